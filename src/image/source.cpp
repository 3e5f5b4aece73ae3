#include "image/source.h"

#include <cstdio>
#include <string_view>

#include "image/base64.h"
#include "util/text.h"

namespace clef {

namespace {

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
    if (s.size() < prefix.size()) return false;
    for (size_t i = 0; i < prefix.size(); ++i) {
        if (ascii_lower(s[i]) != prefix[i]) return false;
    }
    return true;
}

bool ends_with_nocase(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && starts_with_nocase(s.substr(s.size() - suffix.size()), suffix);
}

std::string mib(size_t bytes) {
    const double m = static_cast<double>(bytes) / (1024.0 * 1024.0);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g MiB", m);
    return buf;
}

std::string decode_checked(std::string_view b64, const ImageLimits& limits) {
    if (b64.empty()) throw ImageError("empty image data");
    // The decoded size is known from the length: refuse oversized images before decoding them.
    if (b64.size() / 4 * 3 > limits.max_bytes + 2)
        throw ImageError("image is larger than " + std::to_string(limits.max_bytes) + " bytes (" +
                         mib(limits.max_bytes) + ")");
    std::string out, err;
    if (!base64_decode(b64, out, &err)) throw ImageError(err);
    if (out.size() > limits.max_bytes)
        throw ImageError("image is larger than " + std::to_string(limits.max_bytes) + " bytes (" +
                         mib(limits.max_bytes) + ")");
    if (out.empty()) throw ImageError("empty image data");
    return out;
}

}  // namespace

const char* image_source_form_name(ImageSourceForm f) {
    switch (f) {
        case ImageSourceForm::DataUrl:
            return "data_url";
        case ImageSourceForm::Base64:
            return "base64";
        case ImageSourceForm::Object:
            return "object";
    }
    return "?";
}

ImageSource parse_image_source(const JsonValue& item, const ImageLimits& limits) {
    ImageSource src;
    if (item.is_string()) {
        const std::string& s = item.as_string();
        if (starts_with_nocase(s, "data:")) {
            const size_t comma = s.find(',');
            if (comma == std::string::npos)
                throw ImageError("malformed data URL: expected data:image/<type>;base64,<data>");
            std::string_view header(s.data() + 5, comma - 5);
            if (!ends_with_nocase(header, ";base64"))
                throw ImageError("data URL is not base64-encoded: expected data:image/<type>;base64,<data>");
            header.remove_suffix(7);
            if (!starts_with_nocase(header, "image/"))
                throw ImageError("data URL media type '" + std::string(header.substr(0, 64)) +
                                 "' is not an image type (expected data:image/<type>;base64,<data>)");
            src.form = ImageSourceForm::DataUrl;
            src.content_type = std::string(header);
            src.bytes = decode_checked(std::string_view(s).substr(comma + 1), limits);
            return src;
        }
        if (starts_with_nocase(s, "http://") || starts_with_nocase(s, "https://") ||
            starts_with_nocase(s, "file:"))
            throw ImageError(
                "image URLs are not supported: send the image itself as a data URL "
                "(data:image/png;base64,...) or as base64");
        src.form = ImageSourceForm::Base64;
        src.bytes = decode_checked(s, limits);
        return src;
    }
    if (item.is_object()) {
        const JsonValue* b64 = item.find("base64");
        if (!b64)
            throw ImageError(
                "image object has no \"base64\" field (expected {\"content_type\", \"base64\"})");
        if (!b64->is_string())
            throw ImageError(std::string("image object \"base64\" must be a string, got ") +
                             b64->kind_name());
        if (const JsonValue* ct = item.find("content_type")) {
            if (!ct->is_string())
                throw ImageError(std::string("image object \"content_type\" must be a string, got ") +
                                 ct->kind_name());
            if (!starts_with_nocase(ct->as_string(), "image/"))
                throw ImageError("image object content_type '" + ct->as_string().substr(0, 64) +
                                 "' is not an image type");
            src.content_type = ct->as_string();
        }
        src.form = ImageSourceForm::Object;
        src.bytes = decode_checked(b64->as_string(), limits);
        return src;
    }
    throw ImageError(std::string("an image must be a data URL string, a base64 string or a "
                                 "{\"content_type\", \"base64\"} object, got ") +
                     item.kind_name());
}

std::vector<ImageSource> parse_image_sources(const JsonValue& images, const ImageLimits& limits) {
    std::vector<ImageSource> out;
    if (images.is_null()) return out;
    if (!images.is_array())
        throw ImageError(std::string("images: must be a list of images, got ") + images.kind_name());
    const auto& items = images.items();
    if (items.size() > limits.max_images)
        throw ImageError("images: too many images (" + std::to_string(items.size()) + "); at most " +
                         std::to_string(limits.max_images) + " per request");
    size_t total = 0;
    for (size_t i = 0; i < items.size(); ++i) {
        try {
            out.push_back(parse_image_source(items[i], limits));
        } catch (const ImageError& e) {
            throw ImageError("images[" + std::to_string(i) + "]: " + e.what());
        }
        total += out.back().bytes.size();
        if (total > limits.max_total_bytes)
            throw ImageError("images: more than " + std::to_string(limits.max_total_bytes) + " bytes (" +
                             mib(limits.max_total_bytes) + ") of images in one request");
    }
    return out;
}

std::vector<DecodedImage> decode_image_sources(const JsonValue& images, const ImageLimits& limits) {
    const std::vector<ImageSource> sources = parse_image_sources(images, limits);
    std::vector<DecodedImage> out;
    out.reserve(sources.size());
    for (size_t i = 0; i < sources.size(); ++i) {
        try {
            out.push_back(decode_image(sources[i].bytes, limits));
        } catch (const ImageError& e) {
            throw ImageError("images[" + std::to_string(i) + "]: " + e.what());
        }
    }
    return out;
}

}  // namespace clef
