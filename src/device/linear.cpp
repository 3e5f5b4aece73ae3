#include "device/linear.h"

#include <algorithm>
#include <cstring>

#include "ops/basic.h"
#include "ops/cpu.h"
#include "quant/levels.h"
#include "util/error.h"
#include "util/half.h"
#include "util/mmap.h"

namespace clef {

namespace {

bool wants_fast(LinearPath p) {
    return p != LinearPath::Reference;
}
bool wants_reference(LinearPath p) {
    return p != LinearPath::Fast;
}
bool aligned(const void* p, size_t n) {
    return reinterpret_cast<uintptr_t>(p) % n == 0;
}

// A BF16 / F16 / F32 tensor the reference path reads as it is stored (other dtypes go through fp32).
bool stored_float(const TensorView& t) {
    return (t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32) &&
           aligned(t.data, dtype_size(t.dtype));
}

// F16 / F32 rows of a matrix stored in another row order or layout (a GGUF tensor's row maps), gathered into
// one buffer of their own type (exact: the values are that type's) and packed from it.
ops::PackedLinear pack_float_matrix(const QuantMatrix& m) {
    const size_t n = static_cast<size_t>(m.rows * m.cols);
    if (m.type == GgmlType::F32) {
        std::vector<float> w(n);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < m.rows; ++r) m.row_f32(r, w.data() + r * m.cols);
        return ops::PackedLinear({w.data(), ops::WeightType::F32}, m.rows, m.cols);
    }
    std::vector<uint16_t> w(n);
#pragma omp parallel
    {
        std::vector<float> row(static_cast<size_t>(m.cols));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m.rows; ++r) {
            m.row_f32(r, row.data());
            for (int64_t c = 0; c < m.cols; ++c) w[static_cast<size_t>(r * m.cols + c)] = f32_to_f16(row[c]);
        }
    }
    return ops::PackedLinear({w.data(), ops::WeightType::F16}, m.rows, m.cols);
}

}  // namespace

Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;
Linear::~Linear() = default;

Linear::Linear(const TensorView& t, LinearPath path, std::vector<float> bias, bool int8)
    : out_(t.shape.at(0)), in_(t.numel() / std::max<int64_t>(t.shape.at(0), 1)), bias_(std::move(bias)) {
    if (wants_reference(path)) keep_reference(t, path == LinearPath::Both);
    if (!wants_fast(path)) return;
    if (int8) {
        const size_t es = dtype_size(t.dtype);
        int8_ = ops::Int8Linear(
            [&t, es, this](int64_t r0, int64_t n, float* out) {
                convert_to_f32(t.dtype, t.data + static_cast<size_t>(r0 * in_) * es,
                               static_cast<size_t>(n * in_), out);
            },
            out_, in_, false);
    } else if (t.dtype == DType::BF16 && aligned(t.data, 2)) {
        // A mapped checkpoint is used in place (no copy) where the backend allows.
        packed_ = ops::PackedLinear({t.data, ops::WeightType::BF16}, out_, in_, ops::GemmBackend::Auto,
                                    t.mapped ? ops::Residency::InPlace : ops::Residency::Packed);
        if (packed_.packed_bytes() == 0) return;
    } else if (t.dtype == DType::F16 && aligned(t.data, 2)) {
        packed_ = ops::PackedLinear({t.data, ops::WeightType::F16}, out_, in_);
    } else if (t.dtype == DType::F32 && aligned(t.data, 4)) {
        packed_ =
            ops::PackedLinear({reinterpret_cast<const float*>(t.data), ops::WeightType::F32}, out_, in_);
    } else {
        const std::vector<float> w = t.to_f32();
        packed_ = ops::PackedLinear({w.data(), ops::WeightType::F32}, out_, in_);
    }
    // Packed (or quantised): the mapped copy need not stay resident (the reference path faults it back in).
    if (t.mapped) drop_mapped_pages(t.data, t.nbytes);
}

