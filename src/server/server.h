// clef serve: the System One HTTP server. HTTP threads authenticate, parse, validate and encode; one worker thread
// owns the model and runs decisions from a bounded queue. See docs/API.md for routes, errors and limits.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "decision/answer.h"
#include "decision/request.h"
#include "model/backbone.h"

namespace clef {

class Engine;

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;  // 0 = any free port (see Server::port())
    std::vector<std::string> api_keys;  // empty = no authentication
    std::string model_name = "clef";    // canonical name: the response's `model`
    std::vector<std::string> aliases;   // other names requests may use
    std::string description;
    std::string release_date = "2026-10-01";
    std::string quantization = "bf16";
    std::vector<std::string> capabilities = {"systemone", "decision"};
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
    bool log_requests = false;                    // one structured line per request on stderr
    RequestLimits limits;
    AnswerOptions answers;
    BackboneOptions backbone;  // backbone path / precision / prefill chunk of every decision
    int threads = 0;           // kernel threads of the worker (0 = OMP_NUM_THREADS or the physical cores)
};

class Server {
public:
    using Loader = std::function<std::unique_ptr<Engine>()>;

    // The loader runs on a background thread after start(); /ready answers 503 until it returned and the model
    // answered a warm-up decision. A loader exception is fatal: run() returns false with load_error() set.
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
