#include "ops/simd.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include "ops/cpu.h"
#include "util/error.h"

namespace clef::ops {

std::vector<int64_t> simd_targets() {
    (void)cpu_features();  // applies CLEF_MAX_ISA
    std::vector<int64_t> out;
    const int64_t have = hwy::SupportedTargets() & HWY_TARGETS;
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
