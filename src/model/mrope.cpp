#include "model/mrope.h"

#include <algorithm>

namespace clef {

std::vector<int32_t> mrope_position_ids(const std::vector<int32_t>& types,
                                        const std::vector<MediaGrid>& images,
                                        const std::vector<MediaGrid>& video_groups, int* rope_delta) {
    const int64_t T = static_cast<int64_t>(types.size());
    std::vector<int32_t> pos(static_cast<size_t>(3 * T));
    int32_t p = 0, max_pos = -1;
    size_t next[3] = {0, 0, 0};  // the next grid of each kind (1 image, 2 video group)
    const std::vector<MediaGrid>* grids[3] = {nullptr, &images, &video_groups};
    for (int64_t t = 0; t < T;) {
        const int32_t kind = types[static_cast<size_t>(t)];
        if ((kind == 1 || kind == 2) && next[kind] < grids[kind]->size()) {
            const MediaGrid& g = (*grids[kind])[next[kind]++];
            const int64_t n = std::min<int64_t>(g.tokens, T - t);
            for (int64_t k = 0; k < n; ++k, ++t) {
                const int32_t r = static_cast<int32_t>(k / g.cols), c = static_cast<int32_t>(k % g.cols);
                pos[static_cast<size_t>(t)] = p;
                pos[static_cast<size_t>(T + t)] = p + r;
                pos[static_cast<size_t>(2 * T + t)] = p + c;
                max_pos = std::max({max_pos, p + r, p + c});
            }
            p += std::max(g.rows, g.cols);
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

std::vector<int32_t> mrope_position_ids(const std::vector<int32_t>& types,
                                        const std::vector<MediaGrid>& images, int* rope_delta) {
    return mrope_position_ids(types, images, {}, rope_delta);
}

}  // namespace clef
