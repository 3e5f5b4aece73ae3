#include "server/server.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>

#include "decision/response.h"
#include "server/auth.h"
#include "server/server_impl.h"
#include "server/static_routes.h"
#include "util/error.h"
#include "util/version.h"

namespace clef {

namespace {

// The routes we serve and their methods (for 405 answers and metric labels).
struct Route {
    const char* path;
    const char* method;
};
constexpr Route kRoutes[] = {
    {"/v1/systemone", "POST"}, {"/v1/models", "GET"},   {"/health", "GET"},   {"/ready", "GET"},
    {"/metrics", "GET"},       {"/api/version", "GET"}, {"/api/tags", "GET"}, {"/api/show", "POST"},
};

const Route* find_route(const std::string& path) {
    for (const auto& r : kRoutes)
        if (path == r.path) return &r;
    return nullptr;
}

// Request ids: an incoming x-request-id is honoured when it is short printable ASCII.
std::string request_id_for(const httplib::Request& req) {
    for (const char* h : {"x-request-id", "x-typesafe-request-id"}) {
        std::string v = req.get_header_value(h);
        if (v.empty() || v.size() > 128) continue;
        bool ok = true;
        for (char c : v) ok = ok && c > 0x20 && c < 0x7f;
        if (ok) return v;
    }
    static thread_local std::mt19937_64 rng(std::random_device{}());
    char buf[32];
    std::snprintf(buf, sizeof buf, "req_%016llx%08llx", static_cast<unsigned long long>(rng()),
                  static_cast<unsigned long long>(rng() & 0xffffffffu));
    return buf;
}

const char* const kDefaultDescription = "A Clef decision model served by clef.cpp.";

}  // namespace

Server::Impl::Impl(ServerOptions o, Loader l)
    : opt(std::move(o)),
      loader(std::move(l)),
      scheduler(SchedulerLimits{opt.queue_size, opt.max_in_flight},
                [this](size_t depth) { metrics.set_queue_depth(static_cast<int64_t>(depth)); }) {
    initial_card.name = opt.model_name;
    for (const std::string& a : opt.aliases)
        if (a != opt.model_name) initial_card.aliases.push_back(a);
    initial_card.description = opt.description.empty() ? kDefaultDescription : opt.description;
}

bool Server::Impl::known_model(const std::string& name) const {
    const ModelCard& m = model();
    std::vector<std::string> names = m.aliases;
    names.push_back(m.name);
    return names_model(names, name);
}

void Server::Impl::configure_transport() {
    TransportLimits tl;
    tl.http_threads = static_cast<size_t>(std::max(1, opt.http_threads));
    tl.request_deadline = std::chrono::milliseconds(static_cast<int64_t>(opt.request_read_timeout_s * 1e3));
    tl.io_timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.io_timeout_s * 1e3));
    http.set_limits(tl);
    http.set_tcp_nodelay(true);
    http.set_keep_alive_timeout(opt.keep_alive_timeout_s);
    http.set_keep_alive_max_count(1000);
    http.set_read_timeout(static_cast<time_t>(opt.io_timeout_s), 0);
    http.set_write_timeout(static_cast<time_t>(opt.io_timeout_s), 0);
    http.set_payload_max_length(opt.max_body_bytes);
}

void Server::Impl::setup_routes() {
    configure_transport();
    http.set_pre_routing_handler(
        [this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });

    http.Post("/v1/systemone",
              [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
                  handle_systemone(req, res, read);
              });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { handle_models(res); });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        respond(res, 200, R"({"status":"ok"})");
    });
    http.Get("/ready", [this](const httplib::Request&, httplib::Response& res) {
        if (ready)
            respond(res, 200,
                    write_json(JsonValue::object({{"status", str("ready")}, {"model", str(model().name)}})));
        else
            respond(res, 503, load_failed ? R"({"status":"failed"})" : R"({"status":"loading"})");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        if (ready) metrics.set_device(device_of(*engine));
        res.status = 200;
        res.set_content(metrics.render(), "text/plain; version=0.0.4");
    });
    // Ollama's discovery routes (docs/API.md, "Ollama clients").
    http.Get("/api/version", [this](const httplib::Request&, httplib::Response& res) {
        respond(res, 200, write_json(JsonValue::object({{"version", str(kClefVersion)}})));
    });
    http.Get("/api/tags",
             [this](const httplib::Request&, httplib::Response& res) { handle_ollama_tags(res); });
    http.Post("/api/show",
              [this](const httplib::Request& req, httplib::Response& res,
                     const httplib::ContentReader& read) { handle_ollama_show(req, res, read); });

    register_static_routes(http);  // the playground page and /openapi.json (static_routes.h)

    http.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) { return handle_error(req, res); }));
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& res,
                                      std::exception_ptr ep) { handle_exception(res, ep); });
    http.set_logger(
        [this](const httplib::Request& req, const httplib::Response& res) { log_request(req, res); });
}

