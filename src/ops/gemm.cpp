#include "ops/gemm.h"

// gcc 12 reports its own intrinsics (_mm512_undefined_* self-initialisation) as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "ops/cpu.h"
#include "util/error.h"
#include "util/half.h"

namespace clef::ops {

namespace {

constexpr int kNR = 32;  // columns (weight rows) per panel
constexpr int kMR = 6;   // activation rows per micro-kernel call

#define CLEF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

// Branch-free round to nearest even (inputs are finite activations; NaN is kept a NaN by the caller's scalar
// path never being needed here because overflowing activations already mean a broken model).
inline uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

// hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid): every residual is exact in fp32.
void split3(const float* x, int64_t m, int64_t k, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
#pragma omp parallel for schedule(static) if (m * k > (1 << 15))
    for (int64_t i = 0; i < m; ++i) {
        const float* xr = x + i * k;
        uint16_t* h = hi + i * k;
        uint16_t* md = mid + i * k;
        uint16_t* l = lo + i * k;
#pragma omp simd
        for (int64_t t = 0; t < k; ++t) {
            const float v = xr[t];
            const uint16_t a = to_bf16(v);
            const float r1 = v - bf16_to_f32(a);
            const uint16_t b = to_bf16(r1);
            const float r2 = r1 - bf16_to_f32(b);
            h[t] = a;
            md[t] = b;
            l[t] = to_bf16(r2);
        }
    }
}

void round_bf16(const float* x, int64_t count, uint16_t* out) {
#pragma omp parallel for simd schedule(static) if (count > (1 << 15))
    for (int64_t t = 0; t < count; ++t) out[t] = to_bf16(x[t]);
}

// ------------------------------------------------------------------ own kernels on 32-column panels

inline float elem_f32(const float* p, int64_t i) {
    return p[i];
}
inline float elem_f32(const uint16_t* p, int64_t i) {
    return bf16_to_f32(p[i]);
}

// One panel of kNR columns: rows [i0, i0 + rows) of y, columns [j0, j0 + ncols).
template <class W, bool kIsF16>
void scalar_block(const float* x, int64_t k, const W* panel, int rows, int ncols, float* y, int64_t ldy) {
    for (int i = 0; i < rows; ++i) {
        float acc[kNR] = {};
        const float* xr = x + i * k;
        for (int64_t t = 0; t < k; ++t) {
            const float xv = xr[t];
            const W* wp = panel + t * kNR;
            for (int c = 0; c < kNR; ++c) {
                float w;
                if constexpr (kIsF16)
                    w = f16_to_f32(wp[c]);
                else
                    w = elem_f32(wp, c);
                acc[c] += xv * w;
            }
        }
        for (int c = 0; c < ncols; ++c) y[i * ldy + c] = acc[c];
    }
}

template <int MR, int kType>  // kType: 0 = f32, 1 = bf16, 2 = f16
CLEF_AVX512 void avx512_block(const float* x, int64_t k, const void* panel_v, int ncols, float* y,
                              int64_t ldy) {
    __m512 acc0[MR], acc1[MR];
    for (int i = 0; i < MR; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < k; ++t) {
        __m512 w0, w1;
        if constexpr (kType == 0) {
            const float* p = static_cast<const float*>(panel_v) + t * kNR;
            w0 = _mm512_loadu_ps(p);
            w1 = _mm512_loadu_ps(p + 16);
        } else {
            const uint16_t* p = static_cast<const uint16_t*>(panel_v) + t * kNR;
            const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
            const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
            if constexpr (kType == 1) {
                w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(a), 16));
                w1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
            } else {
                w0 = _mm512_cvtph_ps(a);
                w1 = _mm512_cvtph_ps(b);
            }
        }
        for (int i = 0; i < MR; ++i) {
            const __m512 xb = _mm512_set1_ps(x[i * k + t]);
            acc0[i] = _mm512_fmadd_ps(xb, w0, acc0[i]);
            acc1[i] = _mm512_fmadd_ps(xb, w1, acc1[i]);
        }
    }
    if (ncols == kNR) {
        for (int i = 0; i < MR; ++i) {
            _mm512_storeu_ps(y + i * ldy, acc0[i]);
            _mm512_storeu_ps(y + i * ldy + 16, acc1[i]);
        }
    } else {
        const __mmask16 m0 = static_cast<__mmask16>(ncols >= 16 ? 0xffff : (1u << ncols) - 1u);
        const __mmask16 m1 = static_cast<__mmask16>(ncols <= 16 ? 0 : (1u << (ncols - 16)) - 1u);
        for (int i = 0; i < MR; ++i) {
            _mm512_mask_storeu_ps(y + i * ldy, m0, acc0[i]);
            _mm512_mask_storeu_ps(y + i * ldy + 16, m1, acc1[i]);
        }
    }
}

