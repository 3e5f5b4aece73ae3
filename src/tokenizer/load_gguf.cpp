// Loading the tokenizer.ggml.* metadata of a GGUF file (llama.cpp "gpt2" byte-level BPE vocabularies); the
// token types and the writer are in gguf_vocab.h.
#include <string>

#include "io/gguf.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/tokenizer_impl.h"
#include "util/error.h"

namespace clef {

namespace {

constexpr size_t kMaxTokens = size_t{1} << 24;

[[noreturn]] void fail_in(const GgufFile& f, const std::string& what) {
    throw Error(f.path() + ": " + what);
}

void load_from(const GgufFile& f, Tokenizer::Impl& im) {
    auto fail = [&](const std::string& what) { fail_in(f, what); };
    im.source = f.path();

    const std::string model = f.get_string("tokenizer.ggml.model");
    if (model != "gpt2")
        fail("tokenizer.ggml.model '" + model + "' is not supported (only 'gpt2', byte-level BPE)");
    if (!f.contains("tokenizer.ggml.pre")) fail("metadata key 'tokenizer.ggml.pre' is missing");
    const std::string pre = f.get_string("tokenizer.ggml.pre");
    if (pre != "qwen2" && pre != "qwen35")
        fail("tokenizer.ggml.pre '" + pre + "' is not supported (supported: qwen2, qwen35)");
    const char* pattern = pre == "qwen2" ? tok::kLlamaQwen2Pattern : tok::kLlamaQwen35Pattern;
    im.split_pattern = pattern;
    im.regex = std::make_unique<tok::SplitRegex>(pattern, false);
    im.nfc = true;  // the Hugging Face tokenizers behind these pre-types normalize with NFC

    const std::vector<std::string_view>& tokens = f.get_string_array("tokenizer.ggml.tokens");
    if (tokens.empty()) fail("tokenizer.ggml.tokens is empty");
    if (tokens.size() > kMaxTokens)
        fail("tokenizer.ggml.tokens has " + std::to_string(tokens.size()) + " entries (at most " +
             std::to_string(kMaxTokens) + " supported)");
    const size_t n = tokens.size();

    std::vector<int64_t> types(n, static_cast<int64_t>(GgufTokenType::kNormal));
    if (f.contains("tokenizer.ggml.token_type")) {
        types = f.get_int_array("tokenizer.ggml.token_type");
        if (types.size() != n)
            fail("tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                 " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }

    im.kinds.assign(n, TokenKind::kNormal);
    im.id_text.resize(n);
    im.vocab.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        const int32_t id = static_cast<int32_t>(i);
        im.id_text[i] = std::string(tokens[i]);
        im.vocab[im.id_text[i]] = id;  // llama.cpp's text -> id map: a repeated text keeps the last id
        tok::AddedToken a;
        a.id = id;
        a.content = im.id_text[i];
        if (types[i] < 0 || types[i] > kGgufTokenTypeMax)
            fail("tokenizer.ggml.token_type[" + std::to_string(i) + "] = " + std::to_string(types[i]) +
                 " is not a valid token type (0.." + std::to_string(kGgufTokenTypeMax) + ")");
        switch (static_cast<GgufTokenType>(types[i])) {
            case GgufTokenType::kUndefined:
            case GgufTokenType::kNormal:
                break;
            case GgufTokenType::kUnknown:
            case GgufTokenType::kControl:
                im.kinds[i] = TokenKind::kSpecial;
                a.kind = TokenKind::kSpecial;
                if (!a.content.empty()) im.added.push_back(std::move(a));
                break;
            case GgufTokenType::kUserDefined:
                im.kinds[i] = TokenKind::kUserDefined;
                a.kind = TokenKind::kUserDefined;
                if (!a.content.empty()) im.added.push_back(std::move(a));
                break;
            case GgufTokenType::kUnused:
            case GgufTokenType::kByte:
                im.kinds[i] = TokenKind::kUnused;
                break;
        }
    }

    const std::vector<std::string_view>& merges = f.get_string_array("tokenizer.ggml.merges");
    im.merges.reserve(merges.size());
    std::string merged;
    for (size_t r = 0; r < merges.size(); ++r) {
        const std::string_view m = merges[r];
        auto where = [r] { return "tokenizer.ggml.merges[" + std::to_string(r) + "]"; };
        const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;  // as llama.cpp splits it
        if (sp == std::string_view::npos)
            fail(where() + " = \"" + std::string(m) + "\" is not of the form \"a b\"");
        const std::string_view a = m.substr(0, sp), b = m.substr(sp + 1);
        auto ia = im.vocab.find(a), ib = im.vocab.find(b);
        if (ia == im.vocab.end())
            fail(where() + ": token \"" + std::string(a) + "\" is not in the vocabulary");
        if (ib == im.vocab.end())
            fail(where() + ": token \"" + std::string(b) + "\" is not in the vocabulary");
        merged.assign(a);
        merged.append(b);
        auto im_it = im.vocab.find(merged);
        if (im_it == im.vocab.end())
            fail(where() + ": merged token \"" + merged + "\" is not in the vocabulary");
        // llama.cpp keeps the first rank of a repeated pair.
        im.merges.insert(ia->second, ib->second, static_cast<uint32_t>(r), im_it->second, /*replace=*/false);
    }
    im.finalize(/*added_raw_decode=*/true);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& file) {
    auto im = std::make_shared<Impl>();
    load_from(file, *im);
    return Tokenizer(std::move(im));
}

Tokenizer Tokenizer::from_gguf(const std::string& path) {
    return from_gguf(GgufFile::open(path));
}

}  // namespace clef
