// attention_fast (key blocks, online softmax) against the scalar oracle ops::attention: causal and full, GQA,
// strided rows, head dims 32 (tiny) and 256 (flash), lengths around the block sizes; a query chunk after a KV
// cache against the matching rows of the full causal computation.
// Bounds: Exact 1e-5 of max |v| (fp32 reordering only); BF16 2e-2 of max |v| (q, k, p, v rounded to bf16).
// K/V stored as bf16 equal the fp32 kernel on the widened values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "ops/attention_fast.h"
#include "ops/basic.h"
#include "util/error.h"
#include "util/half.h"

namespace clef {
namespace {

using ops::Precision;

struct Case {
    int64_t L;
    int hq, hkv, dh;
    bool causal;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
    return os << "L" << c.L << "_hq" << c.hq << "_hkv" << c.hkv << "_dh" << c.dh
              << (c.causal ? "_causal" : "_full");
}

class AttentionFast : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionFast, MatchesReference) {
    const Case c = GetParam();
    std::mt19937 rng(static_cast<uint32_t>(c.L * 31 + c.dh));
    std::normal_distribution<float> nd(0.f, 1.f);
    // Packed like a fused projection: row = [q heads | k heads | v heads | 3 padding floats].
    const int64_t qd = int64_t(c.hq) * c.dh, kd = int64_t(c.hkv) * c.dh, stride = qd + 2 * kd + 3;
    std::vector<float> buf(c.L * stride);
    for (float& x : buf) x = 2.f * nd(rng);
    const float* q = buf.data();
    const float* k = q + qd;
    const float* v = k + kd;
    const int64_t os = qd + 5;
    std::vector<float> ref(c.L * os, 0.f), out(c.L * os, 0.f);
    const float scale = 1.f / std::sqrt(float(c.dh));
    ops::attention(q, stride, k, stride, v, stride, c.L, c.L, c.hq, c.hkv, c.dh, scale, c.causal, ref.data(),
                   os);
    double vmax = 0;
    for (int64_t i = 0; i < c.L; ++i)
        for (int64_t d = 0; d < kd; ++d) vmax = std::max(vmax, double(std::fabs(v[i * stride + d])));
    auto err = [&] {
        double e = 0;
        for (int64_t i = 0; i < c.L; ++i)
            for (int64_t d = 0; d < qd; ++d)
                e = std::max(e, double(std::fabs(out[i * os + d] - ref[i * os + d])));
        return e / vmax;
    };
    ops::attention_fast(q, stride, k, stride, v, stride, c.L, c.L, c.hq, c.hkv, c.dh, scale, c.causal,
                        out.data(), os, Precision::Exact);
    EXPECT_LT(err(), 1e-5);
    ops::attention_fast(q, stride, k, stride, v, stride, c.L, c.L, c.hq, c.hkv, c.dh, scale, c.causal,
                        out.data(), os, Precision::BF16);
    const double eb = err();
    EXPECT_LT(eb, 2e-2);
    EXPECT_GT(eb, 1e-5) << "BF16 mode should round its operands";
    // The padding between rows is untouched.
    for (int64_t i = 0; i < c.L; ++i)
        for (int64_t d = qd; d < os; ++d) EXPECT_EQ(out[i * os + d], 0.f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionFast,
                         ::testing::Values(Case{1, 4, 2, 32, true}, Case{31, 4, 2, 32, true},
                                           Case{33, 4, 2, 32, true}, Case{130, 4, 2, 32, true},
                                           Case{130, 4, 2, 32, false}, Case{200, 4, 1, 256, true},
                                           Case{65, 2, 2, 256, false}, Case{300, 8, 2, 256, true},
                                           Case{100, 6, 1, 256, true}, Case{70, 4, 2, 36, true},
                                           Case{70, 4, 2, 40, false}, Case{129, 48, 4, 32, true}));

TEST(AttentionFast, ChunkAfterCache) {
    const int64_t L = 150, lq = 37;
    const int hq = 4, hkv = 2, dh = 32;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(L * hq * dh), k(L * hkv * dh), v(L * hkv * dh);
    for (auto* vec : {&q, &k, &v})
        for (float& x : *vec) x = nd(rng);
    std::vector<float> ref(L * hq * dh), out(lq * hq * dh);
    ops::attention(q.data(), hq * dh, k.data(), hkv * dh, v.data(), hkv * dh, L, L, hq, hkv, dh, 0.2f, true,
                   ref.data(), hq * dh);
    ops::attention_fast(q.data() + (L - lq) * hq * dh, hq * dh, k.data(), hkv * dh, v.data(), hkv * dh, lq, L,
                        hq, hkv, dh, 0.2f, true, out.data(), hq * dh);
    for (int64_t i = 0; i < lq * hq * dh; ++i) EXPECT_NEAR(out[i], ref[(L - lq) * hq * dh + i], 1e-5);
}

// K/V stored as bf16 bits (BackboneOptions::kv_bf16): the same as the fp32 kernel and the oracle on the
// widened values, for GQA groups of 1, 4 and 6 heads and a chunk after a cache.
TEST(AttentionFast, Bf16KvStorage) {
    for (const auto& [L, lq, hq, hkv, dh] :
         {std::tuple{150, 150, 4, 4, 32}, std::tuple{300, 77, 16, 4, 256}, std::tuple{97, 97, 6, 1, 64}}) {
        std::mt19937 rng(static_cast<uint32_t>(L + hq));
        std::normal_distribution<float> nd(0.f, 1.f);
        const int64_t qd = int64_t(hq) * dh, kd = int64_t(hkv) * dh;
        std::vector<float> q(L * qd), kw(L * kd), vw(L * kd);
        std::vector<uint16_t> kb(L * kd), vb(L * kd);
        for (float& x : q) x = nd(rng);
        for (int64_t i = 0; i < L * kd; ++i) {
            kb[i] = f32_to_bf16(nd(rng)), kw[i] = bf16_to_f32(kb[i]);
            vb[i] = f32_to_bf16(nd(rng)), vw[i] = bf16_to_f32(vb[i]);
        }
        std::vector<float> ref(L * qd), got(lq * qd), f32(lq * qd);
        const float scale = 1.f / std::sqrt(float(dh));
        ops::attention(q.data(), qd, kw.data(), kd, vw.data(), kd, L, L, hq, hkv, dh, scale, true, ref.data(),
                       qd);
        const float* qc = q.data() + (L - lq) * qd;
        ops::attention_fast(qc, qd, kb.data(), kd, vb.data(), kd, lq, L, hq, hkv, dh, scale, true, got.data(),
                            qd);
        ops::attention_fast(qc, qd, kw.data(), kd, vw.data(), kd, lq, L, hq, hkv, dh, scale, true, f32.data(),
                            qd);
        for (int64_t i = 0; i < lq * qd; ++i) {
            ASSERT_EQ(got[i], f32[i]) << i;  // widening bf16 is exact: the same arithmetic
            ASSERT_NEAR(got[i], ref[(L - lq) * qd + i], 1e-5) << i;
        }
    }
}

TEST(AttentionFast, BadShapes) {
    float x = 0;
    EXPECT_THROW(ops::attention_fast(&x, 1, &x, 1, &x, 1, 0, 1, 1, 1, 1, 1.f, true, &x, 1), Error);
    EXPECT_THROW(ops::attention_fast(&x, 1, &x, 1, &x, 1, 2, 1, 1, 1, 1, 1.f, true, &x, 1), Error);
    EXPECT_THROW(ops::attention_fast(&x, 1, &x, 1, &x, 1, 1, 1, 3, 2, 1, 1.f, true, &x, 1), Error);
    EXPECT_THROW(ops::attention_fast(nullptr, 1, &x, 1, &x, 1, 1, 1, 1, 1, 1, 1.f, true, &x, 1), Error);
    uint16_t b = 0;
    EXPECT_THROW(ops::attention_fast(&x, 1, &b, 1, &b, 1, 2, 1, 1, 1, 1, 1.f, true, &x, 1), Error);
}

}  // namespace
}  // namespace clef

