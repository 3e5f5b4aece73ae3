#include "decision/engine.h"

#include <algorithm>
#include <chrono>

#include "decision/media.h"
#include "io/model_dir.h"
#include "io/safetensors.h"
#include "model/gguf_model.h"
#include "model/head.h"
#include "model/vision.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace clef {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const std::string& model_dir, const std::string& head_dir,
                                     const LoadOptions& options) {
    ops::set_gemm_plan(ops::default_gemm_plan(options.precision));
    if (is_gguf_file(model_dir)) {
        GgufModel g = load_gguf_model(model_dir, head_dir);
        if (!g.head)
            throw Error(model_dir + ": a " + g.arch + " GGUF without a joint head (give --head DIR)");
        std::unique_ptr<Engine> e(new Engine());
        e->config_ = g.config;
        e->head_config_ = *g.head_config;
        e->tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_dir));
        e->weights_ = std::move(g.weights);
        // The backbone and head keep copies of the quantised matrices they use (which keep the file mapped).
        e->backbone_ = std::make_unique<Backbone>(
            e->config_.text, *e->weights_, &g.matrices,
            options.unpack_quantised ? ops::Residency::Packed : ops::Residency::Streamed);
        // The head converts its tensors to fp32 and packs them: its file (for a GGUF, a temporary fp32 file)
        // is released once the head is built.
        const std::unique_ptr<SafetensorsFile> head_file = std::move(g.head);
        const std::string prefix = e->backbone_->prefix();
        for (const std::string& name : {std::string("lm_head.weight"), prefix + "embed_tokens.weight"}) {
            if (auto it = g.matrices.find(name); it != g.matrices.end()) {
                e->head_ = std::make_unique<JointHead>(e->head_config_, *head_file, it->second);
                break;
            }
            if (const TensorView* t = e->weights_->find(name)) {
                e->head_ = std::make_unique<JointHead>(e->head_config_, *head_file, *t);
                break;
            }
        }
        if (!e->head_) throw Error(model_dir + ": missing output.weight / token_embd.weight");
        return e;
    }
    ModelDir dir = locate_model_dir(model_dir);
    if (!dir.has_head())
        throw Error(model_dir +
                    ": no joint_head.safetensors / joint_head_config.json: a backbone alone cannot "
                    "answer decisions");
    std::unique_ptr<Engine> e(new Engine());
    e->config_ = load_model_config(dir.config_path);
    e->head_config_ = load_head_config(dir.head_config_path);
    if (e->head_config_.hidden_size != e->config_.text.hidden_size)
        throw Error(dir.head_config_path + ": hidden_size " + std::to_string(e->head_config_.hidden_size) +
                    " does not match the backbone's " + std::to_string(e->config_.text.hidden_size));
    e->tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(dir.tokenizer_path));
    e->weights_ = std::make_unique<Checkpoint>(Checkpoint::open(dir.weights_path));
    e->backbone_ = std::make_unique<Backbone>(e->config_.text, *e->weights_);
    const SafetensorsFile head_file =
        SafetensorsFile::open(dir.head_weights_path);  // released once the head is built
    const TensorView* lm_head = e->weights_->find("lm_head.weight");
    if (!lm_head && e->config_.text.tie_word_embeddings)
        lm_head = e->weights_->find(e->backbone_->prefix() + "embed_tokens.weight");
    if (!lm_head)
        throw Error(e->weights_->description() +
                    ": missing tensor lm_head.weight (the head's lexical table)");
    e->head_ = std::make_unique<JointHead>(e->head_config_, head_file, *lm_head);
    if (e->config_.vision && VisionTower::in_checkpoint(*e->weights_))
        e->load_vision(dir.processor_config_path);
    return e;
}

