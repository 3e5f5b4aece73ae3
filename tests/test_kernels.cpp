// The Highway kernels of src/ops (ops/simd_kernels.h, ops/quant_blocks.h, ops/quant_kernels.h) against plain
// computations or their scalar references, on every target compiled in and usable here. Self-contained (ops,
// quant and util only): the aarch64 preset builds and runs this file under qemu-user as the portability proof
// of the kernel layer (scripts/test-aarch64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/attention_fast.h"
#include "ops/cpu.h"
#include "ops/int8_gemm.h"
#include "ops/int8_kernels.h"
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

// ------------------------------------------------------------------ int8 (ops/int8_gemm.h)

// The thread counts the layers run with: one only under qemu-user (the aarch64 proof, CLEF_ONE_THREAD), where
// OpenMP teams of more than one thread do not finish (CMakeLists.txt).
#ifdef CLEF_ONE_THREAD
constexpr int kThreadCounts[] = {1};
#else
constexpr int kThreadCounts[] = {1, 2};
#endif

using ops::i8::kI8Block;
using ops::i8::kI8Cols;
using ops::i8::kI8PanelBlockBytes;

// Rows with a wide dynamic range (a few outliers), zero blocks and exact ties at half a level.
std::vector<float> int8_rows(int64_t m, int64_t k, std::mt19937& rng) {
    std::vector<float> x = normal(static_cast<size_t>(m * k), rng, 1.f);
    for (size_t i = 0; i < x.size(); i += 37) x[i] *= 40.f;
    if (k >= kI8Block) std::fill(x.begin(), x.begin() + kI8Block, 0.f);
    if (k > 96) {  // row 0's block 64..95: scale 1, two ties
        std::fill(x.begin() + 64, x.begin() + 96, 0.25f);
        x[65] = 127.f, x[66] = 0.5f, x[67] = -2.5f;
    }
    return x;
}

TEST(Int8Quantize, LevelsWithinHalfAStepAndSameBitsOnEveryTarget) {
    std::mt19937 rng(41);
    for (int64_t k : {1, 5, 31, 32, 33, 100, 256, 1000}) {
        SCOPED_TRACE(k);
        const std::vector<float> x = int8_rows(1, k, rng);
        const int64_t nb = (k + kI8Block - 1) / kI8Block;
        std::vector<int8_t> want(static_cast<size_t>(nb * kI8Block)), got(want.size());
        std::vector<float> ws(static_cast<size_t>(nb)), gs(ws.size());
        ops::i8::quantize_row_ref(x.data(), k, want.data(), ws.data());
        for (int64_t b = 0; b < nb; ++b) {
            float amax = 0;
            for (int64_t t = b * kI8Block; t < std::min(k, (b + 1) * kI8Block); ++t)
                amax = std::max(amax, std::fabs(x[t]));
            ASSERT_EQ(ws[b], amax / 127.0f);
            for (int64_t t = b * kI8Block; t < (b + 1) * kI8Block; ++t) {
                const double v = t < k ? x[t] : 0.0;
                ASSERT_LE(std::abs(want[t]), 127);
                // Half a level, and the rounding of x * (1 / s) in fp32 (a few ulps of 127).
                ASSERT_LE(std::fabs(v - double(ws[b]) * want[t]), double(ws[b]) * (0.5 + 1e-4)) << t;
                if (amax > 0 && std::fabs(v) == amax) {
                    ASSERT_EQ(std::abs(want[t]), 127);
                }
            }
        }
        if (k > 96) {
            EXPECT_EQ(ws[2], 1.0f);
            EXPECT_EQ(want[66], 0) << "0.5 rounds to the even level";
            EXPECT_EQ(want[67], -2) << "-2.5 rounds to the even level";
        }
        // The activation blocks: quantize_row's levels and scale, then the word of the panels' kind.
        for (bool levels : {false, true}) {
            std::vector<unsigned char> acts(static_cast<size_t>(nb * ops::i8::kI8ActBytes)),
                gacts(acts.size());
            ops::i8::quantize_acts_ref(x.data(), k, acts.data(), levels);
            for (int64_t b = 0; b < nb; ++b) {
                const unsigned char* ab = acts.data() + b * ops::i8::kI8ActBytes;
                ASSERT_EQ(std::memcmp(ab, want.data() + b * kI8Block, kI8Block), 0) << "block " << b;
                float s;
                std::memcpy(&s, ab + kI8Block, 4);
                ASSERT_EQ(s, ws[b]);
                int32_t sum = 0;
                for (int t = 0; t < kI8Block; ++t) sum += want[b * kI8Block + t];
                if (levels) {
                    float ssum;
                    std::memcpy(&ssum, ab + kI8Block + 4, 4);
                    ASSERT_EQ(ssum, ws[b] * static_cast<float>(sum));
                } else {
                    int32_t bias;
                    std::memcpy(&bias, ab + kI8Block + 4, 4);
                    ASSERT_EQ(bias, -ops::i8::kI8Bias * sum);
                }
            }
            on_every_target([&] {
                ops::i8::quantize_acts(x.data(), k, gacts.data(), levels);
                EXPECT_EQ(gacts, acts);
            });
        }
        on_every_target([&] {
            ops::i8::quantize_row(x.data(), k, got.data(), gs.data());
            EXPECT_EQ(got, want);
            EXPECT_EQ(gs, ws);
        });
    }
}

