// The int8 GEMM's kernels (ops/int8_kernels.h), compiled once per Highway target (foreach_target.h
// re-includes this file) and dispatched at run time, and their plain-C++ twins (the reference every target is
// tested against bit for bit: tests/test_kernels.cpp).
//
// x86 (the AVX2 and AVX-512 targets): one body, `tile` below, for every encoding. It multiplies R activation
// rows by V vectors of columns over a tile's blocks, keeping R x V int32 block sums and R x V fp32 sums in
// registers, and takes its instructions from one of three instruction sets (the `Isa` argument):
//   Vnni     (AVX-512 targets on a CPU with AVX512-VNNI): 16 columns per 512-bit vector, per row and step one
//            vpdpbusd of the step's 64 weight bytes (w + 128: unsigned, as the panel holds them) with the
//            row's 4 levels as an embedded broadcast operand (signed): 64 multiply-adds per instruction. The
//            bias comes off in the integers: each block's sums start at -128 * (the row's sum of levels).
//   Vnni     (the AVX2 target on a CPU with AVX-VNNI): the same with 256-bit VEX vpdpbusd (8 columns per
//            vector; VEX has no embedded broadcast: one vpbroadcastd load per row and step, shared by the
//            row's vectors).
//   Avx2     (no VNNI; also the AVX-512 targets without AVX512-VNNI): vpmaddubsw multiplies |w| by the
//            activations carrying w's sign (vpsignb; w = the panel's byte xor 0x80, |w| once per step for all
//            rows), vpmaddwd widens the pairs into int32. Level panels (u < 32, unsigned as they are) add
//            vpmaddubsw's 16-bit pair sums over several steps before widening (kGroup).
// Nibble panels (4-bit levels, two steps per 64 bytes) take the same paths: each 64-byte load serves two
// steps, its low nibbles (one vpand) and its high ones (vpsrlw by 4, vpand), once per step for all rows.
// Every path adds the same exact products into int32 block sums: signed panels |w|, |x| <= 127 (the AVX2
// pair sums at most 2 * 127 * 127 < 2^15, no saturation; vpdpbusd's four products per lane are added without
// intermediate saturation, and (w + 128) * x sums minus 128 * sum x are w * x sums exactly, all within int32:
// 32 * 255 * 127 < 2^31), level panels u * x with u < 32 (AVX2: kGroup steps keep 16-bit sums below 2^15).
// The fp32 epilogue of a block is the twin's: one FMA by ws * s (and for level panels one more by O * ssum),
// so every path gives the twins' bits. R x V per instruction set (kRows x kVecs): 8 x 2 zmm, 4 x 2 ymm; the
// int32 sums stay in registers through a block's steps, the fp32 ones (touched once per block) may be on the
// stack (docs/PERFORMANCE.md, the int8 yardstick).
// The functions take the Highway target's options plus that target's VNNI form (avx512vnni on AVX-512
// targets, avxvnni on AVX2) as their target attribute: a template cannot take its target from a template
// argument, so one target attribute per Highway target serves all three instruction sets; the non-VNNI
// instantiations contain no VNNI instruction (the compiler emits vpdpbusd only from its intrinsics).
//
// aarch64 with FEAT_DotProd (Armv8.2's sdot, ops/cpu.h's asimd_dotprod, on under CLEF_MAX_ISA=dotprod or
// native), whatever Highway target is dispatched: per 8 columns of a panel (two 16-byte halves of the step's
// 64 bytes, columns 0-3 and 4-7 of the half panel), each activation row's 32 levels of a block are two
// 16-byte loads and every step takes vdotq_laneq_s32 with the row's four levels of the step (one 32-bit lane)
// into two int32x4 column sums, exact (32 * 127 * 127 < 2^31); signed panels' bytes xor 0x80 are w, level
// panels' bytes (< 32) are valid signed int8 as they are, nibble panels' nibbles (vand / vshr by 4) too. The
// block's fp32 steps are the twin's. These functions are compiled once with a target attribute (Highway 1.0
// has no dotprod target) and chosen at run time; without the feature, and on other targets, the twin runs.
//
// No i8mm (smmla) variant: smmla multiplies a 2x8 activation tile by an 8x2 weight tile, so it needs eight
// consecutive k per column, two steps of this layout zipped together plus the activation rows zipped in
// pairs and the block's scales built in its [r0c0 r0c1 r1c0 r1c1] order: counted per block, no gain worth a
// second aarch64 path without a panel layout of its own (8 k per column step), which the x86 kernels do not
// share. No AMX-INT8 (tdpbusd) path: no CPU this was written on has AMX, so it could not be tested.
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

