// Base64 (RFC 4648 §4, the standard alphabet), strict: only A-Z a-z 0-9 + / and trailing '=' padding.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace clef {

// Decodes `in` into `out`. Rejects (returns false, with a message in *error when given) any character outside
// the alphabet (whitespace and line breaks included), a length that is not a multiple of 4, and padding
// anywhere but at the end (at most two '='). Non-zero unused bits in the last group are accepted (Python's
// decoder accepts them too).
bool base64_decode(std::string_view in, std::string& out, std::string* error = nullptr);

// Bytes the decoded form of a well-formed input of this length has at most (for limits checked before
// decoding).
inline size_t base64_decoded_size_bound(size_t encoded_length) {
    return encoded_length / 4 * 3 + 3;
}

}  // namespace clef
