// Plain fp32 reference kernels shared by the backbone and the head. Each is the oracle for a later fast path.
// Layouts are row-major; a "linear" weight is stored [out][in] as in PyTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace clef::ops {

// y[m][n] = sum_k x[m][k] * w[n][k] (+ bias[n]); accumulates in fp32. bias may be null.
void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, const float* bias, float* y);
// Same with bf16 weights (raw uint16 bits), converted on the fly.
void linear_bf16(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, const float* bias,
                 float* y);

// torch.nn.LayerNorm over rows of width d (biased variance); w/b may be null.
void layer_norm(const float* x, int64_t rows, int64_t d, const float* w, const float* b, float eps, float* y);
// The same arithmetic per row (so the same bits), rows on the kernel threads.
void layer_norm_fast(const float* x, int64_t rows, int64_t d, const float* w, const float* b, float eps,
                     float* y);
// Zero-centred RMSNorm of Qwen3.5: y = x * rsqrt(mean(x^2) + eps) * (1 + w).
void rms_norm_zc(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y);
// Plain-weight RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w (w may be null = ones).
void rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y);

// x[i] += y[i] (the residual adds).
void add_inplace(float* x, const float* y, size_t n);

float silu(float x);
float sigmoid(float x);
float softplus(float x);  // torch semantics: x for x > 20
float gelu_erf(float x);
float gelu_tanh(float x);
void silu_inplace(float* x, int64_t n);
void gelu_erf_inplace(float* x, int64_t n);
void gelu_tanh_inplace(float* x, int64_t n);

// The one softmax: of one row in place, the maximum subtracted, exp in T, the denominator accumulated in
// double, each term multiplied by 1 / sum rounded to T. The reference the fast forms below are tested
// against; T = float (kernels, answers) or double (the eval statistics).
template <class T>
void softmax_inplace(T* x, int64_t n);
// The answers' probabilities: softmax_inplace of a copy of the logits.
std::vector<float> softmax_f32(const std::vector<float>& logits);
// The softmax's log-normaliser log(sum_i exp(x_i)), as softmax_inplace computes its denominator: the maximum
// m subtracted, exp in T, the sum in double; m + log(sum) (so log(softmax(x)_i) = x_i - log_sum_exp(x)).
// -inf for n = 0. T = float or double (the eval statistics' log loss).
template <class T>
double log_sum_exp(const T* x, int64_t n);

// Multi-head scaled dot-product attention, fp32, reference double loop.
//   q: [lq][hq*dh], k,v: [lk][hkv*dh], out: [lq][hq*dh]; query head h uses kv head h / (hq / hkv).
//   Row strides are given explicitly so callers can point into packed projections.
//   causal: query i sees keys j <= i (requires lq == lk).
void attention(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
               int64_t v_stride, int64_t lq, int64_t lk, int hq, int hkv, int dh, float scale, bool causal,
               float* out, int64_t out_stride);

// ---------------------------------------------------------------- fused kernels and fast paths
// Each *_fast function computes the same as its scalar reference (named in its comment) with vectorised code
// compiled once per Highway target and dispatched under CLEF_MAX_ISA (ops/elementwise_kernels.cpp); the
// tests compare the pairs on every target (tests/test_ops_fast.cpp).

// exp(x) in fp32 without libm: Cody-Waite range reduction and a degree-7 polynomial (Cephes coefficients),
// within 2 ulp of std::exp for x in [-87.3, 88.3]; 0 below, clamped to exp(88.38) above, NaN for NaN.
// Vectorises.
inline float exp_poly(float x) {
    const float xc = x < -87.3365f ? -87.3365f : (x > 88.3762f ? 88.3762f : x);
    // NaN stays NaN through y below; the exponent is computed from 0 then, so the int conversion is defined.
    const float xe = xc == xc ? xc : 0.f;
    const float n = (xe * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return x < -87.3365f ? 0.f : y * scale;
}

// y = x * sigmoid(gate) elementwise (the output gate of a gated attention layer); out may alias x or gate.
void sigmoid_mul(const float* x, const float* gate, int64_t n, float* out);
void sigmoid_mul_fast(const float* x, const float* gate, int64_t n, float* out);
// out = silu(gate) * up elementwise (the SwiGLU MLP); out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void silu_mul_fast(const float* gate, const float* up, int64_t n, float* out);
// gelu_tanh_inplace as x / (1 + exp_poly(-2u)) (the tanh written through the sigmoid), ~2 ulp of exp.
void gelu_tanh_inplace_fast(float* x, int64_t n);
// The gate of a GatedDeltaNet layer's norm: silu(z) (config "swish"/"silu", Qwen3.5's) or sigmoid(z).
enum class NormGate { Silu, Sigmoid };
// Gated RMSNorm of a GatedDeltaNet layer: y = rms_norm(x, w) * gate(z) for `rows` rows of d; z has x's
// layout.
void rms_norm_gated(const float* x, const float* z, int64_t rows, int64_t d, const float* w, float eps,
                    float* y, NormGate gate = NormGate::Silu);
void rms_norm_gated_fast(const float* x, const float* z, int64_t rows, int64_t d, const float* w, float eps,
                         float* y, NormGate gate = NormGate::Silu);
// Fast paths of rms_norm_zc, rms_norm, softmax_inplace and ops::l2_norm (ops/delta_rule.h); rows run in
// parallel. Sums of squares and the softmax denominator are accumulated in double as in the references.
void rms_norm_zc_fast(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y);
void rms_norm_fast(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y);
void softmax_inplace_fast(float* x, int64_t n);
// softmax_inplace with the denominator in fp32 vector partial sums (terms in (0, 1]; ~1e-6 relative for rows
// of a few thousand): vectorises fully where the double sum does not, for the vision tower's heads x rows²
// scores.
void softmax_inplace_fast_f32(float* x, int64_t n);
void l2_norm_fast(const float* x, int64_t rows, int64_t d, float eps, float scale, float* y);

}  // namespace clef::ops
