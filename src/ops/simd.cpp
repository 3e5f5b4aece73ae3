#include "ops/simd.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include "ops/cpu.h"
#include "util/error.h"

namespace clef::ops {

namespace {

// hwy::SupportedTargets() under CLEF_MAX_ISA, the dispatch left pointing at the best of them. Highway 1.0's
// SupportedTargets re-detects the CPU and points HWY_DYNAMIC_DISPATCH at every target it has before it
// applies DisableTargets' mask, so without the Update below the first kernel after a call ran on the best
// target whatever the cap (CLEF_MAX_ISA=baseline ran every kernel family on AVX3). A test mock
// (SetSupportedTargetsForTest) is already masked: the Update points the dispatch at it again, no change.
int64_t supported_targets() {
    (void)cpu_features();  // applies CLEF_MAX_ISA
    const int64_t have = hwy::SupportedTargets();
    hwy::GetChosenTarget().Update(have);
    return have;
}

}  // namespace

std::vector<int64_t> simd_targets() {
    std::vector<int64_t> out;
    const int64_t have = supported_targets() & HWY_TARGETS;
    // Highway's target bits: a lower bit is a better target.
    for (int64_t t = have; t != 0; t &= t - 1) out.push_back(t & -t);
    return out;
}

std::string simd_target_name(int64_t target) {
    return hwy::TargetName(target);
}

std::string simd_target() {
    const std::vector<int64_t> t = simd_targets();
    return simd_target_name(t.front());
}

std::string last_target(KernelFamily family) {
    const int64_t t = g_last_target[static_cast<int>(family)].load(std::memory_order_relaxed);
    return t == 0 ? std::string() : simd_target_name(t);
}

ScopedSimdTarget::ScopedSimdTarget(int64_t target) {
    bool known = false;
    for (int64_t t : simd_targets()) known = known || t == target;
    if (!known)
        throw Error("ScopedSimdTarget: target " + simd_target_name(target) + " is not available here");
    hwy::SetSupportedTargetsForTest(target);
}

ScopedSimdTarget::~ScopedSimdTarget() {
    hwy::SetSupportedTargetsForTest(0);
}

}  // namespace clef::ops
