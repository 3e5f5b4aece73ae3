#include "model/gguf_model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "io/model_dir.h"
#include "model/gguf_keys.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

// Permutes Hv consecutive blocks of `block` floats between HF order (grouped by key head: h = k*r + v) and
// GGUF order (tiled: p = v*Hk + k).
void permute_heads(float* seg, const GdnHeads& g, int64_t block, bool to_gguf) {
    if (g.hk <= 0 || g.hv % g.hk != 0) throw Error("value heads are not a multiple of key heads");
    const int64_t r = g.hv / g.hk;
    if (r == 1) return;
    std::vector<float> tmp(seg, seg + g.hv * block);
    for (int64_t dst = 0; dst < g.hv; ++dst) {
        const int64_t src = to_gguf ? (dst % g.hk) * r + dst / g.hk : (dst % r) * g.hk + dst / r;
        std::memcpy(seg + dst * block, tmp.data() + src * block, static_cast<size_t>(block) * sizeof(float));
    }
}

// Applies a backbone transform in place; shape is the HF shape (conv1d: [C, 1, K]).
void transform(GgufLayout xf, std::vector<float>& x, const std::vector<int64_t>& shape, const GdnHeads& g,
               bool to_gguf, const std::string& name) {
    auto need = [&](bool ok) {
        if (!ok) throw Error(name + ": shape does not match the linear-attention head layout of the config");
    };
    const int64_t cols = shape.size() >= 2 ? shape.back() : 1;
    switch (xf) {
        case GgufLayout::Same:
        case GgufLayout::Split:
        case GgufLayout::Scales:
        case GgufLayout::PatchFrame:
            return;
        case GgufLayout::NormPlus1:
            for (float& v : x) v = to_gguf ? v + 1.f : v - 1.f;
            return;
        case GgufLayout::ALog:
            need(static_cast<int64_t>(x.size()) == g.hv);
            if (to_gguf) {
                for (float& v : x) v = -std::exp(v);
                permute_heads(x.data(), g, 1, true);
            } else {
                permute_heads(x.data(), g, 1, false);
                for (float& v : x) v = std::log(-v);
            }
            return;
        case GgufLayout::VHeads1:
            need(static_cast<int64_t>(x.size()) == g.hv * cols);
            permute_heads(x.data(), g, cols, to_gguf);
            return;
        case GgufLayout::VHeadRows:
            need(static_cast<int64_t>(x.size()) == g.hv * g.dv * cols);
            permute_heads(x.data(), g, g.dv * cols, to_gguf);
            return;
        case GgufLayout::QkvRows:
            need(static_cast<int64_t>(x.size()) == (2 * g.hk * g.dk + g.hv * g.dv) * cols);
            permute_heads(x.data() + 2 * g.hk * g.dk * cols, g, g.dv * cols, to_gguf);
            return;
        case GgufLayout::ConvV: {
            const int64_t k = shape.back();
            need(static_cast<int64_t>(x.size()) == (2 * g.hk * g.dk + g.hv * g.dv) * k);
            permute_heads(x.data() + 2 * g.hk * g.dk * k, g, g.dv * k, to_gguf);
            return;
        }
        case GgufLayout::VHeadCols: {
            need(cols == g.hv * g.dv);
            const int64_t rows = static_cast<int64_t>(x.size()) / cols;
            for (int64_t r = 0; r < rows; ++r) permute_heads(x.data() + r * cols, g, g.dv, to_gguf);
            return;
        }
    }
}

std::vector<int64_t> reversed(const std::vector<uint64_t>& d) {
    std::vector<int64_t> s;
    for (auto it = d.rbegin(); it != d.rend(); ++it) s.push_back(static_cast<int64_t>(*it));
    return s;
}

void require_supported(const GgufFile& f, const GgufTensorInfo& t) {
    if (!ggml_type_traits(t.ggml_type).supported)
        throw Error(
            fmt::format("{}: tensor '{}' has ggml type {}, which clef does not support (supported: {})",
                        f.path(), t.name, ggml_type_name(t.ggml_type), readable_ggml_types()));
}

