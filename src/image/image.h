// Common types of the image module: 8-bit RGB images, the client-error exception and the request limits.
// The module turns what a client sends (data URLs, bare base64, {content_type, base64} objects) into the
// processor output the vision tower reads, bit for bit as the reference (transformers + Pillow + torchvision)
// does it. See docs/MEDIA.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/error.h"

namespace clef {

// An 8-bit RGB image, row-major, height x width x 3 (R, G, B).
struct RgbImage {
    int width = 0;
    int height = 0;
    std::vector<uint8_t> pixels;

    RgbImage() = default;
    RgbImage(int w, int h)
        : width(w), height(h), pixels(static_cast<size_t>(w) * static_cast<size_t>(h) * 3) {}
    uint8_t* row(int y) { return pixels.data() + static_cast<size_t>(y) * static_cast<size_t>(width) * 3; }
    const uint8_t* row(int y) const {
        return pixels.data() + static_cast<size_t>(y) * static_cast<size_t>(width) * 3;
    }
};

// Bad image input: malformed, truncated, unsupported or over a limit. A client error (HTTP 400
// api_usage_error); the message says what is wrong and never contains the image data.
class ImageError : public Error {
public:
    using Error::Error;
};

// Limits on the images of one request (defaults: the hosted Workers AI limits).
struct ImageLimits {
    size_t max_images = 4;                     // images per request
    size_t max_bytes = size_t{4} << 20;        // encoded file bytes per image (after base64 decoding)
    size_t max_total_bytes = size_t{8} << 20;  // encoded file bytes of all images together
    uint64_t max_pixels = uint64_t{1} << 24;   // decoded width x height per image (16 MP = 4096 x 4096)
};

}  // namespace clef
