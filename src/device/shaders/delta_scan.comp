// The chunked gated delta rule, second pass: the state scan and the output, sequential over the chunks that
// delta_wy.comp prepared (W, Qg = diag(exp(G)) Q, Kd = (diag(exp(G_n - G)) K)ᵀ, U, P and G in the scratch
// buffer; device/vk_device.cpp VkStream::delta_rule). One workgroup per (value head h, block of 16 value
// columns); invocation 4 rt + ct holds the block's state S [dk][16] at rows rt + 16a, columns ct + 4b in
// registers, with a transposed copy in shared memory for the product that reads all of it. Per chunk of n
// tokens, as gated_delta_rule_chunked (ops/delta_rule.h):
//   [X_W; X_Q] = [W; Qg] S              (128 x dk times dk x 16, 8 x 4 outputs per invocation, dk in slabs of 16)
//   V' = U - X_W;  O = X_Q + P V';  S = exp(G_n) S + Kdᵀ V'   (the last two over the chunk's positions in slabs
//                                                               of 16, P and Kd staged together)
// fp32 throughout. dk <= 128. Shared tiles are vec4 rows padded against bank conflicts. The host splits long
// inputs so that the chunk loop stays short (lavapipe cuts an invocation's loops off after 65,535
// iterations). Shared memory: 28,160 bytes.
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x4[]; };
layout(std430, binding = 0) readonly buffer Xs { float x[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(std430, binding = 2) buffer S { float state[]; };
layout(push_constant) uniform P {
    uint T, Hv, dk, dkp, dv, oW, oQ, oK, oU, oP, oG, oo, os;
} p;

const uint C = 64u;     // chunk length
const uint BV = 16u;    // value columns per workgroup
const uint LS = 5u;     // vec4 per row of a staged slab: 16 values and a padding vec4
const uint LT = 33u;    // vec4 per column of St: 128 values and a padding vec4
const uint LV = 17u;    // vec4 per column of Vt: 64 values and a padding vec4
shared vec4 St[BV * LT];          // the state block, transposed: [column][row]
shared vec4 sh[192u * LS];        // staging: the [W; Qg] slab [128][16]; then P [64][16] and Kd [128][16]
shared vec4 Vt[BV * LV];          // V', transposed: [column][position]

float sreg[8][4];  // the state block: row rt + 16a, column ct + 4b

float dot4(vec4 a, vec4 b, float acc) {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
}

// [X_W; X_Q] = [W; Qg] S for rows rt + 16a (a < 4: X_W, else X_Q).
void project(out float acc[8][4], uint h, uint t0, uint n, uint R, uint lid) {
    const uint rt = lid / 4u, ct = lid % 4u;
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = 0.0;
    for (uint k0 = 0u; k0 < p.dkp; k0 += 16u) {
        [[unroll]] for (uint m = 0u; m < 8u; ++m) {
            const uint e = lid + 64u * m, row = e / 4u, s = e % 4u, i = row % C, kk = k0 + 4u * s;
            vec4 val = vec4(0.0);
            if (i < n && kk < p.dkp) val = x4[((row < C ? p.oW : p.oQ) + (h * R + t0 + i) * p.dkp + kk) / 4u];
            sh[row * LS + s] = val;
        }
        barrier();
        for (uint s = 0u; s < 4u; ++s) {
            vec4 y[8], sb[4];
            [[unroll]] for (uint a = 0u; a < 8u; ++a) y[a] = sh[(rt + 16u * a) * LS + s];
            [[unroll]] for (uint b = 0u; b < 4u; ++b) sb[b] = St[(ct + 4u * b) * LT + k0 / 4u + s];
            [[unroll]] for (uint a = 0u; a < 8u; ++a)
                [[unroll]] for (uint b = 0u; b < 4u; ++b) acc[a][b] = dot4(y[a], sb[b], acc[a][b]);
        }
        barrier();
    }
}

// V' = U - X_W into Vt; O = X_Q + P V' and S = exp(G_n) S + Kdᵀ V'; the outputs and the state's copy.
void advance(float acc[8][4], uint h, uint c, uint t0, uint n, uint R, uint col0, uint lid) {
    const uint rt = lid / 4u, ct = lid % 4u;
    float ov[4][4];
    [[unroll]] for (uint a = 0u; a < 4u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint i = rt + 16u * a, cl = ct + 4u * b, col = col0 + cl;
            const float u = i < n && col < p.dv ? x[p.oU + (h * R + t0 + i) * p.dv + col] : 0.0;
            Vt[cl * LV + i / 4u][i % 4u] = u - acc[a][b];
            ov[a][b] = acc[a + 4u][b];
        }
    const float en = exp(x[p.oG + h * R + t0 + n - 1u]);
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) sreg[a][b] *= en;
    for (uint j0 = 0u; j0 < n; j0 += 16u) {
        [[unroll]] for (uint m = 0u; m < 12u; ++m) {  // P rows 0..63, then Kd rows 64..191
            const uint e = lid + 64u * m, row = e / 4u, s = e % 4u, r = row - C;
            vec4 val = vec4(0.0);
            if (row < C ? row < n : r < p.dkp)
                val = x4[(row < C ? p.oP + (h * R + t0 + row) * C : p.oK + ((h * R / C + c) * p.dkp + r) * C) / 4u +
                         j0 / 4u + s];
            sh[row * LS + s] = val;
        }
        barrier();
        for (uint s = 0u; s < 4u; ++s) {
            vec4 vb[4], pa[4], ka[8];
            [[unroll]] for (uint b = 0u; b < 4u; ++b) vb[b] = Vt[(ct + 4u * b) * LV + j0 / 4u + s];
            [[unroll]] for (uint a = 0u; a < 4u; ++a) pa[a] = sh[(rt + 16u * a) * LS + s];
            [[unroll]] for (uint a = 0u; a < 8u; ++a) ka[a] = sh[(C + rt + 16u * a) * LS + s];
            [[unroll]] for (uint b = 0u; b < 4u; ++b) {
                [[unroll]] for (uint a = 0u; a < 4u; ++a) ov[a][b] = dot4(pa[a], vb[b], ov[a][b]);
                [[unroll]] for (uint a = 0u; a < 8u; ++a) sreg[a][b] = dot4(ka[a], vb[b], sreg[a][b]);
            }
        }
        barrier();
    }
    [[unroll]] for (uint a = 0u; a < 4u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint i = rt + 16u * a, col = col0 + ct + 4u * b;
            if (i < n && col < p.dv) o[p.oo + (t0 + i) * p.Hv * p.dv + h * p.dv + col] = ov[a][b];
        }
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint r = rt + 16u * a;
            St[(ct + 4u * b) * LT + r / 4u][r % 4u] = sreg[a][b];
        }
}

