// Precision::Int8 end to end (issue 30): the exact levels of the affine GGUF blocks (quant/levels.h), the
// int8 linear layer on them against the file's own values, and whole decisions of the small model's GGUF
// files in int8 against the exact path on the same file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "decision/engine.h"
#include "decision/request.h"
#include "model/serve_plan.h"
#include "ops/cpu.h"
#include "ops/int8_gemm.h"
#include "ops/int8_kernels.h"
#include "ops/simd.h"
#include "quant/levels.h"
#include "quant/quant.h"
#include "small_model.h"
#include "test_util.h"
#include "util/half.h"

using namespace clef;

namespace {

namespace fs = std::filesystem;

const std::string& work_dir() {
    static const std::string d = [] {
        const fs::path p = fs::temp_directory_path() / ("clef-test-int8-" + std::to_string(::getpid()));
        fs::create_directories(p);
        return p.string();
    }();
    return d;
}

class Env : public ::testing::Environment {
public:
    void TearDown() override { fs::remove_all(work_dir()); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Env);

const GgmlType kAffine[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                            GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K};

// rows x cols values quantised to t, row after row.
std::vector<unsigned char> quantised(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const uint64_t rb = ggml_row_bytes(ggml_type_traits(static_cast<uint32_t>(t)), cols);
    std::vector<unsigned char> q(static_cast<size_t>(rows * rb));
    std::vector<float> x(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        for (float& v : x) v = nd(rng) + (r % 3 == 0 ? 0.7f : 0.f);  // some rows off-centre: mins matter
        quantize_row(t, x.data(), q.data() + r * rb, cols);
    }
    return q;
}

// D * u + O rounded once is the dequantised value, bit for bit, for every affine type; levels stay below
// 2^bits; a matrix's row and column-group maps move levels as they move values.
TEST(Int8Levels, ReproduceTheDequantisedValuesExactly) {
    constexpr int64_t rows = 6, cols = 512;
    for (GgmlType t : kAffine) {
        SCOPED_TRACE(ggml_type_traits(static_cast<uint32_t>(t)).name);
        const int bits = affine_level_bits(t);
        ASSERT_TRUE(bits == 4 || bits == 5);
        const std::vector<unsigned char> q = quantised(t, rows, cols, 7);
        QuantMatrix m;
        m.type = t;
        m.data = q.data();
        m.rows = rows;
        m.cols = cols;
        m.row_map = {5, 0, 3, 1, 4, 2};
        m.col_group = 64;
        m.col_map = {7, 0, 6, 1, 5, 2, 4, 3};
        std::vector<float> want(cols), D(cols / 32), O(cols / 32);
        std::vector<uint8_t> u(cols);
        for (int64_t r = 0; r < rows; ++r) {
            m.row_f32(r, want.data());
            ASSERT_TRUE(matrix_row_levels(m, r, u.data(), D.data(), O.data()));
            for (int64_t c = 0; c < cols; ++c) {
                // 4 bits: two levels per byte, c and c + 16 of a block together (ops::level_row_bytes).
                const int level = bits == 5     ? u[c]
                                  : c % 32 < 16 ? u[c / 32 * 16 + c % 16] % 16
                                                : u[c / 32 * 16 + c % 16] / 16;
                ASSERT_LT(level, 1 << bits);
                const float got = static_cast<float>(double(D[c / 32]) * level + double(O[c / 32]));
                ASSERT_EQ(got, want[c]) << "row " << r << " col " << c;
            }
        }
        EXPECT_TRUE(has_levels(m));
        m.col_group = 16;  // groups that split a block: no levels
        m.col_map.assign(cols / 16, 0);
        EXPECT_FALSE(has_levels(m));
        EXPECT_FALSE(matrix_row_levels(m, 0, u.data(), D.data(), O.data()));
    }
    EXPECT_EQ(affine_level_bits(GgmlType::Q8_0), 0);
    EXPECT_EQ(affine_level_bits(GgmlType::Q6_K), 0);
}

// Q8_0 blocks come as the file holds them (matrix_row_int8): s * q is the dequantised value bit for bit for
// every block, a matrix's row and column-group maps move levels as they move values.
TEST(Int8Levels, Q8_0BlocksComeAsTheFileHoldsThem) {
    constexpr int64_t rows = 4, cols = 256;
    const std::vector<unsigned char> q = quantised(GgmlType::Q8_0, rows, cols, 13);
    QuantMatrix m;
    m.type = GgmlType::Q8_0;
    m.data = q.data();
    m.rows = rows;
    m.cols = cols;
    m.row_map = {2, 0, 3, 1};
    m.col_group = 64;
    m.col_map = {3, 0, 2, 1};
    ASSERT_TRUE(has_int8_levels(m));
    std::vector<float> want(cols), s(cols / 32);
    std::vector<int8_t> levels(cols);
    for (int64_t r = 0; r < rows; ++r) {
        m.row_f32(r, want.data());
        ASSERT_TRUE(matrix_row_int8(m, r, levels.data(), s.data()));
        for (int64_t c = 0; c < cols; ++c)
            ASSERT_EQ(s[c / 32] * levels[c], want[c]) << "row " << r << " col " << c;
    }
    m.col_group = 16;  // groups that split a block
    m.col_map.assign(cols / 16, 0);
    EXPECT_FALSE(has_int8_levels(m));
    EXPECT_FALSE(matrix_row_int8(m, 0, levels.data(), s.data()));
    m.type = GgmlType::Q4_0;
    EXPECT_FALSE(has_int8_levels(m));
}

// Level panels (and Q8_0's blocks in signed panels) against the product with the file's values, computed in
// double here: only the activations are quantised, so |y - x.w| <= sum_t |w_t| e_x,t (+ the fp32
// accumulation); packed, streamed and the twins give the same bits on every target and thread count.
TEST(Int8Levels, LinearWithinTheActivationBound) {
    std::mt19937 rng(59);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0}) {
        SCOPED_TRACE(ggml_type_traits(static_cast<uint32_t>(t)).name);
        constexpr int64_t m = 7, n = 70, k = 512, nb = k / 32;
        const std::vector<unsigned char> q = quantised(t, n, k, 11);
        const uint64_t rb = ggml_row_bytes(ggml_type_traits(static_cast<uint32_t>(t)), k);
        std::vector<float> w(static_cast<size_t>(n * k)), x(static_cast<size_t>(m * k));
        for (int64_t j = 0; j < n; ++j) dequantize_row_f32(t, q.data() + j * rb, w.data() + j * k, k);
        for (float& v : x) v = nd(rng);
        x[3] = 60.f;  // an outlier: its block's scale grows
        QuantMatrix qm;
        qm.type = t;
        qm.data = q.data();
        qm.rows = n;
        qm.cols = k;
        const int bits = affine_level_bits(t);
        const ops::LevelProvider levels = [&](int64_t r0, int64_t nr, uint8_t* u, float* D, float* O) {
            for (int64_t i = 0; i < nr; ++i)
                row_levels(t, q.data() + (r0 + i) * rb, k, u + i * ops::level_row_bytes(bits, k), D + i * nb,
                           O + i * nb);
        };
        const ops::Int8Provider int8 = [&](int64_t r0, int64_t nr, int8_t* lv, float* s) {
            for (int64_t i = 0; i < nr; ++i) ASSERT_TRUE(matrix_row_int8(qm, r0 + i, lv + i * k, s + i * nb));
        };
        const ops::Int8Linear packed =
            bits ? ops::Int8Linear(levels, bits, n, k, false) : ops::Int8Linear(int8, n, k, false);
        const ops::Int8Linear streamed =
            bits ? ops::Int8Linear(levels, bits, n, k, true) : ops::Int8Linear(int8, n, k, true);
        EXPECT_EQ(packed.backend_name().find("levels") != std::string::npos, bits != 0);
        std::vector<float> want(static_cast<size_t>(m * n)), got(want.size());
        packed.forward(x.data(), m, want.data(), nullptr, /*reference=*/true);
        for (int64_t i = 0; i < m; ++i) {
            std::vector<float> sx(nb);
            for (int64_t b = 0; b < nb; ++b) {
                float amax = 0;
                for (int64_t c = b * 32; c < b * 32 + 32; ++c) amax = std::max(amax, std::fabs(x[i * k + c]));
                sx[b] = amax / 127.0f;
            }
            for (int64_t j = 0; j < n; ++j) {
                double y = 0, bound = 0, mag = 0;
                for (int64_t c = 0; c < k; ++c) {
                    const double xv = x[i * k + c], wv = w[j * k + c];
                    y += xv * wv;
                    bound += std::fabs(wv) * sx[c / 32] * (0.5 + 1e-4);
                    mag += (std::fabs(xv) + sx[c / 32]) * std::fabs(wv);
                }
                // Two fused adds per block over |D u| and |O| terms: bounded by 4 ulp of 4 x the magnitude.
                ASSERT_LE(std::fabs(want[i * n + j] - y), bound + 16.0 * nb * mag * 0x1p-24) << i << "," << j;
            }
        }
        for (int threads : {1, 2}) {
            ops::set_num_threads(threads);
            for (int64_t target : ops::simd_targets()) {
                const ops::ScopedSimdTarget use(target);
                for (const ops::Int8Linear* l : {&packed, &streamed}) {
                    l->forward(x.data(), m, got.data());
                    ASSERT_EQ(got, want) << ops::simd_target_name(target) << ", " << threads << " threads";
                }
            }
        }
        ops::set_num_threads(0);
    }
}

