// Fuzz target: request body bytes -> parse_json -> parse_request -> encode_prompt (tiny-clef tokenizer).
// Properties checked besides "no crash, no hang, no non-clef exception":
//   * a parsed document re-rendered by write_json parses back to an equal value;
//   * the encoded prompt respects max_length and every span lies inside it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "decision/prompt.h"
#include "decision/request.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/json.h"

using namespace clef;

namespace {

const Tokenizer& tiny_tokenizer() {
    static const Tokenizer tok = Tokenizer::from_hf_json(fuzz::test_data() + "/tiny-clef/tokenizer.json");
    return tok;
}

void check_span(std::pair<int, int> s, size_t n) {
    if (s.first < 0 || s.second < s.first || static_cast<size_t>(s.second) > n) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view text(reinterpret_cast<const char*>(data), size);
    JsonValue body;
    JsonParseError perr;
    if (!parse_json(text, body, perr)) return 0;

    // Round trip. Numbers beyond double range parse to +-inf (as in Python) and render as Infinity, which
    // strict JSON cannot read back; only those may fail to re-parse.
    std::string rendered = write_json(body);
    JsonValue again;
    if (parse_json(rendered, again, perr)) {
        if (!(again == body)) std::abort();
    } else if (rendered.find("Infinity") == std::string::npos) {
        std::abort();
    }

    DecisionRequest req;
    std::vector<RequestError> errors;
    RequestLimits limits;
    limits.images.max_images = 2;
    limits.images.max_pixels = uint64_t{1} << 20;  // keeps each run fast
    if (!parse_request(body, req, errors, limits)) {
        if (errors.empty()) std::abort();
        (void)describe_errors(errors);
        return 0;
    }
    for (int max_length : {16384, 200}) {
        PromptOptions opt;
        opt.max_length = max_length;
        opt.keep_segments = (size & 1) != 0;
        try {
            EncodedPrompt p = encode_prompt(tiny_tokenizer(), req, opt);
            size_t n = p.input_ids.size();
            if (n > static_cast<size_t>(max_length)) std::abort();
            if (p.questions.size() != req.questions.size()) std::abort();
            for (const auto& q : p.questions) {
                check_span(q.span, n);
                for (const auto& s : q.option_spans) check_span(s, n);
            }
        } catch (const Error&) {
            // PromptTooLong and other precise refusals are fine.
        }
    }
    return 0;
}
