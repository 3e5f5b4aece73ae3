// Internal: the pre-tokenizer split regex (PCRE2, UTF + UCP, JIT) with Hugging Face "Isolated" semantics:
// every match is a piece and so is every non-empty gap between matches.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace clef::tok {

// Split patterns llama.cpp uses for tokenizer.ggml.pre (its (?i:...) spelled out as [sS] classes).
extern const char* const kLlamaQwen2Pattern;
extern const char* const kLlamaQwen35Pattern;
// GPT-2 pattern (a bare ByteLevel pre-tokenizer with use_regex=true).
extern const char* const kGpt2Pattern;

// Rewrites \s and \S (inside and outside character classes, not inside \Q..\E) into explicit Unicode
// White_Space sets, so the pattern means what it means in Oniguruma and llama.cpp. PCRE2 with UCP would also
// count U+180E (MONGOLIAN VOWEL SEPARATOR, no longer White_Space) as \s.
std::string rewrite_whitespace_escapes(std::string_view pattern);

struct Piece {
    size_t begin;
    size_t len;
};

class SplitRegex {
public:
    // Compiles `pattern` (after rewrite_whitespace_escapes unless literal). Throws clef::Error (no file name)
    // on a bad pattern.
    SplitRegex(std::string_view pattern, bool literal);
    ~SplitRegex();
    SplitRegex(const SplitRegex&) = delete;
    SplitRegex& operator=(const SplitRegex&) = delete;

    const std::string& pattern() const { return source_; }

    // Per-call matching state (match data and a JIT stack). Not shareable between threads.
    class Matcher {
    public:
        explicit Matcher(const SplitRegex& re);
        ~Matcher();
        Matcher(const Matcher&) = delete;
        Matcher& operator=(const Matcher&) = delete;
        // Appends the pieces of `s` (valid UTF-8) to `out`: matches and the gaps between them, in order.
        void split(std::string_view s, std::vector<Piece>& out);

    private:
        const SplitRegex& re_;
        pcre2_real_match_data_8* md_ = nullptr;
    };

private:
    std::string source_;
    pcre2_real_code_8* code_ = nullptr;
    bool jit_ = false;
};

}  // namespace clef::tok
