// Gated delta rule (the recurrence of a Gated DeltaNet layer), fp32 reference kernels.
//
// Per value head h (key head kh = h / (Hv / Hk), HF repeat_interleave order), with a state S[dk][dv]:
//     S   = exp(g_t) * S
//     u   = beta_t * (v_t - S^T k_t)
//     S  += k_t u^T
//     o_t = S^T q_t
// q must already be L2-normalised and scaled by 1/sqrt(dk); k L2-normalised (see l2_norm).
#pragma once

#include <cstdint>

namespace clef::ops {

// y = x * rsqrt(sum(x^2) + eps) * scale for each of `rows` rows of d values (one row = one head); the sum of
// squares is accumulated in double. x and y may alias.
void l2_norm(const float* x, int64_t rows, int64_t d, float eps, float scale, float* y);

struct DeltaRuleArgs {
    int64_t T = 0;
    int num_k_heads = 0;  // Hk
    int num_v_heads = 0;  // Hv, a multiple of Hk
    int dk = 0;
    int dv = 0;
    // Token t, key head kh: q + t*q_stride + kh*dk (likewise k). Value head h: v + t*v_stride + h*dv.
    const float* q = nullptr;
    int64_t q_stride = 0;
    const float* k = nullptr;
    int64_t k_stride = 0;
    const float* v = nullptr;
    int64_t v_stride = 0;
    // beta[t*beta_stride + h] in (0, 1); g[t*g_stride + h] <= 0 (log decay).
    const float* beta = nullptr;
    int64_t beta_stride = 0;
    const float* g = nullptr;
    int64_t g_stride = 0;
    // Output o_t of value head h at out + t*out_stride + h*dv. Must not alias the inputs.
    float* out = nullptr;
    int64_t out_stride = 0;
    // [Hv][dk][dv]: the state before token 0 (null = zeros) and, if non-null, the state after token T-1.
    // final_state may alias initial_state.
    const float* initial_state = nullptr;
    float* final_state = nullptr;
};

// Token-serial recurrence, fp32 state. Value heads run in parallel.
void gated_delta_rule_serial(const DeltaRuleArgs& a);

// The same result computed chunk by chunk (WY / UT-transform form), chunk length `chunk` (64 in HF and
// llama.cpp). Inside a chunk, with fp32 cumulative log decays G_i = g_1 + ... + g_i:
//     A[i][j] = beta_i (k_i . k_j) exp(G_i - G_j)                 for j < i
//     (I + A) U = beta V,  (I + A) W = beta exp(G) K              (forward substitution)
//     V' = U - W S;  O = exp(G) Q S + ((Q K^T) o D) V';  S = exp(G_n) S + (K exp(G_n - G))^T V'
// where D[i][j] = exp(G_i - G_j) for j <= i and 0 above the diagonal. The mask is applied before exp, so only
// differences <= 0 (up to rounding) are exponentiated. A partial last chunk is handled without padding.
void gated_delta_rule_chunked(const DeltaRuleArgs& a, int chunk = 64);

// The same chunked algebra with contiguous chunk copies, the decays exponentiated once per chunk and vectorised
// inner loops (AVX-512 clone at run time): the fast path of gated_delta_rule_chunked, tested against the serial
// reference. fp32 state and fp32 cumulative decays as above.
void gated_delta_rule_chunked_fast(const DeltaRuleArgs& a, int chunk = 64);

}  // namespace clef::ops
