// Tokenizer tests against the fixtures in tests/data/tokenizer (see tests/data/tokenizer/PROVENANCE.md):
// Hugging Face Qwen3 cases, llama.cpp's own vocab vectors, llama.cpp semantics on the curated strings, the
// GGUF-vs-tokenizer.json cross-check, malformed files, invalid UTF-8 and the tiny-clef tokenizer.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"
#include "util/error.h"

namespace {

using clef::EncodeOptions;
using clef::Tokenizer;
using Ids = std::vector<int32_t>;

const std::string kData = CLEF_TEST_DATA;
const std::string kTok = kData + "/tokenizer";
const std::string kQwen3Json = kTok + "/qwen3/tokenizer.json";
const std::string kQwen2Gguf = kTok + "/llama-vocab/ggml-vocab-qwen2.gguf";
const std::string kQwen35Gguf = kTok + "/llama-vocab/ggml-vocab-qwen35.gguf";

constexpr EncodeOptions kLlama{.normalize = false, .parse_special = false, .parse_user_defined = true};
constexpr EncodeOptions kLlamaSpecial{.normalize = false, .parse_special = true, .parse_user_defined = true};

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::vector<nlohmann::json> out;
    std::istringstream in(read_file(path));
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    }
    return out;
}

std::string ids_str(const Ids& ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(ids[i]);
    }
    s += ']';
    return s;
}

// llama.cpp test-tokenizer-0 format: .inp split on "\n__ggml_vocab_test__\n" (no trailing empty case), .out
// one line per case, stripped of surrounding whitespace, ids separated by spaces.
struct VocabCase {
    std::string text;
    Ids ids;
};

std::vector<VocabCase> read_vocab_cases(const std::string& gguf) {
    const std::string inp = read_file(gguf + ".inp");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> texts;
    size_t pos = 0;
    while (pos < inp.size()) {
        size_t next = inp.find(sep, pos);
        if (next == std::string::npos) next = inp.size();
        texts.push_back(inp.substr(pos, next - pos));
        pos = next + sep.size();
    }
    std::istringstream out(read_file(gguf + ".out"));
    std::vector<VocabCase> cases;
    std::string line;
    size_t i = 0;
    while (std::getline(out, line)) {
        const size_t b = line.find_first_not_of(" \t\r\n");
        const size_t e = line.find_last_not_of(" \t\r\n");
        line = b == std::string::npos ? "" : line.substr(b, e - b + 1);
        VocabCase c;
        if (i >= texts.size()) throw std::runtime_error("more .out lines than .inp cases");
        c.text = texts[i++];
        std::istringstream ls(line);
        int32_t id;
        while (ls >> id) c.ids.push_back(id);
        cases.push_back(std::move(c));
    }
    if (cases.size() != texts.size()) throw std::runtime_error(".out/.inp case count mismatch");
    return cases;
}

// Suite names start with lowercase "tokenizer" so that `ctest -R 'tokenizer|gguf'` selects them.
class tokenizer : public ::testing::Test {
protected:
    static const Tokenizer& qwen3() {
        static const Tokenizer t = Tokenizer::from_hf_json(kQwen3Json);
        return t;
    }
    static const Tokenizer& qwen2_gguf() {
        static const Tokenizer t = Tokenizer::from_gguf(kQwen2Gguf);
        return t;
    }
    static const Tokenizer& qwen35_gguf() {
        static const Tokenizer t = Tokenizer::from_gguf(kQwen35Gguf);
        return t;
    }
};

// ---------------------------------------------------------------------------------------------------------
// 1. Hugging Face oracle

TEST_F(tokenizer, Qwen3HfCases) {
    const Tokenizer& tok = qwen3();
    const auto cases = read_jsonl(kTok + "/qwen3/cases.jsonl");
    ASSERT_EQ(cases.size(), 280u);
    int failures = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::string text = cases[i]["text"];
        const Ids want = cases[i]["ids"].get<Ids>();
        const Ids got = tok.encode(text);
        if (got != want && ++failures <= 20)
            ADD_FAILURE() << "case " << i << " " << nlohmann::json(text).dump() << "\n  want "
                          << ids_str(want) << "\n  got  " << ids_str(got);
        EXPECT_EQ(tok.decode(want), cases[i]["decoded"].get<std::string>()) << "decode, case " << i;
    }
    EXPECT_EQ(failures, 0);
}