// Dequantises a whole GGUF tensor to fp32.
std::vector<float> dequantize_tensor(const GgufFile& f, const GgufTensorInfo& t) {
    require_supported(f, t);
    const GgmlTypeTraits tt = ggml_type_traits(t.ggml_type);
    std::vector<float> out(t.n_elements());
    const int64_t k = static_cast<int64_t>(t.row_length()), rows = static_cast<int64_t>(t.n_rows());
    const uint64_t rb = ggml_row_bytes(tt, static_cast<uint64_t>(k));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
        dequantize_row_f32(static_cast<GgmlType>(t.ggml_type), t.data + r * rb, out.data() + r * k, k);
    return out;
}
// A GGUF matrix as a QuantMatrix in HF layout: the value-head tiling of the transform xf undone by row /
// column-group maps (HF head h is GGUF head (h % r) * Hk + h / r, as permute_heads).
QuantMatrix hf_matrix(const std::shared_ptr<GgufFile>& f, const GgufTensorInfo& t, GgufLayout xf,
                      const GdnHeads& g) {
    QuantMatrix q;
    q.type = static_cast<GgmlType>(t.ggml_type);
    q.data = t.data;
    q.rows = static_cast<int64_t>(t.n_rows());
    q.cols = static_cast<int64_t>(t.row_length());
    q.owner = f;
    q.file_mapped = true;  // GgufFile maps the file read-only
    if (xf == GgufLayout::Same) return q;
    if (g.hk <= 0 || g.hv % g.hk != 0)
        throw Error(f->path() + ": value heads are not a multiple of key heads");
    const int64_t r = g.hv / g.hk;
    if (r == 1) return q;  // one value head per key head: tiled and grouped orders agree
    std::vector<int64_t> heads(static_cast<size_t>(g.hv));
    for (int64_t h = 0; h < g.hv; ++h) heads[h] = (h % r) * g.hk + h / r;
    auto need = [&](bool ok) {
        if (!ok)
            throw Error(f->path() + ": " + t.name +
                        ": shape does not match the linear-attention head layout");
    };
    // Rows [first, first + Hv*per) are Hv heads of `per` rows.
    auto head_rows = [&](int64_t first, int64_t per) {
        need(q.rows == first + g.hv * per);
        q.row_map.resize(static_cast<size_t>(q.rows));
        for (int64_t i = 0; i < first; ++i) q.row_map[i] = i;
        for (int64_t h = 0; h < g.hv; ++h)
            for (int64_t i = 0; i < per; ++i) q.row_map[first + h * per + i] = first + heads[h] * per + i;
    };
    switch (xf) {
        case GgufLayout::QkvRows:
            head_rows(2 * g.hk * g.dk, g.dv);
            break;
        case GgufLayout::VHeadRows:
            head_rows(0, g.dv);
            break;
        case GgufLayout::VHeads1:
            head_rows(0, 1);
            break;
        case GgufLayout::VHeadCols:
            need(q.cols == g.hv * g.dv);
            q.col_group = g.dv;
            q.col_map = heads;
            break;
        default:
            throw Error(f->path() + ": " + t.name + ": no row-wise form of this transform");
    }
    return q;
}

int64_t meta_int(const GgufFile& f, const std::string& key) {
    return f.get_int(key);
}

const GgufTensorInfo& find_tensor(const GgufFile& f, const std::string& name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) throw Error(f.path() + ": missing tensor " + name);
    return *t;
}

// The HF shape of a GGUF tensor (conv taps {K, C} -> [C, 1, K]).
std::vector<int64_t> hf_shape(const GgufFile& f, const GgufTensorInfo& t, GgufLayout layout) {
    std::vector<int64_t> shape = reversed(t.dims);
    if (layout != GgufLayout::ConvV) return shape;
    if (shape.size() != 2) throw Error(f.path() + ": " + t.name + " is not 2-D");
    return {shape[0], 1, shape[1]};
}