// The reference path reads a mapped float tensor where it is when the mapping outlives the layer (in_place:
// the backbone's layers, whose engine keeps its files), and keeps a copy of anything else (in its own type
// where that is BF16 / F16 / F32, else in fp32).
void Linear::keep_reference(const TensorView& t, bool in_place) {
    if (!stored_float(t)) {
        f32_ = t.to_f32();
        return;
    }
    ref_dtype_ = t.dtype;
    ref_ = t.data;
    if (t.mapped && in_place) return;
    ref_copy_.assign(t.data, t.data + t.nbytes);
    ref_ = ref_copy_.data();
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
                    const int64_t nb = m.cols / 32,
                                  bytes = ops::level_row_bytes(affine_level_bits(m.type), m.cols);
                    for (int64_t i = 0; i < n; ++i)
                        matrix_row_levels(m, r0 + i, lu + i * bytes, ld + i * nb, lo + i * nb);
                },
                affine_level_bits(m.type), out_, in_, streamed);
        else if (has_int8_levels(m))  // packed whatever the residency: the panels are the file's bytes
            int8_ = ops::Int8Linear(  // rearranged (1.125 against 1.0625 per weight), no decode per forward
                [&m](int64_t r0, int64_t n, int8_t* q, float* s) {
                    for (int64_t i = 0; i < n; ++i)
                        matrix_row_int8(m, r0 + i, q + i * m.cols, s + i * (m.cols / 32));
                },
                out_, in_, false);
        else
            int8_ = ops::Int8Linear(
                [&m](int64_t r0, int64_t n, float* out) {
                    for (int64_t i = 0; i < n; ++i) m.row_f32(r0 + i, out + i * m.cols);
                },
                out_, in_, streamed);
        if (!int8_.streamed()) m.drop_pages();
        return;
    }
    if (m.type == GgmlType::F16 || m.type == GgmlType::F32) {
        packed_ = pack_float_matrix(m);  // fp32-exact, as a checkpoint of that type
        m.drop_pages();
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
        reference_rows(x, m, y, [this](int64_t r, float* dst) { quant_->row_f32(r, dst); });
    } else if (ref_ && ref_dtype_ == DType::BF16) {
        ops::linear_bf16(x, m, in_, reinterpret_cast<const uint16_t*>(ref_), out_, b, y);
    } else if (ref_ && ref_dtype_ == DType::F32) {
        ops::linear(x, m, in_, reinterpret_cast<const float*>(ref_), out_, b, y);
    } else if (ref_) {
        reference_rows(x, m, y, [this](int64_t r, float* dst) {
            const size_t row = static_cast<size_t>(r * in_) * dtype_size(ref_dtype_);
            convert_to_f32(ref_dtype_, ref_ + row, static_cast<size_t>(in_), dst);
        });
    } else if (!f32_.empty()) {
        ops::linear(x, m, in_, f32_.data(), out_, b, y);
    } else {
        throw Error("linear: the reference path was not kept for this layer");
    }
}

// y = x · Wᵀ + b through the oracle ops::linear, on blocks of rows converted to fp32 by row(r, dst) (each
// output is the same dot product as over the whole matrix).
void Linear::reference_rows(const float* x, int64_t m, float* y,
                            const std::function<void(int64_t, float*)>& row) const {
    constexpr int64_t kBlock = 64;
    std::vector<float> w(static_cast<size_t>(kBlock * in_)), yb(static_cast<size_t>(m * kBlock));
    for (int64_t r0 = 0; r0 < out_; r0 += kBlock) {
        const int64_t nb = std::min(kBlock, out_ - r0);
        for (int64_t i = 0; i < nb; ++i) row(r0 + i, w.data() + i * in_);
        ops::linear(x, m, in_, w.data(), nb, bias_.empty() ? nullptr : bias_.data() + r0, yb.data());
        for (int64_t t = 0; t < m; ++t)
            std::memcpy(y + t * out_ + r0, yb.data() + t * nb, static_cast<size_t>(nb) * sizeof(float));
    }
}

}  // namespace clef
