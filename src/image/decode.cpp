#include "image/decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

// clang-format off
#include <png.h>
#include <jpeglib.h>
#include <jerror.h>
#include <webp/decode.h>
#include <webp/demux.h>
// clang-format on

namespace clef {

namespace {

// ---------------------------------------------------------------------------------------------------------
// Format sniffing

bool has_prefix(std::string_view s, std::string_view p) {
    return s.size() >= p.size() && s.substr(0, p.size()) == p;
}

std::string too_many_pixels(uint64_t w, uint64_t h, uint64_t max_pixels) {
    return "image is " + std::to_string(w) + "x" + std::to_string(h) + " pixels, more than the limit of " +
           std::to_string(max_pixels) + " pixels";
}

// ---------------------------------------------------------------------------------------------------------
// EXIF

uint32_t rd16(const unsigned char* p, bool le) {
    return le ? (p[0] | p[1] << 8) : (p[0] << 8 | p[1]);
}
uint32_t rd32(const unsigned char* p, bool le) {
    return le ? (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24)
              : (uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]});
}

// ---------------------------------------------------------------------------------------------------------
// Pixel conversions

RgbImage from_channels(const unsigned char* buf, size_t rowbytes, int w, int h, int channels) {
    RgbImage out(w, h);
    for (int y = 0; y < h; ++y) {
        const unsigned char* s = buf + static_cast<size_t>(y) * rowbytes;
        uint8_t* d = out.row(y);
        for (int x = 0; x < w; ++x, s += channels, d += 3) {
            if (channels <= 2) {
                d[0] = d[1] = d[2] = s[0];
            } else {
                d[0] = s[0];
                d[1] = s[1];
                d[2] = s[2];
            }
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------------------------
// PNG (libpng). Errors longjmp; the function that calls setjmp holds no object with a destructor.

struct PngJob {
    const unsigned char* data;
    size_t size;
    size_t pos;
    uint64_t max_pixels;
    char message[256];
    // Results.
    png_uint_32 width, height;
    int bit_depth, color_type;
    int out_channels, out_bit_depth;
    size_t rowbytes;
    unsigned char* pixels;  // malloc'd, rowbytes * height
    png_bytep* rows;        // malloc'd
    unsigned char* exif;    // malloc'd copy of the eXIf chunk (or the "Raw profile type exif" text)
    size_t exif_size;
    int raw_profile_exif;  // exif holds the hex text of "Raw profile type exif"
    unsigned char* xmp;    // malloc'd copy of the XML:com.adobe.xmp text
    size_t xmp_size;
    int too_large;
};

void png_read_cb(png_structp png, png_bytep out, size_t n) {
    auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
    if (n > job->size - job->pos) png_error(png, "unexpected end of data (truncated file)");
    std::memcpy(out, job->data + job->pos, n);
    job->pos += n;
}

void png_error_cb(png_structp png, png_const_charp msg) {
    auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
    std::snprintf(job->message, sizeof job->message, "%s", msg ? msg : "libpng error");
    png_longjmp(png, 1);
}

void png_warning_cb(png_structp, png_const_charp) {}

unsigned char* dup_bytes(const void* p, size_t n) {
    auto* d = static_cast<unsigned char*>(std::malloc(n ? n : 1));
    if (d && n) std::memcpy(d, p, n);
    return d;
}

void png_collect_metadata(png_structp png, png_infop info, PngJob* job) {
#ifdef PNG_eXIf_SUPPORTED
    if (!job->exif) {
        png_uint_32 n = 0;
        png_bytep exif = nullptr;
        if (png_get_eXIf_1(png, info, &n, &exif) != 0 && exif && n > 0) {
            job->exif = dup_bytes(exif, n);
            job->exif_size = n;
            job->raw_profile_exif = 0;
        }
    }
#endif
    png_textp text = nullptr;
    int num_text = 0;
    if (png_get_text(png, info, &text, &num_text) > 0) {
        for (int i = 0; i < num_text; ++i) {
            if (!text[i].key || !text[i].text) continue;
            const size_t len = std::strlen(text[i].text);
            if (!job->xmp && std::strcmp(text[i].key, "XML:com.adobe.xmp") == 0) {
                job->xmp = dup_bytes(text[i].text, len);
                job->xmp_size = len;
            } else if (!job->exif && std::strcmp(text[i].key, "Raw profile type exif") == 0) {
                job->exif = dup_bytes(text[i].text, len);
                job->exif_size = len;
                job->raw_profile_exif = 1;
            }
        }
    }
}

// Returns true when the pixels were decoded.
bool png_decode_raw(PngJob* job) {
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, job, png_error_cb, png_warning_cb);
    if (!png) {
        std::snprintf(job->message, sizeof job->message, "out of memory");
        return false;
    }
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_read_struct(&png, nullptr, nullptr);
        std::snprintf(job->message, sizeof job->message, "out of memory");
        return false;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, nullptr);
        return false;
    }
    png_set_read_fn(png, job, png_read_cb);
    // Like Pillow, refuse an ancillary chunk with a bad CRC instead of silently dropping it.
    png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_read_info(png, info);
    job->width = png_get_image_width(png, info);
    job->height = png_get_image_height(png, info);
    job->bit_depth = png_get_bit_depth(png, info);
    job->color_type = png_get_color_type(png, info);
    if (static_cast<uint64_t>(job->width) * job->height > job->max_pixels) {
        job->too_large = 1;
        png_destroy_read_struct(&png, &info, nullptr);
        return false;
    }
    png_collect_metadata(png, info, job);

    if (job->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (job->color_type == PNG_COLOR_TYPE_GRAY && job->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    // 16-bit grey keeps both bytes (Pillow mode I, clipped later); every other 16-bit type keeps the high
    // byte.
    if (job->bit_depth == 16 && job->color_type != PNG_COLOR_TYPE_GRAY) png_set_strip_16(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    job->out_channels = png_get_channels(png, info);
    job->out_bit_depth = png_get_bit_depth(png, info);
    job->rowbytes = png_get_rowbytes(png, info);
    job->pixels = static_cast<unsigned char*>(std::malloc(job->rowbytes * job->height));
    job->rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * job->height));
    if (!job->pixels || !job->rows) png_error(png, "out of memory");
    for (png_uint_32 y = 0; y < job->height; ++y) job->rows[y] = job->pixels + y * job->rowbytes;
    png_read_image(png, job->rows);

    // The pixels are complete. Chunks after the image data (eXIf may be there) are read like Pillow's
    // load_end: a damaged or missing tail is ignored.
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, nullptr);
        return true;
    }
    png_read_end(png, info);
    png_collect_metadata(png, info, job);
    png_destroy_read_struct(&png, &info, nullptr);
    return true;
}

