// The fp32 reference kernels of src/ops/basic.h against straightforward double-precision computations written
// here (and a few published constants). These kernels are the oracles of every fast path, so they are checked
// on their own.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/basic.h"
#include "test_util.h"
#include "util/half.h"

using namespace clef;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
    std::mt19937 rng(seed);
    return clef::testing::randn(n, rng, scale);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

}  // namespace

TEST(OpsBasic, LinearMatchesDouble) {
    for (auto [m, k, n] : {std::tuple{1, 1, 1}, {3, 17, 5}, {64, 64, 128}, {7, 300, 33}}) {
        auto x = randn(static_cast<size_t>(m * k), 1), w = randn(static_cast<size_t>(n * k), 2),
             b = randn(n, 3);
        std::vector<float> y(static_cast<size_t>(m * n));
        ops::linear(x.data(), m, k, w.data(), n, b.data(), y.data());
        std::vector<double> ref(y.size());
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
                double acc = b[j];
                for (int t = 0; t < k; ++t) acc += static_cast<double>(x[i * k + t]) * w[j * k + t];
                ref[i * n + j] = acc;
            }
        EXPECT_LT(max_abs_diff(y, ref), 1e-4 * std::sqrt(k)) << m << "x" << k << "x" << n;

        // bf16 weights: the same with the weights rounded to bf16 first.
        std::vector<uint16_t> wb(w.size());
        for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
        ops::linear_bf16(x.data(), m, k, wb.data(), n, nullptr, y.data());
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
                double acc = 0;
                for (int t = 0; t < k; ++t)
                    acc += static_cast<double>(x[i * k + t]) * bf16_to_f32(wb[j * k + t]);
                ref[i * n + j] = acc;
            }
        EXPECT_LT(max_abs_diff(y, ref), 1e-4 * std::sqrt(k));
    }
}

