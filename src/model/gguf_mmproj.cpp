#include "model/gguf_mmproj.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "io/gguf.h"
#include "model/gguf_model.h"
#include "model/tensors.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

namespace {

namespace key = mmproj_key;

const GgufTensorInfo& need_tensor(const GgufFile& f, const std::string& name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) throw Error(f.path() + ": missing tensor " + name);
    return *t;
}

bool flag(const GgufFile& f, const char* k) {
    return f.contains(k) && f.get_bool(k);
}

// A clip file with a vision encoder in the Qwen3-VL projector's form (DeepStack refused by the config
// parser).
void check_projector(const GgufFile& f) {
    const std::string arch = f.get_string(key::kArchitecture, "");
    if (arch != "clip")
        throw Error(f.path() + ": general.architecture is '" + arch + "', not clip: not an mmproj file");
    std::string proj = f.get_string(key::kProjectorType, "");
    if (proj.empty()) proj = f.get_string(key::kVisionProjectorType, "");
    if (proj != kQwen3vlProjector)
        throw Error(f.path() + ": clip.projector_type '" + proj + "' is not supported (clef reads " +
                    kQwen3vlProjector + ", the Qwen3-VL tower and merger)");
    if (!flag(f, key::kHasVision)) throw Error(f.path() + ": clip.has_vision_encoder is not true");
    if (!flag(f, key::kUseGelu))
        throw Error(f.path() + ": clip.use_gelu is not true (the Qwen3-VL blocks use the tanh GELU)");
}

// The blocks clip.vision.is_deepstack_layers marks, and -1 for DeepStack tensors it does not mark.
nlohmann::json deepstack_layers(const GgufFile& f) {
    nlohmann::json out = nlohmann::json::array();
    if (const GgufValue* v = f.find(key::kIsDeepstackLayers))
        for (size_t i = 0; i < v->size(); ++i)
            if (v->bool_at(i)) out.push_back(i);
    const auto& ts = f.tensors();
    const bool tensors = std::any_of(
        ts.begin(), ts.end(), [](const GgufTensorInfo& t) { return t.name.rfind("v.deepstack.", 0) == 0; });
    if (tensors && out.empty()) out.push_back(-1);
    return out;
}

// The patch embedding's GGUF kernels (one per temporal frame) and the position table, as the vision table
// names them.
struct MmprojNames {
    std::vector<std::string> frames;
    std::string positions;
};

MmprojNames mmproj_names() {
    MmprojNames n;
    for_each_vision_tensor(VisionConfig{}, [&](const TensorSpec& s) {
        if (s.layout == GgufLayout::PatchFrame) n.frames.push_back(s.gguf);
        if (s.module == static_cast<int>(VisionModule::PosEmbed)) n.positions = s.gguf;
    });
    return n;
}

// config.json's vision_config from the metadata and the tensors' shapes (patch {P, P, C, H}, positions {H,
// N}).
nlohmann::json vision_config_json(const GgufFile& f) {
    const MmprojNames names = mmproj_names();
    const GgufTensorInfo& patch = need_tensor(f, names.frames[0]);
    const GgufTensorInfo& pos = need_tensor(f, names.positions);
    if (patch.dims.size() != 4 || pos.dims.size() != 2)
        throw Error(f.path() + ": " + names.frames[0] + " must be 4-D and " + names.positions + " 2-D");
    if (!f.find_tensor(names.frames[1]))
        throw Error(f.path() + ": missing tensor " + names.frames[1] +
                    " (the patch embedding's second temporal frame)");
    nlohmann::json v;
    v["depth"] = f.get_int(key::kBlockCount);
    v["hidden_size"] = f.get_int(key::kEmbeddingLength);
    v["num_heads"] = f.get_int(key::kHeadCount);
    v["intermediate_size"] = f.get_int(key::kFeedForwardLength);
    v["patch_size"] = f.get_int(key::kPatchSize);
    v["temporal_patch_size"] = 2;  // the two kernels names.frames
    // llama.cpp's default for the Qwen-VL projectors when the key is absent.
    v["spatial_merge_size"] = f.contains(key::kSpatialMergeSize) ? f.get_int(key::kSpatialMergeSize) : 2;
    v["num_position_embeddings"] = pos.dims[1];
    v["out_hidden_size"] = f.get_int(key::kProjectionDim);
    v["in_channels"] = patch.dims[2];
    v["hidden_act"] = "gelu_pytorch_tanh";  // clip.use_gelu: ggml's GELU, the tanh approximation
    v["deepstack_visual_indexes"] = deepstack_layers(f);
    return v;
}

