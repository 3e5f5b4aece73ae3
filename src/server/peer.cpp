#include "server/peer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace clef {

namespace {

bool endpoint_of(const sockaddr_storage& ss, std::string& addr, int& port) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (ss.ss_family == AF_INET) {
        const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
        port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
        inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
        port = ntohs(a->sin6_port);
    } else {
        return false;
    }
    addr = buf;
    return true;
}

}  // namespace

bool peer_connected(const std::string& remote_addr, int remote_port, int local_port) {
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return true;
    bool connected = true;
    while (dirent* e = readdir(dir)) {
        char* end = nullptr;
        long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0') continue;
        sockaddr_storage peer{}, self{};
        socklen_t len = sizeof peer;
        if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
        std::string addr;
        int port = -1;
        if (!endpoint_of(peer, addr, port) || port != remote_port || addr != remote_addr) continue;
        len = sizeof self;
        if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &len) != 0) continue;
        std::string self_addr;
        int self_port = -1;
        if (!endpoint_of(self, self_addr, self_port) || self_port != local_port) continue;
        char c;
        ssize_t r = recv(static_cast<int>(fd), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) connected = false;
        break;
    }
    closedir(dir);
    return connected;
}

}  // namespace clef
