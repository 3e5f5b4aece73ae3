// The Qwen3.5 text backbone: embeddings, Gated DeltaNet and gated full-attention layers, SwiGLU MLPs, final
// zero-centred RMSNorm, on two paths over the same steps: the fast path (packed projections, vectorised
// kernels; the default) and the scalar reference path (the oracle it is tested against). Conventions follow
// Hugging Face (docs/ARCHITECTURE.md "The model", tests/data/tiny-clef/README.md "Model").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "io/weight_source.h"
#include "model/config.h"
#include "model/text_weights.h"
#include "ops/gemm.h"
#include "quant/quant.h"

namespace clef {

struct BackboneOptions {
    bool chunked_delta_rule = true;  // 64-token chunked (WY) delta rule; false = token-serial recurrence
    // true: the scalar reference ops (the oracle) over weights converted on the fly; false: the fast path.
    bool reference = false;
    // Activations of the fast path's projections: Exact (fp32-accurate, the default: bf16 activations break
    // the reference tolerances) or BF16 (faster, an opt-in; parity deltas in docs/PERFORMANCE.md).
    ops::Precision precision = ops::Precision::Exact;
    // Prefill chunk length (tokens per forward_chunk call in forward_embeddings); <= 0 = the whole prompt at
    // once. Activation memory is O(chunk); the full-attention K/V cache grows with the prompt.
    int64_t prefill_chunk = 512;
    // The chunk length used instead when the model streams block-quantised projections (GGUF, the default
    // residency): every chunk re-reads the weights, and longer chunks amortise that (docs/GGUF.md: streaming
    // costs 0-4 % with Exact activations at these lengths) for ~0.5 GB more activations on Clef-Flash.
    int64_t streamed_prefill_chunk = 2048;
    // The full-attention K/V cache stored as bf16 (half its memory; keys and values rounded to bf16, the rest
    // of the arithmetic unchanged). Off by default: measured deviation in docs/LONG_CONTEXT.md.
    bool kv_bf16 = false;
};

// "exact" / "bf16" / "int8" / "fp16" (the CLI spelling) -> Precision; false for anything else.
bool parse_precision(const std::string& s, ops::Precision& out);

// Wall-clock seconds per kind of work, accumulated over forward_chunk calls when a profile is passed.
struct BackboneProfile {
    // Waits for a device's queue at the end of each kind of work, so the times below are the work's own
    // (clef bench --profile); without it a GPU's work is timed as recorded and runs as one queue per chunk.
    bool sync = false;
    double embed = 0, norms = 0;               // embedding rows, RMSNorms + residual adds
    double gdn_proj = 0, gdn_conv_gates = 0;   // GDN in/out projections; conv, L2 norms, gates, gated norm
    double delta_rule = 0;                     // the gated delta rule
    double attn_proj = 0, attn_rope_norm = 0;  // attention q/k/v/o projections; q/k norms, RoPE, gate
    double attention = 0;                      // softmax(QK^T)V over the K/V cache
    double mlp_proj = 0, mlp_act = 0;          // gate/up/down projections; SiLU * up
};

// What a chunked prefill carries from one chunk to the next.
struct BackboneState {
    int64_t position = 0;  // tokens processed so far (text position of the next token)
    // The sequence length the length-dependent RoPE scalings decide on (ops::RopeParams::seq_len): the whole
    // prompt's, set by Backbone::Prefill; 0 = each forward_chunk's own.
    int64_t rope_seq_len = 0;
    struct Layer {
        std::vector<float> conv;   // GDN: the last K-1 conv inputs [K-1][conv_dim]
        std::vector<float> delta;  // GDN: the delta-rule state [Hv][dk][dv]
        // Attention: the K/V cache [position][kv_heads*head_dim] (K after norm + RoPE), as fp32 or, with
        // BackboneOptions::kv_bf16, as bf16 bits in kb / vb (the other pair stays empty).
        std::vector<float> k, v;
        std::vector<uint16_t> kb, vb;
        // Rows held, of kv_width values each, whichever pair holds them.
        int64_t kv_rows(int64_t kv_width) const {
            return static_cast<int64_t>(k.empty() ? kb.size() : k.size()) / kv_width;
        }
    };
    std::vector<Layer> layers;
    // On a device other than the CPU the state of its layers stays there from chunk to chunk
    // (model/backbone.cpp BackboneResident): the vectors above then hold what was last copied in or back,
    // and Backbone::to_host copies it back where the host needs it (the state cache's snapshots). A copy of a
    // state shares it.
    std::shared_ptr<struct BackboneResident> resident;
    // Rows the K/V caches on a device are made for (the whole prompt, set by Backbone::Prefill); a chunk past
    // them grows the caches through the host.
    int64_t kv_reserve = 0;
};

// Backbone FLOPs of a prefill of T tokens from the config (multiply-adds count 2): every projection and MLP
// (2 * in * out per token), causal attention scores and values (4 * heads * head_dim per query-key pair,
// T(T+1)/2 pairs), and the delta rule (7 * dk * dv per token and value head: decay, S^T k, update, S^T q).
double backbone_flops(const TextConfig& cfg, int64_t T);

// The rotary embedding of a config (theta, rotary dims, MRoPE sections, scaling). seq_len: the length the
// length-dependent scalings (dynamic, longrope) decide on, the whole prompt's (BackboneState::rope_seq_len),
// so every chunk of a prompt rotates with the same frequencies, as in transformers' one-pass forward; 0 =
// each chunk's own.
ops::RopeParams rope_params(const TextConfig& c, int64_t seq_len);

// Intermediate values of one forward pass, all row-major fp32 with T rows (T = tokens).
struct BackboneTrace {
    // Gated DeltaNet internals (names as in backbone_probe.json).
    struct Gdn {
        std::vector<float> conv_silu;   // [T][2*Hk*dk + Hv*dv], channels q | k | v, after conv + SiLU
        std::vector<float> q;           // [T][Hk][dk], L2-normalised and scaled by 1/sqrt(dk)
        std::vector<float> k;           // [T][Hk][dk], L2-normalised
        std::vector<float> v;           // [T][Hv][dv]
        std::vector<float> z;           // [T][Hv][dv], output gate before SiLU
        std::vector<float> beta;        // [T][Hv]
        std::vector<float> g;           // [T][Hv], log decay
        std::vector<float> delta_out;   // [T][Hv][dv], delta-rule output
        std::vector<float> gated_norm;  // [T][Hv*dv], w * rmsnorm(delta_out) * silu(z)
    };
    // Gated attention internals.
    struct Attention {
        std::vector<float> q_rope;  // [T][H*hd], after q_norm and RoPE
        std::vector<float> k_rope;  // [T][Hkv*hd], after k_norm and RoPE
        std::vector<float> v;       // [T][Hkv*hd]
        std::vector<float> gate;    // [T][H*hd], before the sigmoid
        std::vector<float> attn;    // [T][H*hd], softmax(QK^T/sqrt(hd))V before the gate
    };
    struct Layer {
        std::vector<float> input_norm;  // [T][hidden], the mixer input
        std::vector<float> mixer_out;   // [T][hidden], before the residual add
        std::vector<float> layer_out;   // [T][hidden], residual stream after the layer (MLP included)
        Gdn gdn;                        // filled for linear-attention layers when internals are recorded
        Attention attention;            // filled for full-attention layers when internals are recorded
    };

