// GGUF reader tests: the llama.cpp vocab files from tests/data/tokenizer, every value type through a small
// in-test writer, tensor infos and alignment, and malformed files (each must give clef::Error naming the
// file). Also the GGUF tokenizer loader's refusals (model / pre / merges).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

using clef::GgufFile;
using clef::GgufType;

const std::string kVocab = std::string(CLEF_TEST_DATA) + "/tokenizer/llama-vocab/ggml-vocab-qwen2.gguf";

// ---------------------------------------------------------------------------------------------------------
// A minimal GGUF writer for tests.

class Writer {
public:
    explicit Writer(uint32_t version = 3) {
        raw("GGUF", 4);
        u32(version);
        n_tensors_at_ = buf_.size();
        u64(0);
        n_kv_at_ = buf_.size();
        u64(0);
    }
    template <class T>
    void put(T v) {
        raw(&v, sizeof v);
    }
    void u8(uint8_t v) { put(v); }
    void u32(uint32_t v) { put(v); }
    void u64(uint64_t v) { put(v); }
    void str(const std::string& s) {
        u64(s.size());
        raw(s.data(), s.size());
    }
    void raw(const void* p, size_t n) {
        const auto* c = static_cast<const unsigned char*>(p);
        buf_.insert(buf_.end(), c, c + n);
    }
    // Key + type; the caller writes the value.
    void key(const std::string& k, GgufType t) {
        str(k);
        u32(static_cast<uint32_t>(t));
        set_u64(n_kv_at_, ++n_kv_);
    }
    void kv_string(const std::string& k, const std::string& v) {
        key(k, GgufType::kString);
        str(v);
    }
    void kv_u32(const std::string& k, uint32_t v) {
        key(k, GgufType::kUint32);
        u32(v);
    }
    void kv_strings(const std::string& k, const std::vector<std::string>& v) {
        key(k, GgufType::kArray);
        u32(static_cast<uint32_t>(GgufType::kString));
        u64(v.size());
        for (const auto& s : v) str(s);
    }
    void kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
        key(k, GgufType::kArray);
        u32(static_cast<uint32_t>(GgufType::kInt32));
        u64(v.size());
        for (int32_t x : v) put(x);
    }
    void tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
        str(name);
        u32(static_cast<uint32_t>(dims.size()));
        for (uint64_t d : dims) u64(d);
        u32(type);
        u64(offset);
        set_u64(n_tensors_at_, ++n_tensors_);
    }
    void pad_to(size_t alignment) {
        while (buf_.size() % alignment) buf_.push_back(0);
    }
    void set_u64(size_t at, uint64_t v) { std::memcpy(buf_.data() + at, &v, 8); }
    void set_u32(size_t at, uint32_t v) { std::memcpy(buf_.data() + at, &v, 4); }
    size_t size() const { return buf_.size(); }
    std::vector<unsigned char>& bytes() { return buf_; }

    size_t n_tensors_at_ = 0, n_kv_at_ = 0;

private:
    std::vector<unsigned char> buf_;
    uint64_t n_kv_ = 0, n_tensors_ = 0;
};

