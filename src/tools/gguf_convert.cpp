#include "tools/gguf_convert.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "io/gguf.h"
#include "io/model_dir.h"
#include "model/gguf_keys.h"
#include "model/gguf_model.h"
#include "model/tensors.h"
#include "quant/quant.h"
#include "tokenizer/gguf_vocab.h"
#include "tools/imatrix.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

namespace fs = std::filesystem;

namespace {
constexpr uint32_t T(GgmlType t) {
    return static_cast<uint32_t>(t);
}
}  // namespace

// ------------------------------------------------------------------------------------------------------------
// Convert

namespace {

// What a conversion reads: the model directory, its configs and weights (the joint head's for --arch clef
// only) and where the backbone's tensors sit in the checkpoint.
struct ConvertInputs {
    ModelDir dir;
    ModelConfig config;
    std::shared_ptr<Checkpoint> ck;
    std::optional<HeadConfig> head_config;
    std::shared_ptr<SafetensorsFile> head;
    std::string ck_prefix;
};

ConvertInputs open_inputs(const std::string& model_dir, const ConvertOptions& opt) {
    if (opt.arch != "clef" && opt.arch != "qwen35")
        throw Error("--arch must be clef or qwen35, not '" + opt.arch + "'");
    ConvertInputs in;
    in.dir = locate_model_dir(model_dir);
    in.config = load_model_config(in.dir.config_path);
    in.ck = std::make_shared<Checkpoint>(Checkpoint::open(in.dir.weights_path));
    if (opt.arch == "clef") {
        if (!in.dir.has_head())
            throw Error(model_dir + ": --arch clef needs joint_head.safetensors and joint_head_config.json");
        in.head_config = load_head_config(in.dir.head_config_path);
        in.head = std::make_shared<SafetensorsFile>(SafetensorsFile::open(in.dir.head_weights_path));
    }
    // Checkpoint prefix: the publisher's nested layout or a plain text model.
    in.ck_prefix = text_prefix_in([&](const std::string& n) { return in.ck->find(n) != nullptr; });
    if (in.ck_prefix.empty()) throw Error(in.ck->description() + ": no text backbone");
    return in;
}

void write_general_metadata(GgufWriter& w, const std::string& model_dir, const ConvertOptions& opt) {
    w.add_string(gguf_general::kArchitecture, opt.arch);
    w.add_string(gguf_general::kName, fs::path(model_dir).filename().string());
    w.add_uint32(gguf_general::kFileType, static_cast<uint32_t>(opt.type));
    w.add_uint32(gguf_general::kQuantizationVersion, gguf_general::kQuantizationVersionValue);
}

// The backbone's hyperparameters a GGUF under architecture prefix A ("clef." / "qwen35.") cannot describe:
// a RoPE scaling other than linear and yarn (llama.cpp's rope.scaling keys), yarn without truncation
// (llama.cpp truncates), layer types that are not periodic (full_attention_interval) and a sigmoid GDN gate
// outside the clef architecture. config_path: the config.json they come from, for the error.
void check_describable(const std::string& A, const TextConfig& c, const std::string& config_path) {
    using ops::RopeType;
    const ops::RopeScaling& s = c.rope_scaling;
    if (s.type != RopeType::Default && s.type != RopeType::Linear && s.type != RopeType::Yarn)
        throw Error(config_path + ": rope type " + ops::rope_type_name(s.type) +
                    " has no GGUF description (llama.cpp's rope.scaling keys describe linear and yarn only)");
    if (s.type == RopeType::Yarn && !s.truncate)
        throw Error(config_path + ": yarn with truncate false has no GGUF description (llama.cpp truncates)");
    if (full_attention_interval_of(c.layer_types) == 0)
        throw Error(config_path +
                    ": layer_types is not periodic (full_attention_interval), which GGUF cannot describe");
    if (c.gdn_norm_gate == ops::NormGate::Sigmoid && A != "clef.")
        throw Error(config_path + ": output_gate_type sigmoid has no key in llama.cpp's " +
                    A.substr(0, A.size() - 1) + " architecture (convert with --arch clef)");
}

// The rows of a metadata table (model/gguf_keys.h) that clef convert writes, in order, with their values for
// `config` under prefix A.
template <class Config>
void write_keys(GgufWriter& w, const std::string& A, std::span<const GgufMetaKey<Config>> keys,
                const Config& config) {
    for (const GgufMetaKey<Config>& k : keys) {
        if (!(k.uses & kGgufWritten)) continue;
        const std::optional<GgufMetaValue> v = k.value(config);
        if (!v) continue;
        const std::string key = A + k.name;
        switch (k.type) {
            case GgufKeyType::UInt32:
                w.add_uint32(key, static_cast<uint32_t>(std::get<int64_t>(*v)));
                break;
            case GgufKeyType::Float32:
                w.add_float32(key, static_cast<float>(std::get<double>(*v)));
                break;
            case GgufKeyType::String:
                w.add_string(key, std::get<std::string>(*v));
                break;
            case GgufKeyType::Int32Array:
                w.add_int32_array(key, std::get<std::vector<int32_t>>(*v));
                break;
        }
    }
}

// llama.cpp's named chat templates: tokenizer.chat_template.<name> for each, then the
// tokenizer.chat_templates list of the names; nothing when there are none.
void write_chat_templates(GgufWriter& w, const std::map<std::string, std::string>& templates) {
    if (templates.empty()) return;
    std::vector<std::string> names;
    for (const auto& [name, text] : templates) {
        w.add_string("tokenizer.chat_template." + name, text);
        names.push_back(name);
    }
    w.add_string_array("tokenizer.chat_templates", names);
}

// Picks each tensor's type (gguf_tensor_type's rules) and checks it before anything is written: clef must
// write the type, and the importance matrix must have the tensor where llama.cpp requires one. `importance`
// is set to the tensor's column weights (nullptr without them).
struct TypePicker {
    GgufFileType file_type;
    GgufMixContext ctx;
    std::optional<ImportanceMatrix> imatrix;

