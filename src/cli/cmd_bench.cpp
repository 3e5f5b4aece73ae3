// clef bench: times whole decisions on a synthetic request of exactly N prompt tokens and prints one JSON
// line (throughput, backbone GFLOP/s against the measured yardstick of the precision's path, head share, peak
// RSS, the GEMM plan and the CPU features in use).
// With --image WxH it times the image path instead: one synthetic picture through the image processor and
// the vision tower + merger (docs/PERFORMANCE.md "Vision tower"); with --video FRAMESxWxH the video path
// (docs/MEDIA.md "Performance").
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "decision/engine.h"
#include "image/preprocess.h"
#include "image/synthetic.h"
#include "image/video.h"
#include "io/model_dir.h"
#include "model/backbone.h"
#include "model/vision.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "ops/int8_gemm.h"
#include "ops/simd.h"
#include "util/error.h"
#include "util/json.h"

namespace clef {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
    std::string model;
    LoadArgs load;
    int64_t tokens = 512;
    int repeat = 3;
    int warmup = 1;
    int threads = 0;
    std::string precision = "exact";
    bool kv_bf16 = false;
    int64_t chunk = -1;  // < 0: the engine's default (512 tokens; 2048 when quantised weights are streamed)
    bool reference = false;
    bool profile = false;
    std::string image;  // "WxH": time the vision tower on a synthetic image instead of decisions
    std::string video;  // "FRAMESxWxH": time the video processor and the tower on synthetic frames
};

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best and median of a non-empty list of timings.
std::pair<double, double> best_median(std::vector<double> t) {
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    return {t.front(), n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2])};
}

double peak_rss_mib() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// A request whose encoded prompt is exactly `tokens` long: a state of `tokens` words (at least one token
// each, whatever the tokenizer) cut to fit by max_length = tokens, and one yes/no question.
DecisionRequest synthetic_request(int64_t tokens) {
    std::string state;
    static const char* words[] = {" ticket", " the",    " app",    " crashes",
                                  " after",  " update", " refund", " please"};
    for (int64_t i = 0; i < tokens; ++i) state += words[i % 8];
    // One short question keeps the fixed part (template + schema) small, so short prompts are possible.
    const std::string body = R"({"model": "bench", "state": )" + write_json(JsonValue::string(state)) +
                             R"(, "questions": {"q": {"type": "noul", "instructions": "Bug?"}}})";
    DecisionRequest req;
    std::vector<RequestError> errors;
    if (!parse_request(parse_json_or_throw(body, "bench request"), req, errors))
        throw Error("bench: synthetic request: " + describe_errors(errors));
    return req;
}

// The yardstick a path is measured against, in this process on 512x4096x4096 (oneDNN's own matmuls, weights
// in the layout it prefers): exact = the larger of the fp32 matmul and a third of the bf16 one (Exact needs
// three bf16 products); bf16 = the bf16 matmul where bf16 units exist, else the fp32 one; int8 = the int8
// panel kernels' own peak with their operands in cache (ops::int8_kernel_gops, the faster panel kind).
double yardstick_gflops(ops::Precision p) {
    if (p == ops::Precision::Int8)
        return std::max(ops::int8_kernel_gops(20, 0), ops::int8_kernel_gops(20, 4));
    const double bf16 = ops::dnnl_matmul_gflops(true, 512, 4096, 4096, 5);
    if (p == ops::Precision::BF16 && bf16 > 0) return bf16;
    const double f32 = ops::dnnl_matmul_gflops(false, 512, 4096, 4096, 5);
    return p == ops::Precision::Exact ? std::max(f32, bf16 / 3) : f32;
}

