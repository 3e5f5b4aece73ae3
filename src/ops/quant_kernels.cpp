// The K-quant scale searches (ops/quant_kernels.h). Each candidate scale of a sub-block's search is scored by
// a few sums over the sub-block, which two implementations provide: the scalar reference (ScalarSearch) and
// Highway kernels (VecSearch), compiled per target (foreach_target.h re-includes this file) and dispatched at
// run time. They compute the same numbers:
// * fp32 sums over a sub-block (16 or 32 values) accumulate in 16 lanes, value i in lane i % 16, added in
//   order of i (a target of N < 16 lanes holds them in 16 / N vectors), then the 16 lanes add in one fixed
//   order (lane_sum);
// * sums of levels and of squared levels are of small integers, exact in fp32 in any order;
// * a level is clamped as vmax / vmin do (a NaN becomes the lower bound) and rounded to nearest even;
// * every product, quotient and sum is rounded on its own (this file, like quant/quant.cpp, is built with
//   -ffp-contract=off).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/quant_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "ops/cpu.h"
#include "ops/named_vectors.h"
#include "ops/quant_kernels.h"
#include "ops/simd.h"

// The search and the scalar sums, defined once (on the first pass through this file, for the default target).
#ifndef CLEF_OPS_QUANT_KERNELS_SEARCH
#define CLEF_OPS_QUANT_KERNELS_SEARCH
namespace clef::ops {
namespace {

struct LevelStats {
    int sl = 0, sll = 0;  // sum of levels, of squared levels
    float slx = 0;        // sum of level * x (lane order)
};

// The fixed-order sum of 16 lanes.
inline float lane_sum(const float* v) {
    float b[8], c[4];
    for (int i = 0; i < 8; ++i) b[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; ++i) c[i] = b[i] + b[i + 4];
    return (c[0] + c[2]) + (c[1] + c[3]);
}

// max / min by comparison (the second operand when either is NaN), then round to nearest even.
inline float vmax(float a, float b) {
    return a > b ? a : b;
}
inline float vmin(float a, float b) {
    return a < b ? a : b;
}
inline float level(float v, float lo, float hi) {
    return std::nearbyint(vmin(vmax(v, lo), hi));
}

struct ScalarSearch {
    // Affine levels l = clamp(round(k * (x - c)), 0, nmax) of n values (n a multiple of 16).
    static LevelStats affine_stats(const float* x, int n, float k, float c, float nmax) {
        LevelStats st;
        float lanes[16] = {};
        for (int i = 0; i < n; ++i) {
            const float l = level(k * (x[i] - c), 0.f, nmax);
            const int li = static_cast<int>(l);
            st.sl += li;
            st.sll += li * li;
            lanes[i & 15] += l * x[i];
        }
        st.slx = lane_sum(lanes);
        return st;
    }
    // Squared error of s * l + c - x with those levels.
    static float affine_err(const float* x, int n, float k, float c, float nmax, float s) {
        float lanes[16] = {};
        for (int i = 0; i < n; ++i) {
            const float diff = s * level(k * (x[i] - c), 0.f, nmax) + c - x[i];
            lanes[i & 15] += diff * diff;
        }
        return lane_sum(lanes);
    }
    // Symmetric levels l = clamp(round(x / s), -32, 31) of 16 values: sll and slx.
    static LevelStats sym_stats(const float* x, float s) {
        LevelStats st;
        float lanes[16] = {};
        for (int i = 0; i < 16; ++i) {
            const float l = level(x[i] / s, -32.f, 31.f);
            st.sll += static_cast<int>(l) * static_cast<int>(l);
            lanes[i] += l * x[i];
        }
        st.slx = lane_sum(lanes);
        return st;
    }
    static float sym_err(const float* x, float s) {
        float lanes[16] = {};
        for (int i = 0; i < 16; ++i) {
            const float diff = s * level(x[i] / s, -32.f, 31.f) - x[i];
            lanes[i] += diff * diff;
        }
        return lane_sum(lanes);
    }
};

// Best (scale, min) with x ≈ scale * L - min, L in [0, nmax], for one 32-value sub-block: a grid search over
// the scale around (max - min) / nmax, each candidate refined by a least-squares fit of scale and min to its
// levels (the approach of ggml's make_qkx2_quants, written from the format's definition). min >= 0.
// always_inline (and each target's caller is flatten): the kernels K, compiled for a target, can be inlined
// only once this body is part of a function of that target.
template <class K>
[[gnu::always_inline]] inline void fit_scale_min_with(const float* x, int nmax, float& scale,
                                                      float& min_out) {
    constexpr int n = 32;
    float lo = x[0], hi = x[0], sx_lanes[16] = {};
    for (int i = 0; i < n; ++i) {
        lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
        sx_lanes[i & 15] += x[i];
    }
    lo = std::min(lo, 0.f);
    if (!(hi > lo)) {
        scale = 0;
        min_out = -lo;
        return;
    }
    const float fmax = static_cast<float>(nmax), sx = lane_sum(sx_lanes);
    float best_s = (hi - lo) / fmax, best_m = lo;
    float best_e = K::affine_err(x, n, 1.f / best_s, best_m, fmax, best_s);
    for (int step = -8; step <= 12; ++step) {
        const float iscale = (fmax + 0.1f * static_cast<float>(step)) / (hi - lo);
        // Levels for this candidate, then least squares for (s, m) with x ≈ s*l + m.
        const LevelStats st = K::affine_stats(x, n, iscale, lo, fmax);
        const double sl = st.sl, sll = st.sll;
        const double det = n * sll - sl * sl;
        if (det <= 0) continue;
        float s = static_cast<float>((n * static_cast<double>(st.slx) - sl * sx) / det);
        float m = static_cast<float>((sll * sx - sl * static_cast<double>(st.slx)) / det);
        if (m > 0) {  // the format's min is subtracted and non-negative: clamp and refit the scale
            m = 0;
            s = sll > 0 ? static_cast<float>(st.slx / sll) : 0.f;
        }
        if (!(s > 0)) continue;
        const float e = K::affine_err(x, n, 1.f / s, m, fmax, s);
        if (e < best_e) best_e = e, best_s = s, best_m = m;
    }
    scale = best_s;
    min_out = -best_m;
}

// Symmetric 16-value sub-block scale for Q6_K (levels -32..31): over a small grid around amax / 32, the
// least-squares refit of each candidate's levels, keeping the one with the smallest squared error.
template <class K>
[[gnu::always_inline]] inline float fit_scale_sym_with(const float* x) {
    float amax = 0, vmax_ = 0;
    for (int i = 0; i < 16; ++i)
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), vmax_ = x[i];
    if (!(amax > 0) || !std::isfinite(amax)) return 0;
    float best_s = vmax_ / -32.f, best_e = INFINITY;
    for (int step = -9; step <= 9; ++step) {
        const LevelStats st = K::sym_stats(x, vmax_ / (-32.f + 0.1f * static_cast<float>(step)));
        if (st.sll <= 0) continue;
        const float s2 = static_cast<float>(static_cast<double>(st.slx) / st.sll);
        if (s2 == 0 || !std::isfinite(s2)) continue;
        const float e = K::sym_err(x, s2);
        if (e < best_e) best_e = e, best_s = s2;
    }
    return best_s;
}

}  // namespace
}  // namespace clef::ops
#endif  // CLEF_OPS_QUANT_KERNELS_SEARCH

