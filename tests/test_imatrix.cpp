// Importance matrices (tools/imatrix.h): llama.cpp's two file formats, written here byte by byte from the
// format description, read back; malformed files refused; the low-bit quantisers weigh their error by them;
// `clef convert --imatrix` uses them, and refuses the types clef reads but does not write.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/gguf.h"
#include "quant/quant.h"
#include "test_util.h"
#include "tools/imatrix.h"
#include "util/error.h"

using namespace clef;

namespace {

std::string dir() {
    const std::string d = ::testing::TempDir() + "/clef_imatrix";
    std::filesystem::create_directories(d);
    return d;
}

struct Bytes {
    std::vector<char> b;
    void i32(int32_t v) { b.insert(b.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 4); }
    void f32s(std::initializer_list<float> v) {
        for (float x : v) b.insert(b.end(), reinterpret_cast<char*>(&x), reinterpret_cast<char*>(&x) + 4);
    }
    void str(const std::string& s) {
        i32(static_cast<int32_t>(s.size()));
        b.insert(b.end(), s.begin(), s.end());
    }
    std::string write(const std::string& name) const {
        const std::string p = dir() + "/" + name;
        std::ofstream(p, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
        return p;
    }
};

// A legacy file: two entries, then the chunk count and a dataset name.
Bytes legacy() {
    Bytes f;
    f.i32(2);
    f.str("blk.0.ffn_up.weight");
    f.i32(4);  // ncall
    f.i32(3);
    f.f32s({4.f, 8.f, 12.f});
    f.str("b");
    f.i32(0);
    f.i32(2);
    f.f32s({5.f, 6.f});
    f.i32(7);
    f.str("wiki");
    return f;
}

}  // namespace

TEST(Imatrix, LegacyFormat) {
    const ImportanceMatrix m = load_imatrix(legacy().write("legacy.dat"));
    ASSERT_EQ(m.columns.size(), 2u);
    EXPECT_EQ(m.columns.at("blk.0.ffn_up.weight"), (std::vector<float>{1.f, 2.f, 3.f}));  // divided by ncall
    EXPECT_EQ(m.columns.at("b"), (std::vector<float>{5.f, 6.f}));  // ncall 0: as stored
    EXPECT_EQ(m.chunks, 7);
    EXPECT_EQ(m.datasets, std::vector<std::string>{"wiki"});
    EXPECT_NE(m.find("b", 2), nullptr);
    EXPECT_EQ(m.find("c", 2), nullptr);
    EXPECT_THROW(m.find("b", 3), Error);  // another width: another model's matrix
}

TEST(Imatrix, GgufFormat) {
    GgufWriter w;
    w.add_string_array("imatrix.datasets", {"a.txt"});
    w.add_uint32("imatrix.chunk_count", 3);
    auto f32 = [&](const std::string& name, std::vector<float> v) {
        w.add_tensor(name, 0, {v.size()}, v.size() * 4,
                     [v](unsigned char* dst) { std::memcpy(dst, v.data(), v.size() * 4); });
    };
    f32("x.in_sum2", {2.f, 4.f, 6.f, 8.f});
    f32("x.counts", {2.f});
    f32("y.in_sum2", {9.f, 9.f});
    f32("y.counts", {0.f});  // never seen: 1 (llama.cpp's rule)
    const std::string p = dir() + "/m.gguf";
    w.write(p);
    const ImportanceMatrix m = load_imatrix(p);
    EXPECT_EQ(m.columns.at("x"), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
    EXPECT_EQ(m.columns.at("y"), (std::vector<float>{1.f, 1.f}));
    EXPECT_EQ(m.chunks, 3);
    EXPECT_EQ(m.datasets, std::vector<std::string>{"a.txt"});
}

TEST(Imatrix, MalformedFilesRefused) {
    Bytes whole = legacy();
    for (size_t cut : {size_t{3}, size_t{10}, size_t{40}}) {
        Bytes t;
        t.b.assign(whole.b.begin(), whole.b.begin() + static_cast<long>(cut));
        EXPECT_THROW(load_imatrix(t.write("cut.dat")), Error) << cut;
    }
    Bytes neg;
    neg.i32(1);
    neg.str("n");
    neg.i32(1);
    neg.i32(1);
    neg.f32s({-1.f});
    EXPECT_THROW(load_imatrix(neg.write("neg.dat")), Error);
    Bytes empty;
    empty.i32(0);
    EXPECT_THROW(load_imatrix(empty.write("empty.dat")), Error);
    EXPECT_THROW(load_imatrix(dir() + "/missing.dat"), Error);
}

// With an importance that stresses every eighth column, the low-bit quantisers' error there (weighted by
// the importance) is smaller than without it.
TEST(Imatrix, QuantisersWeighTheirError) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int n = 256 * 16;
    std::vector<float> x(n), imp(n), y(n);
    for (float& v : x) v = nd(rng);
    for (int i = 0; i < n; ++i) imp[i] = i % 8 == 0 ? 100.f : 1.f;
    for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
        const GgmlTypeTraits tt = ggml_type_traits(static_cast<uint32_t>(t));
        SCOPED_TRACE(tt.name);
        std::vector<uint8_t> q(ggml_row_bytes(tt, n));
        auto weighted_error = [&](const float* importance) {
            quantize_row(t, x.data(), q.data(), n, importance);
            dequantize_ref(t, q.data(), y.data(), n);
            double e = 0;
            for (int i = 0; i < n; ++i) e += imp[i] * (y[i] - x[i]) * (y[i] - x[i]);
            return e;
        };
        const double plain = weighted_error(nullptr), weighted = weighted_error(imp.data());
        EXPECT_LT(weighted, 0.9 * plain);
    }
}

