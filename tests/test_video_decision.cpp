// Requests with videos (lists of frames) end to end against the publisher's reference
// (tests/data/tiny-clef/video_cases.json, float64 goldens; the rules in tests/data/tiny-clef/README.md
// "Videos"): request -> frames decoded -> video smart_resize and per-frame bicubic -> temporal groups ->
// media block with timestamps (ids, segments, mm_token_type_ids, MRoPE positions exact) -> pixel values
// (float32 sha256 exact) -> vision tower with one attention segment per group -> embedding substitution ->
// backbone -> head -> response; the processor's refusals; request validation of `videos` and
// `media_kwargs`; the state cache keyed on the frames; `clef decide`, `clef batch` and `clef bench --video`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "decision/engine.h"
#include "decision/media.h"
#include "decision/request.h"
#include "image/preprocess.h"
#include "image/video.h"
#include "model/vision.h"
#include "support/base64_encode.h"
#include "support/sha256.h"
#include "test_util.h"
#include "test_vision_util.h"
#include "tools/make_model.h"
#include "util/json.h"

using namespace clef;
using clef::testing::expect_media_prompt_matches;
using clef::testing::ints_of;

namespace {

const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";

using clef::testing::expect_json_near;
using clef::testing::parse_case_request;
using clef::testing::read_file;
using clef::testing::span_of;

const JsonValue& video_cases() {
    static const JsonValue doc =
        parse_json_or_throw(read_file(kModel + "/video_cases.json"), "video_cases.json");
    return *doc.find("cases");
}

const JsonValue& video_case(const std::string& name) {
    for (const auto& c : video_cases().items())
        if (c.find("name")->as_string() == name) return c;
    throw std::runtime_error("no case " + name);
}

const Engine& engine() {
    static const std::unique_ptr<Engine> e = Engine::load(kModel);
    return *e;
}

bool answered(const JsonValue& c) {
    return c.find("expected_error") == nullptr;
}

DecisionRequest request_of(const JsonValue& c) {
    DecisionRequest req;
    std::vector<RequestError> errors;
    if (!parse_case_request(c, req, errors)) throw std::runtime_error(describe_errors(errors));
    return req;
}

Engine::Prepared prepared(const JsonValue& c, bool keep_segments = false) {
    DecideOptions opt;
    opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
    opt.keep_segments = keep_segments;
    return engine().prepare(request_of(c), opt);
}

std::string sha256_of(const std::vector<float>& v) {
    return sha256_hex(v.data(), v.size() * sizeof(float));
}

std::vector<float> floats_of(const JsonValue& arr) {
    std::vector<float> v;
    for (const auto& x : arr.items()) v.push_back(static_cast<float>(x.as_double()));
    return v;
}

// A request body with these videos (JSON text) and media_kwargs (JSON text, "" for none).
std::string body_with(const std::string& videos,
                      const std::string& kwargs = R"({"do_sample_frames":false})") {
    std::string b =
        R"({"model":"clef-flash","state":"s","questions":{"q":{"type":"noul","instructions":"ok?"}})";
    if (!videos.empty()) b += R"(,"videos":)" + videos;
    if (!kwargs.empty()) b += R"(,"media_kwargs":)" + kwargs;
    return b + "}";
}

// The first frame of a fixture case's first video, as the client sent it (JSON text).
std::string fixture_frame(const std::string& case_name, size_t frame = 0) {
    const JsonValue body =
        parse_json_or_throw(video_case(case_name).find("request_body")->as_string(), "body");
    return write_json(body.find("videos")->items()[0].items()[frame]);
}

// n copies of a JSON item, as a JSON list.
std::string list_of(const std::string& item, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s + "]";
}

}  // namespace

