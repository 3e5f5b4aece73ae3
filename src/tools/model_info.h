// `clef info`'s text and JSON forms of a model's inventory (model/model_inventory.h) and memory plans.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/memory_plan.h"
#include "model/model_inventory.h"
#include "model/serve_plan.h"  // compute_memory_plan, machine_plan_input
#include "util/text.h"

namespace clef {

// The readable, aligned text form (numbers with thousands separators).
std::string format_model_info(const ModelInfo& info);
// A JSON object with the same content (plain integers).
nlohmann::json model_info_to_json(const ModelInfo& info);

// The plan of a model that exists only as its configs (e.g. the full Clef 27B): build "bf16" = the
// publisher's safetensors, or a GGUF file type ("q4_k_m") with llama.cpp's per-tensor types. Throws on an
// unknown build.
MemoryPlan config_memory_plan(const ModelConfig& config, const HeadConfig* head, const std::string& build,
                              const MemoryPlanInput& in);
// The plan as a text section (MiB, with what each part is) and as a JSON object (bytes).
std::string format_memory_plan(const MemoryPlan& plan);
nlohmann::json memory_plan_to_json(const MemoryPlan& plan);

}  // namespace clef