    uint32_t pick(const std::string& name, const std::vector<uint64_t>& dims,
                  const float*& importance) const {
        const uint32_t type = gguf_tensor_type(name, dims, file_type, ctx);
        const std::string tname = ggml_type_name(type);
        if (!ggml_type_writable(static_cast<GgmlType>(type)))
            throw Error(
                fmt::format("--type {}: {} would be {}, which clef reads but cannot write yet (llama.cpp's "
                            "llama-quantize writes it from a clef bf16 GGUF)",
                            gguf_file_type_name(file_type), name, tname));
        importance = imatrix ? imatrix->find(name, dims[0]) : nullptr;
        if (!importance && gguf_type_needs_imatrix(name, type))
            throw Error(fmt::format(
                "--type {}: {} would be {}, which needs an importance matrix: pass --imatrix FILE "
                "(llama.cpp's llama-imatrix writes one){}",
                gguf_file_type_name(file_type), name, tname,
                imatrix ? " (the one given has no entry for it)" : ""));
        return type;
    }
};

TypePicker make_picker(const ConvertOptions& opt, const GgufMixContext& ctx) {
    TypePicker p{opt.type, ctx, std::nullopt};
    if (!opt.imatrix.empty()) p.imatrix = load_imatrix(opt.imatrix);
    p.ctx.has_imatrix = p.imatrix.has_value();
    return p;
}

// Adds tensors to w in the type the picker gives them and counts them per type. `make` gives the values in
// the GGUF layout; it runs, and the rows are quantised, only when the file is written.
struct TensorSink {
    GgufWriter& w;
    const TypePicker& types;
    ConvertSummary& sum;