TEST(VideoDecision, EngineReadsTheVideoProcessor) {
    ASSERT_NE(engine().vision(), nullptr);
    // processor_config.json's video block, not the image block's 4096 / 12288.
    EXPECT_EQ(engine().video_processor().min_pixels, 1024);
    EXPECT_EQ(engine().video_processor().max_pixels, 24576);
    EXPECT_EQ(engine().image_processor().max_pixels, 12288);
    const auto none = parse_video_processor_config(R"({"image_processor":{}})", "p.json");
    EXPECT_FALSE(none.has_value());
    const ImageProcessorConfig flash = clef_flash_video_processor(16, 2, 2);
    EXPECT_EQ(flash.min_pixels, 4096);
    EXPECT_EQ(flash.max_pixels, 25165824);
}

TEST(VideoDecision, SmartResizeTimestampsAndTexts) {
    // The fixture's five-frame case: t̄ = round(5/2)·2 = 4 (half to even) keeps 4·32·160 = 20480 under 24576;
    // half-up rounding would give t̄ = 6 and the max_pixels branch.
    SmartResize s = smart_resize_video(5, 40, 150, 2, 32, 1024, 24576);
    EXPECT_EQ(s.height, 32);
    EXPECT_EQ(s.width, 160);
    EXPECT_EQ(s.branch, ResizeBranch::Round);
    // 4 frames of 120x160 over 24576: β = sqrt(4·120·160/24576) = sqrt(3.125) = 1.7678; floor(120/β/32) = 2,
    // floor(160/β/32) = 2.
    s = smart_resize_video(4, 120, 160, 2, 32, 1024, 24576);
    EXPECT_EQ(s.height, 64);
    EXPECT_EQ(s.width, 64);
    EXPECT_EQ(s.branch, ResizeBranch::MaxPixels);
    // Exactly at the bound: unchanged.
    s = smart_resize_video(4, 64, 96, 2, 32, 1024, 24576);
    EXPECT_EQ(s.branch, ResizeBranch::None);
    // Below min_pixels (a larger bound than the fixture's): β = sqrt(65536/(2·32·32)) = 5.657, ceil(32·β/32)
    // = 6.
    s = smart_resize_video(2, 32, 32, 2, 32, 65536, 1 << 24);
    EXPECT_EQ(s.height, 192);
    EXPECT_EQ(s.branch, ResizeBranch::MinPixels);
    try {
        smart_resize_video(1, 64, 64, 2, 32, 1024, 24576);
        ADD_FAILURE() << "one frame accepted";
    } catch (const ImageError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("t:1 must be larger than temporal_factor:2", 0), 0u)
            << e.what();
    }
    EXPECT_THROW(smart_resize_video(4, 1, 1, 2, 32, 1024, 24576), ImageError);

    // Indices padded with the last one; the mean of each group's first and last second.
    EXPECT_EQ(video_group_timestamps({0, 3, 6, 9, 12}, 4.0, 2), (std::vector<double>{0.375, 1.875, 3.0}));
    // (0/24 + 1/24)/2 and (2/24 + 3/24)/2 as Python computes them (the fixture's group_timestamps).
    EXPECT_EQ(video_group_timestamps({0, 1, 2, 3}, 24.0, 2),
              (std::vector<double>{0.020833333333333332, 0.10416666666666666}));
    // Python's f"{t:.1f}": the exact binary value, ties to even.
    EXPECT_EQ(video_timestamp_text(0.25), "<0.2 seconds>");
    EXPECT_EQ(video_timestamp_text(1.25), "<1.2 seconds>");
    EXPECT_EQ(video_timestamp_text(0.375), "<0.4 seconds>");
    EXPECT_EQ(video_timestamp_text(1.875), "<1.9 seconds>");
    EXPECT_EQ(video_timestamp_text(0.15), "<0.1 seconds>");  // 0.1499999999999999944...
    EXPECT_EQ(video_timestamp_text(1234.0), "<1234.0 seconds>");
}