// One backbone tensor of the table into the source: in place, as a row-mapped matrix, or as fp32.
void add_text_tensor(const std::shared_ptr<GgufFile>& f, const TensorSpec& s, const GdnHeads& g,
                     WeightSource& out) {
    const GgufTensorInfo& t = find_tensor(*f, s.gguf);
    const std::vector<int64_t> shape = hf_shape(*f, t, s.layout);
    if (gguf_float_type(t) && s.layout == GgufLayout::Same) {
        out.add_view(gguf_tensor_view(*f, t, s.hf));
        return;
    }
    require_supported(*f, t);
    // Matrices in a block format (and float ones with a tiled layout) stay in the file, read row by row.
    const bool matrix = t.dims.size() == 2 && t.dims[1] > 1 && s.layout != GgufLayout::ConvV;
    if (matrix && (ggml_type_traits(t.ggml_type).block_size > 1 || gguf_float_type(t))) {
        out.add_matrix(s.hf, hf_matrix(f, t, s.layout, g));
        return;
    }
    std::vector<float> x = dequantize_tensor(*f, t);
    transform(s.layout, x, shape, g, false, s.gguf);
    out.add_f32(s.hf, shape, std::move(x));
}

// The joint head of a clef file, as fp32 under the reference state-dict names.
std::unique_ptr<WeightSource> gguf_head(const GgufFile& f, const HeadConfig& hc) {
    auto out = std::make_unique<WeightSource>();
    out->set_description(f.path() + " (joint head)");
    std::map<std::string, std::vector<float>> packed;  // the parts of split in-projections gathered so far
    for_each_head_tensor(hc, [&](const TensorSpec& s) {
        if (s.layout == GgufLayout::Scales) {  // the three scalars are one GGUF vector
            const GgufTensorInfo& t = find_tensor(f, s.gguf);
            if (t.n_elements() != 3) throw Error(f.path() + ": " + s.gguf + " must hold 3 values");
            const std::vector<float> v = dequantize_tensor(f, t);
            if (!(v[0] > 0 && v[1] > 0 && v[2] > 0 && v[2] < 1))
                throw Error(f.path() + ": " + s.gguf +
                            " must hold exp(prior) > 0, exp(joint) > 0, sigmoid(gate)");
            const float x = v[s.slice];
            out->add_f32(s.hf, {}, {s.slice < 2 ? std::log(x) : std::log(x / (1 - x))});
            return;
        }
        const GgufTensorInfo& t = find_tensor(f, s.gguf);
        std::vector<float> x = dequantize_tensor(f, t);
        if (s.layout != GgufLayout::Split) {
            out->add_f32(s.hf, reversed(t.dims), std::move(x));
            return;
        }
        if (static_cast<int64_t>(x.size()) * 3 != s.numel())
            throw Error(f.path() + ": " + s.gguf + " is not a third of " + s.hf + " " + shape_str(s.shape));
        std::vector<float>& p = packed[s.hf];
        p.insert(p.end(), x.begin(), x.end());
        if (s.slice == 2) out->add_f32(s.hf, s.shape, std::exchange(p, {}));
    });
    return out;
}

// The head files beside a qwen35 file (or in head_dir).
void add_head_dir(GgufModel& m, const std::string& head_dir) {
    std::string dir = head_dir.empty() ? fs::path(m.path).parent_path().string() : head_dir;
    if (dir.empty()) dir = ".";
    const std::string hw = dir + "/joint_head.safetensors", hcfg = dir + "/joint_head_config.json";
    if (fs::exists(hw) && fs::exists(hcfg)) {
        m.head_config = load_head_config(hcfg);
        m.head = std::make_unique<WeightSource>(SafetensorsFile::open(hw));
    } else if (!head_dir.empty()) {
        throw Error(head_dir + ": no joint_head.safetensors + joint_head_config.json");
    }
}

}  // namespace

bool gguf_float_type(const GgufTensorInfo& t) {
    const auto type = static_cast<GgmlType>(t.ggml_type);
    return type == GgmlType::BF16 || type == GgmlType::F16 || type == GgmlType::F32;
}

TensorView gguf_tensor_view(const GgufFile& f, const GgufTensorInfo& t, std::string name) {
    const auto type = static_cast<GgmlType>(t.ggml_type);
    if (!gguf_float_type(t)) throw Error(f.path() + ": " + t.name + " is not f32, f16 or bf16");
    TensorView v;
    v.name = std::move(name);
    v.dtype = type == GgmlType::BF16 ? DType::BF16 : type == GgmlType::F16 ? DType::F16 : DType::F32;
    v.shape = reversed(t.dims);
    v.data = t.data;
    v.nbytes = static_cast<size_t>(t.n_elements()) * dtype_size(v.dtype);
    v.file = f.path();
    v.mapped = true;
    return v;
}

