#include "model/config.h"

#include <algorithm>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "util/error.h"
#include "util/json_fields.h"

namespace clef {

using nlohmann::json;

namespace {

std::string show_number(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error(path + ": read error");
    return ss.str();
}

bool parse_layer_type(std::string_view s, LayerType& out) {
    if (s == "linear_attention") {
        out = LayerType::LinearAttention;
        return true;
    }
    if (s == "full_attention") {
        out = LayerType::FullAttention;
        return true;
    }
    return false;
}

void parse_layer_types(const JsonFields& f, TextConfig& t) {
    if (const json* lt = f.find("layer_types")) {
        if (!lt->is_array()) f.fail("layer_types", "expected an array of strings, got " + show_json(*lt));
        if (lt->size() != static_cast<size_t>(t.num_layers))
            f.fail("layer_types", "has " + std::to_string(lt->size()) + " entries, num_hidden_layers is " +
                                      std::to_string(t.num_layers));
        for (size_t i = 0; i < lt->size(); ++i) {
            const json& v = (*lt)[i];
            LayerType type;
            if (!v.is_string() || !parse_layer_type(v.get_ref<const std::string&>(), type))
                f.fail("layer_types", "entry " + std::to_string(i) + " is " + show_json(v) +
                                          " (expected \"linear_attention\" or \"full_attention\")");
            t.layer_types.push_back(type);
        }
        return;
    }
    t.layer_types = layer_types_for(t.num_layers,
                                    f.positive_or("full_attention_interval", kDefaultFullAttentionInterval));
}

// The rope type an object names (rope_type, else the older type; "mrope" is the default type); *key is set
// to the key that named it (nullptr when none did).
ops::RopeType rope_type_of(const JsonFields& src, const char** key) {
    *key = src.has("rope_type") ? "rope_type" : src.has("type") ? "type" : nullptr;
    const std::string name = *key ? src.string_or(*key, "default") : "default";
    ops::RopeType type = ops::RopeType::Default;
    if (name != "mrope" && !ops::parse_rope_type(name.c_str(), type))
        src.fail(*key, "unsupported rope type '" + name +
                           "' (expected default, linear, dynamic, yarn, llama3 or longrope)");
    return type;
}

// A number key that must be present and at least `min` (strictly more when `strict`).
double rope_number(const JsonFields& s, std::string_view key, double min, bool strict,
                   const std::string& why) {
    if (!s.has(key)) s.fail(key, "missing (" + why + ")");
    const double v = s.number(key, s.require(key));
    if (strict ? !(v > min) : !(v >= min))
        s.fail(key, std::string(strict ? "must be more than " : "must be at least ") + show_number(min) +
                        ", got " + show_number(v));
    return v;
}

// The pre-training context length: text_config.original_max_position_embeddings when present (transformers
// prefers it, as Phi-3 configs put it there), else the scaling object's.
int64_t rope_original_max(const JsonFields& f, const JsonFields& s, const std::string& type) {
    if (f.has("original_max_position_embeddings")) return f.positive("original_max_position_embeddings");
    if (!s.has("original_max_position_embeddings"))
        s.fail("original_max_position_embeddings",
               "missing (" + type + " needs the pre-training context length, e.g. 262144 for Qwen3.5)");
    return s.positive("original_max_position_embeddings");
}

// YaRN's keys: beta_fast / beta_slow (0 or absent = 32 / 1, as transformers' `or`), truncate, and the
// attention factor: attention_factor, else mscale / mscale_all_dim's ratio when both are set, else
// 0.1 ln(factor) + 1.
void parse_yarn(const JsonFields& s, ops::RopeScaling& r) {
    auto beta = [&](std::string_view key, double def) {
        const double v = s.has(key) ? s.number(key, s.require(key)) : 0.0;
        if (v < 0) s.fail(key, "must not be negative, got " + show_number(v));
        return v == 0 ? def : v;
    };
    r.beta_fast = beta("beta_fast", 32.0);
    r.beta_slow = beta("beta_slow", 1.0);
    if (r.beta_fast < r.beta_slow)
        s.fail("beta_fast", show_number(r.beta_fast) + " is less than beta_slow " + show_number(r.beta_slow));
    r.truncate = s.boolean_or("truncate", true);
    const double ms = s.has("mscale") ? s.number("mscale", s.require("mscale")) : 0.0;
    const double ms_all =
        s.has("mscale_all_dim") ? s.number("mscale_all_dim", s.require("mscale_all_dim")) : 0.0;
    if (s.has("attention_factor"))
        r.attention_factor = rope_number(s, "attention_factor", 0, true, "");
    else if (ms != 0 && ms_all != 0)
        r.attention_factor = ops::yarn_get_mscale(r.factor, ms) / ops::yarn_get_mscale(r.factor, ms_all);
    else
        r.attention_factor = ops::yarn_get_mscale(r.factor);
}

// LongRoPE's per-frequency factors: `n` positive numbers.
std::vector<double> rope_factor_list(const JsonFields& s, std::string_view key, int n) {
    const json& v = s.require(key);
    if (!v.is_array() || static_cast<int>(v.size()) != n)
        s.fail(key,
               "expected an array of rotary_dim/2 = " + std::to_string(n) + " numbers, got " + show_json(v));
    std::vector<double> out;
    for (const json& x : v) {
        out.push_back(s.number(key, x));
        if (!(out.back() > 0)) s.fail(key, "entries must be positive, got " + show_json(x));
    }
    return out;
}

void parse_longrope(const JsonFields& s, TextConfig& t) {
    ops::RopeScaling& r = t.rope_scaling;
    r.short_factor = rope_factor_list(s, "short_factor", t.rotary_dim / 2);
    r.long_factor = rope_factor_list(s, "long_factor", t.rotary_dim / 2);
    if (s.has("factor")) {
        r.factor = rope_number(s, "factor", 1, false, "");
    } else {
        if (t.max_position_embeddings <= 0)
            s.fail("factor", "missing, and no max_position_embeddings to derive it from");
        r.factor = static_cast<double>(t.max_position_embeddings) / static_cast<double>(r.original_max);
    }
    if (s.has("attention_factor"))
        r.attention_factor = rope_number(s, "attention_factor", 0, true, "");
    else
        r.attention_factor =
            r.factor <= 1 ? 1.0
                          : std::sqrt(1 + std::log(r.factor) / std::log(static_cast<double>(r.original_max)));
}

// The RoPE scaling named by rope_parameters (or else rope_scaling), with transformers' keys and defaults.
void parse_rope_scaling(const JsonFields& f, const JsonFields& rpf, const JsonFields& rsf, TextConfig& t) {
    const char *pkey, *skey;
    const ops::RopeType pt = rope_type_of(rpf, &pkey), st = rope_type_of(rsf, &skey);
    if (pt != ops::RopeType::Default && st != ops::RopeType::Default && pt != st)
        rsf.fail(skey, std::string("names rope type '") + ops::rope_type_name(st) +
                           "', rope_parameters names '" + ops::rope_type_name(pt) + "' (keep one)");
    const JsonFields& s = pt != ops::RopeType::Default ? rpf : rsf;
    ops::RopeScaling& r = t.rope_scaling;
    r = {};
    r.type = pt != ops::RopeType::Default ? pt : st;
    if (r.type == ops::RopeType::Default) return;
    const std::string name = ops::rope_type_name(r.type);
    if (r.type != ops::RopeType::LongRope)
        r.factor = rope_number(s, "factor", 1, false, "the " + name + " rope scaling needs it");
    if (r.type == ops::RopeType::Dynamic) {
        if (t.max_position_embeddings <= 0)
            f.fail("max_position_embeddings", "missing (the dynamic rope scaling starts beyond it)");
        r.original_max = t.max_position_embeddings;
    } else if (r.type != ops::RopeType::Linear) {
        r.original_max = rope_original_max(f, s, name);
    }
    if (r.type == ops::RopeType::Yarn) parse_yarn(s, r);
    if (r.type == ops::RopeType::Llama3) {
        r.low_freq_factor = rope_number(s, "low_freq_factor", 0, true, "llama3 needs it");
        r.high_freq_factor = rope_number(s, "high_freq_factor", r.low_freq_factor, true, "llama3 needs it");
    }
    if (r.type == ops::RopeType::LongRope) parse_longrope(s, t);
}

// Rope settings: text_config.rope_parameters (current transformers) or the older rope_theta /
// partial_rotary_factor / rope_scaling keys. rope_parameters wins where both are present.
void parse_rope(const JsonFields& f, TextConfig& t) {
    static const json kEmpty = json::object();
    const json* rp = f.object_or_null("rope_parameters");
    const json* rs = f.object_or_null("rope_scaling");
    const JsonFields rpf(rp ? *rp : kEmpty, f.source(), f.path("rope_parameters") + ".");
    const JsonFields rsf(rs ? *rs : kEmpty, f.source(), f.path("rope_scaling") + ".");

    if (rpf.has("rope_theta")) {
        t.rope_theta = rpf.number("rope_theta", rpf.require("rope_theta"));
    } else if (f.has("rope_theta")) {
        t.rope_theta = f.number("rope_theta", f.require("rope_theta"));
    } else {
        f.fail("rope_parameters.rope_theta",
               "missing (neither rope_parameters.rope_theta nor rope_theta is set)");
    }
    if (!(t.rope_theta > 0)) {
        (rpf.has("rope_theta") ? rpf : f)
            .fail("rope_theta", "must be positive, got " + show_number(t.rope_theta));
    }

    const JsonFields& prf = rpf.has("partial_rotary_factor") ? rpf : f;
    if (prf.has("partial_rotary_factor"))
        t.partial_rotary_factor = prf.number("partial_rotary_factor", prf.require("partial_rotary_factor"));
    if (!(t.partial_rotary_factor > 0 && t.partial_rotary_factor <= 1))
        prf.fail("partial_rotary_factor", "must be in (0, 1], got " + show_number(t.partial_rotary_factor));
    const double rot = t.head_dim * t.partial_rotary_factor;
    t.rotary_dim = static_cast<int>(std::lround(rot));
    if (std::fabs(rot - t.rotary_dim) > 1e-9)
        prf.fail("partial_rotary_factor",
                 "head_dim " + std::to_string(t.head_dim) + " x " + show_number(t.partial_rotary_factor) +
                     " = " + show_number(rot) + " is not a whole number of rotary dimensions");
    if (t.rotary_dim <= 0 || t.rotary_dim % 2 != 0 || t.rotary_dim > t.head_dim)
        prf.fail("partial_rotary_factor", "rotary_dim " + std::to_string(t.rotary_dim) +
                                              " must be even, positive and at most head_dim " +
                                              std::to_string(t.head_dim));

    const JsonFields* mf = rpf.has("mrope_section") ? &rpf : rsf.has("mrope_section") ? &rsf : nullptr;
    if (mf) {
        const json& ms = mf->require("mrope_section");
        if (!ms.is_array() || ms.empty())
            mf->fail("mrope_section", "expected a non-empty array, got " + show_json(ms));
        int sum = 0;
        for (const json& v : ms) {
            int s = mf->integer("mrope_section", v);
            if (s < 0) mf->fail("mrope_section", "entries must be non-negative, got " + show_json(ms));
            t.mrope_section.push_back(s);
            sum += s;
        }
        if (sum != t.rotary_dim / 2)
            mf->fail("mrope_section", show_json(ms) + " sums to " + std::to_string(sum) +
                                          ", expected rotary_dim/2 = " + std::to_string(t.rotary_dim / 2));
    }
    const JsonFields& mif = rpf.has("mrope_interleaved") ? rpf : rsf;
    t.mrope_interleaved = mif.boolean_or("mrope_interleaved", true);
    parse_rope_scaling(f, rpf, rsf, t);
}

TextConfig parse_text_config(const JsonFields& f, const JsonFields* top) {
    TextConfig t;
    t.vocab_size = f.positive("vocab_size");
    t.hidden_size = f.positive("hidden_size");
    t.intermediate_size = f.positive("intermediate_size");
    t.num_layers = f.positive("num_hidden_layers");
    t.num_heads = f.positive("num_attention_heads");
    t.num_kv_heads = f.positive("num_key_value_heads");
    t.head_dim = f.positive("head_dim");
    t.attn_output_gate = f.boolean_or("attn_output_gate", true);
    t.linear_num_key_heads = f.positive("linear_num_key_heads");
    t.linear_num_value_heads = f.positive("linear_num_value_heads");
    t.linear_key_head_dim = f.positive("linear_key_head_dim");
    t.linear_value_head_dim = f.positive("linear_value_head_dim");
    t.linear_conv_kernel = f.positive_or("linear_conv_kernel_dim", 4);
    const std::string gate = f.string_or("output_gate_type", "swish");
    if (gate == "sigmoid")
        t.gdn_norm_gate = ops::NormGate::Sigmoid;
    else if (gate != "swish" && gate != "silu")
        f.fail("output_gate_type", "expected swish, silu or sigmoid, got \"" + gate + "\"");
    if (f.has("rms_norm_eps")) {
        double eps = f.number("rms_norm_eps", f.require("rms_norm_eps"));
        if (!(eps > 0)) f.fail("rms_norm_eps", "must be positive, got " + show_number(eps));
        t.rms_norm_eps = static_cast<float>(eps);
    }
    t.max_position_embeddings = f.positive_or("max_position_embeddings", 0);
    t.mtp_num_hidden_layers = f.integer_or("mtp_num_hidden_layers", 0);
    if (t.mtp_num_hidden_layers < 0)
        f.fail("mtp_num_hidden_layers",
               "must not be negative, got " + std::to_string(t.mtp_num_hidden_layers));

    // tie_word_embeddings may sit in text_config, at the top level, or both (then they must agree).
    const bool in_text = f.has("tie_word_embeddings");
    const bool in_top = top && top->has("tie_word_embeddings");
    t.tie_word_embeddings = in_text ? f.boolean_or("tie_word_embeddings", false)
                                    : (in_top ? top->boolean_or("tie_word_embeddings", false) : false);
    if (in_text && in_top && top->boolean_or("tie_word_embeddings", false) != t.tie_word_embeddings)
        f.fail("tie_word_embeddings", std::string(t.tie_word_embeddings ? "true" : "false") +
                                          " disagrees with the top-level tie_word_embeddings");

    if (t.num_heads % t.num_kv_heads != 0)
        f.fail("num_attention_heads", std::to_string(t.num_heads) +
                                          " is not a multiple of num_key_value_heads " +
                                          std::to_string(t.num_kv_heads));
    if (t.linear_num_value_heads % t.linear_num_key_heads != 0)
        f.fail("linear_num_value_heads", std::to_string(t.linear_num_value_heads) +
                                             " is not a multiple of linear_num_key_heads " +
                                             std::to_string(t.linear_num_key_heads));
    parse_layer_types(f, t);
    parse_rope(f, t);
    return t;
}

VisionConfig parse_vision_config(const JsonFields& f, const TextConfig& text) {
    VisionConfig v;
    v.depth = f.positive("depth");
    v.hidden_size = f.positive("hidden_size");
    v.num_heads = f.positive("num_heads");
    v.intermediate_size = f.positive("intermediate_size");
    v.patch_size = f.positive_or("patch_size", 16);
    v.temporal_patch_size = f.positive_or("temporal_patch_size", 2);
    v.spatial_merge_size = f.positive_or("spatial_merge_size", 2);
    v.num_position_embeddings = f.positive("num_position_embeddings");
    v.out_hidden_size = f.positive("out_hidden_size");
    v.in_channels = f.positive_or("in_channels", 3);
    v.hidden_act = f.string_or("hidden_act", "gelu_pytorch_tanh");
    if (v.hidden_size % v.num_heads != 0)
        f.fail("hidden_size", std::to_string(v.hidden_size) + " is not a multiple of num_heads " +
                                  std::to_string(v.num_heads));
    const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
    if (side * side != v.num_position_embeddings)
        f.fail("num_position_embeddings", std::to_string(v.num_position_embeddings) +
                                              " is not a square (the learned grid is side x side)");
    if (v.out_hidden_size != text.hidden_size)
        f.fail("out_hidden_size", std::to_string(v.out_hidden_size) +
                                      " does not match the text hidden_size " +
                                      std::to_string(text.hidden_size));
    if (const json* ds = f.find("deepstack_visual_indexes")) {
        if (!ds->is_array()) f.fail("deepstack_visual_indexes", "expected an array, got " + show_json(*ds));
        if (!ds->empty()) f.fail("deepstack_visual_indexes", show_json(*ds) + ": DeepStack is not supported");
    }
    return v;
}

// A special token id from the top level; -1 when absent.
int token_id_or(const JsonFields& f, std::string_view key, int vocab_size) {
    const int id = f.integer_or(key, -1);
    if (!f.has(key)) return -1;
    if (id < 0 || id >= vocab_size)
        f.fail(key,
               std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    return id;
}

}  // namespace

const char* layer_type_name(LayerType t) {
    return t == LayerType::FullAttention ? "full_attention" : "linear_attention";
}

LayerType layer_type_at(int layer, int interval) {
    return interval > 0 && (layer + 1) % interval == 0 ? LayerType::FullAttention
                                                       : LayerType::LinearAttention;
}

std::vector<LayerType> layer_types_for(int num_layers, int interval) {
    std::vector<LayerType> types;
    for (int i = 0; i < num_layers; ++i) types.push_back(layer_type_at(i, interval));
    return types;
}

int full_attention_interval_of(const std::vector<LayerType>& types) {
    const auto first = std::find(types.begin(), types.end(), LayerType::FullAttention);
    const int interval = first == types.end() ? 0 : static_cast<int>(first - types.begin()) + 1;
    return layer_types_for(static_cast<int>(types.size()), interval) == types ? interval : 0;
}

int64_t TextConfig::context_length() const {
    int64_t n = max_position_embeddings;
    if (rope_scaling.type != ops::RopeType::Default && rope_scaling.original_max > 0)
        n = std::max(
            n, static_cast<int64_t>(rope_scaling.factor * static_cast<double>(rope_scaling.original_max)));
    return n;
}

int TextConfig::num_layers_of(LayerType t) const {
    int n = 0;
    for (LayerType l : layer_types) n += l == t;
    return n;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name) {
    const json root = parse_json_object(json_text, source_name);
    const JsonFields top(root, source_name, "");
    ModelConfig c;

    if (!top.has("model_type")) top.fail("model_type", "missing (expected qwen3_5 or qwen3_5_text)");
    c.model_type = top.string_or("model_type", "");
    const bool nested = c.model_type == "qwen3_5";
    if (!nested && c.model_type != "qwen3_5_text")
        top.fail("model_type", "unsupported model type '" + c.model_type +
                                   "' (clef.cpp runs Qwen3.5 checkpoints: qwen3_5 or qwen3_5_text)");

    if (const json* arch = top.find("architectures")) {
        if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string())
            top.fail("architectures", "expected a non-empty array of strings, got " + show_json(*arch));
        c.architecture = (*arch)[0].get<std::string>();
    } else {
        c.architecture = nested ? "Qwen3_5ForConditionalGeneration" : "Qwen3_5ForCausalLM";
    }

