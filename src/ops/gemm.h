// Packed linear layers for prefill: y[m][n] = x[m][k] . W[n][k]^T (+ bias), weights packed once at load.
//
// Precision::Exact is fp32-accurate (relative error ~1e-6 of sum |x||w|, like ops::linear_bf16): on bf16
// hardware (AMX / AVX512_BF16, through oneDNN) the activations are split into three bf16 terms x = hi + mid +
// lo (each residual is exact in fp32, so the split reproduces x to ~2^-24) and the three products are
// accumulated in fp32; elsewhere an fp32 FMA micro-kernel converts the packed weights on the fly.
// Precision::BF16 rounds the activations once to bf16 (round to nearest even) and accumulates in fp32:
// relative error ~2^-9 per product, i.e. |y - y_ref| <~ 4e-3 * sum_k |x_k w_k| (documented bound used by the
// tests).
//
// Backends (chosen at construction, Backend::Auto picks the fastest measured for this machine):
//   OneDnn  oneDNN matmul (brgemm AMX / avx512_core_bf16) on the bf16 weights in their own row-major layout
//           (oneDNN copies tiles as it goes; measured faster here than weights pre-reordered into its blocked
//           layout: +3 % Exact, +7 % bf16 per decision), in column blocks of <= 32 MiB; primitives are cached
//           per (row count, block width), so repeated chunk sizes do not re-create them.
//   Avx512  own fp32 FMA micro-kernel (6 rows x 32 columns) on 32-column panels of bf16/f16/f32 weights.
//   Scalar  portable loops on the same panels (the fallback on CPUs without AVX-512).
// F16 and F32 weights are kept in their own precision (panels) and always use the own kernels; BF16 weights
// (tensors or row providers) use oneDNN when it reports a bf16 hardware implementation.
// Memory: the packed weights take the size of the bf16 (f16, f32) weights plus at most 31 padded rows; with
// oneDNN, Residency::InPlace uses the caller's bf16 weights without a copy and Residency::Streamed fetches
// them per call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace clef::ops {

enum class Precision { Exact, BF16 };

enum class WeightType { F32, BF16, F16 };

// A weight matrix [n][k], row-major, in one of the supported element types (raw bits for bf16/f16).
struct WeightRef {
    const void* data = nullptr;
    WeightType type = WeightType::BF16;
};

// Fills bf16 rows [row0, row0 + nrows) of a [n][k] weight into out (nrows * k values, row-major).
using RowProvider = std::function<void(int64_t row0, int64_t nrows, uint16_t* bf16_out)>;

enum class GemmBackend { Auto, OneDnn, Avx512, Scalar };

// Where the weights live between forward calls.
enum class Residency {
    Packed,    // packed once at construction: memory = the bf16 size of the matrix
    InPlace,   // (WeightRef) the caller's weights are used where they are, without a copy: they must stay
               // valid and unchanged as long as the layer lives (e.g. a mapped checkpoint). oneDNN backend
               // with BF16 weights only; otherwise the layer packs (packed_bytes() tells).
    Streamed,  // (RowProvider) the provider is kept and called again on every forward, one column block
               // (<= 32 MiB of bf16) at a time, into a per-thread buffer: memory = whatever the provider
               // reads from (e.g. a mapped Q4_K tensor) + one block buffer per calling thread. Results are
               // bit-identical to Packed.
               // oneDNN backend only; the own-kernel backends pack instead (streamed() tells).
};

class PackedLinear {
public:
    PackedLinear();
    // Packs w [n][k] (or, with Residency::InPlace, uses it where it is). Throws clef::Error on n <= 0, k <=
    // 0, a null pointer, or a backend this CPU lacks.
    PackedLinear(WeightRef w, int64_t n, int64_t k, GemmBackend backend = GemmBackend::Auto,
                 Residency residency = Residency::Packed);
    // Packs a bf16 weight [n][k] delivered row block by row block (e.g. dequantised GGUF tensors), or, with
    // Residency::Streamed, keeps the provider (which must stay valid, and be callable from any thread, as
    // long as the layer lives) and fetches the weights again on every forward.
    PackedLinear(const RowProvider& rows, int64_t n, int64_t k, GemmBackend backend = GemmBackend::Auto,
                 Residency residency = Residency::Packed);
    PackedLinear(PackedLinear&&) noexcept;
    PackedLinear& operator=(PackedLinear&&) noexcept;
    ~PackedLinear();

    int64_t n() const { return n_; }
    int64_t k() const { return k_; }
    bool empty() const { return impl_ == nullptr; }
    // The backend in use: "onednn:<impl>", "avx512", "scalar".
    std::string backend_name() const;
    // Bytes held by the packed weights (0 when streamed or in place).
    size_t packed_bytes() const;
    // Whether the weights are fetched from the row provider on every forward.
    bool streamed() const;

    // y[m][n] = x[m][k] . W^T (+ bias[n]); x and y are dense row-major and must not alias. m == 0 is a no-op.
    // Thread-safe (concurrent calls share the cached primitives under a lock); uses num_threads() threads.
    void forward(const float* x, int64_t m, float* y, Precision p, const float* bias = nullptr) const;

    // The backend Auto resolves to for this CPU and weight type (env CLEF_GEMM_BACKEND=onednn|avx512|scalar
    // overrides it when that backend is available).
    static GemmBackend auto_backend(WeightType t);
    // Whether a backend can run here (OneDnn: oneDNN reports an AMX or avx512_core_bf16 bf16 matmul).
    static bool backend_available(GemmBackend b, WeightType t = WeightType::BF16);

    struct Impl;

private:
    int64_t n_ = 0, k_ = 0;
    std::unique_ptr<Impl> impl_;
};

// C[m][n] += alpha * A[m][k] . B[k][n] in fp32 (row-major, leading dimensions lda/ldb/ldc >= the row widths):
// the small single-threaded products of chunked kernels (delta rule). AVX-512 register blocks of 4 rows x 64
// columns when available, plain loops otherwise. C must not alias A or B.
void small_gemm_acc(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc);

}  // namespace clef::ops