// The extension the panel kernels take on the dispatched target (ops/int8_kernels.h), computed here from the
// CPU's features under CLEF_MAX_ISA: on x86 512-bit VNNI on the AVX-512 targets, 256-bit on AVX2.
std::string expected_int8_extension() {
    const ops::CpuFeatures& f = ops::cpu_features();
#if defined(__x86_64__)
    const std::string t = ops::simd_target();
    if (t.rfind("AVX3", 0) == 0) return f.avx512_vnni ? "avx512-vnni" : "";
    if (t == "AVX2") return f.avx_vnni ? "avx-vnni" : "";
    return "";
#elif defined(__aarch64__)
    return f.asimd_dotprod ? "dotprod" : "";
#else
    return "";
#endif
}

// The panel kernels' extension is the one the run expects where it says (CLEF_TEST_INT8_EXTENSION, "none" for
// none, on the default target: scripts/test-aarch64's runs under qemu-user with and without FEAT_DotProd, the
// x86 reruns under CLEF_MAX_ISA: tests/CMakeLists.txt), so the tests below are known to have taken that path,
// and on every target the one its features give. The tests below check that every call took it.
TEST(Int8Panel, KernelExtensionIsTheExpectedOne) {
    const std::string ext = ops::i8::kernel_extension();
    std::printf("  int8 kernel extension: %s on %s (cpu: %s)\n", ext.empty() ? "none" : ext.c_str(),
                ops::simd_target().c_str(), ops::cpu_features_string().c_str());
    if (const char* want = std::getenv("CLEF_TEST_INT8_EXTENSION")) {
        EXPECT_EQ(ext.empty() ? "none" : ext, want);
    }
    on_every_target([&] { EXPECT_EQ(ops::i8::kernel_extension(), expected_int8_extension()); });
#if defined(__x86_64__)
    const ops::CpuFeatures& f = ops::cpu_features();
    if (!f.avx2) {
        EXPECT_FALSE(f.avx_vnni || f.avx512_vnni) << "VNNI without AVX2 (a cap below avx2)";
    }
#endif
}

// npanels panels of kI8Cols weight rows each ([ncols][k] of w, the rest zero) quantised as Int8Linear packs
// them (levels + kI8Bias), panel_stride apart (more than a panel: the kernels must step by it).
struct Int8Panels {
    std::vector<unsigned char> bytes;
    int64_t stride = 0;
};
Int8Panels int8_panels(const std::vector<float>& w, int ncols, int64_t k) {
    const int64_t nb = (k + kI8Block - 1) / kI8Block;
    const int npanels = (ncols + kI8Cols - 1) / kI8Cols;
    Int8Panels p;
    p.stride = nb * kI8PanelBlockBytes + 64;
    p.bytes.assign(static_cast<size_t>(npanels * p.stride), 0xee);
    std::vector<int8_t> q(static_cast<size_t>(nb * kI8Block));
    std::vector<float> s(static_cast<size_t>(nb));
    for (int c = 0; c < npanels * kI8Cols; ++c) {
        std::fill(q.begin(), q.end(), 0);
        std::fill(s.begin(), s.end(), 0.f);
        if (c < ncols) ops::i8::quantize_row_ref(w.data() + c * k, k, q.data(), s.data());
        unsigned char* panel = p.bytes.data() + (c / kI8Cols) * p.stride;
        for (int64_t b = 0; b < nb; ++b) {
            for (int t = 0; t < kI8Block; ++t)
                panel[b * kI8PanelBlockBytes + (t / 4) * kI8Cols * 4 + (c % kI8Cols) * 4 + t % 4] =
                    static_cast<unsigned char>(q[b * kI8Block + t] + ops::i8::kI8Bias);
            std::memcpy(panel + b * kI8PanelBlockBytes + kI8Block * kI8Cols + (c % kI8Cols) * 4, &s[b], 4);
        }
    }
    return p;
}

