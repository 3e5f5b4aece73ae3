#include "tools/model_info.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string_view>

#include "io/gguf.h"
#include "model/gguf_model.h"
#include "model/serve_plan.h"
#include "model/tensors.h"
#include "quant/quant.h"
#include "tools/gguf_convert.h"
#include "tools/gguf_types.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

bool starts_with(std::string_view s, std::string_view p) {
    return s.substr(0, p.size()) == p;
}

enum class Part { LinearLayers, FullLayers, FinalNorm, Embed, LmHead, Vision, Head, Other };

// The component of a tensor of the tables (model/tensors.h).
Part part_of(const TensorSpec& s, const TextConfig& text) {
    if (s.part == ModelPart::Vision) return Part::Vision;
    if (s.part == ModelPart::Head) return Part::Head;
    switch (s.text) {
        case TextWeight::Embed:
            return Part::Embed;
        case TextWeight::FinalNorm:
            return Part::FinalNorm;
        case TextWeight::LmHead:
            return Part::LmHead;
        case TextWeight::Layer:
            break;
    }
    return text.layer_types[s.layer] == LayerType::FullAttention ? Part::FullLayers : Part::LinearLayers;
}

// The component of every tensor the tables hold for these configs, by its name in the files: the
// publisher's names with the text tensors under *prefix, or the GGUF names when prefix is null. A tensor of
// another name belongs to none (Part::Other).
class Parts {
public:
    Parts(const ModelConfig& m, const HeadConfig* head, const std::string* prefix) {
        const TensorTables tables{&m.text, true, m.vision ? &*m.vision : nullptr, head};
        for_each_tensor(tables, [&](const TensorSpec& s) {
            parts_[prefix ? text_name(s, *prefix) : s.gguf] = part_of(s, m.text);
        });
    }
    Part operator()(const std::string& name) const {
        const auto it = parts_.find(name);
        return it == parts_.end() ? Part::Other : it->second;
    }

private:
    std::map<std::string, Part> parts_;
};

int64_t& slot(ParamCounts& c, Part p) {
    switch (p) {
        case Part::LinearLayers:
            return c.linear_attention_layers;
        case Part::FullLayers:
            return c.full_attention_layers;
        case Part::FinalNorm:
            return c.final_norm;
        case Part::Embed:
            return c.embed_tokens;
        case Part::LmHead:
            return c.lm_head;
        case Part::Vision:
            return c.vision;
        case Part::Head:
            return c.head;
        case Part::Other:
            break;
    }
    return c.other;
}

std::string relative_name(const std::string& path, const std::string& root) {
    fs::path rel = fs::path(path).lexically_relative(fs::path(root));
    std::string s = rel.string();
    if (s.empty() || starts_with(s, "..")) return path;
    return s;
}

uint64_t file_bytes(const std::string& path) {
    std::error_code ec;
    uintmax_t n = fs::file_size(path, ec);
    if (ec) throw Error(path + ": cannot read the file size: " + ec.message());
    return static_cast<uint64_t>(n);
}

std::string join_ints(const std::vector<int>& v, const char* sep) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
    return s;
}

std::string number_text(double v) {
    if (v == static_cast<double>(static_cast<int64_t>(v)) && std::abs(v) < 9e15)
        return with_thousands(static_cast<int64_t>(v));
    return fmt::format("{}", v);
}

std::vector<int> full_attention_layers(const TextConfig& t) {
    std::vector<int> idx;
    for (size_t i = 0; i < t.layer_types.size(); ++i)
        if (t.layer_types[i] == LayerType::FullAttention) idx.push_back(static_cast<int>(i));
    return idx;
}

// Counts per component and per dtype, gathered tensor by tensor.
struct Tally {
    ParamCounts tensors;  // tensor counts, in the ParamCounts slots
    std::map<std::string, DTypeTally> dtypes;

    void add(ModelInfo& info, const std::string& name, int64_t numel, const std::string& dtype,
             uint64_t bytes, Part part) {
        slot(info.actual, part) += numel;
        slot(tensors, part) += 1;
        DTypeTally& d = dtypes[dtype];
        d.dtype = dtype;
        d.tensors += 1;
        d.params += numel;
        d.bytes += bytes;
        if (part == Part::Other && info.other_tensors.size() < 8) info.other_tensors.push_back(name);
    }
};

