#include "ops/attention_fast.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/basic.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
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

// K and V of every kv head, prepared once per call: K transposed into key blocks Kt[g][block][dh][kBK] (zero
// columns past the last key), V contiguous [g][lk][dh]; both rounded to bf16 values in BF16 mode.
struct Prepared {
    std::vector<float> kt, v;
    int64_t nkb = 0;
};

Prepared prepare(const Shape& a) {
    Prepared p;
    const int dh = a.dh;
    p.nkb = (a.lk + kBK - 1) / kBK;
    p.kt.assign(static_cast<size_t>(a.hkv * p.nkb) * dh * kBK, 0.f);
    p.v.resize(static_cast<size_t>(a.hkv * a.lk) * dh);
#pragma omp parallel for collapse(2) schedule(static)
    for (int g = 0; g < a.hkv; ++g)
        for (int64_t jb = 0; jb < p.nkb; ++jb) {
            float* kt = p.kt.data() + (g * p.nkb + jb) * dh * kBK;
            const int nk = static_cast<int>(std::min<int64_t>(kBK, a.lk - jb * kBK));
            for (int j = 0; j < nk; ++j) {
                const int64_t t = jb * kBK + j;
                const float* ks = a.k + t * a.ks + static_cast<int64_t>(g) * dh;
                const float* vs = a.v + t * a.vs + static_cast<int64_t>(g) * dh;
                float* vd = p.v.data() + (g * a.lk + t) * dh;
                for (int d = 0; d < dh; ++d) kt[d * kBK + j] = a.bf16 ? round_bf16(ks[d]) : ks[d];
                for (int d = 0; d < dh; ++d) vd[d] = a.bf16 ? round_bf16(vs[d]) : vs[d];
            }
        }
    return p;
}

using SBlock = float[kBK];

// S[0..nq4)[0..kBK) = scale * Q . Kt (the dispatched small GEMM; Kt's padding columns are zero).
void qk(const float* Qb, const float* Kt, int dh, int nq4, float scale, SBlock* S) {
    float* s = reinterpret_cast<float*>(S);  // the nq4 rows as one dense [nq4][kBK] matrix
    std::fill(s, s + nq4 * kBK, 0.f);
    small_gemm_acc(nq4, kBK, dh, scale, Qb, dh, Kt, kBK, s, kBK);
}

// O[0..nq4)[0..dh) += P[0..nq4)[0..nk) . V[0..nk)[0..dh).
void pv(const SBlock* S, const float* V, int nk, int dh, int nq4, float* O) {
    small_gemm_acc(nq4, dh, nk, 1.f, reinterpret_cast<const float*>(S), kBK, V, dh, O, dh);
}

// One query block [i0, i0 + nq) of head h. Scratch: Qb [kBQ][dh], O [kBQ][dh]. Rows are processed in groups
// of 4 (padding rows are zero queries, computed and never stored).
void block(const Shape& a, const Prepared& pr, int h, int64_t i0, int nq, float* Qb, float* O) {
    const int dh = a.dh;
    const int g = h / (a.hq / a.hkv);
    const int64_t off = a.lk - a.lq;  // absolute position of query 0
    alignas(64) float S[kBQ][kBK];
    float mrow[kBQ], lrow[kBQ];
    const int nq4 = (nq + 3) & ~3;
    for (int i = 0; i < nq4; ++i) {
        float* dst = Qb + i * dh;
        if (i < nq) {
            const float* src = a.q + (i0 + i) * a.qs + static_cast<int64_t>(h) * dh;
            for (int d = 0; d < dh; ++d) dst[d] = a.bf16 ? round_bf16(src[d]) : src[d];
        } else {
            std::fill(dst, dst + dh, 0.f);
        }
        mrow[i] = -std::numeric_limits<float>::infinity();
        lrow[i] = 0.f;
        std::fill(O + i * dh, O + (i + 1) * dh, 0.f);
    }
    const int64_t kend = a.causal ? off + i0 + nq : a.lk;  // keys [0, kend) are visible to some row
    for (int64_t j0 = 0; j0 < kend; j0 += kBK) {
        const int nk = static_cast<int>(std::min<int64_t>(kBK, kend - j0));
        const float* Kt = pr.kt.data() + (g * pr.nkb + j0 / kBK) * dh * kBK;
        const float* V = pr.v.data() + (g * a.lk + j0) * dh;
        qk(Qb, Kt, dh, nq4, a.scale, S);
        // Online softmax per row; S becomes P (0 for keys the row cannot see).
        for (int i = 0; i < nq4; ++i) {
            const int64_t lim = i >= nq ? 0 : (a.causal ? off + i0 + i + 1 - j0 : nk);
            const int nv = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(nk, lim)));
            if (nv == 0) {
                std::fill(S[i], S[i] + kBK, 0.f);
                continue;
            }
            float mx = -std::numeric_limits<float>::infinity();
            for (int j = 0; j < nv; ++j) mx = std::max(mx, S[i][j]);
            const float mnew = std::max(mrow[i], mx);
            const float corr = exp_poly(mrow[i] - mnew);  // exp(-inf) = 0 on the first block
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < kBK; ++j) {
                const float pj = j < nv ? exp_poly(S[i][j] - mnew) : 0.f;
                S[i][j] = a.bf16 ? round_bf16(pj) : pj;
                sum += pj;
            }
            lrow[i] = lrow[i] * corr + sum;
            mrow[i] = mnew;
            if (corr != 1.f) {
                float* oi = O + i * dh;
#pragma omp simd
                for (int d = 0; d < dh; ++d) oi[d] *= corr;
            }
        }
        pv(S, V, nk, dh, nq4, O);
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
    num_threads();  // applies the global thread setting to this thread
    const Prepared pr = prepare(a);
#pragma omp parallel if (lq * lk * hq * int64_t(dh) > (1 << 16))
    {
        std::vector<float> buf(static_cast<size_t>(2 * kBQ) * dh);
        float* Qb = buf.data();
        float* O = Qb + kBQ * dh;
        // Causal blocks near the end cost more: interleave them (dynamic, small chunks).
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
            const int64_t qb = nqb - 1 - t / hq;  // the longest blocks first
            const int h = static_cast<int>(t % hq);
            const int64_t i0 = qb * kBQ;
            block(a, pr, h, i0, static_cast<int>(std::min<int64_t>(kBQ, lq - i0)), Qb, O);
        }
    }
}

}  // namespace clef::ops
