// The vector kernel behind ops::attention_fast, compiled per Highway target in attention_kernels.cpp and
// dispatched at run time. Internal to src/ops; the scalar oracle is ops::attention (ops/basic.h).
#pragma once

#include <cstdint>

namespace clef::ops::simd {

constexpr int kAttnQueryRows = 32;  // query positions per task (a multiple of two vectors on every target)
constexpr int kAttnKeyRows = 64;    // keys per block of the online softmax

// One attention_fast call: row t of q / k / v / out starts at t * stride elements, head h at h * dh.
struct AttnCall {
    const float* q;
    int64_t qs;
    const void* k;  // fp32 or (kv_bf16) bf16 bits
    const void* v;
    int64_t ks, vs;
    bool kv_bf16;     // K/V rows stored as bf16
    bool round_bf16;  // Precision::BF16: q, k, p and v rounded to bf16 values before their products
    int64_t lq, lk;
    int hq, hkv, dh;
    float scale;
    bool causal;
    float* out;
    int64_t os;
};

// Floats of per-thread scratch attention_task needs.
int64_t attention_scratch_floats(const AttnCall& a);

// The hq / hkv query heads of kv head g over query rows [i0, i0 + n) (n <= kAttnQueryRows): one pass over
// their visible keys, each key block read once for all of them.
void attention_task(const AttnCall& a, int g, int64_t i0, int n, float* scratch);

}  // namespace clef::ops::simd
