// `clef bench --image WxH` end to end on the tiny-clef fixture: the JSON keys, the image geometry against the
// image processor run here on the same synthetic picture, the FLOP count against vision_flops (checked by
// hand in test_vision), sane timings, and the refusals (bad size, options that do not apply, no vision
// tower).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <string>

#include "image/preprocess.h"
#include "image/synthetic.h"
#include "model/config.h"
#include "model/vision.h"
#include "test_util.h"
#include "tools/make_model.h"
#include "util/json.h"

using namespace clef;
using clef::testing::data_path;
using clef::testing::run_command;

namespace {

const std::string kModel = data_path("tiny-clef");

// Runs `clef bench <args>`; returns stdout (stderr too when merge_stderr) and sets the exit code.
std::string bench(const std::string& args, int& exit_code, bool merge_stderr = false) {
    int status = 0;
    const std::string out =
        run_command(std::string(CLEF_BINARY) + " bench " + args + (merge_stderr ? " 2>&1" : ""), status);
    exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

double number(const JsonValue& o, const char* key) {
    const JsonValue* v = o.find(key);
    if (!v) {
        ADD_FAILURE() << "missing key " << key;
        return NAN;
    }
    return v->as_double();
}

}  // namespace

TEST(BenchImage, ReportsTheVisionTowerTimeForOneSyntheticImage) {
    int code = 0;
    const std::string out =
        bench("--model " + kModel + " --image 96x64 --repeat 3 --warmup 1 --threads 1", code);
    ASSERT_EQ(code, 0) << out;
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.find('\n'), out.size() - 1) << "one JSON line: " << out;
    const JsonValue o = parse_json_or_throw(out, "bench output");

    // The geometry the processor gives this picture (96 wide, 64 high) here, independently of the bench.
    const ImageProcessorConfig proc = load_image_processor_config(kModel + "/processor_config.json");
    const ProcessedImage img = process_image(synthetic_image(96, 64), proc);
    EXPECT_EQ(o.find("image")->as_string(), "96x64");
    EXPECT_EQ(o.find("resized")->as_string(),
              std::to_string(img.resized.width) + "x" + std::to_string(img.resized.height));
    EXPECT_EQ(o.find("patches")->as_int64(), img.num_patches());
    EXPECT_EQ(o.find("image_tokens")->as_int64(), img.num_tokens());
    EXPECT_EQ(img.num_tokens(), 6);  // 96x64 stays 96x64: 6x4 patches of 16, 3x2 merged tokens
    EXPECT_EQ(o.find("threads")->as_int64(), 1);
    EXPECT_EQ(o.find("precision")->as_string(), "exact");
    EXPECT_EQ(o.find("repeat")->as_int64(), 3);
    EXPECT_EQ(o.find("tokens"), nullptr) << "no decision timing with --image";

    const ModelConfig cfg = load_model_config(kModel + "/config.json");
    const double gflop = vision_flops(*cfg.vision, img.grid_t, img.grid_h, img.grid_w) / 1e9;
    EXPECT_NEAR(number(o, "vision_gflop"), gflop, 1e-9 * gflop);

    const double best = number(o, "vision_seconds_best"), median = number(o, "vision_seconds_median");
    EXPECT_GT(best, 0);
    EXPECT_LE(best, median);
    EXPECT_LT(median, 60);
    EXPECT_NEAR(number(o, "vision_gflops"), gflop / best, 1e-6 * gflop / best);
    const double pre_best = number(o, "preprocess_seconds_best");
    EXPECT_GT(pre_best, 0);
    EXPECT_LE(pre_best, number(o, "preprocess_seconds_median"));
    EXPECT_GT(number(o, "peak_rss_mib"), 0);
    EXPECT_GE(number(o, "load_seconds"), 0);
}

TEST(BenchImage, ReferencePath) {
    int code = 0;
    const std::string out =
        bench("--model " + kModel + " --image 64x64 --repeat 1 --warmup 0 --reference", code);
    ASSERT_EQ(code, 0) << out;
    const JsonValue o = parse_json_or_throw(out, "bench output");
    EXPECT_EQ(o.find("precision")->as_string(), "reference");
    EXPECT_EQ(o.find("image_tokens")->as_int64(), 4);
    EXPECT_GT(number(o, "vision_seconds_best"), 0);
}

TEST(BenchImage, Refusals) {
    int code = 0;
    for (const char* size : {"64", "64x", "x64", "0x64", "64x64x3", "64 x 64", "-64x64", "70000x64"}) {
        const std::string out =
            bench("--model " + kModel + " --image '" + size + "' --repeat 1 --warmup 0", code, true);
        EXPECT_EQ(code, 2) << size << ": " << out;
        EXPECT_NE(out.find("--image: expected WIDTHxHEIGHT"), std::string::npos) << size << ": " << out;
    }
    for (const char* other : {"--tokens 64", "--chunk 64", "--profile"}) {
        const std::string out = bench("--model " + kModel + " --image 64x64 " + other, code, true);
        EXPECT_NE(code, 0) << other;
        EXPECT_NE(out.find("excludes"), std::string::npos) << other << ": " << out;
    }
    std::string out = bench("--model " + kModel + " --image 64x64 --precision bf16", code, true);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find("exact precision only"), std::string::npos) << out;

    const std::string dir = ::testing::TempDir() + "/clef_bench_no_vision";
    MakeModelOptions mk;
    mk.preset = "tiny";
    mk.vision = false;
    make_model(mk, dir);
    out = bench("--model " + dir + " --image 64x64", code, true);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find("no vision tower"), std::string::npos) << out;
}
