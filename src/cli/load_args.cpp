// --head and --unpack-weights, shared by the commands that load a model (see commands.h).
#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace clef {

LoadOptions LoadArgs::options(ops::Precision main) const {
    LoadOptions o;
    o.unpack_quantised = unpack;
    o.precision = main;
    return o;
}

void add_load_options(CLI::App* cmd, LoadArgs& args) {
    cmd->add_option("--head", args.head, "Joint head directory for a qwen35 (backbone-only) GGUF");
    cmd->add_flag("--unpack-weights", args.unpack,
                  "GGUF: unpack quantised projections to bf16 at load (faster prefill, bf16-size memory)");
}

}  // namespace clef
