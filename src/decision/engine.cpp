#include "decision/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "decision/media.h"
#include "decision/response.h"
#include "decision/state_cache.h"
#include "device/vulkan.h"
#include "model/head.h"
#include "model/model_files.h"
#include "model/mrope.h"
#include "model/serve_plan.h"
#include "model/tensors.h"
#include "model/vision.h"
#include "ops/basic.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/memory.h"

namespace clef {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The image processor: a GGUF's from its mmproj, a directory's processor config, or Clef-Flash's.
ImageProcessorConfig image_processor_of(const ModelFiles& m, const VisionConfig& vc) {
    if (m.image_processor) return *m.image_processor;
    if (!m.processor_config_path.empty()) return load_image_processor_config(m.processor_config_path);
    return clef_flash_image_processor(vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size);
}

// The video processor: a directory's processor config's video block, or Clef-Flash's.
ImageProcessorConfig video_processor_of(const ModelFiles& m, const VisionConfig& vc) {
    std::optional<ImageProcessorConfig> c;
    if (!m.processor_config_path.empty()) c = load_video_processor_config(m.processor_config_path);
    return c ? *c : clef_flash_video_processor(vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size);
}

// Whether a layer built from the source may read its storage in place (BF16 tensors, model/linear.h).
bool has_bf16(const WeightSource& w) {
    for (const std::string& n : w.names())
        if (const TensorView* t = w.find(n); t && t->dtype == DType::BF16) return true;
    return false;
}
}  // namespace

Engine::~Engine() = default;

uint64_t default_state_cache_bytes() {
    return std::min<uint64_t>(memory_available_bytes() / 4, uint64_t{8} << 30);
}

void Engine::set_state_cache(uint64_t budget_bytes, int64_t granularity) {
    // A RoPE scaling that depends on the prompt's length (dynamic, longrope: docs/LONG_CONTEXT.md) rotates a
    // prefix differently in prompts of different lengths, so a cached prefix could not be resumed: no cache
    // for them.
    const ops::RopeType rope = config_.text.rope_scaling.type;
    if (rope == ops::RopeType::Dynamic || rope == ops::RopeType::LongRope) budget_bytes = 0;
    cache_ = budget_bytes > 0 ? std::make_unique<StateCache>(budget_bytes, granularity) : nullptr;
}

StateCacheStats Engine::state_cache_stats() const {
    return cache_ ? cache_->stats() : StateCacheStats{};
}

std::unique_ptr<Engine> Engine::load(const std::string& model_path, const std::string& head_dir,
                                     const LoadOptions& options) {
    ops::set_gemm_plan(ops::default_gemm_plan(options.precision));
    ModelFiles m = open_model_files(model_path, head_dir, options.mmproj);
    std::unique_ptr<Engine> e(new Engine());
    e->config_ = m.config;
    e->head_config_ = m.head_config;
    e->tokenizer_ = std::make_unique<Tokenizer>(m.tokenizer_in_gguf ? Tokenizer::from_gguf(m.tokenizer_path)
                                                                    : Tokenizer::load(m.tokenizer_path));
    e->model_path_ = model_path, e->head_dir_ = head_dir, e->options_ = options;
    e->open_device(options.device);
    e->fit_device();
    const WeightSource& vision_weights = e->build_parts(m);
    if (e->config_.vision && VisionTower::in_checkpoint(vision_weights)) e->load_vision(m, vision_weights);
    // The tower holds packed copies of an mmproj's other tensors (fp32 ones dequantised from Q8_0 included).
    if (e->vision_weights_ && !has_bf16(*e->vision_weights_)) e->vision_weights_.reset();
    e->set_state_cache(options.cache_bytes, options.cache_granularity);
    return e;
}

