// The gated delta rule, token by token (ops/delta_rule.cpp serial_head's arithmetic): one invocation per
// (value head h, value column j) holds column j of the head's state S [dk][dv] in registers; per token
//   S *= exp(g);  u = beta (v_j - S[:, j] . k);  S[:, j] += k u;  o_j = S[:, j] . q.
// The columns are independent, so the only sharing is the token's q and k (shared memory). dk <= 256.
#version 450
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer Bt { float beta[]; };
layout(std430, binding = 4) readonly buffer G { float g[]; };
layout(std430, binding = 5) buffer O { float o[]; };
layout(std430, binding = 6) buffer S { float st[]; };
layout(push_constant) uniform P { uint T, Hk, Hv, dk, dv, q_ld, k_ld, v_ld, oq, okk, ov, ob, og, oo, os; } p;

shared float qs[256];
shared float ks[256];

void main() {
    uint h = gl_WorkGroupID.x, j = gl_WorkGroupID.y * 64u + gl_LocalInvocationID.x;
    uint kh = h / (p.Hv / p.Hk), t0 = gl_LocalInvocationID.x;
    bool live = j < p.dv;
    float s[256];
    uint sb = p.os + h * p.dk * p.dv;
    for (uint i = 0u; i < p.dk; ++i) s[i] = live ? st[sb + i * p.dv + j] : 0.0;
    for (uint t = 0u; t < p.T; ++t) {
        for (uint i = t0; i < p.dk; i += 64u) {
            qs[i] = q[p.oq + t * p.q_ld + kh * p.dk + i];
            ks[i] = k[p.okk + t * p.k_ld + kh * p.dk + i];
        }
        barrier();
        float decay = exp(g[p.og + t * p.Hv + h]), b = beta[p.ob + t * p.Hv + h];
        float u = 0.0;
        for (uint i = 0u; i < p.dk; ++i) {
            s[i] *= decay;
            u += s[i] * ks[i];
        }
        u = b * ((live ? v[p.ov + t * p.v_ld + h * p.dv + j] : 0.0) - u);
        float acc = 0.0;
        for (uint i = 0u; i < p.dk; ++i) {
            s[i] += ks[i] * u;
            acc += s[i] * qs[i];
        }
        if (live) o[p.oo + t * p.Hv * p.dv + h * p.dv + j] = acc;
        barrier();
    }
    if (live)
        for (uint i = 0u; i < p.dk; ++i) st[sb + i * p.dv + j] = s[i];
}
