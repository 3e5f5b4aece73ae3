// SafetensorsFile / Checkpoint: malformed headers written to a temp dir, sharded checkpoints, and the good
// path on tests/data/tiny-clef/model.safetensors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using clef::Checkpoint;
using clef::DType;
using clef::SafetensorsFile;

const std::string kTiny = std::string(CLEF_TEST_DATA) + "/tiny-clef";

std::string le64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << p;
}

// A file with the given header text and data section.
void write_st(const fs::path& p, const std::string& header, const std::string& data) {
    write_bytes(p, le64(header.size()) + header + data);
}

std::string zeros(size_t n) {
    return std::string(n, '\0');
}

class SafetensorsTest : public ::testing::Test {
protected:
    std::string path(const std::string& name) const { return (dir_ / name).string(); }

    // Writes `header` + `data` to name and expects SafetensorsFile::open to fail with a message that names
    // the file and contains every fragment.
    void expect_open_error(const std::string& name, const std::string& header, const std::string& data,
                           std::initializer_list<std::string> fragments) {
        write_st(dir_ / name, header, data);
        expect_error([&] { SafetensorsFile::open(path(name)); }, path(name), fragments);
    }

    static void expect_error(const std::function<void()>& fn, const std::string& file,
                             std::initializer_list<std::string> fragments) {
        try {
            fn();
            FAIL() << "expected clef::Error mentioning " << file;
        } catch (const clef::Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(file), std::string::npos) << "message does not name " << file << ": " << msg;
            for (const auto& f : fragments)
                EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
        }
    }

    clef::testing::ScratchDir scratch_{"clef_test_safetensors"};
    fs::path dir_ = scratch_.path();
};

// ---- truncated / header length ----

TEST_F(SafetensorsTest, EmptyFile) {
    write_bytes(dir_ / "empty.safetensors", "");
    expect_error([&] { SafetensorsFile::open(path("empty.safetensors")); }, path("empty.safetensors"),
                 {"too short", "0 bytes"});
}

TEST_F(SafetensorsTest, ShorterThanLengthPrefix) {
    write_bytes(dir_ / "short.safetensors", std::string("\x02\x00\x00", 3));
    expect_error([&] { SafetensorsFile::open(path("short.safetensors")); }, path("short.safetensors"),
                 {"too short", "3 bytes"});
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFile) {
    write_bytes(dir_ / "trunc.safetensors", le64(100) + "{\"a\":");
    expect_error([&] { SafetensorsFile::open(path("trunc.safetensors")); }, path("trunc.safetensors"),
                 {"header length 100", "past the end"});
}

TEST_F(SafetensorsTest, HugeHeaderLength) {
    write_bytes(dir_ / "huge.safetensors", le64(uint64_t{1} << 63) + "{}");
    expect_error([&] { SafetensorsFile::open(path("huge.safetensors")); }, path("huge.safetensors"),
                 {"header length 9223372036854775808", "exceeds"});
    write_bytes(dir_ / "max.safetensors", le64(UINT64_MAX) + "{}");
    expect_error([&] { SafetensorsFile::open(path("max.safetensors")); }, path("max.safetensors"),
                 {"exceeds"});
}

TEST_F(SafetensorsTest, MissingFile) {
    expect_error([&] { SafetensorsFile::open(path("nope.safetensors")); }, path("nope.safetensors"),
                 {"cannot open"});
}

// ---- header JSON ----

TEST_F(SafetensorsTest, HeaderNotJson) {
    expect_open_error("notjson.safetensors", "{\"a\": [1, 2", "", {"header is not valid JSON"});
    expect_open_error("garbage.safetensors", "hello", "", {"header is not valid JSON"});
}

TEST_F(SafetensorsTest, HeaderNotObject) {
    expect_open_error("array.safetensors", "[1,2,3]", "", {"header is not a JSON object"});
    expect_open_error("string.safetensors", "\"x\"", "", {"header is not a JSON object"});
}