VisionConfig read_vision_config(const GgufFile& f, const TextConfig& text) {
    const int64_t proj = f.get_int(key::kProjectionDim);
    if (proj != text.hidden_size)
        throw Error(f.path() + ": clip.vision.projection_dim " + std::to_string(proj) +
                    " does not match the backbone's embedding length " + std::to_string(text.hidden_size) +
                    ": the mmproj belongs to another model");
    return parse_vision_config_json(vision_config_json(f).dump(), f.path() + " (clip.vision metadata)", text);
}

std::array<double, 3> triple(const GgufFile& f, const char* k) {
    const GgufValue& v = f.at(k);
    if (!v.is_array() || v.size() < 3) throw Error(f.path() + ": " + k + " must hold 3 numbers");
    const std::vector<double> x = v.floats();
    return {x[0], x[1], x[2]};
}

int64_t pixels(const GgufFile& f, const char* k, int64_t fallback) {
    if (!f.contains(k)) return fallback;
    const int64_t v = f.get_int(k);
    if (v <= 0) throw Error(f.path() + ": " + k + " must be positive, got " + std::to_string(v));
    return v;
}

// Clef-Flash's processor on the tower's geometry, with the file's normalisation and pixel bounds.
ImageProcessorConfig read_processor(const GgufFile& f, const VisionConfig& v) {
    ImageProcessorConfig p =
        clef_flash_image_processor(v.patch_size, v.spatial_merge_size, v.temporal_patch_size);
    p.image_mean = triple(f, key::kImageMean);
    p.image_std = triple(f, key::kImageStd);
    for (double s : p.image_std)
        if (!(s > 0)) throw Error(f.path() + ": clip.vision.image_std must be positive");
    p.min_pixels = pixels(f, key::kImageMinPixels, p.min_pixels);
    p.max_pixels = pixels(f, key::kImageMaxPixels, p.max_pixels);
    if (p.min_pixels > p.max_pixels)
        throw Error(f.path() + ": clip.vision.image_min_pixels is larger than clip.vision.image_max_pixels");
    return p;
}

// The table's GGUF tensor for s, with the dims the config gives it.
const GgufTensorInfo& checked_tensor(const GgufFile& f, const TensorSpec& s) {
    const GgufTensorInfo& t = need_tensor(f, s.gguf);
    const std::vector<uint64_t> want = gguf_dims(s);
    if (t.dims != want)
        throw Error(f.path() + ": tensor " + s.gguf + " has shape " + shape_str(t.torch_shape()) +
                    ", expected " + shape_str(std::vector<int64_t>(want.rbegin(), want.rend())) +
                    " (from clip.vision metadata)");
    return t;
}

// Frame s.slice of the patch embedding ([H][C][P][P]) into its place in the Conv3d weight [H][C][T][P][P].
void place_frame(const std::vector<float>& frame, const TensorSpec& s, std::vector<float>& conv) {
    const int64_t T = s.shape[2], pp = s.shape[3] * s.shape[4], hc = s.shape[0] * s.shape[1];
    conv.resize(static_cast<size_t>(s.numel()));
    for (int64_t i = 0; i < hc; ++i)
        std::copy_n(frame.begin() + i * pp, pp, conv.begin() + (i * T + s.slice) * pp);
}

std::unique_ptr<WeightSource> read_weights(const std::shared_ptr<GgufFile>& f, const VisionConfig& v) {
    auto out = std::make_unique<WeightSource>();
    out->set_description(f->path());
    out->keep_alive(f);
    std::vector<float> conv;
    for_each_vision_tensor(v, [&](const TensorSpec& s) {
        const GgufTensorInfo& t = checked_tensor(*f, s);
        if (s.layout == GgufLayout::PatchFrame) {
            place_frame(gguf_tensor_f32(*f, t), s, conv);
            if (s.slice + 1 == s.shape[2]) out->add_f32(s.hf, s.shape, std::exchange(conv, {}));
        } else if (gguf_float_type(t)) {
            out->add_view(gguf_tensor_view(*f, t, s.hf));
        } else {
            out->add_f32(s.hf, s.shape, gguf_tensor_f32(*f, t));
        }
    });
    return out;
}

}  // namespace

GgufMmproj load_gguf_mmproj(const std::string& path, const TextConfig& text) {
    auto f = std::make_shared<GgufFile>(GgufFile::open(path));
    check_projector(*f);
    GgufMmproj m;
    m.path = path;
    m.vision = read_vision_config(*f, text);
    m.processor = read_processor(*f, m.vision);
    m.weights = read_weights(f, m.vision);
    return m;
}

}  // namespace clef