// Quantised activation rows (ops::i8::I8Rows) of the given levels [rows][nb][kI8Block] and scales [rows][nb],
// the last word of each block for signed panels (levels false) or level panels, rows ld = one block more than
// they need apart (the kernels must step by the stride they are given).
struct Int8Acts {
    std::vector<unsigned char> p;
    int64_t ld = 0;
    ops::i8::I8Rows rows(int n) const {
        ops::i8::I8Rows r;
        r.p = p.data();
        r.ld = ld;
        r.rows = n;
        return r;
    }
};
Int8Acts int8_acts(const std::vector<int8_t>& levels, const std::vector<float>& scales, int rows, int64_t nb,
                   bool level_panels) {
    using ops::i8::kI8ActBytes;
    Int8Acts a;
    a.ld = (nb + 1) * kI8ActBytes;
    a.p.assign(static_cast<size_t>(rows * a.ld), 0xee);
    for (int r = 0; r < rows; ++r)
        for (int64_t b = 0; b < nb; ++b) {
            unsigned char* ab = a.p.data() + r * a.ld + b * kI8ActBytes;
            const float s = scales[r * nb + b];
            int32_t sum = 0;
            for (int t = 0; t < kI8Block; ++t) {
                const int8_t v = levels[(r * nb + b) * kI8Block + t];
                ab[t] = static_cast<unsigned char>(v);
                sum += v;
            }
            std::memcpy(ab + kI8Block, &s, 4);
            const float ssum = s * static_cast<float>(sum);
            const int32_t bias = -ops::i8::kI8Bias * sum;
            if (level_panels)
                std::memcpy(ab + kI8Block + 4, &ssum, 4);
            else
                std::memcpy(ab + kI8Block + 4, &bias, 4);
        }
    return a;
}

// A tile over the panels into y (ldy apart), y starting as `init`.
ops::i8::I8Tile int8_tile(const unsigned char* panel, int64_t stride, int64_t nb, int ncols, float* y,
                          int64_t ldy, bool accumulate) {
    ops::i8::I8Tile t;
    t.panel = panel;
    t.panel_stride = stride;
    t.nb = nb;
    t.ncols = ncols;
    t.y = y;
    t.ldy = ldy;
    t.accumulate = accumulate;
    return t;
}

