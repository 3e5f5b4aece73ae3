// Models from the Hugging Face Hub (docs/HUB.md): a repository id ORG/NAME[@REVISION] is resolved to a
// commit, the files a model needs are fetched into the standard Hugging Face cache (shared with
// huggingface_hub and the other tools that use it), and the local paths are returned. Only `clef pull` and
// the CLI's --model use this module; nothing in the runtime touches the network.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace clef::hub {

struct RepoId {
    std::string repo;               // "org/name"
    std::string revision = "main";  // a branch, a tag or a commit

    std::string label() const { return repo + "@" + revision; }
};

// Parses ORG/NAME[@REVISION]; false when `text` is not of that form (then it is no Hub id).
bool parse_repo_id(std::string_view text, RepoId& out);

// Where and how to fetch, from the environment variables huggingface_hub reads (docs/HUB.md).
struct Settings {
    std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT
    std::string token;      // HF_TOKEN, else the file HF_TOKEN_PATH or $HF_HOME/token
    std::string cache_dir;  // HF_HUB_CACHE, else $HF_HOME/hub
    bool offline = false;   // HF_HUB_OFFLINE: the cache only
    bool progress = false;  // a progress bar on stderr (when it is a terminal)

    static Settings from_environment();
};

// The selected files of one commit in the cache.
struct Snapshot {
    std::string dir;  // <cache>/models--org--name/snapshots/<commit>
    std::string commit;
    std::vector<std::string> files;    // repository paths, sorted
    std::vector<std::string> ggufs;    // local paths of the selected GGUF model files (mmproj files apart)
    std::vector<std::string> mmprojs;  // local paths of the selected mmproj files (GGUF vision towers)

    // What to load: the one GGUF model file of the selection, else the snapshot directory (the publisher
    // layout). Throws clef::Error when the selection holds several GGUF model files.
    std::string model_path() const;
    // The selected mmproj file, "" when none; throws clef::Error when several.
    std::string mmproj_path() const;
};

// Fetches what `patterns` select of the repository (shell globs over its paths; none: the default
// selection, docs/HUB.md) and returns the snapshot. Files already in the snapshot are not fetched again, a
// partial download left by an earlier run is resumed, and a file whose checksum differs from the Hub's
// is deleted and refused. Offline, the snapshot comes from the cache alone. Throws clef::Error.
Snapshot fetch(const RepoId& id, const std::vector<std::string>& patterns, const Settings& settings);

}  // namespace clef::hub
