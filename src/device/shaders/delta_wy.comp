// The chunked gated delta rule, first pass: the intra-chunk products of every 64-token chunk, all chunks in
// parallel (ops/delta_rule.h gated_delta_rule_chunked's algebra; device/vk_device.cpp VkStream::delta_rule runs
// delta_scan.comp after it). One workgroup per (chunk, value head h). With G the chunk's cumulative log decays
// (fp32, summed in token order as the CPU does) and the mask applied before exp (only differences <= 0 are
// exponentiated):
//   A = strictly lower part of diag(beta) (K Kᵀ) o exp(G_i - G_j);  T = (I + A)^-1
//   W = T diag(beta exp(G)) K,  U = T diag(beta) V,  P = lower part, diagonal included, of (Q Kᵀ) o exp(G_i - G_j)
// and for the scan, with the decays folded in: Qg = diag(exp(G)) Q and Kd = (diag(exp(G_n - G)) K)ᵀ.
// [K; Q] Kᵀ is one 128 x 64 product (8 x 8 outputs per invocation, dk staged in slabs of 16); T comes from a
// forward substitution per column (one column per invocation, unrolled, in registers); [W | U] side by side
// in 64 x 128 output tiles (8 x 8 per invocation; one tile where dk + dv <= 128) over the chunk's positions
// staged in slabs of 16, skipping the slabs above T's diagonal. Shared tiles are vec4 rows padded against
// bank conflicts. Writes the chunk's rows (token < T) of W, Qg [Hv][R][dkp], Kd [Hv][R / 64][dkp][64],
// U [Hv][R][dv], P [Hv][R][64] and G [Hv][R] into the scratch buffer (R: the rows of whole chunks, dkp: dk
// rounded up to 4, the padding zeros).
// dk <= 128. Shared memory: 28,928 bytes.
#version 450
#include "common.glsl"
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer Bt { float beta[]; };
layout(std430, binding = 4) readonly buffer G { float g[]; };
layout(std430, binding = 5) writeonly buffer X { float x[]; };
layout(push_constant) uniform P {
    uint T, Hk, Hv, dk, dkp, dv, q_ld, k_ld, v_ld, oq, okk, ov, ob, og, oW, oQ, oK, oU, oP, oG;
} p;

const uint C = 64u;   // chunk length
const uint LA = 17u;  // vec4 per row of As: 64 values and a padding vec4
const uint LS = 5u;   // vec4 per row of a staged slab: 16 values and a padding vec4
shared vec4 As[C * LA];       // A, then T
shared vec4 st[128u * LS];    // staging: the [K; Q] slab [128][16]; then the B slab, transposed [128][16]
shared float Gs[C], Bs[C], Es[C], Eg[C], Ds[C];  // G, beta, beta exp(G), exp(G), exp(G_n - G)

float at(uint row, uint col) { return As[row * LA + col / 4u][col % 4u]; }

// G (token order, fp32) and the chunk's decay factors; zeros past its n tokens.
void decays(uint h, uint t0, uint n, uint R, uint lid) {
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
    if (lid < C) {
        const float gi = Gs[lid], e = exp(gi);
        Eg[lid] = e;
        Es[lid] = Bs[lid] * e;
        Ds[lid] = lid < n ? exp(Gs[n - 1u] - gi) : 0.0;
        if (lid < n) x[p.oG + h * R + t0 + lid] = gi;
    }
    barrier();
}

// [K; Q] Kᵀ over dk in slabs of 16 (rows 8 ri + a, columns cj + 8 b); A into As, P, Qg and Kd into the
// scratch.
void products(uint h, uint kh, uint c, uint t0, uint n, uint R, uint lid) {
    const uint ri = lid / 8u, cj = lid % 8u;
    float acc[8][8];
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 8u; ++b) acc[a][b] = 0.0;
    for (uint k0 = 0u; k0 < p.dk; k0 += 16u) {
        [[unroll]] for (uint m = 0u; m < 16u; ++m) {
            const uint e = lid + 128u * m, row = e / 16u, col = e % 16u, i = row % C, kk = k0 + col;
            float val = 0.0;
            if (i < n && kk < p.dk)
                val = row < C ? k[p.okk + (t0 + i) * p.k_ld + kh * p.dk + kk]
                              : q[p.oq + (t0 + i) * p.q_ld + kh * p.dk + kk];
            st[row * LS + col / 4u][col % 4u] = val;
            if (row >= C && i < n && kk < p.dkp) x[p.oQ + (h * R + t0 + i) * p.dkp + kk] = Eg[i] * val;
        }
        barrier();
        [[unroll]] for (uint m = 0u; m < 8u; ++m) {  // Kd, transposed: [k][j]
            const uint e = lid + 128u * m, kk = e / C, j = e % C;
            if (k0 + kk < p.dkp)
                x[p.oK + ((h * R / C + c) * p.dkp + k0 + kk) * C + j] = Ds[j] * st[j * LS + kk / 4u][kk % 4u];
        }
        for (uint s = 0u; s < 4u; ++s) {
            vec4 ra[8], cb[8];
            [[unroll]] for (uint a = 0u; a < 8u; ++a) ra[a] = st[(8u * ri + a) * LS + s];
            [[unroll]] for (uint b = 0u; b < 8u; ++b) cb[b] = st[(cj + 8u * b) * LS + s];
            [[unroll]] for (uint a = 0u; a < 8u; ++a)
                [[unroll]] for (uint b = 0u; b < 8u; ++b) {
                    acc[a][b] = fma(ra[a].x, cb[b].x, acc[a][b]);
                    acc[a][b] = fma(ra[a].y, cb[b].y, acc[a][b]);
                    acc[a][b] = fma(ra[a].z, cb[b].z, acc[a][b]);
                    acc[a][b] = fma(ra[a].w, cb[b].w, acc[a][b]);
                }
        }
        barrier();
    }
    // Rows 8 ri + a: K rows (A) for ri < 8, else Q rows (P).
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 8u; ++b) {
            const uint i = (8u * ri + a) % C, j = cj + 8u * b;
            const float d = j <= i && i < n ? exp(Gs[i] - Gs[j]) : 0.0;
            if (ri < 8u)
                As[i * LA + j / 4u][j % 4u] = j < i ? Bs[i] * acc[a][b] * d : 0.0;
            else if (i < n)
                x[p.oP + (h * R + t0 + i) * C + j] = acc[a][b] * d;
        }
    barrier();
}

