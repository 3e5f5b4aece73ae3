#include "model/backbone.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "model/tensors.h"
#include "ops/attention_fast.h"
#include "ops/basic.h"
#include "ops/conv.h"
#include "ops/cpu.h"
#include "ops/delta_rule.h"
#include "ops/rope.h"
#include "util/error.h"
#include "util/half.h"
#include "util/mmap.h"
#include "util/text.h"

namespace clef {

namespace {

// Whether the layer's K/V cache is kept as bf16: as it already is, else as the options ask.
bool kv_as_bf16(const BackboneState::Layer& S, bool option) {
    return !S.kb.empty() || (S.k.empty() && option);
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

}  // namespace

ops::RopeParams rope_params(const TextConfig& c, int64_t seq_len) {
    ops::RopeParams p;
    p.rotary_dim = c.rotary_dim;
    p.theta = c.rope_theta;
    if (c.mrope_section.size() == 3)
        p.mrope_section = {c.mrope_section[0], c.mrope_section[1], c.mrope_section[2]};
    p.interleaved = c.mrope_interleaved;
    // HF computes inv_freq and the angles in fp32. Angles in double were measured against the float64 goldens
    // of tiny-clef and are no better (per-case differences are noise), so the engine follows HF.
    p.fp64_angles = false;
    p.scaling = c.rope_scaling;
    p.seq_len = seq_len;
    return p;
}

namespace {

// Seconds since t0, added to *slot when profiling.
struct Timer {
    double* slot;
    std::chrono::steady_clock::time_point t0;
    explicit Timer(double* s)
        : slot(s), t0(s ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
    ~Timer() {
        if (slot) *slot += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
};

}  // namespace

struct Backbone::Ctx {
    const BackboneOptions& opt;
    BackboneProfile* prof;
    float eps;                    // the RMSNorm epsilon
    std::vector<float> cos, sin;  // [T][rotary_dim/2] for this chunk
    double* slot(double BackboneProfile::*m) const { return prof ? &(prof->*m) : nullptr; }
    // Zero-centred RMSNorm of `rows` rows of d: the scalar reference on the reference path.
    void rms_norm_zc(const float* x, int64_t rows, int64_t d, const float* w, float* y) const {
        (opt.reference ? ops::rms_norm_zc : ops::rms_norm_zc_fast)(x, rows, d, w, eps, y);
    }
};

Backbone::~Backbone() = default;

size_t Backbone::packed_weight_bytes() const {
    size_t bytes = 0;
    for (const auto& l : linears_) bytes += l->packed_bytes();
    return bytes;
}

bool Backbone::streams_weights() const {
    for (const auto& l : linears_)
        if (l->streamed()) return true;
    return false;
}

int64_t Backbone::chunk_length(const BackboneOptions& opt, int64_t T) const {
    const int64_t c = streams_weights() ? opt.streamed_prefill_chunk : opt.prefill_chunk;
    return c > 0 ? c : std::max<int64_t>(T, 1);
}

Backbone::Backbone(const TextConfig& cfg, const WeightSource& src, ops::Residency quant_residency)
    : cfg_(cfg) {
    check_config(cfg_);
    prefix_ = text_prefix_in([&](const std::string& name) { return src.has(name); });
    if (prefix_.empty())
        throw Error(src.description() + ": no text backbone (no embedding table under " + kTextPrefix +
                    " or model.)");
    layers_.resize(cfg_.num_layers);
    for (int l = 0; l < cfg_.num_layers; ++l) layers_[l].type = cfg_.layer_types[l];
    for_each_text_tensor(cfg_, false, [&](const TensorSpec& s) { load_tensor(s, src, quant_residency); });
    for (Layer& L : layers_)
        for (float a : L.gdn.log_decay_rate) L.gdn.neg_exp_A.push_back(-std::exp(a));
}

// One tensor of the table into its place: a projection as a Linear (a QuantMatrix the source holds, or the
// checkpoint's own dtype), the embedding table where it lies, every other tensor as fp32.
void Backbone::load_tensor(const TensorSpec& s, const WeightSource& src, ops::Residency quant_residency) {
    const std::string name = text_name(s, prefix_);
    auto mismatch = [&](const std::vector<int64_t>& got) {
        return Error(src.description() + ": tensor " + name + ": shape " + shape_str(got) +
                     " does not match the config (expected " + shape_str(s.shape) + ")");
    };
    const QuantMatrix* q = src.find_matrix(name);
    if (q) {
        if (s.shape != std::vector<int64_t>{q->rows, q->cols}) throw mismatch({q->rows, q->cols});
        q->validate(name);
    }
    const TensorView* t = q ? nullptr : &src.get(name);
    if (t) {
        if (t->dtype != DType::F32 && t->dtype != DType::BF16 && t->dtype != DType::F16 &&
            t->dtype != DType::F64)
            throw Error(src.description() + ": tensor " + name + ": dtype " +
                        std::string(dtype_name(t->dtype)) + " is not a float type");
        if (t->shape != s.shape) throw mismatch(t->shape);
    }
    if (s.text == TextWeight::Embed) {
        if (q) {
            embed_quant_ = std::make_unique<QuantMatrix>(*q);
        } else {
            embed_data_ = t->data;
            embed_dtype_ = t->dtype;
        }
        return;
    }
    if (s.matrix) {
        const bool block_quantised =
            q && q->type != GgmlType::F32 && q->type != GgmlType::F16 && q->type != GgmlType::BF16;
        linears_.push_back(
            q ? std::make_unique<Linear>(*q, LinearPath::Both,
                                         block_quantised ? quant_residency : ops::Residency::Packed)
              : std::make_unique<Linear>(*t, LinearPath::Both));
        *s.slot.linear(layers_[s.layer]) = linears_.back().get();
        return;
    }
    if (q) throw Error(src.description() + ": tensor " + name + " is held as a quantised matrix");
    *(s.text == TextWeight::FinalNorm ? &final_norm_ : s.slot.vector(layers_[s.layer])) = t->to_f32();
}

void Backbone::embed_into(const int32_t* ids, int64_t n, float* out) const {
    const int64_t H = cfg_.hidden_size;
    const size_t row_bytes = static_cast<size_t>(H) * dtype_size(embed_dtype_);
    for (int64_t t = 0; t < n; ++t) {
        const int32_t id = ids[t];
        if (id < 0 || id >= cfg_.vocab_size)
            throw Error("embed: token id " + std::to_string(id) + " at position " + std::to_string(t) +
                        " is outside the vocabulary [0, " + std::to_string(cfg_.vocab_size) + ")");
        if (embed_quant_)
            embed_quant_->row_f32(id, out + t * H);
        else
            convert_to_f32(embed_dtype_, embed_data_ + static_cast<size_t>(id) * row_bytes,
                           static_cast<size_t>(H),
                           out + t * H);  // the dtype is a float type (checked at load)
    }
}

std::vector<float> Backbone::embed(const std::vector<int32_t>& ids) const {
    std::vector<float> out(ids.size() * cfg_.hidden_size);
    embed_into(ids.data(), static_cast<int64_t>(ids.size()), out.data());
    return out;
}

std::vector<float> Backbone::forward(const std::vector<int32_t>& ids, const BackboneOptions& opt) const {
    return forward_embeddings(embed(ids), static_cast<int64_t>(ids.size()), nullptr, opt);
}

BackboneState Backbone::start() const {
    BackboneState s;
    s.layers.resize(cfg_.num_layers);
    for (int l = 0; l < cfg_.num_layers; ++l) {
        if (layers_[l].type != LayerType::LinearAttention) continue;
        const int64_t key_dim = int64_t{cfg_.linear_num_key_heads} * cfg_.linear_key_head_dim;
        const int64_t conv_dim =
            2 * key_dim + int64_t{cfg_.linear_num_value_heads} * cfg_.linear_value_head_dim;
        s.layers[l].conv.assign((cfg_.linear_conv_kernel - 1) * conv_dim, 0.f);
        s.layers[l].delta.assign(
            int64_t{cfg_.linear_num_value_heads} * cfg_.linear_key_head_dim * cfg_.linear_value_head_dim,
            0.f);
    }
    return s;
}

std::vector<float> Backbone::forward_embeddings(const std::vector<float>& x, int64_t T,
                                                const int32_t* positions, const BackboneOptions& opt,
                                                BackboneTrace* trace) const {
    const int64_t H = cfg_.hidden_size;
    if (T < 0 || static_cast<int64_t>(x.size()) != T * H)
        throw Error("forward_embeddings: input has " + std::to_string(x.size()) +
                    " values, expected T*hidden = " + std::to_string(T) + "*" + std::to_string(H));
    std::vector<float> out(static_cast<size_t>(T * H));
    BackboneState st = start();
    PrefillInput in;
    in.T = T;
    in.embeddings = x.data();
    in.positions = positions;
    prefill(
        st, in, opt,
        [&](const float* rows, int64_t n, int64_t t0) { std::copy_n(rows, n * H, out.data() + t0 * H); },
        nullptr, trace);
    return out;
}

void Backbone::prefill(BackboneState& st, const PrefillInput& in, const BackboneOptions& opt,
                       const RowSink& sink, BackboneProfile* profile, BackboneTrace* trace) const {
    Prefill p(*this, st, in, opt, profile, trace);
    while (!p.done()) p.step(sink);
}

Backbone::Prefill::Prefill(const Backbone& b, BackboneState& state, PrefillInput in,
                           const BackboneOptions& opt, BackboneProfile* profile, BackboneTrace* trace)
    : b_(b), state_(state), in_(std::move(in)), opt_(opt), profile_(profile), trace_(trace) {
    if (state_.position < 0 || state_.position > in_.T) throw Error("prefill: the state is past the prompt");
    chunk_ = trace_ ? std::max<int64_t>(in_.T, 1) : b_.chunk_length(opt_, in_.T);
    // The whole prompt's length for the RoPE scalings that depend on it: its largest position + 1.
    state_.rope_seq_len = in_.positions && in_.T > 0
                              ? *std::max_element(in_.positions, in_.positions + 3 * in_.T) + int64_t{1}
                              : in_.T;
    buf_.resize(static_cast<size_t>(std::min(chunk_, in_.T) * b_.cfg_.hidden_size));
    // The K/V cache at its final size from the start: no reallocation (and no old copy beside the new one)
    // as the chunks append their rows.
    const size_t kv = static_cast<size_t>(in_.T) * b_.cfg_.num_kv_heads * b_.cfg_.head_dim;
    for (size_t l = 0; l < state_.layers.size(); ++l) {
        if (b_.layers_[l].type != LayerType::FullAttention) continue;
        BackboneState::Layer& S = state_.layers[l];
        if (kv_as_bf16(S, opt_.kv_bf16)) {
            S.kb.reserve(kv), S.vb.reserve(kv);
        } else {
            S.k.reserve(kv), S.v.reserve(kv);
        }
    }
}

void Backbone::Prefill::step(const RowSink& sink) {
    const int64_t H = b_.cfg_.hidden_size, t0 = state_.position;
    if (t0 >= in_.T) return;
    while (next_stop_ < in_.stops.size() && in_.stops[next_stop_] <= t0) ++next_stop_;
    const int64_t end =
        std::min({t0 + chunk_, in_.T, next_stop_ < in_.stops.size() ? in_.stops[next_stop_] : in_.T});
    const int64_t n = end - t0;
    if (in_.embeddings)
        std::copy_n(in_.embeddings + t0 * H, n * H, buf_.data());
    else
        b_.embed_into(in_.ids + t0, n, buf_.data());
    b_.forward_chunk(state_, buf_.data(), n, in_.positions ? in_.positions + t0 : nullptr, in_.T, opt_,
                     buf_.data(), trace_, profile_);
    sink(buf_.data(), n, t0);
}

void Backbone::forward_chunk(BackboneState& st, const float* x, int64_t T, const int32_t* positions,
                             int64_t positions_stride, const BackboneOptions& opt, float* out,
                             BackboneTrace* trace, BackboneProfile* profile) const {
    const int64_t H = cfg_.hidden_size;
    if (T < 0) throw Error("forward_chunk: negative token count");
    if (static_cast<int>(st.layers.size()) != cfg_.num_layers)
        throw Error("forward_chunk: the state was not made by this backbone's start()");
    if (trace) trace->layers.assign(cfg_.num_layers, {});
    if (T == 0) return;
    const size_t n = static_cast<size_t>(T * H);
    Ctx c{opt, profile, cfg_.rms_norm_eps, {}, {}};

    // RoPE tables for this chunk, shared by every attention layer.
    if (count_layers(cfg_, LayerType::FullAttention) > 0) {
        std::vector<int32_t> pos(3 * T);
        for (int a = 0; a < 3; ++a)
            for (int64_t t = 0; t < T; ++t)
                pos[a * T + t] =
                    positions ? positions[a * positions_stride + t] : static_cast<int32_t>(st.position + t);
        const int half = cfg_.rotary_dim / 2;
        c.cos.resize(T * half);
        c.sin.resize(T * half);
        ops::rope_tables(rope_params(cfg_, st.rope_seq_len), pos.data(), T, c.cos.data(), c.sin.data());
    }

    std::vector<float> h(x, x + n), xn(n), mix(n);
    for (int l = 0; l < cfg_.num_layers; ++l) {
        const Layer& L = layers_[l];
        const bool internals =
            trace && std::find(trace->internals_for_layers.begin(), trace->internals_for_layers.end(), l) !=
                         trace->internals_for_layers.end();
        {
            Timer tm(c.slot(&BackboneProfile::norms));
            c.rms_norm_zc(h.data(), T, H, L.input_norm.data(), xn.data());
        }
        if (trace) trace->layers[l].input_norm = xn;
        if (L.type == LayerType::LinearAttention)
            gdn_mixer(L, st.layers[l], xn.data(), T, c, mix.data(),
                      internals ? &trace->layers[l].gdn : nullptr);
        else
            attention_mixer(L, st.layers[l], xn.data(), T, c, mix.data(),
                            internals ? &trace->layers[l].attention : nullptr);
        if (trace) trace->layers[l].mixer_out = mix;
        {
            Timer tm(c.slot(&BackboneProfile::norms));
            ops::add_inplace(h.data(), mix.data(), n);
            c.rms_norm_zc(h.data(), T, H, L.post_norm.data(), xn.data());
        }
        mlp(L, xn.data(), T, c, mix.data());
        {
            Timer tm(c.slot(&BackboneProfile::norms));
            ops::add_inplace(h.data(), mix.data(), n);
        }
        if (trace) trace->layers[l].layer_out = h;
    }
    Timer tm(c.slot(&BackboneProfile::norms));
    c.rms_norm_zc(h.data(), T, H, final_norm_.data(), out);
    st.position += T;
}

void Backbone::gdn_mixer(const Layer& L, BackboneState::Layer& S, const float* xn, int64_t T, Ctx& c,
                         float* out, BackboneTrace::Gdn* tr) const {
    const GdnWeights& w = L.gdn;
    const int Hk = cfg_.linear_num_key_heads, Hv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    const int64_t key_dim = int64_t{Hk} * dk, value_dim = int64_t{Hv} * dv;
    const int64_t conv_dim = 2 * key_dim + value_dim;

    // Projections: qkv (convolved), z (output gate), b (beta), a (decay input).
    std::vector<float> qkv(T * conv_dim), conv(T * conv_dim), z(T * value_dim), b(T * Hv), a(T * Hv);
    {
        Timer tm(c.slot(&BackboneProfile::gdn_proj));
        w.qkv->forward(xn, T, qkv.data(), c.opt.reference, c.opt.precision);
        w.z->forward(xn, T, z.data(), c.opt.reference, c.opt.precision);
        w.b->forward(xn, T, b.data(), c.opt.reference, c.opt.precision);
        w.a->forward(xn, T, a.data(), c.opt.reference, c.opt.precision);
    }
    std::vector<float> q(T * key_dim), k(T * key_dim);
    {
        Timer tm(c.slot(&BackboneProfile::gdn_conv_gates));
        ops::causal_conv1d_silu(qkv.data(), T, conv_dim, conv_dim, w.conv.data(), cfg_.linear_conv_kernel,
                                S.conv.data(), S.conv.data(), conv.data(), conv_dim);
        qkv = {};
        // q, k: L2-normalised per head (q also scaled by 1/sqrt(dk)); v stays in the conv output.
        const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
        const auto l2 = c.opt.reference ? ops::l2_norm : ops::l2_norm_fast;
#pragma omp parallel for schedule(static) if (!c.opt.reference && T * key_dim > (1 << 15))
        for (int64_t t = 0; t < T; ++t) {
            const float* ct = conv.data() + t * conv_dim;
            l2(ct, Hk, dk, 1e-6f, q_scale, q.data() + t * key_dim);
            l2(ct + key_dim, Hk, dk, 1e-6f, 1.f, k.data() + t * key_dim);
        }
        // beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), in place.
        for (int64_t t = 0; t < T; ++t)
            for (int h = 0; h < Hv; ++h) {
                b[t * Hv + h] = ops::sigmoid(b[t * Hv + h]);
                a[t * Hv + h] = w.neg_exp_A[h] * ops::softplus(a[t * Hv + h] + w.dt_bias[h]);
            }
    }

    std::vector<float> o(T * value_dim);
    {
        Timer tm(c.slot(&BackboneProfile::delta_rule));
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
        d.initial_state = S.delta.data();
        d.final_state = S.delta.data();
        if (c.opt.chunked_delta_rule && !c.opt.reference)
            ops::gated_delta_rule_chunked_fast(d, 64);
        else if (c.opt.chunked_delta_rule)
            ops::gated_delta_rule_chunked(d, 64);
        else
            ops::gated_delta_rule_serial(d);
    }

    // Gated RMSNorm per value head: norm.weight * rmsnorm(o) * silu(z) (or sigmoid(z), by the config).
    std::vector<float> y(T * value_dim);
    {
        Timer tm(c.slot(&BackboneProfile::gdn_conv_gates));
        (c.opt.reference ? ops::rms_norm_gated : ops::rms_norm_gated_fast)(
            o.data(), z.data(), T * Hv, dv, w.norm.data(), cfg_.rms_norm_eps, y.data(), cfg_.gdn_norm_gate);
    }
    {
        Timer tm(c.slot(&BackboneProfile::gdn_proj));
        w.out->forward(y.data(), T, out, c.opt.reference, c.opt.precision);
    }

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

namespace {

// Appends a chunk's K and V rows to the layer's cache, as fp32 or as bf16 bits.
void append_kv(BackboneState::Layer& S, const std::vector<float>& k, const std::vector<float>& v, bool bf16) {
    if (!kv_as_bf16(S, bf16)) {
        S.k.insert(S.k.end(), k.begin(), k.end());
        S.v.insert(S.v.end(), v.begin(), v.end());
        return;
    }
    for (auto [src, dst] : {std::pair{&k, &S.kb}, std::pair{&v, &S.vb}}) {
        const size_t n0 = dst->size();
        dst->resize(n0 + src->size());
        for (size_t i = 0; i < src->size(); ++i) (*dst)[n0 + i] = f32_to_bf16((*src)[i]);
    }
}

// The scalar oracle over the cache (ops::attention): the chunk's T queries after p0 cached rows, query i
// seeing rows 0 .. p0 + i. A bf16 cache is widened first.
void reference_attention(const BackboneState::Layer& S, const float* q, int64_t T, int64_t p0, int nh,
                         int nkv, int hd, float scale, float* out) {
    const int64_t qdim = int64_t{nh} * hd, kvdim = int64_t{nkv} * hd;
    std::vector<float> kw, vw;
    const float *k = S.k.data(), *v = S.v.data();
    if (S.k.empty()) {
        for (auto [src, dst] : {std::pair{&S.kb, &kw}, std::pair{&S.vb, &vw}}) {
            dst->resize(src->size());
            for (size_t i = 0; i < src->size(); ++i) (*dst)[i] = bf16_to_f32((*src)[i]);
        }
        k = kw.data(), v = vw.data();
    }
    if (p0 == 0) {
        ops::attention(q, qdim, k, kvdim, v, kvdim, T, T, nh, nkv, hd, scale, true, out, qdim);
        return;
    }
    for (int64_t i = 0; i < T; ++i)
        ops::attention(q + i * qdim, qdim, k, kvdim, v, kvdim, 1, p0 + i + 1, nh, nkv, hd, scale, false,
                       out + i * qdim, qdim);
}

}  // namespace

void Backbone::attention_mixer(const Layer& L, BackboneState::Layer& S, const float* xn, int64_t T, Ctx& c,
                               float* out, BackboneTrace::Attention* tr) const {
    const AttentionWeights& w = L.attn;
    const int nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, hd = cfg_.head_dim;
    const int64_t qdim = int64_t{nh} * hd, kvdim = int64_t{nkv} * hd;
    const bool gated = cfg_.attn_output_gate;
    const int64_t qrows = gated ? 2 * qdim : qdim;

    std::vector<float> qg(T * qrows), k(T * kvdim), v(T * kvdim);
    {
        Timer tm(c.slot(&BackboneProfile::attn_proj));
        w.q->forward(xn, T, qg.data(), c.opt.reference, c.opt.precision);
        w.k->forward(xn, T, k.data(), c.opt.reference, c.opt.precision);
        w.v->forward(xn, T, v.data(), c.opt.reference, c.opt.precision);
    }

    // q_proj rows are per head [query hd | gate hd] when gated.
    std::vector<float> q(T * qdim), gate(gated ? T * qdim : 0);
    {
        Timer tm(c.slot(&BackboneProfile::attn_rope_norm));
        for (int64_t t = 0; t < T; ++t)
            for (int h = 0; h < nh; ++h) {
                const float* src = qg.data() + t * qrows + static_cast<int64_t>(h) * hd * (gated ? 2 : 1);
                std::copy_n(src, hd, q.data() + t * qdim + int64_t{h} * hd);
                if (gated) std::copy_n(src + hd, hd, gate.data() + t * qdim + int64_t{h} * hd);
            }
        qg = {};
        c.rms_norm_zc(q.data(), T * nh, hd, w.q_norm.data(), q.data());
        c.rms_norm_zc(k.data(), T * nkv, hd, w.k_norm.data(), k.data());
        ops::rope_apply(q.data(), T, nh, hd, qdim, cfg_.rotary_dim, c.cos.data(), c.sin.data());
        ops::rope_apply(k.data(), T, nkv, hd, kvdim, cfg_.rotary_dim, c.cos.data(), c.sin.data());
        append_kv(S, k, v, c.opt.kv_bf16);
    }

    std::vector<float> attn(T * qdim);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    const int64_t p0 = S.kv_rows(kvdim) - T;  // cache rows before this chunk
    {
        Timer tm(c.slot(&BackboneProfile::attention));
        if (!c.opt.reference) {
            if (!S.kb.empty())
                ops::attention_fast(q.data(), qdim, S.kb.data(), kvdim, S.vb.data(), kvdim, T, p0 + T, nh,
                                    nkv, hd, scale, true, attn.data(), qdim, c.opt.precision);
            else
                ops::attention_fast(q.data(), qdim, S.k.data(), kvdim, S.v.data(), kvdim, T, p0 + T, nh, nkv,
                                    hd, scale, true, attn.data(), qdim, c.opt.precision);
        } else {
            reference_attention(S, q.data(), T, p0, nh, nkv, hd, scale, attn.data());
        }
    }
    if (tr) tr->attn = attn;
    {
        Timer tm(c.slot(&BackboneProfile::attn_rope_norm));
        if (gated)
            for (int64_t i = 0; i < T * qdim; ++i) attn[i] *= ops::sigmoid(gate[i]);
    }
    {
        Timer tm(c.slot(&BackboneProfile::attn_proj));
        w.o->forward(attn.data(), T, out, c.opt.reference, c.opt.precision);
    }

    if (tr) {
        tr->q_rope = std::move(q);
        tr->k_rope = std::move(k);
        tr->v = std::move(v);
        tr->gate = std::move(gate);
    }
}

void Backbone::mlp(const Layer& L, const float* xn, int64_t T, Ctx& c, float* out) const {
    const int64_t I = cfg_.intermediate_size;
    std::vector<float> gate(T * I), up(T * I);
    {
        Timer tm(c.slot(&BackboneProfile::mlp_proj));
        L.gate->forward(xn, T, gate.data(), c.opt.reference, c.opt.precision);
        L.up->forward(xn, T, up.data(), c.opt.reference, c.opt.precision);
    }
    {
        Timer tm(c.slot(&BackboneProfile::mlp_act));
        (c.opt.reference ? ops::silu_mul : ops::silu_mul_fast)(gate.data(), up.data(), T * I, gate.data());
    }
    Timer tm(c.slot(&BackboneProfile::mlp_proj));
    L.down->forward(gate.data(), T, out, c.opt.reference, c.opt.precision);
}

bool parse_precision(const std::string& s, ops::Precision& out) {
    if (s == "exact")
        out = ops::Precision::Exact;
    else if (s == "bf16")
        out = ops::Precision::BF16;
    else
        return false;
    return true;
}

double backbone_flops(const TextConfig& c, int64_t T) {
    const double t = static_cast<double>(T);
    double per_token = 0;  // every projection of the table: 2 * rows * cols per token
    for_each_text_tensor(c, false, [&](const TensorSpec& s) {
        if (s.matrix) per_token += 2.0 * static_cast<double>(s.numel());
    });
    double quadratic = 0;
    const double qdim = double{1} * c.num_heads * c.head_dim;
    for (LayerType type : c.layer_types) {
        if (type == LayerType::LinearAttention)  // the delta rule
            per_token += 7.0 * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
        else  // causal attention: scores and values over T(T+1)/2 query-key pairs
            quadratic += 4 * qdim * (t * (t + 1) / 2);
    }
    return per_token * t + quadratic;
}

}  // namespace clef
