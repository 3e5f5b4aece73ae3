// Register blocks without arrays of vectors, for the Highway kernels of src/ops. SVE's vector types are
// sizeless: they cannot be array elements or struct members, so a kernel that keeps several vectors live (a
// register-blocked GEMM's accumulators, the 16 / N vectors of a 16-lane sum) keeps each in a named local and
// spells the statement that touches it once, as a macro M(i) expanded for every i by the helpers below. The
// expansion is what the fully unrolled loops over the arrays were: the same operations in the same order.
#pragma once

// M(0) .. M(5): row r of a block of at most 6 rows. M guards its body with `if constexpr ((r) < MR)`, so a
// block of MR rows compiles the first MR only.
#define CLEF_ROWS6(M) M(0) M(1) M(2) M(3) M(4) M(5)

// The 16 / N vectors of N lanes that hold 16 values (N = 16, 8 or 4): M(0), then M(1) if N <= 8, then M(2)
// and M(3) if N == 4. N is a constant on fixed-width targets; on SVE it is the vector length, known at run
// time (Highway's Lanes, a power of two of at least 4).
#define CLEF_VECS16(N, M) \
    {                     \
        M(0)              \
        if ((N) <= 8) {   \
            M(1)          \
        }                 \
        if ((N) <= 4) {   \
            M(2)          \
            M(3)          \
        }                 \
    }
