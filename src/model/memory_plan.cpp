#include "model/memory_plan.h"

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "device/device.h"
#include "ops/int8_gemm.h"
#include "ops/simd_kernels.h"

namespace clef {

namespace {

using Kind = StoredTensor::Kind;

constexpr uint64_t kF32 = 4;
constexpr uint64_t kMiB = uint64_t{1} << 20;

uint64_t u(int64_t n) {
    return static_cast<uint64_t>(std::max<int64_t>(n, 0));
}

// Rows of a matrix packed into the own kernels' panels (ops/gemm.cpp: [n_panels][k][32], zero-padded).
int64_t panel_rows(int64_t rows) {
    const int64_t p = ops::simd::kPanelCols;
    return (rows + p - 1) / p * p;
}

int64_t rows_of(const TensorSpec& s) {
    return s.shape.empty() ? 1 : s.shape[0];
}

int64_t cols_of(const TensorSpec& s) {
    return s.numel() / std::max<int64_t>(rows_of(s), 1);
}

// The bf16 column block of a streamed oneDNN layer (ops/gemm.cpp block_width, 32 MiB) or the own kernels'
// fetched rows and their panels (ops/gemm.cpp panels_per_group, 8 MiB each): one per calling thread.
uint64_t stream_buffer(int64_t rows, int64_t cols, bool onednn) {
    if (onednn) {
        const int64_t cap = std::max<int64_t>(64, static_cast<int64_t>(32 * kMiB) / (2 * cols) / 64 * 64);
        return u(std::min(rows, cap) * cols * 2);
    }
    const int64_t p = ops::simd::kPanelCols;
    const int64_t group = std::max<int64_t>(1, static_cast<int64_t>(8 * kMiB) / (2 * p * cols));
    return 2 * u(std::min(group, panel_rows(rows) / p) * p * cols * 2);
}

// A backbone projection with Precision::Int8 (ops/int8_gemm.h): streamed from the mapping like Exact, or
// quantised once at load into int8 panels (1.125 bytes per weight; a block-quantised tensor planned at the
// 1.25 of level panels, which its type may not need; the file's pages dropped); Q8_0 blocks are always
// packed (their panels are the file's bytes rearranged, 1.125 against 1.0625 per weight); an F64 checkpoint
// tensor keeps an fp32 reference copy.
void add_int8_matrix(WeightMemory& w, const TensorSpec& s, const StoredTensor& st,
                     const MemoryPlanInput& in) {
    const int64_t rows = rows_of(s), cols = cols_of(s);
    if (st.kind == Kind::Blocks && !in.unpack_quantised && !st.int8_blocks) {
        w.mapped += st.bytes;
        w.streamed = true;
        w.stream_buffer = std::max(w.stream_buffer, ops::int8_stream_scratch_bytes(cols));
        return;
    }
    // Affine levels in their own panel kind; everything else (Q8_0 as it is, other types requantised) signed.
    w.packed += ops::int8_packed_bytes(rows, cols, st.kind == Kind::Blocks ? st.level_bits : 0);
    if (st.kind == Kind::F64) w.packed += u(rows * cols) * kF32;
}

// A projection of the text backbone (device/linear.h, LinearPath::Both) or the vision tower (Fast), by how it
// is stored (device/linear.cpp): block-quantised ones stream from the mapping unless unpacked; BF16 is used
// in place by oneDNN or packed into bf16 panels; F16 into f16 panels and F32 / F64 into fp32 ones, from the
// mapping or (a GGUF tensor in another layout) from its rows. The reference path reads the mapped file, so
// only an F64 tensor keeps an fp32 copy for it (backbone only); packed, the mapped pages are dropped.
void add_matrix(WeightMemory& w, uint64_t& slot, const TensorSpec& s, const StoredTensor& st,
                const MemoryPlanInput& in, bool reference_copy) {
    const int64_t rows = rows_of(s), cols = cols_of(s);
    const uint64_t bf16 = u(rows * cols * 2), panels16 = u(panel_rows(rows) * cols * 2);
    const bool tiled = st.gguf && s.layout != GgufLayout::Same;
    if (st.kind == Kind::Blocks && !in.unpack_quantised) {
        w.mapped += st.bytes;
        w.streamed = true;
        w.stream_buffer = std::max(w.stream_buffer, stream_buffer(rows, cols, in.onednn));
    } else if (st.kind == Kind::Blocks || (st.kind == Kind::BF16 && tiled)) {
        slot += in.onednn ? bf16 : panels16;  // a QuantMatrix packed once (model/gguf_model.cpp serves it)
    } else if (st.kind == Kind::BF16) {
        (in.onednn ? w.mapped : slot) += in.onednn ? st.bytes : panels16;
    } else {
        slot += st.kind == Kind::F16 ? panels16 : u(panel_rows(rows) * cols) * kF32;
        if (reference_copy && st.kind == Kind::F64) slot += u(rows * cols) * kF32;
    }
}

// A vector (norm, conv taps, decay): the layer's fp32 copy, the source's mapped bytes and, for a GGUF tensor
// in another layout or type, the source's own fp32 copy (model/gguf_model.cpp add_text_tensor).
uint64_t vector_bytes(const TensorSpec& s, const StoredTensor& st) {
    const bool converted = st.gguf && (s.layout != GgufLayout::Same || st.kind == Kind::Blocks);
    return u(s.numel()) * kF32 * (converted ? 2 : 1) + st.bytes;
}

// Rows of a mapped table read per token id (model/backbone.cpp embed_into, model/head.cpp lexical_row).
uint64_t table_rows(const TensorSpec& s, const StoredTensor& st, int64_t rows_read) {
    const int64_t rows = std::max<int64_t>(rows_of(s), 1);
    return std::min(st.bytes, st.bytes / u(rows) * u(std::min(rows_read, rows)));
}

// ids: the distinct token ids the tokenizer can produce (0 = unknown).
void add_text_tensor(WeightMemory& w, const TensorSpec& s, const StoredTensor& st, const MemoryPlanInput& in,
                     int64_t ids) {
    auto distinct = [ids](int64_t tokens) { return ids > 0 ? std::min(tokens, ids) : tokens; };
    if (s.text == TextWeight::Embed)
        w.embedding_rows += table_rows(s, st, distinct(in.tokens));
    else if (s.text == TextWeight::LmHead)
        w.embedding_rows += table_rows(s, st, distinct(in.option_tokens));
    else if (s.matrix)
        if (in.backbone.precision == ops::Precision::Int8 && !in.device)
            add_int8_matrix(w, s, st, in);
        else
            add_matrix(w, w.packed, s, st, in, true);
    else
        w.vectors += vector_bytes(s, st);
}

// The joint head as model/head.cpp builds it, whatever its file: fp32 weights packed into fp32 panels, the k
// and v thirds of each attention in-projection also kept in fp32 (attend_memory reads their rows), biases,
// norms and scalars in fp32.
uint64_t head_bytes(const HeadConfig& h, uint64_t* largest_matrix) {
    uint64_t total = 0;
    for_each_head_tensor(h, [&](const TensorSpec& s) {
        const bool split = s.layout == GgufLayout::Split;
        const int64_t rows = split ? rows_of(s) / 3 : rows_of(s), cols = cols_of(s);
        if (!s.matrix) {
            total += u(split ? s.numel() / 3 : s.numel()) * kF32;
            return;
        }
        total += u(panel_rows(rows) * cols) * kF32 + (split && s.slice > 0 ? u(rows * cols) * kF32 : 0);
        *largest_matrix = std::max(*largest_matrix, u(rows_of(s) * cols) * kF32);
    });
    return total;
}

}  // namespace

WeightMemory plan_weights(const ModelConfig& model, const HeadConfig* head, const ModelSources& sources,
                          const MemoryPlanInput& in) {
    WeightMemory w;
    w.tokenizer = sources.tokenizer_bytes;
    uint64_t largest = 0;  // the largest matrix packed from its mapping (its pages are dropped afterwards)
    for_each_text_tensor(model.text, !model.text.tie_word_embeddings, [&](const TensorSpec& s) {
        const std::optional<StoredTensor> st = sources.text(s);
        if (!st) return;
        add_text_tensor(w, s, *st, in, sources.tokenizer_ids);
        if (s.matrix && st->kind != Kind::Blocks) largest = std::max(largest, st->bytes);
    });
    if (sources.vision && model.vision)
        for_each_vision_tensor(*model.vision, [&](const TensorSpec& s) {
            const std::optional<StoredTensor> st = sources.vision(s);
            // The tower loads the Conv3d kernel once (model/vision.cpp), the table lists it per frame.
            if (!st || (s.layout == GgufLayout::PatchFrame && s.slice > 0)) return;
            if (s.matrix)
                add_matrix(w, w.vision, s, *st, in, false);
            else
                w.vision += vector_bytes(s, *st);
        });
    uint64_t head_matrix = 0;
    if (head) w.head = head_bytes(*head, &head_matrix);
    w.load_transient = sources.head_source_bytes + std::max(largest, head_matrix);
    return w;
}

namespace {

// The buffers live at one point of a decision, split by where the allocator puts them.
struct Phase {
    uint64_t heap = 0, mapped = 0;
    Phase& add(std::initializer_list<uint64_t> buffers) {
        for (uint64_t b : buffers) (b >= kHeapBlockLimit ? mapped : heap) += b;
        return *this;
    }
    uint64_t total() const { return heap + mapped; }
};

// The widths the buffers are made of (model/backbone.cpp gdn_mixer, attention_mixer, mlp).
struct Widths {
    int64_t H, I, Hv, kd, vd, cd, qd, kvd, qrows, half_rope, full, linear, recurrent;
    explicit Widths(const TextConfig& t)
        : H(t.hidden_size),
          I(t.intermediate_size),
          Hv(t.linear_num_value_heads),
          kd(int64_t{t.linear_num_key_heads} * t.linear_key_head_dim),
          vd(int64_t{Hv} * t.linear_value_head_dim),
          cd(2 * kd + vd),
          qd(int64_t{t.num_heads} * t.head_dim),
          kvd(int64_t{t.num_kv_heads} * t.head_dim),
          qrows(t.attn_output_gate ? 2 * qd : qd),
          half_rope(t.rotary_dim / 2),
          full(t.num_layers_of(LayerType::FullAttention)),
          linear(t.num_layers_of(LayerType::LinearAttention)),
          // Backbone::start: conv taps [K-1][conv_dim] and the delta-rule state [Hv][dk][dv] per GDN layer.
          recurrent((t.linear_conv_kernel - 1) * cd +
                    int64_t{Hv} * t.linear_key_head_dim * t.linear_value_head_dim) {}
};

uint64_t f32(int64_t n) {
    return u(n) * kF32;
}

// n values of the K/V cache: fp32, or bf16 with BackboneOptions::kv_bf16.
uint64_t kv_bytes(const MemoryPlanInput& in, int64_t n) {
    return u(n) * (in.backbone.kv_bf16 ? 2 : kF32);
}

// The longest prefill chunk (Backbone::chunk_length; the state cache also stops a chunk every granularity
// tokens inside the state, so with it the longest chunk is a stretch of the state or of the schema after it).
int64_t chunk_of(const WeightMemory& w, const MemoryPlanInput& in) {
    const int64_t n = std::max<int64_t>(in.tokens, 1);
    const int64_t set = w.streamed ? in.backbone.streamed_prefill_chunk : in.backbone.prefill_chunk;
    int64_t c = set > 0 ? std::min(set, n) : n;
    if (in.cache_bytes > 0)
        c = std::min(c, std::max(in.cache_granularity, std::clamp<int64_t>(in.schema_tokens, 1, n)));
    return c;
}

// Per-thread GEMM buffers of the decision's thread (ops/gemm.cpp: thread_local, kept at their largest).
uint64_t gemm_scratch(const Widths& d, const WeightMemory& w, const MemoryPlanInput& in, int64_t c) {
    const int64_t k = std::max({d.H, d.I, d.vd, d.qd});
    const int64_t rows = std::min<int64_t>(c, 2048);
    uint64_t b = w.stream_buffer;
    if (in.backbone.precision == ops::Precision::BF16) return b + (in.onednn ? u(rows * k * 2) : f32(c * k));
    // int8: the chunk's activation levels, scales and level sums (ops/int8_gemm.cpp forward).
    if (in.backbone.precision == ops::Precision::Int8) return b + u(c * k) + u(c * (k / 32 + 1)) * 8;
    if (!in.onednn) return b;
    if (in.exact_kernel == ops::GemmKernel::F32) return b + 4 * kMiB;  // the widened sub-block
    // A column block is at most the widest projection's outputs (the fused ones are at most 4 k wide), so a
    // narrow model never plans a 32 MiB block (ops/gemm.cpp forward_bf16: dbuf is 3 r x the block's width).
    const int64_t cap = std::max<int64_t>(64, static_cast<int64_t>(32 * kMiB) / (2 * d.H));
    const int64_t width = std::min(cap, 4 * k);
    return b + u(3 * rows * k * 2) +
           f32(3 * std::min<int64_t>(rows, 256) * width);  // three bf16 terms, products
}

// The state cache's entries for this prompt (decision/state_cache.cpp put): per stop the conv and delta-rule
// states of every GDN layer, per state token its K/V rows, head memory row and id; capped by the budget.
uint64_t state_cache_bytes(const Widths& d, const HeadConfig* head, const MemoryPlanInput& in) {
    if (in.cache_bytes == 0) return 0;
    const int64_t state = in.tokens - std::clamp<int64_t>(in.schema_tokens, 0, in.tokens);
    const int64_t g = std::max<int64_t>(in.cache_granularity, 1), stops = (state + g - 1) / g;
    const int64_t W = head ? head->width : 0;
    const uint64_t bytes =
        f32(stops * d.linear * d.recurrent) + kv_bytes(in, state * d.full * 2 * d.kvd) + f32(state * (W + 1));
    return std::min(in.cache_bytes, bytes);
}

// Scratch of the head's attend_memory for lq queries over N memory rows (model/head.cpp).
Phase& attend_memory(Phase& p, const HeadConfig& h, int64_t lq, int64_t N) {
    const int64_t W = h.width, R = lq * h.heads;
    return p.add({f32(lq * W), f32(R * W), f32(R * N), f32(R * W), f32(lq * W)});
}

// Each layer type's own buffers at its largest, besides what the prefill keeps (model/backbone.cpp): GDN
// before and after its projections' input is freed (qkv, conv, z, b, a, q, k; then o, y), attention before
// and during attention_fast (qg, k, v, q, gate; then attn; attention_fast reads the cache in place, its
// per-thread blocks are under 1 MiB), the MLP's gate and up.
std::vector<Phase> layer_phases(const Widths& d, int64_t c) {
    std::vector<Phase> out;
    if (d.linear > 0) {
        out.push_back(Phase().add({f32(c * d.cd), f32(c * d.cd), f32(c * d.vd), f32(c * d.Hv), f32(c * d.Hv),
                                   f32(c * d.kd), f32(c * d.kd)}));
        out.push_back(Phase().add({f32(c * d.cd), f32(c * d.vd), f32(c * d.Hv), f32(c * d.Hv), f32(c * d.kd),
                                   f32(c * d.kd), f32(c * d.vd), f32(c * d.vd)}));
    }
    if (d.full > 0) {
        const int64_t gate = d.qrows - d.qd;
        out.push_back(
            Phase().add({f32(c * d.qrows), f32(c * d.kvd), f32(c * d.kvd), f32(c * d.qd), f32(c * gate)}));
        out.push_back(
            Phase().add({f32(c * d.kvd), f32(c * d.kvd), f32(c * d.qd), f32(c * gate), f32(c * d.qd)}));
    }
    out.push_back(Phase().add({f32(c * d.I), f32(c * d.I)}));
    return out;
}

// The head's decide stage over N memory rows (model/head.cpp): evidence routing (the option queries r, the
// normalised memory and an unused values buffer of N rows each, attend_memory for every option), then the
// field layers (attend_memory for every question).
std::vector<Phase> head_phases(const HeadConfig& h, int64_t N, int64_t Q, int64_t O) {
    const int64_t W = h.width;
    Phase route, field;
    route.add({f32(O * W), f32(N * W), f32(N * W), f32(O * W), f32(O * W)});
    field.add({f32(O * W), f32(Q * W), f32(Q * W), f32(Q * W), f32(Q * W), f32(Q * W)});
    return {attend_memory(route, h, O, N), attend_memory(field, h, Q, N)};
}

// The resident peak over phases run in order, each on top of its base: heap blocks stay resident once
// touched (kHeapBlockLimit), mapped blocks only while live. *retained: the freed heap at the peak.
uint64_t peak_of(const std::vector<std::pair<Phase, std::vector<Phase>>>& stages, uint64_t* retained) {
    uint64_t hwm = 0, peak = 0;
    for (const auto& [base, phases] : stages)
        for (const Phase& p : phases) {
            const uint64_t heap = base.heap + p.heap;
            hwm = std::max(hwm, heap);
            if (hwm + base.mapped + p.mapped > peak)
                peak = hwm + base.mapped + p.mapped, *retained = hwm - heap;
        }
    return peak;
}

uint64_t largest(const std::vector<Phase>& phases) {
    uint64_t n = 0;
    for (const Phase& p : phases) n = std::max(n, p.total());
    return n;
}

}  // namespace

DecisionMemory plan_decision(const TextConfig& text, const HeadConfig* head, const WeightMemory& weights,
                             const MemoryPlanInput& in) {
    const Widths d(text);
    const int64_t N = std::max<int64_t>(in.tokens, 1), c = chunk_of(weights, in), H = d.H;
    const int64_t W = head ? head->width : 0, Q = head ? in.questions : 0, O = head ? in.options : 0;
    DecisionMemory m;
    m.chunk = c;
    m.kv_cache = kv_bytes(in, 2 * d.full * N * d.kvd);
    m.recurrent = f32(d.linear * d.recurrent);
    m.gemm_scratch = gemm_scratch(d, weights, in, c);
    m.state_cache = state_cache_bytes(d, head, in);
    m.prompt = 3 * u(N) * 4;  // the prepared prompt's ids, the decision's copy, the request's text
    m.chunk_buffers = f32(c * (head ? 5 : 4) * H + 2 * c * d.half_rope);

    // Kept to the end: the head's features (HeadFeatureBuilder: memory rows [N][W], question and option
    // means), the GEMM buffers, the state cache, the prompt.
    Phase after;
    after.add({f32(N * W), f32(Q * H), f32(2 * O * H), f32(H), m.gemm_scratch, m.prompt});
    after.heap += m.state_cache;  // entries of a few MiB each
    m.head_features = f32(N * W + Q * H + 2 * O * H + H) + 2 * f32((Q + O) * H);
    // Kept through the prefill besides: BackboneState (K and V per full-attention layer, GDN states), the
    // chunk's buffers (Backbone::Prefill buf_; forward_chunk h, xn, mix, cos, sin; the builder's normed_) and
    // the builder's span sums in double.
    Phase during = after;
    for (int64_t l = 0; l < 2 * d.full; ++l) during.add({kv_bytes(in, N * d.kvd)});
    for (int64_t l = 0; l < d.linear; ++l) during.add({f32(d.recurrent)});
    for (int i = 0; i < (head ? 5 : 4); ++i) during.add({f32(c * H)});
    during.add({f32(c * d.half_rope), f32(c * d.half_rope), 2 * f32((Q + O) * H)});

    std::vector<std::pair<Phase, std::vector<Phase>>> stages{{during, layer_phases(d, c)}};
    if (head) stages.push_back({after, head_phases(*head, N, Q, O)});
    m.layer_scratch = largest(stages[0].second);
    m.head_scratch = head ? largest(stages[1].second) : 0;
    m.peak = peak_of(stages, &m.heap_retained);
    return m;
}

namespace {

// Buffers of the Vulkan device's scratch pool, as the pool rounds them (device/device.h pool_bytes).
uint64_t pooled(const MemoryPlanInput& in, std::initializer_list<uint64_t> buffers) {
    uint64_t n = 0;
    for (uint64_t b : buffers) n += dev::pool_bytes(b, in.device_max_buffer);
    return n;
}

// A matrix on the device (VulkanDevice::matrix): as stored where a shader reads the type (every float type
// but F64 and every block type of the GGUF files), else widened to fp32.
uint64_t device_matrix(const TensorSpec& s, const StoredTensor& st) {
    return st.kind == Kind::F64 ? f32(s.numel()) : st.bytes;
}

}  // namespace

DevicePlan plan_device(const ModelConfig& model, const HeadConfig* head, const ModelSources& sources,
                       const MemoryPlanInput& in, const WeightMemory& weights) {
    const TextConfig& t = model.text;
    DevicePlan p;
    p.layers = in.device_layers < 0 ? t.num_layers : std::min(in.device_layers, t.num_layers);
    // The device's matrices do not stream: the short prefill chunk, unless CPU layers stream theirs.
    WeightMemory chunking = weights;
    if (p.layers == t.num_layers) chunking.streamed = false;
    const int64_t c = chunk_of(chunking, in);
    const auto on_device = [&](const TensorSpec& s) {
        const int layer = s.text == TextWeight::FinalNorm ? t.num_layers - 1 : s.layer;
        return layer < p.layers;
    };
    for_each_text_tensor(t, !t.tie_word_embeddings, [&](const TensorSpec& s) {
        const std::optional<StoredTensor> st = sources.text(s);
        if (!st || s.text == TextWeight::Embed || s.text == TextWeight::LmHead || !on_device(s)) return;
        p.backbone += s.matrix ? device_matrix(s, *st) : f32(s.numel());
    });
    if (sources.vision && model.vision)
        for_each_vision_tensor(*model.vision, [&](const TensorSpec& s) {
            const std::optional<StoredTensor> st = sources.vision(s);
            if (!st || (s.layout == GgufLayout::PatchFrame && s.slice > 0)) return;
            p.vision += s.matrix ? device_matrix(s, *st) : f32(s.numel());
        });
    if (head)  // model/head.cpp: every tensor as fp32, the attentions' k and v rows once more
        for_each_head_tensor(*head, [&](const TensorSpec& s) {
            const bool split = s.layout == GgufLayout::Split;
            const int64_t n = split ? s.numel() / 3 : s.numel();
            p.head += f32(n) + (split && s.matrix && s.slice > 0 ? f32(n) : 0);
        });
    // The device layers' share of the state; a chunk's buffers on the device (Backbone::forward_chunk,
    // gdn_mixer, attention_mixer, mlp): h, xn, mix, the RoPE tables, every buffer of a GDN layer, of an
    // attention layer and of the MLP (the pool keeps what it freed, by size class).
    const Widths d(t);
    const int64_t N = std::max<int64_t>(in.tokens, 1), W = head ? head->width : 0;
    int full = 0, linear = 0;
    for (int l = 0; l < p.layers; ++l) (t.layer_types[l] == LayerType::FullAttention ? full : linear) += 1;
    p.state = f32(linear * d.recurrent) + kv_bytes(in, 2 * int64_t{full} * N * d.kvd);
    const uint64_t row = f32(c * d.H), gate = f32(c * (d.qrows - d.qd));
    p.activations = pooled(in, {row, row, row, f32(c * d.half_rope), f32(c * d.half_rope)});
    if (linear > 0)
        p.activations +=
            pooled(in, {f32(c * d.cd), f32(c * d.cd), f32(c * d.vd), f32(c * d.Hv), f32(c * d.Hv),
                        f32(c * d.kd), f32(c * d.kd), f32(c * d.vd), f32(c * d.vd)});
    if (full > 0)
        p.activations += pooled(
            in, {f32(c * d.qrows), f32(c * d.kvd), f32(c * d.kvd), f32(c * d.qd), gate, f32(c * d.qd)});
    p.activations += pooled(in, {f32(c * d.I), f32(c * d.I)});
    // The head (model/head.cpp) on the device: its memory rows [N][W], normalised, and a chunk's rows.
    if (head) p.activations += pooled(in, {f32(N * W), f32(N * W), f32(c * d.H), f32(c * W)});
    return p;
}

MemoryPlan plan_memory(const ModelConfig& model, const HeadConfig* head, const ModelSources& sources,
                       const MemoryPlanInput& in) {
    MemoryPlan p;
    p.input = in;
    p.weights = plan_weights(model, head, sources, in);
    p.decision = plan_decision(model.text, head, p.weights, in);
    if (in.device) p.device = plan_device(model, head, sources, in, p.weights);
    return p;
}

uint64_t MemoryPlan::peak() const {
    return std::max(weights.total() + decision.peak, load_peak());
}

}  // namespace clef