namespace clef {
namespace {

// The joint head's factored memory attention against its oracle: the memory rows projected to keys (with a
// key bias, which cancels in the softmax) and values, then ops::attention. Both reorder sums of w products in
// fp32 (~w·2^-24 relative each, w <= 64 here: under 4e-6); the bound 1e-4 of max |V| leaves a margin.
TEST(AttentionFast, MemoryAttentionMatchesProjectedKeysAndValues) {
    struct Shape {
        int64_t lq, T, w;
        int heads;
    };
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (const Shape& s :
         {Shape{1, 1, 24, 1}, Shape{3, 5, 24, 2}, Shape{7, 130, 64, 4}, Shape{2, 37, 64, 2}}) {
        const int64_t w = s.w, dh = w / s.heads;
        auto fill = [&](int64_t n, float scale) {
            std::vector<float> v(static_cast<size_t>(n));
            for (float& x : v) x = scale * nd(rng);
            return v;
        };
        const float ws = 1.f / std::sqrt(static_cast<float>(w));
        const std::vector<float> q = fill(s.lq * w, 1.f), m = fill(s.T * w, 1.f), wk = fill(w * w, ws),
                                 wv = fill(w * w, ws), bk = fill(w, 1.f), bv = fill(w, 1.f);
        std::vector<float> K(static_cast<size_t>(s.T * w)), V(K.size()), ref(static_cast<size_t>(s.lq * w)),
            out(ref.size());
        ops::linear(m.data(), s.T, w, wk.data(), w, bk.data(), K.data());
        ops::linear(m.data(), s.T, w, wv.data(), w, bv.data(), V.data());
        ops::attention(q.data(), w, K.data(), w, V.data(), w, s.lq, s.T, s.heads, s.heads,
                       static_cast<int>(dh), 1.f / std::sqrt(static_cast<float>(dh)), false, ref.data(), w);
        ops::memory_attention_fast(q.data(), s.lq, s.heads, w, wk.data(), wv.data(), bv.data(), m.data(), s.T,
                                   out.data());
        float vmax = 0;
        for (float x : V) vmax = std::max(vmax, std::fabs(x));
        for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], ref[i], 1e-4 * vmax)
                << "lq " << s.lq << " T " << s.T << " w " << w << " at " << i;
    }
}

}  // namespace
}  // namespace clef
