// `clef make-model --preset tiny|small|flash-shaped|clef27-shaped [--layers N] [--seed S] [--no-vision]
// [--shard-size BYTES]
// [--force] [--configs-only] --out DIR`: write a random checkpoint in the publisher layout (see
// tools/make_model.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "tools/make_model.h"
#include "util/error.h"

namespace clef {

namespace {

struct MakeModelArgs {
    MakeModelOptions model;
    std::string out;
    bool no_vision = false;
    bool force = false;
};

// A `\r` progress line on stderr: MB written / total, percent, MB/s. Redrawn at most ~10 times a second.
class ProgressLine {
public:
    ProgressLine() : start_(Clock::now()), last_(start_) {}

    void update(uint64_t done, uint64_t total) {
        const auto now = Clock::now();
        if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
        last_ = now;
        const double secs = std::chrono::duration<double>(now - start_).count();
        const double mb = static_cast<double>(done) / 1e6, total_mb = static_cast<double>(total) / 1e6;
        const double pct = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
        std::fprintf(stderr, "\r  %10.1f / %.1f MB  %5.1f%%  %7.1f MB/s ", mb, total_mb, pct,
                     secs > 0 ? mb / secs : 0.0);
        std::fflush(stderr);
        drawn_ = true;
    }

    void finish(uint64_t total) {
        const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
        if (drawn_) std::fprintf(stderr, "\n");
        std::fprintf(stderr, "  wrote %.1f MB of weights in %.1f s\n", static_cast<double>(total) / 1e6,
                     secs);
    }

private:
    using Clock = std::chrono::steady_clock;
    Clock::time_point start_, last_;
    bool drawn_ = false;
};

void run_make_model(MakeModelArgs a) {
    namespace fs = std::filesystem;
    a.model.vision = !a.no_vision;
    std::error_code ec;
    if (fs::exists(a.out, ec)) {
        if (!fs::is_directory(a.out, ec)) throw Error(a.out + ": exists and is not a directory");
        if (!fs::is_empty(a.out, ec) && !a.force)
            throw Error(a.out + ": directory is not empty (use --force to write into it anyway)");
    }
    const uint64_t total = make_model_weight_bytes(a.model);  // also validates preset and layers
    if (isatty(fileno(stderr)) && !a.model.configs_only) {
        auto line = std::make_shared<ProgressLine>();
        make_model(a.model, a.out, [line](uint64_t done, uint64_t all) { line->update(done, all); });
        line->finish(total);
    } else {
        make_model(a.model, a.out);
    }
}

}  // namespace

void add_make_model_command(CLI::App& app) {
    auto args = std::make_shared<MakeModelArgs>();
    CLI::App* cmd = app.add_subcommand("make-model",
                                       "Write a random checkpoint in the publisher layout (config, weights, "
                                       "joint head, tokenizer, processor)");
    cmd->add_option(
           "--preset", args->model.preset,
           "Sizes: tiny (the test fixture's), small (4 layers of 256-wide rows, which the K-quant and "
           "i-quant GGUF types take), flash-shaped (Clef-Flash's) or clef27-shaped (Clef 27B's)")
        ->required()
        ->check(CLI::IsMember({"tiny", "small", "flash-shaped", "clef27-shaped"}));
    cmd->add_option(
           "--layers", args->model.layers,
           "Number of backbone layers (default: tiny 8, small 4, flash-shaped 32, clef27-shaped 64); layer i "
           "is full attention "
           "iff (i+1) % 4 == 0")
        ->check(CLI::Range(1, 1024));
    cmd->add_option("--seed", args->model.seed, "Random seed (same seed, same bytes)")->capture_default_str();
    cmd->add_flag("--no-vision", args->no_vision,
                  "Leave out the vision tower (no vision_config, no model.visual.*)");
    cmd->add_option(
           "--shard-size", args->model.shard_bytes,
           "Split model weights into model-0000k-of-0000n.safetensors shards of at most this many bytes "
           "(e.g. 5GB); default: one model.safetensors")
        ->transform(CLI::AsSizeValue(true));
    cmd->add_flag("--force", args->force, "Write into an existing non-empty directory");
    cmd->add_flag("--configs-only", args->model.configs_only,
                  "Write the configs, tokenizer and processor files but no weights (for clef info --config "
                  "memory plans)");
    cmd->add_option("--out,-o", args->out, "Output directory")->required();
    cmd->callback([args]() { run_make_model(*args); });
}

}  // namespace clef
