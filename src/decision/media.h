// Images in the prompt, as the reference builds them (`_encode_media` + the HF processor + Qwen3.5's
// get_rope_index / get_placeholder_mask):
//   - the media block "<|vision_start|><|image_pad|><|vision_end|>" per image, then one "\n", each pad
//   expanded to
//     that image's merged-token count, goes right after the prefix;
//   - mm_token_type_ids is 1 on the block's pads;
//   - the pads' embeddings are replaced, in order, by the vision tower's output rows; a literal <|image_pad|>
//   in
//     the text makes the counts disagree and the request is refused (the reference model raises);
//   - positions are interleaved MRoPE (model/mrope.h).
#pragma once

#include <cstdint>
#include <vector>

#include "decision/prompt.h"
#include "image/image.h"
#include "image/preprocess.h"

namespace clef {

class Tokenizer;

// The image-token count check of the reference model (transformers get_placeholder_mask): a 400-class error.
class ImageTokenMismatch : public ImageError {
public:
    ImageTokenMismatch(int64_t tokens, int64_t features);
    int64_t tokens;
    int64_t features;
};

// The expanded media block for these images (text and ids).
MediaBlock build_media_block(const Tokenizer& tok, const std::vector<ProcessedImage>& images);

// [T]: 1 on the media block's <|image_pad|> ids (the block starts at prompt.media_token_offset), 0 elsewhere.
std::vector<int32_t> media_token_type_ids(const EncodedPrompt& prompt, const MediaBlock& media,
                                          int32_t image_token_id);

// Throws ImageTokenMismatch when input_ids hold a different number of image_token_id ids than `features`.
void check_image_tokens(const std::vector<int32_t>& input_ids, int32_t image_token_id, int64_t features);

// Overwrites the rows of x [T][hidden] whose mm_token_type_ids is 1 with the image features, in order (each
// features[i] is [tokens_i][hidden]). Throws ImageTokenMismatch when the counts differ.
void substitute_image_embeddings(std::vector<float>& x, int64_t hidden,
                                 const std::vector<int32_t>& mm_token_type_ids,
                                 const std::vector<std::vector<float>>& features);

}  // namespace clef
