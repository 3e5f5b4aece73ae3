#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <initializer_list>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "decision/engine.h"
#include "decision/response.h"
#include "image/image.h"
#include "server/metrics.h"
#include "server/peer.h"
#include "server/static_routes.h"
#include "server/transport.h"
#include "util/error.h"
#include "util/json.h"
#include "util/text.h"
#include "util/version.h"

namespace clef {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

JsonValue str(const std::string& s) { return JsonValue::string(s); }

// The System One error bodies (decision/response.h), as response text.
std::string detail_object(const std::string& type, const std::string& message) {
    return write_json(error_detail(type, message));
}

std::string detail_string(const std::string& message) {
    return write_json(error_detail_text(message));
}

// Ollama's error body.
std::string ollama_error(const std::string& message) {
    return write_json(JsonValue::object({{"error", JsonValue::string(message)}}));
}

// What the model does: System One decisions, with images and videos when its vision tower is loaded.
JsonValue capabilities_json(const ModelCard& m) {
    std::vector<JsonValue> caps = {str("systemone"), str("decision")};
    if (m.vision) {
        caps.push_back(str("vision"));
        caps.push_back(str("video"));  // frame-list videos (docs/MEDIA.md "Videos")
    }
    return JsonValue::array(std::move(caps));
}

// Ollama's `details` of a model (/api/tags, /api/show).
JsonValue ollama_details(const ModelCard& m) {
    std::string level = m.quantization;
    for (char& c : level) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return JsonValue::object({{"parent_model", str("")},
                              {"format", str(m.format)},
                              {"family", str("clef")},
                              {"families", JsonValue::array({str("clef")})},
                              {"parameter_size", str(parameter_size_text(m.parameter_count))},
                              {"quantization_level", str(level)}});
}

// Ollama's `model_info`: the GGUF metadata keys of llama.cpp's clef architecture (tools/gguf_convert.cpp
// writes the same), from the loaded configs.
JsonValue ollama_model_info(const ModelCard& m) {
    const TextConfig& t = m.config.text;
    auto i = [](int64_t v) { return JsonValue::integer(v); };
    JsonValue info = JsonValue::object({{"general.architecture", str("clef")},
                                        {"general.basename", str(m.name)},
                                        {"general.parameter_count", i(m.parameter_count)}});
    if (m.file_type >= 0) info.set("general.file_type", i(m.file_type));
    if (m.quantization_version >= 0) info.set("general.quantization_version", i(m.quantization_version));
    for (const auto& [key, value] : std::initializer_list<std::pair<const char*, int64_t>>{
             {"context_length", m.context_length},
             {"embedding_length", t.hidden_size},
             {"block_count", t.num_layers},
             {"feed_forward_length", t.intermediate_size},
             {"attention.head_count", t.num_heads},
             {"attention.head_count_kv", t.num_kv_heads},
             {"attention.key_length", t.head_dim},
             {"full_attention_interval", full_attention_interval_of(t.layer_types)},
             {"ssm.conv_kernel", t.linear_conv_kernel},
             {"ssm.state_size", t.linear_key_head_dim},
             {"ssm.group_count", t.linear_num_key_heads},
             {"ssm.time_step_rank", t.linear_num_value_heads},
             {"vocab_size", t.vocab_size}})
        info.set(std::string("clef.") + key, i(value));
    if (m.head) {
        info.set("clef.decision.routing_block_count", i(m.head->routing_layers));
        info.set("clef.decision.block_count", i(m.head->layers));
        info.set("clef.decision.head_count", i(m.head->heads));
        info.set("clef.decision.embedding_length", i(m.head->width));
        info.set("clef.decision.feed_forward_length", i(m.head->feedforward));
    }
    return info;
}

// Content-Type policy (docs/API.md, "Limits and hostile input"): a body is JSON when the header is absent,
// application/json or a structured-syntax */*+json type, in any letter case, with parameters; a charset other
// than UTF-8 and every other media type is refused with 415.
bool json_content_type(const std::string& header) {
    std::string v;
    for (char c : header) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
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

// Constant-time membership test: every key is compared over its full length, no early exit.
bool key_matches(const std::string& given, const std::vector<std::string>& keys) {
    unsigned found = 0;
    for (const auto& k : keys) {
        unsigned diff = given.size() != k.size() ? 1u : 0u;
        const size_t n = std::max(given.size(), k.size());
        for (size_t i = 0; i < n; ++i) {
            unsigned char a = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
            unsigned char b = i < k.size() ? static_cast<unsigned char>(k[i]) : 0;
            diff |= static_cast<unsigned>(a ^ b);
        }
        found |= (diff == 0) ? 1u : 0u;
    }
    return found != 0;
}

struct Outcome {
    int status = 0;  // 0 = dropped (client gone), nobody reads it
    std::string body;
    int tokens = 0;
    int64_t tokens_reused = 0;  // from the state cache
    double queue_s = 0, compute_s = 0;
};

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

const char* const kDefaultDescription = "A Clef decision model served by clef.cpp.";

struct Job {
    Engine::Prepared prepared;
    uint64_t memory = 0;  // the decision's memory plan (DecisionMemoryBudget)
    std::promise<Outcome> promise;
    std::atomic<bool> abandoned{false};
    std::string remote_addr;
    int remote_port = -1;
    int local_port = -1;
    Clock::time_point enqueued;
    Clock::time_point deadline;
};

}  // namespace

struct Server::Impl {
    ServerOptions opt;
    Loader loader;
    HardenedHttpServer http;
    ServerMetrics metrics;
    std::unique_ptr<Engine> engine;
    std::atomic<bool> ready{false}, stopping{false}, load_failed{false}, listening_done{false};
    std::string error;
    int port = -1;
    std::thread loader_thread, worker_thread;
    std::mutex qmu;
    std::condition_variable qcv;
    std::deque<std::shared_ptr<Job>> queue;
    DecisionMemoryBudget memory;    // set by load() before ready
    uint64_t memory_in_flight = 0;  // the worker's decisions' plans (worker thread only)
    bool worker_exit = false;
    // The names given in the options until the model is loaded, then the loaded model's card (written once,
    // before `ready` is set: read it only through model()).
    ModelCard initial_card, loaded_card;

