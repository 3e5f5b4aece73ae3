// The HTTP transport of clef serve, hardened against abusive clients on top of cpp-httplib 0.11:
//   * every request must arrive (request line, headers and body) within a total deadline, so a slow sender
//     (slowloris) holds a connection thread for a bounded time, not forever;
//   * an idle keep-alive connection gives its thread up as soon as other connections wait for one (after a
//     short grace), so a flood of idle connections cannot starve the clients that send requests;
//   * reads and writes each have an inactivity timeout; the server's stop() ends idle waits promptly;
//   * a handler can ask for the connection to be closed after its response (close_after_response(res)).
// Request parsing, routing and responses stay httplib's (Server::process_request).
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>

namespace clef {

struct TransportLimits {
    std::chrono::milliseconds request_deadline{30000};  // from the first byte of a request to its last
    std::chrono::milliseconds io_timeout{30000};        // inactivity while reading or writing
    std::chrono::milliseconds idle_grace{100};          // idle keep-alive time kept under backlog
    std::chrono::milliseconds first_byte_grace{
        2000};  // a new connection's wait for its first request under
                // backlog, shared out: grace * threads / backlog, >= 250 ms
    size_t http_threads = 64;
};

class HardenedHttpServer : public httplib::Server {
public:
    explicit HardenedHttpServer(TransportLimits limits = {});
    void set_limits(const TransportLimits& limits);
    // After bind: a listen backlog of SOMAXCONN instead of httplib's 5, so a burst of connects is not
    // dropped.
    void widen_listen_backlog();
    // Called from a handler: close the connection once the current response is written (a rejected request
    // whose body was never read, or a malformed one, so the rest of its bytes cannot be taken for the next
    // request).
    // Also sets "Connection: close" on the response, so that keep-alive clients do not reuse the connection.
    static void close_after_response(httplib::Response& res);
    // Connections accepted and waiting for a thread (for tests and metrics).
    int backlog() const { return backlog_.load(); }

private:
    bool process_and_close_socket(socket_t sock) override;
    // Waits until a request's first bytes are available; false to close the connection.
    bool wait_for_request(class DeadlineStream& strm, bool first);

    TransportLimits limits_;
    std::atomic<int> backlog_{0};
};

}  // namespace clef