// info.components and info.dtypes from the tally (info.actual / expected filled).
void set_components(ModelInfo& info, const Tally& tally) {
    for (auto& [name, d] : tally.dtypes) info.dtypes.push_back(d);
    struct Row {
        const char* key;
        const char* label;
        Part part;
    };
    const Row rows[] = {
        {"linear_attention_layers", "linear-attention layers", Part::LinearLayers},
        {"full_attention_layers", "full-attention layers", Part::FullLayers},
        {"final_norm", "final norm", Part::FinalNorm},
        {"embed_tokens", "embed_tokens", Part::Embed},
        {"lm_head", "lm_head", Part::LmHead},
        {"vision", "vision tower", Part::Vision},
        {"head", "joint head", Part::Head},
        {"other", "other tensors", Part::Other},
    };
    ParamCounts tensors = tally.tensors;
    for (const Row& r : rows) {
        ComponentInfo c;
        c.key = r.key;
        c.label = r.label;
        c.tensors = slot(tensors, r.part);
        c.actual = slot(info.actual, r.part);
        c.expected = slot(info.expected, r.part);
        if (r.part == Part::Other && c.tensors == 0) continue;
        info.components.push_back(c);
    }
}

// Count mismatches and unrecognised tensors as warnings.
void add_count_warnings(ModelInfo& info) {
    for (const ComponentInfo& c : info.components) {
        if (c.matches()) continue;
        if (c.key == "other") {
            std::string names;
            for (size_t i = 0; i < info.other_tensors.size(); ++i)
                names += (i ? ", " : "") + info.other_tensors[i];
            if (c.tensors > static_cast<int64_t>(info.other_tensors.size())) names += ", ...";
            info.warnings.push_back(fmt::format("{} tensors ({} parameters) belong to no known component: {}",
                                                with_thousands(c.tensors), with_thousands(c.actual), names));
        } else {
            info.warnings.push_back(fmt::format("{}: {} parameters in the files, {} expected from the config",
                                                c.label, with_thousands(c.actual),
                                                with_thousands(c.expected)));
        }
    }
}

}  // namespace

int64_t expected_layer_params(const TextConfig& t, LayerType type) {
    TextConfig one = t;  // one layer of that type
    one.num_layers = 1;
    one.layer_types = {type};
    return text_layer_params(one, 0);
}

int64_t expected_vision_params(const VisionConfig& v) {
    return vision_params(v);
}

int64_t expected_head_params(const HeadConfig& hc) {
    return head_params(hc);
}

ParamCounts expected_param_counts(const ModelConfig& config, const HeadConfig* head) {
    const TextConfig& t = config.text;
    ParamCounts c;
    c.linear_attention_layers =
        t.num_layers_of(LayerType::LinearAttention) * expected_layer_params(t, LayerType::LinearAttention);
    c.full_attention_layers =
        t.num_layers_of(LayerType::FullAttention) * expected_layer_params(t, LayerType::FullAttention);
    c.final_norm = t.hidden_size;
    c.embed_tokens = static_cast<int64_t>(t.vocab_size) * t.hidden_size;
    c.lm_head = t.tie_word_embeddings ? 0 : c.embed_tokens;
    c.vision = config.vision ? expected_vision_params(*config.vision) : 0;
    c.head = head ? expected_head_params(*head) : 0;
    return c;
}

std::string describe_layer_pattern(const std::vector<LayerType>& types) {
    const size_t n = types.size();
    if (n == 0) return "none";
    size_t period = n;
    for (size_t p = 1; p < n; ++p) {
        if (n % p != 0) continue;
        bool ok = true;
        for (size_t i = p; i < n && ok; ++i) ok = types[i] == types[i - p];
        if (ok) {
            period = p;
            break;
        }
    }
    std::string s;
    for (size_t i = 0; i < period;) {
        size_t j = i;
        while (j < period && types[j] == types[i]) ++j;
        if (!s.empty()) s += " + ";
        s += std::to_string(j - i) + "×" + (types[i] == LayerType::FullAttention ? "full" : "linear");
        i = j;
    }
    if (period < n) s += ", repeated " + std::to_string(n / period) + "×";
    return s;
}

bool ModelInfo::counts_match() const {
    return std::all_of(components.begin(), components.end(),
                       [](const ComponentInfo& c) { return c.matches(); });
}