    Impl(ServerOptions o, Loader l) : opt(std::move(o)), loader(std::move(l)) {
        initial_card.name = opt.model_name;
        for (const std::string& a : opt.aliases)
            if (a != opt.model_name) initial_card.aliases.push_back(a);
        initial_card.description = opt.description.empty() ? kDefaultDescription : opt.description;
    }

    const ModelCard& model() const { return ready ? loaded_card : initial_card; }
    ModelCard describe(std::optional<ModelCard> given, const Engine& e) const;

    bool known_model(const std::string& name) const {
        const ModelCard& m = model();
        std::vector<std::string> names = m.aliases;
        names.push_back(m.name);
        return names_model(names, name);
    }

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
    void handle_systemone(const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& read);
    bool read_body(httplib::Response& res, const httplib::ContentReader& read, std::string& text);
    bool parse_decision(const std::string& text, httplib::Response& res, DecisionRequest& dreq);
    std::shared_ptr<Job> prepare_job(const httplib::Request& req, httplib::Response& res,
                                     DecisionRequest&& dreq, Clock::time_point t0);
    bool enqueue(const std::shared_ptr<Job>& job, httplib::Response& res);
    void await_outcome(Job& job, std::future<Outcome>& fut, httplib::Response& res);
    void handle_models(httplib::Response& res);
    bool fits_memory(Job& job, httplib::Response& res);
    void handle_ollama_tags(httplib::Response& res);
    void handle_ollama_show(const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& read);
    void worker_loop();
    void load();
    struct Running;
    bool admit(Job& job, Outcome& out);
    bool advance(Running& r);
    bool take_jobs(std::vector<Running>& running);
};

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

// With API keys configured, the routes that describe or run the model (/v1/, Ollama's /api/ but its version)
// need "Authorization: Bearer <key>": true when it answered 403 or 401 (an Ollama route in Ollama's shape).
bool Server::Impl::refuse_unauthenticated(const httplib::Request& req, httplib::Response& res,
                                          bool has_body) {
    const bool ollama = req.path.rfind("/api/", 0) == 0;
    if (opt.api_keys.empty() || (req.path.rfind("/v1/", 0) != 0 && !ollama) || req.path == "/api/version")
        return false;
    auto refuse = [&](int status, const char* message) {
        if (has_body) HardenedHttpServer::close_after_response(res);
        respond(res, status, ollama ? ollama_error(message) : detail_object("authentication_error", message));
        return true;
    };
    std::string auth = req.get_header_value("Authorization");
    if (auth.empty()) return refuse(403, "Must supply an API key! Check your request and try again.");
    const std::string prefix = "Bearer ";
    std::string given = auth.size() > prefix.size() && auth.compare(0, prefix.size(), prefix) == 0
                            ? auth.substr(prefix.size())
                            : std::string();
    if (!key_matches(given, opt.api_keys))
        return refuse(401, "Cannot authenticate with the server. Please check your API key and try again.");
    return false;
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

// GET /api/tags (Ollama's model list): the loaded model under its canonical name; nothing while it loads.
void Server::Impl::handle_ollama_tags(httplib::Response& res) {
    std::vector<JsonValue> models;
    if (ready) {
        const ModelCard& m = loaded_card;
        models.push_back(JsonValue::object({{"name", str(m.name)},
                                            {"model", str(m.name)},
                                            {"modified_at", str(m.modified_at)},
                                            {"size", JsonValue::integer(static_cast<int64_t>(m.size_bytes))},
                                            {"digest", str(m.digest)},
                                            {"details", ollama_details(m)}}));
    }
    respond(res, 200, write_json(JsonValue::object({{"models", JsonValue::array(std::move(models))}})));
}

// POST /api/show {"model": NAME} (or "name"): Ollama's model details; 404 for a name the model does not
// answer to. Any Content-Type but multipart is read as JSON (Ollama's own examples send `curl -d`, a form
// type).
void Server::Impl::handle_ollama_show(const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& read) {
    if (req.is_multipart_form_data()) {
        HardenedHttpServer::close_after_response(res);
        respond(res, 415, ollama_error("the body must be JSON"));
        return;
    }
    std::string text;
    if (!read_body(res, read, text)) return;
    JsonValue body;
    JsonParseError perr;
    JsonParseOptions popt;
    popt.max_depth = opt.max_json_depth;
    if (!parse_json(text, body, perr, popt) || !body.is_object()) {
        respond(res, 400, ollama_error("invalid JSON body"));
        return;
    }
    const JsonValue* name = body.find("model");
    if (!name || !name->is_string()) name = body.find("name");
    if (!name || !name->is_string() || name->as_string().empty()) {
        respond(res, 400, ollama_error("model is required"));
        return;
    }
    if (!ready) {
        res.set_header("retry-after", "1");
        respond(res, 503, ollama_error(load_failed ? "the model failed to load" : "the model is loading"));
        return;
    }
    if (!known_model(name->as_string())) {
        respond(res, 404, ollama_error("model '" + name->as_string() + "' not found"));
        return;
    }
    const ModelCard& m = loaded_card;
    respond(res, 200,
            write_json(JsonValue::object({{"details", ollama_details(m)},
                                          {"model_info", ollama_model_info(m)},
                                          {"capabilities", capabilities_json(m)},
                                          {"modified_at", str(m.modified_at)}})));
}

void Server::Impl::handle_systemone(const httplib::Request& req, httplib::Response& res,
                                    const httplib::ContentReader& read) {
    const auto t0 = Clock::now();
    LatencyGuard guard{metrics, t0, res};

    if (!ready) {
        HardenedHttpServer::close_after_response(res);  // the body stays unread
        res.set_header("retry-after", "1");
        respond(res, 503,
                detail_object("unavailable", load_failed ? "The model failed to load." : "The model is loading."));
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
    std::shared_ptr<Job> job = prepare_job(req, res, std::move(dreq), t0);
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
                detail_object("api_usage_error", perr.too_deep ? "Request JSON is nested deeper than " +
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
std::shared_ptr<Job> Server::Impl::prepare_job(const httplib::Request& req, httplib::Response& res,
                                               DecisionRequest&& dreq, Clock::time_point t0) {
    auto job = std::make_shared<Job>();
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
bool Server::Impl::fits_memory(Job& job, httplib::Response& res) {
    if (!memory.need) return true;
    const int64_t tokens = static_cast<int64_t>(job.prepared.prompt.input_ids.size());
    job.memory = memory.need(tokens);
    if (job.memory <= memory.budget) return true;
    const auto mib = [](uint64_t b) { return with_thousands(static_cast<int64_t>(b >> 20)); };
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
bool Server::Impl::enqueue(const std::shared_ptr<Job>& job, httplib::Response& res) {
    {
        std::lock_guard<std::mutex> lock(qmu);
        if (queue.size() >= opt.queue_size) {
            res.set_header("retry-after", "1");
            res.set_header("retry-after-ms", "1000");
            respond(res, 529, detail_string("Overloaded"));
            return false;
        }
        queue.push_back(job);
        metrics.set_queue_depth(static_cast<int64_t>(queue.size()));
    }
    qcv.notify_one();
    return true;
}

// Waits for the worker until the job's deadline (504 past it) and answers with its outcome.
void Server::Impl::await_outcome(Job& job, std::future<Outcome>& fut, httplib::Response& res) {
    if (fut.wait_until(job.deadline) != std::future_status::ready) {
        job.abandoned = true;
        respond(res, 504,
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
bool Server::Impl::admit(Job& job, Outcome& out) {
    out.queue_s = seconds_since(job.enqueued);
    metrics.observe_queue_wait(out.queue_s);
    if (job.abandoned) return false;
    if (Clock::now() > job.deadline) {
        metrics.count_dropped();
        out.status = 504;
        out.body = detail_object("timeout", "The decision timed out in the queue.");
        return false;
    }
    if (!peer_connected(job.remote_addr, job.remote_port, job.local_port)) {
        metrics.count_dropped();
        return false;  // status 0: the client went away before its turn
    }
    return true;
}

// One decision in flight on the worker: its task advances one prefill chunk per turn.
struct Server::Impl::Running {
    std::shared_ptr<Job> job;
    std::unique_ptr<DecisionTask> task;
    Outcome out;
    Clock::time_point started;
};

// The next step of a decision in flight; true once it has its outcome (answered, failed or abandoned).
bool Server::Impl::advance(Running& r) {
    try {
        // A client that went away (or gave up at its deadline) stops its decision at the next turn.
        const Job& j = *r.job;
        if (j.abandoned || !peer_connected(j.remote_addr, j.remote_port, j.local_port)) {
            metrics.count_dropped();
            r.out.status = 0;
            return true;
        }
        if (!r.task) {
            DecideOptions dopt;
            dopt.max_length = opt.max_tokens;
            dopt.answers = opt.answers;
            dopt.backbone = opt.backbone;
            dopt.threads = opt.threads;
            r.task = engine->start(r.job->prepared, dopt);
        }
        r.task->step();  // a new decision runs its first chunk in its first turn
        if (!r.task->done()) return false;
        Decision d = r.task->take();
        r.out.status = 200;
        r.out.body = write_json(d.response);
        r.out.tokens = static_cast<int>(d.prompt.input_ids.size());
        r.out.tokens_reused = d.tokens_reused;
        metrics.add_prompt_tokens(r.out.tokens);
        metrics.set_state_cache(engine->state_cache_stats());
    } catch (const std::exception& e) {
        r.out.status = 500;
        r.out.body = detail_object("internal_error", e.what());
    }
    r.out.compute_s = seconds_since(r.started);
    metrics.observe_compute(r.out.compute_s);
    return true;
}

// Takes queued jobs while fewer than max_in_flight run; waits for one when none runs. False: stop the worker.
bool Server::Impl::take_jobs(std::vector<Running>& running) {
    std::unique_lock<std::mutex> lock(qmu);
    if (running.empty()) qcv.wait(lock, [&] { return worker_exit || !queue.empty(); });
    if (running.empty() && queue.empty()) return false;  // worker_exit and nothing left
    while (!queue.empty() && running.size() < std::max<size_t>(opt.max_in_flight, 1)) {
        // Decisions in flight together stay within the memory budget (each alone fits: fits_memory).
        if (!running.empty() && memory_in_flight + queue.front()->memory > memory.budget && memory.need)
            break;
        std::shared_ptr<Job> job = std::move(queue.front());
        queue.pop_front();
        metrics.set_queue_depth(static_cast<int64_t>(queue.size()));
        Running r{std::move(job), nullptr, {}, Clock::now()};
        if (admit(*r.job, r.out)) {
            memory_in_flight += r.job->memory;
            running.push_back(std::move(r));
        } else
            r.job->promise.set_value(std::move(r.out));
    }
    return true;
}

// Round-robin over the decisions in flight, one step each, so a short request behind a long prefill starts
// within one chunk's time and finishes after its own few chunks.
void Server::Impl::worker_loop() {
    std::vector<Running> running;
    while (take_jobs(running)) {
        for (size_t i = 0; i < running.size();) {
            if (!advance(running[i])) {
                ++i;
                continue;
            }
            memory_in_flight -= running[i].job->memory;
            running[i].job->promise.set_value(std::move(running[i].out));
            running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        }
    }
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
        {
            std::lock_guard<std::mutex> lock(impl_->qmu);
            impl_->worker_exit = true;
        }
        impl_->qcv.notify_all();
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
    s.worker_thread = std::thread([&s] { s.worker_loop(); });
    if (!s.stopping) s.http.listen_after_bind();
    s.listening_done = true;
    s.loader_thread.join();
    {
        std::lock_guard<std::mutex> lock(s.qmu);
        s.worker_exit = true;
    }
    s.qcv.notify_all();
    s.worker_thread.join();
    return !s.load_failed;
}

void Server::stop() {
    Impl& s = *impl_;
    s.stopping = true;
    s.http.stop();
}

}  // namespace clef
