// One function per `clef` subcommand; each registers its options and callback on the app.
#pragma once

#include <string>

#include "decision/engine.h"

namespace CLI {
class App;
}

namespace clef {

// How decide, bench and serve load a model beyond its path: --head (the joint head of a qwen35 GGUF) and
// --unpack-weights (a GGUF's quantised projections unpacked to bf16 at load instead of streamed).
struct LoadArgs {
    std::string head;
    bool unpack = false;
    // `main`: the precision the command decides in (it picks the weight layout: ops::default_gemm_plan).
    LoadOptions options(ops::Precision main = ops::Precision::Exact) const;
};
void add_load_options(CLI::App* cmd, LoadArgs& args);

void add_tokenize_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_decide_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_bench_command(CLI::App& app);

}  // namespace clef