// Suite names start with lowercase "gguf" so that `ctest -R 'tokenizer|gguf'` selects them.
class gguf : public ::testing::Test {
protected:
    std::string write(const std::string& name, const std::vector<unsigned char>& bytes) {
        return scratch_.write(name, {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
    }

    // Opening must fail with clef::Error naming the file and containing `needle`.
    void expect_error(const std::vector<unsigned char>& bytes, const std::string& needle) {
        const std::string p = write("bad" + std::to_string(counter_++) + ".gguf", bytes);
        try {
            GgufFile::open(p);
            ADD_FAILURE() << "no error; expected '" << needle << "'";
        } catch (const clef::Error& e) {
            const std::string msg = e.what();
            EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
            EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
        }
    }

    clef::testing::ScratchDir scratch_{"clef_gguf_test"};
    std::filesystem::path dir_ = scratch_.path();
    int counter_ = 0;
};

// ---------------------------------------------------------------------------------------------------------
// The real vocab files

TEST(ggufVocab, Qwen2VocabMetadata) {
    GgufFile f = GgufFile::open(kVocab);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_TRUE(f.tensors().empty());
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.get_string("general.architecture"), "qwen2");
    EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "qwen2");
    EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 151643u);
    EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 151643);
    const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_EQ(tokens.size(), 151936u);
    EXPECT_EQ(tokens[0], "!");
    EXPECT_EQ(tokens[151645], "<|im_end|>");
    EXPECT_EQ(tokens[151646], "[PAD151646]");
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    ASSERT_EQ(types.size(), 151936u);
    EXPECT_EQ(types[0], 1);
    EXPECT_EQ(types[151644], 3);
    EXPECT_EQ(types[151935], 4);
    EXPECT_EQ(f.at("tokenizer.ggml.token_type").element_type(), GgufType::kInt32);
    EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), 151387u);
    EXPECT_EQ(f.find("no.such.key"), nullptr);
    EXPECT_EQ(f.get_string("no.such.key", "fallback"), "fallback");
    EXPECT_GT(f.metadata().size(), 5u);
    // Wrong types and missing keys name the file and the key.
    try {
        f.get_string("tokenizer.ggml.bos_token_id");
        ADD_FAILURE();
    } catch (const clef::Error& e) {
        EXPECT_NE(std::string(e.what()).find(kVocab + ": metadata key 'tokenizer.ggml.bos_token_id'"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(f.get_int("no.such.key"), clef::Error);
    EXPECT_THROW(f.get_string_array("tokenizer.ggml.token_type"), clef::Error);
    EXPECT_THROW(f.get_float("general.architecture"), clef::Error);
}

TEST(ggufVocab, MoveKeepsViewsValid) {
    GgufFile a = GgufFile::open(kVocab);
    const std::string_view tok = a.get_string_array("tokenizer.ggml.tokens")[9707];
    GgufFile b = std::move(a);
    EXPECT_EQ(tok, "Hello");
    EXPECT_EQ(b.get_string_array("tokenizer.ggml.tokens")[9707], "Hello");
    EXPECT_NE(b.find("tokenizer.ggml.pre"), nullptr);
}

// ---------------------------------------------------------------------------------------------------------
// All value types

TEST_F(gguf, AllValueTypes) {
    Writer w(2);
    w.key("u8", GgufType::kUint8);
    w.u8(200);
    w.key("i8", GgufType::kInt8);
    w.put<int8_t>(-100);
    w.key("u16", GgufType::kUint16);
    w.put<uint16_t>(60000);
    w.key("i16", GgufType::kInt16);
    w.put<int16_t>(-30000);
    w.kv_u32("u32", 4000000000u);
    w.key("i32", GgufType::kInt32);
    w.put<int32_t>(-2000000000);
    w.key("f32", GgufType::kFloat32);
    w.put<float>(1.5f);
    w.key("bool", GgufType::kBool);
    w.u8(1);
    w.kv_string("str", "héllo");
    w.key("u64", GgufType::kUint64);
    w.u64(18000000000000000000ull);
    w.key("i64", GgufType::kInt64);
    w.put<int64_t>(-9000000000000000000ll);
    w.key("f64", GgufType::kFloat64);
    w.put<double>(-2.25);
    w.kv_strings("strs", {"a", "", "ccc"});
    w.kv_i32s("i32s", {1, -2, 3});
    w.key("f32s", GgufType::kArray);
    w.u32(static_cast<uint32_t>(GgufType::kFloat32));
    w.u64(2);
    w.put<float>(0.5f);
    w.put<float>(-1.0f);
    w.key("bools", GgufType::kArray);
    w.u32(static_cast<uint32_t>(GgufType::kBool));
    w.u64(3);
    w.u8(1);
    w.u8(0);
    w.u8(1);
    w.key("nested", GgufType::kArray);  // [[1, 2], [], [3]] as uint16
    w.u32(static_cast<uint32_t>(GgufType::kArray));
    w.u64(3);
    for (const std::vector<uint16_t>& inner : {std::vector<uint16_t>{1, 2}, {}, {3}}) {
        w.u32(static_cast<uint32_t>(GgufType::kUint16));
        w.u64(inner.size());
        for (uint16_t x : inner) w.put(x);
    }
    w.key("empty", GgufType::kArray);
    w.u32(static_cast<uint32_t>(GgufType::kString));
    w.u64(0);

    GgufFile f = GgufFile::open(write("all.gguf", w.bytes()));
    EXPECT_EQ(f.version(), 2u);
    EXPECT_EQ(f.get_uint("u8"), 200u);
    EXPECT_EQ(f.get_int("i8"), -100);
    EXPECT_EQ(f.get_uint("u16"), 60000u);
    EXPECT_EQ(f.get_int("i16"), -30000);
    EXPECT_EQ(f.get_uint("u32"), 4000000000u);
    EXPECT_EQ(f.get_int("i32"), -2000000000);
    EXPECT_EQ(f.get_float("f32"), 1.5);
    EXPECT_TRUE(f.get_bool("bool"));
    EXPECT_EQ(f.get_string("str"), "héllo");
    EXPECT_EQ(f.get_uint("u64"), 18000000000000000000ull);
    EXPECT_THROW(f.get_int("u64"), clef::Error);  // does not fit int64
    EXPECT_EQ(f.get_int("i64"), -9000000000000000000ll);
    EXPECT_THROW(f.get_uint("i64"), clef::Error);  // negative
    EXPECT_EQ(f.get_float("f64"), -2.25);
    EXPECT_EQ(f.at("f64").type(), GgufType::kFloat64);
    EXPECT_EQ(f.get_string_array("strs"), (std::vector<std::string_view>{"a", "", "ccc"}));
    EXPECT_EQ(f.get_int_array("i32s"), (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(f.at("i32s").int_at(1), -2);
    EXPECT_THROW(f.at("i32s").int_at(3), clef::Error);
    EXPECT_EQ(f.at("f32s").floats(), (std::vector<double>{0.5, -1.0}));
    EXPECT_TRUE(f.at("bools").bool_at(0));
    EXPECT_FALSE(f.at("bools").bool_at(1));
    const clef::GgufValue& nested = f.at("nested");
    EXPECT_EQ(nested.type_name(), "array[array[uint16]]");
    ASSERT_EQ(nested.size(), 3u);
    EXPECT_EQ(nested.array_at(0).ints(), (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(nested.array_at(1).size(), 0u);
    EXPECT_EQ(nested.array_at(2).uint_at(0), 3u);
    EXPECT_EQ(f.at("empty").size(), 0u);
    EXPECT_EQ(f.metadata().size(), 18u);
    EXPECT_EQ(f.metadata()[0].key, "u8");
}

// ---------------------------------------------------------------------------------------------------------
// Tensor infos and alignment

TEST_F(gguf, TensorInfos) {
    Writer w;
    w.kv_string("general.architecture", "test");
    w.tensor("tok_embd.weight", {8, 4}, 0, 0);
    w.tensor("out.weight", {3}, 1, 128);
    const size_t infos_end = w.size();
    w.pad_to(32);
    const size_t data = w.size();
    w.bytes().resize(data + 256, 0);
    GgufFile f = GgufFile::open(write("t.gguf", w.bytes()));
    ASSERT_EQ(f.tensors().size(), 2u);
    EXPECT_EQ(f.data_offset(), data);
    EXPECT_EQ(f.data_offset(), (infos_end + 31) / 32 * 32);
    const clef::GgufTensorInfo* t = f.find_tensor("tok_embd.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dims, (std::vector<uint64_t>{8, 4}));
    EXPECT_EQ(t->n_elements(), 32u);
    EXPECT_EQ(t->ggml_type, 0u);
    EXPECT_EQ(f.tensors()[1].name, "out.weight");
    EXPECT_EQ(f.tensors()[1].offset, 128u);
    EXPECT_EQ(f.tensors()[1].ggml_type, 1u);
    EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

TEST_F(gguf, CustomAlignment) {
    Writer w;
    w.kv_u32("general.alignment", 64);
    w.tensor("a", {2}, 0, 64);
    w.pad_to(64);
    const size_t data = w.size();
    w.bytes().resize(data + 128, 0);
    GgufFile f = GgufFile::open(write("a.gguf", w.bytes()));
    EXPECT_EQ(f.alignment(), 64u);
    EXPECT_EQ(f.data_offset(), data);
    EXPECT_EQ(f.data_offset() % 64, 0u);
}

// ---------------------------------------------------------------------------------------------------------
// Malformed files

TEST_F(gguf, BadHeaders) {
    expect_error({}, "not a GGUF file");
    expect_error({'G', 'G'}, "not a GGUF file");
    expect_error({'G', 'G', 'U', 'X', 3, 0, 0, 0}, "bad magic");
    expect_error({'G', 'G', 'U', 'F', 3, 0}, "truncated");
    expect_error({'G', 'G', 'U', 'F', 1, 0, 0, 0}, "version 1 is not supported");
    expect_error({'G', 'G', 'U', 'F', 99, 0, 0, 0}, "unsupported GGUF version 99");
    expect_error({'G', 'G', 'U', 'F', 0, 0, 0, 3}, "big-endian");
    Writer w;
    std::vector<unsigned char> b = w.bytes();
    b.resize(b.size() - 3);
    expect_error(b, "truncated");
}

TEST_F(gguf, LyingCounts) {
    {
        Writer w;
        w.set_u64(w.n_kv_at_, ~uint64_t{0});
        expect_error(w.bytes(), "metadata count");
    }
    {
        Writer w;
        w.set_u64(w.n_tensors_at_, uint64_t{1} << 60);
        expect_error(w.bytes(), "tensor count");
    }
    {
        Writer w;
        w.kv_strings("tokenizer.ggml.tokens", {"a", "b"});
        // Patch the array length to something huge.
        const size_t count_at = w.size() - 2 * (8 + 1) - 8;
        w.set_u64(count_at, uint64_t{1} << 62);
        expect_error(w.bytes(), "cannot fit");
    }
    {
        Writer w;
        w.key("big", GgufType::kArray);
        w.u32(static_cast<uint32_t>(GgufType::kUint64));
        w.u64(1000);  // 8000 bytes claimed, none present
        expect_error(w.bytes(), "metadata key 'big'");
    }
}

TEST_F(gguf, StringsPastEof) {
    {
        Writer w;
        w.u64(1000);  // key length
        w.raw("abcdefghijklmnopqrstuvwxyz", 26);
        w.set_u64(w.n_kv_at_, 1);
        expect_error(w.bytes(), "runs past the end of the file");
    }
    {
        Writer w;
        w.key("k", GgufType::kString);
        w.u64(~uint64_t{0} - 5);  // value length near 2^64
        expect_error(w.bytes(), "runs past the end of the file");
    }
    {
        Writer w;
        w.kv_strings("list", {"aa", "bb"});
        w.bytes().resize(w.size() - 1);
        expect_error(w.bytes(), "metadata key 'list'[1]");
    }
}

TEST_F(gguf, UnknownTypesAndBadValues) {
    {
        Writer w;
        w.str("k");
        w.u32(13);
        w.u8(0);
        w.set_u64(w.n_kv_at_, 1);
        expect_error(w.bytes(), "unknown value type 13");
    }
    {
        Writer w;
        w.key("arr", GgufType::kArray);
        w.u32(0xFFFFFFFFu);
        w.u64(1);
        expect_error(w.bytes(), "unknown value type 4294967295");
    }
    {
        Writer w;
        w.key("b", GgufType::kBool);
        w.u8(2);
        expect_error(w.bytes(), "invalid bool value 2");
    }
    {
        Writer w;
        w.kv_u32("dup", 1);
        w.kv_u32("dup", 2);
        expect_error(w.bytes(), "duplicate metadata key 'dup'");
    }
    {
        Writer w;
        w.kv_u32("general.alignment", 48);
        expect_error(w.bytes(), "not a power of two");
    }
    {
        Writer w;
        w.kv_string("general.alignment", "32");
        expect_error(w.bytes(), "expected uint32");
    }
}

TEST_F(gguf, NestingDepth) {
    auto nested = [](size_t depth) {
        Writer w;
        w.key("deep", GgufType::kArray);
        for (size_t d = 1; d < depth; ++d) {
            w.u32(static_cast<uint32_t>(GgufType::kArray));
            w.u64(1);
        }
        w.u32(static_cast<uint32_t>(GgufType::kUint8));
        w.u64(1);
        w.u8(7);
        return w.bytes();
    };
    const std::string ok = write("ok.gguf", nested(GgufFile::kMaxArrayDepth));
    const GgufFile f = GgufFile::open(ok);
    const clef::GgufValue* v = f.find("deep");
    for (size_t d = 1; d < GgufFile::kMaxArrayDepth; ++d) v = &v->array_at(0);
    EXPECT_EQ(v->uint_at(0), 7u);
    expect_error(nested(GgufFile::kMaxArrayDepth + 1), "nested more than");
    expect_error(nested(100000), "nested more than");  // would blow the stack without a limit
}

TEST_F(gguf, BadTensorInfos) {
    {
        Writer w;
        w.tensor("t", {1, 2, 3, 4, 5}, 0, 0);
        expect_error(w.bytes(), "5 dimensions");
    }
    {
        Writer w;
        w.tensor("t", {4}, 0, 7);
        w.pad_to(32);
        w.bytes().resize(w.size() + 64);
        expect_error(w.bytes(), "not a multiple of the alignment");
    }
    {
        Writer w;
        w.tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0);
        w.pad_to(32);
        expect_error(w.bytes(), "overflows");
    }
    {
        Writer w;
        w.tensor("t", {4}, 0, 0);
        w.tensor("t", {4}, 0, 32);
        w.pad_to(32);
        w.bytes().resize(w.size() + 64);
        expect_error(w.bytes(), "duplicate tensor name 't'");
    }
    {
        Writer w;
        w.tensor("t", {4}, 0, 1024);
        w.pad_to(32);
        w.bytes().resize(w.size() + 64);
        expect_error(w.bytes(), "past the end of the data section");
    }
    {
        Writer w;
        w.tensor("t", {4}, 0, 0);  // no padding and no data section at all
        w.bytes().resize(w.size() - 1);
        expect_error(w.bytes(), "tensor 't'");
    }
}

// Every truncation and many single-byte corruptions of a valid file: opening either succeeds or throws
// clef::Error; it never crashes or throws anything else.
TEST_F(gguf, TruncationsAndCorruptionsNeverCrash) {
    Writer w;
    w.kv_string("general.architecture", "x");
    w.kv_strings("tokenizer.ggml.tokens", {"a", "bb", "ccc"});
    w.kv_i32s("tokenizer.ggml.token_type", {1, 1, 3});
    w.key("nested", GgufType::kArray);
    w.u32(static_cast<uint32_t>(GgufType::kArray));
    w.u64(1);
    w.u32(static_cast<uint32_t>(GgufType::kBool));
    w.u64(2);
    w.u8(0);
    w.u8(1);
    w.tensor("w", {2, 2}, 0, 0);
    w.pad_to(32);
    w.bytes().resize(w.size() + 64);
    const std::vector<unsigned char> good = w.bytes();
    const std::string p = (dir_ / "fuzz.gguf").string();
    auto attempt = [&](const std::vector<unsigned char>& bytes) {
        {
            std::ofstream f(p, std::ios::binary | std::ios::trunc);
            f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
        }
        try {
            GgufFile::open(p);
            return true;
        } catch (const clef::Error& e) {
            EXPECT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
            return false;
        }
    };
    EXPECT_TRUE(attempt(good));
    size_t failures = 0;
    for (size_t n = 0; n < good.size(); ++n) {
        if (!attempt(std::vector<unsigned char>(good.begin(), good.begin() + static_cast<long>(n))))
            ++failures;
    }
    EXPECT_GT(failures, 0u);
    uint64_t state = 99;
    for (int i = 0; i < 1000; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        std::vector<unsigned char> b = good;
        b[(state >> 33) % b.size()] = static_cast<unsigned char>(state >> 13);
        attempt(b);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Tokenizer loading from GGUF metadata

std::vector<unsigned char> vocab_gguf(const std::string& model, const std::string& pre,
                                      const std::vector<std::string>& merges) {
    Writer w;
    w.kv_string("tokenizer.ggml.model", model);
    if (!pre.empty()) w.kv_string("tokenizer.ggml.pre", pre);
    std::vector<std::string> tokens;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        const int cp = printable ? b : next++;
        std::string s;
        if (cp < 0x80) {
            s.push_back(static_cast<char>(cp));
        } else {
            s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
            s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
        tokens.push_back(s);
    }
    tokens.push_back("ab");
    tokens.push_back("<|end|>");
    tokens.push_back("[USR]");
    w.kv_strings("tokenizer.ggml.tokens", tokens);
    std::vector<int32_t> types(tokens.size(), 1);
    types[257] = 3;
    types[258] = 4;
    w.kv_i32s("tokenizer.ggml.token_type", types);
    w.kv_strings("tokenizer.ggml.merges", merges);
    return w.bytes();
}

TEST_F(gguf, TokenizerFromSmallGguf) {
    const std::string p = write("v.gguf", vocab_gguf("gpt2", "qwen2", {"a b"}));
    clef::Tokenizer t = clef::Tokenizer::from_gguf(p);
    EXPECT_EQ(t.vocab_size(), 259u);
    EXPECT_EQ(t.encode("ab<|end|>[USR]"), (std::vector<int32_t>{256, 257, 258}));
    EXPECT_EQ(t.encode("<|end|>[USR]", {.normalize = false, .parse_special = false}).back(), 258);
    EXPECT_EQ(t.token_kind(257), clef::TokenKind::kSpecial);
    EXPECT_EQ(t.token_kind(258), clef::TokenKind::kUserDefined);
    EXPECT_EQ(clef::Tokenizer::load(p).vocab_size(), 259u);
}

void expect_tokenizer_error(const std::string& path, const std::string& needle) {
    try {
        clef::Tokenizer::from_gguf(path);
        ADD_FAILURE() << "no error; expected '" << needle << "'";
    } catch (const clef::Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
    }
}

TEST_F(gguf, TokenizerRefusals) {
    expect_tokenizer_error(write("a.gguf", vocab_gguf("gpt2", "llama-bpe", {"a b"})), "'llama-bpe'");
    expect_tokenizer_error(write("b.gguf", vocab_gguf("llama", "qwen2", {"a b"})), "'llama'");
    expect_tokenizer_error(write("c.gguf", vocab_gguf("gpt2", "", {"a b"})), "tokenizer.ggml.pre");
    expect_tokenizer_error(write("d.gguf", vocab_gguf("gpt2", "qwen2", {"a zz"})), "token \"zz\" is not in");
    expect_tokenizer_error(write("e.gguf", vocab_gguf("gpt2", "qwen2", {"b c"})), "merged token \"bc\"");
    expect_tokenizer_error(write("f.gguf", vocab_gguf("gpt2", "qwen2", {"abc"})), "not of the form");
    Writer w;
    w.kv_string("tokenizer.ggml.model", "gpt2");
    expect_tokenizer_error(write("g.gguf", w.bytes()), "tokenizer.ggml.pre");
}

}  // namespace