HWY_BEFORE_NAMESPACE();
namespace clef::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_SCALAR
// One lane per vector: this target runs the scalar reference.
void FitScaleMin(const float* x, int nmax, float& scale, float& min_out) {
    note_target(KernelFamily::Quant, HWY_TARGET);
    fit_scale_min_ref(x, nmax, scale, min_out);
}

float FitScaleSym(const float* x) {
    note_target(KernelFamily::Quant, HWY_TARGET);
    return fit_scale_sym_ref(x);
}
#else
// At most 16 lanes: the reference's 16 lanes are a whole number of vectors on every target.
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;

// level() on every lane.
HWY_INLINE VF level(DF df, VF v, VF lo, VF hi) {
#if HWY_ARCH_X86
    // x86's max / min instructions are vmax / vmin exactly (the second operand unless the comparison holds).
    const VF b = hn::Min(hn::Max(v, lo), hi);
#else
    const VF a = hn::IfThenElse(hn::Gt(v, lo), v, lo);
    const VF b = hn::IfThenElse(hn::Lt(a, hi), a, hi);
#endif
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SSSE3
    // SSE4.1's round instruction, to nearest even.
    (void)df;
    return hn::Round(b);
#else
    // Elsewhere by hand, as Highway's fallbacks may differ from nearbyint in the last place or the sign of a
    // zero: |b| <= 32 after the clamp, where adding and subtracting 2^23 rounds to the nearest integer, ties
    // to even; CopySign keeps the sign (nearbyint(-0.3) is -0).
    const VF big = hn::Set(df, 8388608.f);
    return hn::CopySign(hn::Sub(hn::Add(hn::Abs(b), big), big), b);
#endif
}