// `clef convert --imatrix`: the llama.cpp-written blocks file (tests/data/gguf) requantised to q2_k with and
// without a matrix gives different bytes; a matrix of the wrong width is refused; iq2_xxs is refused without
// a matrix and written with one; the i-quant types clef does not write (IQ1) are refused by name.
TEST(Imatrix, ConvertUsesIt) {
    const std::string src = std::string(CLEF_TEST_DATA) + "/gguf/ggml-blocks.gguf";
    const GgufFile f = GgufFile::open(src);
    Bytes m;
    m.i32(static_cast<int32_t>(f.tensors().size()));
    for (const GgufTensorInfo& t : f.tensors()) {
        m.str(t.name);
        m.i32(1);
        m.i32(static_cast<int32_t>(t.row_length()));
        for (uint64_t j = 0; j < t.row_length(); ++j) m.f32s({j % 8 == 0 ? 50.f : 1.f});
    }
    const std::string imatrix = m.write("blocks.dat");
    auto convert = [&](const std::string& extra, const std::string& out, int& status) {
        return clef::testing::run_command(std::string(CLEF_BINARY) + " convert --model " + src + " --out " +
                                              dir() + "/" + out + " " + extra + " 2>&1",
                                          status);
    };
    int status = 0;
    convert("--type q2_k", "plain.gguf", status);
    ASSERT_EQ(WEXITSTATUS(status), 0);
    convert("--type q2_k --imatrix " + imatrix, "weighted.gguf", status);
    ASSERT_EQ(WEXITSTATUS(status), 0);
    const GgufFile a = GgufFile::open(dir() + "/plain.gguf"), b = GgufFile::open(dir() + "/weighted.gguf");
    const GgufTensorInfo *ta = a.find_tensor("f16.weight"), *tb = b.find_tensor("f16.weight");
    ASSERT_TRUE(ta && tb);
    EXPECT_EQ(ta->ggml_type, 10u);  // q2_K
    EXPECT_NE(std::memcmp(ta->data, tb->data, ta->nbytes), 0);

    Bytes narrow;
    narrow.i32(1);
    narrow.str("f16.weight");
    narrow.i32(1);
    narrow.i32(2);
    narrow.f32s({1.f, 1.f});
    std::string log = convert("--type q2_k --imatrix " + narrow.write("narrow.dat"), "x.gguf", status);
    EXPECT_EQ(WEXITSTATUS(status), 2);
    EXPECT_NE(log.find("another model"), std::string::npos) << log;

    log = convert("--type iq2_xxs", "y.gguf", status);  // needs the matrix
    EXPECT_EQ(WEXITSTATUS(status), 2);
    EXPECT_NE(log.find("needs an importance matrix"), std::string::npos) << log;
    convert("--type iq2_xxs --imatrix " + imatrix, "y.gguf", status);
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_EQ(GgufFile::open(dir() + "/y.gguf").find_tensor("f16.weight")->ggml_type, 16u);  // IQ2_XXS

    log = convert("--type iq1_s --imatrix " + imatrix, "z.gguf", status);
    EXPECT_EQ(WEXITSTATUS(status), 2);
    EXPECT_NE(log.find("iq1_s"), std::string::npos) << log;
    EXPECT_NE(log.find("cannot write yet"), std::string::npos) << log;
}
