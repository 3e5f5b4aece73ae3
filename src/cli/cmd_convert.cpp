// `clef convert --model DIR|FILE.gguf --out FILE.gguf --type f32|f16|bf16|q8_0|q4_k_m|q5_k_m|q6_k
// [--arch clef|qwen35]`: a publisher-layout model directory, or a GGUF file (requantised or upcast), to one
// GGUF file (see tools/gguf_convert.h and docs/GGUF.md); `--mmproj FILE.gguf` also (or, without --out, only)
// writes a directory's vision tower as llama.cpp's mmproj file (tools/gguf_mmproj.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "decision/prompt.h"
#include "io/gguf.h"
#include "model/gguf_model.h"
#include "tools/gguf_convert.h"
#include "tools/gguf_mmproj.h"
#include "util/error.h"

namespace clef {

namespace {

struct ConvertCliOptions {
    std::string model, out, type = "bf16", arch = "clef", imatrix, mmproj;
    bool arch_given = false;
};

void print_summary(const std::string& path, const ConvertSummary& s, GgufFileType type,
                   const std::string& what) {
    std::printf("%s: %llu tensors, %llu bytes (%s, %s):", path.c_str(),
                static_cast<unsigned long long>(s.tensors), static_cast<unsigned long long>(s.bytes),
                gguf_file_type_name(type), what.c_str());
    for (const auto& [t, n] : s.tensors_per_type)
        std::printf(" %s=%llu", t.c_str(), static_cast<unsigned long long>(n));
    std::printf("\n");
}

void run_convert(const ConvertCliOptions& o) {
    ConvertOptions opt;
    if (!parse_gguf_file_type(o.type, opt.type))
        throw Error("--type '" + o.type + "' is not one of " + gguf_file_type_names());
    opt.arch = o.arch;
    opt.imatrix = o.imatrix;
    opt.chat_templates["systemone"] = systemone_chat_template();
    const bool tty = isatty(fileno(stderr));
    if (tty)
        opt.progress = [](uint64_t done, uint64_t total) {
            const int width = 40;
            const double f = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
            const int fill = static_cast<int>(f * width);
            std::fprintf(stderr, "\r[%s%s] %5.1f%% %8.1f / %.1f MiB", std::string(fill, '#').c_str(),
                         std::string(width - fill, ' ').c_str(), 100 * f, done / 1048576.0, total / 1048576.0);
            std::fflush(stderr);
        };
    const bool from_gguf = is_gguf_file(o.model);
    if (from_gguf && o.arch_given)
        throw Error("--arch applies to model directories; a GGUF file keeps its architecture");
    if (o.out.empty() && o.mmproj.empty()) throw Error("give --out FILE.gguf, --mmproj FILE.gguf or both");
    if (from_gguf && !o.mmproj.empty())
        throw Error("--mmproj writes the vision tower of a model directory; " + o.model + " is a GGUF file");
    if (!o.mmproj.empty()) {  // first: small, and it refuses the types an mmproj cannot take
        const ConvertSummary s = convert_to_mmproj(o.model, o.mmproj, opt);
        if (tty) std::fprintf(stderr, "\n");
        print_summary(o.mmproj, s, opt.type, "mmproj");
    }
    if (!o.out.empty()) {
        const ConvertSummary s =
            from_gguf ? convert_gguf(o.model, o.out, opt) : convert_to_gguf(o.model, o.out, opt);
        if (tty) std::fprintf(stderr, "\n");
        print_summary(
            o.out, s, opt.type,
            from_gguf ? "from " + std::filesystem::path(o.model).filename().string() : "arch " + opt.arch);
    }
}

}  // namespace

void add_convert_command(CLI::App& app) {
    auto opt = std::make_shared<ConvertCliOptions>();
    CLI::App* cmd = app.add_subcommand("convert", "Convert a model directory to a GGUF file (optionally quantised)");
    cmd->add_option("--model,-m", opt->model, "Model directory in the publisher layout, or a GGUF file")
        ->required();
    cmd->add_option("--out,-o", opt->out, "Output .gguf file (optional with --mmproj)");
    cmd->add_option("--mmproj", opt->mmproj,
                    "Also write the vision tower as llama.cpp's mmproj .gguf (Qwen3-VL; --type f32, f16, "
                    "bf16, q8_0)");
    cmd->add_option("--type,-t", opt->type,
                    "llama.cpp file type (default bf16): " + gguf_file_type_names() +
                        " (clef writes all but the iq1/iq2/iq3 ones; it reads every one)");
    cmd->add_option(
        "--imatrix", opt->imatrix,
        "llama.cpp importance matrix (llama-imatrix's .gguf or legacy .dat) weighting the low-bit "
        "quantisers' error");
    CLI::Option* arch =
        cmd->add_option("--arch", opt->arch, "clef (backbone + head, default) or qwen35 (backbone only)");
    cmd->callback([opt, arch]() {
        opt->arch_given = arch->count() > 0;
        run_convert(*opt);
    });
}

}  // namespace clef
