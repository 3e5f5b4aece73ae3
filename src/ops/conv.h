// Causal depthwise conv1d over time followed by SiLU: the short convolution of a Gated DeltaNet layer.
#pragma once

#include <cstdint>

namespace clef::ops {

// y[t][c] = silu( sum_{j=0..K-1} w[c][j] * x[t-K+1+j][c] ), accumulated in fp32 in tap order.
//   x: [T][C] with row stride x_stride; w: [C][K] (PyTorch conv1d [C,1,K]); tap K-1 multiplies the current
//   token. Rows before t = 0 come from `state`, the K-1 inputs that preceded this call ([K-1][C], oldest
//   first), or are zero when state is null (left zero padding K-1, a fresh prefill). new_state (optional,
//   [K-1][C]) receives the last K-1 inputs of (state ++ x), so a later call can continue the sequence; it may
//   alias state. y ([T][C], row stride y_stride) must not alias x or state.
void causal_conv1d_silu(const float* x, int64_t T, int64_t C, int64_t x_stride, const float* w, int K,
                        const float* state, float* new_state, float* y, int64_t y_stride);
// The same with the taps vectorised over channels (the same sums, bit for bit) and silu through exp_poly
// (ops/basic.h, 2 ulp of exp): what the opt-in faster precisions run (device/cpu.cpp);
// tests/test_ops_fast.cpp holds it to the reference.
void causal_conv1d_silu_fast(const float* x, int64_t T, int64_t C, int64_t x_stride, const float* w, int K,
                             const float* state, float* new_state, float* y, int64_t y_stride);

}  // namespace clef::ops
