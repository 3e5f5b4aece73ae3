// GGUF models read into the engine's one convention (Hugging Face's): the configs from the metadata, the
// tensors as WeightSources under the publisher's names, mapped in place. Which GGUF tensor is which, and
// how its layout differs, is model/tensors.h's table; docs/GGUF.md describes the layouts:
//   - "+1" folded into every backbone RMSNorm weight except the gated norm of the delta rule: subtracted;
//   - ssm_a = -exp(A_log): A_log = log(-ssm_a);
//   - value heads tiled (GGUF head p = v*Hk + k) instead of grouped by key head (HF head k*r + v);
//   - conv taps {K, C} instead of [C, 1, K]; the head's packed attention in-projections split in three;
//   - decision.scales = [exp(min(prior, ln 100)), exp(min(joint, ln 100)), sigmoid(gate)].
// Block-quantised matrices (and BF16 ones with a tiled layout) stay in the mapped file as QuantMatrix views
// whose row / column maps undo the tiling; F16 / BF16 / F32 tensors without a transform are served in place;
// the rest (norms, conv taps, decays, the joint head) are converted to fp32 in memory. No file is written.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/weight_source.h"
#include "model/config.h"
#include "model/tensors.h"

namespace clef {

// The configs a GGUF's metadata describes (no tensor data is read): general.architecture, the backbone config
// (config.json equivalent), and for a clef file the head config. Throws clef::Error naming the file and key.
struct GgufModelConfig {
    std::string arch;  // "clef" or "qwen35"
    ModelConfig config;
    std::optional<HeadConfig> head_config;  // clef files only
};
GgufModelConfig read_gguf_model_config(const GgufFile& f);

// A GGUF model in the publisher's form.
struct GgufModel {
    std::string path;
    std::string arch;  // "clef" or "qwen35"
    ModelConfig config;
    std::optional<HeadConfig> head_config;  // absent for a qwen35 file without a head
    WeightSource weights;                   // text tensors (model.language_model.*) and lm_head.weight
    std::unique_ptr<WeightSource> head;     // joint head, its own names (absent without a head)
    std::map<std::string, uint64_t> tensors_per_type;  // ggml type name -> count
};

// Loads a GGUF. For a qwen35 (backbone-only) file the head comes from head_dir (joint_head.safetensors +
// joint_head_config.json), or from the GGUF's directory when head_dir is empty and the files are there.
// Throws clef::Error naming the file and tensor (unsupported ggml types by name).
GgufModel load_gguf_model(const std::string& path, const std::string& head_dir = "");

// The head layout of the linear-attention layers (what the value-head tiling permutes).
struct GdnHeads {
    int64_t hk = 0, hv = 0, dk = 0, dv = 0;
};
GdnHeads gdn_heads(const TextConfig& c);

// Converts a tensor's values between the publisher's layout and GGUF's, in place (shape: the HF shape).
void to_gguf_layout(GgufLayout layout, std::vector<float>& x, const std::vector<int64_t>& shape,
                    const GdnHeads& g, const std::string& name);
// A tensor's GGUF dims (ggml order, innermost first) from its table entry.
std::vector<uint64_t> gguf_dims(const TensorSpec& s);

// Whether a GGUF tensor is F32, F16 or BF16 (served in place from the mapping).
bool gguf_float_type(const GgufTensorInfo& t);
// Such a tensor as a view into the mapping under `name`, in torch shape (the file must outlive the view).
TensorView gguf_tensor_view(const GgufFile& f, const GgufTensorInfo& t, std::string name);
// A whole GGUF tensor dequantised to fp32; clef::Error naming the tensor when clef cannot read its type.
std::vector<float> gguf_tensor_f32(const GgufFile& f, const GgufTensorInfo& t);

}  // namespace clef
