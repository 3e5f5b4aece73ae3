// `clef info --model DIR|FILE.gguf [--head DIR] [--tokens N [--schema-tokens N] [--cache-mib N]] [--json]`:
// what is in a model directory or GGUF file, and the memory a decision of N tokens needs
// (tools/model_info.h). `clef info --config config.json [--head-config FILE] [--type BUILD] [--tokens N]`:
// the same from the configs alone (parameters from the shapes; the plan of a BF16 or GGUF build of them).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "decision/engine.h"
#include "device/vulkan.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "ops/int8_gemm.h"
#include "tools/model_info.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

namespace {

struct InfoOptions {
    std::string model;
    std::string head;
    std::string config, head_config;  // --config mode: no weights
    std::string build = "bf16";
    std::optional<std::string> tokens;  // validated here (one-line error, exit 2), not by CLI11
    std::string schema_tokens;
    int64_t cache_mib = -1;  // -1: as clef decide (default_state_cache_bytes)
    bool kv_bf16 = false;
    std::string device = kDefaultDevice;  // a Vulkan device adds its part of the plan (device_in_plan)
    int gpu_layers = -1;                  // with a Vulkan device: the backbone layers on it (-1: all)
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

// Whether the memory plan has a device part for --device `spec`: vulkan and vulkan:N plan for a Vulkan device
// on paper (this machine need not have it), auto for the device clef decide would pick here, cpu for none.
bool device_in_plan(const std::string& spec) {
    const dev::DeviceSpec s = dev::parse_device_spec(spec);
    if (s.kind == dev::DeviceSpec::Kind::Auto) return dev::choose_device(spec, dev::probe_vulkan()).vulkan;
    return s.kind == dev::DeviceSpec::Kind::Vulkan;
}

// The plan's input for --tokens: the engine's defaults (decision/engine.h) and this machine's GEMM backend.
MemoryPlanInput plan_input(const InfoOptions& opt) {
    MemoryPlanInput in = machine_plan_input(parse_tokens("--tokens", *opt.tokens));
    if (!opt.schema_tokens.empty()) in.schema_tokens = parse_tokens("--schema-tokens", opt.schema_tokens);
    in.schema_tokens = std::min(in.schema_tokens, in.tokens);
    in.backbone.kv_bf16 = opt.kv_bf16;
    in.device = device_in_plan(opt.device);
    in.device_layers = opt.gpu_layers;
    in.cache_bytes =
        opt.cache_mib < 0 ? default_state_cache_bytes() : static_cast<uint64_t>(opt.cache_mib) << 20;
    return in;
}

// How this machine would run the model's projections in each precision (ops::default_gemm_plan).
std::string gemm_for(ops::Precision p) {
    ops::set_gemm_plan(ops::default_gemm_plan(p));
    return ops::gemm_plan_string();
}

// --config: parameter counts from the shapes and, with --tokens, the plan of the build.
void run_config_info(const InfoOptions& opt) {
    const ModelConfig config = load_model_config(opt.config);
    std::optional<HeadConfig> head;
    if (!opt.head_config.empty()) head = load_head_config(opt.head_config);
    const ParamCounts p = expected_param_counts(config, head ? &*head : nullptr);
    std::optional<MemoryPlan> plan;
    if (opt.tokens) plan = config_memory_plan(config, head ? &*head : nullptr, opt.build, plan_input(opt));
    std::string out;
    const std::pair<const char*, int64_t> rows[] = {{"backbone_layers", p.backbone_layers()},
                                                    {"embed_tokens", p.embed_tokens},
                                                    {"lm_head", p.lm_head},
                                                    {"vision", p.vision},
                                                    {"head", p.head},
                                                    {"total", p.total()}};
    if (opt.json) {
        nlohmann::json j;
        j["config"] = opt.config;
        for (const auto& [key, n] : rows) j["parameters"][key] = n;
        if (plan) {
            j["build"] = opt.build;
            j["memory_plan"] = memory_plan_to_json(*plan);
        }
        out = j.dump(2) + "\n";
    } else {
        out = "parameters from " + opt.config + (head ? " and " + opt.head_config : "") +
              " (no weights read)\n";
        for (const auto& [key, n] : rows) out += fmt::format("  {:<22}{:>17}\n", key, with_thousands(n));
        if (plan) out += "\nbuild " + opt.build + "\n" + format_memory_plan(*plan);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
}

void run_info(const InfoOptions& opt) {
    if (!opt.config.empty()) return run_config_info(opt);
    std::optional<MemoryPlan> plan;
    if (opt.tokens) plan = compute_memory_plan(opt.model, opt.head, plan_input(opt));
    const ModelInfo info = compute_model_info(opt.model, opt.head);
    const std::string exact = gemm_for(ops::Precision::Exact), bf16 = gemm_for(ops::Precision::BF16);
    std::string out;
    if (opt.json) {
        auto j = model_info_to_json(info);
        j["cpu"] = ops::cpu_features_string();
        j["gemm"] = {{"exact", exact}, {"bf16", bf16}, {"int8", ops::int8_plan_string()}};
        if (plan) j["memory_plan"] = memory_plan_to_json(*plan);
        out = j.dump(2) + "\n";
    } else {
        out = format_model_info(info) + "\nthis machine\n  cpu                   " +
              ops::cpu_features_string() + "\n  gemm exact            " + exact +
              "\n  gemm bf16             " + bf16 + "\n  gemm int8             " + ops::int8_plan_string() +
              "\n";
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
    CLI::Option* model =
        cmd->add_option("--model,-m", opt->model,
                        "Model directory (config.json, weights, tokenizer, joint head) or .gguf file");
    CLI::Option* config =
        cmd->add_option("--config", opt->config,
                        "A config.json alone (no weights): parameters from its shapes and, with "
                        "--tokens, the memory plan of a build of it (--type)");
    model->excludes(config);
    cmd->add_option("--head-config", opt->head_config, "With --config: the joint_head_config.json")
        ->needs(config);
    cmd->add_option(
           "--type", opt->build,
           "With --config: the build to plan, bf16 (the publisher's safetensors) or a GGUF file type "
           "(q8_0, q4_k_m, iq2_m, ...)")
        ->needs(config);
    cmd->add_option("--head", opt->head, "Joint head directory for a qwen35 (backbone-only) GGUF");
    cmd->add_option("--tokens", opt->tokens,
                    "Also print the memory plan of a decision of this many prompt tokens");
    cmd->add_option("--schema-tokens", opt->schema_tokens,
                    "Memory plan: prompt tokens after the state (questions and options; default 512)");
    cmd->add_option("--cache-mib", opt->cache_mib,
                    "Memory plan: the state cache budget in MiB (0 = off; default: as clef decide)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
    add_kv_type_option(cmd, opt->kv_bf16);
    add_device_option(cmd, opt->device,
                      "; the memory plan adds what the model and a decision take on a Vulkan device (vulkan, "
                      "vulkan:N: on paper, whether this machine has it or not)");
    cmd->add_option("--gpu-layers", opt->gpu_layers,
                    "Memory plan on a Vulkan device: the backbone layers on it (default: all)")
        ->check(CLI::Range(0, 4096));
    cmd->add_flag("--json", opt->json, "Print a JSON object instead of the text summary");
    cmd->callback([opt, model, config]() {
        if (model->count() == 0 && config->count() == 0)
            throw Error("info: give --model PATH or --config FILE");
        run_info(*opt);
    });
}

}  // namespace clef