TEST_F(SafetensorsTest, EntryNotObjectOrMissingFields) {
    expect_open_error("entry.safetensors", R"({"t":[1,2]})", "", {"'t'", "not an object"});
    expect_open_error("nodtype.safetensors", R"({"t":{"shape":[1],"data_offsets":[0,4]}})", zeros(4),
                      {"'t'", "dtype"});
    expect_open_error("noshape.safetensors", R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", zeros(4),
                      {"'t'", "shape"});
    expect_open_error("nooffsets.safetensors", R"({"t":{"dtype":"F32","shape":[1]}})", zeros(4),
                      {"'t'", "data_offsets"});
    expect_open_error("threeoffsets.safetensors",
                      R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", zeros(8),
                      {"'t'", "data_offsets must be [begin, end]"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
    expect_open_error("dtype.safetensors", R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})",
                      zeros(2), {"'w'", "unknown dtype 'Q4_K'"});
    expect_open_error("dtype_lower.safetensors", R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})",
                      zeros(4), {"unknown dtype 'f32'"});
}

TEST_F(SafetensorsTest, ShapeTimesDtypeSizeDiffersFromByteRange) {
    // [2,3] F32 needs 24 bytes, the range has 20.
    expect_open_error("size.safetensors", R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                      zeros(24), {"'w'", "byte range 20", "(24)"});
    // Right element count, wrong dtype size: 4 BF16 values are 8 bytes, not 16.
    expect_open_error("size2.safetensors", R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})",
                      zeros(16), {"'w'", "byte range 16", "(8)"});
}

TEST_F(SafetensorsTest, RangePastDataSection) {
    expect_open_error("past.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                      zeros(8), {"'w'", "end 16", "past the data section (8 bytes)"});
}

TEST_F(SafetensorsTest, OverlappingRanges) {
    expect_open_error("overlap.safetensors",
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                          "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      zeros(12), {"'a'", "'b'", "overlap"});
    // One range inside another.
    expect_open_error("nested.safetensors",
                      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                          "b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      zeros(16), {"overlap"});
    // Identical ranges.
    expect_open_error("same.safetensors",
                      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                          "b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                      zeros(4), {"overlap"});
}

TEST_F(SafetensorsTest, OverlapIsNotHiddenByAnEmptyTensorBetween) {
    // a [0,16) and c [8,12) overlap; the empty tensor b sorts between them and must not hide it.
    expect_open_error("empty_between.safetensors",
                      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                          "b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},
                          "c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                      zeros(16), {"'a'", "'c'", "overlap"});
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
    expect_open_error("order.safetensors", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})",
                      zeros(8), {"'w'", "begin 8 > end 4"});
}

TEST_F(SafetensorsTest, BadDimensions) {
    expect_open_error("negdim.safetensors", R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})",
                      zeros(8), {"'w'", "non-negative integers"});
    expect_open_error("fracdim.safetensors", R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})",
                      zeros(8), {"'w'", "non-negative integers"});
    expect_open_error("strdim.safetensors", R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})",
                      zeros(8), {"'w'", "non-negative integers"});
    expect_open_error("overflow.safetensors",
                      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                      zeros(8), {"'w'", "overflows"});
}

TEST_F(SafetensorsTest, BadOffsets) {
    expect_open_error("negoff.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})",
                      zeros(4), {"'w'", "data_offsets must be non-negative integers"});
    expect_open_error("fracoff.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})",
                      zeros(4), {"'w'", "data_offsets must be non-negative integers"});
}

TEST_F(SafetensorsTest, BadMetadata) {
    expect_open_error("meta1.safetensors", R"({"__metadata__":["pt"]})", "",
                      {"__metadata__ is not an object"});
    expect_open_error("meta2.safetensors", R"({"__metadata__":{"format":1}})", "",
                      {"__metadata__ value for 'format' is not a string"});
}

// ---- good files ----

