// The System One request: parsing and validation of a /v1/systemone body into native types.
// Semantics follow the publisher's reference (`systemone()` + `question_options()`), with the hosted API's
// limits; see docs/API.md for every rule and where we differ from other servers.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "image/decode.h"
#include "image/image.h"
#include "image/video.h"
#include "util/json.h"

namespace clef {

enum class QuestionType { Noul = 0, Choice = 1, Score = 2 };
const char* question_type_name(QuestionType t);

// The default descriptions of a noul question's "true" and "false" options.
extern const char* const kNoulTrueDescription;
extern const char* const kNoulFalseDescription;

struct QuestionOption {
    std::string id;           // "true"/"false", the choice label, or the level index "0".."n-1"
    JsonValue description;    // rendered into the option JSON unless has_description is false
    bool has_description = false;
};

struct Question {
    std::string id;
    QuestionType type = QuestionType::Noul;
    JsonValue instructions;               // after the question-id fallback (missing, null or "")
    std::vector<QuestionOption> options;  // encoded (= logit) order: noul true,false; choice by code point; score by level
    std::vector<std::string> answer_order;  // order of keys in the answer: choice labels in request order
    JsonValue criteria;                   // as sent (null when absent); score legends come from here
};

struct DecisionRequest {
    std::string model;
    JsonValue state;
    std::vector<Question> questions;  // request order
    JsonValue images;                 // null when absent
    JsonValue videos;                 // null when absent
    JsonValue media_kwargs;           // null when absent (image/video.h parse_media_kwargs)
    std::vector<DecodedImage> decoded_images;  // `images` decoded (RGB, EXIF orientation applied), in order
    std::vector<DecodedVideo> decoded_videos;  // `videos` decoded with their metadata, in order
};

// How a rejected request maps onto the System One error shapes (the server picks status and body from this).
enum class RequestErrorKind {
    Validation,  // 422, Pydantic-style list item {type, loc, msg}
    Usage,       // 400, {"detail": "<message>"}
    ApiUsage,  // 400, {"detail": {"error_type": "api_usage_error", "message": "<message>"}} (images, videos)
};

struct RequestError {
    RequestErrorKind kind = RequestErrorKind::Validation;
    std::string type;            // Pydantic-style tag: missing, dict_type, string_type, list_type, too_short, ...
    std::vector<JsonValue> loc;  // e.g. ["body", "questions", "q1", "choice", "criteria"]
    std::string message;
};

struct RequestLimits {
    size_t max_questions = 64;
    size_t max_options = 255;  // choice
    size_t max_levels = 10;    // score
    ImageLimits images;        // count, bytes and pixels of `images`; bytes and pixels of each video frame
    VideoLimits videos;        // videos, frames per video, bytes and pixels of all frames
};

// Parses a request body. Returns true on success; otherwise fills `errors` (all 422 items found, or the
// single 400 error that stopped validation) and returns false.
bool parse_request(const JsonValue& body, DecisionRequest& out, std::vector<RequestError>& errors,
                   const RequestLimits& limits = {});

// One line describing the errors, for the CLI: "<loc>: <message>; ...".
std::string describe_errors(const std::vector<RequestError>& errors);

}  // namespace clef