TEST(Int8Linear, KernelYardstickIsPositive) {
    for (int bits : {0, 4}) EXPECT_GT(ops::int8_kernel_gops(2, bits), 0.0) << bits;
}

// Short requests (the small model's tokenizer is byte-level).
const char* const kRequests[] = {
    R"({"model": "small", "state": "The parcel came two weeks late.", "questions": {"late": {"type": "noul"},
        "mood": {"type": "choice", "criteria": {"calm": null, "angry": null, "sad": null}}}})",
    R"({"model": "small", "state": {"temp_c": 71.5},
        "questions": {"heat": {"type": "score", "criteria": ["low", "mid", "high"]}}})"};

std::vector<Decision> decide_all(const std::string& file, ops::Precision p, bool unpack) {
    LoadOptions o;
    o.precision = p;
    o.unpack_quantised = unpack;
    const std::unique_ptr<Engine> e = Engine::load(file, "", o);
    DecideOptions opt;
    opt.backbone.precision = p;
    std::vector<Decision> out;
    for (const char* body : kRequests) {
        DecisionRequest req;
        std::vector<RequestError> errors;
        EXPECT_TRUE(parse_request(parse_json_or_throw(body, "request"), req, errors))
            << describe_errors(errors);
        out.push_back(e->decide(req, opt));
    }
    return out;
}

