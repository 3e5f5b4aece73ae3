// The backbone's reference ops (conv, delta rule, L2 norm, RoPE) against naive double-precision loops written
// here, and the chunked delta rule against the token-serial one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdio>
#include <random>
#include <vector>

#include "ops/conv.h"
#include "ops/delta_rule.h"
#include "ops/rope.h"
#include "test_util.h"
#include "util/error.h"

namespace clef {
namespace {

using clef::testing::randn;

double max_abs(const std::vector<float>& a) {
    double m = 0;
    for (float x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
    return m;
}

template <class A, class B>
double max_diff(const A& a, const B& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
        m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    return m;
}

// ---------------------------------------------------------------- L2 norm

TEST(L2Norm, MatchesDouble) {
    std::mt19937 rng(1);
    const int rows = 7, d = 16;
    auto x = randn(rows * d, rng, 3.f);
    x[3 * d + 5] = 0;                                      // a row with a zero entry is fine
    std::fill(x.begin() + 5 * d, x.begin() + 6 * d, 0.f);  // an all-zero row stays zero (eps)
    std::vector<float> y(x.size());
    ops::l2_norm(x.data(), rows, d, 1e-6f, 0.25f, y.data());
    for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < d; ++i) ss += double(x[r * d + i]) * x[r * d + i];
        for (int i = 0; i < d; ++i) {
            const double want = x[r * d + i] / std::sqrt(ss + 1e-6) * 0.25;
            EXPECT_NEAR(y[r * d + i], want, 1e-7 * std::max(1.0, std::fabs(want)));
        }
    }
    // In place gives the same.
    std::vector<float> z(x);
    ops::l2_norm(z.data(), rows, d, 1e-6f, 0.25f, z.data());
    EXPECT_EQ(z, y);
}

// ---------------------------------------------------------------- conv

std::vector<double> conv_naive(const std::vector<float>& x, int64_t T, int64_t C, const std::vector<float>& w,
                               int K, const std::vector<float>* state) {
    std::vector<double> y(T * C);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c) {
            double acc = 0;
            for (int j = 0; j < K; ++j) {
                const int64_t p = t - (K - 1) + j;
                double xv = 0;
                if (p >= 0)
                    xv = x[p * C + c];
                else if (state)
                    xv = (*state)[(K - 1 + p) * C + c];
                acc += double(w[c * K + j]) * xv;
            }
            y[t * C + c] = acc / (1 + std::exp(-acc));
        }
    return y;
}

TEST(CausalConv, MatchesDoubleWithAndWithoutState) {
    std::mt19937 rng(2);
    for (int K : {1, 2, 4}) {
        for (int64_t T : {1, 3, 17}) {
            const int64_t C = 12;
            auto x = randn(T * C, rng);
            auto w = randn(C * K, rng, 0.7f);
            auto st = randn((K - 1) * C, rng);
            std::vector<float> y(T * C);
            ops::causal_conv1d_silu(x.data(), T, C, C, w.data(), K, nullptr, nullptr, y.data(), C);
            EXPECT_LT(max_diff(y, conv_naive(x, T, C, w, K, nullptr)), 1e-5) << "K=" << K << " T=" << T;
            ops::causal_conv1d_silu(x.data(), T, C, C, w.data(), K, st.data(), nullptr, y.data(), C);
            EXPECT_LT(max_diff(y, conv_naive(x, T, C, w, K, &st)), 1e-5) << "K=" << K << " T=" << T;
        }
    }
}

TEST(CausalConv, TapKMinus1IsTheCurrentToken) {
    // One channel, w = [0, 0, 0, 1]: the output is silu(x_t) itself.
    const std::vector<float> w = {0, 0, 0, 1}, x = {1, 2, 3};
    std::vector<float> y(3);
    ops::causal_conv1d_silu(x.data(), 3, 1, 1, w.data(), 4, nullptr, nullptr, y.data(), 1);
    for (int t = 0; t < 3; ++t) EXPECT_FLOAT_EQ(y[t], x[t] / (1 + std::exp(-x[t])));
    // w = [1, 0, 0, 0]: the token three steps back (zero padding for t < 3).
    const std::vector<float> w0 = {1, 0, 0, 0}, x4 = {1, 2, 3, 4};
    std::vector<float> y4(4);
    ops::causal_conv1d_silu(x4.data(), 4, 1, 1, w0.data(), 4, nullptr, nullptr, y4.data(), 1);
    EXPECT_EQ(y4[0], 0.f);
    EXPECT_EQ(y4[2], 0.f);
    EXPECT_FLOAT_EQ(y4[3], 1 / (1 + std::exp(-1.f)));
}

