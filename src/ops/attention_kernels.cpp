// Flash-style attention for one kv head's query heads over a block of query rows, compiled once per Highway
// target (foreach_target.h re-includes this file). Scores are kept transposed, S^T[key][column] with one
// column per (query head, query row), so that
//   - S^T = K . Q^T broadcasts K's entries against Q^T (vectors of columns),
//   - the online softmax runs down the keys with a whole vector of columns per instruction,
//   - O += P . V broadcasts P^T's entries against V's rows,
// and every key block is read once for all hq / hkv heads. Tested against ops::attention
// (tests/test_attention_fast.cpp) and a double-precision softmax on every target (tests/test_kernels.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>  // per target, after highway.h

#include <hwy/cache_control.h>

#include <algorithm>
#include <cfloat>
#include <cstring>

#include "ops/attention_kernels.h"
#include "ops/named_vectors.h"
#include "ops/simd.h"
#include "ops/simd_kernels.h"
#include "util/half.h"

HWY_BEFORE_NAMESPACE();
namespace clef::ops::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;
using DU = hn::RebindToUnsigned<DF>;

constexpr int kMR =
    6;  // broadcast rows per tile: 6 x 2 accumulators, two loads and a broadcast in 16 registers

HWY_INLINE int64_t lanes() {
    return static_cast<int64_t>(hn::Lanes(DF()));
}

// Query rows per head padded to whole two-vector strips (zero queries, computed and never stored).
HWY_INLINE int64_t padded_rows(int n) {
    const int64_t s = 2 * lanes();
    return (n + s - 1) / s * s;
}

// x rounded to the nearest bf16 value (ties to even), as fp32.
HWY_INLINE hn::Vec<DF> round_bf16(DF df, hn::Vec<DF> x) {
    const DU du;
    auto b = hn::BitCast(du, x);
    b = hn::Add(b, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(b), hn::Set(du, 1u))));
    return hn::BitCast(df, hn::And(b, hn::Set(du, 0xffff0000u)));
}

