// `clef info --model DIR|FILE.gguf [--json]`: what is in a model directory or GGUF file (tools/model_info.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "tools/model_info.h"

namespace clef {

namespace {

struct InfoOptions {
    std::string model;
    bool json = false;
};

// How this machine would run the model's projections in each precision (ops::default_gemm_plan).
std::string gemm_for(ops::Precision p) {
    ops::set_gemm_plan(ops::default_gemm_plan(p));
    return ops::gemm_plan_string();
}

void run_info(const InfoOptions& opt) {
    const ModelInfo info = compute_model_info(opt.model);
    const std::string exact = gemm_for(ops::Precision::Exact), bf16 = gemm_for(ops::Precision::BF16);
    std::string out;
    if (opt.json) {
        auto j = model_info_to_json(info);
        j["cpu"] = ops::cpu_features_string();
        j["gemm"] = {{"exact", exact}, {"bf16", bf16}};
        out = j.dump(2) + "\n";
    } else {
        out = format_model_info(info) + "\nthis machine\n  cpu                   " +
              ops::cpu_features_string() + "\n  gemm exact            " + exact +
              "\n  gemm bf16             " + bf16 + "\n";
    }
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