const char* png_mode(int bit_depth, int color_type) {
    switch (color_type) {
        case PNG_COLOR_TYPE_GRAY:
            return bit_depth == 1 ? "1" : bit_depth == 16 ? "I" : "L";
        case PNG_COLOR_TYPE_RGB:
            return "RGB";
        case PNG_COLOR_TYPE_PALETTE:
            return "P";
        case PNG_COLOR_TYPE_GRAY_ALPHA:
            return bit_depth == 16 ? "RGBA" : "LA";
        case PNG_COLOR_TYPE_RGB_ALPHA:
            return "RGBA";
    }
    return "?";
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Pillow: bytes.fromhex("".join(text.split("\n")[3:])); fromhex skips whitespace between bytes.
bool raw_profile_to_bytes(std::string_view text, std::string& out) {
    size_t pos = 0;
    for (int i = 0; i < 3; ++i) {
        const size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) return false;
        pos = nl + 1;
    }
    out.clear();
    int hi = -1;
    for (size_t i = pos; i < text.size(); ++i) {
        const char c = text[i];
        if (c == '\n') continue;
        if (hi < 0 && (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v')) continue;
        const int v = hex_value(c);
        if (v < 0) return false;
        if (hi < 0) {
            hi = v;
        } else {
            out.push_back(static_cast<char>(hi << 4 | v));
            hi = -1;
        }
    }
    return hi < 0;
}

// Pillow 9.4: re.search(r'tiff:Orientation(="|>)([0-9])', xmp).
int xmp_orientation(std::string_view xmp) {
    const std::string_view key = "tiff:Orientation";
    for (size_t pos = xmp.find(key); pos != std::string_view::npos; pos = xmp.find(key, pos + 1)) {
        const size_t p = pos + key.size();
        if (p + 1 < xmp.size() && xmp[p] == '=' && xmp[p + 1] == '"' && p + 2 < xmp.size() &&
            xmp[p + 2] >= '0' && xmp[p + 2] <= '9')
            return xmp[p + 2] - '0';
        if (p + 1 < xmp.size() && xmp[p] == '>' && xmp[p + 1] >= '0' && xmp[p + 1] <= '9')
            return xmp[p + 1] - '0';
    }
    return 0;
}

DecodedImage decode_png(std::string_view bytes, const ImageLimits& limits) {
    // IHDR is the first chunk: refuse an oversized image before libpng reads anything else.
    if (bytes.size() >= 24 && bytes.substr(12, 4) == "IHDR") {
        const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
        const uint64_t w = rd32(p + 16, false), h = rd32(p + 20, false);
        if (w * h > limits.max_pixels) throw ImageError(too_many_pixels(w, h, limits.max_pixels));
    }
    PngJob job{};
    job.data = reinterpret_cast<const unsigned char*>(bytes.data());
    job.size = bytes.size();
    job.max_pixels = limits.max_pixels;
    const bool ok = png_decode_raw(&job);
    struct Free {
        PngJob& j;
        ~Free() {
            std::free(j.pixels);
            std::free(j.rows);
            std::free(j.exif);
            std::free(j.xmp);
        }
    } free_job{job};
    if (job.too_large) throw ImageError(too_many_pixels(job.width, job.height, limits.max_pixels));
    if (!ok) throw ImageError(std::string("malformed or truncated PNG: ") + job.message);

    DecodedImage d;
    d.format = ImageFormat::Png;
    d.mode = png_mode(job.bit_depth, job.color_type);
    d.stored_width = static_cast<int>(job.width);
    d.stored_height = static_cast<int>(job.height);
    const int w = d.stored_width, h = d.stored_height;
    if (job.out_bit_depth == 16) {
        // 16-bit grey: Pillow mode I, and convert("RGB") clips each value to 255.
        RgbImage out(w, h);
        for (int y = 0; y < h; ++y) {
            const unsigned char* s = job.pixels + static_cast<size_t>(y) * job.rowbytes;
            uint8_t* o = out.row(y);
            for (int x = 0; x < w; ++x, s += 2 * job.out_channels, o += 3) {
                const unsigned v = static_cast<unsigned>(s[0]) << 8 | s[1];
                o[0] = o[1] = o[2] = static_cast<uint8_t>(v > 255 ? 255 : v);
            }
        }
        d.rgb = std::move(out);
    } else {
        d.rgb = from_channels(job.pixels, job.rowbytes, w, h, job.out_channels);
    }
    if (job.exif) {
        std::string_view blob(reinterpret_cast<const char*>(job.exif), job.exif_size);
        if (job.raw_profile_exif) {
            std::string raw;
            if (raw_profile_to_bytes(blob, raw)) d.exif_orientation = exif_orientation(raw);
        } else {
            d.exif_orientation = exif_orientation(blob);
        }
    }
    if (d.exif_orientation == 0 && job.xmp)
        d.exif_orientation =
            xmp_orientation(std::string_view(reinterpret_cast<const char*>(job.xmp), job.xmp_size));
    return d;
}

// ---------------------------------------------------------------------------------------------------------
// JPEG (libjpeg-turbo, its defaults: ISLOW IDCT, fancy upsampling, as Pillow uses it).

struct JpegErr {
    jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX + 64];
    int truncated;
};

[[noreturn]] void jpeg_error_cb(j_common_ptr cinfo) {
    auto* err = reinterpret_cast<JpegErr*>(cinfo->err);
    char buf[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, buf);
    std::snprintf(err->message, sizeof err->message, "%s", buf);
    longjmp(err->jump, 1);
}

void jpeg_message_cb(j_common_ptr cinfo, int level) {
    auto* err = reinterpret_cast<JpegErr*>(cinfo->err);
    // Warnings of corrupt data are ignored (as Pillow does); running out of data is a truncated file, which
    // Pillow refuses ("image file is truncated").
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
        err->truncated = 1;
        std::snprintf(err->message, sizeof err->message, "unexpected end of data (truncated file)");
        longjmp(err->jump, 1);
    }
}

