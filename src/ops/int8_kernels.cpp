// The int8 GEMM's kernels (ops/int8_kernels.h), compiled once per Highway target (foreach_target.h
// re-includes this file) and dispatched at run time, and their plain-C++ twins (the reference every target is
// tested against bit for bit: tests/test_int8.cpp).
//
// panel_block on x86 targets with AVX2 (AVX2 and the AVX-512 ones): per step, one 32-byte load holds four k
// of eight columns; each row's four activation levels are broadcast, take the weights' signs (vpsignb) so
// that vpmaddubsw multiplies |w| (unsigned) by them without saturating (2 * 128 * 127 < 2^15), and vpmaddwd
// sums the pairs into eight int32 column sums. At the end of a block the sums become fp32 and are added with
// one FMA by the product of the two scales, as the twin does.
//
// x86 VNNI (ops/cpu.h's avx512_vnni or avx_vnni, chosen at run time in the AVX2 and AVX-512 targets; Highway
// 1.0 compiles no AVX3_DL target by default): the same kernels with one vpdpbusd (u8 x s8, four products per
// int32 lane added to it without intermediate saturation) in place of vpmaddubsw + vpmaddwd (+ vpaddd), one
// body (int8_kernels_vnni.h) compiled by target attribute as AVX512-VNNI with VL (EVEX, preferred: Cascade
// Lake and later, Zen 4) and AVX-VNNI (VEX: Alder Lake and later, Zen 5). They give the AVX2 kernels' and the
// twins' bits: signed panels take the same sign trick (vpdpbusd's first operand is unsigned too), so every
// product is |w| * (+-x) = w * x with |w|, |x| <= 127; vpmaddubsw's pair sums (at most 2 * 127 * 127 = 32258
// < 2^15) never saturated in the AVX2 path either, so both paths add the same exact products into int32
// block sums (at most 32 * 127 * 127 < 2^31), the same integers. Level panels: u < 32 and |x| <= 127, exact
// in both as well (the AVX2 path's 16-bit sums stay below 2^15 by its kSteps). The fp32 epilogue is the AVX2
// kernels' own code (add_block, add_level_block), so the floats are equal bit for bit too. CLEF_MAX_ISA=avx2
// (and below) turns both off; avx_vnni keeps AVX-VNNI alone, avx512_vnni and avx512_bf16 AVX512-VNNI alone.
//
// On aarch64 with FEAT_DotProd (Armv8.2's sdot, ops/cpu.h's asimd_dotprod, on under CLEF_MAX_ISA=dotprod or
// native), whatever Highway target is dispatched: the step layout is what sdot consumes. Per block, each
// activation row's 32 levels are two 16-byte loads; per step, the two 16-byte halves of the weights (columns
// 0-3 and 4-7, four k each) take vdotq_laneq_s32 with the row's four levels of the step (one 32-bit lane)
// into two int32x4 column sums, exact (32 * 127 * 127 < 2^31; level-panel bytes are < 32, so valid signed
// int8 and no sign trick is needed). The block's fp32 steps are the twin's: one FMA by ws * xs, or for level
// panels one by D * xs and one by xsum * (O * xs). These functions are compiled once with a target attribute
// (Highway 1.0 has no dotprod target) and chosen at run time; without the feature, and on other targets,
// the twin runs.
//
// No i8mm (smmla) variant: smmla multiplies a 2x8 activation tile by an 8x2 weight tile, so it needs eight
// consecutive k per column, two steps of this layout zipped together (vzip1q/vzip2q_s32: 16 zips of weights
// per block, shared by the rows) plus the activation rows zipped in pairs (4 per pair and block) and the
// block's scales built in its [r0c0 r0c1 r1c0 r1c1] order. Counting instructions per block: 2 rows take
// 16 smmla + 20 zips against 32 sdot, 4 rows 32 smmla + 24 zips against 64 sdot, before the scale shuffles:
// no gain worth a second aarch64 path without a panel layout of its own (8 k per column step), which the x86
// kernels do not share.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/int8_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ops/int8_kernels.h"
#include "ops/simd.h"
#include "util/error.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

