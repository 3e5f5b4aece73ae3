// The projection GEMMs' common part (linear.comp, linear_cm.comp): y[m][col0 + n] = sum_k x[m][k] W[n][k] + b,
// with W rows col0 .. of the matrix (device/vk_device.cpp splits a matrix too large for one binding into row
// parts). Bindings, push constants, and the tile loads: 8 consecutive k of one row at a time (one 32-byte
// vector load of x, one 16-byte load of bf16 / f16 weights, one block run of a ggml type with its scales
// decoded once, dequant.glsl), zero past the matrix's edges.
//
// Split K: workgroup z sums k in [z kchunk, min(K, (z + 1) kchunk)) and writes its partial sums at
// y + z M y_ld (the host binds a scratch buffer there and adds the slices with linear_reduce.comp).
//
// The including shader defines WTYPE: 0 F32, 1 BF16, 2 F16 (two elements per 32-bit word), 3 and up the ggml
// block types (dequant.glsl).
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };
#if WTYPE == 0
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 1) readonly buffer Wt4 { vec4 w4[]; };
#else
layout(std430, binding = 1) readonly buffer Wt { uint w[]; };
layout(std430, binding = 1) readonly buffer Wt4 { uvec4 w4[]; };
#endif
layout(std430, binding = 2) readonly buffer Bi { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer Tb { uint tab[]; };
layout(push_constant) uniform P { uint M, N, K, ox, x_ld, oy, y_ld, col0, has_bias, kchunk; } p;

#if WTYPE >= 3
#include "dequant.glsl"
#endif

// x[m][k .. k+7] (0 past M or K).
void load_x8(uint m, uint k, out float v[8]) {
    uint e = p.ox + m * p.x_ld + k;
    if (m < p.M && k + 8u <= p.K && (e & 3u) == 0u) {
        vec4 a = x4[e >> 2], b = x4[(e >> 2) + 1u];
        v = float[8](a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
        return;
    }
    [[unroll]] for (uint i = 0u; i < 8u; ++i) v[i] = m < p.M && k + i < p.K ? x[e + i] : 0.0;
}

#if WTYPE == 1 || WTYPE == 2
// Element e of a matrix of 16-bit values, two to a 32-bit word, the lower first.
float w16(uint word, uint e) {
#if WTYPE == 1
    return bf16_at(word, e);
#else
    vec2 h = unpackHalf2x16(word);
    return (e & 1u) == 0u ? h.x : h.y;
#endif
}
#endif

// W[n][k .. k+7] as both devices multiply by it (0 past N or K).
void load_w8(uint n, uint k, out float v[8]) {
    if (n >= p.N) {
        v = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        return;
    }
#if WTYPE >= 3
    dequant8(n, k, p.K, v);  // K is a whole number of blocks: the run lies in the row
#else
    uint e = n * p.K + k;
    bool whole = k + 8u <= p.K;
#if WTYPE == 0
    if (whole && (e & 3u) == 0u) {
        vec4 a = w4[e >> 2], b = w4[(e >> 2) + 1u];
        v = float[8](a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
        return;
    }
    [[unroll]] for (uint i = 0u; i < 8u; ++i) v[i] = k + i < p.K ? w[e + i] : 0.0;
#else
    if (whole && (e & 7u) == 0u) {
        uvec4 u = w4[e >> 3];
        [[unroll]] for (uint c = 0u; c < 4u; ++c) {
            v[2u * c] = w16(u[c], 0u);
            v[2u * c + 1u] = w16(u[c], 1u);
        }
        return;
    }
    [[unroll]] for (uint i = 0u; i < 8u; ++i) v[i] = k + i < p.K ? w16(w[(e + i) >> 1], e + i) : 0.0;
#endif
#endif
}

// The K range of this workgroup's slice.
uint k_begin() { return gl_WorkGroupID.z * p.kchunk; }
uint k_end() { return min(p.K, k_begin() + p.kchunk); }

// One output of this workgroup's slice: y (partial sums of a split K have no bias).
void store_y(uint m, uint n, float v) {
    if (m >= p.M || n >= p.N) return;
    y[p.oy + gl_WorkGroupID.z * p.M * p.y_ld + m * p.y_ld + p.col0 + n] =
        v + (p.has_bias != 0u ? bias[p.col0 + n] : 0.0);
}