struct JpegJob {
    const unsigned char* data;
    size_t size;
    uint64_t max_pixels;
    JpegErr err;
    // Results.
    unsigned width, height;
    int components;  // in the file
    int out_channels;
    unsigned char* pixels;  // malloc'd, width * out_channels * height
    unsigned char* exif;    // malloc'd copy of the first APP1 "Exif" payload
    size_t exif_size;
    int too_large;
};

bool jpeg_decode_raw(JpegJob* job) {
    jpeg_decompress_struct cinfo;
    cinfo.err = jpeg_std_error(&job->err.pub);
    job->err.pub.error_exit = jpeg_error_cb;
    job->err.pub.emit_message = jpeg_message_cb;
    if (setjmp(job->err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return false;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, job->data, static_cast<unsigned long>(job->size));
    jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xffff);
    jpeg_read_header(&cinfo, TRUE);
    job->width = cinfo.image_width;
    job->height = cinfo.image_height;
    job->components = cinfo.num_components;
    if (static_cast<uint64_t>(job->width) * job->height > job->max_pixels) {
        job->too_large = 1;
        jpeg_destroy_decompress(&cinfo);
        return false;
    }
    for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 5 && std::memcmp(m->data, "Exif\0", 5) == 0) {
            job->exif = dup_bytes(m->data, m->data_length);
            job->exif_size = m->data_length;
            break;
        }
    }
    if (cinfo.num_components == 1) {
        cinfo.out_color_space = JCS_GRAYSCALE;
    } else if (cinfo.num_components == 3) {
        cinfo.out_color_space = JCS_RGB;
    } else if (cinfo.num_components == 4) {
        cinfo.out_color_space = JCS_CMYK;
    } else {
        std::snprintf(job->err.message, sizeof job->err.message, "unsupported JPEG with %d components",
                      cinfo.num_components);
        jpeg_destroy_decompress(&cinfo);
        return false;
    }
    jpeg_start_decompress(&cinfo);
    job->out_channels = cinfo.output_components;
    const size_t stride = static_cast<size_t>(cinfo.output_width) * cinfo.output_components;
    job->pixels = static_cast<unsigned char*>(std::malloc(stride * cinfo.output_height));
    if (!job->pixels) {
        std::snprintf(job->err.message, sizeof job->err.message, "out of memory");
        jpeg_destroy_decompress(&cinfo);
        return false;
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = job->pixels + stride * cinfo.output_scanline;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return true;
}