TEST_F(tokenizer, Qwen3Basics) {
    const Tokenizer& tok = qwen3();
    EXPECT_EQ(tok.vocab_size(), 151669u);
    EXPECT_TRUE(tok.has_normalizer());
    EXPECT_EQ(tok.token_to_id("<|im_end|>"), 151645);
    EXPECT_EQ(tok.token_to_id("</think>"), 151668);
    EXPECT_EQ(tok.token_to_id("Hello"), 9707);
    EXPECT_EQ(tok.token_to_id("no such token at all"), -1);
    EXPECT_EQ(tok.id_to_token(151645), "<|im_end|>");
    EXPECT_EQ(tok.id_to_token(220), "\xC4\xA0");  // "Ġ"
    EXPECT_EQ(tok.token_kind(151645), clef::TokenKind::kSpecial);
    EXPECT_EQ(tok.token_kind(151667), clef::TokenKind::kUserDefined);
    EXPECT_EQ(tok.token_kind(9707), clef::TokenKind::kNormal);
    EXPECT_EQ(tok.token_kind(999999), clef::TokenKind::kNone);
    EXPECT_EQ(tok.encode(""), Ids{});
    EXPECT_EQ(tok.encode(" <|endoftext|> "), (Ids{220, 151643, 220}));
    // parse_special=false: special tokens become text, non-special added tokens are still matched.
    EXPECT_EQ(tok.encode("<|im_start|><think>", {.normalize = true, .parse_special = false}),
              (Ids{27, 91, 318, 4906, 91, 29, 151667}));
    EXPECT_THROW(tok.decode({-1}), clef::Error);
    EXPECT_THROW(tok.decode({151669}), clef::Error);
    // Appending overload.
    Ids out{7};
    tok.encode("Hello", {}, out);
    EXPECT_EQ(out, (Ids{7, 9707}));
}

TEST_F(tokenizer, LoadDispatch) {
    EXPECT_EQ(Tokenizer::load(kTok + "/qwen3").encode("Hello world"), (Ids{9707, 1879}));
    EXPECT_EQ(Tokenizer::load(kTok + "/qwen3/").vocab_size(), 151669u);
    EXPECT_EQ(Tokenizer::load(kQwen3Json).vocab_size(), 151669u);
    EXPECT_EQ(Tokenizer::load(kQwen2Gguf).vocab_size(), 151936u);
    EXPECT_THROW(Tokenizer::load(kTok + "/does-not-exist"), clef::Error);
    EXPECT_THROW(Tokenizer::load(kTok + "/llama-vocab"), clef::Error);  // directory without tokenizer.json
}

TEST_F(tokenizer, LoadQwen3Json) {
    const auto t0 = std::chrono::steady_clock::now();
    Tokenizer t = Tokenizer::from_hf_json(kQwen3Json);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(t.vocab_size(), 151669u);
    RecordProperty("load_seconds", std::to_string(s));  // speed itself is bench_tokenizer's business
}

// ---------------------------------------------------------------------------------------------------------
// 2. llama.cpp's own vectors

void check_vocab_vectors(const Tokenizer& tok, const std::string& gguf, size_t expected_cases,
                         const std::map<size_t, Ids>& hf_overrides) {
    const auto cases = read_vocab_cases(gguf);
    ASSERT_EQ(cases.size(), expected_cases);
    for (size_t i = 0; i < cases.size(); ++i) {
        const auto& c = cases[i];
        EXPECT_EQ(tok.encode(c.text, kLlama), c.ids) << gguf << " case " << i << " (llama.cpp mode)";
        EXPECT_EQ(tok.decode_bytes(c.ids), c.text) << gguf << " case " << i << " detokenize";
        const Ids hf = tok.encode(c.text);  // HF mode: NFC on
        auto it = hf_overrides.find(i);
        EXPECT_EQ(hf, it == hf_overrides.end() ? c.ids : it->second) << gguf << " case " << i << " (HF mode)";
    }
}

