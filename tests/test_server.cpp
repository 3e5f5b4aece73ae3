// The System One server in-process on loopback with the tiny fixture model: routes, every error class with
// its exact status and body shape (docs/API.md "Errors"), auth, limits, metrics, graceful stop.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <chrono>
#include <memory>
#include <thread>

#include "decision/engine.h"
#include "server/server.h"
#include "test_util.h"
#include "util/json.h"
#include "test_server_util.h"

using namespace clef;

namespace {

const std::string kModel = clef::testing::data_path("tiny-clef");
using clef::testing::tiny_case;

using Running = clef::testing::RunningServer;

ServerOptions base_options() {
    ServerOptions o;
    o.model_name = "tiny-clef";
    o.aliases = {"clef-flash"};
    o.description = "test";
    return o;
}

Running& shared_server() {
    static Running r(base_options());
    return r;
}

JsonValue body_of(const httplib::Result& r) { return parse_json_or_throw(r->body, "response"); }

httplib::Result post(const std::string& body, const httplib::Headers& headers = {}) {
    auto c = shared_server().client();
    return c.Post("/v1/systemone", headers, body, "application/json");
}

std::string detail_type(const JsonValue& b) {
    const JsonValue* d = b.find("detail");
    if (!d || !d->is_object()) return "";
    return d->find("error_type") ? d->find("error_type")->as_string() : "";
}

const char* const kOk = R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"noul","instructions":"ok?"}}})";

}  // namespace

TEST(Server, HealthReadyAndRequestIds) {
    auto c = shared_server().client();
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, R"({"status":"ok"})");
    EXPECT_FALSE(r->get_header_value("x-typesafe-request-id").empty());
    r = c.Get("/ready");
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(body_of(r).find("model")->as_string(), "tiny-clef");
    r = c.Get("/health", {{"x-request-id", "trace-123"}});
    EXPECT_EQ(r->get_header_value("x-typesafe-request-id"), "trace-123");
    r = c.Get("/nope");
    EXPECT_FALSE(r->get_header_value("x-typesafe-request-id").empty());
}

TEST(Server, AnswersLikeTheReference) {
    const JsonValue& c = tiny_case("basic_mixed");
    auto r = post(c.find("request_body")->as_string());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    JsonValue got = body_of(r);
    EXPECT_EQ(got.find("model")->as_string(), "tiny-clef");  // canonical name, not the alias sent
    const JsonValue& want = *c.find("response");
    const auto& ga = got.find("answers")->members();
    const auto& wa = want.find("answers")->members();
    ASSERT_EQ(ga.size(), wa.size());
    for (size_t i = 0; i < wa.size(); ++i) {
        EXPECT_EQ(ga[i].first, wa[i].first);
        EXPECT_EQ(ga[i].second.find("type")->as_string(), wa[i].second.find("type")->as_string());
    }
    EXPECT_NEAR(got.find("answers")->find("is_bug")->find("noul")->as_double(),
                want.find("answers")->find("is_bug")->find("noul")->as_double(), 1e-4);
    EXPECT_EQ(got.find("answers")->find("team")->find("choice")->as_string(),
              want.find("answers")->find("team")->find("choice")->as_string());
    EXPECT_EQ(got.find("usage")->find("input_tokens")->as_int64(),
              want.find("usage")->find("input_tokens")->as_int64());
    EXPECT_FALSE(r->get_header_value("Server-Timing").empty());
}

TEST(Server, Models) {
    auto c = shared_server().client();
    auto r = c.Get("/v1/models");
    ASSERT_EQ(r->status, 200);
    JsonValue b = body_of(r);
    const auto& models = b.find("models")->items();
    ASSERT_EQ(models.size(), 2u);
    EXPECT_EQ(models[0].find("name")->as_string(), "tiny-clef");
    EXPECT_TRUE(models[0].find("description")->is_string());
    EXPECT_TRUE(models[0].find("release_date")->is_string());  // the official SDK's ModelCard needs it
    // The model's context (config.json) and the prompt budget (ServerOptions::max_tokens) under their own
    // keys.
    const JsonValue cfg =
        parse_json_or_throw(clef::testing::read_file(kModel + "/config.json"), "config.json");
    EXPECT_EQ(models[0].find("context_length")->as_int64(),
              cfg.find("text_config")->find("max_position_embeddings")->as_int64());
    EXPECT_EQ(models[0].find("max_prompt_tokens")->as_int64(), 16384);
    EXPECT_EQ(models[1].find("name")->as_string(), "clef-flash");
}