TEST(CausalConv, CarriedStateEqualsConcatenation) {
    std::mt19937 rng(3);
    const int K = 4;
    const int64_t C = 10, T = 23, stride = 13;  // strided rows: C of every 13 floats are used
    auto x = randn(T * stride, rng);
    auto w = randn(C * K, rng);
    std::vector<float> full(T * C);
    ops::causal_conv1d_silu(x.data(), T, C, stride, w.data(), K, nullptr, nullptr, full.data(), C);
    // Pieces of 1, 2, 5, 1, 14 tokens (some shorter than K-1), the state carried in place.
    std::vector<float> state((K - 1) * C, 0.f), pieces(T * C);
    int64_t t0 = 0;
    for (int64_t len : {1, 2, 5, 1, 14}) {
        ops::causal_conv1d_silu(x.data() + t0 * stride, len, C, stride, w.data(), K, state.data(),
                                state.data(), pieces.data() + t0 * C, C);
        t0 += len;
    }
    ASSERT_EQ(t0, T);
    EXPECT_EQ(pieces, full);  // same taps, same order: bitwise equal
    // The final state holds the last K-1 inputs.
    for (int r = 0; r < K - 1; ++r)
        for (int64_t c = 0; c < C; ++c) EXPECT_EQ(state[r * C + c], x[(T - (K - 1) + r) * stride + c]);
}

// ---------------------------------------------------------------- delta rule

struct DeltaInputs {
    int64_t T;
    int Hk, Hv, dk, dv;
    std::vector<float> q, k, v, beta, g, state0;
};

// q, k L2-normalised (q scaled by 1/sqrt(dk)); g log-uniform in [-12, -0.02] with per-head ranges: head 0
// slow (near -0.02), head 1 fast (near -12), the others the whole range.
DeltaInputs make_inputs(int64_t T, int Hk, int Hv, int dk, int dv, uint32_t seed) {
    std::mt19937 rng(seed);
    DeltaInputs in{T, Hk, Hv, dk, dv, {}, {}, {}, {}, {}, {}};
    in.q = randn(T * Hk * dk, rng);
    in.k = randn(T * Hk * dk, rng);
    in.v = randn(T * Hv * dv, rng, 2.f);
    ops::l2_norm(in.q.data(), T * Hk, dk, 1e-6f, 1.f / std::sqrt(float(dk)), in.q.data());
    ops::l2_norm(in.k.data(), T * Hk, dk, 1e-6f, 1.f, in.k.data());
    std::uniform_real_distribution<float> u01(0.f, 1.f);
    in.beta.resize(T * Hv);
    in.g.resize(T * Hv);
    const double lo = std::log(0.02), hi = std::log(12.0);
    for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < Hv; ++h) {
            in.beta[t * Hv + h] = u01(rng);
            double r = u01(rng);
            if (h == 0) r *= 0.1;
            if (h == 1) r = 0.9 + 0.1 * r;
            in.g[t * Hv + h] = static_cast<float>(-std::exp(lo + (hi - lo) * r));
        }
    in.state0 = randn(size_t(Hv) * dk * dv, rng, 0.5f);
    return in;
}

ops::DeltaRuleArgs args_of(const DeltaInputs& in, float* out) {
    ops::DeltaRuleArgs a;
    a.T = in.T;
    a.num_k_heads = in.Hk;
    a.num_v_heads = in.Hv;
    a.dk = in.dk;
    a.dv = in.dv;
    a.q = in.q.data();
    a.q_stride = in.Hk * in.dk;
    a.k = in.k.data();
    a.k_stride = in.Hk * in.dk;
    a.v = in.v.data();
    a.v_stride = in.Hv * in.dv;
    a.beta = in.beta.data();
    a.beta_stride = in.Hv;
    a.g = in.g.data();
    a.g_stride = in.Hv;
    a.out = out;
    a.out_stride = in.Hv * in.dv;
    return a;
}