// The small model's Q8_0 (signed panels) and Q4_K_M (level panels for Q4_K, signed ones for its Q6_K
// tensors) files decide in int8 as in exact precision to the issue's bound (max |dp| <= 2e-2; the same
// decision unless the two likeliest options are that close), and the same bits whether the weights are
// quantised per chunk from the file (streamed, the default) or once at load (--unpack-weights).
TEST(Int8Decision, SmallModelGgufAgainstExact) {
    for (const char* type : {"q8_0", "q4_k_m"}) {
        SCOPED_TRACE(type);
        const std::string file = clef::testing::small_gguf(work_dir(), type);
        const std::vector<Decision> exact = decide_all(file, ops::Precision::Exact, false);
        const std::vector<Decision> int8 = decide_all(file, ops::Precision::Int8, false);
        const std::vector<Decision> packed = decide_all(file, ops::Precision::Int8, true);
        for (size_t i = 0; i < exact.size(); ++i) {
            const double dp =
                clef::testing::max_probability_diff(int8[i].probabilities, exact[i].probabilities);
            std::printf("  %s request %zu: max |dp| int8 vs exact %.2e\n", type, i, dp);
            EXPECT_LE(dp, 2e-2);
            EXPECT_GT(dp, 0.0) << "int8 did not run";
            EXPECT_EQ(packed[i].probabilities, int8[i].probabilities);
            for (size_t q = 0; q < exact[i].probabilities.size(); ++q) {
                std::vector<float> p = exact[i].probabilities[q];
                const size_t best = std::max_element(p.begin(), p.end()) - p.begin();
                std::sort(p.rbegin(), p.rend());
                const std::vector<float>& g = int8[i].probabilities[q];
                if (p.size() < 2 || p[0] - p[1] > 4e-2) {
                    EXPECT_EQ(static_cast<size_t>(std::max_element(g.begin(), g.end()) - g.begin()), best);
                }
            }
        }
    }
}

