// Internal: the state behind clef::Tokenizer, shared by the loaders (load_hf_json.cpp, load_gguf.cpp) and the
// encoder (tokenizer.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace clef {

namespace tok {

// Transparent string hashing: lookups by string_view without building a std::string.
struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct AddedToken {
    std::string content;
    int32_t id = -1;
    TokenKind kind = TokenKind::kSpecial;  // kSpecial or kUserDefined
    bool normalized = false;               // searched in the normalized text instead of the raw text
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
};

// Leftmost-longest matcher over a set of added tokens (a byte trie).
class AddedMatcher {
public:
    struct Match {
        size_t begin;
        size_t end;
        int32_t id;
    };
    void add(const AddedToken& token, std::string pattern);  // pattern: the text to search for
    bool empty() const { return tokens_.empty(); }
    // First match at or after `from` among the tokens `options` allows; false when none.
    bool find(std::string_view text, size_t from, const EncodeOptions& options, Match& m) const;

private:
    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> edges;
        int32_t token = -1;  // index into tokens_
    };
    int32_t child(int32_t node, uint8_t b) const {
        for (const auto& e : nodes_[node].edges)
            if (e.first == b) return e.second;
        return -1;
    }
    std::vector<Node> nodes_ = std::vector<Node>(1);
    std::vector<AddedToken> tokens_;
    std::array<bool, 256> first_{};
};

}  // namespace tok

struct Tokenizer::Impl {
    std::string source;
    bool nfc = false;
    std::string split_pattern;
    std::unique_ptr<tok::SplitRegex> regex;  // null: the whole piece is one pre-token

    // BPE model.
    tok::StringMap vocab;  // token string (byte-level alphabet) -> id
    tok::MergeTable merges;
    std::array<int32_t, 256> byte_ids{};  // id of each byte's alphabet character, -1 if missing
    int32_t unk_id = -1;
    bool ignore_merges = false;
    tok::StringMap raw_vocab;  // decoded bytes -> id (ignore_merges only)

    // Added tokens.
    std::vector<tok::AddedToken> added;
    tok::StringMap added_ids;        // content -> id
    tok::AddedMatcher raw_matcher;   // normalized:false tokens, searched in the raw text
    tok::AddedMatcher norm_matcher;  // normalized:true tokens, searched after NFC

    // Per id (filled by the loader, size = vocab size).
    std::vector<TokenKind> kinds;
    std::vector<std::string> id_text;  // the token string as stored (added tokens: their content)
    // Built by finalize().
    std::string dec_bytes;          // concatenated decoded bytes
    std::vector<uint32_t> dec_off;  // id -> [dec_off[id], dec_off[id+1])

    mutable tok::WordCache cache;

    // After vocab, added, kinds and id_text are filled: builds decode tables, byte ids and matchers.
    // `added_raw_decode`: decode added tokens as their raw text (GGUF) instead of through the byte-level
    // decoder (tokenizer.json, as Hugging Face does).
    void finalize(bool added_raw_decode);
};

}  // namespace clef
