#include "util/memory.h"

#include <malloc.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

namespace clef {

namespace {

constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

// A /proc/meminfo field in bytes (kNone when absent).
uint64_t meminfo(const std::string& key) {
    std::ifstream f("/proc/meminfo");
    for (std::string line; std::getline(f, line);)
        if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1)) * 1024;
    return kNone;
}

// The first line of a file as a number of bytes; kNone when absent, "max" or not a number.
uint64_t number_in(const char* path) {
    std::ifstream f(path);
    std::string s;
    if (!(f >> s) || s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return kNone;
    return std::stoull(s);
}

}  // namespace

uint64_t memory_limit_bytes() {
    return std::min({meminfo("MemTotal"), number_in("/sys/fs/cgroup/memory.max"),
                     number_in("/sys/fs/cgroup/memory/memory.limit_in_bytes")});
}

uint64_t memory_available_bytes() {
    uint64_t avail = meminfo("MemAvailable");
    for (const auto& [limit, usage] :
         {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
          std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                    "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
        const uint64_t l = number_in(limit), u = number_in(usage);
        if (l != kNone && u != kNone) avail = std::min(avail, l > u ? l - u : 0);
    }
    return avail == kNone ? 0 : avail;
}

void keep_freed_memory() {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, INT32_MAX);
}

}  // namespace clef
