// ggml block formats (src/quant): dequantisation against an independent per-value decoder, hand-built blocks
// with values worked out by hand from the format definition, quantiser round trips, and the type rules of
// `clef convert`.
//
// Source of the expected values: the per-value decoder below is written from the block layouts (ggml's
// ggml-common.h block structs as documented in src/quant/quant.h), indexing each value directly (value i ->
// byte, nibble, high bits, scale) instead of the implementation's block loops; the literal cases were computed
// by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/gguf_model.h"
#include "ops/simd.h"
#include "quant/quant.h"
#include "test_util.h"
#include "tools/gguf_convert.h"
#include "util/error.h"
#include "util/half.h"
#include "util/json.h"
#include "util/mmap.h"

using namespace clef;

namespace {

float h(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return f16_to_f32(v);
}

// 6-bit scale and min of sub-block j of the 12-byte K-quant scales (ggml's get_scale_min_k4 layout).
void k4(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Value i of the block starting at b.
float expected_value(GgmlType t, const uint8_t* b, int i) {
    switch (t) {
        case GgmlType::Q4_0: {
            const int nib = i < 16 ? b[2 + i] & 15 : b[2 + i - 16] >> 4;
            return static_cast<float>(nib - 8) * h(b);
        }
        case GgmlType::Q4_1: {
            const int nib = i < 16 ? b[4 + i] & 15 : b[4 + i - 16] >> 4;
            return static_cast<float>(nib) * h(b) + h(b + 2);
        }
        case GgmlType::Q5_0: {
            uint32_t qh;
            std::memcpy(&qh, b + 2, 4);
            const int nib = i < 16 ? b[6 + i] & 15 : b[6 + i - 16] >> 4;
            const int hb = static_cast<int>((qh >> i) & 1);
            return static_cast<float>((nib | (hb << 4)) - 16) * h(b);
        }
        case GgmlType::Q5_1: {
            uint32_t qh;
            std::memcpy(&qh, b + 4, 4);
            const int nib = i < 16 ? b[8 + i] & 15 : b[8 + i - 16] >> 4;
            return static_cast<float>(nib | (((qh >> i) & 1) << 4)) * h(b) + h(b + 2);
        }
        case GgmlType::Q8_0: return static_cast<float>(static_cast<int8_t>(b[2 + i])) * h(b);
        case GgmlType::Q4_K: {
            const int sub = i / 32, group = i / 64, l = i % 32;
            const uint8_t byte = b[16 + 32 * group + l];
            const int nib = sub % 2 == 0 ? byte & 15 : byte >> 4;
            int sc, m;
            k4(b + 4, sub, sc, m);
            return h(b) * static_cast<float>(sc) * static_cast<float>(nib) - h(b + 2) * static_cast<float>(m);
        }
        case GgmlType::Q5_K: {
            const int sub = i / 32, group = i / 64, l = i % 32;
            const uint8_t byte = b[48 + 32 * group + l];
            const int nib = sub % 2 == 0 ? byte & 15 : byte >> 4;
            const int hb = (b[16 + l] >> sub) & 1;
            int sc, m;
            k4(b + 4, sub, sc, m);
            return h(b) * static_cast<float>(sc) * static_cast<float>(nib + 16 * hb) -
                   h(b + 2) * static_cast<float>(m);
        }
        case GgmlType::Q6_K: {
            const int half = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
            const uint8_t lo = b[64 * half + l + 32 * (quarter % 2)];
            const int nib = quarter < 2 ? lo & 15 : lo >> 4;
            const int hb = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
            const int q = (nib | (hb << 4)) - 32;
            const int sc = static_cast<int8_t>(b[192 + 8 * half + 2 * quarter + l / 16]);
            return h(b + 208) * static_cast<float>(sc * q);
        }
        default: break;
    }
    ADD_FAILURE() << "no decoder";
    return 0;
}

// Offsets of the fp16 fields of a block (kept finite and small in random blocks).
std::vector<int> half_fields(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
        case GgmlType::Q8_0: return {0};
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K: return {0, 2};
        case GgmlType::Q6_K: return {208};
        case GgmlType::Q2_K:
            return {80, 82};
        case GgmlType::Q3_K:
            return {108};
        case GgmlType::IQ4_NL:
        case GgmlType::IQ4_XS:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ2_S:
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ3_S:
        case GgmlType::IQ1_S:
            return {0};
        default:
            return {};  // IQ1_M's d is spread over its scales' top nibbles
    }
}

const GgmlType kQuantTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

void put_half(std::vector<uint8_t>& b, size_t off, float v) {
    const uint16_t x = f32_to_f16(v);
    std::memcpy(b.data() + off, &x, 2);
}

}  // namespace

TEST(Quant, TypeTraits) {
    EXPECT_STREQ(ggml_type_traits(12).name, "q4_K");
    EXPECT_EQ(ggml_type_traits(14).type_size, 210u);
    EXPECT_EQ(ggml_type_traits(8).block_size, 32u);
    EXPECT_EQ(ggml_type_traits(30).type_size, 2u);
    EXPECT_EQ(ggml_type_traits(31).name, nullptr);  // retired Q4_0_4_4
    EXPECT_EQ(ggml_type_name(31), "type 31");
    EXPECT_TRUE(ggml_type_traits(10).supported);   // q2_K
    EXPECT_FALSE(ggml_type_traits(34).supported);  // tq1_0
    EXPECT_EQ(ggml_row_bytes(ggml_type_traits(13), 512), 352u);
}

