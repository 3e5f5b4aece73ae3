// The text backbone's weights of one decoder layer, as its loader places them: model/tensors.cpp's text
// table names each field's tensor and carries its TextSlot, model/backbone.cpp fills them from a checkpoint.
#pragma once

#include <vector>

namespace clef {

class Linear;  // model/linear.h

struct TextGdnWeights {
    const Linear *qkv = nullptr, *z = nullptr, *a = nullptr, *b = nullptr, *out = nullptr;
    std::vector<float> conv;  // [conv_dim][K]
    std::vector<float> log_decay_rate, dt_bias, norm;
    std::vector<float> neg_exp_A;  // -exp(log_decay_rate), precomputed
};

struct TextAttentionWeights {
    const Linear *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    std::vector<float> q_norm, k_norm;
};

struct TextLayerWeights {
    std::vector<float> input_norm, post_norm;
    const Linear *gate = nullptr, *up = nullptr, *down = nullptr;
    TextGdnWeights gdn;
    TextAttentionWeights attn;
};

}  // namespace clef
