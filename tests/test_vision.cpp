// The vision tower and merger against the float64 reference (tests/data/tiny-clef): vision_probe.json stage
// by stage (patch embedding, interpolated position embedding, 2-D rotary tables, every block's internals,
// merger), and every image's merger output in image_cases.json, within 1e-4, on the fast (default) path. The
// fast path against the scalar reference path (the oracle) stage by stage, on every fixture image and on a
// two-frame input, within 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "device/linear.h"
#include "image/decode.h"
#include "image/preprocess.h"
#include "image/source.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/vision.h"
#include "support/sha256.h"
#include "test_util.h"
#include "util/json.h"

using namespace clef;

namespace {

const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";
constexpr double kTol = 1e-4;
// Fast (packed, Exact) vs reference path: both fp32-accurate, so they agree far below the fixture tolerance.
constexpr double kFastTol = 1e-5;

using clef::testing::read_file;

const JsonValue& image_cases() {
    return clef::testing::tiny_image_cases();
}

const JsonValue& probe() {
    static const JsonValue doc =
        parse_json_or_throw(read_file(kModel + "/vision_probe.json"), "vision_probe.json");
    return doc;
}

const ImageProcessorConfig& processor() {
    static const ImageProcessorConfig c = load_image_processor_config(kModel + "/processor_config.json");
    return c;
}

const ModelConfig& model_config() {
    static const ModelConfig cfg = load_model_config(kModel + "/config.json");
    return cfg;
}

const Checkpoint& checkpoint() {
    static const Checkpoint ckpt = Checkpoint::open(kModel + "/model.safetensors");
    return ckpt;
}

// The fast path (the default, what the engine loads).
const VisionTower& tower() {
    static const VisionTower t(*model_config().vision, checkpoint());
    return t;
}

// The scalar reference path (the oracle).
const VisionTower& reference_tower() {
    static const VisionTower t(*model_config().vision, checkpoint(), "model.visual.", /*reference=*/true);
    return t;
}

// Max |a - b| over two equally long vectors.
double max_diff(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
    EXPECT_EQ(a.size(), b.size()) << what;
    if (a.size() != b.size() || a.empty()) return INFINITY;
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
    return m;
}

void flatten(const JsonValue& v, std::vector<double>& out) {
    if (v.is_array()) {
        for (const auto& x : v.items()) flatten(x, out);
    } else {
        out.push_back(v.as_double());
    }
}

// Max |got - want| over a nested list; sizes must agree.
double max_diff(const std::vector<float>& got, const JsonValue& want, const std::string& what) {
    std::vector<double> w;
    flatten(want, w);
    EXPECT_EQ(got.size(), w.size()) << what;
    if (got.size() != w.size()) return INFINITY;
    double m = 0;
    for (size_t i = 0; i < w.size(); ++i) m = std::max(m, std::abs(static_cast<double>(got[i]) - w[i]));
    return m;
}

// The processor output for the image `item` of a request (as a client sends it).
ProcessedImage process_request_image(const JsonValue& item) {
    const ImageSource src = parse_image_source(item);
    return process_image(decode_image(src.bytes).rgb, processor());
}

}  // namespace

TEST(Vision, LoadsAndValidates) {
    const VisionTower& t = tower();
    EXPECT_EQ(t.patch_dim(), 1536);
    EXPECT_EQ(t.config().depth, 2);
    const Checkpoint ckpt = Checkpoint::open(kModel + "/model.safetensors");
    EXPECT_TRUE(VisionTower::in_checkpoint(ckpt));
    EXPECT_FALSE(VisionTower::in_checkpoint(ckpt, "model.vision."));
    VisionConfig bad = t.config();
    bad.intermediate_size = 50;
    try {
        VisionTower v(bad, ckpt);
        ADD_FAILURE() << "expected a shape error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("blocks.0.mlp.linear_fc1.weight"), std::string::npos)
            << e.what();
    }
    bad = t.config();
    bad.hidden_act = "relu";
    EXPECT_THROW(VisionTower(bad, ckpt), Error);
    std::vector<float> pv(16 * 1536, 0.f);
    EXPECT_THROW(t.forward(pv.data(), 1, 4, 3, nullptr), Error);  // 3 columns: not whole 2x2 blocks
}

