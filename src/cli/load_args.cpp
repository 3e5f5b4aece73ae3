// --head, --mmproj, --unpack-weights, --cache-mib and --file (with a Hub id for --model), and the decision
// options, shared by the commands that load a model (see commands.h).
#include <CLI/CLI.hpp>
#include <filesystem>

#include "cli/commands.h"
#include "hub/hub.h"
#include "util/error.h"

namespace clef {

namespace {

// Gives a parsed option another value, as if the command line had said it.
void set_option(CLI::Option* opt, const std::string& value) {
    opt->clear();
    opt->add_result(value);
    opt->run_callback();
}

// --model ORG/NAME[@REVISION], when no such local path exists: the repository's files (--file, or the default
// selection) are fetched into the Hugging Face cache and --model becomes their local path (the GGUF file, or
// the snapshot directory), and an mmproj file among them becomes --mmproj. Runs once the command line is
// parsed, before the command.
void resolve_hub_model(CLI::App* cmd, LoadArgs& args) {
    CLI::Option* model = cmd->get_option_no_throw("--model");
    if (!model || model->count() == 0 || !cmd->remaining().empty()) return;  // CLI11 reports the extras
    const std::string spec = model->as<std::string>();
    hub::RepoId id;
    std::error_code ec;
    if (std::filesystem::exists(spec, ec) || !hub::parse_repo_id(spec, id)) {
        if (!args.files.empty())
            throw Error("--file selects files of a Hub repository (--model ORG/NAME[@REVISION]), not of '" +
                        spec + "'");
        return;
    }
    hub::Snapshot snap;
    try {
        snap = hub::fetch(id, args.files, hub::Settings::from_environment());
    } catch (const Error& e) {  // a mistyped local path reads as a Hub id too: say both
        throw Error("--model " + spec + " (no such local path, so a Hub repository): " + e.what());
    }
    if (args.mmproj.empty()) args.mmproj = snap.mmproj_path();
    set_option(model, snap.model_path());
}

}  // namespace

LoadOptions LoadArgs::options(ops::Precision main, uint64_t default_cache_bytes) const {
    LoadOptions o;
    o.unpack_quantised = unpack;
    o.mmproj = mmproj;
    o.precision = main;
    o.cache_bytes = cache_mib < 0 ? default_cache_bytes : static_cast<uint64_t>(cache_mib) << 20;
    o.device = device;
    o.gpu_layers = gpu_layers;
    o.gpu_memory = gpu_memory;
    return o;
}

void add_device_option(CLI::App* cmd, std::string& device, const std::string& more) {
    cmd->add_option(
           "--device", device,
           "Where the model runs: auto (a discrete or integrated GPU through Vulkan when there is one, "
           "else the CPU), cpu, vulkan (the best Vulkan device, CPU-type ones included) or vulkan:N "
           "(clef devices lists them)" +
               more)
        ->capture_default_str();
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
    add_device_option(cmd, args.device);
    cmd->add_option(
           "--gpu-layers", args.gpu_layers,
           "On a Vulkan device: the backbone layers it holds, the first ones (the others run on the CPU "
           "in the same decision; default: as many as --gpu-memory holds)")
        ->check(CLI::Range(0, 4096));
    cmd->add_option("--gpu-memory", args.gpu_memory,
                    "On a Vulkan device: the memory the model may take there (e.g. 3.5GB; default: its "
                    "device-local memory less 10 %), planned for a 4,096-token decision (clef info --device "
                    "vulkan shows the plan)")
        ->transform(CLI::AsSizeValue(false));
    if (CLI::Option* model = cmd->get_option_no_throw("--model"))
        model->description(model->get_description() +
                           ", or a Hugging Face Hub repository ORG/NAME[@REVISION]");
    cmd->add_option("--file", args.files,
                    "With a Hub repository for --model: the files to fetch (shell pattern, repeatable), e.g. "
                    "--file '*Q4_K_M.gguf' --file '*mmproj*' in a GGUF repository")
        ->allow_extra_args(false);  // one pattern per --file: the positional arguments stay theirs
    cmd->parse_complete_callback([cmd, &args] { resolve_hub_model(cmd, args); });
}

DecideOptions DecisionArgs::options() const {
    DecideOptions opt;
    opt.max_length = max_length;
    opt.threads = threads;
    opt.backbone.precision = precision_option(precision);
    if (!parse_confidence_convention(confidence, opt.answers.confidence))
        throw Error("--confidence: unknown convention '" + confidence + "'");
    if (max_length <= 0) throw Error("--max-length must be positive");
    if (!calibration.empty()) load_calibration(calibration, opt.answers);
    opt.backbone.kv_bf16 = kv_bf16;
    return opt;
}

ops::Precision precision_option(const std::string& s) {
    ops::Precision p;
    if (!parse_precision(s, p))
        throw Error("--precision: expected exact, bf16, int8 or fp16, got '" + s + "'");
    return p;
}

void add_precision_option(CLI::App* cmd, std::string& precision) {
    cmd->add_option("--precision", precision,
                    "Projection activations: exact (fp32-accurate), bf16 or int8 (faster on the CPU, small "
                    "deviations: docs/PERFORMANCE.md), fp16 (tensor cores of a Vulkan GPU: docs/GPU.md)")
        ->capture_default_str();
}

void add_kv_type_option(CLI::App* cmd, bool& kv_bf16) {
    cmd->add_option_function<std::string>(
           "--kv-type", [&kv_bf16](const std::string& s) { kv_bf16 = s == kv_type_name(true); },
           "Full-attention K/V cache storage: f32 (exact) or bf16 (half the memory of long prompts, small "
           "deviations: docs/LONG_CONTEXT.md)")
        ->check(CLI::IsMember({kv_type_name(false), kv_type_name(true)}))
        ->default_str(kv_type_name(false));
}

void add_decision_options(CLI::App* cmd, DecisionArgs& args) {
    cmd->add_option("--max-length", args.max_length, "Maximum prompt tokens; the state is cut to fit")
        ->capture_default_str();
    cmd->add_option("--confidence", args.confidence,
                    "Confidence convention: reference, typesafe, workers-ai, colibri, entropy")
        ->capture_default_str();
    cmd->add_option("--threads", args.threads, "Kernel threads (0 = OMP_NUM_THREADS or the physical cores)")
        ->capture_default_str();
    add_precision_option(cmd, args.precision);
    cmd->add_option("--calibration", args.calibration,
                    "Temperatures per question type from clef eval --fit-temperature (default: none)");
    add_kv_type_option(cmd, args.kv_bf16);
}

}  // namespace clef