TEST(Server, InvalidJsonAndNesting400) {
    for (std::string bad : {std::string("{\"model\": "), std::string("not json"), std::string("\xff\xfe"),
                            std::string("{\"a\":1,}"), std::string("[NaN]")}) {
        auto r = post(bad);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << bad;
        JsonValue b = body_of(r);
        EXPECT_EQ(detail_type(b), "api_usage_error");
        EXPECT_EQ(b.find("detail")->find("message")->as_string(), "Request contains invalid JSON.");
    }
    std::string deep = "{\"model\":\"clef-flash\",\"state\":" + std::string(100000, '[') + std::string(100000, ']') +
                       ",\"questions\":{\"q\":{\"type\":\"noul\"}}}";
    auto r = post(deep);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(detail_type(body_of(r)), "api_usage_error");
}

TEST(Server, Validation422) {
    struct Case {
        std::string body;
        std::string type;
        std::string loc;  // JSON of the first item's loc
    };
    const Case cases[] = {
        {R"({"model":"clef-flash","questions":{"q":{"type":"noul"}}})", "missing", R"(["body","state"])"},
        {R"({"model":"clef-flash","state":null,"questions":{"q":{"type":"noul"}}})", "missing", R"(["body","state"])"},
        {R"({"model":"clef-flash","state":"s","questions":{}})", "too_short", R"(["body","questions"])"},
        {R"({"model":"clef-flash","state":"s","questions":[1]})", "dict_type", R"(["body","questions"])"},
        {R"({"model":7,"state":"s","questions":{"q":{"type":"noul"}}})", "string_type", R"(["body","model"])"},
        {R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"choice"}}})", "missing",
         R"(["body","questions","q","choice","criteria"])"},
        {R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"score","criteria":"x"}}})", "list_type",
         R"(["body","questions","q","score","criteria"])"},
        {R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"rank"}}})", "union_tag_invalid",
         R"(["body","questions","q","type"])"},
        {R"("just a string")", "dict_type", R"(["body"])"},
    };
    for (const auto& c : cases) {
        auto r = post(c.body);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 422) << c.body << " -> " << r->body;
        JsonValue b = body_of(r);
        const JsonValue* d = b.find("detail");
        ASSERT_TRUE(d && d->is_array() && !d->items().empty()) << r->body;
        EXPECT_EQ(d->items()[0].find("type")->as_string(), c.type) << c.body;
        EXPECT_EQ(write_json(*d->items()[0].find("loc")), c.loc) << c.body;
        EXPECT_TRUE(d->items()[0].find("msg")->is_string());
    }
}

TEST(Server, Limits400) {
    std::string many = R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"choice","criteria":{)";
    for (int i = 0; i < 256; ++i) many += std::string(i ? "," : "") + "\"o" + std::to_string(i) + "\":null";
    many += "}}}}";
    auto r = post(many);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->body, R"({"detail":"Too many choices. Must have at most 255 choices."})");

    r = post(R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"score","criteria":[0,1,2,3,4,5,6,7,8,9,10]}}})");
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->body, R"({"detail":"Too many score levels. Must have at most 10 levels."})");

    std::string qs = R"({"model":"clef-flash","state":"s","questions":{)";
    for (int i = 0; i < 65; ++i) qs += std::string(i ? "," : "") + "\"q" + std::to_string(i) + "\":{\"type\":\"noul\"}";
    qs += "}}";
    r = post(qs);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->body, R"({"detail":"Too many questions. Must have at most 64 questions."})");

    r = post(R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"choice","criteria":{}}}})");
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->body, R"({"detail":"q: criteria must not be empty"})");

    r = post(R"({"model":"jev-9.9.9","state":"s","questions":{"q":{"type":"noul"}}})");
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->body, R"({"detail":{"error_type":"api_usage_error","message":"Unknown model: jev-9.9.9"}})");

    r = post(R"({"model":"clef-flash","state":"s","images":["data:image/png;base64,AAAA"],"questions":{"q":{"type":"noul"}}})");
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(detail_type(body_of(r)), "api_usage_error");
}