JsonValue profile_json(const DecisionProfile& p) {
    const BackboneProfile& b = p.backbone;
    JsonValue o = JsonValue::object();
    auto add = [&](const char* name, double v) { o.set(name, JsonValue::number(v)); };
    add("total", p.total);
    add("backbone", p.backbone_total);
    add("embed", b.embed);
    add("norms_residual", b.norms);
    add("gdn_proj", b.gdn_proj);
    add("gdn_conv_gates", b.gdn_conv_gates);
    add("delta_rule", b.delta_rule);
    add("attn_proj", b.attn_proj);
    add("attn_rope_norm_gate", b.attn_rope_norm);
    add("attention", b.attention);
    add("mlp_proj", b.mlp_proj);
    add("mlp_act", b.mlp_act);
    add("head_features", p.head_features);
    add("head_decide", p.head_decide);
    return o;
}

// The device the decisions ran on and, for a GPU, the time of each kernel per decision (the device's
// timestamps over `runs` decisions) and the GFLOP/s of those whose work is counted.
JsonValue device_json(const dev::Device& d, int runs) {
    JsonValue o = JsonValue::object();
    o.set("kind", JsonValue::string(d.kind()));
    o.set("name", JsonValue::string(d.name()));
    const auto times = d.kernel_times();
    if (times.empty()) return o;
    JsonValue k = JsonValue::object();
    double total = 0;
    for (const auto& [name, t] : times) {
        JsonValue e = JsonValue::object();
        e.set("calls", JsonValue::number(static_cast<double>(t.calls) / runs));
        e.set("ms", JsonValue::number(t.seconds * 1e3 / runs));
        if (t.flops > 0 && t.seconds > 0) e.set("gflops", JsonValue::number(t.flops / t.seconds / 1e9));
        k.set(name, std::move(e));
        total += t.seconds;
    }
    o.set("kernel_ms", JsonValue::number(total * 1e3 / runs));
    o.set("kernels", std::move(k));
    return o;
}

void run_bench(const BenchArgs& a) {
    if (a.tokens <= 0) throw Error("--tokens must be positive");
    if (a.repeat <= 0) throw Error("--repeat must be positive");
    if (a.warmup < 0) throw Error("--warmup must be >= 0");
    if (a.tokens > (int64_t{1} << 30)) throw Error("--tokens is too large");
    DecideOptions opt;
    opt.backbone.precision = precision_option(a.precision);
    opt.backbone.reference = a.reference;
    opt.backbone.kv_bf16 = a.kv_bf16;
    if (a.chunk >= 0) opt.backbone.prefill_chunk = opt.backbone.streamed_prefill_chunk = a.chunk;
    opt.max_length = static_cast<int>(a.tokens);
    if (a.threads > 0) ops::set_num_threads(a.threads);

    const auto tl = Clock::now();
    std::unique_ptr<Engine> engine =
        Engine::load(a.model, a.load.head, a.load.options(opt.backbone.precision));
    const double load_s = seconds_since(tl);
    const Engine::Prepared prepared = engine->prepare(synthetic_request(a.tokens), opt);
    const int64_t T = static_cast<int64_t>(prepared.prompt.input_ids.size());
    if (T != a.tokens)
        throw Error("bench: the synthetic prompt has " + std::to_string(T) + " tokens, not " +
                    std::to_string(a.tokens) + " (the schema alone may be longer)");

    for (int i = 0; i < a.warmup; ++i) engine->run(prepared, opt);
    engine->device().time_kernels(true);  // a GPU's kernels, timed by the device from here on
    std::vector<double> total;
    DecisionProfile best;
    for (int i = 0; i < a.repeat; ++i) {
        DecisionProfile p;
        p.backbone.sync = a.profile;  // per-op times wait for the device only under --profile
        opt.profile = &p;
        engine->run(prepared, opt);
        if (total.empty() || p.total < *std::min_element(total.begin(), total.end())) best = p;
        total.push_back(p.total);
    }
    const auto [t_best, t_median] = best_median(total);
    const double flops = backbone_flops(engine->config().text, T);
    const double gflops = flops / best.backbone_total / 1e9;
    const double peak = yardstick_gflops(opt.backbone.precision);
    const double head = best.head_features + best.head_decide;

    JsonValue o = JsonValue::object();
    o.set("tokens", JsonValue::integer(T));
    o.set("threads", JsonValue::integer(ops::num_threads()));
    o.set("precision", JsonValue::string(a.reference ? "reference" : a.precision));
    o.set("kv_type", JsonValue::string(kv_type_name(a.kv_bf16)));
    o.set("gemm", JsonValue::string(ops::gemm_plan_string()));
    o.set("cpu", JsonValue::string(ops::cpu_features_string() + ", simd " + ops::simd_target()));
    o.set("chunk", JsonValue::integer(engine->backbone().chunk_length(opt.backbone, T)));
    o.set("streamed_weights", JsonValue::boolean(engine->backbone().streams_weights()));
    o.set("repeat", JsonValue::integer(a.repeat));
    o.set("seconds_best", JsonValue::number(t_best));
    o.set("seconds_median", JsonValue::number(t_median));
    o.set("tokens_per_s", JsonValue::number(static_cast<double>(T) / t_best));
    o.set("backbone_gflop", JsonValue::number(flops / 1e9));
    o.set("gflops", JsonValue::number(gflops));
    o.set("peak_gflops", JsonValue::number(peak));
    o.set("peak_ratio", JsonValue::number(gflops / peak));
    o.set("head_share", JsonValue::number(head / best.total));
    o.set("peak_rss_mib", JsonValue::number(peak_rss_mib()));
    o.set("load_seconds", JsonValue::number(load_s));
    o.set("packed_weights_mib",
          JsonValue::number(static_cast<double>(engine->backbone().packed_weight_bytes()) / (1 << 20)));
    if (a.profile) o.set("profile", profile_json(best));
    o.set("device", device_json(engine->device(), a.repeat));
    std::string out = write_json(o);
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
}

