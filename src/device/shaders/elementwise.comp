// Elementwise kernels over n fp32 values, one invocation each (device/vk_device.cpp): by OP
//   0 add          a[i] += b[i]
//   1 silu_mul     c[i] = silu(a[i]) * b[i]
//   2 sigmoid_mul  c[i] = a[i] * sigmoid(b[i])
//   3 gelu_erf     a[i] = gelu(a[i]) exact
//   4 gelu_tanh    a[i] = gelu(a[i]) tanh approximation
//   5 copy         c[i] = a[i]
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) buffer C { float c[]; };
layout(push_constant) uniform P { uint n, oa, ob, oc, op; } p;

void main() {
    uint i = flat_id();
    if (i >= p.n) return;
    float x = a[p.oa + i];
    if (p.op == 0u) {
        a[p.oa + i] = x + b[p.ob + i];
    } else if (p.op == 1u) {
        c[p.oc + i] = silu_f(x) * b[p.ob + i];
    } else if (p.op == 2u) {
        c[p.oc + i] = x * sigmoid_f(b[p.ob + i]);
    } else if (p.op == 3u) {
        a[p.oa + i] = 0.5 * x * (1.0 + erf_f(x * 0.70710678118654752440));
    } else if (p.op == 4u) {
        a[p.oa + i] = 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
    } else {
        c[p.oc + i] = x;
    }
}
