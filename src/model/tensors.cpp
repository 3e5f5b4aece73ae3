#include "model/tensors.h"

#include <cmath>
#include <map>

namespace clef {

int64_t TensorSpec::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

namespace {

TensorInit normal(float mean, float std) {
    return {TensorInit::Kind::Normal, mean, std};
}

// A projection's initialiser: randn * fan_in^-0.5 (fan_in = product of the dimensions after the first).
TensorInit fan_in(const std::vector<int64_t>& shape, float extra = 1.0f) {
    int64_t n = 1;
    for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
    return normal(0.0f, extra / std::sqrt(static_cast<float>(n)));
}

// ------------------------------------------------------------------------------------------------------------
// The text backbone

enum class Where { Global, Every, Gdn, Attention };

struct TextKind {
    TextWeight id;
    Where where;
    const char* hf;    // after the text prefix (layer tensors: after "layers.N.")
    const char* gguf;  // layer tensors: after "blk.N."
    GgufLayout layout;
    GgufQuant quant;
};

// In the publisher's module order (the order its checkpoint files hold them).
constexpr TextKind kTextKinds[] = {
    {TextWeight::Embed, Where::Global, "embed_tokens.weight", "token_embd.weight", GgufLayout::Same,
     GgufQuant::Default},
    {TextWeight::AttnQ, Where::Attention, "self_attn.q_proj.weight", "attn_q.weight", GgufLayout::Same,
     GgufQuant::Q8InMixed},
    {TextWeight::AttnK, Where::Attention, "self_attn.k_proj.weight", "attn_k.weight", GgufLayout::Same,
     GgufQuant::Q8InMixed},
    {TextWeight::AttnV, Where::Attention, "self_attn.v_proj.weight", "attn_v.weight", GgufLayout::Same,
     GgufQuant::Q8InMixed},
    {TextWeight::AttnO, Where::Attention, "self_attn.o_proj.weight", "attn_output.weight", GgufLayout::Same,
     GgufQuant::Q8InMixed},
    {TextWeight::AttnQNorm, Where::Attention, "self_attn.q_norm.weight", "attn_q_norm.weight",
     GgufLayout::NormPlus1, GgufQuant::F32},
    {TextWeight::AttnKNorm, Where::Attention, "self_attn.k_norm.weight", "attn_k_norm.weight",
     GgufLayout::NormPlus1, GgufQuant::F32},
    {TextWeight::GdnDtBias, Where::Gdn, "linear_attn.dt_bias", "ssm_dt.bias", GgufLayout::VHeads1,
     GgufQuant::F32},
    {TextWeight::GdnALog, Where::Gdn, "linear_attn.A_log", "ssm_a", GgufLayout::ALog, GgufQuant::F32},
    {TextWeight::GdnConv, Where::Gdn, "linear_attn.conv1d.weight", "ssm_conv1d.weight", GgufLayout::ConvV,
     GgufQuant::F32},
    {TextWeight::GdnQkv, Where::Gdn, "linear_attn.in_proj_qkv.weight", "attn_qkv.weight", GgufLayout::QkvRows,
     GgufQuant::Q8InMixed},
    {TextWeight::GdnZ, Where::Gdn, "linear_attn.in_proj_z.weight", "attn_gate.weight", GgufLayout::VHeadRows,
     GgufQuant::Q8InMixed},
    {TextWeight::GdnB, Where::Gdn, "linear_attn.in_proj_b.weight", "ssm_beta.weight", GgufLayout::VHeads1,
     GgufQuant::Q8InMixed},
    {TextWeight::GdnA, Where::Gdn, "linear_attn.in_proj_a.weight", "ssm_alpha.weight", GgufLayout::VHeads1,
     GgufQuant::Q8InMixed},
    {TextWeight::GdnNorm, Where::Gdn, "linear_attn.norm.weight", "ssm_norm.weight", GgufLayout::Same,
     GgufQuant::F32},
    {TextWeight::GdnOut, Where::Gdn, "linear_attn.out_proj.weight", "ssm_out.weight", GgufLayout::VHeadCols,
     GgufQuant::Q8InMixed},
    {TextWeight::MlpGate, Where::Every, "mlp.gate_proj.weight", "ffn_gate.weight", GgufLayout::Same,
     GgufQuant::Default},
    {TextWeight::MlpUp, Where::Every, "mlp.up_proj.weight", "ffn_up.weight", GgufLayout::Same,
     GgufQuant::Default},
    {TextWeight::MlpDown, Where::Every, "mlp.down_proj.weight", "ffn_down.weight", GgufLayout::Same,
     GgufQuant::MoreBits},
    {TextWeight::InputNorm, Where::Every, "input_layernorm.weight", "attn_norm.weight", GgufLayout::NormPlus1,
     GgufQuant::F32},
    {TextWeight::PostNorm, Where::Every, "post_attention_layernorm.weight", "post_attention_norm.weight",
     GgufLayout::NormPlus1, GgufQuant::F32},
    {TextWeight::FinalNorm, Where::Global, "norm.weight", "output_norm.weight", GgufLayout::NormPlus1,
     GgufQuant::F32},
    {TextWeight::LmHead, Where::Global, "lm_head.weight", "output.weight", GgufLayout::Same,
     GgufQuant::Output},
};

// Shape, initialiser and random-checkpoint dtype of one text tensor from the config.
void shape_text_tensor(const TextConfig& c, TensorSpec& s) {
    const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
    const int64_t Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim, hd = c.head_dim;
    const int64_t key_dim = int64_t{c.linear_num_key_heads} * c.linear_key_head_dim, value_dim = Hv * dv;
    const int64_t conv_dim = 2 * key_dim + value_dim;
    const int64_t q_dim = int64_t{c.num_heads} * hd, kv_dim = int64_t{c.num_kv_heads} * hd;
    s.matrix = true;
    switch (s.text) {
        case TextWeight::Embed:
        case TextWeight::LmHead:
            s.shape = {V, H};
            s.init = normal(0.0f, 1.0f);
            s.matrix = false;  // rows read per token, not a projection
            return;
        case TextWeight::AttnQ:
            s.shape = {q_dim * (c.attn_output_gate ? 2 : 1), H};
            break;
        case TextWeight::AttnK:
        case TextWeight::AttnV:
            s.shape = {kv_dim, H};
            break;
        case TextWeight::AttnO:
            s.shape = {H, q_dim};
            break;
        case TextWeight::GdnQkv:
            s.shape = {conv_dim, H};
            s.init = fan_in(s.shape);
            // Random checkpoints: the value rows 2.5x larger (as in the fixture), so the delta-rule outputs
            // are not tiny.
            s.init.row_len = static_cast<uint64_t>(H);
            s.init.row_begin = static_cast<uint64_t>(2 * key_dim);
            s.init.row_end = static_cast<uint64_t>(conv_dim);
            s.init.row_scale = 2.5f;
            return;
        case TextWeight::GdnZ:
            s.shape = {value_dim, H};
            break;
        case TextWeight::GdnA:
        case TextWeight::GdnB:
            s.shape = {Hv, H};
            break;
        case TextWeight::GdnOut:
            s.shape = {H, value_dim};
            break;
        case TextWeight::MlpGate:
        case TextWeight::MlpUp:
            s.shape = {I, H};
            break;
        case TextWeight::MlpDown:
            s.shape = {H, I};
            break;
        default:
            s.matrix = false;
            break;
    }
    if (s.matrix) {
        s.init = fan_in(s.shape);
        return;
    }
    switch (s.text) {
        case TextWeight::GdnConv:
            s.shape = {conv_dim, 1, c.linear_conv_kernel};
            s.init = fan_in(s.shape);
            return;
        case TextWeight::GdnDtBias:
            s.shape = {Hv};
            s.init = {TensorInit::Kind::Uniform, -4.0f, -1.0f};
            return;
        case TextWeight::GdnALog:
            s.shape = {Hv};
            s.init = {TensorInit::Kind::LogUniform, 1.0f, 16.0f};
            s.dtype = DType::F32;
            return;
        case TextWeight::GdnNorm:
            s.shape = {dv};
            s.init = normal(1.0f, 0.1f);
            return;
        case TextWeight::AttnQNorm:
        case TextWeight::AttnKNorm:
            s.shape = {hd};
            break;
        default:
            s.shape = {H};
            break;  // the zero-centred RMSNorms of the residual stream
    }
    s.init = normal(0.0f, 0.1f);
}

TensorSpec text_spec(const TextConfig& c, const TextKind& k, int layer) {
    TensorSpec s;
    s.text = k.id;
    s.layer = layer;
    s.layout = k.layout;
    s.quant = k.quant;
    if (layer < 0) {
        s.hf = k.id == TextWeight::LmHead ? std::string(k.hf) : kTextPrefix + std::string(k.hf);
        s.gguf = k.gguf;
    } else {
        s.hf = kTextPrefix + ("layers." + std::to_string(layer) + ".") + k.hf;
        s.gguf = "blk." + std::to_string(layer) + "." + k.gguf;
    }
    shape_text_tensor(c, s);
    return s;
}

bool in_layer(Where w, LayerType t) {
    return w == Where::Every || (w == Where::Gdn && t == LayerType::LinearAttention) ||
           (w == Where::Attention && t == LayerType::FullAttention);
}

// ------------------------------------------------------------------------------------------------------------
// The vision tower and the joint head: the same table, written as torch modules (Linear, LayerNorm,
// MultiheadAttention) because their tensors come in those groups.

class Modules {
public:
    // matrices: the quantisation class of the projections' weights.
    Modules(const TensorFn& fn, GgufQuant matrices) : fn_(fn), matrices_(matrices) {}
    int layer = -1;

