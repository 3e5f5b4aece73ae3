// Flash attention (device/device.h Stream::attention; the host side is device/vk_device.cpp
// VkStream::attention). A workgroup owns a block of BM query slots (a slot: one query row of one query head;
// slot s of the dispatch is row s / G, head kvh G + s % G with G = nh / nkv, so the heads sharing a KV head
// are one block's slots and read each K/V tile once) and BO output dimensions of the head (grid z: heads
// wider than BO, the joint head's memory attention, recompute the scores per block of BO). It walks the keys
// the block sees in tiles of BN (causal: up to p0 + its last row, so fully masked tiles are never loaded) with
// the softmax online in fp32 (a running max and sum per slot):
//   scores   S[BM][BN] = Q Kᵀ over the head dimension in chunks of DC: the Q and K chunks staged in shared
//            memory by coalesced row-wise loads, each invocation a 4 x 4 block of S in registers
//   softmax  S scaled into shared memory; per slot, over the keys it sees, the tile's max, p = exp(s - m)
//            (0 for the others), their sum and the rescaling exp(m_old - m_new), four invocations per slot
//   P V      O[BM][BO] = O corr + P V over V sub-tiles staged in shared memory (16 keys of 256 dimensions, 32
//            of 128, 64 of 64), each invocation a 4 x 16 block of O in registers (dimensions 16 apart:
//            conflict-free shared reads)
// and writes O / l. Shared memory: 4,096 + 32 x 68 + 320 floats (25.9 KiB; the host checks the device's limit).
// The inner products' loops are unrolled by UD (written so that glslc's optimiser unrolls them: no loop inside
// a conditional of an unrolled loop; unrolled whole, lavapipe spent 45 s compiling the kernel, 3 s so): an
// invocation runs 7 + 6 hd / 32 loop iterations per tile of 64 keys plus P V's (11 to 17, by the V sub-tile;
// each loop: its trips plus one), which the host checks against lavapipe's limit of 65,535
// (vk_device.cpp check_attention_loops).
// KV_BF16: K and V are bf16 words (two elements per 32-bit word).
#version 450
#include "common.glsl"
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
#ifdef KV_BF16
layout(std430, binding = 1) readonly buffer K { uint k[]; };
layout(std430, binding = 2) readonly buffer V { uint v[]; };
#define KAT(e) bf16_at(k[(e) >> 1], (e))
#define VAT(e) bf16_at(v[(e) >> 1], (e))
#else
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
#define KAT(e) k[e]
#define VAT(e) v[e]
#endif
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, p0, nh, nkv, hd, keys, causal, q_ld, k_ld, v_ld, o_ld, oq, ok, ov, oo;
    float scale;
} p;

const uint BM = 32u;   // query slots per workgroup
const uint BN = 64u;   // keys per tile
const uint DC = 32u;   // head dimensions per score chunk
const uint DCP = 33u;  // a chunk's row in shared memory (padded: conflict-free column reads)
const uint BV = 16u;   // keys per V sub-tile of BO dimensions (narrower heads: more keys per sub-tile)
const uint BO = 256u;  // output dimensions per workgroup
const uint UD = 8u;    // steps unrolled in the inner products' loops
const uint PSP = 68u;  // a row of P in shared memory (padded: the four readers of a row hit distinct banks)
const float NEG_INF = -1.0 / 0.0;

// Staging, reused by phase: the Q chunk [BM][DCP] and the K chunk [BN][DCP], then a V sub-tile [vkeys][vrow].
shared float sh[BV * BO];
shared float ps[BM * PSP];  // the tile's scores, then its probabilities
shared float red_max[128], red_sum[128], corr_s[BM], l_s[BM];