// "WxH" (e.g. 448x448) -> width, height; clef::Error otherwise.
std::pair<int, int> parse_image_size(const std::string& s) {
    int w = 0, h = 0, end = 0;
    if (std::sscanf(s.c_str(), "%dx%d%n", &w, &h, &end) != 2 || end != static_cast<int>(s.size()) || w < 1 ||
        h < 1 || w > 65536 || h > 65536)
        throw Error("--image: expected WIDTHxHEIGHT with sides in [1, 65536] (e.g. 448x448), got '" + s +
                    "'");
    return {w, h};
}

// "FRAMESxWxH" (e.g. 16x448x448) -> frames, width, height; clef::Error otherwise.
struct VideoSize {
    int frames = 0, width = 0, height = 0;
};
VideoSize parse_video_size(const std::string& s) {
    VideoSize v;
    int end = 0;
    if (std::sscanf(s.c_str(), "%dx%dx%d%n", &v.frames, &v.width, &v.height, &end) != 3 ||
        end != static_cast<int>(s.size()) || v.frames < 1 || v.frames > 4096 || v.width < 1 || v.height < 1 ||
        v.width > 65536 || v.height > 65536)
        throw Error(
            "--video: expected FRAMESxWIDTHxHEIGHT with 1 to 4096 frames and sides in [1, 65536] (e.g. "
            "16x448x448), got '" +
            s + "'");
    return v;
}

// The tower a media bench times: the engine's (the fast path), or with --reference one loaded on the scalar
// reference path.
struct BenchTower {
    std::unique_ptr<Engine> engine;
    std::unique_ptr<VisionTower> reference;
    double load_s = 0;
    const VisionTower& tower() const { return reference ? *reference : *engine->vision(); }
};

BenchTower load_bench_tower(const BenchArgs& a, const char* flag) {
    if (a.repeat <= 0) throw Error("--repeat must be positive");
    if (a.warmup < 0) throw Error("--warmup must be >= 0");
    if (precision_option(a.precision) != ops::Precision::Exact)
        throw Error(std::string(flag) + ": the vision tower runs in exact precision only (no --precision " +
                    a.precision + ")");
    if (a.threads > 0) ops::set_num_threads(a.threads);
    const auto tl = Clock::now();
    BenchTower b;
    b.engine = Engine::load(a.model, a.load.head, a.load.options());
    if (!b.engine->vision())
        throw Error(a.model + ": the model has no vision tower (" + std::string(flag) + " needs one)");
    if (a.reference)
        b.reference = std::make_unique<VisionTower>(*b.engine->config().vision,
                                                    Checkpoint::open(locate_model_dir(a.model).weights_path),
                                                    kVisionPrefix, /*reference=*/true);
    b.load_s = seconds_since(tl);
    return b;
}