TEST_F(tokenizer, LlamaVocabQwen2) {
    check_vocab_vectors(qwen2_gguf(), kQwen2Gguf, 46, {});
}

TEST_F(tokenizer, LlamaVocabQwen35) {
    Ids case48;
    for (int i = 0; i < 200; ++i) case48.push_back(6362);
    check_vocab_vectors(qwen35_gguf(), kQwen35Gguf, 50,
                        {{46, {963}}, {47, {42611, 1242, 963}}, {48, case48}});
    // The llama.cpp (no NFC) ids of the three NFC-sensitive cases, spelled out.
    EXPECT_EQ(qwen35_gguf().encode("e\xCC\x81", kLlama), (Ids{68, 53839}));
    EXPECT_EQ(qwen35_gguf().encode("re\xCC\x81sume\xCC\x81", kLlama), (Ids{265, 53839, 31323, 53839}));
}

// ---------------------------------------------------------------------------------------------------------
// 3. llama.cpp semantics on the curated strings

TEST_F(tokenizer, LlamaCasesJsonl) {
    const auto cases = read_jsonl(kTok + "/qwen3/cases.llama.jsonl");
    ASSERT_EQ(cases.size(), 280u);
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::string text = cases[i]["text"];
        const Ids ids = cases[i]["ids"].get<Ids>();
        EXPECT_EQ(qwen2_gguf().encode(text, kLlama), ids) << "ids, case " << i;
        EXPECT_EQ(qwen2_gguf().encode(text, kLlamaSpecial), cases[i]["ids_parse_special"].get<Ids>())
            << "ids_parse_special, case " << i;
        EXPECT_EQ(qwen35_gguf().encode(text, kLlama), cases[i]["ids_qwen35_pre"].get<Ids>())
            << "ids_qwen35_pre, case " << i;
        EXPECT_EQ(qwen2_gguf().decode_bytes(ids), cases[i]["decoded"].get<std::string>())
            << "decoded, case " << i;
        EXPECT_EQ(qwen2_gguf().decode(ids), text) << "decode, case " << i;
    }
}

// ---------------------------------------------------------------------------------------------------------
// 4. Cross-check: GGUF vocab in HF mode (NFC, only the CONTROL tokens as added tokens) == tokenizer.json ids

TEST_F(tokenizer, GgufHfModeCrossCheck) {
    const auto cases = read_jsonl(kTok + "/qwen3/cases.jsonl");
    const std::set<size_t> lacking{257, 258, 261, 266, 271, 272, 273};  // need ids >= 151646
    const EncodeOptions hf_control_only{
        .normalize = true, .parse_special = true, .parse_user_defined = false};
    size_t compared = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        if (lacking.count(i)) continue;
        const std::string text = cases[i]["text"];
        EXPECT_EQ(qwen2_gguf().encode(text, hf_control_only), cases[i]["ids"].get<Ids>()) << "case " << i;
        ++compared;
    }
    EXPECT_EQ(compared, 273u);
}

// ---------------------------------------------------------------------------------------------------------
// 5. Malformed tokenizer files and invalid UTF-8

class tokenizerFiles : public ::testing::Test {
protected:
    std::string write(const std::string& name, const std::string& content) {
        return scratch_.write(name, content);
    }
    clef::testing::ScratchDir scratch_{"clef_tok_test"};
    std::filesystem::path dir_ = scratch_.path();
};

