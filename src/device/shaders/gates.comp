// The GatedDeltaNet gates in place over [T][Hv] (device/device.h Stream::gdn_gates):
// beta = sigmoid(b), g = -exp(A_log[h]) * softplus(a + dt_bias[h]).
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer B { float b[]; };
layout(std430, binding = 1) buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer L { float alog[]; };
layout(std430, binding = 3) readonly buffer D { float dt[]; };
layout(push_constant) uniform P { uint n, Hv, ob, oa, ol, od; } p;

void main() {
    uint i = flat_id();
    if (i >= p.n) return;
    uint h = i % p.Hv;
    b[p.ob + i] = sigmoid_f(b[p.ob + i]);
    a[p.oa + i] = -exp(alog[p.ol + h]) * softplus_f(a[p.oa + i] + dt[p.od + h]);
}