template <int kType>
CLEF_AVX512 void avx512_rows(const float* x, int64_t k, const void* panel, int rows, int ncols, float* y,
                             int64_t ldy) {
    switch (rows) {
        case 6:
            avx512_block<6, kType>(x, k, panel, ncols, y, ldy);
            break;
        case 5:
            avx512_block<5, kType>(x, k, panel, ncols, y, ldy);
            break;
        case 4:
            avx512_block<4, kType>(x, k, panel, ncols, y, ldy);
            break;
        case 3:
            avx512_block<3, kType>(x, k, panel, ncols, y, ldy);
            break;
        case 2:
            avx512_block<2, kType>(x, k, panel, ncols, y, ldy);
            break;
        default:
            avx512_block<1, kType>(x, k, panel, ncols, y, ldy);
            break;
    }
}

// ------------------------------------------------------------------ oneDNN

dnnl::engine& dnnl_engine() {
    static dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dnnl::matmul::primitive_desc make_pd(int64_t m, int64_t k, int64_t n, const dnnl::memory::desc& wdesc) {
    const dnnl::memory::desc a({m, k}, dt::bf16, tag::ab);
    const dnnl::memory::desc c({m, n}, dt::f32, tag::ab);
    // A caller-owned scratchpad per call: concurrent forward() calls from several threads never share one.
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, wdesc, c), attr, dnnl_engine());
}

bool is_bf16_hw_impl(const std::string& impl) {
    return impl.find("amx") != std::string::npos || impl.find("avx512_core_bf16") != std::string::npos;
}

// oneDNN's implementation for a bf16 matmul here ("" when oneDNN fails).
const std::string& dnnl_bf16_impl() {
    static const std::string s = [] {
        try {
            const dnnl::memory::desc w({256, 256}, dt::bf16, tag::any);
            return std::string(make_pd(256, 256, 256, w).impl_info_str());
        } catch (const dnnl::error&) {
            return std::string();
        }
    }();
    return s;
}

// 64-byte aligned storage (whole cache lines for the matrix units' row loads and stores).
template <class T>
struct Aligned64 {
    using value_type = T;
    Aligned64() = default;
    template <class U>
    Aligned64(const Aligned64<U>&) {}
    T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
    void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
    bool operator==(const Aligned64&) const { return true; }
};
template <class T>
using AlignedVec = std::vector<T, Aligned64<T>>;

// Per-thread growable scratch (avoids page-faulting fresh buffers on every call).
template <class T>
T* scratch(AlignedVec<T>& v, size_t count) {
    if (v.size() < count) v.resize(count);
    return v.data();
}

}  // namespace

// ------------------------------------------------------------------ Impl

struct PackedLinear::Impl {
    GemmBackend backend = GemmBackend::Scalar;
    WeightType type = WeightType::BF16;
    // Own kernels: panels [n_panels][k][kNR], element type per `type`.
    std::vector<uint16_t> panels16;
    std::vector<float> panels32;
    // oneDNN: the weight columns (output features) in blocks of at most kDnnlBlockBytes of weights each,
    // every block its own weight memory (row-major rows j0.. of W, read as the [k][width] matrix). oneDNN's
    // AMX matmul re-streams the weights once per row block, and measured here it halves its throughput from
    // 32 MiB (4096x4096) to 96 MiB (Flash's 4096x12288 MLP) matrices; column blocks keep each product's
    // weights at the size it handles best.
    struct ColBlock {
        int64_t j0 = 0, width = 0;
        dnnl::memory::desc wdesc;
        dnnl::memory wmem;
    };
    std::vector<ColBlock> blocks;  // Residency::Streamed: descriptors only (wmem empty)
    AlignedVec<uint16_t> owned;    // Residency::Packed: the weights the blocks point into
    RowProvider stream_rows;       // set when streamed
    std::string impl;
    mutable std::mutex mu;
    struct Prim {
        dnnl::matmul matmul;
        size_t scratch_bytes = 0;
    };
    // By (row count, block width); primitives are created once per distinct pair.
    mutable std::map<std::pair<int64_t, int64_t>, Prim> cache;