// A small valid byte-level tokenizer.json, with hooks to break it.
nlohmann::json tiny_json() {
    nlohmann::json vocab = nlohmann::json::object();
    // Byte-level alphabet in GPT-2 order: ids 0..255.
    int next = 256, id = 0;
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
        vocab[s] = id++;
    }
    vocab["ab"] = 256;
    vocab["abc"] = 257;
    return {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", {"ab", "c"}}}}},
        {"normalizer", {{"type", "NFC"}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", "\\s+|\\S+"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"added_tokens", {{{"id", 258}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
    };
}

TEST_F(tokenizerFiles, TinyJsonWorks) {
    const std::string p = write("ok.json", tiny_json().dump());
    Tokenizer t = Tokenizer::from_hf_json(p);
    EXPECT_EQ(t.encode("abc<s>ab"), (Ids{257, 258, 256}));
    EXPECT_EQ(t.decode({257, 258, 256}), "abc<s>ab");
    // "a b" string merges and ["a","b"] array merges mean the same.
    nlohmann::json j = tiny_json();
    j["model"]["merges"] = {{"a", "b"}, "ab c"};
    EXPECT_EQ(Tokenizer::from_hf_json(write("ok2.json", j.dump())).encode("abc"), (Ids{257}));
    // Bare ByteLevel with the GPT-2 regex, null normalizer.
    j = tiny_json();
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    j["normalizer"] = nullptr;
    Tokenizer g = Tokenizer::from_hf_json(write("gpt2.json", j.dump()));
    EXPECT_FALSE(g.has_normalizer());
    EXPECT_EQ(g.encode("abc ab"), (Ids{257, t.token_to_id("\xC4\xA0"), 256}));
    // A Sequence holding only NFC is accepted.
    j = tiny_json();
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
    EXPECT_TRUE(Tokenizer::from_hf_json(write("seq.json", j.dump())).has_normalizer());
}

void expect_load_error(const std::string& path, const std::string& needle) {
    try {
        Tokenizer::from_hf_json(path);
        ADD_FAILURE() << "no error for " << path;
    } catch (const clef::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
    } catch (const std::exception& e) {
        ADD_FAILURE() << "wrong exception type for " << path << ": " << e.what();
    }
}

TEST_F(tokenizerFiles, MalformedJson) {
    expect_load_error(write("a.json", "{not json"), "not valid JSON");
    expect_load_error(write("b.json", ""), "not valid JSON");
    expect_load_error(write("c.json", "[1,2]"), "not a JSON object");
    expect_load_error((dir_ / "missing.json").string(), "cannot open");

    nlohmann::json j = tiny_json();
    j.erase("model");
    expect_load_error(write("d.json", j.dump()), "missing \"model\"");

    j = tiny_json();
    j["model"]["type"] = "WordPiece";
    expect_load_error(write("e.json", j.dump()), "unsupported model type 'WordPiece'");

    j = tiny_json();
    j["model"]["merges"] = {"a zz"};
    expect_load_error(write("f.json", j.dump()), "token \"zz\" is not in the vocabulary");

    j = tiny_json();
    j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"b", "c"})});  // "bc" not in vocab
    expect_load_error(write("g.json", j.dump()), "merged token");

    j = tiny_json();
    j["model"]["merges"] = {"a b c"};
    expect_load_error(write("h.json", j.dump()), "not of the form");

    j = tiny_json();
    j["model"]["merges"] = {42};
    expect_load_error(write("i.json", j.dump()), "model.merges[0]");

    j = tiny_json();
    j["model"]["vocab"]["zz"] = -5;
    expect_load_error(write("j.json", j.dump()), "out of range");

    j = tiny_json();
    j["model"]["vocab"]["zz"] = 3;  // duplicate id
    expect_load_error(write("k.json", j.dump()), "is used by both");

    j = tiny_json();
    j["model"]["vocab"]["zz"] = 4000000000u;
    expect_load_error(write("k2.json", j.dump()), "out of range");

    j = tiny_json();
    j["model"]["vocab"] = {1, 2};
    expect_load_error(write("l.json", j.dump()), "model.vocab is not an object");

    j = tiny_json();
    j["normalizer"] = {{"type", "NFKC"}};
    expect_load_error(write("m.json", j.dump()), "unsupported normalizer 'NFKC'");

    j = tiny_json();
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
    expect_load_error(write("n.json", j.dump()), "Lowercase");

    j = tiny_json();
    j["pre_tokenizer"] = {{"type", "Whitespace"}};
    expect_load_error(write("o.json", j.dump()), "unsupported pre_tokenizer 'Whitespace'");

    j = tiny_json();
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
    expect_load_error(write("p.json", j.dump()), "invalid split regex");

    j = tiny_json();
    j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
    expect_load_error(write("q.json", j.dump()), "only Isolated");

    j = tiny_json();
    j["added_tokens"][0].erase("content");
    expect_load_error(write("r.json", j.dump()), "added_tokens[0].content");

    j = tiny_json();
    j["decoder"] = {{"type", "WordPiece"}};
    expect_load_error(write("s.json", j.dump()), "unsupported decoder");

    j = tiny_json();
    j["model"]["dropout"] = 0.5;
    expect_load_error(write("t.json", j.dump()), "dropout");
}

