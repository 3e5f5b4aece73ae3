// clef: command-line entry point. Each subcommand lives in its own cmd_*.cpp (see commands.h).
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "util/error.h"
#include "util/version.h"

namespace {

// A decision allocates and frees activation buffers of tens of MiB per layer. By default glibc hands freed
// memory at the top of the heap back to the system and the next layer page-faults it in again (measured:
// ~30 % of a 512-token decision on the flash-shaped model, docs/PERFORMANCE.md). Keep it: blocks up to 32 MiB
// come from the heap, and the heap is never trimmed.
void keep_freed_memory() {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, INT32_MAX);
}

}  // namespace

int main(int argc, char** argv) {
    keep_freed_memory();
    CLI::App app{"clef.cpp: a fast engine and server for Clef decision models"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("clef.cpp ") + clef::kClefVersion);
    clef::add_tokenize_command(app);
    clef::add_info_command(app);
    clef::add_decide_command(app);
    clef::add_batch_command(app);
    clef::add_eval_command(app);
    clef::add_serve_command(app);
    clef::add_make_model_command(app);
    clef::add_convert_command(app);
    clef::add_bench_command(app);
    clef::add_pull_command(app);
    clef::add_devices_command(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const clef::Error& e) {
        std::fprintf(stderr, "clef: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "clef: internal error: %s\n", e.what());
        return 3;
    }
    return 0;
}
