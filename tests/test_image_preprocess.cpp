// The image processor against the reference (tests/data/tiny-clef/image_cases.json): smart_resize with
// Python's rounding and the processor_config.json bounds, PyTorch's uint8 antialiased bicubic kernel bit for
// bit (resized RGB sha256, weight precision per axis), the fused float32 rescale/normalise and the
// merge-block patch order (pixel_values float32 sha256, sums, rows), grid and token counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "image/base64.h"
#include "image/preprocess.h"
#include "image/resize.h"
#include "support/sha256.h"
#include "test_util.h"
#include "util/json.h"

using namespace clef;

namespace {

const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";

using clef::testing::read_file;


const ImageProcessorConfig& tiny_processor() {
    static const ImageProcessorConfig c = load_image_processor_config(kModel + "/processor_config.json");
    return c;
}

RgbImage rgb_from_b64(const std::string& b64, int h, int w) {
    std::string raw;
    if (!base64_decode(b64, raw)) throw std::runtime_error("bad base64 in fixture");
    RgbImage img(w, h);
    if (raw.size() != img.pixels.size()) throw std::runtime_error("fixture size mismatch");
    std::memcpy(img.pixels.data(), raw.data(), raw.size());
    return img;
}

int hw(const JsonValue& im, const char* key, int i) {
    return static_cast<int>(im.find(key)->items()[i].as_int64());
}

}  // namespace

TEST(ImageProcessorConfig, TinyFixture) {
    const ImageProcessorConfig& c = tiny_processor();
    EXPECT_EQ(c.min_pixels, 4096);
    EXPECT_EQ(c.max_pixels, 12288);  // the image block's bounds, not the video block's
    EXPECT_EQ(c.patch_size, 16);
    EXPECT_EQ(c.merge_size, 2);
    EXPECT_EQ(c.temporal_patch_size, 2);
    EXPECT_EQ(c.factor(), 32);
    EXPECT_EQ(c.patch_dim(), 1536);
    const auto t = normalisation_table(c);
    for (int x = 0; x < 256; ++x) {
        // The float32 rounding of the exact (x - 127.5) / 127.5.
        EXPECT_EQ(t[0][x], static_cast<float>((x - 127.5) / 127.5)) << x;
        EXPECT_EQ(t[2][x], t[0][x]);
    }
}

