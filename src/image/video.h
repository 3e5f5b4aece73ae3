// Videos sent as lists of frames, processed as the reference's processor does it (transformers
// Qwen3VLVideoProcessor with do_sample_frames false, and Qwen3VLProcessor's timestamps; the rules and their
// sources: tests/data/tiny-clef/README.md "Videos", docs/MEDIA.md):
//   - `videos` is a list of videos, each a list of frames in any image form (image/source.h); every frame is
//     decoded like an image (EXIF orientation, conversion to RGB) and all frames of a video have one size;
//   - `media_kwargs` is what the reference passes to the processor: do_sample_frames must be false (the
//     processor cannot sample a list of frames), video_metadata (one {total_num_frames, fps, frames_indices}
//     per video) only sets the timestamps (fps 24 and indices 0..N-1 without it);
//   - the video smart_resize bounds the pixels of all frames together (t̄·h̄·w̄, t̄ = N rounded half to even to a
//     multiple of temporal_patch_size), every frame goes through the image resize and normalisation, an odd
//     frame count repeats the last frame, and each temporal group of frames is one grid of patches;
//   - each group gets the text `<t seconds>` (the mean of its first and last frame's time, printed with one
//     decimal of the exact binary value, ties to even).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "image/image.h"
#include "image/preprocess.h"
#include "util/json.h"

namespace clef {

// Limits on the videos of one request, beyond the per-frame image limits (ImageLimits max_bytes, max_pixels).
struct VideoLimits {
    size_t max_videos = 4;                          // videos per request
    size_t max_frames = 256;                        // frames per video
    size_t max_total_bytes = size_t{12} << 20;      // encoded frame bytes of all videos together
    uint64_t max_total_pixels = uint64_t{1} << 26;  // decoded pixels of all frames of all videos (64 MP)
};

// One video's entry of media_kwargs.video_metadata.
struct VideoMetadata {
    double fps = 24.0;                   // the processor's fallback when fps is absent or null
    std::vector<int64_t> frame_indices;  // frames_indices; 0..N-1 without video_metadata
};

// The media_kwargs the reference hands to the processor, as far as frame lists use them.
struct MediaKwargs {
    bool do_sample_frames = true;  // Qwen3VLVideoProcessor's default
    bool has_metadata = false;
    std::vector<VideoMetadata> video_metadata;
};

// `media_kwargs` (null or absent: the defaults). Throws ImageError ("media_kwargs...: ...") on a wrong type,
// a malformed video_metadata entry, or a key clef does not honour (only do_sample_frames and
// video_metadata are accepted: anything else would change the processing).
MediaKwargs parse_media_kwargs(const JsonValue& kwargs);

struct DecodedVideo {
    std::vector<RgbImage> frames;  // decoded, all of one size
    VideoMetadata metadata;        // frame_indices filled (one per frame)
};

// The whole `videos` value with its media_kwargs: null, absent or [] gives no videos. Checks the counts
// (limits.max_videos, limits.max_frames) before decoding anything, refuses frame sampling with the
// processor's message, then decodes every frame (frame_limits per frame, limits.max_total_bytes and
// max_total_pixels over all of them) and checks that the frames of each video have one size and that each
// video has its metadata. Errors are ImageError with messages starting "videos: ", "videos[i]: ",
// "videos[i][j]: " or "media_kwargs...: ".
std::vector<DecodedVideo> decode_video_sources(const JsonValue& videos, const MediaKwargs& kwargs,
                                               const ImageLimits& frame_limits = {},
                                               const VideoLimits& limits = {});

// transformers' video smart_resize: h̄, w̄ rounded to the factor, t̄ = N rounded to temporal_factor (Python
// round: half to even), and the bounds applied to t̄·h̄·w̄ with β over N·h·w. Throws ImageError for fewer
// frames than temporal_factor ("t:N must be larger than temporal_factor:T", the processor's words), a side
// below the factor or an aspect ratio above 200.
SmartResize smart_resize_video(int frames, int height, int width, int temporal_factor, int factor,
                               int64_t min_pixels, int64_t max_pixels);

// The per-group timestamps (seconds) of Qwen3VLProcessor._calculate_timestamps: the indices padded with the
// last one to a multiple of temporal, index / fps, the mean of each group's first and last.
std::vector<double> video_group_timestamps(const std::vector<int64_t>& frame_indices, double fps,
                                           int temporal);
// "<t seconds>" as Python's f"<{t:.1f} seconds>" prints it.
std::string video_timestamp_text(double seconds);

// One video after resizing: what the prompt (tokens, timestamps, positions) and the vision tower need.
struct ProcessedVideo {
    std::vector<RgbImage> frames;  // resized, the source's N frames (the padding repeats frames.back())
    int source_height = 0, source_width = 0;
    ResizeBranch branch = ResizeBranch::None;
    int grid_t = 0, grid_h = 0, grid_w = 0;    // temporal groups, patches
    int merged_h = 0, merged_w = 0;            // tokens of one group: grid / merge_size
    std::vector<std::string> timestamp_texts;  // one per group
    int tokens_per_group() const { return merged_h * merged_w; }
    int64_t num_tokens() const { return int64_t{grid_t} * tokens_per_group(); }
    int64_t num_patches() const { return int64_t{grid_t} * grid_h * grid_w; }
};

// cfg is the video processor's (its size bounds are not the image processor's). Throws ImageError as
// smart_resize_video.
ProcessedVideo process_video(const DecodedVideo& video, const ImageProcessorConfig& cfg);

// pixel_values_videos of one video: [grid_t·grid_h·grid_w][patch_dim] float32, rows by temporal group, then
// in merge-block order; columns (channel, frame in group, y, x).
std::vector<float> video_pixel_values(const ProcessedVideo& video, const ImageProcessorConfig& cfg);

}  // namespace clef
