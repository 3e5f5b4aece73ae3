// One function per `clef` subcommand; each registers its options and callback on the app.
#pragma once

#include <string>

#include "decision/engine.h"

namespace CLI {
class App;
}

namespace clef {

// How decide, bench and serve load a model beyond its path: --head (the joint head of a qwen35 GGUF),
// --mmproj (a GGUF's vision tower, llama.cpp's mmproj file) and --unpack-weights (a GGUF's quantised
// projections unpacked to bf16 at load instead of streamed).
struct LoadArgs {
    std::string head;
    std::string mmproj;
    bool unpack = false;
    int64_t cache_mib = -1;  // --cache-mib; -1: the command's default
    // `main`: the precision the command decides in (it picks the weight layout: ops::default_gemm_plan).
    // default_cache_bytes: the state cache's budget without --cache-mib (serve sizes it from free memory).
    LoadOptions options(ops::Precision main = ops::Precision::Exact, uint64_t default_cache_bytes = 0) const;
};
void add_load_options(CLI::App* cmd, LoadArgs& args);

// --max-length, --confidence, --threads and --precision, shared by the commands that answer request bodies.
struct DecisionArgs {
    int max_length = 16384;
    std::string confidence = "reference";
    int threads = 0;
    std::string precision = "exact";
    // Throws clef::Error (exit 2) for an unknown precision or convention or a non-positive length.
    DecideOptions options() const;
};
void add_decision_options(CLI::App* cmd, DecisionArgs& args);

void add_tokenize_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_decide_command(CLI::App& app);
void add_batch_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_bench_command(CLI::App& app);

}  // namespace clef
