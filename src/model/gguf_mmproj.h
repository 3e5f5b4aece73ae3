// The vision tower of a GGUF model: llama.cpp's multimodal projector file (mmproj, general.architecture
// "clip") for the Qwen3-VL projector (clip.projector_type "qwen3vl_merger"), read into the engine's
// convention. The tower's config comes from the clip.vision.* metadata and the tensors' shapes (checked by
// the parser of config.json's vision_config), the image-processor settings from clip.vision.image_mean /
// image_std / image_min_pixels / image_max_pixels (Clef-Flash's published pixel bounds when a file has none,
// as for a model directory without a processor config), and the tensors (model/tensors.h's vision table,
// GGUF names v.* / mm.*) become a WeightSource under the publisher's names: F32 / F16 / BF16 tensors in
// place, others dequantised to fp32, the two patch-embedding kernels (one per temporal frame) joined into the
// publisher's Conv3d weight. docs/GGUF.md "Images from GGUF (mmproj)" lists names and keys.
#pragma once

#include <memory>
#include <string>

#include "image/preprocess.h"
#include "io/gguf.h"
#include "io/weight_source.h"
#include "model/config.h"

namespace clef {

// llama.cpp's mmproj metadata keys (gguf-py's Keys.General / Keys.Clip / Keys.ClipVision) clef writes and
// reads.
namespace mmproj_key {
inline constexpr const char* kArchitecture = gguf_general::kArchitecture;  // "clip"
inline constexpr const char* kType = gguf_general::kType;                  // "mmproj"
inline constexpr const char* kProjectorType = "clip.projector_type";
inline constexpr const char* kVisionProjectorType =
    "clip.vision.projector_type";  // files of several modalities
inline constexpr const char* kHasVision = "clip.has_vision_encoder";
inline constexpr const char* kUseGelu = "clip.use_gelu";
inline constexpr const char* kProjectionDim = "clip.vision.projection_dim";
inline constexpr const char* kImageSize = "clip.vision.image_size";
inline constexpr const char* kPatchSize = "clip.vision.patch_size";
inline constexpr const char* kEmbeddingLength = "clip.vision.embedding_length";
inline constexpr const char* kFeedForwardLength = "clip.vision.feed_forward_length";
inline constexpr const char* kBlockCount = "clip.vision.block_count";
inline constexpr const char* kHeadCount = "clip.vision.attention.head_count";
inline constexpr const char* kLayerNormEps = "clip.vision.attention.layer_norm_epsilon";
inline constexpr const char* kImageMean = "clip.vision.image_mean";
inline constexpr const char* kImageStd = "clip.vision.image_std";
inline constexpr const char* kSpatialMergeSize = "clip.vision.spatial_merge_size";
inline constexpr const char* kIsDeepstackLayers = "clip.vision.is_deepstack_layers";
inline constexpr const char* kImageMinPixels = "clip.vision.image_min_pixels";
inline constexpr const char* kImageMaxPixels = "clip.vision.image_max_pixels";
}  // namespace mmproj_key

// The projector llama.cpp's clip loader knows the Qwen3-VL tower and merger by.
inline constexpr const char* kQwen3vlProjector = "qwen3vl_merger";

struct GgufMmproj {
    std::string path;
    VisionConfig vision;
    ImageProcessorConfig processor;
    std::unique_ptr<WeightSource> weights;  // model.visual.* in the publisher's layout
};

// Reads an mmproj for a backbone of text config `text`: its clip.vision.projection_dim must be the text
// hidden_size. Throws clef::Error naming the file and the key or tensor (another projector, DeepStack, a
// missing or misshapen tensor, a width that does not match the backbone).
GgufMmproj load_gguf_mmproj(const std::string& path, const TextConfig& text);

}  // namespace clef
