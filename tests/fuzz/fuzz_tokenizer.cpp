// Fuzz target: arbitrary bytes through the Qwen3 tokenizer (tests/data/tokenizer/qwen3). The first byte picks
// the encode options; the rest is the text. Properties: decode_bytes(encode(text)) == text for every option
// set (the documented round trip, invalid UTF-8 included); decode() of any id list either works or throws
// clef::Error; ids are always valid token ids.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace clef;

namespace {

const Tokenizer& qwen3() {
    static const Tokenizer tok =
        Tokenizer::from_hf_json(fuzz::test_data() + "/tokenizer/qwen3/tokenizer.json");
    return tok;
}

}  // namespace

// The 11 MB tokenizer.json loads once, before the per-input timeout starts counting.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
    (void)qwen3();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const Tokenizer& tok = qwen3();
    uint8_t mode = data[0];
    std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    EncodeOptions opt;
    opt.normalize = (mode & 1) != 0;
    opt.parse_special = (mode & 2) != 0;
    opt.parse_user_defined = (mode & 4) != 0;
    std::vector<int32_t> ids = tok.encode(text, opt);
    for (int32_t id : ids) {
        if (id < 0 || static_cast<size_t>(id) >= tok.vocab_size() || tok.token_kind(id) == TokenKind::kNone) {
            std::abort();
        }
    }
    // Without NFC the bytes come back exactly; with NFC only when the text is already NFC (not checked here).
    if (!opt.normalize && tok.decode_bytes(ids) != text) std::abort();
    (void)tok.decode(ids);

    // The same bytes read as little-endian int32 ids (some invalid) go through decode.
    if (mode & 8) {
        std::vector<int32_t> raw((size - 1) / 4);
        if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
        for (int32_t& id : raw) {
            if (mode & 16) id = static_cast<int32_t>(static_cast<uint32_t>(id) % (tok.vocab_size() + 8));
        }
        try {
            (void)tok.decode(raw);
            (void)tok.decode_bytes(raw);
        } catch (const Error&) {
        }
    }
    return 0;
}
