// The Highway kernels of src/ops (ops/simd_kernels.h, ops/quant_blocks.h, ops/quant_kernels.h) against plain
// computations or their scalar references, on every target compiled in and usable here. Self-contained (ops,
// quant and util only): the aarch64 preset builds and runs this file under qemu-user as the portability proof
// of the kernel layer (scripts/test-aarch64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ops/attention_fast.h"
#include "ops/quant_blocks.h"
#include "ops/quant_kernels.h"
#include "ops/simd.h"
#include "ops/simd_kernels.h"
#include "quant/quant.h"
#include "util/half.h"

namespace clef {
namespace {

std::vector<float> normal(size_t n, std::mt19937& rng, float sd) {
    std::normal_distribution<float> d(0.f, sd);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// Runs body once per dispatch target, with the target forced.
template <class F>
void on_every_target(F body) {
    for (int64_t target : ops::simd_targets()) {
        SCOPED_TRACE(ops::simd_target_name(target));
        const ops::ScopedSimdTarget use(target);
        ASSERT_EQ(ops::simd_target(), ops::simd_target_name(target));
        body();
    }
}

TEST(Simd, TargetsAreListedBestFirst) {
    const std::vector<int64_t> t = ops::simd_targets();
    ASSERT_FALSE(t.empty());
    std::printf("  dispatch targets:");
    for (int64_t x : t) std::printf(" %s", ops::simd_target_name(x).c_str());
    std::printf(" (now %s)\n", ops::simd_target().c_str());
    EXPECT_EQ(ops::simd_target(), ops::simd_target_name(t.front()));
}

TEST(SmallGemm, MatchesNaiveOnEveryTarget) {
    std::mt19937 rng(11);
    on_every_target([&] {
        for (int64_t m : {1, 3, 4, 9, 64})
            for (int64_t n : {1, 15, 16, 17, 64, 100, 128})
                for (int64_t k : {1, 7, 64}) {
                    const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
                    auto a = normal(m * lda, rng, 1.f), b = normal(k * ldb, rng, 1.f),
                         c = normal(m * ldc, rng, 1.f);
                    auto want = c;
                    for (int64_t i = 0; i < m; ++i)
                        for (int64_t j = 0; j < n; ++j) {
                            double acc = 0;
                            for (int64_t t = 0; t < k; ++t) acc += double(a[i * lda + t]) * b[t * ldb + j];
                            want[i * ldc + j] = static_cast<float>(c[i * ldc + j] - 0.5 * acc);
                        }
                    ops::simd::small_gemm_acc(m, n, k, -0.5f, a.data(), lda, b.data(), ldb, c.data(), ldc);
                    for (int64_t i = 0; i < m; ++i)
                        for (int64_t j = 0; j < ldc; ++j)  // the padding columns are untouched
                            ASSERT_NEAR(c[i * ldc + j], want[i * ldc + j], 1e-5 * (1 + std::sqrt(double(k))))
                                << m << " " << n << " " << k;
                }
    });
}

// Causal attention (GQA, a query chunk after cached keys, K/V in fp32 and in bf16) against a double-precision
// softmax on every target: ops/attention_kernels.cpp's tiles, masks and online softmax.
TEST(AttentionFast, MatchesDoubleSoftmaxOnEveryTarget) {
    std::mt19937 rng(17);
    const int64_t L = 90, lq = 70;
    const int hq = 6, hkv = 2, dh = 40;  // 40: whole vectors and a remainder on every target
    const int64_t qd = int64_t(hq) * dh, kd = int64_t(hkv) * dh;
    const auto q = normal(L * qd, rng, 1.f);
    std::vector<uint16_t> kb(L * kd), vb(L * kd);
    std::vector<float> k(L * kd), v(L * kd);
    for (int64_t i = 0; i < L * kd; ++i) {
        kb[i] = f32_to_bf16(normal(1, rng, 1.f)[0]), k[i] = bf16_to_f32(kb[i]);
        vb[i] = f32_to_bf16(normal(1, rng, 1.f)[0]), v[i] = bf16_to_f32(vb[i]);
    }
    const double scale = 1.0 / std::sqrt(double(dh));
    std::vector<double> want(lq * qd);
    for (int64_t i = 0; i < lq; ++i)
        for (int h = 0; h < hq; ++h) {
            const int g = h / (hq / hkv);
            const int64_t pos = L - lq + i;
            std::vector<double> s(pos + 1);
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j <= pos; ++j) {
                double acc = 0;
                for (int d = 0; d < dh; ++d)
                    acc += double(q[(L - lq + i) * qd + h * dh + d]) * k[j * kd + g * dh + d];
                s[j] = acc * scale, mx = std::max(mx, s[j]);
            }
            for (double& x : s) sum += (x = std::exp(x - mx));
            for (int d = 0; d < dh; ++d) {
                double acc = 0;
                for (int64_t j = 0; j <= pos; ++j) acc += s[j] * v[j * kd + g * dh + d];
                want[i * qd + h * dh + d] = acc / sum;
            }
        }
    on_every_target([&] {
        std::vector<float> a(lq * qd), b(lq * qd);
        const float* qc = q.data() + (L - lq) * qd;
        ops::attention_fast(qc, qd, k.data(), kd, v.data(), kd, lq, L, hq, hkv, dh, float(scale), true,
                            a.data(), qd);
        ops::attention_fast(qc, qd, kb.data(), kd, vb.data(), kd, lq, L, hq, hkv, dh, float(scale), true,
                            b.data(), qd);
        for (int64_t i = 0; i < lq * qd; ++i) {
            ASSERT_NEAR(a[i], want[i], 2e-5) << i;
            ASSERT_EQ(a[i], b[i]) << i;
        }
    });
}

// One panel [k][32] of each weight type times up to 6 rows, every column count, against a double sum.
TEST(PanelBlock, MatchesDoubleSumOnEveryTarget) {
    std::mt19937 rng(5);
    const int64_t k = 77;
    const auto x = normal(6 * k, rng, 1.f);
    const auto wf = normal(k * ops::simd::kPanelCols, rng, 0.1f);
    std::vector<uint16_t> wb(wf.size()), wh(wf.size());
    std::vector<float> vb(wf.size()), vh(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) {
        wb[i] = f32_to_bf16(wf[i]);
        vb[i] = bf16_to_f32(wb[i]);
        wh[i] = f32_to_f16(wf[i]);
        vh[i] = f16_to_f32(wh[i]);
    }
    struct Case {
        ops::simd::PanelType type;
        const void* panel;
        const std::vector<float>* values;
    };
    const Case cases[] = {{ops::simd::PanelType::F32, wf.data(), &wf},
                          {ops::simd::PanelType::BF16, wb.data(), &vb},
                          {ops::simd::PanelType::F16, wh.data(), &vh}};
    on_every_target([&] {
        for (const Case& c : cases)
            for (int rows = 1; rows <= ops::simd::kPanelRows; ++rows)
                for (int ncols : {1, 5, 8, 16, 31, 32}) {
                    const int64_t ldy = 40;
                    std::vector<float> y(rows * ldy, -7.f);
                    ops::simd::panel_block(x.data(), k, c.panel, c.type, rows, ncols, y.data(), ldy);
                    for (int i = 0; i < rows; ++i)
                        for (int j = 0; j < ldy; ++j) {
                            if (j >= ncols) {
                                ASSERT_EQ(y[i * ldy + j], -7.f) << "wrote past ncols";
                                continue;
                            }
                            double want = 0, mag = 0;
                            for (int64_t t = 0; t < k; ++t) {
                                const double p =
                                    double(x[i * k + t]) * (*c.values)[t * ops::simd::kPanelCols + j];
                                want += p;
                                mag += std::fabs(p);
                            }
                            ASSERT_NEAR(y[i * ldy + j], want, 1e-6 * mag + 1e-7)
                                << int(c.type) << " rows " << rows << " col " << j;
                        }
                }
    });
}

TEST(Bf16ToF32, WidensExactlyOnEveryTarget) {
    std::vector<uint16_t> in(67);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i * 977u);
    on_every_target([&] {
        std::vector<float> out(in.size());
        ops::simd::bf16_to_f32(in.data(), out.data(), static_cast<int64_t>(in.size()));
        for (size_t i = 0; i < in.size(); ++i) {
            const uint32_t want = static_cast<uint32_t>(in[i]) << 16;
            uint32_t got;
            std::memcpy(&got, &out[i], 4);
            ASSERT_EQ(got, want) << i;
        }
    });
}

// The vector dequantisers against quant's scalar decoder, bit for bit, on random blocks with finite fp16
// scales (tests/test_quant.cpp adds infinities, NaN and subnormals on the native target).
TEST(Dequant, BlocksMatchTheScalarDecoderOnEveryTarget) {
    std::mt19937 rng(29);
    const struct {
        GgmlType type;
        ops::DequantType dq;
        std::vector<int> fp16_fields;  // byte offsets of the fp16 scales in a block
    } types[] = {{GgmlType::Q8_0, ops::DequantType::Q8_0, {0}},
                 {GgmlType::Q4_K, ops::DequantType::Q4_K, {0, 2}},
                 {GgmlType::Q5_K, ops::DequantType::Q5_K, {0, 2}},
                 {GgmlType::Q6_K, ops::DequantType::Q6_K, {208}},
                 {GgmlType::Q2_K, ops::DequantType::Q2_K, {80, 82}},
                 {GgmlType::Q3_K, ops::DequantType::Q3_K, {108}},
                 {GgmlType::IQ4_NL, ops::DequantType::IQ4_NL, {0}},
                 {GgmlType::IQ4_XS, ops::DequantType::IQ4_XS, {0}},
                 {GgmlType::IQ2_XXS, ops::DequantType::IQ2_XXS, {0}},
                 {GgmlType::IQ2_XS, ops::DequantType::IQ2_XS, {0}},
                 {GgmlType::IQ2_S, ops::DequantType::IQ2_S, {0}},
                 {GgmlType::IQ3_XXS, ops::DequantType::IQ3_XXS, {0}},
                 {GgmlType::IQ3_S, ops::DequantType::IQ3_S, {0}},
                 {GgmlType::IQ1_S, ops::DequantType::IQ1_S, {0}},
                 {GgmlType::IQ1_M, ops::DequantType::IQ1_M, {}}};  // d in the scales' top nibbles
    for (const auto& t : types) {
        const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(t.type));
        SCOPED_TRACE(tt.name);
        const int nb = 24;
        std::vector<uint8_t> bytes(nb * tt.type_size);
        for (auto& b : bytes) b = static_cast<uint8_t>(rng());
        for (int b = 0; b < nb; ++b)
            for (int off : t.fp16_fields) {
                const uint16_t h = f32_to_f16(std::ldexp(float(rng() % 2000) - 1000.f, int(rng() % 20) - 20));
                std::memcpy(&bytes[b * tt.type_size + off], &h, 2);
            }
        const int64_t n = nb * static_cast<int64_t>(tt.block_size);
        std::vector<float> want(n);
        dequantize_ref(t.type, bytes.data(), want.data(), n);
        on_every_target([&] {
            std::vector<float> got(n);
            std::vector<uint16_t> got16(n);
            ops::dequant_blocks(t.dq, bytes.data(), nb, got.data());
            ops::dequant_blocks(t.dq, bytes.data(), nb, got16.data());
            for (int64_t i = 0; i < n; ++i) {
                ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << i << ": " << got[i] << " vs " << want[i];
                ASSERT_EQ(got16[i], f32_to_bf16(want[i])) << i;
            }
        });
    }
}