TEST_F(tokenizer, InvalidUtf8Input) {
    const Tokenizer& tok = qwen3();
    auto byte_id = [&](unsigned char b) {
        // GPT-2 byte-level character of b.
        int next = 256, cp = -1;
        for (int x = 0; x < 256; ++x) {
            const bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
            const int c = printable ? x : next++;
            if (x == b) cp = c;
        }
        std::string s;
        if (cp < 0x80) {
            s.push_back(static_cast<char>(cp));
        } else {
            s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
            s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
        return tok.token_to_id(s);
    };
    const std::vector<std::string> inputs = {
        "\xFF",
        "\xC3",
        "abc\xFF\xFE def",
        "\xE2\x82",
        "\xED\xA0\x80",
        "\xF4\x90\x80\x80",
        "\xC0\xAF",
        "caf\xC3\xA9\xC3",
        "e\xFF\xCC\x81",
        std::string("a\0b", 3),
        "<|im_end|>\x80<think>",
    };
    for (const std::string& s : inputs) {
        const Ids ids = tok.encode(s);
        EXPECT_EQ(tok.decode_bytes(ids), s) << ids_str(ids);
        EXPECT_EQ(qwen2_gguf().decode_bytes(qwen2_gguf().encode(s, kLlama)), s);
    }
    // Ill-formed runs are their own pre-token; the valid text around them is encoded as separate pieces.
    const Ids hello = tok.encode("Hello");
    const Ids world = tok.encode(" world");
    Ids want = hello;
    want.push_back(byte_id(0xFF));
    want.insert(want.end(), world.begin(), world.end());
    EXPECT_EQ(tok.encode("Hello\xFF world"), want);
    // NFC never reaches across an invalid byte: "e" + FF + U+0301 stays decomposed.
    Ids e_ff = tok.encode("e");
    e_ff.push_back(byte_id(0xFF));
    const Ids acute = tok.encode("\xCC\x81");
    e_ff.insert(e_ff.end(), acute.begin(), acute.end());
    EXPECT_EQ(tok.encode("e\xFF\xCC\x81"), e_ff);
    // Decoding replaces each maximal ill-formed subpart with one U+FFFD.
    EXPECT_EQ(tok.decode(tok.encode("a\xFF\xFE"
                                    "b")),
              "a\xEF\xBF\xBD\xEF\xBF\xBD"
              "b");
    EXPECT_EQ(tok.decode(tok.encode("a\xE2\x82"
                                    "b")),
              "a\xEF\xBF\xBD"
              "b");
    EXPECT_EQ(tok.decode(tok.encode("\xF0\x9F\x98")), "\xEF\xBF\xBD");
}

// Random byte strings (valid, invalid, fragments of added tokens): encoding never fails and the ids always
// decode back to the exact input bytes.
TEST_F(tokenizer, RandomBytesRoundTrip) {
    const std::vector<std::string> atoms = {"a",
                                            "b",
                                            " ",
                                            "\n",
                                            "\r",
                                            "\t",
                                            "'s",
                                            "<|",
                                            "|>",
                                            "<|im_end|>",
                                            "<think>",
                                            "[PAD151646]",
                                            "\xC3",
                                            "\xA9",
                                            "\xCC\x81",
                                            "\xE4\xBD\xA0",
                                            "\xF0\x9F\x98\x80",
                                            "\xFF",
                                            "\x80",
                                            "\xED\xA0\x80",
                                            "1",
                                            "!",
                                            "\xC2\x85",
                                            "\xE1\xA0\x8E",
                                            "\xEF\xBB\xBF",
                                            "\xE3\x81\x8B\xE3\x82\x99"};
    uint64_t state = 2024;
    for (int iter = 0; iter < 3000; ++iter) {
        std::string s;
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const size_t n = (state >> 33) % 24;
        for (size_t i = 0; i < n; ++i) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            s += atoms[(state >> 33) % atoms.size()];
        }
        ASSERT_EQ(qwen3().decode_bytes(qwen3().encode(s, {.normalize = false})), s) << "iteration " << iter;
        // With NFC the valid parts may change; decoding still yields valid UTF-8.
        ASSERT_TRUE(clef::tok::is_valid_utf8(qwen3().decode(qwen3().encode(s)))) << "iteration " << iter;
        ASSERT_EQ(qwen2_gguf().decode_bytes(qwen2_gguf().encode(s, kLlama)), s) << "iteration " << iter;
    }
}

