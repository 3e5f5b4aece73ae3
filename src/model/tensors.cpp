#include "model/tensors.h"

#include <cmath>
#include <map>
#include <tuple>

#include "model/text_weights.h"
#include "util/error.h"

namespace clef {

int64_t TensorSpec::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

namespace {

using Shape = std::vector<int64_t>;

TensorInit normal(float mean, float std) {
    return {TensorInit::Kind::Normal, mean, std};
}

// A projection's initialiser: randn * fan_in^-0.5 (fan_in = product of the dimensions after the first).
TensorInit fan_in(const Shape& shape, float extra = 1.0f) {
    int64_t n = 1;
    for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
    return normal(0.0f, extra / std::sqrt(static_cast<float>(n)));
}

// ------------------------------------------------------------------------------------------------------------
// The text backbone

enum class Where { Global, Every, Gdn, Attention };

// The widths a text tensor's shape is made of.
struct TextDims {
    explicit TextDims(const TextConfig& c)
        : H(c.hidden_size),
          I(c.intermediate_size),
          V(c.vocab_size),
          Hv(c.linear_num_value_heads),
          dv(c.linear_value_head_dim),
          hd(c.head_dim),
          K(c.linear_conv_kernel),
          key_dim(int64_t{c.linear_num_key_heads} * c.linear_key_head_dim),
          value_dim(Hv * dv),
          conv_dim(2 * key_dim + value_dim),
          q_dim(int64_t{c.num_heads} * hd * (c.attn_output_gate ? 2 : 1)),
          kv_dim(int64_t{c.num_kv_heads} * hd),
          o_dim(int64_t{c.num_heads} * hd) {}
    int64_t H, I, V, Hv, dv, hd, K, key_dim, value_dim, conv_dim;
    int64_t q_dim;  // the query rows, with the output gate's when it is on
    int64_t kv_dim, o_dim;
};

// How a random checkpoint draws a text tensor.
enum class Draw { Table, Projection, QkvRows, DtBias, ALog, GdnNorm, Norm };

// A field of a layer's weights, as a TextSlot (M: the member pointers from TextLayerWeights down).
template <class T>
T& member_at(T& x) {
    return x;
}
template <auto M, auto... Rest, class T>
auto& member_at(T& x) {
    return member_at<Rest...>(x.*M);
}
template <auto... M>
const dev::Matrix** linear_at(TextLayerWeights& w) {
    return &member_at<M...>(w);
}
template <auto... M>
dev::Tensor* vector_at(TextLayerWeights& w) {
    return &member_at<M...>(w);
}
using L = TextLayerWeights;
using G = TextGdnWeights;
using A = TextAttentionWeights;

struct TextKind {
    TextWeight id;
    Where where;
    const char* hf;    // after the text prefix (layer tensors: after "layers.N.")
    const char* gguf;  // layer tensors: after "blk.N."
    GgufLayout layout;
    GgufQuant quant;
    Shape (*shape)(const TextDims&);
    Draw draw;
    TextSlot slot;  // layer tensors: where the loader puts it (a projection when slot.linear is set)
};

#define CLEF_SHAPE(...) [](const TextDims& d) -> Shape { return {__VA_ARGS__}; }

// In the publisher's module order (the order its checkpoint files hold them). One row a line pair: role,
// where, HF name, GGUF name, GGUF layout and type class; shape, draw, the loader's slot.
// clang-format off
const TextKind kTextKinds[] = {
    {TextWeight::Embed, Where::Global, "embed_tokens.weight", "token_embd.weight", GgufLayout::Same,
     GgufQuant::TokenEmbd, CLEF_SHAPE(d.V, d.H), Draw::Table, {}},
    {TextWeight::Layer, Where::Attention, "self_attn.q_proj.weight", "attn_q.weight", GgufLayout::Same,
     GgufQuant::AttnQ, CLEF_SHAPE(d.q_dim, d.H), Draw::Projection, {linear_at<&L::attn, &A::q>}},
    {TextWeight::Layer, Where::Attention, "self_attn.k_proj.weight", "attn_k.weight", GgufLayout::Same,
     GgufQuant::AttnK, CLEF_SHAPE(d.kv_dim, d.H), Draw::Projection, {linear_at<&L::attn, &A::k>}},
    {TextWeight::Layer, Where::Attention, "self_attn.v_proj.weight", "attn_v.weight", GgufLayout::Same,
     GgufQuant::AttnV, CLEF_SHAPE(d.kv_dim, d.H), Draw::Projection, {linear_at<&L::attn, &A::v>}},
    {TextWeight::Layer, Where::Attention, "self_attn.o_proj.weight", "attn_output.weight", GgufLayout::Same,
     GgufQuant::AttnOutput, CLEF_SHAPE(d.H, d.o_dim), Draw::Projection, {linear_at<&L::attn, &A::o>}},
    {TextWeight::Layer, Where::Attention, "self_attn.q_norm.weight", "attn_q_norm.weight", GgufLayout::NormPlus1,
     GgufQuant::F32, CLEF_SHAPE(d.hd), Draw::Norm, {{}, vector_at<&L::attn, &A::q_norm>}},
    {TextWeight::Layer, Where::Attention, "self_attn.k_norm.weight", "attn_k_norm.weight", GgufLayout::NormPlus1,
     GgufQuant::F32, CLEF_SHAPE(d.hd), Draw::Norm, {{}, vector_at<&L::attn, &A::k_norm>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.dt_bias", "ssm_dt.bias", GgufLayout::VHeads1, GgufQuant::F32,
     CLEF_SHAPE(d.Hv), Draw::DtBias, {{}, vector_at<&L::gdn, &G::dt_bias>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.A_log", "ssm_a", GgufLayout::ALog, GgufQuant::F32,
     CLEF_SHAPE(d.Hv), Draw::ALog, {{}, vector_at<&L::gdn, &G::log_decay_rate>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.conv1d.weight", "ssm_conv1d.weight", GgufLayout::ConvV,
     GgufQuant::F32, CLEF_SHAPE(d.conv_dim, 1, d.K), Draw::Projection, {{}, vector_at<&L::gdn, &G::conv>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.in_proj_qkv.weight", "attn_qkv.weight", GgufLayout::QkvRows,
     GgufQuant::AttnV, CLEF_SHAPE(d.conv_dim, d.H), Draw::QkvRows, {linear_at<&L::gdn, &G::qkv>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.in_proj_z.weight", "attn_gate.weight", GgufLayout::VHeadRows,
     GgufQuant::Default, CLEF_SHAPE(d.value_dim, d.H), Draw::Projection, {linear_at<&L::gdn, &G::z>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.in_proj_b.weight", "ssm_beta.weight", GgufLayout::VHeads1,
     GgufQuant::Default, CLEF_SHAPE(d.Hv, d.H), Draw::Projection, {linear_at<&L::gdn, &G::b>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.in_proj_a.weight", "ssm_alpha.weight", GgufLayout::VHeads1,
     GgufQuant::Default, CLEF_SHAPE(d.Hv, d.H), Draw::Projection, {linear_at<&L::gdn, &G::a>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.norm.weight", "ssm_norm.weight", GgufLayout::Same,
     GgufQuant::F32, CLEF_SHAPE(d.dv), Draw::GdnNorm, {{}, vector_at<&L::gdn, &G::norm>}},
    {TextWeight::Layer, Where::Gdn, "linear_attn.out_proj.weight", "ssm_out.weight", GgufLayout::VHeadCols,
     GgufQuant::Default, CLEF_SHAPE(d.H, d.value_dim), Draw::Projection, {linear_at<&L::gdn, &G::out>}},
    {TextWeight::Layer, Where::Every, "mlp.gate_proj.weight", "ffn_gate.weight", GgufLayout::Same,
     GgufQuant::FfnGate, CLEF_SHAPE(d.I, d.H), Draw::Projection, {linear_at<&L::gate>}},
    {TextWeight::Layer, Where::Every, "mlp.up_proj.weight", "ffn_up.weight", GgufLayout::Same,
     GgufQuant::FfnUp, CLEF_SHAPE(d.I, d.H), Draw::Projection, {linear_at<&L::up>}},
    {TextWeight::Layer, Where::Every, "mlp.down_proj.weight", "ffn_down.weight", GgufLayout::Same,
     GgufQuant::FfnDown, CLEF_SHAPE(d.H, d.I), Draw::Projection, {linear_at<&L::down>}},
    {TextWeight::Layer, Where::Every, "input_layernorm.weight", "attn_norm.weight", GgufLayout::NormPlus1,
     GgufQuant::F32, CLEF_SHAPE(d.H), Draw::Norm, {{}, vector_at<&L::input_norm>}},
    {TextWeight::Layer, Where::Every, "post_attention_layernorm.weight", "post_attention_norm.weight",
     GgufLayout::NormPlus1, GgufQuant::F32, CLEF_SHAPE(d.H), Draw::Norm, {{}, vector_at<&L::post_norm>}},
    {TextWeight::FinalNorm, Where::Global, "norm.weight", "output_norm.weight", GgufLayout::NormPlus1,
     GgufQuant::F32, CLEF_SHAPE(d.H), Draw::Norm, {}},
    {TextWeight::LmHead, Where::Global, "lm_head.weight", "output.weight", GgufLayout::Same,
     GgufQuant::Output, CLEF_SHAPE(d.V, d.H), Draw::Table, {}},
};
// clang-format on

#undef CLEF_SHAPE

TensorInit text_init(Draw draw, const TextDims& d, const Shape& shape) {
    switch (draw) {
        case Draw::Table:
            return normal(0.0f, 1.0f);
        case Draw::Projection:
            return fan_in(shape);
        case Draw::QkvRows: {
            // Random checkpoints: the value rows 2.5x larger (as in the fixture), so the delta-rule outputs
            // are not tiny.
            TensorInit init = fan_in(shape);
            init.row_len = static_cast<uint64_t>(d.H);
            init.row_begin = static_cast<uint64_t>(2 * d.key_dim);
            init.row_end = static_cast<uint64_t>(d.conv_dim);
            init.row_scale = 2.5f;
            return init;
        }
        case Draw::DtBias:
            return {TensorInit::Kind::Uniform, -4.0f, -1.0f};
        case Draw::ALog:
            return {TensorInit::Kind::LogUniform, 1.0f, 16.0f};
        case Draw::GdnNorm:
            return normal(1.0f, 0.1f);
        case Draw::Norm:
            break;  // the zero-centred RMSNorms
    }
    return normal(0.0f, 0.1f);
}

TensorSpec text_spec(const TextConfig& c, const TextKind& k, int layer) {
    TensorSpec s;
    s.part = ModelPart::Text;
    s.text = k.id;
    s.slot = k.slot;
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
    const TextDims d(c);
    s.shape = k.shape(d);
    s.matrix = k.slot.linear != nullptr;
    s.init = text_init(k.draw, d, s.shape);
    if (k.draw == Draw::ALog) s.dtype = DType::F32;
    return s;
}

bool in_layer(Where w, LayerType t) {
    return w == Where::Every || (w == Where::Gdn && t == LayerType::LinearAttention) ||
           (w == Where::Attention && t == LayerType::FullAttention);
}

const TextKind& text_kind(TextWeight w) {
    for (const TextKind& k : kTextKinds)
        if (k.id == w) return k;
    throw Error("text table: no tensor of that role");
}

// ------------------------------------------------------------------------------------------------------------
// The vision tower and the joint head: the same table, written as torch modules (Linear, LayerNorm,
// MultiheadAttention) because their tensors come in those groups. Each module has its role (VisionModule /
// HeadModule), by which the loaders find it (ModuleIndex).

class Modules {
public:
    Modules(ModelPart part, const TensorFn& fn, ModuleIndex* index) : part_(part), fn_(fn), index_(index) {}
    int layer = -1;

    // A parameter of its own (one tensor).
    template <class Role>
    void param(Role role, const std::string& hf, const std::string& gguf, Shape shape, TensorInit init,
               GgufQuant quant = GgufQuant::F32) {
        index(role, {hf, "", gguf, shape});
        TensorSpec s = spec(role, hf, gguf, std::move(shape), init, quant);
        emit(s);
    }
    // torch.nn.Linear: weight [out][in] (+ bias [out]).
    template <class Role>
    void linear(Role role, const std::string& hf, const std::string& gguf, int64_t out, int64_t in,
                GgufQuant quant, bool bias = true, float extra = 1.0f) {
        const Shape shape{out, in};
        index(role, {hf + ".weight", bias ? hf + ".bias" : "", gguf + ".weight", shape});
        TensorSpec s = spec(role, hf + ".weight", gguf + ".weight", shape, fan_in(shape, extra), quant);
        s.matrix = true;
        emit(s);
        if (bias) emit(spec(role, hf + ".bias", gguf + ".bias", {out}, normal(0.0f, 0.1f), GgufQuant::F32));
    }
    // torch.nn.LayerNorm with weight and bias.
    template <class Role>
    void layer_norm(Role role, const std::string& hf, const std::string& gguf, int64_t n) {
        index(role, {hf + ".weight", hf + ".bias", gguf + ".weight", {n}});
        emit(spec(role, hf + ".weight", gguf + ".weight", {n}, normal(1.0f, 0.1f), GgufQuant::F32));
        emit(spec(role, hf + ".bias", gguf + ".bias", {n}, normal(0.0f, 0.1f), GgufQuant::F32));
    }
    // torch.nn.MultiheadAttention: packed in_proj_{weight,bias} [3W...] (GGUF: split into _q/_k/_v),
    // out_proj. The callback sees the packed tensor once per GGUF third (slice 0, 1, 2), each with the full
    // HF shape.
    void mha(HeadModule in_role, HeadModule out_role, const std::string& hf, const std::string& gguf,
             int64_t w) {
        const char* qkv[3] = {"q", "k", "v"};
        const Shape shape{3 * w, w};
        index(in_role, {hf + ".in_proj_weight", hf + ".in_proj_bias", gguf + "_q.weight", shape});
        for (int p = 0; p < 3; ++p) {
            TensorSpec s = spec(in_role, hf + ".in_proj_weight", gguf + "_" + qkv[p] + ".weight", shape,
                                fan_in(shape), GgufQuant::HeadQ8);
            s.matrix = true;
            s.layout = GgufLayout::Split;
            s.slice = p;
            emit(s);
            s = spec(in_role, hf + ".in_proj_bias", gguf + "_" + qkv[p] + ".bias", {3 * w},
                     normal(0.0f, 0.1f), GgufQuant::F32);
            s.layout = GgufLayout::Split;
            s.slice = p;
            emit(s);
        }
        linear(out_role, hf + ".out_proj", gguf + "_o", w, w, GgufQuant::HeadQ8);
    }
    void emit(const TensorSpec& s) { fn_(s); }
    template <class Role>
    TensorSpec spec(Role role, const std::string& hf, const std::string& gguf, Shape shape, TensorInit init,
                    GgufQuant quant) const {
        TensorSpec s;
        s.part = part_;
        s.hf = hf;
        s.gguf = gguf;
        s.shape = std::move(shape);
        s.layer = layer;
        s.module = static_cast<int>(role);
        s.quant = quant;
        s.init = init;
        return s;
    }

private:
    template <class Role>
    void index(Role role, ModuleRef r) {
        if (index_) index_->add(static_cast<int>(role), layer, std::move(r));
    }
    ModelPart part_;
    const TensorFn& fn_;
    ModuleIndex* index_;
};

void vision_table(const VisionConfig& v, const std::string& p, const TensorFn& fn, ModuleIndex* index) {
    using M = VisionModule;
    Modules m(ModelPart::Vision, fn, index);
    const int64_t H = v.hidden_size,
                  merged = int64_t{v.hidden_size} * v.spatial_merge_size * v.spatial_merge_size;
    const Shape patch{H, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size};
    const std::string patch_hf = p + "patch_embed.proj", patch_gguf = "v.patch_embd";
    if (index)
        index->add(static_cast<int>(M::PatchEmbed), -1,
                   {patch_hf + ".weight", patch_hf + ".bias", "", patch});
    for (int t = 0; t < v.temporal_patch_size; ++t) {  // the Conv3d as one 2-D kernel per frame
        // Frame 0 keeps the plain name.
        const std::string gguf = patch_gguf + ".weight" + (t > 0 ? '.' + std::to_string(t) : "");
        TensorSpec s =
            m.spec(M::PatchEmbed, patch_hf + ".weight", gguf, patch, fan_in(patch), GgufQuant::PatchEmbd);
        s.matrix = true;
        s.layout = GgufLayout::PatchFrame;
        s.slice = t;
        m.emit(s);
    }
    m.emit(m.spec(M::PatchEmbed, patch_hf + ".bias", patch_gguf + ".bias", {H}, normal(0.0f, 0.1f),
                  GgufQuant::F32));
    m.param(M::PosEmbed, p + "pos_embed.weight", "v.position_embd.weight", {v.num_position_embeddings, H},
            normal(0.0f, 0.5f));
    for (int i = 0; i < v.depth; ++i) {
        m.layer = i;
        const std::string b = p + "blocks." + std::to_string(i) + ".", g = "v.blk." + std::to_string(i) + ".";
        m.layer_norm(M::Norm1, b + "norm1", g + "ln1", H);
        m.layer_norm(M::Norm2, b + "norm2", g + "ln2", H);
        // llama.cpp's attn_v class by the attn_qkv name, and its ffn classes (no mmproj type depends on
        // them).
        m.linear(M::Qkv, b + "attn.qkv", g + "attn_qkv", 3 * H, H, GgufQuant::AttnV);
        m.linear(M::Proj, b + "attn.proj", g + "attn_out", H, H, GgufQuant::Default);
        m.linear(M::Fc1, b + "mlp.linear_fc1", g + "ffn_up", v.intermediate_size, H, GgufQuant::FfnUp);
        m.linear(M::Fc2, b + "mlp.linear_fc2", g + "ffn_down", H, v.intermediate_size, GgufQuant::FfnDown);
    }
    m.layer = -1;
    m.layer_norm(M::MergerNorm, p + "merger.norm", "v.post_ln", H);
    m.linear(M::MergerFc1, p + "merger.linear_fc1", "mm.0", merged, merged, GgufQuant::Default);
    m.linear(M::MergerFc2, p + "merger.linear_fc2", "mm.2", v.out_hidden_size, merged, GgufQuant::Default);
}

void head_layers(const HeadConfig& h, Modules& m) {
    using M = HeadModule;
    const int64_t W = h.width, F = h.feedforward;
    const GgufQuant q8 = GgufQuant::HeadQ8;
    for (int n = 0; n < h.routing_layers; ++n) {
        m.layer = n;
        const std::string s = "evidence_layers." + std::to_string(n) + ".",
                          d = "dec.blk." + std::to_string(n) + ".";
        m.layer_norm(M::QueryNorm, s + "query_norm", d + "cross_attn_norm", W);
        m.layer_norm(M::MemoryNorm, s + "memory_norm", d + "cross_attn_norm_kv", W);
        m.mha(M::Attention, M::AttentionOut, s + "attention", d + "cross_attn", W);
        m.layer_norm(M::FeedforwardNorm, s + "feedforward_norm", d + "ffn_norm", W);
        m.linear(M::FeedforwardIn, s + "feedforward.0", d + "ffn_up", F, W, q8);
        m.linear(M::FeedforwardOut, s + "feedforward.3", d + "ffn_down", W, F, q8);
    }
    m.layer = -1;
    m.layer_norm(M::OptionSummaryNorm, "option_summary_norm", "decision.option_summary_norm", W);
    for (int n = 0; n < h.layers; ++n) {
        m.layer = h.routing_layers + n;
        const std::string s = "layers." + std::to_string(n) + ".",
                          d = "dec.blk." + std::to_string(n + h.routing_layers) + ".";
        m.mha(M::SelfAttn, M::SelfAttnOut, s + "self_attn", d + "attn", W);
        m.mha(M::CrossAttn, M::CrossAttnOut, s + "multihead_attn", d + "cross_attn", W);
        m.linear(M::Linear1, s + "linear1", d + "ffn_up", F, W, q8);
        m.linear(M::Linear2, s + "linear2", d + "ffn_down", W, F, q8);
        m.layer_norm(M::Norm1, s + "norm1", d + "attn_norm", W);
        m.layer_norm(M::Norm2, s + "norm2", d + "cross_attn_norm", W);
        m.layer_norm(M::Norm3, s + "norm3", d + "ffn_norm", W);
    }
    m.layer = -1;
}

void head_table(const HeadConfig& h, const TensorFn& fn, ModuleIndex* index) {
    using M = HeadModule;
    Modules m(ModelPart::Head, fn, index);
    const int64_t H = h.hidden_size, W = h.width;
    const GgufQuant q8 = GgufQuant::HeadQ8;
    m.layer_norm(M::HiddenNorm, "hidden_norm", "decision.hidden_norm", H);
    const std::tuple<M, const char*, const char*> proj[] = {
        {M::MemoryProjection, "memory_projection", "proj_memory"},
        {M::QuestionProjection, "question_projection", "proj_question"},
        {M::OptionQuestionProjection, "option_question_projection", "proj_option_question"},
        {M::GlobalProjection, "global_projection", "proj_global"},
        {M::OptionContextProjection, "option_context_projection", "proj_option_context"},
        {M::OptionLexicalProjection, "option_lexical_projection", "proj_option_lexical"}};
    for (const auto& [role, hf, gguf] : proj)
        m.linear(role, hf, std::string("decision.") + gguf, W, H, q8, false);
    m.param(M::TypeEmbedding, "type_embedding.weight", "token_types.weight", {3, W}, normal(0.0f, 0.5f), q8);
    head_layers(h, m);
    m.layer_norm(M::FieldNorm, "field_norm", "decision.field_norm", W);
    m.layer_norm(M::OptionNorm, "option_norm", "decision.option_norm", W);
    m.linear(M::ScorerIn, "residual_scorer.0", "decision.scorer", W, 4 * W, q8);
    m.linear(M::ScorerOut, "residual_scorer.3", "decision.scorer_out", 1, W, GgufQuant::HeadBF16, true, 3.0f);
    // The three scalars as one GGUF vector: [exp(prior), exp(joint), sigmoid(gate)], element `slice`.
    const std::tuple<M, const char*, float> scalars[] = {{M::PriorScale, "prior_logit_scale", 0.5f},
                                                         {M::JointScale, "joint_logit_scale", 2.0f},
                                                         {M::ResidualGate, "residual_gate", 0.0f}};
    for (int i = 0; i < 3; ++i) {
        const auto& [role, name, value] = scalars[i];
        if (index) index->add(static_cast<int>(role), -1, {name, "", "decision.scales", {}});
        TensorSpec s =
            m.spec(role, name, "decision.scales", {}, {TensorInit::Kind::Constant, value, 0}, GgufQuant::F32);
        s.layout = GgufLayout::Scales;
        s.slice = i;
        m.emit(s);
    }
}

void no_tensor(const TensorSpec&) {}

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
    vision_table(v, kVisionPrefix, fn, nullptr);
}

void for_each_head_tensor(const HeadConfig& h, const TensorFn& fn) {
    head_table(h, fn, nullptr);
}

void for_each_tensor(const TensorTables& t, const TensorFn& fn) {
    if (t.vision) for_each_vision_tensor(*t.vision, fn);
    if (t.text) for_each_text_tensor(*t.text, t.with_lm_head, fn);
    if (t.head) for_each_head_tensor(*t.head, fn);
}

void ModuleIndex::add(int module, int layer, ModuleRef r) {
    m_[{module, layer}] = std::move(r);
}

const ModuleRef& ModuleIndex::at(int module, int layer) const {
    const auto it = m_.find({module, layer});
    if (it == m_.end())
        throw Error("tensor table: no module " + std::to_string(module) + " in layer " +
                    std::to_string(layer));
    return it->second;
}

ModuleIndex vision_modules(const VisionConfig& cfg, const std::string& prefix) {
    ModuleIndex index;
    vision_table(cfg, prefix, no_tensor, &index);
    return index;
}

ModuleIndex head_modules(const HeadConfig& cfg) {
    ModuleIndex index;
    head_table(cfg, no_tensor, &index);
    return index;
}

ModuleIndex head_module_names() {
    return head_modules(HeadConfig{1, 1, 1, 1, 1, 1});
}

std::string text_prefix_in(const std::function<bool(const std::string&)>& has) {
    for (const char* p : {kTextPrefix, "model."})
        if (has(std::string(p) + text_kind(TextWeight::Embed).hf)) return p;
    return "";
}

std::string text_name(const TensorSpec& s, const std::string& prefix) {
    const std::string std_prefix = kTextPrefix;
    if (prefix == std_prefix || s.hf.compare(0, std_prefix.size(), std_prefix) != 0) return s.hf;
    return prefix + s.hf.substr(std_prefix.size());
}

TensorSpec text_tensor(const TextConfig& cfg, TextWeight w) {
    return text_spec(cfg, text_kind(w), -1);
}

std::string text_gguf_name(TextWeight w) {
    return text_kind(w).gguf;
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
        if (s.first_slice()) n += s.numel();  // the patch embedding once, not once per frame
    });
    return n;
}

int64_t head_params(const HeadConfig& cfg) {
    int64_t n = 0;
    for_each_head_tensor(cfg, [&](const TensorSpec& s) {
        if (s.layout != GgufLayout::Split || s.first_slice()) n += s.numel();
    });
    return n;
}

namespace {

// A GGUF name with its block number left out ("blk.3.attn_q.weight" -> "blk.attn_q.weight", also under
// "v." and "dec."); layer: the number (-1 without one).
std::string gguf_key(std::string_view name, int& layer) {
    layer = -1;
    const size_t at = name.find("blk.");
    if (at == std::string_view::npos || (at > 0 && name[at - 1] != '.')) return std::string(name);
    size_t i = at + 4;
    int n = 0;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && n < (1 << 24); ++i)
        n = n * 10 + (name[i] - '0');
    if (i == at + 4 || i >= name.size() || name[i] != '.') return std::string(name);
    layer = n;
    return std::string(name.substr(0, at + 4)) + std::string(name.substr(i + 1));
}

// Every table row by gguf_key, from tables of one layer of each kind (the names do not depend on the widths).
const std::map<std::string, GgufNameInfo, std::less<>>& gguf_rows() {
    static const std::map<std::string, GgufNameInfo, std::less<>> rows = [] {
        TextConfig t;
        t.num_layers = 2;
        t.layer_types = {LayerType::LinearAttention, LayerType::FullAttention};
        VisionConfig v;
        v.depth = 1;
        const HeadConfig h{1, 1, 1, 1, 1, 1};
        std::map<std::string, GgufNameInfo, std::less<>> m;
        for_each_tensor({&t, true, &v, &h}, [&](const TensorSpec& s) {
            int layer;
            m[gguf_key(s.gguf, layer)] = {true, s.part, s.quant, s.text, -1};
        });
        return m;
    }();
    return rows;
}

}  // namespace

GgufNameInfo gguf_name_info(std::string_view name) {
    int layer;
    const auto it = gguf_rows().find(gguf_key(name, layer));
    if (it == gguf_rows().end()) return {};
    GgufNameInfo info = it->second;
    if (info.part == ModelPart::Text) info.layer = layer;
    return info;
}

}  // namespace clef