TEST(VideoDecision, PromptIdsTypesAndPositionsAreExact) {
    int n = 0;
    for (const auto& c : video_cases().items()) {
        if (!answered(c)) continue;
        SCOPED_TRACE(c.find("name")->as_string());
        const Engine::Prepared p = prepared(c, /*keep_segments=*/true);
        expect_media_prompt_matches(p, c);
        const auto& vids = c.find("videos")->items();
        ASSERT_EQ(p.videos.size(), vids.size());
        for (size_t i = 0; i < vids.size(); ++i) {
            const ProcessedVideo& v = p.videos[i];
            EXPECT_EQ((std::vector<int32_t>{v.grid_t, v.grid_h, v.grid_w}),
                      ints_of(*vids[i].find("grid_thw")));
            EXPECT_EQ(v.num_tokens(), vids[i].find("num_video_tokens")->as_int64());
            EXPECT_EQ(resize_branch_name(v.branch), vids[i].find("resize_branch")->as_string());
            const auto& texts = vids[i].find("timestamp_texts")->items();
            ASSERT_EQ(v.timestamp_texts.size(), texts.size());
            for (size_t g = 0; g < texts.size(); ++g) EXPECT_EQ(v.timestamp_texts[g], texts[g].as_string());
            for (const auto& r : vids[i].find("group_token_ranges")->items()) {
                const auto [b, e] = span_of(r);
                for (int t = b; t < e; ++t) EXPECT_EQ(p.mm_token_type_ids[t], 2) << t;
            }
        }
        ++n;
    }
    EXPECT_EQ(n, 5);
}

TEST(VideoDecision, FramesAndPixelValuesAreExact) {
    int videos = 0;
    for (const auto& c : video_cases().items()) {
        if (!answered(c)) continue;
        SCOPED_TRACE(c.find("name")->as_string());
        const DecisionRequest req = request_of(c);
        const auto& vids = c.find("videos")->items();
        ASSERT_EQ(req.decoded_videos.size(), vids.size());
        for (size_t i = 0; i < vids.size(); ++i) {
            const DecodedVideo& d = req.decoded_videos[i];
            const auto& frames = vids[i].find("frames")->items();
            ASSERT_EQ(d.frames.size(), frames.size());
            for (size_t j = 0; j < frames.size(); ++j)
                EXPECT_EQ(sha256_hex(d.frames[j].pixels.data(), d.frames[j].pixels.size()),
                          frames[j].find("decoded_rgb_sha256")->as_string())
                    << "frame " << j;
            const ProcessedVideo v = process_video(d, engine().video_processor());
            std::string resized;
            for (const RgbImage& f : v.frames) resized.append(f.pixels.begin(), f.pixels.end());
            EXPECT_EQ(sha256_hex(resized), vids[i].find("resized_rgb_sha256")->as_string());
            const std::vector<float> pv = video_pixel_values(v, engine().video_processor());
            const JsonValue& want = *vids[i].find("pixel_values_videos");
            const auto shape = ints_of(*want.find("shape"));
            ASSERT_EQ(shape.size(), 2u);
            ASSERT_EQ(pv.size(), static_cast<size_t>(shape[0]) * shape[1]);
            EXPECT_EQ(sha256_of(pv), want.find("sha256_f32le")->as_string());
            const size_t dim = static_cast<size_t>(shape[1]);
            EXPECT_EQ(std::vector<float>(pv.begin(), pv.begin() + dim), floats_of(*want.find("row_0")));
            EXPECT_EQ(std::vector<float>(pv.begin() + dim, pv.begin() + 2 * dim),
                      floats_of(*want.find("row_1")));
            EXPECT_EQ(std::vector<float>(pv.end() - dim, pv.end()), floats_of(*want.find("row_last")));
            ++videos;
        }
    }
    EXPECT_EQ(videos, 6);
}

