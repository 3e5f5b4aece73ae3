// The per-target vector loops behind ops/basic.h's *_fast functions (elementwise_kernels.cpp, dispatched by
// Highway under CLEF_MAX_ISA). Internal to src/ops: the parallel row loops and the public entry points live
// in ops/basic.cpp.
#pragma once

#include <cstdint>

namespace clef::ops::simd {

// How norm_row finishes a row already scaled by 1 / rms: by w (null = ones), by (1 + w), or by w and then a
// gate of z (silu or sigmoid).
enum class NormMode { Plain, ZeroCentred, GateSilu, GateSigmoid };

void sigmoid_mul_span(const float* x, const float* gate, int64_t n, float* out);
void silu_mul_span(const float* gate, const float* up, int64_t n, float* out);
// One row of causal_conv1d_silu_fast: y[c] = silu(sum over taps j of wt[j][c] * x[j][c]) (wt: [K][C]; a
// null x[j] is zero padding), the taps summed in order as the reference sums them, silu as x / (1 +
// exp_poly(-x)).
void conv_silu_row(const float* const* x, const float* wt, int K, int64_t C, float* y);
void gelu_tanh_span(float* x, int64_t n);  // in place, exp_poly form of ops::gelu_tanh
double sum_sq(const float* x, int64_t d);  // sum of x², accumulated in double
void norm_row(const float* x, const float* z, int64_t d, const float* w, float inv, NormMode mode, float* y);
void scale_row(const float* x, int64_t d, float s, float* y);
// Softmax of one row in place (n > 0): denominator in double, or with f32_sum in fp32 vector partial sums.
void softmax_row(float* x, int64_t n, bool f32_sum);

}  // namespace clef::ops::simd
