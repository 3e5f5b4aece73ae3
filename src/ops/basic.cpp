#include "ops/basic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/cpu.h"
#include "ops/elementwise_kernels.h"
#include "util/half.h"

namespace clef::ops {

namespace {
// fp32 dot product; the simd reduction lets the compiler keep several partial sums (vectorised).
inline float dot(const float* a, const float* b, int64_t n) {
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t t = 0; t < n; ++t) acc += a[t] * b[t];
    return acc;
}
}  // namespace

void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, const float* bias, float* y) {
#pragma omp parallel for collapse(2) schedule(static) if (m * n * k > (1 << 16))
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            y[i * n + j] = dot(x + i * k, w + j * k, k) + (bias ? bias[j] : 0.f);
        }
}

void linear_bf16(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, const float* bias,
                 float* y) {
#pragma omp parallel if (m * n * k > (1 << 16))
    {
        std::vector<float> row(static_cast<size_t>(k));
#pragma omp for schedule(static)
        for (int64_t j = 0; j < n; ++j) {
            for (int64_t t = 0; t < k; ++t) row[t] = bf16_to_f32(w[j * k + t]);
            for (int64_t i = 0; i < m; ++i)
                y[i * n + j] = dot(x + i * k, row.data(), k) + (bias ? bias[j] : 0.f);
        }
    }
}

void layer_norm(const float* x, int64_t rows, int64_t d, const float* w, const float* b, float eps,
                float* y) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * d;
        float* yr = y + r * d;
        double mean = 0.0;
        for (int64_t i = 0; i < d; ++i) mean += xr[i];
        mean /= static_cast<double>(d);
        double var = 0.0;
        for (int64_t i = 0; i < d; ++i) {
            double c = xr[i] - mean;
            var += c * c;
        }
        var /= static_cast<double>(d);
        const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
        const float mf = static_cast<float>(mean);
        for (int64_t i = 0; i < d; ++i) {
            float v = (xr[i] - mf) * inv;
            if (w) v *= w[i];
            if (b) v += b[i];
            yr[i] = v;
        }
    }
}

namespace {
inline float rms_inv(const float* xr, int64_t d, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
}
}  // namespace

void rms_norm_zc(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * d;
        const float inv = rms_inv(xr, d, eps);
        for (int64_t i = 0; i < d; ++i) y[r * d + i] = xr[i] * inv * (1.f + w[i]);
    }
}

void rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * d;
        const float inv = rms_inv(xr, d, eps);
        for (int64_t i = 0; i < d; ++i) y[r * d + i] = xr[i] * inv * (w ? w[i] : 1.f);
    }
}

float sigmoid(float x) {
    return 1.f / (1.f + std::exp(-x));
}
void add_inplace(float* x, const float* y, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

float silu(float x) {
    return x * sigmoid(x);
}
float softplus(float x) {
    return x > 20.f ? x : std::log1p(std::exp(x));
}
float gelu_erf(float x) {
    return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752440f));
}
float gelu_tanh(float x) {
    const float c = 0.79788456080286535588f;  // sqrt(2/pi)
    return 0.5f * x * (1.f + std::tanh(c * (x + 0.044715f * x * x * x)));
}
void silu_inplace(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = silu(x[i]);
}
void gelu_erf_inplace(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = gelu_erf(x[i]);
}
void gelu_tanh_inplace(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = gelu_tanh(x[i]);
}

template <class T>
void softmax_inplace(T* x, int64_t n) {
    if (n <= 0) return;
    T mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}
template void softmax_inplace<float>(float* x, int64_t n);
template void softmax_inplace<double>(double* x, int64_t n);

template <class T>
double log_sum_exp(const T* x, int64_t n) {
    if (n <= 0) return -std::numeric_limits<double>::infinity();
    T mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
    return static_cast<double>(mx) + std::log(sum);
}
template double log_sum_exp<float>(const float* x, int64_t n);
template double log_sum_exp<double>(const double* x, int64_t n);

std::vector<float> softmax_f32(const std::vector<float>& logits) {
    std::vector<float> p = logits;
    softmax_inplace(p.data(), static_cast<int64_t>(p.size()));
    return p;
}

