#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "util/error.h"

namespace clef::tok {

const char* const kLlamaQwen2Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kLlamaQwen35Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space and its complement, as character-class bodies.
constexpr const char* kWsBody =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr const char* kNotWsBody =
    R"(\x{0}-\x{8}\x{E}-\x{1F}\x{21}-\x{84}\x{86}-\x{9F}\x{A1}-\x{167F}\x{1681}-\x{1FFF}\x{200B}-\x{2027})"
    R"(\x{202A}-\x{202E}\x{2030}-\x{205E}\x{2060}-\x{2FFF}\x{3001}-\x{10FFFF})";

}  // namespace

std::string rewrite_whitespace_escapes(std::string_view p) {
    std::string out;
    out.reserve(p.size() + 64);
    bool in_class = false;
    size_t i = 0;
    while (i < p.size()) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char e = p[i + 1];
            if (e == 'Q') {  // quoted literal up to \E (or the end)
                const size_t end = p.find("\\E", i + 2);
                const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
                out.append(p.substr(i, stop - i));
                i = stop;
                continue;
            }
            if (e == 's' || e == 'S') {
                const char* body = e == 's' ? kWsBody : kNotWsBody;
                if (in_class) {
                    out += body;
                } else {
                    out += '[';
                    out += body;
                    out += ']';
                }
                i += 2;
                continue;
            }
            out.append(p.substr(i, 2));
            i += 2;
            continue;
        }
        if (!in_class) {
            if (c == '[') {
                in_class = true;
                out += c;
                ++i;
                // A ']' right after '[' or '[^' is a literal member.
                if (i < p.size() && p[i] == '^') out += p[i++];
                if (i < p.size() && p[i] == ']') out += p[i++];
                continue;
            }
            out += c;
            ++i;
            continue;
        }
        // Inside a class.
        if (c == '[' && i + 1 < p.size() && (p[i + 1] == ':' || p[i + 1] == '.' || p[i + 1] == '=')) {
            const char kind = p[i + 1];
            const std::string close{kind, ']'};
            const size_t end = p.find(close, i + 2);
            if (end != std::string_view::npos) {  // POSIX [:name:]
                out.append(p.substr(i, end + 2 - i));
                i = end + 2;
                continue;
            }
        }
        if (c == ']') in_class = false;
        out += c;
        ++i;
    }
    return out;
}

SplitRegex::SplitRegex(std::string_view pattern, bool literal) : source_(pattern) {
    const std::string compiled = literal ? std::string(pattern) : rewrite_whitespace_escapes(pattern);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C;
    if (literal) opts |= PCRE2_LITERAL;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), opts, &err,
                          &err_off, nullptr);
    if (!code_) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(err, buf, sizeof buf);
        throw Error("invalid split regex /" + std::string(pattern) +
                    "/: " + reinterpret_cast<const char*>(buf) + " at offset " + std::to_string(err_off));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::~SplitRegex() {
    pcre2_code_free(code_);
}

SplitRegex::Matcher::Matcher(const SplitRegex& re) : re_(re) {
    md_ = pcre2_match_data_create_from_pattern(re.code_, nullptr);
    if (!md_) throw Error("out of memory creating regex match data");
}

SplitRegex::Matcher::~Matcher() {
    pcre2_match_data_free(md_);
}

void SplitRegex::Matcher::split(std::string_view s, std::vector<Piece>& out) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    const size_t n = s.size();
    size_t pos = 0;      // where the next search starts
    size_t emitted = 0;  // end of the last emitted piece
    while (pos < n) {
        int rc;
        if (re_.jit_) {
            rc = pcre2_jit_match(re_.code_, subject, n, pos, 0, md_, nullptr);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
                rc = pcre2_match(re_.code_, subject, n, pos, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, md_, nullptr);
        } else {
            rc = pcre2_match(re_.code_, subject, n, pos, PCRE2_NO_UTF_CHECK, md_, nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(rc, buf, sizeof buf);
            throw Error(std::string("split regex match failed: ") + reinterpret_cast<const char*>(buf));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_);
        const size_t b = ov[0], e = ov[1];
        if (e == b) {  // empty match: no piece; step over one character
            size_t step = 1;
            while (b + step < n && (static_cast<unsigned char>(s[b + step]) & 0xC0) == 0x80) ++step;
            pos = b + step;
            continue;
        }
        if (b > emitted) out.push_back({emitted, b - emitted});
        out.push_back({b, e - b});
        emitted = e;
        pos = e;
    }
    if (emitted < n) out.push_back({emitted, n - emitted});
}

}  // namespace clef::tok
