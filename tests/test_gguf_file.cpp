// GGUF tensor data: the writer's files read back (metadata, tensor views, alignment), and the validation of
// tensor data (unknown types, rows that are not whole blocks, bytes past the end, overlaps, misalignment):
// every malformed file is a clef::Error naming the file and the problem, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "quant/quant.h"
#include "util/error.h"

using namespace clef;
namespace fs = std::filesystem;

namespace {

class GgufFileTest : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("clef-test-gguf-file-" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string& n) const { return (dir_ / n).string(); }

    // Three tensors: a f32 [2][3], b q8_0 [2][64], c q4_K [1][256]; bytes = index pattern.
    std::string write_sample(const std::string& name) {
        GgufWriter w;
        w.add_string("general.architecture", "test");
        w.add_uint32("test.n", 7);
        w.add_float32("test.eps", 1e-6f);
        w.add_bool("test.flag", true);
        w.add_int32_array("test.sections", {11, 11, 10, 0});
        w.add_string_array("test.words", {"a", "bc"});
        auto pattern = [](uint8_t seed) {
            return [seed](unsigned char* d, uint64_t n) {
                for (uint64_t i = 0; i < n; ++i) d[i] = static_cast<unsigned char>(seed + i);
            };
        };
        auto fa = pattern(1), fb = pattern(50), fc = pattern(200);
        w.add_tensor("a", 0, {3, 2}, 24, [fa](unsigned char* d) { fa(d, 24); });
        w.add_tensor("b", 8, {64, 2}, 4 * 34, [fb](unsigned char* d) { fb(d, 4 * 34); });
        w.add_tensor("c", 12, {256, 1}, 144, [fc](unsigned char* d) { fc(d, 144); });
        const std::string p = path(name);
        w.write(p);
        return p;
    }

    static std::vector<unsigned char> read(const std::string& p) {
        std::ifstream f(p, std::ios::binary);
        return {std::istreambuf_iterator<char>(f), {}};
    }
    std::string write_bytes(const std::string& n, const std::vector<unsigned char>& b) {
        std::ofstream f(path(n), std::ios::binary);
        f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
        return path(n);
    }
    // File offset of the tensor info fields after the name of tensor `name` (a 1-character name).
    static size_t info_after_name(const std::vector<unsigned char>& b, char name) {
        for (size_t i = 0; i + 9 < b.size(); ++i) {
            uint64_t len;
            std::memcpy(&len, &b[i], 8);
            if (len == 1 && b[i + 8] == static_cast<unsigned char>(name)) {
                uint32_t nd;
                std::memcpy(&nd, &b[i + 9], 4);
                if (nd == 2) return i + 9;
            }
        }
        ADD_FAILURE() << "tensor info not found";
        return 0;
    }
    void expect_error(const std::vector<unsigned char>& b, const std::string& what) {
        const std::string p = write_bytes("bad.gguf", b);
        try {
            GgufFile::open(p);
            ADD_FAILURE() << "opened a malformed file; expected: " << what;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
        }
    }

    fs::path dir_;
};

template <class T>
void patch(std::vector<unsigned char>& b, size_t off, T v) {
    std::memcpy(&b[off], &v, sizeof(T));
}

}  // namespace

