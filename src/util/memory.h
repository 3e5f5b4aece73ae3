// How much memory this process may use: the smallest of the machine's RAM and the control group's limit (a
// container's or a systemd unit's), read from /proc and /sys; and how the allocator keeps freed memory.
#pragma once

#include <cstdint>

namespace clef {

// min(MemTotal, cgroup v2 memory.max, cgroup v1 memory.limit_in_bytes) in bytes; limits that are absent or
// "max" do not count.
uint64_t memory_limit_bytes();
// MemAvailable, capped by what the control group's limit leaves above its current usage.
uint64_t memory_available_bytes();

// A decision allocates and frees activation buffers of tens of MiB per layer. By default glibc hands freed
// memory at the top of the heap back to the system and the next layer page-faults it in again (measured:
// ~30 % of a 512-token decision on the flash-shaped model, docs/PERFORMANCE.md). This keeps it: blocks up to
// 32 MiB come from the heap, and the heap is never trimmed. Programs that run decisions call it first (the
// clef binary, the benchmarks).
void keep_freed_memory();

}  // namespace clef