// The tower's projections are model/linear.h's Linear: both paths against a float64 product.
TEST(Vision, LinearMatchesTheReferenceProduct) {
    for (auto [m, k, n] :
         std::vector<std::tuple<int, int, int>>{{1, 3, 1}, {7, 33, 5}, {70, 129, 67}, {9, 1536, 130}}) {
        std::vector<float> w(static_cast<size_t>(n) * k), bias(static_cast<size_t>(n));
        std::vector<float> x(static_cast<size_t>(m) * k), y(static_cast<size_t>(m) * n);
        for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * static_cast<float>(i));
        for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.1f * static_cast<float>(i % 7);
        for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.11f * static_cast<float>(i));
        for (LinearPath path : {LinearPath::Reference, LinearPath::Fast}) {
            const Linear l(w, n, k, path, bias);
            l.forward(x.data(), m, y.data());
            for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) {
                    double want = bias[j];
                    for (int t = 0; t < k; ++t)
                        want += static_cast<double>(x[static_cast<size_t>(i) * k + t]) *
                                w[static_cast<size_t>(j) * k + t];
                    ASSERT_NEAR(y[static_cast<size_t>(i) * n + j], want, 1e-4 * std::sqrt(k))
                        << m << "x" << k << "x" << n << (path == LinearPath::Fast ? " fast" : " reference");
                }
        }
    }
}

TEST(Vision, ProbeStageByStage) {
    const JsonValue& pr = probe();
    const std::string case_name = pr.find("case")->as_string();
    const size_t image_index = static_cast<size_t>(pr.find("image_index")->as_int64());
    const JsonValue* request = nullptr;
    for (const auto& c : image_cases().items())
        if (c.find("name")->as_string() == case_name) request = c.find("request");
    ASSERT_NE(request, nullptr);
    const ProcessedImage img = process_request_image(request->find("images")->items()[image_index]);
    const auto& grid = pr.find("grid_thw")->items();
    ASSERT_EQ(img.grid_t, grid[0].as_int64());
    ASSERT_EQ(img.grid_h, grid[1].as_int64());
    ASSERT_EQ(img.grid_w, grid[2].as_int64());
    const std::vector<float> pv = pixel_values(img, processor());
    EXPECT_EQ(sha256_hex(pv.data(), pv.size() * sizeof(float)),
              pr.find("pixel_values_sha256_f32le")->as_string());

    VisionTrace tr;
    const std::vector<float> out = tower().forward(pv.data(), img.grid_t, img.grid_h, img.grid_w, &tr);
    auto check = [&](const std::vector<float>& got, const JsonValue& want, const std::string& what) {
        const double d = max_diff(got, want, what);
        EXPECT_LE(d, kTol) << what;
        std::printf("  %-26s max |diff| %.3g\n", what.c_str(), d);
    };
    check(tr.patch_embed, *pr.find("patch_embed"), "patch_embed");
    check(tr.pos_embed, *pr.find("pos_embed"), "pos_embed");
    std::vector<double> rc;
    flatten(*pr.find("rotary_row_col"), rc);
    ASSERT_EQ(rc.size(), tr.rotary_row_col.size());
    for (size_t i = 0; i < rc.size(); ++i) EXPECT_EQ(tr.rotary_row_col[i], static_cast<int32_t>(rc[i])) << i;
    check(tr.rotary_cos, *pr.find("rotary_cos"), "rotary_cos");
    check(tr.rotary_sin, *pr.find("rotary_sin"), "rotary_sin");
    check(tr.embeddings, *pr.find("embeddings"), "embeddings");
    const auto& blocks = pr.find("blocks")->items();
    ASSERT_EQ(blocks.size(), tr.blocks.size());
    for (size_t l = 0; l < blocks.size(); ++l) {
        const VisionTrace::Block& b = tr.blocks[l];
        const std::string p = "blocks." + std::to_string(l) + ".";
        check(b.norm1, *blocks[l].find("norm1"), p + "norm1");
        check(b.q_rope, *blocks[l].find("q_rope"), p + "q_rope");
        check(b.k_rope, *blocks[l].find("k_rope"), p + "k_rope");
        check(b.v, *blocks[l].find("v"), p + "v");
        check(b.attn, *blocks[l].find("attn"), p + "attn");
        check(b.attn_out, *blocks[l].find("attn_out"), p + "attn_out");
        check(b.norm2, *blocks[l].find("norm2"), p + "norm2");
        check(b.mlp_out, *blocks[l].find("mlp_out"), p + "mlp_out");
        check(b.block_out, *blocks[l].find("block_out"), p + "block_out");
    }
    check(tr.merger_norm, *pr.find("merger_norm"), "merger_norm");
    check(tr.merger_in, *pr.find("merger_in"), "merger_in");
    check(tr.merger_fc1_gelu, *pr.find("merger_fc1_gelu"), "merger_fc1_gelu");
    check(tr.merged, *pr.find("merged"), "merged");
    EXPECT_EQ(out, tr.merged);
}

