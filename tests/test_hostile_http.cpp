// Hostile HTTP input against the System One server, in-process on loopback with the tiny fixture model. Every
// class of abuse gets a defined 4xx (or a closed connection for transport abuse) within a bounded time, and
// the server keeps answering other clients correctly: invalid UTF-8, NaN/Infinity, huge numbers, duplicate
// keys, deep nesting, 100 MB bodies (declared and chunked), slow senders, connection floods, pipelining,
// content types. Raw sockets produce what httplib::Client cannot.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "decision/engine.h"
#include "server/server.h"
#include "test_util.h"
#include "util/json.h"

using namespace clef;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";
const char* const kOk =
    R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"noul","instructions":"ok?"}}})";

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

ServerOptions hostile_options() {
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_name = "tiny-clef";
    o.aliases = {"clef-flash"};
    o.http_threads = 8;
    o.request_read_timeout_s = 2;
    o.io_timeout_s = 2;
    o.max_body_bytes = 1 << 20;
    return o;
}

class Running {
public:
    explicit Running(ServerOptions opt) {
        server_ = std::make_unique<Server>(opt, [] { return Engine::load(kModel); });
        if (!server_->bind()) throw std::runtime_error(server_->error());
        thread_ = std::thread([this] { server_->run(); });
        for (int i = 0; i < 2000 && !server_->ready(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (!server_->ready()) throw std::runtime_error("server not ready: " + server_->error());
    }
    ~Running() {
        server_->stop();
        thread_.join();
    }
    int port() const { return server_->port(); }
    httplib::Client client() const {
        httplib::Client c("127.0.0.1", port());
        c.set_read_timeout(static_cast<time_t>(20 * clef::testing::kTimeScale), 0);
        return c;
    }

private:
    std::unique_ptr<Server> server_;
    std::thread thread_;
};

Running& server() {
    static Running r(hostile_options());
    return r;
}

// The answer to kOk from a fresh single request: what every correct answer during abuse must equal.
const std::string& reference_answer() {
    static const std::string body = [] {
        auto r = server().client().Post("/v1/systemone", kOk, "application/json");
        if (!r || r->status != 200) throw std::runtime_error("reference request failed");
        return r->body;
    }();
    return body;
}

void expect_healthy() {
    auto r = server().client().Post("/v1/systemone", kOk, "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, reference_answer());
}

// A raw TCP connection to the server.
class Raw {
public:
    explicit Raw(int port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
            throw std::runtime_error("connect");
    }
    ~Raw() { ::close(fd_); }
    Raw(const Raw&) = delete;
    Raw& operator=(const Raw&) = delete;

    // False when the peer closed or reset the connection.
    bool send_all(const std::string& s) {
        size_t done = 0;
        while (done < s.size()) {
            ssize_t n = ::send(fd_, s.data() + done, s.size() - done, MSG_NOSIGNAL);
            if (n <= 0) return false;
            done += static_cast<size_t>(n);
        }
        return true;
    }
    // Reads until `n` complete responses arrived (Content-Length framing), EOF or the timeout.
    std::string read_responses(size_t n, double timeout_s) {
        std::string got;
        const auto t0 = Clock::now();
        while (count_responses(got) < n && seconds_since(t0) < timeout_s) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            char buf[65536];
            ssize_t k = ::recv(fd_, buf, sizeof buf, 0);
            if (k <= 0) {
                closed_ = true;
                break;
            }
            got.append(buf, static_cast<size_t>(k));
        }
        return got;
    }
    // True when the server closed the connection within the timeout (EOF or reset).
    bool wait_closed(double timeout_s) {
        const auto t0 = Clock::now();
        while (!closed_ && seconds_since(t0) < timeout_s) read_responses(1000, 0.05);
        return closed_;
    }

    static size_t count_responses(const std::string& s) {
        size_t n = 0, at = 0;
        for (;;) {
            size_t end = s.find("\r\n\r\n", at);
            if (end == std::string::npos) return n;
            size_t cl = s.find("Content-Length: ", at);
            size_t len = cl != std::string::npos && cl < end ? std::stoul(s.substr(cl + 16)) : 0;
            if (s.size() < end + 4 + len) return n;
            ++n;
            at = end + 4 + len;
        }
    }

private:
    int fd_ = -1;
    bool closed_ = false;
};

int status_of(const std::string& response) {
    return response.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(response.c_str() + 9) : 0;
}

std::vector<int> statuses(const std::string& s) {
    std::vector<int> out;
    for (size_t at = s.find("HTTP/1.1 "); at != std::string::npos; at = s.find("HTTP/1.1 ", at + 1))
        out.push_back(std::atoi(s.c_str() + at + 9));
    return out;
}

std::string post_request(const std::string& body, const std::string& extra_headers = "") {
    return "POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra_headers +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

struct Timed {
    int status = 0;
    std::string body;
    double seconds = 0;
};

Timed post(const std::string& body, const std::string& content_type = "application/json") {
    const auto t0 = Clock::now();
    auto r = server().client().Post("/v1/systemone", body, content_type.c_str());
    Timed t;
    t.seconds = seconds_since(t0);
    if (r) {
        t.status = r->status;
        t.body = r->body;
    } else {
        t.body = httplib::to_string(r.error());
    }
    return t;
}

std::string error_message(const std::string& body) {
    JsonValue b = parse_json_or_throw(body, "response");
    const JsonValue* d = b.find("detail");
    if (d && d->is_object() && d->find("message")) return d->find("message")->as_string();
    return d && d->is_string() ? d->as_string() : "";
}

}  // namespace

TEST(HostileHttp, InvalidUtf8Is400) {
    for (std::string bad :
         {std::string("{\"model\":\"clef-flash\",\"state\":\"\xff\xfe\",\"questions\":{}}"),
          std::string("{\"model\":\"clef-flash\",\"state\":\"\xed\xa0\x80\"}"),  // surrogate
          std::string("{\"model\":\"clef-flash\",\"state\":\"\xc0\xaf\"}"),      // overlong
          std::string("{\"state\":\"ok\",\"\xf8\x88\x80\x80\x80\":1}")}) {
        Timed t = post(bad);
        EXPECT_EQ(t.status, 400) << t.body;
        EXPECT_EQ(error_message(t.body), "Request contains invalid JSON.");
        EXPECT_LT(t.seconds, 2.0);
    }
    // An escaped lone surrogate is valid JSON (Python accepts it): the request is answered, not crashed on.
    Timed t = post(
        R"({"model":"clef-flash","state":"\ud800","questions":{"q":{"type":"noul","instructions":"x"}}})");
    EXPECT_TRUE(t.status == 200 || t.status == 400 || t.status == 422) << t.status << " " << t.body;
    expect_healthy();
}

TEST(HostileHttp, NanAndInfinityLiteralsAre400) {
    for (const char* lit : {"NaN", "Infinity", "-Infinity", "nan", "inf", "1e", "-", "01", "0x10", "+1"}) {
        std::string body = std::string(R"({"model":"clef-flash","state":)") + lit +
                           R"(,"questions":{"q":{"type":"noul","instructions":"x"}}})";
        Timed t = post(body);
        EXPECT_EQ(t.status, 400) << lit << " -> " << t.body;
        EXPECT_EQ(error_message(t.body), "Request contains invalid JSON.") << lit;
    }
    expect_healthy();
}

TEST(HostileHttp, HugeNumbersAreDefined) {
    // A float beyond the double range is refused as invalid JSON (Python would read it as inf).
    for (const char* num : {"1e999", "-1e999", "1e400", "-2.5e308"}) {
        std::string body = std::string(R"({"model":"clef-flash","state":)") + num +
                           R"(,"questions":{"q":{"type":"noul","instructions":"x"}}})";
        Timed t = post(body);
        EXPECT_EQ(t.status, 400) << num << " -> " << t.body;
        EXPECT_EQ(error_message(t.body), "Request contains invalid JSON.") << num;
    }
    // As state (any JSON): a 100k-digit integer keeps every digit (Python int), underflow is 0.0; answered in
    // bounded time.
    for (std::string num :
         {std::string("1e-999"), std::string(300, '9'), "-" + std::string(300, '1') + ".5e-3"}) {
        std::string body = R"({"model":"clef-flash","state":)" + num +
                           R"(,"questions":{"q":{"type":"noul","instructions":"x"}}})";
        Timed t = post(body);
        EXPECT_EQ(t.status, 200) << num.substr(0, 20) << " -> " << t.body;
        EXPECT_LT(t.seconds, 10.0);
    }
    // Integers beyond the double range (Python refuses over 4300 digits too): 400.
    for (std::string num : {std::string(400, '9'), std::string(100000, '9')}) {
        Timed t = post(R"({"model":"clef-flash","state":)" + num + R"(,"questions":{"q":{"type":"noul"}}})");
        EXPECT_EQ(t.status, 400) << t.body;
        EXPECT_LT(t.seconds, 5.0);
    }
    // Where a string is required: 422.
    Timed t =
        post(R"({"model":)" + std::string(300, '7') + R"(,"state":"s","questions":{"q":{"type":"noul"}}})");
    EXPECT_EQ(t.status, 422) << t.body;
    // As criteria level descriptions and instructions: answered.
    t = post(R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"score","instructions":)" +
             std::string(300, '5') + R"(,"criteria":[1e300,-1e300]}}})");
    EXPECT_TRUE(t.status == 200 || t.status == 422) << t.body;
    expect_healthy();
}

TEST(HostileHttp, DuplicateKeysTakeTheLastValue) {
    // Python dict semantics: the last value wins, at the first key's position. Same answer as the plain
    // request.
    Timed dup =
        post(R"({"model":"nope","state":"other","model":"clef-flash","questions":{"q":{"type":"choice"}},)"
             R"("state":"s","questions":{"q":{"type":"noul","instructions":"ok?"}}})");
    EXPECT_EQ(dup.status, 200) << dup.body;
    EXPECT_EQ(dup.body, reference_answer());
}

TEST(HostileHttp, DeepNestingIs400Fast) {
    // "Fast" relative to a flat body of the same size on this machine (sanitizers and busy cores slow both
    // alike): the depth limit stops the parse early instead of recursing 100,000 levels.
    const Timed flat = post(R"({"model":"no-such-model","state":")" + std::string(600000, 'x') +
                            R"(","questions":{"q":{"type":"noul"}}})");  // parsed whole, then refused (400)
    EXPECT_EQ(flat.status, 400);
    const double bound = 2.0 + 10 * flat.seconds;
    for (char open : {'[', '{'}) {
        std::string nest;
        if (open == '[') {
            nest = std::string(100000, '[') + std::string(100000, ']');
        } else {
            for (int i = 0; i < 100000; ++i) nest += "{\"a\":";
            nest += "1" + std::string(100000, '}');
        }
        std::string body =
            R"({"model":"clef-flash","state":)" + nest + R"(,"questions":{"q":{"type":"noul"}}})";
        Timed t = post(body);
        EXPECT_EQ(t.status, 400) << open;
        EXPECT_EQ(error_message(t.body), "Request JSON is nested deeper than 128 levels.");
        EXPECT_LT(t.seconds, bound) << "flat body: " << flat.seconds << " s";
        // Unterminated deep nesting too.
        t = post(std::string(200000, '['));
        EXPECT_EQ(t.status, 400);
    }
    expect_healthy();
}

