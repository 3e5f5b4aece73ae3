// The server's state and the parts that share it: server.cpp (loading, the HTTP plumbing: transport limits,
// pre-routing, errors, request logs), routes.cpp (the System One API and the decisions the worker runs),
// ollama.cpp (Ollama's discovery API), auth.cpp (API keys), scheduler.cpp (the queue and the worker's turns).
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "decision/engine.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/server.h"
#include "server/transport.h"
#include "util/json.h"

namespace clef {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}
inline JsonValue str(const std::string& s) {
    return JsonValue::string(s);
}

// The System One error bodies (decision/response.h), as response text.
std::string detail_object(const std::string& type, const std::string& message);
std::string detail_string(const std::string& message);
// Ollama's error body.
std::string ollama_error(const std::string& message);
// What the model does: System One decisions, with images and videos when its vision tower is loaded.
JsonValue capabilities_json(const ModelCard& m);
// The device the engine runs on, as /metrics and /v1/models name it.
ServerMetrics::Device device_of(const Engine& e);
// Whether a Content-Type header names JSON in UTF-8 (routes.cpp); 415 with kContentTypeMessage otherwise.
bool json_content_type(const std::string& header);
extern const char* const kContentTypeMessage;

struct Outcome {
    int status = 0;  // 0 = dropped (client gone), nobody reads it
    std::string body;
    int tokens = 0;
    int64_t tokens_reused = 0;  // from the state cache
    double queue_s = 0, compute_s = 0;
};

// One /v1/systemone decision: prepared on its HTTP thread, run by the worker one prefill chunk per turn
// (routes.cpp), its outcome handed back through the promise.
struct DecisionJob final : ScheduledJob {
    explicit DecisionJob(Server::Impl& s) : server(s) {}
    bool admit() override;
    bool step() override;
    void finish() override { promise.set_value(std::move(out)); }

    Server::Impl& server;
    Engine::Prepared prepared;
    std::promise<Outcome> promise;
    std::atomic<bool> abandoned{false};
    std::string remote_addr;
    int remote_port = -1;
    int local_port = -1;
    Clock::time_point enqueued;
    Clock::time_point deadline;
    // The worker's.
    std::unique_ptr<DecisionTask> task;
    const dev::Device* task_device = nullptr;  // where task runs
    Outcome out;
    Clock::time_point started;
};

struct Server::Impl {
    ServerOptions opt;
    Loader loader;
    HardenedHttpServer http;
    ServerMetrics metrics;
    Scheduler scheduler;
    std::unique_ptr<Engine> engine;
    std::atomic<bool> ready{false}, stopping{false}, load_failed{false}, listening_done{false};
    std::string error;
    int port = -1;
    std::thread loader_thread, worker_thread;
    DecisionMemoryBudget memory;  // set by load() before ready
    // The names given in the options until the model is loaded, then the loaded model's card (written once,
    // before `ready` is set: read it only through model()).
    ModelCard initial_card, loaded_card;

    Impl(ServerOptions o, Loader l);

    const ModelCard& model() const { return ready ? loaded_card : initial_card; }
    ModelCard describe(std::optional<ModelCard> given, const Engine& e) const;
    bool known_model(const std::string& name) const;
    void respond(httplib::Response& res, int status, const std::string& body) {
        res.status = status;
        res.set_content(body, "application/json");
    }

    void setup_routes();
    void configure_transport();
    httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
    bool refuse_content_length(const httplib::Request& req, httplib::Response& res);
    bool refuse_unauthenticated(const httplib::Request& req, httplib::Response& res, bool has_body);
    httplib::Server::HandlerResponse handle_error(const httplib::Request& req, httplib::Response& res);
    void handle_exception(httplib::Response& res, std::exception_ptr ep);
    void log_request(const httplib::Request& req, const httplib::Response& res);
    void load();

    // routes.cpp
    void handle_systemone(const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& read);
    bool read_body(httplib::Response& res, const httplib::ContentReader& read, std::string& text);
    bool parse_decision(const std::string& text, httplib::Response& res, DecisionRequest& dreq);
    std::shared_ptr<DecisionJob> prepare_job(const httplib::Request& req, httplib::Response& res,
                                             DecisionRequest&& dreq, Clock::time_point t0);
    bool fits_memory(DecisionJob& job, httplib::Response& res);
    bool enqueue(const std::shared_ptr<DecisionJob>& job, httplib::Response& res);
    void await_outcome(DecisionJob& job, std::future<Outcome>& fut, httplib::Response& res);
    void handle_models(httplib::Response& res);

    // ollama.cpp
    void handle_ollama_tags(httplib::Response& res);
    void handle_ollama_show(const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& read);
};

}  // namespace clef
