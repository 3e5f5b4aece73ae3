// API keys (docs/API.md, "Authentication"): with keys configured, the routes that describe or run the model
// (/v1/, Ollama's /api/ but its version) need "Authorization: Bearer <key>".
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace clef {

// Why a request is refused: 403 without a key, 401 with a wrong one.
struct AuthRefusal {
    int status = 0;
    const char* message = "";
};
// The refusal of a request for `path` with this Authorization header (empty when absent); nothing when the
// route needs no key or the key is accepted.
std::optional<AuthRefusal> auth_refusal(const std::string& path, const std::string& authorization,
                                        const std::vector<std::string>& keys);
// Whether the path is one of Ollama's routes (they answer in Ollama's error shape).
bool ollama_route(const std::string& path);

}  // namespace clef