// Signed panels: the twin against exact integer block sums computed here (scaled in double), and every
// target bit for bit against the twin, for every row count of a call, one or two panels (full and partial),
// starting from 0 or adding to y; every call took the extension expected (kernel_extension).
TEST(Int8Panel, MatchesIntegerSumsAndSameBitsOnEveryTarget) {
    std::mt19937 rng(43);
    for (int64_t k : {1, 32, 33, 100, 512})
        for (int rows = 1; rows <= ops::i8::kI8Rows; ++rows)
            for (int ncols : {1, 5, 16, 17, 32})
                for (bool accumulate : {false, true}) {
                    SCOPED_TRACE(::testing::Message() << "k " << k << " rows " << rows << " cols " << ncols
                                                      << (accumulate ? " accumulate" : ""));
                    const int64_t nb = (k + kI8Block - 1) / kI8Block;
                    std::vector<float> w = int8_rows(ncols, k, rng);
                    w[0] = -127.f * 3;  // a level of -127 next to +127 elsewhere: the widest products
                    const Int8Panels panels = int8_panels(w, ncols, k);
                    const std::vector<float> xf = int8_rows(rows, k, rng);
                    std::vector<int8_t> levels(static_cast<size_t>(rows * nb * kI8Block));
                    std::vector<float> scales(static_cast<size_t>(rows * nb));
                    for (int r = 0; r < rows; ++r)
                        ops::i8::quantize_row_ref(xf.data() + r * k, k, levels.data() + r * nb * kI8Block,
                                                  scales.data() + r * nb);
                    if (rows > 1) std::fill_n(levels.begin() + nb * kI8Block, kI8Block, int8_t{-127});
                    const Int8Acts x = int8_acts(levels, scales, rows, nb, false);
                    const int64_t ldy = 37;
                    std::vector<float> init = normal(static_cast<size_t>(rows * ldy), rng, 1.f);
                    std::vector<float> want = init, got;
                    ops::i8::panel_block_ref(x.rows(rows), int8_tile(panels.bytes.data(), panels.stride, nb,
                                                                     ncols, want.data(), ldy, accumulate));
                    for (int r = 0; r < rows; ++r)
                        for (int c = 0; c < ldy; ++c) {
                            if (c >= ncols) {
                                ASSERT_EQ(want[r * ldy + c], init[r * ldy + c])
                                    << "a column past ncols was written";
                                continue;
                            }
                            double y = accumulate ? init[r * ldy + c] : 0.0, mag = std::fabs(y);
                            for (int64_t b = 0; b < nb; ++b) {
                                int64_t sum = 0;
                                for (int t = 0; t < kI8Block; ++t)
                                    sum +=
                                        int64_t{levels[(r * nb + b) * kI8Block + t]} *
                                        int64_t{panels.bytes[(c / kI8Cols) * panels.stride +
                                                             b * kI8PanelBlockBytes + (t / 4) * kI8Cols * 4 +
                                                             (c % kI8Cols) * 4 + t % 4] -
                                                ops::i8::kI8Bias};
                                float ws;
                                std::memcpy(&ws,
                                            panels.bytes.data() + (c / kI8Cols) * panels.stride +
                                                b * kI8PanelBlockBytes + kI8Block * kI8Cols +
                                                (c % kI8Cols) * 4,
                                            4);
                                const double term = double(sum) * ws * scales[r * nb + b];
                                y += term;
                                mag += std::fabs(term);
                            }
                            // One rounding of the scale product and one of each fused add: 2 ulp of the
                            // magnitude per block.
                            ASSERT_LE(std::fabs(want[r * ldy + c] - y),
                                      2.0 * (nb + 1) * mag * 0x1p-24 + 1e-30)
                                << r << "," << c;
                        }
                    on_every_target([&] {
                        got = init;
                        ops::i8::panel_block(x.rows(rows), int8_tile(panels.bytes.data(), panels.stride, nb,
                                                                     ncols, got.data(), ldy, accumulate));
                        ASSERT_EQ(got, want);
                        EXPECT_EQ(ops::last_target(ops::KernelFamily::Int8), ops::simd_target());
                        EXPECT_STREQ(ops::i8::last_kernel_extension(), ops::i8::kernel_extension());
                        EXPECT_EQ(ops::i8::kernel_extension(), expected_int8_extension());
                    });
                }
}

