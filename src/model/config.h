// Model configuration: the Qwen3.5 text backbone (config.json, nested text_config or a plain text layout),
// the optional vision tower, and the joint schema head (joint_head_config.json).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/model_dir.h"
#include "ops/basic.h"
#include "ops/rope.h"

namespace clef {

enum class LayerType { LinearAttention, FullAttention };

// "linear_attention" / "full_attention", the spelling of config.json's layer_types.
const char* layer_type_name(LayerType t);

// Qwen3.5's layer pattern: layer i (from 0) is full attention when (i + 1) is a multiple of the
// full-attention interval, linear attention otherwise.
inline constexpr int kDefaultFullAttentionInterval = 4;
LayerType layer_type_at(int layer, int full_attention_interval);
std::vector<LayerType> layer_types_for(int num_layers, int full_attention_interval);
// The interval that produces `types` (the first full-attention layer's number), or 0 when none does.
int full_attention_interval_of(const std::vector<LayerType>& types);

struct TextConfig {
    int vocab_size = 0;
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_layers = 0;
    std::vector<LayerType> layer_types;  // size num_layers
    // Gated full attention.
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    bool attn_output_gate = true;
    double rope_theta = 1e7;
    double partial_rotary_factor = 0.25;
    int rotary_dim = 0;              // head_dim * partial_rotary_factor
    std::vector<int> mrope_section;  // e.g. {11, 11, 10}; sums to rotary_dim / 2
    bool mrope_interleaved = true;
    // RoPE scaling (rope_parameters' or rope_scaling's rope_type and its keys, resolved as transformers does:
    // docs/LONG_CONTEXT.md); the default type leaves it at its default.
    ops::RopeScaling rope_scaling;
    // Gated DeltaNet.
    int linear_num_key_heads = 0;
    int linear_num_value_heads = 0;
    int linear_key_head_dim = 0;
    int linear_value_head_dim = 0;
    int linear_conv_kernel = 4;
    // The activation of the GDN gated norm's z: text_config.output_gate_type "swish"/"silu" (Qwen3.5's and
    // both Clef models') or "sigmoid" (vLLM's RMSNormGated reads the key so). The attention output gate is
    // always sigmoid (tests/data/tiny-clef27/README.md).
    ops::NormGate gdn_norm_gate = ops::NormGate::Silu;
    float rms_norm_eps = 1e-6f;
    bool tie_word_embeddings = false;
    int max_position_embeddings = 0;
    int mtp_num_hidden_layers = 0;  // multi-token-prediction layers (mtp.* tensors; unused by the engine)

    int num_layers_of(LayerType t) const;
    // The longest prompt the model is configured for: max_position_embeddings, or a RoPE scaling's factor x
    // its original context when that is longer (a YaRN config may leave max_position_embeddings at the
    // original).
    int64_t context_length() const;
};

struct VisionConfig {
    int depth = 0;
    int hidden_size = 0;
    int num_heads = 0;
    int intermediate_size = 0;
    int patch_size = 16;
    int temporal_patch_size = 2;
    int spatial_merge_size = 2;
    int num_position_embeddings = 0;
    int out_hidden_size = 0;
    int in_channels = 3;
    std::string hidden_act;
};

struct HeadConfig {
    int hidden_size = 0;
    int width = 0;
    int routing_layers = 0;
    int layers = 0;
    int heads = 0;
    int feedforward = 0;
};

struct ModelConfig {
    std::string architecture;  // e.g. Qwen3_5ForConditionalGeneration
    std::string model_type;    // e.g. qwen3_5
    TextConfig text;
    std::optional<VisionConfig> vision;
    int image_token_id = -1;
    int video_token_id = -1;
    int vision_start_token_id = -1;
    int vision_end_token_id = -1;
};

// Parse and validate; throw clef::Error("<path>: <field>: <problem>") for unknown or inconsistent configs.
ModelConfig load_model_config(const std::string& config_json_path);
ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name);
HeadConfig load_head_config(const std::string& path);
// A vision_config object on its own (config.json's keys; a GGUF mmproj's metadata mapped to them), checked as
// parse_model_config checks it and against the text backbone it feeds (out_hidden_size == its hidden_size).
VisionConfig parse_vision_config_json(const std::string& json_text, const std::string& source_name,
                                      const TextConfig& text);
HeadConfig parse_head_config(const std::string& json_text, const std::string& source_name);

// The configs of a located model directory. head is empty for a backbone-only directory. Also checks that the
// head reads the backbone's width (joint_head_config.json hidden_size == text hidden_size).
struct ModelDirConfig {
    ModelConfig model;
    std::optional<HeadConfig> head;
};
ModelDirConfig load_model_dir_config(const ModelDir& dir);

}  // namespace clef