    void add(const std::string& hf, const std::string& gguf, std::vector<int64_t> shape, TensorInit init,
             GgufQuant quant = GgufQuant::F32, bool matrix = false) {
        TensorSpec s;
        s.hf = hf;
        s.gguf = gguf;
        s.shape = std::move(shape);
        s.layer = layer;
        s.matrix = matrix;
        s.quant = quant;
        s.init = init;
        fn_(s);
    }
    void emit(TensorSpec s) {
        s.layer = layer;
        fn_(s);
    }
    // torch.nn.Linear: weight [out][in] (+ bias [out]).
    void linear(const std::string& hf, const std::string& gguf, int64_t out, int64_t in, bool bias = true,
                float extra = 1.0f) {
        const std::vector<int64_t> shape{out, in};
        add(hf + ".weight", gguf + ".weight", shape, fan_in(shape, extra), matrix_quant(gguf), true);
        if (bias) add(hf + ".bias", gguf + ".bias", {out}, normal(0.0f, 0.1f));
    }
    // torch.nn.LayerNorm with weight and bias.
    void layer_norm(const std::string& hf, const std::string& gguf, int64_t n) {
        add(hf + ".weight", gguf + ".weight", {n}, normal(1.0f, 0.1f));
        add(hf + ".bias", gguf + ".bias", {n}, normal(0.0f, 0.1f));
    }
    // torch.nn.MultiheadAttention: packed in_proj_{weight,bias} [3W...] (GGUF: split into _q/_k/_v),
    // out_proj. The callback sees the packed tensor once per GGUF third (part 0, 1, 2), each with the full HF
    // shape.
    void mha(const std::string& hf, const std::string& gguf, int64_t w) {
        const char* qkv[3] = {"q", "k", "v"};
        const std::vector<int64_t> shape{3 * w, w};
        for (int p = 0; p < 3; ++p) {
            TensorSpec s;
            s.hf = hf + ".in_proj_weight";
            s.gguf = gguf + "_" + qkv[p] + ".weight";
            s.shape = shape;
            s.matrix = true;
            s.layout = GgufLayout::Split;
            s.part = p;
            s.quant = GgufQuant::HeadQ8;
            s.init = fan_in(shape);
            emit(s);
            s.hf = hf + ".in_proj_bias";
            s.gguf = gguf + "_" + qkv[p] + ".bias";
            s.shape = {3 * w};
            s.matrix = false;
            s.quant = GgufQuant::F32;
            s.init = normal(0.0f, 0.1f);
            emit(s);
        }
        linear(hf + ".out_proj", gguf + "_o", w, w);
    }

