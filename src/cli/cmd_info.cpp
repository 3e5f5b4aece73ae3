// `clef info --model DIR|FILE.gguf [--json]`: what is in a model directory or GGUF file (model/model_info.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/model_info.h"

namespace clef {

namespace {

struct InfoOptions {
    std::string model;
    bool json = false;
};

void run_info(const InfoOptions& opt) {
    const ModelInfo info = compute_model_info(opt.model);
    const std::string out = opt.json ? model_info_to_json(info).dump(2) + "\n" : format_model_info(info);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
}

}  // namespace

void add_info_command(CLI::App& app) {
    auto opt = std::make_shared<InfoOptions>();
    CLI::App* cmd = app.add_subcommand(
        "info",
        "Summarise a model directory or GGUF file: architecture, layer pattern, widths, parameter counts, "
        "dtypes / quant types, files");
    cmd->add_option("--model,-m", opt->model,
                    "Model directory (config.json, weights, tokenizer, joint head) or .gguf file")
        ->required();
    cmd->add_flag("--json", opt->json, "Print a JSON object instead of the text summary");
    cmd->callback([opt]() { run_info(*opt); });
}

}  // namespace clef
