// Image inputs: strict base64, the three request forms (data URL, bare base64, {content_type, base64}), PNG /
// JPEG / WebP decoding equal to Pillow's (tests/data/tiny-clef/image_cases.json: decoded RGB sha256), the
// Pillow conversions to RGB, EXIF orientation, limits, and every malformed-input class failing with
// ImageError (never a crash).
#include <gtest/gtest.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

// jpeglib.h needs <cstdio> first.
#include <jpeglib.h>
#include <png.h>

#include "image/base64.h"
#include "image/decode.h"
#include "image/source.h"
#include "support/base64_encode.h"
#include "support/sha256.h"
#include "test_util.h"
#include "util/json.h"

using namespace clef;

namespace {

const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";

using clef::testing::read_file;


std::string file_bytes(const std::string& name) {
    return read_file(kModel + "/images/" + name);
}

std::string rgb_sha(const RgbImage& img) {
    return sha256_hex(img.pixels.data(), img.pixels.size());
}

// Expects `f` to throw ImageError whose message contains `needle`.
template <class F>
void expect_image_error(F&& f, const std::string& needle, const std::string& what = "") {
    try {
        f();
        ADD_FAILURE() << what << ": expected ImageError containing '" << needle << "'";
    } catch (const ImageError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << what << ": message '" << e.what() << "' lacks '" << needle << "'";
    }
}

// ---- small writers for synthetic files ----

uint32_t crc32(const std::string& s) {
    uint32_t c = 0xffffffffu;
    for (unsigned char b : s) {
        c ^= b;
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return c ^ 0xffffffffu;
}

std::string be32(uint32_t v) {
    return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
            static_cast<char>(v)};
}
std::string le32(uint32_t v) {
    return {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
            static_cast<char>(v >> 24)};
}

std::string png_chunk(const std::string& type, const std::string& data) {
    return be32(static_cast<uint32_t>(data.size())) + type + data + be32(crc32(type + data));
}

// A minimal TIFF/EXIF block with IFD0 holding only the orientation tag (SHORT).
std::string exif_block(int orientation, bool little_endian, bool with_header = true) {
    std::string t;
    auto u16 = [&](uint32_t v) {
        if (little_endian)
            t += {static_cast<char>(v), static_cast<char>(v >> 8)};
        else
            t += {static_cast<char>(v >> 8), static_cast<char>(v)};
    };
    auto u32 = [&](uint32_t v) { t += little_endian ? le32(v) : be32(v); };
    t += little_endian ? "II" : "MM";
    u16(42);
    u32(8);
    u16(1);
    u16(0x0112);
    u16(3);
    u32(1);
    u16(static_cast<uint32_t>(orientation));
    u16(0);
    u32(0);
    return with_header ? std::string("Exif\0\0", 6) + t : t;
}

// Inserts an APP1 EXIF segment right after SOI.
std::string jpeg_with_exif(const std::string& jpeg, int orientation, bool le) {
    const std::string payload = exif_block(orientation, le);
    const size_t len = payload.size() + 2;
    std::string seg = "\xff\xe1";
    seg += static_cast<char>(len >> 8);
    seg += static_cast<char>(len & 0xff);
    return jpeg.substr(0, 2) + seg + payload + jpeg.substr(2);
}

// Inserts a chunk right before the first IDAT.
std::string png_with_chunk(const std::string& png, const std::string& type, const std::string& data) {
    const size_t idat = png.find("IDAT") - 4;
    return png.substr(0, idat) + png_chunk(type, data) + png.substr(idat);
}

// Wraps a simple-format (VP8 / VP8L) WebP into the extended format with an EXIF chunk.
std::string webp_with_exif(const std::string& webp, int w, int h, const std::string& exif) {
    std::string body = "WEBP";
    std::string vp8x(10, '\0');
    vp8x[0] = 0x08;  // EXIF flag
    const uint32_t cw = static_cast<uint32_t>(w - 1), ch = static_cast<uint32_t>(h - 1);
    vp8x[4] = static_cast<char>(cw), vp8x[5] = static_cast<char>(cw >> 8),
    vp8x[6] = static_cast<char>(cw >> 16);
    vp8x[7] = static_cast<char>(ch), vp8x[8] = static_cast<char>(ch >> 8),
    vp8x[9] = static_cast<char>(ch >> 16);
    body += "VP8X" + le32(10) + vp8x;
    body += webp.substr(12);  // the image chunk(s)
    std::string e = exif;
    body += "EXIF" + le32(static_cast<uint32_t>(e.size())) + e;
    if (e.size() % 2) body += '\0';
    return "RIFF" + le32(static_cast<uint32_t>(body.size())) + body;
}

struct PngSpec {
    int width = 0, height = 0, color_type = PNG_COLOR_TYPE_RGB, bit_depth = 8;
    bool interlace = false;
    std::vector<png_color> palette;
    std::vector<png_byte> trans_alpha;  // palette tRNS
    bool gray_trns = false;
    std::vector<std::vector<png_byte>> rows;  // packed rows as libpng expects them
};

void png_write_cb(png_structp png, png_bytep data, size_t n) {
    static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}

std::string write_png(const PngSpec& s) {
    std::string out;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
    png_infop info = png_create_info_struct(png);
    std::vector<png_bytep> rows;
    for (const auto& r : s.rows) rows.push_back(const_cast<png_bytep>(r.data()));
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        throw std::runtime_error("write_png failed");
    }
    png_set_write_fn(png, &out, png_write_cb, nullptr);
    png_set_IHDR(png, info, s.width, s.height, s.bit_depth, s.color_type,
                 s.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (!s.palette.empty()) png_set_PLTE(png, info, s.palette.data(), static_cast<int>(s.palette.size()));
    if (!s.trans_alpha.empty())
        png_set_tRNS(png, info, s.trans_alpha.data(), static_cast<int>(s.trans_alpha.size()), nullptr);
    png_color_16 gray_trans{};
    gray_trans.gray = 0;
    if (s.gray_trns) png_set_tRNS(png, info, nullptr, 0, &gray_trans);
    png_write_info(png, info);
    png_write_image(png, rows.data());
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    return out;
}

std::string write_jpeg(int w, int h, int components, J_COLOR_SPACE cs, const std::vector<uint8_t>& pixels) {
    jpeg_compress_struct c;
    jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    unsigned char* mem = nullptr;
    unsigned long size = 0;
    jpeg_mem_dest(&c, &mem, &size);
    c.image_width = w;
    c.image_height = h;
    c.input_components = components;
    c.in_color_space = cs;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row =
            const_cast<JSAMPROW>(pixels.data() + static_cast<size_t>(c.next_scanline) * w * components);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    std::string out(reinterpret_cast<const char*>(mem), size);
    jpeg_destroy_compress(&c);
    std::free(mem);
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// base64

TEST(Base64, Rfc4648Vectors) {
    const std::vector<std::pair<std::string, std::string>> v = {{"", ""},
                                                                {"f", "Zg=="},
                                                                {"fo", "Zm8="},
                                                                {"foo", "Zm9v"},
                                                                {"foob", "Zm9vYg=="},
                                                                {"fooba", "Zm9vYmE="},
                                                                {"foobar", "Zm9vYmFy"}};
    for (const auto& [plain, enc] : v) {
        EXPECT_EQ(base64_encode(plain), enc);
        std::string out, err;
        ASSERT_TRUE(base64_decode(enc, out, &err)) << enc << ": " << err;
        EXPECT_EQ(out, plain);
    }
    std::string all;
    for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
    std::string out;
    ASSERT_TRUE(base64_decode(base64_encode(all), out));
    EXPECT_EQ(out, all);
    // Non-zero unused bits are accepted (Python's decoder accepts them too).
    ASSERT_TRUE(base64_decode("Zh==", out));
    EXPECT_EQ(out, "f");
}

TEST(Base64, StrictRejections) {
    for (const char* bad : {"Zm9v YmFy", "Zm9vYmF", "Zm=vYmFy", "Zm9vYmFy\n", "Zg===", "====", "Zm9-", "Zm9_",
                            "Z===", "=Zm9", "Zm9vY=Fy",
                            "\xc3\xa9"
                            "AAA"}) {
        std::string out, err;
        EXPECT_FALSE(base64_decode(bad, out, &err)) << bad;
        EXPECT_NE(err.find("invalid base64"), std::string::npos) << bad << ": " << err;
    }
}

// ---------------------------------------------------------------------------------------------------------
// Request forms

TEST(ImageSource, Forms) {
    const std::string png = file_bytes("square_rgb.png");
    const std::string b64 = base64_encode(png);
    ImageSource s = parse_image_source(JsonValue::string("data:image/png;base64," + b64));
    EXPECT_EQ(s.form, ImageSourceForm::DataUrl);
    EXPECT_EQ(s.content_type, "image/png");
    EXPECT_EQ(s.bytes, png);
    s = parse_image_source(JsonValue::string("DATA:Image/PNG;BASE64," + b64));
    EXPECT_EQ(s.bytes, png);
    s = parse_image_source(JsonValue::string(b64));
    EXPECT_EQ(s.form, ImageSourceForm::Base64);
    EXPECT_EQ(s.bytes, png);
    JsonValue obj = JsonValue::object(
        {{"content_type", JsonValue::string("image/png")}, {"base64", JsonValue::string(b64)}});
    s = parse_image_source(obj);
    EXPECT_EQ(s.form, ImageSourceForm::Object);
    EXPECT_EQ(s.content_type, "image/png");
    EXPECT_EQ(s.bytes, png);
    // The declared type is not trusted: the bytes decide.
    s = parse_image_source(JsonValue::string("data:image/jpeg;base64," + b64));
    EXPECT_EQ(decode_image(s.bytes).format, ImageFormat::Png);
    EXPECT_TRUE(parse_image_sources(JsonValue::null()).empty());
    EXPECT_TRUE(parse_image_sources(JsonValue::array()).empty());
}

TEST(ImageSource, MalformedInputs) {
    const std::string b64 = base64_encode(file_bytes("square_rgb.png"));
    auto one = [](JsonValue v, ImageLimits lim = {}) { return [v, lim] { parse_image_source(v, lim); }; };
    expect_image_error(one(JsonValue::integer(3)), "got int");
    expect_image_error(one(JsonValue::null()), "got null");
    expect_image_error(one(JsonValue::array({JsonValue::string(b64)})), "got array");
    expect_image_error(one(JsonValue::string("")), "empty image");
    expect_image_error(one(JsonValue::string("data:image/png;base64,")), "empty image");
    expect_image_error(one(JsonValue::string("data:image/png;base64")), "malformed data URL");
    expect_image_error(one(JsonValue::string("data:image/png," + b64)), "not base64-encoded");
    expect_image_error(one(JsonValue::string("data:text/plain;base64," + b64)), "not an image type");
    expect_image_error(one(JsonValue::string("https://example.com/cat.png")), "URLs are not supported");
    expect_image_error(one(JsonValue::string("file:///etc/passwd")), "URLs are not supported");
    expect_image_error(one(JsonValue::string("data:image/png;base64,iVBO%%%")), "invalid base64");
    expect_image_error(one(JsonValue::string("not base64 at all")), "invalid base64");
    expect_image_error(one(JsonValue::object({{"content_type", JsonValue::string("image/png")}})),
                       "no \"base64\"");
    expect_image_error(one(JsonValue::object({{"base64", JsonValue::integer(1)}})), "must be a string");
    expect_image_error(
        one(JsonValue::object({{"content_type", JsonValue::integer(1)}, {"base64", JsonValue::string(b64)}})),
        "\"content_type\" must be a string");
    expect_image_error(one(JsonValue::object({{"content_type", JsonValue::string("application/pdf")},
                                              {"base64", JsonValue::string(b64)}})),
                       "not an image type");
    ImageLimits small;
    small.max_bytes = 1000;
    expect_image_error(one(JsonValue::string(b64), small), "larger than 1000 bytes");
    expect_image_error(one(JsonValue::string(base64_encode(std::string(1001, 'x'))), small),
                       "larger than 1000");

    expect_image_error([&] { parse_image_sources(JsonValue::string(b64)); }, "images: must be a list");
    expect_image_error([&] { parse_image_sources(JsonValue::object()); }, "images: must be a list");
    std::vector<JsonValue> five(5, JsonValue::string(b64));
    expect_image_error([&] { parse_image_sources(JsonValue::array(five)); },
                       "too many images (5); at most 4");
    ImageLimits total;
    total.max_total_bytes = 10000;
    expect_image_error(
        [&] {
            parse_image_sources(JsonValue::array({JsonValue::string(b64), JsonValue::string(b64)}), total);
        },
        "more than 10000 bytes");
    expect_image_error(
        [&] {
            parse_image_sources(JsonValue::array({JsonValue::string(b64), JsonValue::integer(2)}));
        },
        "images[1]: ");
}

// ---------------------------------------------------------------------------------------------------------
// Decoding equal to Pillow on the fixture images

TEST(ImageDecode, FixtureImagesMatchPillow) {
    int n = 0;
    clef::testing::for_each_fixture_image(
        [&](const JsonValue& c, const JsonValue& im, const JsonValue& req_image) {
            const std::string file = im.find("file")->as_string();
            SCOPED_TRACE(c.find("name")->as_string() + " " + file);
            const ImageSource src = parse_image_source(req_image);
            EXPECT_EQ(image_source_form_name(src.form), im.find("source_form")->as_string());
            EXPECT_EQ(src.bytes, read_file(kModel + "/" + file));
            EXPECT_EQ(sha256_hex(src.bytes), im.find("file_sha256")->as_string());
            const DecodedImage d = decode_image(src.bytes);
            EXPECT_EQ(image_format_name(d.format), im.find("format")->as_string());
            EXPECT_EQ(d.mode, im.find("mode")->as_string());
            EXPECT_EQ(d.stored_height, im.find("stored_size_hw")->items()[0].as_int64());
            EXPECT_EQ(d.stored_width, im.find("stored_size_hw")->items()[1].as_int64());
            EXPECT_EQ(d.rgb.height, im.find("decoded_size_hw")->items()[0].as_int64());
            EXPECT_EQ(d.rgb.width, im.find("decoded_size_hw")->items()[1].as_int64());
            const JsonValue* orient = im.find("exif_orientation");
            EXPECT_EQ(d.exif_orientation, orient->is_null() ? 0 : orient->as_int64());
            std::string want;
            ASSERT_TRUE(base64_decode(im.find("decoded_rgb_base64")->as_string(), want));
            ASSERT_EQ(d.rgb.pixels.size(), want.size());
            size_t diff = 0;
            for (size_t i = 0; i < want.size(); ++i) diff += d.rgb.pixels[i] != static_cast<uint8_t>(want[i]);
            EXPECT_EQ(diff, 0u) << "bytes differing from Pillow";
            EXPECT_EQ(rgb_sha(d.rgb), im.find("decoded_rgb_sha256")->as_string());
            ++n;
        });
    EXPECT_EQ(n, 7);  // the 7 images of the 5 answered cases
}

TEST(ImageDecode, ConversionsFollowPillow) {
    // RGBA: alpha dropped without compositing (the transparent band of rgba.png keeps its stored colour).
    {
        const DecodedImage d = decode_image(file_bytes("rgba.png"));
        EXPECT_EQ(d.mode, "RGBA");
        EXPECT_EQ(d.rgb.width, 130);
    }
    // Palette with tRNS -> the palette colours; grey+tRNS ignored; 1/2/4-bit grey scaled by replication;
    // 16-bit grey clipped (Pillow mode I); 16-bit RGB and LA keep the high byte; interlaced = progressive.
    const int W = 4, H = 2;
    {
        PngSpec s;
        s.width = W, s.height = H, s.color_type = PNG_COLOR_TYPE_PALETTE, s.bit_depth = 8;
        s.palette = {{10, 20, 30}, {200, 100, 50}, {0, 255, 0}};
        s.trans_alpha = {0, 128};
        s.rows = {{0, 1, 2, 1}, {2, 2, 0, 0}};
        const DecodedImage d = decode_image(write_png(s));
        EXPECT_EQ(d.mode, "P");
        const std::vector<uint8_t> want = {10, 20,  30, 200, 100, 50, 0,  255, 0,  200, 100, 50,
                                           0,  255, 0,  0,   255, 0,  10, 20,  30, 10,  20,  30};
        EXPECT_EQ(d.rgb.pixels, want);
        s.bit_depth = 2;
        s.rows = {{0b00011001}, {0b10100000}};
        EXPECT_EQ(decode_image(write_png(s)).rgb.pixels, want);
    }
    for (int depth : {1, 2, 4}) {
        PngSpec s;
        s.width = W, s.height = 1, s.color_type = PNG_COLOR_TYPE_GRAY, s.bit_depth = depth;
        const int maxv = (1 << depth) - 1;
        std::vector<int> vals = {0, maxv, maxv / 2, 1};
        std::vector<png_byte> row(static_cast<size_t>((4 * depth + 7) / 8), 0);
        for (int x = 0; x < 4; ++x) {
            const int bit = x * depth;
            row[bit / 8] = static_cast<png_byte>(row[bit / 8] | vals[x] << (8 - depth - bit % 8));
        }
        s.rows = {row};
        s.gray_trns = true;
        const DecodedImage d = decode_image(write_png(s));
        EXPECT_EQ(d.mode, depth == 1 ? "1" : "L");
        for (int x = 0; x < 4; ++x) {
            const int want = vals[x] * 255 / maxv;
            for (int c = 0; c < 3; ++c)
                EXPECT_EQ(d.rgb.pixels[3 * x + c], want) << "depth " << depth << " x " << x;
        }
    }
    {
        PngSpec s;
        s.width = 3, s.height = 1, s.color_type = PNG_COLOR_TYPE_GRAY, s.bit_depth = 16;
        s.rows = {{0x00, 0x07, 0x00, 0xff, 0x01, 0x00}};  // 7, 255, 256
        const DecodedImage d = decode_image(write_png(s));
        EXPECT_EQ(d.mode, "I");
        EXPECT_EQ(d.rgb.pixels, (std::vector<uint8_t>{7, 7, 7, 255, 255, 255, 255, 255, 255}));
    }
    {
        PngSpec s;
        s.width = 1, s.height = 1, s.color_type = PNG_COLOR_TYPE_RGB, s.bit_depth = 16;
        s.rows = {{0x12, 0xff, 0x80, 0x01, 0x00, 0x80}};
        EXPECT_EQ(decode_image(write_png(s)).rgb.pixels, (std::vector<uint8_t>{0x12, 0x80, 0x00}));
        s.color_type = PNG_COLOR_TYPE_GRAY_ALPHA;
        s.rows = {{0x34, 0xff, 0x00, 0x00}};
        const DecodedImage d = decode_image(write_png(s));
        EXPECT_EQ(d.mode, "RGBA");
        EXPECT_EQ(d.rgb.pixels, (std::vector<uint8_t>{0x34, 0x34, 0x34}));
        s.bit_depth = 8;
        s.rows = {{0x56, 0x00}};
        EXPECT_EQ(decode_image(write_png(s)).mode, "LA");
        EXPECT_EQ(decode_image(write_png(s)).rgb.pixels, (std::vector<uint8_t>{0x56, 0x56, 0x56}));
    }
    {
        PngSpec s;
        s.width = 17, s.height = 11, s.color_type = PNG_COLOR_TYPE_RGB_ALPHA, s.bit_depth = 8;
        std::vector<uint8_t> want;
        for (int y = 0; y < s.height; ++y) {
            std::vector<png_byte> row;
            for (int x = 0; x < s.width; ++x) {
                const uint8_t px[4] = {static_cast<uint8_t>(x * 13 + y), static_cast<uint8_t>(y * 29),
                                       static_cast<uint8_t>(x * y), static_cast<uint8_t>(x * 7)};
                row.insert(row.end(), px, px + 4);
                want.insert(want.end(), px, px + 3);
            }
            s.rows.push_back(row);
        }
        EXPECT_EQ(decode_image(write_png(s)).rgb.pixels, want);
        s.interlace = true;
        EXPECT_EQ(decode_image(write_png(s)).rgb.pixels, want);
    }
    // Grey JPEG -> R = G = B.
    {
        std::vector<uint8_t> g(40 * 24);
        for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<uint8_t>(i * 7);
        const DecodedImage d = decode_image(write_jpeg(40, 24, 1, JCS_GRAYSCALE, g));
        EXPECT_EQ(d.mode, "L");
        for (size_t i = 0; i < g.size(); ++i) {
            EXPECT_EQ(d.rgb.pixels[3 * i], d.rgb.pixels[3 * i + 1]);
            EXPECT_EQ(d.rgb.pixels[3 * i], d.rgb.pixels[3 * i + 2]);
        }
    }
    // CMYK JPEG: read inverted (Adobe convention), then Pillow's cmyk2rgb.
    {
        std::vector<uint8_t> cmyk(16 * 16 * 4);
        for (size_t i = 0; i < cmyk.size(); ++i) cmyk[i] = static_cast<uint8_t>(i % 4 == 3 ? 40 : 200);
        const DecodedImage d = decode_image(write_jpeg(16, 16, 4, JCS_CMYK, cmyk));
        EXPECT_EQ(d.mode, "CMYK");
        // Stored c = 200, k = 40 -> inverted c' = 55, k' = 215 -> nk = 40 -> 40 - 55*40/255 = 31.4 -> 31 (+-1
        // JPEG).
        EXPECT_NEAR(d.rgb.pixels[0], 31, 2);
    }
}

TEST(ImageDecode, ExifOrientation) {
    // Pillow's transposes on a 3x2 image with distinct pixels.
    RgbImage img(3, 2);
    for (int i = 0; i < 6; ++i) img.pixels[3 * i] = static_cast<uint8_t>(i);  // R = row-major index
    auto r_of = [](const RgbImage& m) {
        std::vector<int> v;
        for (size_t i = 0; i < m.pixels.size(); i += 3) v.push_back(m.pixels[i]);
        return v;
    };
    // input:  0 1 2 / 3 4 5
    const std::map<int, std::vector<int>> want = {
        {1, {0, 1, 2, 3, 4, 5}}, {2, {2, 1, 0, 5, 4, 3}}, {3, {5, 4, 3, 2, 1, 0}}, {4, {3, 4, 5, 0, 1, 2}},
        {5, {0, 3, 1, 4, 2, 5}}, {6, {3, 0, 4, 1, 5, 2}}, {7, {5, 2, 4, 1, 3, 0}}, {8, {2, 5, 1, 4, 0, 3}}};
    for (const auto& [o, w] : want) {
        const RgbImage t = apply_exif_orientation(img, o);
        EXPECT_EQ(r_of(t), w) << "orientation " << o;
        EXPECT_EQ(t.width, o >= 5 ? 2 : 3) << o;
    }

    EXPECT_EQ(exif_orientation(exif_block(6, true)), 6);
    EXPECT_EQ(exif_orientation(exif_block(3, false)), 3);
    EXPECT_EQ(exif_orientation(exif_block(8, false, false)), 8);
    EXPECT_EQ(exif_orientation(exif_block(9, true)), 0);
    EXPECT_EQ(exif_orientation("Exif\0\0II*\0\xff\xff\xff\xff"), 0);  // IFD offset out of range
    EXPECT_EQ(exif_orientation(""), 0);

    // JPEG APP1, PNG eXIf, PNG "Raw profile type exif", WebP EXIF: orientation 6 swaps width and height.
    const std::string jpg = file_bytes("banner_444.jpg");
    const DecodedImage plain = decode_image(jpg);
    for (int o = 1; o <= 8; ++o) {
        const DecodedImage d = decode_image(jpeg_with_exif(jpg, o, o % 2 == 0));
        EXPECT_EQ(d.exif_orientation, o);
        EXPECT_EQ(d.stored_width, 150);
        EXPECT_EQ(d.rgb.pixels, apply_exif_orientation(plain.rgb, o).pixels) << o;
        EXPECT_EQ(d.rgb.width, o >= 5 ? 80 : 150) << o;
    }
    const std::string png = file_bytes("tall_rgb.png");
    const DecodedImage png_plain = decode_image(png);
    DecodedImage d = decode_image(png_with_chunk(png, "eXIf", exif_block(6, false, false)));
    EXPECT_EQ(d.exif_orientation, 6);
    EXPECT_EQ(d.rgb.pixels, apply_exif_orientation(png_plain.rgb, 6).pixels);
    std::string hex;
    for (unsigned char ch : exif_block(8, true)) {
        static const char* digits = "0123456789abcdef";
        hex += digits[ch >> 4];
        hex += digits[ch & 15];
    }
    const std::string raw = std::string("Raw profile type exif") + '\0' + "\nexif\n      " +
                            std::to_string(hex.size() / 2) + "\n" + hex + "\n";
    d = decode_image(png_with_chunk(png, "tEXt", raw));
    EXPECT_EQ(d.exif_orientation, 8);
    EXPECT_EQ(d.rgb.width, 56);
    const std::string xmp = std::string("XML:com.adobe.xmp") + '\0' + '\0' + '\0' + '\0' + '\0' +
                            "<x:xmpmeta><rdf:Description tiff:Orientation=\"3\"/></x:xmpmeta>";
    d = decode_image(png_with_chunk(png, "iTXt", xmp));
    EXPECT_EQ(d.exif_orientation, 3);
    EXPECT_EQ(d.rgb.pixels, apply_exif_orientation(png_plain.rgb, 3).pixels);

    const std::string webp = file_bytes("chart.webp");
    const DecodedImage webp_plain = decode_image(webp);
    d = decode_image(webp_with_exif(webp, 72, 120, exif_block(6, true)));
    EXPECT_EQ(d.exif_orientation, 6);
    EXPECT_EQ(d.rgb.width, 120);
    EXPECT_EQ(d.rgb.pixels, apply_exif_orientation(webp_plain.rgb, 6).pixels);
}

// ---------------------------------------------------------------------------------------------------------
// Malformed input classes: always ImageError, never a crash

TEST(ImageDecode, UnsupportedFormats) {
    expect_image_error([] { decode_image(std::string("GIF89a\x01\x00\x01\x00\x80\x00\x00", 13)); },
                       "unsupported image format GIF");
    expect_image_error([] { decode_image(std::string("BM\x3a\x00\x00\x00\x00\x00\x00\x00\x36\x00", 12)); },
                       "unsupported image format BMP");
    expect_image_error([] { decode_image(std::string("II*\0\x08\0\0\0", 8)); },
                       "unsupported image format TIFF");
    expect_image_error(
        [] {
            decode_image(
                std::string("\0\0\0\x1c"
                            "ftypavif\0\0\0\0",
                            16));
        },
        "AVIF");
    expect_image_error([] { decode_image("<svg xmlns='http://www.w3.org/2000/svg'/>"); }, "SVG");
    expect_image_error([] { decode_image("%PDF-1.7"); }, "PDF");
    expect_image_error([] { decode_image("hello, world"); }, "unrecognised image data");
    expect_image_error([] { decode_image(std::string(3, '\0')); }, "unrecognised image data");
    expect_image_error([] { decode_image(""); }, "empty image");
}

TEST(ImageDecode, TruncatedAndCorruptFiles) {
    for (const char* name : {"square_rgb.png", "gray.png", "rgba.png", "tall_rgb.png", "photo_420.jpg",
                             "banner_444.jpg", "chart.webp"}) {
        SCOPED_TRACE(name);
        const std::string bytes = file_bytes(name);
        const ImageFormat fmt = sniff_image_format(bytes);
        const std::string fmt_name = image_format_name(fmt);
        // Half the file: refused, naming the format.
        expect_image_error(
            [&] { decode_image(bytes.substr(0, bytes.size() / 2)); },
            "malformed or truncated " + std::string(fmt == ImageFormat::Webp ? "WebP" : fmt_name));
        // Every prefix (coarse steps near the start, then strided): an ImageError or, for PNG, a complete
        // image whose trailing chunks are missing (Pillow ignores a damaged tail too). Never a crash.
        const DecodedImage full = decode_image(bytes);
        for (size_t n = 0; n < bytes.size(); n += n < 64 ? 1 : 97) {
            try {
                const DecodedImage d = decode_image(bytes.substr(0, n));
                EXPECT_EQ(fmt, ImageFormat::Png) << "prefix " << n;
                EXPECT_EQ(d.rgb.pixels, full.rgb.pixels) << "prefix " << n;
            } catch (const ImageError&) {
            }
        }
        // Flipped bytes inside the data: an ImageError or some image, never a crash.
        for (size_t pos = bytes.size() / 3; pos < bytes.size(); pos += bytes.size() / 7) {
            std::string bad = bytes;
            bad[pos] = static_cast<char>(bad[pos] ^ 0x5a);
            try {
                decode_image(bad);
            } catch (const ImageError&) {
            }
        }
    }
    // A PNG without IEND still decodes (Pillow: load_end ignores a missing tail).
    const std::string png = file_bytes("square_rgb.png");
    EXPECT_EQ(decode_image(png.substr(0, png.size() - 12)).rgb.pixels, decode_image(png).rgb.pixels);
    // A corrupt IDAT (bad CRC) is refused.
    std::string bad = png;
    bad[png.find("IDAT") + 10] ^= 0x01;
    expect_image_error([&] { decode_image(bad); }, "PNG");
    // A JPEG without EOI is truncated (Pillow: "image file is truncated").
    const std::string jpg = file_bytes("photo_420.jpg");
    expect_image_error([&] { decode_image(jpg.substr(0, jpg.size() - 2)); }, "truncated");
}

TEST(ImageDecode, PixelLimitCheckedFromTheHeader) {
    ImageLimits lim;
    lim.max_pixels = 100;
    for (const char* name : {"rgba.png", "banner_444.jpg", "chart.webp"})
        expect_image_error([&] { decode_image(file_bytes(name), lim); }, "more than the limit of 100 pixels",
                           name);
    // A PNG header claiming 20000 x 20000 pixels with no image data: refused as too large, not as truncated.
    std::string ihdr = be32(20000) + be32(20000) + std::string("\x08\x02\x00\x00\x00", 5);
    const std::string huge = std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr);
    expect_image_error([&] { decode_image(huge); }, "20000x20000 pixels, more than the limit of 16777216");
}