// c[r][0, kV * N) (+)= sum_t a[r * ars + t * ats] * b[t * ldb + 0, kV * N) for r < MR. kAcc: c starts as
// c * cs[r] (the online softmax's correction), else as zero.
template <int MR, int kV, bool kAcc>
HWY_INLINE void tile(int64_t k, const float* a, int64_t ars, int64_t ats, const float* b, int64_t ldb,
                     float* c, int64_t ldc, const float* cs) {
    static_assert(MR >= 1 && MR <= 6);
    const DF df;
    const int64_t N = lanes();
    // Row r: acc<r>0 (columns [0, N)) and, if kV == 2, acc<r>1 ([N, 2N)), named locals
    // (ops/named_vectors.h); rows from MR on are not used.
    auto acc00 = hn::Zero(df), acc01 = acc00, acc10 = acc00, acc11 = acc00, acc20 = acc00, acc21 = acc00,
         acc30 = acc00, acc31 = acc00, acc40 = acc00, acc41 = acc00, acc50 = acc00, acc51 = acc00;
    if constexpr (kAcc) {
#define CLEF_ROW(r)                                                                    \
    if constexpr (r < MR) {                                                            \
        const auto s = hn::Set(df, cs[r]);                                             \
        acc##r##0 = hn::Mul(hn::LoadU(df, c + r * ldc), s);                            \
        if constexpr (kV == 2) acc##r##1 = hn::Mul(hn::LoadU(df, c + r * ldc + N), s); \
    }
        CLEF_ROWS6(CLEF_ROW)
#undef CLEF_ROW
    }
    for (int64_t t = 0; t < k; ++t) {
        const auto b0 = hn::LoadU(df, b + t * ldb);
        const auto b1 = kV == 2 ? hn::LoadU(df, b + t * ldb + N) : b0;
#define CLEF_ROW(r)                                                       \
    if constexpr (r < MR) {                                               \
        const auto av = hn::Set(df, a[r * ars + t * ats]);                \
        acc##r##0 = hn::MulAdd(av, b0, acc##r##0);                        \
        if constexpr (kV == 2) acc##r##1 = hn::MulAdd(av, b1, acc##r##1); \
    }
        CLEF_ROWS6(CLEF_ROW)
#undef CLEF_ROW
    }
#define CLEF_ROW(r)                                                        \
    if constexpr (r < MR) {                                                \
        hn::StoreU(acc##r##0, df, c + r * ldc);                            \
        if constexpr (kV == 2) hn::StoreU(acc##r##1, df, c + r * ldc + N); \
    }
    CLEF_ROWS6(CLEF_ROW)
#undef CLEF_ROW
}

// tile over m rows in tiles of kMR (and one shorter).
template <int kV, bool kAcc>
HWY_INLINE void tiles(int64_t m, int64_t k, const float* a, int64_t ars, int64_t ats, const float* b,
                      int64_t ldb, float* c, int64_t ldc, const float* cs) {
    int64_t r = 0;
    for (; r + kMR <= m; r += kMR)
        tile<kMR, kV, kAcc>(k, a + r * ars, ars, ats, b, ldb, c + r * ldc, ldc, cs + (kAcc ? r : 0));
    const float* ar = a + r * ars;
    float* cr = c + r * ldc;
    const float* sr = cs + (kAcc ? r : 0);
    switch (m - r) {
        case 5:
            return tile<5, kV, kAcc>(k, ar, ars, ats, b, ldb, cr, ldc, sr);
        case 4:
            return tile<4, kV, kAcc>(k, ar, ars, ats, b, ldb, cr, ldc, sr);
        case 3:
            return tile<3, kV, kAcc>(k, ar, ars, ats, b, ldb, cr, ldc, sr);
        case 2:
            return tile<2, kV, kAcc>(k, ar, ars, ats, b, ldb, cr, ldc, sr);
        case 1:
            return tile<1, kV, kAcc>(k, ar, ars, ats, b, ldb, cr, ldc, sr);
        default:
            return;
    }
}

// The per-thread buffers of one task, carved from the scratch floats.
struct Scratch {
    float *qt, *st, *o, *m, *l, *corr, *kb, *vb;
    int64_t C;  // columns: heads x padded query rows
};

Scratch carve(const AttnCall& a, int n, float* s) {
    const int64_t G = a.hq / a.hkv, C = G * padded_rows(n), dh = a.dh;
    Scratch x;
    x.C = C;
    x.qt = s;                         // Q^T [dh][C], scaled
    x.st = x.qt + dh * C;             // S^T, then P^T [kAttnKeyRows][C]
    x.o = x.st + kAttnKeyRows * C;    // O [C][dh]
    x.m = x.o + C * dh;               // running max per column
    x.l = x.m + C;                    // running sum per column
    x.corr = x.l + C;                 // this block's correction per column
    x.kb = x.corr + C;                // K block as fp32 [kAttnKeyRows][dh]
    x.vb = x.kb + kAttnKeyRows * dh;  // V block likewise
    return x;
}

// Q^T of the task's heads and rows, times scale; zero columns for the padding rows.
void load_queries(const AttnCall& a, int g, int64_t i0, int n, const Scratch& x) {
    const int G = a.hq / a.hkv;
    const int64_t rows = x.C / G;
    std::fill(x.qt, x.qt + a.dh * x.C, 0.f);
    for (int hh = 0; hh < G; ++hh)
        for (int p = 0; p < n; ++p) {
            const float* src = a.q + (i0 + p) * a.qs + static_cast<int64_t>(g * G + hh) * a.dh;
            float* dst = x.qt + hh * rows + p;
            for (int d = 0; d < a.dh; ++d) {
                const float qv = a.round_bf16 ? clef::bf16_to_f32(clef::f32_to_bf16(src[d])) : src[d];
                dst[d * x.C] = qv * a.scale;
            }
        }
}

// Rows [j0, j0 + nk) of kv head g from src as fp32 with row stride dh (rounded to bf16 values in BF16 mode).
// The copy is contiguous for the kernels: rows read in place, kv_heads * dh apart, put every row of a tile in
// the same cache set and made the kernels ~20 % slower.
void load_block(const AttnCall& a, const void* src, int64_t stride, int g, int64_t j0, int nk, float* dst) {
    const DF df;
    const int64_t N = lanes();
    for (int j = 0; j < nk; ++j) {
        const int64_t off = (j0 + j) * stride + static_cast<int64_t>(g) * a.dh;
        float* out = dst + static_cast<int64_t>(j) * a.dh;
        if (a.kv_bf16) {
            simd::bf16_to_f32(static_cast<const uint16_t*>(src) + off, out, a.dh);  // simd_kernels.h
        } else if (a.round_bf16) {
            const float* in = static_cast<const float*>(src) + off;
            int64_t d = 0;
            for (; d + N <= a.dh; d += N) hn::StoreU(round_bf16(df, hn::LoadU(df, in + d)), df, out + d);
            for (; d < a.dh; ++d) out[d] = clef::bf16_to_f32(clef::f32_to_bf16(in[d]));
        } else {
            std::memcpy(out, static_cast<const float*>(src) + off, static_cast<size_t>(a.dh) * sizeof(float));
        }
    }
}

// Prefetches rows [j0, j0 + n) of kv head g.
void prefetch_rows(const AttnCall& a, const void* src, int64_t stride, int g, int64_t j0, int64_t n) {
    const int64_t bytes = a.dh * (a.kv_bf16 ? 2 : 4), esize = a.kv_bf16 ? 2 : 4;
    const char* base = static_cast<const char*>(src);
    for (int64_t j = j0; j < j0 + n; ++j) {
        const char* row = base + ((j * stride) + static_cast<int64_t>(g) * a.dh) * esize;
        for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 1);
    }
}

// The online softmax over S^T rows [0, nk) (keys j0 + j), one vector of columns at a time: updates m and l,
// sets corr, and turns S^T into P^T (zero where a column's query may not see the key).
void softmax_block(const AttnCall& a, int64_t i0, int64_t j0, int nk, const Scratch& x) {
    const DF df;
    const int64_t N = lanes(), rows = x.C / (a.hq / a.hkv);
    const auto iota = hn::Iota(df, 0.f);
    const auto lowest = hn::Set(df, -FLT_MAX);
    for (int64_t c = 0; c < x.C; c += N) {
        // Column lane i is query row p = c % rows + i at position lk - lq + i0 + p; it sees key j0 + j when
        // j - base <= i, base = lk - lq + i0 + p - j0.
        const int64_t base = a.lk - a.lq + i0 + c % rows - j0;
        const bool masked = a.causal && nk - 1 > base;
        auto mx = lowest;
        for (int j = 0; j < nk; ++j) {
            auto s = hn::LoadU(df, x.st + j * x.C + c);
            if (masked)
                s = hn::IfThenElse(hn::Ge(iota, hn::Set(df, static_cast<float>(j - base))), s, lowest);
            mx = hn::Max(mx, s);
        }
        const auto mold = hn::LoadU(df, x.m + c);
        const auto mnew = hn::Max(mold, mx);
        auto sum = hn::Zero(df);
        for (int j = 0; j < nk; ++j) {
            float* row = x.st + j * x.C + c;
            auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, row), mnew));
            if (masked) p = hn::IfThenElseZero(hn::Ge(iota, hn::Set(df, static_cast<float>(j - base))), p);
            sum = hn::Add(sum, p);
            hn::StoreU(a.round_bf16 ? round_bf16(df, p) : p, df, row);
        }
        const auto corr = hn::Exp(df, hn::Sub(mold, mnew));
        hn::StoreU(corr, df, x.corr + c);
        hn::StoreU(hn::MulAdd(hn::LoadU(df, x.l + c), corr, sum), df, x.l + c);
        hn::StoreU(mnew, df, x.m + c);
    }
}