TEST_F(SafetensorsTest, ScalarEmptyAndMetadata) {
    const std::string header =
        R"({"__metadata__":{"format":"pt","note":"x"},
            "s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},
            "e":{"dtype":"BF16","shape":[3,0],"data_offsets":[4,4]},
            "v":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})";
    std::string data(12, '\0');
    const float s = 2.5f;
    const int32_t v[2] = {-7, 123456};
    std::memcpy(&data[0], &s, 4);
    std::memcpy(&data[4], v, 8);
    write_st(dir_ / "ok.safetensors", header, data);
    SafetensorsFile f = SafetensorsFile::open(path("ok.safetensors"));
    ASSERT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("note"), "x");
    const auto* ts = f.find("s");
    ASSERT_NE(ts, nullptr);
    EXPECT_TRUE(ts->shape.empty());
    EXPECT_EQ(ts->numel(), 1);
    EXPECT_EQ(ts->to_f32(), std::vector<float>{2.5f});
    const auto* te = f.find("e");
    ASSERT_NE(te, nullptr);
    EXPECT_EQ(te->numel(), 0);
    EXPECT_EQ(te->nbytes, 0u);
    EXPECT_TRUE(te->to_f32().empty());
    EXPECT_EQ(f.find("v")->to_f32(), (std::vector<float>{-7.0f, 123456.0f}));
    EXPECT_EQ(f.find("v")->file, path("ok.safetensors"));
    EXPECT_EQ(f.find("__metadata__"), nullptr);
    EXPECT_EQ(f.find("missing"), nullptr);
    EXPECT_EQ(f.file_size(), 8 + header.size() + 12);
}

TEST_F(SafetensorsTest, HeaderWithTrailingSpacesAndEmptyHeader) {
    write_st(dir_ / "pad.safetensors",
             std::string(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})") + "    ", "\x01\x02");
    SafetensorsFile f = SafetensorsFile::open(path("pad.safetensors"));
    EXPECT_EQ(f.find("a")->to_f32(), (std::vector<float>{1.0f, 2.0f}));
    write_st(dir_ / "none.safetensors", "{}", "");
    EXPECT_TRUE(SafetensorsFile::open(path("none.safetensors")).tensors().empty());
}

TEST_F(SafetensorsTest, ConversionsOfEveryFloatDtype) {
    const float vals[3] = {1.5f, -0.25f, 65504.0f};
    std::string data;
    auto append = [&](const void* p, size_t n) { data.append(static_cast<const char*>(p), n); };
    for (float v : vals) {
        uint16_t h = clef::f32_to_f16(v);
        append(&h, 2);
    }
    for (float v : vals) {
        double d = v;
        append(&d, 8);
    }
    for (float v : vals) {
        uint16_t b = clef::f32_to_bf16(v);
        append(&b, 2);
    }
    const uint8_t flags[2] = {1, 0};
    append(flags, 2);
    const std::string header =
        R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},
            "d":{"dtype":"F64","shape":[3],"data_offsets":[6,30]},
            "b":{"dtype":"BF16","shape":[3],"data_offsets":[30,36]},
            "m":{"dtype":"BOOL","shape":[2],"data_offsets":[36,38]}})";
    write_st(dir_ / "conv.safetensors", header, data);
    SafetensorsFile f = SafetensorsFile::open(path("conv.safetensors"));
    EXPECT_EQ(f.find("h")->to_f32(), (std::vector<float>{1.5f, -0.25f, 65504.0f}));
    EXPECT_EQ(f.find("d")->to_f32(), (std::vector<float>{1.5f, -0.25f, 65504.0f}));
    EXPECT_EQ(f.find("b")->to_f32(), (std::vector<float>{1.5f, -0.25f, 65536.0f}));  // bf16 rounds 65504 up
    EXPECT_EQ(f.find("m")->dtype, DType::BOOL);
    expect_error([&] { f.find("m")->to_f32(); }, path("conv.safetensors"), {"tensor m", "BOOL"});
}