TEST(VideoDecision, VisionOutputMatchesTheReference) {
    for (const auto& c : video_cases().items()) {
        if (!answered(c)) continue;
        SCOPED_TRACE(c.find("name")->as_string());
        const Engine::Prepared p = prepared(c);
        const MediaFeatures f = vision_features(*engine().vision(), p.images, engine().image_processor(),
                                                p.videos, engine().video_processor());
        const auto& vids = c.find("videos")->items();
        ASSERT_EQ(f.videos.size(), vids.size());
        for (size_t i = 0; i < vids.size(); ++i) {
            const auto& rows = vids[i].find("vision_output")->items();
            const size_t H = rows.empty() ? 0 : rows[0].items().size();
            ASSERT_EQ(f.videos[i].size(), rows.size() * H);
            double worst = 0;
            for (size_t r = 0; r < rows.size(); ++r)
                for (size_t j = 0; j < H; ++j)
                    worst =
                        std::max(worst, std::abs(f.videos[i][r * H + j] - rows[r].items()[j].as_double()));
            EXPECT_LE(worst, 1e-4) << "video " << i;
            std::printf("  video %zu: vision output max %.3g\n", i, worst);
        }
    }
}

TEST(VideoDecision, MatchesTheReference) {
    int n = 0;
    for (const auto& c : video_cases().items()) {
        if (!answered(c)) continue;
        const std::string name = c.find("name")->as_string();
        SCOPED_TRACE(name);
        DecideOptions opt;
        opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
        const Decision d = engine().decide(request_of(c), opt, /*keep_hidden=*/true);
        const clef::testing::GoldenDiff g = clef::testing::expect_matches_image_golden(d, c);
        std::printf("  %-30s logits %.3g | probabilities %.3g\n", name.c_str(), g.logits_max,
                    g.probabilities_max);
        ++n;
    }
    EXPECT_EQ(n, 5);
}

// The README's check behind the goldens: a video of frames A, A, B, B is, group by group, images A and B —
// the same pixel values and the same tower rows (the grouping, the per-group attention and the repeated
// position tables agree with the image path).
TEST(VideoDecision, FramesAABBAreImagesAAndB) {
    const DecisionRequest req = request_of(video_case("video_four_frames_png"));
    const RgbImage& a = req.decoded_videos[0].frames[0];
    const RgbImage& b = req.decoded_videos[0].frames[2];
    DecodedVideo v;
    v.frames = {a, a, b, b};
    v.metadata.frame_indices = {0, 1, 2, 3};
    ImageProcessorConfig cfg = engine().image_processor();  // 64x64 stays 64x64 in both processors
    const ProcessedVideo pv = process_video(v, engine().video_processor());
    const ProcessedImage ia = process_image(a, cfg), ib = process_image(b, cfg);
    ASSERT_EQ(pv.grid_t, 2);
    ASSERT_EQ(pv.frames[0].width, ia.resized.width);
    std::vector<float> images = pixel_values(ia, cfg);
    const std::vector<float> pb = pixel_values(ib, cfg);
    images.insert(images.end(), pb.begin(), pb.end());
    EXPECT_EQ(video_pixel_values(pv, engine().video_processor()), images);
    const MediaFeatures f =
        vision_features(*engine().vision(), {ia, ib}, cfg, {pv}, engine().video_processor());
    std::vector<float> rows = f.images[0];
    rows.insert(rows.end(), f.images[1].begin(), f.images[1].end());
    EXPECT_EQ(f.videos[0], rows);
}

