// `clef info --model DIR|FILE.gguf [--head DIR] [--tokens N [--schema-tokens N] [--cache-mib N]] [--json]`:
// what is in a model directory or GGUF file, and the memory a decision of N tokens needs
// (tools/model_info.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "decision/engine.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "tools/model_info.h"
#include "util/error.h"

namespace clef {

namespace {

struct InfoOptions {
    std::string model;
    std::string head;
    std::optional<std::string> tokens;  // validated here (one-line error, exit 2), not by CLI11
    std::string schema_tokens;
    int64_t cache_mib = -1;  // -1: as clef decide (default_state_cache_bytes)
    bool json = false;
};

// A positive whole number of tokens from option `name`.
int64_t parse_tokens(const std::string& name, const std::string& text) {
    size_t used = 0;
    long long v = 0;
    try {
        v = std::stoll(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size() || v <= 0 || v > (int64_t{1} << 40))
        throw Error(name + ": expected a positive whole number of tokens, got '" + text + "'");
    return v;
}

// The plan's input for --tokens: the engine's defaults (decision/engine.h) and this machine's GEMM backend.
MemoryPlanInput plan_input(const InfoOptions& opt) {
    MemoryPlanInput in;
    in.tokens = parse_tokens("--tokens", *opt.tokens);
    if (!opt.schema_tokens.empty()) in.schema_tokens = parse_tokens("--schema-tokens", opt.schema_tokens);
    in.schema_tokens = std::min(in.schema_tokens, in.tokens);
    in.cache_bytes =
        opt.cache_mib < 0 ? default_state_cache_bytes() : static_cast<uint64_t>(opt.cache_mib) << 20;
    ops::set_gemm_plan(ops::default_gemm_plan(in.backbone.precision));
    in.onednn = ops::PackedLinear::auto_backend(ops::WeightType::BF16) == ops::GemmBackend::OneDnn;
    in.exact_kernel = ops::gemm_plan().exact;
    return in;
}

// How this machine would run the model's projections in each precision (ops::default_gemm_plan).
std::string gemm_for(ops::Precision p) {
    ops::set_gemm_plan(ops::default_gemm_plan(p));
    return ops::gemm_plan_string();
}

void run_info(const InfoOptions& opt) {
    std::optional<MemoryPlan> plan;
    if (opt.tokens) plan = compute_memory_plan(opt.model, opt.head, plan_input(opt));
    const ModelInfo info = compute_model_info(opt.model, opt.head);
    const std::string exact = gemm_for(ops::Precision::Exact), bf16 = gemm_for(ops::Precision::BF16);
    std::string out;
    if (opt.json) {
        auto j = model_info_to_json(info);
        j["cpu"] = ops::cpu_features_string();
        j["gemm"] = {{"exact", exact}, {"bf16", bf16}};
        if (plan) j["memory_plan"] = memory_plan_to_json(*plan);
        out = j.dump(2) + "\n";
    } else {
        out = format_model_info(info) + "\nthis machine\n  cpu                   " +
              ops::cpu_features_string() + "\n  gemm exact            " + exact +
              "\n  gemm bf16             " + bf16 + "\n";
        if (plan) out += "\n" + format_memory_plan(*plan);
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
    cmd->add_option("--head", opt->head, "Joint head directory for a qwen35 (backbone-only) GGUF");
    cmd->add_option("--tokens", opt->tokens,
                    "Also print the memory plan of a decision of this many prompt tokens");
    cmd->add_option("--schema-tokens", opt->schema_tokens,
                    "Memory plan: prompt tokens after the state (questions and options; default 512)");
    cmd->add_option("--cache-mib", opt->cache_mib,
                    "Memory plan: the state cache budget in MiB (0 = off; default: as clef decide)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
    cmd->add_flag("--json", opt->json, "Print a JSON object instead of the text summary");
    cmd->callback([opt]() { run_info(*opt); });
}

}  // namespace clef