TEST(SafetensorsTiny, ModelSafetensors) {
    const std::string p = kTiny + "/model.safetensors";
    SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(f.path(), p);
    EXPECT_EQ(f.file_size(), 1013256u);
    ASSERT_EQ(f.tensors().size(), 142u);
    int bf16 = 0, f32 = 0, text = 0, visual = 0;
    for (const auto& t : f.tensors()) {
        const bool a_log = t.name.size() >= 5 && t.name.compare(t.name.size() - 5, 5, "A_log") == 0;
        if (a_log) {
            EXPECT_EQ(t.dtype, DType::F32) << t.name;
            ++f32;
        } else {
            EXPECT_EQ(t.dtype, DType::BF16) << t.name;
            ++bf16;
        }
        if (t.name.rfind("model.visual.", 0) == 0)
            ++visual;
        else
            ++text;
        EXPECT_EQ(static_cast<size_t>(t.numel()) * clef::dtype_size(t.dtype), t.nbytes) << t.name;
        EXPECT_EQ(t.file, p);
    }
    EXPECT_EQ(f32, 6);  // one A_log per linear-attention layer
    EXPECT_EQ(bf16, 136);
    EXPECT_EQ(text, 109);
    EXPECT_EQ(visual, 33);
    for (size_t i = 1; i < f.tensors().size(); ++i) EXPECT_LT(f.tensors()[i - 1].name, f.tensors()[i].name);
    EXPECT_EQ(f.metadata().at("format"), "pt");

    const auto* emb = f.find("model.language_model.embed_tokens.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->shape, (std::vector<int64_t>{320, 64}));
    const auto* q = f.find("model.language_model.layers.3.self_attn.q_proj.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->shape, (std::vector<int64_t>{256, 64}));
    const auto* patch = f.find("model.visual.patch_embed.proj.weight");
    ASSERT_NE(patch, nullptr);
    EXPECT_EQ(patch->shape, (std::vector<int64_t>{32, 3, 2, 16, 16}));
}

TEST(SafetensorsTiny, Bf16ToF32MatchesManualBitConversion) {
    SafetensorsFile f = SafetensorsFile::open(kTiny + "/model.safetensors");
    const auto* t = f.find("model.language_model.layers.0.linear_attn.in_proj_qkv.weight");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->dtype, DType::BF16);
    const std::vector<float> got = t->to_f32();
    ASSERT_EQ(got.size(), 128u * 64u);
    size_t nonzero = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const uint32_t bits =
            static_cast<uint32_t>(t->data[2 * i]) | static_cast<uint32_t>(t->data[2 * i + 1]) << 8;
        const uint32_t f32bits = bits << 16;
        float want;
        std::memcpy(&want, &f32bits, 4);
        uint32_t got_bits;
        std::memcpy(&got_bits, &got[i], 4);
        ASSERT_EQ(got_bits, f32bits) << "element " << i << " want " << want;
        nonzero += want != 0.0f;
    }
    EXPECT_GT(nonzero, got.size() / 2);

    std::vector<float> buf(got.size());
    t->copy_to_f32(buf.data());
    EXPECT_EQ(buf, got);
}

TEST(SafetensorsTiny, F32ALogIsCopiedExactly) {
    SafetensorsFile f = SafetensorsFile::open(kTiny + "/model.safetensors");
    const auto* t = f.find("model.language_model.layers.0.linear_attn.A_log");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->dtype, DType::F32);
    ASSERT_EQ(t->shape, std::vector<int64_t>{4});
    const std::vector<float> v = t->to_f32();
    for (int i = 0; i < 4; ++i) {
        float want;
        std::memcpy(&want, t->data + 4 * i, 4);
        EXPECT_EQ(v[i], want);
        // A_log = log(U(1, 16)) per the README.
        EXPECT_GE(v[i], 0.0f);
        EXPECT_LE(v[i], std::log(16.0f) + 1e-6f);
    }
}

