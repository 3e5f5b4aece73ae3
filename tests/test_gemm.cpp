// PackedLinear on every available backend against the scalar reference ops::linear_bf16 / ops::linear, for
// both precisions, on odd shapes and on the tiny model's shapes.
//
// Bounds: Exact must agree with the fp32 reference to 1e-5 relative to sum_k |x_k w_k| (fp32 accumulation in
// a different order); BF16 rounds the activations once to bf16 (relative error <= 2^-9 per product), so it
// must agree to 4e-3 of sum_k |x_k w_k| -- and, to show the test can fail, it must NOT agree to the Exact
// bound.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ops/basic.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "ops/simd.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

namespace clef {
namespace {

using ops::GemmBackend;
using ops::PackedLinear;
using ops::Precision;
using ops::WeightType;

using clef::testing::randn;

// One way of running a layer: a backend, and for oneDNN the kernel plan, for the own SIMD kernel the
// Highway target. Every variant this CPU can run is tested (the SIMD kernel on every compiled-in target).
struct Variant {
    GemmBackend backend;
    ops::GemmPlan plan;  // OneDnn
    int64_t target = 0;  // Simd
    std::string name;
    // Whether Precision::BF16 rounds the activations (f32 plans compute it exactly).
    bool bf16_rounds() const { return backend != GemmBackend::OneDnn || plan.bf16 == ops::GemmKernel::BF16; }
    ops::GemmKernel dnnl_kernel(Precision p) const { return p == Precision::Exact ? plan.exact : plan.bf16; }
};

// Applies a variant's plan / target while it lives.
struct Use {
    std::optional<ops::ScopedGemmPlan> plan;
    std::optional<ops::ScopedSimdTarget> target;
    explicit Use(const Variant& v) {
        if (v.backend == GemmBackend::OneDnn) plan.emplace(v.plan);
        if (v.backend == GemmBackend::Simd) target.emplace(v.target);
    }
};

// every_target = false: the own kernel on the dispatched target only (the big-matrix tests; every target is
// covered by the small shapes here and by tests/test_kernels.cpp).
std::vector<Variant> variants(WeightType t, bool every_target = true) {
    using ops::GemmKernel;
    std::vector<Variant> out;
    if (PackedLinear::backend_available(GemmBackend::OneDnn, t)) {
        if (ops::gemm_kernel_available(GemmKernel::F32))
            out.push_back({GemmBackend::OneDnn,
                           {GemmBackend::OneDnn, GemmKernel::F32, GemmKernel::F32},
                           0,
                           "onednn f32"});
        if (ops::gemm_kernel_available(GemmKernel::BF16))
            out.push_back({GemmBackend::OneDnn,
                           {GemmBackend::OneDnn, GemmKernel::BF16x3, GemmKernel::BF16},
                           0,
                           "onednn bf16x3/bf16"});
    }
    for (int64_t target : ops::simd_targets()) {
        out.push_back({GemmBackend::Simd, {}, target, "simd " + ops::simd_target_name(target)});
        if (!every_target) break;
    }
    out.push_back({GemmBackend::Scalar, {}, 0, "scalar"});
    return out;
}

// Worst |y - ref| / (sum_k |x w| + tiny) over all outputs.
double worst_rel(const std::vector<float>& y, const std::vector<float>& ref, const std::vector<float>& x,
                 const std::vector<float>& wf, int64_t m, int64_t k, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            double mag = 0;
            for (int64_t t = 0; t < k; ++t) mag += std::fabs(double(x[i * k + t]) * wf[j * k + t]);
            worst = std::max(worst, std::fabs(double(y[i * n + j]) - ref[i * n + j]) / (mag + 1e-30));
        }
    return worst;
}

void check_bf16_weights(int64_t m, int64_t k, int64_t n, bool with_bias, uint32_t seed,
                        bool every_target = true) {
    std::mt19937 rng(seed);
    auto x = randn(m * k, rng, 1.5f);
    auto wf = randn(n * k, rng, 0.05f);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) {
        w[i] = f32_to_bf16(wf[i]);
        wf[i] = bf16_to_f32(w[i]);
    }
    auto bias = randn(n, rng, 0.1f);
    const float* b = with_bias ? bias.data() : nullptr;
    std::vector<float> ref(m * n);
    ops::linear_bf16(x.data(), m, k, w.data(), n, b, ref.data());
    // Without the bias for the relative bound's denominator; the bias is exact in both.
    for (const Variant& v : variants(WeightType::BF16, every_target)) {
        SCOPED_TRACE(::testing::Message() << v.name << " m=" << m << " k=" << k << " n=" << n);
        const Use use(v);
        PackedLinear lin({w.data(), WeightType::BF16}, n, k, v.backend);
        EXPECT_EQ(lin.n(), n);
        EXPECT_EQ(lin.k(), k);
        std::vector<float> y(m * n, -1.f);
        lin.forward(x.data(), m, y.data(), Precision::Exact, b);
        EXPECT_LT(worst_rel(y, ref, x, wf, m, k, n), 1e-5);
        std::fill(y.begin(), y.end(), -1.f);
        lin.forward(x.data(), m, y.data(), Precision::BF16, b);
        const double rel = worst_rel(y, ref, x, wf, m, k, n);
        EXPECT_LT(rel, 4e-3);
        if (!v.bf16_rounds()) {
            EXPECT_LT(rel, 1e-5) << "the f32 plan computes BF16 exactly";
        } else if (m * k >= 64) {
            EXPECT_GT(rel, 1e-5) << "BF16 mode should round the activations";
        }
    }
}

