#include "io/model_dir.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "util/error.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

enum class Entry { Missing, File, Other };

Entry entry_kind(const fs::path& p) {
    std::error_code ec;
    fs::file_status st = fs::status(p, ec);  // follows symlinks
    if (ec || !fs::exists(st)) return Entry::Missing;
    return fs::is_regular_file(st) ? Entry::File : Entry::Other;
}

// Path of a file in the directory, or "" when it is absent; something there that is not a file is an error.
std::string optional_file(const fs::path& dir, const std::string& root, const char* name) {
    fs::path p = dir / name;
    switch (entry_kind(p)) {
        case Entry::Missing:
            return {};
        case Entry::File:
            return p.string();
        case Entry::Other:
            break;
    }
    throw Error(root + ": " + name + " is not a regular file");
}

std::string required_file(const fs::path& dir, const std::string& root, const char* name, const char* what) {
    std::string p = optional_file(dir, root, name);
    if (p.empty()) throw Error(root + ": missing " + name + " (" + what + ")");
    return p;
}

}  // namespace

ModelDir locate_model_dir(const std::string& path) {
    if (path.empty()) throw Error("model directory path is empty");
    ModelDir d;
    d.root = path;
    const fs::path dir(path);
    switch (entry_kind(dir)) {
        case Entry::Missing:
            throw Error(path + ": model directory does not exist");
        case Entry::File:
            throw Error(path + ": not a directory (expected a model directory holding config.json)");
        case Entry::Other:
            break;
    }
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw Error(path + ": not a directory");

    d.config_path = required_file(dir, path, "config.json", "the backbone configuration");
    d.tokenizer_path = required_file(dir, path, "tokenizer.json", "the tokenizer");
    d.tokenizer_config_path = optional_file(dir, path, "tokenizer_config.json");
    d.processor_config_path = optional_file(dir, path, "processor_config.json");
    if (d.processor_config_path.empty())  // the older transformers layout: the image processor's own file
        d.processor_config_path = optional_file(dir, path, "preprocessor_config.json");

    // Backbone weights: an index, a single file, or unindexed shards (the forms Checkpoint::open accepts).
    d.weights_index_path = optional_file(dir, path, "model.safetensors.index.json");
    std::string single = optional_file(dir, path, "model.safetensors");
    if (!d.weights_index_path.empty()) {
        d.weights_path = path;
        if (!single.empty())
            d.notes.push_back("model.safetensors is ignored: model.safetensors.index.json is used");
    } else if (!single.empty()) {
        d.weights_path = single;
    } else {
        bool shards = false;
        for (const auto& e : fs::directory_iterator(dir, ec)) {
            const std::string n = e.path().filename().string();
            if (n.rfind("model-", 0) == 0 && e.path().extension() == ".safetensors") shards = true;
        }
        if (ec) throw Error(path + ": cannot list the directory: " + ec.message());
        if (!shards)
            throw Error(path +
                        ": missing the backbone weights (model.safetensors, model.safetensors.index.json or "
                        "model-*.safetensors)");
        d.weights_path = path;
    }

    // The joint head: both files or neither.
    std::string head_cfg = optional_file(dir, path, "joint_head_config.json");
    std::string head_w = optional_file(dir, path, "joint_head.safetensors");
    if (!head_cfg.empty() && head_w.empty())
        throw Error(path +
                    ": missing joint_head.safetensors (the head weights; joint_head_config.json is present)");
    if (head_cfg.empty() && !head_w.empty())
        throw Error(path +
                    ": missing joint_head_config.json (the head config; joint_head.safetensors is present)");
    if (head_cfg.empty()) {
        d.backbone_only = true;
        d.notes.insert(
            d.notes.begin(),
            "backbone only: no joint_head_config.json / joint_head.safetensors, so no decisions can be made");
    }
    d.head_config_path = head_cfg;
    d.head_weights_path = head_w;
    return d;
}

}  // namespace clef