const WeightSource& Engine::build_parts(ModelFiles& m) const {
    dev::Device& device = *device_;
    weights_ = std::move(m.weights);
    backbone_ = std::make_unique<Backbone>(
        config_.text, *weights_,
        options_.unpack_quantised ? ops::Residency::Packed : ops::Residency::Streamed, device,
        options_.gpu_layers, options_.precision == ops::Precision::Int8);
    // The head converts its tensors to fp32 and packs them: its source is released once the head is built.
    const std::unique_ptr<WeightSource> head = std::move(m.head);
    const std::string lm_head = text_tensor(config_.text, TextWeight::LmHead).hf;
    std::string lexical = lm_head;
    if (!weights_->has(lexical) && config_.text.tie_word_embeddings)
        lexical = text_name(text_tensor(config_.text, TextWeight::Embed), backbone_->prefix());
    if (const QuantMatrix* q = weights_->find_matrix(lexical))
        head_ = std::make_unique<JointHead>(head_config_, *head, *q, false, device);
    else if (const TensorView* t = weights_->find(lexical))
        head_ = std::make_unique<JointHead>(head_config_, *head, *t, false, device);
    else
        throw Error(weights_->description() + ": missing tensor " + lm_head + " (the head's lexical table)");
    vision_weights_ = std::move(m.vision);
    return vision_weights_ ? *vision_weights_ : *weights_;
}

bool Engine::fall_back_to_cpu(const std::string& why) const {
    std::lock_guard<std::mutex> lk(fallback_mu_);
    if (device_.load()->is_cpu()) return false;
    std::fprintf(stderr, "clef: %s: running on the CPU from now on\n", why.c_str());
    // Decisions in flight may still hold the old parts: they are kept (with the device) until the engine
    // goes, and those decisions fail at their next step on the device and start over.
    retired_.push_back({std::move(own_device_), std::move(weights_), std::move(vision_weights_),
                        std::move(backbone_), std::move(head_), std::move(vision_)});
    device_ = &dev::cpu();
    ModelFiles m = open_model_files(model_path_, head_dir_, options_.mmproj);
    const WeightSource& vision_weights = build_parts(m);
    if (config_.vision && VisionTower::in_checkpoint(vision_weights)) vision_ = make_vision(vision_weights);
    if (vision_weights_ && !has_bf16(*vision_weights_)) vision_weights_.reset();
    return true;
}

Decision Engine::run(const Prepared& p, const DecideOptions& opt, bool keep_hidden) const {
    for (;;) {
        try {
            std::unique_ptr<DecisionTask> t = start(p, opt, keep_hidden);
            while (!t->done()) t->step();
            return t->take();
        } catch (const dev::DeviceError& e) {
            // A lost device or a kernel its driver would not build: the decision starts over on the CPU.
            if (e.kind() == dev::DeviceError::Kind::OutOfMemory || !fall_back_to_cpu(e.what())) throw;
        }
    }
}

void Engine::load_vision(const ModelFiles& m, const WeightSource& weights) {
    const VisionConfig& vc = *config_.vision;
    image_processor_ = image_processor_of(m, vc);
    video_processor_ = video_processor_of(m, vc);
    const std::string& processor_config_path = m.processor_config_path;
    for (const ImageProcessorConfig* ip : {&image_processor_, &video_processor_})
        if (ip->patch_size != vc.patch_size || ip->merge_size != vc.spatial_merge_size ||
            ip->temporal_patch_size != vc.temporal_patch_size || vc.in_channels != 3)
            throw Error(
                (processor_config_path.empty() ? std::string("image processor") : processor_config_path) +
                ": patch_size / merge_size / temporal_patch_size do not match config.json's vision_config");
    image_token_id_ =
        config_.image_token_id >= 0 ? config_.image_token_id : tokenizer_->token_to_id("<|image_pad|>");
    for (const char* t : {"<|vision_start|>", "<|image_pad|>", "<|vision_end|>"})
        if (tokenizer_->token_to_id(t) < 0)
            throw Error(std::string("the tokenizer has no ") + t + " token, which images need");
    if (tokenizer_->token_to_id("<|image_pad|>") != image_token_id_)
        throw Error("config.json image_token_id " + std::to_string(image_token_id_) +
                    " is not the tokenizer's <|image_pad|>");
    video_token_id_ = tokenizer_->token_to_id("<|video_pad|>");  // -1: videos are refused
    vision_ = make_vision(weights);
}