TEST(Quant, RandomBlocksMatchPerValueDecoder) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> scale(-2.f, 2.f);
    for (GgmlType t : kQuantTypes) {
        const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(t));
        SCOPED_TRACE(tt.name);
        const int nblocks = 5;
        std::vector<uint8_t> bytes(nblocks * tt.type_size);
        for (auto& x : bytes) x = static_cast<uint8_t>(rng());
        for (int b = 0; b < nblocks; ++b)
            for (int off : half_fields(t)) put_half(bytes, b * tt.type_size + off, scale(rng));
        const int n = nblocks * static_cast<int>(tt.block_size);
        std::vector<float> got(n), fast(n);
        dequantize_ref(t, bytes.data(), got.data(), n);
        dequantize_row_f32(t, bytes.data(), fast.data(), n);
        std::vector<uint16_t> bf(n);
        dequantize_row_bf16(t, bytes.data(), bf.data(), n);
        for (int i = 0; i < n; ++i) {
            const float want = expected_value(t, bytes.data() + (i / tt.block_size) * tt.type_size, i % tt.block_size);
            ASSERT_FLOAT_EQ(got[i], want) << i;
            ASSERT_EQ(fast[i], got[i]) << i;
            ASSERT_EQ(bf[i], f32_to_bf16(got[i])) << i;
        }
    }
}

// The vector dequantisers (Q8_0, Q4_K, Q5_K, Q6_K) against the scalar loops, bit for bit, on every Highway
// target compiled in: many random blocks (scales of every magnitude, including fp16 inf / NaN and
// subnormals), an odd source address, fp32 and bf16.
TEST(Quant, SimdMatchesScalarOnEveryTarget) {
    for (int64_t target : ops::simd_targets()) {
        SCOPED_TRACE(ops::simd_target_name(target));
        const ops::ScopedSimdTarget use(target);
        std::mt19937 rng(23);
        const float specials[] = {INFINITY, -INFINITY, NAN, 6e-8f, -3e-5f, 65504.f, 0.f};
        for (GgmlType t :
             {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q2_K, GgmlType::Q3_K,
              GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,
              GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M}) {
            const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(t));
            SCOPED_TRACE(tt.name);
            const int nblocks = 96;
            std::vector<uint8_t> storage(nblocks * tt.type_size + 1);
            uint8_t* bytes = storage.data() + 1;  // odd address: the kernels must not assume alignment
            for (auto& x : storage) x = static_cast<uint8_t>(rng());
            for (int b = 0; b < nblocks; ++b)
                for (int off : half_fields(t)) {
                    const float v = b < 7 ? specials[b]
                                          : std::ldexp(static_cast<float>(rng() % 2000) - 1000.f,
                                                       static_cast<int>(rng() % 30) - 25);
                    const uint16_t h16 = f32_to_f16(v);
                    std::memcpy(bytes + b * tt.type_size + off, &h16, 2);
                }
            const int n = nblocks * static_cast<int>(tt.block_size);
            std::vector<float> ref(n), fast(n), scalar(n);
            std::vector<uint16_t> bf_fast(n), bf_scalar(n);
            dequantize_ref(t, bytes, ref.data(), n);
            dequantize_row_f32(t, bytes, fast.data(), n);
            dequantize_row_bf16(t, bytes, bf_fast.data(), n);
            set_quant_simd(false);
            dequantize_row_f32(t, bytes, scalar.data(), n);
            dequantize_row_bf16(t, bytes, bf_scalar.data(), n);
            set_quant_simd(true);
            auto bits = [](float v) {
                uint32_t u;
                std::memcpy(&u, &v, 4);
                return u;
            };
            for (int i = 0; i < n; ++i) {
                ASSERT_EQ(bits(fast[i]), bits(ref[i])) << i << ": " << fast[i] << " vs " << ref[i];
                ASSERT_EQ(bits(scalar[i]), bits(ref[i])) << i;
                ASSERT_EQ(bf_fast[i], f32_to_bf16(ref[i])) << i;
                ASSERT_EQ(bf_scalar[i], bf_fast[i]) << i;
            }
        }
    }
}

// The K-quant scale searches have an AVX-512 kernel and a scalar reference that must agree exactly: the same
// bytes out of every quantiser with SIMD on and off, on rows mixing scales from 1e-6 to 1e4, skewed and
// one-signed blocks, constant, sparse and all-zero blocks, subnormals, and non-finite values.
TEST(Quant, QuantiserSimdMatchesScalar) {
    if (!quant_simd_available()) GTEST_SKIP() << "no AVX-512 on this CPU";
    std::mt19937 rng(31);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int blocks = 512, n = 256 * blocks;
    std::vector<float> x(n);
    for (int b = 0; b < blocks; ++b) {
        float* v = x.data() + 256 * b;
        const float scale = std::pow(10.f, static_cast<float>(rng() % 11) - 6.f);
        for (int i = 0; i < 256; ++i) {
            const float g = nd(rng);
            switch (b % 8) {
                case 0:
                    v[i] = scale * g;
                    break;
                case 1:
                    v[i] = scale * g * g * g;
                    break;  // heavy tails
                case 2:
                    v[i] = scale * (std::fabs(g) + 0.5f);
                    break;  // all positive
                case 3:
                    v[i] = -scale * std::fabs(g);
                    break;  // all non-positive
                case 4:
                    v[i] = i % 32 == 5 ? scale * g : 0.f;
                    break;  // sparse
                case 5:
                    v[i] = scale;
                    break;  // constant
                case 6:
                    v[i] = g * 1e-39f;
                    break;  // subnormal
                default:
                    v[i] = scale * (g + 3.f);
                    break;  // offset
            }
        }
    }
    x[256 * 9 + 3] = NAN;
    x[256 * 17 + 40] = INFINITY;
    x[256 * 25 + 100] = -INFINITY;
    std::fill(x.begin() + 256 * 33, x.begin() + 256 * 34, 0.f);
    for (GgmlType t : kQuantTypes) {
        const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(t));
        SCOPED_TRACE(tt.name);
        std::vector<uint8_t> fast(ggml_row_bytes(tt, n)), scalar(fast.size());
        quantize_row(t, x.data(), fast.data(), n);
        set_quant_simd(false);
        quantize_row(t, x.data(), scalar.data(), n);
        set_quant_simd(true);
        for (size_t i = 0; i < fast.size(); ++i)
            ASSERT_EQ(fast[i], scalar[i]) << "byte " << i << " (block " << i / tt.type_size << ")";
    }
}

