// Runtime SIMD dispatch shared by every kernel in src/ops: the Highway targets compiled into this binary,
// the one dispatch picks on this CPU, and a way to force one (tests, measurements).
//
// Every hand-written vector kernel is compiled once per Highway target (src/ops/simd_kernels.cpp) and called
// through HWY_DYNAMIC_DISPATCH, so the same source serves SSE4, AVX2, AVX-512 and NEON. The environment
// variable CLEF_MAX_ISA (see ops/cpu.h) caps the targets as it caps oneDNN.
#pragma once

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
