#include "decision/media.h"

#include <algorithm>
#include <cstring>

#include "decision/state_cache.h"
#include "model/vision.h"
#include "tokenizer/tokenizer.h"

namespace clef {

namespace {

std::string mismatch_message(int64_t t, int64_t f, bool video) {
    const char* kind = video ? "Video" : "Image";
    const char* lower = video ? "video" : "image";
    std::string m = std::string(kind) + " features and " + lower +
                    " tokens do not match, tokens: " + std::to_string(t) + ", features: " + std::to_string(f);
    if (t > f)
        m += std::string(" (the request text contains the literal <|") + lower +
             "_pad|> token, which is reserved for " + lower + "s)";
    return m;
}

void check_tokens(const std::vector<int32_t>& input_ids, int32_t token_id, int64_t features, bool video) {
    const int64_t tokens = std::count(input_ids.begin(), input_ids.end(), token_id);
    if (tokens != features) throw ImageTokenMismatch(tokens, features, video);
}

// Copies the feature rows of one kind into the rows of x whose type is `kind`, in order.
void substitute_kind(std::vector<float>& x, int64_t hidden, const std::vector<int32_t>& types, int32_t kind,
                     const std::vector<std::vector<float>>& features) {
    int64_t rows = 0, slots = 0;
    for (const auto& f : features) rows += static_cast<int64_t>(f.size()) / hidden;
    for (int32_t v : types) slots += v == kind;
    if (rows != slots) throw ImageTokenMismatch(slots, rows, kind == 2);
    size_t item = 0;
    int64_t row = 0;
    for (size_t t = 0; t < types.size(); ++t) {
        if (types[t] != kind) continue;
        while (row * hidden >= static_cast<int64_t>(features[item].size())) {
            ++item;
            row = 0;
        }
        std::memcpy(x.data() + t * static_cast<size_t>(hidden), features[item].data() + row * hidden,
                    sizeof(float) * static_cast<size_t>(hidden));
        ++row;
    }
}

// FNV-1a over 64-bit words, then a final mix.
uint64_t mix(uint64_t h, uint64_t v) {
    return (h ^ v) * 0x100000001b3ull;
}

}  // namespace

ImageTokenMismatch::ImageTokenMismatch(int64_t t, int64_t f, bool v)
    : ImageError(mismatch_message(t, f, v)), tokens(t), features(f), video(v) {}

std::vector<ProcessedImage> process_images(const std::vector<DecodedImage>& images,
                                           const ImageProcessorConfig& cfg) {
    std::vector<ProcessedImage> out;
    for (size_t i = 0; i < images.size(); ++i) {
        try {
            out.push_back(process_image(images[i].rgb, cfg));
        } catch (const ImageError& e) {
            throw ImageError("images[" + std::to_string(i) + "]: " + e.what());
        }
    }
    return out;
}

std::vector<ProcessedVideo> process_videos(const std::vector<DecodedVideo>& videos,
                                           const ImageProcessorConfig& cfg) {
    std::vector<ProcessedVideo> out;
    for (size_t i = 0; i < videos.size(); ++i) {
        try {
            out.push_back(process_video(videos[i], cfg));
        } catch (const ImageError& e) {
            throw ImageError("videos[" + std::to_string(i) + "]: " + e.what());
        }
    }
    return out;
}

MediaBlock build_media_block(const Tokenizer& tok, const std::vector<ProcessedImage>& images,
                             const std::vector<ProcessedVideo>& videos) {
    MediaBlock m;
    for (const ProcessedImage& img : images) {
        m.text += "<|vision_start|>";
        for (int i = 0; i < img.num_tokens(); ++i) m.text += "<|image_pad|>";
        m.text += "<|vision_end|>";
    }
    for (const ProcessedVideo& v : videos) {
        m.text += "<|vision_start|>";
        for (int g = 0; g < v.grid_t; ++g) {
            m.text += v.timestamp_texts[static_cast<size_t>(g)] + "<|vision_start|>";
            for (int i = 0; i < v.tokens_per_group(); ++i) m.text += "<|video_pad|>";
            m.text += "<|vision_end|>";
        }
        m.text += "<|vision_end|>";
    }
    m.text += "\n";
    m.ids = tok.encode(m.text);
    return m;
}

std::vector<int32_t> media_token_type_ids(const EncodedPrompt& prompt, const MediaBlock& media,
                                          MediaTokenIds ids) {
    std::vector<int32_t> types(prompt.input_ids.size(), 0);
    if (prompt.media_token_offset < 0) return types;
    const size_t begin = static_cast<size_t>(prompt.media_token_offset);
    const size_t end = std::min(types.size(), begin + media.ids.size());
    for (size_t t = begin; t < end; ++t)
        types[t] = prompt.input_ids[t] == ids.image ? 1 : prompt.input_ids[t] == ids.video ? 2 : 0;
    return types;
}

void check_image_tokens(const std::vector<int32_t>& input_ids, int32_t image_token_id, int64_t features) {
    check_tokens(input_ids, image_token_id, features, false);
}

void check_video_tokens(const std::vector<int32_t>& input_ids, int32_t video_token_id, int64_t features) {
    check_tokens(input_ids, video_token_id, features, true);
}

std::vector<MediaGrid> image_grids(const std::vector<ProcessedImage>& images) {
    std::vector<MediaGrid> g;
    for (const ProcessedImage& img : images) g.push_back({img.num_tokens(), img.merged_h, img.merged_w});
    return g;
}

std::vector<MediaGrid> video_group_grids(const std::vector<ProcessedVideo>& videos) {
    std::vector<MediaGrid> g;
    for (const ProcessedVideo& v : videos)
        for (int t = 0; t < v.grid_t; ++t) g.push_back({v.tokens_per_group(), v.merged_h, v.merged_w});
    return g;
}

MediaLayout lay_out_media(const EncodedPrompt& prompt, const MediaBlock& media, MediaTokenIds ids,
                          const std::vector<ProcessedImage>& images,
                          const std::vector<ProcessedVideo>& videos) {
    int64_t image_features = 0, video_features = 0;
    for (const ProcessedImage& img : images) image_features += img.num_tokens();
    for (const ProcessedVideo& v : videos) video_features += v.num_tokens();
    // The model checks images first (get_placeholder_mask for the image features, then the video ones).
    if (!images.empty()) check_image_tokens(prompt.input_ids, ids.image, image_features);
    if (!videos.empty()) check_video_tokens(prompt.input_ids, ids.video, video_features);
    MediaLayout l;
    l.mm_token_type_ids = media_token_type_ids(prompt, media, ids);
    l.position_ids = mrope_position_ids(l.mm_token_type_ids, image_grids(images), video_group_grids(videos),
                                        &l.rope_delta);
    return l;
}

uint64_t media_cache_key(const std::vector<ProcessedImage>& images,
                         const std::vector<ProcessedVideo>& videos) {
    uint64_t h = media_key_of(images);
    if (videos.empty()) return h;
    h = mix(h, 0x766964656f73ull);  // "videos"
    for (const ProcessedVideo& v : videos) {
        h = mix(h, static_cast<uint64_t>(v.frames.size()) << 32 | static_cast<uint32_t>(v.grid_t));
        for (const std::string& ts : v.timestamp_texts)
            for (char c : ts) h = mix(h, static_cast<uint8_t>(c));
        for (const RgbImage& f : v.frames) {
            h = mix(h, static_cast<uint64_t>(f.width) << 32 | static_cast<uint32_t>(f.height));
            uint64_t word = 0;
            for (size_t j = 0; j < f.pixels.size(); ++j) {
                word = word << 8 | f.pixels[j];
                if (j % 8 == 7) h = mix(h, word), word = 0;
            }
            h = mix(h, word ^ f.pixels.size());
        }
    }
    h ^= h >> 29;
    return h == 0 ? 1 : h;
}

MediaFeatures vision_features(const VisionTower& tower, const std::vector<ProcessedImage>& images,
                              const ImageProcessorConfig& image_cfg,
                              const std::vector<ProcessedVideo>& videos,
                              const ImageProcessorConfig& video_cfg) {
    MediaFeatures f;
    for (const ProcessedImage& img : images) {
        const std::vector<float> pv = pixel_values(img, image_cfg);
        f.images.push_back(tower.forward(pv.data(), img.grid_t, img.grid_h, img.grid_w));
    }
    // A video is one tower pass over all its groups: attention stays within each group (one segment per
    // temporal patch), the position embedding and rotary tables repeat per group.
    for (const ProcessedVideo& v : videos) {
        const std::vector<float> pv = video_pixel_values(v, video_cfg);
        f.videos.push_back(tower.forward(pv.data(), v.grid_t, v.grid_h, v.grid_w));
    }
    return f;
}

void substitute_media_embeddings(std::vector<float>& x, int64_t hidden, const std::vector<int32_t>& types,
                                 const MediaFeatures& features) {
    substitute_kind(x, hidden, types, 1, features.images);
    substitute_kind(x, hidden, types, 2, features.videos);
}

}  // namespace clef
