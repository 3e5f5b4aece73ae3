// The vector kernels of the int8 GEMM (ops/int8_gemm.h), compiled per Highway target in int8_kernels.cpp and
// dispatched at run time (ops/simd.h), with the plain-C++ twin of each (int8_gemm.cpp) they are tested
// against bit for bit (tests/test_int8.cpp). Internal to src/ops.
//
// Blocks: k is cut into blocks of kI8Block values; a row of fp32 values becomes int8 levels q in [-127, 127]
// and one fp32 scale s per block (x ~ s * q, s = max |x| / 127 over the block, q = x / s rounded to nearest
// even), for activations and weights alike.
//
// Panels: the weights of kI8Cols output columns (weight rows), per block: kI8Block / 4 steps of
// [kI8Cols columns][4 levels] (the four consecutive k of a step, column by column), then the kI8Cols column
// scales as fp32: kI8PanelBlockBytes bytes per block, blocks one after another.
//
// Level panels (weights with unsigned levels u < 2^bits and w = D * u + O per 32 values: quant/levels.h): the
// same steps of levels, then the kI8Cols D and the kI8Cols O as fp32: kU8PanelBlockBytes per block. With at
// most 5 bits, vpmaddubsw's 16-bit pair sums can add up several steps before they are widened (4-bit: all 8
// steps of a block, 5-bit: 4), about half the multiplies of the signed panels.
#pragma once

#include <cstdint>

namespace clef::ops::i8 {

constexpr int kI8Block = 32;
constexpr int kI8Cols = 8;
constexpr int kI8Rows = 4;  // activation rows per panel_block call at most
constexpr int64_t kI8PanelBlockBytes = kI8Block * kI8Cols + kI8Cols * 4;
constexpr int64_t kU8PanelBlockBytes = kI8Block * kI8Cols + 2 * kI8Cols * 4;

// Levels q[k_padded] and scales s[k_padded / kI8Block] of x[k]; the padding (k up to a whole block) is zero.
void quantize_row(const float* x, int64_t k, int8_t* q, float* s);
void quantize_row_ref(const float* x, int64_t k, int8_t* q, float* s);

// y[i][c] = sum over blocks b of (sum_t xq[i][t] w[c][t]) * (ws[b][c] * xs[i][b]), accumulated block after
// block in fp32 with one fused multiply-add per block, for i < rows (<= kI8Rows), c < ncols (<= kI8Cols).
// xq rows are kp levels apart (kp = nb * kI8Block), xs rows nb scales apart, y rows ldy apart.
void panel_block(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel, int rows,
                 int ncols, float* y, int64_t ldy);
void panel_block_ref(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel, int rows,
                     int ncols, float* y, int64_t ldy);

// Level panels: y[i][c] = sum over blocks b of (sum_t xq[i][t] u[c][t]) * (D[b][c] * xs[i][b]) +
// xsum[i][b] * (O[b][c] * xs[i][b]), two fused multiply-adds per block in that order; xsum[i][b] = the sum of
// row i's levels in block b (rows nb apart). bits: 4 or 5.
void panel_block_u(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                   const unsigned char* panel, int rows, int ncols, float* y, int64_t ldy, int bits);
void panel_block_u_ref(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                       const unsigned char* panel, int rows, int ncols, float* y, int64_t ldy, int bits);

// The extension the panel kernels use besides the Highway target on this CPU under CLEF_MAX_ISA: "dotprod" on
// aarch64 with FEAT_DotProd (whatever target is dispatched); on x86 "avx512-vnni" (AVX512-VNNI with VL) or
// else "avx-vnni" (AVX-VNNI) while an AVX2 or AVX-512 target is dispatched; else "". last_kernel_extension:
// the one the last panel_block / panel_block_u call used (tests).
const char* kernel_extension();
const char* last_kernel_extension();

}  // namespace clef::ops::i8
