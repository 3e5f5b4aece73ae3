#include "model/backbone.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ops/basic.h"
#include "ops/conv.h"
#include "ops/delta_rule.h"
#include "ops/rope.h"
#include "util/error.h"

namespace clef {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

int count_layers(const TextConfig& c, LayerType t) {
    return static_cast<int>(std::count(c.layer_types.begin(), c.layer_types.end(), t));
}

void check_config(const TextConfig& c) {
    auto fail = [](const std::string& what) { throw Error("backbone config: " + what); };
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0)
        fail("vocab_size, hidden_size, intermediate_size and num_layers must be positive");
    if (static_cast<int>(c.layer_types.size()) != c.num_layers)
        fail("layer_types has " + std::to_string(c.layer_types.size()) + " entries, num_layers is " +
             std::to_string(c.num_layers));
    if (count_layers(c, LayerType::FullAttention) > 0) {
        if (c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 || c.num_heads % c.num_kv_heads != 0)
            fail(
                "attention: num_heads, num_kv_heads and head_dim must be positive, num_heads a multiple "
                "of num_kv_heads");
        const int rd = c.rotary_dim;
        if (rd <= 0 || rd % 2 != 0 || rd > c.head_dim)
            fail("rotary_dim " + std::to_string(rd) + " must be even and in (0, head_dim]");
        if (!c.mrope_section.empty()) {
            if (c.mrope_section.size() != 3) fail("mrope_section must have 3 entries");
            int sum = 0;
            for (int s : c.mrope_section) {
                if (s < 0) fail("mrope_section entries must be >= 0");
                sum += s;
            }
            if (sum != rd / 2) fail("mrope_section must sum to rotary_dim/2 = " + std::to_string(rd / 2));
        }
        if (!(c.rope_theta > 0)) fail("rope_theta must be positive");
    }
    if (count_layers(c, LayerType::LinearAttention) > 0) {
        if (c.linear_num_key_heads <= 0 || c.linear_num_value_heads <= 0 || c.linear_key_head_dim <= 0 ||
            c.linear_value_head_dim <= 0 || c.linear_conv_kernel <= 0 ||
            c.linear_num_value_heads % c.linear_num_key_heads != 0)
            fail(
                "linear attention: heads, head dims and conv kernel must be positive, "
                "linear_num_value_heads a multiple of linear_num_key_heads");
    }
}

// x[i] += y[i]
void add_inplace(float* x, const float* y, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

ops::RopeParams rope_params(const TextConfig& c) {
    ops::RopeParams p;
    p.rotary_dim = c.rotary_dim;
    p.theta = c.rope_theta;
    if (c.mrope_section.size() == 3)
        p.mrope_section = {c.mrope_section[0], c.mrope_section[1], c.mrope_section[2]};
    p.interleaved = c.mrope_interleaved;
    // HF computes inv_freq and the angles in fp32. Angles in double were measured against the float64 goldens
    // of tiny-clef and are no better (per-case differences are noise), so the engine follows HF.
    p.fp64_angles = false;
    return p;
}

}  // namespace

