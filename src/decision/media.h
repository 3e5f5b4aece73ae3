// Images and videos in the prompt, as the reference builds them (`_encode_media` + the HF processor +
// Qwen3.5's get_rope_index / get_placeholder_mask; tests/data/tiny-clef/README.md "Images" and "Videos"):
//   - the media block goes right after the prefix: per image "<|vision_start|><|image_pad|><|vision_end|>",
//     each pad expanded to that image's merged-token count; then per video "<|vision_start|>", per temporal
//     group "<t seconds><|vision_start|>" + its <|video_pad|> ids + "<|vision_end|>", and "<|vision_end|>"
//     (the processor replaces only the video pad, so the reference's outer start/end stay); then one "\n";
//   - mm_token_type_ids is 1 on the block's image pads, 2 on its video pads;
//   - the pads' embeddings are replaced, in order, by the vision tower's output rows (images and videos
//     each in their own order); a literal <|image_pad|> or <|video_pad|> in the text makes the counts
//     disagree and the request is refused (the reference model raises);
//   - positions are interleaved MRoPE (model/mrope.h), each video group placed like a still image.
#pragma once

#include <cstdint>
#include <vector>

#include "decision/prompt.h"
#include "image/image.h"
#include "image/preprocess.h"
#include "image/video.h"
#include "model/mrope.h"

namespace clef {

class Tokenizer;
class VisionTower;

// The placeholder count check of the reference model (transformers get_placeholder_mask): a 400-class error.
class ImageTokenMismatch : public ImageError {
public:
    ImageTokenMismatch(int64_t tokens, int64_t features, bool video = false);
    int64_t tokens;
    int64_t features;
    bool video;  // <|video_pad|> ids against video features
};

// The placeholder ids of the tokenizer.
struct MediaTokenIds {
    int32_t image = -1;  // <|image_pad|>
    int32_t video = -1;  // <|video_pad|>
};

// Resizes the decoded images and videos with their processors; ImageError names the item ("images[i]: ",
// "videos[i]: ").
std::vector<ProcessedImage> process_images(const std::vector<DecodedImage>& images,
                                           const ImageProcessorConfig& cfg);
std::vector<ProcessedVideo> process_videos(const std::vector<DecodedVideo>& videos,
                                           const ImageProcessorConfig& cfg);

// The expanded media block for these images and videos (text and ids).
MediaBlock build_media_block(const Tokenizer& tok, const std::vector<ProcessedImage>& images,
                             const std::vector<ProcessedVideo>& videos = {});

// [T]: 1 on the media block's image pads, 2 on its video pads (the block starts at
// prompt.media_token_offset), 0 elsewhere.
std::vector<int32_t> media_token_type_ids(const EncodedPrompt& prompt, const MediaBlock& media,
                                          MediaTokenIds ids);

// Throws ImageTokenMismatch when input_ids hold a different number of token_id ids than `features`.
void check_image_tokens(const std::vector<int32_t>& input_ids, int32_t image_token_id, int64_t features);
void check_video_tokens(const std::vector<int32_t>& input_ids, int32_t video_token_id, int64_t features);

// What the prompt needs from the media once encoded: the placeholder checks, mm_token_type_ids and the
// MRoPE positions.
struct MediaLayout {
    std::vector<int32_t> mm_token_type_ids;  // [T]
    std::vector<int32_t> position_ids;       // [3][T]
    int rope_delta = 0;
};
MediaLayout lay_out_media(const EncodedPrompt& prompt, const MediaBlock& media, MediaTokenIds ids,
                          const std::vector<ProcessedImage>& images,
                          const std::vector<ProcessedVideo>& videos);

// The grids get_rope_index walks: one per image, one per temporal group of every video.
std::vector<MediaGrid> image_grids(const std::vector<ProcessedImage>& images);
std::vector<MediaGrid> video_group_grids(const std::vector<ProcessedVideo>& videos);

// The media's key in the state cache (0 without media): the resized pixels and grids of every image and
// video.
uint64_t media_cache_key(const std::vector<ProcessedImage>& images,
                         const std::vector<ProcessedVideo>& videos);

// The vision tower's rows: per image [tokens][out_hidden], per video [groups·tokens per group][out_hidden].
struct MediaFeatures {
    std::vector<std::vector<float>> images, videos;
};
MediaFeatures vision_features(const VisionTower& tower, const std::vector<ProcessedImage>& images,
                              const ImageProcessorConfig& image_cfg,
                              const std::vector<ProcessedVideo>& videos,
                              const ImageProcessorConfig& video_cfg);

// Overwrites the rows of x [T][hidden] whose mm_token_type_ids is 1 with the image features and those whose
// type is 2 with the video features, each in order. Throws ImageTokenMismatch when a count differs.
void substitute_media_embeddings(std::vector<float>& x, int64_t hidden,
                                 const std::vector<int32_t>& mm_token_type_ids,
                                 const MediaFeatures& features);

}  // namespace clef