    // The head's scorer output row stays bf16 in quantised files (llama.cpp's clef rule).
    static bool is_scorer_out(std::string_view gguf) { return gguf == std::string(kScorerOut) + ".weight"; }

private:
    GgufQuant matrix_quant(const std::string& gguf) const {
        return gguf == kScorerOut ? GgufQuant::HeadBF16 : matrices_;
    }
    static constexpr const char* kScorerOut = "decision.scorer_out";
    const TensorFn& fn_;
    GgufQuant matrices_;
};

}  // namespace

void for_each_text_tensor(const TextConfig& cfg, bool with_lm_head, const TensorFn& fn) {
    for (const TextKind& k : kTextKinds)
        if (k.where == Where::Global && k.id == TextWeight::Embed) fn(text_spec(cfg, k, -1));
    for (int l = 0; l < cfg.num_layers; ++l)
        for (const TextKind& k : kTextKinds)
            if (k.where != Where::Global && in_layer(k.where, cfg.layer_types[l])) fn(text_spec(cfg, k, l));
    for (const TextKind& k : kTextKinds)
        if (k.where == Where::Global && k.id != TextWeight::Embed &&
            (with_lm_head || k.id != TextWeight::LmHead))
            fn(text_spec(cfg, k, -1));
}

void for_each_vision_tensor(const VisionConfig& v, const TensorFn& fn) {
    Modules m(fn, GgufQuant::Default);
    const std::string p = kVisionPrefix;
    const int64_t H = v.hidden_size,
                  merged = int64_t{v.hidden_size} * v.spatial_merge_size * v.spatial_merge_size;
    const std::vector<int64_t> patch{H, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size};
    for (int t = 0; t < v.temporal_patch_size; ++t) {  // the Conv3d as one 2-D kernel per frame
        TensorSpec s;
        s.hf = p + "patch_embed.proj.weight";
        s.gguf = "v.patch_embd.weight";
        if (t > 0) s.gguf += '.' + std::to_string(t);  // frame 0 keeps the plain name
        s.shape = patch;
        s.matrix = true;
        s.layout = GgufLayout::PatchFrame;
        s.part = t;
        s.quant = GgufQuant::PatchEmbd;
        s.init = fan_in(patch);
        m.emit(s);
    }
    m.add(p + "patch_embed.proj.bias", "v.patch_embd.bias", {H}, normal(0.0f, 0.1f));
    m.add(p + "pos_embed.weight", "v.position_embd.weight", {v.num_position_embeddings, H},
          normal(0.0f, 0.5f));
    for (int i = 0; i < v.depth; ++i) {
        m.layer = i;
        const std::string b = p + "blocks." + std::to_string(i) + ".", g = "v.blk." + std::to_string(i) + ".";
        m.layer_norm(b + "norm1", g + "ln1", H);
        m.layer_norm(b + "norm2", g + "ln2", H);
        m.linear(b + "attn.qkv", g + "attn_qkv", 3 * H, H);
        m.linear(b + "attn.proj", g + "attn_out", H, H);
        m.linear(b + "mlp.linear_fc1", g + "ffn_up", v.intermediate_size, H);
        m.linear(b + "mlp.linear_fc2", g + "ffn_down", H, v.intermediate_size);
    }
    m.layer = -1;
    m.layer_norm(p + "merger.norm", "v.post_ln", H);
    m.linear(p + "merger.linear_fc1", "mm.0", merged, merged);
    m.linear(p + "merger.linear_fc2", "mm.2", v.out_hidden_size, merged);
}

void for_each_head_tensor(const HeadConfig& h, const TensorFn& fn) {
    Modules m(fn, GgufQuant::HeadQ8);
    const int64_t H = h.hidden_size, W = h.width, F = h.feedforward;
    m.layer_norm("hidden_norm", "decision.hidden_norm", H);
    const char* proj[][2] = {{"memory_projection", "proj_memory"},
                             {"question_projection", "proj_question"},
                             {"option_question_projection", "proj_option_question"},
                             {"global_projection", "proj_global"},
                             {"option_context_projection", "proj_option_context"},
                             {"option_lexical_projection", "proj_option_lexical"}};
    for (auto& pr : proj) m.linear(pr[0], std::string("decision.") + pr[1], W, H, false);
    m.add("type_embedding.weight", "token_types.weight", {3, W}, normal(0.0f, 0.5f), GgufQuant::HeadQ8);
    for (int n = 0; n < h.routing_layers; ++n) {
        m.layer = n;
        const std::string s = "evidence_layers." + std::to_string(n) + ".",
                          d = "dec.blk." + std::to_string(n) + ".";
        m.layer_norm(s + "query_norm", d + "cross_attn_norm", W);
        m.layer_norm(s + "memory_norm", d + "cross_attn_norm_kv", W);
        m.mha(s + "attention", d + "cross_attn", W);
        m.layer_norm(s + "feedforward_norm", d + "ffn_norm", W);
        m.linear(s + "feedforward.0", d + "ffn_up", F, W);
        m.linear(s + "feedforward.3", d + "ffn_down", W, F);
    }
    m.layer = -1;
    m.layer_norm("option_summary_norm", "decision.option_summary_norm", W);
    for (int n = 0; n < h.layers; ++n) {
        m.layer = h.routing_layers + n;
        const std::string s = "layers." + std::to_string(n) + ".",
                          d = "dec.blk." + std::to_string(n + h.routing_layers) + ".";
        m.mha(s + "self_attn", d + "attn", W);
        m.mha(s + "multihead_attn", d + "cross_attn", W);
        m.linear(s + "linear1", d + "ffn_up", F, W);
        m.linear(s + "linear2", d + "ffn_down", W, F);
        m.layer_norm(s + "norm1", d + "attn_norm", W);
        m.layer_norm(s + "norm2", d + "cross_attn_norm", W);
        m.layer_norm(s + "norm3", d + "ffn_norm", W);
    }
    m.layer = -1;
    m.layer_norm("field_norm", "decision.field_norm", W);
    m.layer_norm("option_norm", "decision.option_norm", W);
    m.linear("residual_scorer.0", "decision.scorer", W, 4 * W);
    m.linear("residual_scorer.3", "decision.scorer_out", 1, W, true, 3.0f);
    for (auto [name, value] : {std::pair{"prior_logit_scale", 0.5f}, std::pair{"joint_logit_scale", 2.0f},
                               std::pair{"residual_gate", 0.0f}}) {
        TensorSpec s;
        s.hf = name;
        s.gguf =
            "decision.scales";  // the three scalars as one vector: [exp(prior), exp(joint), sigmoid(gate)]
        s.layout = GgufLayout::Scales;
        s.quant = GgufQuant::F32;
        s.init = {TensorInit::Kind::Constant, value, 0};
        m.emit(s);
    }
}

std::string text_prefix_in(const std::function<bool(const std::string&)>& has) {
    for (const char* p : {kTextPrefix, "model."})
        if (has(std::string(p) + kTextKinds[0].hf)) return p;
    return "";
}

std::string text_name(const TensorSpec& s, const std::string& prefix) {
    const std::string std_prefix = kTextPrefix;
    if (prefix == std_prefix || s.hf.compare(0, std_prefix.size(), std_prefix) != 0) return s.hf;
    return prefix + s.hf.substr(std_prefix.size());
}

int64_t text_layer_params(const TextConfig& cfg, int layer) {
    int64_t n = 0;
    for_each_text_tensor(cfg, false, [&](const TensorSpec& s) {
        if (s.layer == layer) n += s.numel();
    });
    return n;
}

int64_t vision_params(const VisionConfig& cfg) {
    int64_t n = 0;
    for_each_vision_tensor(cfg, [&](const TensorSpec& s) {
        if (s.part == 0) n += s.numel();  // the patch embedding once, not once per frame
    });
    return n;
}

int64_t head_params(const HeadConfig& cfg) {
    int64_t n = 0;
    for_each_head_tensor(cfg, [&](const TensorSpec& s) {
        if (s.layout != GgufLayout::Split || s.part == 0) n += s.numel();
    });
    return n;
}

int gguf_layer_of(std::string_view name) {
    if (name.substr(0, 4) != "blk.") return -1;
    int n = 0;
    size_t i = 4;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && n < (1 << 24); ++i)
        n = n * 10 + (name[i] - '0');
    return i > 4 && i < name.size() && name[i] == '.' ? n : -1;
}