#if !defined(CLEF_INT8_KERNELS_DECLS)
#define CLEF_INT8_KERNELS_DECLS  // this file is included once per target (foreach_target.h)
namespace clef::ops::i8 {
// The extension a panel kernel call used (kernel_extension's names), noted by every call for
// last_kernel_extension.
enum class Ext { None, Dotprod, AvxVnni, Avx512Vnni };
void note_extension(Ext used);
// A quantised activation block's last word (ops/int8_kernels.h) from its scale and sum of levels.
inline void put_act_word(unsigned char* block, float s, int32_t sum, bool levels) {
    if (levels) {
        const float ssum = s * static_cast<float>(sum);
        std::memcpy(block + kI8Block + 4, &ssum, 4);
    } else {
        const int32_t bias = -kI8Bias * sum;
        std::memcpy(block + kI8Block + 4, &bias, 4);
    }
    std::memcpy(block + kI8Block, &s, 4);
}
// The VNNI forms this CPU may use under CLEF_MAX_ISA (x86; false elsewhere).
bool cpu_avx512_vnni();
bool cpu_avx_vnni();
#if HWY_ARCH_ARM_A64
// The dotprod kernels (below, compiled once) and whether this CPU may run them under CLEF_MAX_ISA.
bool dotprod_enabled();
void panel_block_dotprod(const I8Rows& x, const I8Tile& t, int bits);  // bits: the panel kind
#endif
}  // namespace clef::ops::i8
#endif

HWY_BEFORE_NAMESPACE();
namespace clef::ops::i8 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes of fp32: a block (32 values) is a whole number of vectors on every target.
using DF = hn::CappedTag<float, 16>;

// One block of kI8Block values at xb: levels into q, scale into *s; returns the sum of the levels.
HWY_INLINE int32_t QuantizeBlock(const float* xb, int8_t* q, float* s) {
    const DF df;
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<int8_t, DF> d8;
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
    auto m = hn::Zero(df);
    for (int64_t t = 0; t < kI8Block; t += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, xb + t)));
    const float amax = hn::GetLane(hn::MaxOfLanes(df, m));
    const float sc = amax / 127.0f;
    const auto inv = hn::Set(df, sc > 0 ? 1.0f / sc : 0.0f);
    const auto lo = hn::Set(di, -127), hi = hn::Set(di, 127);
    auto total = hn::Zero(di);
    for (int64_t t = 0; t < kI8Block; t += N) {
        const auto v = hn::Min(hn::Max(hn::NearestInt(hn::Mul(hn::LoadU(df, xb + t), inv)), lo), hi);
        total = hn::Add(total, v);
        hn::StoreU(hn::DemoteTo(d8, v), d8, q + t);
    }
    *s = sc;
    return hn::GetLane(hn::SumOfLanes(di, total));
}

void QuantizeRow(const float* x, int64_t k, int8_t* q, float* s) {
    note_target(KernelFamily::Int8, HWY_TARGET);
    const int64_t full = k / kI8Block;
    for (int64_t b = 0; b < full; ++b) QuantizeBlock(x + b * kI8Block, q + b * kI8Block, s + b);
    if (full * kI8Block < k)
        quantize_row_ref(x + full * kI8Block, k - full * kI8Block, q + full * kI8Block, s + full);
}

