#include "hub/select.h"

#include <fnmatch.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "util/error.h"
#include "util/text.h"

namespace clef::hub {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string base_name(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Files of the publisher layout that no loader reads: documentation, git metadata, pictures, and weights in
// formats other than safetensors (pytorch, TF, Flax, ONNX, GGUF).
bool unneeded(const std::string& path) {
    static constexpr std::array<std::string_view, 18> kSuffixes = {
        ".md",  ".png",  ".jpg", ".jpeg",    ".gif",  ".webp",   ".svg", ".bin",  ".pt",
        ".pth", ".ckpt", ".h5",  ".msgpack", ".onnx", ".tflite", ".ot",  ".gguf", ".pdf"};
    const std::string name = ascii_lower(base_name(path));
    if (name == ".gitattributes" || name == ".gitignore") return true;
    return std::any_of(kSuffixes.begin(), kSuffixes.end(),
                       [&](std::string_view s) { return ends_with(name, s); });
}

std::string list_some(const std::vector<std::string>& paths) {
    std::string out;
    const size_t shown = std::min<size_t>(paths.size(), 12);
    for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + paths[i];
    if (paths.size() > shown) out += ", ... (" + std::to_string(paths.size()) + " in all)";
    return out.empty() ? "none" : out;
}

std::vector<std::string> by_patterns(const std::vector<std::string>& files,
                                     const std::vector<std::string>& patterns, const std::string& label) {
    std::vector<std::string> out;
    for (const auto& p : patterns) {
        bool any = false;
        for (const auto& f : files) {
            if (fnmatch(p.c_str(), f.c_str(), 0) != 0) continue;
            any = true;
            if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
        }
        if (!any)
            throw Error("--file '" + p + "' matches no file of " + label +
                        " (its files: " + list_some(files) + ")");
    }
    return out;
}

std::vector<std::string> default_selection(const std::vector<std::string>& files, const std::string& label) {
    std::vector<std::string> out;
    if (std::find(files.begin(), files.end(), "config.json") != files.end()) {
        for (const auto& f : files)
            if (!unneeded(f)) out.push_back(f);
        return out;
    }
    std::vector<std::string> ggufs;
    for (const auto& f : files)
        if (is_gguf(f) && !is_mmproj(f)) ggufs.push_back(f);
    if (ggufs.size() == 1) return ggufs;
    if (ggufs.empty())
        throw Error(
            label +
            ": no config.json (the publisher layout) and no GGUF file: nothing clef can load (files: " +
            list_some(files) + ")");
    throw Error(label +
                " holds several GGUF files: choose one with --file PATTERN (e.g. --file '*Q4_K_M.gguf'; " +
                "a second --file for an mmproj file): " + list_some(ggufs));
}

}  // namespace

bool is_gguf(const std::string& path) {
    return ends_with(ascii_lower(path), ".gguf");
}

bool is_mmproj(const std::string& path) {
    return is_gguf(path) && ascii_lower(base_name(path)).find("mmproj") != std::string::npos;
}

bool is_safe_repo_path(const std::string& path) {
    if (path.empty() || path.front() == '/' || path.find('\\') != std::string::npos) return false;
    size_t start = 0;
    while (start <= path.size()) {
        size_t end = path.find('/', start);
        if (end == std::string::npos) end = path.size();
        const std::string_view part(path.data() + start, end - start);
        if (part.empty() || part == "." || part == "..") return false;
        start = end + 1;
    }
    return path.find('\0') == std::string::npos;
}

std::vector<std::string> select_files(const std::vector<std::string>& files,
                                      const std::vector<std::string>& patterns, const std::string& label) {
    std::vector<std::string> out =
        patterns.empty() ? default_selection(files, label) : by_patterns(files, patterns, label);
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace clef::hub
