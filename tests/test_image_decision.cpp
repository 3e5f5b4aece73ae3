// Requests with images end to end against the publisher's reference (tests/data/tiny-clef/image_cases.json,
// float64 goldens): request -> images decoded and resized -> media block (ids, segments, mm_token_type_ids,
// MRoPE positions exact) -> vision tower -> embedding substitution -> backbone -> head -> answers ->
// response; the image-token mismatch refused; and every malformed image input answered 400 by `clef serve`
// (in process) and refused by `clef decide`.
#include <gtest/gtest.h>

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "decision/engine.h"
#include "decision/media.h"
#include "decision/prompt.h"
#include "decision/request.h"
#include "image/source.h"
#include "model/vision.h"
#include "server/server.h"
#include "support/base64_encode.h"
#include "test_server_util.h"
#include "test_util.h"
#include "test_vision_util.h"
#include "tokenizer/tokenizer.h"
#include "tools/make_model.h"
#include "util/json.h"

using namespace clef;
using clef::testing::expect_media_prompt_matches;
using clef::testing::ints_of;

namespace {

const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";

using clef::testing::read_file;

const JsonValue& image_cases() { return clef::testing::tiny_image_cases(); }

const JsonValue& image_case(const std::string& name) {
    for (const auto& c : image_cases().items())
        if (c.find("name")->as_string() == name) return c;
    throw std::runtime_error("no case " + name);
}

const Engine& engine() {
    static const std::unique_ptr<Engine> e = Engine::load(kModel);
    return *e;
}

std::string name_of(const JsonValue& c) {
    return c.find("name")->as_string();
}

using clef::testing::expect_json_near;
using clef::testing::parse_case_request;
using clef::testing::span_of;

bool answered(const JsonValue& c) {
    return c.find("expected_error") == nullptr;
}

}  // namespace

TEST(ImageDecision, EngineHasTheVisionTower) {
    ASSERT_NE(engine().vision(), nullptr);
    EXPECT_EQ(engine().image_processor().max_pixels, 12288);
    EXPECT_TRUE(VisionTower::in_model_dir(kModel));
}

TEST(ImageDecision, PromptIdsTypesAndPositionsAreExact) {
    int n = 0;
    for (const auto& c : image_cases().items()) {
        if (!answered(c)) continue;
        SCOPED_TRACE(name_of(c));
        DecisionRequest req;
        std::vector<RequestError> errors;
        ASSERT_TRUE(parse_case_request(c, req, errors)) << describe_errors(errors);
        DecideOptions opt;
        opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
        opt.keep_segments = true;
        const Engine::Prepared p = engine().prepare(req, opt);
        expect_media_prompt_matches(p, c);
        const auto& qs = c.find("questions")->items();
        ASSERT_EQ(p.prompt.questions.size(), qs.size());
        for (size_t i = 0; i < qs.size(); ++i) {
            EXPECT_EQ(p.prompt.questions[i].span, span_of(*qs[i].find("question_span")));
            const auto& os = qs[i].find("option_spans")->items();
            ASSERT_EQ(p.prompt.questions[i].option_spans.size(), os.size());
            for (size_t j = 0; j < os.size(); ++j)
                EXPECT_EQ(p.prompt.questions[i].option_spans[j], span_of(os[j]));
        }
        const auto& imgs = c.find("images")->items();
        ASSERT_EQ(p.images.size(), imgs.size());
        for (size_t i = 0; i < imgs.size(); ++i) {
            const auto g = ints_of(*imgs[i].find("grid_thw"));
            EXPECT_EQ(p.images[i].grid_t, g[0]);
            EXPECT_EQ(p.images[i].grid_h, g[1]);
            EXPECT_EQ(p.images[i].grid_w, g[2]);
            const auto range = span_of(*imgs[i].find("image_token_range"));
            for (int t = range.first; t < range.second; ++t) EXPECT_EQ(p.mm_token_type_ids[t], 1) << t;
        }
        ++n;
    }
    EXPECT_EQ(n, 5);
}

TEST(ImageDecision, MatchesTheReference) {
    int n = 0;
    for (const auto& c : image_cases().items()) {
        if (!answered(c)) continue;
        const std::string name = name_of(c);
        SCOPED_TRACE(name);
        DecisionRequest req;
        std::vector<RequestError> errors;
        ASSERT_TRUE(parse_case_request(c, req, errors)) << describe_errors(errors);
        DecideOptions opt;
        opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
        const Decision d = engine().decide(req, opt, /*keep_hidden=*/true);

        const clef::testing::GoldenDiff g = clef::testing::expect_matches_image_golden(d, c);
        std::printf("  %-28s hidden max %.3g mean %.3g | logits %.3g | probabilities %.3g\n", name.c_str(),
                    g.hidden_max, g.hidden_mean, g.logits_max, g.probabilities_max);
        ++n;
    }
    EXPECT_EQ(n, 5);
}

