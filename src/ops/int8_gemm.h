// Linear layers with int8 activations and int8 weights (Precision::Int8, opt-in): y[m][n] = x[m][k] . W^T.
//
// Both sides are cut into blocks of 32 along k, each block int8 levels with one fp32 scale
// (ops/int8_kernels.h: s = max |v| / 127, levels v / s rounded to nearest even). Activations are quantised on
// every forward; weights once at load (Packed) or again on every forward from the provider (Streamed: a
// quantised GGUF matrix stays in its file). A block's products are summed in int32, exactly, and each block's
// sum is added in fp32 times the two scales.
//
// Weights whose file type has affine 32-value blocks of at most 5 bits (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K:
// quant/levels.h) come as those blocks' unsigned levels and (scale, offset) instead, exactly as the file
// holds them, and multiply with about half the instructions (ops/int8_kernels.h, level panels); their only
// error is the activations'. Q8_0 weights come as their blocks' int8 levels and scales, also exactly the
// file's (Int8Provider; signed panels; device/linear.cpp packs those at load, streamed or not). Other weights
// come as fp32 rows from the provider (a GGUF matrix dequantised exactly, a BF16 or F16 matrix widened) and
// are quantised: Q4_0 and IQ4_NL blocks keep their levels up to the common factor; every other type (blocks
// with mins, 16-value sub-block scales, grids) is requantised, within half a level of the block's new scale
// (max |w| / 254): far inside the file's own quantisation step. Error of one output (what
// tests/test_kernels.cpp and tests/test_int8.cpp hold it to):
//   |y - x.w| <= sum over t of (|x_t| e_w,t + |w_t| e_x,t + e_x,t e_w,t) + fp32 rounding of the block sums,
// with e_x,t = s_x / 2 and e_w,t = s_w / 2 of t's blocks.
//
// Memory: Packed holds k_padded + 4 * k_padded / 32 bytes per row (1.125 bytes per weight; 1.25 with 5-bit
// levels, 0.75 with 4-bit ones: two per byte);
// Streamed holds nothing between calls and, per calling thread during one, the 64 rows it decodes at once
// (fp32) and their panels, used while they are in the L2 cache (int8_packed_bytes,
// int8_stream_scratch_bytes).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace clef::ops {

// Fills fp32 rows [row0, row0 + nrows) of a [n][k] weight into out (nrows * k values, row-major). Called from
// any thread when streamed.
using RowProviderF32 = std::function<void(int64_t row0, int64_t nrows, float* out)>;
// Fills rows [row0, row0 + nrows) of a [n][k] weight as levels u (nrows rows of level_row_bytes(bits, k)) and
// the per-32 D and O (nrows * k / 32 each) with w = D * u + O. Called from any thread when streamed.
using LevelProvider = std::function<void(int64_t row0, int64_t nrows, uint8_t* u, float* D, float* O)>;
// Bytes of a row of k levels of `bits` bits: one per level (5 bits), or two levels per byte (4 bits; per
// 32-value block 16 bytes, byte j holding level j in its low nibble and j + 16 in its high one: Q4_0's
// layout).
constexpr int64_t level_row_bytes(int bits, int64_t k) {
    return bits == 4 ? k / 2 : k;
}
// Fills rows [row0, row0 + nrows) of a [n][k] weight as int8 levels q (nrows * k) and per-32 scales s
// (nrows * k / 32) with w = s * q (Q8_0's blocks as they are: quant/levels.h). Called from any thread when
// streamed.
using Int8Provider = std::function<void(int64_t row0, int64_t nrows, int8_t* q, float* s)>;

class Int8Linear {
public:
    Int8Linear();
    // streamed = false: the rows are read and quantised once, here; true: the provider is kept (it must stay
    // valid as long as the layer lives) and read again on every forward. Throws clef::Error on n or k <= 0.
    Int8Linear(const RowProviderF32& rows, int64_t n, int64_t k, bool streamed);
    // Levels of `bits` (4 or 5) bits; k must be a multiple of 32.
    Int8Linear(const LevelProvider& levels, int bits, int64_t n, int64_t k, bool streamed);
    // int8 levels and scales multiplied as they are (no requantisation); k must be a multiple of 32.
    Int8Linear(const Int8Provider& levels, int64_t n, int64_t k, bool streamed);
    Int8Linear(Int8Linear&&) noexcept;
    Int8Linear& operator=(Int8Linear&&) noexcept;
    ~Int8Linear();

    bool empty() const { return impl_ == nullptr; }
    int64_t n() const { return n_; }
    int64_t k() const { return k_; }
    bool streamed() const;
    // Bytes of the packed weights (0 when streamed).
    size_t packed_bytes() const;
    // "int8(<target>)" (signed panels) or "int8-levels(<target>)".
    std::string backend_name() const;

    // y[m][n] = x[m][k] . W^T (+ bias[n]); x and y must not alias. Thread-safe; uses num_threads() threads.
    // reference: the plain-C++ twins of the kernels (the same bits: tests).
    void forward(const float* x, int64_t m, float* y, const float* bias = nullptr,
                 bool reference = false) const;

    struct Impl;
    struct Providers;

private:
    int64_t n_ = 0, k_ = 0;
    std::unique_ptr<Impl> impl_;
};

// Bytes an Int8Linear of n rows of k holds packed (bits: 0 signed panels, else levels of that many bits):
// whole panels of kI8Cols rows (ops/int8_kernels.h).
uint64_t int8_packed_bytes(int64_t n, int64_t k, int bits);
// Bytes one calling thread holds during a forward of a streamed Int8Linear with rows of k: the rows it
// decodes at once and their panels.
uint64_t int8_stream_scratch_bytes(int64_t k);

// How this machine runs Precision::Int8: "int8(<target>)", the dispatch target of the panel kernels and their
// extension if any, e.g. "int8(NEON+dotprod)" (ops/int8_kernels.h; clef info).
std::string int8_plan_string();

// Best GOP/s (two per multiply-add) of the int8 panel kernel (bits 0: signed panels; 4: 4-bit level panels),
// over `iters` runs of 32 products of 64 x 512 by 512 x 64 on each of num_threads() threads at once, with
// every thread's operands in its core's L1 cache: the yardstick of Precision::Int8 (clef bench: the faster
// of the two), the most this machine's int8 path can do.
double int8_kernel_gops(int iters, int bits = 0);

}  // namespace clef::ops
