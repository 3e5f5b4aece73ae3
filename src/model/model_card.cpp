#include "model/model_card.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>

#include "io/gguf.h"
#include "model/model_inventory.h"
#include "util/text.h"

namespace clef {

namespace {

constexpr const char* kFlash = "clef-flash";
constexpr const char* kClef = "clef";

// "-9b", "-27b", "-9.5b" at the end of a normalised name (a size label), dropped.
std::string without_size_label(std::string s) {
    if (s.empty() || s.back() != 'b') return s;
    size_t i = s.size() - 1;
    while (i > 0 && (std::isdigit(static_cast<unsigned char>(s[i - 1])) || s[i - 1] == '.')) --i;
    if (i == s.size() - 1 || i == 0 || s[i - 1] != '-') return s;
    return s.substr(0, i - 1);
}

// A quantisation type as file names spell it: Q4_K_M, IQ2_M, TQ1_0, F16, BF16 (any letter case).
bool quant_token(std::string_view t) {
    size_t i = 0;
    auto up = [&](size_t k) { return k < t.size() ? ascii_upper(t[k]) : '\0'; };
    if ((up(0) == 'I' || up(0) == 'T') && up(1) == 'Q') i = 1;
    if (up(0) == 'B' && up(1) == 'F') i = 1;
    if ((up(i) != 'Q' && up(i) != 'F') || !std::isdigit(static_cast<unsigned char>(up(i + 1)))) return false;
    return std::all_of(t.begin(), t.end(),
                       [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// The name without a quantisation suffix ("clef-flash-Q4_K_M" -> "clef-flash", "clef.Q8_0" -> "clef").
std::string_view without_quant_suffix(std::string_view s) {
    for (size_t p = 0; p < s.size(); ++p)
        if ((s[p] == '-' || s[p] == '.') && quant_token(s.substr(p + 1))) return s.substr(0, p);
    return s;
}

}  // namespace

std::string checkpoint_model_name(const TextConfig& text) {
    const int k = text.linear_num_key_heads, v = text.linear_num_value_heads;
    if (k <= 0 || v % k != 0) return "";
    if (v / k == 2) return kFlash;
    if (v / k == 3) return kClef;
    return "";
}

std::string known_model_name(std::string_view written) {
    std::string s;
    for (char c : written) s += (c == ' ' || c == '_') ? '-' : ascii_lower(c);
    if (const size_t slash = s.rfind('/'); slash != std::string::npos) s = s.substr(slash + 1);
    s = without_size_label(s);
    return s == kFlash || s == kClef ? s : "";
}

std::string model_name_in_file_name(std::string_view stem) {
    const std::string_view s = without_quant_suffix(stem);
    if (std::string n = known_model_name(s); !n.empty()) return n;
    // Hugging Face "Org/model" flattened to "Org_model" by the community converters.
    const size_t underscore = s.find('_');
    return underscore == std::string_view::npos ? "" : known_model_name(s.substr(underscore + 1));
}

std::string published_release_date(const TextConfig& t) {
    // Cloudflare/clef-flash and Cloudflare/clef, announced together (docs/API.md, "Models").
    const bool flash = t.hidden_size == 4096 && t.num_layers == 32 && t.linear_num_value_heads == 32;
    const bool clef = t.hidden_size == 5120 && t.num_layers == 64 && t.linear_num_value_heads == 48;
    return (flash || clef) && t.vocab_size == 248320 && t.linear_num_key_heads == 16 ? "2026-10-01" : "";
}

std::vector<std::string> served_names(const ModelCard& card, const std::string& name_override,
                                      const std::vector<std::string>& aliases) {
    const std::string from_file = model_name_in_file_name(card.file_name);
    std::vector<std::string> candidates = {name_override, card.checkpoint_name, from_file, card.file_name};
    candidates.insert(candidates.end(), aliases.begin(), aliases.end());
    std::vector<std::string> names;
    for (const std::string& n : candidates)
        if (!n.empty() && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    if (names.empty()) names.push_back(kClef);
    return names;
}

bool names_model(const std::vector<std::string>& names, std::string_view requested) {
    constexpr std::string_view latest = ":latest";
    if (requested.size() > latest.size() && requested.substr(requested.size() - latest.size()) == latest)
        requested.remove_suffix(latest.size());
    return std::find(names.begin(), names.end(), requested) != names.end();
}

std::string parameter_size_text(int64_t params) {
    const double p = static_cast<double>(params);
    const char* unit = p >= 1e9 ? "B" : p >= 1e6 ? "M" : p >= 1e3 ? "K" : "";
    const double v = p >= 1e9 ? p / 1e9 : p >= 1e6 ? p / 1e6 : p >= 1e3 ? p / 1e3 : p;
    const double one_decimal = std::round(v * 10) / 10;
    char buf[32];
    std::snprintf(buf, sizeof buf, one_decimal == std::floor(one_decimal) ? "%.0f%s" : "%.1f%s", one_decimal,
                  unit);
    return buf;
}

// -----------------------------------------------------------------------------------------------------------
// The card of a model's files

namespace fs = std::filesystem;

namespace {

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
    for (const char* key : {gguf_general::kBasename, gguf_general::kName}) {
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
        c.quantization = c.file_type >= 0 ? info.gguf->file_type_name : ascii_upper(dominant_dtype(info));
        if (std::string n = gguf_model_name(path); !n.empty()) c.checkpoint_name = n;
        if (!mmproj.empty()) {
            c.parameter_count += gguf_parameters(mmproj);
            c.vision = true;
            paths.push_back(mmproj);
        }
    } else {
        c.format = "safetensors";
        c.quantization = ascii_lower(dominant_dtype(info));
    }
    set_file_facts(c, paths);
    return c;
}

}  // namespace clef