TEST(ImageProcessorConfig, OverridesAndErrors) {
    ImageProcessorConfig c = parse_image_processor_config(
        R"({"image_processor":{"size":{"shortest_edge":10,"longest_edge":20},"min_pixels":5,"patch_size":16}})",
        "x");
    EXPECT_EQ(c.min_pixels, 5);
    EXPECT_EQ(c.max_pixels, 20);
    c = parse_image_processor_config(R"({"max_pixels":100000,"patch_size":14})", "preprocessor_config.json");
    EXPECT_EQ(c.max_pixels, 100000);
    EXPECT_EQ(c.factor(), 28);
    auto bad = [](const std::string& text, const std::string& needle) {
        try {
            parse_image_processor_config(text, "p.json");
            ADD_FAILURE() << text;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    bad(R"({"image_processor":{"resample":2}})", "image_processor.resample");
    bad(R"({"image_processor":{"size":{"height":224,"width":224}}})", "shortest_edge");
    bad(R"({"image_processor":{"patch_size":0}})", "patch_size");
    bad(R"({"image_processor":{"image_mean":[0.5,0.5]}})", "image_mean");
    bad(R"({"image_processor":{"do_convert_rgb":false}})", "do_convert_rgb");
    bad(R"({"image_processor":{"size":{"shortest_edge":100,"longest_edge":10}}})", "larger than");
    bad("[1]", "expected a JSON object");
}

TEST(SmartResize, BranchesAndPythonRounding) {
    auto sr = [](int h, int w) { return smart_resize(h, w, 32, 4096, 12288); };
    SmartResize r = sr(80, 150);  // round(2.5) = 2 (half to even), round(4.6875) = 5
    EXPECT_EQ(r.height, 64);
    EXPECT_EQ(r.width, 160);
    EXPECT_EQ(r.branch, ResizeBranch::Round);
    r = sr(48, 48);  // round(1.5) = 2
    EXPECT_EQ(r.height, 64);
    EXPECT_EQ(r.width, 64);
    r = sr(112, 112);  // round(3.5) = 4 -> 128 x 128 = 16384 > 12288: max_pixels branch
    EXPECT_EQ(r.branch, ResizeBranch::MaxPixels);
    EXPECT_EQ(r.height, 96);
    r = sr(64, 64);
    EXPECT_EQ(r.branch, ResizeBranch::None);
    r = sr(56, 40);
    EXPECT_EQ(r.branch, ResizeBranch::MinPixels);
    EXPECT_EQ(r.height, 96);
    EXPECT_EQ(r.width, 64);
    r = sr(150, 130);
    EXPECT_EQ(r.branch, ResizeBranch::MaxPixels);
    EXPECT_EQ(r.height, 96);
    EXPECT_EQ(r.width, 96);
    // Very wide: floor would give 0 rows; max(factor, ...) keeps one.
    r = smart_resize(32, 6000, 32, 4096, 12288);
    EXPECT_EQ(r.height, 32);
    for (auto [h, w] : std::vector<std::pair<int, int>>{{31, 100}, {100, 20}, {32, 6401}}) {
        EXPECT_THROW(sr(h, w), ImageError) << h << "x" << w;
    }
}

TEST(Resize, WeightsAndIdentity) {
    const ResizeAxisWeights up = bicubic_aa_weights(40, 64);
    EXPECT_EQ(up.precision, 14);
    for (int i = 0; i < up.out_size; ++i) {
        int sum = 0;
        for (int j = 0; j < up.count[i]; ++j) sum += up.weights[static_cast<size_t>(i) * up.taps + j];
        EXPECT_NEAR(sum, 1 << up.precision, 2) << i;
    }
    RgbImage img(37, 23);
    for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i * 31);
    EXPECT_EQ(resize_bicubic_aa(img, 37, 23).pixels, img.pixels);
    // Only the width changes: every column of a vertically constant image stays constant.
    RgbImage flat(50, 9);
    for (int y = 0; y < 9; ++y)
        for (int x = 0; x < 50; ++x)
            for (int c = 0; c < 3; ++c) flat.row(y)[3 * x + c] = static_cast<uint8_t>(x * 5 + c);
    const RgbImage r = resize_bicubic_aa(flat, 32, 9);
    EXPECT_EQ(r.height, 9);
    for (int y = 1; y < 9; ++y) EXPECT_EQ(std::memcmp(r.row(y), r.row(0), 32 * 3), 0);
    // A constant image stays constant through both passes.
    RgbImage grey(70, 45);
    std::fill(grey.pixels.begin(), grey.pixels.end(), 77);
    for (uint8_t v : resize_bicubic_aa(grey, 96, 32).pixels) ASSERT_EQ(v, 77);
}

TEST(ImagePreprocess, FixtureImagesMatchTheReference) {
    const ImageProcessorConfig& cfg = tiny_processor();
    int n = 0;
    clef::testing::for_each_fixture_image([&](const JsonValue& c, const JsonValue& im, const JsonValue&) {
        SCOPED_TRACE(c.find("name")->as_string() + " " + im.find("file")->as_string());
        const RgbImage rgb = rgb_from_b64(im.find("decoded_rgb_base64")->as_string(),
                                          hw(im, "decoded_size_hw", 0), hw(im, "decoded_size_hw", 1));
        const ProcessedImage p = process_image(rgb, cfg);
        EXPECT_EQ(p.resized.height, hw(im, "resized_size_hw", 0));
        EXPECT_EQ(p.resized.width, hw(im, "resized_size_hw", 1));
        EXPECT_EQ(resize_branch_name(p.branch), im.find("resize_branch")->as_string());
        const JsonValue* prec = im.find("resize_weights_precision_hw");
        const int axis_in[2] = {rgb.height, rgb.width}, axis_out[2] = {p.resized.height, p.resized.width};
        for (int a = 0; a < 2; ++a) {
            const JsonValue& want = prec->items()[a];
            if (axis_in[a] == axis_out[a]) {
                EXPECT_TRUE(want.is_null()) << "axis " << a;  // skipped axis
            } else {
                EXPECT_EQ(bicubic_aa_weights(axis_in[a], axis_out[a]).precision, want.as_int64())
                    << "axis " << a;
            }
        }
        const RgbImage want =
            rgb_from_b64(im.find("resized_rgb_base64")->as_string(), p.resized.height, p.resized.width);
        size_t diff = 0;
        for (size_t i = 0; i < want.pixels.size(); ++i) diff += want.pixels[i] != p.resized.pixels[i];
        EXPECT_EQ(diff, 0u) << "resized bytes differing from the PyTorch kernel";
        EXPECT_EQ(sha256_hex(p.resized.pixels.data(), p.resized.pixels.size()),
                  im.find("resized_rgb_sha256")->as_string());

        EXPECT_EQ(p.grid_t, hw(im, "grid_thw", 0));
        EXPECT_EQ(p.grid_h, hw(im, "grid_thw", 1));
        EXPECT_EQ(p.grid_w, hw(im, "grid_thw", 2));
        EXPECT_EQ(p.merged_h, hw(im, "merged_grid_hw", 0));
        EXPECT_EQ(p.merged_w, hw(im, "merged_grid_hw", 1));
        EXPECT_EQ(p.num_tokens(), im.find("num_image_tokens")->as_int64());

        const std::vector<float> pv = pixel_values(p, cfg);
        const JsonValue& ref = *im.find("pixel_values");
        const int64_t rows = ref.find("shape")->items()[0].as_int64();
        const int64_t cols = ref.find("shape")->items()[1].as_int64();
        ASSERT_EQ(static_cast<int64_t>(pv.size()), rows * cols);
        EXPECT_EQ(cols, cfg.patch_dim());
        EXPECT_EQ(sha256_hex(pv.data(), pv.size() * sizeof(float)), ref.find("sha256_f32le")->as_string());
        double sum = 0, sq = 0;
        for (float v : pv) {
            sum += v;
            sq += static_cast<double>(v) * v;
        }
        EXPECT_NEAR(sum, ref.find("sum")->as_double(), 1e-9 * std::max(1.0, std::abs(sum)));
        EXPECT_NEAR(sq, ref.find("sum_of_squares")->as_double(), 1e-9 * sq);
        const std::pair<const char*, int64_t> check_rows[] = {
            {"row_0", 0}, {"row_1", 1}, {"row_last", rows - 1}};
        for (const auto& [key, r] : check_rows) {
            const auto& want_row = ref.find(key)->items();
            ASSERT_EQ(static_cast<int64_t>(want_row.size()), cols);
            for (int64_t j = 0; j < cols; ++j)
                ASSERT_EQ(pv[static_cast<size_t>(r * cols + j)], static_cast<float>(want_row[j].as_double()))
                    << key << " col " << j;
        }
        ++n;
    });
    EXPECT_EQ(n, 7);
}
