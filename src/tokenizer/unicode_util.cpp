#include "tokenizer/unicode_util.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace clef::tok {

size_t utf8_sequence(const unsigned char* s, size_t n, size_t& bad) {
    const unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;  // no overlongs
        if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;  // no overlongs
        if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
    } else {
        bad = 1;  // stray continuation byte, C0/C1, F5..FF
        return 0;
    }
    size_t i = 1;
    for (; i < len; ++i) {
        if (i >= n) break;
        const unsigned char b = s[i];
        const unsigned char l = i == 1 ? lo : 0x80;
        const unsigned char h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) break;
    }
    if (i == len) return len;
    bad = i;
    return 0;
}

uint32_t utf8_decode(const unsigned char* s, size_t len) {
    switch (len) {
        case 1:
            return s[0];
        case 2:
            return (uint32_t(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        case 3:
            return (uint32_t(s[0] & 0x0F) << 12) | (uint32_t(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        default:
            return (uint32_t(s[0] & 0x07) << 18) | (uint32_t(s[1] & 0x3F) << 12) |
                   (uint32_t(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

uint32_t utf8_decode_before(const unsigned char* s, size_t end, size_t& len) {
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (s[start] & 0xC0) == 0x80) --start;
    len = end - start;
    return utf8_decode(s + start, len);
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

std::string utf8_lossy(std::string_view bytes) {
    const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
    const size_t n = bytes.size();
    std::string out;
    out.reserve(n);
    size_t i = 0;
    while (i < n) {
        // ASCII run fast path.
        size_t j = i;
        while (j < n && s[j] < 0x80) ++j;
        out.append(bytes.data() + i, j - i);
        i = j;
        if (i >= n) break;
        size_t bad = 0;
        const size_t len = utf8_sequence(s + i, n - i, bad);
        if (len) {
            out.append(bytes.data() + i, len);
            i += len;
        } else {
            out.append("\xEF\xBF\xBD");
            i += bad;
        }
    }
    return out;
}

bool is_valid_utf8(std::string_view bytes) {
    const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
    size_t i = 0;
    while (i < bytes.size()) {
        size_t bad = 0;
        const size_t len = utf8_sequence(s + i, bytes.size() - i, bad);
        if (!len) return false;
        i += len;
    }
    return true;
}

bool is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_word_char(uint32_t cp) {
    if (cp < 0x80) {
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
    }
    switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
        case UTF8PROC_CATEGORY_LU:
        case UTF8PROC_CATEGORY_LL:
        case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM:
        case UTF8PROC_CATEGORY_LO:
        case UTF8PROC_CATEGORY_MN:
        case UTF8PROC_CATEGORY_MC:
        case UTF8PROC_CATEGORY_ND:
        case UTF8PROC_CATEGORY_NL:
        case UTF8PROC_CATEGORY_NO:
            return true;
        default:
            return false;
    }
}

namespace {

struct ByteTables {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 324> to_byte{};  // code points 0..323 cover the whole alphabet
    ByteTables() {
        to_byte.fill(-1);
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            to_cp[b] = printable ? b : next++;
            to_byte[to_cp[b]] = static_cast<int16_t>(b);
        }
    }
};

const ByteTables& tables() {
    static const ByteTables t;
    return t;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_cp() {
    return tables().to_cp;
}

int cp_to_byte(uint32_t cp) {
    return cp < 324 ? tables().to_byte[cp] : -1;
}

std::string byte_level_char(uint8_t b) {
    std::string s;
    append_utf8(s, tables().to_cp[b]);
    return s;
}

std::string byte_level_encode(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char b : bytes) append_utf8(out, tables().to_cp[b]);
    return out;
}

bool byte_level_decode(std::string_view text, std::string& out) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    size_t i = 0;
    while (i < text.size()) {
        size_t bad = 0;
        const size_t len = utf8_sequence(s + i, text.size() - i, bad);
        if (!len) return false;
        const int b = cp_to_byte(utf8_decode(s + i, len));
        if (b < 0) return false;
        out.push_back(static_cast<char>(b));
        i += len;
    }
    return true;
}

void nfc_append(std::string_view in, std::string& out) {
    if (in.empty()) return;
    utf8proc_uint8_t* res = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(
        reinterpret_cast<const utf8proc_uint8_t*>(in.data()), static_cast<utf8proc_ssize_t>(in.size()), &res,
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) {
        std::free(res);
        throw Error(std::string("NFC normalization failed: ") + utf8proc_errmsg(n));
    }
    out.append(reinterpret_cast<const char*>(res), static_cast<size_t>(n));
    std::free(res);
}

namespace {

// Bit set over all code points: 1 = not inert (see nfc_if_needed). Built once from utf8proc's data.
class NonInertTable {
public:
    NonInertTable() : bits_((0x110000 + 63) / 64, 0) {
        utf8proc_int32_t buf[16];
        for (utf8proc_int32_t cp = 0x300; cp < 0x110000; ++cp) {
            const utf8proc_property_t* p = utf8proc_get_property(cp);
            if (p->category == UTF8PROC_CATEGORY_CN) continue;  // unassigned: NFC leaves it alone
            if (p->combining_class != 0) set(cp);
            utf8proc_int32_t last_boundclass = 0;
            const utf8proc_ssize_t n =
                utf8proc_decompose_char(cp, buf, 16, UTF8PROC_DECOMPOSE, &last_boundclass);
            if (n <= 0 || n > 16) {
                set(cp);
                continue;
            }
            if (n != 1 || buf[0] != cp) {
                set(cp);
                // Every non-first element of a canonical decomposition may compose with what precedes it.
                for (utf8proc_ssize_t k = 1; k < n; ++k) set(static_cast<uint32_t>(buf[k]));
            }
        }
    }
    bool non_inert(uint32_t cp) const { return (bits_[cp >> 6] >> (cp & 63)) & 1; }

private:
    void set(uint32_t cp) { bits_[cp >> 6] |= uint64_t{1} << (cp & 63); }
    std::vector<uint64_t> bits_;
};

const NonInertTable& non_inert_table() {
    static const NonInertTable t;
    return t;
}

}  // namespace

bool nfc_if_needed(std::string_view in, std::string& out) {
    const auto* s = reinterpret_cast<const unsigned char*>(in.data());
    const size_t n = in.size();
    const NonInertTable* table = nullptr;
    size_t copied = 0;     // in[0..copied) has been emitted to out
    size_t seg_start = 0;  // start of the last inert character (a safe place to start normalizing)
    bool changed_any = false;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {  // eight ASCII bytes at once
            uint64_t w;
            std::memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                i += 8;
                seg_start = i - 1;
                continue;
            }
        }
        if (s[i] < 0xCC) {  // below U+0300: inert
            seg_start = i;
            i += s[i] < 0x80 ? 1 : 2;
            continue;
        }
        size_t bad = 0;
        const size_t len = utf8_sequence(s + i, n - i, bad);
        if (!table) table = &non_inert_table();
        if (!table->non_inert(utf8_decode(s + i, len))) {
            seg_start = i;
            i += len;
            continue;
        }
        // A span that needs normalizing: from the last inert character to the next inert one.
        size_t j = i + len;
        while (j < n) {
            if (s[j] < 0xCC) break;
            const size_t l = utf8_sequence(s + j, n - j, bad);
            if (!table->non_inert(utf8_decode(s + j, l))) break;
            j += l;
        }
        if (!changed_any) {
            out.clear();
            changed_any = true;
        }
        const size_t rs = std::max(seg_start, copied);
        out.append(in.substr(copied, rs - copied));
        nfc_append(in.substr(rs, j - rs), out);
        copied = j;
        seg_start = j;
        i = j;
    }
    if (!changed_any) return false;
    out.append(in.substr(copied));
    return true;
}

}  // namespace clef::tok
