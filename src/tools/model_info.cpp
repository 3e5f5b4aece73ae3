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

namespace {

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

}  // namespace

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
        return stored_ggml(type, rows * ggml_row_bytes(t, dims[0]));
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
    if (const auto& g = p.device) {
        o << fmt::format(
            "on the Vulkan device ({} backbone layers; the embedding table and lm_head rows stay "
            "in host memory)\n",
            g->layers);
        row("backbone weights", g->backbone,
            "the device layers' projections in the file's type, vectors fp32");
        row("joint head", g->head, "fp32 matrices and the k/v rows of its attentions");
        if (g->vision) row("vision tower", g->vision, "in the file's types");
        row("state", g->state, "the device layers' recurrent states and K/V cache, N rows");
        row("activations", g->activations, "a chunk's buffers in power-of-two size classes, the head's rows");
        row("device total", g->total(), "");
    }
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
            {"peak", p.peak()},
            {"device", p.device ? nlohmann::json{{"layers", p.device->layers},
                                                 {"backbone", p.device->backbone},
                                                 {"head", p.device->head},
                                                 {"vision", p.device->vision},
                                                 {"state", p.device->state},
                                                 {"activations", p.device->activations},
                                                 {"total", p.device->total()}}
                                : nlohmann::json(nullptr)}};
}

}  // namespace clef