httplib::Server::HandlerResponse Server::Impl::pre_route(const httplib::Request& req,
                                                         httplib::Response& res) {
    res.set_header("x-typesafe-request-id", request_id_for(req));
    // Runs before the body is read: a refusal here leaves the body unread, so the connection is closed
    // after the response instead of parsing the rest as the next request.
    const bool has_body = req.has_header("Content-Length") || req.has_header("Transfer-Encoding");
    if (refuse_content_length(req, res) || refuse_unauthenticated(req, res, has_body))
        return httplib::Server::HandlerResponse::Handled;
    return httplib::Server::HandlerResponse::Unhandled;
}

// A Content-Length that is not a number (400) or over max_body_bytes (413): true when it answered.
bool Server::Impl::refuse_content_length(const httplib::Request& req, httplib::Response& res) {
    const std::string length = req.get_header_value("Content-Length");
    if (length.empty()) return false;
    const bool digits = length.find_first_not_of("0123456789") == std::string::npos;
    if (digits && length.size() <= 19 && std::stoull(length) <= opt.max_body_bytes) return false;
    HardenedHttpServer::close_after_response(res);
    if (!digits) {
        respond(res, 400, detail_object("api_usage_error", "Invalid Content-Length."));
    } else {
        respond(res, 413,
                detail_object("api_usage_error", "Request body is larger than " +
                                                     std::to_string(opt.max_body_bytes) + " bytes."));
    }
    return true;
}

// With API keys configured, the routes that describe or run the model need a key (auth.h): true when it
// answered 403 or 401 (an Ollama route in Ollama's shape).
bool Server::Impl::refuse_unauthenticated(const httplib::Request& req, httplib::Response& res,
                                          bool has_body) {
    const std::optional<AuthRefusal> refusal =
        auth_refusal(req.path, req.get_header_value("Authorization"), opt.api_keys);
    if (!refusal) return false;
    if (has_body) HardenedHttpServer::close_after_response(res);
    respond(res, refusal->status,
            ollama_route(req.path) ? ollama_error(refusal->message)
                                   : detail_object("authentication_error", refusal->message));
    return true;
}

httplib::Server::HandlerResponse Server::Impl::handle_error(const httplib::Request& req,
                                                            httplib::Response& res) {
    if (!res.has_header("x-typesafe-request-id"))
        res.set_header("x-typesafe-request-id", request_id_for(req));
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    // An error httplib produced itself (malformed request, body over the limit, URI or header too long):
    // whatever is left of the request on the connection cannot be trusted.
    if (res.status != 404) HardenedHttpServer::close_after_response(res);
    if (res.status == 404) {
        if (const Route* r = find_route(req.path)) {
            res.set_header("Allow", r->method);
            respond(res, 405, detail_string("Method Not Allowed"));
        } else {
            respond(res, 404, detail_string("Not Found"));
        }
    } else if ((res.status == 413 || res.status == 400) && req.path == "/v1/systemone" &&
               !json_content_type(req.get_header_value("Content-Type")) &&
               req.body.size() <= opt.max_body_bytes) {
        // httplib refuses form bodies over 8 KiB and malformed multipart itself; the real problem is the
        // media type.
        respond(res, 415, detail_object("api_usage_error", kContentTypeMessage));
    } else if (res.status == 413) {
        respond(res, 413,
                detail_object("api_usage_error", "Request body is larger than " +
                                                     std::to_string(opt.max_body_bytes) + " bytes."));
    } else if (res.status == 400) {
        respond(res, 400, detail_object("api_usage_error", "Invalid request."));
    } else {
        respond(res, res.status, detail_string("HTTP " + std::to_string(res.status)));
    }
    return httplib::Server::HandlerResponse::Handled;
}

void Server::Impl::handle_exception(httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
        if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
        what = e.what();
    } catch (...) {
    }
    respond(res, 500, detail_object("internal_error", what));
}

// Counts every request in the metrics; with a log format, writes one line per request on stderr: the request
// id, method, route (never the raw target), status, and for a decision the model, its input tokens and its
// queue / compute / total milliseconds. Nothing from the body or the headers a client chose (keys, state).
void Server::Impl::log_request(const httplib::Request& req, const httplib::Response& res) {
    const Route* r = find_route(req.path);
    metrics.count_request(r ? r->path : "other", res.status);
    if (opt.log_format == LogFormat::None) return;
    JsonValue line = JsonValue::object();
    line.set("id", str(res.get_header_value("x-typesafe-request-id")));
    line.set("method", str(req.method));
    line.set("path", str(r ? r->path : "other"));
    line.set("status", JsonValue::integer(res.status));
    if (r && std::string(r->path) == "/v1/systemone" && res.status == 200)
        line.set("model", str(model().name));
    if (res.has_header("x-clef-input-tokens"))
        line.set("input_tokens",
                 JsonValue::integer(std::atoll(res.get_header_value("x-clef-input-tokens").c_str())));
    for (const auto& [key, header] :
         {std::pair{"queue_ms", "x-clef-queue-ms"}, std::pair{"compute_ms", "x-clef-compute-ms"},
          std::pair{"total_ms", "x-clef-total-ms"}}) {
        if (!res.has_header(header)) continue;
        const double ms = std::strtod(res.get_header_value(header).c_str(), nullptr);
        line.set(key, JsonValue::number(std::round(ms * 1e3) / 1e3));
    }
    std::string text;
    if (opt.log_format == LogFormat::Json) {
        text = write_json(line);
    } else {  // "req_… POST /v1/systemone 200 model=clef-flash input_tokens=42 queue_ms=0.1 …"
        for (const auto& [key, value] : line.members()) {
            if (!text.empty()) text += ' ';
            if (key != "id" && key != "method" && key != "path" && key != "status") text += key + "=";
            text += value.is_string() ? value.as_string() : write_json(value);
        }
    }
    text += "\n";
    std::fwrite(text.data(), 1, text.size(), stderr);
}