    if (nested) {
        const json* tc = top.object_or_null("text_config");
        if (!tc) top.fail("text_config", "missing (required for model_type qwen3_5)");
        const JsonFields tf(*tc, source_name, "text_config.");
        const std::string text_type = tf.string_or("model_type", "qwen3_5_text");
        if (text_type != "qwen3_5_text")
            tf.fail("model_type", "unsupported text model type '" + text_type + "' (expected qwen3_5_text)");
        c.text = parse_text_config(tf, &top);
        if (const json* vc = top.object_or_null("vision_config")) {
            const JsonFields vf(*vc, source_name, "vision_config.");
            const std::string vision_type = vf.string_or("model_type", "qwen3_5_vision");
            if (vision_type != "qwen3_5_vision")
                vf.fail("model_type",
                        "unsupported vision model type '" + vision_type + "' (expected qwen3_5_vision)");
            c.vision = parse_vision_config(vf, c.text);
        }
    } else {
        c.text = parse_text_config(top, nullptr);
    }
    const int vocab = c.text.vocab_size;
    c.image_token_id = token_id_or(top, "image_token_id", vocab);
    c.video_token_id = token_id_or(top, "video_token_id", vocab);
    c.vision_start_token_id = token_id_or(top, "vision_start_token_id", vocab);
    c.vision_end_token_id = token_id_or(top, "vision_end_token_id", vocab);
    return c;
}

ModelConfig load_model_config(const std::string& config_json_path) {
    return parse_model_config(read_text_file(config_json_path), config_json_path);
}

HeadConfig parse_head_config(const std::string& json_text, const std::string& source_name) {
    const json root = parse_json_object(json_text, source_name);
    const JsonFields f(root, source_name, "");
    HeadConfig h;
    h.hidden_size = f.positive("hidden_size");
    h.width = f.positive("width");
    h.routing_layers = f.positive("routing_layers");
    h.layers = f.positive("layers");
    h.heads = f.positive("heads");
    h.feedforward = f.positive("feedforward");
    if (h.width % h.heads != 0)
        f.fail("width", std::to_string(h.width) + " is not a multiple of heads " + std::to_string(h.heads));
    if (f.has("dropout")) {
        double d = f.number("dropout", f.require("dropout"));
        if (d < 0 || d >= 1) f.fail("dropout", "must be in [0, 1), got " + show_number(d));
    }
    return h;
}

VisionConfig parse_vision_config_json(const std::string& json_text, const std::string& source_name,
                                      const TextConfig& text) {
    const json root = parse_json_object(json_text, source_name);
    return parse_vision_config(JsonFields(root, source_name, ""), text);
}

HeadConfig load_head_config(const std::string& path) {
    return parse_head_config(read_text_file(path), path);
}

ModelDirConfig load_model_dir_config(const ModelDir& dir) {
    ModelDirConfig out;
    out.model = load_model_config(dir.config_path);
    if (!dir.backbone_only) {
        HeadConfig h = load_head_config(dir.head_config_path);
        if (h.hidden_size != out.model.text.hidden_size)
            throw Error(dir.head_config_path + ": hidden_size: " + std::to_string(h.hidden_size) +
                        " does not match the backbone hidden_size " +
                        std::to_string(out.model.text.hidden_size) + " in " + dir.config_path);
        out.head = h;
    }
    return out;
}

}  // namespace clef
