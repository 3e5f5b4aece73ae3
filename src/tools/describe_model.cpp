#include "tools/describe_model.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>

#include "io/gguf.h"
#include "tools/model_info.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

// The dtype (or ggml type) that holds most parameters.
std::string dominant_dtype(const ModelInfo& info) {
    auto most =
        std::max_element(info.dtypes.begin(), info.dtypes.end(),
                         [](const DTypeTally& a, const DTypeTally& b) { return a.params < b.params; });
    return most == info.dtypes.end() ? std::string() : most->dtype;
}

// The directory's or file's own name: "clef-flash" for /models/clef-flash/ and /models/clef-flash.gguf.
std::string file_name_of(const std::string& path) {
    fs::path p(path);
    if (p.filename().empty()) p = p.parent_path();
    std::string name = p.filename().string();
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
    return name;
}

std::string rfc3339_utc(std::chrono::system_clock::time_point t) {
    const std::time_t secs = std::chrono::system_clock::to_time_t(t);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// Size, newest modification time and a digest of the served files. The digest identifies the files by their
// names, sizes and modification times (hashing the contents would read gigabytes at every start).
void set_file_facts(ModelCard& c, const std::vector<std::string>& paths) {
    std::string fingerprint = c.quantization;
    std::chrono::system_clock::time_point newest{};
    for (const std::string& p : paths) {
        std::error_code ec;
        const uint64_t bytes = fs::file_size(p, ec);
        if (ec) continue;
        const fs::file_time_type written = fs::last_write_time(p, ec);
        if (ec) continue;
        const auto when = std::chrono::time_point_cast<std::chrono::system_clock::duration>(
            std::chrono::file_clock::to_sys(written));
        c.size_bytes += bytes;
        newest = std::max(newest, when);
        for (const std::string& part : {fs::path(p).filename().string(), std::to_string(bytes),
                                        std::to_string(when.time_since_epoch().count())})
            fingerprint.append(" ").append(part);
    }
    if (newest != std::chrono::system_clock::time_point{}) c.modified_at = rfc3339_utc(newest);
    for (int part = 0; part < 4; ++part) {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016zx",
                      std::hash<std::string>{}(std::to_string(part) + fingerprint));
        c.digest += hex;
    }
}

// A GGUF's own name for the model (general.basename, else general.name) when it is Clef-Flash or Clef.
std::string gguf_model_name(const std::string& path) {
    const GgufFile f = GgufFile::open(path);
    for (const char* key : {"general.basename", "general.name"}) {
        const GgufValue* v = f.find(key);
        if (!v || v->type() != GgufType::kString) continue;
        if (std::string n = known_model_name(v->as_string()); !n.empty()) return n;
    }
    return "";
}

// The parameters of an mmproj file's vision tower.
int64_t gguf_parameters(const std::string& path) {
    const GgufFile f = GgufFile::open(path);
    int64_t n = 0;
    for (const GgufTensorInfo& t : f.tensors()) n += static_cast<int64_t>(t.n_elements());
    return n;
}

}  // namespace

ModelCard describe_model(const std::string& path, const std::string& head_dir, const std::string& mmproj) {
    const ModelInfo info = compute_model_info(path, head_dir);
    ModelCard c;
    c.config = info.config;
    c.head = info.head;
    c.file_name = file_name_of(path);
    c.checkpoint_name = checkpoint_model_name(info.config.text);
    c.context_length = info.config.text.context_length();
    c.release_date = published_release_date(info.config.text);
    const ParamCounts& a = info.actual;
    c.parameter_count = a.backbone_layers() + a.embed_tokens + a.lm_head + a.head;
    c.vision = info.config.vision && a.vision > 0;
    if (c.vision) c.parameter_count += a.vision;
    std::vector<std::string> paths;
    for (const FileEntry& f : info.files) paths.push_back(f.path);
    if (info.gguf) {
        c.format = "gguf";
        c.file_type = info.gguf->file_type;
        c.quantization_version = info.gguf->quantization_version;
        c.quantization = c.file_type >= 0 ? info.gguf->file_type_name : upper(dominant_dtype(info));
        if (std::string n = gguf_model_name(path); !n.empty()) c.checkpoint_name = n;
        if (!mmproj.empty()) {
            c.parameter_count += gguf_parameters(mmproj);
            c.vision = true;
            paths.push_back(mmproj);
        }
    } else {
        c.format = "safetensors";
        c.quantization = lower(dominant_dtype(info));
    }
    set_file_facts(c, paths);
    return c;
}

}  // namespace clef