TEST(VideoDecision, ProcessorErrorsAreRefused) {
    // No media_kwargs: refused while parsing, with the processor's message.
    {
        const JsonValue& c = video_case("video_sampling_not_disabled_error");
        DecisionRequest req;
        std::vector<RequestError> errors;
        EXPECT_FALSE(parse_case_request(c, req, errors));
        ASSERT_EQ(errors.size(), 1u);
        EXPECT_EQ(errors[0].kind, RequestErrorKind::ApiUsage);
        EXPECT_NE(errors[0].message.find(c.find("expected_error")->find("message")->as_string()),
                  std::string::npos)
            << errors[0].message;
    }
    // Frames of different sizes: refused while decoding (torch's stack error in the reference; our wording).
    {
        const JsonValue& c = video_case("video_frame_sizes_differ_error");
        DecisionRequest req;
        std::vector<RequestError> errors;
        EXPECT_FALSE(parse_case_request(c, req, errors));
        const std::string msg = describe_errors(errors);
        EXPECT_NE(msg.find("videos[0][1]: frame is 96x64 pixels but frame 0 is 64x64"), std::string::npos)
            << msg;
        EXPECT_NE(msg.find("same size"), std::string::npos) << msg;
    }
    // One frame: the request is well formed, the processor refuses it (prepare: a 400 in the server).
    {
        const JsonValue& c = video_case("video_single_frame_error");
        try {
            prepared(c);
            ADD_FAILURE() << "one-frame video accepted";
        } catch (const ImageError& e) {
            EXPECT_EQ(std::string(e.what()).find("videos[0]: " +
                                                 c.find("expected_error")->find("message")->as_string()),
                      0u)
                << e.what();
        }
    }
}

TEST(VideoDecision, LiteralVideoPadInTheTextIsRefused) {
    const JsonValue& c = video_case("video_four_frames_png");
    JsonValue body = parse_json_or_throw(c.find("request_body")->as_string(), "body");
    body.set("state", JsonValue::string("see <|video_pad|> here"));
    DecisionRequest req;
    std::vector<RequestError> errors;
    ASSERT_TRUE(parse_request(body, req, errors)) << describe_errors(errors);
    try {
        engine().prepare(req);
        ADD_FAILURE() << "expected ImageTokenMismatch";
    } catch (const ImageTokenMismatch& e) {
        EXPECT_TRUE(e.video);
        EXPECT_EQ(e.tokens, 9);
        EXPECT_EQ(e.features, 8);
        EXPECT_EQ(std::string(e.what()).rfind(
                      "Video features and video tokens do not match, tokens: 9, features: 8", 0),
                  0u)
            << e.what();
    }
    // Without videos the literal pad is plain text.
    req.decoded_videos.clear();
    EXPECT_NO_THROW(engine().prepare(req));
}

TEST(VideoDecision, StateCacheKeysOnTheFrames) {
    // Two requests with the same ids (same sizes, timestamps, state and questions) but other frames: a cache
    // keyed on the ids alone would resume the first one's state for the second (answers 1e-4 or more apart).
    // A cached engine stops its prefill at the snapshot points, so its chunks of the delta rule end elsewhere
    // than the plain engine's: fp32 rounding in another order, within the 2e-5 of tests/test_state_cache.cpp
    // (measured up to 1.01e-6 under the ASan build on an AVX2-only CPU).
    const JsonValue& c = video_case("video_four_frames_png");
    JsonValue body = parse_json_or_throw(c.find("request_body")->as_string(), "body");
    JsonValue other = body;
    const JsonValue gate =
        parse_json_or_throw(video_case("video_two_videos").find("request_body")->as_string(), "b");
    other.set("videos", JsonValue::array({gate.find("videos")->items()[0]}));
    std::unique_ptr<Engine> cached = Engine::load(kModel);
    cached->set_state_cache(uint64_t{64} << 20, 16);
    DecideOptions opt;
    opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
    auto decide = [&](const Engine& e, const JsonValue& b) {
        DecisionRequest req;
        std::vector<RequestError> errors;
        EXPECT_TRUE(parse_request(b, req, errors)) << describe_errors(errors);
        return e.decide(req, opt);
    };
    const Decision first = decide(*cached, body);
    const Decision second = decide(*cached, other);
    const Decision fresh = decide(engine(), other);
    EXPECT_EQ(second.prompt.input_ids, first.prompt.input_ids);
    EXPECT_EQ(second.tokens_reused, 0);
    EXPECT_LE(clef::testing::max_probability_diff(second.probabilities, fresh.probabilities), 2e-5);
    EXPECT_GT(clef::testing::max_probability_diff(second.probabilities, first.probabilities), 1e-4);
    // The same video again resumes its state.
    const Decision again = decide(*cached, other);
    EXPECT_GT(again.tokens_reused, 0);
    EXPECT_LE(clef::testing::max_probability_diff(again.probabilities, fresh.probabilities), 2e-5);
}