// `repeat` timed runs after `warmup`: process() (the processor: resize, normalisation, patches) returns the
// pixel rows and their grid, then the tower + merger runs on them. Adds the timings and the tower's FLOP rate
// to o.
template <class Process>
void time_media(const BenchArgs& a, const BenchTower& b, Process&& process, JsonValue& o) {
    std::vector<double> pre, vis;
    int gt = 0, gh = 0, gw = 0;
    for (int i = 0; i < a.warmup + a.repeat; ++i) {
        const auto t0 = Clock::now();
        const std::vector<float> pv = process(gt, gh, gw);
        const double tp = seconds_since(t0);
        const auto t1 = Clock::now();
        const std::vector<float> out = b.tower().forward(pv.data(), gt, gh, gw);
        const double tv = seconds_since(t1);
        if (i < a.warmup) continue;
        pre.push_back(tp);
        vis.push_back(tv);
    }
    const auto [pre_best, pre_median] = best_median(pre);
    const auto [vis_best, vis_median] = best_median(vis);
    const double flops = vision_flops(b.tower().config(), gt, gh, gw);
    o.set("threads", JsonValue::integer(ops::num_threads()));
    o.set("precision", JsonValue::string(a.reference ? "reference" : "exact"));
    o.set("repeat", JsonValue::integer(a.repeat));
    o.set("preprocess_seconds_best", JsonValue::number(pre_best));
    o.set("preprocess_seconds_median", JsonValue::number(pre_median));
    o.set("vision_seconds_best", JsonValue::number(vis_best));
    o.set("vision_seconds_median", JsonValue::number(vis_median));
    o.set("vision_gflop", JsonValue::number(flops / 1e9));
    o.set("vision_gflops", JsonValue::number(flops / vis_best / 1e9));
    o.set("peak_rss_mib", JsonValue::number(peak_rss_mib()));
    o.set("load_seconds", JsonValue::number(b.load_s));
    std::string line = write_json(o);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
}

std::string size_text(int width, int height) {
    return std::to_string(width) + "x" + std::to_string(height);
}

// --image: one synthetic picture through the model's image processor (smart resize, bicubic, normalisation,
// patches) and the vision tower + merger.
void run_image_bench(const BenchArgs& a) {
    const auto [width, height] = parse_image_size(a.image);
    const BenchTower b = load_bench_tower(a, "--image");
    const RgbImage rgb = synthetic_image(width, height);
    const ImageProcessorConfig& proc = b.engine->image_processor();
    const ProcessedImage img = process_image(rgb, proc);
    JsonValue o = JsonValue::object();
    o.set("image", JsonValue::string(size_text(width, height)));
    o.set("resized", JsonValue::string(size_text(img.resized.width, img.resized.height)));
    o.set("patches", JsonValue::integer(img.num_patches()));
    o.set("image_tokens", JsonValue::integer(img.num_tokens()));
    time_media(
        a, b,
        [&](int& gt, int& gh, int& gw) {
            const ProcessedImage p = process_image(rgb, proc);
            gt = p.grid_t, gh = p.grid_h, gw = p.grid_w;
            return pixel_values(p, proc);
        },
        o);
}