void attention(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
               int64_t v_stride, int64_t lq, int64_t lk, int hq, int hkv, int dh, float scale, bool causal,
               float* out, int64_t out_stride) {
    const int group = hq / hkv;
#pragma omp parallel if (lq * lk * hq * dh > (1 << 16))
    {
        std::vector<float> s(static_cast<size_t>(lk));
#pragma omp for collapse(2) schedule(static)
        for (int64_t i = 0; i < lq; ++i)
            for (int h = 0; h < hq; ++h) {
                const int g = h / group;
                const float* qi = q + i * q_stride + h * dh;
                const int64_t n = causal ? i + 1 : lk;
                for (int64_t j = 0; j < n; ++j) s[j] = dot(qi, k + j * k_stride + g * dh, dh) * scale;
                softmax_inplace(s.data(), n);
                float* o = out + i * out_stride + h * dh;
                for (int d = 0; d < dh; ++d) o[d] = 0.f;
                for (int64_t j = 0; j < n; ++j) {
                    const float* vj = v + j * v_stride + g * dh;
                    const float sj = s[j];
#pragma omp simd
                    for (int d = 0; d < dh; ++d) o[d] += sj * vj[d];
                }
            }
    }
}

// ---------------------------------------------------------------- fused kernels and fast paths

void sigmoid_mul(const float* x, const float* gate, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * sigmoid(gate[i]);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void rms_norm_gated(const float* x, const float* z, int64_t rows, int64_t d, const float* w, float eps,
                    float* y, NormGate gate) {
    rms_norm(x, rows, d, w, eps, y);
    for (int64_t i = 0; i < rows * d; ++i) y[i] *= gate == NormGate::Silu ? silu(z[i]) : sigmoid(z[i]);
}

namespace {
constexpr int64_t kPar = 1 << 15;  // elements below which the fast kernels stay on one thread

using simd::NormMode;

void rms_rows(const float* x, const float* z, int64_t rows, int64_t d, const float* w, float eps,
              NormMode mode, float* y) {
#pragma omp parallel for schedule(static) if (rows * d > kPar)
    for (int64_t r = 0; r < rows; ++r) {
        const float inv =
            static_cast<float>(1.0 / std::sqrt(simd::sum_sq(x + r * d, d) / static_cast<double>(d) + eps));
        simd::norm_row(x + r * d, z ? z + r * d : nullptr, d, w, inv, mode, y + r * d);
    }
}
}  // namespace

void sigmoid_mul_fast(const float* x, const float* gate, int64_t n, float* out) {
    const int64_t blk = 4096;
#pragma omp parallel for schedule(static) if (n > kPar)
    for (int64_t i = 0; i < n; i += blk)
        simd::sigmoid_mul_span(x + i, gate + i, std::min(blk, n - i), out + i);
}

void silu_mul_fast(const float* gate, const float* up, int64_t n, float* out) {
    const int64_t blk = 4096;
#pragma omp parallel for schedule(static) if (n > kPar)
    for (int64_t i = 0; i < n; i += blk) simd::silu_mul_span(gate + i, up + i, std::min(blk, n - i), out + i);
}

void layer_norm_fast(const float* x, int64_t rows, int64_t d, const float* w, const float* b, float eps,
                     float* y) {
    num_threads();  // applies the global thread setting to this thread
#pragma omp parallel for schedule(static) if (rows * d > kPar)
    for (int64_t r = 0; r < rows; ++r) layer_norm(x + r * d, 1, d, w, b, eps, y + r * d);
}

void gelu_tanh_inplace_fast(float* x, int64_t n) {
    const int64_t blk = 4096;
#pragma omp parallel for schedule(static) if (n > kPar)
    for (int64_t i = 0; i < n; i += blk) simd::gelu_tanh_span(x + i, std::min(blk, n - i));
}

void rms_norm_gated_fast(const float* x, const float* z, int64_t rows, int64_t d, const float* w, float eps,
                         float* y, NormGate gate) {
    rms_rows(x, z, rows, d, w, eps, gate == NormGate::Silu ? NormMode::GateSilu : NormMode::GateSigmoid, y);
}

void rms_norm_zc_fast(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y) {
    rms_rows(x, nullptr, rows, d, w, eps, NormMode::ZeroCentred, y);
}

void rms_norm_fast(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y) {
    rms_rows(x, nullptr, rows, d, w, eps, NormMode::Plain, y);
}

void softmax_inplace_fast(float* x, int64_t n) {
    if (n > 0) simd::softmax_row(x, n, false);
}

void softmax_inplace_fast_f32(float* x, int64_t n) {
    if (n > 0) simd::softmax_row(x, n, true);
}

void l2_norm_fast(const float* x, int64_t rows, int64_t d, float eps, float scale, float* y) {
#pragma omp parallel for schedule(static) if (rows * d > kPar)
    for (int64_t r = 0; r < rows; ++r) {
        const float inv =
            static_cast<float>(static_cast<double>(scale) / std::sqrt(simd::sum_sq(x + r * d, d) + eps));
        simd::scale_row(x + r * d, d, inv, y + r * d);
    }
}

}  // namespace clef::ops
