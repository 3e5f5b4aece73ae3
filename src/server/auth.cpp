#include "server/auth.h"

#include <algorithm>

namespace clef {

namespace {

// Constant-time membership test: every key is compared over its full length, no early exit.
bool key_matches(const std::string& given, const std::vector<std::string>& keys) {
    unsigned found = 0;
    for (const auto& k : keys) {
        unsigned diff = given.size() != k.size() ? 1u : 0u;
        const size_t n = std::max(given.size(), k.size());
        for (size_t i = 0; i < n; ++i) {
            unsigned char a = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
            unsigned char b = i < k.size() ? static_cast<unsigned char>(k[i]) : 0;
            diff |= static_cast<unsigned>(a ^ b);
        }
        found |= (diff == 0) ? 1u : 0u;
    }
    return found != 0;
}

}  // namespace

bool ollama_route(const std::string& path) {
    return path.rfind("/api/", 0) == 0;
}

std::optional<AuthRefusal> auth_refusal(const std::string& path, const std::string& authorization,
                                        const std::vector<std::string>& keys) {
    if (keys.empty() || (path.rfind("/v1/", 0) != 0 && !ollama_route(path)) || path == "/api/version")
        return std::nullopt;
    if (authorization.empty())
        return AuthRefusal{403, "Must supply an API key! Check your request and try again."};
    const std::string prefix = "Bearer ";
    const std::string given =
        authorization.size() > prefix.size() && authorization.compare(0, prefix.size(), prefix) == 0
            ? authorization.substr(prefix.size())
            : std::string();
    if (!key_matches(given, keys))
        return AuthRefusal{401,
                           "Cannot authenticate with the server. Please check your API key and try again."};
    return std::nullopt;
}

}  // namespace clef