TEST(OpsBasic, NormsMatchDouble) {
    const int rows = 5, d = 96;
    auto x = randn(rows * d, 4, 3.f), w = randn(d, 5, 0.1f), b = randn(d, 6, 0.1f);
    std::vector<float> y(x.size());
    std::vector<double> ref(x.size());
    // torch.nn.LayerNorm: biased variance, eps inside the sqrt.
    ops::layer_norm(x.data(), rows, d, w.data(), b.data(), 1e-5f, y.data());
    for (int r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int i = 0; i < d; ++i) mean += x[r * d + i];
        mean /= d;
        for (int i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
        var /= d;
        for (int i = 0; i < d; ++i)
            ref[r * d + i] = (x[r * d + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
    }
    EXPECT_LT(max_abs_diff(y, ref), 1e-5);
    // Zero-centred RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w); plain RMSNorm: * w.
    ops::rms_norm_zc(x.data(), rows, d, w.data(), 1e-6f, y.data());
    std::vector<double> plain(x.size());
    for (int r = 0; r < rows; ++r) {
        double ms = 0;
        for (int i = 0; i < d; ++i) ms += static_cast<double>(x[r * d + i]) * x[r * d + i];
        const double inv = 1.0 / std::sqrt(ms / d + 1e-6);
        for (int i = 0; i < d; ++i) {
            ref[r * d + i] = x[r * d + i] * inv * (1.0 + w[i]);
            plain[r * d + i] = x[r * d + i] * inv * w[i];
        }
    }
    EXPECT_LT(max_abs_diff(y, ref), 1e-5);
    ops::rms_norm(x.data(), rows, d, w.data(), 1e-6f, y.data());
    EXPECT_LT(max_abs_diff(y, plain), 1e-6);
}

TEST(OpsBasic, Activations) {
    // Published values: GELU(1) exact = 0.8413447460685429, tanh approximation = 0.8411919906082768.
    EXPECT_NEAR(ops::gelu_erf(1.f), 0.8413447460685429, 1e-6);
    EXPECT_NEAR(ops::gelu_tanh(1.f), 0.8411919906082768, 1e-6);
    EXPECT_NEAR(ops::gelu_erf(-2.f), -2.0 * 0.5 * std::erfc(2.0 / std::sqrt(2.0)), 1e-6);
    EXPECT_NEAR(ops::silu(2.f), 2.0 / (1.0 + std::exp(-2.0)), 1e-6);
    EXPECT_NEAR(ops::sigmoid(-3.f), 1.0 / (1.0 + std::exp(3.0)), 1e-7);
    EXPECT_NEAR(ops::softplus(1.f), std::log1p(std::exp(1.0)), 1e-6);
    EXPECT_EQ(ops::softplus(25.f), 25.f);  // torch's threshold: x above 20 passes through
    std::vector<float> s = {1000.f, 1001.f, 1002.f};
    ops::softmax_inplace(s.data(), 3);
    const double z = 1 + std::exp(1.0) + std::exp(2.0);
    EXPECT_NEAR(s[0], 1 / z, 1e-7);
    EXPECT_NEAR(s[2], std::exp(2.0) / z, 1e-7);
}

// log_sum_exp against long-double sums of exponentials written here, against the softmax it normalises, far
// past exp's overflow, and for no values.
TEST(OpsBasic, LogSumExp) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> u(-8.0, 8.0);
    std::vector<double> x(200);
    for (double& v : x) v = u(rng);
    long double sum = 0;
    for (double v : x) sum += std::exp(static_cast<long double>(v));
    const double want = static_cast<double>(std::log(sum));
    // Double terms: each exp within an ulp, 200 of them summed in double; the logarithm of a sum >= 1.
    EXPECT_NEAR(ops::log_sum_exp(x.data(), 200), want, 1e-13);
    // Float terms: x_i - max rounded to half an ulp of 16 (1e-6), expf within an ulp: each term within
    // ~1.2e-6 relative, so the logarithm within 1.2e-6 absolute.
    const std::vector<float> xf(x.begin(), x.end());
    long double sumf = 0;
    for (float v : xf) sumf += std::exp(static_cast<long double>(v));
    EXPECT_NEAR(ops::log_sum_exp(xf.data(), 200), static_cast<double>(std::log(sumf)), 2e-6);

    // The softmax it normalises: softmax(x)_i = exp(x_i - log_sum_exp(x)).
    std::vector<double> p = x;
    ops::softmax_inplace(p.data(), 200);
    const double lse = ops::log_sum_exp(x.data(), 200);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(std::exp(x[i] - lse), p[i], 1e-15) << i;

    // Shifted by the maximum: exp(1002) overflows double, the log-normaliser does not.
    const std::vector<double> big = {1000.0, 1001.0, 1002.0};
    EXPECT_NEAR(ops::log_sum_exp(big.data(), 3), 1002.0 + std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0),
                1e-12);
    EXPECT_EQ(ops::log_sum_exp(big.data(), 0), -std::numeric_limits<double>::infinity());
}

// Attention against a naive double loop: GQA grouping, causal mask, strides, scale.
TEST(OpsBasic, AttentionMatchesNaiveDoubleLoop) {
    for (bool causal : {true, false}) {
        const int L = 37, hq = 4, hkv = 2, dh = 8;
        const int64_t qs = hq * dh + 3, ks = hkv * dh + 1, vs = hkv * dh + 2, os = hq * dh;
        auto q = randn(L * qs, 7), k = randn(L * ks, 8), v = randn(L * vs, 9);
        std::vector<float> out(L * os);
        const float scale = 1.f / std::sqrt(static_cast<float>(dh));
        ops::attention(q.data(), qs, k.data(), ks, v.data(), vs, L, L, hq, hkv, dh, scale, causal, out.data(),
                       os);
        std::vector<double> ref(out.size());
        for (int i = 0; i < L; ++i)
            for (int h = 0; h < hq; ++h) {
                const int g = h / (hq / hkv);
                const int n = causal ? i + 1 : L;
                std::vector<double> p(n);
                double mx = -1e300, sum = 0;
                for (int j = 0; j < n; ++j) {
                    double dot = 0;
                    for (int d = 0; d < dh; ++d)
                        dot += static_cast<double>(q[i * qs + h * dh + d]) * k[j * ks + g * dh + d];
                    p[j] = dot * scale;
                    mx = std::max(mx, p[j]);
                }
                for (int j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
                for (int d = 0; d < dh; ++d) {
                    double acc = 0;
                    for (int j = 0; j < n; ++j) acc += p[j] / sum * v[j * vs + g * dh + d];
                    ref[i * os + h * dh + d] = acc;
                }
            }
        EXPECT_LT(max_abs_diff(out, ref), 1e-5) << (causal ? "causal" : "full");
    }
}