    void operator()(const TensorSpec& s, std::function<std::vector<float>()> make) const {
        const float* importance = nullptr;
        const uint32_t type = types.pick(s.gguf, gguf_dims(s), importance);
        add_quantised_tensor(w, s, type, importance, std::move(make), sum);
    }
};

// Whether the file gets an output matrix: when it is not tied to the embeddings, or the checkpoint has one
// anyway.
bool writes_output(const TextConfig& c, const Checkpoint& ck) {
    return !c.tie_word_embeddings || ck.find(text_tensor(c, TextWeight::LmHead).hf);
}

// The backbone's tensors, read from the checkpoint under prefix and put in the GGUF layouts; the output
// matrix when with_output (writes_output).
void add_text_tensors(const TextConfig& c, const Checkpoint& ck, const std::string& prefix, bool with_output,
                      const TensorSink& add) {
    const GdnHeads g = gdn_heads(c);
    for_each_text_tensor(c, with_output, [&](const TensorSpec& s) {
        const TensorView& tv = ck.get(text_name(s, prefix));
        if (tv.shape != s.shape)
            throw Error(tv.file + ": " + tv.name + " has shape " + shape_str(tv.shape) + ", expected " +
                        shape_str(s.shape));
        add(s, [&tv, s, g] {
            std::vector<float> x = tv.to_f32();
            to_gguf_layout(s.layout, x, s.shape, g, tv.name);
            return x;
        });
    });
}

// One head tensor of the table: the three scalars as decision.scales (gathered in `scales`, written with the
// last), a third of a packed in-projection, or the tensor as it is.
void add_head_tensor(const TensorSpec& s, const SafetensorsFile& head, std::vector<float>& scales,
                     const TensorSink& add) {
    auto get = [&](const std::string& n) -> const TensorView& {
        const TensorView* t = head.find(n);
        if (!t) throw Error(head.path() + ": missing tensor " + n);
        return *t;
    };
    if (s.layout == GgufLayout::Scales) {
        const TensorView& t = get(s.hf);
        if (t.numel() != 1) throw Error(head.path() + ": " + s.hf + " is not a scalar");
        const float x = t.to_f32()[0];  // [exp(prior), exp(joint)] capped at 100, then sigmoid(gate)
        scales.push_back(s.slice < 2 ? std::exp(std::min(x, std::log(100.f))) : 1.f / (1.f + std::exp(-x)));
        if (s.slice == 2) add(s, [v = std::exchange(scales, {})] { return v; });
        return;
    }
    const TensorView& tv = get(s.hf);
    if (tv.shape != s.shape)
        throw Error(head.path() + ": " + s.hf + " has shape " + shape_str(tv.shape) + ", expected " +
                    shape_str(s.shape));
    add(s, [&tv, split = s.layout == GgufLayout::Split, part = s.slice] {
        std::vector<float> x = tv.to_f32();
        if (!split) return x;
        const size_t third = x.size() / 3;
        return std::vector<float>(x.begin() + part * third, x.begin() + (part + 1) * third);
    });
}

}  // namespace

void add_quantised_tensor(GgufWriter& w, const TensorSpec& s, uint32_t type, const float* importance,
                          std::function<std::vector<float>()> make, ConvertSummary& sum) {
    const std::vector<uint64_t> dims = gguf_dims(s);
    const GgmlTypeTraits tt = ggml_type_traits(type);
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    const uint64_t k = dims[0], rows = n / k, rb = ggml_row_bytes(tt, k);
    ++sum.tensors_per_type[tt.name];
    w.add_tensor(s.gguf, type, dims, rows * rb, [=, make = std::move(make)](unsigned char* dst) {
        std::vector<float> x = make();
        if (x.size() != n) throw Error("element count mismatch");
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < static_cast<int64_t>(rows); ++r)
            quantize_row(static_cast<GgmlType>(type), x.data() + r * k, dst + r * rb, static_cast<int64_t>(k),
                         importance);
    });
}

ConvertSummary write_gguf(const GgufWriter& w, const std::string& out_path,
                          const std::function<void(uint64_t, uint64_t)>& progress, ConvertSummary sum) {
    w.write(out_path, progress);
    for (auto& [t, n] : sum.tensors_per_type) sum.tensors += n;
    std::error_code ec;
    sum.bytes = fs::file_size(out_path, ec);
    return sum;
}

ConvertSummary convert_to_gguf(const std::string& model_dir, const std::string& out_path,
                               const ConvertOptions& opt) {
    const ConvertInputs in = open_inputs(model_dir, opt);
    const TextConfig& c = in.config.text;
    const bool clef = opt.arch == "clef";
    const std::string A = opt.arch + ".";
    GgufWriter w;
    write_general_metadata(w, model_dir, opt);
    check_describable(A, c, in.dir.config_path);
    write_keys(w, A, gguf_text_keys(), c);
    if (clef) write_keys(w, A, gguf_head_keys(), *in.head_config);
    write_gguf_tokenizer(w, in.dir.tokenizer_path, c.vocab_size);
    if (clef) write_chat_templates(w, opt.chat_templates);

    ConvertSummary sum;
    const bool with_output = writes_output(c, *in.ck);
    const TypePicker types = make_picker(
        opt, {c.num_layers, c.num_kv_heads > 0 ? c.num_heads / c.num_kv_heads : 0, with_output, false});
    const TensorSink add{w, types, sum};
    add_text_tensors(c, *in.ck, in.ck_prefix, with_output, add);
    if (clef) {
        std::vector<float> scales;
        for_each_head_tensor(*in.head_config,
                             [&](const TensorSpec& s) { add_head_tensor(s, *in.head, scales, add); });
    }
    return write_gguf(w, out_path, opt.progress, std::move(sum));
}

