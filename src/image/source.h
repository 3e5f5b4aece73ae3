// The image forms a request may carry in its `images` list, turned into the encoded file bytes:
//   - a data URL                "data:image/png;base64,iVBOR..." (OpenJev, Workers AI, the reference);
//   - a bare base64 string      "iVBOR..." (Ollama);
//   - an object                 {"content_type": "image/png", "base64": "iVBOR..."} (Workers AI).
// The format is always sniffed from the bytes (as Pillow does); the declared media type is not trusted.
// Remote URLs and file paths are refused: the server never fetches or opens anything.
#pragma once

#include <string>
#include <vector>

#include "image/decode.h"
#include "image/image.h"
#include "util/json.h"

namespace clef {

enum class ImageSourceForm { DataUrl, Base64, Object };
const char* image_source_form_name(ImageSourceForm f);  // "data_url", "base64", "object"

struct ImageSource {
    ImageSourceForm form = ImageSourceForm::DataUrl;
    std::string content_type;  // as declared ("" for bare base64)
    std::string bytes;         // the encoded file
};

// One item of `images`. Throws ImageError (message without the "images[i]: " prefix) on a wrong type,
// malformed data URL or base64, an empty image, or more than limits.max_bytes bytes.
ImageSource parse_image_source(const JsonValue& item, const ImageLimits& limits = {});

// The whole `images` value: null (or absent) gives no images; otherwise it must be a list of at most
// limits.max_images items whose bytes total at most limits.max_total_bytes. Errors are ImageError with
// messages starting "images: " or "images[i]: ".
std::vector<ImageSource> parse_image_sources(const JsonValue& images, const ImageLimits& limits = {});

// parse_image_sources, then decode_image on each (EXIF orientation applied); errors name the image
// ("images[i]: ...").
std::vector<DecodedImage> decode_image_sources(const JsonValue& images, const ImageLimits& limits = {});

}  // namespace clef