TEST(VideoDecision, ModelWithoutVisionTowerRefusesVideos) {
    const std::string dir = ::testing::TempDir() + "/clef_tiny_no_vision_video";
    MakeModelOptions mk;
    mk.preset = "tiny";
    mk.vision = false;
    make_model(mk, dir);
    const std::unique_ptr<Engine> e = Engine::load(dir);
    DecisionRequest req = request_of(video_case("video_four_frames_png"));
    try {
        e->prepare(req);
        ADD_FAILURE() << "expected ImageError";
    } catch (const ImageError& err) {
        EXPECT_EQ(std::string(err.what()), "videos are not supported: this model has no vision tower");
    }
    req.decoded_videos.clear();
    EXPECT_NO_THROW(e->decide(req));
}

// ---------------------------------------------------------------------------------------------------------
// Request validation

TEST(VideoRequest, ValidationOfVideosAndMediaKwargs) {
    const std::string png = fixture_frame("video_four_frames_png");
    const std::string wide = fixture_frame("video_with_image");  // 64x96
    auto refused = [](const std::string& body, const std::string& needle, const RequestLimits& lim = {}) {
        DecisionRequest r;
        std::vector<RequestError> errs;
        EXPECT_FALSE(parse_request(parse_json_or_throw(body, "body"), r, errs, lim)) << needle;
        ASSERT_EQ(errs.size(), 1u) << needle;
        EXPECT_EQ(errs[0].kind, RequestErrorKind::ApiUsage) << needle;
        EXPECT_NE(errs[0].message.find(needle), std::string::npos) << errs[0].message;
    };
    DecisionRequest req;
    std::vector<RequestError> errors;
    ASSERT_TRUE(parse_request(parse_json_or_throw(body_with(list_of(list_of(png, 3), 2)), "b"), req, errors));
    ASSERT_EQ(req.decoded_videos.size(), 2u);
    EXPECT_EQ(req.decoded_videos[1].frames.size(), 3u);
    EXPECT_EQ(req.decoded_videos[1].metadata.fps, 24.0);
    EXPECT_EQ(req.decoded_videos[1].metadata.frame_indices, (std::vector<int64_t>{0, 1, 2}));
    ASSERT_TRUE(parse_request(parse_json_or_throw(body_with("[]", ""), "b"), req, errors));  // no videos
    EXPECT_TRUE(req.decoded_videos.empty());
    ASSERT_TRUE(parse_request(parse_json_or_throw(body_with("null", "null"), "b"), req, errors));

    const std::string two = list_of(png, 2);
    refused(body_with("\"x\""), "videos: must be a list of videos");
    refused(body_with("[" + png + "]"), "videos[0]: a video must be a list of frames");
    refused(body_with("[[]]"), "videos[0]: empty video");
    refused(body_with("[[1,2]]"), "videos[0][0]: an image must be");
    refused(body_with(R"([["AAAA","AAAA"]])"), "videos[0][0]: unrecognised image data");
    refused(body_with("[" + png + "," + "\"data:image/png;base64,@@\"]"), "videos[0]: a video must be");
    refused(body_with("[[" + png + ",\"data:image/png;base64,@@@@\"]]"), "videos[0][1]: invalid base64");
    refused(body_with("[" + list_of("\"AAAA\"", 10000) + "]"),
            "videos[0]: too many frames (10000); at most 256");
    refused(body_with(list_of(two, 5)), "videos: too many videos (5); at most 4 per request");
    refused(body_with("[" + two + "]", ""), "Sampling frames from a list of images is not supported!");
    refused(body_with("[" + two + "]", R"({"do_sample_frames":true})"), "Set `do_sample_frames=False`.");
    refused(body_with("[" + two + "]", "[]"), "media_kwargs: must be an object");
    refused(body_with("[" + two + "]", R"({"do_sample_frames":"no"})"),
            "do_sample_frames: must be true or false");
    refused(body_with("[" + two + "]", R"({"do_sample_frames":false,"fps":2})"),
            "media_kwargs.fps: not supported");
    refused(body_with("", R"({"size":{"longest_edge":1}})"), "media_kwargs.size: not supported");
    const std::string md = R"({"total_num_frames":2,"fps":2,"frames_indices":[0,1]})";
    refused(
        body_with("[" + two + "]", R"({"do_sample_frames":false,"video_metadata":[)" + md + "," + md + "]}"),
        "2 entries for 1 videos");
    refused(body_with("[" + two + "]",
                      R"({"do_sample_frames":false,"video_metadata":[{"total_num_frames":2,"fps":2}]})"),
            "video_metadata[0].frames_indices: required");
    refused(
        body_with(
            "[" + two + "]",
            R"({"do_sample_frames":false,"video_metadata":[{"total_num_frames":2,"frames_indices":[0]}]})"),
        "frames_indices: 1 indices for 2 frames");
    refused(
        body_with(
            "[" + two + "]",
            R"({"do_sample_frames":false,"video_metadata":[{"total_num_frames":2,"frames_indices":[]}]})"),
        "frames_indices: 0 indices for 2 frames");
    refused(
        body_with(
            "[" + two + "]",
            R"({"do_sample_frames":false,"video_metadata":[{"total_num_frames":2,"fps":0,"frames_indices":[0,1]}]})"),
        "video_metadata[0].fps: must be a positive number");
    refused(body_with("[" + two + "]",
                      R"({"do_sample_frames":false,"video_metadata":[{"fps":2,"frames_indices":[0,1]}]})"),
            "total_num_frames: required");
    refused(
        body_with(
            "[" + two + "]",
            R"({"do_sample_frames":false,"video_metadata":[{"total_num_frames":2,"frames_indices":[0,-1]}]})"),
        "frame indices (integers from 0)");
    refused(body_with("[[" + png + "," + wide + "]]"),
            "videos[0][1]: frame is 96x64 pixels but frame 0 is 64x64");

    RequestLimits lim;
    lim.videos.max_total_pixels = 64 * 64 * 3;  // three 64x64 frames
    refused(body_with(list_of(two, 2)), "decoded pixels of video frames", lim);
    lim = {};
    lim.videos.max_total_bytes = png.size() * 3 / 4 * 2;  // about two of these frames
    refused(body_with(list_of(list_of(png, 3), 1)), "bytes of video frames in one request", lim);
    lim = {};
    lim.videos.max_frames = 3;
    refused(body_with("[" + list_of(png, 4) + "]"), "too many frames (4); at most 3 per video", lim);
    lim = {};
    lim.images.max_pixels = 100;  // per frame
    refused(body_with("[" + two + "]"), "videos[0][0]:", lim);
}

