// The chunked gated delta rule, first pass: the intra-chunk products of every 64-token chunk, all chunks in
// parallel (ops/delta_rule.h gated_delta_rule_chunked's algebra; device/vk_device.cpp VkStream::delta_rule runs
// delta_scan.comp after it). One workgroup per (chunk, value head h); with G the chunk's cumulative log decays
// (fp32, summed in token order as the CPU does):
//   A = strictly lower part of diag(beta) (K Kᵀ) o exp(G_i - G_j);  T = (I + A)^-1
//   W = T diag(beta exp(G)) K,  U = T diag(beta) V,  P = lower part, diagonal included, of (Q Kᵀ) o exp(G_i - G_j)
// The mask is applied before exp, so only differences <= 0 are exponentiated. T comes from its 16x16
// diagonal blocks (forward substitution, one column per invocation, in registers) merged block row by block
// row (T_ij = -T_ii sum_k A_ik T_kj). The products are 64x64 output tiles, 4x4 outputs per invocation, with
// the inner dimension staged through shared memory in slabs of 16. Writes the chunk's rows (token < T) of
// W [Hv][R][dk], U [Hv][R][dv], P [Hv][R][64] and G [Hv][R] of the scratch buffer (R: the rows of whole
// chunks). Shared memory: 26,112 bytes.
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer Bt { float beta[]; };
layout(std430, binding = 4) readonly buffer G { float g[]; };
layout(std430, binding = 5) writeonly buffer X { float x[]; };
layout(push_constant) uniform P {
    uint T, Hk, Hv, dk, dv, q_ld, k_ld, v_ld, oq, okk, ov, ob, og, oW, oU, oP, oG;
} p;

const uint C = 64u;   // chunk length
const uint LA = 65u;  // row stride of As (padded against bank conflicts)
shared float As[C * LA];  // A, then T
shared float st[2176];    // staging: K and Q slabs [64][17]; then B slabs [16][64]
shared float Gs[C], Bs[C], Es[C];  // G, beta, beta exp(G)

// G (token order, fp32), beta and beta exp(G) of the chunk's n tokens; zeros past them.
void decays(uint h, uint t0, uint n, uint lid) {
    if (lid < C) {
        Gs[lid] = lid < n ? g[p.og + (t0 + lid) * p.Hv + h] : 0.0;
        Bs[lid] = lid < n ? beta[p.ob + (t0 + lid) * p.Hv + h] : 0.0;
    }
    barrier();
    if (lid == 0u) {
        float acc = 0.0;
        for (uint i = 0u; i < n; ++i) Gs[i] = acc += Gs[i];
    }
    barrier();
    if (lid < C) Es[lid] = Bs[lid] * exp(Gs[lid]);
}

// A into As and P into the scratch: K Kᵀ and Q Kᵀ over dk in slabs of 16, rows ty + 16a, columns tx + 16b.
void masked_products(uint h, uint kh, uint t0, uint n, uint R, uint lid) {
    const uint tx = lid % 16u, ty = lid / 16u;
    float kk[4][4], qk[4][4];
    [[unroll]] for (uint a = 0u; a < 4u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) kk[a][b] = 0.0, qk[a][b] = 0.0;
    for (uint k0 = 0u; k0 < p.dk; k0 += 16u) {
        [[unroll]] for (uint m = 0u; m < 4u; ++m) {
            const uint e = lid + 256u * m, row = e / 16u, col = e % 16u;
            const bool ok = row < n && k0 + col < p.dk;
            st[row * 17u + col] = ok ? k[p.okk + (t0 + row) * p.k_ld + kh * p.dk + k0 + col] : 0.0;
            st[1088u + row * 17u + col] = ok ? q[p.oq + (t0 + row) * p.q_ld + kh * p.dk + k0 + col] : 0.0;
        }
        barrier();
        [[unroll]] for (uint l = 0u; l < 16u; ++l) {
            float ki[4], qi[4], kj[4];
            [[unroll]] for (uint a = 0u; a < 4u; ++a) {
                ki[a] = st[(ty + 16u * a) * 17u + l];
                qi[a] = st[1088u + (ty + 16u * a) * 17u + l];
                kj[a] = st[(tx + 16u * a) * 17u + l];
            }
            [[unroll]] for (uint a = 0u; a < 4u; ++a)
                [[unroll]] for (uint b = 0u; b < 4u; ++b) {
                    kk[a][b] = fma(ki[a], kj[b], kk[a][b]);
                    qk[a][b] = fma(qi[a], kj[b], qk[a][b]);
                }
        }
        barrier();
    }
    [[unroll]] for (uint a = 0u; a < 4u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint i = ty + 16u * a, j = tx + 16u * b;
            const float d = j <= i && i < n ? exp(Gs[i] - Gs[j]) : 0.0;
            As[i * LA + j] = j < i ? Bs[i] * kk[a][b] * d : 0.0;
            if (i < n) x[p.oP + (h * R + t0 + i) * C + j] = qk[a][b] * d;
        }
    barrier();
}