// QuantMatrix: rows through the row and column-group maps equal the permuted rows of the whole dequantised
// matrix; bad maps and rows are refused.
TEST(Quant, QuantMatrixMaps) {
    std::mt19937 rng(5);
    const int64_t rows = 6, cols = 64;
    const std::vector<float> x = clef::testing::randn(rows * cols, rng);
    const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(GgmlType::Q8_0));
    std::vector<uint8_t> q(rows * ggml_row_bytes(tt, cols));
    quantize_row(GgmlType::Q8_0, x.data(), q.data(), rows * cols);
    std::vector<float> all(rows * cols);
    dequantize_ref(GgmlType::Q8_0, q.data(), all.data(), rows * cols);

    QuantMatrix m;
    m.type = GgmlType::Q8_0;
    m.data = q.data();
    m.rows = rows;
    m.cols = cols;
    m.row_map = {5, 0, 1, 2, 3, 4};
    m.col_group = 16;
    m.col_map = {2, 0, 3, 1};
    m.validate("m");
    std::vector<float> row(cols);
    std::vector<uint16_t> row16(cols);
    for (int64_t r = 0; r < rows; ++r) {
        m.row_f32(r, row.data());
        m.row_bf16(r, row16.data());
        for (int64_t c = 0; c < cols; ++c) {
            const float want = all[m.row_map[r] * cols + m.col_map[c / 16] * 16 + c % 16];
            ASSERT_EQ(row[c], want) << r << "," << c;
            ASSERT_EQ(row16[c], f32_to_bf16(want)) << r << "," << c;
        }
    }
    // drop_pages is a no-op on heap data (file_mapped false): the rows stay.
    m.drop_pages();
    m.row_f32(0, row.data());
    EXPECT_EQ(row[0], all[m.row_map[0] * cols + m.col_map[0] * 16]);
    EXPECT_THROW(m.row_f32(rows, row.data()), Error);
    EXPECT_THROW(m.row_f32(-1, row.data()), Error);
    QuantMatrix bad = m;
    bad.row_map = {0, 0, 1, 2, 3, 4};
    EXPECT_THROW(bad.validate("bad"), Error);
    bad = m;
    bad.col_group = 8;
    EXPECT_THROW(bad.validate("bad"), Error);
    bad = m;
    bad.cols = 48;  // not whole q8_0 blocks of 32
    bad.col_map.clear();
    EXPECT_THROW(bad.validate("bad"), Error);
}

// A file-mapped matrix reads the same rows after its pages were dropped (they are faulted back in from the
// file).
TEST(Quant, QuantMatrixDropPagesOfAMapping) {
    std::mt19937 rng(9);
    const int64_t rows = 512, cols = 1024;  // 1.1 MB of q8_0: several whole pages
    const std::vector<float> x = clef::testing::randn(rows * cols, rng);
    std::vector<uint8_t> q(rows *
                           ggml_row_bytes(ggml_type_traits(static_cast<uint32_t>(GgmlType::Q8_0)), cols));
    quantize_row(GgmlType::Q8_0, x.data(), q.data(), rows * cols);
    const clef::testing::ScratchDir dir("clef_test_quant");
    const std::string path =
        dir.write("q8.bin", std::string_view(reinterpret_cast<const char*>(q.data()), q.size()));
    auto file = std::make_shared<MappedFile>(MappedFile::open(path));
    QuantMatrix m;
    m.type = GgmlType::Q8_0;
    m.data = file->data();
    m.rows = rows;
    m.cols = cols;
    m.owner = file;
    m.file_mapped = true;
    std::vector<float> before(rows * cols), after(rows * cols);
    for (int64_t r = 0; r < rows; ++r) m.row_f32(r, before.data() + r * cols);
    m.drop_pages();
    for (int64_t r = 0; r < rows; ++r) m.row_f32(r, after.data() + r * cols);
    EXPECT_EQ(before, after);
    std::vector<float> want(rows * cols);
    dequantize_ref(GgmlType::Q8_0, q.data(), want.data(), rows * cols);
    EXPECT_EQ(after, want);
}

