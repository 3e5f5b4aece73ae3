// The vectorised fast paths against their scalar references on every Highway target compiled in and usable
// here (the suite reruns under each CLEF_MAX_ISA cap, label isa): fused elementwise kernels (ops/basic.h),
// the bidirectional path of attention_fast (ops/attention_fast.h), and the fast chunked gated delta rule
// against the token-serial recurrence (ops/delta_rule.h). Each kernel's family reports the target it ran on
// (ops/simd.h), and the cap is checked to reach every family.
#include <gtest/gtest.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ops/attention_fast.h"
#include "ops/basic.h"
#include "ops/conv.h"
#include "ops/delta_rule.h"
#include "ops/gemm.h"
#include "ops/quant_blocks.h"
#include "ops/quant_kernels.h"
#include "ops/simd.h"
#include "test_util.h"
#include "util/error.h"

namespace clef {
namespace {

using clef::testing::randn;

// max |a - b| / max(1, |b|) elementwise.
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i)
        m = std::max(m, std::fabs(double(a[i]) - b[i]) / std::max(1.0, std::fabs(double(b[i]))));
    return m;
}

using ops::KernelFamily;

// Runs body once per dispatch target with the target forced; body's kernels of `family` must report it.
template <class F>
void on_every_target(KernelFamily family, F body) {
    for (int64_t target : ops::simd_targets()) {
        const std::string name = ops::simd_target_name(target);
        SCOPED_TRACE(name);
        const ops::ScopedSimdTarget use(target);
        body();
        EXPECT_EQ(ops::last_target(family), name);
    }
}

// The target CLEF_MAX_ISA leaves as the best: the named class, the lowest compiled target for baseline.
std::string capped_target() {
    const char* e = std::getenv("CLEF_MAX_ISA");
    const std::string cap = e ? e : "";
    if (cap == "avx2") return "AVX2";
    if (cap == "sse4") return "SSE4";
    if (cap == "baseline") {
        // The lowest target compiled in (Highway 1.0 on x86: SCALAR), the only one the cap leaves.
        int64_t lowest = HWY_TARGETS;
        while (lowest & (lowest - 1)) lowest &= lowest - 1;  // a higher bit is a lower target
        EXPECT_EQ(ops::simd_targets(), std::vector<int64_t>{lowest});
        return ops::simd_target_name(lowest);
    }
    return ops::simd_target();
}

TEST(Dispatch, CapReachesEveryKernelFamily) {
    const std::string want = capped_target();
    std::printf("  CLEF_MAX_ISA=%s: every kernel family on %s\n",
                std::getenv("CLEF_MAX_ISA") ? std::getenv("CLEF_MAX_ISA") : "(unset)", want.c_str());
    std::mt19937 rng(9);
    auto x = randn(64 * 40, rng);
    std::vector<float> y(x.size());
    ops::silu_mul_fast(x.data(), x.data(), 100, y.data());
    EXPECT_EQ(ops::last_target(KernelFamily::Elementwise), want);
    ops::small_gemm_acc(3, 5, 7, 1.f, x.data(), 7, x.data(), 5, y.data(), 5);
    EXPECT_EQ(ops::last_target(KernelFamily::Gemm), want);
    ops::attention_fast(x.data(), 40, x.data(), 40, x.data(), 40, 30, 30, 1, 1, 40, 0.1f, true, y.data(), 40);
    EXPECT_EQ(ops::last_target(KernelFamily::Attention), want);
    ops::DeltaRuleArgs a;
    std::vector<float> beta(4, 0.5f), g(4, -0.1f);
    a.T = 4, a.num_k_heads = a.num_v_heads = 1, a.dk = a.dv = 16;
    a.q = a.k = a.v = x.data(), a.q_stride = a.k_stride = a.v_stride = a.out_stride = 16;
    a.beta = beta.data(), a.g = g.data(), a.beta_stride = a.g_stride = 1, a.out = y.data();
    ops::gated_delta_rule_chunked_fast(a);
    EXPECT_EQ(ops::last_target(KernelFamily::DeltaRule), want);
    std::vector<uint8_t> block(sizeof(ops::BlockQ8_0), 0);
    ops::dequant_blocks(ops::DequantType::Q8_0, block.data(), 1, y.data());
    EXPECT_EQ(ops::last_target(KernelFamily::Dequant), want);
    (void)ops::fit_scale_sym(x.data());
    EXPECT_EQ(ops::last_target(KernelFamily::Quant), want);
}