Backbone::Backbone(const TextConfig& cfg, const Checkpoint& ckpt) : cfg_(cfg) {
    check_config(cfg_);
    if (ckpt.find("model.language_model.embed_tokens.weight"))
        prefix_ = "model.language_model.";
    else if (ckpt.find("model.embed_tokens.weight"))
        prefix_ = "model.";
    else
        throw Error(ckpt.description() +
                    ": no text backbone (neither model.language_model.embed_tokens.weight nor "
                    "model.embed_tokens.weight)");

    auto load = [&](const std::string& name, std::vector<int64_t> shape) {
        const TensorView& t = ckpt.get(prefix_ + name);
        if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F64)
            throw Error(ckpt.description() + ": tensor " + t.name + ": dtype " +
                        std::string(dtype_name(t.dtype)) + " is not a float type");
        if (t.shape != shape)
            throw Error(ckpt.description() + ": tensor " + t.name + ": shape " + shape_str(t.shape) +
                        " does not match the config (expected " + shape_str(shape) + ")");
        return t.to_f32();
    };

    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    embed_tokens_ = load("embed_tokens.weight", {cfg_.vocab_size, H});
    final_norm_ = load("norm.weight", {H});
    layers_.resize(cfg_.num_layers);
    for (int l = 0; l < cfg_.num_layers; ++l) {
        Layer& L = layers_[l];
        const std::string p = "layers." + std::to_string(l) + ".";
        L.type = cfg_.layer_types[l];
        L.input_layernorm = load(p + "input_layernorm.weight", {H});
        L.post_attention_layernorm = load(p + "post_attention_layernorm.weight", {H});
        L.gate_proj = load(p + "mlp.gate_proj.weight", {I, H});
        L.up_proj = load(p + "mlp.up_proj.weight", {I, H});
        L.down_proj = load(p + "mlp.down_proj.weight", {H, I});
        if (L.type == LayerType::LinearAttention) {
            const int64_t Hv = cfg_.linear_num_value_heads;
            const int64_t key_dim = int64_t{cfg_.linear_num_key_heads} * cfg_.linear_key_head_dim;
            const int64_t value_dim = Hv * cfg_.linear_value_head_dim;
            const int64_t conv_dim = 2 * key_dim + value_dim;
            GdnWeights& w = L.gdn;
            const std::string q = p + "linear_attn.";
            w.in_proj_qkv = load(q + "in_proj_qkv.weight", {conv_dim, H});
            w.in_proj_z = load(q + "in_proj_z.weight", {value_dim, H});
            w.in_proj_a = load(q + "in_proj_a.weight", {Hv, H});
            w.in_proj_b = load(q + "in_proj_b.weight", {Hv, H});
            w.out_proj = load(q + "out_proj.weight", {H, value_dim});
            w.conv1d = load(q + "conv1d.weight", {conv_dim, 1, cfg_.linear_conv_kernel});
            w.A_log = load(q + "A_log", {Hv});
            w.dt_bias = load(q + "dt_bias", {Hv});
            w.norm = load(q + "norm.weight", {cfg_.linear_value_head_dim});
            w.neg_exp_A.resize(Hv);
            for (int64_t h = 0; h < Hv; ++h) w.neg_exp_A[h] = -std::exp(w.A_log[h]);
        } else {
            const int64_t hd = cfg_.head_dim;
            const int64_t qrows = int64_t{cfg_.num_heads} * hd * (cfg_.attn_output_gate ? 2 : 1);
            const int64_t kvrows = int64_t{cfg_.num_kv_heads} * hd;
            AttentionWeights& w = L.attn;
            const std::string q = p + "self_attn.";
            w.q_proj = load(q + "q_proj.weight", {qrows, H});
            w.k_proj = load(q + "k_proj.weight", {kvrows, H});
            w.v_proj = load(q + "v_proj.weight", {kvrows, H});
            w.o_proj = load(q + "o_proj.weight", {H, int64_t{cfg_.num_heads} * hd});
            w.q_norm = load(q + "q_norm.weight", {hd});
            w.k_norm = load(q + "k_norm.weight", {hd});
        }
    }
}

