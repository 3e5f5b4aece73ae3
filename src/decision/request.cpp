#include "decision/request.h"

#include <algorithm>

#include "image/source.h"

namespace clef {

const char* const kNoulTrueDescription = "The proposition is true or the answer is yes.";
const char* const kNoulFalseDescription = "The proposition is false or the answer is no.";

const char* question_type_name(QuestionType t) {
    switch (t) {
        case QuestionType::Noul: return "noul";
        case QuestionType::Choice: return "choice";
        case QuestionType::Score: return "score";
    }
    return "?";
}

namespace {

struct Validator {
    const RequestLimits& limits;
    std::vector<RequestError>& errors;

    void validation(std::string type, std::vector<JsonValue> loc, std::string msg) {
        errors.push_back({RequestErrorKind::Validation, std::move(type), std::move(loc), std::move(msg)});
    }
    // A 400 error stops validation: the caller returns false right after.
    bool usage(std::string msg) {
        errors.clear();
        errors.push_back({RequestErrorKind::Usage, "usage", {JsonValue::string("body")}, std::move(msg)});
        return false;
    }
    bool api_usage(std::string field, std::string msg) {
        errors.clear();
        errors.push_back({RequestErrorKind::ApiUsage,
                          "api_usage_error",
                          {JsonValue::string("body"), JsonValue::string(std::move(field))},
                          std::move(msg)});
        return false;
    }
};

std::vector<JsonValue> loc_of(std::initializer_list<std::string> parts) {
    std::vector<JsonValue> v;
    for (const auto& p : parts) v.push_back(JsonValue::string(p));
    return v;
}

QuestionOption make_option(std::string id, const JsonValue* description) {
    QuestionOption o;
    o.id = std::move(id);
    if (description && !description->is_null()) {
        o.description = *description;
        o.has_description = true;
    }
    return o;
}

// What validating one part of the body did: Ok, Invalid (validation errors recorded; parsing goes on to
// collect the others) or Stop (a 400 error replaced them: parse_request returns false at once).
enum class Step { Ok, Invalid, Stop };

void parse_model(const JsonValue& body, Validator& v, DecisionRequest& req) {
    const JsonValue* model = body.find("model");
    if (!model)
        v.validation("missing", loc_of({"body", "model"}), "Field required");
    else if (!model->is_string())
        v.validation("string_type", loc_of({"body", "model"}), "Input should be a valid string");
    else
        req.model = model->as_string();
}

void parse_state(const JsonValue& body, Validator& v, DecisionRequest& req) {
    // `document` is the pre-launch name of `state`; accepted when `state` is absent.
    const JsonValue* state = body.find("state");
    if (!state || state->is_null()) {
        const JsonValue* doc = body.find("document");
        if (doc && !doc->is_null()) state = doc;
    }
    if (!state || state->is_null())
        v.validation("missing", loc_of({"body", "state"}), "Field required");
    else
        req.state = *state;
}

// The `questions` object, or nullptr (with a validation error) when it is missing, not an object or empty.
const JsonValue* find_questions(const JsonValue& body, Validator& v) {
    const JsonValue* questions = body.find("questions");
    if (!questions || questions->is_null()) {
        v.validation("missing", loc_of({"body", "questions"}), "Field required");
        return nullptr;
    }
    if (!questions->is_object()) {
        v.validation("dict_type", loc_of({"body", "questions"}), "Input should be a valid dictionary");
        return nullptr;
    }
    if (questions->members().empty()) {
        v.validation("too_short", loc_of({"body", "questions"}),
                     "Dictionary should have at least 1 item after validation, not 0");
        return nullptr;
    }
    return questions;
}

// A question's `criteria` field: `value` is null when the field is absent or null.
struct Criteria {
    const JsonValue* value;
    const std::string& qid;
    const std::string& type_name;
    std::vector<JsonValue> loc() const { return loc_of({"body", "questions", qid, type_name, "criteria"}); }
};

Step parse_noul_options(const Criteria& c, Validator& v, Question& q) {
    if (c.value && !c.value->is_object()) {
        v.validation("dict_type", c.loc(), "Input should be a valid dictionary");
        return Step::Invalid;
    }
    JsonValue t = JsonValue::string(kNoulTrueDescription), f = JsonValue::string(kNoulFalseDescription);
    // dict.update semantics: an explicit null removes the description; other keys are ignored.
    if (c.value) {
        if (const JsonValue* ct = c.value->find("true")) t = *ct;
        if (const JsonValue* cf = c.value->find("false")) f = *cf;
    }
    q.options.push_back(make_option("true", &t));
    q.options.push_back(make_option("false", &f));
    q.answer_order = {"true", "false"};
    return Step::Ok;
}

// What a choice's or a score's criteria must be: a dictionary of choices or a list of levels, not empty and
// at most `limit` long. The error over the limit reads "<too_many> <limit> <unit>.".
struct CriteriaShape {
    bool dictionary;
    size_t limit;
    const char* too_many;  // "Too many choices. Must have at most"
    const char* unit;      // "choices"
};

// The checks a choice's and a score's criteria share: present (validation error "missing"), a dictionary or a
// list (validation error), not empty and not over the limit (400 usage errors). Step::Ok when they hold.
Step check_criteria(const Criteria& c, Validator& v, const CriteriaShape& s) {
    if (!c.value) {
        v.validation("missing", c.loc(), "Field required");
        return Step::Invalid;
    }
    if (s.dictionary ? !c.value->is_object() : !c.value->is_array()) {
        v.validation(s.dictionary ? "dict_type" : "list_type", c.loc(),
                     s.dictionary ? "Input should be a valid dictionary" : "Input should be a valid list");
        return Step::Invalid;
    }
    const size_t n = s.dictionary ? c.value->members().size() : c.value->items().size();
    if (n == 0) {
        v.usage(c.qid + ": criteria must not be empty");
        return Step::Stop;
    }
    if (n > s.limit) {
        v.usage(std::string(s.too_many) + " " + std::to_string(s.limit) + " " + s.unit + ".");
        return Step::Stop;
    }
    return Step::Ok;
}

Step parse_choice_options(const Criteria& c, Validator& v, Question& q) {
    const Step checked =
        check_criteria(c, v, {true, v.limits.max_options, "Too many choices. Must have at most", "choices"});
    if (checked != Step::Ok) return checked;
    for (const auto& [label, desc] : c.value->members()) {
        q.options.push_back(make_option(label, &desc));
        q.answer_order.push_back(label);
    }
    // Python sorts str keys by code point, which is UTF-8 byte order.
    std::stable_sort(q.options.begin(), q.options.end(),
                     [](const QuestionOption& a, const QuestionOption& b) { return a.id < b.id; });
    return Step::Ok;
}

Step parse_score_options(const Criteria& c, Validator& v, Question& q) {
    const Step checked = check_criteria(
        c, v, {false, v.limits.max_levels, "Too many score levels. Must have at most", "levels"});
    if (checked != Step::Ok) return checked;
    const auto& levels = c.value->items();
    for (size_t i = 0; i < levels.size(); ++i) {
        q.options.push_back(make_option(std::to_string(i), &levels[i]));
        q.answer_order.push_back(std::to_string(i));
    }
    return Step::Ok;
}

bool parse_question_type(const std::string& name, QuestionType& type) {
    if (name == "noul")
        type = QuestionType::Noul;
    else if (name == "choice")
        type = QuestionType::Choice;
    else if (name == "score")
        type = QuestionType::Score;
    else
        return false;
    return true;
}

Step parse_question(const std::string& qid, const JsonValue& qv, Validator& v, Question& q) {
    if (!qv.is_object()) {
        v.validation("dict_type", loc_of({"body", "questions", qid}), "Input should be a valid dictionary");
        return Step::Invalid;
    }
    q.id = qid;
    const JsonValue* type = qv.find("type");
    const std::string tname = type && type->is_string() ? type->as_string() : "";
    if (!parse_question_type(tname, q.type)) {
        v.validation("union_tag_invalid", loc_of({"body", "questions", qid, "type"}),
                     qid + ": type must be noul, choice, or score");
        return Step::Invalid;
    }
    if (qid.empty()) {
        v.validation("value_error", loc_of({"body", "questions", qid}), "question id must not be empty");
        return Step::Invalid;
    }
    const JsonValue* instructions = qv.find("instructions");
    if (!instructions || instructions->is_null() ||
        (instructions->is_string() && instructions->as_string().empty()))
        q.instructions = JsonValue::string(qid);
    else
        q.instructions = *instructions;

    const JsonValue* criteria = qv.find("criteria");
    if (criteria) q.criteria = *criteria;
    const Criteria c{criteria && !criteria->is_null() ? criteria : nullptr, qid, tname};
    if (q.type == QuestionType::Noul) return parse_noul_options(c, v, q);
    if (q.type == QuestionType::Choice) return parse_choice_options(c, v, q);
    return parse_score_options(c, v, q);
}

// Every question, in the body's order, into `out`; false when a 400 error stopped the parse.
bool parse_questions(const JsonValue& questions, Validator& v, std::vector<Question>& out) {
    if (questions.members().size() > v.limits.max_questions)
        return v.usage("Too many questions. Must have at most " + std::to_string(v.limits.max_questions) +
                       " questions.");
    for (const auto& [qid, qv] : questions.members()) {
        Question q;
        const Step step = parse_question(qid, qv, v, q);
        if (step == Step::Stop) return false;
        if (step == Step::Ok) out.push_back(std::move(q));
    }
    return true;
}

// Media last (400 api_usage_error): the images and video frames are decoded here, so every bad image or frame
// is a validation error.
bool decode_media(Validator& v, DecisionRequest& req) {
    try {
        req.decoded_images = decode_image_sources(req.images, v.limits.images);
    } catch (const ImageError& e) {
        return v.api_usage("images", e.what());
    }
    try {
        const MediaKwargs kwargs = parse_media_kwargs(req.media_kwargs);
        req.decoded_videos = decode_video_sources(req.videos, kwargs, v.limits.images, v.limits.videos);
    } catch (const ImageError& e) {
        const std::string msg = e.what();
        return v.api_usage(msg.rfind("media_kwargs", 0) == 0 ? "media_kwargs" : "videos", msg);
    }
    return true;
}

}  // namespace

bool parse_request(const JsonValue& body, DecisionRequest& out, std::vector<RequestError>& errors,
                   const RequestLimits& limits) {
    errors.clear();
    Validator v{limits, errors};
    if (!body.is_object()) {
        v.validation("dict_type", loc_of({"body"}), "Input should be a valid dictionary");
        return false;
    }
    DecisionRequest req;
    parse_model(body, v, req);
    parse_state(body, v, req);
    if (const JsonValue* images = body.find("images")) req.images = *images;
    if (const JsonValue* videos = body.find("videos")) req.videos = *videos;
    if (const JsonValue* kwargs = body.find("media_kwargs")) req.media_kwargs = *kwargs;

    const JsonValue* questions = find_questions(body, v);
    if (!questions || !errors.empty()) return false;
    if (!parse_questions(*questions, v, req.questions) || !errors.empty()) return false;
    if (!decode_media(v, req)) return false;
    out = std::move(req);
    return true;
}

std::string describe_errors(const std::vector<RequestError>& errors) {
    std::string s;
    for (const auto& e : errors) {
        if (!s.empty()) s += "; ";
        std::string loc;
        for (size_t i = 1; i < e.loc.size(); ++i) {  // skip the leading "body"
            if (!loc.empty()) loc += '.';
            loc += e.loc[i].is_string() ? e.loc[i].as_string() : write_json(e.loc[i]);
        }
        // Messages that already name their question ("<id>: ...") are printed as they are.
        const bool names_question =
            e.loc.size() > 2 && e.loc[2].is_string() && e.message.rfind(e.loc[2].as_string() + ":", 0) == 0;
        if (e.kind == RequestErrorKind::Usage || e.kind == RequestErrorKind::ApiUsage || loc.empty() ||
            names_question)
            s += e.message;
        else
            s += loc + ": " + e.message;
    }
    return s;
}

}  // namespace clef