TEST(PackedLinear, OddShapes) {
    uint32_t seed = 1;
    for (int64_t m : {1, 7, 64, 513})
        for (int64_t k : {13, 64, 100})
            for (int64_t n : {1, 3, 100}) {
                check_bf16_weights(m, k, n, (seed & 1) != 0, seed);
                ++seed;
            }
}

TEST(PackedLinear, TinyModelShapes) {
    // hidden 64, intermediate 128, q+gate 4*32*2, kv 2*32, linear-attention qkv 2*16*2 + 4*16, z 64, vocab
    // 320.
    const int64_t shapes[][2] = {{64, 256}, {64, 64}, {64, 128}, {128, 64}, {256, 64}, {64, 128}, {64, 320}};
    uint32_t seed = 100;
    for (int64_t m : {1, 37, 300})
        for (auto& s : shapes) check_bf16_weights(m, s[0], s[1], false, seed++);
}

TEST(PackedLinear, LargeK) {
    check_bf16_weights(9, 4099, 70, true, 7);
}

TEST(PackedLinear, ColumnBlocks) {
    // 8200 x 4100 bf16 = 64 MiB: oneDNN packs it as three column blocks of at most 32 MiB (widths 1408, 1408,
    // 1284; the last is not a multiple of 64), each written into its columns of y and summed per term.
    check_bf16_weights(3, 8200, 4100, true, 11, false);
    check_bf16_weights(8, 8200, 4100, false, 12, false);
}

TEST(PackedLinear, F32AndF16Weights) {
    std::mt19937 rng(5);
    const int64_t m = 11, k = 77, n = 45;
    auto x = randn(m * k, rng);
    auto wf = randn(n * k, rng, 0.1f);
    std::vector<uint16_t> wh(wf.size());
    std::vector<float> whf(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) {
        wh[i] = f32_to_f16(wf[i]);
        whf[i] = f16_to_f32(wh[i]);
    }
    std::vector<float> ref32(m * n), ref16(m * n);
    ops::linear(x.data(), m, k, wf.data(), n, nullptr, ref32.data());
    ops::linear(x.data(), m, k, whf.data(), n, nullptr, ref16.data());
    for (const Variant& v : variants(WeightType::F32)) {
        SCOPED_TRACE(v.name);
        const Use use(v);
        const GemmBackend be = v.backend;
        std::vector<float> y(m * n);
        PackedLinear l32({wf.data(), WeightType::F32}, n, k, be);
        l32.forward(x.data(), m, y.data(), Precision::Exact);
        EXPECT_LT(worst_rel(y, ref32, x, wf, m, k, n), 1e-5);
        PackedLinear l16({wh.data(), WeightType::F16}, n, k, be);
        l16.forward(x.data(), m, y.data(), Precision::Exact);
        EXPECT_LT(worst_rel(y, ref16, x, whf, m, k, n), 1e-5);
        l16.forward(x.data(), m, y.data(), Precision::BF16);
        EXPECT_LT(worst_rel(y, ref16, x, whf, m, k, n), 4e-3);
    }
}