ModelInfo compute_model_info(const ModelDir& dir, const ModelDirConfig& config, const Checkpoint& backbone,
                             const SafetensorsFile* head_weights) {
    ModelInfo info;
    info.dir = dir;
    info.config = config.model;
    info.head = config.head;
    const TextConfig& text = info.config.text;
    info.text_prefix = checkpoint_text_prefix(backbone);
    info.layer_pattern = describe_layer_pattern(text.layer_types);
    info.expected = expected_param_counts(info.config, info.head ? &*info.head : nullptr);

    Tally tally;
    const Parts parts(info.config, nullptr, &info.text_prefix);  // the head is a file of its own
    for (const TensorView* t : backbone.all())
        tally.add(info, t->name, t->numel(), std::string(dtype_name(t->dtype)), t->nbytes, parts(t->name));
    info.backbone_tensors = static_cast<int64_t>(backbone.all().size());
    if (head_weights) {
        for (const TensorView& t : head_weights->tensors())
            tally.add(info, t.name, t.numel(), std::string(dtype_name(t.dtype)), t.nbytes, Part::Head);
        info.head_tensors = static_cast<int64_t>(head_weights->tensors().size());
    }
    set_components(info, tally);

    // Files, in a fixed order.
    auto add_file = [&](const std::string& path, const char* role, int64_t n_tensors, uint64_t bytes) {
        if (path.empty()) return;
        info.files.push_back({relative_name(path, dir.root), path, role, bytes, n_tensors});
    };
    add_file(dir.config_path, "backbone config", -1, file_bytes(dir.config_path));
    add_file(dir.weights_index_path, "weights index", -1,
             dir.weights_index_path.empty() ? 0 : file_bytes(dir.weights_index_path));
    for (const SafetensorsFile& f : backbone.files())
        add_file(f.path(), "backbone weights", static_cast<int64_t>(f.tensors().size()), f.file_size());
    add_file(dir.head_config_path, "head config", -1,
             dir.head_config_path.empty() ? 0 : file_bytes(dir.head_config_path));
    if (head_weights)
        add_file(head_weights->path(), "head weights", static_cast<int64_t>(head_weights->tensors().size()),
                 head_weights->file_size());
    for (const auto& [path, role] : {std::pair{dir.tokenizer_path, "tokenizer"},
                                     std::pair{dir.tokenizer_config_path, "tokenizer config"},
                                     std::pair{dir.processor_config_path, "processor config"}})
        add_file(path, role, -1, path.empty() ? 0 : file_bytes(path));

    // Warnings.
    for (const std::string& note : dir.notes) info.warnings.push_back(note);
    add_count_warnings(info);
    return info;
}

namespace {

ModelInfo compute_gguf_model_info(const std::string& path, const std::string& head_dir) {
    const GgufFile f = GgufFile::open(path);
    GgufModelConfig mc = read_gguf_model_config(f);
    ModelInfo info;
    info.dir.root = path;
    info.config = std::move(mc.config);
    info.head = std::move(mc.head_config);
    const TextConfig& text = info.config.text;

    GgufInfo g;
    g.version = f.version();
    g.alignment = f.alignment();
    g.arch = mc.arch;
    if (f.contains("general.file_type")) {
        g.file_type = f.get_int("general.file_type");
        g.file_type_name = llama_file_type_name(g.file_type);
    }
    if (f.contains("general.quantization_version"))
        g.quantization_version = f.get_int("general.quantization_version");
    if (f.contains(g.arch + ".context_length")) g.context_length = f.get_int(g.arch + ".context_length");

    // A qwen35 file's head: joint_head.safetensors + joint_head_config.json from head_dir or beside it.
    std::optional<SafetensorsFile> head_file;
    if (info.head) {
        g.head_source = "in the file";
    } else if (const std::optional<HeadFiles> h = gguf_head_files(path, head_dir)) {
        info.head = load_head_config(h->config);
        head_file = SafetensorsFile::open(h->weights);
        info.dir.head_weights_path = h->weights;
        info.dir.head_config_path = h->config;
        g.head_source = head_dir.empty() ? "joint_head.safetensors beside the file"
                                         : "joint_head.safetensors in " + head_dir;
    } else {
        g.head_source = "none";
    }
    info.dir.backbone_only = !info.head;
    info.layer_pattern = describe_layer_pattern(text.layer_types);
    info.expected = expected_param_counts(info.config, info.head ? &*info.head : nullptr);

    Tally tally;
    std::map<std::string, bool> quant;
    std::map<std::string, std::vector<std::string>> unreadable;  // ggml type -> tensors of it
    const Parts parts(info.config, info.head ? &*info.head : nullptr, nullptr);
    for (const GgufTensorInfo& t : f.tensors()) {
        const Part part = parts(t.name);
        tally.add(info, t.name, static_cast<int64_t>(t.n_elements()), ggml_type_name(t.ggml_type), t.nbytes,
                  part);
        if (ggml_type_traits(t.ggml_type).block_size > 1) quant[ggml_type_name(t.ggml_type)] = true;
        (part == Part::Head ? info.head_tensors : info.backbone_tensors) += 1;
        if (!ggml_type_traits(t.ggml_type).supported)
            unreadable[ggml_type_name(t.ggml_type)].push_back(t.name);
    }
    for (const auto& [type, names] : unreadable)
        info.warnings.push_back(
            fmt::format("{} tensors are {}, which clef cannot read (it reads {}); first: {}", names.size(),
                        type, readable_ggml_types(), names.front()));
    if (head_file) {
        for (const TensorView& t : head_file->tensors())
            tally.add(info, t.name, t.numel(), std::string(dtype_name(t.dtype)), t.nbytes, Part::Head);
        info.head_tensors += static_cast<int64_t>(head_file->tensors().size());
    }
    for (const auto& [name, present] : quant) g.quant_types.push_back(name);
    set_components(info, tally);
    info.gguf = std::move(g);

    info.files.push_back({fs::path(path).filename().string(), path, "GGUF model", f.file_size(),
                          static_cast<int64_t>(f.tensors().size())});
    if (head_file) {
        info.files.push_back({"joint_head_config.json", info.dir.head_config_path, "head config",
                              file_bytes(info.dir.head_config_path), -1});
        info.files.push_back({"joint_head.safetensors", head_file->path(), "head weights",
                              head_file->file_size(), static_cast<int64_t>(head_file->tensors().size())});
    } else if (!info.head) {
        info.warnings.push_back("backbone only: no joint head in the file or beside it (decisions need one)");
    }
    add_count_warnings(info);
    return info;
}

}  // namespace

