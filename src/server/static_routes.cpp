#include "server/static_routes.h"

#include <httplib.h>

#include <string>
#include <string_view>

#include "util/error.h"

namespace clef {

namespace {

struct StaticRoute {
    const char* path;
    const char* file;  // an EmbeddedFile name (CMakeLists.txt, clef_embed_files)
    const char* media_type;
};
constexpr StaticRoute kStaticRoutes[] = {
    {"/", "index.html", "text/html; charset=utf-8"},
    {"/playground.css", "playground.css", "text/css; charset=utf-8"},
    {"/playground.js", "playground.js", "text/javascript; charset=utf-8"},
    {"/openapi.json", "openapi.json", "application/json"},
};

// The page runs only its own script and style sheet and talks only to this server.
const char* const kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src "
    "'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const EmbeddedFile& embedded_file(std::string_view name) {
    for (std::size_t i = 0; i < kEmbeddedFileCount; ++i)
        if (name == kEmbeddedFiles[i].name) return kEmbeddedFiles[i];
    throw Error("no embedded file " + std::string(name) + " (CMakeLists.txt, clef_embed_files)");
}

// httplib matches a route as a regular expression over the whole path: the dots are literal.
std::string route_pattern(std::string_view path) {
    std::string p;
    for (char c : path) {
        if (c == '.') p += '\\';
        p += c;
    }
    return p;
}

}  // namespace

void register_static_routes(httplib::Server& http) {
    for (const StaticRoute& r : kStaticRoutes) {
        const EmbeddedFile& f = embedded_file(r.file);
        http.Get(route_pattern(r.path),
                 [&f, type = r.media_type](const httplib::Request&, httplib::Response& res) {
                     res.set_header("Content-Security-Policy", kContentSecurityPolicy);
                     res.set_header("X-Content-Type-Options", "nosniff");
                     res.set_header("Cache-Control", "no-cache");
                     res.set_content(reinterpret_cast<const char*>(f.data), f.size, type);
                 });
    }
}

}  // namespace clef
