#include "model/backbone.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "ops/attention_fast.h"
#include "ops/basic.h"
#include "ops/conv.h"
#include "ops/cpu.h"
#include "ops/delta_rule.h"
#include "ops/rope.h"
#include "util/error.h"
#include "util/half.h"
#include "util/mmap.h"

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

// One projection matrix [rows][cols] (PyTorch [out][in]). The fast path runs an ops::PackedLinear on the
// mapped weight: BF16 used in place (no copy) on the oneDNN backend, packed once at load otherwise (never an
// fp32 copy of a BF16 / F16 matrix); the reference path reads BF16 straight from the mapped file (converted
// on the fly by ops::linear_bf16) and keeps fp32 copies of other dtypes (small models). A quantised matrix is
// packed from rows dequantised to bf16 block by block; its reference path dequantises blocks of rows to fp32
// for ops::linear.
class Backbone::Linear {
public:
    Linear(const QuantMatrix& q, ops::Residency residency)
        : rows_(q.rows), cols_(q.cols), quant_(std::make_unique<QuantMatrix>(q)) {
        const QuantMatrix& m = *quant_;  // on the heap: the streamed layer's provider keeps pointing at it
        ops::num_threads();  // applies the global thread setting to this thread
        packed_ = ops::PackedLinear(
            [&m](int64_t r0, int64_t n, uint16_t* out) {
#pragma omp parallel for schedule(static)
                for (int64_t i = 0; i < n; ++i) m.row_bf16(r0 + i, out + i * m.cols);
            },
            rows_, cols_, ops::GemmBackend::Auto, residency);
        // Packed: the mapped blocks need not stay resident (re-faulted if read again).
        if (!packed_.streamed()) m.drop_pages();
    }
    explicit Linear(const TensorView& t) : rows_(t.shape[0]), cols_(t.shape[1]) {
        const bool aligned = reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0;
        if (t.dtype == DType::BF16 && reinterpret_cast<uintptr_t>(t.data) % alignof(uint16_t) == 0) {
            bf16_ = reinterpret_cast<const uint16_t*>(t.data);
            // Used in place from the mapped checkpoint (no copy) where the backend allows.
            packed_ = ops::PackedLinear({t.data, ops::WeightType::BF16}, rows_, cols_, ops::GemmBackend::Auto,
                                        ops::Residency::InPlace);
            // Packed into the own kernels' panels instead: the mapped copy need not stay resident.
            if (packed_.packed_bytes() > 0) drop_mapped_pages(t.data, static_cast<size_t>(rows_ * cols_) * 2);
        } else {
            f32_ = t.to_f32();
            if (t.dtype == DType::F16 && aligned)
                packed_ = ops::PackedLinear({t.data, ops::WeightType::F16}, rows_, cols_);
            else
                packed_ = ops::PackedLinear({f32_.data(), ops::WeightType::F32}, rows_, cols_);
        }
    }
    size_t packed_bytes() const {
        return packed_.packed_bytes();
    }
    bool streamed() const {
        return packed_.streamed();
    }
    int64_t rows() const {
        return rows_;
    }
    int64_t cols() const {
        return cols_;
    }

    // y[m][rows] = x[m][cols] · Wᵀ
    void forward(const float* x, int64_t m, float* y, const BackboneOptions& opt) const {
        if (m == 0) return;
        if (!opt.reference)
            packed_.forward(x, m, y, opt.precision);
        else if (quant_)
            reference_quant(x, m, y);
        else if (bf16_)
            ops::linear_bf16(x, m, cols_, bf16_, rows_, nullptr, y);
        else
            ops::linear(x, m, cols_, f32_.data(), rows_, nullptr, y);
    }

private:
    // y = x · Wᵀ through the oracle ops::linear, on blocks of rows dequantised to fp32.
    void reference_quant(const float* x, int64_t m, float* y) const {
        constexpr int64_t kBlock = 64;
        std::vector<float> w(static_cast<size_t>(kBlock * cols_)), yb(static_cast<size_t>(m * kBlock));
        for (int64_t r0 = 0; r0 < rows_; r0 += kBlock) {
            const int64_t nb = std::min(kBlock, rows_ - r0);
            for (int64_t i = 0; i < nb; ++i) quant_->row_f32(r0 + i, w.data() + i * cols_);
            ops::linear(x, m, cols_, w.data(), nb, nullptr, yb.data());
            for (int64_t t = 0; t < m; ++t)
                std::memcpy(y + t * rows_ + r0, yb.data() + t * nb, static_cast<size_t>(nb) * sizeof(float));
        }
    }

