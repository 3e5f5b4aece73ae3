// dst (bf16, two elements per 32-bit word) = src (fp32) rounded to nearest even: one invocation per word of
// dst. A word only half inside dst (an odd start or end) keeps its other half.
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer S { float src[]; };
layout(std430, binding = 1) buffer D { uint dst[]; };
layout(push_constant) uniform P { uint n, os, od, words; } p;

void main() {
    uint w = flat_id();
    if (w >= p.words) return;
    uint word = p.od / 2u + w;
    uint old = dst[word], lo = old & 0xffffu, hi = old >> 16;
    uint e0 = 2u * word, e1 = e0 + 1u;
    if (e0 >= p.od && e0 < p.od + p.n) lo = bf16_bits(src[p.os + e0 - p.od]);
    if (e1 >= p.od && e1 < p.od + p.n) hi = bf16_bits(src[p.os + e1 - p.od]);
    dst[word] = lo | (hi << 16);
}
