// `clef convert --mmproj`: the vision tower and merger of a publisher-layout model directory as llama.cpp's
// multimodal projector file (mmproj) for the Qwen3-VL projector, the file llama.cpp's converter writes for
// this model: general.architecture "clip", general.type "mmproj", the clip.* / clip.vision.* metadata
// (model/gguf_mmproj.h's keys; plus clip.vision.image_min_pixels / image_max_pixels, which llama.cpp's
// Qwen3-VL converter leaves out, so the pixel bounds survive), the tensors under model/tensors.h's vision
// names, the Conv3d patch embedding as two 2-D kernels (one per temporal frame). docs/GGUF.md "Images from
// GGUF (mmproj)" lists names, keys and types.
#pragma once

#include <string>

#include "tools/gguf_convert.h"

namespace clef {

// Writes the vision tower of model_dir to out_path as an mmproj file of type opt.type (f32, f16, bf16 or
// q8_0, llama.cpp's mmproj types; gguf_tensor_type's rules: the patch kernels f32, f16 in f16 files, the
// position table, norms and biases f32). opt.arch, opt.imatrix and opt.chat_templates are not used. Throws
// clef::Error for a model without a vision tower and for settings an mmproj cannot carry (temporal patch
// size other than 2, an activation other than the tanh GELU, a processor that does not rescale by 1/255 and
// normalise).
ConvertSummary convert_to_mmproj(const std::string& model_dir, const std::string& out_path,
                                 const ConvertOptions& opt);

}  // namespace clef
