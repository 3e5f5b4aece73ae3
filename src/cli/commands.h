// One function per `clef` subcommand; each registers its options and callback on the app.
#pragma once

namespace CLI {
class App;
}

namespace clef {

void add_tokenize_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_decide_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_bench_command(CLI::App& app);

}  // namespace clef