    // Inputs: which layers record their mixer internals (empty = none; the probe test asks for {0, 3}).
    std::vector<int> internals_for_layers;
    // Outputs: one entry per layer.
    std::vector<Layer> layers;
};

struct TensorSpec;  // model/tensors.h

class Backbone {
public:
    // Reads the text weights (model/tensors.h's table: prefix "model.language_model." or "model." detected)
    // from the weight source and validates the config and every tensor's shape against it (clef::Error naming
    // the tensor). The big matrices are not copied to fp32: the reference path reads them from the mapped
    // file (BF16 converted on the fly), the fast path packs them once at load. Small vectors (norms, conv
    // taps, decays) become fp32. The source's files must outlive the Backbone. Matrices the source serves as
    // QuantMatrix (a GGUF model's quantised projections and embedding table): a projection is packed from
    // rows dequantised straight to bf16 (bf16 size in memory, no fp32 copy of the matrix); embedding rows are
    // dequantised per token. quant_residency applies to the block-quantised projections (Q8_0, Q4_K, ...):
    // Streamed (the default) keeps them in the mapped file and dequantises each one per prefill chunk (memory
    // ~ the GGUF file), Packed unpacks them to bf16 once at load (faster, bf16-size memory).
    // The layers run on `device` (device/device.h): its matrices and vectors hold the weights, and each chunk
    // is one stream of its kernels. device_layers >= 0 puts only the first device_layers layers there and the
    // others on the CPU (a device too small for the whole model): a chunk then runs on both, the hidden
    // states going to the CPU once, between the two parts. int8: the projections on the CPU run in int8
    // (Precision::Int8: ops/int8_gemm.h) whatever a forward's precision, their weights quantised to int8
    // blocks at load (float tensors, or quantised ones held Packed) or per chunk from the file (Streamed).
    Backbone(const TextConfig& cfg, const WeightSource& weights,
             ops::Residency quant_residency = ops::Residency::Streamed, dev::Device& device = dev::cpu(),
             int device_layers = -1, bool int8 = false);
    ~Backbone();
    Backbone(const Backbone&) = delete;
    Backbone& operator=(const Backbone&) = delete;

