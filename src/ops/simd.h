// Runtime SIMD dispatch shared by every kernel in src/ops: the Highway targets compiled into this binary,
// the one dispatch picks on this CPU, and a way to force one (tests, measurements).
//
// Every hand-written vector kernel is compiled once per Highway target (src/ops/simd_kernels.cpp) and called
// through HWY_DYNAMIC_DISPATCH, so the same source serves SSE4, AVX2, AVX-512, NEON and SVE. The environment
// variable CLEF_MAX_ISA (see ops/cpu.h) caps the targets as it caps oneDNN.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace clef::ops {

// The Highway targets compiled in and usable on this CPU under CLEF_MAX_ISA, best first (never empty).
std::vector<int64_t> simd_targets();
// Highway's name of a target ("AVX3", "AVX2", "SSE4", "EMU128", "NEON", ...).
std::string simd_target_name(int64_t target);
// The name of the target the kernels dispatch to now.
std::string simd_target();

// The families of Highway kernels in src/ops (one per *_kernels.cpp file). Each kernel notes the target it
// ran on, so a test can see which per-target code CLEF_MAX_ISA or ScopedSimdTarget made the dispatch pick.
enum class KernelFamily { Gemm, Attention, Elementwise, DeltaRule, Dequant, Quant, Int8, kCount };
// Highway's name of the target the family's last kernel call ran on ("" before its first call).
std::string last_target(KernelFamily family);

// Called by each per-target kernel with its HWY_TARGET: a relaxed load and, on a change only, a store.
inline std::atomic<int64_t> g_last_target[static_cast<int>(KernelFamily::kCount)];
inline void note_target(KernelFamily family, int64_t target) {
    std::atomic<int64_t>& last = g_last_target[static_cast<int>(family)];
    if (last.load(std::memory_order_relaxed) != target) last.store(target, std::memory_order_relaxed);
}

// Forces the dispatch to one target of simd_targets() while it lives (not thread-safe: tests and benchmarks
// set it before running kernels). The previous choice comes back on destruction.
class ScopedSimdTarget {
public:
    explicit ScopedSimdTarget(int64_t target);
    ~ScopedSimdTarget();
    ScopedSimdTarget(const ScopedSimdTarget&) = delete;
    ScopedSimdTarget& operator=(const ScopedSimdTarget&) = delete;
};

}  // namespace clef::ops
