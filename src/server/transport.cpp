#include "server/transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <utility>

namespace clef {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// poll() on one socket for `events`, retrying on EINTR; >0 ready, 0 timeout, <0 error.
int poll_one(int sock, short events, milliseconds timeout) {
    pollfd p{sock, events, 0};
    for (;;) {
        int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, timeout.count())));
        if (r < 0 && errno == EINTR) continue;
        if (r > 0 && (p.revents & (POLLERR | POLLNVAL))) return -1;
        return r;
    }
}

void ip_and_port(const sockaddr_storage& addr, std::string& ip, int& port) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (addr.ss_family == AF_INET) {
        const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
        ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
        port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
        const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
        ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
        port = ntohs(a->sin6_port);
    }
    ip = buf;
}

thread_local bool t_close_after_response = false;

// Counts the connections waiting for a pool thread.
class CountingPool : public httplib::TaskQueue {
public:
    CountingPool(size_t n, std::atomic<int>& backlog) : pool_(n), backlog_(backlog) {}
    void enqueue(std::function<void()> fn) override {
        ++backlog_;
        pool_.enqueue([this, fn = std::move(fn)] {
            --backlog_;
            fn();
        });
    }
    void shutdown() override { pool_.shutdown(); }

private:
    httplib::ThreadPool pool_;
    std::atomic<int>& backlog_;
};

}  // namespace

// A buffered socket stream whose reads fail once the current request's deadline has passed.
class DeadlineStream : public httplib::Stream {
public:
    DeadlineStream(int sock, milliseconds io_timeout) : sock_(sock), io_timeout_(io_timeout) {}

    void start_request(Clock::time_point deadline) { deadline_ = deadline; }
    bool has_buffered() const { return pos_ < len_; }

    bool is_readable() const override { return has_buffered() || poll_one(sock_, POLLIN, read_wait()) > 0; }
    bool is_writable() const override { return poll_one(sock_, POLLOUT, io_timeout_) > 0; }

    ssize_t read(char* ptr, size_t size) override {
        if (!has_buffered()) {
            if (poll_one(sock_, POLLIN, read_wait()) <= 0) return -1;
            ssize_t n;
            do {
                n = ::recv(sock_, buf_, sizeof buf_, 0);
            } while (n < 0 && errno == EINTR);
            if (n <= 0) return n;
            pos_ = 0;
            len_ = static_cast<size_t>(n);
        }
        size_t n = std::min(size, len_ - pos_);
        std::memcpy(ptr, buf_ + pos_, n);
        pos_ += n;
        return static_cast<ssize_t>(n);
    }

    ssize_t write(const char* ptr, size_t size) override {
        if (poll_one(sock_, POLLOUT, io_timeout_) <= 0) return -1;
        ssize_t n;
        do {
            n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
        } while (n < 0 && errno == EINTR);
        return n;
    }

    void get_remote_ip_and_port(std::string& ip, int& port) const override {
        sockaddr_storage addr{};
        socklen_t len = sizeof addr;
        if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip_and_port(addr, ip, port);
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
        sockaddr_storage addr{};
        socklen_t len = sizeof addr;
        if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip_and_port(addr, ip, port);
    }
    socket_t socket() const override { return sock_; }

private:
    // How long the next read may wait: the inactivity timeout, cut at the request deadline.
    milliseconds read_wait() const {
        auto left = std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now());
        return std::max(milliseconds(0), std::min(left, io_timeout_));
    }

    int sock_;
    milliseconds io_timeout_;
    Clock::time_point deadline_ = Clock::time_point::max();
    char buf_[4096];
    size_t pos_ = 0, len_ = 0;
};

HardenedHttpServer::HardenedHttpServer(TransportLimits limits) {
    set_limits(limits);
}

void HardenedHttpServer::close_after_response(httplib::Response& res) {
    if (!t_close_after_response) res.set_header("Connection", "close");  // the client must not reuse it
    t_close_after_response = true;
}

void HardenedHttpServer::set_limits(const TransportLimits& limits) {
    limits_ = limits;
    new_task_queue = [this] { return new CountingPool(limits_.http_threads, backlog_); };
}

void HardenedHttpServer::widen_listen_backlog() {
    socket_t s = svr_sock_;
    if (s != INVALID_SOCKET) ::listen(s, SOMAXCONN);  // Linux: listen() again updates the backlog
}

bool HardenedHttpServer::wait_for_request(DeadlineStream& strm, bool first) {
    if (strm.has_buffered()) return true;  // pipelined request already read
    const auto start = Clock::now();
    const auto keep_alive = std::chrono::seconds(keep_alive_timeout_sec_);
    for (;;) {
        if (svr_sock_ == INVALID_SOCKET) return false;  // stopping
        const auto idle = Clock::now() - start;
        if (idle >= keep_alive) return false;
        if (const int waiting = backlog_.load(); waiting > 0) {  // others wait for this thread
            milliseconds grace = limits_.idle_grace;
            if (first) {
                // A client sends right after connecting, but may be slow to be scheduled: give new
                // connections longer, shared out so that a flood of silent ones still yields threads quickly.
                grace = std::max(milliseconds(250), limits_.first_byte_grace *
                                                        static_cast<int64_t>(limits_.http_threads) / waiting);
            }
            if (idle >= grace) return false;
        }
        int r = poll_one(strm.socket(), POLLIN, milliseconds(20));
        if (r < 0) return false;
        if (r > 0) return true;  // data, or EOF (the read sees it)
    }
}

bool HardenedHttpServer::process_and_close_socket(socket_t sock) {
    DeadlineStream strm(sock, limits_.io_timeout);
    bool ok = true;
    for (size_t left = keep_alive_max_count_; left > 0; --left) {
        if (!wait_for_request(strm, left == keep_alive_max_count_)) break;
        strm.start_request(Clock::now() + limits_.request_deadline);
        bool closed = false;
        t_close_after_response = false;
        ok = process_request(strm, left == 1, closed, {});
        if (!ok || closed || t_close_after_response) break;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
}

}  // namespace clef