TEST(ExpPoly, MatchesStdExp) {
    double worst = 0;
    for (float x = -87.f; x < 88.f; x += 0.0137f)
        worst = std::max(worst, std::fabs(double(ops::exp_poly(x)) / std::exp(double(x)) - 1.0));
    EXPECT_LT(worst, 3e-7);
    EXPECT_EQ(ops::exp_poly(-std::numeric_limits<float>::infinity()), 0.f);
    EXPECT_EQ(ops::exp_poly(-100.f), 0.f);
    EXPECT_EQ(ops::exp_poly(0.f), 1.f);
    EXPECT_TRUE(
        std::isnan(ops::exp_poly(std::numeric_limits<float>::quiet_NaN())));  // NaN outputs stay visible
}

TEST(FusedOps, ElementwiseMatchScalar) {
    std::mt19937 rng(1);
    on_every_target(KernelFamily::Elementwise, [&] {
        for (int64_t n : {1, 15, 17, 1000, 70001}) {
            auto a = randn(n, rng, 4.f), b = randn(n, rng, 4.f);
            a[0] = -30.f;  // far tails
            if (n > 1) a[1] = 30.f;
            std::vector<float> r(n), f(n);
            ops::sigmoid_mul(a.data(), b.data(), n, r.data());
            ops::sigmoid_mul_fast(a.data(), b.data(), n, f.data());
            EXPECT_LT(max_rel(f, r), 1e-6) << n;
            ops::silu_mul(a.data(), b.data(), n, r.data());
            ops::silu_mul_fast(a.data(), b.data(), n, f.data());
            EXPECT_LT(max_rel(f, r), 1e-6) << n;
            // In place (out aliases the first input).
            std::vector<float> g = a;
            ops::silu_mul_fast(g.data(), b.data(), n, g.data());
            EXPECT_EQ(g, f);
        }
    });
}

// The fast causal conv: the same tap sums (vectorised over channels), silu through exp_poly: within the
// silu_mul bound of the reference, with and without carried state (the state it leaves equal, bit for bit).
TEST(FusedOps, CausalConvSiluMatchesScalar) {
    std::mt19937 rng(3);
    on_every_target(KernelFamily::Elementwise, [&] {
        for (const auto& [T, C, K] :
             {std::tuple<int64_t, int64_t, int>{1, 1, 1}, {5, 19, 4}, {70, 260, 4}, {9, 33, 3}}) {
            const auto x = randn(T * C, rng, 2.f), w = randn(C * K, rng, 1.f);
            const auto state0 = randn((K - 1) * C, rng, 2.f);
            for (const bool carried : {false, true}) {
                SCOPED_TRACE(::testing::Message()
                             << T << "x" << C << " K " << K << (carried ? " state" : ""));
                std::vector<float> r(T * C), f(T * C), sr = state0, sf = state0;
                ops::causal_conv1d_silu(x.data(), T, C, C, w.data(), K, carried ? sr.data() : nullptr,
                                        sr.data(), r.data(), C);
                ops::causal_conv1d_silu_fast(x.data(), T, C, C, w.data(), K, carried ? sf.data() : nullptr,
                                             sf.data(), f.data(), C);
                EXPECT_LT(max_rel(f, r), 1e-6);
                EXPECT_EQ(sf, sr);
            }
        }
    });
}

