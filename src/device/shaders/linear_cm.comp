// The projection GEMM on tensor cores (an opt-in precision: fp16 operands, fp32 accumulation; device/device.h
// Stream::linear with StreamOptions::precision F16): one 64 x 64 tile of y per workgroup of WG invocations in
// subgroups of SG, each subgroup owning FPS of its sixteen 16 x 16 fragments (a strip of one fragment row), K
// in steps of 16 through two shared buffers of fp16 tiles (the next step's loaded into registers while this
// one is multiplied: one barrier per step), the accumulators through shared memory to y at the end. The
// fragment interface and its two implementations: coopmat.glsl. Loads, split K: gemm_tile.glsl.
//
// Operands are rounded to fp16 (to nearest) where the tiles are stored; an activation beyond fp16's range
// saturates at +-65504 instead of becoming infinite.
#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#ifdef COOPMAT_NV
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#endif
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128u;
layout(constant_id = 1) const uint SG = 32u;  // the device's subgroup size: WG / SG divides 16
const uint BM = 64u, BN = 64u, BK = 16u;
const uint AS = BK + 8u;   // tile row stride in halves: 48-byte rows, 16-byte aligned fragments
const uint CS = BN + 4u;   // result row stride in floats
const uint FPS = 16u / (WG / SG);
const uint XU = (BM * 2u + WG - 1u) / WG;
const uint WU = (BN * 2u + WG - 1u) / WG;

#include "gemm_tile.glsl"

shared float16_t as_[2u * BM * AS];  // [buffer][m][k]
shared float16_t bs_[2u * BN * AS];  // [buffer][n][k]
shared float cs_[BM * CS];

#include "coopmat.glsl"

float16_t half_sat(float v) { return float16_t(clamp(v, -65504.0, 65504.0)); }

float16_t xr[XU * 8u], wr[WU * 8u];
uint m0, n0;

void fetch(uint k0) {
    uint t = gl_LocalInvocationID.x;
    float v[8];
    [[unroll]] for (uint u = 0u; u < XU; ++u) {
        uint r = t + u * WG;
        load_x8(r < BM * 2u ? m0 + r / 2u : p.M, k0 + (r % 2u) * 8u, v);
        [[unroll]] for (uint i = 0u; i < 8u; ++i) xr[u * 8u + i] = half_sat(v[i]);
    }
    [[unroll]] for (uint u = 0u; u < WU; ++u) {
        uint r = t + u * WG;
        load_w8(r < BN * 2u ? n0 + r / 2u : p.N, k0 + (r % 2u) * 8u, v);
        [[unroll]] for (uint i = 0u; i < 8u; ++i) wr[u * 8u + i] = half_sat(v[i]);
    }
}

void put(uint b) {
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint u = 0u; u < XU; ++u) {
        uint r = t + u * WG;
        if (r >= BM * 2u) break;
        [[unroll]] for (uint i = 0u; i < 8u; ++i) as_[(b * BM + r / 2u) * AS + (r % 2u) * 8u + i] = xr[u * 8u + i];
    }
    [[unroll]] for (uint u = 0u; u < WU; ++u) {
        uint r = t + u * WG;
        if (r >= BN * 2u) break;
        [[unroll]] for (uint i = 0u; i < 8u; ++i) bs_[(b * BN + r / 2u) * AS + (r % 2u) * 8u + i] = wr[u * 8u + i];
    }
}

void main() {
    uint t = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM;
    FragAcc acc[FPS];
    [[unroll]] for (uint f = 0u; f < FPS; ++f) acc[f] = frag_zero();
    uint k0 = k_begin(), steps = (k_end() - k0 + BK - 1u) / BK;
    fetch(k0);
    put(0u);
    barrier();
    for (uint s = 0u; s < steps; ++s) {
        bool more = s + 1u < steps;
        if (more) fetch(k0 + (s + 1u) * BK);
        uint b = s & 1u;
        [[unroll]] for (uint f = 0u; f < FPS; ++f) {
            uint frag = sg * FPS + f, fi = frag / 4u, fj = frag % 4u;
            frag_mma(acc[f], (b * BM + fi * 16u) * AS, (b * BN + fj * 16u) * AS);
        }
        if (more) put((s + 1u) & 1u);
        barrier();
    }
    [[unroll]] for (uint f = 0u; f < FPS; ++f) {
        uint frag = sg * FPS + f;
        frag_store(acc[f], (frag / 4u) * 16u * CS + (frag % 4u) * 16u);
    }
    barrier();
    for (uint e = t; e < BM * BN; e += WG) store_y(m0 + e / BN, n0 + e % BN, cs_[(e / BN) * CS + e % BN]);
}
