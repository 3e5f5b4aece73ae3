// Base64 encoding (RFC 4648 §4, the standard alphabet, with padding), for building image requests in
// the tests; the runtime only decodes (src/image/base64.h).
#pragma once

#include <string>
#include <string_view>

namespace clef {

// Standard alphabet with padding.
std::string base64_encode(std::string_view bytes);

}  // namespace clef
