// SHA-256 (FIPS 180-4), for fingerprints of image data and tensors in the tests (test support, not runtime).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace clef {

// Lower-case hex digest of the bytes.
std::string sha256_hex(const void* data, size_t size);
inline std::string sha256_hex(std::string_view s) {
    return sha256_hex(s.data(), s.size());
}

}  // namespace clef
