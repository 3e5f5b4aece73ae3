// GGUF models: `clef convert` (publisher layout -> GGUF, llama.cpp's `clef` / `qwen35` naming and transforms,
// optional quantisation) and loading a GGUF back into the engine's one internal convention (Hugging Face's).
//
// GGUF conventions undone at load (qwen35-backbone.md §6.3, clef-architecture.md §7):
//   - "+1" folded into every backbone RMSNorm weight except linear_attn.norm (ssm_norm): subtracted;
//   - ssm_a = -exp(A_log): A_log = log(-ssm_a);
//   - value heads tiled (GGUF head p = v*Hk + k) instead of grouped by key head (HF head k*r + v):
//     regrouped in the V rows of in_proj_qkv, the rows of in_proj_z / in_proj_a / in_proj_b, A_log,
//     dt_bias, the V channels of conv1d and the input columns of out_proj;
//   - ssm_conv1d {K, C} -> conv1d [C, 1, K]; the head's packed attention in_proj split into q/k/v (merged
//     back);
//   - decision.scales = [exp(min(prior, ln 100)), exp(min(joint, ln 100)), sigmoid(gate)]: logs / logit back.
// The backbone's quantised matrices (projections, token_embd, output) stay in the mapped file as QuantMatrix
// views (GgufModel::matrices; the head transforms become row / column maps) and are dequantised row by row by
// their consumers: the backbone packs projections from bf16 rows, embedding and lm_head rows are dequantised
// per token. Everything else (norms, conv, A_log, dt_bias, the joint head; F32 matrices, and F16 matrices
// with a transform) is converted to fp32 at load and presented under HF names as a Checkpoint and a head
// SafetensorsFile backed by a private temporary file (mapped, then unlinked), so the backbone and head
// loaders read GGUF and safetensors models through the same code.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "quant/quant.h"

namespace clef {

// llama.cpp's file types that `clef convert` writes (general.file_type values in parentheses).
enum class GgufFileType { F16 /*1*/, BF16 /*32*/, Q8_0 /*7*/, Q4_K_M /*15*/, Q5_K_M /*17*/, Q6_K /*18*/ };
// "f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k" (case-insensitive); false when unknown.
bool parse_gguf_file_type(std::string_view s, GgufFileType& out);
const char* gguf_file_type_name(GgufFileType t);

// The ggml type `clef convert` gives a tensor (GGUF name, ggml dims) under file type ft, for a backbone of
// n_layers layers, including llama.cpp's fallback for rows that are not a whole number of blocks
// (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, then f16). docs/GGUF.md lists the rules.
uint32_t gguf_tensor_type(const std::string& name, const std::vector<uint64_t>& dims, GgufFileType ft,
                          int n_layers);

struct ConvertOptions {
    GgufFileType type = GgufFileType::BF16;
    std::string arch = "clef";  // "clef" (backbone + head) or "qwen35" (backbone only)
    std::function<void(uint64_t done, uint64_t total)> progress;
    // Named chat templates written for the clef architecture as tokenizer.chat_template.<name> plus the
    // tokenizer.chat_templates list (llama.cpp's keys); `clef convert` passes the systemone template.
    std::map<std::string, std::string> chat_templates;
};

struct ConvertSummary {
    uint64_t tensors = 0;
    uint64_t bytes = 0;  // file size
    std::map<std::string, uint64_t> tensors_per_type;  // ggml type name -> count
};

// Converts a model directory in the publisher layout to one GGUF file. Throws clef::Error.
ConvertSummary convert_to_gguf(const std::string& model_dir, const std::string& out_path,
                               const ConvertOptions& opt);

// True when the path names a GGUF file (by its magic; false for directories and unreadable paths).
bool is_gguf_file(const std::string& path);

class GgufFile;

// The configs a GGUF's metadata describes (no tensor data is read): general.architecture, the backbone config
// (config.json equivalent), and for a clef file the head config. Throws clef::Error naming the file and key.
struct GgufModelConfig {
    std::string arch;  // "clef" or "qwen35"
    ModelConfig config;
    std::optional<HeadConfig> head_config;  // clef files only
};
GgufModelConfig read_gguf_model_config(const GgufFile& f);

// llama.cpp's name of a general.file_type value ("Q4_K_M", "BF16", ...); "unknown (N)" otherwise.
std::string llama_file_type_name(int64_t ftype);

// A GGUF model in HF form.
struct GgufModel {
    std::string path;
    std::string arch;  // "clef" or "qwen35"
    ModelConfig config;
    std::optional<HeadConfig> head_config;       // absent for a qwen35 file without a head
    std::unique_ptr<Checkpoint> weights;         // model.language_model.* and lm_head.weight, HF names
    QuantTensors matrices;                       // quantised backbone matrices (not in weights), HF names
    std::unique_ptr<SafetensorsFile> head;       // joint head, HF names (absent without a head)
    std::map<std::string, uint64_t> tensors_per_type;  // ggml type name -> count
};

// Loads a GGUF. For a qwen35 (backbone-only) file the head comes from head_dir (joint_head.safetensors +
// joint_head_config.json), or from the GGUF's directory when head_dir is empty and the files are there.
// Throws clef::Error naming the file and tensor (unsupported ggml types by name).
GgufModel load_gguf_model(const std::string& path, const std::string& head_dir = "");

}  // namespace clef
