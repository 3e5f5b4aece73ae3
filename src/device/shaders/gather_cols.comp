// The input of a matrix whose column groups are stored in another order (io's QuantMatrix col_map: a GGUF's
// tiled value heads) put in the stored order, so the GEMM reads the file's rows as they are:
// out[m][s * gs + i] = x[m][from[s] * gs + i], for M rows of G groups of gs columns. One invocation per value.
#version 450
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer F { uint from[]; };
layout(std430, binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P { uint M, G, gs, ox, x_ld, oo; } p;

void main() {
    uint e = flat_id(), row = p.G * p.gs;
    if (e >= p.M * row) return;
    uint m = e / row, c = e % row, s = c / p.gs, i = c % p.gs;
    o[p.oo + e] = x[p.ox + m * p.x_ld + from[s] * p.gs + i];
}