TEST(Quant, HandBuiltBlocks) {
    // Q8_0: d = 0.5, q = [-127, 3, 0, ...] -> -63.5, 1.5, 0.
    {
        std::vector<uint8_t> b(34, 0);
        put_half(b, 0, 0.5f);
        b[2] = static_cast<uint8_t>(-127);
        b[3] = 3;
        float y[32];
        dequantize_ref(GgmlType::Q8_0, b.data(), y, 32);
        EXPECT_EQ(y[0], -63.5f);
        EXPECT_EQ(y[1], 1.5f);
        EXPECT_EQ(y[2], 0.f);
    }
    // Q4_0: d = 2, qs[0] = 0x9F -> value 0 = (15 - 8) * 2 = 14, value 16 = (9 - 8) * 2 = 2; zero nibbles -> -16.
    {
        std::vector<uint8_t> b(18, 0);
        put_half(b, 0, 2.f);
        b[2] = 0x9F;
        float y[32];
        dequantize_ref(GgmlType::Q4_0, b.data(), y, 32);
        EXPECT_EQ(y[0], 14.f);
        EXPECT_EQ(y[16], 2.f);
        EXPECT_EQ(y[1], -16.f);
    }
    // Q5_1: d = 0.25, m = -1, qh bit 17 set, qs[1] = 0x3? -> value 17 = (3 | 16) * 0.25 - 1 = 3.75.
    {
        std::vector<uint8_t> b(24, 0);
        put_half(b, 0, 0.25f);
        put_half(b, 2, -1.f);
        b[4 + 2] = 0x02;  // qh bit 17
        b[8 + 1] = 0x30;  // value 17: high nibble of qs[1]
        float y[32];
        dequantize_ref(GgmlType::Q5_1, b.data(), y, 32);
        EXPECT_EQ(y[17], 3.75f);
        EXPECT_EQ(y[1], -1.f);
    }
    // Q4_K: d = 1, dmin = 0.5; sub-block 0: scale 3, min 2; sub-block 5: scale 0x25 (37), min 0x13 (19);
    // value 0 = 1*3*nib(qs[0] low = 4) - 0.5*2 = 11; value 160 (sub 5, group 2, high nibble of qs[64] = 2)
    // = 37*2 - 0.5*19 = 64.5.
    {
        std::vector<uint8_t> b(144, 0);
        put_half(b, 0, 1.f);
        put_half(b, 2, 0.5f);
        uint8_t* s = b.data() + 4;
        s[0] = 3;
        s[4] = 2;
        // j = 5: sc = (s[9] & 15) | (s[1] >> 6) << 4; m = (s[9] >> 4) | (s[5] >> 6) << 4.
        s[9] = static_cast<uint8_t>((37 & 15) | ((19 & 15) << 4));
        s[1] = static_cast<uint8_t>((37 >> 4) << 6);
        s[5] = static_cast<uint8_t>((19 >> 4) << 6);
        b[16 + 0] = 0x04;
        b[16 + 64] = 0x20;
        std::vector<float> y(256);
        dequantize_ref(GgmlType::Q4_K, b.data(), y.data(), 256);
        EXPECT_EQ(y[0], 11.f);
        EXPECT_EQ(y[160], 64.5f);
    }
    // Q6_K: d = 0.125, scales[0] = -2; value 0 = low nibble of ql[0] (5) | (qh[0] & 3) << 4 (1) = 21 -> 21 - 32
    // = -11 -> 0.125 * -2 * -11 = 2.75.
    {
        std::vector<uint8_t> b(210, 0);
        put_half(b, 208, 0.125f);
        b[192] = static_cast<uint8_t>(-2);
        b[0] = 0x05;
        b[128] = 0x01;
        std::vector<float> y(256);
        dequantize_ref(GgmlType::Q6_K, b.data(), y.data(), 256);
        EXPECT_EQ(y[0], 2.75f);
    }
}

