// A Clef model directory: the Qwen3.5 backbone (config.json + safetensors weights), the tokenizer, and the
// joint schema head (joint_head_config.json + joint_head.safetensors). locate_model_dir only finds the files
// and checks that the required ones exist; parsing them is left to the loaders (model/config.h,
// io/safetensors.h).
#pragma once

#include <string>
#include <vector>

namespace clef {

struct ModelDir {
    std::string root;                   // the directory as given
    std::string config_path;            // config.json (required)
    std::string head_config_path;       // joint_head_config.json ("" when backbone only)
    std::string head_weights_path;      // joint_head.safetensors ("" when backbone only)
    std::string tokenizer_path;         // tokenizer.json (required)
    std::string tokenizer_config_path;  // tokenizer_config.json (optional, "" when absent)
    std::string
        processor_config_path;  // processor_config.json, else preprocessor_config.json ("" when absent)
    // The backbone weights, in the form Checkpoint::open takes: model.safetensors, or the directory itself
    // when it holds model.safetensors.index.json or model-*.safetensors shards.
    std::string weights_path;
    std::string weights_index_path;  // model.safetensors.index.json ("" when absent)
    // No joint head files: the backbone can run, but no decisions can be made.
    bool backbone_only = false;
    // Conditions worth reporting that are not errors (e.g. "backbone only: ..."), in a fixed order.
    std::vector<std::string> notes;

    bool has_head() const { return !backbone_only; }
};

// Finds the files of a model directory. Throws clef::Error("<dir>: ...") naming each missing required file:
// config.json, tokenizer.json, the backbone weights, and joint_head.safetensors / joint_head_config.json when
// only one of the two is present. A directory with neither head file is accepted with backbone_only set.
ModelDir locate_model_dir(const std::string& path);

}  // namespace clef