// The loaded model's card: the loader's (its files' facts) or, without one, what the engine's config says;
// whether images work from the engine; the names from the card and the options.
ModelCard Server::Impl::describe(std::optional<ModelCard> given, const Engine& e) const {
    ModelCard m;
    if (given) {
        m = std::move(*given);
    } else {
        m.config = e.config();
        m.checkpoint_name = checkpoint_model_name(m.config.text);
        m.context_length = m.config.text.context_length();
        m.release_date = published_release_date(m.config.text);
    }
    m.vision = e.vision() != nullptr;
    const std::vector<std::string> names = served_names(m, opt.model_name, opt.aliases);
    m.name = names.front();
    m.aliases.assign(names.begin() + 1, names.end());
    m.description = initial_card.description;
    return m;
}

void Server::Impl::load() {
    const auto t = Clock::now();
    try {
        LoadedModel loaded = loader();
        if (!loaded.engine) throw Error("the loader returned no model");
        engine = std::move(loaded.engine);
        loaded_card = describe(std::move(loaded.card), *engine);
        memory = std::move(loaded.memory);
        if (memory.need) scheduler.set_memory_budget(memory.budget);
        if (memory.device_need) scheduler.set_device_memory_budget(memory.device_budget);
        // Warm-up: one small decision touches every weight page and sizes the scratch buffers.
        JsonValue body = parse_json_or_throw(
            R"({"model":"warm-up","state":"warm-up","questions":{"ok":{"type":"noul","instructions":"ok?"}}})",
            "warm-up");
        DecisionRequest req;
        std::vector<RequestError> errors;
        if (!parse_request(body, req, errors)) throw Error("warm-up request rejected");
        engine->decide(req);
        metrics.set_state_cache(engine->state_cache_stats());
        metrics.set_model_load_seconds(seconds_since(t));
        ready = true;
        metrics.set_ready(true);
        std::string names = loaded_card.name;
        for (size_t i = 0; i < loaded_card.aliases.size(); ++i)
            names += (i ? ", " : " (also ") + loaded_card.aliases[i] +
                     (i + 1 == loaded_card.aliases.size() ? ")" : "");
        std::fprintf(stderr, "clef: ready in %.1f s: model %s\n", seconds_since(t), names.c_str());
    } catch (const std::exception& e) {
        error = std::string("loading the model failed: ") + e.what();
        load_failed = true;
        std::thread([this] {
            // stop() must reach a listening server: wait for listen to start (or run() to finish).
            while (!http.is_running() && !listening_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            http.stop();
        }).detach();
    }
}

Server::Server(ServerOptions opt, Loader loader) : impl_(std::make_unique<Impl>(std::move(opt), std::move(loader))) {
    impl_->setup_routes();
}

Server::~Server() {
    stop();
    if (impl_->loader_thread.joinable()) impl_->loader_thread.join();
    if (impl_->worker_thread.joinable()) {
        impl_->scheduler.stop();
        impl_->worker_thread.join();
    }
}

bool Server::bind() {
    Impl& s = *impl_;
    if (s.opt.port == 0) {
        s.port = s.http.bind_to_any_port(s.opt.host);
        if (s.port < 0) s.error = "cannot bind " + s.opt.host + " on any port";
    } else if (s.http.bind_to_port(s.opt.host, s.opt.port)) {
        s.port = s.opt.port;
    } else {
        s.error = "cannot bind " + s.opt.host + ":" + std::to_string(s.opt.port) + " (in use or not permitted)";
    }
    if (s.port >= 0) s.http.widen_listen_backlog();
    return s.port >= 0;
}

int Server::port() const { return impl_->port; }
bool Server::ready() const { return impl_->ready; }
const std::string& Server::error() const { return impl_->error; }

bool Server::run() {
    Impl& s = *impl_;
    s.loader_thread = std::thread([&s] { s.load(); });
    s.worker_thread = std::thread([&s] { s.scheduler.run(); });
    if (!s.stopping) s.http.listen_after_bind();
    s.listening_done = true;
    s.loader_thread.join();
    s.scheduler.stop();
    s.worker_thread.join();
    return !s.load_failed;
}

void Server::stop() {
    Impl& s = *impl_;
    s.stopping = true;
    s.http.stop();
}

}  // namespace clef
