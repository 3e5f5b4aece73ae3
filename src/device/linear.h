// One linear layer y = x·Wᵀ (+ b), the one every model part uses (backbone projections, vision tower, joint
// head). The weights come as they are stored: a checkpoint tensor in its own dtype, a quantised matrix
// (GGUF), or fp32 values. Which paths a layer can run is fixed when it is built:
// A layer built with int8 = true runs its fast path in int8 (ops::Int8Linear: activations and weights as int8
// blocks, Precision::Int8) whatever precision a forward asks for, its weights quantised once at load (a float
// tensor, or a quantised matrix held Packed) or per forward from the mapped file (Streamed).
//   Fast       ops::PackedLinear only (packed once, used in place, or streamed from a quantised file);
//   Reference  the scalar oracle only;
//   Both       both, for the backbone, whose callers pick per forward.
// The backbone's reference path costs no memory for a mapped tensor: it reads BF16 / F16 / F32 rows where the
// checkpoint is mapped (ops::linear_bf16, ops::linear, F16 rows converted block by block) and quantised rows
// dequantised block by block. Once packed, a mapped tensor's pages are dropped (re-read from the file if the
// reference path runs), so a layer holds about its panels.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "device/device.h"
#include "io/safetensors.h"
#include "ops/gemm.h"
#include "ops/int8_gemm.h"
#include "quant/quant.h"

namespace clef {

enum class LinearPath { Fast, Reference, Both };

// The CPU device's matrix (device/device.h dev::Matrix): dev::cpu().matrix() makes one with LinearPath::Both.
class Linear : public dev::Matrix {
public:
    Linear() = default;
    // w [out][in] in a float dtype (BF16 / F16 / F32 packed from the mapped bytes, or used in place where the
    // GEMM backend can; other dtypes through fp32). With LinearPath::Both a mapped tensor's file must outlive
    // the layer (its reference path reads it there); what a layer keeps of anything else it copies.
    Linear(const TensorView& w, LinearPath path, std::vector<float> bias = {}, bool int8 = false);
    // A quantised matrix: packed from rows dequantised to bf16, or (residency Streamed) dequantised again on
    // every forward from the mapped file. The matrix's owner keeps its storage alive.
    Linear(const QuantMatrix& w, LinearPath path, ops::Residency residency, std::vector<float> bias = {},
           bool int8 = false);
    // fp32 values [out][in]. keep_f32: keep them beside the packed copy (a caller reads rows through f32()).
    Linear(std::vector<float> w, int64_t out, int64_t in, LinearPath path, std::vector<float> bias = {},
           bool keep_f32 = false);
    Linear(Linear&&) noexcept;
    Linear& operator=(Linear&&) noexcept;
    ~Linear() override;

    int64_t out() const override { return out_; }
    int64_t in() const override { return in_; }
    const std::vector<float>& bias() const { return bias_; }
    // The fp32 weights given to the fp32 constructor when kept (its reference path, or keep_f32), else
    // nullptr.
    const float* f32() const { return f32_.empty() ? nullptr : f32_.data(); }
    size_t packed_bytes() const { return packed_.packed_bytes() + int8_.packed_bytes(); }
    size_t resident_bytes() const override { return packed_bytes(); }
    bool streamed() const override { return packed_.streamed() || int8_.streamed(); }
    bool has_fast() const { return !packed_.empty() || !int8_.empty(); }
    bool int8() const { return !int8_.empty(); }

    // y[m][out] = x[m][in] · Wᵀ + b: the reference path when asked and built (a Reference-only layer always
    // runs it), else the fast one with activations of precision p. m == 0 is a no-op.
    void forward(const float* x, int64_t m, float* y, bool reference = false,
                 ops::Precision p = ops::Precision::Exact) const;

private:
    void keep_reference(const TensorView& t, bool in_place);
    void reference_forward(const float* x, int64_t m, float* y) const;
    void reference_rows(const float* x, int64_t m, float* y,
                        const std::function<void(int64_t, float*)>& row) const;

    int64_t out_ = 0, in_ = 0;
    std::vector<float> bias_;
    std::unique_ptr<QuantMatrix> quant_;  // reference rows of a quantised layer (and the streamed provider's)
    // The reference rows of a BF16 / F16 / F32 tensor: where it is mapped, else in ref_copy_.
    const unsigned char* ref_ = nullptr;
    DType ref_dtype_ = DType::F32;
    std::vector<unsigned char> ref_copy_;
    std::vector<float> f32_;  // the reference rows of any other dtype, or the fp32 values given
    ops::PackedLinear packed_;
    ops::Int8Linear int8_;
};

}  // namespace clef