TEST(Server, MaxTokensExceeded) {
    ServerOptions o = base_options();
    o.max_tokens = 300;
    Running s(o);
    auto c = s.client();
    auto r = c.Post("/v1/systemone", tiny_case("schema_exceeds_max_length").find("request_body")->as_string(),
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    JsonValue b = body_of(r);
    EXPECT_EQ(detail_type(b), "max_tokens_exceeded");
    EXPECT_EQ(b.find("detail")->find("message")->as_string(),
              "schema requires 746 tokens before state; maximum is 300");
    // A long state is cut to fit instead.
    r = c.Post("/v1/systemone", tiny_case("long_state_truncated").find("request_body")->as_string(),
               "application/json");
    EXPECT_EQ(r->status, 400);  // its schema alone is longer than 300 too
}

TEST(Server, AuthKeys) {
    ServerOptions o = base_options();
    o.api_keys = {"key-one", "key-two"};
    Running s(o);
    auto c = s.client();
    auto r = c.Post("/v1/systemone", kOk, "application/json");
    EXPECT_EQ(r->status, 403);
    EXPECT_EQ(detail_type(body_of(r)), "authentication_error");
    r = c.Post("/v1/systemone", {{"Authorization", "Bearer wrong"}}, kOk, "application/json");
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(r->body,
              R"({"detail":{"error_type":"authentication_error","message":"Cannot authenticate with the server. Please check your API key and try again."}})");
    r = c.Post("/v1/systemone", {{"Authorization", "key-two"}}, kOk, "application/json");
    EXPECT_EQ(r->status, 401);
    r = c.Post("/v1/systemone", {{"Authorization", "Bearer key-two"}}, kOk, "application/json");
    EXPECT_EQ(r->status, 200) << r->body;
    r = c.Get("/v1/models", {{"Authorization", "Bearer key-one"}});
    EXPECT_EQ(r->status, 200);
    r = c.Get("/v1/models");
    EXPECT_EQ(r->status, 403);
    r = c.Get("/health");  // liveness stays public
    EXPECT_EQ(r->status, 200);
}

TEST(Server, RoutesAndMethods) {
    auto c = shared_server().client();
    auto r = c.Get("/v1/nothing");
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(r->body, R"({"detail":"Not Found"})");
    r = c.Get("/v1/systemone");
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(r->body, R"({"detail":"Method Not Allowed"})");
    EXPECT_EQ(r->get_header_value("Allow"), "POST");
    r = c.Post("/v1/models", "{}", "application/json");
    EXPECT_EQ(r->status, 405);
}

TEST(Server, BodyTooLarge413) {
    ServerOptions o = base_options();
    o.max_body_bytes = 1000;
    Running s(o);
    auto c = s.client();
    std::string big = R"({"model":"clef-flash","state":")" + std::string(5000, 'x') +
                      R"(","questions":{"q":{"type":"noul"}}})";
    auto r = c.Post("/v1/systemone", big, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_EQ(detail_type(body_of(r)), "api_usage_error");
    r = c.Post("/v1/systemone", kOk, "application/json");
    EXPECT_EQ(r->status, 200);
}

TEST(Server, Overload529) {
    ServerOptions o = base_options();
    o.queue_size = 0;  // every decision finds the queue full
    Running s(o);
    auto c = s.client();
    auto r = c.Post("/v1/systemone", kOk, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 529);
    EXPECT_EQ(r->body, R"({"detail":"Overloaded"})");
    EXPECT_EQ(r->get_header_value("retry-after"), "1");
    EXPECT_EQ(r->get_header_value("retry-after-ms"), "1000");
}

