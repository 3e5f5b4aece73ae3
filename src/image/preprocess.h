// The image processor of the reference (transformers Qwen2VLImageProcessorFast, torchvision backend), as
// processor_config.json's "image_processor" block selects it:
//   smart_resize (factor = patch_size · merge_size, Python round-half-to-even, bounds from size.shortest_edge
//   / size.longest_edge), PyTorch's uint8 antialiased bicubic resize, the fused rescale + normalise in
//   float32, temporal duplication of the still image, and patch rows in 2x2 merge-block order with columns
//   (channel, frame, y, x).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "image/image.h"

namespace clef {

struct ImageProcessorConfig {
    int64_t min_pixels = 56 * 56;         // size.shortest_edge (min_pixels overrides)
    int64_t max_pixels = 28 * 28 * 1280;  // size.longest_edge (max_pixels overrides)
    int patch_size = 14;
    int merge_size = 2;
    int temporal_patch_size = 2;
    bool do_resize = true;
    bool do_rescale = true;
    bool do_normalize = true;
    double rescale_factor = 1.0 / 255.0;
    std::array<double, 3> image_mean{0.48145466, 0.4578275,
                                     0.40821073};  // OPENAI_CLIP_MEAN (the class default)
    std::array<double, 3> image_std{0.26862954, 0.26130258, 0.27577711};
    int resample = 3;  // PIL BICUBIC, the only filter supported

    int factor() const { return patch_size * merge_size; }
    int patch_dim() const { return 3 * temporal_patch_size * patch_size * patch_size; }
};

// Reads the "image_processor" block of processor_config.json (or a bare image-processor dict, as
// preprocessor_config.json holds it). Unknown keys are ignored; unsupported settings (another resample
// filter, do_convert_rgb false, ...) throw clef::Error("<source>: image_processor.<key>: ...").
ImageProcessorConfig parse_image_processor_config(const std::string& json_text,
                                                  const std::string& source_name);
ImageProcessorConfig load_image_processor_config(const std::string& path);
// The "video_processor" block of processor_config.json (the same keys; its size bounds apply to all frames of
// a video together, image/video.h), or nullopt when the file has none.
std::optional<ImageProcessorConfig> parse_video_processor_config(const std::string& json_text,
                                                                 const std::string& source_name);
std::optional<ImageProcessorConfig> load_video_processor_config(const std::string& path);
// Clef-Flash's published image processor (min/max pixels 65536 / 16777216, mean and std 0.5) on the given
// vision geometry: the settings of a model directory without a processor config.
ImageProcessorConfig clef_flash_image_processor(int patch_size, int merge_size, int temporal_patch_size);
// Clef-Flash's published video processor: the same with min/max pixels 4096 / 25165824 over all frames.
ImageProcessorConfig clef_flash_video_processor(int patch_size, int merge_size, int temporal_patch_size);

enum class ResizeBranch { None, Round, MinPixels, MaxPixels };
const char* resize_branch_name(ResizeBranch b);  // "none", "round", "min_pixels", "max_pixels"

struct SmartResize {
    int height = 0;
    int width = 0;
    ResizeBranch branch = ResizeBranch::None;  // None: rounding left the size unchanged
};

// transformers smart_resize. Throws ImageError when a side is below the factor or the aspect ratio exceeds
// 200.
SmartResize smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels);
// The same over `frames` frames whose count rounds to t_bar (the video form, image/video.h): the bounds apply
// to t_bar·h̄·w̄ and β is computed over frames·h·w. smart_resize is (1, 1, ...).
SmartResize smart_resize_frames(int64_t frames, int64_t t_bar, int height, int width, int factor,
                                int64_t min_pixels, int64_t max_pixels);

// One image after resizing: what the prompt (token count, positions) and the vision tower need.
struct ProcessedImage {
    RgbImage resized;
    int source_height = 0, source_width = 0;  // the decoded (EXIF-oriented) size
    ResizeBranch branch = ResizeBranch::None;
    int grid_t = 1, grid_h = 0, grid_w = 0;  // patches
    int merged_h = 0, merged_w = 0;          // tokens: grid / merge_size
    int num_tokens() const { return merged_h * merged_w; }
    int num_patches() const { return grid_t * grid_h * grid_w; }
};

ProcessedImage process_image(const RgbImage& rgb, const ImageProcessorConfig& cfg);

// The processor's pixel_values for one image: [num_patches][patch_dim] float32, rows in merge-block order
// (blocks row-major; inside a block (0,0), (0,1), (1,0), (1,1)), columns (channel, frame, y, x).
std::vector<float> pixel_values(const ProcessedImage& img, const ImageProcessorConfig& cfg);

// The patch rows of grid_t temporal groups: frames[g·T + t] (T = temporal_patch_size) is frame t of group g,
// every frame (merged_h·merge) x (merged_w·merge) patches. Rows by group, then merge-block order; columns
// (channel, frame in group, y, x).
std::vector<float> patch_rows(const std::vector<const RgbImage*>& frames, int grid_t, int merged_h,
                              int merged_w, const ImageProcessorConfig& cfg);

// (x - mean) / std per channel for x = 0..255 in float32, as the fused torchvision path computes it.
std::array<std::array<float, 256>, 3> normalisation_table(const ImageProcessorConfig& cfg);

}  // namespace clef