// gelu_tanh through exp_poly (2 ulp) and the sigmoid form: each value within a few ulp of max(1, |x|), the
// scale of the reference's own rounding of 0.5·x·(1 + tanh u).
TEST(FusedOps, GeluTanhMatchesScalar) {
    std::mt19937 rng(6);
    on_every_target(KernelFamily::Elementwise, [&] {
        for (int64_t n : {1, 15, 17, 4099}) {
            auto x = randn(n, rng, 4.f);
            x[0] = -30.f;
            auto r = x, f = x;
            ops::gelu_tanh_inplace(r.data(), n);
            ops::gelu_tanh_inplace_fast(f.data(), n);
            for (int64_t i = 0; i < n; ++i)
                EXPECT_NEAR(f[i], r[i], 1e-6 * std::max(1.f, std::fabs(x[i]))) << x[i];
        }
    });
}

// layer_norm_fast runs the reference's arithmetic per row: the same bits, one row or many, long rows.
TEST(FusedOps, LayerNormFastIsTheReference) {
    std::mt19937 rng(7);
    for (int64_t d : {1, 17, 1000})
        for (int64_t rows : {1, 3, 70}) {
            auto x = randn(rows * d, rng, 3.f), w = randn(d, rng), b = randn(d, rng);
            std::vector<float> r(x.size()), f(x.size());
            ops::layer_norm(x.data(), rows, d, w.data(), b.data(), 1e-6f, r.data());
            ops::layer_norm_fast(x.data(), rows, d, w.data(), b.data(), 1e-6f, f.data());
            EXPECT_EQ(f, r);
        }
}

TEST(FusedOps, NormsMatchScalar) {
    std::mt19937 rng(2);
    on_every_target(KernelFamily::Elementwise, [&] {
        for (int64_t d : {16, 32, 100, 4096})
            for (int64_t rows : {1, 5, 40}) {
                auto x = randn(rows * d, rng, 2.f), z = randn(rows * d, rng, 3.f), w = randn(d, rng, 0.3f);
                std::fill(x.begin(), x.begin() + d, 0.f);  // a zero row: eps keeps it finite
                std::vector<float> r(rows * d), f(rows * d);
                ops::rms_norm_zc(x.data(), rows, d, w.data(), 1e-6f, r.data());
                ops::rms_norm_zc_fast(x.data(), rows, d, w.data(), 1e-6f, f.data());
                EXPECT_LT(max_rel(f, r), 1e-6);
                ops::rms_norm(x.data(), rows, d, w.data(), 1e-6f, r.data());
                ops::rms_norm_fast(x.data(), rows, d, w.data(), 1e-6f, f.data());
                EXPECT_LT(max_rel(f, r), 1e-6);
                ops::rms_norm(x.data(), rows, d, nullptr, 1e-6f, r.data());
                ops::rms_norm_fast(x.data(), rows, d, nullptr, 1e-6f, f.data());
                EXPECT_LT(max_rel(f, r), 1e-6);
                ops::rms_norm_gated(x.data(), z.data(), rows, d, w.data(), 1e-6f, r.data());
                ops::rms_norm_gated_fast(x.data(), z.data(), rows, d, w.data(), 1e-6f, f.data());
                EXPECT_LT(max_rel(f, r), 2e-6);
                ops::l2_norm(x.data(), rows, d, 1e-6f, 0.125f, r.data());
                ops::l2_norm_fast(x.data(), rows, d, 1e-6f, 0.125f, f.data());
                EXPECT_LT(max_rel(f, r), 1e-6);
            }
    });
}

TEST(FusedOps, GatedNormIsNormTimesSilu) {
    // An independent check of the scalar reference: rms_norm_gated = rms_norm * z * sigmoid(z) by hand.
    std::mt19937 rng(3);
    const int64_t d = 8;
    auto x = randn(d, rng), z = randn(d, rng), w = randn(d, rng);
    std::vector<float> y(d);
    ops::rms_norm_gated(x.data(), z.data(), 1, d, w.data(), 1e-6f, y.data());
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int64_t i = 0; i < d; ++i) {
        const double want = x[i] * inv * w[i] * z[i] / (1.0 + std::exp(-double(z[i])));
        EXPECT_NEAR(y[i], want, 1e-5 * std::max(1.0, std::fabs(want)));
    }
}

