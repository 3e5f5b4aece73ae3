#include "model/serve_plan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "io/gguf.h"
#include "io/model_dir.h"
#include "model/gguf_model.h"
#include "model/tensors.h"
#include "ops/gemm.h"
#include "quant/levels.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/mmap.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

// What a plan reads from a model's files, kept open so that plans of any size need no further reads.
struct PlanSources {
    ModelConfig config;
    std::optional<HeadConfig> head;
    ModelSources src;
    std::shared_ptr<const void> files;  // what src's functions read
};

// One past the largest id of a tokenizer.json (its model's vocabulary and its added tokens); 0 when the file
// does not say.
int64_t tokenizer_json_ids(const std::string& path) {
    std::ifstream f(path);
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return 0;
    int64_t n = 0;
    const auto model = j.find("model");
    if (model != j.end() && model->is_object() && model->contains("vocab") && (*model)["vocab"].is_object())
        for (const auto& id : (*model)["vocab"])
            if (id.is_number_integer()) n = std::max<int64_t>(n, id.get<int64_t>() + 1);
    const auto added = j.find("added_tokens");
    if (added != j.end() && added->is_array())
        for (const auto& t : *added)
            if (t.is_object() && t.contains("id") && t["id"].is_number_integer())
                n = std::max<int64_t>(n, t["id"].get<int64_t>() + 1);
    return n;
}

PlanSources directory_plan_sources(const std::string& path) {
    const ModelDir dir = locate_model_dir(path);
    const ModelDirConfig config = load_model_dir_config(dir);
    auto ck = std::make_shared<const Checkpoint>(Checkpoint::open(dir.weights_path));
    const std::string prefix = checkpoint_text_prefix(*ck);
    auto stored = [ck](const std::string& name) -> std::optional<StoredTensor> {
        const TensorView* t = ck->find(name);
        if (!t) return std::nullopt;
        return StoredTensor{stored_kind(t->dtype), t->nbytes, false};
    };
    PlanSources p{config.model, config.head, {}, ck};
    p.src.text = [stored, prefix](const TensorSpec& s) { return stored(text_name(s, prefix)); };
    p.src.vision = [stored](const TensorSpec& s) { return stored(s.hf); };
    // The head file is mapped and read whole while the head converts it (decision/engine.cpp Engine::load).
    p.src.head_source_bytes = dir.backbone_only ? 0 : file_bytes(dir.head_weights_path);
    p.src.tokenizer_bytes = kTokenizerPerJsonByte * file_bytes(dir.tokenizer_path);
    p.src.tokenizer_ids = tokenizer_json_ids(dir.tokenizer_path);
    return p;
}

PlanSources gguf_plan_sources(const std::string& path, const std::string& head_dir) {
    auto f = std::make_shared<const GgufFile>(GgufFile::open(path));
    const GgufModelConfig mc = read_gguf_model_config(*f);
    PlanSources p{mc.config, mc.head_config, {}, f};
    p.src.text = [f](const TensorSpec& s) -> std::optional<StoredTensor> {
        const GgufTensorInfo* t = f->find_tensor(s.gguf);
        if (!t) return std::nullopt;
        return stored_ggml(t->ggml_type, t->nbytes);
    };
    for (const std::string key : {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"}) {
        if (!f->contains(key)) continue;
        const size_t n = f->get_string_array(key).size();
        p.src.tokenizer_bytes += kTokenizerPerEntry * n;
        if (key == "tokenizer.ggml.tokens") p.src.tokenizer_ids = static_cast<int64_t>(n);
    }
    uint64_t& head_source = p.src.head_source_bytes;
    if (p.head) {  // the file's head tensors, read from the mapping into fp32 (model/gguf_model.cpp)
        std::map<std::string, uint64_t> bytes;
        for_each_head_tensor(*p.head, [&](const TensorSpec& s) {
            if (const GgufTensorInfo* t = f->find_tensor(s.gguf)) bytes[s.gguf] = t->nbytes;
        });
        head_source = static_cast<uint64_t>(head_params(*p.head)) * 4;
        for (const auto& [name, n] : bytes) head_source += n;
    } else if (const std::optional<HeadFiles> h = gguf_head_files(path, head_dir)) {
        p.head = load_head_config(h->config);
        head_source = file_bytes(h->weights);
    }
    return p;
}

}  // namespace

StoredTensor::Kind stored_kind(DType t) {
    using K = StoredTensor::Kind;
    return t == DType::BF16 ? K::BF16 : t == DType::F16 ? K::F16 : t == DType::F64 ? K::F64 : K::F32;
}

StoredTensor stored_ggml(uint32_t type, uint64_t bytes) {
    using K = StoredTensor::Kind;
    const auto t = static_cast<GgmlType>(type);
    const K kind = ggml_type_traits(type).block_size > 1 ? K::Blocks
                   : t == GgmlType::BF16                 ? K::BF16
                   : t == GgmlType::F16                  ? K::F16
                                                         : K::F32;
    return StoredTensor{kind, bytes, true, int8_level_type(t), affine_level_bits(t)};
}

std::string checkpoint_text_prefix(const Checkpoint& ck) {
    const std::string p = text_prefix_in([&](const std::string& n) { return ck.find(n) != nullptr; });
    return p.empty() ? std::string(kTextPrefix) : p;
}

std::optional<HeadFiles> gguf_head_files(const std::string& path, const std::string& head_dir) {
    const fs::path dir = !head_dir.empty()                      ? fs::path(head_dir)
                         : fs::path(path).parent_path().empty() ? fs::path(".")
                                                                : fs::path(path).parent_path();
    HeadFiles h{(dir / "joint_head.safetensors").string(), (dir / "joint_head_config.json").string()};
    if (!fs::exists(h.weights) || !fs::exists(h.config)) return std::nullopt;
    return h;
}

MemoryPlanInput machine_plan_input(int64_t tokens, const BackboneOptions& backbone) {
    MemoryPlanInput in;
    in.tokens = tokens;
    in.schema_tokens = std::min(in.schema_tokens, tokens);
    in.backbone = backbone;
    ops::set_gemm_plan(ops::default_gemm_plan(backbone.precision));
    in.onednn = ops::PackedLinear::auto_backend(ops::WeightType::BF16) == ops::GemmBackend::OneDnn;
    in.exact_kernel = ops::gemm_plan().exact;
    return in;
}

MemoryPlanner memory_planner(const std::string& model, const std::string& head_dir) {
    auto p = std::make_shared<const PlanSources>(is_gguf_file(model) ? gguf_plan_sources(model, head_dir)
                                                                     : directory_plan_sources(model));
    return [p](const MemoryPlanInput& in) {
        return plan_memory(p->config, p->head ? &*p->head : nullptr, p->src, in);
    };
}

MemoryPlan compute_memory_plan(const std::string& model, const std::string& head_dir,
                               const MemoryPlanInput& in) {
    return memory_planner(model, head_dir)(in);
}

}  // namespace clef