    Prim primitive(int64_t rows, int64_t k, const ColBlock& b) const {
        std::lock_guard<std::mutex> lock(mu);
        const std::pair<int64_t, int64_t> key(rows, b.width);
        auto it = cache.find(key);
        if (it != cache.end()) return it->second;
        if (cache.size() >= 64) cache.erase(cache.begin());
        const auto pd = make_pd(rows, k, b.width, b.wdesc);
        Prim prim{dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
        cache.emplace(key, prim);
        return prim;
    }

    // dst[rows][b.width] (dense) = a[rows][k] . W[:, block] (bf16 src, f32 dst), on stream s.
    void run(dnnl::stream& s, const uint16_t* a, int64_t rows, float* dst, int64_t k,
             const ColBlock& b) const {
        thread_local AlignedVec<uint8_t> pad;
        const Prim prim = primitive(rows, k, b);
        if (pad.size() < prim.scratch_bytes) pad.resize(prim.scratch_bytes);
        dnnl::memory am({{rows, k}, dt::bf16, tag::ab}, dnnl_engine(), const_cast<uint16_t*>(a));
        dnnl::memory cm({{rows, b.width}, dt::f32, tag::ab}, dnnl_engine(), dst);
        dnnl::memory sm({{static_cast<int64_t>(prim.scratch_bytes)}, dt::u8, tag::a}, dnnl_engine(),
                        pad.data());
        prim.matmul.execute(
            s,
            {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, b.wmem}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
        s.wait();
    }
};

GemmBackend PackedLinear::auto_backend(WeightType t) {
    // CLEF_GEMM_BACKEND=onednn|avx512|scalar overrides the choice (for measurements), when available.
    if (const char* e = std::getenv("CLEF_GEMM_BACKEND")) {
        const std::string v(e);
        const GemmBackend b = v == "onednn"   ? GemmBackend::OneDnn
                              : v == "avx512" ? GemmBackend::Avx512
                              : v == "scalar" ? GemmBackend::Scalar
                                              : GemmBackend::Auto;
        if (b != GemmBackend::Auto && backend_available(b, t)) return b;
    }
    if (t == WeightType::BF16 && backend_available(GemmBackend::OneDnn, t)) return GemmBackend::OneDnn;
    if (backend_available(GemmBackend::Avx512, t)) return GemmBackend::Avx512;
    return GemmBackend::Scalar;
}

bool PackedLinear::backend_available(GemmBackend b, WeightType t) {
    switch (b) {
        case GemmBackend::Auto:
        case GemmBackend::Scalar:
            return true;
        case GemmBackend::Avx512:
            return cpu_features().has_avx512();
        case GemmBackend::OneDnn:
            return t == WeightType::BF16 && is_bf16_hw_impl(dnnl_bf16_impl());
    }
    return false;
}

PackedLinear::PackedLinear() = default;
PackedLinear::PackedLinear(PackedLinear&&) noexcept = default;
PackedLinear& PackedLinear::operator=(PackedLinear&&) noexcept = default;
PackedLinear::~PackedLinear() = default;

namespace {

void check_shape(int64_t n, int64_t k) {
    if (n <= 0 || k <= 0) throw Error("PackedLinear: weight shape must be positive");
}

GemmBackend resolve(GemmBackend b, WeightType t) {
    if (b == GemmBackend::Auto) return PackedLinear::auto_backend(t);
    if (!PackedLinear::backend_available(b, t))
        throw Error(std::string("PackedLinear: backend not available on this CPU / weight type: ") +
                    (b == GemmBackend::OneDnn ? "onednn" : "avx512"));
    return b;
}

// Packs rows [j0, j0 + nrows) of a row-major [.][k] source (already at row j0) into panel layout.
template <class T>
void to_panel(const T* rows, int nrows, int64_t k, T* panel) {
    for (int64_t t = 0; t < k; ++t) {
        T* dst = panel + t * kNR;
        for (int c = 0; c < kNR; ++c) dst[c] = c < nrows ? rows[c * k + t] : T(0);
    }
}

// Column block width for a [n][k] bf16 weight: at most CLEF_GEMM_BLOCK_MIB (default 32) MiB of weights per
// block, a multiple of 64 columns, blocks of near-equal width.
int64_t dnnl_block_width(int64_t n, int64_t k) {
    static const int64_t budget = [] {
        const char* e = std::getenv("CLEF_GEMM_BLOCK_MIB");
        const long v = e ? std::strtol(e, nullptr, 10) : 0;
        return int64_t(v > 0 ? v : 32) << 20;
    }();
    const int64_t cap = std::max<int64_t>(64, budget / (2 * k) / 64 * 64);
    if (n <= cap) return n;
    const int64_t nblocks = (n + cap - 1) / cap;
    return ((n + nblocks - 1) / nblocks + 63) / 64 * 64;
}

// The column blocks of a [n][k] bf16 weight and their weight descriptors (no weights yet): rows [j0, j0 +
// width) of the row-major weight, read as the [k][width] matrix oneDNN multiplies by.
void plan_dnnl(PackedLinear::Impl& im, int64_t n, int64_t k) {
    const int64_t bw = dnnl_block_width(n, k);
    for (int64_t j0 = 0; j0 < n; j0 += bw) {
        PackedLinear::Impl::ColBlock b;
        b.j0 = j0;
        b.width = std::min(bw, n - j0);
        b.wdesc = dnnl::memory::desc({k, b.width}, dt::bf16, dnnl::memory::dims{1, k});
        if (im.impl.empty()) im.impl = make_pd(512, k, b.width, b.wdesc).impl_info_str();
        im.blocks.push_back(std::move(b));
    }
}

// Points every column block at its rows of w (a row-major [n][k] bf16 weight that outlives the blocks).
void bind_dnnl(PackedLinear::Impl& im, const uint16_t* w, int64_t k) {
    for (auto& b : im.blocks)
        b.wmem = dnnl::memory(b.wdesc, dnnl_engine(), const_cast<uint16_t*>(w + b.j0 * k));
}

}  // namespace

PackedLinear::PackedLinear(WeightRef w, int64_t n, int64_t k, GemmBackend backend, Residency residency)
    : n_(n), k_(k) {
    check_shape(n, k);
    if (!w.data) throw Error("PackedLinear: null weight");
    impl_ = std::make_unique<Impl>();
    Impl& im = *impl_;
    im.type = w.type;
    im.backend = resolve(backend, w.type);
    if (im.backend == GemmBackend::OneDnn) {
        plan_dnnl(im, n, k);
        const uint16_t* src = static_cast<const uint16_t*>(w.data);
        if (residency != Residency::InPlace) {
            im.owned.resize(static_cast<size_t>(n * k));
            std::memcpy(im.owned.data(), src, static_cast<size_t>(n * k) * sizeof(uint16_t));
            src = im.owned.data();
        }
        bind_dnnl(im, src, k);
        return;
    }
    const int64_t np = (n + kNR - 1) / kNR;
    if (w.type == WeightType::F32) {
        im.panels32.resize(static_cast<size_t>(np * k * kNR));
        const float* src = static_cast<const float*>(w.data);
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < np; ++p)
            to_panel(src + p * kNR * k, static_cast<int>(std::min<int64_t>(kNR, n - p * kNR)), k,
                     im.panels32.data() + p * k * kNR);
    } else {
        im.panels16.resize(static_cast<size_t>(np * k * kNR));
        const uint16_t* src = static_cast<const uint16_t*>(w.data);
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < np; ++p)
            to_panel(src + p * kNR * k, static_cast<int>(std::min<int64_t>(kNR, n - p * kNR)), k,
                     im.panels16.data() + p * k * kNR);
    }
}