void QuantizeActs(const float* x, int64_t k, unsigned char* out, bool levels) {
    note_target(KernelFamily::Int8, HWY_TARGET);
    const int64_t full = k / kI8Block;
    for (int64_t b = 0; b < full; ++b) {
        unsigned char* ob = out + b * kI8ActBytes;
        float sc;
        const int32_t sum = QuantizeBlock(x + b * kI8Block, reinterpret_cast<int8_t*>(ob), &sc);
        put_act_word(ob, sc, sum, levels);
    }
    if (full * kI8Block < k)
        quantize_acts_ref(x + full * kI8Block, k - full * kI8Block, out + full * kI8ActBytes, levels);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// This target's VNNI form (see the top of the file).
#if HWY_TARGET <= HWY_AVX3
#define CLEF_I8_TARGET HWY_TARGET_STR ",avx512vnni"
#else
#define CLEF_I8_TARGET HWY_TARGET_STR ",avxvnni"
#endif
#define CLEF_I8_FN __attribute__((target(CLEF_I8_TARGET)))
#define CLEF_I8_INLINE __attribute__((target(CLEF_I8_TARGET), always_inline)) inline

// The four levels at p as one int32.
CLEF_I8_INLINE int32_t four(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The fp32 at p (any alignment).
CLEF_I8_INLINE float load_f32(const unsigned char* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
}

// The 256-bit vectors' fp32 side and loads (Avx2 and VnniAvx).
struct X256 {
    using I = __m256i;
    using F = __m256;
    static constexpr int kLanes = 8;
    static CLEF_I8_INLINE I zero() { return _mm256_setzero_si256(); }
    static CLEF_I8_INLINE I set1(int32_t v) { return _mm256_set1_epi32(v); }
    static CLEF_I8_INLINE I load(const unsigned char* p) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    }
    // The low (high: false) or high nibbles of v's bytes.
    static CLEF_I8_INLINE I nibbles(I v, bool high) {
        return _mm256_and_si256(high ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
    }
    static CLEF_I8_INLINE F fzero() { return _mm256_setzero_ps(); }
    static CLEF_I8_INLINE F fload(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }
    static CLEF_I8_INLINE F fset1(float v) { return _mm256_set1_ps(v); }
    // acc + float(sum) * (scale * s): the twin's fused add.
    static CLEF_I8_INLINE F add_scaled(F acc, I sum, F scale, float s) {
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(scale, _mm256_set1_ps(s)), acc);
    }
    static CLEF_I8_INLINE F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    // The first n (<= kLanes) floats at y: loaded (the rest 0) / stored.
    static CLEF_I8_INLINE F yload(const float* y, int n) {
        if (n == kLanes) return _mm256_loadu_ps(y);
        alignas(32) float tmp[kLanes] = {};
        std::memcpy(tmp, y, static_cast<size_t>(n) * sizeof(float));
        return _mm256_load_ps(tmp);
    }
    static CLEF_I8_INLINE void ystore(float* y, F v, int n) {
        if (n == kLanes) return _mm256_storeu_ps(y, v);
        alignas(32) float tmp[kLanes];
        _mm256_store_ps(tmp, v);
        std::memcpy(y, tmp, static_cast<size_t>(n) * sizeof(float));
    }
};

// vpmaddubsw + vpmaddwd (see the top of the file). W: the step's weights w and |w| (signed panels) or u.
struct Avx2 : X256 {
    static constexpr Ext kExt = Ext::None;
    static constexpr int kRows = 4, kVecs = 2;
    struct W {
        I w, aw;
    };
    // Steps of 16-bit pair sums per widening of level panels: kGroup * 2 * (2^bits - 1) * 127 < 2^15 (signed
    // panels widen every step in dot: the group is the block).
    static constexpr int group(int bits) { return bits == 5 ? 4 : 8; }
    static CLEF_I8_INLINE I ones() { return _mm256_set1_epi16(1); }
    template <int kBits>
    static CLEF_I8_INLINE I start(const unsigned char*) {
        return zero();
    }
    template <int kBits>
    static CLEF_I8_INLINE W weights(const unsigned char* p, bool high) {
        const I v = load(p);
        if constexpr (kBits == 4) {
            const I u = nibbles(v, high);
            return {u, u};
        }
        if constexpr (kBits) return {v, v};
        const I w = _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
        return {w, _mm256_abs_epi8(w)};
    }
    template <int kBits>
    static CLEF_I8_INLINE I open(I sum) {
        return kBits ? zero() : sum;
    }
    template <int kBits>
    static CLEF_I8_INLINE I bcast(const int8_t* x) {
        return _mm256_set1_epi32(four(x));
    }
    template <int kBits>
    static CLEF_I8_INLINE I dot(I part, const W& w, I x) {
        if constexpr (kBits) return keep(_mm256_add_epi16(part, _mm256_maddubs_epi16(w.w, x)));
        const I p16 = _mm256_maddubs_epi16(w.aw, _mm256_sign_epi8(x, w.w));
        return keep(_mm256_add_epi32(part, _mm256_madd_epi16(p16, ones())));
    }
    // The running sum through an empty asm: gcc would otherwise re-associate a block's unrolled adds into a
    // tree whose partial sums do not fit the 16 registers (bench/int8_mix.py: 3 stack accesses per 64
    // multiply-adds, half the speed).
    static CLEF_I8_INLINE I keep(I v) {
        __asm__("" : "+x"(v));
        return v;
    }
    template <int kBits>
    static CLEF_I8_INLINE I close(I sum, I part) {
        return kBits ? _mm256_add_epi32(sum, _mm256_madd_epi16(part, ones())) : part;
    }
};

// One vpdpbusd per row, step and vector: int32 sums all the way (open / close are the sums themselves).
template <class Base>
struct VnniSteps : Base {
    using I = typename Base::I;
    using W = I;
    static constexpr int group(int) { return kI8Block / 4; }
    // The block sums' start: the activation block's bias word for signed panels, 0 for levels.
    template <int kBits>
    static CLEF_I8_INLINE I start(const unsigned char* word) {
        if constexpr (kBits) return Base::zero();
        int32_t v;
        std::memcpy(&v, word, 4);
        return Base::set1(v);
    }
    template <int kBits>
    static CLEF_I8_INLINE W weights(const unsigned char* p, bool high) {
        if constexpr (kBits == 4) return Base::nibbles(Base::load(p), high);
        return Base::load(p);
    }
    template <int kBits>
    static CLEF_I8_INLINE I open(I sum) {
        return sum;
    }
    template <int kBits>
    static CLEF_I8_INLINE I close(I, I part) {
        return part;
    }
};

#if HWY_TARGET <= HWY_AVX3
struct X512 {
    using I = __m512i;
    using F = __m512;
    static constexpr int kLanes = 16;
    static CLEF_I8_INLINE I zero() { return _mm512_setzero_si512(); }
    static CLEF_I8_INLINE I set1(int32_t v) { return _mm512_set1_epi32(v); }
    static CLEF_I8_INLINE I load(const unsigned char* p) { return _mm512_loadu_si512(p); }
    static CLEF_I8_INLINE I nibbles(I v, bool high) {
        return _mm512_and_si512(high ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0f));
    }
    static CLEF_I8_INLINE F fzero() { return _mm512_setzero_ps(); }
    static CLEF_I8_INLINE F fload(const void* p) { return _mm512_loadu_ps(p); }
    static CLEF_I8_INLINE F add_scaled(F acc, I sum, F scale, float s) {
        // maskz with every lane: the plain conversion (gcc 12 warns about _mm512_cvtepi32_ps's undefined
        // source).
        const F f = _mm512_maskz_cvtepi32_ps(static_cast<__mmask16>(0xffff), sum);
        return _mm512_fmadd_ps(f, _mm512_mul_ps(scale, _mm512_set1_ps(s)), acc);
    }
    static CLEF_I8_INLINE F fset1(float v) { return _mm512_set1_ps(v); }
    static CLEF_I8_INLINE F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static CLEF_I8_INLINE __mmask16 lanes(int n) { return static_cast<__mmask16>((1u << n) - 1); }
    static CLEF_I8_INLINE F yload(const float* y, int n) { return _mm512_maskz_loadu_ps(lanes(n), y); }
    static CLEF_I8_INLINE void ystore(float* y, F v, int n) { _mm512_mask_storeu_ps(y, lanes(n), v); }
};