// Int8Linear against the fp32 product computed in double here, within the error of the two quantisations
// (ops/int8_gemm.h): |y - x.w| <= sum_t |x_t| e_w + (|w_t| + e_w) e_x, e = half a level of t's block, plus
// the fp32 accumulation's rounding. Packed and streamed, the kernels and their twins, one thread and two give
// the same bits.
TEST(Int8Linear, WithinTheQuantisationBoundPackedStreamedAndThreaded) {
    std::mt19937 rng(47);
    // m x n x k (plain variables: clang 14 cannot capture structured bindings in the lambdas below).
    // The last two: tasks of 256 columns narrowing to 64 and a short last one; k in more than one slice on
    // any L2 (at most 1,024 blocks a slice: ops/int8_gemm.cpp).
    const int64_t shapes[][3] = {{1, 1, 1},     {3, 9, 33},     {7, 70, 100},    {13, 130, 256},
                                 {5, 64, 1000}, {19, 97, 1030}, {9, 1105, 4200}, {3, 40, 40000}};
    for (const auto& shape : shapes) {
        const int64_t m = shape[0], n = shape[1], k = shape[2];
        SCOPED_TRACE(::testing::Message() << m << "x" << n << "x" << k);
        const std::vector<float> w = int8_rows(n, k, rng), x = int8_rows(m, k, rng);
        const std::vector<float> bias = normal(static_cast<size_t>(n), rng, 1.f);
        const ops::RowProviderF32 rows = [&](int64_t r0, int64_t nr, float* out) {
            std::memcpy(out, w.data() + r0 * k, static_cast<size_t>(nr * k) * sizeof(float));
        };
        const ops::Int8Linear packed(rows, n, k, false), streamed(rows, n, k, true);
        EXPECT_FALSE(packed.streamed());
        EXPECT_TRUE(streamed.streamed());
        const int64_t nb = (k + kI8Block - 1) / kI8Block;
        EXPECT_EQ(packed.packed_bytes(),
                  static_cast<size_t>((n + kI8Cols - 1) / kI8Cols * nb * kI8PanelBlockBytes));
        EXPECT_EQ(packed.packed_bytes(), ops::int8_packed_bytes(n, k, 0));
        EXPECT_EQ(streamed.packed_bytes(), 0u);
        std::vector<float> want(static_cast<size_t>(m * n)), got(want.size());
        packed.forward(x.data(), m, want.data(), bias.data(), /*reference=*/true);
        auto scales = [&](const std::vector<float>& v, int64_t r) {
            std::vector<int8_t> q(static_cast<size_t>(nb * kI8Block));
            std::vector<float> s(static_cast<size_t>(nb));
            ops::i8::quantize_row_ref(v.data() + r * k, k, q.data(), s.data());
            return s;
        };
        for (int64_t i = 0; i < m; ++i) {
            const std::vector<float> sx = scales(x, i);
            for (int64_t j = 0; j < n; ++j) {
                const std::vector<float> sw = scales(w, j);
                double y = bias[j], bound = 0, mag = 0;
                for (int64_t t = 0; t < k; ++t) {
                    const double xv = x[i * k + t], wv = w[j * k + t];
                    const double ex = sx[t / kI8Block] * (0.5 + 1e-4), ew = sw[t / kI8Block] * (0.5 + 1e-4);
                    y += xv * wv;
                    bound += std::fabs(xv) * ew + (std::fabs(wv) + ew) * ex;
                    mag += (std::fabs(xv) + ex) * (std::fabs(wv) + ew);
                }
                bound += 2.0 * nb * mag * 0x1p-24 + std::fabs(bias[j]) * 0x1p-24;
                ASSERT_LE(std::fabs(want[i * n + j] - y), bound) << i << "," << j;
            }
        }
        for (int threads : kThreadCounts) {
            ops::set_num_threads(threads);
            on_every_target([&] {
                for (const ops::Int8Linear* l : {&packed, &streamed}) {
                    std::fill(got.begin(), got.end(), 0.f);
                    l->forward(x.data(), m, got.data(), bias.data());
                    ASSERT_EQ(got, want)
                        << (l->streamed() ? "streamed" : "packed") << ", " << threads << " threads";
                }
            });
        }
        ops::set_num_threads(0);
    }
}

// Level t of column c in a level panel's block pb (ops/int8_kernels.h: 5-bit levels one per byte in steps of
// four, 4-bit ones two per byte, t and t + 16 together).
int panel_level(const unsigned char* pb, int t, int c, int bits) {
    if (bits == 5) return pb[(t / 4) * kI8Cols * 4 + c * 4 + t % 4];
    const int byte = pb[(t % 16 / 4) * kI8Cols * 4 + c * 4 + t % 4];
    return t < 16 ? byte % 16 : byte / 16;
}

