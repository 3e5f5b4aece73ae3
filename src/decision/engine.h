// The decision engine: owns a loaded model (tokenizer, backbone, joint head) and answers validated requests.
// One prefill over the whole prompt, then the head, then the answers. Thread-compatible: decide() is const
// and keeps its scratch memory per call, but callers run one decision at a time (the server's worker does).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "decision/answer.h"
#include "decision/prompt.h"
#include "decision/request.h"
#include "decision/state_cache.h"
#include "image/preprocess.h"
#include "model/backbone.h"
#include "model/config.h"
#include "util/json.h"

namespace clef {

class Tokenizer;
class JointHead;
class WeightSource;
class SafetensorsFile;
class VisionTower;
struct ModelFiles;

// Wall-clock seconds of the parts of run(), accumulated over calls.
struct DecisionProfile {
    BackboneProfile backbone;   // per kind of backbone work
    double backbone_total = 0;  // embedding + every forward_chunk
    double vision = 0;          // vision tower (requests with images)
    double head_features = 0;   // HeadFeatureBuilder::add_rows + finish
    double head_decide = 0;     // JointHead::decide
    double total = 0;           // the whole run()
};

struct DecideOptions {
    int max_length = 16384;
    bool debug = false;  // add the "debug" object to the response
    AnswerOptions answers;
    // Backbone path and precision (reference oracle or fast path, Exact or BF16 activations) and the prefill
    // chunk length: the prompt runs through the backbone chunk by chunk and each chunk's last hidden states
    // go straight to the head's feature builder, so activation memory is O(chunk).
    BackboneOptions backbone;
    int threads = 0;             // OpenMP threads for the kernels (ops::set_num_threads); 0 = leave as is
    bool keep_segments = false;  // fill the prompt's segments (debugging and tests)
    DecisionProfile* profile = nullptr;  // when set, run() adds its timings (bench, profiling)
};

struct Decision {
    JsonValue response;  // {model, answers, usage} (+ debug)
    EncodedPrompt prompt;
    std::vector<std::vector<float>> logits;         // per question, encoded option order
    std::vector<std::vector<float>> probabilities;  // float32 softmax of logits
    std::vector<float> last_hidden_state;           // [T][hidden], kept only when asked (tests)
    int64_t tokens_reused = 0;                      // prompt tokens resumed from the state cache
};

// Load-time choices.
struct LoadOptions {
    // GGUF block-quantised projections (Q8_0, Q4_K, ...): false (the default) keeps them in the mapped file
    // and dequantises each one per prefill chunk, so the model takes about its file size in memory; true
    // unpacks them to bf16 once at load (prefill 0-7 % faster as measured in docs/GGUF.md, bf16-size
    // memory: ~17 GB for Clef-Flash whatever the file's type).
    bool unpack_quantised = false;
    // The precision decisions will mostly run in: it fixes the projections' weight layout for this CPU
    // (ops::default_gemm_plan; the process's GEMM plan is set at load). Exact and BF16 both still run; Int8
    // quantises the backbone's projections (on the CPU) to int8 blocks, which then run in int8 whatever a
    // decision asks (ops/int8_gemm.h).
    ops::Precision precision = ops::Precision::Exact;
    // The state cache's budget in bytes (0: off) and the tokens between its snapshots inside a state.
    uint64_t cache_bytes = 0;
    int64_t cache_granularity = 256;
    // A GGUF model's vision tower: llama.cpp's mmproj file (model/gguf_mmproj.h); "" for none.
    std::string mmproj;
    // Where the model runs: cpu, auto, vulkan or vulkan:N (device/vulkan.h choose_device). Where the spec
    // cannot be met (no Vulkan loader or device, a device that does not open) the CPU runs: auto quietly, an
    // explicit vulkan spec with one line on stderr saying why (Engine::open_device). A program that does not
    // choose (the tests, the benches) runs on the CPU, whose results it compares with; every command a person
    // runs passes its --device, whose default is the CLI's (cli/commands.h kDefaultDevice).
    std::string device = "cpu";
    // With a Vulkan device: how many backbone layers go on it (the first ones; the others run on the CPU in
    // the same decision); -1: as many as the device memory plan (model/memory_plan.h plan_device) fits in
    // gpu_memory bytes for a decision of plan_tokens tokens (0: the device's device-local memory less 10 %).
    int gpu_layers = -1;
    uint64_t gpu_memory = 0;
    int64_t plan_tokens = 4096;
};

// The memory a model loaded with `o` may take on device `d` (not the CPU): o.gpu_memory, else the device's
// device-local memory less 10 %; 0 (no bound) where neither is known (a device that reports no device-local
// heap).
uint64_t gpu_memory_budget(const LoadOptions& o, const dev::Device& d);

// A state-cache budget sized from this machine's available memory (a quarter of it, at most 8 GiB).
uint64_t default_state_cache_bytes();

class Engine;

// One decision in steps (Engine::start): step() runs the next prefill chunk or, after the last one, the head
// and the answers. `clef serve` interleaves the steps of the decisions in flight, so a short request does not
// wait for a long prefill. The engine and the Prepared request must outlive the task.
class DecisionTask {
public:
    ~DecisionTask();
    bool done() const;
    void step();
    // The decision, once done().
    Decision take();

    struct State;  // engine.cpp

private:
    friend class Engine;
    DecisionTask() = default;
    std::unique_ptr<State> s_;
};

class Engine {
public:
    // Loads a model directory in the publisher layout (config.json, safetensors weights, tokenizer.json,
    // joint_head_config.json, joint_head.safetensors). Throws clef::Error naming what is missing or
    // malformed. A .gguf path loads a GGUF model (clef, or qwen35 with the head from head_dir or beside the
    // file; its vision tower from options.mmproj).
    static std::unique_ptr<Engine> load(const std::string& model_dir, const std::string& head_dir = "",
                                        const LoadOptions& options = {});
    ~Engine();

