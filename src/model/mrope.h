// Qwen-VL's multimodal rotary positions (interleaved MRoPE, axes t, h, w), as Qwen3.5's get_rope_index builds
// them: a text token at running position p has (p, p, p); an image whose merged patch grid is rows x cols,
// starting at p, gives its token k = r·cols + c the position (p, p + r, p + c), and text resumes at
// p + max(rows, cols). A video is split into its temporal groups first, and each group is placed the same way
// (the T position is p for every token of the group; the text between groups counts on as text).
#pragma once

#include <cstdint>
#include <vector>

namespace clef {

// One run of pad tokens in the prompt: an image, or one temporal group of a video.
struct MediaGrid {
    int64_t tokens = 0;          // pad tokens (rows · cols)
    int32_t rows = 0, cols = 0;  // the merged patch grid
};

// [3][T] positions for a prompt whose mm_token_type_ids are 1 on the images' pad tokens and 2 on the videos'
// (each run takes the next grid of its kind: `images` in order, `video_groups` in order); rope_delta = max
// position + 1 − T.
std::vector<int32_t> mrope_position_ids(const std::vector<int32_t>& mm_token_type_ids,
                                        const std::vector<MediaGrid>& images,
                                        const std::vector<MediaGrid>& video_groups,
                                        int* rope_delta = nullptr);
// The same without videos.
std::vector<int32_t> mrope_position_ids(const std::vector<int32_t>& mm_token_type_ids,
                                        const std::vector<MediaGrid>& images, int* rope_delta = nullptr);

}  // namespace clef