// Pillow's cmyk2rgb: MULDIV255(a, b) = ((t = a*b + 128) >> 8) + t) >> 8.
inline int muldiv255(int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
}
inline uint8_t clip8(int v) {
    return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

DecodedImage decode_jpeg(std::string_view bytes, const ImageLimits& limits) {
    JpegJob job{};
    job.data = reinterpret_cast<const unsigned char*>(bytes.data());
    job.size = bytes.size();
    job.max_pixels = limits.max_pixels;
    const bool ok = jpeg_decode_raw(&job);
    struct Free {
        JpegJob& j;
        ~Free() {
            std::free(j.pixels);
            std::free(j.exif);
        }
    } free_job{job};
    if (job.too_large) throw ImageError(too_many_pixels(job.width, job.height, limits.max_pixels));
    if (!ok) throw ImageError(std::string("malformed or truncated JPEG: ") + job.err.message);

    DecodedImage d;
    d.format = ImageFormat::Jpeg;
    d.mode = job.components == 1 ? "L" : job.components == 3 ? "RGB" : "CMYK";
    d.stored_width = static_cast<int>(job.width);
    d.stored_height = static_cast<int>(job.height);
    const int w = d.stored_width, h = d.stored_height;
    if (job.out_channels == 4) {
        // Pillow reads 4-component JPEGs as "CMYK;I" (Adobe convention: stored inverted), then cmyk2rgb.
        RgbImage out(w, h);
        for (int y = 0; y < h; ++y) {
            const unsigned char* s = job.pixels + static_cast<size_t>(y) * w * 4;
            uint8_t* o = out.row(y);
            for (int x = 0; x < w; ++x, s += 4, o += 3) {
                const int nk = s[3];  // 255 - k with k = 255 - stored (the inverted reading)
                for (int c = 0; c < 3; ++c) o[c] = clip8(nk - muldiv255(255 - s[c], nk));
            }
        }
        d.rgb = std::move(out);
    } else {
        d.rgb = from_channels(job.pixels, static_cast<size_t>(w) * job.out_channels, w, h, job.out_channels);
    }
    if (job.exif)
        d.exif_orientation = exif_orientation({reinterpret_cast<const char*>(job.exif), job.exif_size});
    return d;
}

// ---------------------------------------------------------------------------------------------------------
// WebP (libwebp's animation decoder, as Pillow: the first frame on its canvas, RGBA not premultiplied).

DecodedImage decode_webp(std::string_view bytes, const ImageLimits& limits) {
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    WebPBitstreamFeatures features;
    const VP8StatusCode st = WebPGetFeatures(data, bytes.size(), &features);
    if (st == VP8_STATUS_NOT_ENOUGH_DATA)
        throw ImageError("malformed or truncated WebP: unexpected end of data");
    if (st != VP8_STATUS_OK)
        throw ImageError("malformed or truncated WebP: invalid bitstream (status " + std::to_string(st) +
                         ")");
    if (features.width <= 0 || features.height <= 0)
        throw ImageError("malformed or truncated WebP: invalid size");
    if (static_cast<uint64_t>(features.width) * static_cast<uint64_t>(features.height) > limits.max_pixels)
        throw ImageError(too_many_pixels(features.width, features.height, limits.max_pixels));

    WebPData wd{data, bytes.size()};
    WebPAnimDecoderOptions opts;
    if (!WebPAnimDecoderOptionsInit(&opts)) throw ImageError("WebP: decoder version mismatch");
    opts.color_mode = MODE_RGBA;
    opts.use_threads = 0;
    std::unique_ptr<WebPAnimDecoder, void (*)(WebPAnimDecoder*)> dec(WebPAnimDecoderNew(&wd, &opts),
                                                                     WebPAnimDecoderDelete);
    if (!dec) throw ImageError("malformed or truncated WebP: the container could not be parsed");
    WebPAnimInfo info;
    if (!WebPAnimDecoderGetInfo(dec.get(), &info)) throw ImageError("malformed WebP: no image information");
    if (info.canvas_width == 0 || info.canvas_height == 0 || info.frame_count == 0)
        throw ImageError("malformed WebP: empty image");
    if (uint64_t{info.canvas_width} * info.canvas_height > limits.max_pixels)
        throw ImageError(too_many_pixels(info.canvas_width, info.canvas_height, limits.max_pixels));
    uint8_t* rgba = nullptr;
    int timestamp = 0;
    if (!WebPAnimDecoderGetNext(dec.get(), &rgba, &timestamp) || !rgba)
        throw ImageError("malformed or truncated WebP: the image data could not be decoded");

    DecodedImage d;
    d.format = ImageFormat::Webp;
    d.mode = features.has_alpha ? "RGBA" : "RGB";
    d.stored_width = static_cast<int>(info.canvas_width);
    d.stored_height = static_cast<int>(info.canvas_height);
    d.rgb =
        from_channels(rgba, static_cast<size_t>(info.canvas_width) * 4, d.stored_width, d.stored_height, 4);

    const WebPDemuxer* demux = WebPAnimDecoderGetDemuxer(dec.get());
    WebPChunkIterator it;
    if (demux && WebPDemuxGetChunk(demux, "EXIF", 1, &it)) {
        d.exif_orientation = exif_orientation({reinterpret_cast<const char*>(it.chunk.bytes), it.chunk.size});
        WebPDemuxReleaseChunkIterator(&it);
    }
    return d;
}

}  // namespace