// ------------------------------------------------------------------------------------------------------------
// GGUF -> GGUF

namespace {

// The type a tensor of a GGUF file gets under ft: every tensor fp32 for f32; otherwise fp32 tensors stay fp32
// and the others follow the picker's rules (by GGUF name, as from a checkpoint).
uint32_t requantised_type(const GgufTensorInfo& t, const TypePicker& types, const float*& importance) {
    importance = nullptr;
    if (types.file_type == GgufFileType::F32 || t.ggml_type == T(GgmlType::F32)) return T(GgmlType::F32);
    return types.pick(t.name, t.dims, importance);
}

// The rules' context from a GGUF's metadata (architecture prefix keys; zeros where absent).
GgufMixContext mix_context_of(const GgufFile& f) {
    const std::string A = f.get_string(gguf_general::kArchitecture, "") + ".";
    auto uint_or_0 = [&](const std::string& key) -> int {
        const GgufValue* v = f.find(key);
        return v && gguf_type_is_integer(v->type()) ? static_cast<int>(v->as_uint()) : 0;
    };
    const int heads = uint_or_0(A + gguf_key::kHeadCount), kv = uint_or_0(A + gguf_key::kHeadCountKv);
    return {uint_or_0(A + gguf_key::kBlockCount), kv > 0 ? heads / kv : 0,
            f.find_tensor(text_gguf_name(TextWeight::LmHead)) != nullptr, false};
}

// Tensor t of the input in ggml type `type`: its bytes as they are when the type does not change, otherwise
// each row dequantised to fp32 and quantised again.
void add_requantised(GgufWriter& w, const GgufTensorInfo& t, uint32_t type, const float* importance) {
    const GgmlTypeTraits to = ggml_type_traits(type), from = ggml_type_traits(t.ggml_type);
    const uint64_t k = t.row_length(), rows = t.n_rows(), rb = ggml_row_bytes(to, k),
                   src_rb = ggml_row_bytes(from, k);
    w.add_tensor(
        t.name, type, t.dims, rows * rb, [&t, type, k, rows, rb, src_rb, importance](unsigned char* dst) {
            if (type == t.ggml_type) {
                std::memcpy(dst, t.data, t.nbytes);
                return;
            }
            const auto src = static_cast<GgmlType>(t.ggml_type);
#pragma omp parallel
            {
                std::vector<float> row(k);
#pragma omp for schedule(static)
                for (int64_t r = 0; r < static_cast<int64_t>(rows); ++r) {
                    dequantize_row_f32(src, t.data + r * src_rb, row.data(), static_cast<int64_t>(k));
                    quantize_row(static_cast<GgmlType>(type), row.data(), dst + r * rb,
                                 static_cast<int64_t>(k), importance);
                }
            }
        });
}

}  // namespace

ConvertSummary convert_gguf(const std::string& in_path, const std::string& out_path,
                            const ConvertOptions& opt) {
    const GgufFile in = GgufFile::open(in_path);
    const TypePicker types = make_picker(opt, mix_context_of(in));
    GgufWriter w;
    bool file_type_written = false;
    for (const GgufKeyValue& kv : in.metadata()) {
        if (kv.key == gguf_general::kAlignment) continue;  // the writer aligns to its default
        if (kv.key == gguf_general::kFileType) {
            w.add_uint32(gguf_general::kFileType, static_cast<uint32_t>(opt.type));
            file_type_written = true;
            continue;
        }
        w.add_value(std::string(kv.key), kv.value);
    }
    if (!file_type_written) w.add_uint32(gguf_general::kFileType, static_cast<uint32_t>(opt.type));
    ConvertSummary sum;
    for (const GgufTensorInfo& t : in.tensors()) {
        const float* importance = nullptr;
        const uint32_t type = requantised_type(t, types, importance);
        if (type != t.ggml_type && !ggml_type_traits(t.ggml_type).supported)
            throw Error(in_path + ": tensor " + t.name + " is " + ggml_type_name(t.ggml_type) +
                        ", which clef cannot read");
        add_requantised(w, t, type, importance);
        ++sum.tensors_per_type[ggml_type_traits(type).name];
    }
    return write_gguf(w, out_path, opt.progress, std::move(sum));
}

}  // namespace clef
