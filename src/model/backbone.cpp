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

// One chunk's stream of kernels, with its options and profile.
struct Backbone::Ctx {
    const BackboneOptions& opt;
    BackboneProfile* prof;
    dev::Device& dev;
    dev::Stream& s;
    float eps;             // the RMSNorm epsilon
    dev::Tensor cos, sin;  // [T][rotary_dim/2] for this chunk
    // Times a kind of work into the profile (waiting for the device's queue at the end of it where the
    // profile asks: BackboneProfile::sync).
    struct Scope {
        Timer tm;
        dev::Stream* s;
        Scope(double* slot, dev::Stream* st) : tm(slot), s(st) {}
        Scope(const Scope&) = delete;
        ~Scope() {
            if (s) s->sync();
        }
    };
    Scope time(double BackboneProfile::*m) const {
        return Scope(prof ? &(prof->*m) : nullptr, prof && prof->sync ? &s : nullptr);
    }
    // Zero-centred RMSNorm of `rows` rows of d.
    void rms_norm_zc(dev::Span x, int64_t rows, int64_t d, const dev::Tensor& w, dev::Span y) const {
        s.rms_norm(x, rows, d, w.span(), eps, true, y);
    }
    dev::Tensor scratch(int64_t n) const { return s.scratch(n); }
    // A span's values on the host (traces).
};

// The state of a backbone's layers on a device between chunks (BackboneState::resident): per layer, its conv
// and delta-rule state, or its K/V cache with room for `capacity` rows of which `rows` are written.
struct BackboneResident {
    struct Layer {
        bool ready = false;
        dev::Tensor conv, delta, k, v;
        int64_t rows = 0, capacity = 0;
    };
    std::vector<Layer> layers;
};

Backbone::~Backbone() = default;

