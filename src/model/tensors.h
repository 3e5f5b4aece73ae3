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
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"

namespace clef {

struct TextLayerWeights;  // model/text_weights.h
namespace dev {
class Matrix;  // device/device.h
class Tensor;
}  // namespace dev

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

// A tensor's class in llama.cpp's ggml type rules (llama-quant.cpp's llama_tensor_get_type, which tells the
// classes apart by name): tools/gguf_types.cpp gives each class its type by file type, layer and dims.
enum class GgufQuant {
    F32,        // vectors, norms, conv taps, decays: always f32
    Default,    // the file type's base type
    TokenEmbd,  // the embedding table: lower in the 1-3 bit mixes, the output's type without an output matrix
    Output,     // the output (lm_head) matrix: q6_K in the k-quant mixes
    AttnV,      // llama.cpp's attn_v class (attn_v and the fused attn_qkv): more bits in most mixes
    AttnK,      // attn_k
    AttnQ,      // attn_q
    AttnOutput,  // attn_output
    FfnUp,       // ffn_up
    FfnGate,     // ffn_gate
    FfnDown,     // ffn_down: more bits on llama.cpp's use_more_bits layers in the k-quant mixes
    HeadQ8,      // joint-head matrices: q8_0 in every quantised file
    HeadBF16,    // the head's scorer output row: bf16 in every quantised file
    PatchEmbd,   // the vision patch-embedding kernels: f16 in f16 files, f32 in all others (mmproj)
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

// The model part a tensor belongs to; each part has one table below. The vision tower's GGUF names are those
// of llama.cpp's mmproj file, which holds the tower and nothing else.
enum class ModelPart { Text, Vision, Head };

// The text backbone's tensors outside the layers, by role.
enum class TextWeight { Layer, Embed, FinalNorm, LmHead };

// Where the backbone's loader puts a decoder-layer tensor (model/text_weights.h): a projection's Linear or
// a vector's values. The text table's rows carry it, so no switch joins a tensor to its field.
struct TextSlot {
    const dev::Matrix** (*linear)(TextLayerWeights&) = nullptr;
    dev::Tensor* (*vector)(TextLayerWeights&) = nullptr;
};

// The torch modules of the vision tower and of the joint head, by role: their loaders find each module's
// name and shape in the tables (vision_modules, head_modules) instead of spelling them again.
enum class VisionModule {
    PatchEmbed,
    PosEmbed,
    Norm1,
    Norm2,
    Qkv,
    Proj,
    Fc1,
    Fc2,
    MergerNorm,
    MergerFc1,
    MergerFc2
};
enum class HeadModule {
    HiddenNorm,
    MemoryProjection,
    QuestionProjection,
    OptionQuestionProjection,
    GlobalProjection,
    OptionContextProjection,
    OptionLexicalProjection,
    TypeEmbedding,
    QueryNorm,  // routing (evidence) layers
    MemoryNorm,
    Attention,  // the packed in-projection; *Out: its out_proj
    AttentionOut,
    FeedforwardNorm,
    FeedforwardIn,
    FeedforwardOut,
    OptionSummaryNorm,
    SelfAttn,  // field (decoder) layers
    SelfAttnOut,
    CrossAttn,
    CrossAttnOut,
    Linear1,
    Linear2,
    Norm1,
    Norm2,
    Norm3,
    FieldNorm,
    OptionNorm,
    ScorerIn,
    ScorerOut,
    PriorScale,  // the three scalars
    JointScale,
    ResidualGate,
};

struct TensorSpec {
    ModelPart part = ModelPart::Text;
    std::string hf;              // the publisher's name (text tensors: under "model.language_model.")
    std::string gguf;            // llama.cpp's name (vision: in the mmproj file)
    std::vector<int64_t> shape;  // the publisher's shape, from the config
    int layer = -1;              // decoder layer / vision block / head layer; -1 outside layers
    TextWeight text = TextWeight::Layer;  // text tensors only
    TextSlot slot;                        // text layer tensors only
    int module = -1;                      // vision / head: the VisionModule / HeadModule it belongs to
    bool matrix = false;                  // a projection run as a linear layer (2 * numel FLOPs per row)
    GgufLayout layout = GgufLayout::Same;
    int slice = 0;  // Split: 0 q, 1 k, 2 v; PatchFrame: the frame; Scales: the element of decision.scales
    GgufQuant quant = GgufQuant::Default;
    TensorInit init;
    DType dtype = DType::BF16;  // the dtype of a random checkpoint's copy

    int64_t numel() const;
    // Whether this row is the tensor's first (or only) GGUF piece: the publisher's tensor counted once.
    bool first_slice() const { return slice == 0; }
};

using TensorFn = std::function<void(const TensorSpec&)>;

// The shapes of the parts a visit covers; a null part is left out.
struct TensorTables {
    const TextConfig* text = nullptr;
    bool with_lm_head = true;  // false leaves out lm_head (tied embeddings)
    const VisionConfig* vision = nullptr;
    const HeadConfig* head = nullptr;
};

// The one visitor: every tensor of the parts given, part by part (vision tower, text backbone, joint head),
// each in its table's order.
void for_each_tensor(const TensorTables& t, const TensorFn& fn);

// One part's table (for_each_tensor with that part only).
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
// The row of a text tensor outside the layers (its names; shape and the rest from cfg).
TensorSpec text_tensor(const TextConfig& cfg, TextWeight w);
// Its GGUF name (token_embd.weight, output.weight, ...).
std::string text_gguf_name(TextWeight w);

// A torch module of the vision tower or the head, as its table gives it: its tensors' HF names (weight: the
// .weight, the packed .in_proj_weight of an attention, or a parameter of its own; bias: "" when it has
// none), its weight's GGUF name (the first third of a packed one) and the weight's shape.
struct ModuleRef {
    std::string weight, bias, gguf;
    std::vector<int64_t> shape;
};
// The modules of a part by (role, layer); layer -1 outside layers (the head's field layers follow its
// routing layers: layer routing_layers + n).
class ModuleIndex {
public:
    const ModuleRef& at(VisionModule m, int layer = -1) const { return at(static_cast<int>(m), layer); }
    const ModuleRef& at(HeadModule m, int layer = -1) const { return at(static_cast<int>(m), layer); }
    void add(int module, int layer, ModuleRef r);

private:
    const ModuleRef& at(int module, int layer) const;
    std::map<std::pair<int, int>, ModuleRef> m_;
};
// The vision tower's modules with HF names under prefix.
ModuleIndex vision_modules(const VisionConfig& cfg, const std::string& prefix = kVisionPrefix);
ModuleIndex head_modules(const HeadConfig& cfg);
// The names of a head of one routing and one field layer (for reading a file's shapes before its config is
// known).
ModuleIndex head_module_names();

// Parameters of decoder layer `layer` (its tensors in the table).
int64_t text_layer_params(const TextConfig& cfg, int layer);
// Parameters of a whole part.
int64_t vision_params(const VisionConfig& cfg);
int64_t head_params(const HeadConfig& cfg);

// A GGUF tensor name's row in the tables (layer numbers are not compared; the part, class and layer
// of a name the tables hold), for files read by name.
struct GgufNameInfo {
    bool known = false;
    ModelPart part = ModelPart::Text;
    GgufQuant quant = GgufQuant::Default;
    TextWeight text = TextWeight::Layer;
    int layer = -1;  // the text layer of "blk.N...." (-1 otherwise)
};
GgufNameInfo gguf_name_info(std::string_view gguf_name);

}  // namespace clef
