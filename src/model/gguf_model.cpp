#include "model/gguf_model.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "io/model_dir.h"
#include "io/safetensors_writer.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/half.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "model.language_model.";

// How a tensor differs between the HF and the GGUF convention.
enum class Xf {
    None,
    NormPlus1,   // GGUF = HF + 1
    ALog,        // GGUF ssm_a = -exp(A_log), V heads tiled
    VHeads1,     // rows / elements are V heads (in_proj_a, in_proj_b, dt_bias): tiled
    VHeadRows,   // rows are V heads of dv rows (in_proj_z): tiled
    QkvRows,     // in_proj_qkv: the V part of the rows tiled
    ConvV,       // conv1d [C,1,K] <-> {K, C}: the V channels tiled
    VHeadCols,   // out_proj: input columns are V heads of dv columns: tiled
    Split,       // one third (part) of a packed [3W, ...] HF tensor
    Scales,      // the head's three scalars <-> decision.scales
};

struct Entry {
    std::string hf;
    std::string gguf;
    Xf xf = Xf::None;
    int part = 0;  // Split: 0 q, 1 k, 2 v
};

struct Geometry {
    int64_t hk = 0, hv = 0, dk = 0, dv = 0;
};

Geometry geometry(const TextConfig& c) {
    return {c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim};
}

