// The memory plan: what a decision of N prompt tokens needs in memory, part by part, from the configs and
// from how each tensor is stored. Every formula follows the buffers the engine really allocates (each one's
// comment in memory_plan.cpp names the function that allocates it); README.md "Memory plan" shows how
// `clef info --tokens N` prints it. All sizes are bytes of resident memory.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "model/backbone.h"
#include "model/config.h"
#include "model/tensors.h"
#include "ops/gemm.h"

namespace clef {

// How one tensor is stored in the model's files.
struct StoredTensor {
    enum class Kind { F32, F16, BF16, F64, Blocks };  // Blocks: a block-quantised ggml type (Q4_K, Q8_0, ...)
    Kind kind = Kind::BF16;
    uint64_t bytes = 0;  // in the file
    bool gguf = false;   // in a GGUF file (model/gguf_model.cpp reads it)
    // int8 levels (quant/levels.h int8_level_type, Q8_0): Precision::Int8 packs them at load as they are
    // (device/linear.cpp), not streamed.
    bool int8_blocks = false;
    // Affine levels of this many bits (quant/levels.h affine_level_bits: 4 or 5), else 0: the int8 panel kind
    // Precision::Int8 packs them into (ops/int8_gemm.h int8_packed_bytes).
    int level_bits = 0;
};
// The stored form of a table entry (model/tensors.h), or nothing when the files do not hold it.
using StoredTensorFn = std::function<std::optional<StoredTensor>(const TensorSpec&)>;

// What a model's files hold, for the plan.
struct ModelSources {
    StoredTensorFn text;             // the text backbone's tensors, lm_head included
    StoredTensorFn vision;           // the vision tower's (empty: none is loaded)
    uint64_t head_source_bytes = 0;  // what loading the head maps or converts before the head is built
    uint64_t tokenizer_bytes = 0;    // the loaded tokenizer (the caller estimates it from its file)
    // The ids the tokenizer can produce (one past its largest; 0 = unknown): a prompt reads at most that many
    // distinct embedding rows, however long it is.
    int64_t tokenizer_ids = 0;
};

// The process without a model: the binary, its libraries (oneDNN, OpenMP), thread stacks. Measured: `clef
// tokenize` with tests/data/tiny-clef's 6 kB tokenizer peaks at 17 MB.
inline constexpr uint64_t kRuntimeBytes = uint64_t{16} << 20;

// What the plan assumes about the model's load and the request.
struct MemoryPlanInput {
    int64_t tokens = 0;           // N, the prompt's tokens
    int64_t schema_tokens = 512;  // tokens after the state (questions, options, suffix); at most N
    int64_t questions = 8;
    int64_t options = 32;           // options of all questions together
    int64_t option_tokens = 256;    // tokens of all option spans (the lm_head rows the head reads)
    bool unpack_quantised = false;  // LoadOptions::unpack_quantised (decision/engine.h)
    uint64_t cache_bytes = 0;       // the state cache's budget (0: off)
    int64_t cache_granularity = 256;
    BackboneOptions backbone;  // chunk lengths and precision
    // Backend of bf16 weights (ops::PackedLinear::auto_backend): the own kernels pack, oneDNN reads in place.
    bool onednn = false;
    ops::GemmKernel exact_kernel = ops::GemmKernel::F32;  // the oneDNN kernel of Precision::Exact
    // A Vulkan device's part (DevicePlan), when `device`: the backbone layers on it (-1: all of them, as
    // LoadOptions::gpu_layers).
    bool device = false;
    int device_layers = -1;
    uint64_t device_max_buffer = 0;  // its largest buffer (dev::DeviceMemory::max_buffer; 0: no limit)
};

// What the model holds on a Vulkan device (device/vk_device.cpp) and what a decision of N tokens adds there.
// The token embedding table and the lm_head rows stay in host memory.
struct DevicePlan {
    int layers = 0;            // backbone layers on the device (the others run on the CPU)
    uint64_t backbone = 0;     // their projections in the file's type, norms and other vectors as fp32
    uint64_t head = 0;         // the joint head: fp32 matrices, the k/v rows its memory attention reads
    uint64_t vision = 0;       // the vision tower, in its file's types (0: none)
    uint64_t state = 0;        // the device layers' recurrent states and K/V cache for N tokens
    uint64_t activations = 0;  // a chunk's buffers (each in the allocator's power-of-two size class) and
                               // the head's memory rows, at most
    uint64_t weights() const { return backbone + head + vision; }
    uint64_t total() const { return weights() + state + activations; }
};

// The weights as the engine holds them, independent of N except for the embedding rows.
struct WeightMemory {
    uint64_t mapped = 0;   // projections read from the file mapping on every chunk (streamed / in place)
    uint64_t packed = 0;   // projections packed in memory (bf16 / f16 / f32 panels, fp32 copies)
    uint64_t vectors = 0;  // norms, conv taps, decays as fp32 (and a GGUF source's fp32 copies)
    uint64_t embedding_rows = 0;  // embedding rows of N tokens and lm_head rows of the option tokens (mapped)
    uint64_t head = 0;            // the joint head: fp32 panels, k/v rows kept in fp32, norms
    uint64_t vision = 0;          // the vision tower, when the files hold one
    uint64_t tokenizer = 0;       // ModelSources::tokenizer_bytes
    uint64_t runtime = kRuntimeBytes;
    // More while loading: the head's source (mapped / converted) until the head is built.
    uint64_t load_transient = 0;
    // Some projection streams its weights (the longer prefill chunk applies); the largest streamed layer's
    // per-call buffers (one set per calling thread).
    bool streamed = false;
    uint64_t stream_buffer = 0;
    uint64_t total() const {
        return mapped + packed + vectors + embedding_rows + head + vision + tokenizer + runtime;
    }
};

// One decision's own memory at N tokens.
struct DecisionMemory {
    int64_t chunk = 0;           // tokens per prefill chunk (the longest chunk the prompt runs in)
    uint64_t kv_cache = 0;       // K and V rows of the full-attention layers, fp32
    uint64_t recurrent = 0;      // Gated DeltaNet conv taps and delta-rule states, fp32
    uint64_t chunk_buffers = 0;  // the chunk's input, residual stream, norms, mixer output, RoPE tables
    uint64_t layer_scratch = 0;  // the largest layer's own buffers (GDN, attention, MLP)
    uint64_t gemm_scratch = 0;   // per-thread GEMM buffers (streamed weights, bf16 activations)
    uint64_t head_features = 0;  // the head's memory rows [N][width], span sums, option rows
    uint64_t head_scratch = 0;   // the head's decide stage: normalised memory, attention scores, queries
    uint64_t state_cache = 0;    // the state cache's snapshots of this prompt (0 when off)
    uint64_t prompt = 0;         // token ids and their copies
    uint64_t heap_retained = 0;  // freed heap blocks kept by the allocator when the peak is reached
    uint64_t peak = 0;           // the largest resident total over the decision's phases (all of the above)
};

struct MemoryPlan {
    MemoryPlanInput input;
    WeightMemory weights;
    DecisionMemory decision;
    std::optional<DevicePlan> device;  // when input.device
    // While loading: the weights (no embedding rows yet) and the head's source until the head is built.
    uint64_t load_peak() const { return weights.total() - weights.embedding_rows + weights.load_transient; }
    // The process's peak: the weights plus the decision's peak, or the load's peak when that is larger.
    uint64_t peak() const;
};

// The weights as held after load: the text backbone (the table's tensors, lm_head included), the vision tower
// when the sources hold one, the joint head from its config (converted to fp32 whatever its file), the
// tokenizer and the runtime.
WeightMemory plan_weights(const ModelConfig& model, const HeadConfig* head, const ModelSources& sources,
                          const MemoryPlanInput& in);
// A decision's memory (head null: a backbone-only model, no head parts).
DecisionMemory plan_decision(const TextConfig& text, const HeadConfig* head, const WeightMemory& weights,
                             const MemoryPlanInput& in);
// weights: the host plan's (its streaming decides the prefill chunk where layers stay on the CPU).
DevicePlan plan_device(const ModelConfig& model, const HeadConfig* head, const ModelSources& sources,
                       const MemoryPlanInput& in, const WeightMemory& weights);
MemoryPlan plan_memory(const ModelConfig& model, const HeadConfig* head, const ModelSources& sources,
                       const MemoryPlanInput& in);

// Allocations of at least this many bytes are mapped and returned when freed; smaller ones come from the
// heap, which the clef binary never trims (util/memory.h keep_freed_memory).
inline constexpr uint64_t kHeapBlockLimit = uint64_t{32} << 20;

}  // namespace clef