// lane_sum of the 16 lanes held in a0 .. a<16 / N - 1> (the rest unused): lane i plus lane i + 8, then lane
// i plus lane i + 4 in registers, then (c0 + c2) + (c1 + c3). A template, so that only the branch of the
// target's N is compiled. On SVE, whose N is known at run time only, the 16 lanes go through memory to
// lane_sum itself.
template <class D>
HWY_INLINE float sum16(D d, hn::Vec<D> a0, hn::Vec<D> a1, hn::Vec<D> a2, hn::Vec<D> a3) {
#if HWY_HAVE_SCALABLE
    const size_t N = hn::Lanes(d);
    float v[16];
#define CLEF_STORE(j) hn::StoreU(a##j, d, v + j * N);
    CLEF_VECS16(N, CLEF_STORE)
#undef CLEF_STORE
    return lane_sum(v);
#else
    constexpr size_t N = hn::MaxLanes(D());
    static_assert(N == 4 || N == 8 || N == 16);
    const hn::CappedTag<float, 4> d4;
    hn::Vec<decltype(d4)> c;
    if constexpr (N == 16) {
        const hn::Half<D> d8;
        const auto b = hn::Add(hn::LowerHalf(d8, a0), hn::UpperHalf(d8, a0));
        c = hn::Add(hn::LowerHalf(d4, b), hn::UpperHalf(d4, b));
        (void)a1, (void)a2, (void)a3;
    } else if constexpr (N == 8) {
        const auto b = hn::Add(a0, a1);
        c = hn::Add(hn::LowerHalf(d4, b), hn::UpperHalf(d4, b));
        (void)a2, (void)a3;
    } else {
        c = hn::Add(hn::Add(a0, a2), hn::Add(a1, a3));
    }
    HWY_ALIGN float t[4];
    hn::Store(c, d4, t);
    (void)d;
    return (t[0] + t[2]) + (t[1] + t[3]);
#endif
}

// A sum of integer-valued lanes (every partial sum below 2^24, so exact in any order).
HWY_INLINE int int_sum(DF df, VF v) {
    return static_cast<int>(hn::GetLane(hn::SumOfLanes(df, v)));
}

