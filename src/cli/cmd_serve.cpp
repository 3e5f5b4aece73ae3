// clef serve: the System One HTTP server (see src/server and docs/API.md).
#include <pthread.h>
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/serve_model.h"
#include "decision/engine.h"
#include "server/server.h"
#include "util/error.h"
#include "util/memory.h"

namespace clef {

namespace {

struct ServeArgs {
    std::string model;
    LoadArgs load;
    bool demo = false;
    std::string name;
    std::vector<std::string> api_keys;
    std::string api_key_file;
    int max_questions = 64;
    std::string confidence = "reference";
    std::string precision = "exact";
    std::string calibration;
    bool log_requests = false;
    std::string log_format;         // "", "text" or "json"
    int64_t memory_limit_mib = -1;  // -1: this machine's (util/memory.h)
};

const char* const kNoModelHelp =
    "no model given. Download the Clef-Flash weights (the Hugging Face repository Cloudflare/clef-flash, e.g. "
    "`huggingface-cli download Cloudflare/clef-flash --local-dir clef-flash`) and run `clef serve --model "
    "clef-flash`, or try the built-in random model with `clef serve --demo`.";

std::vector<std::string> split_keys(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
        if (c == sep || c == '\n' || c == '\r') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else if (c != ' ' && c != '\t') {
            cur += c;
        }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}

std::vector<std::string> read_key_file(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw Error(path + ": cannot open the API key file");
    std::vector<std::string> keys;
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty() || line[0] == '#') continue;
        for (auto& k : split_keys(line, ',')) keys.push_back(k);
    }
    return keys;
}

// A directory that is removed when the process ends normally.
struct TempDir {
    std::string path;
    ~TempDir() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
};

