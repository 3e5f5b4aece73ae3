#include "ops/attention_fast.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/basic.h"
#include "util/error.h"
#include "util/half.h"

namespace clef::ops {

namespace {

constexpr int kBQ = 32;  // query rows per block
constexpr int kBK = 64;  // keys per block

inline float round_bf16(float x) {
    return bf16_to_f32(f32_to_bf16(x));
}

struct Shape {
    const float *q, *k, *v;
    int64_t qs, ks, vs, lq, lk;
    int hq, hkv, dh;
    float scale;
    bool causal;
    float* out;
    int64_t os;
    bool bf16;
};

// One query block [i0, i0 + nq) of head h. Scratch: Qb [kBQ][dh], Kb [kBK][dh], Vb [kBK][dh], O [kBQ][dh].
__attribute__((target_clones("arch=x86-64-v4", "default"))) void block(const Shape& a, int h, int64_t i0,
                                                                       int nq, float* Qb, float* Kb,
                                                                       float* Vb, float* O) {
    const int dh = a.dh;
    const int g = h / (a.hq / a.hkv);
    const int64_t off = a.lk - a.lq;  // absolute position of query 0
    float S[kBQ][kBK];
    float mrow[kBQ], lrow[kBQ];
    for (int i = 0; i < nq; ++i) {
        const float* src = a.q + (i0 + i) * a.qs + static_cast<int64_t>(h) * dh;
        float* dst = Qb + i * dh;
        for (int d = 0; d < dh; ++d) dst[d] = a.bf16 ? round_bf16(src[d]) : src[d];
        mrow[i] = -std::numeric_limits<float>::infinity();
        lrow[i] = 0.f;
        std::fill(O + i * dh, O + (i + 1) * dh, 0.f);
    }
    const int64_t kend = a.causal ? off + i0 + nq : a.lk;  // keys [0, kend) are visible to some row
    for (int64_t j0 = 0; j0 < kend; j0 += kBK) {
        const int nk = static_cast<int>(std::min<int64_t>(kBK, kend - j0));
        for (int j = 0; j < nk; ++j) {
            const float* ks = a.k + (j0 + j) * a.ks + static_cast<int64_t>(g) * dh;
            const float* vs = a.v + (j0 + j) * a.vs + static_cast<int64_t>(g) * dh;
            float* kd = Kb + j * dh;
            float* vd = Vb + j * dh;
            if (a.bf16) {
                for (int d = 0; d < dh; ++d) kd[d] = round_bf16(ks[d]);
                for (int d = 0; d < dh; ++d) vd[d] = round_bf16(vs[d]);
            } else {
                std::copy(ks, ks + dh, kd);
                std::copy(vs, vs + dh, vd);
            }
        }
        for (int i = 0; i < nq; ++i) {
            // Keys visible to row i in this block: [0, nv).
            const int64_t lim = a.causal ? off + i0 + i + 1 - j0 : nk;
            const int nv = static_cast<int>(std::min<int64_t>(nk, lim));
            if (nv <= 0) continue;
            const float* qi = Qb + i * dh;
            float mx = -std::numeric_limits<float>::infinity();
            for (int j = 0; j < nv; ++j) {
                const float* kj = Kb + j * dh;
                float acc = 0.f;
#pragma omp simd reduction(+ : acc)
                for (int d = 0; d < dh; ++d) acc += qi[d] * kj[d];
                S[i][j] = acc * a.scale;
                mx = std::max(mx, S[i][j]);
            }
            const float mnew = std::max(mrow[i], mx);
            const float corr = exp_poly(mrow[i] - mnew);  // exp(-inf) = 0 on the first block
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < nv; ++j) {
                const float pj = exp_poly(S[i][j] - mnew);
                S[i][j] = pj;
                sum += pj;
            }
            lrow[i] = lrow[i] * corr + sum;
            mrow[i] = mnew;
            float* oi = O + i * dh;
            if (corr != 1.f) {
#pragma omp simd
                for (int d = 0; d < dh; ++d) oi[d] *= corr;
            }
            for (int j = 0; j < nv; ++j) {
                const float pj = a.bf16 ? round_bf16(S[i][j]) : S[i][j];
                const float* vj = Vb + j * dh;
#pragma omp simd
                for (int d = 0; d < dh; ++d) oi[d] += pj * vj[d];
            }
        }
    }
    for (int i = 0; i < nq; ++i) {
        float* dst = a.out + (i0 + i) * a.os + static_cast<int64_t>(h) * dh;
        const float inv = 1.f / lrow[i];
        const float* oi = O + i * dh;
#pragma omp simd
        for (int d = 0; d < dh; ++d) dst[d] = oi[d] * inv;
    }
}

}  // namespace

void attention_fast(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                    int64_t v_stride, int64_t lq, int64_t lk, int hq, int hkv, int dh, float scale,
                    bool causal, float* out, int64_t out_stride, Precision p) {
    if (lq <= 0 || lk <= 0 || hq <= 0 || hkv <= 0 || dh <= 0 || hq % hkv != 0)
        throw Error(
            "attention_fast: bad shape (lq, lk, heads and head dim must be positive, hq a multiple of hkv)");
    if (causal && lq > lk) throw Error("attention_fast: causal attention needs lq <= lk");
    if (!q || !k || !v || !out) throw Error("attention_fast: null input or output");
    const Shape a{q,  k,   v,  q_stride, k_stride, v_stride, lq,         lk,
                  hq, hkv, dh, scale,    causal,   out,      out_stride, p == Precision::BF16};
    const int64_t nqb = (lq + kBQ - 1) / kBQ;
    const int64_t tasks = nqb * hq;
#pragma omp parallel if (lq * lk * hq * int64_t(dh) > (1 << 16))
    {
        std::vector<float> buf(static_cast<size_t>(2 * kBQ + 2 * kBK) * dh);
        float* Qb = buf.data();
        float* O = Qb + kBQ * dh;
        float* Kb = O + kBQ * dh;
        float* Vb = Kb + kBK * dh;
        // Causal blocks near the end cost more: interleave them (dynamic, small chunks).
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
            const int64_t qb = nqb - 1 - t / hq;  // the longest blocks first
            const int h = static_cast<int>(t % hq);
            const int64_t i0 = qb * kBQ;
            block(a, h, i0, static_cast<int>(std::min<int64_t>(kBQ, lq - i0)), Qb, Kb, Vb, O);
        }
    }
}

}  // namespace clef::ops
