// The card of a model as `clef serve` publishes it (model/model_card.h), from its files: format,
// quantisation, parameter count, context length, sizes, modification time, and the name the checkpoint gives
// itself. Reads the configs, safetensors headers and GGUF metadata (compute_model_info), no tensor data.
#pragma once

#include <string>

#include "model/model_card.h"

namespace clef {

// path: a model directory or GGUF file; head_dir: a qwen35 GGUF's joint head (as Engine::load takes it);
// mmproj: a GGUF's vision tower file ("" for none). The names are left to served_names; `vision` says whether
// the files hold a vision tower that loads with the model. Throws clef::Error as compute_model_info does.
ModelCard describe_model(const std::string& path, const std::string& head_dir = "",
                         const std::string& mmproj = "");

}  // namespace clef