ModelInfo compute_model_info(const std::string& model_dir, const std::string& head_dir) {
    if (is_gguf_file(model_dir)) return compute_gguf_model_info(model_dir, head_dir);
    ModelDir dir = locate_model_dir(model_dir);
    ModelDirConfig config = load_model_dir_config(dir);
    Checkpoint backbone = Checkpoint::open(dir.weights_path);
    std::optional<SafetensorsFile> head;
    if (!dir.backbone_only) head = SafetensorsFile::open(dir.head_weights_path);
    return compute_model_info(dir, config, backbone, head ? &*head : nullptr);
}

namespace {

// The text report of format_model_info, written section by section.
struct InfoWriter {
    std::ostringstream o;
    void line(std::string_view label, const std::string& value) {
        o << fmt::format("  {:<22}{}\n", label, value);
    }
};

// The model line, its format (GGUF or safetensors) and its layer layout.
void write_overview(InfoWriter& w, const ModelInfo& info) {
    const ModelConfig& c = info.config;
    const TextConfig& t = c.text;
    w.o << "model " << info.dir.root << "\n";
    if (info.gguf) {
        const GgufInfo& g = *info.gguf;
        w.line("format", fmt::format("GGUF v{}, alignment {}", g.version, g.alignment));
        w.line("architecture", g.arch + (g.arch == "clef" ? " (backbone + joint head)" : " (backbone only)"));
        w.line("file type", g.file_type < 0
                                ? std::string("not given")
                                : fmt::format("{} (general.file_type {})", g.file_type_name, g.file_type));
        if (g.quantization_version >= 0)
            w.line("quantization_version", std::to_string(g.quantization_version));
        std::string qt;
        for (const std::string& t : g.quant_types) qt += (qt.empty() ? "" : ", ") + t;
        w.line("quant types", qt.empty() ? "none (float tensors only)" : qt);
        w.line("head weights", g.head_source);
    } else {
        w.line("architecture", c.architecture + " (model_type " + c.model_type + ")");
        std::string layout = info.text_prefix + "*";
        layout += info.text_prefix == kTextPrefix ? " (Qwen3_5ForConditionalGeneration layout)"
                                                  : " (Qwen3_5ForCausalLM text-only layout)";
        w.line("tensor layout", layout);
        w.line("head weights", info.dir.backbone_only ? "none (backbone only)" : "joint_head.safetensors");
    }
    w.line("layers", std::to_string(t.num_layers) + ": " + info.layer_pattern);
    std::string letters;
    for (LayerType l : t.layer_types) letters += l == LayerType::FullAttention ? 'F' : 'L';
    w.line("layer types", letters + "  (L linear_attention, F full_attention)");
    w.line("full attention at", join_ints(full_attention_layers(t), ", "));
}

// The "widths" section: text model sizes, attention, rope, context, vision tower and joint head.
void write_widths(InfoWriter& w, const ModelInfo& info) {
    const ModelConfig& c = info.config;
    const TextConfig& t = c.text;
    w.o << "\nwidths\n";
    w.line("hidden_size", with_thousands(t.hidden_size));
    w.line("intermediate_size", with_thousands(t.intermediate_size));
    w.line("vocab_size",
           with_thousands(t.vocab_size) + (t.tie_word_embeddings ? " (tied lm_head)" : " (untied lm_head)"));
    w.line("full attention",
           fmt::format("{} query heads, {} KV heads, head_dim {}, output gate {}", t.num_heads,
                       t.num_kv_heads, t.head_dim, t.attn_output_gate ? "on" : "off"));
    std::string rope =
        fmt::format("theta {}, rotary_dim {} of {}", number_text(t.rope_theta), t.rotary_dim, t.head_dim);
    if (!t.mrope_section.empty())
        rope += fmt::format(", mrope_section [{}]{}", join_ints(t.mrope_section, ", "),
                            t.mrope_interleaved ? " interleaved" : "");
    w.line("rope", rope);
    w.line("linear attention",
           fmt::format("{} key heads × {}, {} value heads × {}, conv kernel {}", t.linear_num_key_heads,
                       t.linear_key_head_dim, t.linear_num_value_heads, t.linear_value_head_dim,
                       t.linear_conv_kernel));
    w.line("rms_norm_eps", fmt::format("{}", t.rms_norm_eps));
    if (info.gguf)
        w.line("context length", info.gguf->context_length < 0 ? std::string("not given")
                                                               : with_thousands(info.gguf->context_length));
    else if (t.max_position_embeddings > 0)
        w.line("max positions", with_thousands(t.max_position_embeddings));
    if (c.vision) {
        const VisionConfig& v = *c.vision;
        w.line("vision", fmt::format("depth {}, hidden {}, {} heads, intermediate {}, patch {}, merge {}, "
                                     "{} positions, out {}",
                                     v.depth, v.hidden_size, v.num_heads, v.intermediate_size, v.patch_size,
                                     v.spatial_merge_size, v.num_position_embeddings, v.out_hidden_size));
    } else {
        w.line("vision", info.gguf
                             ? "none (a GGUF holds no vision tower; llama.cpp keeps it in an mmproj file)"
                             : "none");
    }
    if (info.head) {
        const HeadConfig& h = *info.head;
        w.line("head",
               fmt::format("hidden {}, width {}, {} routing layers, {} layers, {} heads, feedforward {}",
                           h.hidden_size, h.width, h.routing_layers, h.layers, h.heads, h.feedforward));
    }
}

// Parameters per component (with the backbone layers subtotal after the final norm), in files and expected.
void write_param_counts(InfoWriter& w, const ModelInfo& info) {
    w.o << "\n"
        << fmt::format("{:<24}{:>9}{:>17}{:>17}\n", "parameters", "tensors", "in files", "from config");
    auto count_row = [&](const std::string& label, int64_t tensors, int64_t actual, int64_t expected) {
        w.o << fmt::format("  {:<22}{:>9}{:>17}{:>17}  {}\n", label, with_thousands(tensors),
                           with_thousands(actual), with_thousands(expected),
                           actual == expected ? "ok" : "MISMATCH");
    };
    int64_t layer_tensors = 0, total_tensors = 0;
    for (const ComponentInfo& ci : info.components) {
        count_row(ci.label, ci.tensors, ci.actual, ci.expected);
        total_tensors += ci.tensors;
        if (ci.key == "linear_attention_layers" || ci.key == "full_attention_layers" ||
            ci.key == "final_norm")
            layer_tensors += ci.tensors;
        if (ci.key == "final_norm")
            count_row("backbone layers total", layer_tensors, info.actual.backbone_layers(),
                      info.expected.backbone_layers());
    }
    count_row("total", total_tensors, info.actual.total(), info.expected.total());
}

double bits_per_weight(uint64_t bytes, int64_t params) {
    return params > 0 ? 8.0 * static_cast<double>(bytes) / static_cast<double>(params) : 0.0;
}

// Tensors per dtype (with bits per weight), the files with their sizes, and the warnings.
void write_dtypes_files_warnings(InfoWriter& w, const ModelInfo& info) {
    w.o << "\n"
        << fmt::format("{:<24}{:>9}{:>17}{:>17}{:>7}\n", info.gguf ? "tensor types" : "dtypes", "tensors",
                       "parameters", "bytes", "bpw");
    int64_t params = 0, tensors = 0;
    uint64_t bytes = 0;
    for (const DTypeTally& d : info.dtypes) {
        w.o << fmt::format("  {:<22}{:>9}{:>17}{:>17}{:>7.2f}\n", d.dtype, with_thousands(d.tensors),
                           with_thousands(d.params), with_thousands(static_cast<int64_t>(d.bytes)),
                           bits_per_weight(d.bytes, d.params));
        params += d.params, tensors += d.tensors, bytes += d.bytes;
    }
    w.o << fmt::format("  {:<22}{:>9}{:>17}{:>17}{:>7.2f}\n", "all", with_thousands(tensors),
                       with_thousands(params), with_thousands(static_cast<int64_t>(bytes)),
                       bits_per_weight(bytes, params));

    w.o << "\n" << fmt::format("{:<42}{:>17}{:>9}\n", "files", "bytes", "tensors");
    uint64_t total_bytes = 0;
    for (const FileEntry& f : info.files) {
        std::string row =
            fmt::format("  {:<40}{:>17}", f.name, with_thousands(static_cast<int64_t>(f.bytes)));
        if (f.tensors >= 0) row += fmt::format("{:>9}", with_thousands(f.tensors));
        w.o << row << "\n";
        total_bytes += f.bytes;
    }
    w.o << fmt::format("  {:<40}{:>17}\n", "total", with_thousands(static_cast<int64_t>(total_bytes)));

    w.o << "\nwarnings\n";
    if (info.warnings.empty()) w.o << "  none\n";
    for (const std::string& warning : info.warnings) w.o << "  " << warning << "\n";
}

}  // namespace