// Straightforward double-precision recurrence. Returns outputs [T][Hv][dv]; `state` in/out [Hv][dk][dv].
std::vector<double> delta_naive(const DeltaInputs& in, std::vector<double>& state) {
    const int Hk = in.Hk, Hv = in.Hv, dk = in.dk, dv = in.dv;
    std::vector<double> out(in.T * Hv * dv);
    for (int h = 0; h < Hv; ++h) {
        const int kh = h / (Hv / Hk);
        double* S = state.data() + size_t(h) * dk * dv;
        for (int64_t t = 0; t < in.T; ++t) {
            const float* q = in.q.data() + (t * Hk + kh) * dk;
            const float* k = in.k.data() + (t * Hk + kh) * dk;
            const float* v = in.v.data() + (t * Hv + h) * dv;
            const double decay = std::exp(double(in.g[t * Hv + h])), beta = in.beta[t * Hv + h];
            for (int i = 0; i < dk * dv; ++i) S[i] *= decay;
            for (int j = 0; j < dv; ++j) {
                double pred = 0;
                for (int i = 0; i < dk; ++i) pred += S[i * dv + j] * k[i];
                const double u = beta * (v[j] - pred);
                for (int i = 0; i < dk; ++i) S[i * dv + j] += k[i] * u;
            }
            for (int j = 0; j < dv; ++j) {
                double o = 0;
                for (int i = 0; i < dk; ++i) o += S[i * dv + j] * q[i];
                out[(t * Hv + h) * dv + j] = o;
            }
        }
    }
    return out;
}

struct DeltaCase {
    int64_t T;
    bool with_state;
};

class DeltaRule : public ::testing::TestWithParam<DeltaCase> {};

TEST_P(DeltaRule, SerialMatchesDoubleAndChunkedMatchesSerial) {
    const auto [T, with_state] = GetParam();
    const int Hk = 2, Hv = 4, dk = 16, dv = 24;
    const DeltaInputs in = make_inputs(T, Hk, Hv, dk, dv, 100 + static_cast<uint32_t>(T) * 2 + with_state);
    const size_t n_state = size_t(Hv) * dk * dv;

    std::vector<float> o_serial(T * Hv * dv), s_serial(n_state);
    auto a = args_of(in, o_serial.data());
    a.initial_state = with_state ? in.state0.data() : nullptr;
    a.final_state = s_serial.data();
    ops::gated_delta_rule_serial(a);

    std::vector<double> s_naive(n_state, 0.0);
    if (with_state) std::copy(in.state0.begin(), in.state0.end(), s_naive.begin());
    const auto o_naive = delta_naive(in, s_naive);
    double o_scale = 0, s_scale = 0;
    for (double x : o_naive) o_scale = std::max(o_scale, std::fabs(x));
    for (double x : s_naive) s_scale = std::max(s_scale, std::fabs(x));

    const double e_serial = max_diff(o_serial, o_naive) / o_scale;
    const double es_serial = max_diff(s_serial, s_naive) / s_scale;
    EXPECT_LT(e_serial, 1e-5);
    EXPECT_LT(es_serial, 1e-5);

    for (int chunk : {64, 16}) {
        std::vector<float> o_chunk(T * Hv * dv), s_chunk(n_state);
        auto c = args_of(in, o_chunk.data());
        c.initial_state = with_state ? in.state0.data() : nullptr;
        c.final_state = s_chunk.data();
        ops::gated_delta_rule_chunked(c, chunk);
        const double e_chunk = max_diff(o_chunk, o_serial) / max_abs(o_serial);
        const double es_chunk = max_diff(s_chunk, s_serial) / max_abs(s_serial);
        const double e_chunk_naive = max_diff(o_chunk, o_naive) / o_scale;
        std::printf(
            "T=%4lld state=%d chunk=%2d  rel max err: serial-vs-f64 out %.2e state %.2e | "
            "chunked-vs-serial out %.2e state %.2e | chunked-vs-f64 out %.2e\n",
            static_cast<long long>(T), with_state, chunk, e_serial, es_serial, e_chunk, es_chunk,
            e_chunk_naive);
        EXPECT_LT(e_chunk, 1e-5) << "chunk " << chunk;
        EXPECT_LT(es_chunk, 1e-5) << "chunk " << chunk;
        EXPECT_LT(e_chunk_naive, 1e-5) << "chunk " << chunk;
    }
}

INSTANTIATE_TEST_SUITE_P(Lengths, DeltaRule,
                         ::testing::Values(DeltaCase{1, false}, DeltaCase{1, true}, DeltaCase{63, false},
                                           DeltaCase{63, true}, DeltaCase{64, false}, DeltaCase{64, true},
                                           DeltaCase{65, false}, DeltaCase{65, true}, DeltaCase{200, false},
                                           DeltaCase{200, true}),
                         [](const auto& info) {
                             return "T" + std::to_string(info.param.T) +
                                    (info.param.with_state ? "_state" : "");
                         });

