// The vector kernels of the int8 GEMM (ops/int8_gemm.h), compiled per Highway target in int8_kernels.cpp and
// dispatched at run time (ops/simd.h), with the plain-C++ twin of each (int8_kernels.cpp) they are tested
// against bit for bit (tests/test_kernels.cpp, tests/test_int8.cpp). Internal to src/ops.
//
// Blocks: k is cut into blocks of kI8Block values; a row of fp32 values becomes int8 levels q in [-127, 127]
// and one fp32 scale s per block (x ~ s * q, s = max |x| / 127 over the block, q = x / s rounded to nearest
// even), for activations and weights alike.
//
// Panels: the weights of kI8Cols output columns (weight rows), per block: kI8Block / 4 steps of
// [kI8Cols columns][4 levels] (the four consecutive k of a step, column by column: 64 bytes, one 512-bit
// vector), then the kI8Cols column scales as fp32: kI8PanelBlockBytes bytes per block, blocks one after
// another. The levels are stored as w + kI8Bias (unsigned bytes 1 to 255): the unsigned operand of vpdpbusd
// as they are, w again by one xor with 0x80 where a kernel wants signed bytes.
//
// Level panels (weights with unsigned levels u < 2^bits and w = D * u + O per 32 values: quant/levels.h), of
// 5-bit levels: the same steps of levels (as they are, no bias), then the kI8Cols D and the kI8Cols O as
// fp32: kU8PanelBlockBytes per block. Of 4-bit levels (nibble panels): two steps per 64 bytes, kI8Block / 8
// of them (step g in the low nibbles, step g + kI8Block / 8 in the high ones: byte e of column c in group g
// holds the levels of k = 4g + e and 4g + 16 + e, the pairing of Q4_0's bytes), then the D and the O:
// kN4PanelBlockBytes per block.
#pragma once

#include <cstdint>

namespace clef::ops::i8 {

constexpr int kI8Block = 32;
constexpr int kI8Cols = 16;      // columns per panel
constexpr int kI8TileCols = 32;  // columns per panel_block call at most: two panels side by side
constexpr int kI8Rows = 8;       // activation rows per panel_block call at most
constexpr int kI8Bias = 128;     // signed panels hold w + kI8Bias
constexpr int64_t kI8PanelBlockBytes = kI8Block * kI8Cols + kI8Cols * 4;
constexpr int64_t kU8PanelBlockBytes = kI8Block * kI8Cols + 2 * kI8Cols * 4;
constexpr int64_t kN4PanelBlockBytes = kI8Block * kI8Cols / 2 + 2 * kI8Cols * 4;
// Bytes per block of k of one panel of a kind (bits: 0 signed panels, 4 nibble panels, 5 level panels) and
// the bytes of levels among them.
constexpr int64_t panel_block_bytes(int bits) {
    return bits == 0 ? kI8PanelBlockBytes : bits == 4 ? kN4PanelBlockBytes : kU8PanelBlockBytes;
}
constexpr int64_t panel_level_bytes(int bits) {
    return bits == 4 ? kI8Block * kI8Cols / 2 : kI8Block * kI8Cols;
}

// Levels q[k_padded] and scales s[k_padded / kI8Block] of x[k]; the padding (k up to a whole block) is zero.
void quantize_row(const float* x, int64_t k, int8_t* q, float* s);
void quantize_row_ref(const float* x, int64_t k, int8_t* q, float* s);

// Quantised activations: a row of k values becomes k_padded / kI8Block blocks of kI8ActBytes bytes: the
// block's kI8Block levels (quantize_row's), its fp32 scale s, then one 32-bit word for the panels' kind: for
// signed panels the int32 -kI8Bias * (the sum of the levels), which the weights' bias adds to a block's sum
// (so a kernel may start the sum there); for level panels the fp32 s * float(the sum of the levels) rounded
// once.
constexpr int64_t kI8ActBytes = kI8Block + 8;
void quantize_acts(const float* x, int64_t k, unsigned char* out, bool levels);
void quantize_acts_ref(const float* x, int64_t k, unsigned char* out, bool levels);

// Rows of quantised activations: row r's block b at p + r * ld + b * kI8ActBytes.
struct I8Rows {
    const unsigned char* p = nullptr;
    int64_t ld = 0;
    int rows = 0;  // 1 to kI8Rows
};

// One tile: x's rows against the first ncols (1 to kI8TileCols) columns of the panels at `panel` (consecutive
// panels panel_stride bytes apart: column c is column c % kI8Cols of panel c / kI8Cols), over nb blocks.
struct I8Tile {
    const unsigned char* panel = nullptr;
    int64_t panel_stride = 0;
    int64_t nb = 0;
    int ncols = 0;
    float* y = nullptr;  // y[r * ldy + c] for r < rows, c < ncols; no other element is touched
    int64_t ldy = 0;
    bool accumulate = false;  // add to y (a later slice of k) instead of starting from 0
};

// Signed panels: y[r][c] = (accumulate ? y[r][c] : 0) + sum over blocks b of S * (ws[b][c] * s[r][b]), one
// fused multiply-add per block in block order, S = sum_t q[r][t] w[c][t] (exact int32); x quantised with
// levels = false.
void panel_block(const I8Rows& x, const I8Tile& t);
void panel_block_ref(const I8Rows& x, const I8Tile& t);

// Level panels (bits: 4 nibble panels, 5 level panels): per block two fused multiply-adds, S * (D[b][c] *
// s[r][b]) then O[b][c] times the block's s * sum word, S = sum_t q[r][t] u[c][t]; x quantised with levels =
// true.
void panel_block_u(const I8Rows& x, const I8Tile& t, int bits);
void panel_block_u_ref(const I8Rows& x, const I8Tile& t, int bits);

// The extension the panel kernels use besides the Highway target on this CPU under CLEF_MAX_ISA: "dotprod" on
// aarch64 with FEAT_DotProd (whatever target is dispatched); on x86 "avx512-vnni" (512-bit vpdpbusd) while an
// AVX-512 target is dispatched on a CPU with AVX512-VNNI, "avx-vnni" (256-bit VEX vpdpbusd) while the AVX2
// target is dispatched on one with AVX-VNNI; else "" (the AVX2 kernels on either target, or the twins).
// last_kernel_extension: the one the last panel_block / panel_block_u call used (tests).
const char* kernel_extension();
const char* last_kernel_extension();

}  // namespace clef::ops::i8