#if HWY_ARCH_ARM_A64
namespace clef::ops::i8 {
// The dotprod kernels (below, compiled once) and whether this CPU may run them under CLEF_MAX_ISA.
bool dotprod_enabled();
void panel_block_dotprod(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel, int rows,
                         int ncols, float* y, int64_t ldy);
void panel_block_u_dotprod(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                           const unsigned char* panel, int rows, int ncols, float* y, int64_t ldy);
}  // namespace clef::ops::i8
#endif

#if HWY_ARCH_X86 && !defined(CLEF_INT8_KERNELS_X86_DECLS)
#define CLEF_INT8_KERNELS_X86_DECLS  // this file is included once per target (foreach_target.h)
namespace clef::ops::i8 {
// The x86 VNNI kernels this CPU may run under CLEF_MAX_ISA, the best of them (avx512_vnni over avx_vnni).
enum class Vnni { None, Avx, Avx512 };
Vnni vnni_kind();
// Which the last panel_block / panel_block_u call used (last_kernel_extension).
void note_vnni(Vnni used);
}  // namespace clef::ops::i8
#endif

HWY_BEFORE_NAMESPACE();
namespace clef::ops::i8 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes of fp32: a block (32 values) is a whole number of vectors on every target.
using DF = hn::CappedTag<float, 16>;

void QuantizeRow(const float* x, int64_t k, int8_t* q, float* s) {
    note_target(KernelFamily::Int8, HWY_TARGET);
    const DF df;
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<int8_t, DF> d8;
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
    const int64_t full = k / kI8Block;
    for (int64_t b = 0; b < full; ++b) {
        const float* xb = x + b * kI8Block;
        auto m = hn::Zero(df);
        for (int64_t t = 0; t < kI8Block; t += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, xb + t)));
        const float amax = hn::GetLane(hn::MaxOfLanes(df, m));
        const float sc = amax / 127.0f;
        const auto inv = hn::Set(df, sc > 0 ? 1.0f / sc : 0.0f);
        const auto lo = hn::Set(di, -127), hi = hn::Set(di, 127);
        for (int64_t t = 0; t < kI8Block; t += N) {
            const auto v = hn::Min(hn::Max(hn::NearestInt(hn::Mul(hn::LoadU(df, xb + t), inv)), lo), hi);
            hn::StoreU(hn::DemoteTo(d8, v), d8, q + b * kI8Block + t);
        }
        s[b] = sc;
    }
    if (full * kI8Block < k)
        quantize_row_ref(x + full * kI8Block, k - full * kI8Block, q + full * kI8Block, s + full);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// The four activation levels at p in every 32-bit lane.
HWY_INLINE __m256i broadcast4(const int8_t* p) {
    int32_t four;
    std::memcpy(&four, p, 4);
    return _mm256_set1_epi32(four);
}

// Row r's kI8Cols sums into y + r * ldy (the first ncols of them), for r < R.
template <int R>
HWY_INLINE void store_rows(const __m256* acc, int ncols, float* y, int64_t ldy) {
    alignas(32) float tmp[kI8Cols];
    for (int r = 0; r < R; ++r) {
        _mm256_store_ps(tmp, acc[r]);
        std::memcpy(y + r * ldy, tmp, static_cast<size_t>(ncols) * sizeof(float));
    }
}

// f(std::integral_constant<int, R>()) for R = rows (1 to kI8Rows): the row count as a template argument.
template <class F>
HWY_INLINE void with_rows(int rows, F&& f) {
    switch (rows) {
        case 4:
            return f(std::integral_constant<int, 4>());
        case 3:
            return f(std::integral_constant<int, 3>());
        case 2:
            return f(std::integral_constant<int, 2>());
        default:
            return f(std::integral_constant<int, 1>());
    }
}

// Block b's column sums of R rows (sum) into acc, one FMA by ws * xs as the twin (signed panels at pb).
template <int R>
HWY_INLINE void add_block(__m256* acc, const __m256i* sum, const unsigned char* pb, const float* xs,
                          int64_t nb, int64_t b) {
    const __m256 ws = _mm256_loadu_ps(reinterpret_cast<const float*>(pb + kI8Block * kI8Cols));
    for (int r = 0; r < R; ++r) {
        const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(xs[r * nb + b]));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), scale, acc[r]);
    }
}