TEST(DeltaRuleState, SplitRunsEqualOneRun) {
    // Running 200 tokens as 70 + 130 with the state carried gives the same outputs and final state.
    const DeltaInputs in = make_inputs(200, 2, 4, 16, 16, 7);
    const size_t n_state = size_t(4) * 16 * 16;
    for (bool chunked : {false, true}) {
        auto run = [&](const ops::DeltaRuleArgs& a) {
            chunked ? ops::gated_delta_rule_chunked(a) : ops::gated_delta_rule_serial(a);
        };
        std::vector<float> o_all(200 * 64), s_all(n_state);
        auto a = args_of(in, o_all.data());
        a.final_state = s_all.data();
        run(a);
        std::vector<float> o_split(200 * 64), s(n_state);
        auto b = args_of(in, o_split.data());
        b.T = 70;
        b.final_state = s.data();
        run(b);
        b.T = 130;
        b.q += 70 * b.q_stride;
        b.k += 70 * b.k_stride;
        b.v += 70 * b.v_stride;
        b.beta += 70 * b.beta_stride;
        b.g += 70 * b.g_stride;
        b.out += 70 * b.out_stride;
        b.initial_state = s.data();  // aliases final_state
        run(b);
        EXPECT_LT(max_diff(o_split, o_all) / max_abs(o_all), 1e-5) << "chunked=" << chunked;
        EXPECT_LT(max_diff(s, s_all) / max_abs(s_all), 1e-5) << "chunked=" << chunked;
        if (!chunked) {
            EXPECT_EQ(o_split, o_all);  // the serial form is order-identical
        }
    }
}

TEST(DeltaRuleState, ValueHeadUsesKeyHeadHDivR) {
    // Hk = 2, Hv = 4: value heads 0,1 read key head 0 and value heads 2,3 key head 1. Giving key head 1 zeros
    // (k = q = 0) zeroes the outputs of value heads 2 and 3 only.
    DeltaInputs in = make_inputs(10, 2, 4, 8, 8, 9);
    for (int64_t t = 0; t < 10; ++t)
        for (int i = 0; i < 8; ++i) in.q[(t * 2 + 1) * 8 + i] = in.k[(t * 2 + 1) * 8 + i] = 0.f;
    for (bool chunked : {false, true}) {
        std::vector<float> o(10 * 32);
        auto a = args_of(in, o.data());
        chunked ? ops::gated_delta_rule_chunked(a) : ops::gated_delta_rule_serial(a);
        double head_abs[4] = {0, 0, 0, 0};
        for (int64_t t = 0; t < 10; ++t)
            for (int h = 0; h < 4; ++h)
                for (int j = 0; j < 8; ++j) head_abs[h] += std::fabs(o[(t * 4 + h) * 8 + j]);
        EXPECT_GT(head_abs[0], 0);
        EXPECT_GT(head_abs[1], 0);
        EXPECT_EQ(head_abs[2], 0);
        EXPECT_EQ(head_abs[3], 0);
    }
}

TEST(DeltaRuleState, BadShapesThrow) {
    ops::DeltaRuleArgs a;
    a.T = 1;
    a.num_k_heads = 3;
    a.num_v_heads = 4;
    a.dk = a.dv = 4;
    EXPECT_THROW(ops::gated_delta_rule_serial(a), Error);
    EXPECT_THROW(ops::gated_delta_rule_chunked(a), Error);
}

// ---------------------------------------------------------------- RoPE