void main() {
    const uint h = gl_WorkGroupID.x, col0 = gl_WorkGroupID.y * BV, lid = gl_LocalInvocationID.x;
    const uint rt = lid / 4u, ct = lid % 4u, R = (p.T + C - 1u) / C * C;
    // The state block in (zeros past dk and dv, so that the padded products add nothing).
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint r = rt + 16u * a, col = col0 + ct + 4u * b;
            sreg[a][b] = r < p.dk && col < p.dv ? state[p.os + (h * p.dk + r) * p.dv + col] : 0.0;
            St[(ct + 4u * b) * LT + r / 4u][r % 4u] = sreg[a][b];
        }
    for (uint t0 = 0u; t0 < p.T; t0 += C) {
        const uint n = min(C, p.T - t0);
        float acc[8][4];
        project(acc, h, t0, n, R, lid);
        advance(acc, h, t0 / C, t0, n, R, col0, lid);
    }
    [[unroll]] for (uint a = 0u; a < 8u; ++a)
        [[unroll]] for (uint b = 0u; b < 4u; ++b) {
            const uint r = rt + 16u * a, col = col0 + ct + 4u * b;
            if (r < p.dk && col < p.dv) state[p.os + (h * p.dk + r) * p.dv + col] = sreg[a][b];
        }
}
