// Small text helpers shared by every layer's error messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace clef {

// "[2, 3, 4]"
std::string shape_str(const std::vector<int64_t>& shape);
// 1234567 -> "1,234,567".
std::string with_thousands(int64_t v);

// ASCII letter case (A-Z <-> a-z; every other byte, UTF-8 included, as it is): what the file names, type
// names, header values and settings clef compares without case are spelled in, whatever the C locale.
inline char ascii_lower(char c) {
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}
inline char ascii_upper(char c) {
    return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
}
std::string ascii_lower(std::string_view s);
std::string ascii_upper(std::string_view s);

}  // namespace clef
