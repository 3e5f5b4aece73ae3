// The chunked gated delta rule, second pass: the state scan and the output, sequential over the chunks that
// delta_wy.comp prepared (its W, U, P and G in the scratch buffer; device/vk_device.cpp VkStream::delta_rule).
// One workgroup per (value head h, block of 16 value columns); the block's state S [dk][16] stays in
// registers (rows ry + 32a, columns cx + 4b of invocation 4 ry + cx) with a copy in shared memory for the
// products that read all of it. Per chunk of n tokens, as gated_delta_rule_chunked (ops/delta_rule.h):
//   [X_W; X_Q] = [W; Q] S                       (128 x dk times dk x 16, dk staged in slabs of 16)
//   V' = U - X_W;  O = exp(G) X_Q + P V'        (P staged in slabs of 16 chunk positions)
//   S = exp(G_n) S + (K exp(G_n - G))ᵀ V'       (K staged in slabs of 2048 / dk positions, rounded down to a
//                                                power of two)
// fp32 throughout. dk <= 256. The host splits long inputs so that the chunk loop stays short (lavapipe cuts an
// invocation's loops off after 65,535 iterations). Shared memory: 29,248 bytes.
#version 450
#include "common.glsl"
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) buffer S { float st[]; };
layout(push_constant) uniform P {
    uint T, Hk, Hv, dk, dv, q_ld, k_ld, oq, okk, oW, oU, oP, oG, oo, os;
} p;

const uint C = 64u;                   // chunk length
const uint BV = 16u;                  // value columns per workgroup
const uint LY = 129u;                 // row stride of the [W; Q] slab (padded against bank conflicts)
shared float Ss[256u * BV];           // the state block, [dk][16]
shared float sh[16u * LY];            // staging: [W; Q] slab [16][129], P slab [64][17], K slab [..][dk]
shared float Vs[C * BV];              // V' [64][16]
shared float Ec[C], Dc[C];            // exp(G_i), exp(G_n - G_i)

float sreg[8][4];  // the state block: row ry + 32a, column cx + 4b

