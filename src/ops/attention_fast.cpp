#include "ops/attention_fast.h"

// gcc 12 reports its own intrinsics (_mm512_undefined_* self-initialisation) as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/basic.h"
#include "ops/cpu.h"
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

#define CLEF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

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

// S[i..i+4)[0..kBK) = scale * Q[i..i+4) . Kt, for i < nq4 (a multiple of 4).
void qk_generic(const float* Qb, const float* Kt, int dh, int nq4, float scale, SBlock* S) {
    for (int i = 0; i < nq4; i += 4) {
        float acc[4][kBK] = {};
        for (int d = 0; d < dh; ++d) {
            const float* kt = Kt + d * kBK;
            for (int r = 0; r < 4; ++r) {
                const float qv = Qb[(i + r) * dh + d];
#pragma omp simd
                for (int j = 0; j < kBK; ++j) acc[r][j] += qv * kt[j];
            }
        }
        for (int r = 0; r < 4; ++r)
            for (int j = 0; j < kBK; ++j) S[i + r][j] = acc[r][j] * scale;
    }
}

CLEF_AVX512 void qk_512(const float* Qb, const float* Kt, int dh, int nq4, float scale, SBlock* S) {
    static_assert(kBK == 64, "4 vectors of 16 keys");
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < nq4; i += 4) {
        __m512 acc[4][4];
        for (int r = 0; r < 4; ++r)
            for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
        for (int d = 0; d < dh; ++d) {
            const float* kt = Kt + d * kBK;
            const __m512 k0 = _mm512_loadu_ps(kt), k1 = _mm512_loadu_ps(kt + 16),
                         k2 = _mm512_loadu_ps(kt + 32), k3 = _mm512_loadu_ps(kt + 48);
            for (int r = 0; r < 4; ++r) {
                const __m512 qv = _mm512_set1_ps(Qb[(i + r) * dh + d]);
                acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
                acc[r][2] = _mm512_fmadd_ps(qv, k2, acc[r][2]);
                acc[r][3] = _mm512_fmadd_ps(qv, k3, acc[r][3]);
            }
        }
        for (int r = 0; r < 4; ++r)
            for (int c = 0; c < 4; ++c) _mm512_storeu_ps(S[i + r] + 16 * c, _mm512_mul_ps(acc[r][c], sc));
    }
}

// O[i..i+4)[0..dh) += P[i..i+4)[0..nk) . V[0..nk)[0..dh).
void pv_generic(const SBlock* S, const float* V, int nk, int dh, int nq4, float* O) {
    for (int i = 0; i < nq4; i += 4)
        for (int j = 0; j < nk; ++j) {
            const float* vj = V + static_cast<int64_t>(j) * dh;
            for (int r = 0; r < 4; ++r) {
                const float pv = S[i + r][j];
                float* o = O + (i + r) * dh;
#pragma omp simd
                for (int d = 0; d < dh; ++d) o[d] += pv * vj[d];
            }
        }
}

template <int NC>
CLEF_AVX512 void pv_chunk_512(const SBlock* S, const float* V, int nk, int dh, int i, int d0, float* O) {
    __m512 acc[4][NC];
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_loadu_ps(O + (i + r) * dh + d0 + 16 * c);
    for (int j = 0; j < nk; ++j) {
        const float* vj = V + static_cast<int64_t>(j) * dh + d0;
        __m512 vv[NC];
        for (int c = 0; c < NC; ++c) vv[c] = _mm512_loadu_ps(vj + 16 * c);
        for (int r = 0; r < 4; ++r) {
            const __m512 p = _mm512_set1_ps(S[i + r][j]);
            for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NC; ++c) _mm512_storeu_ps(O + (i + r) * dh + d0 + 16 * c, acc[r][c]);
}

// Needs dh % 16 == 0.
CLEF_AVX512 void pv_512(const SBlock* S, const float* V, int nk, int dh, int nq4, float* O) {
    for (int i = 0; i < nq4; i += 4) {
        int d0 = 0;
        for (; d0 + 64 <= dh; d0 += 64) pv_chunk_512<4>(S, V, nk, dh, i, d0, O);
        if (d0 + 32 <= dh) {
            pv_chunk_512<2>(S, V, nk, dh, i, d0, O);
            d0 += 32;
        }
        if (d0 + 16 <= dh) pv_chunk_512<1>(S, V, nk, dh, i, d0, O);
    }
}

// One query block [i0, i0 + nq) of head h. Scratch: Qb [kBQ][dh], O [kBQ][dh]. Rows are processed in groups
// of 4 (padding rows are zero queries, computed and never stored).
void block(const Shape& a, const Prepared& pr, bool use512, int h, int64_t i0, int nq, float* Qb, float* O) {
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
        if (use512)
            qk_512(Qb, Kt, dh, nq4, a.scale, S);
        else
            qk_generic(Qb, Kt, dh, nq4, a.scale, S);
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
        if (use512)
            pv_512(S, V, nk, dh, nq4, O);
        else
            pv_generic(S, V, nk, dh, nq4, O);
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
    const bool use512 = cpu_features().has_avx512() && dh % 16 == 0;
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
            block(a, pr, use512, h, i0, static_cast<int>(std::min<int64_t>(kBQ, lq - i0)), Qb, O);
        }
    }
}

}  // namespace clef::ops