TEST_F(GgufFileTest, WriterRoundTrip) {
    const GgufFile f = GgufFile::open(write_sample("ok.gguf"));
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.get_string("general.architecture"), "test");
    EXPECT_EQ(f.get_uint("test.n"), 7u);
    EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("test.eps")), 1e-6f);
    EXPECT_TRUE(f.get_bool("test.flag"));
    EXPECT_EQ(f.get_int_array("test.sections"), (std::vector<int64_t>{11, 11, 10, 0}));
    EXPECT_EQ(f.get_string_array("test.words"), (std::vector<std::string_view>{"a", "bc"}));
    ASSERT_EQ(f.tensors().size(), 3u);
    const GgufTensorInfo* b = f.find_tensor("b");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->ggml_type, 8u);
    EXPECT_EQ(b->nbytes, 136u);
    EXPECT_EQ(b->row_length(), 64u);
    EXPECT_EQ(b->n_rows(), 2u);
    EXPECT_EQ(b->torch_shape(), (std::vector<int64_t>{2, 64}));
    EXPECT_EQ(b->data[0], 50);
    EXPECT_EQ(b->data[135], static_cast<unsigned char>(50 + 135));
    for (const GgufTensorInfo& t : f.tensors()) {
        EXPECT_EQ((t.data - f.file_data()) % 32, 0) << t.name;
        EXPECT_EQ(t.data, f.file_data() + f.data_offset() + t.offset);
    }
    EXPECT_EQ(f.find_tensor("c")->nbytes, 144u);
    EXPECT_EQ(f.find_tensor("a")->data[23], 24);
}

TEST_F(GgufFileTest, TruncatedData) {
    std::vector<unsigned char> b = read(write_sample("t.gguf"));
    b.resize(b.size() - 40);  // c's last bytes gone
    expect_error(b, "run past the end of the data section");
}

TEST_F(GgufFileTest, Overlap) {
    std::vector<unsigned char> b = read(write_sample("o.gguf"));
    const size_t p = info_after_name(b, 'c');  // n_dims, dims[2], type, offset
    patch<uint64_t>(b, p + 4 + 16 + 4, 64);    // c starts inside b (b: 32..168)
    expect_error(b, "overlap");
}

TEST_F(GgufFileTest, UnknownType) {
    std::vector<unsigned char> b = read(write_sample("u.gguf"));
    patch<uint32_t>(b, info_after_name(b, 'b') + 4 + 16, 31);
    expect_error(b, "unknown ggml type 31");
}

TEST_F(GgufFileTest, RowNotWholeBlocks) {
    std::vector<unsigned char> b = read(write_sample("r.gguf"));
    patch<uint64_t>(b, info_after_name(b, 'b') + 4, 48);
    expect_error(b, "row length 48 is not a multiple of the q8_0 block size 32");
}

TEST_F(GgufFileTest, Misaligned) {
    std::vector<unsigned char> b = read(write_sample("m.gguf"));
    patch<uint64_t>(b, info_after_name(b, 'c') + 4 + 16 + 4, 8);
    expect_error(b, "not a multiple of the alignment 32");
}

TEST_F(GgufFileTest, TypeSizeLargerThanFile) {
    // An unsupported but known type whose blocks need more bytes than the file has (q8_K, 292 B per 256).
    std::vector<unsigned char> b = read(write_sample("s.gguf"));
    patch<uint32_t>(b, info_after_name(b, 'c') + 4 + 16, 15);
    patch<uint64_t>(b, info_after_name(b, 'c') + 4, 256 * 4);
    expect_error(b, "run past the end");
}

TEST_F(GgufFileTest, EveryTruncationIsAnErrorNotACrash) {
    const std::string full = write_sample("full.gguf");
    const std::vector<unsigned char> b = read(full);
    // Cuts inside the tail padding after the last tensor's bytes are still valid files.
    const GgufFile f = GgufFile::open(full);
    const size_t end = static_cast<size_t>(f.find_tensor("c")->data + 144 - f.file_data());
    for (size_t n = 0; n < end; n += 3) {
        std::vector<unsigned char> cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
        const std::string p = write_bytes("cut.gguf", cut);
        EXPECT_THROW(GgufFile::open(p), Error) << n;
    }
}

TEST_F(GgufFileTest, WriterFailureLeavesNoFile) {
    GgufWriter w;
    w.add_tensor("x", 0, {4}, 16, [](unsigned char*) { throw Error("boom"); });
    EXPECT_THROW(w.write(path("fail.gguf")), Error);
    EXPECT_FALSE(fs::exists(path("fail.gguf")));
    EXPECT_FALSE(fs::exists(path("fail.gguf.partial")));
}