uint32_t float_bits(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
}

// n values in 32-value sub-blocks of the kinds a tensor holds: scales from 1e-7 to 1e5, heavy tails,
// one-signed, sparse, constant, subnormal, values on the rounding ties of the levels, huge (sums overflow),
// offset; then NaN, infinities, signed zeros and extreme finite values here and there.
std::vector<float> search_inputs(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(n);
    for (size_t b = 0; b < n / 32; ++b) {
        float* v = x.data() + 32 * b;
        const float scale = std::pow(10.f, static_cast<float>(rng() % 13) - 7.f);
        for (int i = 0; i < 32; ++i) {
            const float g = nd(rng);
            switch (b % 10) {
                case 0:
                    v[i] = scale * g;
                    break;
                case 1:
                    v[i] = scale * g * g * g;
                    break;
                case 2:
                    v[i] = scale * (std::fabs(g) + 0.5f);
                    break;
                case 3:
                    v[i] = -scale * std::fabs(g);
                    break;
                case 4:
                    v[i] = i == static_cast<int>(b % 32) ? scale * g : 0.f;
                    break;
                case 5:
                    v[i] = scale;
                    break;
                case 6:
                    v[i] = g * 1e-39f;
                    break;
                case 7:
                    v[i] = std::nearbyint(g * 8.f) * 0.5f * scale;
                    break;
                case 8:
                    v[i] = g * 1e37f;
                    break;
                default:
                    v[i] = scale * (g + 3.f);
                    break;
            }
        }
    }
    const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, -0.f, 3.4e38f, -3.4e38f, 1e-45f};
    for (size_t k = 0; k < n / 64; ++k) x[rng() % n] = specials[k % 8];
    return x;
}

