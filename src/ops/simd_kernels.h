// The vector kernels behind PackedLinear's own backend and small_gemm_acc, compiled per Highway target in
// simd_kernels.cpp and dispatched at run time (ops/simd.h). Internal to src/ops.
#pragma once

#include <cstdint>

namespace clef::ops::simd {

constexpr int kPanelCols = 32;  // weight rows per packed panel ([k][32], zero-padded)
constexpr int kPanelRows = 6;   // activation rows per panel_block call at most

enum class PanelType { F32 = 0, BF16 = 1, F16 = 2 };

// y[i][c] = sum_t x[i][t] * panel[t][c] for i < rows (<= kPanelRows), c < ncols (<= kPanelCols); x rows are k
// apart, y rows ldy apart. Accumulates in fp32 in the order t = 0, 1, ... per output.
void panel_block(const float* x, int64_t k, const void* panel, PanelType type, int rows, int ncols, float* y,
                 int64_t ldy);

// c[m][n] += alpha * a[m][k] . b[k][n] (row-major with leading dimensions).
void small_gemm_acc(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc);

// out[i] = the float value of the bf16 bits in[i].
void bf16_to_f32(const uint16_t* in, float* out, int64_t count);

}  // namespace clef::ops::simd