// O = O * corr + P . V over one key block (V rows dh apart).
void pv_block(const AttnCall& a, const float* V, int nk, const Scratch& x) {
    const int64_t vs = a.dh;
    const int64_t N = lanes(), dh = a.dh;
    int64_t d = 0;
    for (; d + 2 * N <= dh; d += 2 * N) tiles<2, true>(x.C, nk, x.st, 1, x.C, V + d, vs, x.o + d, dh, x.corr);
    for (; d + N <= dh; d += N) tiles<1, true>(x.C, nk, x.st, 1, x.C, V + d, vs, x.o + d, dh, x.corr);
    for (; d < dh; ++d)
        for (int64_t c = 0; c < x.C; ++c) {
            float acc = x.o[c * dh + d] * x.corr[c];
            for (int j = 0; j < nk; ++j) acc += x.st[j * x.C + c] * V[j * vs + d];
            x.o[c * dh + d] = acc;
        }
}

void AttentionTask(const AttnCall& a, int g, int64_t i0, int n, float* scratch) {
    note_target(KernelFamily::Attention, HWY_TARGET);
    const DF df;
    const int64_t N = lanes(), dh = a.dh, G = a.hq / a.hkv;
    const Scratch x = carve(a, n, scratch);
    const int64_t rows = x.C / G;
    load_queries(a, g, i0, n, x);
    std::fill(x.o, x.o + x.C * dh, 0.f);
    std::fill(x.m, x.m + x.C, -FLT_MAX);
    std::fill(x.l, x.l + x.C, 0.f);
    const int64_t kend = a.causal ? a.lk - a.lq + i0 + n : a.lk;
    for (int64_t j0 = 0; j0 < kend; j0 += kAttnKeyRows) {
        const int nk = static_cast<int>(std::min<int64_t>(kAttnKeyRows, kend - j0));
        if (j0 + kAttnKeyRows < kend) {  // the next block: each row is a short run the prefetchers miss
            const int64_t nn = std::min<int64_t>(kAttnKeyRows, kend - j0 - kAttnKeyRows);
            prefetch_rows(a, a.k, a.ks, g, j0 + kAttnKeyRows, nn);
            prefetch_rows(a, a.v, a.vs, g, j0 + kAttnKeyRows, nn);
        }
        load_block(a, a.k, a.ks, g, j0, nk, x.kb);
        load_block(a, a.v, a.vs, g, j0, nk, x.vb);
        for (int64_t c = 0; c < x.C; c += 2 * N)  // S^T = K . Q^T (scale is in Q^T)
            tiles<2, false>(nk, dh, x.kb, dh, 1, x.qt + c, x.C, x.st + c, x.C, nullptr);
        softmax_block(a, i0, j0, nk, x);
        pv_block(a, x.vb, nk, x);
    }
    for (int64_t hh = 0; hh < G; ++hh)
        for (int p = 0; p < n; ++p) {
            const int64_t c = hh * rows + p;
            const auto inv = hn::Set(df, 1.f / x.l[c]);
            const float* o = x.o + c * dh;
            float* dst = a.out + (i0 + p) * a.os + (g * G + hh) * dh;
            int64_t d = 0;
            for (; d + N <= dh; d += N) hn::StoreU(hn::Mul(hn::LoadU(df, o + d), inv), df, dst + d);
            for (; d < dh; ++d) dst[d] = o[d] / x.l[c];
        }
}

int64_t ScratchFloats(const AttnCall& a) {
    const int64_t C = a.hq / a.hkv * padded_rows(kAttnQueryRows), dh = a.dh;
    return dh * C + kAttnKeyRows * C + C * dh + 3 * C + 2 * kAttnKeyRows * dh;
}

}  // namespace HWY_NAMESPACE
}  // namespace clef::ops::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace clef::ops::simd {

HWY_EXPORT(AttentionTask);
HWY_EXPORT(ScratchFloats);

int64_t attention_scratch_floats(const AttnCall& a) {
    return HWY_DYNAMIC_DISPATCH(ScratchFloats)(a);
}

void attention_task(const AttnCall& a, int g, int64_t i0, int n, float* scratch) {
    HWY_DYNAMIC_DISPATCH(AttentionTask)(a, g, i0, n, scratch);
}

}  // namespace clef::ops::simd
#endif
