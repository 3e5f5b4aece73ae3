#include "image/preprocess.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "image/resize.h"
#include "util/json.h"

namespace clef {

namespace {

struct Reader {
    const JsonValue& obj;
    std::string where;  // "<source>: image_processor."

    [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
        throw Error(where + key + ": " + msg);
    }
    const JsonValue* get(const std::string& key) const {
        const JsonValue* v = obj.find(key);
        return v && !v->is_null() ? v : nullptr;
    }
    bool boolean(const std::string& key, bool def) const {
        const JsonValue* v = get(key);
        if (!v) return def;
        if (!v->is_bool()) fail(key, std::string("expected true or false, got ") + v->kind_name());
        return v->as_bool();
    }
    int64_t positive(const JsonValue& v, const std::string& key) const {
        if (!v.is_int() || !v.fits_int64() || v.as_int64() <= 0 || v.as_int64() > (int64_t{1} << 40))
            fail(key, "expected a positive integer, got " + write_json(v));
        return v.as_int64();
    }
    int64_t positive_or(const std::string& key, int64_t def) const {
        const JsonValue* v = get(key);
        return v ? positive(*v, key) : def;
    }
    double number_or(const std::string& key, double def) const {
        const JsonValue* v = get(key);
        if (!v) return def;
        if (!v->is_number()) fail(key, std::string("expected a number, got ") + v->kind_name());
        return v->as_double();
    }
    std::array<double, 3> triple_or(const std::string& key, std::array<double, 3> def) const {
        const JsonValue* v = get(key);
        if (!v) return def;
        if (v->is_number()) return {v->as_double(), v->as_double(), v->as_double()};
        if (!v->is_array() || v->items().size() != 3) fail(key, "expected a list of 3 numbers");
        std::array<double, 3> out{};
        for (int i = 0; i < 3; ++i) {
            if (!v->items()[i].is_number()) fail(key, "expected a list of 3 numbers");
            out[i] = v->items()[i].as_double();
        }
        return out;
    }
};

}  // namespace

ImageProcessorConfig parse_image_processor_config(const std::string& json_text,
                                                  const std::string& source_name) {
    const JsonValue doc = parse_json_or_throw(json_text, source_name);
    if (!doc.is_object()) throw Error(source_name + ": expected a JSON object");
    const JsonValue* block = doc.find("image_processor");
    std::string where = source_name + ": image_processor.";
    if (!block) {
        block = &doc;  // preprocessor_config.json layout
        where = source_name + ": ";
    }
    if (!block->is_object()) throw Error(source_name + ": image_processor: expected an object");
    const Reader r{*block, where};
    ImageProcessorConfig c;
    if (const JsonValue* size = r.get("size")) {
        if (!size->is_object()) r.fail("size", "expected an object {shortest_edge, longest_edge}");
        const JsonValue* se = size->find("shortest_edge");
        const JsonValue* le = size->find("longest_edge");
        if (!se || !le) r.fail("size", "must have shortest_edge and longest_edge (min and max pixels)");
        c.min_pixels = r.positive(*se, "size.shortest_edge");
        c.max_pixels = r.positive(*le, "size.longest_edge");
    }
    c.min_pixels = r.positive_or("min_pixels", c.min_pixels);
    c.max_pixels = r.positive_or("max_pixels", c.max_pixels);
    if (c.min_pixels > c.max_pixels)
        r.fail("size", "shortest_edge " + std::to_string(c.min_pixels) + " is larger than longest_edge " +
                           std::to_string(c.max_pixels));
    c.patch_size = static_cast<int>(r.positive_or("patch_size", c.patch_size));
    c.merge_size = static_cast<int>(r.positive_or("merge_size", c.merge_size));
    c.temporal_patch_size = static_cast<int>(r.positive_or("temporal_patch_size", c.temporal_patch_size));
    if (c.patch_size > 1024 || c.merge_size > 64 || c.temporal_patch_size > 64)
        r.fail("patch_size", "patch, merge or temporal patch size out of range");
    c.do_resize = r.boolean("do_resize", true);
    c.do_rescale = r.boolean("do_rescale", true);
    c.do_normalize = r.boolean("do_normalize", true);
    if (!r.boolean("do_convert_rgb", true)) r.fail("do_convert_rgb", "false is not supported");
    if (!c.do_resize) r.fail("do_resize", "false is not supported (the patch grid needs the smart resize)");
    c.rescale_factor = r.number_or("rescale_factor", c.rescale_factor);
    if (!(c.rescale_factor > 0)) r.fail("rescale_factor", "must be positive");
    c.image_mean = r.triple_or("image_mean", c.image_mean);
    c.image_std = r.triple_or("image_std", c.image_std);
    for (double s : c.image_std)
        if (!(s > 0)) r.fail("image_std", "must be positive");
    c.resample = static_cast<int>(r.number_or("resample", 3));
    if (c.resample != 3)
        r.fail("resample", std::to_string(c.resample) + " is not supported (only 3 = bicubic)");
    return c;
}

ImageProcessorConfig load_image_processor_config(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    return parse_image_processor_config(ss.str(), path);
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

SmartResize smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
    if (height < factor || width < factor)
        throw ImageError("image is " + std::to_string(width) + "x" + std::to_string(height) +
                         " pixels; both sides must be at least " + std::to_string(factor) + " pixels");
    const double ratio =
        static_cast<double>(std::max(height, width)) / static_cast<double>(std::min(height, width));
    if (ratio > 200)
        throw ImageError("image is " + std::to_string(width) + "x" + std::to_string(height) +
                         " pixels; the aspect ratio must be at most 200:1");
    const double f = factor;
    // Python round(): half to even, which nearbyint gives in the default rounding mode.
    int64_t h = static_cast<int64_t>(std::nearbyint(height / f)) * factor;
    int64_t w = static_cast<int64_t>(std::nearbyint(width / f)) * factor;
    SmartResize r;
    r.branch = (h == height && w == width) ? ResizeBranch::None : ResizeBranch::Round;
    const double hw = static_cast<double>(int64_t{height} * width);
    if (h * w > max_pixels) {
        const double beta = std::sqrt(hw / static_cast<double>(max_pixels));
        h = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(height / beta / f)) * factor);
        w = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(width / beta / f)) * factor);
        r.branch = ResizeBranch::MaxPixels;
    } else if (h * w < min_pixels) {
        const double beta = std::sqrt(static_cast<double>(min_pixels) / hw);
        h = static_cast<int64_t>(std::ceil(height * beta / f)) * factor;
        w = static_cast<int64_t>(std::ceil(width * beta / f)) * factor;
        r.branch = ResizeBranch::MinPixels;
    }
    if (h > (int64_t{1} << 20) || w > (int64_t{1} << 20)) throw ImageError("image is too large to resize");
    r.height = static_cast<int>(h);
    r.width = static_cast<int>(w);
    return r;
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

std::vector<float> pixel_values(const ProcessedImage& img, const ImageProcessorConfig& cfg) {
    const int P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
    const int dim = cfg.patch_dim();
    const auto norm = normalisation_table(cfg);
    std::vector<float> out(static_cast<size_t>(img.num_patches()) * dim);
    float* row = out.data();
    for (int bh = 0; bh < img.merged_h; ++bh)
        for (int bw = 0; bw < img.merged_w; ++bw)
            for (int mh = 0; mh < M; ++mh)
                for (int mw = 0; mw < M; ++mw, row += dim) {
                    const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
                    float* o = row;
                    for (int c = 0; c < 3; ++c)
                        for (int t = 0; t < T; ++t)  // the frames are copies of the still image
                            for (int y = 0; y < P; ++y) {
                                const uint8_t* s = img.resized.row(y0 + y) + static_cast<size_t>(x0) * 3 + c;
                                for (int x = 0; x < P; ++x) *o++ = norm[c][s[3 * x]];
                            }
                }
    return out;
}

}  // namespace clef
