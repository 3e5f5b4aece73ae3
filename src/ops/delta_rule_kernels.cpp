// The fast chunked gated delta rule of one value head (ops::gated_delta_rule_chunked_fast), compiled once per
// Highway target (foreach_target.h re-includes this file) and dispatched at run time under CLEF_MAX_ISA. The
// `omp simd` loops are vectorised by the compiler for each target; the chunk's products are small_gemm_acc
// calls (ops/gemm.h). Tested against the token-serial reference on every target (tests/test_ops_fast.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/delta_rule_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>
#include <vector>

#include "ops/basic.h"
#include "ops/delta_rule_head.h"
#include "ops/gemm.h"
#include "ops/simd.h"

HWY_BEFORE_NAMESPACE();
namespace clef::ops::delta {
namespace HWY_NAMESPACE {

// The chunked form with the chunk's products as small register-blocked matrix products (small_gemm_acc), the
// decay factors exponentiated once per chunk and the forward substitution vectorised over rows (compiled per
// Highway target). Same algebra as chunked_head.
// Asks for rows [t0, t0 + n) of the head's q, k and v (one row a whole projection apart: no hardware
// prefetcher follows that stride) into L2 while the chunk before them is computed.
HWY_INLINE void prefetch_rows(const DeltaRuleArgs& a, const Head& p, int64_t t0, int64_t n) {
    constexpr int kLine = 64 / sizeof(float);
    for (int64_t t = t0; t < t0 + n; ++t) {
        for (int c = 0; c < a.dk; c += kLine) {
            __builtin_prefetch(p.q + t * a.q_stride + c, 0, 2);
            __builtin_prefetch(p.k + t * a.k_stride + c, 0, 2);
        }
        for (int c = 0; c < a.dv; c += kLine) __builtin_prefetch(p.v + t * a.v_stride + c, 0, 2);
    }
}

void ChunkedHeadFast(const DeltaRuleArgs& a, int h, int C) {
    note_target(KernelFamily::DeltaRule, HWY_TARGET);
    const int dk = a.dk, dv = a.dv;
    const Head p = head_of(a, h);
    // Per-thread scratch reused across heads and calls (no page faults for fresh buffers on every head).
    thread_local std::vector<float> S, G, eG, bt, KK, QK, Kc, KcT, Qc, U, W, O, kdT;
    const size_t cc = static_cast<size_t>(C);
    S.resize(static_cast<size_t>(dk) * dv);
    for (auto* v : {&G, &eG, &bt}) v->resize(cc);
    for (auto* v : {&KK, &QK}) v->resize(cc * cc);
    for (auto* v : {&Kc, &KcT, &Qc, &W, &kdT}) v->resize(cc * dk);
    for (auto* v : {&U, &O}) v->resize(cc * dv);
    load_state(a, h, S.data());
    for (int64_t t0 = 0; t0 < a.T; t0 += C) {
        const int n = static_cast<int>(std::min<int64_t>(C, a.T - t0));
        prefetch_rows(a, p, t0 + C, std::min<int64_t>(C, a.T - t0 - C));
        float acc = 0.f;
        for (int i = 0; i < n; ++i) {
            G[i] = acc += p.g[(t0 + i) * a.g_stride];
            eG[i] = std::exp(G[i]);
            bt[i] = p.beta[(t0 + i) * a.beta_stride];
            const float* ki = p.k + (t0 + i) * a.k_stride;
            std::memcpy(&Kc[static_cast<size_t>(i) * dk], ki, dk * sizeof(float));
            std::memcpy(&Qc[static_cast<size_t>(i) * dk], p.q + (t0 + i) * a.q_stride, dk * sizeof(float));
            for (int r = 0; r < dk; ++r) KcT[static_cast<size_t>(r) * C + i] = ki[r];
        }
        // KK = K K^T, QK = Q K^T (n x n), then the decays and masks:
        // A[i][j] = beta_i KK[i][j] exp(G_i - G_j) (j < i); QK[i][j] *= exp(G_i - G_j) (j <= i), 0 above.
        std::fill(KK.begin(), KK.end(), 0.f);
        std::fill(QK.begin(), QK.end(), 0.f);
        small_gemm_acc(n, n, dk, 1.f, Kc.data(), dk, KcT.data(), C, KK.data(), C);
        small_gemm_acc(n, n, dk, 1.f, Qc.data(), dk, KcT.data(), C, QK.data(), C);
        for (int i = 0; i < n; ++i) {
            float* Ai = &KK[static_cast<size_t>(i) * C];
            float* Pi = &QK[static_cast<size_t>(i) * C];
            const float gi = G[i], bi = bt[i];
#pragma omp simd
            for (int j = 0; j <= i; ++j) {
                const float d = exp_poly(gi - G[j]);
                Ai[j] *= bi * d;
                Pi[j] *= d;
            }
            for (int j = i + 1; j < n; ++j) Pi[j] = 0.f;
        }
        // Forward substitution: (I + A) U = beta V, (I + A) W = beta exp(G) K.
        for (int i = 0; i < n; ++i) {
            float* Ui = &U[static_cast<size_t>(i) * dv];
            float* Wi = &W[static_cast<size_t>(i) * dk];
            const float* vi = p.v + (t0 + i) * a.v_stride;
            const float* ki = &Kc[static_cast<size_t>(i) * dk];
            const float bi = bt[i], bg = bt[i] * eG[i];
#pragma omp simd
            for (int c = 0; c < dv; ++c) Ui[c] = bi * vi[c];
#pragma omp simd
            for (int c = 0; c < dk; ++c) Wi[c] = bg * ki[c];
            for (int j = 0; j < i; ++j) {
                const float aij = KK[static_cast<size_t>(i) * C + j];
                const float* Uj = &U[static_cast<size_t>(j) * dv];
                const float* Wj = &W[static_cast<size_t>(j) * dk];
#pragma omp simd
                for (int c = 0; c < dv; ++c) Ui[c] -= aij * Uj[c];
#pragma omp simd
                for (int c = 0; c < dk; ++c) Wi[c] -= aij * Wj[c];
            }
        }
        // V' = U - W S and O = exp(G) Q S, both with the state before this chunk.
        small_gemm_acc(n, dv, dk, -1.f, W.data(), dk, S.data(), dv, U.data(), dv);
        std::fill(O.begin(), O.begin() + static_cast<size_t>(n) * dv, 0.f);
        small_gemm_acc(n, dv, dk, 1.f, Qc.data(), dk, S.data(), dv, O.data(), dv);
        for (int i = 0; i < n; ++i) {
            float* Oi = &O[static_cast<size_t>(i) * dv];
            const float gi = eG[i];
#pragma omp simd
            for (int c = 0; c < dv; ++c) Oi[c] *= gi;
        }
        // O += (QK o D) V'.
        small_gemm_acc(n, dv, n, 1.f, QK.data(), C, U.data(), dv, O.data(), dv);
        for (int i = 0; i < n; ++i)
            std::memcpy(p.out + (t0 + i) * a.out_stride, &O[static_cast<size_t>(i) * dv], dv * sizeof(float));
        // S = exp(G_n) S + (K exp(G_n - G))^T V'.
        const float gn = eG[n - 1];
        for (float& sv : S) sv *= gn;
        for (int j = 0; j < n; ++j) {
            const float dj = std::exp(G[n - 1] - G[j]);
            for (int r = 0; r < dk; ++r)
                kdT[static_cast<size_t>(r) * C + j] = dj * Kc[static_cast<size_t>(j) * dk + r];
        }
        small_gemm_acc(dk, dv, n, 1.f, kdT.data(), C, U.data(), dv, S.data(), dv);
    }
    store_state(a, h, S.data());
}

}  // namespace HWY_NAMESPACE
}  // namespace clef::ops::delta
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace clef::ops::delta {

HWY_EXPORT(ChunkedHeadFast);

void chunked_head_fast(const DeltaRuleArgs& a, int h, int C) {
    HWY_DYNAMIC_DISPATCH(ChunkedHeadFast)(a, h, C);
}

}  // namespace clef::ops::delta
#endif  // HWY_ONCE
