// Rotary embedding in place (ops/rope.cpp rope_apply): one invocation per (t, head, i < rotary_dim/2) rotates
// the pair (i, i + half) of that head by the angle whose cos and sin are at row t of the tables.
// SPLIT = 1 instead splits q_proj rows [query hd | gate hd] per head into q and gate (x -> a, b).
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) buffer Cs { float cs[]; };
layout(std430, binding = 2) buffer Sn { float sn[]; };
layout(push_constant) uniform P { uint T, heads, hd, ld, half_dim, ox, oc, os, split; } p;

void main() {
    uint i = flat_id();
    if (p.split != 0u) {  // x: qg, cs: q, sn: gate; i over T * heads * hd
        if (i >= p.T * p.heads * p.hd) return;
        uint d = i % p.hd, th = i / p.hd;
        cs[p.oc + i] = x[p.ox + th * 2u * p.hd + d];
        sn[p.os + i] = x[p.ox + th * 2u * p.hd + p.hd + d];
        return;
    }
    if (i >= p.T * p.heads * p.half_dim) return;
    uint k = i % p.half_dim, th = i / p.half_dim, h = th % p.heads, t = th / p.heads;
    uint base = p.ox + t * p.ld + h * p.hd;
    float a = x[base + k], b = x[base + k + p.half_dim];
    float c = cs[p.oc + t * p.half_dim + k], s = sn[p.os + t * p.half_dim + k];
    x[base + k] = a * c - b * s;
    x[base + k + p.half_dim] = b * c + a * s;
}