const char* image_format_name(ImageFormat f) {
    switch (f) {
        case ImageFormat::Unknown:
            return "unknown";
        case ImageFormat::Png:
            return "PNG";
        case ImageFormat::Jpeg:
            return "JPEG";
        case ImageFormat::Webp:
            return "WEBP";
        case ImageFormat::Gif:
            return "GIF";
        case ImageFormat::Bmp:
            return "BMP";
        case ImageFormat::Tiff:
            return "TIFF";
        case ImageFormat::Heif:
            return "HEIF";
        case ImageFormat::Avif:
            return "AVIF";
        case ImageFormat::Ico:
            return "ICO";
        case ImageFormat::Pdf:
            return "PDF";
        case ImageFormat::Svg:
            return "SVG";
    }
    return "unknown";
}

ImageFormat sniff_image_format(std::string_view b) {
    using namespace std::string_view_literals;
    if (has_prefix(b, "\x89PNG\r\n\x1a\n"sv)) return ImageFormat::Png;
    if (has_prefix(b, "\xff\xd8\xff"sv)) return ImageFormat::Jpeg;
    if (b.size() >= 12 && has_prefix(b, "RIFF"sv) && b.substr(8, 4) == "WEBP"sv) return ImageFormat::Webp;
    if (has_prefix(b, "GIF87a"sv) || has_prefix(b, "GIF89a"sv)) return ImageFormat::Gif;
    if (has_prefix(b, "BM"sv)) return ImageFormat::Bmp;
    if (has_prefix(b, "II*\0"sv) || has_prefix(b, "MM\0*"sv)) return ImageFormat::Tiff;
    if (b.size() >= 12 && b.substr(4, 4) == "ftyp"sv) {
        const std::string_view brand = b.substr(8, 4);
        if (brand == "avif"sv || brand == "avis"sv) return ImageFormat::Avif;
        return ImageFormat::Heif;
    }
    if (has_prefix(b, "\0\0\1\0"sv)) return ImageFormat::Ico;
    if (has_prefix(b, "%PDF"sv)) return ImageFormat::Pdf;
    size_t i = 0;
    while (i < b.size() && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n')) ++i;
    if (i < b.size() && b[i] == '<') return ImageFormat::Svg;
    return ImageFormat::Unknown;
}

int exif_orientation(std::string_view exif) {
    if (exif.size() >= 6 && exif.substr(0, 6) == std::string_view("Exif\0\0", 6)) exif.remove_prefix(6);
    const auto* p = reinterpret_cast<const unsigned char*>(exif.data());
    const size_t n = exif.size();
    if (n < 8) return 0;
    bool le;
    if (p[0] == 'I' && p[1] == 'I')
        le = true;
    else if (p[0] == 'M' && p[1] == 'M')
        le = false;
    else
        return 0;
    if (rd16(p + 2, le) != 42) return 0;
    const uint32_t ifd = rd32(p + 4, le);
    if (ifd > n || n - ifd < 2) return 0;
    const uint32_t count = rd16(p + ifd, le);
    for (uint32_t i = 0; i < count; ++i) {
        const size_t e = static_cast<size_t>(ifd) + 2 + static_cast<size_t>(i) * 12;
        if (e + 12 > n) return 0;
        if (rd16(p + e, le) != 0x0112) continue;
        const uint32_t type = rd16(p + e + 2, le);
        const uint32_t cnt = rd32(p + e + 4, le);
        if (cnt < 1) return 0;
        uint32_t v;
        if (type == 3 || type == 8)  // SHORT, SSHORT
            v = rd16(p + e + 8, le);
        else if (type == 4 || type == 9)  // LONG, SLONG
            v = rd32(p + e + 8, le);
        else if (type == 1 || type == 6 || type == 7)  // BYTE, SBYTE, UNDEFINED
            v = p[e + 8];
        else
            return 0;
        return v >= 1 && v <= 8 ? static_cast<int>(v) : 0;
    }
    return 0;
}

RgbImage apply_exif_orientation(const RgbImage& in, int orientation) {
    if (orientation < 2 || orientation > 8) return in;
    const int W = in.width, H = in.height;
    const bool swap = orientation >= 5;
    RgbImage out(swap ? H : W, swap ? W : H);
    for (int y = 0; y < out.height; ++y) {
        uint8_t* o = out.row(y);
        for (int x = 0; x < out.width; ++x, o += 3) {
            int sy = 0, sx = 0;
            switch (orientation) {
                case 2:
                    sy = y, sx = W - 1 - x;
                    break;  // FLIP_LEFT_RIGHT
                case 3:
                    sy = H - 1 - y, sx = W - 1 - x;
                    break;  // ROTATE_180
                case 4:
                    sy = H - 1 - y, sx = x;
                    break;  // FLIP_TOP_BOTTOM
                case 5:
                    sy = x, sx = y;
                    break;  // TRANSPOSE
                case 6:
                    sy = H - 1 - x, sx = y;
                    break;  // ROTATE_270 (90 degrees clockwise)
                case 7:
                    sy = H - 1 - x, sx = W - 1 - y;
                    break;  // TRANSVERSE
                case 8:
                    sy = x, sx = W - 1 - y;
                    break;  // ROTATE_90 (90 degrees counter-clockwise)
            }
            const uint8_t* s = in.row(sy) + static_cast<size_t>(sx) * 3;
            o[0] = s[0];
            o[1] = s[1];
            o[2] = s[2];
        }
    }
    return out;
}

DecodedImage decode_image(std::string_view bytes, const ImageLimits& limits) {
    if (bytes.empty()) throw ImageError("empty image data");
    DecodedImage d;
    const ImageFormat f = sniff_image_format(bytes);
    switch (f) {
        case ImageFormat::Png:
            d = decode_png(bytes, limits);
            break;
        case ImageFormat::Jpeg:
            d = decode_jpeg(bytes, limits);
            break;
        case ImageFormat::Webp:
            d = decode_webp(bytes, limits);
            break;
        case ImageFormat::Unknown:
            throw ImageError("unrecognised image data (not PNG, JPEG or WebP)");
        default:
            throw ImageError(std::string("unsupported image format ") + image_format_name(f) +
                             ": send PNG, JPEG or WebP");
    }
    if (d.stored_width <= 0 || d.stored_height <= 0) throw ImageError("image has no pixels");
    if (d.exif_orientation >= 2) d.rgb = apply_exif_orientation(d.rgb, d.exif_orientation);
    return d;
}

}  // namespace clef