std::vector<float> gguf_tensor_f32(const GgufFile& f, const GgufTensorInfo& t) {
    return dequantize_tensor(f, t);
}

GdnHeads gdn_heads(const TextConfig& c) {
    return {c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim};
}

void to_gguf_layout(GgufLayout layout, std::vector<float>& x, const std::vector<int64_t>& shape,
                    const GdnHeads& g, const std::string& name) {
    transform(layout, x, shape, g, true, name);
}

std::vector<uint64_t> gguf_dims(const TensorSpec& s) {
    std::vector<uint64_t> dims;
    if (s.layout == GgufLayout::ConvV)
        return {static_cast<uint64_t>(s.shape[2]), static_cast<uint64_t>(s.shape[0])};
    if (s.layout == GgufLayout::Scales) return {3};
    if (s.layout == GgufLayout::PatchFrame)  // [H, C, T, P, P] -> one frame {P, P, C, H}
        return {static_cast<uint64_t>(s.shape[4]), static_cast<uint64_t>(s.shape[3]),
                static_cast<uint64_t>(s.shape[1]), static_cast<uint64_t>(s.shape[0])};
    for (auto it = s.shape.rbegin(); it != s.shape.rend(); ++it) dims.push_back(static_cast<uint64_t>(*it));
    if (dims.empty()) dims.push_back(1);
    if (s.layout == GgufLayout::Split) dims.back() /= 3;
    return dims;
}

namespace {

// The fields of a metadata table's rows (model/gguf_keys.h) under prefix A from the file into `config` (JSON
// pointers into it): the RoPE scaling's rows when `scaling`, the others otherwise. A required key must be
// there; an optional one is read where it is.
template <class Config>
void read_keys(const GgufFile& f, const std::string& A, std::span<const GgufMetaKey<Config>> keys,
               bool scaling, nlohmann::json& config) {
    for (const GgufMetaKey<Config>& k : keys) {
        const std::string key = A + k.name;
        if (!k.field || ((k.uses & kGgufScaling) != 0) != scaling) continue;
        if (!(k.uses & kGgufRequired) && !f.contains(key)) continue;
        nlohmann::json& v = config[nlohmann::json::json_pointer(k.field)];
        switch (k.type) {
            case GgufKeyType::UInt32:
                v = meta_int(f, key);
                break;
            case GgufKeyType::Float32:
                v = f.get_float(key);
                break;
            case GgufKeyType::String:
                v = f.get_string(key);
                break;
            case GgufKeyType::Int32Array:
                v = f.get_int_array(key);
                break;
        }
    }
}

// llama.cpp's rope.scaling keys under A back into transformers' rope_parameters in text config tc: none,
// linear and yarn (what clef convert writes: tools/gguf_convert.cpp); config parsing validates the values.
void read_rope_scaling(const GgufFile& f, const std::string& A, nlohmann::json& tc) {
    const std::string P = A + gguf_key::kRopeScalingType, M = A + gguf_key::kRopeScalingLogMultiplier;
    const std::string type = f.get_string(P, "none");
    if (type == "none") return;
    if (type != "linear" && type != "yarn")
        throw Error(f.path() + ": " + P + " '" + type + "' is not supported (none, linear or yarn)");
    if (f.contains(M) && f.get_float(M) != 0) throw Error(f.path() + ": " + M + " is not supported");
    read_keys(f, A, gguf_text_keys(), true, tc);
}

// config.json's text_config from the backbone's keys under A and the embedding table's shape.
nlohmann::json text_config_json(const GgufFile& f, const std::string& A) {
    const std::string embd_name = text_gguf_name(TextWeight::Embed);
    const GgufTensorInfo* embd = f.find_tensor(embd_name);
    if (!embd || embd->dims.size() != 2) throw Error(f.path() + ": missing 2-D tensor " + embd_name);
    nlohmann::json tc = {{"model_type", "qwen3_5_text"},
                         {"rope_parameters", {{"rope_type", "default"}, {"mrope_interleaved", true}}}};
    read_keys(f, A, gguf_text_keys(), false, tc);
    const int64_t n_layers = tc["num_hidden_layers"], interval = tc["full_attention_interval"];
    if (n_layers <= 0 || n_layers > 4096 || interval <= 0)
        throw Error(f.path() + ": bad block_count / full_attention_interval");
    // The fields llama.cpp's keys give back through others: the rotary fraction of the key length, three
    // MRoPE sections of four, the value head width from all value heads' and their count.
    const int64_t head_dim = tc["head_dim"], rot = meta_int(f, A + gguf_key::kRopeDimensionCount);
    std::vector<int64_t> sec = f.get_int_array(A + gguf_key::kRopeDimensionSections);
    sec.resize(3, 0);
    nlohmann::json& rp = tc["rope_parameters"];
    rp["partial_rotary_factor"] = head_dim > 0 ? static_cast<double>(rot) / head_dim : 0.0;
    rp["mrope_section"] = sec;
    read_rope_scaling(f, A, tc);
    const int64_t hv = tc["linear_num_value_heads"];
    tc["linear_value_head_dim"] = hv > 0 ? meta_int(f, A + gguf_key::kSsmInnerSize) / hv : 0;
    if (!tc.contains("max_position_embeddings")) tc["max_position_embeddings"] = 262144;
    tc["vocab_size"] = embd->dims[1];
    tc["tie_word_embeddings"] = f.find_tensor(text_gguf_name(TextWeight::LmHead)) == nullptr;
    return tc;
}

// joint_head_config.json from the head's keys under A and its tensors' shapes (the width of the memory
// projection, the feed-forward width of the first layer).
HeadConfig head_config_of(const GgufFile& f, const std::string& A, const TextConfig& c) {
    const ModuleIndex names = head_module_names();
    const std::string mem_name = names.at(HeadModule::MemoryProjection).gguf,
                      up_name = names.at(HeadModule::FeedforwardIn, 0).gguf;  // dec.blk.0's
    const GgufTensorInfo* mem = f.find_tensor(mem_name);
    const GgufTensorInfo* up = f.find_tensor(up_name);
    if (!mem || !up || mem->dims.size() != 2 || up->dims.size() != 2)
        throw Error(f.path() + ": missing head tensors " + mem_name + " / " + up_name);
    nlohmann::json hj = {
        {"hidden_size", c.hidden_size}, {"width", mem->dims[1]}, {"feedforward", up->dims[1]}};
    read_keys(f, A, gguf_head_keys(), false, hj);
    return parse_head_config(hj.dump(), f.path() + " (decision metadata)");
}

}  // namespace

