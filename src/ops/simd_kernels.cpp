// Highway kernels, compiled once per target (foreach_target.h re-includes this file) and dispatched at run
// time. Each has a plain-C++ reference it is tested against on every target (tests/test_gemm.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/simd_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu.h"
#include "ops/named_vectors.h"
#include "ops/simd.h"
#include "ops/simd_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace clef::ops::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes of fp32: a panel (32 columns) is a whole number of two-vector strips on every target.
using DF = hn::CappedTag<float, 16>;

// N weights of row t of a panel strip, as fp32.
template <int kType>
HWY_INLINE hn::Vec<DF> load_weights(DF df, const void* panel, int64_t offset) {
    if constexpr (kType == 0) {
        return hn::LoadU(df, static_cast<const float*>(panel) + offset);
    } else if constexpr (kType == 1) {
        const hn::Rebind<uint16_t, DF> d16;
        const hn::Rebind<uint32_t, DF> d32;
        const auto bits = hn::LoadU(d16, static_cast<const uint16_t*>(panel) + offset);
        return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, bits)));
    } else {
        const hn::Rebind<hwy::float16_t, DF> dh;
        return hn::PromoteTo(df, hn::LoadU(dh, static_cast<const hwy::float16_t*>(panel) + offset));
    }
}

// Row r of a strip, columns [0, ncols): the two vectors, whole or through tmp.
HWY_INLINE void store_row(DF df, hn::Vec<DF> v0, hn::Vec<DF> v1, int ncols, float* y, float* tmp) {
    const int N = static_cast<int>(hn::Lanes(df));
    if (ncols >= 2 * N) {
        hn::StoreU(v0, df, y);
        hn::StoreU(v1, df, y + N);
    } else {
        hn::Store(v0, df, tmp);
        hn::Store(v1, df, tmp + N);
        std::memcpy(y, tmp, static_cast<size_t>(ncols) * sizeof(float));
    }
}