TEST(Rope, AxisSelectionInterleaved) {
    ops::RopeParams p;
    p.rotary_dim = 8;
    p.mrope_section = {2, 1, 1};
    // tiny-clef: frequencies 0..3 take T, H, W, T.
    EXPECT_EQ(ops::rope_axis(p, 0), 0);
    EXPECT_EQ(ops::rope_axis(p, 1), 1);
    EXPECT_EQ(ops::rope_axis(p, 2), 2);
    EXPECT_EQ(ops::rope_axis(p, 3), 0);
    // Qwen3.5-9B: rotary 64, [11, 11, 10] -> T {0,3,...,30}, H {1,...,31}, W {2,...,29}.
    p.rotary_dim = 64;
    p.mrope_section = {11, 11, 10};
    int count[3] = {0, 0, 0};
    for (int i = 0; i < 32; ++i) {
        const int ax = ops::rope_axis(p, i);
        ++count[ax];
        EXPECT_EQ(ax, i % 3 == 1 ? 1 : (i % 3 == 2 && i < 30) ? 2 : 0) << i;
    }
    EXPECT_EQ(count[0], 11);
    EXPECT_EQ(count[1], 11);
    EXPECT_EQ(count[2], 10);
    // Non-interleaved: contiguous sections.
    p.interleaved = false;
    EXPECT_EQ(ops::rope_axis(p, 10), 0);
    EXPECT_EQ(ops::rope_axis(p, 11), 1);
    EXPECT_EQ(ops::rope_axis(p, 22), 2);
    // Sections that do not sum to rotary_dim/2 are refused.
    p.mrope_section = {11, 11, 11};
    EXPECT_THROW(ops::rope_axis(p, 0), Error);
}

TEST(Rope, MatchesComplexRotation) {
    std::mt19937 rng(11);
    const int heads = 3, head_dim = 32, rotary_dim = 8, half = rotary_dim / 2;
    const int64_t T = 9, stride = heads * head_dim + 5;
    const double theta = 1e7;
    // Image-like positions: the three axes differ.
    std::vector<int32_t> pos(3 * T);
    for (int64_t t = 0; t < T; ++t) {
        pos[t] = static_cast<int32_t>(100 + t);
        pos[T + t] = static_cast<int32_t>(100 + t + 3 * (t % 4));
        pos[2 * T + t] = static_cast<int32_t>(1000 + 7 * t);
    }
    for (bool fp64 : {false, true}) {
        ops::RopeParams p;
        p.rotary_dim = rotary_dim;
        p.theta = theta;
        p.mrope_section = {2, 1, 1};
        p.fp64_angles = fp64;
        std::vector<float> cos(T * half), sin(T * half);
        ops::rope_tables(p, pos.data(), T, cos.data(), sin.data());
        const auto x = randn(T * stride, rng);
        auto y = x;
        ops::rope_apply(y.data(), T, heads, head_dim, stride, rotary_dim, cos.data(), sin.data());
        double err = 0;
        for (int64_t t = 0; t < T; ++t)
            for (int h = 0; h < heads; ++h) {
                const float* xh = x.data() + t * stride + h * head_dim;
                const float* yh = y.data() + t * stride + h * head_dim;
                for (int i = 0; i < half; ++i) {
                    const int axis = i == 1 ? 1 : i == 2 ? 2 : 0;  // T, H, W, T
                    const double ang = pos[axis * T + t] * std::pow(theta, -2.0 * i / rotary_dim);
                    const std::complex<double> z =
                        std::complex<double>(xh[i], xh[i + half]) * std::polar(1.0, ang);
                    err = std::max({err, std::fabs(yh[i] - z.real()), std::fabs(yh[i + half] - z.imag())});
                }
                for (int i = rotary_dim; i < head_dim; ++i) EXPECT_EQ(yh[i], xh[i]);
            }
        // Angles up to ~1000 rad: fp32 angles are off by up to ~ulp(1000) = 6e-5.
        EXPECT_LT(err, fp64 ? 1e-6 : 3e-4) << "fp64_angles=" << fp64;
        std::printf("rope fp64_angles=%d: max abs err vs complex rotation %.2e\n", fp64, err);
        // The padding between rows is untouched.
        for (int64_t t = 0; t < T; ++t)
            for (int64_t i = heads * head_dim; i < stride; ++i)
                EXPECT_EQ(y[t * stride + i], x[t * stride + i]);
    }
}

TEST(Rope, Fp32AnglesFollowHf) {
    // inv_freq in fp32: 1 / theta^(2i/d) with an fp32 exponent; the angle is one fp32 product.
    ops::RopeParams p;
    p.rotary_dim = 8;
    p.theta = 1e7;
    std::vector<int32_t> pos = {12345, 12345, 12345};
    float c[4], s[4];
    ops::rope_tables(p, pos.data(), 1, c, s);
    for (int i = 0; i < 4; ++i) {
        const float inv = 1.0f / std::pow(1e7f, float(2 * i) / 8.f);
        const float ang = 12345.f * inv;
        EXPECT_EQ(c[i], std::cos(ang));
        EXPECT_EQ(s[i], std::sin(ang));
    }
}

}  // namespace
}  // namespace clef