TEST_F(tokenizer, LongInputs) {
    const Tokenizer& tok = qwen3();
    // A long single word (heap merge path) and long whitespace runs; results must equal word-by-word
    // encoding.
    std::string word(5000, 'a');
    const Ids ids = tok.encode(word);
    EXPECT_EQ(tok.decode(ids), word);
    std::string spaces(10000, ' ');
    EXPECT_EQ(tok.decode(tok.encode(spaces + "x")), spaces + "x");
    std::string mixed;
    for (int i = 0; i < 2000; ++i) mixed += "\xE4\xBD\xA0\xE5\xA5\xBD";  // 你好 x2000: one long \p{L}+ word
    EXPECT_EQ(tok.decode(tok.encode(mixed)), mixed);
}

TEST_F(tokenizer, CacheConsistency) {
    // Encoding the same texts repeatedly (cache hits) and in a fresh tokenizer (cold cache) must agree.
    const auto cases = read_jsonl(kTok + "/qwen3/cases.jsonl");
    Tokenizer cold = Tokenizer::from_hf_json(kQwen3Json);
    std::string all;
    for (const auto& c : cases) all += c["text"].get<std::string>() + "\n";
    const Ids a = cold.encode(all);
    const Ids b = cold.encode(all);
    const Ids c = qwen3().encode(all);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, c);
}

// The partial NFC (only spans around non-inert characters) must equal utf8proc's NFC of the whole string.
TEST(tokenizerUnicode, PartialNfcMatchesFullNfc) {
    const std::vector<uint32_t> pool = {
        'a',     'e',     'A',     'o',     'u',     ' ',     'k',     0xE9,    0xC0,    0x300,   0x301,
        0x302,   0x308,   0x323,   0x327,   0x338,   0x340,   0x343,   0x344,   0x374,   0x37E,   0x387,
        0x3A9,   0x1100,  0x1112,  0x1161,  0x1175,  0x11A8,  0x11C2,  0xAC00,  0xAC01,  0xD7A3,  0x304B,
        0x304C,  0x3099,  0x309A,  0x30CF,  0xFF8A,  0xFF9E,  0x915,   0x93C,   0x958,   0x9C7,   0x9BE,
        0x9D7,   0xB47,   0xB3E,   0xB56,   0xB57,   0xBC6,   0xBBE,   0xBD7,   0xC46,   0xC56,   0xCBF,
        0xCC6,   0xCC2,   0xCD5,   0xCD6,   0xD46,   0xD3E,   0xD57,   0xDD9,   0xDCA,   0xDCF,   0xDDF,
        0x1025,  0x102E,  0x1B05,  0x1B35,  0x2126,  0x212B,  0x212A,  0xF900,  0x2F800, 0x1D15E, 0x1D165,
        0x1F600, 0x4E00,  0x5D9,   0x5B4,   0x5BC,   0x5C2,   0xFB1D,  0x21,    0x11099, 0x110BA, 0x1109A,
        0x11131, 0x11127, 0x1112E, 0x11347, 0x1133E, 0x11357, 0x1134B, 0x114B9, 0x114BA, 0x114BB, 0x114BD,
        0x115B8, 0x115AF, 0x115BA, 0x11935, 0x11930, 0x11938, 0x0F40,  0x0FB7,  0x0F43,  0x0F71,  0x0F72,
        0x0F73,  0x0F80,  0x0F81,  0x1E0A,  0x1E0C,  0x307,   0x1EBF,  0x1E9B,  0x17F,   0x2ADC,  0x2ADD,
        0x3008,  0x2329,  0xFB2A};
    uint64_t state = 12345;
    auto rnd = [&] {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<size_t>(state >> 33);
    };
    for (int iter = 0; iter < 200000; ++iter) {
        std::string s;
        const size_t len = 1 + rnd() % 8;
        for (size_t i = 0; i < len; ++i) clef::tok::append_utf8(s, pool[rnd() % pool.size()]);
        std::string full;
        clef::tok::nfc_append(s, full);
        std::string partial;
        const std::string got = clef::tok::nfc_if_needed(s, partial) ? partial : s;
        ASSERT_EQ(got, full) << "iteration " << iter;
    }
}