std::string format_model_info(const ModelInfo& info) {
    InfoWriter w;
    write_overview(w, info);
    write_widths(w, info);
    write_param_counts(w, info);
    write_dtypes_files_warnings(w, info);
    return w.o.str();
}

namespace {

using nlohmann::json;

json gguf_json(const GgufInfo& g) {
    return {{"version", g.version},
            {"alignment", g.alignment},
            {"architecture", g.arch},
            {"file_type", g.file_type},
            {"file_type_name", g.file_type_name},
            {"quantization_version", g.quantization_version},
            {"quant_types", g.quant_types},
            {"context_length", g.context_length},
            {"head", g.head_source}};
}

json layers_json(const ModelInfo& info) {
    const TextConfig& t = info.config.text;
    json types = json::array();
    for (LayerType l : t.layer_types) types.push_back(layer_type_name(l));
    return {{"count", t.num_layers},
            {"pattern", info.layer_pattern},
            {"types", types},
            {"full_attention", full_attention_layers(t)},
            {"linear_attention_count", t.num_layers_of(LayerType::LinearAttention)},
            {"full_attention_count", t.num_layers_of(LayerType::FullAttention)}};
}

json text_json(const TextConfig& t) {
    return {{"vocab_size", t.vocab_size},
            {"hidden_size", t.hidden_size},
            {"intermediate_size", t.intermediate_size},
            {"num_attention_heads", t.num_heads},
            {"num_key_value_heads", t.num_kv_heads},
            {"head_dim", t.head_dim},
            {"attn_output_gate", t.attn_output_gate},
            {"rope_theta", t.rope_theta},
            {"partial_rotary_factor", t.partial_rotary_factor},
            {"rotary_dim", t.rotary_dim},
            {"mrope_section", t.mrope_section},
            {"mrope_interleaved", t.mrope_interleaved},
            {"linear_num_key_heads", t.linear_num_key_heads},
            {"linear_num_value_heads", t.linear_num_value_heads},
            {"linear_key_head_dim", t.linear_key_head_dim},
            {"linear_value_head_dim", t.linear_value_head_dim},
            {"linear_conv_kernel_dim", t.linear_conv_kernel},
            {"rms_norm_eps", std::stod(fmt::format("{}", t.rms_norm_eps))},  // shortest float spelling
            {"tie_word_embeddings", t.tie_word_embeddings},
            {"max_position_embeddings", t.max_position_embeddings}};
}

json vision_json(const VisionConfig& v) {
    return {{"depth", v.depth},
            {"hidden_size", v.hidden_size},
            {"num_heads", v.num_heads},
            {"intermediate_size", v.intermediate_size},
            {"patch_size", v.patch_size},
            {"temporal_patch_size", v.temporal_patch_size},
            {"spatial_merge_size", v.spatial_merge_size},
            {"num_position_embeddings", v.num_position_embeddings},
            {"out_hidden_size", v.out_hidden_size},
            {"in_channels", v.in_channels},
            {"hidden_act", v.hidden_act}};
}

json head_json(const HeadConfig& h) {
    return {{"hidden_size", h.hidden_size}, {"width", h.width}, {"routing_layers", h.routing_layers},
            {"layers", h.layers},           {"heads", h.heads}, {"feedforward", h.feedforward}};
}

// Per component, plus the backbone layers subtotal and the total: tensors, actual, expected, match.
json parameters_json(const ModelInfo& info) {
    json params = json::object();
    int64_t layer_tensors = 0, total_tensors = 0;
    for (const ComponentInfo& ci : info.components) {
        params[ci.key] = {{"tensors", ci.tensors},
                          {"actual", ci.actual},
                          {"expected", ci.expected},
                          {"match", ci.matches()}};
        total_tensors += ci.tensors;
        if (ci.key == "linear_attention_layers" || ci.key == "full_attention_layers" ||
            ci.key == "final_norm")
            layer_tensors += ci.tensors;
    }
    params["backbone_layers"] = {{"tensors", layer_tensors},
                                 {"actual", info.actual.backbone_layers()},
                                 {"expected", info.expected.backbone_layers()},
                                 {"match", info.actual.backbone_layers() == info.expected.backbone_layers()}};
    params["total"] = {{"tensors", total_tensors},
                       {"actual", info.actual.total()},
                       {"expected", info.expected.total()},
                       {"match", info.actual.total() == info.expected.total()}};
    return params;
}

json dtypes_json(const ModelInfo& info) {
    json dtypes = json::object();
    for (const DTypeTally& d : info.dtypes)
        dtypes[d.dtype] = {{"tensors", d.tensors},
                           {"params", d.params},
                           {"bytes", d.bytes},
                           {"bits_per_weight", bits_per_weight(d.bytes, d.params)}};
    return dtypes;
}

json files_json(const ModelInfo& info) {
    json files = json::array();
    for (const FileEntry& f : info.files) {
        json e = {{"name", f.name}, {"role", f.role}, {"bytes", f.bytes}};
        if (f.tensors >= 0) e["tensors"] = f.tensors;
        files.push_back(e);
    }
    return files;
}

}  // namespace

