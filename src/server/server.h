// clef serve: the System One HTTP server. HTTP threads authenticate, parse, validate and encode; one worker thread
// owns the model and runs decisions from a bounded queue. See docs/API.md for routes, errors and limits.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "decision/answer.h"
#include "decision/engine.h"
#include "decision/request.h"
#include "model/backbone.h"
#include "model/model_card.h"

namespace clef {

// Request logs (--log-format): none, one human-readable line per request, or one JSON object per line.
enum class LogFormat { None, Text, Json };

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;  // 0 = any free port (see Server::port())
    std::vector<std::string> api_keys;  // empty = no authentication
    // The names the model answers to besides its own (model_card.h served_names): model_name replaces the
    // checkpoint's canonical name when set (--name), aliases are added (--alias).
    std::string model_name;
    std::vector<std::string> aliases;
    std::string description;                      // the model card's description (a default one when empty)
    size_t queue_size = 16;                       // decisions waiting for the worker; beyond it: 529
    size_t max_in_flight = 4;  // decisions the worker advances together, one prefill chunk each in turn
    size_t max_body_bytes = 16u << 20;            // larger bodies: 413
    size_t max_json_depth = 128;                  // deeper bodies: 400
    int max_tokens = 16384;                       // prompt budget (state is cut to fit; schema beyond: 400)
    double request_timeout_s = 600;               // from arrival to answer; beyond: 504
    int http_threads = 64;                        // concurrent connections served
    double request_read_timeout_s = 30;           // a request (line, headers, body) must arrive within this
    double io_timeout_s = 30;                     // inactivity limit while reading or writing a connection
    int keep_alive_timeout_s = 5;
    LogFormat log_format = LogFormat::None;  // request lines on stderr
    RequestLimits limits;
    AnswerOptions answers;
    BackboneOptions backbone;  // backbone path / precision / prefill chunk of every decision
    int threads = 0;           // kernel threads of the worker (0 = OMP_NUM_THREADS or the physical cores)
};

// What a loader hands the server: the engine and the card of its files (model/model_card.h describe_model).
// Without a card the server describes the model from the engine alone (names, context length, vision; no file
// facts). The memory a decision of N prompt tokens needs beside the weights (the memory plan,
// model/memory_plan.h), and what the machine leaves for decisions: requests beyond it are refused (400)
// before they start, and decisions in flight together stay within it. An empty `need` admits everything.
struct DecisionMemoryBudget {
    std::function<uint64_t(int64_t tokens)> need;
    uint64_t budget = 0;  // bytes for the decisions in flight
    std::string limit;    // how the budget was reached, for the refusal's message
    // On a Vulkan device: a decision's device memory (its plan's state and activations) and what the device
    // leaves for one beside the model's weights there; a decision over it is refused before it starts.
    std::function<uint64_t(int64_t tokens)> device_need;
    uint64_t device_budget = 0;
    std::string device_limit;
};

struct LoadedModel {
    LoadedModel(std::unique_ptr<Engine> e) : engine(std::move(e)) {}  // NOLINT: implicit, an engine alone
    LoadedModel(std::unique_ptr<Engine> e, ModelCard c) : engine(std::move(e)), card(std::move(c)) {}
    std::unique_ptr<Engine> engine;
    std::optional<ModelCard> card;
    DecisionMemoryBudget memory;
};

class Server {
public:
    using Loader = std::function<LoadedModel()>;

    // The loader runs on a background thread after start(); /ready answers 503 until it returned and the
    // model answered a warm-up decision. A loader exception is fatal: run() returns false with load_error()
    // set. The card (names, /v1/models, /api/tags, /api/show) is the loaded model's from then on; while it
    // loads, /v1/models lists the names given in the options.
    Server(ServerOptions opt, Loader loader);
    ~Server();

    // Binds the listening socket (port 0 picks a free one); false with error() set on failure.
    bool bind();
    int port() const;
    // Serves until stop(); returns after in-flight requests finished. False when the model failed to load.
    bool run();
    // Thread-safe and idempotent: stop accepting, let in-flight requests finish, make run() return.
    void stop();
    bool ready() const;
    const std::string& error() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace clef
