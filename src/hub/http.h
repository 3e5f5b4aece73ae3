// The HTTP side of the Hub (docs/HUB.md), over cpp-httplib: JSON from the API, a file's metadata from a HEAD
// on its resolve URL, and ranged downloads into a file. Redirects are followed here, not by the library, so
// that the token (Authorization: Bearer) is sent to the endpoint's origin only, never to a CDN host.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace clef::hub {

struct Url {
    std::string origin;  // scheme://host[:port]
    std::string target;  // path and query, starting with '/'
    std::string text() const { return origin + target; }
};

// http:// and https:// URLs only; false otherwise.
bool parse_url(const std::string& text, Url& out);
// The URL a Location header names, relative to `base` or absolute.
Url follow_location(const Url& base, const std::string& location);
// Percent-encodes everything but RFC 3986's unreserved characters (and '/' when keep_slash).
std::string percent_encode(std::string_view s, bool keep_slash);

// What a resolve URL says of a file: its etag (X-Linked-Etag for LFS files, else ETag), size, commit, and
// where its bytes are (the redirect's target, or the resolve URL itself).
struct FileInfo {
    std::string etag;
    std::string commit;  // X-Repo-Commit ("" when absent)
    uint64_t size = 0;
    bool size_known = false;
    Url location;
};

class HubHttp {
public:
    // `endpoint`: HF_ENDPOINT (scheme://host[:port][/prefix]). Throws clef::Error when it is no http(s) URL.
    HubHttp(const std::string& endpoint, std::string token);

    // The body of a 200 answer to GET <endpoint><target>; anything else throws clef::Error naming `what`.
    std::string get(const std::string& target, const std::string& what);
    // HEAD <endpoint><target>, following redirects until an answer carries the file's etag.
    FileInfo file_info(const std::string& target, const std::string& what);

    enum class Outcome { Done, Cut };
    // Fetches `url` into the file `part`, asking for the bytes from `offset` on (its current size) and
    // appending them, or rewriting the file when the server sends it whole. `progress` gets the file's size
    // as it grows. Cut: the transfer broke off (`reason` says how; what arrived is kept). HTTP errors and
    // write failures throw clef::Error naming `what`.
    Outcome download(const Url& url, const std::string& part, uint64_t offset,
                     const std::function<void(uint64_t)>& progress, const std::string& what,
                     std::string& reason);

private:
    Url endpoint_;
    std::string token_;
};

}  // namespace clef::hub
