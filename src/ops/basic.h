// Plain fp32 reference kernels shared by the backbone and the head. Each is the oracle for a later fast path.
// Layouts are row-major; a "linear" weight is stored [out][in] as in PyTorch.
#pragma once

#include <cstdint>

namespace clef::ops {

// y[m][n] = sum_k x[m][k] * w[n][k] (+ bias[n]); accumulates in fp32. bias may be null.
void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, const float* bias, float* y);
// Same with bf16 weights (raw uint16 bits), converted on the fly.
void linear_bf16(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, const float* bias, float* y);

// torch.nn.LayerNorm over rows of width d (biased variance); w/b may be null.
void layer_norm(const float* x, int64_t rows, int64_t d, const float* w, const float* b, float eps, float* y);
// Zero-centred RMSNorm of Qwen3.5: y = x * rsqrt(mean(x^2) + eps) * (1 + w).
void rms_norm_zc(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y);
// Plain-weight RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w (w may be null = ones).
void rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y);

float silu(float x);
float sigmoid(float x);
float softplus(float x);  // torch semantics: x for x > 20
float gelu_erf(float x);
float gelu_tanh(float x);
void silu_inplace(float* x, int64_t n);
void gelu_erf_inplace(float* x, int64_t n);
void gelu_tanh_inplace(float* x, int64_t n);

// Numerically stable softmax of one row, in place.
void softmax_inplace(float* x, int64_t n);

// Multi-head scaled dot-product attention, fp32, reference double loop.
//   q: [lq][hq*dh], k,v: [lk][hkv*dh], out: [lq][hq*dh]; query head h uses kv head h / (hq / hkv).
//   Row strides are given explicitly so callers can point into packed projections.
//   causal: query i sees keys j <= i (requires lq == lk).
void attention(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
               int64_t v_stride, int64_t lq, int64_t lk, int hq, int hkv, int dh, float scale, bool causal,
               float* out, int64_t out_stride);

}  // namespace clef::ops
