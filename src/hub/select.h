// Which files of a Hub repository a model needs (docs/HUB.md), for the online file list and the cache alike.
#pragma once

#include <string>
#include <vector>

namespace clef::hub {

// The repository paths to fetch among `files`. With patterns: the paths matching any of them (shell globs,
// `*` crosses `/`), each pattern matching at least one. Without: the publisher layout (config.json at the
// top) minus what a model does not read (README and other Markdown, .gitattributes, images, weights in other
// formats), or the one GGUF model file of a GGUF repository. Throws clef::Error naming `label` when nothing
// fits: a pattern that matches no path, a GGUF repository with several model files and no pattern.
std::vector<std::string> select_files(const std::vector<std::string>& files,
                                      const std::vector<std::string>& patterns, const std::string& label);

bool is_gguf(const std::string& path);
// llama.cpp's vision-tower files are named mmproj*.gguf (any case, anywhere in the name).
bool is_mmproj(const std::string& path);

// A repository path is safe to place under a snapshot directory: relative, no empty, `.` or `..` parts.
bool is_safe_repo_path(const std::string& path);

}  // namespace clef::hub
