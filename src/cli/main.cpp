// clef: command-line entry point. Each subcommand lives in its own cmd_*.cpp (see commands.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "util/error.h"
#include "util/memory.h"
#include "util/version.h"

int main(int argc, char** argv) {
    clef::keep_freed_memory();
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