    const Tokenizer& tokenizer() const { return *tokenizer_; }
    const ModelConfig& config() const { return config_; }
    const Backbone& backbone() const { return *backbone_; }
    const JointHead& head() const { return *head_; }
    // The vision tower, or nullptr when the model has none (then requests with images are refused).
    const VisionTower* vision() const { return vision_.get(); }
    const ImageProcessorConfig& image_processor() const { return image_processor_; }
    const ImageProcessorConfig& video_processor() const { return video_processor_; }
    // The device the model's layers run on ("cpu" or the Vulkan device's name).
    const dev::Device& device() const { return *device_.load(); }
    // After the device failed for good (a dev::DeviceError of kind Lost or Kernel: `why`): builds the layers
    // again on the CPU from the model's files and runs every later decision there (one line on stderr). The
    // old layers and the device stay until the engine goes: decisions in flight may hold them (their next
    // step fails, and they start over). run() and decide() do this themselves and start the decision over; a
    // caller of start() / step() catches the error and calls it. False when already on the CPU.
    bool fall_back_to_cpu(const std::string& why) const;

    // Encodes and runs one request: run(prepare(...)). Throws PromptTooLong when the schema does not fit
    // max_length, dev::DeviceError when the device is out of memory for it, clef::Error for other failures
    // (e.g. non-finite model output).
    Decision decide(const DecisionRequest& req, const DecideOptions& opt = {},
                    bool keep_hidden = false) const;

    // The two halves of decide(): prepare() validates against the model and encodes the prompt (cheap; the
    // server runs it on its HTTP threads), run() does the prefill, the head and the answers (the worker).
    // With images, prepare() also resizes them; it throws clef::ImageError (a client error: 400 in the
    // server) for an image size the processor refuses and for a literal <|image_pad|> in the text
    // (ImageTokenMismatch).
    struct Prepared {
        DecisionRequest request;
        EncodedPrompt prompt;
        std::vector<ProcessedImage> images;      // resized, in request order (empty without images)
        std::vector<ProcessedVideo> videos;      // resized, in request order (empty without videos)
        std::vector<int32_t>
            mm_token_type_ids;              // [T], 1 on image pads, 2 on video pads (empty without media)
        std::vector<int32_t> position_ids;  // [3][T] MRoPE (t, h, w) (empty without media: 0..T-1)
        int rope_delta = 0;
        uint64_t media_key = 0;  // the media's key in the state cache (0 without media)
    };
    Prepared prepare(DecisionRequest req, const DecideOptions& opt = {}) const;
    Decision run(const Prepared& p, const DecideOptions& opt = {}, bool keep_hidden = false) const;
    // run() in steps (DecisionTask); the first part (state cache lookup, image rows) runs here.
    std::unique_ptr<DecisionTask> start(const Prepared& p, const DecideOptions& opt = {},
                                        bool keep_hidden = false) const;

    // The state cache (decision/state_cache.h): prompt prefixes up to the end of the state, resumed by later
    // decisions; at most budget_bytes (0 turns it off, the default). granularity: tokens between snapshots
    // inside a state. Set it before decisions run.
    void set_state_cache(uint64_t budget_bytes, int64_t granularity = 256);
    StateCacheStats state_cache_stats() const;

private:
    friend struct DecisionTask::State;
    Engine() = default;
    void load_vision(const ModelFiles& m, const WeightSource& weights);
    std::unique_ptr<VisionTower> make_vision(const WeightSource& weights) const;
    void open_device(const std::string& spec);
    // With a Vulkan device and gpu_layers -1: the layers its memory plan fits (LoadOptions), or the CPU.
    void fit_device();
    // The weights, backbone and head on device_ from the model's files; returns the vision tower's weights.
    const WeightSource& build_parts(ModelFiles& m) const;
    // [T][hidden]: the prompt's embeddings with the vision tower's rows in place of the image and video pads.
    std::vector<float> image_embeddings(const Prepared& p) const;
    ModelConfig config_;
    HeadConfig head_config_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::string model_path_, head_dir_;  // what load() read, again by fall_back_to_cpu()
    LoadOptions options_;
    // The device and the model's layers on it: mutable, since fall_back_to_cpu() replaces them under
    // decisions (const) that found the device failed.
    mutable std::unique_ptr<dev::Device> own_device_;    // a Vulkan device (outlives the parts below)
    mutable std::atomic<dev::Device*> device_{nullptr};  // it, or the CPU
    mutable std::unique_ptr<WeightSource> weights_;
    mutable std::unique_ptr<WeightSource>
        vision_weights_;  // a GGUF's mmproj tensors (the tower reads BF16 in place)
    mutable std::unique_ptr<Backbone> backbone_;
    mutable std::unique_ptr<JointHead> head_;
    mutable std::unique_ptr<VisionTower> vision_;
    struct Retired {  // layers on a failed device, in the order they were declared above
        std::unique_ptr<dev::Device> device;
        std::unique_ptr<WeightSource> weights, vision_weights;
        std::unique_ptr<Backbone> backbone;
        std::unique_ptr<JointHead> head;
        std::unique_ptr<VisionTower> vision;
    };
    mutable std::vector<Retired> retired_;
    mutable std::mutex fallback_mu_;
    std::unique_ptr<StateCache> cache_;
    ImageProcessorConfig image_processor_;
    ImageProcessorConfig video_processor_;
    int32_t image_token_id_ = -1;
    int32_t video_token_id_ = -1;
};

}  // namespace clef