// ---------------------------------------------------------------------------------------------------------
// 6. tiny-clef: added tokens are split from the raw text before NFC

TEST(tokenizerTinyClef, AddedTokenBeforeNfc) {
    Tokenizer t = Tokenizer::from_hf_json(kData + "/tiny-clef/tokenizer.json");
    // U+0338 is CC B8; as byte-level characters "Ì" (U+00CC) and "¸" (U+00B8).
    const int32_t cc = t.token_to_id("\xC3\x8C");
    const int32_t b8 = t.token_to_id("\xC2\xB8");
    ASSERT_GE(cc, 0);
    ASSERT_LT(cc, 256);
    ASSERT_GE(b8, 0);
    ASSERT_LT(b8, 256);
    EXPECT_EQ(t.encode("<|im_end|>\xCC\xB8"), (Ids{258, cc, b8}));
    EXPECT_EQ(t.token_to_id("<think>"), 263);
    EXPECT_EQ(t.encode("!\n "), (Ids{0, 198, 220}));
    EXPECT_EQ(t.decode({258, cc, b8}), "<|im_end|>\xCC\xB8");
}

// ---------------------------------------------------------------------------------------------------------
// The `clef tokenize` subcommand (skipped when the clef binary has not been built).

struct CliResult {
    int status;
    std::string out, err;
};

CliResult run_cli(const std::string& input, const std::string& args) {
    const auto dir = std::filesystem::temp_directory_path();
    const std::string tag = std::to_string(::getpid());
    const std::string in = (dir / ("clef_cli_in_" + tag)).string();
    const std::string out = (dir / ("clef_cli_out_" + tag)).string();
    const std::string err = (dir / ("clef_cli_err_" + tag)).string();
    std::ofstream(in, std::ios::binary) << input;
    const std::string cmd = std::string("'") + CLEF_BINARY + "' tokenize " + args + " < '" + in + "' > '" +
                            out + "' 2> '" + err + "'";
    const int rc = std::system(cmd.c_str());
    CliResult r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out), read_file(err)};
    std::filesystem::remove(in);
    std::filesystem::remove(out);
    std::filesystem::remove(err);
    return r;
}

TEST(tokenizerCli, Tokenize) {
    if (!std::filesystem::exists(CLEF_BINARY)) GTEST_SKIP() << "clef binary not built: " << CLEF_BINARY;
    CliResult r = run_cli("{\"text\": \"Hello world\"}\n{\"text\": \"<|im_end|>\"}\n{\"text\": \"\"}\n",
                          "--tokenizer '" + kTok + "/qwen3'");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, "{\"ids\":[9707,1879]}\n{\"ids\":[151645]}\n{\"ids\":[]}\n");
    // GGUF path; llama.cpp semantics through the flags.
    r = run_cli("{\"text\": \"<|im_end|>\"}\n",
                "--tokenizer '" + kQwen2Gguf + "' --no-parse-special --no-normalize");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, "{\"ids\":[27,91,318,6213,91,29]}\n");
    // A bad line: exit status 2, one-line message naming the line; earlier lines were written.
    r = run_cli("{\"text\": \"a\"}\n{\"txt\": 1}\n{\"text\": \"b\"}\n", "--tokenizer '" + kQwen3Json + "'");
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, "{\"ids\":[64]}\n");
    EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    r = run_cli("{\"text\": \"a\xff\"}\n", "--tokenizer '" + kQwen3Json + "'");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("line 1: not valid JSON"), std::string::npos) << r.err;
    r = run_cli("", "--tokenizer '" + kTok + "/nope.json'");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("nope.json"), std::string::npos) << r.err;
}

}  // namespace