std::unique_ptr<VisionTower> Engine::make_vision(const WeightSource& weights) const {
    return std::make_unique<VisionTower>(*config_.vision, weights, kVisionPrefix, false, *device_);
}

uint64_t gpu_memory_budget(const LoadOptions& o, const dev::Device& d) {
    return o.gpu_memory > 0 ? o.gpu_memory : d.memory().total / 10 * 9;
}

void Engine::fit_device() {
    if (device_.load()->is_cpu() || options_.gpu_layers >= 0) return;
    const uint64_t budget = gpu_memory_budget(options_, *device_.load());
    if (budget == 0) return;
    // The plan reads the model's files (a GGUF's mmproj tower is not in it: it goes on the device beside).
    MemoryPlanInput in = machine_plan_input(options_.plan_tokens);
    in.device = true;
    in.unpack_quantised = options_.unpack_quantised;
    const int layers = config_.text.num_layers;
    MemoryPlanner planner;
    for (int n = layers; n >= 0; --n) {
        in.device_layers = n;
        uint64_t need = 0;
        try {
            if (!planner) planner = memory_planner(model_path_, head_dir_);
            need = planner(in).device->total();
        } catch (const Error&) {
            return;  // files the plan cannot read (the load will say what is wrong): all layers
        }
        if (need > budget) continue;
        options_.gpu_layers = n;
        if (n < layers)
            std::fprintf(stderr,
                         "clef: %d of %d layers on %s: the whole model needs more than %.0f MiB there\n", n,
                         layers, device_.load()->name().c_str(), static_cast<double>(budget) / (1 << 20));
        return;
    }
    std::fprintf(stderr,
                 "clef: %s: %.0f MiB of device memory do not hold the joint head: running on the CPU\n",
                 device_.load()->name().c_str(), static_cast<double>(budget) / (1 << 20));
    own_device_.reset();
    device_ = &dev::cpu();
}

void Engine::open_device(const std::string& spec) {
    dev::OpenedDevice d = dev::open_device(spec);
    own_device_ = std::move(d.device);
    device_ = own_device_ ? own_device_.get() : &dev::cpu();
    if (d.reason.empty()) return;
    // auto on a machine with no GPU is the usual case: quiet (clef devices says why). A Vulkan device asked
    // for and not had: one line on stderr (stdout carries the commands' JSON).
    if (spec != "auto")
        std::fprintf(stderr, "clef: --device %s: running on the CPU: %s\n", spec.c_str(), d.reason.c_str());
}

Engine::Prepared Engine::prepare(DecisionRequest req, const DecideOptions& opt) const {
    Prepared p;
    PromptOptions popt;
    popt.max_length = opt.max_length;
    popt.keep_segments = opt.keep_segments;
    MediaBlock media;
    const bool has_media = !req.decoded_images.empty() || !req.decoded_videos.empty();
    if (has_media) {
        const char* kind = req.decoded_images.empty() ? "videos" : "images";
        if (!vision_)
            throw ImageError(std::string(kind) + " are not supported: this model has no vision tower");
        if (!req.decoded_videos.empty() && video_token_id_ < 0)
            throw ImageError("videos are not supported: the tokenizer has no <|video_pad|> token");
        p.images = process_images(req.decoded_images, image_processor_);
        p.videos = process_videos(req.decoded_videos, video_processor_);
        media = build_media_block(*tokenizer_, p.images, p.videos);
        popt.media = &media;
    }
    p.prompt = encode_prompt(*tokenizer_, req, popt);
    if (has_media) {
        MediaLayout l =
            lay_out_media(p.prompt, media, {image_token_id_, video_token_id_}, p.images, p.videos);
        p.mm_token_type_ids = std::move(l.mm_token_type_ids);
        p.position_ids = std::move(l.position_ids);
        p.rope_delta = l.rope_delta;
        p.media_key = media_cache_key(p.images, p.videos);
        req.decoded_images = {};  // the resized images and frames are all run() needs
        req.decoded_videos = {};
    }
    p.request = std::move(req);
    return p;
}

