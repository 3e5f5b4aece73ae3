#include "device/linear.h"

#include <algorithm>
#include <cstring>

#include "ops/basic.h"
#include "ops/cpu.h"
#include "quant/levels.h"
#include "util/error.h"
#include "util/mmap.h"

namespace clef {

namespace {

bool wants_fast(LinearPath p) {
    return p != LinearPath::Reference;
}
bool wants_reference(LinearPath p) {
    return p != LinearPath::Fast;
}

}  // namespace

Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;
Linear::~Linear() = default;

Linear::Linear(const TensorView& t, LinearPath path, std::vector<float> bias, bool int8)
    : out_(t.shape.at(0)), in_(t.numel() / std::max<int64_t>(t.shape.at(0), 1)), bias_(std::move(bias)) {
    const bool aligned16 = reinterpret_cast<uintptr_t>(t.data) % alignof(uint16_t) == 0;
    if (int8 && wants_fast(path)) {
        if (t.dtype == DType::BF16 && aligned16 && path == LinearPath::Both)
            bf16_ = reinterpret_cast<const uint16_t*>(t.data);
        else if (wants_reference(path))
            f32_ = t.to_f32();
        const size_t es = dtype_size(t.dtype);
        int8_ = ops::Int8Linear(
            [&t, es, this](int64_t r0, int64_t n, float* out) {
                convert_to_f32(t.dtype, t.data + static_cast<size_t>(r0 * in_) * es,
                               static_cast<size_t>(n * in_), out);
            },
            out_, in_, false);
        // Quantised at load: the mapped copy need not stay resident (the reference path faults it back in).
        drop_mapped_pages(t.data, t.nbytes);
        return;
    }
    if (t.dtype == DType::BF16 && aligned16 && path != LinearPath::Reference) {
        if (path == LinearPath::Both) bf16_ = reinterpret_cast<const uint16_t*>(t.data);
        if (!wants_fast(path)) return;
        // Used in place from the mapped checkpoint (no copy) where the backend allows.
        packed_ = ops::PackedLinear({t.data, ops::WeightType::BF16}, out_, in_, ops::GemmBackend::Auto,
                                    ops::Residency::InPlace);
        // Packed into the own kernels' panels instead: the mapped copy need not stay resident (the reference
        // path, when asked, faults it back in).
        if (packed_.packed_bytes() > 0) drop_mapped_pages(t.data, static_cast<size_t>(out_ * in_) * 2);
        return;
    }
    if (t.dtype == DType::F16 && aligned16 && !wants_reference(path)) {
        packed_ = ops::PackedLinear({t.data, ops::WeightType::F16}, out_, in_);
        return;
    }
    f32_ = t.to_f32();
    if (t.dtype == DType::F16 && aligned16)
        packed_ = ops::PackedLinear({t.data, ops::WeightType::F16}, out_, in_);
    else if (wants_fast(path))
        packed_ = ops::PackedLinear({f32_.data(), ops::WeightType::F32}, out_, in_);
    if (!wants_reference(path)) std::vector<float>().swap(f32_);
}

Linear::Linear(const QuantMatrix& q, LinearPath path, ops::Residency residency, std::vector<float> bias,
               bool int8)
    : out_(q.rows), in_(q.cols), bias_(std::move(bias)), quant_(std::make_unique<QuantMatrix>(q)) {
    if (!wants_fast(path)) return;
    const QuantMatrix& m = *quant_;  // on the heap: the streamed layer's provider keeps pointing at it
    ops::num_threads();              // applies the global thread setting to this thread
    if (int8) {
        const bool streamed = residency == ops::Residency::Streamed;
        if (has_levels(m))
            int8_ = ops::Int8Linear(
                [&m](int64_t r0, int64_t n, uint8_t* lu, float* ld, float* lo) {
                    const int64_t nb = m.cols / 32;
                    for (int64_t i = 0; i < n; ++i)
                        matrix_row_levels(m, r0 + i, lu + i * m.cols, ld + i * nb, lo + i * nb);
                },
                affine_level_bits(m.type), out_, in_, streamed);
        else
            int8_ = ops::Int8Linear(
                [&m](int64_t r0, int64_t n, float* out) {
                    for (int64_t i = 0; i < n; ++i) m.row_f32(r0 + i, out + i * m.cols);
                },
                out_, in_, streamed);
        if (!int8_.streamed()) m.drop_pages();
        return;
    }
    packed_ = ops::PackedLinear(
        [&m](int64_t r0, int64_t n, uint16_t* out) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; ++i) m.row_bf16(r0 + i, out + i * m.cols);
        },
        out_, in_, ops::GemmBackend::Auto, residency);
    // Packed: the mapped blocks need not stay resident (re-faulted if read again).
    if (!packed_.streamed()) m.drop_pages();
}

Linear::Linear(std::vector<float> w, int64_t out, int64_t in, LinearPath path, std::vector<float> bias,
               bool keep_f32)
    : out_(out), in_(in), bias_(std::move(bias)), f32_(std::move(w)) {
    if (static_cast<int64_t>(f32_.size()) != out * in)
        throw Error("linear: weight count does not match its shape");
    if (wants_fast(path)) packed_ = ops::PackedLinear({f32_.data(), ops::WeightType::F32}, out_, in_);
    if (!wants_reference(path) && !keep_f32) std::vector<float>().swap(f32_);
}

void Linear::forward(const float* x, int64_t m, float* y, bool reference, ops::Precision p) const {
    if (m == 0) return;
    if (!reference && !int8_.empty())
        int8_.forward(x, m, y, bias_.empty() ? nullptr : bias_.data());
    else if (reference || packed_.empty())
        reference_forward(x, m, y);
    else
        packed_.forward(x, m, y, p, bias_.empty() ? nullptr : bias_.data());
}

void Linear::reference_forward(const float* x, int64_t m, float* y) const {
    const float* b = bias_.empty() ? nullptr : bias_.data();
    if (quant_) {
        reference_quant(x, m, y);
    } else if (bf16_) {
        ops::linear_bf16(x, m, in_, bf16_, out_, b, y);
    } else if (!f32_.empty()) {
        ops::linear(x, m, in_, f32_.data(), out_, b, y);
    } else {
        throw Error("linear: the reference path was not kept for this layer");
    }
}

// y = x · Wᵀ + b through the oracle ops::linear, on blocks of rows dequantised to fp32.
void Linear::reference_quant(const float* x, int64_t m, float* y) const {
    constexpr int64_t kBlock = 64;
    std::vector<float> w(static_cast<size_t>(kBlock * in_)), yb(static_cast<size_t>(m * kBlock));
    for (int64_t r0 = 0; r0 < out_; r0 += kBlock) {
        const int64_t nb = std::min(kBlock, out_ - r0);
        for (int64_t i = 0; i < nb; ++i) quant_->row_f32(r0 + i, w.data() + i * in_);
        ops::linear(x, m, in_, w.data(), nb, bias_.empty() ? nullptr : bias_.data() + r0, yb.data());
        for (int64_t t = 0; t < m; ++t)
            std::memcpy(y + t * out_ + r0, yb.data() + t * nb, static_cast<size_t>(nb) * sizeof(float));
    }
}

void LayerNorm::forward(const float* x, int64_t rows, float* y, float eps) const {
    ops::layer_norm_fast(x, rows, static_cast<int64_t>(weight.size()), weight.data(), bias.data(), eps, y);
}

}  // namespace clef
