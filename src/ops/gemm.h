// Packed linear layers for prefill: y[m][n] = x[m][k] . W[n][k]^T (+ bias), weights packed once at load.
//
// Precision::Exact is fp32-accurate (relative error ~1e-6 of sum |x||w|, like ops::linear_bf16);
// Precision::BF16 may round the activations once to bf16 (round to nearest even) and accumulate in fp32:
// relative error ~2^-9 per product, i.e. |y - y_ref| <~ 4e-3 * sum_k |x_k w_k| (documented bound used by the
// tests).
//
// Backends (chosen at construction, Backend::Auto picks oneDNN for bf16 weights wherever it has a JIT):
//   OneDnn  bf16 weights in their own row-major layout (packed, in place or streamed), in column blocks of
//           <= 32 MiB, multiplied by the kernel the GEMM plan names for the precision (gemm_plan(), chosen
//           once per process from the CPU):
//             f32     the block's bf16 weights widened to fp32 in cache-sized sub-blocks inside the forward,
//                     oneDNN's fp32 matmul (AVX2 / AVX-512 JIT): exact by construction, any x86 CPU;
//             bf16x3  the activations split into three bf16 terms x = hi + mid + lo (each residual exact in
//                     fp32, so the split reproduces x to ~2^-24), three bf16 products accumulated in fp32:
//                     exact, and the fastest exact kernel where bf16 matrix units exist (AMX);
//             bf16    the activations rounded once (the BF16 precision where bf16 units exist).
//           Without bf16 units both precisions use f32 (BF16 then equals Exact).
//   Simd    own fp32 micro-kernel (6 rows x 32 columns, Highway-dispatched per CPU target: ops/simd.h) on
//           32-column panels of bf16/f16/f32 weights converted on the fly.
//   Scalar  portable loops on the same panels (the reference the Simd kernel is tested against).
// F16 and F32 weights are kept in their own precision (panels) and always use the own kernels.
// Memory: the packed weights take the size of the bf16 (f16, f32) weights plus at most 31 padded rows; with
// oneDNN, Residency::InPlace uses the caller's bf16 weights without a copy and Residency::Streamed fetches
// them per call; the f32 kernel adds one sub-block buffer per calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace clef::ops {

// Int8: activations and weights as int8 blocks (ops/int8_gemm.h), for the backbone's projections of a model
// loaded in that precision; a PackedLinear runs it as Exact. F16: fp16 operands with fp32 accumulation on a
// Vulkan device's tensor cores (device/vk_device.cpp, docs/GPU.md); the CPU runs it as Exact.
enum class Precision { Exact, BF16, Int8, F16 };

enum class WeightType { F32, BF16, F16 };

// A weight matrix [n][k], row-major, in one of the supported element types (raw bits for bf16/f16).
struct WeightRef {
    const void* data = nullptr;
    WeightType type = WeightType::BF16;
};

// Fills bf16 rows [row0, row0 + nrows) of a [n][k] weight into out (nrows * k values, row-major).
using RowProvider = std::function<void(int64_t row0, int64_t nrows, uint16_t* bf16_out)>;

enum class GemmBackend { Auto, OneDnn, Simd, Scalar };

// The oneDNN kernels a precision can run on (see above).
enum class GemmKernel { F32, BF16x3, BF16 };

// How this process multiplies bf16 weights: where GemmBackend::Auto puts them, and which oneDNN kernel each
// precision runs on the oneDNN backend. The default (default_gemm_plan) follows the CPU and the precision the
// process mostly decides in (the weight layout is fixed at load):
//   exact  AMX: oneDNN bf16x3; otherwise the own Simd kernel (fp32 FMA on bf16 panels, faster than oneDNN's
//          fp32 matmul on widened blocks on AVX2 and AVX-512 alike: docs/PERFORMANCE.md);
//   bf16   bf16 units (AVX512_BF16, AMX): oneDNN bf16; otherwise as exact.
// CLEF_GEMM_BACKEND=onednn|simd|scalar and CLEF_GEMM_EXACT=f32|bf16x3 override it where available.
struct GemmPlan {
    GemmBackend bf16_weights = GemmBackend::Simd;
    GemmKernel exact = GemmKernel::F32;
    GemmKernel bf16 = GemmKernel::F32;
};
GemmPlan default_gemm_plan(Precision main);
// Makes p the process's plan (the engine does at load, before it builds layers).
void set_gemm_plan(const GemmPlan& p);
const GemmPlan& gemm_plan();
// Whether oneDNN has a JIT implementation of the kernel here (bf16 ones need bf16 units).
bool gemm_kernel_available(GemmKernel k);
// e.g. "simd(AVX3); onednn exact=f32:brg:avx512_core bf16=bf16:brg:avx512_core_bf16" (clef bench key `gemm`).
std::string gemm_plan_string();

// Replaces the plan while it lives (tests run every available kernel). Not thread-safe: set it before
// running layers. Throws clef::Error when a kernel is not available here.
class ScopedGemmPlan {
public:
    explicit ScopedGemmPlan(GemmPlan p);
    ~ScopedGemmPlan();
    ScopedGemmPlan(const ScopedGemmPlan&) = delete;
    ScopedGemmPlan& operator=(const ScopedGemmPlan&) = delete;

private:
    GemmPlan saved_;
};

// Best GFLOP/s of oneDNN's own matmul [m][k] x [k][n] (f32 or bf16 inputs, fp32 output, weights in the layout
// it prefers) over `iters` timed runs: the yardstick clef bench measures against. 0 where oneDNN has no JIT
// for the type (bf16 without bf16 units).
double dnnl_matmul_gflops(bool bf16, int64_t m, int64_t k, int64_t n, int iters);

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
    // The backend in use: "onednn(<plan>)", "simd(<target>)", "scalar".
    std::string backend_name() const;
    // Bytes held by the packed weights (0 when streamed or in place).
    size_t packed_bytes() const;
    // Whether the weights are fetched from the row provider on every forward.
    bool streamed() const;

    // y[m][n] = x[m][k] . W^T (+ bias[n]); x and y are dense row-major and must not alias. m == 0 is a no-op.
    // Thread-safe (concurrent calls share the cached primitives under a lock); uses num_threads() threads.
    void forward(const float* x, int64_t m, float* y, Precision p, const float* bias = nullptr) const;

    // The backend Auto resolves to for this CPU and weight type (env CLEF_GEMM_BACKEND=onednn|simd|scalar
    // overrides it when that backend is available).
    static GemmBackend auto_backend(WeightType t);
    // Whether a backend can run here (OneDnn: bf16 weights and a oneDNN fp32 JIT).
    static bool backend_available(GemmBackend b, WeightType t = WeightType::BF16);

    struct Impl;

private:
    int64_t n_ = 0, k_ = 0;
    std::unique_ptr<Impl> impl_;
};

// C[m][n] += alpha * A[m][k] . B[k][n] in fp32 (row-major, leading dimensions lda/ldb/ldc >= the row widths):
// the small single-threaded products of chunked kernels (delta rule, attention blocks). Highway register
// blocks of 4 rows x 2 vectors on the dispatched target. C must not alias A or B.
void small_gemm_acc(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc);

}  // namespace clef::ops
