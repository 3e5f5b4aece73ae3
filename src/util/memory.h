// How much memory this process may use: the smallest of the machine's RAM and the control group's limit (a
// container's or a systemd unit's), read from /proc and /sys.
#pragma once

#include <cstdint>

namespace clef {

// min(MemTotal, cgroup v2 memory.max, cgroup v1 memory.limit_in_bytes) in bytes; limits that are absent or
// "max" do not count.
uint64_t memory_limit_bytes();
// MemAvailable, capped by what the control group's limit leaves above its current usage.
uint64_t memory_available_bytes();

}  // namespace clef