// X = [W; Q] S for rows i (X_W) and 64 + i (X_Q), i = ry + 32a: acc[a] for a < 2 is X_W, a >= 2 X_Q.
void project(out float acc[4][4], uint h, uint kh, uint t0, uint n, uint R, uint lid) {
    const uint cx = lid % 4u, ry = lid / 4u;
    [[unroll]] for (uint a = 0u; a < 4u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = 0.0;
    for (uint k0 = 0u; k0 < p.dk; k0 += 16u) {
        [[unroll]] for (uint m = 0u; m < 16u; ++m) {
            const uint e = lid + 128u * m, row = e / 16u, kk = e % 16u, i = row % C;
            float val = 0.0;
            if (i < n && k0 + kk < p.dk)
                val = row < C ? x[p.oW + (h * R + t0 + i) * p.dk + k0 + kk]
                              : q[p.oq + (t0 + i) * p.q_ld + kh * p.dk + k0 + kk];
            sh[kk * LY + row] = val;
        }
        barrier();
        [[unroll]] for (uint kk = 0u; kk < 16u; ++kk) {
            float y[4], s[4];
            [[unroll]] for (uint a = 0u; a < 4u; ++a) y[a] = sh[kk * LY + ry + 32u * a];
            [[unroll]] for (uint b = 0u; b < 4u; ++b) s[b] = Ss[(k0 + kk) * BV + cx + 4u * b];
            [[unroll]] for (uint a = 0u; a < 4u; ++a)
                [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = fma(y[a], s[b], acc[a][b]);
        }
        barrier();
    }
}

// out = exp(G) X_Q + P V' for the chunk's rows ry + 32a (a < 2); V' into Vs first.
void outputs(float acc[4][4], uint h, uint t0, uint n, uint R, uint col0, uint lid) {
    const uint cx = lid % 4u, ry = lid / 4u;
    float ov[2][4];
    [[unroll]] for (uint a = 0u; a < 2u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint i = ry + 32u * a, col = col0 + cx + 4u * b;
            const float u = i < n && col < p.dv ? x[p.oU + (h * R + t0 + i) * p.dv + col] : 0.0;
            Vs[i * BV + cx + 4u * b] = u - acc[a][b];
            ov[a][b] = Ec[i] * acc[a + 2u][b];
        }
    barrier();
    for (uint j0 = 0u; j0 < n; j0 += 16u) {
        [[unroll]] for (uint m = 0u; m < 8u; ++m) {
            const uint e = lid + 128u * m, i = e / 16u, jj = e % 16u;
            sh[i * 17u + jj] = i < n && j0 + jj < n ? x[p.oP + (h * R + t0 + i) * C + j0 + jj] : 0.0;
        }
        barrier();
        [[unroll]] for (uint jj = 0u; jj < 16u; ++jj) {
            float pa[2], vb[4];
            [[unroll]] for (uint a = 0u; a < 2u; ++a) pa[a] = sh[(ry + 32u * a) * 17u + jj];
            [[unroll]] for (uint b = 0u; b < 4u; ++b) vb[b] = Vs[(j0 + jj) * BV + cx + 4u * b];
            [[unroll]] for (uint a = 0u; a < 2u; ++a)
                [[unroll]] for (uint b = 0u; b < 4u; ++b) ov[a][b] = fma(pa[a], vb[b], ov[a][b]);
        }
        barrier();
    }
    [[unroll]] for (uint a = 0u; a < 2u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint i = ry + 32u * a, col = col0 + cx + 4u * b;
            if (i < n && col < p.dv) o[p.oo + (t0 + i) * p.Hv * p.dv + h * p.dv + col] = ov[a][b];
        }
}

// S = exp(G_n) S + (K exp(G_n - G))ᵀ V', then the shared copy.
void update(uint kh, uint t0, uint n, uint lid) {
    const uint cx = lid % 4u, ry = lid / 4u;
    const float en = Ec[n - 1u];
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) sreg[a][b] *= en;
    uint jn = C;  // positions per slab: jn dk <= 2048, a power of two
    while (jn * p.dk > 2048u) jn >>= 1u;
    for (uint j0 = 0u; j0 < n; j0 += jn) {
        for (uint e = lid; e < jn * p.dk; e += 128u) {
            const uint jj = e / p.dk, r = e % p.dk, j = j0 + jj;
            sh[e] = j < n ? Dc[j] * k[p.okk + (t0 + j) * p.k_ld + kh * p.dk + r] : 0.0;
        }
        barrier();
        for (uint jj = 0u; jj < jn; ++jj) {
            float ka[8], vb[4];
            [[unroll]] for (uint a = 0u; a < 8u; ++a) {
                const uint r = ry + 32u * a;
                ka[a] = r < p.dk ? sh[jj * p.dk + r] : 0.0;
            }
            [[unroll]] for (uint b = 0u; b < 4u; ++b) vb[b] = Vs[(j0 + jj) * BV + cx + 4u * b];
            [[unroll]] for (uint a = 0u; a < 8u; ++a)
                [[unroll]] for (uint b = 0u; b < 4u; ++b) sreg[a][b] = fma(ka[a], vb[b], sreg[a][b]);
        }
        barrier();
    }
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) Ss[(ry + 32u * a) * BV + cx + 4u * b] = sreg[a][b];
}

void main() {
    const uint h = gl_WorkGroupID.x, col0 = gl_WorkGroupID.y * BV, lid = gl_LocalInvocationID.x;
    const uint cx = lid % 4u, ry = lid / 4u;
    const uint kh = h / (p.Hv / p.Hk), R = (p.T + C - 1u) / C * C;
    // The state block in (zeros past dk and dv, so that the padded products add nothing).
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint r = ry + 32u * a, col = col0 + cx + 4u * b;
            sreg[a][b] = r < p.dk && col < p.dv ? st[p.os + (h * p.dk + r) * p.dv + col] : 0.0;
            Ss[r * BV + cx + 4u * b] = sreg[a][b];
        }
    for (uint t0 = 0u; t0 < p.T; t0 += C) {
        const uint n = min(C, p.T - t0);
        if (lid < C) {
            const float gi = lid < n ? x[p.oG + h * R + t0 + lid] : 0.0;
            const float gn = x[p.oG + h * R + t0 + n - 1u];
            Ec[lid] = exp(gi);
            Dc[lid] = lid < n ? exp(gn - gi) : 0.0;
        }
        barrier();
        float acc[4][4];
        project(acc, h, kh, t0, n, R, lid);
        outputs(acc, h, t0, n, R, col0, lid);
        update(kh, t0, n, lid);
        barrier();
    }
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint r = ry + 32u * a, col = col0 + cx + 4u * b;
            if (r < p.dk && col < p.dv) st[p.os + (h * p.dk + r) * p.dv + col] = sreg[a][b];
        }
}
