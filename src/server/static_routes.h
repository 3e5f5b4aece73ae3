// The server's static routes: the playground page (GET / with its style sheet and script, from
// src/server/web/) and the OpenAPI document (GET /openapi.json, docs/openapi.json). Their bytes are compiled
// into the binary by cmake/embed.cmake, so nothing is read from disk at run time.
#pragma once

#include <cstddef>

namespace httplib {
class Server;
}

namespace clef {

// One embedded file: its route-relative name ("index.html", "openapi.json", ...) and bytes.
struct EmbeddedFile {
    const char* name;
    const unsigned char* data;
    std::size_t size;
};
// Defined by the generated file (cmake/embed_generate.cmake).
extern const EmbeddedFile kEmbeddedFiles[];
extern const std::size_t kEmbeddedFileCount;

// Registers GET /, /playground.css, /playground.js and /openapi.json. None of them needs an API key.
void register_static_routes(httplib::Server& http);

}  // namespace clef