    int64_t rows_, cols_;
    std::unique_ptr<QuantMatrix> quant_;
    const uint16_t* bf16_ = nullptr;
    std::vector<float> f32_;
    ops::PackedLinear packed_;
};

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

Backbone::Backbone(const TextConfig& cfg, const Checkpoint& ckpt, const QuantTensors* quant,
                   ops::Residency quant_residency)
    : cfg_(cfg) {
    check_config(cfg_);
    auto has = [&](const std::string& name) { return ckpt.find(name) || (quant && quant->count(name)); };
    if (has("model.language_model.embed_tokens.weight"))
        prefix_ = "model.language_model.";
    else if (has("model.embed_tokens.weight"))
        prefix_ = "model.";
    else
        throw Error(ckpt.description() +
                    ": no text backbone (neither model.language_model.embed_tokens.weight nor "
                    "model.embed_tokens.weight)");

    auto get = [&](const std::string& name, const std::vector<int64_t>& shape) -> const TensorView& {
        const TensorView& t = ckpt.get(prefix_ + name);
        if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F64)
            throw Error(ckpt.description() + ": tensor " + t.name + ": dtype " +
                        std::string(dtype_name(t.dtype)) + " is not a float type");
        if (t.shape != shape)
            throw Error(ckpt.description() + ": tensor " + t.name + ": shape " + shape_str(t.shape) +
                        " does not match the config (expected " + shape_str(shape) + ")");
        return t;
    };
    auto load = [&](const std::string& name, const std::vector<int64_t>& shape) {
        return get(name, shape).to_f32();
    };
    // The quantised matrix of that name, shape-checked; nullptr when the checkpoint holds it.
    auto find_quant = [&](const std::string& name, const std::vector<int64_t>& shape) -> const QuantMatrix* {
        if (!quant) return nullptr;
        auto it = quant->find(prefix_ + name);
        if (it == quant->end()) return nullptr;
        const QuantMatrix& q = it->second;
        if (shape != std::vector<int64_t>{q.rows, q.cols})
            throw Error("tensor " + it->first + ": shape " + shape_str({q.rows, q.cols}) +
                        " does not match the config (expected " + shape_str(shape) + ")");
        q.validate(it->first);
        return &q;
    };
    auto linear = [&](const std::string& name, const std::vector<int64_t>& shape) {
        if (const QuantMatrix* q = find_quant(name, shape)) {
            const bool block_quantised =
                q->type != GgmlType::F32 && q->type != GgmlType::F16 && q->type != GgmlType::BF16;
            linears_.push_back(
                std::make_unique<Linear>(*q, block_quantised ? quant_residency : ops::Residency::Packed));
        } else {
            linears_.push_back(std::make_unique<Linear>(get(name, shape)));
        }
        return linears_.back().get();
    };

    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    if (const QuantMatrix* q = find_quant("embed_tokens.weight", {cfg_.vocab_size, H})) {
        embed_quant_ = std::make_unique<QuantMatrix>(*q);
    } else {
        const TensorView& emb = get("embed_tokens.weight", {cfg_.vocab_size, H});
        embed_data_ = emb.data;
        embed_dtype_ = emb.dtype;
    }
    final_norm_ = load("norm.weight", {H});
    layers_.resize(cfg_.num_layers);
    for (int l = 0; l < cfg_.num_layers; ++l) {
        Layer& L = layers_[l];
        const std::string p = "layers." + std::to_string(l) + ".";
        L.type = cfg_.layer_types[l];
        L.input_layernorm = load(p + "input_layernorm.weight", {H});
        L.post_attention_layernorm = load(p + "post_attention_layernorm.weight", {H});
        L.gate_proj = linear(p + "mlp.gate_proj.weight", {I, H});
        L.up_proj = linear(p + "mlp.up_proj.weight", {I, H});
        L.down_proj = linear(p + "mlp.down_proj.weight", {H, I});
        if (L.type == LayerType::LinearAttention) {
            const int64_t Hv = cfg_.linear_num_value_heads;
            const int64_t key_dim = int64_t{cfg_.linear_num_key_heads} * cfg_.linear_key_head_dim;
            const int64_t value_dim = Hv * cfg_.linear_value_head_dim;
            const int64_t conv_dim = 2 * key_dim + value_dim;
            GdnWeights& w = L.gdn;
            const std::string q = p + "linear_attn.";
            w.in_proj_qkv = linear(q + "in_proj_qkv.weight", {conv_dim, H});
            w.in_proj_z = linear(q + "in_proj_z.weight", {value_dim, H});
            w.in_proj_a = linear(q + "in_proj_a.weight", {Hv, H});
            w.in_proj_b = linear(q + "in_proj_b.weight", {Hv, H});
            w.out_proj = linear(q + "out_proj.weight", {H, value_dim});
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
            w.q_proj = linear(q + "q_proj.weight", {qrows, H});
            w.k_proj = linear(q + "k_proj.weight", {kvrows, H});
            w.v_proj = linear(q + "v_proj.weight", {kvrows, H});
            w.o_proj = linear(q + "o_proj.weight", {H, int64_t{cfg_.num_heads} * hd});
            w.q_norm = load(q + "q_norm.weight", {hd});
            w.k_norm = load(q + "k_norm.weight", {hd});
        }
    }
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
    const int64_t chunk = trace ? std::max<int64_t>(T, 1) : chunk_length(opt, T);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const int64_t n = std::min(chunk, T - t0);
        forward_chunk(st, x.data() + t0 * H, n, positions ? positions + t0 : nullptr, T, opt,
                      out.data() + t0 * H, trace);
    }
    return out;
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
        ops::rope_tables(rope_params(cfg_), pos.data(), T, c.cos.data(), c.sin.data());
    }

    std::vector<float> h(x, x + n), xn(n), mix(n);
    for (int l = 0; l < cfg_.num_layers; ++l) {
        const Layer& L = layers_[l];
        const bool internals =
            trace && std::find(trace->internals_for_layers.begin(), trace->internals_for_layers.end(), l) !=
                         trace->internals_for_layers.end();
        {
            Timer tm(c.slot(&BackboneProfile::norms));
            c.rms_norm_zc(h.data(), T, H, L.input_layernorm.data(), xn.data());
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
            add_inplace(h.data(), mix.data(), n);
            c.rms_norm_zc(h.data(), T, H, L.post_attention_layernorm.data(), xn.data());
        }
        mlp(L, xn.data(), T, c, mix.data());
        {
            Timer tm(c.slot(&BackboneProfile::norms));
            add_inplace(h.data(), mix.data(), n);
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
        w.in_proj_qkv->forward(xn, T, qkv.data(), c.opt);
        w.in_proj_z->forward(xn, T, z.data(), c.opt);
        w.in_proj_b->forward(xn, T, b.data(), c.opt);
        w.in_proj_a->forward(xn, T, a.data(), c.opt);
    }
    std::vector<float> q(T * key_dim), k(T * key_dim);
    {
        Timer tm(c.slot(&BackboneProfile::gdn_conv_gates));
        ops::causal_conv1d_silu(qkv.data(), T, conv_dim, conv_dim, w.conv1d.data(), cfg_.linear_conv_kernel,
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

    // Gated RMSNorm per value head: norm.weight * rmsnorm(o) * silu(z).
    std::vector<float> y(T * value_dim);
    {
        Timer tm(c.slot(&BackboneProfile::gdn_conv_gates));
        (c.opt.reference ? ops::rms_norm_gated : ops::rms_norm_gated_fast)(
            o.data(), z.data(), T * Hv, dv, w.norm.data(), cfg_.rms_norm_eps, y.data());
    }
    {
        Timer tm(c.slot(&BackboneProfile::gdn_proj));
        w.out_proj->forward(y.data(), T, out, c.opt);
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
        w.q_proj->forward(xn, T, qg.data(), c.opt);
        w.k_proj->forward(xn, T, k.data(), c.opt);
        w.v_proj->forward(xn, T, v.data(), c.opt);
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
        S.k.insert(S.k.end(), k.begin(), k.end());
        S.v.insert(S.v.end(), v.begin(), v.end());
    }

    std::vector<float> attn(T * qdim);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    const int64_t p0 = static_cast<int64_t>(S.k.size()) / kvdim - T;  // cache rows before this chunk
    {
        Timer tm(c.slot(&BackboneProfile::attention));
        if (!c.opt.reference) {
            ops::attention_fast(q.data(), qdim, S.k.data(), kvdim, S.v.data(), kvdim, T, p0 + T, nh, nkv, hd,
                                scale, true, attn.data(), qdim, c.opt.precision);
        } else if (p0 == 0) {
            ops::attention(q.data(), qdim, S.k.data(), kvdim, S.v.data(), kvdim, T, T, nh, nkv, hd, scale,
                           true, attn.data(), qdim);
        } else {  // query i sees cache rows 0 .. p0 + i
            for (int64_t i = 0; i < T; ++i)
                ops::attention(q.data() + i * qdim, qdim, S.k.data(), kvdim, S.v.data(), kvdim, 1, p0 + i + 1,
                               nh, nkv, hd, scale, false, attn.data() + i * qdim, qdim);
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
        w.o_proj->forward(attn.data(), T, out, c.opt);
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
        L.gate_proj->forward(xn, T, gate.data(), c.opt);
        L.up_proj->forward(xn, T, up.data(), c.opt);
    }
    {
        Timer tm(c.slot(&BackboneProfile::mlp_act));
        (c.opt.reference ? ops::silu_mul : ops::silu_mul_fast)(gate.data(), up.data(), T * I, gate.data());
    }
    Timer tm(c.slot(&BackboneProfile::mlp_proj));
    L.down_proj->forward(gate.data(), T, out, c.opt);
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
    const double t = static_cast<double>(T), H = c.hidden_size, I = c.intermediate_size;
    double per_token = 0, quadratic = 0;
    for (LayerType type : c.layer_types) {
        per_token += 2 * 3 * H * I;  // gate, up, down
        if (type == LayerType::LinearAttention) {
            const double Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
            const double dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
            const double key_dim = Hk * dk, value_dim = Hv * dv;
            per_token += 2 * H * (2 * key_dim + value_dim) + 2 * H * value_dim + 2 * 2 * H * Hv;  // in_proj
            per_token += 2 * value_dim * H;                                                       // out_proj
            per_token += 7 * Hv * dk * dv;  // delta rule
        } else {
            const double hd = c.head_dim, qdim = c.num_heads * hd, kvdim = c.num_kv_heads * hd;
            per_token += 2 * H * (qdim * (c.attn_output_gate ? 2 : 1) + 2 * kvdim) + 2 * qdim * H;
            quadratic += 4 * qdim * (t * (t + 1) / 2);
        }
    }
    return per_token * t + quadratic;
}

}  // namespace clef