// Under int8, Q8_0's blocks are packed at load whether or not the file's weights stream (the panels are the
// file's bytes rearranged, no decode per forward), and the memory plan counts what the layers then hold:
// the small model's Q8_0 file (all matrices Q8_0) streams nothing; its Q4_K_M file still streams.
TEST(Int8Decision, Q8_0BlocksArePackedAtLoadAndPlannedSo) {
    for (const char* type : {"q8_0", "q4_k_m"}) {
        SCOPED_TRACE(type);
        const std::string file = clef::testing::small_gguf(work_dir(), type);
        LoadOptions o;
        o.precision = ops::Precision::Int8;
        const std::unique_ptr<Engine> e = Engine::load(file, "", o);
        const bool q8 = std::string(type) == "q8_0";
        EXPECT_EQ(e->backbone().streams_weights(), !q8);
        clef::MemoryPlanInput in;
        in.tokens = 100;
        in.backbone.precision = ops::Precision::Int8;
        const clef::MemoryPlan plan = clef::compute_memory_plan(file, "", in);
        EXPECT_EQ(plan.weights.streamed, !q8);
        if (q8) {
            EXPECT_EQ(plan.weights.packed, e->backbone().packed_weight_bytes());
            EXPECT_GT(plan.weights.packed, 0u);
        }
    }
}

// Unpacked under int8, the Q4_K_M file's Q4_K matrices become nibble panels (0.75 bytes per weight), its Q6_K
// ones signed panels (1.125): the memory plan counts what the layers hold, and the nibble panels hold less
// than the same weights as 5-bit level panels would.
TEST(Int8Decision, UnpackedQ4KmIsPlannedAsTheLayersHoldIt) {
    const std::string file = clef::testing::small_gguf(work_dir(), "q4_k_m");
    LoadOptions o;
    o.precision = ops::Precision::Int8;
    o.unpack_quantised = true;
    const std::unique_ptr<Engine> e = Engine::load(file, "", o);
    EXPECT_FALSE(e->backbone().streams_weights());
    clef::MemoryPlanInput in;
    in.tokens = 100;
    in.backbone.precision = ops::Precision::Int8;
    in.unpack_quantised = true;
    const clef::MemoryPlan plan = clef::compute_memory_plan(file, "", in);
    EXPECT_FALSE(plan.weights.streamed);
    EXPECT_EQ(plan.weights.packed, e->backbone().packed_weight_bytes());
    EXPECT_EQ(ops::int8_packed_bytes(16, 256, 4) * 5, ops::int8_packed_bytes(16, 256, 5) * 3);
}

}  // namespace