Decision Engine::decide(const DecisionRequest& req, const DecideOptions& opt, bool keep_hidden) const {
    return run(prepare(req, opt), opt, keep_hidden);
}

std::vector<float> Engine::image_embeddings(const Prepared& p) const {
    const MediaFeatures features =
        vision_features(*vision_, p.images, image_processor_, p.videos, video_processor_);
    std::vector<float> x = backbone_->embed(p.prompt.input_ids);
    substitute_media_embeddings(x, backbone_->config().hidden_size, p.mm_token_type_ids, features);
    return x;
}

// One decision's working state (DecisionTask): the prompt's head questions, the feature builder, the backbone
// state (resumed from the state cache where it can) and the prefill cursor.
struct DecisionTask::State {
    const Engine& e;
    const Engine::Prepared& p;
    DecideOptions opt;
    bool keep_hidden;
    Clock::time_point t_start;
    Decision d;
    std::vector<HeadQuestion> hq;
    std::unique_ptr<HeadFeatureBuilder> builder;
    StateCache* cache = nullptr;
    StateCache::Plan plan;
    StateCache::Resume resume;  // .state is the backbone state the prefill carries
    size_t next_stop = 0;
    std::vector<float> x_all;  // [T][hidden], only while image pads remain to be run
    std::unique_ptr<Backbone::Prefill> prefill;
    // Where the backbone's last layer and the head share a device other than the CPU, each chunk's rows stay
    // there and go to the head's features in the chunk's own stream (Backbone::DeviceRowSink).
    Backbone::DeviceRowSink on_device;
    double backbone_s = 0, sink_s = 0;
    bool finished = false;

    State(const Engine& engine, const Engine::Prepared& prepared, const DecideOptions& o, bool keep)
        : e(engine), p(prepared), opt(o), keep_hidden(keep), t_start(Clock::now()) {}
    void begin();
    void sink(const float* rows, int64_t n, int64_t t0);
    void finish();
};

std::unique_ptr<DecisionTask> Engine::start(const Prepared& p, const DecideOptions& opt,
                                            bool keep_hidden) const {
    if (opt.threads > 0) ops::set_num_threads(opt.threads);
    auto t = std::unique_ptr<DecisionTask>(new DecisionTask());
    t->s_ = std::make_unique<DecisionTask::State>(*this, p, opt, keep_hidden);
    t->s_->begin();
    return t;
}

DecisionTask::~DecisionTask() = default;

bool DecisionTask::done() const {
    return s_->finished;
}

// The next prefill chunk (model/backbone.h), or, after the last one, the head and the answers.
void DecisionTask::step() {
    State& s = *s_;
    if (s.finished) return;
    if (!s.prefill->done()) {
        const auto tb = Clock::now();
        s.prefill->step([&s](const float* rows, int64_t n, int64_t t0) { s.sink(rows, n, t0); },
                        s.on_device ? &s.on_device : nullptr);
        s.backbone_s += seconds_since(tb);
        if (!s.prefill->done()) return;
    }
    s.finish();
}

Decision DecisionTask::take() {
    if (!s_->finished) throw Error("decision task: taken before it finished");
    return std::move(s_->d);
}