namespace {

// A vision GGUF name with a block's number left out ("v.blk.3.ln1.weight" -> "v.blk.ln1.weight").
std::string vision_key(std::string_view name) {
    const std::string_view blk = "v.blk.";
    if (name.substr(0, blk.size()) != blk) return std::string(name);
    size_t i = blk.size();
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
    if (i == blk.size() || i >= name.size() || name[i] != '.') return std::string(name);
    return std::string(blk) + std::string(name.substr(i + 1));
}

// The quantisation class of a name of the vision table (Default when it is not one), from a one-block tower:
// the names do not depend on the widths.
GgufQuant vision_quant_of(std::string_view name) {
    static const std::map<std::string, GgufQuant, std::less<>> kByName = [] {
        VisionConfig v;
        v.depth = v.hidden_size = v.num_heads = v.intermediate_size = 1;
        v.num_position_embeddings = v.out_hidden_size = 1;
        std::map<std::string, GgufQuant, std::less<>> m;
        for_each_vision_tensor(v, [&](const TensorSpec& s) { m[vision_key(s.gguf)] = s.quant; });
        return m;
    }();
    const auto it = kByName.find(vision_key(name));
    return it == kByName.end() ? GgufQuant::Default : it->second;
}

}  // namespace

GgufQuant gguf_quant_of(std::string_view name) {
    if (name.substr(0, 2) == "v." || name.substr(0, 3) == "mm.") return vision_quant_of(name);
    const bool head = name.substr(0, 9) == "decision." || name.substr(0, 8) == "dec.blk." ||
                      name.substr(0, 12) == "token_types.";
    if (head) return Modules::is_scorer_out(name) ? GgufQuant::HeadBF16 : GgufQuant::HeadQ8;
    const bool layer = gguf_layer_of(name) >= 0;
    for (const TextKind& k : kTextKinds) {
        if ((k.where == Where::Global) == layer) continue;
        if (layer ? name.ends_with(std::string(".") + k.gguf) : name == k.gguf) return k.quant;
    }
    return GgufQuant::Default;
}

}  // namespace clef
