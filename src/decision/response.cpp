#include "decision/response.h"

namespace clef {

namespace {

JsonValue span_json(std::pair<int, int> s) {
    return JsonValue::array({JsonValue::integer(s.first), JsonValue::integer(s.second)});
}

template <class T, class F>
JsonValue array_of(const std::vector<T>& v, F to_json) {
    std::vector<JsonValue> out;
    out.reserve(v.size());
    for (const T& x : v) out.push_back(to_json(x));
    return JsonValue::array(std::move(out));
}

JsonValue debug_json(const EncodedPrompt& prompt, const std::vector<std::vector<float>>& logits,
                     const std::vector<std::vector<float>>& probabilities) {
    JsonValue dbg = JsonValue::object();
    dbg.set("input_ids", array_of(prompt.input_ids, [](int32_t id) { return JsonValue::integer(id); }));
    std::vector<JsonValue> qs;
    const auto number = [](float x) { return JsonValue::number(x); };
    for (size_t i = 0; i < prompt.questions.size(); ++i) {
        const auto& q = prompt.questions[i];
        JsonValue o = JsonValue::object();
        o.set("id", JsonValue::string(q.id));
        o.set("span", span_json(q.span));
        o.set("option_spans", array_of(q.option_spans, span_json));
        o.set("option_ids",
              array_of(q.option_ids, [](const std::string& s) { return JsonValue::string(s); }));
        o.set("logits", array_of(logits[i], number));
        o.set("probabilities", array_of(probabilities[i], number));
        qs.push_back(std::move(o));
    }
    dbg.set("questions", JsonValue::array(std::move(qs)));
    return dbg;
}

}  // namespace

JsonValue decision_response(const DecisionRequest& req, const EncodedPrompt& prompt,
                            const std::vector<std::vector<float>>& logits,
                            const std::vector<std::vector<float>>& probabilities,
                            const AnswerOptions& answers, bool debug) {
    JsonValue by_id = JsonValue::object();
    for (size_t i = 0; i < probabilities.size(); ++i)
        by_id.set(req.questions[i].id,
                  make_answer(req.questions[i], prompt.questions[i], probabilities[i], answers));
    JsonValue usage = JsonValue::object();
    usage.set("input_tokens", JsonValue::integer(static_cast<int64_t>(prompt.input_ids.size())));
    usage.set("output_tokens", JsonValue::integer(0));
    JsonValue r = JsonValue::object();
    r.set("model", JsonValue::string(req.model));
    r.set("answers", std::move(by_id));
    r.set("usage", std::move(usage));
    if (debug) r.set("debug", debug_json(prompt, logits, probabilities));
    return r;
}

JsonValue error_detail(const std::string& error_type, const std::string& message) {
    JsonValue d = JsonValue::object();
    d.set("error_type", JsonValue::string(error_type));
    if (!message.empty()) d.set("message", JsonValue::string(message));
    JsonValue body = JsonValue::object();
    body.set("detail", std::move(d));
    return body;
}

JsonValue error_detail_text(const std::string& message) {
    JsonValue body = JsonValue::object();
    body.set("detail", JsonValue::string(message));
    return body;
}

std::pair<int, JsonValue> request_error_response(const std::vector<RequestError>& errors) {
    if (!errors.empty() && errors[0].kind == RequestErrorKind::Usage)
        return {400, error_detail_text(errors[0].message)};
    if (!errors.empty() && errors[0].kind == RequestErrorKind::ApiUsage)
        return {400, error_detail("api_usage_error", errors[0].message)};
    std::vector<JsonValue> items;
    for (const auto& e : errors) {
        JsonValue item = JsonValue::object();
        item.set("type", JsonValue::string(e.type));
        item.set("loc", JsonValue::array(e.loc));
        item.set("msg", JsonValue::string(e.message));
        items.push_back(std::move(item));
    }
    JsonValue body = JsonValue::object();
    body.set("detail", JsonValue::array(std::move(items)));
    return {422, body};
}

}  // namespace clef
