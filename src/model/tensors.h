// Every tensor of a Clef model, written down once: one table per model part (the Qwen3.5 text backbone, the
// vision tower with its merger, the joint schema head). For each tensor: its name in the publisher's files
// (Hugging Face), its name in llama.cpp's GGUF layout and how that layout differs, its shape from the config,
// how a random checkpoint of that shape draws it and which ggml type a quantised GGUF gives it. The loaders,
// the GGUF reader and writer, the random checkpoints, the parameter counts and the FLOP count all iterate
// these tables (gemma.cpp's ForEachTensor is the model), so adding a tensor is one edit here. docs/GGUF.md
// explains the GGUF layouts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"

namespace clef {

// How llama.cpp's GGUF copy of a tensor differs from the publisher's.
enum class GgufLayout {
    Same,
    NormPlus1,  // GGUF = HF + 1 (zero-centred RMSNorm weights)
    ALog,       // GGUF ssm_a = -exp(A_log), value heads tiled
    VHeads1,    // rows / elements are value heads (in_proj_a, in_proj_b, dt_bias): tiled
    VHeadRows,  // rows are value heads of dv rows (in_proj_z): tiled
    QkvRows,    // the value part of the fused q|k|v rows tiled
    ConvV,      // conv taps [C, 1, K] <-> {K, C}: the value channels tiled
    VHeadCols,  // input columns are value heads of dv columns (the GDN output projection): tiled
    Split,      // one third (part) of a packed [3W, ...] attention in-projection
    Scales,     // the head's three scalars <-> one 3-vector
    // One temporal frame (part) of the vision patch embedding [H, C, T, P, P]: one 2-D kernel.
    PatchFrame,
};

// How a quantised GGUF file picks a ggml type for a tensor (llama.cpp's rules, by file type).
enum class GgufQuant {
    F32,        // vectors, norms, conv taps, decays: always f32
    Default,    // the file type's base type
    Output,     // the output (lm_head) matrix: q6_K in the k-quant mixes
    Q8InMixed,  // attention / SSM projections: q8_0 in the k-quant mixes
    MoreBits,   // ffn_down: q6_K on llama.cpp's use_more_bits layers in the k-quant mixes
    HeadQ8,     // joint-head matrices: q8_0 in every quantised file
    HeadBF16,   // the head's scorer output row: bf16 in every quantised file
    PatchEmbd,  // the vision patch-embedding kernels: f16 in f16 files, f32 in all others (mmproj)
};

// How a random checkpoint draws a tensor's values.
struct TensorInit {
    enum class Kind { Normal, Uniform, LogUniform, Constant };
    Kind kind = Kind::Normal;
    float a = 0, b = 1;  // Normal: a + b z; Uniform: U(a, b); LogUniform: log(U(a, b)); Constant: a
    // Rows [row_begin, row_end) of length row_len are multiplied by row_scale (Normal only).
    uint64_t row_len = 0, row_begin = 0, row_end = 0;
    float row_scale = 1;
};

// The weights of the text backbone, by role (the backbone loader stores each by this).
enum class TextWeight {
    Embed,
    FinalNorm,
    LmHead,
    InputNorm,
    PostNorm,
    MlpGate,
    MlpUp,
    MlpDown,
    GdnQkv,
    GdnZ,
    GdnA,
    GdnB,
    GdnConv,
    GdnDtBias,
    GdnALog,
    GdnNorm,
    GdnOut,
    AttnQ,
    AttnK,
    AttnV,
    AttnO,
    AttnQNorm,
    AttnKNorm,
};

struct TensorSpec {
    std::string hf;              // the publisher's name (text tensors: under "model.language_model.")
    std::string gguf;            // llama.cpp's name (vision: in the mmproj file)
    std::vector<int64_t> shape;  // the publisher's shape, from the config
    int layer = -1;              // decoder layer / vision block / head layer; -1 outside layers
    TextWeight text = TextWeight::Embed;  // text tensors only
    bool matrix = false;                  // a projection run as a linear layer (2 * numel FLOPs per row)
    GgufLayout layout = GgufLayout::Same;
    int part = 0;  // Split: 0 q, 1 k, 2 v; PatchFrame: the frame
    GgufQuant quant = GgufQuant::Default;
    TensorInit init;
    DType dtype = DType::BF16;  // the dtype of a random checkpoint's copy

    int64_t numel() const;
};

using TensorFn = std::function<void(const TensorSpec&)>;

// The text backbone's tensors in the publisher's module order (embeddings, layers, final norm, lm_head), with
// HF names under "model.language_model." (lm_head.weight at the top level). with_lm_head = false leaves out
// lm_head (tied embeddings).
void for_each_text_tensor(const TextConfig& cfg, bool with_lm_head, const TensorFn& fn);
// The vision tower and merger, HF names under "model.visual."; GGUF names of llama.cpp's mmproj file for the
// Qwen3-VL projector (v.*, mm.*; the patch embedding once per temporal frame, v.patch_embd.weight and
// v.patch_embd.weight.1).
void for_each_vision_tensor(const VisionConfig& cfg, const TensorFn& fn);
// The joint head, the reference JointSchemaHead's state-dict names; GGUF names of llama.cpp's clef
// architecture (the packed in-projections split three ways, the three scalars as decision.scales).
void for_each_head_tensor(const HeadConfig& cfg, const TensorFn& fn);

// The text tensors' name prefix in the publisher's layout.
inline constexpr const char* kTextPrefix = "model.language_model.";
inline constexpr const char* kVisionPrefix = "model.visual.";

// The prefix a checkpoint keeps the text tensors under: kTextPrefix (the publisher's
// Qwen3_5ForConditionalGeneration layout) or "model." (a text-only Qwen3_5ForCausalLM); "" when neither holds
// the embedding table. has(name) says whether the checkpoint holds a tensor.
std::string text_prefix_in(const std::function<bool(const std::string&)>& has);
// A text tensor's name under that prefix (lm_head.weight stays at the top level).
std::string text_name(const TensorSpec& s, const std::string& prefix);

// Parameters of decoder layer `layer` (its tensors in the table).
int64_t text_layer_params(const TextConfig& cfg, int layer);
// Parameters of a whole part.
int64_t vision_params(const VisionConfig& cfg);
int64_t head_params(const HeadConfig& cfg);

// The quantisation class of a GGUF tensor name (the tables' GGUF names; Default for names not in them).
GgufQuant gguf_quant_of(std::string_view gguf_name);
// The layer of a GGUF name "blk.N...." (-1 otherwise).
int gguf_layer_of(std::string_view gguf_name);

}  // namespace clef