// The low-bit types clef reads (Q2_K, Q3_K, the i-quants): one hand-built block each, the expected values
// worked out by hand from the block layout (src/quant/quant.h) and, for the i-quants, the grid entries of
// ggml's ggml-common.h quoted in the comments (entry bytes listed value 0 first).
TEST(Quant, HandBuiltLowBitBlocks) {
    auto put16 = [](std::vector<uint8_t>& b, size_t off, uint16_t v) { std::memcpy(b.data() + off, &v, 2); };
    auto put32 = [](std::vector<uint8_t>& b, size_t off, uint32_t v) { std::memcpy(b.data() + off, &v, 4); };
    auto decode = [](GgmlType t, const std::vector<uint8_t>& b) {
        const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(t));
        EXPECT_TRUE(tt.supported) << tt.name;
        EXPECT_EQ(b.size(), tt.type_size) << tt.name;
        std::vector<float> y(tt.block_size), fast(tt.block_size);
        dequantize_ref(t, b.data(), y.data(), tt.block_size);
        dequantize_row_f32(t, b.data(), fast.data(), tt.block_size);
        EXPECT_EQ(y, fast) << tt.name;
        return y;
    };
    // Q2_K (scales @0, qs @16, d @80, dmin @82): d = 0.5, dmin = 0.25. Sub-block k of 16 = 8h + 2s + p reads
    // bits 2s of qs[32h + 16p + l]. scales[0] = 0x23 (scale 3, min 2), qs[0] = 0xE4 (2-bit fields 0, 1, 2,
    // 3): value 0 = 0.5*3*0 - 0.25*2 = -0.5; values 32 / 64 / 96 (s = 1, 2, 3; scale 1, min 0) = 0.5, 1, 1.5;
    // value 208 = sub-block 13 (h 1, s 2, p 1; scales[13] = 0x1F), qs[48] = 0x20: 0.5*15*2 - 0.25 = 14.75.
    {
        std::vector<uint8_t> b(84, 0);
        put_half(b, 80, 0.5f);
        put_half(b, 82, 0.25f);
        b[0] = 0x23;
        b[2] = b[4] = b[6] = 0x01;
        b[13] = 0x1F;
        b[16 + 0] = 0xE4;
        b[16 + 48] = 0x20;
        const std::vector<float> y = decode(GgmlType::Q2_K, b);
        EXPECT_EQ(y[0], -0.5f);
        EXPECT_EQ(y[1], -0.5f);
        EXPECT_EQ(y[16], 0.f);
        EXPECT_EQ(y[32], 0.5f);
        EXPECT_EQ(y[64], 1.f);
        EXPECT_EQ(y[96], 1.5f);
        EXPECT_EQ(y[208], 14.75f);
    }
    // Q3_K (hmask @0, qs @32, scales @96, d @108): d = 0.25; all-zero 6-bit scales mean -32 and a clear hmask
    // bit subtracts 4, so a zero value is 0.25*-32*(0 - 4) = 32. Value 0: qs[0] = 3 with hmask bit set: -8*3
    // = -24. Sub-block 10 (h 1, s 1, p 0): scale low nibble = high nibble of scales[2] (5), high bits = bits
    // 4-5 of scales[10] (2): 37 - 32 = 5, dl = 1.25; value 160 = (qs[32] >> 2) & 3 = 2, hmask[0] bit 5
    // set: 2.5; value 161 = 1.25*(0 - 4) = -5.
    {
        std::vector<uint8_t> b(110, 0);
        put_half(b, 108, 0.25f);
        b[0] = 0x21;
        b[32 + 0] = 0x03;
        b[32 + 32] = 0x08;
        b[96 + 2] = 0x50;
        b[96 + 10] = 0x20;
        const std::vector<float> y = decode(GgmlType::Q3_K, b);
        EXPECT_EQ(y[0], -24.f);
        EXPECT_EQ(y[1], 32.f);
        EXPECT_EQ(y[160], 2.5f);
        EXPECT_EQ(y[161], -5.f);
    }
    // IQ2_XXS (d @0, qs @2): d = 1; first 32 values: grid indices {1, 0, 0, 0}, then the u32 3 << 28 | sign
    // index 1 (ksigns 129: values 0 and 7 negative): db = (0.5 + 3)*0.25 = 0.875; grid entry 1 = {43, 8 x 7}:
    // value 0 = -37.625, 1 = 7, 7 = -7, 8 (entry 0, all 8) = 7. Next 32 values: scale 0, db = 0.125: 1.
    {
        std::vector<uint8_t> b(66, 0);
        put_half(b, 0, 1.f);
        b[2] = 1;
        put32(b, 2 + 4, 0x30000001u);
        const std::vector<float> y = decode(GgmlType::IQ2_XXS, b);
        EXPECT_EQ(y[0], -37.625f);
        EXPECT_EQ(y[1], 7.f);
        EXPECT_EQ(y[7], -7.f);
        EXPECT_EQ(y[8], 7.f);
        EXPECT_EQ(y[32], 1.f);
    }
    // IQ2_XS (d @0, qs u16 @2, scales @66): d = 2; qs[0] = grid index 2 | sign index 3 << 9 (ksigns 3: values
    // 0 and 1 negative); scales[0] = 0x51: db = 2*1.5*0.25 = 0.75 for values 0-15, 2*5.5*0.25 = 2.75 for
    // 16-31. Grid entry 2 = {25, 25, 8, ...}: values -18.75, -18.75, 6; value 16 (entry 0) = 22.
    {
        std::vector<uint8_t> b(74, 0);
        put_half(b, 0, 2.f);
        put16(b, 2, static_cast<uint16_t>(2 | (3 << 9)));
        b[66] = 0x51;
        const std::vector<float> y = decode(GgmlType::IQ2_XS, b);
        EXPECT_EQ(y[0], -18.75f);
        EXPECT_EQ(y[1], -18.75f);
        EXPECT_EQ(y[2], 6.f);
        EXPECT_EQ(y[16], 22.f);
    }
    // IQ2_S (d @0, qs @2, signs @34, qh @66, scales @74): d = 4; qs[0] = 1, qh[0] = 0x05: group 0 index 257
    // = {8, 43, 25, 25, 25, 8, 25, 8}, group 1 index 256 = {25, 25, 25, 25, 25, 8, 25, 8}; signs[0] = 0x80;
    // scales[0] = 0x32: db = 4*2.5*0.25 = 2.5 (values 0-15), 4*3.5*0.25 = 3.5 (16-31).
    {
        std::vector<uint8_t> b(82, 0);
        put_half(b, 0, 4.f);
        b[2] = 1;
        b[34] = 0x80;
        b[66] = 0x05;
        b[74] = 0x32;
        const std::vector<float> y = decode(GgmlType::IQ2_S, b);
        EXPECT_EQ(y[0], 20.f);
        EXPECT_EQ(y[1], 107.5f);
        EXPECT_EQ(y[7], -20.f);
        EXPECT_EQ(y[8], 62.5f);
        EXPECT_EQ(y[13], 20.f);
        EXPECT_EQ(y[16], 28.f);
    }
    // IQ3_XXS (d @0, qs @2, scales_signs @66): d = 0.5; qs = {1, 0, ...}: entry 1 = {20, 4, 4, 4}, entry 0 =
    // all 4; first u32 2 << 28 | 127 (ksigns 255: values 0-7 negative): db = 0.5*2.5*0.5 = 0.625: value 0 =
    // -12.5, 1 and 4 = -2.5, 8 = 2.5; value 32 (scale 0: db = 0.125) = 0.5.
    {
        std::vector<uint8_t> b(98, 0);
        put_half(b, 0, 0.5f);
        b[2] = 1;
        put32(b, 66, 0x2000007Fu);
        const std::vector<float> y = decode(GgmlType::IQ3_XXS, b);
        EXPECT_EQ(y[0], -12.5f);
        EXPECT_EQ(y[1], -2.5f);
        EXPECT_EQ(y[4], -2.5f);
        EXPECT_EQ(y[8], 2.5f);
        EXPECT_EQ(y[32], 0.5f);
    }
    // IQ3_S (d @0, qs @2, qh @66, signs @74, scales @106): d = 1; scales[0] = 0x21: db = 1 + 2*1 = 3 (values
    // 0-31), 1 + 2*2 = 5 (32-63); qs = {0, 1}, qh[0] = 1: indices 256 = {7, 5, 9, 5} and 1 = {3, 1, 1, 1};
    // signs[0] = 0x10 (value 4 negative).
    {
        std::vector<uint8_t> b(110, 0);
        put_half(b, 0, 1.f);
        b[2 + 1] = 1;
        b[66] = 0x01;
        b[74] = 0x10;
        b[106] = 0x21;
        const std::vector<float> y = decode(GgmlType::IQ3_S, b);
        EXPECT_EQ(y[0], 21.f);
        EXPECT_EQ(y[1], 15.f);
        EXPECT_EQ(y[2], 27.f);
        EXPECT_EQ(y[4], -9.f);
        EXPECT_EQ(y[5], 3.f);
        EXPECT_EQ(y[8], 3.f);
        EXPECT_EQ(y[32], 5.f);
    }
    // IQ1_S (d @0, qs @2, qh u16 @34): d = 0.5; qh[0] = 0xA008: delta -0.125, scale 2 (dl = 0.5*5 = 2.5),
    // group 1 index high bits 1 -> entry 256 = {-1, 0, 1, 0, 1, -1, 0, -1}; group 0 entry 0 (all -1):
    // 2.5*-1.125 = -2.8125. Value 32 (qh[1] = 0: dl = 0.5, delta +0.125) = 0.5*-0.875 = -0.4375.
    {
        std::vector<uint8_t> b(50, 0);
        put_half(b, 0, 0.5f);
        put16(b, 34, 0xA008);
        const std::vector<float> y = decode(GgmlType::IQ1_S, b);
        EXPECT_EQ(y[0], -2.8125f);
        EXPECT_EQ(y[8], -2.8125f);
        EXPECT_EQ(y[9], -0.3125f);
        EXPECT_EQ(y[10], 2.1875f);
        EXPECT_EQ(y[32], -0.4375f);
    }
    // IQ1_M (qs @0, qh @32, scales u16 @48): d = fp16 0x3C00 = 1 from the top nibbles of the 4 scale u16s (0,
    // 0, 0xC, 0x3); scales u16 0 = 0x000B: 3-bit scales 3 (values 0-15: dl 7) and 1 (16-31: dl 3), then 0 (dl
    // 1); qh[0] = 0x81: group 0 index 256 with delta +0.125, group 1 index 0 with delta -0.125.
    {
        std::vector<uint8_t> b(56, 0);
        b[32] = 0x81;
        put16(b, 48, 0x000B);
        put16(b, 52, 0xC000);
        put16(b, 54, 0x3000);
        const std::vector<float> y = decode(GgmlType::IQ1_M, b);
        EXPECT_EQ(y[0], -6.125f);
        EXPECT_EQ(y[1], 0.875f);
        EXPECT_EQ(y[2], 7.875f);
        EXPECT_EQ(y[8], -7.875f);
        EXPECT_EQ(y[16], -2.625f);
        EXPECT_EQ(y[32], -0.875f);
    }
    // IQ4_NL (d @0, qs @2; levels -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113):
    // d = 0.5, qs[0] = 0xF0, qs[1] = 0x78.
    {
        std::vector<uint8_t> b(18, 0);
        put_half(b, 0, 0.5f);
        b[2] = 0xF0;
        b[3] = 0x78;
        const std::vector<float> y = decode(GgmlType::IQ4_NL, b);
        EXPECT_EQ(y[0], -63.5f);
        EXPECT_EQ(y[16], 56.5f);
        EXPECT_EQ(y[1], 0.5f);
        EXPECT_EQ(y[17], -5.f);
    }
    // IQ4_XS (d @0, scales_h u16 @2, scales_l @4, qs @8): d = 0.25; group 0 scale 1 | 2 << 4 = 33 (dl 0.25),
    // the others 0 (dl -8); qs[0] = 0x0F: value 0 = 0.25*113, value 16 = 0.25*-127; values 32 and 64 (nibble
    // 0) = -8*-127.
    {
        std::vector<uint8_t> b(136, 0);
        put_half(b, 0, 0.25f);
        put16(b, 2, 0x0002);
        b[4] = 0x01;
        b[8] = 0x0F;
        const std::vector<float> y = decode(GgmlType::IQ4_XS, b);
        EXPECT_EQ(y[0], 28.25f);
        EXPECT_EQ(y[16], -31.75f);
        EXPECT_EQ(y[32], 1016.f);
        EXPECT_EQ(y[64], 1016.f);
    }
}