PackedLinear::PackedLinear(const RowProvider& rows, int64_t n, int64_t k, GemmBackend backend,
                           Residency residency)
    : n_(n), k_(k) {
    check_shape(n, k);
    if (!rows) throw Error("PackedLinear: empty row provider");
    impl_ = std::make_unique<Impl>();
    Impl& im = *impl_;
    im.type = WeightType::BF16;
    im.backend = resolve(backend, WeightType::BF16);
    if (im.backend == GemmBackend::OneDnn && residency == Residency::Streamed) {
        plan_dnnl(im, n, k);
        im.stream_rows = rows;
        return;
    }
    if (im.backend == GemmBackend::OneDnn) {
        plan_dnnl(im, n, k);
        im.owned.resize(static_cast<size_t>(n * k));
        const int64_t block = std::max<int64_t>(1, (int64_t(1) << 22) / k);
        for (int64_t r = 0; r < n; r += block) rows(r, std::min(block, n - r), im.owned.data() + r * k);
        bind_dnnl(im, im.owned.data(), k);
        return;
    }
    const int64_t np = (n + kNR - 1) / kNR;
    im.panels16.resize(static_cast<size_t>(np * k * kNR));
    std::vector<uint16_t> tmp(static_cast<size_t>(kNR * k));
    for (int64_t p = 0; p < np; ++p) {
        const int nr = static_cast<int>(std::min<int64_t>(kNR, n - p * kNR));
        rows(p * kNR, nr, tmp.data());
        to_panel(tmp.data(), nr, k, im.panels16.data() + p * k * kNR);
    }
}