TEST(PackedLinear, RowProviderEqualsTensor) {
    std::mt19937 rng(9);
    const int64_t m = 20, k = 96, n = 75;
    auto x = randn(m * k, rng);
    std::vector<uint16_t> w(n * k);
    for (auto& v : w) v = f32_to_bf16(std::normal_distribution<float>(0.f, 0.1f)(rng));
    int calls = 0;
    ops::RowProvider rows = [&](int64_t r0, int64_t nr, uint16_t* out) {
        ++calls;
        ASSERT_LE(r0 + nr, n);
        std::copy(w.begin() + r0 * k, w.begin() + (r0 + nr) * k, out);
    };
    for (const Variant& v : variants(WeightType::BF16)) {
        SCOPED_TRACE(v.name);
        const Use use(v);
        const GemmBackend be = v.backend;
        PackedLinear a({w.data(), WeightType::BF16}, n, k, be), b(rows, n, k, be);
        std::vector<float> ya(m * n), yb(m * n);
        for (Precision p : {Precision::Exact, Precision::BF16}) {
            a.forward(x.data(), m, ya.data(), p);
            b.forward(x.data(), m, yb.data(), p);
            EXPECT_EQ(ya, yb);
        }
        EXPECT_GE(b.packed_bytes(), size_t(n * k * 2));
        EXPECT_LE(b.packed_bytes(), size_t((n + 64) * (k + 64) * 2));
    }
    EXPECT_GT(calls, 0);
}

// Residency::InPlace uses the caller's bf16 weights without a copy on oneDNN (packed_bytes 0; a change to
// them shows in the next product) with results equal to the packed layer's bit for bit; other backends pack.
TEST(PackedLinear, InPlaceEqualsPacked) {
    std::mt19937 rng(17);
    const int64_t m = 40, k = 2056, n = 8200;  // two column blocks
    std::vector<uint16_t> w(n * k);
    for (auto& v : w) v = f32_to_bf16(std::normal_distribution<float>(0.f, 0.05f)(rng));
    const std::vector<float> x = randn(m * k, rng);
    for (const Variant& v : variants(WeightType::BF16, false)) {
        SCOPED_TRACE(v.name);
        const Use use(v);
        const GemmBackend be = v.backend;
        const bool dnn = be == GemmBackend::OneDnn;
        const PackedLinear packed({w.data(), WeightType::BF16}, n, k, be);
        const PackedLinear in_place({w.data(), WeightType::BF16}, n, k, be, ops::Residency::InPlace);
        EXPECT_EQ(in_place.packed_bytes(), dnn ? 0u : packed.packed_bytes());
        EXPECT_GE(packed.packed_bytes(), size_t(n * k * 2));
        for (Precision p : {Precision::Exact, Precision::BF16}) {
            std::vector<float> ya(m * n), yb(m * n, NAN);
            packed.forward(x.data(), m, ya.data(), p);
            in_place.forward(x.data(), m, yb.data(), p);
            ASSERT_EQ(ya, yb);
        }
        if (dnn) {
            std::vector<uint16_t> saved = w;
            std::fill(w.begin(), w.begin() + k, f32_to_bf16(1.f));  // output 0's weights
            std::vector<float> y(m * n);
            in_place.forward(x.data(), m, y.data(), Precision::BF16);
            double want = 0;
            for (int64_t t = 0; t < k; ++t) want += bf16_to_f32(f32_to_bf16(x[t]));
            EXPECT_NEAR(y[0], want, 1e-3 * (1 + std::fabs(want)));
            w = saved;
        }
    }
}

