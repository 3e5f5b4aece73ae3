// The GGUF metadata of a clef / qwen35 model, written down once as model/tensors.h writes down its tensors:
// per key of the backbone and of the joint head, its name (llama.cpp's, under the architecture prefix "clef."
// or "qwen35."), its GGUF type, the config value it comes from and the config.json field it gives back. Three
// walk these tables: clef convert writes the keys in their order (tools/gguf_convert.cpp), the reader gives
// the fields back (model/gguf_model.cpp), and Ollama's /api/show lists them (server/ollama.cpp). Adding a key
// is one row here. docs/GGUF.md lists the keys.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "model/config.h"

namespace clef {

// The names code outside the tables reads by hand (under the architecture prefix): the keys a reader
// derives a field from, the RoPE scaling's type and its refused log multiplier, and the keys of a file's
// context and of llama.cpp's type rules (model/model_inventory.cpp, tools/gguf_convert.cpp).
namespace gguf_key {
inline constexpr const char* kBlockCount = "block_count";
inline constexpr const char* kContextLength = "context_length";
inline constexpr const char* kHeadCount = "attention.head_count";
inline constexpr const char* kHeadCountKv = "attention.head_count_kv";
inline constexpr const char* kRopeDimensionCount = "rope.dimension_count";
inline constexpr const char* kRopeDimensionSections = "rope.dimension_sections";
inline constexpr const char* kRopeScalingType = "rope.scaling.type";
inline constexpr const char* kRopeScalingLogMultiplier = "rope.scaling.yarn_log_multiplier";  // refused
inline constexpr const char* kSsmInnerSize = "ssm.inner_size";
}  // namespace gguf_key

enum class GgufKeyType { UInt32, Float32, String, Int32Array };

// A key's value as clef writes it, the alternatives in GgufKeyType's order: an integer (UInt32), a real
// (Float32, rounded to float when written), a string, or integers (Int32Array).
using GgufMetaValue = std::variant<int64_t, double, std::string, std::vector<int32_t>>;

// Who walks a row (bits): clef convert writes it (where its value is not std::nullopt); the reader refuses a
// file without it (a row with a field but not this bit is read where the file has it); Ollama's /api/show
// lists it (integers).
enum GgufKeyUse : unsigned {
    kGgufWritten = 1,
    kGgufRequired = 2,
    kGgufShown = 4,
    kGgufScaling = 8,  // a RoPE scaling key: read only where rope.scaling.type is linear or yarn
};

template <class Config>
struct GgufMetaKey {
    const char* name;  // under the architecture prefix
    GgufKeyType type;
    // The field it gives back: a JSON pointer into config.json's text_config (the backbone's rows) or into
    // joint_head_config.json (the head's). nullptr where the reader derives the field from several keys or
    // from tensor shapes (model/gguf_model.cpp), or where nothing reads it back.
    const char* field;
    unsigned uses;  // GgufKeyUse bits
    // Its value for a config; std::nullopt: the key is left out (llama.cpp's default holds).
    std::optional<GgufMetaValue> (*value)(const Config&);
};

// The backbone's keys, in the order clef convert writes them.
std::span<const GgufMetaKey<TextConfig>> gguf_text_keys();
// The joint head's keys (the clef architecture), written after the backbone's.
std::span<const GgufMetaKey<HeadConfig>> gguf_head_keys();

}  // namespace clef