TEST(ImageDecision, ImagePadInStateIsRefused) {
    const JsonValue& c = image_case("image_pad_in_state_error");
    DecisionRequest req;
    std::vector<RequestError> errors;
    ASSERT_TRUE(parse_case_request(c, req, errors)) << describe_errors(errors);  // the record encodes
    // The ids the reference encodes: the media block plus the literal pad of the state.
    std::vector<ProcessedImage> imgs;
    for (const auto& d : req.decoded_images) imgs.push_back(process_image(d.rgb, engine().image_processor()));
    const MediaBlock media = build_media_block(engine().tokenizer(), imgs);
    PromptOptions popt;
    popt.media = &media;
    const EncodedPrompt prompt = encode_prompt(engine().tokenizer(), req, popt);
    EXPECT_EQ(prompt.input_ids, ints_of(*c.find("input_ids")));
    EXPECT_EQ(std::count(prompt.input_ids.begin(), prompt.input_ids.end(), 261),
              c.find("image_token_count_in_input_ids")->as_int64());
    // The model refuses: tokens 5, features 4.
    const std::string want = c.find("expected_error")->find("message")->as_string();
    try {
        engine().prepare(req);
        ADD_FAILURE() << "expected ImageTokenMismatch";
    } catch (const ImageTokenMismatch& e) {
        EXPECT_EQ(e.tokens, 5);
        EXPECT_EQ(e.features, c.find("image_features")->as_int64());
        EXPECT_EQ(std::string(e.what()).rfind(want, 0), 0u) << e.what();
        EXPECT_NE(std::string(e.what()).find("<|image_pad|>"), std::string::npos);
    }
    // Without images the literal pad is plain text (the reference runs the text model only).
    req.decoded_images.clear();
    EXPECT_NO_THROW(engine().prepare(req));
}

TEST(ImageDecision, ModelWithoutVisionTowerRefusesImages) {
    const std::string dir = ::testing::TempDir() + "/clef_tiny_no_vision";
    MakeModelOptions mk;
    mk.preset = "tiny";
    mk.vision = false;
    make_model(mk, dir);
    EXPECT_FALSE(VisionTower::in_model_dir(dir));
    const std::unique_ptr<Engine> e = Engine::load(dir);
    DecisionRequest req;
    std::vector<RequestError> errors;
    ASSERT_TRUE(parse_case_request(image_case("image_single_png"), req, errors));
    clef::testing::expect_refuses_images_answers_text(*e, std::move(req));
}

