// The text backbone's weights of one decoder layer, as its loader places them on the device:
// model/tensors.cpp's text table names each field's tensor and carries its TextSlot, model/backbone.cpp fills
// them from a checkpoint.
#pragma once

#include "device/device.h"

namespace clef {

struct TextGdnWeights {
    const dev::Matrix *qkv = nullptr, *z = nullptr, *a = nullptr, *b = nullptr, *out = nullptr;
    dev::Tensor conv;                           // [conv_dim][K]
    dev::Tensor log_decay_rate, dt_bias, norm;  // A_log, dt_bias, the gated norm's weight
};

struct TextAttentionWeights {
    const dev::Matrix *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    dev::Tensor q_norm, k_norm;
};

struct TextLayerWeights {
    dev::Tensor input_norm, post_norm;
    const dev::Matrix *gate = nullptr, *up = nullptr, *down = nullptr;
    TextGdnWeights gdn;
    TextAttentionWeights attn;
};

}  // namespace clef