nlohmann::json model_info_to_json(const ModelInfo& info) {
    const ModelConfig& c = info.config;
    json j;
    j["model_dir"] = info.dir.root;
    j["format"] = info.gguf ? "gguf" : "safetensors";
    if (info.gguf) j["gguf"] = gguf_json(*info.gguf);
    j["architecture"] = c.architecture;
    j["model_type"] = c.model_type;
    j["text_prefix"] = info.text_prefix;
    j["backbone_only"] = info.dir.backbone_only;
    j["layers"] = layers_json(info);
    j["text"] = text_json(c.text);
    j["vision"] = c.vision ? vision_json(*c.vision) : json(nullptr);
    j["head"] = info.head ? head_json(*info.head) : json(nullptr);
    j["parameters"] = parameters_json(info);
    j["counts_match"] = info.counts_match();
    j["dtypes"] = dtypes_json(info);
    j["files"] = files_json(info);
    j["warnings"] = info.warnings;
    return j;
}

namespace {

// A publisher-layout checkpoint of the config's shapes in BF16 (the published dtypes: model/tensors.h).
ModelSources bf16_sources(const ModelConfig& config, const HeadConfig* head) {
    ModelSources src;
    auto stored = [](const TensorSpec& s) -> std::optional<StoredTensor> {
        const uint64_t per = s.dtype == DType::BF16 || s.dtype == DType::F16 ? 2 : 4;
        return StoredTensor{stored_kind(s.dtype), per * static_cast<uint64_t>(s.numel()), false};
    };
    src.text = stored;
    if (config.vision) src.vision = stored;
    src.head_source_bytes = head ? static_cast<uint64_t>(head_params(*head)) * 2 : 0;
    return src;
}

// A GGUF of file type ft, each tensor in the type llama.cpp's rules give it (tools/gguf_types.h; an
// importance matrix assumed where a type needs one); the head's matrices Q8_0, read into fp32 at load.
ModelSources gguf_sources(const ModelConfig& config, const HeadConfig* head, GgufFileType ft) {
    GgufMixContext ctx;
    ctx.n_layers = config.text.num_layers;
    ctx.n_gqa = config.text.num_heads / std::max(1, config.text.num_kv_heads);
    ctx.has_output = !config.text.tie_word_embeddings;
    ctx.has_imatrix = true;
    ModelSources src;
    src.text = [ft, ctx](const TensorSpec& s) -> std::optional<StoredTensor> {
        const std::vector<uint64_t> dims = gguf_dims(s);
        const uint32_t type = gguf_tensor_type(s.gguf, dims, ft, ctx);
        const GgmlTypeTraits t = ggml_type_traits(type);
        const uint64_t rows = static_cast<uint64_t>(s.numel()) / dims[0];
        return StoredTensor{stored_kind_ggml(type), rows * ggml_row_bytes(t, dims[0]), true};
    };
    const uint64_t hp = head ? static_cast<uint64_t>(head_params(*head)) : 0;
    src.head_source_bytes = hp * 4 + hp * 34 / 32;
    return src;
}

double mib(uint64_t bytes) {
    return static_cast<double>(bytes) / (1 << 20);
}

}  // namespace

