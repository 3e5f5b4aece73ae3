#include "model/model_files.h"

#include "io/gguf.h"
#include "io/model_dir.h"
#include "model/gguf_mmproj.h"
#include "model/gguf_model.h"
#include "util/error.h"

namespace clef {

namespace {

// The vision tower and image processor of a GGUF backbone from its mmproj file.
void add_mmproj(ModelFiles& m, const std::string& mmproj) {
    GgufMmproj v = load_gguf_mmproj(mmproj, m.config.text);
    m.config.vision = v.vision;
    m.vision = std::move(v.weights);
    m.image_processor = v.processor;
}

ModelFiles open_gguf(const std::string& path, const std::string& head_dir, const std::string& mmproj) {
    GgufModel g = load_gguf_model(path, head_dir);
    if (!g.head) throw Error(path + ": a " + g.arch + " GGUF without a joint head (give --head DIR)");
    ModelFiles m;
    m.path = path;
    m.config = std::move(g.config);
    m.head_config = *g.head_config;
    m.weights = std::make_unique<WeightSource>(std::move(g.weights));
    m.head = std::move(g.head);
    m.tokenizer_in_gguf = true;
    m.tokenizer_path = path;
    if (!mmproj.empty()) add_mmproj(m, mmproj);
    return m;
}

ModelFiles open_dir(const std::string& path) {
    const ModelDir dir = locate_model_dir(path);
    if (!dir.has_head())
        throw Error(path +
                    ": no joint_head.safetensors / joint_head_config.json: a backbone alone cannot answer "
                    "decisions");
    const ModelDirConfig cfg = load_model_dir_config(dir);  // checks that the head reads the backbone's width
    ModelFiles m;
    m.path = path;
    m.config = cfg.model;
    m.head_config = *cfg.head;
    m.weights = std::make_unique<WeightSource>(Checkpoint::open(dir.weights_path));
    m.head = std::make_unique<WeightSource>(SafetensorsFile::open(dir.head_weights_path));
    m.tokenizer_path = dir.tokenizer_path;
    m.processor_config_path = dir.processor_config_path;
    return m;
}

}  // namespace

ModelFiles open_model_files(const std::string& path, const std::string& head_dir, const std::string& mmproj) {
    if (is_gguf_file(path)) return open_gguf(path, head_dir, mmproj);
    if (!mmproj.empty())
        throw Error(mmproj + ": an mmproj file goes with a GGUF model; the model directory " + path +
                    " holds its own vision tower");
    return open_dir(path);
}

}  // namespace clef
