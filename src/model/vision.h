// The Qwen3.5 vision tower and patch merger, as transformers' Qwen3_5VisionModel computes it
// (tests/data/tiny-clef/README.md "Images"):
//   patch embedding (the Conv3d with kernel = stride as a matrix over patch_dim = C·T·P·P inputs),
//   + the learned position grid interpolated bilinearly (align_corners) to the image's patch grid,
//   blocks: x += proj(attn(rope2d(qkv(LN1(x))))), x += fc2(act(fc1(LN2(x)))) with bidirectional attention per
//   image and frame and a 2-D rotary embedding (row angles | column angles, θ 10000) over the full head_dim,
//   merger: LN, 2x2 blocks of patch rows concatenated, fc1, exact GELU, fc2 -> out_hidden_size.
// Rows are patches in the processor's merge-block order throughout.
//
// Every step runs through one stream of the tower's device (device/device.h: one upload of the pixels and of
// the grid's tables, one download of the merged rows). The CPU device has two paths: the fast path (the
// default) runs every projection as an ops::PackedLinear packed once at load from the checkpoint's own dtype
// (Precision::Exact: fp32-accurate), ops::attention_fast (bidirectional, per frame), and the norms and
// activations on all kernel threads. The reference path (reference = true, the oracle the fast path is tested
// against) runs device/linear.h's reference projections, ops::attention and the scalar ops.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "io/weight_source.h"
#include "model/config.h"
#include "model/tensors.h"
#include "ops/gemm.h"

namespace clef {

// Every stage of one forward pass (names as in tests/data/tiny-clef/vision_probe.json), row-major fp32.
struct VisionTrace {
    struct Block {
        std::vector<float> norm1;      // [N][hidden]
        std::vector<float> q_rope;     // [N][heads][head_dim], after the rotary embedding
        std::vector<float> k_rope;     // [N][heads][head_dim]
        std::vector<float> v;          // [N][heads][head_dim]
        std::vector<float> attn;       // [N][hidden], heads concatenated, before proj
        std::vector<float> attn_out;   // [N][hidden], after proj
        std::vector<float> norm2;      // [N][hidden]
        std::vector<float> mlp_out;    // [N][hidden], after fc2
        std::vector<float> block_out;  // [N][hidden], the residual stream after the block
    };
    std::vector<float> patch_embed;       // [N][hidden]
    std::vector<float> pos_embed;         // [N][hidden]
    std::vector<int32_t> rotary_row_col;  // [N][2]
    std::vector<float> rotary_cos;        // [N][head_dim]
    std::vector<float> rotary_sin;        // [N][head_dim]
    std::vector<float> embeddings;        // [N][hidden], patch_embed + pos_embed
    std::vector<Block> blocks;
    std::vector<float> merger_norm;      // [N][hidden]
    std::vector<float> merger_in;        // [N/m²][m²·hidden]
    std::vector<float> merger_fc1_gelu;  // [N/m²][m²·hidden]
    std::vector<float> merged;           // [N/m²][out_hidden]
};

class VisionTower {
public:
    // Reads `prefix`* (default model.visual.) from the checkpoint and checks every shape against the config
    // (clef::Error naming the tensor). Fast path: the matrices are packed (BF16/F16 kept as they are, other
    // dtypes through fp32) and no fp32 copy is kept; reference = true: every tensor converted to fp32.
    // The checkpoint need not outlive the tower.
    // Its matrices and vectors live on `device` and every forward pass runs on one stream of it.
    VisionTower(const VisionConfig& cfg, const WeightSource& ckpt, const std::string& prefix = kVisionPrefix,
                bool reference = false, dev::Device& device = dev::cpu());

    // Whether the checkpoint holds a vision tower under prefix (its patch embedding).
    static bool in_checkpoint(const WeightSource& ckpt, const std::string& prefix = kVisionPrefix);
    // Whether a model directory has a vision tower: a vision_config in config.json and the tower's weights.
    // Throws clef::Error when the directory, its config or its weights cannot be read.
    static bool in_model_dir(const std::string& model_dir);

    const VisionConfig& config() const { return cfg_; }
    bool reference() const { return reference_; }
    const dev::Device& device() const { return *dev_; }
    int patch_dim() const {
        return cfg_.in_channels * cfg_.temporal_patch_size * cfg_.patch_size * cfg_.patch_size;
    }

    // One image (or video): pixel_values [grid_t·grid_h·grid_w][patch_dim] in merge-block order; grid_h and
    // grid_w multiples of spatial_merge_size. Returns [N / merge²][out_hidden_size] (the rows its pad tokens
    // take).
    std::vector<float> forward(const float* pixel_values, int grid_t, int grid_h, int grid_w,
                               VisionTrace* trace = nullptr) const;

private:
    struct Norm {  // a LayerNorm's weight and bias on the device
        dev::Tensor w, b;
    };
    struct Block {
        Norm norm1, norm2;
        std::unique_ptr<dev::Matrix> qkv, proj, fc1, fc2;
    };

    // Reads the weights from the checkpoint (the vision table's modules under prefix).
    void load_weights(const WeightSource& ckpt, const std::string& prefix);
    Norm load_norm(const WeightSource& ckpt, const ModuleRef& m) const;
    struct Grid;  // the patch grid of one image (vision.cpp)
    struct Run;   // one forward pass's stream and activations (vision.cpp)
    Grid patch_grid(int grid_t, int grid_h, int grid_w) const;
    void add_position_embedding(Run& r) const;
    void rotary_tables(Run& r) const;
    void attention_block(const Block& b, Run& r, VisionTrace::Block* tb) const;
    void mlp_block(const Block& b, Run& r, VisionTrace::Block* tb) const;
    std::vector<float> merge(Run& r) const;

    VisionConfig cfg_;
    bool reference_ = false;
    int head_dim_ = 0;
    int grid_side_ = 0;  // the learned position grid is grid_side x grid_side
    bool act_tanh_ = true;
    dev::Device* dev_;
    std::unique_ptr<dev::Matrix> patch_embed_;
    std::vector<float> pos_embed_;  // [num_position_embeddings][hidden]
    std::vector<Block> blocks_;
    Norm merger_norm_;
    std::unique_ptr<dev::Matrix> merger_fc1_, merger_fc2_;
};

// FLOPs of one forward pass over grid_t x grid_h x grid_w patches (multiply-adds count 2): the patch
// embedding, every block's projections and MLP (2 * in * out per patch), bidirectional attention within each
// frame (4 * hidden per query-key pair), and the merger. Norms, activations and the rotary embedding are left
// out.
double vision_flops(const VisionConfig& cfg, int64_t grid_t, int64_t grid_h, int64_t grid_w);

}  // namespace clef