// The same for level panels: one FMA by D * xs, then one of xsum by O * xs, as the twin.
template <int R>
HWY_INLINE void add_level_block(__m256* acc, const __m256i* sum, const unsigned char* pb, const float* xs,
                                const int32_t* xsum, int64_t nb, int64_t b) {
    const __m256 dv = _mm256_loadu_ps(reinterpret_cast<const float*>(pb + kI8Block * kI8Cols));
    const __m256 ov = _mm256_loadu_ps(reinterpret_cast<const float*>(pb + kI8Block * kI8Cols + kI8Cols * 4));
    for (int r = 0; r < R; ++r) {
        const __m256 sx = _mm256_set1_ps(xs[r * nb + b]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(dv, sx), acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(xsum[r * nb + b])), _mm256_mul_ps(ov, sx),
                                 acc[r]);
    }
}

template <int R>
HWY_INLINE void panel_rows_avx2(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel,
                                int ncols, float* y, int64_t ldy) {
    const int64_t kp = nb * kI8Block;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const unsigned char* pb = panel + b * kI8PanelBlockBytes;
        __m256i sum[R];
        for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
        for (int st = 0; st < kI8Block / 4; ++st) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + st * 32));
            const __m256i aw = _mm256_abs_epi8(w);
            for (int r = 0; r < R; ++r) {
                const __m256i xv = _mm256_sign_epi8(broadcast4(xq + r * kp + b * kI8Block + st * 4), w);
                sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones));
            }
        }
        add_block<R>(acc, sum, pb, xs, nb, b);
    }
    store_rows<R>(acc, ncols, y, ldy);
}

// kSteps steps of 16-bit pair sums per widening: kSteps * 2 * (2^bits - 1) * 127 < 2^15.
template <int R, int kSteps>
HWY_INLINE void level_rows_avx2(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                                const unsigned char* panel, int ncols, float* y, int64_t ldy) {
    const int64_t kp = nb * kI8Block;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const unsigned char* pb = panel + b * kU8PanelBlockBytes;
        __m256i sum[R];
        for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
        for (int s0 = 0; s0 < kI8Block / 4; s0 += kSteps) {
            __m256i p16[R];
            for (int r = 0; r < R; ++r) p16[r] = _mm256_setzero_si256();
            for (int st = s0; st < s0 + kSteps; ++st) {
                const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + st * 32));
                for (int r = 0; r < R; ++r)
                    p16[r] = _mm256_add_epi16(
                        p16[r], _mm256_maddubs_epi16(w, broadcast4(xq + r * kp + b * kI8Block + st * 4)));
            }
            for (int r = 0; r < R; ++r) sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(p16[r], ones));
        }
        add_level_block<R>(acc, sum, pb, xs, xsum, nb, b);
    }
    store_rows<R>(acc, ncols, y, ldy);
}

// The VNNI kernels (int8_kernels_vnni.h): vnni512::panel_rows / level_rows with EVEX vpdpbusd (AVX512-VNNI on
// 256-bit vectors), vnni256:: with VEX vpdpbusd (AVX-VNNI).
#define CLEF_VNNI_NS vnni512
#define CLEF_VNNI_ATTR __attribute__((target(HWY_TARGET_STR ",avx512f,avx512vl,avx512vnni")))
#define CLEF_VNNI_DPBUSD _mm256_dpbusd_epi32
#include "ops/int8_kernels_vnni.h"
#undef CLEF_VNNI_NS
#undef CLEF_VNNI_ATTR
#undef CLEF_VNNI_DPBUSD
#define CLEF_VNNI_NS vnni256
#define CLEF_VNNI_ATTR __attribute__((target(HWY_TARGET_STR ",avxvnni")))
#define CLEF_VNNI_DPBUSD _mm256_dpbusd_avx_epi32
#include "ops/int8_kernels_vnni.h"
#undef CLEF_VNNI_NS
#undef CLEF_VNNI_ATTR
#undef CLEF_VNNI_DPBUSD