TEST(Server, Metrics) {
    post(kOk);
    post("garbage");
    auto c = shared_server().client();
    // Requests are counted by the server after their response is written, so either may still be on its way.
    std::string body;
    for (int i = 0; i < 500; ++i) {
        auto m = c.Get("/metrics");
        ASSERT_TRUE(m);
        ASSERT_EQ(m->status, 200);
        body = m->body;
        if (body.find("clef_requests_total{route=\"/v1/systemone\",status=\"400\"}") != std::string::npos &&
            body.find("clef_requests_total{route=\"/v1/systemone\",status=\"200\"}") != std::string::npos)
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_NE(body.find("clef_requests_total{route=\"/v1/systemone\",status=\"200\"}"), std::string::npos);
    EXPECT_NE(body.find("clef_requests_total{route=\"/v1/systemone\",status=\"400\"}"), std::string::npos);
    EXPECT_NE(body.find("clef_request_duration_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
    EXPECT_NE(body.find("clef_prompt_tokens_total "), std::string::npos);
    EXPECT_NE(body.find("clef_queue_depth 0"), std::string::npos);
    EXPECT_NE(body.find("clef_model_load_seconds "), std::string::npos);
    EXPECT_NE(body.find("clef_ready 1"), std::string::npos);
    EXPECT_NE(body.find("clef_state_cache_hits_total "), std::string::npos);
    EXPECT_NE(body.find("clef_state_cache_budget_bytes "), std::string::npos);
}

TEST(Server, StopFinishesInFlightRequests) {
    ServerOptions o = base_options();
    auto s = std::make_unique<Running>(o);
    const std::string body = tiny_case("basic_mixed").find("request_body")->as_string();
    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    for (int i = 0; i < 4; ++i)
        clients.emplace_back([&] {
            auto c = s->client();
            auto r = c.Post("/v1/systemone", body, "application/json");
            if (r && r->status == 200)
                ++ok;
            else
                ADD_FAILURE() << (r ? std::to_string(r->status) + " " + r->body : httplib::to_string(r.error()));
        });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s.reset();  // stop() + join while requests are in flight
    for (auto& t : clients) t.join();
    EXPECT_EQ(ok.load(), 4);
}

TEST(Server, LoadFailureIsReported) {
    ServerOptions o = base_options();
    o.port = 0;
    Server s(o, []() -> std::unique_ptr<Engine> { return Engine::load("/nonexistent/model"); });
    ASSERT_TRUE(s.bind());
    EXPECT_FALSE(s.run());
    EXPECT_NE(s.error().find("/nonexistent/model"), std::string::npos) << s.error();
}

// A queued decision whose client has gone away is dropped before it runs (clef_dropped_total counts it).
TEST(Server, DropsRequestsWhoseClientLeft) {
    ServerOptions o = base_options();
    Running s(o);
    const std::string long_body = tiny_case("choice_1_and_40_options").find("request_body")->as_string();
    std::thread busy([&] {
        auto c = s.client();
        auto r = c.Post("/v1/systemone", long_body, "application/json");
        EXPECT_TRUE(r && r->status == 200);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    // A second request on a raw socket, closed right after sending: it waits behind the first one.
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(s.server().port()));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    std::string req = "POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(std::string(kOk).size()) + "\r\n\r\n" + kOk;
    ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    close(fd);
    busy.join();
    // Give the worker a moment to pick up (and drop) the abandoned decision.
    std::string metrics;
    for (int i = 0; i < 200; ++i) {
        metrics = s.client().Get("/metrics")->body;
        if (metrics.find("clef_dropped_total 1") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_NE(metrics.find("clef_dropped_total 1"), std::string::npos) << metrics;
}

TEST(Server, RequestTimeout504) {
    ServerOptions o = base_options();
    o.request_timeout_s = 0.001;
    Running s(o);
    auto c = s.client();
    auto r = c.Post("/v1/systemone", tiny_case("basic_mixed").find("request_body")->as_string(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 504);
    EXPECT_EQ(detail_type(body_of(r)), "timeout");
}

TEST(Server, CliWithoutModelExplainsWhatToDo) {
    int status = 0;
    std::string out = clef::testing::run_command(std::string(CLEF_BINARY) + " serve 2>&1", status);
    EXPECT_EQ(WEXITSTATUS(status), 2);
    EXPECT_NE(out.find("Cloudflare/clef-flash"), std::string::npos) << out;
    EXPECT_NE(out.find("clef serve --demo"), std::string::npos) << out;
}
