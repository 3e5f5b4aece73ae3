// Byte-level BPE tokenizer compatible with Hugging Face `tokenizers` (Qwen2/Qwen3 style tokenizer.json) and
// with llama.cpp for GGUF vocabularies (tokenizer.ggml.model = "gpt2", pre = "qwen2" / "qwen35").
//
// Encoding (Hugging Face semantics, the default):
//   1. Added tokens (special or not) are found in the RAW text, leftmost-longest first (tokens marked
//      normalized:true are searched later, in the normalized pieces).
//   2. Every remaining piece is NFC-normalised on its own (when the tokenizer has the NFC normalizer).
//   3. It is split with the pre-tokenizer regex (PCRE2; \s and \S mean Unicode White_Space as in Oniguruma).
//   4. Each pre-token's UTF-8 bytes go through the byte-level alphabet and BPE merges by rank.
//   No BOS/EOS is ever added.
// Invalid UTF-8 in the input (which Hugging Face cannot receive at all) is defined as follows: every maximal
// run of ill-formed bytes becomes a pre-token of its own and is byte-level BPE-encoded as raw bytes; the
// valid text around it is processed as separate pieces (NFC and the regex never see the invalid bytes).
// Decoding such ids with decode_bytes() gives back the exact input bytes.
//
// llama.cpp semantics for a GGUF vocabulary: EncodeOptions{.normalize = false, .parse_special = false};
// CONTROL tokens are then plain text, USER_DEFINED tokens are still matched (as llama.cpp's
// tokenizer_st_partition does). Difference: llama.cpp partitions on the longest special token first across
// the whole text, this tokenizer takes the leftmost-longest match; the two only differ when added tokens
// overlap one another.
//
// Unicode data: regex categories (\p{L}, \p{N}, \p{M}) come from PCRE2's tables (Unicode 14 in PCRE2 10.42),
// NFC from utf8proc (Unicode 15 in 2.8); code points assigned after those versions may be classified
// differently from Hugging Face. Not supported (refused at load time with a clear error): other
// model/normalizer/pre-tokenizer/decoder types, add_prefix_space, Split behaviours other than Isolated,
// dropout.
//
// A Tokenizer is immutable after loading and cheap to copy (shared state); encode/decode are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace clef {

class GgufFile;

struct EncodeOptions {
    // Apply the tokenizer's normalizer (NFC) to each non-added-token piece. tokenizer.json: only when the
    // file has the NFC normalizer. GGUF: the qwen2/qwen35 pre-types come from Hugging Face tokenizers that
    // use NFC, so true means NFC; llama.cpp itself never normalizes (use false to match it).
    bool normalize = true;
    // Match special added tokens: tokenizer.json added_tokens with "special": true, GGUF CONTROL (and
    // UNKNOWN) tokens. false: their text is tokenized as ordinary text (llama.cpp parse_special=false).
    bool parse_special = true;
    // Match non-special added tokens: tokenizer.json added_tokens with "special": false, GGUF USER_DEFINED
    // tokens. Hugging Face and llama.cpp always match them; false is for cross-checks.
    bool parse_user_defined = true;
};

enum class TokenKind : uint8_t {
    kNone,         // no token has this id (hole in the id space)
    kNormal,       // BPE vocabulary token
    kSpecial,      // special added token / GGUF CONTROL or UNKNOWN
    kUserDefined,  // non-special added token / GGUF USER_DEFINED
    kUnused,       // GGUF UNUSED or BYTE: in the vocabulary, never matched as an added token
};

class Tokenizer {
public:
    // Hugging Face tokenizer.json (model BPE; merges "a b" or ["a","b"]; normalizer NFC / none;
    // pre_tokenizer Sequence[Split(Regex, Isolated), ByteLevel(use_regex=false)] or
    // ByteLevel(use_regex=true)). Throws clef::Error("<path>: <problem>") on anything it cannot load exactly.
    static Tokenizer from_hf_json(const std::string& path);
    // tokenizer.ggml.* metadata of a GGUF file (model "gpt2", pre "qwen2" or "qwen35").
    static Tokenizer from_gguf(const std::string& path);
    static Tokenizer from_gguf(const GgufFile& file);
    // A .gguf file (by magic), a .json file, or a directory holding tokenizer.json.
    static Tokenizer load(const std::string& path);

    // Hugging Face semantics (see the top of this file). No BOS/EOS.
    std::vector<int32_t> encode(std::string_view text) const;
    std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options) const;
    // Appends to out (reuses its capacity).
    void encode(std::string_view text, const EncodeOptions& options, std::vector<int32_t>& out) const;

    // Byte-level decode; invalid UTF-8 in the result becomes U+FFFD per maximal ill-formed subpart (Hugging
    // Face errors="replace", Rust from_utf8_lossy). Added tokens are included (skip_special_tokens=False).
    // Throws clef::Error for an id that names no token.
    std::string decode(const std::vector<int32_t>& ids) const;
    // The exact bytes, without replacement (llama.cpp detokenize with unparse_special).
    std::string decode_bytes(const std::vector<int32_t>& ids) const;

    int32_t token_to_id(std::string_view token) const;  // -1 if absent (added tokens included)
    std::string_view id_to_token(int32_t id) const;     // token string as stored ("" if no such id)
    TokenKind token_kind(int32_t id) const;
    size_t vocab_size() const;  // one past the largest id

    // Drops the bounded per-word cache (pre-token bytes -> ids). Results never depend on it; for benchmarks.
    void clear_cache() const;

    bool has_normalizer() const;               // NFC present (tokenizer.json) or implied (GGUF)
    const std::string& split_pattern() const;  // the pre-tokenizer regex as given ("" when none)
    const std::string& source() const;         // the file it was loaded from

    struct Impl;  // implementation detail (src/tokenizer/tokenizer_impl.h)

private:
    explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

}  // namespace clef