// Rows [0, MR) x columns [col0, col0 + 2N) of one panel: 2 * MR accumulators (12 at MR = 6, which with two
// weight vectors and a broadcast fits AVX2's 16 registers), named locals (ops/named_vectors.h).
template <int MR, int kType>
HWY_INLINE void panel_strip(const float* x, int64_t k, const void* panel, int col0, int ncols, float* y,
                            int64_t ldy) {
    static_assert(MR >= 1 && MR <= 6);
    const DF df;
    const int N = static_cast<int>(hn::Lanes(df));
    // Row r: acc<r>0 (columns [0, N)) and acc<r>1 ([N, 2N)); rows from MR on are not used.
    auto acc00 = hn::Zero(df), acc01 = acc00, acc10 = acc00, acc11 = acc00, acc20 = acc00, acc21 = acc00,
         acc30 = acc00, acc31 = acc00, acc40 = acc00, acc41 = acc00, acc50 = acc00, acc51 = acc00;
    for (int64_t t = 0; t < k; ++t) {
        const int64_t off = t * kPanelCols + col0;
        const auto w0 = load_weights<kType>(df, panel, off);
        const auto w1 = load_weights<kType>(df, panel, off + N);
#define CLEF_ROW(r)                                \
    if constexpr (r < MR) {                        \
        const auto xb = hn::Set(df, x[r * k + t]); \
        acc##r##0 = hn::MulAdd(xb, w0, acc##r##0); \
        acc##r##1 = hn::MulAdd(xb, w1, acc##r##1); \
    }
        CLEF_ROWS6(CLEF_ROW)
#undef CLEF_ROW
    }
    HWY_ALIGN float tmp[2 * 16];
#define CLEF_ROW(r) \
    if constexpr (r < MR) store_row(df, acc##r##0, acc##r##1, ncols, y + r * ldy, tmp);
    CLEF_ROWS6(CLEF_ROW)
#undef CLEF_ROW
}

template <int kType>
HWY_INLINE void panel_rows(const float* x, int64_t k, const void* panel, int rows, int col0, int ncols,
                           float* y, int64_t ldy) {
    switch (rows) {
        case 6:
            return panel_strip<6, kType>(x, k, panel, col0, ncols, y, ldy);
        case 5:
            return panel_strip<5, kType>(x, k, panel, col0, ncols, y, ldy);
        case 4:
            return panel_strip<4, kType>(x, k, panel, col0, ncols, y, ldy);
        case 3:
            return panel_strip<3, kType>(x, k, panel, col0, ncols, y, ldy);
        case 2:
            return panel_strip<2, kType>(x, k, panel, col0, ncols, y, ldy);
        default:
            return panel_strip<1, kType>(x, k, panel, col0, ncols, y, ldy);
    }
}

void PanelBlock(const float* x, int64_t k, const void* panel, PanelType type, int rows, int ncols, float* y,
                int64_t ldy) {
    note_target(KernelFamily::Gemm, HWY_TARGET);
    const int strip = 2 * static_cast<int>(hn::Lanes(DF()));
    for (int c0 = 0; c0 < ncols; c0 += strip) {
        const int nc = std::min(strip, ncols - c0);
        if (type == PanelType::F32)
            panel_rows<0>(x, k, panel, rows, c0, nc, y + c0, ldy);
        else if (type == PanelType::BF16)
            panel_rows<1>(x, k, panel, rows, c0, nc, y + c0, ldy);
        else
            panel_rows<2>(x, k, panel, rows, c0, nc, y + c0, ldy);
    }
}

// c rows [0, MR) x columns [0, N) or [0, 2N) (kTwo). Only whole vectors: Highway 1.0's masked loads and
// blended stores may touch the whole vector on some targets, so the last n % N columns are scalar.
template <int MR, bool kTwo>
HWY_INLINE void small_block(int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                            float* c, int64_t ldc) {
    static_assert(MR >= 1 && MR <= 6);
    const DF df;
    const size_t N = hn::Lanes(df);
    // Row r: acc<r>0 (columns [0, N)) and, if kTwo, acc<r>1 ([N, 2N)); rows from MR on are not used.
    auto acc00 = hn::Zero(df), acc01 = acc00, acc10 = acc00, acc11 = acc00, acc20 = acc00, acc21 = acc00,
         acc30 = acc00, acc31 = acc00, acc40 = acc00, acc41 = acc00, acc50 = acc00, acc51 = acc00;
#define CLEF_ROW(r)                                                     \
    if constexpr (r < MR) {                                             \
        acc##r##0 = hn::LoadU(df, c + r * ldc);                         \
        if constexpr (kTwo) acc##r##1 = hn::LoadU(df, c + r * ldc + N); \
    }
    CLEF_ROWS6(CLEF_ROW)
#undef CLEF_ROW
    for (int64_t t = 0; t < k; ++t) {
        const auto b0 = hn::LoadU(df, b + t * ldb);
        const auto b1 = kTwo ? hn::LoadU(df, b + t * ldb + N) : b0;
#define CLEF_ROW(r)                                                    \
    if constexpr (r < MR) {                                            \
        const auto av = hn::Set(df, alpha * a[r * lda + t]);           \
        acc##r##0 = hn::MulAdd(av, b0, acc##r##0);                     \
        if constexpr (kTwo) acc##r##1 = hn::MulAdd(av, b1, acc##r##1); \
    }
        CLEF_ROWS6(CLEF_ROW)
#undef CLEF_ROW
    }
#define CLEF_ROW(r)                                                     \
    if constexpr (r < MR) {                                             \
        hn::StoreU(acc##r##0, df, c + r * ldc);                         \
        if constexpr (kTwo) hn::StoreU(acc##r##1, df, c + r * ldc + N); \
    }
    CLEF_ROWS6(CLEF_ROW)
#undef CLEF_ROW
}

template <int MR>
HWY_INLINE void small_rows(int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                           int64_t ldb, float* c, int64_t ldc) {
    const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
    int64_t j = 0;
    for (; j + 2 * N <= n; j += 2 * N) small_block<MR, true>(k, alpha, a, lda, b + j, ldb, c + j, ldc);
    if (j + N <= n) {
        small_block<MR, false>(k, alpha, a, lda, b + j, ldb, c + j, ldc);
        j += N;
    }
    for (int r = 0; r < MR; ++r)
        for (int64_t t = 0; t < k; ++t) {
            const float av = alpha * a[r * lda + t];
            for (int64_t jj = j; jj < n; ++jj) c[r * ldc + jj] += av * b[t * ldb + jj];
        }
}

void SmallGemmAcc(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
    note_target(KernelFamily::Gemm, HWY_TARGET);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) small_rows<4>(n, k, alpha, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
    for (; i < m; ++i) small_rows<1>(n, k, alpha, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
}

void Bf16ToF32(const uint16_t* in, float* out, int64_t count) {
    note_target(KernelFamily::Gemm, HWY_TARGET);
    const DF df;
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
    int64_t i = 0;
    for (; i + N <= count; i += N) hn::StoreU(load_weights<1>(df, in, i), df, out + i);
    for (; i < count; ++i) {
        const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
        std::memcpy(out + i, &u, 4);
    }
}

}  // namespace HWY_NAMESPACE
}  // namespace clef::ops::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace clef::ops::simd {

HWY_EXPORT(PanelBlock);
HWY_EXPORT(SmallGemmAcc);
HWY_EXPORT(Bf16ToF32);

// CLEF_MAX_ISA (ops::cpu_features) must reach Highway before the first dispatch: Highway picks its target on
// the first call, and a later cap would change the arithmetic between calls. Applied when the program starts.
[[maybe_unused]] const bool kIsaCapApplied = (cpu_features(), true);

void panel_block(const float* x, int64_t k, const void* panel, PanelType type, int rows, int ncols, float* y,
                 int64_t ldy) {
    HWY_DYNAMIC_DISPATCH(PanelBlock)(x, k, panel, type, rows, ncols, y, ldy);
}

void small_gemm_acc(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc) {
    HWY_DYNAMIC_DISPATCH(SmallGemmAcc)(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

void bf16_to_f32(const uint16_t* in, float* out, int64_t count) {
    HWY_DYNAMIC_DISPATCH(Bf16ToF32)(in, out, count);
}

}  // namespace clef::ops::simd
#endif  // HWY_ONCE
