// The System One API (docs/API.md): POST /v1/systemone, GET /v1/models, and the decisions the worker runs.
#include <cstdio>

#include "decision/response.h"
#include "device/device.h"
#include "image/image.h"
#include "server/peer.h"
#include "server/server_impl.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

std::string detail_object(const std::string& type, const std::string& message) {
    return write_json(error_detail(type, message));
}

std::string detail_string(const std::string& message) {
    return write_json(error_detail_text(message));
}

ServerMetrics::Device device_of(const Engine& e) {
    const dev::Device& d = e.device();
    const dev::DeviceMemory m = d.memory();
    return {d.kind(), d.name(), m.total, m.used};
}

JsonValue capabilities_json(const ModelCard& m) {
    std::vector<JsonValue> caps = {str("systemone"), str("decision")};
    if (m.vision) {
        caps.push_back(str("vision"));
        caps.push_back(str("video"));  // frame-list videos (docs/MEDIA.md "Videos")
    }
    return JsonValue::array(std::move(caps));
}

// Content-Type policy (docs/API.md, "Limits and hostile input"): a body is JSON when the header is absent,
// application/json or a structured-syntax */*+json type, in any letter case, with parameters; a charset other
// than UTF-8 and every other media type is refused with 415.
bool json_content_type(const std::string& header) {
    const std::string v = ascii_lower(header);
    auto trim = [](std::string t) {
        const char* ws = " \t";
        size_t b = t.find_first_not_of(ws), e = t.find_last_not_of(ws);
        return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
    };
    size_t semi = v.find(';');
    std::string media = trim(v.substr(0, semi));
    if (media.empty() && semi == std::string::npos) return true;
    bool json = media == "application/json" ||
                (media.size() > 5 && media.compare(media.size() - 5, 5, "+json") == 0 &&
                 media.find('/') != std::string::npos);
    if (!json) return false;
    for (size_t at = semi; at != std::string::npos;) {
        size_t next = v.find(';', at + 1);
        std::string param =
            trim(v.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
        if (param.rfind("charset=", 0) == 0) {
            std::string cs = trim(param.substr(8));
            if (cs.size() >= 2 && cs.front() == '"' && cs.back() == '"') cs = cs.substr(1, cs.size() - 2);
            if (cs != "utf-8" && cs != "utf8") return false;
        }
        at = next;
    }
    return true;
}

const char* const kContentTypeMessage = "Content-Type must be application/json (UTF-8).";

namespace {

// Observes the latency of a /v1/systemone request and sets x-clef-total-ms when the handler returns.
struct LatencyGuard {
    ServerMetrics& m;
    Clock::time_point t0;
    httplib::Response& res;
    ~LatencyGuard() {
        const double s = seconds_since(t0);
        m.observe_latency(s);
        res.set_header("x-clef-total-ms", std::to_string(s * 1e3));
    }
};

}  // namespace

// GET /v1/models: the model card, then one card per other name it answers to.
void Server::Impl::handle_models(httplib::Response& res) {
    const bool loaded = ready;
    const ModelCard& m = loaded ? loaded_card : initial_card;
    auto card = [&](const std::string& name, const std::string& description) {
        JsonValue c = JsonValue::object();
        c.set("name", str(name));
        c.set("description", str(description));
        c.set("release_date", str(m.release_date));  // "" when unknown: the official SDK types it as a string
        c.set("capabilities", capabilities_json(m));
        if (m.context_length > 0) c.set("context_length", JsonValue::integer(m.context_length));
        c.set("max_prompt_tokens", JsonValue::integer(opt.max_tokens));
        if (!m.quantization.empty()) c.set("quantization", str(m.quantization));
        if (m.parameter_count > 0) c.set("parameter_count", JsonValue::integer(m.parameter_count));
        if (!m.format.empty()) c.set("format", str(m.format));
        c.set("ready", JsonValue::boolean(loaded));
        if (loaded) {
            const ServerMetrics::Device d = device_of(*engine);
            c.set("device", JsonValue::object(
                                {{"kind", str(d.kind)},
                                 {"name", str(d.name)},
                                 {"memory_bytes", JsonValue::integer(static_cast<int64_t>(d.memory))},
                                 {"memory_used_bytes", JsonValue::integer(static_cast<int64_t>(d.used))}}));
        }
        return c;
    };
    std::vector<JsonValue> cards;
    if (!m.name.empty()) {
        JsonValue main = card(m.name, m.description);
        std::vector<JsonValue> aliases;
        for (const auto& a : m.aliases) aliases.push_back(str(a));
        main.set("aliases", JsonValue::array(std::move(aliases)));
        cards.push_back(std::move(main));
        for (const auto& a : m.aliases) {
            JsonValue c = card(a, "Alias of " + m.name + ".");
            c.set("alias_of", str(m.name));
            cards.push_back(std::move(c));
        }
    }
    respond(res, 200, write_json(JsonValue::object({{"models", JsonValue::array(std::move(cards))}})));
}

void Server::Impl::handle_systemone(const httplib::Request& req, httplib::Response& res,
                                    const httplib::ContentReader& read) {
    const auto t0 = Clock::now();
    LatencyGuard guard{metrics, t0, res};

    if (!ready) {
        HardenedHttpServer::close_after_response(res);  // the body stays unread
        res.set_header("retry-after", "1");
        respond(res, 503,
                detail_object("unavailable",
                              load_failed ? "The model failed to load." : "The model is loading."));
        return;
    }
    // The body is read here, not by httplib: a chunked body is held to max_body_bytes as it arrives (httplib
    // 0.11 limits only Content-Length bodies), and a refused media type is never parsed as a form.
    if (!json_content_type(req.get_header_value("Content-Type"))) {
        HardenedHttpServer::close_after_response(res);
        respond(res, 415, detail_object("api_usage_error", kContentTypeMessage));
        return;
    }
    std::string text;
    if (!read_body(res, read, text)) return;
    DecisionRequest dreq;
    if (!parse_decision(text, res, dreq)) return;
    std::shared_ptr<DecisionJob> job = prepare_job(req, res, std::move(dreq), t0);
    if (!job) return;
    std::future<Outcome> fut = job->promise.get_future();
    if (!enqueue(job, res)) return;
    await_outcome(*job, fut, res);
}

// Reads the body, at most max_body_bytes of it; false when it answered 413 or 400.
bool Server::Impl::read_body(httplib::Response& res, const httplib::ContentReader& read, std::string& text) {
    bool too_large = false;
    const bool complete = read([&](const char* data, size_t n) {
        if (text.size() + n > opt.max_body_bytes) {
            too_large = true;
            return false;
        }
        text.append(data, n);
        return true;
    });
    if (complete) return true;
    HardenedHttpServer::close_after_response(res);
    if (too_large)
        respond(res, 413,
                detail_object("api_usage_error", "Request body is larger than " +
                                                     std::to_string(opt.max_body_bytes) + " bytes."));
    else
        respond(res, 400, detail_object("api_usage_error", "Incomplete or malformed request body."));
    return false;
}

// Parses and validates the request JSON into dreq (its model made canonical); false when it answered 400/422.
bool Server::Impl::parse_decision(const std::string& text, httplib::Response& res, DecisionRequest& dreq) {
    JsonValue body;
    JsonParseError perr;
    JsonParseOptions popt;
    popt.max_depth = opt.max_json_depth;
    if (!parse_json(text, body, perr, popt)) {
        respond(res, 400,
                detail_object("api_usage_error", perr.too_deep
                                                     ? "Request JSON is nested deeper than " +
                                                           std::to_string(opt.max_json_depth) + " levels."
                                                     : "Request contains invalid JSON."));
        return false;
    }
    std::vector<RequestError> errors;
    if (!parse_request(body, dreq, errors, opt.limits)) {
        const auto [status, body] = request_error_response(errors);
        respond(res, status, write_json(body));
        return false;
    }
    if (!known_model(dreq.model)) {
        respond(res, 400, detail_object("api_usage_error", "Unknown model: " + dreq.model));
        return false;
    }
    dreq.model = model().name;
    return true;
}

// Encodes the prompt on this thread; null when the engine refused the request (answered 400).
std::shared_ptr<DecisionJob> Server::Impl::prepare_job(const httplib::Request& req, httplib::Response& res,
                                                       DecisionRequest&& dreq, Clock::time_point t0) {
    auto job = std::make_shared<DecisionJob>(*this);
    DecideOptions dopt;
    dopt.max_length = opt.max_tokens;
    try {
        job->prepared = engine->prepare(std::move(dreq), dopt);
    } catch (const PromptTooLong& e) {
        respond(res, 400, detail_object("max_tokens_exceeded", e.what()));
        return nullptr;
    } catch (const ImageError& e) {  // an image the processor refuses, or a literal <|image_pad|> in the text
        respond(res, 400, detail_object("api_usage_error", e.what()));
        return nullptr;
    }
    if (!fits_memory(*job, res)) return nullptr;
    job->remote_addr = req.remote_addr;
    job->remote_port = req.remote_port;
    job->local_port = req.local_port;
    job->enqueued = Clock::now();
    job->deadline = t0 + std::chrono::milliseconds(static_cast<int64_t>(opt.request_timeout_s * 1e3));
    return job;
}

// Whether the decision's memory plan fits the budget at all (answered 400 otherwise); sets job.memory.
bool Server::Impl::fits_memory(DecisionJob& job, httplib::Response& res) {
    const int64_t tokens = static_cast<int64_t>(job.prepared.prompt.input_ids.size());
    const auto mib = [](uint64_t b) { return with_thousands(static_cast<int64_t>(b >> 20)); };
    if (memory.device_need && !engine->device().is_cpu()) {
        const uint64_t need = job.device_memory = memory.device_need(tokens);
        if (need > memory.device_budget) {
            respond(
                res, 400,
                detail_object("max_tokens_exceeded",
                              "This decision of " + with_thousands(tokens) + " tokens needs " +
                                  mib(need + (uint64_t{1} << 20) - 1) + " MiB on " + engine->device().name() +
                                  " (the device memory plan); " + mib(memory.device_budget) +
                                  " MiB are left there for a decision (" + memory.device_limit +
                                  "). Send a shorter state or raise --gpu-memory."));
            return false;
        }
    }
    if (!memory.need) return true;
    job.memory = memory.need(tokens);
    if (scheduler.admissible(job.memory)) return true;
    const uint64_t need_up = job.memory + (uint64_t{1} << 20) - 1;  // never shown as equal to the budget
    respond(res, 400,
            detail_object("max_tokens_exceeded",
                          "This decision of " + with_thousands(tokens) + " tokens needs " + mib(need_up) +
                              " MiB (the memory plan); the memory limit leaves " + mib(memory.budget) +
                              " MiB for decisions (" + memory.limit +
                              "). Send a shorter state or raise the "
                              "limit (--memory-limit-mib)."));
    return false;
}

// Hands the job to the worker; false when the queue is full (answered 529).
bool Server::Impl::enqueue(const std::shared_ptr<DecisionJob>& job, httplib::Response& res) {
    if (scheduler.submit(job)) return true;
    res.set_header("retry-after", "1");
    res.set_header("retry-after-ms", "1000");
    respond(res, 529, detail_string("Overloaded"));
    return false;
}

// Waits for the worker until the job's deadline (504 past it) and answers with its outcome.
void Server::Impl::await_outcome(DecisionJob& job, std::future<Outcome>& fut, httplib::Response& res) {
    if (fut.wait_until(job.deadline) != std::future_status::ready) {
        job.abandoned = true;
        respond(
            res, 504,
            detail_object("timeout", "The decision did not finish within " +
                                         std::to_string(static_cast<int>(opt.request_timeout_s)) + " s."));
        return;
    }
    Outcome out = fut.get();
    if (out.status == 200) {
        res.set_header("x-clef-input-tokens", std::to_string(out.tokens));
        res.set_header("x-clef-queue-ms", std::to_string(out.queue_s * 1e3));
        res.set_header("x-clef-compute-ms", std::to_string(out.compute_s * 1e3));
        char timing[160];
        std::snprintf(timing, sizeof timing,
                      "queue;dur=%.3f, compute;dur=%.3f, cache;desc=\"%lld tokens reused\"",
                      out.queue_s * 1e3, out.compute_s * 1e3, static_cast<long long>(out.tokens_reused));
        res.set_header("Server-Timing", timing);
        if (!opt.answers.calibration.empty()) res.set_header("x-clef-calibration", opt.answers.calibration);
    }
    respond(res, out.status == 0 ? 499 : out.status, out.body);
}

// Whether a job taken from the queue still wants an answer: false (with its outcome set) when its client went
// away or its deadline passed while it waited.
bool DecisionJob::admit() {
    started = Clock::now();
    ServerMetrics& metrics = server.metrics;
    out.queue_s = seconds_since(enqueued);
    metrics.observe_queue_wait(out.queue_s);
    if (abandoned) return false;
    if (Clock::now() > deadline) {
        metrics.count_dropped();
        out.status = 504;
        out.body = detail_object("timeout", "The decision timed out in the queue.");
        return false;
    }
    if (!peer_connected(remote_addr, remote_port, local_port)) {
        metrics.count_dropped();
        return false;  // status 0: the client went away before its turn
    }
    return true;
}

// The next step of a decision in flight; true once it has its outcome (answered, failed or abandoned).
bool DecisionJob::step() {
    ServerMetrics& metrics = server.metrics;
    const ServerOptions& opt = server.opt;
    try {
        // A client that went away (or gave up at its deadline) stops its decision at the next turn.
        if (abandoned || !peer_connected(remote_addr, remote_port, local_port)) {
            metrics.count_dropped();
            out.status = 0;
            return true;
        }
        try {
            if (!task) {
                DecideOptions dopt;
                dopt.max_length = opt.max_tokens;
                dopt.answers = opt.answers;
                dopt.backbone = opt.backbone;
                dopt.threads = opt.threads;
                task_device = &server.engine->device();
                task = server.engine->start(prepared, dopt);
            }
            task->step();  // a new decision runs its first chunk in its first turn
        } catch (const dev::DeviceError& e) {
            if (e.kind() == dev::DeviceError::Kind::OutOfMemory) throw;
            // A lost device or a kernel it cannot build: the engine moves to the CPU (or another decision
            // already moved it) and this decision starts over there in its next turn.
            if (&server.engine->device() == task_device && !server.engine->fall_back_to_cpu(e.what())) throw;
            task.reset();
            return false;
        }
        if (!task->done()) return false;
        Decision d = task->take();
        out.status = 200;
        out.body = write_json(d.response);
        out.tokens = static_cast<int>(d.prompt.input_ids.size());
        out.tokens_reused = d.tokens_reused;
        metrics.add_prompt_tokens(out.tokens);
        metrics.set_state_cache(server.engine->state_cache_stats());
    } catch (const dev::DeviceError& e) {  // out of device memory: this decision, not the server
        out.status = 503;
        out.body = detail_object(
            e.kind() == dev::DeviceError::Kind::OutOfMemory ? "device_out_of_memory" : "device_error",
            e.what());
    } catch (const std::exception& e) {
        out.status = 500;
        out.body = detail_object("internal_error", e.what());
    }
    out.compute_s = seconds_since(started);
    metrics.observe_compute(out.compute_s);
    return true;
}

}  // namespace clef
