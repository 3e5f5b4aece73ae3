// The Qwen3.5 text backbone in plain fp32: embeddings, Gated DeltaNet and gated full-attention layers, SwiGLU
// MLPs, final zero-centred RMSNorm. The reference (oracle) for later fast paths; conventions follow HF
// (qwen35-backbone.md §2-§4, tests/data/tiny-clef/README.md "Model").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"

namespace clef {

struct BackboneOptions {
    bool chunked_delta_rule = true;  // 64-token chunked (WY) delta rule; false = token-serial recurrence
};

// Intermediate values of one forward pass, all row-major fp32 with T rows (T = tokens).
struct BackboneTrace {
    // Gated DeltaNet internals (names as in backbone_probe.json).
    struct Gdn {
        std::vector<float> conv_silu;   // [T][2*Hk*dk + Hv*dv], channels q | k | v, after conv + SiLU
        std::vector<float> q;           // [T][Hk][dk], L2-normalised and scaled by 1/sqrt(dk)
        std::vector<float> k;           // [T][Hk][dk], L2-normalised
        std::vector<float> v;           // [T][Hv][dv]
        std::vector<float> z;           // [T][Hv][dv], output gate before SiLU
        std::vector<float> beta;        // [T][Hv]
        std::vector<float> g;           // [T][Hv], log decay
        std::vector<float> delta_out;   // [T][Hv][dv], delta-rule output
        std::vector<float> gated_norm;  // [T][Hv*dv], w * rmsnorm(delta_out) * silu(z)
    };
    // Gated attention internals.
    struct Attention {
        std::vector<float> q_rope;  // [T][H*hd], after q_norm and RoPE
        std::vector<float> k_rope;  // [T][Hkv*hd], after k_norm and RoPE
        std::vector<float> v;       // [T][Hkv*hd]
        std::vector<float> gate;    // [T][H*hd], before the sigmoid
        std::vector<float> attn;    // [T][H*hd], softmax(QK^T/sqrt(hd))V before the gate
    };
    struct Layer {
        std::vector<float> input_norm;  // [T][hidden], the mixer input
        std::vector<float> mixer_out;   // [T][hidden], before the residual add
        std::vector<float> layer_out;   // [T][hidden], residual stream after the layer (MLP included)
        Gdn gdn;                        // filled for linear-attention layers when internals are recorded
        Attention attention;            // filled for full-attention layers when internals are recorded
    };

    // Inputs: which layers record their mixer internals (empty = none; the probe test asks for {0, 3}).
    std::vector<int> internals_for_layers;
    // Outputs: one entry per layer.
    std::vector<Layer> layers;
};

class Backbone {
public:
    // Reads the text weights from the checkpoint (prefix "model.language_model." or "model." auto-detected),
    // converting BF16/F16 to fp32 at load. Validates the config and every tensor's shape against it
    // (clef::Error naming the tensor).
    Backbone(const TextConfig& cfg, const Checkpoint& ckpt);

    const TextConfig& config() const { return cfg_; }
    // The detected tensor-name prefix ("model.language_model." or "model.").
    const std::string& prefix() const { return prefix_; }

    // Embedding rows for ids, [ids.size()][hidden] (ids must be in [0, vocab_size), else clef::Error).
    std::vector<float> embed(const std::vector<int32_t>& ids) const;

    // Runs all layers + final norm on input embeddings x [T][hidden]; positions is [3][T] (t, h, w) or
    // nullptr for text positions 0..T-1 on all three axes. Returns last_hidden_state [T][hidden], row-major
    // fp32.
    std::vector<float> forward_embeddings(const std::vector<float>& x, int64_t T, const int32_t* positions,
                                          const BackboneOptions& opt = {},
                                          BackboneTrace* trace = nullptr) const;
    // embed + forward_embeddings with text positions.
    std::vector<float> forward(const std::vector<int32_t>& ids, const BackboneOptions& opt = {}) const;

private:
    struct GdnWeights {
        std::vector<float> in_proj_qkv, in_proj_z, in_proj_a, in_proj_b, out_proj;
        std::vector<float> conv1d;  // [conv_dim][K]
        std::vector<float> A_log, dt_bias, norm;
        std::vector<float> neg_exp_A;  // -exp(A_log), precomputed
    };
    struct AttentionWeights {
        std::vector<float> q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
    };
    struct Layer {
        LayerType type = LayerType::LinearAttention;
        std::vector<float> input_layernorm, post_attention_layernorm;
        std::vector<float> gate_proj, up_proj, down_proj;
        GdnWeights gdn;
        AttentionWeights attn;
    };

    void gdn_mixer(const Layer& L, const float* xn, int64_t T, const BackboneOptions& opt, float* out,
                   BackboneTrace::Gdn* tr) const;
    void attention_mixer(const Layer& L, const float* xn, int64_t T, const float* cos, const float* sin,
                         float* out, BackboneTrace::Attention* tr) const;
    void mlp(const Layer& L, const float* xn, int64_t T, float* out) const;

    TextConfig cfg_;
    std::string prefix_;
    std::vector<float> embed_tokens_;  // [vocab][hidden]
    std::vector<float> final_norm_;
    std::vector<Layer> layers_;
};

}  // namespace clef