// Level panels (4-bit nibble panels and 5-bit level panels, unsigned levels with a scale and an offset per 32
// values): the twin against exact integer sums scaled in double, and every target bit for bit against the
// twin, at levels up to the bound that the AVX2 kernels' 16-bit pair sums were sized for (all 15 or all 31
// against activations of +-127), one or two panels, starting from 0 or adding to y.
TEST(Int8Panel, LevelPanelsMatchIntegerSumsAndSameBitsOnEveryTarget) {
    std::mt19937 rng(53);
    for (int bits : {4, 5})
        for (int64_t nb : {1, 3, 16})
            for (int rows = 1; rows <= ops::i8::kI8Rows; ++rows)
                for (int ncols : {7, 16, 29})
                    for (bool accumulate : {false, true}) {
                        SCOPED_TRACE(::testing::Message()
                                     << bits << " bits, " << nb << " blocks, " << rows << " rows, " << ncols
                                     << " cols" << (accumulate ? ", accumulate" : ""));
                        const int umax = (1 << bits) - 1;
                        // A level byte: one level, or (4 bits) two.
                        const int byte_max = bits == 4 ? 255 : umax;
                        std::uniform_int_distribution<int> level(0, byte_max), q(-127, 127);
                        const int npanels = (ncols + kI8Cols - 1) / kI8Cols;
                        const int64_t block_bytes = ops::i8::panel_block_bytes(bits),
                                      level_bytes = ops::i8::panel_level_bytes(bits);
                        const int64_t stride = nb * block_bytes + 64;
                        std::vector<unsigned char> panels(static_cast<size_t>(npanels * stride), 0xee);
                        for (int p = 0; p < npanels; ++p)
                            for (int64_t b = 0; b < nb; ++b) {
                                unsigned char* pb = panels.data() + p * stride + b * block_bytes;
                                for (int t = 0; t < level_bytes; ++t)
                                    pb[t] = static_cast<unsigned char>(b == 0 ? byte_max : level(rng));
                                const std::vector<float> d = normal(2 * kI8Cols, rng, 0.01f);
                                std::memcpy(pb + level_bytes, d.data(), d.size() * 4);
                            }
                        // Row 0's first block all +127 and row 1's all -127 against block 0's all-umax
                        // levels: the widest 16-bit pair sums.
                        std::vector<int8_t> levels(static_cast<size_t>(rows * nb * kI8Block));
                        for (int64_t i = 0; i < static_cast<int64_t>(levels.size()); ++i)
                            levels[i] =
                                static_cast<int8_t>(i < kI8Block                                    ? 127
                                                    : i >= nb * kI8Block && i < (nb + 1) * kI8Block ? -127
                                                                                                    : q(rng));
                        const std::vector<float> scales = normal(static_cast<size_t>(rows * nb), rng, 0.1f);
                        const Int8Acts x = int8_acts(levels, scales, rows, nb, true);
                        const int64_t ldy = 33;
                        const std::vector<float> init = normal(static_cast<size_t>(rows * ldy), rng, 1.f);
                        std::vector<float> want = init, got;
                        ops::i8::panel_block_u_ref(
                            x.rows(rows),
                            int8_tile(panels.data(), stride, nb, ncols, want.data(), ldy, accumulate), bits);
                        for (int r = 0; r < rows; ++r)
                            for (int c = 0; c < ldy; ++c) {
                                if (c >= ncols) {
                                    ASSERT_EQ(want[r * ldy + c], init[r * ldy + c]) << "a column past ncols";
                                    continue;
                                }
                                double y = accumulate ? init[r * ldy + c] : 0.0, mag = std::fabs(y);
                                for (int64_t b = 0; b < nb; ++b) {
                                    const unsigned char* pb =
                                        panels.data() + (c / kI8Cols) * stride + b * block_bytes;
                                    const int cc = c % kI8Cols;
                                    int64_t sum = 0, xsum = 0;
                                    for (int t = 0; t < kI8Block; ++t) {
                                        const int64_t xv = levels[(r * nb + b) * kI8Block + t];
                                        sum += xv * panel_level(pb, t, cc, bits);
                                        xsum += xv;
                                    }
                                    float d, o;
                                    std::memcpy(&d, pb + level_bytes + cc * 4, 4);
                                    std::memcpy(&o, pb + level_bytes + kI8Cols * 4 + cc * 4, 4);
                                    const double t1 = double(sum) * d * scales[r * nb + b],
                                                 t2 = double(xsum) * o * scales[r * nb + b];
                                    y += t1 + t2;
                                    mag += std::fabs(t1) + std::fabs(t2);
                                }
                                // The scale product, s * sum and two fused adds per block: 4 ulp of the
                                // magnitude.
                                ASSERT_LE(std::fabs(want[r * ldy + c] - y),
                                          4.0 * (nb + 1) * mag * 0x1p-24 + 1e-30)
                                    << r << "," << c;
                            }
                        on_every_target([&] {
                            got = init;
                            ops::i8::panel_block_u(
                                x.rows(rows),
                                int8_tile(panels.data(), stride, nb, ncols, got.data(), ldy, accumulate),
                                bits);
                            ASSERT_EQ(got, want);
                            EXPECT_EQ(ops::last_target(ops::KernelFamily::Int8), ops::simd_target());
                            EXPECT_STREQ(ops::i8::last_kernel_extension(), ops::i8::kernel_extension());
                            EXPECT_EQ(ops::i8::kernel_extension(), expected_int8_extension());
                        });
                    }
}

}  // namespace
}  // namespace clef
