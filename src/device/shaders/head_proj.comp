// The joint head's factored memory attention around the attention kernel (ops/attention_fast.cpp
// memory_attention_fast), one output value per invocation:
//   MODE 0  qt[i][h][c] = scale * sum_{d < dh} q[i][h dh + d] * wk[h dh + d][c]      (query in memory space)
//   MODE 1  out[i][h dh + d] = sum_c wv[h dh + d][c] * ctx[i][h][c] + bv[h dh + d]
// with q, out [lq][w], wk, wv [w][w], qt, ctx [lq][heads][w].
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };   // MODE 0: q; MODE 1: ctx
layout(std430, binding = 1) readonly buffer Wt { float w[]; };  // wk or wv
layout(std430, binding = 2) readonly buffer Bi { float bv[]; };
layout(std430, binding = 3) buffer Y { float y[]; };   // MODE 0: qt; MODE 1: out
layout(push_constant) uniform P { uint lq, heads, w, oa, ow, ob, oy, mode; float scale; } p;

void main() {
    uint idx = flat_id(), dh = p.w / p.heads;
    if (idx >= p.lq * p.w * (p.mode == 0u ? p.heads : 1u)) return;
    float acc = 0.0;
    if (p.mode == 0u) {
        uint c = idx % p.w, h = (idx / p.w) % p.heads, i = idx / (p.w * p.heads);
        for (uint d = 0u; d < dh; ++d) acc += a[p.oa + i * p.w + h * dh + d] * w[p.ow + (h * dh + d) * p.w + c];
        y[p.oy + idx] = p.scale * acc;
        return;
    }
    uint col = idx % p.w, i = idx / p.w, h = col / dh;
    for (uint c = 0u; c < p.w; ++c) acc += w[p.ow + col * p.w + c] * a[p.oa + (i * p.heads + h) * p.w + c];
    y[p.oy + idx] = acc + bv[p.ob + col];
}
