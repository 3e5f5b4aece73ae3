// The slices of a split-K GEMM added in order (gemm_tile.glsl): y[m][col0 + n] = sum_z part[z][m][n] + b.
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Pt { float part[]; };
layout(std430, binding = 1) readonly buffer Bi { float bias[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint M, N, S, oy, y_ld, col0, has_bias; } p;

void main() {
    uint e = flat_id();
    if (e >= p.M * p.N) return;
    uint m = e / p.N, n = e % p.N;
    float s = 0.0;
    for (uint z = 0u; z < p.S; ++z) s += part[z * p.M * p.N + e];
    y[p.oy + m * p.y_ld + p.col0 + n] = s + (p.has_bias != 0u ? bias[p.col0 + n] : 0.0);
}