std::vector<float> Backbone::embed(const std::vector<int32_t>& ids) const {
    const int64_t H = cfg_.hidden_size;
    std::vector<float> out(ids.size() * H);
    for (size_t t = 0; t < ids.size(); ++t) {
        const int32_t id = ids[t];
        if (id < 0 || id >= cfg_.vocab_size)
            throw Error("embed: token id " + std::to_string(id) + " at position " + std::to_string(t) +
                        " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
        std::copy_n(embed_tokens_.data() + id * H, H, out.data() + t * H);
    }
    return out;
}

std::vector<float> Backbone::forward(const std::vector<int32_t>& ids, const BackboneOptions& opt) const {
    return forward_embeddings(embed(ids), static_cast<int64_t>(ids.size()), nullptr, opt);
}

std::vector<float> Backbone::forward_embeddings(const std::vector<float>& x, int64_t T,
                                                const int32_t* positions, const BackboneOptions& opt,
                                                BackboneTrace* trace) const {
    const int64_t H = cfg_.hidden_size;
    if (T < 0 || static_cast<int64_t>(x.size()) != T * H)
        throw Error("forward_embeddings: input has " + std::to_string(x.size()) +
                    " values, expected T*hidden = " + std::to_string(T) + "*" + std::to_string(H));
    const size_t n = static_cast<size_t>(T * H);

    // RoPE tables, shared by every attention layer.
    std::vector<float> cos, sin;
    if (count_layers(cfg_, LayerType::FullAttention) > 0) {
        std::vector<int32_t> text_pos;
        if (!positions) {
            text_pos.resize(3 * T);
            for (int a = 0; a < 3; ++a)
                for (int64_t t = 0; t < T; ++t) text_pos[a * T + t] = static_cast<int32_t>(t);
            positions = text_pos.data();
        }
        const int half = cfg_.rotary_dim / 2;
        cos.resize(T * half);
        sin.resize(T * half);
        ops::rope_tables(rope_params(cfg_), positions, T, cos.data(), sin.data());
    }

    if (trace) {
        trace->layers.assign(cfg_.num_layers, {});
    }

    std::vector<float> h(x), xn(n), mix(n);
    for (int l = 0; l < cfg_.num_layers; ++l) {
        const Layer& L = layers_[l];
        const bool internals =
            trace && std::find(trace->internals_for_layers.begin(), trace->internals_for_layers.end(), l) !=
                         trace->internals_for_layers.end();
        ops::rms_norm_zc(h.data(), T, H, L.input_layernorm.data(), cfg_.rms_norm_eps, xn.data());
        if (trace) trace->layers[l].input_norm = xn;
        if (L.type == LayerType::LinearAttention)
            gdn_mixer(L, xn.data(), T, opt, mix.data(), internals ? &trace->layers[l].gdn : nullptr);
        else
            attention_mixer(L, xn.data(), T, cos.data(), sin.data(), mix.data(),
                            internals ? &trace->layers[l].attention : nullptr);
        if (trace) trace->layers[l].mixer_out = mix;
        add_inplace(h.data(), mix.data(), n);
        ops::rms_norm_zc(h.data(), T, H, L.post_attention_layernorm.data(), cfg_.rms_norm_eps, xn.data());
        mlp(L, xn.data(), T, mix.data());
        add_inplace(h.data(), mix.data(), n);
        if (trace) trace->layers[l].layer_out = h;
    }
    std::vector<float> out(n);
    ops::rms_norm_zc(h.data(), T, H, final_norm_.data(), cfg_.rms_norm_eps, out.data());
    return out;
}

void Backbone::gdn_mixer(const Layer& L, const float* xn, int64_t T, const BackboneOptions& opt, float* out,
                         BackboneTrace::Gdn* tr) const {
    const GdnWeights& w = L.gdn;
    const int64_t H = cfg_.hidden_size;
    const int Hk = cfg_.linear_num_key_heads, Hv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    const int64_t key_dim = int64_t{Hk} * dk, value_dim = int64_t{Hv} * dv;
    const int64_t conv_dim = 2 * key_dim + value_dim;

    // Projections: qkv (convolved), z (output gate), b (beta), a (decay input).
    std::vector<float> qkv(T * conv_dim), conv(T * conv_dim), z(T * value_dim), b(T * Hv), a(T * Hv);
    ops::linear(xn, T, H, w.in_proj_qkv.data(), conv_dim, nullptr, qkv.data());
    ops::linear(xn, T, H, w.in_proj_z.data(), value_dim, nullptr, z.data());
    ops::linear(xn, T, H, w.in_proj_b.data(), Hv, nullptr, b.data());
    ops::linear(xn, T, H, w.in_proj_a.data(), Hv, nullptr, a.data());
    ops::causal_conv1d_silu(qkv.data(), T, conv_dim, conv_dim, w.conv1d.data(), cfg_.linear_conv_kernel,
                            nullptr, nullptr, conv.data(), conv_dim);
    qkv = {};

    // q, k: L2-normalised per head (q also scaled by 1/sqrt(dk)); v stays in the conv output.
    std::vector<float> q(T * key_dim), k(T * key_dim);
    const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
    for (int64_t t = 0; t < T; ++t) {
        const float* ct = conv.data() + t * conv_dim;
        ops::l2_norm(ct, Hk, dk, 1e-6f, q_scale, q.data() + t * key_dim);
        ops::l2_norm(ct + key_dim, Hk, dk, 1e-6f, 1.f, k.data() + t * key_dim);
    }
    // beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), in place.
    for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < Hv; ++h) {
            b[t * Hv + h] = ops::sigmoid(b[t * Hv + h]);
            a[t * Hv + h] = w.neg_exp_A[h] * ops::softplus(a[t * Hv + h] + w.dt_bias[h]);
        }

    std::vector<float> o(T * value_dim);
    ops::DeltaRuleArgs d;
    d.T = T;
    d.num_k_heads = Hk;
    d.num_v_heads = Hv;
    d.dk = dk;
    d.dv = dv;
    d.q = q.data();
    d.q_stride = key_dim;
    d.k = k.data();
    d.k_stride = key_dim;
    d.v = conv.data() + 2 * key_dim;
    d.v_stride = conv_dim;
    d.beta = b.data();
    d.beta_stride = Hv;
    d.g = a.data();
    d.g_stride = Hv;
    d.out = o.data();
    d.out_stride = value_dim;
    if (opt.chunked_delta_rule)
        ops::gated_delta_rule_chunked(d, 64);
    else
        ops::gated_delta_rule_serial(d);

    // Gated RMSNorm per value head: norm.weight * rmsnorm(o) * silu(z).
    std::vector<float> y(T * value_dim);
    ops::rms_norm(o.data(), T * Hv, dv, w.norm.data(), cfg_.rms_norm_eps, y.data());
    for (int64_t i = 0; i < T * value_dim; ++i) y[i] *= ops::silu(z[i]);
    ops::linear(y.data(), T, value_dim, w.out_proj.data(), H, nullptr, out);

    if (tr) {
        tr->conv_silu = conv;
        tr->q = std::move(q);
        tr->k = std::move(k);
        tr->v.resize(T * value_dim);
        for (int64_t t = 0; t < T; ++t)
            std::copy_n(conv.data() + t * conv_dim + 2 * key_dim, value_dim, tr->v.data() + t * value_dim);
        tr->z = std::move(z);
        tr->beta = std::move(b);
        tr->g = std::move(a);
        tr->delta_out = std::move(o);
        tr->gated_norm = std::move(y);
    }
}