// 512-bit EVEX vpdpbusd; the row's four levels are its broadcast memory operand.
struct Vnni : VnniSteps<X512> {
    static constexpr Ext kExt = Ext::Avx512Vnni;
    static constexpr int kRows = 8, kVecs = 2;
    template <int kBits>
    static CLEF_I8_INLINE const int8_t* bcast(const int8_t* x) {
        return x;
    }
    template <int kBits>
    static CLEF_I8_INLINE I dot(I part, W w, const int8_t* x) {
        return _mm512_dpbusd_epi32(part, w, _mm512_set1_epi32(four(x)));
    }
};
#else
// 256-bit VEX vpdpbusd; one broadcast per row and step, shared by the row's vectors.
struct Vnni : VnniSteps<X256> {
    static constexpr Ext kExt = Ext::AvxVnni;
    static constexpr int kRows = 4, kVecs = 2;
    template <int kBits>
    static CLEF_I8_INLINE I bcast(const int8_t* x) {
        return _mm256_set1_epi32(four(x));
    }
    template <int kBits>
    static CLEF_I8_INLINE I dot(I part, W w, I x) {
        return _mm256_dpbusd_avx_epi32(part, w, x);
    }
};
#endif

// R rows (row0 on) by V vectors of columns (col0 on, within the tile's panels) of one tile, every block:
// the one body of the x86 kernels (see the top of the file). kBits: 0 signed panels, 4 or 5 level panels.
template <class Isa, int R, int V, int kBits>
CLEF_I8_FN void tile(const I8Rows& x, const I8Tile& t, int row0, int col0) {
    using I = typename Isa::I;
    using F = typename Isa::F;
    constexpr int L = Isa::kLanes;
    constexpr int64_t kBlockBytes = panel_block_bytes(kBits);
    constexpr int kGroup = Isa::group(kBits);
    constexpr int kPairs = kI8Block / 8;  // nibble panels: steps st and st + kPairs share 64 bytes
    const unsigned char* col[V];          // vector v's first byte in block 0 (its columns' 4 bytes of step 0)
    int n[V];                             // vector v's columns in the tile
    for (int v = 0; v < V; ++v) {
        const int c = col0 + v * L;
        col[v] = t.panel + (c / kI8Cols) * t.panel_stride + (c % kI8Cols) * 4;
        n[v] = std::clamp(t.ncols - c, 0, L);
    }
    const unsigned char* xr[R];  // row r's block 0
    for (int r = 0; r < R; ++r) xr[r] = x.p + (row0 + r) * x.ld;
    float* y = t.y + row0 * t.ldy + col0;
    F acc[R][V];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v)
            acc[r][v] = t.accumulate ? Isa::yload(y + r * t.ldy + v * L, n[v]) : Isa::fzero();
    for (int64_t b = 0; b < t.nb; ++b) {
        I sum[R][V];
        for (int r = 0; r < R; ++r) {
            const I s0 = Isa::template start<kBits>(xr[r] + b * kI8ActBytes + kI8Block + 4);
            for (int v = 0; v < V; ++v) sum[r][v] = s0;
        }
        for (int g = 0; g < kI8Block / 4; g += kGroup) {
            I part[R][V];
            for (int r = 0; r < R; ++r)
                for (int v = 0; v < V; ++v) part[r][v] = Isa::template open<kBits>(sum[r][v]);
#pragma GCC unroll 8
            for (int st = g; st < g + kGroup; ++st) {
                typename Isa::W w[V];
                const int at = kBits == 4 ? st % kPairs : st;  // the step's 64 bytes
                for (int v = 0; v < V; ++v)
                    w[v] = Isa::template weights<kBits>(col[v] + b * kBlockBytes + at * (kI8Cols * 4),
                                                        st >= kPairs);
                for (int r = 0; r < R; ++r) {
                    const auto xv = Isa::template bcast<kBits>(
                        reinterpret_cast<const int8_t*>(xr[r] + b * kI8ActBytes + st * 4));
                    for (int v = 0; v < V; ++v) part[r][v] = Isa::template dot<kBits>(part[r][v], w[v], xv);
                }
            }
            for (int r = 0; r < R; ++r)
                for (int v = 0; v < V; ++v) sum[r][v] = Isa::template close<kBits>(sum[r][v], part[r][v]);
        }
        for (int v = 0; v < V; ++v) {
            const unsigned char* sc = col[v] + b * kBlockBytes + panel_level_bytes(kBits);  // ws or D, then O
            const F d = Isa::fload(sc);
            for (int r = 0; r < R; ++r) {
                const unsigned char* word = xr[r] + b * kI8ActBytes + kI8Block;  // s, then ssum
                acc[r][v] = Isa::add_scaled(acc[r][v], sum[r][v], d, load_f32(word));
                if constexpr (kBits != 0)
                    acc[r][v] =
                        Isa::fma(Isa::fload(sc + kI8Cols * 4), Isa::fset1(load_f32(word + 4)), acc[r][v]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) Isa::ystore(y + r * t.ldy + v * L, acc[r][v], n[v]);
}

// f(std::integral_constant<int, R>()) for R = Isa::kRows, or for fewer rows the largest power of two <= rows.
template <int kMax, class F>
CLEF_I8_INLINE void with_rows(int rows, F&& f) {
    if (rows >= kMax) return f(std::integral_constant<int, kMax>());
    if constexpr (kMax > 4)
        if (rows >= 4) return f(std::integral_constant<int, 4>());
    if constexpr (kMax > 2)
        if (rows >= 2) return f(std::integral_constant<int, 2>());
    return f(std::integral_constant<int, 1>());
}

// A whole tile with one instruction set: rows in chunks of at most Isa::kRows, columns in passes of
// Isa::kVecs vectors (where a pass wider than a panel would reach past the tile's last panel, one panel's
// vectors).
template <class Isa, int kBits>
CLEF_I8_FN void tiles(const I8Rows& x, const I8Tile& t) {
    constexpr int kWide = Isa::kVecs * Isa::kLanes;
    static_assert(kWide % kI8Cols == 0 || kI8Cols % kWide == 0);
    for (int c0 = 0; c0 < t.ncols; c0 += kWide)
        for (int r0 = 0; r0 < x.rows;) {
            with_rows<Isa::kRows>(x.rows - r0, [&](auto r) {
                constexpr int R = decltype(r)::value;
                if constexpr (kWide > kI8Cols) {
                    if (t.ncols - c0 <= kI8Cols) {
                        tile<Isa, R, kI8Cols / Isa::kLanes, kBits>(x, t, r0, c0);
                        r0 += R;
                        return;
                    }
                }
                tile<Isa, R, Isa::kVecs, kBits>(x, t, r0, c0);
                r0 += R;
            });
        }
    note_extension(Isa::kExt);
}
#endif

void PanelBlock(const I8Rows& x, const I8Tile& t) {
    note_target(KernelFamily::Int8, HWY_TARGET);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    if ((HWY_TARGET <= HWY_AVX3 ? cpu_avx512_vnni() : cpu_avx_vnni())) return tiles<Vnni, 0>(x, t);
    return tiles<Avx2, 0>(x, t);
#else
#if HWY_ARCH_ARM_A64
    if (dotprod_enabled()) return panel_block_dotprod(x, t, 0);
#endif
    note_extension(Ext::None);
    panel_block_ref(x, t);
#endif
}

// bits: 4 or 5 (panel_block_u checks).
void PanelBlockU(const I8Rows& x, const I8Tile& t, int bits) {
    note_target(KernelFamily::Int8, HWY_TARGET);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    if ((HWY_TARGET <= HWY_AVX3 ? cpu_avx512_vnni() : cpu_avx_vnni()))
        return bits == 4 ? tiles<Vnni, 4>(x, t) : tiles<Vnni, 5>(x, t);
    return bits == 4 ? tiles<Avx2, 4>(x, t) : tiles<Avx2, 5>(x, t);
#else
#if HWY_ARCH_ARM_A64
    if (dotprod_enabled()) return panel_block_dotprod(x, t, bits);
#endif
    note_extension(Ext::None);
    panel_block_u_ref(x, t, bits);
#endif
}

// The extension this target's panel kernels take on this CPU (kernel_extension).
int KernelExt() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    if (HWY_TARGET <= HWY_AVX3 ? cpu_avx512_vnni() : cpu_avx_vnni()) return static_cast<int>(Vnni::kExt);
#elif HWY_ARCH_ARM_A64
    if (dotprod_enabled()) return static_cast<int>(Ext::Dotprod);
#endif
    return static_cast<int>(Ext::None);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#undef CLEF_I8_TARGET
#undef CLEF_I8_FN
#undef CLEF_I8_INLINE
#endif

}  // namespace HWY_NAMESPACE
}  // namespace clef::ops::i8
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <atomic>

