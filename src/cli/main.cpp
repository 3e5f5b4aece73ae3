// clef: command-line entry point. Each subcommand lives in its own cmd_*.cpp (see commands.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
    CLI::App app{"clef.cpp: a fast engine and server for Clef decision models"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "clef.cpp 0.1.0");
    clef::add_tokenize_command(app);
    clef::add_info_command(app);
    clef::add_decide_command(app);
    clef::add_serve_command(app);
    clef::add_make_model_command(app);
    clef::add_convert_command(app);
    clef::add_bench_command(app);
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
