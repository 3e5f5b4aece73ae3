// Row norms, one workgroup per row of d values (ops/basic.cpp's references):
//   KIND 0 RMSNorm  y = x / sqrt(mean(x^2) + eps) * W, W = w (WMODE 1), 1 + w (WMODE 2) or 1 (WMODE 0),
//          times gate(z) when GATE is 1 (silu) or 2 (sigmoid);
//   KIND 1 LayerNorm y = (x - mean) / sqrt(var + eps) * w + b (biased variance, two passes);
//   KIND 2 L2 norm  y = x * scale / sqrt(sum(x^2) + eps) (the delta rule's q and k, per head).
// Row r reads x at ox + (r / per) * x_ld + (r % per) * d (heads of a strided row; per = 1: plain rows) and
// writes y at oy + r * d. y may alias x: each value is read before the barrier that precedes the writes.
#version 450
#include "common.glsl"
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer Bz { float bz[]; };  // LayerNorm's bias, or the gate's z
layout(std430, binding = 3) buffer Y { float y[]; };
layout(push_constant) uniform P {
    uint rows, d, ox, x_ld, per, ow, obz, oy, kind, wmode, gate;
    float eps, scale;
} p;

shared float red[128];

float block_sum(float v) {
    red[gl_LocalInvocationID.x] = v;
    barrier();
    [[unroll]] for (uint s = 64u; s > 0u; s >>= 1) {
        if (gl_LocalInvocationID.x < s) red[gl_LocalInvocationID.x] += red[gl_LocalInvocationID.x + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (r >= p.rows) return;
    uint tid = gl_LocalInvocationID.x;
    uint xb = p.ox + (r / p.per) * p.x_ld + (r % p.per) * p.d, yb = p.oy + r * p.d;
    float mean = 0.0, inv;
    if (p.kind == 1u) {
        float s = 0.0;
        for (uint i = tid; i < p.d; i += 128u) s += x[xb + i];
        mean = block_sum(s) / float(p.d);
        float v = 0.0;
        for (uint i = tid; i < p.d; i += 128u) { float c = x[xb + i] - mean; v += c * c; }
        inv = 1.0 / sqrt(block_sum(v) / float(p.d) + p.eps);
    } else {
        float s = 0.0;
        for (uint i = tid; i < p.d; i += 128u) s += x[xb + i] * x[xb + i];
        float ss = block_sum(s);
        inv = p.kind == 0u ? 1.0 / sqrt(ss / float(p.d) + p.eps) : p.scale / sqrt(ss + p.eps);
    }
    for (uint i = tid; i < p.d; i += 128u) {
        float v = (x[xb + i] - mean) * inv;
        if (p.kind == 1u) {
            v = v * w[p.ow + i] + bz[p.obz + i];
        } else if (p.kind == 0u) {
            if (p.wmode == 1u) v *= w[p.ow + i];
            if (p.wmode == 2u) v *= 1.0 + w[p.ow + i];
            float z = p.gate != 0u ? bz[p.obz + r * p.d + i] : 0.0;
            if (p.gate == 1u) v *= silu_f(z);
            if (p.gate == 2u) v *= sigmoid_f(z);
        }
        y[yb + i] = v;
    }
}
