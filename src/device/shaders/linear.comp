// The projection GEMM on fp32 FMAs (device/device.h Stream::linear; the exact default): one BM x BN tile of y
// per workgroup, TM x TN outputs per invocation (register blocking: per k, TM/4 + TN/4 vector reads of
// shared memory feed TM TN FMAs), K in steps of BK through two shared buffers (the next step's tiles are
// loaded from memory into registers while this step's are multiplied, so one barrier per step), fp32
// accumulation. The tile shape is chosen per device and shape by the host (device/vk_device.cpp GemmShape)
// through specialisation constants. Loads and the split of K: gemm_tile.glsl.
#version 450
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256u;  // (BM / TM) (BN / TN)
layout(constant_id = 1) const uint BM = 64u;
layout(constant_id = 2) const uint BN = 64u;
layout(constant_id = 3) const uint TM = 4u;  // multiples of 4
layout(constant_id = 4) const uint TN = 4u;
const uint BK = 16u;
const uint XU = (BM * 2u + WG - 1u) / WG;  // 8-value runs of the x tile per invocation (BK / 8 per row)
const uint WU = (BN * 2u + WG - 1u) / WG;

#include "gemm_tile.glsl"

shared vec4 xs[2u * BK * BM / 4u];  // [buffer][k][m]
shared vec4 ws[2u * BK * BN / 4u];  // [buffer][k][n]

float xr[XU * 8u], wr[WU * 8u];  // the next step's runs, in registers
float acc[TM * TN];
uint m0, n0;

void fetch(uint k0) {
    uint t = gl_LocalInvocationID.x;
    float v[8];
    [[unroll]] for (uint u = 0u; u < XU; ++u) {
        uint r = t + u * WG;
        load_x8(r < BM * 2u ? m0 + r / 2u : p.M, k0 + (r % 2u) * 8u, v);
        [[unroll]] for (uint i = 0u; i < 8u; ++i) xr[u * 8u + i] = v[i];
    }
    [[unroll]] for (uint u = 0u; u < WU; ++u) {
        uint r = t + u * WG;
        load_w8(r < BN * 2u ? n0 + r / 2u : p.N, k0 + (r % 2u) * 8u, v);
        [[unroll]] for (uint i = 0u; i < 8u; ++i) wr[u * 8u + i] = v[i];
    }
}

// The registers into shared buffer b, transposed to [k][row].
void put(uint b) {
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint u = 0u; u < XU; ++u) {
        uint r = t + u * WG;
        if (r >= BM * 2u) break;
        [[unroll]] for (uint i = 0u; i < 8u; ++i) {
            uint e = (b * BK + (r % 2u) * 8u + i) * BM + r / 2u;
            xs[e >> 2][e & 3u] = xr[u * 8u + i];
        }
    }
    [[unroll]] for (uint u = 0u; u < WU; ++u) {
        uint r = t + u * WG;
        if (r >= BN * 2u) break;
        [[unroll]] for (uint i = 0u; i < 8u; ++i) {
            uint e = (b * BK + (r % 2u) * 8u + i) * BN + r / 2u;
            ws[e >> 2][e & 3u] = wr[u * 8u + i];
        }
    }
}

void multiply(uint b, uint tm, uint tn) {
    [[unroll]] for (uint kk = 0u; kk < BK; ++kk) {
        vec4 a[TM / 4u], w[TN / 4u];
        [[unroll]] for (uint i = 0u; i < TM / 4u; ++i) a[i] = xs[((b * BK + kk) * BM + tm * TM) / 4u + i];
        [[unroll]] for (uint j = 0u; j < TN / 4u; ++j) w[j] = ws[((b * BK + kk) * BN + tn * TN) / 4u + j];
        [[unroll]] for (uint i = 0u; i < TM; ++i)
            [[unroll]] for (uint j = 0u; j < TN; ++j)
                acc[i * TN + j] = fma(a[i / 4u][i % 4u], w[j / 4u][j % 4u], acc[i * TN + j]);
    }
}

void main() {
    uint t = gl_LocalInvocationID.x, tn = t % (BN / TN), tm = t / (BN / TN);
    n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM;
    [[unroll]] for (uint i = 0u; i < TM * TN; ++i) acc[i] = 0.0;
    uint k0 = k_begin(), steps = (k_end() - k0 + BK - 1u) / BK;
    fetch(k0);
    put(0u);
    barrier();
    for (uint s = 0u; s < steps; ++s) {
        bool more = s + 1u < steps;
        if (more) fetch(k0 + (s + 1u) * BK);
        multiply(s & 1u, tm, tn);
        if (more) put((s + 1u) & 1u);
        barrier();
    }
    [[unroll]] for (uint i = 0u; i < TM; ++i)
        [[unroll]] for (uint j = 0u; j < TN; ++j) store_y(m0 + tm * TM + i, n0 + tn * TN + j, acc[i * TN + j]);
}
