// What `clef serve` says about the model it serves (GET /v1/models, /api/tags, /api/show): the names it
// answers to and the facts of its checkpoint. The loader fills the facts (describe_model below reads them
// from the files, the server adds what the loaded engine knows); the naming rules are here, so every layout
// and every caller names a model the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace clef {

struct ModelCard {
    // Names: the canonical one (a response's `model`) and the others requests may use (served_names).
    std::string name;
    std::vector<std::string> aliases;
    std::string description;

    // What the checkpoint calls itself: "clef-flash" or "clef" (checkpoint_model_name), "" when it does not
    // say.
    std::string checkpoint_name;
    // The directory's or file's name (".gguf" dropped); "" when it names nothing (the demo's temporary copy).
    std::string file_name;

    std::string format;  // "safetensors" or "gguf"
    std::string
        quantization;  // the GGUF file type as llama.cpp names it ("Q4_K_M"), or the weights' dtype ("bf16")
    int64_t file_type = -1;             // GGUF general.file_type (-1: not a GGUF file)
    int64_t quantization_version = -1;  // GGUF general.quantization_version (-1: absent)
    int64_t parameter_count = 0;  // the loaded tensors: backbone (vision tower when loaded) + joint head
    int64_t context_length = 0;   // max_position_embeddings / <arch>.context_length
    bool vision = false;          // a vision tower is loaded (requests may carry images)
    std::string release_date;     // the publisher's release date ("YYYY-MM-DD"), "" when unknown
    uint64_t size_bytes = 0;      // the served files together
    std::string modified_at;      // the newest file's modification time (RFC 3339, UTC), "" when unknown
    std::string digest;           // 64 hex digits identifying the files (describe_model)
    ModelConfig config;
    std::optional<HeadConfig> head;
};

// The model a checkpoint's structure makes it: "clef" (Clef 27B: three delta-rule value heads per key head)
// or "clef-flash" (two, as Qwen3.5-9B), "" for another layout.
std::string checkpoint_model_name(const TextConfig& text);
// "clef-flash" or "clef" when a name written in a file (GGUF general.basename / general.name, e.g. "Clef
// Flash", "Cloudflare/clef-flash") is one of them, "" otherwise.
std::string known_model_name(std::string_view written);
// The known model a community file name names, e.g. "Cloudflare_clef-flash-Q4_K_M", "clef-flash-IQ2_M",
// "clef-27b.Q8_0" (organisation prefix, size label and quantisation suffix dropped); "" otherwise.
std::string model_name_in_file_name(std::string_view stem);
// The publisher's release date of a checkpoint with the published shapes of Clef-Flash or Clef, "" otherwise.
std::string published_release_date(const TextConfig& text);

// The names a served model answers to, canonical first: `name_override` (--name) when given, else the
// checkpoint's own name, else the model the file name names, else the file name, else "clef"; then the other
// names among these and `aliases`, each once.
std::vector<std::string> served_names(const ModelCard& card, const std::string& name_override,
                                      const std::vector<std::string>& aliases);
// Whether `requested` is one of `names`; "NAME:latest" (Ollama's default tag) is NAME.
bool names_model(const std::vector<std::string>& names, std::string_view requested);

// Ollama's human-readable parameter count: "9.5B", "27B", "1.2M", "950K".
std::string parameter_size_text(int64_t params);

// The card of a model from its files (the inventory of model/model_inventory.h; configs, safetensors
// headers and GGUF metadata, no tensor data): format, quantisation, parameter count, context length, sizes,
// modification time, and the name the checkpoint gives itself.
// path: a model directory or GGUF file; head_dir: a qwen35 GGUF's joint head (as Engine::load takes it);
// mmproj: a GGUF's vision tower file ("" for none). The names are left to served_names; `vision` says whether
// the files hold a vision tower that loads with the model. Throws clef::Error as compute_model_info does.
ModelCard describe_model(const std::string& path, const std::string& head_dir = "",
                         const std::string& mmproj = "");

}  // namespace clef