    const TextConfig& config() const { return cfg_; }
    // The device of the last layer and the final norm: where a chunk's last_hidden_state rows are made.
    dev::Device& output_device() const { return device_of(cfg_.num_layers - 1); }
    // The layers on the constructor's device (the others run on the CPU).
    int device_layers() const { return device_layers_; }
    // The detected tensor-name prefix ("model.language_model." or "model.").
    const std::string& prefix() const { return prefix_; }
    // Bytes of packed projection weights held in memory (streamed projections hold none).
    size_t packed_weight_bytes() const;
    // Whether some projection streams its weights (see the constructor).
    bool streams_weights() const;
    // Tokens per prefill chunk for a T-token prompt: opt.prefill_chunk (or opt.streamed_prefill_chunk when
    // the weights are streamed); a value <= 0 means the whole prompt.
    int64_t chunk_length(const BackboneOptions& opt, int64_t T) const;

    // Embedding rows for ids, [ids.size()][hidden] (ids must be in [0, vocab_size), else clef::Error).
    std::vector<float> embed(const std::vector<int32_t>& ids) const;
    // The same into out [n][hidden], converting each row from the mapped table.
    void embed_into(const int32_t* ids, int64_t n, float* out) const;

    // Runs all layers + final norm on input embeddings x [T][hidden]; positions is [3][T] (t, h, w) or
    // nullptr for text positions 0..T-1 on all three axes. Returns last_hidden_state [T][hidden], row-major
    // fp32. Processes the prompt in chunks of opt.prefill_chunk tokens (one chunk when a trace is asked).
    std::vector<float> forward_embeddings(const std::vector<float>& x, int64_t T, const int32_t* positions,
                                          const BackboneOptions& opt = {},
                                          BackboneTrace* trace = nullptr) const;
    // A whole prompt of T tokens through the layers, from state.position on (0 for a fresh start(); a
    // restored state resumes a prompt prefix), chunk_length(opt, T) tokens at a time (one chunk when a trace
    // is asked) and never across a position in `stops` (ascending; where a caller snapshots the state). Each
    // chunk's inputs are the embedding rows of ids, or the rows of `embeddings` [T][hidden] when given (e.g.
    // with image features in place of pads); positions as in forward_chunk (stride T). Each chunk's
    // last_hidden_state rows go to sink(rows, n, first_token), after which `state` is at first_token + n; the
    // rows are not kept, so activation memory is O(chunk). Prefill below runs it chunk by chunk, for callers
    // that interleave prompts.
    using RowSink = std::function<void(const float* rows, int64_t n, int64_t first)>;
    // Where the rows may stay on the device: called with the chunk's stream and its last_hidden_state rows
    // there before the stream runs, to queue more work on them (the joint head's features); the RowSink then
    // gets rows = nullptr. Used only where the last layer runs on a device other than the CPU
    // (output_device()).
    using DeviceRowSink = std::function<void(dev::Stream& s, dev::Span rows, int64_t n, int64_t first)>;
    struct PrefillInput {
        int64_t T = 0;
        const int32_t* ids = nullptr;
        const float* embeddings = nullptr;
        const int32_t* positions = nullptr;
        std::vector<int64_t> stops;
    };
    void prefill(BackboneState& state, const PrefillInput& in, const BackboneOptions& opt,
                 const RowSink& sink, BackboneProfile* profile = nullptr,
                 BackboneTrace* trace = nullptr) const;
    // The same, one chunk per step(); the backbone, state, inputs and options must outlive it.
    class Prefill {
    public:
        Prefill(const Backbone& b, BackboneState& state, PrefillInput in, const BackboneOptions& opt,
                BackboneProfile* profile = nullptr, BackboneTrace* trace = nullptr);
        bool done() const { return state_.position >= in_.T; }
        void step(const RowSink& sink, const DeviceRowSink* on_device = nullptr);

