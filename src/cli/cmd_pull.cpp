// clef pull: fetch a model from the Hugging Face Hub into the Hugging Face cache and print its local path
// (docs/HUB.md).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "hub/hub.h"
#include "util/error.h"

namespace clef {

namespace {

struct PullArgs {
    std::string repo;
    std::vector<std::string> files;
};

void run_pull(const PullArgs& a) {
    hub::RepoId id;
    if (!hub::parse_repo_id(a.repo, id)) throw Error("expected ORG/NAME[@REVISION], got '" + a.repo + "'");
    const hub::Snapshot snap = hub::fetch(id, a.files, hub::Settings::from_environment());
    // What --model takes: the GGUF file when the selection has one, else the snapshot directory.
    const std::string path = snap.ggufs.size() == 1 ? snap.ggufs[0] : snap.dir;
    std::printf("%s\n", path.c_str());
}

}  // namespace

void add_pull_command(CLI::App& app) {
    auto args = std::make_shared<PullArgs>();
    CLI::App* cmd = app.add_subcommand(
        "pull",
        "Download a model from the Hugging Face Hub into its cache (HF_HOME) and print its local path");
    cmd->add_option("repo", args->repo,
                    "ORG/NAME[@REVISION] (REVISION: a branch, tag or commit; default main)")
        ->required();
    cmd->add_option("--file", args->files,
                    "Files to fetch (shell pattern, repeatable), e.g. '*Q4_K_M.gguf' in a GGUF repository; "
                    "default: what a model in the publisher layout needs")
        ->allow_extra_args(false);
    cmd->callback([args] { run_pull(*args); });
}

}  // namespace clef