MemoryPlan config_memory_plan(const ModelConfig& config, const HeadConfig* head, const std::string& build,
                              const MemoryPlanInput& in) {
    ModelSources src;
    GgufFileType ft{};
    if (build == "bf16" || build == "safetensors")
        src = bf16_sources(config, head);
    else if (parse_gguf_file_type(build, ft))
        src = gguf_sources(config, head, ft);
    else
        throw Error("--type: unknown build type '" + build +
                    "' (bf16 for the publisher's safetensors, or a GGUF "
                    "file type such as q8_0, q4_k_m, iq2_m)");
    // tokenizer.json of the Qwen3.5 vocabulary: a token and a merge per entry (kTokenizerPerEntry each).
    src.tokenizer_bytes = kTokenizerPerEntry * 2 * static_cast<uint64_t>(config.text.vocab_size);
    src.tokenizer_ids = config.text.vocab_size;
    return plan_memory(config, head, src, in);
}

std::string format_memory_plan(const MemoryPlan& p) {
    const MemoryPlanInput& in = p.input;
    const WeightMemory& w = p.weights;
    const DecisionMemory& d = p.decision;
    std::ostringstream o;
    auto row = [&o](std::string_view label, uint64_t bytes, std::string_view what) {
        o << fmt::format("  {:<24}{:>12.1f} MiB  {}\n", label, mib(bytes), what);
    };
    o << fmt::format("memory plan for {} tokens (MiB = 2^20 bytes)\n", with_thousands(in.tokens));
    o << fmt::format(
        "  {:<24}chunk {} tokens, {} questions, {} options ({} option tokens), {} schema tokens, "
        "state cache {}\n",
        "assumes", with_thousands(d.chunk), in.questions, in.options, in.option_tokens, in.schema_tokens,
        in.cache_bytes ? fmt::format("on ({:.0f} MiB budget)", mib(in.cache_bytes)) : "off");
    row("weights mapped", w.mapped,
        w.streamed ? "projections streamed from the file" : "projections in place");
    row("weights packed", w.packed, "projections packed in memory");
    row("weights vectors", w.vectors, "norms, conv taps, decays (fp32)");
    row("embedding rows", w.embedding_rows, "table rows of the distinct tokens and option tokens (at most)");
    row("joint head", w.head, "fp32 panels and k/v rows");
    if (w.vision) row("vision tower", w.vision, "packed");
    row("tokenizer", w.tokenizer, "vocabulary and merges (estimated from the file)");
    row("runtime", w.runtime, "the binary and its libraries");
    row("weights total", w.total(), "");
    row("K/V cache", d.kv_cache,
        in.backbone.kv_bf16 ? "full-attention K and V, bf16, N rows"
                            : "full-attention K and V, fp32, N rows");
    row("recurrent states", d.recurrent, "GDN conv taps and delta-rule states");
    row("chunk buffers", d.chunk_buffers, "input, residual, norms, mixer output, RoPE tables of one chunk");
    row("layer scratch", d.layer_scratch, "the largest layer's buffers (GDN, attention or MLP; one chunk)");
    row("gemm scratch", d.gemm_scratch, "per-thread GEMM buffers");
    row("head features", d.head_features, "memory rows [N][width], span sums and means");
    row("head scratch", d.head_scratch, "normalised memory, attention scores over N rows");
    row("state cache", d.state_cache, "this prompt's snapshots (capped by the budget)");
    row("prompt", d.prompt, "token ids and copies");
    row("heap retained", d.heap_retained, "freed heap blocks kept at the peak");
    row("decision peak", d.peak, "the largest total over the prefill and head phases");
    row("load peak", p.load_peak(), "weights + the head's source while it loads");
    row("total peak", p.peak(), "weights + decision peak, or the load peak");
    return o.str();
}