void Backbone::attention_mixer(const Layer& L, const float* xn, int64_t T, const float* cos, const float* sin,
                               float* out, BackboneTrace::Attention* tr) const {
    const AttentionWeights& w = L.attn;
    const int64_t H = cfg_.hidden_size;
    const int nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, hd = cfg_.head_dim;
    const int64_t qdim = int64_t{nh} * hd, kvdim = int64_t{nkv} * hd;
    const bool gated = cfg_.attn_output_gate;
    const int64_t qrows = gated ? 2 * qdim : qdim;

    std::vector<float> qg(T * qrows), k(T * kvdim), v(T * kvdim);
    ops::linear(xn, T, H, w.q_proj.data(), qrows, nullptr, qg.data());
    ops::linear(xn, T, H, w.k_proj.data(), kvdim, nullptr, k.data());
    ops::linear(xn, T, H, w.v_proj.data(), kvdim, nullptr, v.data());

    // q_proj rows are per head [query hd | gate hd] when gated.
    std::vector<float> q(T * qdim), gate(gated ? T * qdim : 0);
    for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < nh; ++h) {
            const float* src = qg.data() + t * qrows + static_cast<int64_t>(h) * hd * (gated ? 2 : 1);
            std::copy_n(src, hd, q.data() + t * qdim + int64_t{h} * hd);
            if (gated) std::copy_n(src + hd, hd, gate.data() + t * qdim + int64_t{h} * hd);
        }
    qg = {};

    ops::rms_norm_zc(q.data(), T * nh, hd, w.q_norm.data(), cfg_.rms_norm_eps, q.data());
    ops::rms_norm_zc(k.data(), T * nkv, hd, w.k_norm.data(), cfg_.rms_norm_eps, k.data());
    ops::rope_apply(q.data(), T, nh, hd, qdim, cfg_.rotary_dim, cos, sin);
    ops::rope_apply(k.data(), T, nkv, hd, kvdim, cfg_.rotary_dim, cos, sin);

    std::vector<float> attn(T * qdim);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    ops::attention(q.data(), qdim, k.data(), kvdim, v.data(), kvdim, T, T, nh, nkv, hd, scale, true,
                   attn.data(), qdim);
    if (tr) tr->attn = attn;
    if (gated)
        for (int64_t i = 0; i < T * qdim; ++i) attn[i] *= ops::sigmoid(gate[i]);
    ops::linear(attn.data(), T, qdim, w.o_proj.data(), H, nullptr, out);

    if (tr) {
        tr->q_rope = std::move(q);
        tr->k_rope = std::move(k);
        tr->v = std::move(v);
        tr->gate = std::move(gate);
    }
}

void Backbone::mlp(const Layer& L, const float* xn, int64_t T, float* out) const {
    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    std::vector<float> gate(T * I), up(T * I);
    ops::linear(xn, T, H, L.gate_proj.data(), I, nullptr, gate.data());
    ops::linear(xn, T, H, L.up_proj.data(), I, nullptr, up.data());
    for (int64_t i = 0; i < T * I; ++i) gate[i] = ops::silu(gate[i]) * up[i];
    ops::linear(gate.data(), T, I, L.down_proj.data(), H, nullptr, out);
}

}  // namespace clef