// The prompt's questions for the head, the state cache's plan and resumed prefix, and the image rows when
// pads remain to be run.
void DecisionTask::State::begin() {
    d.prompt = p.prompt;
    const auto& ids = d.prompt.input_ids;
    const int64_t T = static_cast<int64_t>(ids.size());
    for (const auto& q : d.prompt.questions)
        hq.push_back({static_cast<int>(q.type), q.span.first, q.span.second, q.option_spans});
    const int64_t H = e.backbone_->config().hidden_size, W = e.head_->config().width;
    builder = std::make_unique<HeadFeatureBuilder>(*e.head_, T, ids, hq);
    cache = keep_hidden ? nullptr : e.cache_.get();
    if (cache) {
        plan = cache->plan(ids, p.media_key, p.prompt.state_end);
        resume = cache->find(plan, ids, e.backbone_->start(), W);
        builder->restore_memory(resume.memory.data(), resume.position);
        resume.memory = {};
    } else {
        resume.state = e.backbone_->start();
    }
    next_stop = resume.stops_done;
    d.tokens_reused = resume.position;
    if (std::find_if(
            p.mm_token_type_ids.begin() + std::min<int64_t>(resume.position, p.mm_token_type_ids.size()),
            p.mm_token_type_ids.end(), [](int32_t k) { return k != 0; }) != p.mm_token_type_ids.end()) {
        const auto tv = Clock::now();
        x_all = e.image_embeddings(p);
        if (opt.profile) opt.profile->vision += seconds_since(tv);
    }
    if (keep_hidden) d.last_hidden_state.resize(static_cast<size_t>(T * H));
    Backbone::PrefillInput in;
    in.T = T;
    in.ids = ids.data();
    in.embeddings = x_all.empty() ? nullptr : x_all.data();
    in.positions = p.position_ids.empty() ? nullptr : p.position_ids.data();
    in.stops.assign(plan.stops.begin() + static_cast<std::ptrdiff_t>(next_stop), plan.stops.end());
    prefill = std::make_unique<Backbone::Prefill>(*e.backbone_, resume.state, std::move(in), opt.backbone,
                                                  opt.profile ? &opt.profile->backbone : nullptr);
    dev::Device& out = e.backbone_->output_device();
    if (!keep_hidden && !out.is_cpu() && &e.head_->device() == &out)
        on_device = [this](dev::Stream& s, dev::Span rows, int64_t n, int64_t) {
            builder->add_device_rows(s, rows, n);
        };
}

// A chunk's last hidden states: to the head's features, and to the state cache at a stop.
void DecisionTask::State::sink(const float* rows, int64_t n, int64_t t0) {
    const auto th = Clock::now();
    if (rows) builder->add_rows(rows, n);  // else on_device queued them
    const int64_t H = e.backbone_->config().hidden_size;
    if (keep_hidden) std::copy_n(rows, n * H, d.last_hidden_state.data() + t0 * H);
    if (cache && next_stop < plan.stops.size() && plan.stops[next_stop] == t0 + n) {
        const int64_t begin = next_stop ? plan.stops[next_stop - 1] : 0;
        e.backbone_->to_host(resume.state,
                             begin);  // a device's state back for the snapshot: the stretch's rows
        cache->put(plan, next_stop++, d.prompt.input_ids, resume.state, builder->memory_rows(begin),
                   e.head_->config().width);
    }
    sink_s += seconds_since(th);
}

void DecisionTask::State::finish() {
    prefill.reset();
    x_all = {};
    resume.state = {};
    DecisionProfile* prof = opt.profile;
    if (prof) {
        prof->backbone_total += backbone_s - sink_s;
        prof->head_features += sink_s;
    }
    const auto tf = Clock::now();
    HeadFeatures features = builder->finish();
    builder.reset();
    if (prof) prof->head_features += seconds_since(tf);
    const auto td = Clock::now();
    d.logits = e.head_->decide(features, hq);
    if (prof) prof->head_decide += seconds_since(td);
    for (size_t i = 0; i < d.logits.size(); ++i)
        d.probabilities.push_back(
            answer_probabilities(d.logits[i], p.request.questions[i].type, opt.answers));
    d.response = decision_response(p.request, d.prompt, d.logits, d.probabilities, opt.answers, opt.debug);
    if (prof) prof->total += seconds_since(t_start);
    finished = true;
}

}  // namespace clef
