#include "model/model_inventory.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <string_view>

#include "io/gguf.h"
#include "model/gguf_keys.h"
#include "model/gguf_model.h"
#include "model/serve_plan.h"
#include "model/tensors.h"
#include "quant/file_type.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/mmap.h"
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
    if (f.contains(gguf_general::kFileType)) {
        g.file_type = f.get_int(gguf_general::kFileType);
        g.file_type_name = llama_file_type_name(g.file_type);
    }
    if (f.contains(gguf_general::kQuantizationVersion))
        g.quantization_version = f.get_int(gguf_general::kQuantizationVersion);
    if (const std::string key = g.arch + "." + gguf_key::kContextLength; f.contains(key))
        g.context_length = f.get_int(key);

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

}  // namespace clef