// Residency::Streamed fetches the weights from the provider on every forward and holds none between calls
// (one call per column block and group of rows for oneDNN's bf16 kernels, where a group holds more than 1024
// rows; one per column block for the f32 kernel, per 8 MiB group of panels for the own kernels); its results
// equal the packed layer's bit for bit, with two column blocks (8200 x 2056 bf16 is over 32 MiB), several row
// blocks, more rows than one group, both precisions and a bias.
TEST(PackedLinear, StreamedEqualsPacked) {
    std::mt19937 rng(21);
    const int64_t k = 2056, n = 8200;
    std::vector<uint16_t> w(n * k);
    for (auto& v : w) v = f32_to_bf16(std::normal_distribution<float>(0.f, 0.05f)(rng));
    const std::vector<float> bias = randn(n, rng);
    std::atomic<int> calls{0};
    ops::RowProvider rows = [&](int64_t r0, int64_t nr, uint16_t* out) {
        ++calls;
        std::copy(w.begin() + r0 * k, w.begin() + (r0 + nr) * k, out);
    };
    for (const Variant& v : variants(WeightType::BF16, false)) {
        SCOPED_TRACE(v.name);
        const Use use(v);
        const GemmBackend be = v.backend;
        const bool dnn = be == GemmBackend::OneDnn;
        const PackedLinear packed(rows, n, k, be), streamed(rows, n, k, be, ops::Residency::Streamed);
        EXPECT_TRUE(streamed.streamed());
        EXPECT_EQ(streamed.packed_bytes(), 0u);
        for (const int64_t m : dnn ? std::vector<int64_t>{1, 300, 2100} : std::vector<int64_t>{7}) {
            const std::vector<float> x = randn(m * k, rng);
            for (Precision p : {Precision::Exact, Precision::BF16}) {
                SCOPED_TRACE(m);
                std::vector<float> ya(m * n), yb(m * n, NAN);
                packed.forward(x.data(), m, ya.data(), p, bias.data());
                calls = 0;
                streamed.forward(x.data(), m, yb.data(), p, bias.data());
                ASSERT_EQ(ya, yb);
                if (!dnn) {  // once per 8 MiB group of panels: 63 panels of 32 x 2056 bf16, 257 panels
                    EXPECT_EQ(calls.load(), 5);
                } else if (v.dnnl_kernel(p) == ops::GemmKernel::F32) {  // once per column block
                    EXPECT_EQ(calls.load(), 2);
                } else {  // 2 column blocks, fetched once per group of rows
                    EXPECT_EQ(calls % 2, 0);
                    EXPECT_GE(calls.load(), 2);
                    EXPECT_LE(calls.load(), 2 * ((m + 1023) / 1024));
                    if (m == 2100) {
                        EXPECT_EQ(calls.load(), 4);
                    }
                }
            }
        }
    }
}

TEST(PackedLinear, RepeatedCallsAndMoves) {
    std::mt19937 rng(3);
    const int64_t k = 40, n = 33;
    std::vector<uint16_t> w(n * k);
    for (auto& v : w) v = f32_to_bf16(std::normal_distribution<float>(0.f, 0.1f)(rng));
    PackedLinear lin({w.data(), WeightType::BF16}, n, k);
    PackedLinear moved = std::move(lin);
    EXPECT_TRUE(lin.empty());
    for (int64_t m : {5, 300, 5, 1}) {
        auto x = randn(m * k, rng);
        std::vector<float> y(m * n), ref(m * n);
        ops::linear_bf16(x.data(), m, k, w.data(), n, nullptr, ref.data());
        moved.forward(x.data(), m, y.data(), Precision::Exact);
        for (int64_t i = 0; i < m * n; ++i) EXPECT_NEAR(y[i], ref[i], 1e-5);
    }
    moved.forward(nullptr, 0, nullptr, Precision::Exact);  // m == 0: no-op
}

TEST(PackedLinear, BadInput) {
    std::vector<uint16_t> w(6);
    EXPECT_THROW(PackedLinear({w.data(), WeightType::BF16}, 0, 3), Error);
    EXPECT_THROW(PackedLinear({nullptr, WeightType::BF16}, 2, 3), Error);
    EXPECT_THROW(PackedLinear(ops::RowProvider{}, 2, 3), Error);
    PackedLinear empty;
    float x = 0, y = 0;
    EXPECT_THROW(empty.forward(&x, 1, &y, Precision::Exact), Error);
    PackedLinear lin({w.data(), WeightType::BF16}, 2, 3);
    EXPECT_THROW(lin.forward(&x, -1, &y, Precision::Exact), Error);
    EXPECT_THROW(lin.forward(nullptr, 1, &y, Precision::Exact), Error);
    if (!PackedLinear::backend_available(GemmBackend::OneDnn)) {
        EXPECT_THROW(PackedLinear({w.data(), WeightType::BF16}, 2, 3, GemmBackend::OneDnn), Error);
    }
    EXPECT_THROW(PackedLinear({w.data(), WeightType::F16}, 2, 3, GemmBackend::OneDnn), Error);
}

TEST(Cpu, FeaturesAndThreads) {
    const auto& f = ops::cpu_features();
    EXPECT_GE(f.physical_cores, 1);
    EXPECT_GE(f.logical_cpus, f.physical_cores);
    EXPECT_FALSE(ops::cpu_features_string().empty());
    ops::set_num_threads(1);
    EXPECT_EQ(ops::num_threads(), 1);
    ops::set_num_threads(0);
    EXPECT_GE(ops::num_threads(), 1);
}

}  // namespace
}  // namespace clef
