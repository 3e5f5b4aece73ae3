// --head, --mmproj, --unpack-weights and --cache-mib, and the decision options, shared by the commands that
// load a model (see commands.h).
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "util/error.h"

namespace clef {

LoadOptions LoadArgs::options(ops::Precision main, uint64_t default_cache_bytes) const {
    LoadOptions o;
    o.unpack_quantised = unpack;
    o.mmproj = mmproj;
    o.precision = main;
    o.cache_bytes = cache_mib < 0 ? default_cache_bytes : static_cast<uint64_t>(cache_mib) << 20;
    return o;
}

void add_load_options(CLI::App* cmd, LoadArgs& args) {
    cmd->add_option("--head", args.head, "Joint head directory for a qwen35 (backbone-only) GGUF");
    cmd->add_option("--mmproj", args.mmproj,
                    "Vision tower of a GGUF model: llama.cpp's mmproj file (clef convert --mmproj); without "
                    "it a GGUF answers text only");
    cmd->add_flag("--unpack-weights", args.unpack,
                  "GGUF: unpack quantised projections to bf16 at load (faster prefill, bf16-size memory)");
    cmd->add_option("--cache-mib", args.cache_mib,
                    "State cache budget in MiB: prompt prefixes up to the end of the state, resumed by later "
                    "decisions (0 = off; serve's default: a quarter of the available memory, at most 8 GiB)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
}

DecideOptions DecisionArgs::options() const {
    DecideOptions opt;
    opt.max_length = max_length;
    opt.threads = threads;
    if (!parse_precision(precision, opt.backbone.precision))
        throw Error("--precision: expected exact or bf16, got '" + precision + "'");
    if (!parse_confidence_convention(confidence, opt.answers.confidence))
        throw Error("--confidence: unknown convention '" + confidence + "'");
    if (max_length <= 0) throw Error("--max-length must be positive");
    return opt;
}

void add_decision_options(CLI::App* cmd, DecisionArgs& args) {
    cmd->add_option("--max-length", args.max_length, "Maximum prompt tokens; the state is cut to fit")
        ->capture_default_str();
    cmd->add_option("--confidence", args.confidence,
                    "Confidence convention: reference, typesafe, workers-ai, colibri, entropy")
        ->capture_default_str();
    cmd->add_option("--threads", args.threads, "Kernel threads (0 = OMP_NUM_THREADS or the physical cores)")
        ->capture_default_str();
    cmd->add_option("--precision", args.precision,
                    "Projection activations: exact (fp32-accurate) or bf16 (faster, small deviations)")
        ->capture_default_str();
}

}  // namespace clef
