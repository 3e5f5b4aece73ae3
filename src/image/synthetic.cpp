#include "image/synthetic.h"

#include <string>

#include "util/error.h"

namespace clef {

RgbImage synthetic_image(int width, int height, uint64_t seed) {
    if (width < 1 || height < 1 || width > 65536 || height > 65536)
        throw Error("synthetic image: " + std::to_string(width) + "x" + std::to_string(height) +
                    " is not a size in [1, 65536] x [1, 65536]");
    RgbImage img(width, height);
    uint64_t s = seed;
    for (int y = 0; y < height; ++y)
        for (int x = 0; x < width; ++x) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t* p = img.row(y) + 3 * x;
            p[0] = static_cast<uint8_t>((static_cast<int64_t>(x) * 255) / width);
            p[1] = static_cast<uint8_t>((static_cast<int64_t>(y) * 255) / height);
            p[2] = static_cast<uint8_t>(s >> 56);
        }
    return img;
}

}  // namespace clef
