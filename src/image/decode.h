// Image decoding as the reference does it: transformers load_image = Pillow Image.open,
// ImageOps.exif_transpose, convert("RGB"). PNG through libpng, JPEG through libjpeg-turbo (its defaults, as
// Pillow: ISLOW IDCT, fancy upsampling), WebP through libwebp's animation decoder (as Pillow; the first
// frame). The conversion to RGB follows Pillow exactly:
//   L / 1 / 2- and 4-bit grey  -> R = G = B (1-, 2-, 4-bit values scaled by bit replication);
//   16-bit grey (Pillow mode I) -> clipped to 255 (not scaled: that is what convert("RGB") does);
//   LA, RGBA                   -> alpha dropped, no compositing;
//   P (palette)                -> the palette colours; tRNS transparency ignored;
//   other 16-bit PNGs          -> the high byte;
//   CMYK JPEG                  -> Pillow's cmyk2rgb (inverted first when an Adobe marker is present).
// EXIF orientation (tag 0x0112 of IFD0; from the JPEG APP1 "Exif" segment, the PNG eXIf chunk or
// "Raw profile type exif" text, the WebP EXIF chunk; for PNG also XMP tiff:Orientation) is applied.
#pragma once

#include <string>
#include <string_view>

#include "image/image.h"

namespace clef {

enum class ImageFormat { Unknown, Png, Jpeg, Webp, Gif, Bmp, Tiff, Heif, Avif, Ico, Pdf, Svg };
const char* image_format_name(ImageFormat f);  // "PNG", "JPEG", "WEBP", "GIF", ... (Pillow's spelling)

// Identifies the format from the leading bytes (the declared media type is never trusted).
ImageFormat sniff_image_format(std::string_view bytes);

struct DecodedImage {
    RgbImage rgb;  // after EXIF orientation and the conversion to RGB
    ImageFormat format = ImageFormat::Unknown;
    std::string mode;  // Pillow's mode of the stored image: 1, L, I, LA, P, RGB, RGBA, CMYK
    int stored_width = 0, stored_height = 0;  // before the EXIF orientation
    int exif_orientation = 0;                 // 0 when absent, else 1..8
};

// Decodes one PNG, JPEG or WebP file. Throws ImageError for an unsupported format, malformed or truncated
// data, or more than limits.max_pixels pixels (checked from the header, before any pixel is decoded).
DecodedImage decode_image(std::string_view bytes, const ImageLimits& limits = {});

// The EXIF orientation (1..8) of a TIFF-structured EXIF block (an optional leading "Exif\0\0" is skipped);
// 0 when absent or malformed.
int exif_orientation(std::string_view exif);

// Pillow's ImageOps.exif_transpose for orientation 2..8 (others: a copy).
RgbImage apply_exif_orientation(const RgbImage& img, int orientation);

}  // namespace clef
