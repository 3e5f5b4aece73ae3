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

    const JsonValue* model = body.find("model");
    if (!model)
        v.validation("missing", loc_of({"body", "model"}), "Field required");
    else if (!model->is_string())
        v.validation("string_type", loc_of({"body", "model"}), "Input should be a valid string");
    else
        req.model = model->as_string();

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

    if (const JsonValue* images = body.find("images")) req.images = *images;
    if (const JsonValue* videos = body.find("videos")) req.videos = *videos;

    const JsonValue* questions = body.find("questions");
    if (!questions || questions->is_null()) {
        v.validation("missing", loc_of({"body", "questions"}), "Field required");
        return false;
    }
    if (!questions->is_object()) {
        v.validation("dict_type", loc_of({"body", "questions"}), "Input should be a valid dictionary");
        return false;
    }
    if (questions->members().empty()) {
        v.validation("too_short", loc_of({"body", "questions"}),
                     "Dictionary should have at least 1 item after validation, not 0");
        return false;
    }
    if (!errors.empty()) return false;
    if (questions->members().size() > limits.max_questions)
        return v.usage("Too many questions. Must have at most " + std::to_string(limits.max_questions) +
                       " questions.");

    for (const auto& [qid, qv] : questions->members()) {
        if (!qv.is_object()) {
            v.validation("dict_type", loc_of({"body", "questions", qid}), "Input should be a valid dictionary");
            continue;
        }
        Question q;
        q.id = qid;
        const JsonValue* type = qv.find("type");
        std::string tname = type && type->is_string() ? type->as_string() : "";
        if (tname == "noul")
            q.type = QuestionType::Noul;
        else if (tname == "choice")
            q.type = QuestionType::Choice;
        else if (tname == "score")
            q.type = QuestionType::Score;
        else {
            v.validation("union_tag_invalid", loc_of({"body", "questions", qid, "type"}),
                         qid + ": type must be noul, choice, or score");
            continue;
        }
        if (qid.empty()) {
            v.validation("value_error", loc_of({"body", "questions", qid}), "question id must not be empty");
            continue;
        }
        const JsonValue* instructions = qv.find("instructions");
        if (!instructions || instructions->is_null() || (instructions->is_string() && instructions->as_string().empty()))
            q.instructions = JsonValue::string(qid);
        else
            q.instructions = *instructions;

        const JsonValue* criteria = qv.find("criteria");
        if (criteria) q.criteria = *criteria;
        const bool has_criteria = criteria && !criteria->is_null();
        auto crit_loc = [&, &qid = qid] { return loc_of({"body", "questions", qid, tname, "criteria"}); };

        switch (q.type) {
            case QuestionType::Noul: {
                if (has_criteria && !criteria->is_object()) {
                    v.validation("dict_type", crit_loc(), "Input should be a valid dictionary");
                    continue;
                }
                JsonValue t = JsonValue::string(kNoulTrueDescription),
                          f = JsonValue::string(kNoulFalseDescription);
                // dict.update semantics: an explicit null removes the description; other keys are ignored.
                if (has_criteria) {
                    if (const JsonValue* ct = criteria->find("true")) t = *ct;
                    if (const JsonValue* cf = criteria->find("false")) f = *cf;
                }
                q.options.push_back(make_option("true", &t));
                q.options.push_back(make_option("false", &f));
                q.answer_order = {"true", "false"};
                break;
            }
            case QuestionType::Choice: {
                if (!has_criteria) {
                    v.validation("missing", crit_loc(), "Field required");
                    continue;
                }
                if (!criteria->is_object()) {
                    v.validation("dict_type", crit_loc(), "Input should be a valid dictionary");
                    continue;
                }
                if (criteria->members().empty()) return v.usage(qid + ": criteria must not be empty");
                if (criteria->members().size() > limits.max_options)
                    return v.usage("Too many choices. Must have at most " + std::to_string(limits.max_options) +
                                   " choices.");
                for (const auto& [label, desc] : criteria->members()) {
                    q.options.push_back(make_option(label, &desc));
                    q.answer_order.push_back(label);
                }
                // Python sorts str keys by code point, which is UTF-8 byte order.
                std::stable_sort(q.options.begin(), q.options.end(),
                                 [](const QuestionOption& a, const QuestionOption& b) { return a.id < b.id; });
                break;
            }
            case QuestionType::Score: {
                if (!has_criteria) {
                    v.validation("missing", crit_loc(), "Field required");
                    continue;
                }
                if (!criteria->is_array()) {
                    v.validation("list_type", crit_loc(), "Input should be a valid list");
                    continue;
                }
                if (criteria->items().empty()) return v.usage(qid + ": criteria must not be empty");
                if (criteria->items().size() > limits.max_levels)
                    return v.usage("Too many score levels. Must have at most " + std::to_string(limits.max_levels) +
                                   " levels.");
                for (size_t i = 0; i < criteria->items().size(); ++i) {
                    q.options.push_back(make_option(std::to_string(i), &criteria->items()[i]));
                    q.answer_order.push_back(std::to_string(i));
                }
                break;
            }
        }
        req.questions.push_back(std::move(q));
    }
    if (!errors.empty()) return false;
    // Media last (400 api_usage_error): the images are decoded here, so every bad image is a validation
    // error.
    if (!req.videos.is_null() && !(req.videos.is_array() && req.videos.items().empty()))
        return v.api_usage("videos", "videos are not supported yet; send still images in `images`");
    try {
        req.decoded_images = decode_image_sources(req.images, limits.images);
    } catch (const ImageError& e) {
        return v.api_usage("images", e.what());
    }
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