// A fast softmax against the scalar ops::softmax_inplace on rows of 1..5000 scores (spread 10), each value
// within rel * max(1e-3, reference).
void check_softmax(void (*fast)(float*, int64_t), uint32_t seed, double rel) {
    std::mt19937 rng(seed);
    on_every_target(KernelFamily::Elementwise, [&] {
        for (int64_t n : {1, 7, 64, 5000}) {
            auto x = randn(n, rng, 10.f);
            auto r = x, f = x;
            ops::softmax_inplace(r.data(), n);
            fast(f.data(), n);
            for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(f[i], r[i], rel * std::max(1e-3f, r[i])) << i;
        }
    });
}

// The float and double instantiations of the one softmax agree to float rounding, and sum to 1.
TEST(FusedOps, SoftmaxFloatAndDouble) {
    std::mt19937 rng(8);
    for (int64_t n : {1, 3, 1000}) {
        auto x = randn(n, rng, 10.f);
        std::vector<double> d(x.begin(), x.end());
        ops::softmax_inplace(x.data(), n);
        ops::softmax_inplace(d.data(), n);
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) {
            EXPECT_NEAR(x[i], d[i], 4e-7 * std::max(1e-3, d[i]) + 1e-12) << i;
            sum += d[i];
        }
        EXPECT_NEAR(sum, 1.0, 1e-12);
    }
}

// attention_fast's bidirectional fp32 path (whole score rows) against ops::attention: GQA, row strides with
// padding, lq != lk, one query row, head dims off the vector width. Each output is a convex combination of
// V's rows, so the error bound is relative to max |v|.
TEST(AttentionFast, BidirectionalMatchesReferenceOnEveryTarget) {
    std::mt19937 rng(12);
    struct Shape {
        int64_t lq, lk;
        int hq, hkv, dh;
    };
    for (const Shape c :
         {Shape{1, 5, 2, 1, 7}, Shape{37, 53, 6, 2, 40}, Shape{70, 70, 4, 4, 17}, Shape{3, 300, 8, 1, 96}}) {
        const int64_t qs = int64_t(c.hq) * c.dh + 3, ks = int64_t(c.hkv) * c.dh * 2 + 1, os = qs + 2;
        auto q = randn(c.lq * qs, rng, 2.f), kv = randn(c.lk * ks, rng, 2.f);
        const float* k = kv.data();
        const float* v = kv.data() + int64_t(c.hkv) * c.dh;
        double vmax = 0;
        for (float x : kv) vmax = std::max(vmax, double(std::fabs(x)));
        std::vector<float> ref(c.lq * os, 0.f);
        const float scale = 1.f / std::sqrt(float(c.dh));
        ops::attention(q.data(), qs, k, ks, v, ks, c.lq, c.lk, c.hq, c.hkv, c.dh, scale, false, ref.data(),
                       os);
        on_every_target(KernelFamily::Gemm, [&] {
            std::vector<float> out(c.lq * os, 0.f);
            ops::attention_fast(q.data(), qs, k, ks, v, ks, c.lq, c.lk, c.hq, c.hkv, c.dh, scale, false,
                                out.data(), os);
            for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5 * vmax) << i;
        });
    }
}

TEST(FusedOps, SoftmaxMatchesScalar) {
    check_softmax(ops::softmax_inplace_fast, 4, 1e-6);
}

// fp32 partial sums of up to n / 16 terms each: a few ulp more than the double denominator.
TEST(FusedOps, SoftmaxF32SumMatchesScalar) {
    check_softmax(ops::softmax_inplace_fast_f32, 5, 4e-6);
}

// ---------------------------------------------------------------- fast chunked delta rule

struct DeltaCase {
    int64_t T;
    int Hk, Hv, dk, dv;
    bool with_state;
};

std::ostream& operator<<(std::ostream& os, const DeltaCase& c) {
    return os << "T" << c.T << "_Hk" << c.Hk << "_Hv" << c.Hv << "_dk" << c.dk << "_dv" << c.dv
              << (c.with_state ? "_state" : "");
}