GgufModelConfig read_gguf_model_config(const GgufFile& f) {
    GgufModelConfig m;
    m.arch = f.get_string(gguf_general::kArchitecture);
    if (m.arch != "clef" && m.arch != "qwen35")
        throw Error(f.path() + ": " + gguf_general::kArchitecture + " '" + m.arch +
                    "' is not supported (clef or qwen35)");
    const std::string A = m.arch + ".";
    const nlohmann::json cj = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                               {"model_type", "qwen3_5"},
                               {"text_config", text_config_json(f, A)}};
    m.config = parse_model_config(cj.dump(), f.path() + " (metadata)");
    if (m.arch == "clef") m.head_config = head_config_of(f, A, m.config.text);
    return m;
}

GgufModel load_gguf_model(const std::string& path, const std::string& head_dir) {
    auto f = std::make_shared<GgufFile>(GgufFile::open(path));
    GgufModel m;
    m.path = path;
    GgufModelConfig mc = read_gguf_model_config(*f);
    m.arch = mc.arch;
    m.config = std::move(mc.config);
    m.head_config = std::move(mc.head_config);
    for (const GgufTensorInfo& t : f->tensors()) ++m.tensors_per_type[ggml_type_name(t.ggml_type)];
    const TextConfig& c = m.config.text;
    m.weights.set_description(path);
    m.weights.keep_alive(f);
    const GdnHeads g = gdn_heads(c);
    for_each_text_tensor(c, f->find_tensor(text_gguf_name(TextWeight::LmHead)) != nullptr,
                         [&](const TensorSpec& s) { add_text_tensor(f, s, g, m.weights); });
    if (m.arch == "clef")
        m.head = gguf_head(*f, *m.head_config);
    else
        add_head_dir(m, head_dir);
    if (m.head_config && m.head_config->hidden_size != c.hidden_size)
        throw Error(path + ": the head's hidden_size " + std::to_string(m.head_config->hidden_size) +
                    " does not match the backbone's " + std::to_string(c.hidden_size));
    return m;
}

}  // namespace clef
