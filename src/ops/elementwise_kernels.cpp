// The elementwise and row kernels behind ops/basic.h's *_fast functions, compiled once per Highway target
// (foreach_target.h re-includes this file) and dispatched at run time, so CLEF_MAX_ISA (ops/cpu.h) reaches
// them. The loops are written once in plain C++ with `omp simd` and vectorised by the compiler for each
// target's instruction set; every product is rounded as in the scalar references of ops/basic.cpp (no
// contraction in ISO C++ mode), only the order of the sums is the vector's.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/elementwise_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>

#include "ops/basic.h"
#include "ops/elementwise_kernels.h"
#include "ops/simd.h"

HWY_BEFORE_NAMESPACE();
namespace clef::ops::simd {
namespace HWY_NAMESPACE {

HWY_INLINE void note() {
    note_target(KernelFamily::Elementwise, HWY_TARGET);
}

void SigmoidMul(const float* x, const float* gate, int64_t n, float* out) {
    note();
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] / (1.f + exp_poly(-gate[i]));
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
    note();
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.f + exp_poly(-gate[i])) * up[i];
}

void ConvSiluRow(const float* const* x, const float* wt, int K, int64_t C, float* y) {
    note();
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = 0.f;
    for (int j = 0; j < K; ++j) {
        if (!x[j]) continue;
        const float* xr = x[j];
        const float* wr = wt + j * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) y[c] += wr[c] * xr[c];
    }
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = y[c] / (1.f + exp_poly(-y[c]));
}

// gelu_tanh(x) = 0.5·x·(1 + tanh(u)) = x·sigmoid(2u) = x / (1 + exp(-2u)), u = sqrt(2/π)·(x + 0.044715·x³);
// the exponent is capped where the result is 0 anyway.
void GeluTanh(float* x, int64_t n) {
    note();
    constexpr float kMinus2C = -1.5957691216057307f;  // -2·sqrt(2/π)
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        x[i] = v / (1.f + exp_poly(std::min(kMinus2C * (v + 0.044715f * v * v * v), 80.f)));
    }
}

double SumSq(const float* x, int64_t d) {
    note();
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
    return ss;
}

void NormRow(const float* x, const float* z, int64_t d, const float* w, float inv, NormMode mode, float* y) {
    note();
    if (mode == NormMode::ZeroCentred) {
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inv * (1.f + w[i]);
    } else if (!w) {
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inv;
    } else {
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inv * w[i];
    }
    if (mode == NormMode::GateSilu) {
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) y[i] *= z[i] / (1.f + exp_poly(-z[i]));
    } else if (mode == NormMode::GateSigmoid) {
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) y[i] *= 1.f / (1.f + exp_poly(-z[i]));
    }
}

void ScaleRow(const float* x, int64_t d, float s, float* y) {
    note();
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) y[i] = x[i] * s;
}

// The denominator in double (as the reference) or, with f32_sum, in fp32 vector partial sums.
void Softmax(float* x, int64_t n, bool f32_sum) {
    note();
    float mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
    float inv;
    if (f32_sum) {
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; ++i) {
            x[i] = exp_poly(x[i] - mx);
            sum += x[i];
        }
        inv = 1.f / sum;
    } else {
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; ++i) {
            x[i] = exp_poly(x[i] - mx);
            sum += x[i];
        }
        inv = static_cast<float>(1.0 / sum);
    }
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace HWY_NAMESPACE
}  // namespace clef::ops::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace clef::ops::simd {

HWY_EXPORT(SigmoidMul);
HWY_EXPORT(SiluMul);
HWY_EXPORT(ConvSiluRow);
HWY_EXPORT(GeluTanh);
HWY_EXPORT(SumSq);
HWY_EXPORT(NormRow);
HWY_EXPORT(ScaleRow);
HWY_EXPORT(Softmax);

void sigmoid_mul_span(const float* x, const float* gate, int64_t n, float* out) {
    HWY_DYNAMIC_DISPATCH(SigmoidMul)(x, gate, n, out);
}
void silu_mul_span(const float* gate, const float* up, int64_t n, float* out) {
    HWY_DYNAMIC_DISPATCH(SiluMul)(gate, up, n, out);
}
void conv_silu_row(const float* const* x, const float* wt, int K, int64_t C, float* y) {
    HWY_DYNAMIC_DISPATCH(ConvSiluRow)(x, wt, K, C, y);
}
void gelu_tanh_span(float* x, int64_t n) {
    HWY_DYNAMIC_DISPATCH(GeluTanh)(x, n);
}
double sum_sq(const float* x, int64_t d) {
    return HWY_DYNAMIC_DISPATCH(SumSq)(x, d);
}
void norm_row(const float* x, const float* z, int64_t d, const float* w, float inv, NormMode mode, float* y) {
    HWY_DYNAMIC_DISPATCH(NormRow)(x, z, d, w, inv, mode, y);
}
void scale_row(const float* x, int64_t d, float s, float* y) {
    HWY_DYNAMIC_DISPATCH(ScaleRow)(x, d, s, y);
}
void softmax_row(float* x, int64_t n, bool f32_sum) {
    HWY_DYNAMIC_DISPATCH(Softmax)(x, n, f32_sum);
}

}  // namespace clef::ops::simd
#endif  // HWY_ONCE
