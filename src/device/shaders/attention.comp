// Attention, one workgroup per (query row i, head h) (device/device.h Stream::attention): the keys visible to
// query i (causal: rows 0 .. p0 + i; else all kv rows) in blocks of 128, one key per invocation, with the
// softmax kept online (running max and sum, fp32) and the output dimensions of the head spread over the
// invocations. KV_BF16: K and V are bf16 words (two elements per 32-bit word). hd <= 2048.
#version 450
#include "common.glsl"
layout(local_size_x = 128) in;
layout(std430, binding = 0) buffer Q { float q[]; };
#ifdef KV_BF16
layout(std430, binding = 1) buffer K { uint k[]; };
layout(std430, binding = 2) buffer V { uint v[]; };
#define KAT(e) bf16_at(k[(e) >> 1], (e))
#define VAT(e) bf16_at(v[(e) >> 1], (e))
#else
layout(std430, binding = 1) buffer K { float k[]; };
layout(std430, binding = 2) buffer V { float v[]; };
#define KAT(e) k[e]
#define VAT(e) v[e]
#endif
layout(std430, binding = 3) buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, p0, nh, nkv, hd, keys, causal, q_ld, k_ld, v_ld, o_ld, oq, ok, ov, oo;
    float scale;
} p;

const uint MAXR = 16u;  // output dimensions per invocation: 2048 / 128
shared float qs[2048];
shared float ps[128];
shared float red[128];

float reduce(float x, bool is_max) {
    uint t = gl_LocalInvocationID.x;
    red[t] = x;
    barrier();
    [[unroll]] for (uint s = 64u; s > 0u; s >>= 1) {
        if (t < s) red[t] = is_max ? max(red[t], red[t + s]) : red[t] + red[t + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint i = gl_WorkGroupID.x, h = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    uint kvh = h / (p.nh / p.nkv);
    uint nkeys = p.causal != 0u ? p.p0 + i + 1u : p.keys;
    for (uint d = t; d < p.hd; d += 128u) qs[d] = q[p.oq + i * p.q_ld + h * p.hd + d];
    barrier();
    float acc[MAXR];
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) acc[r] = 0.0;
    float m = -1.0 / 0.0, l = 0.0;
    for (uint kb = 0u; kb < nkeys; kb += 128u) {
        uint j = kb + t;
        float s = -1.0 / 0.0;
        if (j < nkeys) {
            uint kbase = p.ok + j * p.k_ld + kvh * p.hd;
            float dot = 0.0;
            for (uint d = 0u; d < p.hd; ++d) dot += qs[d] * KAT(kbase + d);
            s = dot * p.scale;
        }
        float m_new = max(m, reduce(s, true));
        float corr = exp(m - m_new);
        float pj = j < nkeys ? exp(s - m_new) : 0.0;
        ps[t] = pj;
        l = l * corr + reduce(pj, false);  // reduce's barriers also publish ps
        uint nb = min(128u, nkeys - kb);
        [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
            uint d = t + r * 128u;
            if (d >= p.hd) break;
            float a = acc[r] * corr;
            for (uint jj = 0u; jj < nb; ++jj) a += ps[jj] * VAT(p.ov + (kb + jj) * p.v_ld + kvh * p.hd + d);
            acc[r] = a;
        }
        m = m_new;
        barrier();
    }
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
        uint d = t + r * 128u;
        if (d >= p.hd) break;
        o[p.oo + i * p.o_ld + h * p.hd + d] = acc[r] / l;
    }
}
