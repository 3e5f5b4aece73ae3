// The GatedDeltaNet's causal depthwise conv1d with SiLU (ops/conv.cpp causal_conv1d_silu): x [T][C], taps
// w [C][K], state [K-1][C] (the input rows before the chunk). PHASE 0: y[t][c] for one (t, c) per
// invocation; PHASE 1 (dispatched after it): state = the last K-1 input rows, one channel per invocation
// (read into registers before the writes, so the in-place shift is safe).
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) buffer S { float st[]; };
layout(std430, binding = 3) buffer Y { float y[]; };
layout(push_constant) uniform P { uint T, C, K, ox, ow, os, oy, phase; } p;

float row_at(int pos, uint c) {  // input at sequence position pos (negative: the state)
    if (pos >= 0) return x[p.ox + uint(pos) * p.C + c];
    return st[p.os + uint(int(p.K) - 1 + pos) * p.C + c];
}

void main() {
    uint i = flat_id();
    int pad = int(p.K) - 1;
    if (p.phase == 0u) {
        if (i >= p.T * p.C) return;
        uint t = i / p.C, c = i % p.C;
        float acc = 0.0;
        for (int j = 0; j < int(p.K); ++j) acc += w[p.ow + c * p.K + uint(j)] * row_at(int(t) - pad + j, c);
        y[p.oy + i] = silu_f(acc);
        return;
    }
    if (i >= p.C) return;
    float keep[16];
    for (int r = 0; r < pad; ++r) keep[r] = row_at(int(p.T) - pad + r, i);
    for (int r = 0; r < pad; ++r) st[p.os + uint(r) * p.C + i] = keep[r];
}