#endif

void PanelBlockU(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                 const unsigned char* panel, int rows, int ncols, float* y, int64_t ldy, int bits) {
    note_target(KernelFamily::Int8, HWY_TARGET);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    with_rows(rows, [&](auto r) {
        if (bits == 4)
            level_rows_avx2<decltype(r)::value, 8>(xq, xs, xsum, nb, panel, ncols, y, ldy);
        else
            level_rows_avx2<decltype(r)::value, 4>(xq, xs, xsum, nb, panel, ncols, y, ldy);
    });
#else
#if HWY_ARCH_ARM_A64
    if (dotprod_enabled() && (bits == 4 || bits == 5))
        return panel_block_u_dotprod(xq, xs, xsum, nb, panel, rows, ncols, y, ldy);
#endif
    panel_block_u_ref(xq, xs, xsum, nb, panel, rows, ncols, y, ldy, bits);
#endif
}

void PanelBlock(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel, int rows,
                int ncols, float* y, int64_t ldy) {
    note_target(KernelFamily::Int8, HWY_TARGET);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    with_rows(rows, [&](auto r) { panel_rows_avx2<decltype(r)::value>(xq, xs, nb, panel, ncols, y, ldy); });
#else
#if HWY_ARCH_ARM_A64
    if (dotprod_enabled()) return panel_block_dotprod(xq, xs, nb, panel, rows, ncols, y, ldy);
#endif
    panel_block_ref(xq, xs, nb, panel, rows, ncols, y, ldy);
#endif
}

// PanelBlock and PanelBlockU where the CPU has VNNI under CLEF_MAX_ISA (panel_block and panel_block_u call
// them only then, so the two above stay the AVX2 path as it was): the VNNI kernels on the AVX2 and AVX-512
// targets, the targets' own functions on the others (SSE4, scalar: the twins).
void PanelBlockVnni(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel, int rows,
                    int ncols, float* y, int64_t ldy) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    note_target(KernelFamily::Int8, HWY_TARGET);
    const Vnni vnni = vnni_kind();
    note_vnni(vnni);
    if (vnni == Vnni::Avx512)
        with_rows(rows,
                  [&](auto r) { vnni512::panel_rows<decltype(r)::value>(xq, xs, nb, panel, ncols, y, ldy); });
    else
        with_rows(rows,
                  [&](auto r) { vnni256::panel_rows<decltype(r)::value>(xq, xs, nb, panel, ncols, y, ldy); });
#else
#if HWY_ARCH_X86
    note_vnni(Vnni::None);
#endif
    PanelBlock(xq, xs, nb, panel, rows, ncols, y, ldy);
#endif
}

// bits: 4 or 5 (panel_block_u checks).
void PanelBlockUVnni(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                     const unsigned char* panel, int rows, int ncols, float* y, int64_t ldy, int bits) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    (void)bits;  // u < 32 either way: every step goes into the int32 sums
    note_target(KernelFamily::Int8, HWY_TARGET);
    const Vnni vnni = vnni_kind();
    note_vnni(vnni);
    if (vnni == Vnni::Avx512)
        with_rows(rows, [&](auto r) {
            vnni512::level_rows<decltype(r)::value>(xq, xs, xsum, nb, panel, ncols, y, ldy);
        });
    else
        with_rows(rows, [&](auto r) {
            vnni256::level_rows<decltype(r)::value>(xq, xs, xsum, nb, panel, ncols, y, ldy);
        });
#else
#if HWY_ARCH_X86
    note_vnni(Vnni::None);
#endif
    PanelBlockU(xq, xs, xsum, nb, panel, rows, ncols, y, ldy, bits);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace clef::ops::i8
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#if HWY_ARCH_X86
#include <atomic>

#include "ops/cpu.h"
#elif HWY_ARCH_ARM_A64
#include <arm_neon.h>

#include <atomic>

#include "ops/cpu.h"
#endif

