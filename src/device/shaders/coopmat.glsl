// The tensor-core fragment interface of linear_cm.comp: 16 x 16 tiles, fp16 operands read from the shared
// tiles as_ (A, row-major, row stride AS) and bs_ (B stored n-major: B[k][n] at n AS + k), fp32 accumulation,
// results stored to the shared tile cs_ (row stride CS). One accumulator type, FragAcc, and three calls:
//   frag_zero()                 a zero accumulator
//   frag_mma(c, a_off, b_off)   c += A(16 x 16 at as_[a_off]) B(16 x 16 at bs_[b_off])
//   frag_store(c, c_off)        c into cs_[c_off ..]
// Two implementations behind it:
//   COOPMAT_NV  the GL_NV_cooperative_matrix intrinsics (VK_NV_cooperative_matrix: NVIDIA tensor cores),
//   otherwise   a plain-GLSL emulation with the same data flow for devices without them (lavapipe in CI):
//               A and B are read where a real load reads them, and the accumulator's 256 values are spread
//               over the subgroup's SG invocations (invocation l holds elements l, l + SG, ...; SG >= 8).
// Both multiply fp16 values exactly in fp32 and accumulate in fp32; only the order of the additions differs.
#ifdef COOPMAT_NV
#define FragAcc fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

FragAcc frag_zero() { return FragAcc(0.0); }

void frag_mma(inout FragAcc c, uint a_off, uint b_off) {
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a, b;
    coopMatLoadNV(a, as_, a_off, AS, false);
    coopMatLoadNV(b, bs_, b_off, AS, true);
    c = coopMatMulAddNV(a, b, c);
}

void frag_store(FragAcc c, uint c_off) { coopMatStoreNV(c, cs_, c_off, CS, false); }
#else
const uint LANE = 256u / SG;  // accumulator values per invocation
struct FragAcc {
    float v[32];
};

FragAcc frag_zero() {
    FragAcc c;
    [[unroll]] for (uint s = 0u; s < 32u; ++s) c.v[s] = 0.0;
    return c;
}

void frag_mma(inout FragAcc c, uint a_off, uint b_off) {
    uint l = gl_SubgroupInvocationID;
    for (uint s = 0u; s < LANE; ++s) {
        uint e = l + s * SG, i = e / 16u, j = e % 16u;
        float sum = c.v[s];
        [[unroll]] for (uint kk = 0u; kk < 16u; ++kk)
            sum = fma(float(as_[a_off + i * AS + kk]), float(bs_[b_off + j * AS + kk]), sum);
        c.v[s] = sum;
    }
}

void frag_store(FragAcc c, uint c_off) {
    uint l = gl_SubgroupInvocationID;
    for (uint s = 0u; s < LANE; ++s) {
        uint e = l + s * SG;
        cs_[c_off + (e / 16u) * CS + e % 16u] = c.v[s];
    }
}
#endif
