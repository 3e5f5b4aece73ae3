// The tokenizer.ggml.* vocabulary of a GGUF file, both ways: load_gguf.cpp reads it (Tokenizer::from_gguf),
// gguf_export.cpp writes it from a Hugging Face tokenizer.json (`clef convert`). Both use the token types
// below.
#pragma once

#include <cstdint>
#include <string>

namespace clef {

class GgufWriter;

// llama.cpp's token types (llama_token_type): the values of tokenizer.ggml.token_type.
enum class GgufTokenType : int32_t {
    kUndefined = 0,
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
};
constexpr int32_t kGgufTokenTypeMax = static_cast<int32_t>(GgufTokenType::kByte);

// Writes a byte-level BPE tokenizer.json as tokenizer.ggml.* metadata (model "gpt2", pre "qwen35") for a
// vocabulary of vocab_size ids: the BPE vocabulary as NORMAL tokens, added tokens as CONTROL (special) or
// USER_DEFINED, every id left without a token as "[PAD<id>]" (UNUSED); the merges; <|im_end|> as EOS and
// <|endoftext|> as padding when present; no BOS. Throws clef::Error("<path>: <problem>").
void write_gguf_tokenizer(GgufWriter& w, const std::string& tokenizer_json_path, int vocab_size);

}  // namespace clef
