// Random checkpoints in the publisher layout of Cloudflare/clef-flash: config.json, model.safetensors (or
// model-0000k-of-0000n.safetensors + model.safetensors.index.json), joint_head.safetensors,
// joint_head_config.json, tokenizer.json, tokenizer_config.json and processor_config.json.
//
// Presets:
//   tiny          the sizes of tests/data/tiny-clef (hidden 64, 8 layers, vocab 320, head width 32, vision
//                 depth 2 / hidden 32); same tensor names, shapes and dtypes, same config keys and tokenizer.
//   flash-shaped  Clef-Flash's real widths (hidden 4096, FFN 12288, vocab 248320, 16/4 attention heads of
//                 256, 16/32 GDN heads of 128, head width 1024, vision depth 27 / hidden 1152); 32 layers by
//                 default (~19 GB), so the weights are generated and written block by block.
//   clef27-shaped Clef's (27B) widths (hidden 5120, FFN 17408, 24/4 attention heads of 256, 16/48 GDN heads
//   of
//                 128, head hidden 5120, vision out 5120, output_gate_type "swish"); 64 layers by default.
// The layer pattern is Qwen3.5's with the default interval (model/config.h), whatever the number of layers.
//
// The tensors, their shapes, dtypes (BF16, the decay logs F32) and how each is drawn are model/tensors.h's
// tables: scales that keep activations O(1) (projections randn * fan_in^-0.5, the fused GDN projection's
// value rows x2.5 and the head's scorer output x3 as in the fixture, norms and biases near their neutral
// values).
//
// The bytes are a pure function of (preset, layers, vision, seed): each tensor's values come from its own
// splitmix64 streams keyed by the seed and the tensor name (blocks of 4096 values, each block its own
// stream), and normals from a Box-Muller transform with our own log/sin/cos polynomials and IEEE sqrt (no
// other libm, no <random> distributions), so neither the thread count, the block size nor the C++ library
// changes them. A tensor's values do not depend on which other tensors exist (e.g. --layers or --no-vision
// leave the others unchanged).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace clef {

struct MakeModelOptions {
    std::string preset;  // "tiny" | "small" (256-wide rows) | "flash-shaped" | "clef27-shaped"
    int layers = -1;     // -1: the preset's default (tiny 8, small 4, flash-shaped 32, clef27-shaped 64)
    uint64_t seed = 1;
    bool vision = true;      // false: no vision_config and no model.visual.* tensors
    size_t shard_bytes = 0;  // > 0: model-0000k-of-0000n.safetensors shards of at most this many tensor bytes
    bool configs_only = false;  // the configs, tokenizer and processor files, no weights (memory plans)
};

// Called as the weights are written: bytes written so far and the total, over all safetensors files.
using ProgressFn = std::function<void(uint64_t bytes_done, uint64_t bytes_total)>;

// Writes the model directory `out_dir` (created if needed). Files of an earlier checkpoint that would
// contradict the new one (model.safetensors, model.safetensors.index.json, model-*-of-*.safetensors) are
// removed first; other files in the directory are left alone. Throws clef::Error on a bad preset or layer
// count, or when a file cannot be written.
void make_model(const MakeModelOptions& opt, const std::string& out_dir, ProgressFn progress = {});

// The total number of bytes of the safetensors files make_model writes for these options (what progress
// reports as bytes_total).
uint64_t make_model_weight_bytes(const MakeModelOptions& opt);

}  // namespace clef