TEST(Quant, QuantiserRoundTripErrors) {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int n = 256 * 64;
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    struct Case {
        GgmlType t;
        double max_rel_rms;
    };
    // Relative RMS error bounds: a few times the uniform-quantiser noise of each format on N(0, 1) data.
    const Case cases[] = {{GgmlType::F16, 1e-3},     {GgmlType::BF16, 5e-3},   {GgmlType::Q8_0, 0.01},
                          {GgmlType::Q6_K, 0.03},    {GgmlType::Q5_K, 0.05},   {GgmlType::Q4_K, 0.10},
                          {GgmlType::Q5_0, 0.06},    {GgmlType::Q5_1, 0.06},   {GgmlType::Q4_0, 0.12},
                          {GgmlType::Q4_1, 0.12},    {GgmlType::IQ4_NL, 0.12}, {GgmlType::IQ4_XS, 0.12},
                          {GgmlType::Q3_K, 0.25},    {GgmlType::Q2_K, 0.45},   {GgmlType::IQ3_S, 0.16},
                          {GgmlType::IQ3_XXS, 0.22}, {GgmlType::IQ2_S, 0.30},  {GgmlType::IQ2_XS, 0.35},
                          {GgmlType::IQ2_XXS, 0.40}};
    for (const Case& c : cases) {
        const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(c.t));
        SCOPED_TRACE(tt.name);
        std::vector<uint8_t> q(ggml_row_bytes(tt, n));
        quantize_row(c.t, x.data(), q.data(), n);
        std::vector<float> y(n);
        dequantize_ref(c.t, q.data(), y.data(), n);
        double e = 0, s = 0;
        for (int i = 0; i < n; ++i) e += (y[i] - x[i]) * (y[i] - x[i]), s += x[i] * x[i];
        const double rel = std::sqrt(e / s);
        EXPECT_LT(rel, c.max_rel_rms);
        EXPECT_GT(rel, 0.0);
        RecordProperty(std::string("rel_rms_") + tt.name, std::to_string(rel));
        std::printf("%-5s relative RMS error %.5f\n", tt.name, rel);
    }
}

