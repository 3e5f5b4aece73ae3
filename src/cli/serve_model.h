// What `clef serve` loads (src/cli/cmd_serve.cpp runs the server): the engine, its card (from the tools'
// model summary, model/model_card.h describe_model) and the memory its decisions may take
// (model/serve_plan.h); for
// --demo, the tiny random model it writes first (tools/make_model.h).
#pragma once

#include <cstdint>
#include <string>

#include "decision/engine.h"
#include "server/server.h"

namespace clef {

struct ServeModel {
    std::string dir;   // a model directory or GGUF file
    std::string head;  // --head
    LoadOptions load;
    bool demo = false;
    BackboneOptions backbone;
    int64_t memory_limit_mib = -1;  // -1: this machine's (util/memory.h)
    int max_tokens = 0;             // --max-tokens, at most the model's context
};

// The server's loader: the engine, its card and the decisions' memory budget; throws clef::Error when
// --max-tokens exceeds the model's context.
Server::Loader serve_loader(ServeModel m);

// Writes the demo model (make-model's tiny preset, a fixed seed, no vision tower) to `dir`.
void make_demo_model(const std::string& dir);

}  // namespace clef