namespace clef::ops::i8 {

#if HWY_ARCH_ARM_A64
namespace {

// Whether the last panel_block / panel_block_u call took the dotprod kernels (kernel_extension's test side).
std::atomic<bool> g_used_dotprod{false};

void note_dotprod(bool used) {
    if (g_used_dotprod.load(std::memory_order_relaxed) != used)
        g_used_dotprod.store(used, std::memory_order_relaxed);
}

#define CLEF_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

// One step S of four (the activation levels xv[r] hold four steps): sdot of the weights' two halves (columns
// 0-3 into lo, 4-7 into hi) with lane S of each row.
template <int R, int S>
CLEF_DOTPROD inline void dot_step(const unsigned char* w, const int8x16_t (&xv)[R], int32x4_t (&lo)[R],
                                  int32x4_t (&hi)[R]) {
    const int8x16_t w0 = vld1q_s8(reinterpret_cast<const int8_t*>(w));
    const int8x16_t w1 = vld1q_s8(reinterpret_cast<const int8_t*>(w + 16));
    for (int r = 0; r < R; ++r) {
        lo[r] = vdotq_laneq_s32(lo[r], w0, xv[r], S);
        hi[r] = vdotq_laneq_s32(hi[r], w1, xv[r], S);
    }
}

// The fp32 at p as a vector (any alignment).
CLEF_DOTPROD inline float32x4_t load_f32(const unsigned char* p) {
    return vreinterpretq_f32_u8(vld1q_u8(p));
}

// R activation rows against one panel, signed (kLevels false) or level panels (true: xsum and the offsets).
// One-dimensional arrays per half of the columns: gcc keeps them in registers, [R][2] ones in memory.
template <int R, bool kLevels>
CLEF_DOTPROD void rows_dotprod(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                               const unsigned char* panel, int ncols, float* y, int64_t ldy) {
    const int64_t kp = nb * kI8Block;
    const int64_t block_bytes = kLevels ? kU8PanelBlockBytes : kI8PanelBlockBytes;
    float32x4_t acc_lo[R], acc_hi[R];
    for (int r = 0; r < R; ++r) acc_lo[r] = acc_hi[r] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; ++b) {
        const unsigned char* pb = panel + b * block_bytes;
        int32x4_t lo[R], hi[R];
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = vdupq_n_s32(0);
        for (int h = 0; h < kI8Block / 16; ++h) {  // 16 levels: four steps
            int8x16_t xv[R];
            for (int r = 0; r < R; ++r) xv[r] = vld1q_s8(xq + r * kp + b * kI8Block + h * 16);
            const unsigned char* w = pb + h * 4 * 32;
            dot_step<R, 0>(w, xv, lo, hi);
            dot_step<R, 1>(w + 32, xv, lo, hi);
            dot_step<R, 2>(w + 64, xv, lo, hi);
            dot_step<R, 3>(w + 96, xv, lo, hi);
        }
        // The column scales (ws or D), then for level panels the offsets O.
        const unsigned char* sc = pb + kI8Block * kI8Cols;
        const float32x4_t d_lo = load_f32(sc), d_hi = load_f32(sc + 16);
        for (int r = 0; r < R; ++r) {
            const float sx = xs[r * nb + b];
            acc_lo[r] = vfmaq_f32(acc_lo[r], vcvtq_f32_s32(lo[r]), vmulq_n_f32(d_lo, sx));
            acc_hi[r] = vfmaq_f32(acc_hi[r], vcvtq_f32_s32(hi[r]), vmulq_n_f32(d_hi, sx));
            if constexpr (kLevels) {
                const float32x4_t o_lo = load_f32(sc + kI8Cols * 4), o_hi = load_f32(sc + kI8Cols * 4 + 16);
                const float32x4_t xsv = vdupq_n_f32(static_cast<float>(xsum[r * nb + b]));
                acc_lo[r] = vfmaq_f32(acc_lo[r], xsv, vmulq_n_f32(o_lo, sx));
                acc_hi[r] = vfmaq_f32(acc_hi[r], xsv, vmulq_n_f32(o_hi, sx));
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        float tmp[kI8Cols];
        vst1q_f32(tmp, acc_lo[r]);
        vst1q_f32(tmp + 4, acc_hi[r]);
        std::memcpy(y + r * ldy, tmp, static_cast<size_t>(ncols) * sizeof(float));
    }
}

#undef CLEF_DOTPROD

template <bool kLevels>
void dotprod(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb, const unsigned char* panel,
             int rows, int ncols, float* y, int64_t ldy) {
    note_dotprod(true);
    switch (rows) {
        case 4:
            return rows_dotprod<4, kLevels>(xq, xs, xsum, nb, panel, ncols, y, ldy);
        case 3:
            return rows_dotprod<3, kLevels>(xq, xs, xsum, nb, panel, ncols, y, ldy);
        case 2:
            return rows_dotprod<2, kLevels>(xq, xs, xsum, nb, panel, ncols, y, ldy);
        default:
            return rows_dotprod<1, kLevels>(xq, xs, xsum, nb, panel, ncols, y, ldy);
    }
}

}  // namespace

bool dotprod_enabled() {
    const bool on = cpu_features().asimd_dotprod;
    if (!on) note_dotprod(false);
    return on;
}

void panel_block_dotprod(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel, int rows,
                         int ncols, float* y, int64_t ldy) {
    dotprod<false>(xq, xs, nullptr, nb, panel, rows, ncols, y, ldy);
}

void panel_block_u_dotprod(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                           const unsigned char* panel, int rows, int ncols, float* y, int64_t ldy) {
    dotprod<true>(xq, xs, xsum, nb, panel, rows, ncols, y, ldy);
}

const char* kernel_extension() {
    return cpu_features().asimd_dotprod ? "dotprod" : "";
}

const char* last_kernel_extension() {
    return g_used_dotprod.load(std::memory_order_relaxed) ? "dotprod" : "";
}
#elif HWY_ARCH_X86
namespace {

// The VNNI kernels the last panel_block / panel_block_u call took (Vnni::None: the AVX2 kernels or the twin).
std::atomic<Vnni> g_used_vnni{Vnni::None};

const char* vnni_name(Vnni v) {
    return v == Vnni::Avx512 ? "avx512-vnni" : v == Vnni::Avx ? "avx-vnni" : "";
}

}  // namespace

Vnni vnni_kind() {
    const CpuFeatures& f = cpu_features();
    return f.avx512_vnni ? Vnni::Avx512 : f.avx_vnni ? Vnni::Avx : Vnni::None;
}

void note_vnni(Vnni used) {
    if (g_used_vnni.load(std::memory_order_relaxed) != used)
        g_used_vnni.store(used, std::memory_order_relaxed);
}

const char* kernel_extension() {
    // Only the AVX2 and AVX-512 targets call the VNNI kernels (a forced SSE4 or scalar target runs the twin).
    const Vnni v = vnni_kind();
    return v != Vnni::None && simd_targets().front() <= HWY_AVX2 ? vnni_name(v) : "";
}

const char* last_kernel_extension() {
    return vnni_name(g_used_vnni.load(std::memory_order_relaxed));
}
#else
const char* kernel_extension() {
    return "";
}

const char* last_kernel_extension() {
    return "";
}
#endif

HWY_EXPORT(QuantizeRow);
HWY_EXPORT(PanelBlock);
HWY_EXPORT(PanelBlockU);
HWY_EXPORT(PanelBlockVnni);
HWY_EXPORT(PanelBlockUVnni);

void quantize_row(const float* x, int64_t k, int8_t* q, float* s) {
    HWY_DYNAMIC_DISPATCH(QuantizeRow)(x, k, q, s);
}

void panel_block(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel, int rows,
                 int ncols, float* y, int64_t ldy) {
#if HWY_ARCH_X86
    if (vnni_kind() != Vnni::None)
        return HWY_DYNAMIC_DISPATCH(PanelBlockVnni)(xq, xs, nb, panel, rows, ncols, y, ldy);
    note_vnni(Vnni::None);
#endif
    HWY_DYNAMIC_DISPATCH(PanelBlock)(xq, xs, nb, panel, rows, ncols, y, ldy);
}

void panel_block_u(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                   const unsigned char* panel, int rows, int ncols, float* y, int64_t ldy, int bits) {
#if HWY_ARCH_X86
    if (vnni_kind() != Vnni::None && (bits == 4 || bits == 5))
        return HWY_DYNAMIC_DISPATCH(PanelBlockUVnni)(xq, xs, xsum, nb, panel, rows, ncols, y, ldy, bits);
    note_vnni(Vnni::None);
#endif
    HWY_DYNAMIC_DISPATCH(PanelBlockU)(xq, xs, xsum, nb, panel, rows, ncols, y, ldy, bits);
}

void panel_block_u_ref(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                       const unsigned char* panel, int rows, int ncols, float* y, int64_t ldy, int bits) {
    if (bits != 4 && bits != 5) throw Error("int8: level panels hold 4- or 5-bit levels");
    const int64_t kp = nb * kI8Block;
    for (int r = 0; r < rows; ++r) {
        float acc[kI8Cols] = {};
        for (int64_t b = 0; b < nb; ++b) {
            const unsigned char* pb = panel + b * kU8PanelBlockBytes;
            const int8_t* x = xq + r * kp + b * kI8Block;
            for (int c = 0; c < kI8Cols; ++c) {
                int32_t sum = 0;
                for (int t = 0; t < kI8Block; ++t) sum += int32_t{x[t]} * pb[(t / 4) * 32 + c * 4 + t % 4];
                float d, o;
                std::memcpy(&d, pb + kI8Block * kI8Cols + c * 4, 4);
                std::memcpy(&o, pb + kI8Block * kI8Cols + kI8Cols * 4 + c * 4, 4);
                const float sx = xs[r * nb + b];
                acc[c] = std::fma(static_cast<float>(sum), d * sx, acc[c]);
                acc[c] = std::fma(static_cast<float>(xsum[r * nb + b]), o * sx, acc[c]);
            }
        }
        for (int c = 0; c < ncols; ++c) y[r * ldy + c] = acc[c];
    }
}

void quantize_row_ref(const float* x, int64_t k, int8_t* q, float* s) {
    for (int64_t b = 0; b * kI8Block < k; ++b) {
        const int64_t n = std::min<int64_t>(kI8Block, k - b * kI8Block);
        const float* xb = x + b * kI8Block;
        float amax = 0;
        for (int64_t t = 0; t < n; ++t) amax = std::max(amax, std::fabs(xb[t]));
        const float sc = amax / 127.0f;
        const float inv = sc > 0 ? 1.0f / sc : 0.0f;
        for (int64_t t = 0; t < kI8Block; ++t) {
            const float v = t < n ? std::nearbyint(xb[t] * inv) : 0.0f;
            q[b * kI8Block + t] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
        }
        s[b] = sc;
    }
}

void panel_block_ref(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel, int rows,
                     int ncols, float* y, int64_t ldy) {
    const int64_t kp = nb * kI8Block;
    for (int r = 0; r < rows; ++r) {
        float acc[kI8Cols] = {};
        for (int64_t b = 0; b < nb; ++b) {
            const unsigned char* pb = panel + b * kI8PanelBlockBytes;
            const int8_t* w = reinterpret_cast<const int8_t*>(pb);
            const int8_t* x = xq + r * kp + b * kI8Block;
            for (int c = 0; c < kI8Cols; ++c) {
                int32_t sum = 0;
                for (int t = 0; t < kI8Block; ++t) sum += int32_t{x[t]} * w[(t / 4) * 32 + c * 4 + t % 4];
                float ws;
                std::memcpy(&ws, pb + kI8Block * kI8Cols + c * 4, 4);
                acc[c] = std::fma(static_cast<float>(sum), ws * xs[r * nb + b], acc[c]);
            }
        }
        for (int c = 0; c < ncols; ++c) y[r * ldy + c] = acc[c];
    }
}

}  // namespace clef::ops::i8
#endif  // HWY_ONCE