TEST(Vision, EveryImageOutputWithinTolerance) {
    int n = 0;
    double worst = 0;
    clef::testing::for_each_fixture_image(
        [&](const JsonValue& c, const JsonValue& im, const JsonValue& req_image) {
            const std::string what = c.find("name")->as_string() + " " + im.find("file")->as_string();
            const ProcessedImage img = process_request_image(req_image);
            const std::vector<float> pv = pixel_values(img, processor());
            EXPECT_EQ(sha256_hex(pv.data(), pv.size() * sizeof(float)),
                      im.find("pixel_values")->find("sha256_f32le")->as_string())
                << what;
            const std::vector<float> out = tower().forward(pv.data(), img.grid_t, img.grid_h, img.grid_w);
            EXPECT_EQ(static_cast<int64_t>(out.size()), im.find("num_image_tokens")->as_int64() * 64) << what;
            const double d = max_diff(out, *im.find("vision_output"), what);
            EXPECT_LE(d, kTol) << what;
            std::printf("  %-50s vision_output max |diff| %.3g\n", what.c_str(), d);
            worst = std::max(worst, d);
            ++n;
        });
    EXPECT_EQ(n, 7);
    std::printf("  worst vision_output max |diff| over %d images: %.3g\n", n, worst);
}

TEST(Vision, FastPathMatchesTheReferenceStageByStage) {
    EXPECT_FALSE(tower().reference());
    EXPECT_TRUE(reference_tower().reference());
    double worst = 0;
    int n = 0;
    clef::testing::for_each_fixture_image([&](const JsonValue& c, const JsonValue& im,
                                              const JsonValue& req_image) {
        const std::string what = c.find("name")->as_string() + " " + im.find("file")->as_string();
        const ProcessedImage img = process_request_image(req_image);
        const std::vector<float> pv = pixel_values(img, processor());
        VisionTrace fast, ref;
        const std::vector<float> out_fast =
            tower().forward(pv.data(), img.grid_t, img.grid_h, img.grid_w, &fast);
        const std::vector<float> out_ref =
            reference_tower().forward(pv.data(), img.grid_t, img.grid_h, img.grid_w, &ref);
        auto check = [&](const std::vector<float>& a, const std::vector<float>& b, const std::string& stage) {
            const double d = max_diff(a, b, what + " " + stage);
            EXPECT_LE(d, kFastTol) << what << " " << stage;
            worst = std::max(worst, d);
        };
        check(fast.patch_embed, ref.patch_embed, "patch_embed");
        check(fast.embeddings, ref.embeddings, "embeddings");
        ASSERT_EQ(fast.blocks.size(), ref.blocks.size());
        for (size_t l = 0; l < ref.blocks.size(); ++l) {
            const std::string p = "blocks." + std::to_string(l) + ".";
            check(fast.blocks[l].norm1, ref.blocks[l].norm1, p + "norm1");
            check(fast.blocks[l].q_rope, ref.blocks[l].q_rope, p + "q_rope");
            check(fast.blocks[l].k_rope, ref.blocks[l].k_rope, p + "k_rope");
            check(fast.blocks[l].v, ref.blocks[l].v, p + "v");
            check(fast.blocks[l].attn, ref.blocks[l].attn, p + "attn");
            check(fast.blocks[l].attn_out, ref.blocks[l].attn_out, p + "attn_out");
            check(fast.blocks[l].mlp_out, ref.blocks[l].mlp_out, p + "mlp_out");
            check(fast.blocks[l].block_out, ref.blocks[l].block_out, p + "block_out");
        }
        check(fast.merger_fc1_gelu, ref.merger_fc1_gelu, "merger_fc1_gelu");
        check(out_fast, out_ref, "merged");
        ++n;
    });
    EXPECT_EQ(n, 7);
    std::printf("  fast vs reference: worst max |diff| over %d images, every stage: %.3g\n", n, worst);
}