// Permutes Hv consecutive blocks of `block` floats between HF order (grouped by key head: h = k*r + v) and
// GGUF order (tiled: p = v*Hk + k).
void permute_heads(float* seg, const Geometry& g, int64_t block, bool to_gguf) {
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
void transform(Xf xf, std::vector<float>& x, const std::vector<int64_t>& shape, const Geometry& g, bool to_gguf,
               const std::string& name) {
    auto need = [&](bool ok) {
        if (!ok) throw Error(name + ": shape does not match the linear-attention head layout of the config");
    };
    const int64_t cols = shape.size() >= 2 ? shape.back() : 1;
    switch (xf) {
        case Xf::None:
        case Xf::Split:
        case Xf::Scales: return;
        case Xf::NormPlus1:
            for (float& v : x) v = to_gguf ? v + 1.f : v - 1.f;
            return;
        case Xf::ALog:
            need(static_cast<int64_t>(x.size()) == g.hv);
            if (to_gguf) {
                for (float& v : x) v = -std::exp(v);
                permute_heads(x.data(), g, 1, true);
            } else {
                permute_heads(x.data(), g, 1, false);
                for (float& v : x) v = std::log(-v);
            }
            return;
        case Xf::VHeads1:
            need(static_cast<int64_t>(x.size()) == g.hv * cols);
            permute_heads(x.data(), g, cols, to_gguf);
            return;
        case Xf::VHeadRows:
            need(static_cast<int64_t>(x.size()) == g.hv * g.dv * cols);
            permute_heads(x.data(), g, g.dv * cols, to_gguf);
            return;
        case Xf::QkvRows:
            need(static_cast<int64_t>(x.size()) == (2 * g.hk * g.dk + g.hv * g.dv) * cols);
            permute_heads(x.data() + 2 * g.hk * g.dk * cols, g, g.dv * cols, to_gguf);
            return;
        case Xf::ConvV: {
            const int64_t k = shape.back();
            need(static_cast<int64_t>(x.size()) == (2 * g.hk * g.dk + g.hv * g.dv) * k);
            permute_heads(x.data() + 2 * g.hk * g.dk * k, g, g.dv * k, to_gguf);
            return;
        }
        case Xf::VHeadCols: {
            need(cols == g.hv * g.dv);
            const int64_t rows = static_cast<int64_t>(x.size()) / cols;
            for (int64_t r = 0; r < rows; ++r) permute_heads(x.data() + r * cols, g, g.dv, to_gguf);
            return;
        }
    }
}

std::vector<Entry> backbone_entries(const TextConfig& c, bool with_output) {
    std::vector<Entry> e;
    const std::string P = kPrefix;
    e.push_back({P + "embed_tokens.weight", "token_embd.weight"});
    e.push_back({P + "norm.weight", "output_norm.weight", Xf::NormPlus1});
    if (with_output) e.push_back({"lm_head.weight", "output.weight"});
    for (int i = 0; i < c.num_layers; ++i) {
        const std::string h = P + "layers." + std::to_string(i) + ".", b = "blk." + std::to_string(i) + ".";
        e.push_back({h + "input_layernorm.weight", b + "attn_norm.weight", Xf::NormPlus1});
        e.push_back({h + "post_attention_layernorm.weight", b + "post_attention_norm.weight", Xf::NormPlus1});
        if (c.layer_types[i] == LayerType::LinearAttention) {
            const std::string l = h + "linear_attn.";
            e.push_back({l + "in_proj_qkv.weight", b + "attn_qkv.weight", Xf::QkvRows});
            e.push_back({l + "in_proj_z.weight", b + "attn_gate.weight", Xf::VHeadRows});
            e.push_back({l + "in_proj_a.weight", b + "ssm_alpha.weight", Xf::VHeads1});
            e.push_back({l + "in_proj_b.weight", b + "ssm_beta.weight", Xf::VHeads1});
            e.push_back({l + "conv1d.weight", b + "ssm_conv1d.weight", Xf::ConvV});
            e.push_back({l + "dt_bias", b + "ssm_dt.bias", Xf::VHeads1});
            e.push_back({l + "A_log", b + "ssm_a", Xf::ALog});
            e.push_back({l + "norm.weight", b + "ssm_norm.weight"});
            e.push_back({l + "out_proj.weight", b + "ssm_out.weight", Xf::VHeadCols});
        } else {
            const std::string a = h + "self_attn.";
            e.push_back({a + "q_proj.weight", b + "attn_q.weight"});
            e.push_back({a + "k_proj.weight", b + "attn_k.weight"});
            e.push_back({a + "v_proj.weight", b + "attn_v.weight"});
            e.push_back({a + "o_proj.weight", b + "attn_output.weight"});
            e.push_back({a + "q_norm.weight", b + "attn_q_norm.weight", Xf::NormPlus1});
            e.push_back({a + "k_norm.weight", b + "attn_k_norm.weight", Xf::NormPlus1});
        }
        e.push_back({h + "mlp.gate_proj.weight", b + "ffn_gate.weight"});
        e.push_back({h + "mlp.up_proj.weight", b + "ffn_up.weight"});
        e.push_back({h + "mlp.down_proj.weight", b + "ffn_down.weight"});
    }
    return e;
}

void add_wb(std::vector<Entry>& e, const std::string& hf, const std::string& gguf) {
    e.push_back({hf + ".weight", gguf + ".weight"});
    e.push_back({hf + ".bias", gguf + ".bias"});
}

// Packed nn.MultiheadAttention: in_proj_{weight,bias} split into q/k/v, out_proj -> o.
void add_mha(std::vector<Entry>& e, const std::string& hf, const std::string& gguf) {
    const char* qkv[3] = {"q", "k", "v"};
    for (int p = 0; p < 3; ++p) {
        e.push_back({hf + ".in_proj_weight", gguf + "_" + qkv[p] + ".weight", Xf::Split, p});
        e.push_back({hf + ".in_proj_bias", gguf + "_" + qkv[p] + ".bias", Xf::Split, p});
    }
    add_wb(e, hf + ".out_proj", gguf + "_o");
}

std::vector<Entry> head_entries(const HeadConfig& h) {
    std::vector<Entry> e;
    add_wb(e, "hidden_norm", "decision.hidden_norm");
    const char* proj[][2] = {{"memory_projection", "proj_memory"},
                             {"question_projection", "proj_question"},
                             {"option_question_projection", "proj_option_question"},
                             {"global_projection", "proj_global"},
                             {"option_context_projection", "proj_option_context"},
                             {"option_lexical_projection", "proj_option_lexical"}};
    for (auto& p : proj) e.push_back({std::string(p[0]) + ".weight", std::string("decision.") + p[1] + ".weight"});
    e.push_back({"type_embedding.weight", "token_types.weight"});
    for (int n = 0; n < h.routing_layers; ++n) {
        const std::string s = "evidence_layers." + std::to_string(n) + ".", d = "dec.blk." + std::to_string(n) + ".";
        add_wb(e, s + "query_norm", d + "cross_attn_norm");
        add_wb(e, s + "memory_norm", d + "cross_attn_norm_kv");
        add_mha(e, s + "attention", d + "cross_attn");
        add_wb(e, s + "feedforward_norm", d + "ffn_norm");
        add_wb(e, s + "feedforward.0", d + "ffn_up");
        add_wb(e, s + "feedforward.3", d + "ffn_down");
    }
    add_wb(e, "option_summary_norm", "decision.option_summary_norm");
    for (int n = 0; n < h.layers; ++n) {
        const std::string s = "layers." + std::to_string(n) + ".",
                          d = "dec.blk." + std::to_string(n + h.routing_layers) + ".";
        add_wb(e, s + "norm1", d + "attn_norm");
        add_wb(e, s + "norm2", d + "cross_attn_norm");
        add_wb(e, s + "norm3", d + "ffn_norm");
        add_mha(e, s + "self_attn", d + "attn");
        add_mha(e, s + "multihead_attn", d + "cross_attn");
        add_wb(e, s + "linear1", d + "ffn_up");
        add_wb(e, s + "linear2", d + "ffn_down");
    }
    add_wb(e, "field_norm", "decision.field_norm");
    add_wb(e, "option_norm", "decision.option_norm");
    add_wb(e, "residual_scorer.0", "decision.scorer");
    add_wb(e, "residual_scorer.3", "decision.scorer_out");
    e.push_back({"prior_logit_scale", "decision.scales", Xf::Scales});
    return e;
}

bool is_head_name(const std::string& n) {
    return n.rfind("decision.", 0) == 0 || n.rfind("dec.blk.", 0) == 0 || n.rfind("token_types.", 0) == 0;
}

bool ends_with(const std::string& s, std::string_view suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third one between.
bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

int layer_of(const std::string& name) {
    if (name.rfind("blk.", 0) != 0) return -1;
    return std::atoi(name.c_str() + 4);
}

std::vector<int64_t> reversed(const std::vector<uint64_t>& d) {
    std::vector<int64_t> s;
    for (auto it = d.rbegin(); it != d.rend(); ++it) s.push_back(static_cast<int64_t>(*it));
    return s;
}

void require_supported(const GgufFile& f, const GgufTensorInfo& t) {
    if (!ggml_type_traits(t.ggml_type).supported)
        throw Error(fmt::format("{}: tensor '{}' has ggml type {}, which clef does not support (supported: f32, "
                                "f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K)",
                                f.path(), t.name, ggml_type_name(t.ggml_type)));
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

std::string temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "clef-gguf-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw Error("cannot create a temporary directory in " + fs::temp_directory_path().string());
    return tmpl;
}

// Writes sources to a private temporary safetensors file, maps it and removes the file (the mapping stays).
template <class Open>
auto materialise(const std::vector<TensorSource>& src, const char* stem, Open open) {
    const std::string dir = temp_dir();
    const std::string path = dir + "/" + stem + ".safetensors";
    try {
        write_safetensors(path, src);
        auto r = open(path);
        std::error_code ec;
        fs::remove_all(dir, ec);
        return r;
    } catch (...) {
        std::error_code ec;
        fs::remove_all(dir, ec);
        throw;
    }
}

TensorSource f32_source(std::string name, std::vector<int64_t> shape, std::function<std::vector<float>()> make) {
    TensorSource s;
    s.name = std::move(name);
    s.dtype = DType::F32;
    s.shape = std::move(shape);
    auto cache = std::make_shared<std::vector<float>>();
    s.fill = [make = std::move(make), cache](unsigned char* dst, uint64_t offset, size_t nbytes) {
        if (offset == 0) *cache = make();
        std::memcpy(dst, reinterpret_cast<const unsigned char*>(cache->data()) + offset, nbytes);
        if (offset + nbytes >= cache->size() * sizeof(float)) std::vector<float>().swap(*cache);
    };
    return s;
}

int64_t meta_int(const GgufFile& f, const std::string& key) { return f.get_int(key); }

// A GGUF matrix as a QuantMatrix in HF layout: the value-head tiling of the transform xf undone by row /
// column-group maps (HF head h is GGUF head (h % r) * Hk + h / r, as permute_heads).
QuantMatrix hf_matrix(const std::shared_ptr<GgufFile>& f, const GgufTensorInfo& t, Xf xf, const Geometry& g) {
    QuantMatrix q;
    q.type = static_cast<GgmlType>(t.ggml_type);
    q.data = t.data;
    q.rows = static_cast<int64_t>(t.n_rows());
    q.cols = static_cast<int64_t>(t.row_length());
    q.owner = f;
    q.file_mapped = true;  // GgufFile maps the file read-only
    if (xf == Xf::None) return q;
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
        case Xf::QkvRows:
            head_rows(2 * g.hk * g.dk, g.dv);
            break;
        case Xf::VHeadRows:
            head_rows(0, g.dv);
            break;
        case Xf::VHeads1:
            head_rows(0, 1);
            break;
        case Xf::VHeadCols:
            need(q.cols == g.hv * g.dv);
            q.col_group = g.dv;
            q.col_map = heads;
            break;
        default:
            throw Error(f->path() + ": " + t.name + ": no row-wise form of this transform");
    }
    return q;
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------
// File types and tensor types

bool parse_gguf_file_type(std::string_view s, GgufFileType& out) {
    std::string l(s);
    for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (l == "f16") out = GgufFileType::F16;
    else if (l == "bf16") out = GgufFileType::BF16;
    else if (l == "q8_0") out = GgufFileType::Q8_0;
    else if (l == "q4_k_m") out = GgufFileType::Q4_K_M;
    else if (l == "q5_k_m") out = GgufFileType::Q5_K_M;
    else if (l == "q6_k") out = GgufFileType::Q6_K;
    else return false;
    return true;
}

std::string llama_file_type_name(int64_t ftype) {
    // llama.h's llama_ftype (LLAMA_FTYPE_MOSTLY_* without the prefix); 4-6 and 33-35 are retired.
    static const std::map<int64_t, const char*> kNames = {
        {0, "F32"},     {1, "F16"},     {2, "Q4_0"},      {3, "Q4_1"},    {7, "Q8_0"},     {8, "Q5_0"},
        {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"},   {12, "Q3_K_M"}, {13, "Q3_K_L"},  {14, "Q4_K_S"},
        {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"},   {18, "Q6_K"},   {19, "IQ2_XXS"}, {20, "IQ2_XS"},
        {21, "Q2_K_S"}, {22, "IQ3_XS"}, {23, "IQ3_XXS"},  {24, "IQ1_S"},  {25, "IQ4_NL"},  {26, "IQ3_S"},
        {27, "IQ3_M"},  {28, "IQ2_S"},  {29, "IQ2_M"},    {30, "IQ4_XS"}, {31, "IQ1_M"},   {32, "BF16"},
        {36, "TQ1_0"},  {37, "TQ2_0"},  {38, "MXFP4_MOE"}};
    auto it = kNames.find(ftype);
    return it != kNames.end() ? it->second : "unknown (" + std::to_string(ftype) + ")";
}

const char* gguf_file_type_name(GgufFileType t) {
    switch (t) {
        case GgufFileType::F16: return "f16";
        case GgufFileType::BF16: return "bf16";
        case GgufFileType::Q8_0: return "q8_0";
        case GgufFileType::Q4_K_M: return "q4_k_m";
        case GgufFileType::Q5_K_M: return "q5_k_m";
        case GgufFileType::Q6_K: return "q6_k";
    }
    return "?";
}

namespace {
uint32_t llama_ftype(GgufFileType t) {
    switch (t) {
        case GgufFileType::F16: return 1;
        case GgufFileType::BF16: return 32;
        case GgufFileType::Q8_0: return 7;
        case GgufFileType::Q4_K_M: return 15;
        case GgufFileType::Q5_K_M: return 17;
        case GgufFileType::Q6_K: return 18;
    }
    return 0;
}
constexpr uint32_t T(GgmlType t) { return static_cast<uint32_t>(t); }
}  // namespace

uint32_t gguf_tensor_type(const std::string& name, const std::vector<uint64_t>& dims, GgufFileType ft,
                          int n_layers) {
    const bool matrix = dims.size() >= 2 && dims[1] > 1;
    if (!matrix || name == "decision.scales" || name.find("norm") != std::string::npos || ends_with(name, ".bias") ||
        ends_with(name, "ssm_a") || ends_with(name, "ssm_conv1d.weight"))
        return T(GgmlType::F32);
    uint32_t type;
    if (ft == GgufFileType::F16) {
        type = T(GgmlType::F16);
    } else if (ft == GgufFileType::BF16) {
        type = T(GgmlType::BF16);
    } else if (is_head_name(name)) {
        type = ends_with(name, "scorer_out.weight") ? T(GgmlType::BF16) : T(GgmlType::Q8_0);
    } else if (ft == GgufFileType::Q8_0) {
        type = T(GgmlType::Q8_0);
    } else if (ft == GgufFileType::Q6_K) {
        type = T(GgmlType::Q6_K);
    } else {  // q4_k_m / q5_k_m
        const uint32_t base = ft == GgufFileType::Q4_K_M ? T(GgmlType::Q4_K) : T(GgmlType::Q5_K);
        static const char* kQ8[] = {"attn_qkv.weight", "attn_gate.weight", "ssm_alpha.weight", "ssm_beta.weight",
                                    "ssm_out.weight",  "attn_q.weight",    "attn_k.weight",    "attn_v.weight",
                                    "attn_output.weight"};
        type = base;
        if (name == "output.weight") type = T(GgmlType::Q6_K);
        for (const char* s : kQ8)
            if (ends_with(name, std::string(".") + s)) type = T(GgmlType::Q8_0);
        if (ends_with(name, ".ffn_down.weight") && use_more_bits(layer_of(name), n_layers)) type = T(GgmlType::Q6_K);
    }
    // llama.cpp's fallback for rows that are not a whole number of blocks.
    const uint64_t k = dims[0];
    if (k % ggml_type_traits(type).block_size != 0) {
        if (type == T(GgmlType::Q4_K)) type = T(GgmlType::Q5_0);
        else if (type == T(GgmlType::Q5_K)) type = T(GgmlType::Q5_1);
        else if (type == T(GgmlType::Q6_K)) type = T(GgmlType::Q8_0);
        if (k % ggml_type_traits(type).block_size != 0) type = T(GgmlType::F16);
    }
    return type;
}

// ------------------------------------------------------------------------------------------------------------
// Convert

namespace {

void add_tokenizer_metadata(GgufWriter& w, const std::string& tokenizer_path, int vocab_size) {
    nlohmann::json j;
    try {
        std::ifstream in(tokenizer_path);
        j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
        throw Error(tokenizer_path + ": " + e.what());
    }
    const auto& model = j.at("model");
    if (model.value("type", "") != "BPE") throw Error(tokenizer_path + ": only BPE tokenizers can be converted");
    int n = vocab_size;
    std::vector<std::string> tokens(static_cast<size_t>(n));
    std::vector<int32_t> types(static_cast<size_t>(n), 0);
    for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) {
        const int id = it.value().get<int>();
        if (id < 0 || id >= n) throw Error(tokenizer_path + ": token id " + std::to_string(id) + " outside the vocabulary");
        tokens[id] = it.key();
        types[id] = 1;  // NORMAL
    }
    if (j.contains("added_tokens"))
        for (const auto& a : j["added_tokens"]) {
            const int id = a.at("id").get<int>();
            if (id < 0 || id >= n) throw Error(tokenizer_path + ": added token id " + std::to_string(id) + " outside the vocabulary");
            tokens[id] = a.at("content").get<std::string>();
            types[id] = a.value("special", false) ? 3 : 4;  // CONTROL / USER_DEFINED
        }
    for (int i = 0; i < n; ++i)
        if (types[i] == 0) {
            tokens[i] = "[PAD" + std::to_string(i) + "]";
            types[i] = 5;  // UNUSED
        }
    std::vector<std::string> merges;
    for (const auto& m : model.at("merges")) {
        if (m.is_string()) merges.push_back(m.get<std::string>());
        else merges.push_back(m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
    }
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen35");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_int32_array("tokenizer.ggml.token_type", types);
    w.add_string_array("tokenizer.ggml.merges", merges);
    auto id_of = [&](const std::string& t) -> int {
        for (int i = 0; i < n; ++i)
            if (tokens[i] == t) return i;
        return -1;
    };
    if (int eos = id_of("<|im_end|>"); eos >= 0) w.add_uint32("tokenizer.ggml.eos_token_id", eos);
    if (int pad = id_of("<|endoftext|>"); pad >= 0) w.add_uint32("tokenizer.ggml.padding_token_id", pad);
    w.add_bool("tokenizer.ggml.add_bos_token", false);
}

}  // namespace

ConvertSummary convert_to_gguf(const std::string& model_dir, const std::string& out_path, const ConvertOptions& opt) {
    if (opt.arch != "clef" && opt.arch != "qwen35")
        throw Error("--arch must be clef or qwen35, not '" + opt.arch + "'");
    ModelDir dir = locate_model_dir(model_dir);
    ModelConfig mc = load_model_config(dir.config_path);
    const TextConfig& c = mc.text;
    auto ck = std::make_shared<Checkpoint>(Checkpoint::open(dir.weights_path));
    const bool clef = opt.arch == "clef";
    std::optional<HeadConfig> hc;
    std::shared_ptr<SafetensorsFile> head;
    if (clef) {
        if (!dir.has_head()) throw Error(model_dir + ": --arch clef needs joint_head.safetensors and joint_head_config.json");
        hc = load_head_config(dir.head_config_path);
        head = std::make_shared<SafetensorsFile>(SafetensorsFile::open(dir.head_weights_path));
    }
    // Checkpoint prefix: the publisher's nested layout or a plain text model.
    std::string ck_prefix = kPrefix;
    if (!ck->find(ck_prefix + "embed_tokens.weight") && ck->find("model.embed_tokens.weight")) ck_prefix = "model.";

    const std::string A = opt.arch + ".";
    GgufWriter w;
    w.add_string("general.architecture", opt.arch);
    w.add_string("general.name", fs::path(model_dir).filename().string());
    w.add_uint32("general.file_type", llama_ftype(opt.type));
    w.add_uint32("general.quantization_version", 2);
    w.add_uint32(A + "block_count", c.num_layers);
    w.add_uint32(A + "context_length", c.max_position_embeddings);
    w.add_uint32(A + "embedding_length", c.hidden_size);
    w.add_uint32(A + "feed_forward_length", c.intermediate_size);
    w.add_uint32(A + "attention.head_count", c.num_heads);
    w.add_uint32(A + "attention.head_count_kv", c.num_kv_heads);
    w.add_uint32(A + "attention.key_length", c.head_dim);
    w.add_uint32(A + "attention.value_length", c.head_dim);
    w.add_float32(A + "attention.layer_norm_rms_epsilon", c.rms_norm_eps);
    w.add_float32(A + "rope.freq_base", static_cast<float>(c.rope_theta));
    w.add_uint32(A + "rope.dimension_count", c.rotary_dim);
    std::vector<int32_t> sections(c.mrope_section.begin(), c.mrope_section.end());
    sections.resize(4, 0);
    w.add_int32_array(A + "rope.dimension_sections", sections);
    int interval = 0;
    for (int i = 0; i < c.num_layers; ++i)
        if (c.layer_types[i] == LayerType::FullAttention) {
            interval = i + 1;
            break;
        }
    for (int i = 0; i < c.num_layers; ++i)
        if ((interval > 0 && (i + 1) % interval == 0) != (c.layer_types[i] == LayerType::FullAttention))
            throw Error(dir.config_path + ": layer_types is not periodic (full_attention_interval), which GGUF "
                                          "cannot describe");
    w.add_uint32(A + "full_attention_interval", interval);
    w.add_uint32(A + "ssm.conv_kernel", c.linear_conv_kernel);
    w.add_uint32(A + "ssm.state_size", c.linear_key_head_dim);
    w.add_uint32(A + "ssm.group_count", c.linear_num_key_heads);
    w.add_uint32(A + "ssm.time_step_rank", c.linear_num_value_heads);
    w.add_uint32(A + "ssm.inner_size", c.linear_num_value_heads * c.linear_value_head_dim);
    if (clef) {
        w.add_string(A + "decision.type", "clef");
        w.add_uint32(A + "decision.routing_block_count", hc->routing_layers);
        w.add_uint32(A + "decision.block_count", hc->layers);
        w.add_uint32(A + "decision.head_count", hc->heads);
        w.add_uint32(A + "decision.embedding_length", hc->width);
        w.add_uint32(A + "decision.feed_forward_length", hc->feedforward);
        w.add_float32(A + "attention.layer_norm_epsilon", 1e-5f);
    }
    add_tokenizer_metadata(w, dir.tokenizer_path, c.vocab_size);
    if (clef && !opt.chat_templates.empty()) {
        std::vector<std::string> names;
        for (const auto& [name, text] : opt.chat_templates) {
            w.add_string("tokenizer.chat_template." + name, text);
            names.push_back(name);
        }
        w.add_string_array("tokenizer.chat_templates", names);
    }

    ConvertSummary sum;
    const Geometry g = geometry(c);
    auto add = [&](const std::string& gname, std::vector<uint64_t> dims, std::function<std::vector<float>()> make) {
        const uint32_t type = gguf_tensor_type(gname, dims, opt.type, c.num_layers);
        const GgmlTypeTraits tt = ggml_type_traits(type);
        uint64_t n = 1;
        for (uint64_t d : dims) n *= d;
        const uint64_t k = dims[0], rows = n / k, rb = ggml_row_bytes(tt, k);
        ++sum.tensors_per_type[tt.name];
        w.add_tensor(gname, type, dims, rows * rb, [=](unsigned char* dst) {
            std::vector<float> x = make();
            if (x.size() != n) throw Error("element count mismatch");
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < static_cast<int64_t>(rows); ++r)
                quantize_row(static_cast<GgmlType>(type), x.data() + r * k, dst + r * rb, static_cast<int64_t>(k));
        });
    };

    const bool with_output = !c.tie_word_embeddings || ck->find("lm_head.weight");
    for (const Entry& e : backbone_entries(c, with_output)) {
        std::string src_name = e.hf;
        if (src_name.rfind(kPrefix, 0) == 0) src_name = ck_prefix + src_name.substr(std::strlen(kPrefix));
        const TensorView& tv = ck->get(src_name);
        std::vector<int64_t> shape = tv.shape;
        std::vector<uint64_t> dims;
        if (e.xf == Xf::ConvV) {
            if (shape.size() != 3 || shape[1] != 1) throw Error(tv.file + ": " + tv.name + " is not [C, 1, K]");
            dims = {static_cast<uint64_t>(shape[2]), static_cast<uint64_t>(shape[0])};
        } else {
            for (auto it = shape.rbegin(); it != shape.rend(); ++it) dims.push_back(static_cast<uint64_t>(*it));
            if (dims.empty()) dims.push_back(1);
        }
        add(e.gguf, dims, [ck, &tv, shape, xf = e.xf, g, name = tv.name] {
            std::vector<float> x = tv.to_f32();
            transform(xf, x, shape, g, true, name);
            return x;
        });
    }
    if (clef) {
        for (const Entry& e : head_entries(*hc)) {
            if (e.xf == Xf::Scales) {
                auto val = [head](const char* n) {
                    const TensorView* t = head->find(n);
                    if (!t || t->numel() != 1) throw Error(head->path() + ": missing scalar " + std::string(n));
                    return t->to_f32()[0];
                };
                const float ln100 = std::log(100.f);
                std::vector<float> s = {std::exp(std::min(val("prior_logit_scale"), ln100)),
                                        std::exp(std::min(val("joint_logit_scale"), ln100)),
                                        1.f / (1.f + std::exp(-val("residual_gate")))};
                add(e.gguf, {3}, [s] { return s; });
                continue;
            }
            const TensorView* tv = head->find(e.hf);
            if (!tv) throw Error(head->path() + ": missing tensor " + e.hf);
            std::vector<uint64_t> dims;
            for (auto it = tv->shape.rbegin(); it != tv->shape.rend(); ++it) dims.push_back(static_cast<uint64_t>(*it));
            if (e.xf == Xf::Split) {
                if (tv->shape.empty() || tv->shape[0] % 3 != 0) throw Error(head->path() + ": " + e.hf + " is not [3W, ...]");
                dims.back() /= 3;
            }
            add(e.gguf, dims, [head, tv, xf = e.xf, part = e.part] {
                std::vector<float> x = tv->to_f32();
                if (xf != Xf::Split) return x;
                const size_t third = x.size() / 3;
                return std::vector<float>(x.begin() + part * third, x.begin() + (part + 1) * third);
            });
        }
    }
    w.write(out_path, opt.progress);
    for (auto& [t, n] : sum.tensors_per_type) sum.tensors += n;
    std::error_code ec;
    sum.bytes = fs::file_size(out_path, ec);
    return sum;
}

// ------------------------------------------------------------------------------------------------------------
// Load

bool is_gguf_file(const std::string& path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return false;
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    char m[4] = {};
    const size_t n = std::fread(m, 1, 4, f);
    std::fclose(f);
    return n == 4 && std::memcmp(m, "GGUF", 4) == 0;
}

GgufModelConfig read_gguf_model_config(const GgufFile& file) {
    const GgufFile* f = &file;
    const std::string& path = file.path();
    GgufModelConfig m;
    m.arch = f->get_string("general.architecture");
    if (m.arch != "clef" && m.arch != "qwen35")
        throw Error(path + ": general.architecture '" + m.arch + "' is not supported (clef or qwen35)");
    const std::string A = m.arch + ".";

    // config.json equivalent.
    const GgufTensorInfo* embd = f->find_tensor("token_embd.weight");
    if (!embd || embd->dims.size() != 2) throw Error(path + ": missing 2-D tensor token_embd.weight");
    nlohmann::json tc;
    const int64_t n_layers = meta_int(*f, A + "block_count");
    const int64_t interval = meta_int(*f, A + "full_attention_interval");
    if (n_layers <= 0 || n_layers > 4096 || interval <= 0) throw Error(path + ": bad block_count / full_attention_interval");
    std::vector<std::string> types;
    for (int64_t i = 0; i < n_layers; ++i) types.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
    const int64_t head_dim = meta_int(*f, A + "attention.key_length");
    const int64_t rot = meta_int(*f, A + "rope.dimension_count");
    std::vector<int64_t> sec = f->get_int_array(A + "rope.dimension_sections");
    sec.resize(3, 0);
    tc["vocab_size"] = embd->dims[1];
    tc["hidden_size"] = meta_int(*f, A + "embedding_length");
    tc["intermediate_size"] = meta_int(*f, A + "feed_forward_length");
    tc["num_hidden_layers"] = n_layers;
    tc["layer_types"] = types;
    tc["full_attention_interval"] = interval;
    tc["num_attention_heads"] = meta_int(*f, A + "attention.head_count");
    tc["num_key_value_heads"] = meta_int(*f, A + "attention.head_count_kv");
    tc["head_dim"] = head_dim;
    tc["rms_norm_eps"] = f->get_float(A + "attention.layer_norm_rms_epsilon");
    tc["rope_parameters"] = {{"rope_type", "default"},
                             {"rope_theta", f->get_float(A + "rope.freq_base")},
                             {"partial_rotary_factor", head_dim > 0 ? static_cast<double>(rot) / head_dim : 0.0},
                             {"mrope_section", sec},
                             {"mrope_interleaved", true}};
    const int64_t hk = meta_int(*f, A + "ssm.group_count"), hv = meta_int(*f, A + "ssm.time_step_rank");
    tc["linear_num_key_heads"] = hk;
    tc["linear_num_value_heads"] = hv;
    tc["linear_key_head_dim"] = meta_int(*f, A + "ssm.state_size");
    tc["linear_value_head_dim"] = hv > 0 ? meta_int(*f, A + "ssm.inner_size") / hv : 0;
    tc["linear_conv_kernel_dim"] = meta_int(*f, A + "ssm.conv_kernel");
    tc["max_position_embeddings"] = f->contains(A + "context_length") ? meta_int(*f, A + "context_length") : 262144;
    tc["tie_word_embeddings"] = f->find_tensor("output.weight") == nullptr;
    nlohmann::json cj = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                         {"model_type", "qwen3_5"},
                         {"text_config", tc}};
    tc["model_type"] = "qwen3_5_text";
    cj["text_config"] = tc;
    m.config = parse_model_config(cj.dump(), path + " (metadata)");

    if (m.arch == "clef") {
        const TextConfig& c = m.config.text;
        HeadConfig h;
        const GgufTensorInfo* mem = f->find_tensor("decision.proj_memory.weight");
        const GgufTensorInfo* up = f->find_tensor("dec.blk.0.ffn_up.weight");
        if (!mem || !up || mem->dims.size() != 2 || up->dims.size() != 2)
            throw Error(path +
                        ": missing head tensors decision.proj_memory.weight / dec.blk.0.ffn_up.weight");
        h.hidden_size = c.hidden_size;
        h.width = static_cast<int>(mem->dims[1]);
        h.feedforward = static_cast<int>(up->dims[1]);
        h.routing_layers = static_cast<int>(meta_int(*f, A + "decision.routing_block_count"));
        h.layers = static_cast<int>(meta_int(*f, A + "decision.block_count"));
        h.heads = static_cast<int>(meta_int(*f, A + "decision.head_count"));
        nlohmann::json hj = {
            {"hidden_size", h.hidden_size}, {"width", h.width}, {"routing_layers", h.routing_layers},
            {"layers", h.layers},           {"heads", h.heads}, {"feedforward", h.feedforward}};
        m.head_config = parse_head_config(hj.dump(), path + " (decision metadata)");
    }
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
    const Geometry g = geometry(c);

    // Backbone tensors.
    std::vector<TensorSource> src;
    for (const Entry& e : backbone_entries(c, f->find_tensor("output.weight") != nullptr)) {
        const GgufTensorInfo* t = f->find_tensor(e.gguf);
        if (!t) throw Error(path + ": missing tensor " + e.gguf);
        std::vector<int64_t> shape = reversed(t->dims);
        if (e.xf == Xf::ConvV) {
            if (shape.size() != 2) throw Error(path + ": " + e.gguf + " is not 2-D");
            shape = {shape[0], 1, shape[1]};
        }
        if ((t->ggml_type == T(GgmlType::BF16) || t->ggml_type == T(GgmlType::F16)) && e.xf == Xf::None) {
            TensorSource s;  // zero-transform pass-through
            s.name = e.hf;
            s.dtype = t->ggml_type == T(GgmlType::BF16) ? DType::BF16 : DType::F16;
            s.shape = shape;
            const unsigned char* data = t->data;
            s.fill = [f, data](unsigned char* dst, uint64_t off, size_t nb) { std::memcpy(dst, data + off, nb); };
            src.push_back(std::move(s));
            continue;
        }
        require_supported(*f, *t);
        // Matrices in a block format (and BF16 ones with a transform) stay in the file, read row by row.
        const bool matrix = t->dims.size() == 2 && t->dims[1] > 1 && e.xf != Xf::ConvV;
        if (matrix && (ggml_type_traits(t->ggml_type).block_size > 1 || t->ggml_type == T(GgmlType::BF16))) {
            m.matrices.emplace(e.hf, hf_matrix(f, *t, e.xf, g));
            continue;
        }
        src.push_back(f32_source(e.hf, shape, [f, t, xf = e.xf, shape, g, name = e.gguf] {
            std::vector<float> x = dequantize_tensor(*f, *t);
            transform(xf, x, shape, g, false, name);
            return x;
        }));
    }
    m.weights = materialise(src, "backbone", [](const std::string& p) {
        return std::make_unique<Checkpoint>(Checkpoint::open(p));
    });

    // Head.
    if (m.arch == "clef") {
        std::vector<TensorSource> hs;
        std::vector<Entry> entries = head_entries(*m.head_config);
        for (size_t i = 0; i < entries.size(); ++i) {
            const Entry& e = entries[i];
            if (e.xf == Xf::Scales) {
                const GgufTensorInfo* t = f->find_tensor(e.gguf);
                if (!t || t->n_elements() != 3) throw Error(path + ": missing tensor decision.scales (3 values)");
                std::vector<float> s = dequantize_tensor(*f, *t);
                if (!(s[0] > 0 && s[1] > 0 && s[2] > 0 && s[2] < 1))
                    throw Error(path + ": decision.scales must hold exp(prior) > 0, exp(joint) > 0, sigmoid(gate)");
                hs.push_back(tensor_from_f32("prior_logit_scale", DType::F32, {}, {std::log(s[0])}));
                hs.push_back(tensor_from_f32("joint_logit_scale", DType::F32, {}, {std::log(s[1])}));
                hs.push_back(tensor_from_f32("residual_gate", DType::F32, {}, {std::log(s[2] / (1 - s[2]))}));
                continue;
            }
            if (e.xf == Xf::Split) {
                if (e.part != 0) continue;
                // The three parts follow at i, i+2, i+4 (weight, bias interleaved).
                std::vector<const GgufTensorInfo*> parts;
                for (int p = 0; p < 3; ++p) {
                    const Entry& ep = entries[i + 2 * p];
                    const GgufTensorInfo* t = f->find_tensor(ep.gguf);
                    if (!t) throw Error(path + ": missing tensor " + ep.gguf);
                    parts.push_back(t);
                }
                std::vector<int64_t> shape = reversed(parts[0]->dims);
                for (int p = 1; p < 3; ++p)
                    if (parts[p]->dims != parts[0]->dims)
                        throw Error(path + ": " + parts[p]->name + " has another shape than " + parts[0]->name);
                shape[0] *= 3;
                for (const auto* t : parts) require_supported(*f, *t);
                hs.push_back(f32_source(e.hf, shape, [f, parts] {
                    std::vector<float> x;
                    for (const auto* t : parts) {
                        std::vector<float> y = dequantize_tensor(*f, *t);
                        x.insert(x.end(), y.begin(), y.end());
                    }
                    return x;
                }));
                continue;
            }
            const GgufTensorInfo* t = f->find_tensor(e.gguf);
            if (!t) throw Error(path + ": missing tensor " + e.gguf);
            require_supported(*f, *t);
            hs.push_back(f32_source(e.hf, reversed(t->dims), [f, t] { return dequantize_tensor(*f, *t); }));
        }
        m.head = materialise(hs, "head", [](const std::string& p) {
            return std::make_unique<SafetensorsFile>(SafetensorsFile::open(p));
        });
    } else {
        std::string dir = head_dir.empty() ? fs::path(path).parent_path().string() : head_dir;
        if (dir.empty()) dir = ".";
        const std::string hw = dir + "/joint_head.safetensors", hcfg = dir + "/joint_head_config.json";
        if (fs::exists(hw) && fs::exists(hcfg)) {
            m.head_config = load_head_config(hcfg);
            m.head = std::make_unique<SafetensorsFile>(SafetensorsFile::open(hw));
        } else if (!head_dir.empty()) {
            throw Error(head_dir + ": no joint_head.safetensors + joint_head_config.json");
        }
    }
    if (m.head_config && m.head_config->hidden_size != c.hidden_size)
        throw Error(path + ": the head's hidden_size " + std::to_string(m.head_config->hidden_size) +
                    " does not match the backbone's " + std::to_string(c.hidden_size));
    return m;
}

}  // namespace clef
