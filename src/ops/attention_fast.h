// The one fast attention (the scalar reference is ops::attention in ops/basic.h). Causal / full attention for
// long prompts: key blocks with an online softmax (no lq x lk score matrix), GQA
// (each key block read once for all query heads of its kv head), explicit row strides as in ops::attention
// (the scalar oracle in ops/basic.h). The K/V rows are read where they lie: no copy of the cache per call.
#pragma once

#include <cstdint>

#include "ops/gemm.h"

namespace clef::ops {

// Same layout and meaning as ops::attention, generalised to a query block at the end of the keys: when
// causal, query i sits at position lk - lq + i and sees keys j <= lk - lq + i (lq == lk is ops::attention's
// causal case; lq < lk is a prompt chunk after a KV cache). Requires 0 < lq, lq <= lk when causal, hq a
// multiple of hkv. Precision::Exact: fp32 products and a fp32 online softmax (agrees with ops::attention to
// ~1e-6 relative). Precision::BF16: q, k, p and v are rounded to bf16 before their products (fp32
// accumulation), the numerics of a bf16 matrix unit; error ~1e-2 relative on the output (documented bound
// used by the tests: 2e-2 of max |v|). Throws clef::Error on a bad shape.
// Two implementations behind this one entry: bidirectional fp32 attention (Exact, fp32 K/V: the vision
// tower's frames, the joint head's memory) computes whole score rows with small_gemm_acc products and
// softmax_inplace_fast_f32 (ops/basic.h); everything else runs the flash kernel (ops/attention_kernels.cpp).
void attention_fast(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                    int64_t v_stride, int64_t lq, int64_t lk, int hq, int hkv, int dh, float scale,
                    bool causal, float* out, int64_t out_stride, Precision p = Precision::Exact);

// The same over K/V rows stored as bf16 bits (BackboneOptions::kv_bf16): exact arithmetic on those values.
void attention_fast(const float* q, int64_t q_stride, const uint16_t* k, int64_t k_stride, const uint16_t* v,
                    int64_t v_stride, int64_t lq, int64_t lk, int hq, int hkv, int dh, float scale,
                    bool causal, float* out, int64_t out_stride, Precision p = Precision::Exact);

// Multi-head attention of lq queries over T memory rows m [T][w] whose key and value projections are factored
// out (the joint head's, model/head.cpp): per head h of dh = w / heads, with q [lq][w] already projected and
// wk, wv [w][w], bv [w] the key and value projections,
//   out[i][h] = Σ_j softmax_j(q_i,h · (W_k,h m_j) / sqrt(dh)) (W_v,h m_j + b_v,h)
//             = W_v,h (Σ_j p_j m_j) + b_v,h   with the scores (W_k,hᵀ q_i,h) · m_j,
// equal up to rounding to projecting the T rows first (the key bias adds a constant per query that cancels in
// the softmax; Σ_j p_j = 1): O(T·w·heads·lq) work instead of O(T·w²). out [lq][w], heads concatenated. Its
// oracle is that projection followed by ops::attention.
void memory_attention_fast(const float* q, int64_t lq, int heads, int64_t w, const float* wk, const float* wv,
                           const float* bv, const float* m, int64_t T, float* out);

}  // namespace clef::ops