TEST(Vision, FastPathMatchesTheReferenceOnTwoFrames) {
    // grid_t = 2 (a two-frame video input): attention stays within each frame on both paths.
    const int grid_t = 2, grid_h = 6, grid_w = 4;
    const int64_t rows = int64_t{grid_t} * grid_h * grid_w;
    std::vector<float> pv(static_cast<size_t>(rows * tower().patch_dim()));
    for (size_t i = 0; i < pv.size(); ++i) pv[i] = std::sin(0.013f * static_cast<float>(i * i % 9973));
    const std::vector<float> fast = tower().forward(pv.data(), grid_t, grid_h, grid_w);
    const std::vector<float> ref = reference_tower().forward(pv.data(), grid_t, grid_h, grid_w);
    ASSERT_EQ(fast.size(), static_cast<size_t>(rows / 4 * model_config().vision->out_hidden_size));
    EXPECT_LE(max_diff(fast, ref, "two frames"), kFastTol);
    // Frames do not attend to each other: the second frame run alone reproduces the second half.
    const std::vector<float> second = reference_tower().forward(pv.data() + pv.size() / 2, 1, grid_h, grid_w);
    ASSERT_EQ(second.size() * 2, fast.size());
    const std::vector<float> tail(fast.begin() + static_cast<std::ptrdiff_t>(second.size()), fast.end());
    EXPECT_LE(max_diff(tail, second, "second frame alone"), kFastTol);
}

TEST(Vision, FastPathMatchesTheReferenceForOtherHeadDims) {
    // The weights' shapes do not depend on num_heads: the tiny checkpoint loads with 1, 4 or 8 heads
    // (head_dim 32, 8, 4), which exercises the attention products' partial register blocks (Clef-Flash:
    // head_dim 72).
    const ProcessedImage img =
        process_request_image(image_cases().items()[0].find("request")->find("images")->items()[0]);
    const std::vector<float> pv = pixel_values(img, processor());
    for (int heads : {1, 4, 8}) {
        VisionConfig c = *model_config().vision;
        c.num_heads = heads;
        const VisionTower fast(c, checkpoint());
        const VisionTower ref(c, checkpoint(), "model.visual.", /*reference=*/true);
        const std::vector<float> a = fast.forward(pv.data(), img.grid_t, img.grid_h, img.grid_w);
        const std::vector<float> b = ref.forward(pv.data(), img.grid_t, img.grid_h, img.grid_w);
        EXPECT_LE(max_diff(a, b, std::to_string(heads) + " heads"), kFastTol) << heads << " heads";
    }
}

TEST(Vision, FlopsCountTheProjectionsAttentionAndMerger) {
    // Hand count for the tiny tower (hidden 32, MLP 48, depth 2, patch_dim 1536, out 64) on one 4x4 frame.
    const VisionConfig& c = *model_config().vision;
    const double N = 16, H = 32, I = 48;
    const double block = 2 * N * H * 96 + 2 * N * H * H + 4 * N * N * H + 4 * N * H * I;
    const double want = 2 * N * 1536 * H + 2 * block + 2 * 4 * 128 * 128 + 2 * 4 * 128 * 64;
    EXPECT_DOUBLE_EQ(vision_flops(c, 1, 4, 4), want);
    // Two frames: twice the per-patch work, attention within each frame only.
    EXPECT_DOUBLE_EQ(vision_flops(c, 2, 4, 4), 2 * want);
}