TEST(HostileHttp, HundredMegabyteBodiesAre413) {
    // Declared by Content-Length: refused from the headers, without reading 100 MB.
    {
        Raw c(server().port());
        const auto t0 = Clock::now();
        ASSERT_TRUE(
            c.send_all("POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 104857600\r\n\r\n{\"model\":"));
        std::string r = c.read_responses(1, 5);
        EXPECT_EQ(status_of(r), 413) << r;
        EXPECT_LT(seconds_since(t0), 1.5);  // before the 2 s request deadline: refused from the header
        // The rest of the body is never read: the server closes instead of keeping the connection.
        std::string chunk(1 << 20, 'x');
        for (int i = 0; i < 100 && c.send_all(chunk); ++i) {
        }
        EXPECT_TRUE(c.wait_closed(5));
    }
    // Chunked: refused once the limit (1 MiB in this test) is passed.
    {
        Raw c(server().port());
        const auto t0 = Clock::now();
        ASSERT_TRUE(
            c.send_all("POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n"));
        std::string chunk(1 << 16, ' ');
        char head[32];
        std::snprintf(head, sizeof head, "%zx\r\n", chunk.size());
        std::string piece = head + chunk + "\r\n";
        for (int i = 0; i < 1600 && c.send_all(piece); ++i) {  // up to 100 MiB
        }
        std::string r = c.read_responses(1, 5);
        EXPECT_EQ(status_of(r), 413) << r.substr(0, 200);
        EXPECT_LT(seconds_since(t0), 10.0);
    }
    // Through httplib: 100 MB in one request.
    // The server answers 413 from the header and closes; the client may see the answer or, still writing, a
    // reset.
    Timed t = post(std::string(100u << 20, ' '));
    EXPECT_TRUE(t.status == 413 || t.status == 0) << t.status;
    EXPECT_LT(t.seconds, 5.0);
    expect_healthy();
}

