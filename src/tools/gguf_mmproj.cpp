#include "tools/gguf_mmproj.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>

#include "image/preprocess.h"
#include "io/gguf.h"
#include "io/model_dir.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/gguf_mmproj.h"
#include "model/gguf_model.h"
#include "model/tensors.h"
#include "quant/quant.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

namespace fs = std::filesystem;

namespace {

namespace key = mmproj_key;

// What an mmproj is written from: the directory's configs, image processor and checkpoint.
struct MmprojInputs {
    ModelDir dir;
    ModelConfig config;
    ImageProcessorConfig processor;
    std::unique_ptr<Checkpoint> ck;
};

void check_file_type(GgufFileType t) {
    if (t != GgufFileType::F32 && t != GgufFileType::F16 && t != GgufFileType::BF16 &&
        t != GgufFileType::Q8_0)
        throw Error(std::string("--type ") + gguf_file_type_name(t) +
                    " is not an mmproj type (llama.cpp writes mmproj files as f32, f16, bf16 or q8_0)");
}

// The vision config settings an mmproj cannot say otherwise: two temporal frames, the tanh GELU.
void check_vision(const VisionConfig& v, const std::string& config_path) {
    if (v.temporal_patch_size != 2)
        throw Error(config_path + ": vision_config.temporal_patch_size " +
                    std::to_string(v.temporal_patch_size) +
                    ": an mmproj holds the patch embedding as two frames (v.patch_embd.weight, .weight.1)");
    if (v.hidden_act != "gelu_pytorch_tanh" && v.hidden_act != "gelu_tanh")
        throw Error(config_path + ": vision_config.hidden_act '" + v.hidden_act +
                    "': an mmproj's clip.use_gelu is the tanh GELU");
}

// The image processor as the mmproj will carry it: the tower's geometry, a 1/255 rescale and a normalisation.
void check_processor(const ImageProcessorConfig& p, const VisionConfig& v, const std::string& source) {
    if (p.patch_size != v.patch_size || p.merge_size != v.spatial_merge_size ||
        p.temporal_patch_size != v.temporal_patch_size)
        throw Error(
            source +
            ": patch_size / merge_size / temporal_patch_size do not match config.json's vision_config");
    if (!p.do_rescale || !p.do_normalize || std::fabs(p.rescale_factor * 255.0 - 1.0) > 1e-9)
        throw Error(source +
                    ": an mmproj holds image_mean / image_std only: do_rescale, do_normalize and "
                    "rescale_factor 1/255 are required");
}

MmprojInputs open_inputs(const std::string& model_dir) {
    MmprojInputs in;
    in.dir = locate_model_dir(model_dir);
    in.config = load_model_config(in.dir.config_path);
    if (!in.config.vision)
        throw Error(in.dir.config_path +
                    ": no vision_config: the model has no vision tower to write as an mmproj");
    const VisionConfig& v = *in.config.vision;
    check_vision(v, in.dir.config_path);
    const std::string& pc = in.dir.processor_config_path;
    in.processor = pc.empty()
                       ? clef_flash_image_processor(v.patch_size, v.spatial_merge_size, v.temporal_patch_size)
                       : load_image_processor_config(pc);
    check_processor(in.processor, v, pc.empty() ? std::string("image processor") : pc);
    in.ck = std::make_unique<Checkpoint>(Checkpoint::open(in.dir.weights_path));
    return in;
}

std::vector<float> floats3(const std::array<double, 3>& x) {
    return {static_cast<float>(x[0]), static_cast<float>(x[1]), static_cast<float>(x[2])};
}

// general.* as llama.cpp's converter writes them for an mmproj.
void write_general(GgufWriter& w, const std::string& model_dir, GgufFileType type) {
    w.add_string(key::kArchitecture, "clip");
    w.add_string(key::kType, "mmproj");
    w.add_string(gguf_general::kName, fs::path(model_dir).filename().string());
    w.add_uint32(gguf_general::kFileType, static_cast<uint32_t>(type));
}

// clip.* / clip.vision.*: the encoder's widths (projection_dim = the text width it feeds), the image
// processor, the projector and its settings.
void write_clip(GgufWriter& w, const ModelConfig& c, const ImageProcessorConfig& p) {
    const VisionConfig& v = *c.vision;
    const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
    w.add_bool(key::kHasVision, true);
    w.add_uint32(key::kProjectionDim, c.text.hidden_size);
    w.add_uint32(key::kImageSize, side * v.patch_size);  // the learned position grid's side, in pixels
    w.add_uint32(key::kPatchSize, v.patch_size);
    w.add_uint32(key::kEmbeddingLength, v.hidden_size);
    w.add_uint32(key::kFeedForwardLength, v.intermediate_size);
    w.add_uint32(key::kBlockCount, v.depth);
    w.add_uint32(key::kHeadCount, v.num_heads);
    w.add_float32_array(key::kImageMean, floats3(p.image_mean));
    w.add_float32_array(key::kImageStd, floats3(p.image_std));
    w.add_string(key::kProjectorType, kQwen3vlProjector);
    w.add_bool(key::kUseGelu, true);
    w.add_uint32(key::kSpatialMergeSize, v.spatial_merge_size);
    // llama.cpp takes the text model's rms_norm_eps here.
    w.add_float32(key::kLayerNormEps, c.text.rms_norm_eps);
    w.add_bool_array(key::kIsDeepstackLayers, std::vector<bool>(static_cast<size_t>(v.depth), false));
    w.add_uint32(key::kImageMinPixels, static_cast<uint32_t>(p.min_pixels));
    w.add_uint32(key::kImageMaxPixels, static_cast<uint32_t>(p.max_pixels));
    w.add_uint32(gguf_general::kQuantizationVersion, gguf_general::kQuantizationVersionValue);
}

// Frame s.slice of the Conv3d weight [H][C][T][P][P]: [H][C][P][P].
std::vector<float> frame_of(const std::vector<float>& conv, const TensorSpec& s) {
    const int64_t T = s.shape[2], pp = s.shape[3] * s.shape[4], hc = s.shape[0] * s.shape[1];
    std::vector<float> out(static_cast<size_t>(hc * pp));
    for (int64_t i = 0; i < hc; ++i)
        std::copy_n(conv.begin() + (i * T + s.slice) * pp, pp, out.begin() + i * pp);
    return out;
}

// Adds the table's tensor s to w in the type gguf_tensor_type gives it; its values are read from the
// checkpoint (one frame of the patch kernel) and quantised only when the file is written.
void add_tensor(GgufWriter& w, const TensorSpec& s, const TensorView& tv, GgufFileType ft,
                ConvertSummary& sum) {
    const uint32_t type = gguf_tensor_type(s.gguf, gguf_dims(s), ft, GgufMixContext{});
    add_quantised_tensor(
        w, s, type, nullptr,
        [&tv, s] {
            std::vector<float> x = tv.to_f32();
            return s.layout == GgufLayout::PatchFrame ? frame_of(x, s) : x;
        },
        sum);
}

void add_tensors(GgufWriter& w, const VisionConfig& v, const Checkpoint& ck, GgufFileType ft,
                 ConvertSummary& sum) {
    for_each_vision_tensor(v, [&](const TensorSpec& s) {
        const TensorView& tv = ck.get(s.hf);
        if (tv.shape != s.shape)
            throw Error(tv.file + ": " + tv.name + " has shape " + shape_str(tv.shape) + ", expected " +
                        shape_str(s.shape) + " (from vision_config)");
        add_tensor(w, s, tv, ft, sum);
    });
}

}  // namespace

ConvertSummary convert_to_mmproj(const std::string& model_dir, const std::string& out_path,
                                 const ConvertOptions& opt) {
    check_file_type(opt.type);
    const MmprojInputs in = open_inputs(model_dir);
    GgufWriter w;
    write_general(w, model_dir, opt.type);
    write_clip(w, in.config, in.processor);
    ConvertSummary sum;
    add_tensors(w, *in.config.vision, *in.ck, opt.type, sum);
    return write_gguf(w, out_path, opt.progress, std::move(sum));
}

}  // namespace clef
