#include "image/video.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "image/decode.h"
#include "image/resize.h"
#include "image/source.h"

namespace clef {

namespace {

std::string size_str(int width, int height) {
    return std::to_string(width) + "x" + std::to_string(height);
}

// The processor's message for a list of frames with sampling on, and how to turn it off.
const char* const kSamplingRefused =
    "Sampling frames from a list of images is not supported! Set `do_sample_frames=False`. "
    "(send \"media_kwargs\": {\"do_sample_frames\": false} with videos given as lists of frames)";

// A list of integers >= 0 (frames_indices).
std::vector<int64_t> parse_indices(const JsonValue& v, const std::string& where) {
    if (!v.is_array()) throw ImageError(where + ": must be a list of frame indices, got " + v.kind_name());
    std::vector<int64_t> out;
    for (const JsonValue& x : v.items()) {
        if (!x.is_int() || !x.fits_int64() || x.as_int64() < 0 || x.as_int64() > (int64_t{1} << 40))
            throw ImageError(where + ": must be a list of frame indices (integers from 0), got " +
                             write_json(x));
        out.push_back(x.as_int64());
    }
    return out;
}

// One entry of video_metadata (transformers VideoMetadata: total_num_frames required; fps and frames_indices
// optional there, but the timestamps need frames_indices, so it is required here).
VideoMetadata parse_metadata(const JsonValue& m, const std::string& where) {
    if (!m.is_object())
        throw ImageError(where + ": must be an object {total_num_frames, fps, frames_indices}, got " +
                         m.kind_name());
    const JsonValue* total = m.find("total_num_frames");
    if (!total || !total->is_int() || !total->fits_int64() || total->as_int64() < 1)
        throw ImageError(where + ".total_num_frames: required, a positive integer");
    VideoMetadata md;
    if (const JsonValue* fps = m.find("fps"); fps && !fps->is_null()) {
        if (!fps->is_number() || !(fps->as_double() > 0) || !std::isfinite(fps->as_double()))
            throw ImageError(where + ".fps: must be a positive number, got " + write_json(*fps));
        md.fps = fps->as_double();
    }
    const JsonValue* idx = m.find("frames_indices");
    if (!idx || idx->is_null())
        throw ImageError(where + ".frames_indices: required (the timestamps are computed from it)");
    md.frame_indices = parse_indices(*idx, where + ".frames_indices");
    return md;
}

// Every frame's encoded bytes, checked against the per-frame and the total byte limits.
std::vector<std::vector<ImageSource>> parse_frame_sources(const std::vector<JsonValue>& videos,
                                                          const ImageLimits& frame_limits,
                                                          const VideoLimits& limits) {
    std::vector<std::vector<ImageSource>> out(videos.size());
    size_t total = 0;
    for (size_t i = 0; i < videos.size(); ++i) {
        const auto& frames = videos[i].items();
        for (size_t j = 0; j < frames.size(); ++j) {
            try {
                out[i].push_back(parse_image_source(frames[j], frame_limits));
            } catch (const ImageError& e) {
                throw ImageError("videos[" + std::to_string(i) + "][" + std::to_string(j) + "]: " + e.what());
            }
            total += out[i].back().bytes.size();
            if (total > limits.max_total_bytes)
                throw ImageError("videos: more than " + std::to_string(limits.max_total_bytes) +
                                 " bytes of video frames in one request");
        }
    }
    return out;
}

// The shape of `videos` and the per-request counts, before anything is decoded.
void check_video_list(const JsonValue& videos, const VideoLimits& limits) {
    if (!videos.is_array())
        throw ImageError(std::string("videos: must be a list of videos (each a list of frames), got ") +
                         videos.kind_name());
    const auto& items = videos.items();
    if (items.size() > limits.max_videos)
        throw ImageError("videos: too many videos (" + std::to_string(items.size()) + "); at most " +
                         std::to_string(limits.max_videos) + " per request");
    for (size_t i = 0; i < items.size(); ++i) {
        const std::string where = "videos[" + std::to_string(i) + "]: ";
        if (!items[i].is_array())
            throw ImageError(where + "a video must be a list of frames (images), got " +
                             items[i].kind_name());
        if (items[i].items().empty()) throw ImageError(where + "empty video; a video is a list of frames");
        if (items[i].items().size() > limits.max_frames)
            throw ImageError(where + "too many frames (" + std::to_string(items[i].items().size()) +
                             "); at most " + std::to_string(limits.max_frames) + " per video");
    }
}

// One video's frames decoded; all of one size (the processor stacks them into one tensor).
std::vector<RgbImage> decode_frames(const std::vector<ImageSource>& sources, size_t video,
                                    const ImageLimits& frame_limits, uint64_t& pixels,
                                    const VideoLimits& limits) {
    std::vector<RgbImage> frames;
    for (size_t j = 0; j < sources.size(); ++j) {
        const std::string where = "videos[" + std::to_string(video) + "][" + std::to_string(j) + "]: ";
        try {
            frames.push_back(decode_image(sources[j].bytes, frame_limits).rgb);
        } catch (const ImageError& e) {
            throw ImageError(where + e.what());
        }
        const RgbImage& f = frames.back();
        pixels += static_cast<uint64_t>(f.width) * static_cast<uint64_t>(f.height);
        if (pixels > limits.max_total_pixels)
            throw ImageError("videos: more than " + std::to_string(limits.max_total_pixels) +
                             " decoded pixels of video frames in one request");
        if (f.width != frames[0].width || f.height != frames[0].height)
            throw ImageError(where + "frame is " + size_str(f.width, f.height) + " pixels but frame 0 is " +
                             size_str(frames[0].width, frames[0].height) +
                             "; all frames of a video must have the same size (stack expects each tensor to "
                             "be equal size)");
    }
    return frames;
}

}  // namespace

MediaKwargs parse_media_kwargs(const JsonValue& kwargs) {
    MediaKwargs out;
    if (kwargs.is_null()) return out;
    if (!kwargs.is_object())
        throw ImageError(std::string("media_kwargs: must be an object, got ") + kwargs.kind_name());
    for (const auto& [key, value] : kwargs.members()) {
        if (key == "do_sample_frames") {
            if (!value.is_bool())
                throw ImageError(std::string("media_kwargs.do_sample_frames: must be true or false, got ") +
                                 value.kind_name());
            out.do_sample_frames = value.as_bool();
        } else if (key == "video_metadata") {
            if (value.is_null()) continue;
            if (!value.is_array())
                throw ImageError(std::string("media_kwargs.video_metadata: must be a list (one entry per "
                                             "video), got ") +
                                 value.kind_name());
            out.has_metadata = true;
            for (size_t i = 0; i < value.items().size(); ++i)
                out.video_metadata.push_back(parse_metadata(
                    value.items()[i], "media_kwargs.video_metadata[" + std::to_string(i) + "]"));
        } else {
            throw ImageError("media_kwargs." + key.substr(0, 64) +
                             ": not supported (clef accepts do_sample_frames and video_metadata; the "
                             "processor's other settings come from the model's processor_config.json)");
        }
    }
    return out;
}

std::vector<DecodedVideo> decode_video_sources(const JsonValue& videos, const MediaKwargs& kwargs,
                                               const ImageLimits& frame_limits, const VideoLimits& limits) {
    if (videos.is_null() || (videos.is_array() && videos.items().empty())) return {};
    check_video_list(videos, limits);
    if (kwargs.do_sample_frames) throw ImageError(std::string("videos: ") + kSamplingRefused);
    const auto& items = videos.items();
    if (kwargs.has_metadata && kwargs.video_metadata.size() != items.size())
        throw ImageError("media_kwargs.video_metadata: " + std::to_string(kwargs.video_metadata.size()) +
                         " entries for " + std::to_string(items.size()) + " videos; send one per video");
    const std::vector<std::vector<ImageSource>> sources = parse_frame_sources(items, frame_limits, limits);
    std::vector<DecodedVideo> out(items.size());
    uint64_t pixels = 0;
    for (size_t i = 0; i < items.size(); ++i) {
        DecodedVideo& v = out[i];
        v.frames = decode_frames(sources[i], i, frame_limits, pixels, limits);
        const int64_t n = static_cast<int64_t>(v.frames.size());
        if (kwargs.has_metadata)
            v.metadata = kwargs.video_metadata[i];
        else
            for (int64_t k = 0; k < n; ++k) v.metadata.frame_indices.push_back(k);
        if (static_cast<int64_t>(v.metadata.frame_indices.size()) != n)
            throw ImageError("media_kwargs.video_metadata[" + std::to_string(i) +
                             "].frames_indices: " + std::to_string(v.metadata.frame_indices.size()) +
                             " indices for " + std::to_string(n) + " frames; send one index per frame");
    }
    return out;
}

SmartResize smart_resize_video(int frames, int height, int width, int temporal_factor, int factor,
                               int64_t min_pixels, int64_t max_pixels) {
    if (frames < temporal_factor)
        throw ImageError("t:" + std::to_string(frames) +
                         " must be larger than temporal_factor:" + std::to_string(temporal_factor) +
                         " (a video needs at least " + std::to_string(temporal_factor) + " frames)");
    const int64_t t_bar =
        static_cast<int64_t>(std::nearbyint(static_cast<double>(frames) / temporal_factor)) * temporal_factor;
    return smart_resize_frames(frames, t_bar, height, width, factor, min_pixels, max_pixels);
}

std::vector<double> video_group_timestamps(const std::vector<int64_t>& frame_indices, double fps,
                                           int temporal) {
    std::vector<int64_t> idx = frame_indices;
    while (!idx.empty() && idx.size() % static_cast<size_t>(temporal) != 0) idx.push_back(idx.back());
    std::vector<double> out;
    for (size_t g = 0; g < idx.size(); g += static_cast<size_t>(temporal)) {
        const double first = static_cast<double>(idx[g]) / fps;
        const double last = static_cast<double>(idx[g + static_cast<size_t>(temporal) - 1]) / fps;
        out.push_back((first + last) / 2);
    }
    return out;
}

std::string video_timestamp_text(double seconds) {
    // printf's %.1f rounds the exact binary value, ties to even in the default rounding mode: as Python.
    const int n = std::snprintf(nullptr, 0, "<%.1f seconds>", seconds);
    std::string s(static_cast<size_t>(n) + 1, '\0');
    std::snprintf(s.data(), s.size(), "<%.1f seconds>", seconds);
    s.pop_back();
    return s;
}

ProcessedVideo process_video(const DecodedVideo& video, const ImageProcessorConfig& cfg) {
    const int n = static_cast<int>(video.frames.size());
    const int T = cfg.temporal_patch_size;
    const int height = n ? video.frames[0].height : 0, width = n ? video.frames[0].width : 0;
    const SmartResize s =
        smart_resize_video(n, height, width, T, cfg.factor(), cfg.min_pixels, cfg.max_pixels);
    ProcessedVideo p;
    p.source_height = height;
    p.source_width = width;
    p.branch = s.branch;
    for (const RgbImage& f : video.frames) p.frames.push_back(resize_bicubic_aa(f, s.width, s.height));
    p.grid_t = (n + T - 1) / T;
    p.grid_h = s.height / cfg.patch_size;
    p.grid_w = s.width / cfg.patch_size;
    p.merged_h = p.grid_h / cfg.merge_size;
    p.merged_w = p.grid_w / cfg.merge_size;
    for (double t : video_group_timestamps(video.metadata.frame_indices, video.metadata.fps, T))
        p.timestamp_texts.push_back(video_timestamp_text(t));
    return p;
}

std::vector<float> video_pixel_values(const ProcessedVideo& video, const ImageProcessorConfig& cfg) {
    std::vector<const RgbImage*> frames;
    const size_t slots = static_cast<size_t>(video.grid_t) * static_cast<size_t>(cfg.temporal_patch_size);
    for (size_t k = 0; k < slots; ++k) frames.push_back(&video.frames[std::min(k, video.frames.size() - 1)]);
    return patch_rows(frames, video.grid_t, video.merged_h, video.merged_w, cfg);
}

}  // namespace clef