// T = (I + A)^-1 in place: the diagonal blocks, then block rows 1..3 (M_ij = sum_{k=j}^{i-1} A_ik T_kj over
// the original A_ik, then T_ij = -T_ii M_ij).
void invert(uint lid) {
    float xs[16];
    const uint o = 16u * (lid / 16u % 4u), cc = lid % 16u;
    if (lid < C)
        [[unroll]] for (uint i = 0u; i < 16u; ++i) {
            float s = i == cc ? 1.0 : 0.0;
            [[unroll]] for (uint j = 0u; j < i; ++j) s -= As[(o + i) * LA + o + j] * xs[j];
            xs[i] = s;
        }
    barrier();
    if (lid < C)
        [[unroll]] for (uint i = 0u; i < 16u; ++i) As[(o + i) * LA + o + cc] = xs[i];
    barrier();
    const uint r = lid / 16u;
    for (uint bi = 1u; bi < 4u; ++bi) {
        const uint row = (16u * bi + r) * LA;
        float m[3];
        [[unroll]] for (uint bj = 0u; bj < 3u; ++bj) {
            float s = 0.0;
            if (bj < bi)
                for (uint l = 16u * bj; l < 16u * bi; ++l) s = fma(As[row + l], As[l * LA + 16u * bj + cc], s);
            m[bj] = s;
        }
        barrier();
        [[unroll]] for (uint bj = 0u; bj < 3u; ++bj) if (bj < bi) As[row + 16u * bj + cc] = m[bj];
        barrier();
        [[unroll]] for (uint bj = 0u; bj < 3u; ++bj) {
            float s = 0.0;
            if (bj < bi)
                [[unroll]] for (uint l = 0u; l < 16u; ++l)
                    s = fma(As[row + 16u * bi + l], As[(16u * bi + l) * LA + 16u * bj + cc], s);
            m[bj] = -s;
        }
        barrier();
        [[unroll]] for (uint bj = 0u; bj < 3u; ++bj) if (bj < bi) As[row + 16u * bj + cc] = m[bj];
        barrier();
    }
}

// W = T diag(beta exp(G)) K (w) or U = T diag(beta) V: one 64-column tile from column c0 of a matrix of width
// `width`, the chunk positions staged in slabs of 16.
void wy_tile(bool w, uint c0, uint h, uint kh, uint t0, uint n, uint R, uint lid) {
    const uint tx = lid % 16u, ty = lid / 16u, width = w ? p.dk : p.dv;
    float acc[4][4];
    [[unroll]] for (uint a = 0u; a < 4u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = 0.0;
    for (uint s0 = 0u; s0 < n; s0 += 16u) {
        [[unroll]] for (uint m = 0u; m < 4u; ++m) {
            const uint e = lid + 256u * m, pp = e / 64u, col = e % 64u, pos = s0 + pp;
            float val = 0.0;
            if (pos < n && c0 + col < width)
                val = w ? Es[pos] * k[p.okk + (t0 + pos) * p.k_ld + kh * p.dk + c0 + col]
                        : Bs[pos] * v[p.ov + (t0 + pos) * p.v_ld + h * p.dv + c0 + col];
            st[pp * 64u + col] = val;
        }
        barrier();
        [[unroll]] for (uint pp = 0u; pp < 16u; ++pp) {
            float ta[4], bb[4];
            [[unroll]] for (uint a = 0u; a < 4u; ++a) ta[a] = As[(ty + 16u * a) * LA + s0 + pp];
            [[unroll]] for (uint b = 0u; b < 4u; ++b) bb[b] = st[pp * 64u + tx + 16u * b];
            [[unroll]] for (uint a = 0u; a < 4u; ++a)
                [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = fma(ta[a], bb[b], acc[a][b]);
        }
        barrier();
    }
    const uint base = w ? p.oW : p.oU;
    [[unroll]] for (uint a = 0u; a < 4u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint i = ty + 16u * a, col = c0 + tx + 16u * b;
            if (i < n && col < width) x[base + (h * R + t0 + i) * width + col] = acc[a][b];
        }
}

void main() {
    const uint c = gl_WorkGroupID.x, h = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
    const uint kh = h / (p.Hv / p.Hk), t0 = c * C, n = min(C, p.T - t0), R = (p.T + C - 1u) / C * C;
    decays(h, t0, n, lid);
    if (lid < n) x[p.oG + h * R + t0 + lid] = Gs[lid];
    masked_products(h, kh, t0, n, R, lid);
    invert(lid);
    for (uint c0 = 0u; c0 < p.dk; c0 += 64u) wy_tile(true, c0, h, kh, t0, n, R, lid);
    for (uint c0 = 0u; c0 < p.dv; c0 += 64u) wy_tile(false, c0, h, kh, t0, n, R, lid);
}