TEST(SafetensorsTiny, CheckpointOpenDirectoryAndFile) {
    Checkpoint dir = Checkpoint::open(kTiny);  // has model.safetensors
    EXPECT_EQ(dir.files().size(), 1u);
    EXPECT_EQ(dir.all().size(), 142u);
    EXPECT_EQ(dir.description(), kTiny + "/model.safetensors");
    EXPECT_EQ(dir.get("lm_head.weight").shape, (std::vector<int64_t>{320, 64}));
    try {
        dir.get("model.language_model.layers.8.mlp.up_proj.weight");
        FAIL();
    } catch (const clef::Error& e) {
        EXPECT_NE(std::string(e.what()).find(kTiny + "/model.safetensors: missing tensor "
                                                     "model.language_model.layers.8.mlp.up_proj.weight"),
                  std::string::npos)
            << e.what();
    }
    Checkpoint head = Checkpoint::open(kTiny + "/joint_head.safetensors");
    EXPECT_EQ(head.all().size(), 122u);
    EXPECT_NE(head.find("residual_gate"), nullptr);
    EXPECT_EQ(head.find("residual_gate")->numel(), 1);
}

TEST(SafetensorsTiny, CheckpointCopyKeepsAValidIndex) {
    std::unique_ptr<Checkpoint> original = std::make_unique<Checkpoint>(Checkpoint::open(kTiny));
    Checkpoint copy = *original;
    Checkpoint assigned;
    assigned = *original;
    original.reset();
    for (const Checkpoint* c : {&copy, &assigned}) {
        const auto& t = c->get("model.language_model.norm.weight");
        EXPECT_EQ(t.shape, std::vector<int64_t>{64});
        EXPECT_EQ(t.to_f32().size(), 64u);
        EXPECT_EQ(c->all().size(), 142u);
        for (const auto* v : c->all()) EXPECT_EQ(c->find(v->name), v);
    }
}

// ---- sharded checkpoints ----

class ShardedTest : public SafetensorsTest {
protected:
    // Two shards: a.safetensors holds x (F32 [2]) and y (U8 [3]); b.safetensors holds z (I16 [2]).
    void write_shards() {
        std::string xa(8, '\0');
        const float xv[2] = {1.0f, -2.0f};
        std::memcpy(&xa[0], xv, 8);
        write_st(dir_ / "a.safetensors",
                 R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                     "y":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})",
                 xa + "\x07\x08\x09");
        const int16_t zv[2] = {-3, 300};
        std::string zb(4, '\0');
        std::memcpy(&zb[0], zv, 4);
        write_st(dir_ / "b.safetensors", R"({"z":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})", zb);
    }
    void write_index(const json& weight_map) {
        json idx = {{"metadata", {{"total_size", 15}}}, {"weight_map", weight_map}};
        write_bytes(dir_ / "model.safetensors.index.json", idx.dump());
    }
    std::string index_path() const { return path("model.safetensors.index.json"); }
};

TEST_F(ShardedTest, TwoShardsThroughTheIndex) {
    write_shards();
    write_index({{"x", "a.safetensors"}, {"y", "a.safetensors"}, {"z", "b.safetensors"}});
    Checkpoint c = Checkpoint::open(dir_.string());
    ASSERT_EQ(c.files().size(), 2u);
    EXPECT_EQ(c.all().size(), 3u);
    EXPECT_EQ(c.get("x").to_f32(), (std::vector<float>{1.0f, -2.0f}));
    EXPECT_EQ(c.get("y").to_f32(), (std::vector<float>{7.0f, 8.0f, 9.0f}));
    EXPECT_EQ(c.get("z").to_f32(), (std::vector<float>{-3.0f, 300.0f}));
    EXPECT_EQ(c.get("x").file, path("a.safetensors"));
    EXPECT_EQ(c.get("z").file, path("b.safetensors"));
    EXPECT_NE(c.description().find("2 shards"), std::string::npos) << c.description();
}

