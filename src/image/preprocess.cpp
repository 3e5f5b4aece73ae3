#include "image/preprocess.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "image/resize.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace clef {

namespace {

std::string size_str(int width, int height) {
    return std::to_string(width) + "x" + std::to_string(height);
}

constexpr int64_t kMaxPixels = int64_t{1} << 40;  // pixel counts and patch sizes beyond it are refused

// A setting of three numbers (one per channel), or one number for all three.
std::array<double, 3> triple_or(const JsonFields& f, const char* key, std::array<double, 3> def) {
    const nlohmann::json* v = f.find(key);
    if (!v) return def;
    if (v->is_number()) return {v->get<double>(), v->get<double>(), v->get<double>()};
    if (!v->is_array() || v->size() != 3) f.fail(key, "expected a list of 3 numbers");
    std::array<double, 3> out{};
    for (size_t i = 0; i < 3; ++i) {
        if (!(*v)[i].is_number()) f.fail(key, "expected a list of 3 numbers");
        out[i] = (*v)[i].get<double>();
    }
    return out;
}

int64_t pixels_or(const JsonFields& f, const char* key, int64_t def) {
    const nlohmann::json* v = f.find(key);
    return v ? f.positive_up_to(key, *v, kMaxPixels) : def;
}

// size {shortest_edge, longest_edge}: the min and max pixels.
void read_size(const JsonFields& f, ImageProcessorConfig& c) {
    const nlohmann::json* size = f.find("size");
    if (!size) return;
    if (!size->is_object()) f.fail("size", "expected an object {shortest_edge, longest_edge}");
    const JsonFields s(*size, f.source(), f.path("size") + ".");
    if (!s.has("shortest_edge") || !s.has("longest_edge"))
        f.fail("size", "must have shortest_edge and longest_edge (min and max pixels)");
    c.min_pixels = pixels_or(s, "shortest_edge", 0);
    c.max_pixels = pixels_or(s, "longest_edge", 0);
}

// One processor block (image_processor or video_processor: the same keys); `prefix` names it in the errors.
ImageProcessorConfig parse_processor_block(const nlohmann::json& block, const std::string& source,
                                           const std::string& prefix) {
    const JsonFields r(block, source, prefix);
    ImageProcessorConfig c;
    read_size(r, c);
    c.min_pixels = pixels_or(r, "min_pixels", c.min_pixels);
    c.max_pixels = pixels_or(r, "max_pixels", c.max_pixels);
    if (c.min_pixels > c.max_pixels)
        r.fail("size", "shortest_edge " + std::to_string(c.min_pixels) + " is larger than longest_edge " +
                           std::to_string(c.max_pixels));
    c.patch_size = static_cast<int>(pixels_or(r, "patch_size", c.patch_size));
    c.merge_size = static_cast<int>(pixels_or(r, "merge_size", c.merge_size));
    c.temporal_patch_size = static_cast<int>(pixels_or(r, "temporal_patch_size", c.temporal_patch_size));
    if (c.patch_size > 1024 || c.merge_size > 64 || c.temporal_patch_size > 64)
        r.fail("patch_size", "patch, merge or temporal patch size out of range");
    c.do_resize = r.boolean_or("do_resize", true);
    c.do_rescale = r.boolean_or("do_rescale", true);
    c.do_normalize = r.boolean_or("do_normalize", true);
    if (!r.boolean_or("do_convert_rgb", true)) r.fail("do_convert_rgb", "false is not supported");
    if (!c.do_resize) r.fail("do_resize", "false is not supported (the patch grid needs the smart resize)");
    c.rescale_factor = r.number_or("rescale_factor", c.rescale_factor);
    if (!(c.rescale_factor > 0)) r.fail("rescale_factor", "must be positive");
    c.image_mean = triple_or(r, "image_mean", c.image_mean);
    c.image_std = triple_or(r, "image_std", c.image_std);
    for (double s : c.image_std)
        if (!(s > 0)) r.fail("image_std", "must be positive");
    c.resample = static_cast<int>(r.number_or("resample", 3));
    if (c.resample != 3)
        r.fail("resample", std::to_string(c.resample) + " is not supported (only 3 = bicubic)");
    return c;
}

std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace

ImageProcessorConfig parse_image_processor_config(const std::string& json_text,
                                                  const std::string& source_name) {
    const nlohmann::json doc = parse_json_object(json_text, source_name);
    const auto block = doc.find("image_processor");
    if (block == doc.end()) return parse_processor_block(doc, source_name, "");  // preprocessor_config.json
    if (!block->is_object()) throw Error(source_name + ": image_processor: expected an object");
    return parse_processor_block(*block, source_name, "image_processor.");
}

std::optional<ImageProcessorConfig> parse_video_processor_config(const std::string& json_text,
                                                                 const std::string& source_name) {
    const nlohmann::json doc = parse_json_object(json_text, source_name);
    const auto block = doc.find("video_processor");
    if (block == doc.end() || block->is_null()) return std::nullopt;
    if (!block->is_object()) throw Error(source_name + ": video_processor: expected an object");
    return parse_processor_block(*block, source_name, "video_processor.");
}

ImageProcessorConfig load_image_processor_config(const std::string& path) {
    return parse_image_processor_config(read_text(path), path);
}

std::optional<ImageProcessorConfig> load_video_processor_config(const std::string& path) {
    return parse_video_processor_config(read_text(path), path);
}

ImageProcessorConfig clef_flash_image_processor(int patch_size, int merge_size, int temporal_patch_size) {
    ImageProcessorConfig c;
    c.min_pixels = 65536;
    c.max_pixels = 16777216;
    c.patch_size = patch_size;
    c.merge_size = merge_size;
    c.temporal_patch_size = temporal_patch_size;
    c.image_mean = {0.5, 0.5, 0.5};
    c.image_std = {0.5, 0.5, 0.5};
    return c;
}

ImageProcessorConfig clef_flash_video_processor(int patch_size, int merge_size, int temporal_patch_size) {
    ImageProcessorConfig c = clef_flash_image_processor(patch_size, merge_size, temporal_patch_size);
    c.min_pixels = 4096;
    c.max_pixels = 25165824;
    return c;
}

const char* resize_branch_name(ResizeBranch b) {
    switch (b) {
        case ResizeBranch::None:
            return "none";
        case ResizeBranch::Round:
            return "round";
        case ResizeBranch::MinPixels:
            return "min_pixels";
        case ResizeBranch::MaxPixels:
            return "max_pixels";
    }
    return "?";
}

SmartResize smart_resize_frames(int64_t frames, int64_t t_bar, int height, int width, int factor,
                                int64_t min_pixels, int64_t max_pixels) {
    const char* what = frames > 1 ? "video frames are " : "image is ";
    if (height < factor || width < factor)
        throw ImageError(what + size_str(width, height) + " pixels; both sides must be at least " +
                         std::to_string(factor) + " pixels");
    const double ratio =
        static_cast<double>(std::max(height, width)) / static_cast<double>(std::min(height, width));
    if (ratio > 200)
        throw ImageError(what + size_str(width, height) + " pixels; the aspect ratio must be at most 200:1");
    const double f = factor;
    // Python round(): half to even, which nearbyint gives in the default rounding mode.
    int64_t h = static_cast<int64_t>(std::nearbyint(height / f)) * factor;
    int64_t w = static_cast<int64_t>(std::nearbyint(width / f)) * factor;
    SmartResize r;
    r.branch = (h == height && w == width) ? ResizeBranch::None : ResizeBranch::Round;
    // N·h·w, the real frame count (not t̄), as the processor computes β.
    const double nhw = static_cast<double>(frames) * static_cast<double>(int64_t{height} * width);
    if (t_bar * h * w > max_pixels) {
        const double beta = std::sqrt(nhw / static_cast<double>(max_pixels));
        h = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(height / beta / f)) * factor);
        w = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(width / beta / f)) * factor);
        r.branch = ResizeBranch::MaxPixels;
    } else if (t_bar * h * w < min_pixels) {
        const double beta = std::sqrt(static_cast<double>(min_pixels) / nhw);
        h = static_cast<int64_t>(std::ceil(height * beta / f)) * factor;
        w = static_cast<int64_t>(std::ceil(width * beta / f)) * factor;
        r.branch = ResizeBranch::MinPixels;
    }
    if (h > (int64_t{1} << 20) || w > (int64_t{1} << 20)) throw ImageError("image is too large to resize");
    r.height = static_cast<int>(h);
    r.width = static_cast<int>(w);
    return r;
}