// ---------------------------------------------------------------------------------------------------------
// clef decide, clef batch, clef bench --video

namespace {

std::string run_clef(const std::string& args, int& status) {
    return clef::testing::run_command(std::string(CLEF_BINARY) + " " + args + " 2>&1", status);
}

}  // namespace

TEST(VideoCli, DecideAcceptsVideosAndRefusesBadOnes) {
    const clef::testing::ScratchDir dir("clef_video_cli");
    const JsonValue& c = video_case("video_five_frames_odd_resize");
    const std::string good = dir.write("good.json", c.find("request_body")->as_string());
    const std::string bad = dir.write(
        "bad.json", video_case("video_sampling_not_disabled_error").find("request_body")->as_string());
    const std::string one =
        dir.write("one.json", video_case("video_single_frame_error").find("request_body")->as_string());
    int status = 0;
    const std::string out = run_clef("decide --model " + kModel + " " + good, status);
    ASSERT_EQ(WEXITSTATUS(status), 0) << out;
    expect_json_near(parse_json_or_throw(out, "stdout"), *c.find("response"), 1e-4, "response");
    std::string err = run_clef("decide --model " + kModel + " " + bad, status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << err;
    EXPECT_NE(err.find("Sampling frames from a list of images is not supported!"), std::string::npos) << err;
    err = run_clef("decide --model " + kModel + " " + one, status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << err;
    EXPECT_NE(err.find("videos[0]: t:1 must be larger than temporal_factor:2"), std::string::npos) << err;
}

TEST(VideoCli, BatchAnswersVideoLines) {
    const clef::testing::ScratchDir dir("clef_video_batch");
    const JsonValue& a = video_case("video_four_frames_png");
    const JsonValue& b = video_case("video_two_videos");
    const JsonValue& e = video_case("video_frame_sizes_differ_error");
    const std::string in = dir.write("in.jsonl", a.find("request_body")->as_string() + "\n" +
                                                     e.find("request_body")->as_string() + "\n" +
                                                     b.find("request_body")->as_string() + "\n");
    int status = 0;
    const std::string log =
        run_clef("batch --model " + kModel + " --in " + in + " --out " + dir.file("out.jsonl"), status);
    ASSERT_EQ(WEXITSTATUS(status), 0) << log;
    std::ifstream f(dir.file("out.jsonl"));
    std::vector<std::string> lines;
    for (std::string line; std::getline(f, line);) lines.push_back(line);
    ASSERT_EQ(lines.size(), 3u) << log;
    auto model_free = [](JsonValue r) {
        r.set("model", JsonValue::string("m"));
        return r;
    };
    expect_json_near(model_free(parse_json_or_throw(lines[0], "line 1")), model_free(*a.find("response")),
                     1e-4, "a");
    EXPECT_NE(lines[1].find("same size"), std::string::npos) << lines[1];
    expect_json_near(model_free(parse_json_or_throw(lines[2], "line 3")), model_free(*b.find("response")),
                     1e-4, "b");
}

TEST(VideoCli, BenchTimesTheVideoPath) {
    int status = 0;
    const std::string out =
        run_clef("bench --model " + kModel + " --video 5x150x40 --repeat 1 --warmup 0", status);
    ASSERT_EQ(WEXITSTATUS(status), 0) << out;
    const JsonValue j = parse_json_or_throw(out, "bench");
    // The five-frame fixture video: 32x160 after the video resize, 3 groups of 2x10 patches, 5 tokens each.
    EXPECT_EQ(j.find("video")->as_string(), "5x150x40");
    EXPECT_EQ(j.find("resized")->as_string(), "160x32");
    EXPECT_EQ(j.find("groups")->as_int64(), 3);
    EXPECT_EQ(j.find("patches")->as_int64(), 60);
    EXPECT_EQ(j.find("video_tokens")->as_int64(), 15);
    EXPECT_GT(j.find("vision_seconds_best")->as_double(), 0);
    EXPECT_GT(j.find("vision_gflop")->as_double(), 0);
    const std::string bad = run_clef("bench --model " + kModel + " --video 1x64x64", status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << bad;
    EXPECT_NE(bad.find("t:1 must be larger than temporal_factor:2"), std::string::npos) << bad;
    const std::string malformed = run_clef("bench --model " + kModel + " --video 64x64", status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << malformed;
    EXPECT_NE(malformed.find("--video: expected FRAMESxWIDTHxHEIGHT"), std::string::npos) << malformed;
}
