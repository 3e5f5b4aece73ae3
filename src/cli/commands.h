// One function per `clef` subcommand; each registers its options and callback on the app.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "decision/engine.h"

namespace CLI {
class App;
}

namespace clef {

// The --device of every command that loads or plans a model (decide, batch, eval, serve, bench, info): the
// GPU when there is one, else the CPU. The commands' one default: a person running clef gets the machine's
// GPU without asking. (A program that loads an Engine itself gets LoadOptions' "cpu", decision/engine.h: the
// tests and benches compare against the CPU's results.)
inline constexpr const char* kDefaultDevice = "auto";
// --device on a command, parsed by device/vulkan.h parse_device_spec where it is used; `more`, appended to
// the help, says what the command does with it.
void add_device_option(CLI::App* cmd, std::string& device, const std::string& more = "");

// How decide, bench and serve load a model beyond its path: --head (the joint head of a qwen35 GGUF),
// --mmproj (a GGUF's vision tower, llama.cpp's mmproj file), --unpack-weights (a GGUF's quantised
// projections unpacked to bf16 at load instead of streamed) and --file (which files of a Hub repository).
struct LoadArgs {
    std::string head;
    std::vector<std::string> files;
    std::string mmproj;
    bool unpack = false;
    int64_t cache_mib = -1;               // --cache-mib; -1: the command's default
    std::string device = kDefaultDevice;  // --device auto|cpu|vulkan[:N]
    int gpu_layers = -1;                  // --gpu-layers N; -1: as many as fit
    uint64_t gpu_memory = 0;              // --gpu-memory SIZE; 0: the device's memory less 10 %
    // `main`: the precision the command decides in (it picks the weight layout: ops::default_gemm_plan).
    // default_cache_bytes: the state cache's budget without --cache-mib (serve sizes it from free memory).
    LoadOptions options(ops::Precision main = ops::Precision::Exact, uint64_t default_cache_bytes = 0) const;
};
// Also makes the command's --model take a Hugging Face Hub id (docs/HUB.md): fetched before the command runs.
void add_load_options(CLI::App* cmd, LoadArgs& args);

// --max-length, --confidence, --threads and --precision, shared by the commands that answer request bodies.
struct DecisionArgs {
    int max_length = 16384;
    std::string confidence = "reference";
    int threads = 0;
    std::string precision = "exact";
    std::string calibration;  // --calibration: a calibration file (clef eval --fit-temperature)
    bool kv_bf16 = false;     // --kv-type bf16 (BackboneOptions::kv_bf16)
    // Throws clef::Error (exit 2) for an unknown precision or convention, a non-positive length or an
    // unreadable calibration file.
    DecideOptions options() const;
};
void add_decision_options(CLI::App* cmd, DecisionArgs& args);
// --kv-type f32|bf16 on a command (decide, batch, eval, serve, bench, info): sets kv_bf16.
void add_kv_type_option(CLI::App* cmd, bool& kv_bf16);
// --precision (exact, bf16, int8 or fp16) into `precision`.
void add_precision_option(CLI::App* cmd, std::string& precision);
// The option's value as a Precision; clef::Error for anything else.
ops::Precision precision_option(const std::string& s);
// The --kv-type spelling of a K/V storage.
inline const char* kv_type_name(bool kv_bf16) {
    return kv_bf16 ? "bf16" : "f32";
}

// One request line's outcome (clef batch, clef eval): the response, or the error body the server would send.
// An answered line also keeps its request and decision (logits and probabilities per question).
struct LineResult {
    JsonValue body;
    bool error = false;
    int64_t tokens = 0;  // prompt tokens
    double seconds = 0;  // the decision's wall-clock time
    DecisionRequest request;
    Decision decision;
};
std::vector<std::string> read_lines(const std::string& path);
// Decides request lines [first, end) (System One bodies), lines with the same state back to back so the state
// cache resumes it, and hands each outcome to `done` in line order; a progress bar on stderr when it is a
// terminal. Returns the wall-clock seconds (cmd_batch.cpp).
double run_request_lines(const Engine& engine, const std::vector<std::string>& lines, size_t first,
                         const DecideOptions& opt, const std::function<void(size_t line, LineResult&)>& done);

void add_tokenize_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_decide_command(CLI::App& app);
void add_batch_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_pull_command(CLI::App& app);
void add_devices_command(CLI::App& app);

}  // namespace clef
