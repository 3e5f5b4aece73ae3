// Shared by every compute shader of the Vulkan device (device/vk_device.cpp): buffer element access, the
// flat invocation index of a 2-D grid, and the scalar functions whose CPU twins are in ops/basic.cpp.
#extension GL_EXT_control_flow_attributes : enable

// The flat index of this invocation in a grid of (x, y) workgroups of local_size_x (the host splits large
// 1-D dispatches over y: device/vk_device.cpp grid_1d). A macro, so that gl_WorkGroupSize is read where it is
// used (in main): a function here, before the shader's layout(local_size_x = ...) declaration, sees the
// default size (1, 1, 1), and the rows of a 2-D grid overlapped.
#define flat_id() (gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x)

// bf16 element e of a buffer of 32-bit words (two elements per word, the lower first).
float bf16_at(uint w, uint e) {
    return uintBitsToFloat(((e & 1u) == 0u ? (w << 16) : (w & 0xffff0000u)));
}
// fp32 to bf16 bits, rounded to nearest even (util/half.h f32_to_bf16; NaN kept quiet).
uint bf16_bits(float f) {
    uint u = floatBitsToUint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

float sigmoid_f(float x) { return 1.0 / (1.0 + exp(-x)); }
float silu_f(float x) { return x * sigmoid_f(x); }
float softplus_f(float x) { return x > 20.0 ? x : log(1.0 + exp(x)); }

// erf to within 1.2e-7 absolute (W. J. Cody's rational forms are what libm uses; this is the classic
// Numerical Recipes erfc Chebyshev fit, fractional error < 1.2e-7 everywhere).
float erf_f(float x) {
    float z = abs(x);
    float t = 1.0 / (1.0 + 0.5 * z);
    float r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
              t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
              t * (-0.82215223 + t * 0.17087277)))))))));
    return x >= 0.0 ? 1.0 - r : r - 1.0;
}
