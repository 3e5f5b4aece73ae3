// A model to load, from either layout (a directory in the publisher layout or one GGUF file): its configs,
// its weights as WeightSources under the publisher's names, and where its tokenizer and image-processor
// settings are. Engine::load reads only this, so both layouts take one path.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "image/preprocess.h"
#include "io/weight_source.h"
#include "model/config.h"

namespace clef {

struct ModelFiles {
    std::string path;
    ModelConfig config;
    HeadConfig head_config;
    std::unique_ptr<WeightSource> weights;  // text backbone, lm_head, vision tower (directories only)
    std::unique_ptr<WeightSource> head;     // joint head
    std::unique_ptr<WeightSource> vision;   // a GGUF's vision tower, from its mmproj file (model.visual.*)
    bool tokenizer_in_gguf = false;         // the tokenizer is the GGUF's own metadata (tokenizer_path)
    std::string tokenizer_path;             // tokenizer.json, or the GGUF file
    std::string processor_config_path;  // processor_config.json / preprocessor_config.json; "" when absent
    std::optional<ImageProcessorConfig> image_processor;  // a GGUF's, from its mmproj's metadata
};

// Opens a model directory or GGUF file (a qwen35 GGUF takes its head from head_dir or from beside the file;
// a GGUF's vision tower and image-processor settings come from the mmproj file, when one is given).
// Throws clef::Error when there is no joint head, naming what to give, and for an mmproj given with a model
// directory or not matching the backbone.
ModelFiles open_model_files(const std::string& path, const std::string& head_dir = "",
                            const std::string& mmproj = "");

}  // namespace clef
