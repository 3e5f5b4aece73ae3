#include "image/base64.h"

#include <array>
#include <cstdint>

namespace clef {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> make_table() {
    std::array<int8_t, 256> t{};
    for (auto& v : t) v = -1;
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
    return t;
}
constexpr std::array<int8_t, 256> kTable = make_table();

bool fail(std::string* error, std::string msg) {
    if (error) *error = std::move(msg);
    return false;
}

std::string describe_char(unsigned char c) {
    static const char* hex = "0123456789abcdef";
    if (c >= 0x21 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
    return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
}

}  // namespace

bool base64_decode(std::string_view in, std::string& out, std::string* error) {
    out.clear();
    const size_t n = in.size();
    size_t pad = 0;
    while (pad < n && pad < 3 && in[n - 1 - pad] == '=') ++pad;
    for (size_t i = 0; i + pad < n; ++i) {
        const unsigned char c = static_cast<unsigned char>(in[i]);
        if (kTable[c] < 0) {
            if (c == '=') return fail(error, "invalid base64: '=' padding at position " + std::to_string(i));
            return fail(error, "invalid base64: " + describe_char(c) + " at position " + std::to_string(i));
        }
    }
    if (n % 4 != 0)
        return fail(error, "invalid base64: length " + std::to_string(n) + " is not a multiple of 4");
    if (pad > 2) return fail(error, "invalid base64: too much '=' padding");
    out.reserve(n / 4 * 3);
    for (size_t i = 0; i < n; i += 4) {
        const bool last = i + 4 == n;
        const size_t valid = last ? 4 - pad : 4;
        uint32_t v = 0;
        for (size_t j = 0; j < 4; ++j)
            v = (v << 6) |
                static_cast<uint32_t>(j < valid ? kTable[static_cast<unsigned char>(in[i + j])] : 0);
        out.push_back(static_cast<char>(v >> 16));
        if (valid > 2) out.push_back(static_cast<char>((v >> 8) & 0xff));
        if (valid > 3) out.push_back(static_cast<char>(v & 0xff));
    }
    return true;
}

}  // namespace clef