void main() {
    const uint t = gl_LocalInvocationID.x;
    const uint G = p.nh / p.nkv, kvh = gl_WorkGroupID.y, cz = gl_WorkGroupID.z * BO;
    const uint slot0 = gl_WorkGroupID.x * BM, slots = p.T * G;
    const uint dw = min(BO, p.hd - cz);  // output dimensions of this workgroup
    // A V sub-tile: rows of vrow >= dw floats (a power of two), as many keys as fill the staging buffer.
    const uint vshift = dw > 128u ? 8u : dw > 64u ? 7u : 6u, vrow = 1u << vshift, vkeys = BV * BO / vrow;
    // The last query row of the block, and the keys it sees (every row of the block sees a prefix of them).
    const uint last_row = (min(slot0 + BM, slots) - 1u) / G;
    const uint kend = p.causal != 0u ? min(p.keys, p.p0 + last_row + 1u) : p.keys;

    // Roles: scores and P V (sg: 4 slots, kg: keys kg + 16 b, cg: dimensions cg + 16 c); softmax (4 per slot).
    const uint sg = t >> 4, kg = t & 15u, cg = t & 15u;
    const uint ss = t >> 2, part = t & 3u;
    // Slot ss's row (slots past the last row: the last row, so that they see keys and stay finite).
    const uint ss_row = min(slot0 + ss, slots - 1u) / G;
    const uint ss_end = p.causal != 0u ? min(kend, p.p0 + ss_row + 1u) : kend;

    float acc[4][16];
    [[unroll]] for (uint a = 0u; a < 4u; ++a)
        [[unroll]] for (uint c = 0u; c < 16u; ++c) acc[a][c] = 0.0;
    float m_run = NEG_INF, l_run = 0.0;  // slot ss's running max and sum (the same in its four invocations)

    for (uint kb = 0u; kb < kend; kb += BN) {
        // ---- scores: S = Q Kᵀ over the head dimension, chunk by chunk ----
        float s[4][4];
        [[unroll]] for (uint a = 0u; a < 4u; ++a)
            [[unroll]] for (uint b = 0u; b < 4u; ++b) s[a][b] = 0.0;
        for (uint c0 = 0u; c0 < p.hd; c0 += DC) {
            const uint dc = min(DC, p.hd - c0);
            [[unroll]] for (uint r = 0u; r < BM * DC / 128u; ++r) {
                const uint e = t + r * 128u, sl = e / DC, d = e % DC, g = slot0 + sl;
                float x = 0.0;
                if (d < dc && g < slots)
                    x = q[p.oq + (g / G) * p.q_ld + (kvh * G + g % G) * p.hd + c0 + d];
                sh[sl * DCP + d] = x;
            }
            [[unroll]] for (uint r = 0u; r < BN * DC / 128u; ++r) {
                const uint e = t + r * 128u, key = e / DC, d = e % DC, j = kb + key;
                sh[BM * DCP + key * DCP + d] = d < dc && j < kend ? KAT(p.ok + j * p.k_ld + kvh * p.hd + c0 + d) : 0.0;
            }
            barrier();
            // Both chunks are zero past dc: the steps past it add exact zeros.
            for (uint d0 = 0u; d0 < dc; d0 += UD) [[unroll]] for (uint du = 0u; du < UD; ++du) {
                const uint d = d0 + du;
                float qa[4], kk[4];
                [[unroll]] for (uint a = 0u; a < 4u; ++a) qa[a] = sh[(sg * 4u + a) * DCP + d];
                [[unroll]] for (uint b = 0u; b < 4u; ++b) kk[b] = sh[BM * DCP + (kg + 16u * b) * DCP + d];
                [[unroll]] for (uint a = 0u; a < 4u; ++a)
                    [[unroll]] for (uint b = 0u; b < 4u; ++b) s[a][b] += qa[a] * kk[b];
            }
            barrier();
        }
        // ---- softmax, online: the scaled scores, each slot's max over the keys it sees, probabilities ----
        [[unroll]] for (uint a = 0u; a < 4u; ++a)
            [[unroll]] for (uint b = 0u; b < 4u; ++b) ps[(sg * 4u + a) * PSP + kg + 16u * b] = s[a][b] * p.scale;
        barrier();
        float mx = NEG_INF;
        [[unroll]] for (uint jj = 0u; jj < BN / 4u; ++jj) {
            const uint j = part + 4u * jj;
            if (kb + j < ss_end) mx = max(mx, ps[ss * PSP + j]);
        }
        red_max[t] = mx;
        barrier();
        const uint r0 = ss * 4u;
        const float m_new = max(max(m_run, max(red_max[r0], red_max[r0 + 1u])),
                                max(red_max[r0 + 2u], red_max[r0 + 3u]));
        float sum = 0.0;
        [[unroll]] for (uint jj = 0u; jj < BN / 4u; ++jj) {
            const uint j = part + 4u * jj;
            const float pj = kb + j < ss_end ? exp(ps[ss * PSP + j] - m_new) : 0.0;
            ps[ss * PSP + j] = pj;
            sum += pj;
        }
        red_sum[t] = sum;
        const float corr = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);  // 0 on the first tile
        if (part == 0u) corr_s[ss] = corr;
        m_run = m_new;
        barrier();
        l_run = l_run * corr + ((red_sum[r0] + red_sum[r0 + 1u]) + (red_sum[r0 + 2u] + red_sum[r0 + 3u]));
        // ---- P V: O = O corr + P V, V sub-tile by sub-tile ----
        [[unroll]] for (uint a = 0u; a < 4u; ++a) {
            const float cr = corr_s[sg * 4u + a];
            [[unroll]] for (uint c = 0u; c < 16u; ++c) acc[a][c] *= cr;
        }
        for (uint v0 = 0u; v0 < BN && kb + v0 < kend; v0 += vkeys) {
            [[unroll]] for (uint r = 0u; r < BV * BO / 128u; ++r) {
                const uint e = t + r * 128u, col = e & (vrow - 1u), j = kb + v0 + (e >> vshift);
                if (col < dw) sh[e] = j < kend ? VAT(p.ov + j * p.v_ld + kvh * p.hd + cz + col) : 0.0;
            }
            barrier();
            for (uint j0 = 0u; j0 < vkeys; j0 += UD) [[unroll]] for (uint ju = 0u; ju < UD; ++ju) {
                const uint jj = j0 + ju;
                float pa[4];
                [[unroll]] for (uint a = 0u; a < 4u; ++a) pa[a] = ps[(sg * 4u + a) * PSP + v0 + jj];
                [[unroll]] for (uint c = 0u; c < 16u; ++c) {
                    const uint col = cg + 16u * c;
                    if (col < dw) {
                        const float vv = sh[(jj << vshift) + col];
                        acc[0][c] += pa[0] * vv;
                        acc[1][c] += pa[1] * vv;
                        acc[2][c] += pa[2] * vv;
                        acc[3][c] += pa[3] * vv;
                    }
                }
            }
            barrier();
        }
    }
    if (part == 0u) l_s[ss] = l_run;
    barrier();
    [[unroll]] for (uint a = 0u; a < 4u; ++a) {
        const uint g = slot0 + sg * 4u + a;
        const float l = l_s[sg * 4u + a];
        const uint base = p.oo + (g / G) * p.o_ld + (kvh * G + g % G) * p.hd + cz;
        [[unroll]] for (uint c = 0u; c < 16u; ++c) {
            const uint col = cg + 16u * c;
            if (g < slots && col < dw) o[base + col] = acc[a][c] / l;
        }
    }
}