size_t Backbone::packed_weight_bytes() const {
    size_t bytes = 0;
    for (const auto& l : linears_) bytes += l->resident_bytes();
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

Backbone::Backbone(const TextConfig& cfg, const WeightSource& src, ops::Residency quant_residency,
                   dev::Device& device, int device_layers, bool int8)
    : device_(device), cfg_(cfg) {
    check_config(cfg_);
    device_layers_ = device_layers < 0 ? cfg_.num_layers : std::min(device_layers, cfg_.num_layers);
    prefix_ = text_prefix_in([&](const std::string& name) { return src.has(name); });
    if (prefix_.empty())
        throw Error(src.description() + ": no text backbone (no embedding table under " + kTextPrefix +
                    " or model.)");
    layers_.resize(cfg_.num_layers);
    for (int l = 0; l < cfg_.num_layers; ++l) layers_[l].type = cfg_.layer_types[l];
    for_each_text_tensor(cfg_, false,
                         [&](const TensorSpec& s) { load_tensor(s, src, quant_residency, int8); });
}

// One tensor of the table into its place: a projection as a Linear (a QuantMatrix the source holds, or the
// checkpoint's own dtype), the embedding table where it lies, every other tensor as fp32.
void Backbone::load_tensor(const TensorSpec& s, const WeightSource& src, ops::Residency quant_residency,
                           bool int8) {
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
    dev::Device& device = device_of(s.text == TextWeight::FinalNorm ? cfg_.num_layers - 1 : s.layer);
    if (s.matrix) {
        linears_.push_back(device.matrix({t, q, quant_residency, {}, dev::Paths::Both, int8}));
        *s.slot.linear(layers_[s.layer]) = linears_.back().get();
        return;
    }
    if (q) throw Error(src.description() + ": tensor " + name + " is held as a quantised matrix");
    *(s.text == TextWeight::FinalNorm ? &final_norm_ : s.slot.vector(layers_[s.layer])) =
        device.vector(t->to_f32());
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
    state_.kv_reserve = in_.T;
    // The K/V cache at its final size from the start: no reallocation (and no old copy beside the new one)
    // as the chunks append their rows.
    const size_t kv = static_cast<size_t>(in_.T) * b_.cfg_.num_kv_heads * b_.cfg_.head_dim;
    for (size_t l = 0; l < state_.layers.size(); ++l) {
        if (b_.layers_[l].type != LayerType::FullAttention || !b_.device_of(static_cast<int>(l)).is_cpu())
            continue;
        BackboneState::Layer& S = state_.layers[l];
        if (kv_as_bf16(S, opt_.kv_bf16)) {
            S.kb.reserve(kv), S.vb.reserve(kv);
        } else {
            S.k.reserve(kv), S.v.reserve(kv);
        }
    }
}

void Backbone::Prefill::step(const RowSink& sink, const DeviceRowSink* on_device) {
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
    const bool stay = on_device && !b_.output_device().is_cpu();
    const DeviceRowSink at_t0 = [&](dev::Stream& s, dev::Span rows, int64_t m, int64_t) {
        (*on_device)(s, rows, m, t0);
    };
    b_.forward_chunk(state_, buf_.data(), n, in_.positions ? in_.positions + t0 : nullptr, in_.T, opt_,
                     stay ? nullptr : buf_.data(), trace_, profile_, stay ? &at_t0 : nullptr);
    sink(stay ? nullptr : buf_.data(), n, t0);
}

void Backbone::forward_chunk(BackboneState& st, const float* x, int64_t T, const int32_t* positions,
                             int64_t positions_stride, const BackboneOptions& opt, float* out,
                             BackboneTrace* trace, BackboneProfile* profile,
                             const DeviceRowSink* on_device) const {
    const int64_t H = cfg_.hidden_size;
    if (T < 0) throw Error("forward_chunk: negative token count");
    if (static_cast<int>(st.layers.size()) != cfg_.num_layers)
        throw Error("forward_chunk: the state was not made by this backbone's start()");
    if (trace) trace->layers.assign(cfg_.num_layers, {});
    if (T == 0) return;
    // The layers in runs on one device (all of them, or the device's first ones and then the CPU's), each run
    // one stream; the hidden states cross to the next run through the host.
    std::vector<float> carry;
    for (int l0 = 0; l0 < cfg_.num_layers;) {
        int l1 = l0 + 1;
        while (l1 < cfg_.num_layers && &device_of(l1) == &device_of(l0)) ++l1;
        const bool first = l0 == 0, last = l1 == cfg_.num_layers;
        dev::Device& device = device_of(l0);
        const std::unique_ptr<dev::Stream> stream = device.stream({opt.reference, opt.precision});
        Ctx c{opt, profile, device, *stream, cfg_.rms_norm_eps, {}, {}};
        dev::Tensor h = c.scratch(T * H), xn = c.scratch(T * H), mix = c.scratch(T * H);
        c.s.upload(h.span(), first ? x : carry.data());
        run_layers(st, l0, l1, h, xn, mix, positions, positions_stride, T, c, trace);
        if (last) {
            {
                auto tm = c.time(&BackboneProfile::norms);
                c.rms_norm_zc(h.span(), T, H, final_norm_, xn.span());
            }
            if (on_device && !device.is_cpu()) (*on_device)(c.s, xn.span(), T, st.position);
            if (out)
                c.s.download(out, xn.span());
            else
                c.s.sync();
        } else {
            carry.resize(static_cast<size_t>(T * H));
            c.s.download(carry.data(), h.span());
        }
        l0 = l1;
    }
    st.position += T;
}

// Layers [l0, l1) of a chunk on one device's stream: h [T][hidden] in, the residual stream after l1 - 1 out;
// xn and mix [T][hidden] are its working rows.
void Backbone::run_layers(BackboneState& st, int l0, int l1, const dev::Tensor& h, const dev::Tensor& xn,
                          const dev::Tensor& mix, const int32_t* positions, int64_t positions_stride,
                          int64_t T, Ctx& c, BackboneTrace* trace) const {
    const int64_t H = cfg_.hidden_size;
    // RoPE tables for this chunk (computed on the host), shared by every attention layer of the run.
    bool attention = false;
    for (int l = l0; l < l1; ++l) attention = attention || layers_[l].type == LayerType::FullAttention;
    if (attention) {
        std::vector<int32_t> pos(3 * T);
        for (int a = 0; a < 3; ++a)
            for (int64_t t = 0; t < T; ++t)
                pos[a * T + t] =
                    positions ? positions[a * positions_stride + t] : static_cast<int32_t>(st.position + t);
        const int half = cfg_.rotary_dim / 2;
        std::vector<float> cos(T * half), sin(T * half);
        ops::rope_tables(rope_params(cfg_, st.rope_seq_len), pos.data(), T, cos.data(), sin.data());
        c.cos = c.scratch(T * half), c.sin = c.scratch(T * half);
        c.s.upload(c.cos.span(), cos.data());
        c.s.upload(c.sin.span(), sin.data());
    }
    for (int l = l0; l < l1; ++l) {
        const Layer& L = layers_[l];
        const bool internals =
            trace && std::find(trace->internals_for_layers.begin(), trace->internals_for_layers.end(), l) !=
                         trace->internals_for_layers.end();
        {
            auto tm = c.time(&BackboneProfile::norms);
            c.rms_norm_zc(h.span(), T, H, L.input_norm, xn.span());
        }
        if (trace) trace->layers[l].input_norm = c.s.read(xn.span());
        const LayerState S = layer_state(st, l, T, c);
        if (L.type == LayerType::LinearAttention)
            gdn_mixer(L, S, xn.span(), T, c, mix.span(), internals ? &trace->layers[l].gdn : nullptr);
        else
            attention_mixer(L, S, xn.span(), T, c, mix.span(),
                            internals ? &trace->layers[l].attention : nullptr);
        if (trace) trace->layers[l].mixer_out = c.s.read(mix.span());
        {
            auto tm = c.time(&BackboneProfile::norms);
            c.s.add(h.span(), mix.span());
            c.rms_norm_zc(h.span(), T, H, L.post_norm, xn.span());
        }
        mlp(L, xn.span(), T, c, mix.span());
        {
            auto tm = c.time(&BackboneProfile::norms);
            c.s.add(h.span(), mix.span());
        }
        if (trace) trace->layers[l].layer_out = c.s.read(h.span());
    }
}

void Backbone::gdn_mixer(const Layer& L, const LayerState& S, dev::Span xn, int64_t T, Ctx& c, dev::Span out,
                         BackboneTrace::Gdn* tr) const {
    const GdnWeights& w = L.gdn;
    const int Hk = cfg_.linear_num_key_heads, Hv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    const int64_t key_dim = int64_t{Hk} * dk, value_dim = int64_t{Hv} * dv;
    const int64_t conv_dim = 2 * key_dim + value_dim;
    dev::Stream& s = c.s;

    // Projections: qkv (convolved), z (output gate), b (beta), a (decay input).
    dev::Tensor qkv = c.scratch(T * conv_dim), conv = c.scratch(T * conv_dim), z = c.scratch(T * value_dim),
                b = c.scratch(T * Hv), a = c.scratch(T * Hv);
    {
        auto tm = c.time(&BackboneProfile::gdn_proj);
        s.linear(*w.qkv, xn, T, qkv.span());
        s.linear(*w.z, xn, T, z.span());
        s.linear(*w.b, xn, T, b.span());
        s.linear(*w.a, xn, T, a.span());
    }
    dev::Tensor q = c.scratch(T * key_dim), k = c.scratch(T * key_dim);
    {
        auto tm = c.time(&BackboneProfile::gdn_conv_gates);
        s.conv1d_silu(qkv.span(), T, conv_dim, w.conv.span(), cfg_.linear_conv_kernel, S.conv, conv.span());
        qkv = {};
        // q, k: L2-normalised per head (q also scaled by 1/sqrt(dk)); v stays in the conv output.
        const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
        s.l2_norm_heads(conv.span(), conv_dim, T, Hk, dk, 1e-6f, q_scale, q.span());
        s.l2_norm_heads(conv.at(key_dim, T * conv_dim - key_dim), conv_dim, T, Hk, dk, 1e-6f, 1.f, k.span());
        // beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), in place.
        s.gdn_gates(b.span(), a.span(), T, Hv, w.log_decay_rate.span(), w.dt_bias.span());
    }

    dev::Tensor o = c.scratch(T * value_dim);
    {
        auto tm = c.time(&BackboneProfile::delta_rule);
        dev::DeltaRule d;
        d.T = T, d.Hk = Hk, d.Hv = Hv, d.dk = dk, d.dv = dv;
        d.q = q.span(), d.q_ld = key_dim;
        d.k = k.span(), d.k_ld = key_dim;
        d.v = conv.at(2 * key_dim, T * conv_dim - 2 * key_dim), d.v_ld = conv_dim;
        d.beta = b.span(), d.g = a.span(), d.out = o.span(), d.state = S.delta;
        d.chunked = c.opt.chunked_delta_rule;
        s.delta_rule(d);
    }

    // Gated RMSNorm per value head: norm.weight * rmsnorm(o) * silu(z) (or sigmoid(z), by the config).
    dev::Tensor y = c.scratch(T * value_dim);
    {
        auto tm = c.time(&BackboneProfile::gdn_conv_gates);
        s.rms_norm_gated(o.span(), z.span(), T * Hv, dv, w.norm.span(), cfg_.rms_norm_eps, cfg_.gdn_norm_gate,
                         y.span());
    }
    {
        auto tm = c.time(&BackboneProfile::gdn_proj);
        s.linear(*w.out, y.span(), T, out);
    }

    if (tr) {
        tr->conv_silu = c.s.read(conv.span());
        tr->q = c.s.read(q.span());
        tr->k = c.s.read(k.span());
        tr->v.resize(T * value_dim);
        for (int64_t t = 0; t < T; ++t)
            std::copy_n(tr->conv_silu.data() + t * conv_dim + 2 * key_dim, value_dim,
                        tr->v.data() + t * value_dim);
        tr->z = c.s.read(z.span());
        tr->beta = c.s.read(b.span());
        tr->g = c.s.read(a.span());
        tr->delta_out = c.s.read(o.span());
        tr->gated_norm = c.s.read(y.span());
    }
}

namespace {

// Grows a CPU layer's K/V cache (fp32 or bf16 bits) by T rows of kvdim and returns it wrapped: the cache as
// it will be after this chunk, its last T rows still to be written.
void grow_kv(BackboneState::Layer& S, int64_t T, int64_t kvdim, bool bf16, dev::Tensor (&hold)[4]) {
    const int64_t rows = S.kv_rows(kvdim) + T;
    dev::Device& cpu = dev::cpu();
    if (kv_as_bf16(S, bf16)) {
        S.kb.resize(rows * kvdim), S.vb.resize(rows * kvdim);
        hold[2] = cpu.wrap(S.kb.data(), rows * kvdim, dev::Elem::BF16);
        hold[3] = cpu.wrap(S.vb.data(), rows * kvdim, dev::Elem::BF16);
        return;
    }
    S.k.resize(rows * kvdim), S.v.resize(rows * kvdim);
    hold[2] = cpu.wrap(S.k.data(), rows * kvdim), hold[3] = cpu.wrap(S.v.data(), rows * kvdim);
}

// A device layer's K/V cache made (or grown) to `capacity` rows, its `rows` rows copied in from the host
// vectors (fp32, or bf16 bits where they hold those or, for a new cache, where kv_bf16 asks).
void make_kv(BackboneResident::Layer& r, BackboneState::Layer& S, int64_t capacity, int64_t kvdim,
             bool kv_bf16, dev::Device& d, dev::Stream& s) {
    const bool bf16 = kv_as_bf16(S, kv_bf16);
    const dev::Elem e = bf16 ? dev::Elem::BF16 : dev::Elem::F32;
    r.k = d.buffer(capacity * kvdim, e), r.v = d.buffer(capacity * kvdim, e);
    r.capacity = capacity;
    if (r.rows == 0) return;
    s.upload(r.k.at(0, r.rows * kvdim), bf16 ? static_cast<const void*>(S.kb.data()) : S.k.data());
    s.upload(r.v.at(0, r.rows * kvdim), bf16 ? static_cast<const void*>(S.vb.data()) : S.v.data());
}

// Records the copies of a device layer's state back into its host vectors (made at the stream's next sync):
// the conv and delta-rule state whole, the K/V rows [kv_from, rows).
void fetch_layer(const BackboneResident::Layer& r, BackboneState::Layer& S, int64_t kv_from, int64_t kvdim,
                 dev::Stream& s) {
    if (!r.ready) return;
    if (!r.conv.empty()) {
        s.fetch(S.conv.data(), r.conv.span());
        s.fetch(S.delta.data(), r.delta.span());
        return;
    }
    const bool bf16 = r.k.span().elem == dev::Elem::BF16;
    const int64_t n = r.rows * kvdim, o = std::min(kv_from, r.rows) * kvdim;
    if (bf16)
        S.kb.resize(n), S.vb.resize(n);
    else
        S.k.resize(n), S.v.resize(n);
    if (o == n) return;
    s.fetch(bf16 ? static_cast<void*>(S.kb.data() + o) : S.k.data() + o, r.k.at(o, n - o));
    s.fetch(bf16 ? static_cast<void*>(S.vb.data() + o) : S.v.data() + o, r.v.at(o, n - o));
}

}  // namespace

void Backbone::to_host(BackboneState& st, int64_t kv_from) const {
    if (!st.resident) return;
    const std::unique_ptr<dev::Stream> s = device_.stream({});
    const int64_t kvdim = int64_t{cfg_.num_kv_heads} * cfg_.head_dim;
    for (int l = 0; l < cfg_.num_layers; ++l)
        fetch_layer(st.resident->layers[l], st.layers[l], kv_from, kvdim, *s);
    s->sync();
}

Backbone::LayerState Backbone::layer_state(BackboneState& st, int l, int64_t T, Ctx& c) const {
    BackboneState::Layer& S = st.layers[l];
    LayerState out;
    const bool gdn = layers_[l].type == LayerType::LinearAttention;
    const int64_t kvdim = int64_t{cfg_.num_kv_heads} * cfg_.head_dim;
    if (c.dev.is_cpu()) {  // the state vectors themselves
        if (gdn) {
            out.hold[0] = c.dev.wrap(S.conv.data(), static_cast<int64_t>(S.conv.size()));
            out.hold[1] = c.dev.wrap(S.delta.data(), static_cast<int64_t>(S.delta.size()));
            out.conv = out.hold[0].span(), out.delta = out.hold[1].span();
            return out;
        }
        out.p0 = S.kv_rows(kvdim);
        grow_kv(S, T, kvdim, c.opt.kv_bf16, out.hold);
        out.k = out.hold[2].span(), out.v = out.hold[3].span();
        return out;
    }
    if (!st.resident) {
        st.resident = std::make_shared<BackboneResident>();
        st.resident->layers.resize(cfg_.num_layers);
    }
    BackboneResident::Layer& r = st.resident->layers[l];
    if (gdn) {
        if (!r.ready) {  // the host's state in, once (a fresh one, all zeros, made on the device)
            r.conv = c.dev.buffer(static_cast<int64_t>(S.conv.size()));
            r.delta = c.dev.buffer(static_cast<int64_t>(S.delta.size()));
            if (st.position == 0) {
                c.s.zero(r.conv.span()), c.s.zero(r.delta.span());
            } else {
                c.s.upload(r.conv.span(), S.conv.data());
                c.s.upload(r.delta.span(), S.delta.data());
            }
            r.ready = true;
        }
        out.conv = r.conv.span(), out.delta = r.delta.span();
        return out;
    }
    if (!r.ready) {
        r.rows = S.kv_rows(kvdim);
        make_kv(r, S, std::max(r.rows + T, st.kv_reserve), kvdim, c.opt.kv_bf16, c.dev, c.s);
        r.ready = true;
    } else if (r.rows + T > r.capacity) {  // past the reserve: through the host into a larger cache
        fetch_layer(r, S, 0, kvdim, c.s);
        c.s.sync();
        make_kv(r, S, std::max(2 * r.capacity, r.rows + T), kvdim, c.opt.kv_bf16, c.dev, c.s);
    }
    out.p0 = r.rows;
    out.k = r.k.at(0, (r.rows + T) * kvdim), out.v = r.v.at(0, (r.rows + T) * kvdim);
    r.rows += T;
    return out;
}

void Backbone::attention_mixer(const Layer& L, const LayerState& S, dev::Span xn, int64_t T, Ctx& c,
                               dev::Span out, BackboneTrace::Attention* tr) const {
    const AttentionWeights& w = L.attn;
    const int nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, hd = cfg_.head_dim;
    const int64_t qdim = int64_t{nh} * hd, kvdim = int64_t{nkv} * hd;
    const bool gated = cfg_.attn_output_gate;
    dev::Stream& s = c.s;
    const int64_t p0 = S.p0;  // cache rows before this chunk
    const dev::Span kc = S.k, vc = S.v;

    dev::Tensor qg = c.scratch(T * (gated ? 2 * qdim : qdim)), k = c.scratch(T * kvdim),
                v = c.scratch(T * kvdim);
    {
        auto tm = c.time(&BackboneProfile::attn_proj);
        s.linear(*w.q, xn, T, qg.span());
        s.linear(*w.k, xn, T, k.span());
        s.linear(*w.v, xn, T, v.span());
    }

    // q_proj rows are per head [query hd | gate hd] when gated.
    dev::Tensor q = gated ? c.scratch(T * qdim) : std::move(qg), gate = c.scratch(gated ? T * qdim : 0);
    {
        auto tm = c.time(&BackboneProfile::attn_rope_norm);
        if (gated) s.split_query_gate(qg.span(), T, nh, hd, q.span(), gate.span());
        qg = {};
        c.rms_norm_zc(q.span(), T * nh, hd, w.q_norm, q.span());
        c.rms_norm_zc(k.span(), T * nkv, hd, w.k_norm, k.span());
        s.rope(q.span(), T, nh, hd, qdim, cfg_.rotary_dim, c.cos.span(), c.sin.span());
        s.rope(k.span(), T, nkv, hd, kvdim, cfg_.rotary_dim, c.cos.span(), c.sin.span());
        s.copy(k.span(), kc.at(p0 * kvdim, T * kvdim));
        s.copy(v.span(), vc.at(p0 * kvdim, T * kvdim));
    }

    dev::Tensor attn = c.scratch(T * qdim);
    {
        auto tm = c.time(&BackboneProfile::attention);
        dev::Attention at;
        at.T = T, at.p0 = p0, at.nh = nh, at.nkv = nkv, at.hd = hd;
        at.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
        at.q = q.span(), at.k = kc, at.v = vc, at.out = attn.span();
        s.attention(at);
    }
    if (tr) tr->attn = c.s.read(attn.span());
    {
        auto tm = c.time(&BackboneProfile::attn_rope_norm);
        if (gated) s.sigmoid_mul(attn.span(), gate.span(), attn.span());
    }
    {
        auto tm = c.time(&BackboneProfile::attn_proj);
        s.linear(*w.o, attn.span(), T, out);
    }

    if (tr) {
        tr->q_rope = c.s.read(q.span());
        tr->k_rope = c.s.read(k.span());
        tr->v = c.s.read(v.span());
        tr->gate = c.s.read(gate.span());
    }
}

void Backbone::mlp(const Layer& L, dev::Span xn, int64_t T, Ctx& c, dev::Span out) const {
    const int64_t I = cfg_.intermediate_size;
    dev::Tensor gate = c.scratch(T * I), up = c.scratch(T * I);
    {
        auto tm = c.time(&BackboneProfile::mlp_proj);
        c.s.linear(*L.gate, xn, T, gate.span());
        c.s.linear(*L.up, xn, T, up.span());
    }
    {
        auto tm = c.time(&BackboneProfile::mlp_act);
        c.s.silu_mul(gate.span(), up.span(), gate.span());
    }
    auto tm = c.time(&BackboneProfile::mlp_proj);
    c.s.linear(*L.down, gate.span(), T, out);
}

bool parse_precision(const std::string& s, ops::Precision& out) {
    if (s == "exact")
        out = ops::Precision::Exact;
    else if (s == "bf16")
        out = ops::Precision::BF16;
    else if (s == "int8")
        out = ops::Precision::Int8;
    else if (s == "fp16")
        out = ops::Precision::F16;
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