TEST_F(ShardedTest, IndexNamesAMissingTensor) {
    write_shards();
    write_index(
        {{"x", "a.safetensors"}, {"y", "a.safetensors"}, {"z", "b.safetensors"}, {"w", "b.safetensors"}});
    expect_error([&] { Checkpoint::open(dir_.string()); }, index_path(), {"tensor 'w'", "not in any shard"});
}

TEST_F(ShardedTest, TensorInTheWrongShard) {
    write_shards();
    write_index({{"x", "a.safetensors"}, {"y", "b.safetensors"}, {"z", "b.safetensors"}});
    expect_error([&] { Checkpoint::open(dir_.string()); }, index_path(),
                 {"tensor 'y'", "listed for b.safetensors", "found in " + path("a.safetensors")});
}

TEST_F(ShardedTest, DuplicateTensorAcrossShards) {
    write_shards();
    write_st(dir_ / "b.safetensors",
             R"({"z":{"dtype":"I16","shape":[2],"data_offsets":[0,4]},
                 "x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             zeros(8));
    write_index({{"x", "a.safetensors"}, {"y", "a.safetensors"}, {"z", "b.safetensors"}});
    expect_error([&] { Checkpoint::open(dir_.string()); }, path("a.safetensors"),
                 {"tensor 'x'", "appears in both", path("b.safetensors")});
    expect_error(
        [&] {
            Checkpoint::open_files({path("a.safetensors"), path("b.safetensors")});
        },
        path("b.safetensors"), {"tensor 'x'", "appears in both"});
}

TEST_F(ShardedTest, ShardFileMissing) {
    write_shards();
    write_index({{"x", "a.safetensors"}, {"y", "a.safetensors"}, {"z", "c.safetensors"}});
    expect_error([&] { Checkpoint::open(dir_.string()); }, path("c.safetensors"), {"cannot open"});
}

TEST_F(ShardedTest, MalformedShardIsReportedByName) {
    write_shards();
    write_bytes(dir_ / "b.safetensors", "xyz");
    write_index({{"x", "a.safetensors"}, {"y", "a.safetensors"}, {"z", "b.safetensors"}});
    expect_error([&] { Checkpoint::open(dir_.string()); }, path("b.safetensors"), {"too short"});
}

TEST_F(ShardedTest, BadIndexFiles) {
    write_shards();
    write_bytes(dir_ / "model.safetensors.index.json", "{not json");
    expect_error([&] { Checkpoint::open(dir_.string()); }, index_path(), {"not valid JSON"});
    write_bytes(dir_ / "model.safetensors.index.json", R"({"metadata":{}})");
    expect_error([&] { Checkpoint::open(dir_.string()); }, index_path(), {"missing weight_map"});
    write_index(json::object());
    expect_error([&] { Checkpoint::open(dir_.string()); }, index_path(), {"weight_map is empty"});
    write_index({{"x", 3}});
    expect_error([&] { Checkpoint::open(dir_.string()); }, index_path(), {"weight_map['x'] is not a string"});
    write_index({{"x", "../a.safetensors"}});
    expect_error([&] { Checkpoint::open(dir_.string()); }, index_path(), {"not a plain file name"});
}

TEST_F(ShardedTest, UnindexedShardsAreFound) {
    write_shards();
    fs::rename(dir_ / "a.safetensors", dir_ / "model-00001-of-00002.safetensors");
    fs::rename(dir_ / "b.safetensors", dir_ / "model-00002-of-00002.safetensors");
    Checkpoint c = Checkpoint::open(dir_.string());
    EXPECT_EQ(c.files().size(), 2u);
    EXPECT_EQ(c.get("z").file, path("model-00002-of-00002.safetensors"));
}

TEST_F(ShardedTest, DirectoryWithoutWeights) {
    expect_error([&] { Checkpoint::open(dir_.string()); }, dir_.string(), {"no model.safetensors"});
    expect_error([&] { Checkpoint::open_files({}); }, "checkpoint", {"no safetensors files"});
}

}  // namespace