    private:
        const Backbone& b_;
        BackboneState& state_;
        PrefillInput in_;
        const BackboneOptions& opt_;
        BackboneProfile* profile_;
        BackboneTrace* trace_;
        int64_t chunk_ = 0;
        size_t next_stop_ = 0;
        std::vector<float> buf_;
    };
    // embed + forward_embeddings with text positions.
    std::vector<float> forward(const std::vector<int32_t>& ids, const BackboneOptions& opt = {}) const;

    // Chunked prefill: a fresh state, then forward_chunk on consecutive chunks. Each call runs the next n
    // tokens (embeddings x [n][hidden]) and writes their last_hidden_state rows to out [n][hidden] (out may
    // alias x). positions: axis a of chunk token t at positions[a * positions_stride + t], or nullptr for
    // text positions state.position + t on all axes. With a trace, the trace holds this chunk only.
    BackboneState start() const;
    // The state of the layers on a device (BackboneState::resident) copied back into the state's vectors:
    // the conv and delta-rule state whole, the K/V rows from kv_from on (the rows before it keep what the
    // vectors held). Nothing to do for the CPU's layers, whose state is the vectors themselves.
    void to_host(BackboneState& state, int64_t kv_from) const;
    // With on_device (and the last layer on a device other than the CPU) the rows go to it (DeviceRowSink)
    // and out may be nullptr: then they stay on the device.
    void forward_chunk(BackboneState& state, const float* x, int64_t n, const int32_t* positions,
                       int64_t positions_stride, const BackboneOptions& opt, float* out,
                       BackboneTrace* trace = nullptr, BackboneProfile* profile = nullptr,
                       const DeviceRowSink* on_device = nullptr) const;

private:
    // The weights by role (model/tensors.h names them, model/text_weights.h holds them on the device).
    using GdnWeights = TextGdnWeights;
    using AttentionWeights = TextAttentionWeights;
    struct Layer : TextLayerWeights {
        LayerType type = LayerType::LinearAttention;
    };
    void load_tensor(const TensorSpec& s, const WeightSource& src, ops::Residency quant_residency, bool int8);
    struct Ctx;  // per-chunk stream, scratch and options (backbone.cpp)
    // One layer's state on the device that runs it, for a chunk: the conv and delta-rule state (GDN), or
    // the K/V cache with room for the chunk's rows after the p0 rows it holds (attention).
    struct LayerState {
        dev::Span conv, delta, k, v;
        int64_t p0 = 0;
        dev::Tensor hold[4];  // a CPU layer's state vectors wrapped for the chunk
    };
    LayerState layer_state(BackboneState& st, int l, int64_t T, Ctx& c) const;

    void gdn_mixer(const Layer& L, const LayerState& S, dev::Span xn, int64_t T, Ctx& c, dev::Span out,
                   BackboneTrace::Gdn* tr) const;
    void attention_mixer(const Layer& L, const LayerState& S, dev::Span xn, int64_t T, Ctx& c, dev::Span out,
                         BackboneTrace::Attention* tr) const;
    void mlp(const Layer& L, dev::Span xn, int64_t T, Ctx& c, dev::Span out) const;
    void run_layers(BackboneState& st, int l0, int l1, const dev::Tensor& h, const dev::Tensor& xn,
                    const dev::Tensor& mix, const int32_t* positions, int64_t positions_stride, int64_t T,
                    Ctx& c, BackboneTrace* trace) const;

    // The device of layer l (the final norm is the last layer's).
    dev::Device& device_of(int l) const { return l < device_layers_ ? device_ : dev::cpu(); }
    dev::Device& device_;
    int device_layers_ = 0;
    TextConfig cfg_;
    std::string prefix_;
    const unsigned char* embed_data_ = nullptr;  // [vocab][hidden] in the mapped file
    DType embed_dtype_ = DType::F32;
    std::unique_ptr<QuantMatrix> embed_quant_;  // the table when it comes from `quant` (rows read per token)
    dev::Tensor final_norm_;
    std::vector<std::unique_ptr<dev::Matrix>> linears_;
    std::vector<Layer> layers_;
};

}  // namespace clef