// ScalarSearch's sums, 16 values per step. Not HWY_INLINE (always_inline): the search template that calls
// them is compiled for the default target, which could not inline them (see FitScaleMin).
// The 16 lanes of a sum are 16 / N vectors, named (ops/named_vectors.h): value j * N + i of every 16 in lane
// i of slx<j> or e<j>.
struct VecSearch {
    static LevelStats affine_stats(const float* x, int n, float k, float c, float nmax) {
        const DF df;
        const int N = static_cast<int>(hn::Lanes(df));
        const VF kv = hn::Set(df, k), cv = hn::Set(df, c), lo = hn::Zero(df), hi = hn::Set(df, nmax);
        VF sl = hn::Zero(df), sll = sl, slx0 = sl, slx1 = sl, slx2 = sl, slx3 = sl;
        for (int i = 0; i < n; i += 16) {
#define CLEF_STEP(j)                                                  \
    {                                                                 \
        const VF xv = hn::LoadU(df, x + i + j * N);                   \
        const VF l = level(df, hn::Mul(kv, hn::Sub(xv, cv)), lo, hi); \
        sl = hn::Add(sl, l);                                          \
        sll = hn::Add(sll, hn::Mul(l, l));                            \
        slx##j = hn::Add(slx##j, hn::Mul(l, xv));                     \
    }
            CLEF_VECS16(N, CLEF_STEP)
#undef CLEF_STEP
        }
        LevelStats st;
        st.sl = int_sum(df, sl);
        st.sll = int_sum(df, sll);
        st.slx = sum16(df, slx0, slx1, slx2, slx3);
        return st;
    }
    static float affine_err(const float* x, int n, float k, float c, float nmax, float s) {
        const DF df;
        const int N = static_cast<int>(hn::Lanes(df));
        const VF kv = hn::Set(df, k), cv = hn::Set(df, c), sv = hn::Set(df, s), lo = hn::Zero(df),
                 hi = hn::Set(df, nmax);
        VF e0 = hn::Zero(df), e1 = e0, e2 = e0, e3 = e0;
        for (int i = 0; i < n; i += 16) {
#define CLEF_STEP(j)                                                  \
    {                                                                 \
        const VF xv = hn::LoadU(df, x + i + j * N);                   \
        const VF l = level(df, hn::Mul(kv, hn::Sub(xv, cv)), lo, hi); \
        const VF diff = hn::Sub(hn::Add(hn::Mul(sv, l), cv), xv);     \
        e##j = hn::Add(e##j, hn::Mul(diff, diff));                    \
    }
            CLEF_VECS16(N, CLEF_STEP)
#undef CLEF_STEP
        }
        return sum16(df, e0, e1, e2, e3);
    }
    static LevelStats sym_stats(const float* x, float s) {
        const DF df;
        const int N = static_cast<int>(hn::Lanes(df));
        const VF sv = hn::Set(df, s), lo = hn::Set(df, -32.f), hi = hn::Set(df, 31.f);
        VF sll = hn::Zero(df), slx0 = sll, slx1 = sll, slx2 = sll, slx3 = sll;
#define CLEF_STEP(j)                                     \
    {                                                    \
        const VF xv = hn::LoadU(df, x + j * N);          \
        const VF l = level(df, hn::Div(xv, sv), lo, hi); \
        sll = hn::Add(sll, hn::Mul(l, l));               \
        slx##j = hn::Add(slx##j, hn::Mul(l, xv));        \
    }
        CLEF_VECS16(N, CLEF_STEP)
#undef CLEF_STEP
        LevelStats st;
        st.sll = int_sum(df, sll);
        st.slx = sum16(df, slx0, slx1, slx2, slx3);
        return st;
    }
    static float sym_err(const float* x, float s) {
        const DF df;
        const int N = static_cast<int>(hn::Lanes(df));
        const VF sv = hn::Set(df, s), lo = hn::Set(df, -32.f), hi = hn::Set(df, 31.f);
        VF e0 = hn::Zero(df), e1 = e0, e2 = e0, e3 = e0;
#define CLEF_STEP(j)                                                                  \
    {                                                                                 \
        const VF xv = hn::LoadU(df, x + j * N);                                       \
        const VF diff = hn::Sub(hn::Mul(sv, level(df, hn::Div(xv, sv), lo, hi)), xv); \
        e##j = hn::Add(e##j, hn::Mul(diff, diff));                                    \
    }
        CLEF_VECS16(N, CLEF_STEP)
#undef CLEF_STEP
        return sum16(df, e0, e1, e2, e3);
    }
};

// flatten: the search template (default target) is inlined first, then the kernels into what it became.
[[gnu::flatten]] void FitScaleMin(const float* x, int nmax, float& scale, float& min_out) {
    note_target(KernelFamily::Quant, HWY_TARGET);
    fit_scale_min_with<VecSearch>(x, nmax, scale, min_out);
}

[[gnu::flatten]] float FitScaleSym(const float* x) {
    note_target(KernelFamily::Quant, HWY_TARGET);
    return fit_scale_sym_with<VecSearch>(x);
}
#endif  // HWY_TARGET == HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace clef::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace clef::ops {

HWY_EXPORT(FitScaleMin);
HWY_EXPORT(FitScaleSym);

// CLEF_MAX_ISA reaches Highway before the first dispatch (see simd_kernels.cpp): applied when the program
// starts.
[[maybe_unused]] const bool kIsaCapApplied = (cpu_features(), true);

void fit_scale_min(const float* x, int nmax, float& scale, float& min_out) {
    HWY_DYNAMIC_DISPATCH(FitScaleMin)(x, nmax, scale, min_out);
}

float fit_scale_sym(const float* x) {
    return HWY_DYNAMIC_DISPATCH(FitScaleSym)(x);
}

void fit_scale_min_ref(const float* x, int nmax, float& scale, float& min_out) {
    fit_scale_min_with<ScalarSearch>(x, nmax, scale, min_out);
}

float fit_scale_sym_ref(const float* x) {
    return fit_scale_sym_with<ScalarSearch>(x);
}

}  // namespace clef::ops
#endif  // HWY_ONCE
