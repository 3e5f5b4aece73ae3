// Small text helpers shared by every layer's error messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace clef {

// "[2, 3, 4]"
std::string shape_str(const std::vector<int64_t>& shape);
// 1234567 -> "1,234,567".
std::string with_thousands(int64_t v);

}  // namespace clef