class DeltaRuleFast : public ::testing::TestWithParam<DeltaCase> {};

void check_delta_rule(const DeltaCase& c) {
    std::mt19937 rng(static_cast<uint32_t>(c.T * 7 + c.dk));
    auto q = randn(c.T * c.Hk * c.dk, rng), k = randn(c.T * c.Hk * c.dk, rng),
         v = randn(c.T * c.Hv * c.dv, rng);
    ops::l2_norm(q.data(), c.T * c.Hk, c.dk, 1e-6f, 1.f / std::sqrt(float(c.dk)), q.data());
    ops::l2_norm(k.data(), c.T * c.Hk, c.dk, 1e-6f, 1.f, k.data());
    std::uniform_real_distribution<float> u01(0.f, 1.f);
    std::vector<float> beta(c.T * c.Hv), g(c.T * c.Hv);
    for (size_t i = 0; i < beta.size(); ++i) {
        beta[i] = u01(rng);
        g[i] = -std::exp(std::log(0.02f) + u01(rng) * (std::log(12.f) - std::log(0.02f)));
    }
    const size_t ns = size_t(c.Hv) * c.dk * c.dv;
    auto s0 = randn(ns, rng, 0.5f);
    ops::DeltaRuleArgs a;
    a.T = c.T;
    a.num_k_heads = c.Hk;
    a.num_v_heads = c.Hv;
    a.dk = c.dk;
    a.dv = c.dv;
    a.q = q.data();
    a.k = k.data();
    a.q_stride = a.k_stride = c.Hk * c.dk;
    a.v = v.data();
    a.v_stride = c.Hv * c.dv;
    a.beta = beta.data();
    a.g = g.data();
    a.beta_stride = a.g_stride = c.Hv;
    a.out_stride = c.Hv * c.dv;
    a.initial_state = c.with_state ? s0.data() : nullptr;
    std::vector<float> o_ref(c.T * c.Hv * c.dv), s_ref(ns), o_fast(o_ref.size(), -7.f), s_fast(ns);
    a.out = o_ref.data();
    a.final_state = s_ref.data();
    ops::gated_delta_rule_serial(a);
    double oscale = 0, sscale = 0;
    for (float x : o_ref) oscale = std::max(oscale, double(std::fabs(x)));
    for (float x : s_ref) sscale = std::max(sscale, double(std::fabs(x)));
    for (int chunk : {64, 16}) {
        a.out = o_fast.data();
        a.final_state = s_fast.data();
        ops::gated_delta_rule_chunked_fast(a, chunk);
        double eo = 0, es = 0;
        for (size_t i = 0; i < o_ref.size(); ++i) eo = std::max(eo, double(std::fabs(o_fast[i] - o_ref[i])));
        for (size_t i = 0; i < ns; ++i) es = std::max(es, double(std::fabs(s_fast[i] - s_ref[i])));
        EXPECT_LT(eo / oscale, 2e-5) << "chunk " << chunk;
        EXPECT_LT(es / sscale, 2e-5) << "chunk " << chunk;
    }
}

TEST_P(DeltaRuleFast, MatchesSerial) {
    on_every_target(KernelFamily::DeltaRule, [] { check_delta_rule(GetParam()); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeltaRuleFast,
                         ::testing::Values(DeltaCase{1, 2, 4, 16, 16, false},
                                           DeltaCase{63, 2, 4, 16, 16, true},
                                           DeltaCase{130, 2, 4, 16, 24, true},
                                           DeltaCase{200, 1, 2, 128, 128, true},
                                           DeltaCase{64, 2, 4, 16, 16, false}));

TEST(DeltaRuleFast, BadInput) {
    ops::DeltaRuleArgs a;
    EXPECT_THROW(ops::gated_delta_rule_chunked_fast(a), Error);
    a.num_k_heads = 1;
    a.num_v_heads = 1;
    a.dk = a.dv = 4;
    EXPECT_THROW(ops::gated_delta_rule_chunked_fast(a, 0), Error);
}

}  // namespace
}  // namespace clef
