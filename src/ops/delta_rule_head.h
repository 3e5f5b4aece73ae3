// One value head's view of DeltaRuleArgs (ops/delta_rule.h): its pointers and its state in and out. Internal
// to src/ops, shared by the reference recurrences (delta_rule.cpp) and the per-target fast form
// (delta_rule_kernels.cpp).
#pragma once

#include <algorithm>
#include <cstring>

#include "ops/delta_rule.h"

namespace clef::ops::delta {

// Pointers of value head h.
struct Head {
    const float* q;
    const float* k;
    const float* v;
    const float* beta;
    const float* g;
    float* out;
};

inline Head head_of(const DeltaRuleArgs& a, int h) {
    const int kh = h / (a.num_v_heads / a.num_k_heads);
    return {a.q + kh * a.dk, a.k + kh * a.dk, a.v + static_cast<int64_t>(h) * a.dv,
            a.beta + h,      a.g + h,         a.out + static_cast<int64_t>(h) * a.dv};
}

inline void load_state(const DeltaRuleArgs& a, int h, float* S) {
    const size_t n = static_cast<size_t>(a.dk) * a.dv;
    if (a.initial_state)
        std::memcpy(S, a.initial_state + h * n, n * sizeof(float));
    else
        std::fill(S, S + n, 0.f);
}

inline void store_state(const DeltaRuleArgs& a, int h, const float* S) {
    const size_t n = static_cast<size_t>(a.dk) * a.dv;
    if (a.final_state) std::memcpy(a.final_state + h * n, S, n * sizeof(float));
}

// The fast chunked form of value head h with chunk length C (delta_rule_kernels.cpp, per Highway target).
void chunked_head_fast(const DeltaRuleArgs& a, int h, int C);

}  // namespace clef::ops::delta
