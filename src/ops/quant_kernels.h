// The sub-block scale searches of the K-quant quantisers (quant/quant.cpp): a scalar reference and Highway
// kernels (ops/quant_kernels.cpp, compiled per target and dispatched at run time) that return the same bits
// on every CPU, so a quantised file does not depend on the machine that wrote it (tests/test_kernels.cpp
// compares them on every target).
#pragma once

namespace clef::ops {

// Q4_K / Q5_K: scale and min (>= 0) with x ≈ scale * L - min, L in [0, nmax], for one 32-value sub-block.
void fit_scale_min(const float* x, int nmax, float& scale, float& min_out);
// Q6_K: the scale with x ≈ scale * L, L in [-32, 31], for one 16-value sub-block.
float fit_scale_sym(const float* x);

// The scalar references of the two.
void fit_scale_min_ref(const float* x, int nmax, float& scale, float& min_out);
float fit_scale_sym_ref(const float* x);

}  // namespace clef::ops