TEST(HostileHttp, SlowSendersAreCutAtTheRequestDeadline) {
    // Four slowloris connections drip one header byte every 200 ms. Each is closed at the request deadline (2
    // s here), and meanwhile other clients are answered normally.
    std::atomic<int> closed{0};
    std::atomic<double> worst{0};
    std::vector<std::thread> slow;
    for (int i = 0; i < 4; ++i) {
        slow.emplace_back([&] {
            Raw c(server().port());
            const auto t0 = Clock::now();
            std::string head = "POST /v1/systemone HTTP/1.1\r\nHost: x\r\nX-Slow: ";
            c.send_all(head);
            while (seconds_since(t0) < 8) {
                if (!c.send_all("a")) break;
                if (c.wait_closed(0.2)) break;
            }
            if (c.wait_closed(0.5)) {
                ++closed;
                double s = seconds_since(t0);
                double w = worst.load();
                while (s > w && !worst.compare_exchange_weak(w, s)) {
                }
            }
        });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int i = 0; i < 3; ++i) {
        Timed t = post(kOk);
        EXPECT_EQ(t.status, 200);
        EXPECT_EQ(t.body, reference_answer());
        EXPECT_LT(t.seconds, 5.0);
    }
    for (auto& th : slow) th.join();
    EXPECT_EQ(closed.load(), 4);
    EXPECT_LT(worst.load(),
              5.0);  // 2 s deadline + slack for a loaded machine (unbounded without the deadline)
    // A body that stalls half-way is cut too, with a 400 or a close.
    Raw c(server().port());
    const auto t0 = Clock::now();
    c.send_all("POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\"");
    std::string r = c.read_responses(1, 5);
    EXPECT_TRUE(r.empty() || status_of(r) == 400) << r;
    EXPECT_TRUE(c.wait_closed(4));
    EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(HostileHttp, IdleConnectionFloodDoesNotStarveClients) {
    // 200 idle connections against 8 HTTP threads: an idle connection gives its thread up once others wait.
    std::vector<std::unique_ptr<Raw>> idle;
    for (int i = 0; i < 200; ++i) idle.push_back(std::make_unique<Raw>(server().port()));
    Timed t = post(kOk);
    EXPECT_EQ(t.status, 200);
    EXPECT_EQ(t.body, reference_answer());
    EXPECT_LT(t.seconds, 20.0);  // 200 x 250 ms / 8 threads at worst; 125 s if idle connections kept threads
    // The idle ones are closed.
    size_t closed = 0;
    for (auto& c : idle) closed += c->wait_closed(0.01) ? 1 : 0;
    EXPECT_GT(closed, 150u);
    idle.clear();
    expect_healthy();
}

TEST(HostileHttp, ManyConcurrentClientsAllAnswered) {
    // 48 clients (6x the HTTP threads) post at once: each gets the reference answer or a 529 (queue full).
    std::vector<std::thread> th;
    std::atomic<int> ok{0}, overloaded{0}, other{0};
    for (int i = 0; i < 48; ++i) {
        th.emplace_back([&] {
            Timed t = post(kOk);
            if (t.status == 200 && t.body == reference_answer())
                ++ok;
            else if (t.status == 529)
                ++overloaded;
            else {
                ++other;
                ADD_FAILURE() << "status " << t.status << " after " << t.seconds << " s: " << t.body;
            }
        });
    }
    for (auto& x : th) x.join();
    EXPECT_EQ(other.load(), 0);
    EXPECT_GT(ok.load(), 0);
    EXPECT_EQ(ok + overloaded, 48);
}

TEST(HostileHttp, PipelinedRequestsAnsweredInOrder) {
    Raw c(server().port());
    std::string pipeline = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post_request(kOk) +
                           post_request("[NaN]") + "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n" +
                           post_request(kOk);
    ASSERT_TRUE(c.send_all(pipeline));
    std::string r = c.read_responses(5, 10);
    EXPECT_EQ(statuses(r), (std::vector<int>{200, 200, 400, 404, 200})) << r;
    EXPECT_NE(r.find(reference_answer()), std::string::npos);
}

TEST(HostileHttp, RejectedBodiesDoNotCorruptTheNextRequest) {
    // Auth is checked before the body is read; the unread body must not be parsed as the next request.
    ServerOptions o = hostile_options();
    o.api_keys = {"k"};
    Running s(o);
    Raw c(s.port());
    std::string body = std::string(kOk) + std::string(1000, ' ');
    std::string pipeline = post_request(body, "Authorization: Bearer wrong\r\n") +
                           post_request(kOk, "Authorization: Bearer k\r\n");
    ASSERT_TRUE(c.send_all(pipeline));
    std::string r = c.read_responses(2, 10);
    std::vector<int> st = statuses(r);
    ASSERT_FALSE(st.empty()) << r;
    EXPECT_EQ(st[0], 401);
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;  // so keep-alive clients do not reuse it
    // Either the second request is answered correctly, or the connection was closed after the 401.
    if (st.size() > 1)
        EXPECT_EQ(st[1], 200) << r;
    else
        EXPECT_TRUE(c.wait_closed(3));
}

TEST(HostileHttp, GarbageRequestLinesAndHeaders) {
    const std::string cases[] = {
        "GARBAGE\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n",
        "POST /v1/systemone HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        "POST /v1/systemone HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "POST /v1/systemone HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n",
        "GET /health HTTP/1.1\r\nX: " + std::string(20000, 'b') + "\r\n\r\n",
        std::string("\0\0\0\0\r\n\r\n", 8),
    };
    for (const auto& req : cases) {
        Raw c(server().port());
        const auto t0 = Clock::now();
        c.send_all(req);
        std::string r = c.read_responses(1, 4);
        int st = status_of(r);
        EXPECT_TRUE(r.empty() || (st >= 400 && st < 500)) << req.substr(0, 60) << " -> " << r.substr(0, 80);
        EXPECT_TRUE(c.wait_closed(4)) << req.substr(0, 60);
        EXPECT_LT(seconds_since(t0), 4.5);
    }
    expect_healthy();
}

TEST(HostileHttp, ContentTypePolicy) {
    // JSON media types (any case, parameters, +json) are accepted, and so is a missing header.
    for (const char* ct : {"application/json", "Application/JSON; charset=UTF-8", "application/vnd.api+json",
                           "application/json;charset=\"utf-8\""}) {
        Timed t = post(kOk, ct);
        EXPECT_EQ(t.status, 200) << ct << " " << t.body;
    }
    {
        Raw c(server().port());
        c.send_all("POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                   std::to_string(strlen(kOk)) + "\r\n\r\n" + kOk);
        EXPECT_EQ(status_of(c.read_responses(1, 10)), 200);
    }
    // Everything else: 415 with the api_usage_error shape, even for a form body over httplib's 8 KiB form
    // limit.
    for (const char* ct :
         {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
          "application/json; charset=latin-1", "application/jsonx", "json", "+json"}) {
        Timed t = post(kOk, ct);
        EXPECT_EQ(t.status, 415) << ct << " " << t.body;
        EXPECT_EQ(error_message(t.body), "Content-Type must be application/json (UTF-8).") << ct;
    }
    Timed t = post(std::string(kOk) + std::string(20000, ' '), "application/x-www-form-urlencoded");
    EXPECT_EQ(t.status, 415) << t.body;
    expect_healthy();
}