TEST(Quant, ZerosAndExactValues) {
    std::vector<float> z(256, 0.f), y(256, 1.f);
    std::vector<GgmlType> written(std::begin(kQuantTypes), std::end(kQuantTypes));
    written.insert(written.end(),
                   {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::IQ2_XXS,
                    GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S});
    for (GgmlType t : written) {
        const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(t));
        std::vector<uint8_t> q(tt.type_size * (256 / tt.block_size));
        quantize_row(t, z.data(), q.data(), 256);
        dequantize_ref(t, q.data(), y.data(), 256);
        for (float v : y) ASSERT_EQ(v, 0.f) << tt.name;
    }
    // Integers in [-127, 127] with the block maximum 127 are exact in Q8_0 (d = 1).
    std::vector<float> x(32);
    for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i * 8 - 127 + (i == 31 ? 2 : 0));
    x[31] = 127;
    std::vector<uint8_t> q(34);
    quantize_row(GgmlType::Q8_0, x.data(), q.data(), 32);
    std::vector<float> out(32);
    dequantize_ref(GgmlType::Q8_0, q.data(), out.data(), 32);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], x[i]) << i;
}

TEST(Quant, Refusals) {
    std::vector<uint8_t> q(1024);
    std::vector<float> y(256);
    try {
        dequantize_ref(GgmlType::TQ1_0, q.data(), y.data(), 256);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("tq1_0"), std::string::npos) << e.what();
    }
    EXPECT_THROW(dequantize_ref(GgmlType::Q4_K, q.data(), y.data(), 100), Error);  // not whole blocks
    EXPECT_THROW(quantize_row(GgmlType::IQ1_S, y.data(), q.data(), 256), Error);   // read, not written
    EXPECT_FALSE(ggml_type_writable(GgmlType::IQ1_M));
    EXPECT_TRUE(ggml_type_writable(GgmlType::IQ4_XS));
}