#include "ops/cpu.h"
#if HWY_ARCH_ARM_A64
#include <arm_neon.h>
#endif

namespace clef::ops::i8 {

namespace {

// The extension of the last panel_block / panel_block_u call (last_kernel_extension).
std::atomic<Ext> g_last_ext{Ext::None};

const char* ext_name(Ext e) {
    switch (e) {
        case Ext::Dotprod:
            return "dotprod";
        case Ext::AvxVnni:
            return "avx-vnni";
        case Ext::Avx512Vnni:
            return "avx512-vnni";
        case Ext::None:
            break;
    }
    return "";
}

}  // namespace

void note_extension(Ext used) {
    if (g_last_ext.load(std::memory_order_relaxed) != used) g_last_ext.store(used, std::memory_order_relaxed);
}

bool cpu_avx512_vnni() {
    return cpu_features().avx512_vnni;
}

bool cpu_avx_vnni() {
    return cpu_features().avx_vnni;
}

#if HWY_ARCH_ARM_A64
namespace {

#define CLEF_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

// One step S of four (the activation levels xv[r] hold four steps): sdot of the half panel's two 16-byte
// quarters (columns 0-3 into lo, 4-7 into hi) with lane S of each row; signed panels' bytes xor 0x80 first,
// nibble panels' low (high: the high) nibbles.
template <int R, int S, int kBits>
CLEF_DOTPROD inline void dot_step(const unsigned char* w, bool high, const int8x16_t (&xv)[R],
                                  int32x4_t (&lo)[R], int32x4_t (&hi)[R]) {
    uint8x16_t u0 = vld1q_u8(w), u1 = vld1q_u8(w + 16);
    if constexpr (kBits == 0) {
        u0 = veorq_u8(u0, vdupq_n_u8(0x80));
        u1 = veorq_u8(u1, vdupq_n_u8(0x80));
    } else if constexpr (kBits == 4) {
        const uint8x16_t low = vdupq_n_u8(0x0f);
        u0 = high ? vshrq_n_u8(u0, 4) : vandq_u8(u0, low);
        u1 = high ? vshrq_n_u8(u1, 4) : vandq_u8(u1, low);
    }
    const int8x16_t w0 = vreinterpretq_s8_u8(u0), w1 = vreinterpretq_s8_u8(u1);
    for (int r = 0; r < R; ++r) {
        lo[r] = vdotq_laneq_s32(lo[r], w0, xv[r], S);
        hi[r] = vdotq_laneq_s32(hi[r], w1, xv[r], S);
    }
}

// The fp32 at p as a vector (any alignment).
CLEF_DOTPROD inline float32x4_t load_f32(const unsigned char* p) {
    return vreinterpretq_f32_u8(vld1q_u8(p));
}

// R activation rows (row0 on) against the 8 columns col0.. of the tile (half a panel) of a panel kind (kBits:
// ops/int8_kernels.h). One-dimensional arrays per half of the columns: gcc keeps them in registers, [R][2]
// ones in memory.
template <int R, int kBits>
CLEF_DOTPROD void rows_dotprod(const I8Rows& x, const I8Tile& t, int row0, int col0) {
    constexpr int64_t kBlockBytes = panel_block_bytes(kBits);
    const unsigned char* col = t.panel + (col0 / kI8Cols) * t.panel_stride + (col0 % kI8Cols) * 4;
    const int ncols = std::clamp(t.ncols - col0, 0, 8);
    float* y = t.y + row0 * t.ldy + col0;
    float32x4_t acc_lo[R], acc_hi[R];
    for (int r = 0; r < R; ++r) {
        float tmp[8] = {};
        if (t.accumulate) std::memcpy(tmp, y + r * t.ldy, static_cast<size_t>(ncols) * sizeof(float));
        acc_lo[r] = vld1q_f32(tmp);
        acc_hi[r] = vld1q_f32(tmp + 4);
    }
    for (int64_t b = 0; b < t.nb; ++b) {
        const unsigned char* pb = col + b * kBlockBytes;
        int32x4_t lo[R], hi[R];
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = vdupq_n_s32(0);
        for (int h = 0; h < kI8Block / 16; ++h) {  // 16 levels: four steps
            int8x16_t xv[R];
            for (int r = 0; r < R; ++r)
                xv[r] = vld1q_s8(
                    reinterpret_cast<const int8_t*>(x.p + (row0 + r) * x.ld + b * kI8ActBytes + h * 16));
            // Steps 4h to 4h + 3: their own 64 bytes each, or (nibble panels) the four groups' low or high
            // nibbles.
            const unsigned char* w = kBits == 4 ? pb : pb + h * 4 * (kI8Cols * 4);
            const bool high = kBits == 4 && h == 1;
            dot_step<R, 0, kBits>(w, high, xv, lo, hi);
            dot_step<R, 1, kBits>(w + kI8Cols * 4, high, xv, lo, hi);
            dot_step<R, 2, kBits>(w + 2 * kI8Cols * 4, high, xv, lo, hi);
            dot_step<R, 3, kBits>(w + 3 * kI8Cols * 4, high, xv, lo, hi);
        }
        // The column scales (ws or D), then for level panels the offsets O.
        const unsigned char* sc = pb + panel_level_bytes(kBits);
        const float32x4_t d_lo = load_f32(sc), d_hi = load_f32(sc + 16);
        for (int r = 0; r < R; ++r) {
            const unsigned char* word = x.p + (row0 + r) * x.ld + b * kI8ActBytes + kI8Block;  // s, then ssum
            float sx;
            std::memcpy(&sx, word, 4);
            acc_lo[r] = vfmaq_f32(acc_lo[r], vcvtq_f32_s32(lo[r]), vmulq_n_f32(d_lo, sx));
            acc_hi[r] = vfmaq_f32(acc_hi[r], vcvtq_f32_s32(hi[r]), vmulq_n_f32(d_hi, sx));
            if constexpr (kBits != 0) {
                const float32x4_t o_lo = load_f32(sc + kI8Cols * 4), o_hi = load_f32(sc + kI8Cols * 4 + 16);
                float ssum;
                std::memcpy(&ssum, word + 4, 4);
                const float32x4_t ss = vdupq_n_f32(ssum);
                acc_lo[r] = vfmaq_f32(acc_lo[r], o_lo, ss);
                acc_hi[r] = vfmaq_f32(acc_hi[r], o_hi, ss);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        float tmp[8];
        vst1q_f32(tmp, acc_lo[r]);
        vst1q_f32(tmp + 4, acc_hi[r]);
        std::memcpy(y + r * t.ldy, tmp, static_cast<size_t>(ncols) * sizeof(float));
    }
}

#undef CLEF_DOTPROD

template <int kBits>
void dotprod(const I8Rows& x, const I8Tile& t) {
    note_extension(Ext::Dotprod);
    for (int c0 = 0; c0 < t.ncols; c0 += 8)
        for (int r0 = 0; r0 < x.rows;) {
            const int rows = x.rows - r0;
            if (rows >= 4) {
                rows_dotprod<4, kBits>(x, t, r0, c0);
                r0 += 4;
            } else if (rows >= 2) {
                rows_dotprod<2, kBits>(x, t, r0, c0);
                r0 += 2;
            } else {
                rows_dotprod<1, kBits>(x, t, r0, c0);
                r0 += 1;
            }
        }
}

}  // namespace

bool dotprod_enabled() {
    return cpu_features().asimd_dotprod;
}

void panel_block_dotprod(const I8Rows& x, const I8Tile& t, int bits) {
    if (bits == 0) return dotprod<0>(x, t);
    if (bits == 4) return dotprod<4>(x, t);
    dotprod<5>(x, t);
}
#endif

HWY_EXPORT(QuantizeRow);
HWY_EXPORT(QuantizeActs);
HWY_EXPORT(PanelBlock);
HWY_EXPORT(PanelBlockU);
HWY_EXPORT(KernelExt);

const char* kernel_extension() {
    return ext_name(static_cast<Ext>(HWY_DYNAMIC_DISPATCH(KernelExt)()));
}

const char* last_kernel_extension() {
    return ext_name(g_last_ext.load(std::memory_order_relaxed));
}

void quantize_row(const float* x, int64_t k, int8_t* q, float* s) {
    HWY_DYNAMIC_DISPATCH(QuantizeRow)(x, k, q, s);
}

void quantize_acts(const float* x, int64_t k, unsigned char* out, bool levels) {
    HWY_DYNAMIC_DISPATCH(QuantizeActs)(x, k, out, levels);
}

void panel_block(const I8Rows& x, const I8Tile& t) {
    HWY_DYNAMIC_DISPATCH(PanelBlock)(x, t);
}

void panel_block_u(const I8Rows& x, const I8Tile& t, int bits) {
    if (bits != 4 && bits != 5) throw Error("int8: level panels hold 4- or 5-bit levels");
    HWY_DYNAMIC_DISPATCH(PanelBlockU)(x, t, bits);
}

namespace {

// Block b's n (<= kI8Block) values of xb (the rest of the block 0): levels into q, scale into *s; returns the
// sum of the levels.
int32_t quantize_block_ref(const float* xb, int64_t n, int8_t* q, float* s) {
    float amax = 0;
    for (int64_t t = 0; t < n; ++t) amax = std::max(amax, std::fabs(xb[t]));
    const float sc = amax / 127.0f;
    const float inv = sc > 0 ? 1.0f / sc : 0.0f;
    int32_t total = 0;
    for (int64_t t = 0; t < kI8Block; ++t) {
        const float v = t < n ? std::nearbyint(xb[t] * inv) : 0.0f;
        q[t] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
        total += q[t];
    }
    *s = sc;
    return total;
}

}  // namespace

void quantize_row_ref(const float* x, int64_t k, int8_t* q, float* s) {
    for (int64_t b = 0; b * kI8Block < k; ++b)
        quantize_block_ref(x + b * kI8Block, std::min<int64_t>(kI8Block, k - b * kI8Block), q + b * kI8Block,
                           s + b);
}

void quantize_acts_ref(const float* x, int64_t k, unsigned char* out, bool levels) {
    for (int64_t b = 0; b * kI8Block < k; ++b) {
        unsigned char* ob = out + b * kI8ActBytes;
        float sc;
        const int32_t sum =
            quantize_block_ref(x + b * kI8Block, std::min<int64_t>(kI8Block, k - b * kI8Block),
                               reinterpret_cast<int8_t*>(ob), &sc);
        put_act_word(ob, sc, sum, levels);
    }
}

namespace {

// Weight k of column c in a block's panel bytes pb (a panel kind: ops/int8_kernels.h): a level, or for signed
// panels w + kI8Bias.
int panel_level(const unsigned char* pb, int k, int c, int bits) {
    if (bits != 4) return pb[(k / 4) * kI8Cols * 4 + c * 4 + k % 4];
    const int byte = pb[(k % 16 / 4) * kI8Cols * 4 + c * 4 + k % 4];  // levels k and k + 16 share a byte
    return k < 16 ? byte & 0xf : byte >> 4;
}

// The twins' one body: y[r][c] over the tile's blocks of a panel kind (bits).
template <int kBits>
void panel_ref(const I8Rows& x, const I8Tile& t) {
    constexpr int64_t kBlockBytes = panel_block_bytes(kBits);
    constexpr int bias = kBits ? 0 : kI8Bias;
    for (int r = 0; r < x.rows; ++r)
        for (int c = 0; c < t.ncols; ++c) {
            const unsigned char* panel = t.panel + (c / kI8Cols) * t.panel_stride;
            const int cc = c % kI8Cols;
            float acc = t.accumulate ? t.y[r * t.ldy + c] : 0.0f;
            for (int64_t b = 0; b < t.nb; ++b) {
                const unsigned char* pb = panel + b * kBlockBytes;
                const unsigned char* xb = x.p + r * x.ld + b * kI8ActBytes;
                const int8_t* q = reinterpret_cast<const int8_t*>(xb);
                int32_t sum = 0;
                for (int k = 0; k < kI8Block; ++k)
                    sum += int32_t{q[k]} * (panel_level(pb, k, cc, kBits) - bias);
                float d;
                std::memcpy(&d, pb + panel_level_bytes(kBits) + cc * 4, 4);
                float xs;
                std::memcpy(&xs, xb + kI8Block, 4);
                acc = std::fma(static_cast<float>(sum), d * xs, acc);
                if constexpr (kBits != 0) {
                    float o;
                    std::memcpy(&o, pb + panel_level_bytes(kBits) + kI8Cols * 4 + cc * 4, 4);
                    float ssum;
                    std::memcpy(&ssum, xb + kI8Block + 4, 4);
                    acc = std::fma(o, ssum, acc);
                }
            }
            t.y[r * t.ldy + c] = acc;
        }
}

}  // namespace

void panel_block_ref(const I8Rows& x, const I8Tile& t) {
    panel_ref<0>(x, t);
}

void panel_block_u_ref(const I8Rows& x, const I8Tile& t, int bits) {
    if (bits != 4 && bits != 5) throw Error("int8: level panels hold 4- or 5-bit levels");
    if (bits == 4) return panel_ref<4>(x, t);
    panel_ref<5>(x, t);
}

}  // namespace clef::ops::i8
#endif  // HWY_ONCE