// --video: FRAMES synthetic frames (a different noise seed each) through the model's video processor (the
// video smart resize over all frames, per-frame bicubic, temporal groups) and the vision tower + merger (one
// attention segment per group).
void run_video_bench(const BenchArgs& a) {
    const VideoSize size = parse_video_size(a.video);
    const BenchTower b = load_bench_tower(a, "--video");
    DecodedVideo video;
    for (int f = 0; f < size.frames; ++f) {
        video.frames.push_back(synthetic_image(size.width, size.height, 20261008 + static_cast<uint64_t>(f)));
        video.metadata.frame_indices.push_back(f);
    }
    const ImageProcessorConfig& proc = b.engine->video_processor();
    const ProcessedVideo v = process_video(video, proc);
    JsonValue o = JsonValue::object();
    o.set("video", JsonValue::string(a.video));
    o.set("resized", JsonValue::string(size_text(v.frames[0].width, v.frames[0].height)));
    o.set("groups", JsonValue::integer(v.grid_t));
    o.set("patches", JsonValue::integer(v.num_patches()));
    o.set("video_tokens", JsonValue::integer(v.num_tokens()));
    time_media(
        a, b,
        [&](int& gt, int& gh, int& gw) {
            const ProcessedVideo p = process_video(video, proc);
            gt = p.grid_t, gh = p.grid_h, gw = p.grid_w;
            return video_pixel_values(p, proc);
        },
        o);
}

}  // namespace

void add_bench_command(CLI::App& app) {
    auto args = std::make_shared<BenchArgs>();
    CLI::App* cmd = app.add_subcommand("bench",
                                       "Time whole decisions on a synthetic prompt of N tokens, or (--image "
                                       "WxH / --video FRAMESxWxH) the processor and vision tower on one "
                                       "synthetic image or video (JSON line)");
    cmd->add_option("--model", args->model, "Model directory (publisher layout) or GGUF file")->required();
    add_load_options(cmd, args->load);
    CLI::Option* tokens = cmd->add_option("--tokens", args->tokens, "Prompt tokens")->capture_default_str();
    cmd->add_option("--repeat", args->repeat,
                    "Timed runs: decisions, or images / videos with --image / --video (best and median are "
                    "reported)")
        ->capture_default_str();
    cmd->add_option("--warmup", args->warmup, "Untimed runs first")->capture_default_str();
    cmd->add_option("--threads", args->threads, "Kernel threads (0 = OMP_NUM_THREADS or the physical cores)")
        ->capture_default_str();
    add_precision_option(cmd, args->precision);
    add_kv_type_option(cmd, args->kv_bf16);
    CLI::Option* chunk = cmd->add_option("--chunk", args->chunk,
                                         "Prefill chunk length in tokens (0 = whole prompt; default 512, "
                                         "2048 when quantised weights are "
                                         "streamed)")
                             ->capture_default_str();
    cmd->add_flag("--reference", args->reference, "Run the scalar reference path (the oracle) instead");
    CLI::Option* profile =
        cmd->add_flag("--profile", args->profile, "Add a per-op time breakdown of the best run (seconds)");
    CLI::Option* image =
        cmd->add_option(
               "--image", args->image,
               "Instead of decisions, time one synthetic WIDTHxHEIGHT image (e.g. 448x448) through the "
               "image processor and the vision tower + merger (exact; --reference for the scalar path). "
               "Keys: image, resized, patches, image_tokens, preprocess_seconds_best/_median, "
               "vision_seconds_best/_median, vision_gflop, vision_gflops")
            ->excludes(tokens)
            ->excludes(chunk)
            ->excludes(profile);
    cmd->add_option(
           "--video", args->video,
           "Instead of decisions, time a synthetic video of FRAMESxWIDTHxHEIGHT (e.g. 16x448x448) through "
           "the video processor and the vision tower + merger (exact; --reference for the scalar path). "
           "Keys: video, resized, groups, patches, video_tokens, and the timings of --image")
        ->excludes(tokens)
        ->excludes(chunk)
        ->excludes(profile)
        ->excludes(image);
    cmd->callback([args] {
        if (!args->image.empty())
            run_image_bench(*args);
        else if (!args->video.empty())
            run_video_bench(*args);
        else
            run_bench(*args);
    });
}

}  // namespace clef