// The K-quant scale searches against their scalar reference, bit for bit, on every target (from an odd
// address: the kernels must not assume alignment).
TEST(QuantSearch, MatchesTheScalarReferenceOnEveryTarget) {
    std::mt19937 rng(37);
    const size_t n = 32 * 2000;
    std::vector<float> storage(n + 1);
    const std::vector<float> x = search_inputs(n, rng);
    std::copy(x.begin(), x.end(), storage.begin() + 1);
    const float* p = storage.data() + 1;
    on_every_target([&] {
        for (size_t b = 0; b < n; b += 32) {
            for (int nmax : {15, 31}) {
                float s, m, s_ref, m_ref;
                ops::fit_scale_min(p + b, nmax, s, m);
                ops::fit_scale_min_ref(p + b, nmax, s_ref, m_ref);
                ASSERT_EQ(float_bits(s), float_bits(s_ref)) << "sub-block " << b / 32 << " nmax " << nmax;
                ASSERT_EQ(float_bits(m), float_bits(m_ref)) << "sub-block " << b / 32 << " nmax " << nmax;
            }
            for (size_t h : {b, b + 16})
                ASSERT_EQ(float_bits(ops::fit_scale_sym(p + h)), float_bits(ops::fit_scale_sym_ref(p + h)))
                    << "16 values at " << h;
        }
    });
}

// The K quantisers write the same bytes with the vector searches on every target as with the scalar ones.
TEST(QuantSearch, QuantisersWriteTheSameBytesOnEveryTarget) {
    std::mt19937 rng(41);
    const int64_t n = 256 * 128;
    const std::vector<float> x = search_inputs(static_cast<size_t>(n), rng);
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
        const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(t));
        SCOPED_TRACE(tt.name);
        std::vector<uint8_t> want(ggml_row_bytes(tt, n)), got(want.size());
        set_quant_simd(false);
        quantize_row(t, x.data(), want.data(), n);
        set_quant_simd(true);
        on_every_target([&] {
            quantize_row(t, x.data(), got.data(), n);
            for (size_t i = 0; i < got.size(); ++i)
                ASSERT_EQ(got[i], want[i]) << "byte " << i << " (block " << i / tt.type_size << ")";
        });
    }
}

}  // namespace
}  // namespace clef