void run_serve(ServeArgs a, ServerOptions opt) {
    // SIGINT/SIGTERM are taken by a dedicated thread that stops the server gracefully. They are blocked first,
    // before any other thread exists (OpenMP workers included), so that every thread inherits the mask.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

    if (a.model.empty() && !a.demo) throw Error(kNoModelHelp);
    if (!a.model.empty() && a.demo) throw Error("--model and --demo exclude each other");
    if (!parse_confidence_convention(a.confidence, opt.answers.confidence))
        throw Error("--confidence: unknown convention '" + a.confidence + "'");
    if (!a.calibration.empty()) load_calibration(a.calibration, opt.answers);
    if (a.max_questions < 1) throw Error("--max-questions must be at least 1");
    opt.limits.max_questions = static_cast<size_t>(a.max_questions);
    if (opt.queue_size < 1) throw Error("--queue must be at least 1");
    if (opt.max_tokens < 16) throw Error("--max-tokens must be at least 16");
    opt.backbone.precision = precision_option(a.precision);
    if (!(opt.request_read_timeout_s > 0) || !(opt.io_timeout_s > 0))
        throw Error("--request-read-timeout and --io-timeout must be positive");
    opt.log_format = a.log_format == "json"                     ? LogFormat::Json
                     : a.log_format == "text" || a.log_requests ? LogFormat::Text
                                                                : LogFormat::None;

    for (auto& k : a.api_keys)
        for (auto& part : split_keys(k, ',')) opt.api_keys.push_back(part);
    if (!a.api_key_file.empty())
        for (auto& k : read_key_file(a.api_key_file)) opt.api_keys.push_back(k);
    if (const char* env = std::getenv("CLEF_API_KEYS"))
        for (auto& k : split_keys(env, ',')) opt.api_keys.push_back(k);

    auto temp = std::make_shared<TempDir>();
    std::string model_dir = a.model;
    if (a.demo) {
        char tmpl[] = "/tmp/clef-demo-XXXXXX";
        if (!mkdtemp(tmpl)) throw Error("cannot create a temporary directory for the demo model");
        temp->path = tmpl;
        model_dir = temp->path + "/model";
        make_demo_model(model_dir);
        opt.description =
            "A tiny built-in model with random weights: it exercises the whole stack, but its answers carry no "
            "meaning. Point clef serve --model at Clef-Flash weights for real decisions.";
    } else {
        opt.description = "Clef decision model served by clef.cpp from " + a.model + ".";
    }
    // The model answers to its checkpoint's name, its directory's or file's name (not the demo's temporary
    // one) and every --alias; --name (the demo: clef-demo) replaces the canonical name (model/model_card.h).
    opt.model_name = a.name.empty() && a.demo ? "clef-demo" : a.name;

    // The state cache's default budget: a quarter of the available memory, and of --memory-limit-mib.
    uint64_t cache_default = default_state_cache_bytes();
    if (a.memory_limit_mib > 0)
        cache_default = std::min(cache_default, (static_cast<uint64_t>(a.memory_limit_mib) << 20) / 4);
    const LoadOptions lo = a.load.options(opt.backbone.precision, cache_default);
    Server server(opt, serve_loader({model_dir, a.load.head, lo, a.demo, opt.backbone, a.memory_limit_mib,
                                     opt.max_tokens}));
    if (!server.bind()) throw Error(server.error());
    std::fprintf(stderr, "clef: serving %s on http://%s:%d (POST /v1/systemone)%s; state cache %s\n",
                 a.demo ? "the demo model" : a.model.c_str(), opt.host.c_str(), server.port(),
                 opt.api_keys.empty() ? "" : ", API keys required",
                 lo.cache_bytes ? (std::to_string(lo.cache_bytes >> 20) + " MiB").c_str() : "off");
    std::thread signals([&server, set] {
        int sig = 0;
        sigwait(&set, &sig);
        if (sig != 0) server.stop();
    });
    const bool ok = server.run();
    // Wake the signal thread if the server stopped for another reason.
    pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
    if (!ok) throw Error(server.error());
    std::fprintf(stderr, "clef: stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
    auto args = std::make_shared<ServeArgs>();
    auto opt = std::make_shared<ServerOptions>();
    CLI::App* cmd = app.add_subcommand("serve", "Serve decisions over HTTP (System One API: POST /v1/systemone)");
    cmd->add_option("--model", args->model, "Model directory (publisher layout) or GGUF file");
    add_load_options(cmd, args->load);
    cmd->add_flag("--demo", args->demo, "Serve a tiny built-in random model (answers carry no meaning)");
    cmd->add_option("--host", opt->host, "Address to listen on")->capture_default_str();
    cmd->add_option("--port", opt->port, "Port (0 = any free port)")->capture_default_str();
    cmd->add_option(
        "--name", args->name,
        "Canonical model name: a response's `model` (default: the checkpoint's own, e.g. clef-flash)");
    cmd->add_option("--alias", opt->aliases, "Another name requests may use (repeatable)");
    cmd->add_option("--api-key", args->api_keys, "Accepted Bearer API key (repeatable; comma lists allowed)");
    cmd->add_option("--api-key-file", args->api_key_file, "File of API keys, one per line, # comments");
    cmd->add_option(
           "--max-in-flight", opt->max_in_flight,
           "Decisions advanced together, one prefill chunk each in turn (a short request does not wait "
           "for a long prefill)")
        ->capture_default_str()
        ->check(CLI::Range(size_t{1}, size_t{256}));
    cmd->add_option("--queue", opt->queue_size, "Decisions that may wait for the worker before 529")
        ->capture_default_str();
    cmd->add_option("--max-body-bytes", opt->max_body_bytes, "Largest request body (413 beyond)")
        ->capture_default_str();
    cmd->add_option("--max-questions", args->max_questions, "Questions per request (400 beyond)")
        ->capture_default_str();
    cmd->add_option("--max-tokens", opt->max_tokens,
                    "Prompt budget, up to the model's context; the state is cut to fit")
        ->capture_default_str();
    cmd->add_option(
           "--memory-limit-mib", args->memory_limit_mib,
           "Memory for the model and its decisions (default: the machine's RAM or its control group's "
           "limit); a request whose memory plan would exceed it is refused (400)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    cmd->add_option("--max-json-depth", opt->max_json_depth, "Deepest JSON nesting accepted")->capture_default_str();
    cmd->add_option("--timeout", opt->request_timeout_s, "Seconds from arrival to answer (504 beyond)")
        ->capture_default_str();
    cmd->add_option("--http-threads", opt->http_threads, "Connections served at once")->capture_default_str();
    cmd->add_option("--request-read-timeout", opt->request_read_timeout_s,
                    "Seconds for a whole request (line, headers, body) to arrive; slower senders are cut off")
        ->capture_default_str();
    cmd->add_option("--io-timeout", opt->io_timeout_s, "Seconds of socket inactivity while reading or writing")
        ->capture_default_str();
    cmd->add_option("--confidence", args->confidence,
                    "Confidence convention: reference, typesafe, workers-ai, colibri, entropy")
        ->capture_default_str();
    cmd->add_option(
        "--calibration", args->calibration,
        "Temperatures per question type from clef eval --fit-temperature (header x-clef-calibration)");
    cmd->add_flag("--log-requests", args->log_requests,
                  "One line per request on stderr (--log-format's, text by default)");
    cmd->add_option(
           "--log-format", args->log_format,
           "Request lines on stderr: text (readable) or json (one object per line); implies --log-requests")
        ->check(CLI::IsMember({"text", "json"}));
    cmd->add_option("--threads", opt->threads, "Kernel threads (0 = OMP_NUM_THREADS or the physical cores)")
        ->capture_default_str();
    add_precision_option(cmd, args->precision);
    add_kv_type_option(cmd, opt->backbone.kv_bf16);
    cmd->add_flag("--reference", opt->backbone.reference, "Use the scalar reference kernels (the oracle; slow)");
    cmd->callback([args, opt] { run_serve(*args, *opt); });
}

}  // namespace clef