void Engine::load_vision(const std::string& processor_config_path) {
    const VisionConfig& vc = *config_.vision;
    if (!processor_config_path.empty()) {
        image_processor_ = load_image_processor_config(processor_config_path);
    } else {  // Clef-Flash's published image processor
        image_processor_.min_pixels = 65536;
        image_processor_.max_pixels = 16777216;
        image_processor_.patch_size = vc.patch_size;
        image_processor_.merge_size = vc.spatial_merge_size;
        image_processor_.temporal_patch_size = vc.temporal_patch_size;
        image_processor_.image_mean = {0.5, 0.5, 0.5};
        image_processor_.image_std = {0.5, 0.5, 0.5};
    }
    const ImageProcessorConfig& ip = image_processor_;
    if (ip.patch_size != vc.patch_size || ip.merge_size != vc.spatial_merge_size ||
        ip.temporal_patch_size != vc.temporal_patch_size || vc.in_channels != 3)
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
    vision_ = std::make_unique<VisionTower>(vc, *weights_);
}

Engine::Prepared Engine::prepare(DecisionRequest req, const DecideOptions& opt) const {
    Prepared p;
    PromptOptions popt;
    popt.max_length = opt.max_length;
    popt.keep_segments = opt.keep_segments;
    MediaBlock media;
    if (!req.decoded_images.empty()) {
        if (!vision_) throw ImageError("images are not supported: this model has no vision tower");
        for (size_t i = 0; i < req.decoded_images.size(); ++i) {
            try {
                p.images.push_back(process_image(req.decoded_images[i].rgb, image_processor_));
            } catch (const ImageError& e) {
                throw ImageError("images[" + std::to_string(i) + "]: " + e.what());
            }
        }
        media = build_media_block(*tokenizer_, p.images);
        popt.media = &media;
    }
    p.prompt = encode_prompt(*tokenizer_, req, popt);
    if (!p.images.empty()) {
        int64_t features = 0;
        for (const auto& img : p.images) features += img.num_tokens();
        check_image_tokens(p.prompt.input_ids, image_token_id_, features);
        p.mm_token_type_ids = media_token_type_ids(p.prompt, media, image_token_id_);
        p.position_ids = mrope_position_ids(p.mm_token_type_ids, p.images, &p.rope_delta);
        req.decoded_images.clear();  // the resized images are all run() needs
        req.decoded_images.shrink_to_fit();
    }
    p.request = std::move(req);
    return p;
}

Decision Engine::decide(const DecisionRequest& req, const DecideOptions& opt, bool keep_hidden) const {
    return run(prepare(req, opt), opt, keep_hidden);
}