// T = (I + A)^-1 in place: invocation c (and c + 64, redundantly, so that the substitution runs outside any
// branch) solves (I + A) x = e_c by forward substitution, x in registers.
void invert(uint lid) {
    const uint c = lid % C;
    float xs[C];
    [[unroll]] for (uint i = 0u; i < C; ++i) {
        float s = i == c ? 1.0 : 0.0;
        [[unroll]] for (uint j = 0u; j < C; ++j)  // constant bounds, so that the nest unrolls fully
            if (j < i) s = fma(-at(i, j), xs[j], s);
        xs[i] = s;
    }
    barrier();
    if (lid < C)
        [[unroll]] for (uint i = 0u; i < C; ++i) As[i * LA + c / 4u][c % 4u] = xs[i];
    barrier();
}

// [W | U] = T [diag(beta exp(G)) K | diag(beta) V]: columns c0 .. c0 + 127 of the two side by side (W's dkp
// columns, the padding zeros, then U's dv), rows 8 ri + a and columns cj + 16 b per invocation.
void wy_tile(uint c0, uint h, uint kh, uint t0, uint n, uint R, uint lid) {
    const uint ri = lid / 16u, cj = lid % 16u;
    float acc[8][8];
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 8u; ++b) acc[a][b] = 0.0;
    for (uint s0 = 0u; s0 < n; s0 += 16u) {
        [[unroll]] for (uint m = 0u; m < 16u; ++m) {  // B transposed: [column][position]
            const uint e = lid + 128u * m, pp = e / 128u, cl = e % 128u, col = c0 + cl, pos = s0 + pp;
            float val = 0.0;
            if (pos < n && col < p.dk)
                val = Es[pos] * k[p.okk + (t0 + pos) * p.k_ld + kh * p.dk + col];
            else if (pos < n && col >= p.dkp && col < p.dkp + p.dv)
                val = Bs[pos] * v[p.ov + (t0 + pos) * p.v_ld + h * p.dv + col - p.dkp];
            st[cl * LS + pp / 4u][pp % 4u] = val;
        }
        barrier();
        if (s0 <= 8u * ri + 7u)  // T is lower triangular: rows above the slab get nothing from it
            for (uint s = 0u; s < 4u; ++s) {
                vec4 ta[8], bb[8];
                [[unroll]] for (uint a = 0u; a < 8u; ++a) ta[a] = As[(8u * ri + a) * LA + s0 / 4u + s];
                [[unroll]] for (uint b = 0u; b < 8u; ++b) bb[b] = st[(cj + 16u * b) * LS + s];
                [[unroll]] for (uint a = 0u; a < 8u; ++a)
                    [[unroll]] for (uint b = 0u; b < 8u; ++b) {
                        acc[a][b] = fma(ta[a].x, bb[b].x, acc[a][b]);
                        acc[a][b] = fma(ta[a].y, bb[b].y, acc[a][b]);
                        acc[a][b] = fma(ta[a].z, bb[b].z, acc[a][b]);
                        acc[a][b] = fma(ta[a].w, bb[b].w, acc[a][b]);
                    }
            }
        barrier();
    }
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 8u; ++b) {
            const uint i = 8u * ri + a, col = c0 + cj + 16u * b, row = h * R + t0 + i;
            if (i < n && col < p.dkp)
                x[p.oW + row * p.dkp + col] = acc[a][b];
            else if (i < n && col < p.dkp + p.dv)
                x[p.oU + row * p.dv + col - p.dkp] = acc[a][b];
        }
}

void main() {
    const uint c = gl_WorkGroupID.x, h = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
    const uint kh = h / (p.Hv / p.Hk), t0 = c * C, n = min(C, p.T - t0), R = (p.T + C - 1u) / C * C;
    decays(h, t0, n, R, lid);
    products(h, kh, c, t0, n, R, lid);
    invert(lid);
    for (uint c0 = 0u; c0 < p.dkp + p.dv; c0 += 128u) wy_tile(c0, h, kh, t0, n, R, lid);
}