SmartResize smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
    return smart_resize_frames(1, 1, height, width, factor, min_pixels, max_pixels);
}

ProcessedImage process_image(const RgbImage& rgb, const ImageProcessorConfig& cfg) {
    const SmartResize s = smart_resize(rgb.height, rgb.width, cfg.factor(), cfg.min_pixels, cfg.max_pixels);
    ProcessedImage p;
    p.source_height = rgb.height;
    p.source_width = rgb.width;
    p.branch = s.branch;
    p.resized = resize_bicubic_aa(rgb, s.width, s.height);
    p.grid_t = 1;  // a still image: one temporal patch of temporal_patch_size identical frames
    p.grid_h = s.height / cfg.patch_size;
    p.grid_w = s.width / cfg.patch_size;
    p.merged_h = p.grid_h / cfg.merge_size;
    p.merged_w = p.grid_w / cfg.merge_size;
    return p;
}

std::array<std::array<float, 256>, 3> normalisation_table(const ImageProcessorConfig& cfg) {
    std::array<std::array<float, 256>, 3> t{};
    // transformers' fused path: mean' = float32(mean) * (1 / rescale_factor), std' likewise, computed on a
    // float32 tensor; then (float32(x) - mean') / std' in float32.
    const float inv_rescale = static_cast<float>(1.0 / cfg.rescale_factor);
    for (int c = 0; c < 3; ++c) {
        const float mean = static_cast<float>(cfg.image_mean[c]);
        const float stdv = static_cast<float>(cfg.image_std[c]);
        for (int x = 0; x < 256; ++x) {
            const float v = static_cast<float>(x);
            if (cfg.do_rescale && cfg.do_normalize)
                t[c][x] = (v - mean * inv_rescale) / (stdv * inv_rescale);
            else if (cfg.do_normalize)
                t[c][x] = (v - mean) / stdv;
            else if (cfg.do_rescale)
                t[c][x] = v * static_cast<float>(cfg.rescale_factor);
            else
                t[c][x] = v;
        }
    }
    return t;
}