Decision Engine::run(const Prepared& p, const DecideOptions& opt, bool keep_hidden) const {
    const auto t_start = Clock::now();
    if (opt.threads > 0) ops::set_num_threads(opt.threads);
    const DecisionRequest& req = p.request;
    Decision d;
    d.prompt = p.prompt;
    const auto& ids = d.prompt.input_ids;
    const int64_t T = static_cast<int64_t>(ids.size());

    std::vector<HeadQuestion> hq;
    hq.reserve(d.prompt.questions.size());
    for (const auto& q : d.prompt.questions) {
        HeadQuestion h;
        h.type = static_cast<int>(q.type);
        h.span_begin = q.span.first;
        h.span_end = q.span.second;
        h.option_spans = q.option_spans;
        hq.push_back(std::move(h));
    }

    // Chunked prefill: embeddings (with the vision tower's rows substituted for image pads), the backbone
    // chunk by chunk (conv, delta-rule and K/V state carried along), each chunk's last hidden states streamed
    // into the head's feature builder.
    const int64_t H = backbone_->config().hidden_size;
    DecisionProfile* prof = opt.profile;
    std::vector<float> x_all;  // [T][hidden], only with images
    if (!p.images.empty()) {
        const auto tv = Clock::now();
        std::vector<std::vector<float>> features;
        for (const ProcessedImage& img : p.images) {
            const std::vector<float> pv = pixel_values(img, image_processor_);
            features.push_back(vision_->forward(pv.data(), img.grid_t, img.grid_h, img.grid_w));
        }
        x_all = backbone_->embed(ids);
        substitute_image_embeddings(x_all, H, p.mm_token_type_ids, features);
        if (prof) prof->vision += seconds_since(tv);
    }
    HeadFeatureBuilder builder(*head_, T, ids, hq);
    BackboneState state = backbone_->start();
    const int64_t chunk = backbone_->chunk_length(opt.backbone, T);
    std::vector<float> buf(static_cast<size_t>(std::min(chunk, T) * H));
    if (keep_hidden) d.last_hidden_state.resize(static_cast<size_t>(T * H));
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const int64_t n = std::min(chunk, T - t0);
        const auto tb = Clock::now();
        if (x_all.empty())
            backbone_->embed_into(ids.data() + t0, n, buf.data());
        else
            std::copy_n(x_all.data() + t0 * H, n * H, buf.data());
        backbone_->forward_chunk(state, buf.data(), n,
                                 p.position_ids.empty() ? nullptr : p.position_ids.data() + t0, T,
                                 opt.backbone, buf.data(), nullptr, prof ? &prof->backbone : nullptr);
        const auto th = Clock::now();
        if (prof) prof->backbone_total += std::chrono::duration<double>(th - tb).count();
        builder.add_rows(buf.data(), n);
        if (prof) prof->head_features += seconds_since(th);
        if (keep_hidden) std::copy_n(buf.data(), n * H, d.last_hidden_state.data() + t0 * H);
    }
    state = {};
    const auto tf = Clock::now();
    HeadFeatures features = builder.finish();
    if (prof) prof->head_features += seconds_since(tf);
    const auto td = Clock::now();
    d.logits = head_->decide(features, hq);
    if (prof) prof->head_decide += seconds_since(td);

    JsonValue answers = JsonValue::object();
    for (size_t i = 0; i < d.logits.size(); ++i) {
        d.probabilities.push_back(softmax_f32(d.logits[i]));
        answers.set(req.questions[i].id, make_answer(req.questions[i], d.prompt.questions[i],
                                                     d.probabilities.back(), opt.answers));
    }
    JsonValue usage = JsonValue::object();
    usage.set("input_tokens", JsonValue::integer(T));
    usage.set("output_tokens", JsonValue::integer(0));
    d.response = JsonValue::object();
    d.response.set("model", JsonValue::string(req.model));
    d.response.set("answers", std::move(answers));
    d.response.set("usage", std::move(usage));

    if (opt.debug) {
        JsonValue dbg = JsonValue::object();
        std::vector<JsonValue> idv;
        idv.reserve(ids.size());
        for (int32_t id : ids) idv.push_back(JsonValue::integer(id));
        dbg.set("input_ids", JsonValue::array(std::move(idv)));
        std::vector<JsonValue> qs;
        auto span_json = [](std::pair<int, int> s) {
            return JsonValue::array({JsonValue::integer(s.first), JsonValue::integer(s.second)});
        };
        for (size_t i = 0; i < d.prompt.questions.size(); ++i) {
            const auto& q = d.prompt.questions[i];
            JsonValue o = JsonValue::object();
            o.set("id", JsonValue::string(q.id));
            o.set("span", span_json(q.span));
            std::vector<JsonValue> spans, oids, lg, pr;
            for (const auto& s : q.option_spans) spans.push_back(span_json(s));
            for (const auto& s : q.option_ids) oids.push_back(JsonValue::string(s));
            for (float x : d.logits[i]) lg.push_back(JsonValue::number(x));
            for (float x : d.probabilities[i]) pr.push_back(JsonValue::number(x));
            o.set("option_spans", JsonValue::array(std::move(spans)));
            o.set("option_ids", JsonValue::array(std::move(oids)));
            o.set("logits", JsonValue::array(std::move(lg)));
            o.set("probabilities", JsonValue::array(std::move(pr)));
            qs.push_back(std::move(o));
        }
        dbg.set("questions", JsonValue::array(std::move(qs)));
        d.response.set("debug", std::move(dbg));
    }
    if (opt.profile) opt.profile->total += seconds_since(t_start);
    return d;
}

}  // namespace clef