nlohmann::json memory_plan_to_json(const MemoryPlan& p) {
    const MemoryPlanInput& in = p.input;
    const WeightMemory& w = p.weights;
    const DecisionMemory& d = p.decision;
    return {{"tokens", in.tokens},
            {"chunk", d.chunk},
            {"assumptions",
             {{"schema_tokens", in.schema_tokens},
              {"questions", in.questions},
              {"options", in.options},
              {"option_tokens", in.option_tokens},
              {"state_cache_bytes", in.cache_bytes},
              {"unpack_quantised", in.unpack_quantised}}},
            {"weights",
             {{"mapped", w.mapped},
              {"packed", w.packed},
              {"vectors", w.vectors},
              {"embedding_rows", w.embedding_rows},
              {"head", w.head},
              {"vision", w.vision},
              {"tokenizer", w.tokenizer},
              {"runtime", w.runtime},
              {"load_transient", w.load_transient},
              {"streamed", w.streamed},
              {"total", w.total()}}},
            {"decision",
             {{"kv_cache", d.kv_cache},
              {"recurrent", d.recurrent},
              {"chunk_buffers", d.chunk_buffers},
              {"layer_scratch", d.layer_scratch},
              {"gemm_scratch", d.gemm_scratch},
              {"head_features", d.head_features},
              {"head_scratch", d.head_scratch},
              {"state_cache", d.state_cache},
              {"prompt", d.prompt},
              {"heap_retained", d.heap_retained},
              {"peak", d.peak}}},
            {"load_peak", p.load_peak()},
            {"peak", p.peak()}};
}

}  // namespace clef
