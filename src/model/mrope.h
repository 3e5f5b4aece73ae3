// Qwen-VL's multimodal rotary positions (interleaved MRoPE, axes t, h, w), as Qwen3.5's get_rope_index builds
// them: a text token at running position p has (p, p, p); an image whose merged patch grid is rows x cols,
// starting at p, gives its token k = r·cols + c the position (p, p + r, p + c), and text resumes at
// p + max(rows, cols).
#pragma once

#include <cstdint>
#include <vector>

namespace clef {

// One image's run of pad tokens in the prompt.
struct MediaGrid {
    int64_t tokens = 0;          // pad tokens (rows · cols per frame)
    int32_t rows = 0, cols = 0;  // the merged patch grid
};

// [3][T] positions for a prompt whose mm_token_type_ids are 1 on the images' pad tokens (runs in `media`
// order); rope_delta = max position + 1 − T.
std::vector<int32_t> mrope_position_ids(const std::vector<int32_t>& mm_token_type_ids,
                                        const std::vector<MediaGrid>& media, int* rope_delta = nullptr);

}  // namespace clef