std::vector<float> patch_rows(const std::vector<const RgbImage*>& frames, int grid_t, int merged_h,
                              int merged_w, const ImageProcessorConfig& cfg) {
    const int P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
    const int dim = cfg.patch_dim();
    const auto norm = normalisation_table(cfg);
    std::vector<float> out(static_cast<size_t>(grid_t) * merged_h * merged_w * M * M * dim);
    float* row = out.data();
    for (int g = 0; g < grid_t; ++g)
        for (int bh = 0; bh < merged_h; ++bh)
            for (int bw = 0; bw < merged_w; ++bw)
                for (int mh = 0; mh < M; ++mh)
                    for (int mw = 0; mw < M; ++mw, row += dim) {
                        const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
                        float* o = row;
                        for (int c = 0; c < 3; ++c)
                            for (int t = 0; t < T; ++t) {
                                const RgbImage& f = *frames[static_cast<size_t>(g * T + t)];
                                for (int y = 0; y < P; ++y) {
                                    const uint8_t* s = f.row(y0 + y) + static_cast<size_t>(x0) * 3 + c;
                                    for (int x = 0; x < P; ++x) *o++ = norm[c][s[3 * x]];
                                }
                            }
                    }
    return out;
}

std::vector<float> pixel_values(const ProcessedImage& img, const ImageProcessorConfig& cfg) {
    // A still image: one temporal patch of temporal_patch_size copies.
    const std::vector<const RgbImage*> frames(static_cast<size_t>(cfg.temporal_patch_size), &img.resized);
    return patch_rows(frames, 1, img.merged_h, img.merged_w, cfg);
}

}  // namespace clef
