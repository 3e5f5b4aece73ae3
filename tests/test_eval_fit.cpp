// clef eval --fit-temperature on the tiny model (src/cli/cmd_eval.cpp, tools/eval_report.h): a set whose
// labels follow softmax(logits / 2) of the model's own logits gives T = 2 for every question type.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "decision/answer.h"
#include "decision/engine.h"
#include "test_util.h"
#include "util/json.h"

using namespace clef;

namespace {

using clef::testing::softmax_ref;

}  // namespace

namespace {

// A request of six questions (two per type) about one of a few varied states.
JsonValue fit_request(int k) {
    static const char* const kSubjects[] = {"invoice",        "login page",   "delivery", "refund",
                                            "password reset", "subscription", "driver",   "warehouse"};
    static const char* const kMoods[] = {"angry", "calm", "confused", "urgent"};
    const std::string s = std::string("The customer is ") + kMoods[k % 4] + " about the " + kSubjects[k % 8] +
                          " (ticket " + std::to_string(1000 + 37 * k) + ").";
    return parse_json_or_throw(
        R"({"model":"m","state":)" + write_json(JsonValue::string(s)) + R"(,"questions":{
        "n1":{"type":"noul","instructions":"Is the customer angry?"},
        "c1":{"type":"choice","instructions":"Which team?","criteria":{"billing":null,"support":null,"sales":null}},
        "s1":{"type":"score","instructions":"How urgent?","criteria":["low","medium","high"]},
        "n2":{"type":"noul","instructions":"Is money involved?"},
        "c2":{"type":"choice","instructions":"Which channel?","criteria":{"mail":null,"phone":null,"chat":null,"visit":null}},
        "s2":{"type":"score","instructions":"How complex?","criteria":["1","2","3","4","5"]}}})",
        "request");
}

// Label counts over M copies of one question whose frequencies follow softmax(l / T0): largest-remainder
// rounding of M p, then single moves between options that bring the running residual of the log-likelihood's
// score equation (sum of l[label] - E_p[l]) closest to zero, so the maximum-likelihood temperature of the
// whole set is T0 up to a residual far below the 5 % asked (sampled labels would need ~10^5 questions at the
// tiny model's logit spread).
std::vector<int> balanced_counts(const std::vector<double>& l, double t0, int m, double& residual) {
    const std::vector<double> p = softmax_ref(l, t0);
    std::vector<int> c(p.size());
    std::vector<std::pair<double, size_t>> rest;
    int left = m;
    for (size_t k = 0; k < p.size(); ++k) {
        c[k] = static_cast<int>(std::floor(m * p[k]));
        left -= c[k];
        rest.push_back({m * p[k] - c[k], k});
    }
    std::sort(rest.rbegin(), rest.rend());
    for (int i = 0; i < left; ++i) ++c[rest[static_cast<size_t>(i)].second];
    double mean = 0;
    for (size_t k = 0; k < p.size(); ++k) mean += p[k] * l[k];
    auto off = [&] {
        double s = residual - m * mean;
        for (size_t k = 0; k < p.size(); ++k) s += c[k] * l[k];
        return s;
    };
    for (int pass = 0; pass < 3; ++pass) {
        size_t from = 0, to = 0;
        double best = std::fabs(off());
        for (size_t a = 0; a < c.size(); ++a)
            for (size_t b = 0; b < c.size(); ++b)
                if (a != b && c[a] > 0 && std::fabs(off() - l[a] + l[b]) < best)
                    best = std::fabs(off() - l[a] + l[b]), from = a, to = b;
        if (from == to) break;
        --c[from], ++c[to];
    }
    residual = off();
    return c;
}

JsonValue label_json(QuestionType type, const std::string& option) {
    if (type == QuestionType::Noul) return JsonValue::boolean(option == "true");
    if (type == QuestionType::Score) return JsonValue::integer(std::stoll(option));
    return JsonValue::string(option);
}

}  // namespace

// An over-confident model: labels follow softmax(logits / 2) of the tiny model's own logits; clef eval
// --fit-temperature finds T = 2 for each question type.
TEST(EvalCli, FitTemperatureRecoversAKnownTemperature) {
    constexpr double kT0 = 2.0;
    constexpr int kCopies = 10, kStates = 4;
    const std::unique_ptr<Engine> engine = Engine::load(clef::testing::data_path("tiny-clef"));
    std::vector<JsonValue> bodies;
    std::vector<std::vector<JsonValue>> expected(kCopies);  // [copy][state]: the "expected" object
    std::array<double, 3> residual{};
    for (int k = 0; k < kStates; ++k) {
        bodies.push_back(fit_request(k));
        DecisionRequest req;
        std::vector<RequestError> errors;
        ASSERT_TRUE(parse_request(bodies.back(), req, errors));
        const Decision d = engine->decide(req);
        for (auto& e : expected) e.push_back(JsonValue::object());
        for (size_t i = 0; i < req.questions.size(); ++i) {
            const Question& q = req.questions[i];
            const auto& ids = d.prompt.questions[i].option_ids;
            std::vector<double> l;
            for (const auto& id : q.answer_order)
                l.push_back(
                    d.logits[i][static_cast<size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin())]);
            const std::vector<int> counts =
                balanced_counts(l, kT0, kCopies, residual[static_cast<size_t>(q.type)]);
            int copy = 0;
            for (size_t o = 0; o < counts.size(); ++o)
                for (int n = 0; n < counts[o]; ++n)
                    expected[static_cast<size_t>(copy++)].back().set(q.id,
                                                                     label_json(q.type, q.answer_order[o]));
        }
    }
    const std::string dir =
        std::filesystem::temp_directory_path() / ("clef-test-eval-fit-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    {
        std::ofstream data(dir + "/data.jsonl");
        for (const auto& copy : expected)
            for (size_t k = 0; k < bodies.size(); ++k) {
                JsonValue b = bodies[k];
                b.set("expected", copy[k]);
                data << write_json(b) << "\n";
            }
    }
    int status = 0;
    clef::testing::run_command(
        std::string(CLEF_BINARY) + " eval --model " + clef::testing::data_path("tiny-clef") + " --data " +
            dir + "/data.jsonl --fit-temperature --calibration-out " + dir + "/cal.json >/dev/null",
        status);
    ASSERT_EQ(WEXITSTATUS(status), 0);
    AnswerOptions opt;
    load_calibration(dir + "/cal.json", opt);
    std::filesystem::remove_all(dir);
    for (double t : opt.temperature) EXPECT_NEAR(t / kT0, 1.0, 0.05) << "fitted " << t;
}
