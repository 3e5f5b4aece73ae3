// The memory plan (model/memory_plan.h) of a model's files: its configs and the stored types and sizes of its
// tensors (no tensor data is read). `clef serve` admits decisions by it (src/cli/cmd_serve.cpp) and `clef
// info
// --tokens N` prints it (src/tools/model_info.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "model/memory_plan.h"

namespace clef {

// How a safetensors dtype is stored; a GGUF tensor of a ggml type and its bytes in the file.
StoredTensor::Kind stored_kind(DType t);
StoredTensor stored_ggml(uint32_t type, uint64_t bytes);

// A loaded tokenizer's memory, measured with `clef tokenize`: tests/data/tokenizer/qwen3/tokenizer.json (11.4
// MB, 151,643 tokens + 151,387 merges) peaks 55 MB above the runtime, a GGUF with 248,320 tokens 44 MB: ~180
// bytes per token or merge, ~5 bytes per byte of tokenizer.json.
inline constexpr uint64_t kTokenizerPerEntry = 180, kTokenizerPerJsonByte = 5;

// The text prefix the checkpoint uses (model/tensors.h); the publisher's when it holds no embedding table.
std::string checkpoint_text_prefix(const Checkpoint& ck);

// A qwen35 file's head files (joint_head.safetensors + joint_head_config.json) in head_dir, or beside the
// file when head_dir is empty (as the loader finds them); nothing when they are not there.
struct HeadFiles {
    std::string weights, config;
};
std::optional<HeadFiles> gguf_head_files(const std::string& path, const std::string& head_dir);

// The plan's input for a decision of `tokens` tokens on this machine: the engine's defaults
// (decision/engine.h), the backbone options given, this CPU's GEMM backend for their precision (it sets the
// process's GEMM plan).
MemoryPlanInput machine_plan_input(int64_t tokens, const BackboneOptions& backbone = {});
// The plans of one model (a directory or GGUF file; head_dir: a qwen35 GGUF's head directory, as clef decide
// --head, "" looks beside the file) at any request size: its files' headers are read once, by
// memory_planner().
using MemoryPlanner = std::function<MemoryPlan(const MemoryPlanInput&)>;
MemoryPlanner memory_planner(const std::string& model, const std::string& head_dir);
// One plan of a model directory or GGUF file.
MemoryPlan compute_memory_plan(const std::string& model, const std::string& head_dir,
                               const MemoryPlanInput& in);

}  // namespace clef
