// Prompt encoding, token-exact with the reference `encode_record`: the fixed system prefix, the rendered state,
// the schema (one FIELD block per question with its options), and the assistant suffix. Every piece is tokenized
// on its own and the ids concatenated, so BPE never merges across a piece boundary. The question span covers the
// rendered instructions; an option span covers its {"description":...,"option_id":...} JSON.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "decision/request.h"
#include "util/error.h"

namespace clef {

class Tokenizer;

struct EncodedQuestion {
    std::string id;
    QuestionType type = QuestionType::Noul;
    std::pair<int, int> span;                       // [begin, end) in input_ids
    std::vector<std::pair<int, int>> option_spans;  // encoded option order
    std::vector<std::string> option_ids;
};

struct PromptSegment {
    std::string role;  // prefix, media, state, schema_header, field_header, instruction, allowed_options,
                       // option_label, option_json, newline, end_field, suffix
    std::string text;
    std::vector<int32_t> ids;
};

// The media block that goes right after the prefix (images), already expanded to its token ids.
struct MediaBlock {
    std::string text;
    std::vector<int32_t> ids;
};

struct EncodedPrompt {
    std::vector<int32_t> input_ids;
    std::vector<EncodedQuestion> questions;
    int fixed_length = 0;        // prefix + media + schema + suffix
    int state_tokens_total = 0;  // before truncation
    int state_tokens_kept = 0;
    int media_token_offset = -1;         // where the media block starts, -1 without media
    int state_end = 0;  // where the state ends and the schema begins (prefix + media + state)
    std::vector<PromptSegment> segments;  // filled when requested, in sequence order
};

// Raised when the schema alone does not fit: "schema requires N tokens before state; maximum is M".
class PromptTooLong : public Error {
public:
    PromptTooLong(int fixed_length, int max_length);
    int fixed_length;
    int max_length;
};

struct PromptOptions {
    int max_length = 16384;      // the trained length; the state is cut (keeping its beginning) to fit
    bool keep_segments = false;  // fill EncodedPrompt::segments (debugging and tests)
    const MediaBlock* media = nullptr;
};

EncodedPrompt encode_prompt(const Tokenizer& tok, const DecisionRequest& req, const PromptOptions& opt = {});

// The same prompt as a Jinja template, the `systemone` chat template llama.cpp's `clef` GGUF files carry
// (`tokenizer.chat_template.systemone`) for its decision server. Variables: state (any JSON; objects with
// sorted keys), questions (list of {id, type, instructions, options: list of {key, description}} in encoded
// order), sep (printed between the pieces that are tokenized separately), mark_question and mark_option
// (printed at the start of the question span's and each option span's piece). Pieces and texts equal
// encode_prompt's segments (text prompts; tests/gguf/check_systemone_template.py renders it with Jinja2
// against the fixture).
std::string systemone_chat_template();

}  // namespace clef
