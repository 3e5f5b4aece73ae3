// clef decide: answer one System One request body from a file or stdin.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "decision/engine.h"
#include "util/error.h"
#include "util/json.h"

namespace clef {

namespace {

struct DecideArgs {
    std::string model;
    LoadArgs load;
    DecisionArgs decision;
    std::string input = "-";
    bool debug = false;
    bool serial_delta = false;
    bool reference = false;
};

std::string read_input(const std::string& path) {
    if (path == "-") {
        std::ostringstream ss;
        ss << std::cin.rdbuf();
        return ss.str();
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open");
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void run_decide(const DecideArgs& a) {
    DecideOptions opt = a.decision.options();
    opt.debug = a.debug;
    opt.backbone.chunked_delta_rule = !a.serial_delta;
    opt.backbone.reference = a.reference;

    const std::string source = a.input == "-" ? "stdin" : a.input;
    JsonValue body;
    JsonParseError perr;
    if (!parse_json(read_input(a.input), body, perr))
        throw Error(source + ": invalid JSON at byte " + std::to_string(perr.offset) + ": " + perr.message);
    DecisionRequest req;
    std::vector<RequestError> errors;
    if (!parse_request(body, req, errors)) throw Error(source + ": " + describe_errors(errors));

    std::unique_ptr<Engine> engine = Engine::load(
        a.model, a.load.head, a.load.options(opt.backbone.precision, default_state_cache_bytes()));
    Decision d = engine->decide(req, opt);
    std::string out = write_json(d.response);
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_decide_command(CLI::App& app) {
    auto args = std::make_shared<DecideArgs>();
    CLI::App* cmd = app.add_subcommand("decide", "Answer one System One request body (JSON) and print the response");
    cmd->add_option("--model", args->model, "Model directory (publisher layout) or GGUF file")->required();
    add_load_options(cmd, args->load);
    cmd->add_option("input", args->input, "Request body file, or - for stdin")->capture_default_str();
    add_decision_options(cmd, args->decision);
    cmd->add_flag("--debug", args->debug, "Add input_ids, spans, option ids, logits and probabilities");
    cmd->add_flag("--serial-delta-rule", args->serial_delta,
                  "Use the token-serial delta rule (reference oracle)");
    cmd->add_flag("--reference", args->reference, "Use the scalar reference kernels (the oracle; slow)");
    cmd->callback([args] { run_decide(*args); });
}

}  // namespace clef