TEST(ImageDecision, RequestValidationOfImages) {
    const std::string png_b64 = base64_encode(read_file(kModel + "/images/square_rgb.png"));
    auto body = [](const std::string& images_json, const std::string& extra = "") {
        return parse_json_or_throw(R"({"model":"m","state":"s","questions":{"q":{"type":"noul"}},"images":)" +
                                       images_json + extra + "}",
                                   "body");
    };
    DecisionRequest req;
    std::vector<RequestError> errors;
    ASSERT_TRUE(parse_request(body("[\"" + png_b64 + "\"]"), req, errors));
    ASSERT_EQ(req.decoded_images.size(), 1u);
    EXPECT_EQ(req.decoded_images[0].rgb.width, 64);
    ASSERT_TRUE(parse_request(body("null"), req, errors));
    EXPECT_TRUE(req.decoded_images.empty());
    ASSERT_TRUE(parse_request(body("[]", R"(,"videos":[])"), req, errors));

    auto refused = [&](const JsonValue& b, const std::string& needle) {
        DecisionRequest r;
        std::vector<RequestError> errs;
        EXPECT_FALSE(parse_request(b, r, errs)) << needle;
        ASSERT_EQ(errs.size(), 1u) << needle;
        EXPECT_EQ(errs[0].kind, RequestErrorKind::ApiUsage) << needle;
        EXPECT_NE(describe_errors(errs).find(needle), std::string::npos) << describe_errors(errs);
    };
    refused(body("\"" + png_b64 + "\""), "images: must be a list");
    refused(body("[1]"), "images[0]: an image must be");
    refused(body("[\"" + png_b64 + "\",\"" + png_b64 + "\",\"" + png_b64 + "\",\"" + png_b64 + "\",\"" +
                 png_b64 + "\"]"),
            "too many images (5)");
    refused(body("[\"R0lGODlhAQABAAAAACw=\"]"), "unsupported image format GIF");
    refused(body("[\"data:image/png;base64,@@@@\"]"), "invalid base64");
    refused(body("[]", R"(,"videos":["AAAA"])"), "videos[0]: a video must be a list of frames");
    RequestLimits lim;
    lim.images.max_images = 1;
    DecisionRequest r;
    std::vector<RequestError> errs;
    EXPECT_FALSE(parse_request(body("[\"" + png_b64 + "\",\"" + png_b64 + "\"]"), r, errs, lim));
    EXPECT_NE(describe_errors(errs).find("at most 1 per request"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------------
// clef serve (in process) and clef decide

namespace {

using clef::testing::post_decision;

std::string with_images(const std::string& images_json, const std::string& state = "\"s\"") {
    return R"({"model":"clef-flash","state":)" + state +
           R"(,"questions":{"q":{"type":"noul","instructions":"ok?"}},"images":)" + images_json + "}";
}

std::string data_url(const std::string& mime, const std::string& bytes) {
    return "\"data:" + mime + ";base64," + base64_encode(bytes) + "\"";
}

}  // namespace

TEST(ImageServer, AnswersLikeTheReference) {
    for (const char* name : {"image_single_png", "image_two_sizes"}) {
        const JsonValue& c = image_case(name);
        auto r = post_decision(c.find("request_body")->as_string());
        ASSERT_TRUE(r) << name;
        ASSERT_EQ(r->status, 200) << r->body;
        JsonValue got = parse_json_or_throw(r->body, "response");
        JsonValue want = *c.find("response");
        want.set("model", JsonValue::string("tiny-clef"));
        expect_json_near(got, want, 1e-4, name);
    }
    auto r = clef::testing::tiny_clef_server().client().Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_NE(r->body.find("\"vision\""), std::string::npos) << r->body;
}

TEST(ImageServer, MalformedImagesAre400) {
    const std::string png = read_file(kModel + "/images/square_rgb.png");
    const std::string jpg = read_file(kModel + "/images/photo_420.jpg");
    const std::string webp = read_file(kModel + "/images/chart.webp");
    // A well-formed 1x1 PNG: below the processor's 32-pixel minimum.
    const std::string tiny_png =
        "\"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
        "\"";
    const std::string b64 = "\"" + base64_encode(png) + "\"";
    const std::vector<std::pair<std::string, std::string>> bad = {
        {with_images("[\"data:image/png;base64,not*base64\"]"), "invalid base64"},
        {with_images("[" + data_url("image/png", png.substr(0, png.size() / 2)) + "]"), "truncated PNG"},
        {with_images("[" + data_url("image/jpeg", jpg.substr(0, jpg.size() / 2)) + "]"), "truncated JPEG"},
        {with_images("[" + data_url("image/webp", webp.substr(0, webp.size() / 2)) + "]"), "truncated WebP"},
        {with_images("[" + data_url("image/gif", "GIF89a\x01\x00\x01\x00\x00\x00\x00;") + "]"), "GIF"},
        {with_images("[" + data_url("image/bmp", std::string("BM\x1e\0\0\0\0\0\0\0\x1a\0\0\0", 14)) + "]"),
         "BMP"},
        {with_images("[" + b64 + "," + b64 + "," + b64 + "," + b64 + "," + b64 + "]"), "too many images"},
        {with_images("[" + data_url("image/png", std::string(5u << 20, 'x')) + "]"),
         "larger than 4194304 bytes"},
        {with_images(b64), "must be a list"},
        {with_images("[42]"), "an image must be"},
        {with_images(R"([{"content_type":"image/png"}])"), "no \"base64\" field"},
        {with_images(R"([{"content_type":"image/png","base64":7}])"), "must be a string"},
        {with_images("[\"https://example.com/a.png\"]"), "URLs are not supported"},
        {with_images("[" + tiny_png + "]"), "at least 32 pixels"},
        {with_images("[" + b64 + "]", "\"see <|image_pad|>\""),
         "Image features and image tokens do not match"},
        {with_images("[]").substr(0, with_images("[]").size() - 1) + R"(,"videos":["AAAA"]})", "videos"},
    };
    for (const auto& [body, needle] : bad) {
        auto r = post_decision(body);
        ASSERT_TRUE(r) << needle;
        EXPECT_EQ(r->status, 400) << needle << ": " << r->body;
        const JsonValue j = parse_json_or_throw(r->body, "error body");
        const JsonValue* detail = j.find("detail");
        ASSERT_TRUE(detail && detail->is_object()) << r->body;
        EXPECT_EQ(detail->find("error_type")->as_string(), "api_usage_error") << r->body;
        EXPECT_NE(detail->find("message")->as_string().find(needle), std::string::npos) << r->body;
    }
    // The server still answers after all that.
    auto r = post_decision(with_images("[" + b64 + "]"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
}

TEST(ImageCli, DecideAcceptsImagesAndRefusesBadOnes) {
    const JsonValue& c = image_case("image_nonsquare_resize");
    const std::string dir = ::testing::TempDir();
    const std::string good = dir + "/clef_image_request.json", bad = dir + "/clef_bad_image_request.json";
    std::ofstream(good) << c.find("request_body")->as_string();
    std::ofstream(bad) << with_images("[\"data:image/png;base64,iVBORw0KGgo=\"]");
    auto run = [](const std::string& args, int& status) {
        const std::string cmd = std::string(CLEF_BINARY) + " decide --model " + kModel + " " + args + " 2>&1";
        FILE* f = popen(cmd.c_str(), "r");
        std::string out;
        char buf[4096];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
        status = pclose(f);
        return out;
    };
    int status = 0;
    const std::string out = run(good, status);
    ASSERT_EQ(status, 0) << out;
    expect_json_near(parse_json_or_throw(out, "stdout"), *c.find("response"), 1e-4, "response");
    const std::string err = run(bad, status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << err;
    EXPECT_NE(err.find("images[0]: malformed or truncated PNG"), std::string::npos) << err;
}
