// The inventory of a Clef model's files: architecture, layer pattern, parameter counts per component (counted
// from the tensors in the files and expected from the config shapes), dtypes, files and sizes. `clef info`
// prints it (tools/model_info.h); `clef serve` publishes its card from it (model/model_card.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/model_dir.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace clef {

// Parameter counts of a Clef checkpoint, by component.
struct ParamCounts {
    int64_t linear_attention_layers = 0;  // the Gated DeltaNet decoder layers, MLP and norms included
    int64_t full_attention_layers = 0;    // the gated full-attention decoder layers, MLP and norms included
    int64_t final_norm = 0;
    int64_t embed_tokens = 0;
    int64_t lm_head = 0;
    int64_t vision = 0;  // vision tower and merger
    int64_t head = 0;    // joint schema head
    int64_t other = 0;   // tensors that belong to no component above (e.g. mtp.*)

    // Decoder layers + final norm (6,919,565,824 for Clef-Flash).
    int64_t backbone_layers() const { return linear_attention_layers + full_attention_layers + final_norm; }
    int64_t total() const { return backbone_layers() + embed_tokens + lm_head + vision + head + other; }
};

// Parameters of one decoder layer of the given type, from the config shapes.
int64_t expected_layer_params(const TextConfig& text, LayerType type);
int64_t expected_vision_params(const VisionConfig& vision);
int64_t expected_head_params(const HeadConfig& head);
// Every component from the config alone (lm_head is 0 when the embeddings are tied; vision is 0 without a
// vision_config; head is 0 when head is null).
ParamCounts expected_param_counts(const ModelConfig& config, const HeadConfig* head);

// The layer types as a repeated pattern, e.g. "3×linear + 1×full, repeated 2×".
std::string describe_layer_pattern(const std::vector<LayerType>& types);

struct ComponentInfo {
    std::string key;    // JSON key, e.g. "linear_attention_layers"
    std::string label;  // display name, e.g. "linear-attention layers"
    int64_t tensors = 0;
    int64_t actual = 0;    // counted from the tensors in the files
    int64_t expected = 0;  // from the config shapes
    bool matches() const { return actual == expected; }
};

struct DTypeTally {
    std::string dtype;  // safetensors spelling, e.g. "BF16"
    int64_t tensors = 0;
    int64_t params = 0;
    uint64_t bytes = 0;
};

struct FileEntry {
    std::string name;  // relative to the model directory
    std::string path;
    std::string role;  // "backbone config", "backbone weights", ...
    uint64_t bytes = 0;
    int64_t tensors = -1;  // safetensors files only
};

// What `clef info` adds for a GGUF file.
struct GgufInfo {
    uint32_t version = 0;
    uint32_t alignment = 0;
    std::string arch;                      // general.architecture: "clef" or "qwen35"
    int64_t file_type = -1;                // general.file_type (-1 when absent)
    std::string file_type_name;            // llama.cpp's name, e.g. "Q4_K_M"
    int64_t quantization_version = -1;     // general.quantization_version (-1 when absent)
    std::vector<std::string> quant_types;  // block-quantised ggml types present (ggml spelling), sorted
    int64_t context_length = -1;           // <arch>.context_length (-1 when absent)
    std::string head_source;  // "in the file", "joint_head.safetensors beside the file", or "none"
};

struct ModelInfo {
    // For a GGUF file: dir.root is the file, dir.backbone_only says whether a head was found, the paths of
    // the head files are set when they sit beside it; the other paths are empty.
    ModelDir dir;
    std::optional<GgufInfo> gguf;  // set for a GGUF file
    ModelConfig config;
    std::optional<HeadConfig> head;
    // Prefix of the text tensors: "model.language_model." (Qwen3_5ForConditionalGeneration layout) or
    // "model." (Qwen3_5ForCausalLM, text only).
    std::string text_prefix;
    std::string layer_pattern;
    ParamCounts actual;
    ParamCounts expected;
    std::vector<ComponentInfo> components;  // display order; the totals are not included
    std::vector<DTypeTally> dtypes;         // sorted by dtype name (GGUF: ggml type names, e.g. "q4_K")
    std::vector<FileEntry> files;
    int64_t backbone_tensors = 0;
    int64_t head_tensors = 0;
    std::vector<std::string> other_tensors;  // names of tensors counted under "other" (first few)
    std::vector<std::string> warnings;       // count mismatches, backbone only, unrecognised tensors

    bool counts_match() const;
};

// Locates the directory, loads both configs and the safetensors headers, and summarises them. A GGUF file
// (recognised by its magic) is summarised from its metadata and tensor infos (no tensor data is read), with
// the head files beside it for a qwen35 (backbone-only) file.
// head_dir: a qwen35 GGUF's head directory (as clef decide --head); "" looks beside the file.
ModelInfo compute_model_info(const std::string& model_dir, const std::string& head_dir = "");
// The same from already loaded parts; head_weights is null for a backbone-only model.
ModelInfo compute_model_info(const ModelDir& dir, const ModelDirConfig& config, const Checkpoint& backbone,
                             const SafetensorsFile* head_weights);

}  // namespace clef