std::string PackedLinear::backend_name() const {
    if (!impl_) return "empty";
    switch (impl_->backend) {
        case GemmBackend::OneDnn:
            return "onednn:" + impl_->impl;
        case GemmBackend::Avx512:
            return "avx512";
        default:
            return "scalar";
    }
}

bool PackedLinear::streamed() const {
    return impl_ && impl_->stream_rows;
}

size_t PackedLinear::packed_bytes() const {
    if (!impl_) return 0;
    if (impl_->backend == GemmBackend::OneDnn) return impl_->owned.size() * sizeof(uint16_t);
    return impl_->panels16.size() * 2 + impl_->panels32.size() * 4;
}

void PackedLinear::forward(const float* x, int64_t m, float* y, Precision p, const float* bias) const {
    if (!impl_) throw Error("PackedLinear: forward on an empty layer");
    if (m < 0) throw Error("PackedLinear: negative row count");
    if (m == 0) return;
    if (!x || !y) throw Error("PackedLinear: null input or output");
    const Impl& im = *impl_;
    const int64_t n = n_, k = k_;
    num_threads();  // applies the global thread setting to this thread

    if (im.backend == GemmBackend::OneDnn) {
        thread_local AlignedVec<uint16_t> abuf;
        thread_local AlignedVec<float> dbuf;
        dnnl::stream s(dnnl_engine());
        // Row blocks of near-equal size (no 1-row tail call); each block size gets one cached primitive.
        auto block_rows = [m](int64_t cap) {
            const int64_t nb = (m + cap - 1) / cap;
            return (m + nb - 1) / nb;
        };
        // BF16: one term (activations rounded once); Exact: the three split terms stacked into 3r rows.
        const int terms = p == Precision::BF16 ? 1 : 3;
        const int64_t mb = block_rows(p == Precision::BF16 ? 1024 : 256);
        // Activations of the r rows from row i0 as the bf16 term(s) oneDNN multiplies.
        auto prepare = [&](int64_t i0, int64_t r, uint16_t* a) {
            if (terms == 1)
                round_bf16(x + i0 * k, r * k, a);
            else
                split3(x + i0 * k, r, k, a, a + r * k, a + 2 * r * k);
        };
        // Rows [i0, i0 + r) times column block b into y (through the per-thread dbuf).
        auto product = [&](const uint16_t* a, int64_t i0, int64_t r, const Impl::ColBlock& b) {
            const int64_t w = b.width;
            float* yb = y + i0 * n;
            if (terms == 1 && im.blocks.size() == 1) {  // straight into y
                im.run(s, a, r, yb, k, b);
                return;
            }
            float* d = scratch(dbuf, static_cast<size_t>(terms * r * w));
            im.run(s, a, terms * r, d, k, b);
            // y[:, block] = hi + (mid + lo) (Exact) or the block's result (BF16).
#pragma omp parallel for schedule(static) if (r * w > (1 << 15))
            for (int64_t i = 0; i < r; ++i) {
                float* yr = yb + i * n + b.j0;
                const float* dh = d + i * w;
                if (terms == 1) {
                    std::memcpy(yr, dh, static_cast<size_t>(w) * sizeof(float));
                    continue;
                }
                const float* dm = dh + r * w;
                const float* dl = dm + r * w;
#pragma omp simd
                for (int64_t t = 0; t < w; ++t) yr[t] = dh[t] + (dm[t] + dl[t]);
            }
        };
        if (!im.stream_rows) {
            for (int64_t i0 = 0; i0 < m; i0 += mb) {
                const int64_t r = std::min(mb, m - i0);
                uint16_t* a = scratch(abuf, static_cast<size_t>(terms * r * k));
                prepare(i0, r, a);
                for (const auto& b : im.blocks) product(a, i0, r, b);
            }
        } else {
            // Streamed weights: each column block is fetched once per group of up to ~2048 rows
            // (the same row blocks as above, so the same primitives and bit-identical results), whose
            // activations are prepared first.
            thread_local AlignedVec<uint16_t> plain;
            const int64_t group = mb * std::max<int64_t>(1, 2048 / mb);
            for (int64_t g0 = 0; g0 < m; g0 += group) {
                const int64_t gm = std::min(group, m - g0);
                uint16_t* a = scratch(abuf, static_cast<size_t>(terms * gm * k));
                for (int64_t i0 = g0; i0 < g0 + gm; i0 += mb)
                    prepare(i0, std::min(mb, m - i0), a + terms * (i0 - g0) * k);
                for (const auto& b : im.blocks) {
                    uint16_t* w = scratch(plain, static_cast<size_t>(b.width * k));
                    im.stream_rows(b.j0, b.width, w);
                    Impl::ColBlock cur = b;
                    cur.wmem = dnnl::memory(b.wdesc, dnnl_engine(), w);
                    for (int64_t i0 = g0; i0 < g0 + gm; i0 += mb)
                        product(a + terms * (i0 - g0) * k, i0, std::min(mb, m - i0), cur);
                }
            }
        }
        if (bias) {
#pragma omp parallel for schedule(static) if (m * n > (1 << 15))
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
        }
        return;
    }

    // Own kernels. BF16 precision: the activations rounded once to bf16 (kept as fp32 values).
    const float* xs = x;
    thread_local AlignedVec<float> xr;
    if (p == Precision::BF16) {
        float* b = scratch(xr, static_cast<size_t>(m * k));
#pragma omp parallel for simd schedule(static) if (m * k > (1 << 15))
        for (int64_t t = 0; t < m * k; ++t) b[t] = bf16_to_f32(to_bf16(x[t]));
        xs = b;
    }
    const int64_t np = (n + kNR - 1) / kNR;
    const int64_t nb = (m + kMR - 1) / kMR;
    const int type = im.type == WeightType::F32 ? 0 : im.type == WeightType::BF16 ? 1 : 2;
    const bool avx = im.backend == GemmBackend::Avx512;
#pragma omp parallel for collapse(2) schedule(static) if (m * n * k > (1 << 16))
    for (int64_t pj = 0; pj < np; ++pj)
        for (int64_t bi = 0; bi < nb; ++bi) {
            const int rows = static_cast<int>(std::min<int64_t>(kMR, m - bi * kMR));
            const int ncols = static_cast<int>(std::min<int64_t>(kNR, n - pj * kNR));
            const float* xb = xs + bi * kMR * k;
            float* yb = y + bi * kMR * n + pj * kNR;
            const size_t off = static_cast<size_t>(pj * k * kNR);
            if (avx) {
                if (type == 0)
                    avx512_rows<0>(xb, k, im.panels32.data() + off, rows, ncols, yb, n);
                else if (type == 1)
                    avx512_rows<1>(xb, k, im.panels16.data() + off, rows, ncols, yb, n);
                else
                    avx512_rows<2>(xb, k, im.panels16.data() + off, rows, ncols, yb, n);
            } else {
                if (type == 0)
                    scalar_block<float, false>(xb, k, im.panels32.data() + off, rows, ncols, yb, n);
                else if (type == 1)
                    scalar_block<uint16_t, false>(xb, k, im.panels16.data() + off, rows, ncols, yb, n);
                else
                    scalar_block<uint16_t, true>(xb, k, im.panels16.data() + off, rows, ncols, yb, n);
            }
            if (bias)
                for (int i = 0; i < rows; ++i)
                    for (int c = 0; c < ncols; ++c) yb[i * n + c] += bias[pj * kNR + c];
        }
}

