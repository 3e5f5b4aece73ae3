// clef eval: decide a labelled JSONL set (System One bodies with "expected" answers) and report accuracy,
// calibration, agreement with a second model and latency (tools/eval_report.h, docs/EVAL.md); optionally fit
// one temperature per question type and write it as a calibration file.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "decision/engine.h"
#include "tools/eval_report.h"
#include "util/error.h"
#include "util/json.h"

namespace clef {

namespace {

struct EvalArgs {
    std::string model, data, compare, compare_precision, report, calibration_out;
    bool fit = false;
    int folds = 5;
    LoadArgs load;
    DecisionArgs decision;
};

using Expectations = std::map<std::string, int>;  // question id -> option index in answer order

// The option index an expectation names, or -1 when it names none of the question's options.
int expected_index(const Question& q, const JsonValue& v) {
    std::string id;
    if (q.type == QuestionType::Noul && v.is_bool()) id = v.as_bool() ? "true" : "false";
    if (q.type == QuestionType::Choice && v.is_string()) id = v.as_string();
    if (q.type == QuestionType::Score && v.is_int() && v.fits_int64()) id = std::to_string(v.as_int64());
    for (size_t i = 0; i < q.answer_order.size(); ++i)
        if (!id.empty() && q.answer_order[i] == id) return static_cast<int>(i);
    return -1;
}

// Checks every line (JSON, request, expectations) before anything runs; throws "FILE:LINE: problem".
std::vector<Expectations> read_expectations(const std::string& source,
                                            const std::vector<std::string>& lines) {
    std::vector<Expectations> out;
    for (size_t n = 0; n < lines.size(); ++n) {
        const std::string where = source + ":" + std::to_string(n + 1) + ": ";
        JsonValue body;
        JsonParseError perr;
        if (!parse_json(lines[n], body, perr))
            throw Error(where + "invalid JSON at byte " + std::to_string(perr.offset) + ": " + perr.message);
        DecisionRequest req;
        std::vector<RequestError> errors;
        if (!parse_request(body, req, errors)) throw Error(where + describe_errors(errors));
        Expectations e;
        const JsonValue* expected = body.find("expected");
        if (expected && !expected->is_object()) throw Error(where + "\"expected\" must be an object");
        for (const auto& [id, value] : expected ? expected->members() : std::vector<JsonValue::Member>{}) {
            const Question* q = nullptr;
            for (const Question& x : req.questions)
                if (x.id == id) q = &x;
            if (!q) throw Error(where + "expected." + id + ": no such question");
            const int index = expected_index(*q, value);
            if (index < 0)
                throw Error(where + "expected." + id + ": " + write_json(value) + " is not an option of " +
                            question_type_name(q->type) + " question " + id +
                            " (noul: true/false, choice: an option id, score: a level index)");
            e[id] = index;
        }
        out.push_back(std::move(e));
    }
    return out;
}

// The questions of an answered line as eval items (answer order, expectations attached).
void add_items(size_t line, const LineResult& r, const Expectations& expected, std::vector<eval::Item>& out) {
    for (size_t i = 0; i < r.request.questions.size(); ++i) {
        const Question& q = r.request.questions[i];
        const std::vector<std::string>& ids = r.decision.prompt.questions[i].option_ids;
        eval::Item it;
        it.line = line;
        it.question = q.id;
        it.type = q.type;
        it.options = q.answer_order;
        for (const std::string& id : q.answer_order) {
            const size_t k = static_cast<size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
            it.logits.push_back(r.decision.logits[i].at(k));
            it.probs.push_back(r.decision.probabilities[i].at(k));
        }
        const auto e = expected.find(q.id);
        if (e != expected.end()) it.expected = e->second;
        out.push_back(std::move(it));
    }
}

// The model's answers to every line, in `precision` (the CLI spelling).
eval::ModelRun run_model(const EvalArgs& a, const std::string& model, const std::string& precision,
                         const std::vector<std::string>& lines, const std::vector<Expectations>& expected) {
    DecideOptions opt = a.decision.options();
    opt.backbone.precision = precision_option(precision);
    std::unique_ptr<Engine> engine =
        Engine::load(model, a.load.head, a.load.options(opt.backbone.precision, default_state_cache_bytes()));
    std::fprintf(stderr, "clef eval: %s (%s): %zu lines\n", model.c_str(), precision.c_str(), lines.size());
    eval::ModelRun run;
    run.model = precision == "exact" ? model : model + " (" + precision + ")";
    run.wall_seconds = run_request_lines(*engine, lines, 0, opt, [&](size_t line, LineResult& r) {
        if (r.error) {
            run.errors.emplace_back(line, write_json(r.body));
            return;
        }
        run.seconds.push_back(r.seconds);
        run.tokens += r.tokens;
        add_items(line, r, expected[line], run.items);
    });
    return run;
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    if (!(f << text)) throw Error(path + ": cannot write");
}

void run_eval(const EvalArgs& a) {
    if (a.fit && a.report.empty() && a.calibration_out.empty())
        throw Error("--fit-temperature writes calibration.json: give --report DIR or --calibration-out FILE");
    if (a.folds < 2) throw Error("--folds must be at least 2");
    a.decision.options();  // option errors before the models load
    if (!a.compare_precision.empty()) precision_option(a.compare_precision);
    const std::vector<std::string> lines = read_lines(a.data);
    const std::vector<Expectations> expected = read_expectations(a.data, lines);

    const eval::ModelRun run = run_model(a, a.model, a.decision.precision, lines, expected);
    JsonValue summary = JsonValue::object();
    summary.set("data", JsonValue::string(a.data));
    summary.set("model", eval::run_json(run));
    if (!a.compare.empty() || !a.compare_precision.empty()) {
        const eval::ModelRun other = run_model(
            a, a.compare.empty() ? a.model : a.compare,
            a.compare_precision.empty() ? a.decision.precision : a.compare_precision, lines, expected);
        JsonValue c = JsonValue::object();
        c.set("model", eval::run_json(other));
        c.set("agreement", eval::compare_json(run, other));
        summary.set("compare", std::move(c));
    }
    if (!a.report.empty()) std::filesystem::create_directories(a.report);
    if (a.fit) {
        std::array<double, 3> t{};
        JsonValue fit = eval::fit_temperatures(run.items, a.folds, t);
        JsonValue file = calibration_json(t);
        file.set("fit", fit);
        const std::string out =
            a.calibration_out.empty() ? a.report + "/calibration.json" : a.calibration_out;
        write_file(out, write_json(file) + "\n");
        fit.set("calibration_file", JsonValue::string(out));
        summary.set("temperature_fit", std::move(fit));
    }
    const std::string json = write_json(summary) + "\n";
    if (!a.report.empty()) {
        write_file(a.report + "/summary.json", json);
        write_file(a.report + "/index.html", eval::report_html(summary));
    }
    std::fwrite(json.data(), 1, json.size(), stdout);
}

}  // namespace

void add_eval_command(CLI::App& app) {
    auto args = std::make_shared<EvalArgs>();
    CLI::App* cmd = app.add_subcommand(
        "eval",
        "Accuracy, calibration, agreement and latency of a model on labelled System One requests (JSONL)");
    cmd->add_option("--model", args->model, "Model directory (publisher layout) or GGUF file")->required();
    add_load_options(cmd, args->load);
    cmd->add_option(
           "--data", args->data,
           "Labelled requests: one System One body per line plus \"expected\": {question id: answer}")
        ->required();
    cmd->add_option("--compare", args->compare, "A second model: agreement, |dp| and a paired accuracy test");
    cmd->add_option("--compare-precision", args->compare_precision,
                    "The second run's --precision (exact, bf16, int8 or fp16): alone, the same model in "
                    "another precision "
                    "(e.g. --compare-precision int8: what int8 costs in answers)");
    cmd->add_option("--report", args->report, "Directory for index.html (self-contained) and summary.json");
    cmd->add_flag(
        "--fit-temperature", args->fit,
        "Fit one temperature per question type (K-fold cross-validated metrics); writes calibration.json");
    cmd->add_option("--folds", args->folds, "Folds of the temperature's cross-validation")
        ->capture_default_str();
    cmd->add_option("--calibration-out", args->calibration_out,
                    "Where --fit-temperature writes the calibration file (default: DIR/calibration.json)");
    add_decision_options(cmd, args->decision);
    cmd->callback([args] { run_eval(*args); });
}

}  // namespace clef
