#include "ops/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/basic.h"
#include "ops/cpu.h"
#include "ops/delta_rule_head.h"
#include "ops/gemm.h"
#include "util/error.h"

namespace clef::ops {

void l2_norm(const float* x, int64_t rows, int64_t d, float eps, float scale, float* y) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * d;
        double ss = 0.0;
        for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        const float inv = static_cast<float>(static_cast<double>(scale) / std::sqrt(ss + eps));
        float* yr = y + r * d;
        for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * inv;
    }
}

namespace {

using delta::Head;
using delta::head_of;
using delta::load_state;
using delta::store_state;

void check_args(const DeltaRuleArgs& a) {
    if (a.T < 0 || a.num_k_heads <= 0 || a.num_v_heads <= 0 || a.dk <= 0 || a.dv <= 0 ||
        a.num_v_heads % a.num_k_heads != 0)
        throw Error("gated_delta_rule: bad shape (Hk, Hv, dk, dv must be positive and Hv a multiple of Hk)");
    if (a.T > 0 && (!a.q || !a.k || !a.v || !a.beta || !a.g || !a.out))
        throw Error("gated_delta_rule: null input or output");
}

void serial_head(const DeltaRuleArgs& a, int h) {
    const int dk = a.dk, dv = a.dv;
    const Head p = head_of(a, h);
    std::vector<float> S(static_cast<size_t>(dk) * dv), u(dv);
    load_state(a, h, S.data());
    for (int64_t t = 0; t < a.T; ++t) {
        const float* q = p.q + t * a.q_stride;
        const float* k = p.k + t * a.k_stride;
        const float* v = p.v + t * a.v_stride;
        const float decay = std::exp(p.g[t * a.g_stride]);
        const float beta = p.beta[t * a.beta_stride];
        for (float& s : S) s *= decay;
        // u = beta (v - S^T k)
        std::fill(u.begin(), u.end(), 0.f);
        for (int i = 0; i < dk; ++i) {
            const float* Si = S.data() + static_cast<size_t>(i) * dv;
            for (int j = 0; j < dv; ++j) u[j] += Si[j] * k[i];
        }
        for (int j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);
        // S += k u^T; o = S^T q
        float* o = p.out + t * a.out_stride;
        std::fill(o, o + dv, 0.f);
        for (int i = 0; i < dk; ++i) {
            float* Si = S.data() + static_cast<size_t>(i) * dv;
            for (int j = 0; j < dv; ++j) {
                Si[j] += k[i] * u[j];
                o[j] += Si[j] * q[i];
            }
        }
    }
    store_state(a, h, S.data());
}

float dot(const float* a, const float* b, int n) {
    float acc = 0.f;
    for (int i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
}

void chunked_head(const DeltaRuleArgs& a, int h, int C) {
    const int dk = a.dk, dv = a.dv;
    const Head p = head_of(a, h);
    std::vector<float> S(static_cast<size_t>(dk) * dv);
    load_state(a, h, S.data());
    std::vector<float> G(C), A(static_cast<size_t>(C) * C), U(static_cast<size_t>(C) * dv),
        W(static_cast<size_t>(C) * dk), kd(dk);
    for (int64_t t0 = 0; t0 < a.T; t0 += C) {
        const int n = static_cast<int>(std::min<int64_t>(C, a.T - t0));
        auto q = [&](int i) { return p.q + (t0 + i) * a.q_stride; };
        auto k = [&](int i) { return p.k + (t0 + i) * a.k_stride; };
        auto v = [&](int i) { return p.v + (t0 + i) * a.v_stride; };
        auto beta = [&](int i) { return p.beta[(t0 + i) * a.beta_stride]; };
        // Cumulative log decay inside the chunk (fp32, as HF).
        float acc = 0.f;
        for (int i = 0; i < n; ++i) G[i] = acc += p.g[(t0 + i) * a.g_stride];
        // A (strictly lower), then forward substitution for U and W, one row at a time.
        for (int i = 0; i < n; ++i) {
            const float bi = beta(i);
            float* Ai = A.data() + static_cast<size_t>(i) * C;
            for (int j = 0; j < i; ++j) Ai[j] = bi * dot(k(i), k(j), dk) * std::exp(G[i] - G[j]);
            float* Ui = U.data() + static_cast<size_t>(i) * dv;
            float* Wi = W.data() + static_cast<size_t>(i) * dk;
            const float bg = bi * std::exp(G[i]);
            for (int c = 0; c < dv; ++c) Ui[c] = bi * v(i)[c];
            for (int c = 0; c < dk; ++c) Wi[c] = bg * k(i)[c];
            for (int j = 0; j < i; ++j) {
                const float aij = Ai[j];
                const float* Uj = U.data() + static_cast<size_t>(j) * dv;
                const float* Wj = W.data() + static_cast<size_t>(j) * dk;
                for (int c = 0; c < dv; ++c) Ui[c] -= aij * Uj[c];
                for (int c = 0; c < dk; ++c) Wi[c] -= aij * Wj[c];
            }
        }
        // V' = U - W S (in place in U).
        for (int i = 0; i < n; ++i) {
            float* Ui = U.data() + static_cast<size_t>(i) * dv;
            const float* Wi = W.data() + static_cast<size_t>(i) * dk;
            for (int r = 0; r < dk; ++r) {
                const float* Sr = S.data() + static_cast<size_t>(r) * dv;
                const float w = Wi[r];
                for (int c = 0; c < dv; ++c) Ui[c] -= w * Sr[c];
            }
        }
        // O = exp(G) Q S + (Q K^T o D) V'
        for (int i = 0; i < n; ++i) {
            float* o = p.out + (t0 + i) * a.out_stride;
            std::fill(o, o + dv, 0.f);
            const float* qi = q(i);
            for (int r = 0; r < dk; ++r) {
                const float* Sr = S.data() + static_cast<size_t>(r) * dv;
                const float w = qi[r];
                for (int c = 0; c < dv; ++c) o[c] += w * Sr[c];
            }
            const float gi = std::exp(G[i]);
            for (int c = 0; c < dv; ++c) o[c] *= gi;
            for (int j = 0; j <= i; ++j) {
                const float pij = dot(qi, k(j), dk) * std::exp(G[i] - G[j]);
                const float* Uj = U.data() + static_cast<size_t>(j) * dv;
                for (int c = 0; c < dv; ++c) o[c] += pij * Uj[c];
            }
        }
        // S = exp(G_n) S + sum_j exp(G_n - G_j) k_j V'_j^T
        const float gn = std::exp(G[n - 1]);
        for (float& s : S) s *= gn;
        for (int j = 0; j < n; ++j) {
            const float dj = std::exp(G[n - 1] - G[j]);
            for (int r = 0; r < dk; ++r) kd[r] = dj * k(j)[r];
            const float* Uj = U.data() + static_cast<size_t>(j) * dv;
            for (int r = 0; r < dk; ++r) {
                float* Sr = S.data() + static_cast<size_t>(r) * dv;
                const float w = kd[r];
                for (int c = 0; c < dv; ++c) Sr[c] += w * Uj[c];
            }
        }
    }
    store_state(a, h, S.data());
}

}  // namespace

void gated_delta_rule_serial(const DeltaRuleArgs& a) {
    check_args(a);
#pragma omp parallel for schedule(static) if (a.T * a.num_v_heads * a.dk * a.dv > (1 << 16))
    for (int h = 0; h < a.num_v_heads; ++h) serial_head(a, h);
}

void gated_delta_rule_chunked(const DeltaRuleArgs& a, int chunk) {
    check_args(a);
    if (chunk <= 0) throw Error("gated_delta_rule_chunked: chunk must be positive");
#pragma omp parallel for schedule(static) if (a.T * a.num_v_heads * a.dk * a.dv > (1 << 16))
    for (int h = 0; h < a.num_v_heads; ++h) chunked_head(a, h, chunk);
}

void gated_delta_rule_chunked_fast(const DeltaRuleArgs& a, int chunk) {
    check_args(a);
    if (chunk <= 0) throw Error("gated_delta_rule_chunked_fast: chunk must be positive");
    num_threads();  // applies the global thread setting to this thread
#pragma omp parallel for schedule(static) if (a.T * a.num_v_heads * a.dk * a.dv > (1 << 16))
    for (int h = 0; h < a.num_v_heads; ++h) delta::chunked_head_fast(a, h, chunk);
}

}  // namespace clef::ops