// ------------------------------------------------------------------ small_gemm_acc

namespace {

void small_gemm_generic(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                        const float* b, int64_t ldb, float* c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) {
        float* ci = c + i * ldc;
        for (int64_t t = 0; t < k; ++t) {
            const float av = alpha * a[i * lda + t];
            const float* bt = b + t * ldb;
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) ci[j] += av * bt[j];
        }
    }
}

// Rows [i, i + MR), columns [j, j + 16 * NC) with the last vector masked by `last`.
template <int MR, int NC>
CLEF_AVX512 void small_block_512(int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                                 int64_t ldb, float* c, int64_t ldc, __mmask16 last) {
    __m512 acc[MR][NC];
    for (int r = 0; r < MR; ++r)
        for (int q = 0; q < NC; ++q)
            acc[r][q] = _mm512_maskz_loadu_ps(q == NC - 1 ? last : __mmask16(0xffff), c + r * ldc + 16 * q);
    for (int64_t t = 0; t < k; ++t) {
        __m512 bv[NC];
        for (int q = 0; q < NC; ++q)
            bv[q] = _mm512_maskz_loadu_ps(q == NC - 1 ? last : __mmask16(0xffff), b + t * ldb + 16 * q);
        for (int r = 0; r < MR; ++r) {
            const __m512 av = _mm512_set1_ps(alpha * a[r * lda + t]);
            for (int q = 0; q < NC; ++q) acc[r][q] = _mm512_fmadd_ps(av, bv[q], acc[r][q]);
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int q = 0; q < NC; ++q)
            _mm512_mask_storeu_ps(c + r * ldc + 16 * q, q == NC - 1 ? last : __mmask16(0xffff), acc[r][q]);
}

template <int MR>
CLEF_AVX512 void small_rows_512(int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                const float* b, int64_t ldb, float* c, int64_t ldc) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) small_block_512<MR, 4>(k, alpha, a, lda, b + j, ldb, c + j, ldc, 0xffff);
    while (j < n) {
        const int64_t rem = n - j;
        const int nv = static_cast<int>(std::min<int64_t>(4, (rem + 15) / 16));
        const int tail = static_cast<int>(rem - 16 * (nv - 1));
        const __mmask16 last = static_cast<__mmask16>(tail >= 16 ? 0xffff : (1u << tail) - 1u);
        switch (nv) {
            case 4:
                small_block_512<MR, 4>(k, alpha, a, lda, b + j, ldb, c + j, ldc, last);
                break;
            case 3:
                small_block_512<MR, 3>(k, alpha, a, lda, b + j, ldb, c + j, ldc, last);
                break;
            case 2:
                small_block_512<MR, 2>(k, alpha, a, lda, b + j, ldb, c + j, ldc, last);
                break;
            default:
                small_block_512<MR, 1>(k, alpha, a, lda, b + j, ldb, c + j, ldc, last);
                break;
        }
        j += 16 * nv;
    }
}

CLEF_AVX512 void small_gemm_512(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                const float* b, int64_t ldb, float* c, int64_t ldc) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) small_rows_512<4>(n, k, alpha, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
    for (; i < m; ++i) small_rows_512<1>(n, k, alpha, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
}

}  // namespace

void small_gemm_acc(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    static const bool avx = cpu_features().has_avx512();
    if (avx)
        small_gemm_512(m, n, k, alpha, a, lda, b, ldb, c, ldc);
    else
        small_gemm_generic(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

}  // namespace clef::ops
