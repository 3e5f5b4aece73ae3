// y[m][col0 + o] = sum_k x[m][k] * W[o][k] + b[col0 + o] (W: rows col0 .. of the matrix): the projection GEMM
// (device/device.h Stream::linear), one 64 x 64 tile of y per workgroup, 4 x 4 values per invocation, K in
// steps of 16 through shared memory, fp32 accumulation. The weights stay in their file's type and are widened
// in the tile load, by WTYPE: 0 F32, 1 BF16, 2 F16 (two elements per 32-bit word), 3 and up the ggml block
// types (dequant.glsl).
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
#if WTYPE == 0
layout(std430, binding = 1) buffer Wt { float w[]; };
#else
layout(std430, binding = 1) buffer Wt { uint w[]; };
#endif
layout(std430, binding = 2) buffer Bi { float bias[]; };
layout(std430, binding = 3) buffer Y { float y[]; };
layout(std430, binding = 4) buffer Tb { uint tab[]; };
layout(push_constant) uniform P { uint M, N, K, ox, x_ld, oy, y_ld, col0, has_bias; } p;

shared float xs[16][65];
shared float ws[16][65];

#if WTYPE >= 3
#include "dequant.glsl"
#endif

float wval(uint o, uint k) {
#if WTYPE == 0
    return w[o * p.K + k];
#elif WTYPE == 1
    uint e = o * p.K + k;
    return bf16_at(w[e >> 1], e);
#elif WTYPE == 2
    uint e = o * p.K + k;
    vec2 h = unpackHalf2x16(w[e >> 1]);
    return (e & 1u) == 0u ? h.x : h.y;
#else
    return wval_block(o, k, p.K);
#endif
}

void main() {
    uint t = gl_LocalInvocationID.x, tx = t % 16u, ty = t / 16u;
    uint n0 = gl_WorkGroupID.x * 64u, m0 = gl_WorkGroupID.y * 64u;
    float acc[4][4];
    [[unroll]] for (uint a = 0u; a < 4u; ++a) [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = 0.0;
    for (uint k0 = 0u; k0 < p.K; k0 += 16u) {
        [[unroll]] for (uint r = 0u; r < 4u; ++r) {
            uint idx = t + r * 256u, row = idx / 16u, kk = idx % 16u, k = k0 + kk;
            uint m = m0 + row, n = n0 + row;
            xs[kk][row] = (m < p.M && k < p.K) ? x[p.ox + m * p.x_ld + k] : 0.0;
            ws[kk][row] = (n < p.N && k < p.K) ? wval(n, k) : 0.0;
        }
        barrier();
        [[unroll]] for (uint kk = 0u; kk < 16u; ++kk) {
            float xv[4], wv[4];
            [[unroll]] for (uint a = 0u; a < 4u; ++a) xv[a] = xs[kk][ty + 16u * a];
            [[unroll]] for (uint b = 0u; b < 4u; ++b) wv[b] = ws[kk][tx + 16u * b];
            [[unroll]] for (uint a = 0u; a < 4u; ++a)
                [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = fma(xv[a], wv[b], acc[a][b]);
        }
        barrier();
    }
    [[unroll]] for (uint a = 0u; a < 4u; ++a) {
        uint m = m0 + ty + 16u * a;
        if (m >= p.M) continue;
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            uint n = n0 + tx + 16u * b;
            if (n >= p.N) continue;
            y[p.oy + m * p.y_ld + p.col0 + n] = acc[a][b] + (p.has_bias != 0u ? bias[p.col0 + n] : 0.0);
        }
    }
}