TEST(Quant, ConvertTypeRules) {
    // Clef-Flash's shape: 32 layers, 16 query / 4 KV heads (n_gqa 4), an output matrix.
    GgufMixContext ctx{32, 4, true, false};
    auto ty = [&](const std::string& n, std::vector<uint64_t> d, GgufFileType ft) {
        return ggml_type_name(gguf_tensor_type(n, d, ft, ctx));
    };
    using FT = GgufFileType;
    const std::vector<uint64_t> sq{4096, 4096}, up{4096, 12288}, down{12288, 4096}, vocab{4096, 248320};
    // 1-D tensors, norms, ssm_a / conv: f32.
    EXPECT_EQ(ty("blk.0.attn_norm.weight", {4096}, FT::Q4_K_M), "f32");
    EXPECT_EQ(ty("blk.0.ssm_conv1d.weight", {4, 8192}, FT::Q8_0), "f32");
    EXPECT_EQ(ty("decision.scales", {3}, FT::Q4_K_M), "f32");
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", up, FT::F32), "f32");
    // Q4_K_M (llama.cpp's llama_tensor_get_type): base q4_K, output q6_K, the attn_v class (attn_qkv, attn_v)
    // and ffn_down q6_K on the use_more_bits layers (i < n/8, i >= 7n/8, (i - n/8) % 3 == 2).
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", up, FT::Q4_K_M), "q4_K");
    EXPECT_EQ(ty("token_embd.weight", vocab, FT::Q4_K_M), "q4_K");
    EXPECT_EQ(ty("output.weight", vocab, FT::Q4_K_M), "q6_K");
    EXPECT_EQ(ty("blk.1.attn_qkv.weight", {4096, 8192}, FT::Q4_K_M), "q6_K");  // 1 < 32/8
    EXPECT_EQ(ty("blk.5.attn_qkv.weight", {4096, 8192}, FT::Q4_K_M), "q4_K");  // (5-4)%3 != 2
    EXPECT_EQ(ty("blk.6.attn_v.weight", {4096, 1024}, FT::Q4_K_M), "q6_K");    // (6-4)%3 == 2
    EXPECT_EQ(ty("blk.1.ssm_out.weight", sq, FT::Q4_K_M), "q4_K");
    EXPECT_EQ(ty("blk.0.ffn_down.weight", down, FT::Q4_K_M), "q6_K");
    EXPECT_EQ(ty("blk.7.ffn_down.weight", down, FT::Q4_K_M), "q4_K");  // (7-4)%3 == 0
    EXPECT_EQ(ty("blk.6.ffn_down.weight", down, FT::Q5_K_M), "q6_K");
    EXPECT_EQ(ty("blk.1.ffn_up.weight", up, FT::Q5_K_M), "q5_K");
    // Q2_K: attn_v q4_K (n_gqa >= 4), ffn_down and attn_output q3_K.
    EXPECT_EQ(ty("blk.3.attn_v.weight", {4096, 1024}, FT::Q2_K), "q4_K");
    EXPECT_EQ(ty("blk.9.ffn_down.weight", down, FT::Q2_K), "q3_K");
    EXPECT_EQ(ty("blk.3.attn_output.weight", sq, FT::Q2_K), "q3_K");
    EXPECT_EQ(ty("blk.9.ffn_up.weight", up, FT::Q2_K), "q2_K");
    // Q3_K_M: attn_v q5_K on the first two, q4_K after; ffn_down q5_K below n/16, q4_K after.
    EXPECT_EQ(ty("blk.1.attn_qkv.weight", {4096, 8192}, FT::Q3_K_M), "q5_K");
    EXPECT_EQ(ty("blk.2.attn_qkv.weight", {4096, 8192}, FT::Q3_K_M), "q4_K");
    EXPECT_EQ(ty("blk.1.ffn_down.weight", down, FT::Q3_K_M), "q5_K");
    EXPECT_EQ(ty("blk.2.ffn_down.weight", down, FT::Q3_K_M), "q4_K");
    EXPECT_EQ(ty("blk.2.ffn_up.weight", up, FT::Q3_K_L), "q3_K");
    // IQ2_M (base iq2_s): output q5_K, token_embd iq3_s, attn_v q4_K, early ffn_down / attn_output iq3_s.
    EXPECT_EQ(ty("output.weight", vocab, FT::IQ2_M), "q5_K");
    EXPECT_EQ(ty("token_embd.weight", vocab, FT::IQ2_M), "iq3_s");
    EXPECT_EQ(ty("blk.0.attn_qkv.weight", {4096, 8192}, FT::IQ2_M), "q4_K");
    EXPECT_EQ(ty("blk.0.ffn_down.weight", down, FT::IQ2_M), "iq3_s");
    EXPECT_EQ(ty("blk.4.ffn_down.weight", down, FT::IQ2_M), "iq2_s");
    EXPECT_EQ(ty("blk.4.ffn_gate.weight", up, FT::IQ2_S), "iq2_xs");
    EXPECT_EQ(ty("token_embd.weight", vocab, FT::IQ1_M), "q2_K");
    // IQ4_XS: attn_v q5_K; early ffn_down q5_K without an importance matrix, iq4_xs with one.
    EXPECT_EQ(ty("blk.3.attn_v.weight", {4096, 1024}, FT::IQ4_XS), "q5_K");
    EXPECT_EQ(ty("blk.0.ffn_down.weight", down, FT::IQ4_XS), "q5_K");
    ctx.has_imatrix = true;
    EXPECT_EQ(ty("blk.0.ffn_down.weight", down, FT::IQ4_XS), "iq4_xs");
    ctx.has_imatrix = false;
    // Head: q8_0 matrices, scorer_out bf16, in every quantised type.
    EXPECT_EQ(ty("decision.proj_memory.weight", {4096, 1024}, FT::Q4_K_M), "q8_0");
    EXPECT_EQ(ty("decision.proj_memory.weight", {4096, 1024}, FT::IQ2_XXS), "q8_0");
    EXPECT_EQ(ty("decision.scorer_out.weight", {1024, 1}, FT::Q4_K_M), "f32");  // one row: 1-D-like
    EXPECT_EQ(ty("decision.scorer_out.weight", {1024, 2}, FT::Q4_K_M), "bf16");
    // Fallbacks for rows that are not whole blocks (llama.cpp's): q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0,
    // q2_K / q3_K -> q4_0, the 256-value i-quants -> iq4_nl, then f16.
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {64, 128}, FT::Q4_K_M), "q5_0");
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {64, 128}, FT::Q5_K_M), "q5_1");
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {64, 128}, FT::Q6_K), "q8_0");
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {64, 128}, FT::Q2_K), "q4_0");
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {64, 128}, FT::IQ4_XS), "iq4_nl");
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {64, 128}, FT::IQ2_XXS), "iq4_nl");
    EXPECT_EQ(ty("output.weight", {64, 320}, FT::Q4_K_M), "q8_0");  // output: q8_0 when q4_K does not fit
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {48, 128}, FT::Q6_K), "f16");
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {48, 128}, FT::Q8_0), "f16");
    EXPECT_EQ(ty("blk.1.ffn_gate.weight", {48, 128}, FT::BF16), "bf16");
    // Names and llama.cpp's file-type ids.
    GgufFileType ft;
    EXPECT_TRUE(parse_gguf_file_type("IQ2_M", ft));
    EXPECT_EQ(static_cast<int>(ft), 29);
    EXPECT_EQ(llama_file_type_name(29), "IQ2_M");
    EXPECT_FALSE(parse_gguf_file_type("q3_k", ft));
}

// The types llama.cpp's own llama-quantize chose for every tensor of a 4-layer flash-shaped qwen35 model
// (tests/data/gguf/llama-quantize-types.json, from its logs; the file says how it was made) equal ours.
TEST(Quant, TypeRulesMatchLlamaQuantize) {
    const JsonValue j = parse_json_or_throw(
        clef::testing::read_file(std::string(CLEF_TEST_DATA) + "/gguf/llama-quantize-types.json"), "types");
    GgufMixContext ctx{static_cast<int>(j.find("n_layers")->as_int64()),
                       static_cast<int>(j.find("n_gqa")->as_int64()), j.find("has_output")->as_bool(),
                       j.find("has_imatrix")->as_bool()};
    int checked = 0;
    for (const auto& [ftype, tensors] : j.find("types")->members()) {
        GgufFileType ft;
        ASSERT_TRUE(parse_gguf_file_type(ftype, ft)) << ftype;
        for (const auto& [name, t] : tensors.members()) {
            std::vector<uint64_t> dims;
            for (const JsonValue& d : t.find("dims")->items())
                dims.push_back(static_cast<uint64_t>(d.as_int64()));
            EXPECT_EQ(ggml_type_name(gguf_tensor_type(name, dims, ft, ctx)), t.find("type")->as_string())
                << ftype << " " << name;
            ++checked;
        }
    }
    EXPECT_GE(checked, 5 * 56);
}
