// `clef serve` (in process) with videos: the fixture's video requests answered as the reference answers them,
// and every malformed video input (an empty video, a frame that is not an image, 10,000 frames, frames of
// 1x1, no do_sample_frames, one frame, frames of different sizes, a literal <|video_pad|>, ...) answered 400
// api_usage_error with a message naming the problem, while the server keeps answering.
#include <gtest/gtest.h>

#include <httplib.h>

#include <string>
#include <utility>
#include <vector>

#include "server/server.h"
#include "test_server_util.h"
#include "test_util.h"
#include "util/json.h"

using namespace clef;

namespace {

using clef::testing::expect_json_near;
using clef::testing::read_file;

const JsonValue& video_cases() {
    static const JsonValue doc = parse_json_or_throw(
        read_file(clef::testing::data_path("tiny-clef/video_cases.json")), "video_cases.json");
    return *doc.find("cases");
}

const JsonValue& video_case(const std::string& name) {
    for (const auto& c : video_cases().items())
        if (c.find("name")->as_string() == name) return c;
    throw std::runtime_error("no case " + name);
}

using clef::testing::post_decision;

std::string body_with(const std::string& videos, const std::string& kwargs = R"({"do_sample_frames":false})",
                      const std::string& state = "\"s\"") {
    return R"({"model":"clef-flash","state":)" + state +
           R"(,"questions":{"q":{"type":"noul","instructions":"ok?"}},"videos":)" + videos +
           (kwargs.empty() ? "" : R"(,"media_kwargs":)" + kwargs) + "}";
}

std::string list_of(const std::string& item, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s + "]";
}

// A frame of a fixture case's first video, as the client sent it (JSON text).
std::string fixture_frame(const std::string& case_name, size_t frame = 0) {
    const JsonValue body =
        parse_json_or_throw(video_case(case_name).find("request_body")->as_string(), "body");
    return write_json(body.find("videos")->items()[0].items()[frame]);
}

void expect_answers_like_the_reference(const std::string& name) {
    const JsonValue& c = video_case(name);
    auto r = post_decision(c.find("request_body")->as_string());
    ASSERT_TRUE(r) << name;
    ASSERT_EQ(r->status, 200) << name << ": " << r->body;
    JsonValue want = *c.find("response");
    want.set("model", JsonValue::string("tiny-clef"));
    expect_json_near(parse_json_or_throw(r->body, "response"), want, 1e-4, name);
}

}  // namespace

TEST(VideoServer, AnswersLikeTheReference) {
    for (const char* name : {"video_four_frames_png", "video_with_image", "video_two_videos"})
        expect_answers_like_the_reference(name);
}

TEST(VideoServer, MalformedVideosAre400AndTheServerKeepsAnswering) {
    const std::string png = fixture_frame("video_four_frames_png");
    const std::string wide = fixture_frame("video_with_image");  // 64x96, bare base64
    // A well-formed 1x1 PNG: below the processor's 32-pixel minimum.
    const std::string tiny =
        "\"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
        "\"";
    const std::string two = list_of(png, 2);
    const std::vector<std::pair<std::string, std::string>> bad = {
        {body_with("[[]]"), "videos[0]: empty video"},
        {body_with("{}"), "videos: must be a list of videos"},
        {body_with("[" + png + "]"), "videos[0]: a video must be a list of frames"},
        {body_with("[[42,42]]"), "videos[0][0]: an image must be"},
        {body_with(R"([["AAAA","AAAA"]])"), "videos[0][0]: unrecognised image data"},
        {body_with(R"([[{"content_type":"image/png"},{"content_type":"image/png"}]])"),
         "videos[0][0]: image object has no \"base64\" field"},
        {body_with("[[" + png + ",\"https://example.com/f.png\"]]"),
         "videos[0][1]: image URLs are not supported"},
        {body_with("[" + list_of("\"AAAA\"", 10000) + "]"),
         "videos[0]: too many frames (10000); at most 256"},
        {body_with(list_of(two, 5)), "videos: too many videos (5)"},
        {body_with("[" + list_of(tiny, 4) + "]"),
         "videos[0]: video frames are 1x1 pixels; both sides must be at least 32"},
        {body_with("[" + two + "]", ""), "Sampling frames from a list of images is not supported!"},
        {body_with("[" + two + "]", R"({"do_sample_frames":false,"num_frames":8})"),
         "media_kwargs.num_frames: not supported"},
        {body_with("[" + two + "]", R"({"do_sample_frames":false,"video_metadata":{}})"),
         "media_kwargs.video_metadata: must be a list"},
        {body_with("[[" + png + "]]"), "videos[0]: t:1 must be larger than temporal_factor:2"},
        {body_with("[[" + png + "," + wide + "]]"),
         "videos[0][1]: frame is 96x64 pixels but frame 0 is 64x64"},
        {body_with("[" + two + "]", R"({"do_sample_frames":false})", "\"<|video_pad|>\""),
         "Video features and video tokens do not match, tokens: 5, features: 4"},
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
    // The server still answers after all that, the same as before.
    expect_answers_like_the_reference("video_five_frames_odd_resize");
    auto r = post_decision(body_with("[" + two + "]"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
}

TEST(VideoServer, FixtureErrorCasesAre400) {
    for (const char* name : {"video_sampling_not_disabled_error", "video_single_frame_error",
                             "video_frame_sizes_differ_error"}) {
        const JsonValue& c = video_case(name);
        auto r = post_decision(c.find("request_body")->as_string());
        ASSERT_TRUE(r) << name;
        EXPECT_EQ(r->status, 400) << name << ": " << r->body;
        const std::string want = c.find("expected_error")->find("message")->as_string();
        // The reference's wording, except torch's stack error (an engine's wording is free there).
        const std::string needle = want.rfind("stack expects", 0) == 0 ? "same size" : want;
        const JsonValue j = parse_json_or_throw(r->body, "error body");
        const JsonValue* detail = j.find("detail");
        ASSERT_TRUE(detail && detail->is_object()) << r->body;
        EXPECT_NE(detail->find("message")->as_string().find(needle), std::string::npos)
            << name << ": " << r->body;
    }
}

TEST(VideoServer, ModelsListVideoForAModelWithATower) {
    auto r = clef::testing::tiny_clef_server().client().Get("/v1/models");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->body.find("\"video\""), std::string::npos) << r->body;
}
