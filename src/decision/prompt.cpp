#include "decision/prompt.h"

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace clef {

namespace {

// The fixed pieces of the prompt (the reference's text, byte for byte).
const std::string kPrefix =
    "<|im_start|>system\nRead the complete state and schema. Decide every field jointly. Each answer must be "
    "exactly one of that field's allowed options.<|im_end|>\n<|im_start|>user\nSTATE:\n";
const char* const kSchemaHeader = "\n\nSCHEMA FIELDS:\n";
const char* const kAllowedOptions = "\nALLOWED OPTIONS:\n";
const char* const kEndField = "END FIELD\n";
const char* const kSuffix =
    "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:";

// Accumulates tokenized pieces and, when asked, the segments they came from.
class Pieces {
public:
    Pieces(const Tokenizer& tok, bool keep) : tok_(tok), keep_(keep) {}
    void add(const char* role, std::string text) {
        std::vector<int32_t> ids = tok_.encode(text);
        ids_.insert(ids_.end(), ids.begin(), ids.end());
        if (keep_) segments_.push_back({role, std::move(text), std::move(ids)});
    }
    int size() const { return static_cast<int>(ids_.size()); }
    std::vector<int32_t>& ids() { return ids_; }
    std::vector<PromptSegment>& segments() { return segments_; }

private:
    const Tokenizer& tok_;
    bool keep_;
    std::vector<int32_t> ids_;
    std::vector<PromptSegment> segments_;
};

}  // namespace

PromptTooLong::PromptTooLong(int fixed, int max)
    : Error("schema requires " + std::to_string(fixed) + " tokens before state; maximum is " +
            std::to_string(max)),
      fixed_length(fixed),
      max_length(max) {}

EncodedPrompt encode_prompt(const Tokenizer& tok, const DecisionRequest& req, const PromptOptions& opt) {
    EncodedPrompt out;

    Pieces schema(tok, opt.keep_segments);
    schema.add("schema_header", kSchemaHeader);
    for (size_t qi = 0; qi < req.questions.size(); ++qi) {
        const Question& q = req.questions[qi];
        EncodedQuestion eq;
        eq.id = q.id;
        eq.type = q.type;
        schema.add("field_header", "\nFIELD " + std::to_string(qi + 1) + "\nID: " + q.id +
                                       "\nTYPE: " + question_type_name(q.type) + "\nINSTRUCTION: ");
        const int q_begin = schema.size();
        schema.add("instruction", render_python(q.instructions));
        eq.span = {q_begin, schema.size()};
        schema.add("allowed_options", kAllowedOptions);
        for (size_t oi = 0; oi < q.options.size(); ++oi) {
            const QuestionOption& o = q.options[oi];
            schema.add("option_label", "OPTION " + std::to_string(oi + 1) + ": ");
            JsonValue semantics = JsonValue::object();
            semantics.set("option_id", JsonValue::string(o.id));
            if (o.has_description) semantics.set("description", o.description);
            const int o_begin = schema.size();
            schema.add("option_json", render_python(semantics));
            eq.option_spans.emplace_back(o_begin, schema.size());
            eq.option_ids.push_back(o.id);
            schema.add("newline", "\n");
        }
        schema.add("end_field", kEndField);
        out.questions.push_back(std::move(eq));
    }

    Pieces head(tok, opt.keep_segments);
    head.add("prefix", kPrefix);
    if (opt.media) {
        out.media_token_offset = head.size();
        head.ids().insert(head.ids().end(), opt.media->ids.begin(), opt.media->ids.end());
        if (opt.keep_segments) head.segments().push_back({"media", opt.media->text, opt.media->ids});
    }
    Pieces suffix(tok, opt.keep_segments);
    suffix.add("suffix", kSuffix);

    std::string state_text = render_python(req.state);
    std::vector<int32_t> state_ids = tok.encode(state_text);
    out.state_tokens_total = static_cast<int>(state_ids.size());
    out.fixed_length = head.size() + schema.size() + suffix.size();
    if (out.fixed_length > opt.max_length) throw PromptTooLong(out.fixed_length, opt.max_length);
    const size_t keep = static_cast<size_t>(opt.max_length - out.fixed_length);
    if (state_ids.size() > keep) state_ids.resize(keep);
    out.state_tokens_kept = static_cast<int>(state_ids.size());

    const int schema_offset = head.size() + out.state_tokens_kept;
    out.state_end = schema_offset;
    for (auto& q : out.questions) {
        q.span.first += schema_offset;
        q.span.second += schema_offset;
        for (auto& s : q.option_spans) {
            s.first += schema_offset;
            s.second += schema_offset;
        }
    }

    out.input_ids.reserve(static_cast<size_t>(out.fixed_length + out.state_tokens_kept));
    out.input_ids = head.ids();
    out.input_ids.insert(out.input_ids.end(), state_ids.begin(), state_ids.end());
    out.input_ids.insert(out.input_ids.end(), schema.ids().begin(), schema.ids().end());
    out.input_ids.insert(out.input_ids.end(), suffix.ids().begin(), suffix.ids().end());

    if (opt.keep_segments) {
        out.segments = std::move(head.segments());
        out.segments.push_back({"state", std::move(state_text), std::move(state_ids)});
        for (auto& s : schema.segments()) out.segments.push_back(std::move(s));
        for (auto& s : suffix.segments()) out.segments.push_back(std::move(s));
    }
    return out;
}

namespace {

// A Jinja expression printing the text s as it is (a JSON string literal is a valid Jinja string literal).
std::string jinja_text(const std::string& s) {
    return "{{ " + nlohmann::json(s).dump() + " }}";
}

// Prints a JSON value the way render_python does: strings as they are, anything else as compact JSON (the
// caller passes objects with their keys sorted).
std::string jinja_render(const std::string& var) {
    return "{{ " + var + " if " + var + " is string else " + var + " | tojson(separators=[',', ':']) }}";
}

}  // namespace

std::string systemone_chat_template() {
    const std::string sep = "{{ sep }}";
    const std::string json = " | tojson(separators=[',', ':'])";
    std::string t;
    t += jinja_text(kPrefix) + sep + jinja_render("state") + sep + jinja_text(kSchemaHeader);
    t += "{% for q in questions %}";
    t += sep + jinja_text("\nFIELD ") + "{{ loop.index }}" + jinja_text("\nID: ") + "{{ q.id }}" +
         jinja_text("\nTYPE: ") + "{{ q.type }}" + jinja_text("\nINSTRUCTION: ");
    // The question-id fallback for missing, null or empty instructions.
    const std::string given =
        "q.instructions is defined and q.instructions is not none and q.instructions != ''";
    t += "{% set instruction = q.instructions if (" + given + ") else q.id %}";
    t += sep + "{{ mark_question }}" + jinja_render("instruction");
    t += sep + jinja_text(kAllowedOptions);
    t += "{% for o in q.options %}";
    t += sep + jinja_text("OPTION ") + "{{ loop.index }}" + jinja_text(": ");
    // A noul option without a description gets the default one; other options without one print their id
    // only.
    // (Appended piece by piece: gcc 12 misreads "(" + std::string as overlapping memcpy, -Wrestrict.)
    std::string noul_default = "(";
    noul_default += nlohmann::json(kNoulTrueDescription).dump();
    noul_default += " if o.key == 'true' else ";
    noul_default += nlohmann::json(kNoulFalseDescription).dump();
    noul_default += ")";
    t += "{% set description = o.description if (o.description is defined and o.description is not none) "
         "else (" +
         noul_default + " if q.type == 'noul' else none) %}";
    t += sep + "{{ mark_option }}";
    t += "{% if description is none %}{{ {'option_id': o.key}" + json + " }}";
    t += "{% else %}{{ {'description': description, 'option_id': o.key}" + json + " }}{% endif %}";
    t += sep + jinja_text("\n");
    t += "{% endfor %}";
    t += sep + jinja_text(kEndField);
    t += "{% endfor %}";
    t += sep + jinja_text(kSuffix);
    return t;
}

}  // namespace clef
