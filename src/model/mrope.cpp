#include "model/mrope.h"

#include <algorithm>

namespace clef {

std::vector<int32_t> mrope_position_ids(const std::vector<int32_t>& types,
                                        const std::vector<MediaGrid>& images, int* rope_delta) {
    const int64_t T = static_cast<int64_t>(types.size());
    std::vector<int32_t> pos(static_cast<size_t>(3 * T));
    int32_t p = 0, max_pos = -1;
    size_t next_image = 0;
    for (int64_t t = 0; t < T;) {
        if (types[static_cast<size_t>(t)] == 1 && next_image < images.size()) {
            const MediaGrid& img = images[next_image++];
            const int64_t n = std::min<int64_t>(img.tokens, T - t);
            for (int64_t k = 0; k < n; ++k, ++t) {
                const int32_t r = static_cast<int32_t>(k / img.cols), c = static_cast<int32_t>(k % img.cols);
                pos[static_cast<size_t>(t)] = p;
                pos[static_cast<size_t>(T + t)] = p + r;
                pos[static_cast<size_t>(2 * T + t)] = p + c;
                max_pos = std::max({max_pos, p + r, p + c});
            }
            p += std::max(img.rows, img.cols);
        } else {
            pos[static_cast<size_t>(t)] = pos[static_cast<size_t>(T + t)] =
                pos[static_cast<size_t>(2 * T + t)] = p;
            max_pos = std::max(max_pos, p);
            ++p;
            ++t;
        }
    }
    if (rope_delta) *rope_delta = static_cast<int>(max_pos + 1 - T);
    return pos;
}

}  // namespace clef
