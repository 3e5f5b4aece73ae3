#include "ops/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <new>
#include <tuple>
#include <vector>

#include "ops/cpu.h"
#include "ops/simd.h"
#include "ops/simd_kernels.h"
#include "util/error.h"
#include "util/half.h"

namespace clef::ops {

namespace {

constexpr int kNR = simd::kPanelCols;  // columns (weight rows) per panel
constexpr int kMR = simd::kPanelRows;  // activation rows per micro-kernel call

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

// ------------------------------------------------------------------ the scalar reference panel kernel

inline float elem_f32(const float* p, int64_t i) {
    return p[i];
}
inline float elem_f32(const uint16_t* p, int64_t i) {
    return bf16_to_f32(p[i]);
}

// What simd::panel_block computes, in plain loops (GemmBackend::Scalar, and the oracle of its tests).
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

void scalar_panel_block(const float* x, int64_t k, const void* panel, WeightType type, int rows, int ncols,
                        float* y, int64_t ldy) {
    if (type == WeightType::F32)
        scalar_block<float, false>(x, k, static_cast<const float*>(panel), rows, ncols, y, ldy);
    else if (type == WeightType::BF16)
        scalar_block<uint16_t, false>(x, k, static_cast<const uint16_t*>(panel), rows, ncols, y, ldy);
    else
        scalar_block<uint16_t, true>(x, k, static_cast<const uint16_t*>(panel), rows, ncols, y, ldy);
}

simd::PanelType panel_type(WeightType t) {
    return t == WeightType::F32    ? simd::PanelType::F32
           : t == WeightType::BF16 ? simd::PanelType::BF16
                                   : simd::PanelType::F16;
}

// ------------------------------------------------------------------ oneDNN

dnnl::engine& dnnl_engine() {
    static dnnl::engine e = [] {
        (void)cpu_features();  // applies CLEF_MAX_ISA before oneDNN picks its ISA
        return dnnl::engine(dnnl::engine::kind::cpu, 0);
    }();
    return e;
}

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// A matmul src[m][k] . W -> dst[m][n] (fp32 dst with row stride ldc), src in `src_type`; the weight
// descriptor is the caller's. A caller-owned scratchpad per call: concurrent forward() calls never share one.
dnnl::matmul::primitive_desc make_pd(int64_t m, int64_t k, int64_t n, const dnnl::memory::desc& wdesc,
                                     dt src_type, int64_t ldc) {
    const dnnl::memory::desc a({m, k}, src_type, tag::ab);
    const dnnl::memory::desc c({m, n}, dt::f32, dnnl::memory::dims{ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, wdesc, c), attr, dnnl_engine());
}

bool is_bf16_hw_impl(const std::string& impl) {
    return impl.find("amx") != std::string::npos || impl.find("avx512_core_bf16") != std::string::npos;
}

// oneDNN's implementation of a matmul with `type` inputs here ("" when it has none).
std::string dnnl_impl(dt type) {
    try {
        const dnnl::memory::desc w({256, 256}, type, tag::any);
        return make_pd(256, 256, 256, w, type, 256).impl_info_str();
    } catch (const dnnl::error&) {
        return std::string();
    }
}
const std::string& dnnl_bf16_impl() {
    static const std::string s = dnnl_impl(dt::bf16);
    return s;
}
const std::string& dnnl_f32_impl() {
    static const std::string s = dnnl_impl(dt::f32);
    return s;
}
bool dnnl_bf16_hw() {
    return is_bf16_hw_impl(dnnl_bf16_impl());
}
bool dnnl_f32_jit() {  // a JIT kernel, not oneDNN's reference loops
    const std::string& s = dnnl_f32_impl();
    return !s.empty() && s.rfind("ref", 0) != 0;
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

int64_t env_mib(const char* name, int64_t fallback) {
    const char* e = std::getenv(name);
    const long v = e ? std::strtol(e, nullptr, 10) : 0;
    return int64_t(v > 0 ? v : fallback) << 20;
}

const char* kernel_name(GemmKernel k) {
    return k == GemmKernel::F32 ? "f32" : k == GemmKernel::BF16x3 ? "bf16x3" : "bf16";
}

GemmPlan& plan_storage() {
    static GemmPlan p = default_gemm_plan(Precision::Exact);
    return p;
}

const char* backend_label(GemmBackend b) {
    return b == GemmBackend::OneDnn ? "onednn" : b == GemmBackend::Simd ? "simd" : "scalar";
}

}  // namespace

GemmPlan default_gemm_plan(Precision main) {
    GemmPlan p;
    const bool bf16 = dnnl_bf16_hw();
    const bool amx = bf16 && cpu_features().amx_bf16;
    // Three bf16 products beat one fp32 product only where the bf16 units are matrix units (AMX); AVX512_BF16
    // dot products run at ~2x fp32 FMA, so a third of them is slower than fp32.
    p.exact = amx ? GemmKernel::BF16x3 : GemmKernel::F32;
    p.bf16 = bf16 ? GemmKernel::BF16 : GemmKernel::F32;
    if (const char* e = std::getenv("CLEF_GEMM_EXACT")) {
        const std::string v(e);
        if (v == "f32") p.exact = GemmKernel::F32;
        if (v == "bf16x3" && bf16) p.exact = GemmKernel::BF16x3;
    }
    // Int8 models multiply their backbone in int8; the rest (the head, the vision tower) runs Exact.
    const bool dnnl_wins = main == Precision::BF16 ? bf16 : p.exact == GemmKernel::BF16x3;
    p.bf16_weights = dnnl_wins && dnnl_f32_jit() ? GemmBackend::OneDnn : GemmBackend::Simd;
    return p;
}

void set_gemm_plan(const GemmPlan& p) {
    plan_storage() = p;
}

const GemmPlan& gemm_plan() {
    return plan_storage();
}

bool gemm_kernel_available(GemmKernel k) {
    return k == GemmKernel::F32 ? dnnl_f32_jit() : dnnl_bf16_hw();
}

ScopedGemmPlan::ScopedGemmPlan(GemmPlan p) : saved_(plan_storage()) {
    if (!gemm_kernel_available(p.exact) || !gemm_kernel_available(p.bf16))
        throw Error("ScopedGemmPlan: a kernel of the plan is not available on this CPU");
    plan_storage() = p;
}

ScopedGemmPlan::~ScopedGemmPlan() {
    plan_storage() = saved_;
}

std::string gemm_plan_string() {
    // Appended piece by piece (gcc 12 reports chained std::string + as -Wrestrict, a known false positive).
    const GemmPlan& p = gemm_plan();
    const GemmBackend b = PackedLinear::auto_backend(WeightType::BF16);
    std::string s = backend_label(b);
    if (b == GemmBackend::Simd) s.append("(").append(simd_target()).append(")");
    if (b != GemmBackend::OneDnn) return s;
    for (const auto& [name, k] : {std::pair{" exact=", p.exact}, std::pair{" bf16=", p.bf16}})
        s.append(name)
            .append(kernel_name(k))
            .append(":")
            .append(k == GemmKernel::F32 ? dnnl_f32_impl() : dnnl_bf16_impl());
    return s;
}

double dnnl_matmul_gflops(bool bf16, int64_t m, int64_t k, int64_t n, int iters) {
    if (bf16 ? !dnnl_bf16_hw() : !dnnl_f32_jit()) return 0;
    using namespace dnnl;
    const dt type = bf16 ? dt::bf16 : dt::f32;
    const size_t esz = bf16 ? 2 : 4;
    engine& eng = dnnl_engine();
    stream s(eng);
    const memory::desc a_md({m, k}, type, tag::ab), b_any({k, n}, type, tag::any);
    const memory::desc c_md({m, n}, dt::f32, tag::ab);
    const matmul::primitive_desc pd(matmul::desc(a_md, b_any, c_md), eng);
    memory a(a_md, eng), b(pd.weights_desc(), eng), c(c_md, eng);
    // Small values of either type (0x3c00.. as bf16 is ~0.0078.., as the high half of an fp32 the same).
    auto fill = [esz](memory& mem, size_t count) {
        auto* p = static_cast<uint16_t*>(mem.get_data_handle());
        for (size_t i = 0; i < count * esz / 2; ++i)
            p[i] =
                (esz == 4 && i % 2 == 0) ? 0 : static_cast<uint16_t>(0x3c00 + (i * 2654435761u >> 20) % 256);
    };
    fill(a, static_cast<size_t>(m * k));
    fill(b, pd.weights_desc().get_size() / esz);
    matmul mm(pd);
    double best = 1e30;
    for (int i = 0; i < iters + 1; ++i) {
        const double t0 = omp_get_wtime();
        mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
        s.wait();
        if (i > 0) best = std::min(best, omp_get_wtime() - t0);  // the first run creates the kernels
    }
    return 2.0 * static_cast<double>(m) * k * n / best / 1e9;
}

// ------------------------------------------------------------------ Impl

struct PackedLinear::Impl {
    GemmBackend backend = GemmBackend::Scalar;
    WeightType type = WeightType::BF16;
    // Own kernels: panels [n_panels][k][kNR], element type per `type`.
    std::vector<uint16_t> panels16;
    std::vector<float> panels32;
    // oneDNN: the weight columns (output features) in blocks of at most 32 MiB of bf16 weights each, every
    // block its own weight memory (row-major rows j0.. of W, read as the [k][width] matrix). oneDNN's AMX
    // matmul re-streams the weights once per row block, and measured here it halves its throughput from
    // 32 MiB (4096x4096) to 96 MiB (Flash's 4096x12288 MLP) matrices; column blocks keep each product's
    // weights at the size it handles best.
    struct ColBlock {
        int64_t j0 = 0, width = 0;
        dnnl::memory::desc wdesc;
        dnnl::memory wmem;
        const uint16_t* w = nullptr;  // the block's bf16 rows (null when streamed)
    };
    std::vector<ColBlock> blocks;  // Residency::Streamed: descriptors only (wmem empty)
    AlignedVec<uint16_t> owned;    // Residency::Packed: the weights the blocks point into
    RowProvider stream_rows;       // set when streamed
    mutable std::mutex mu;
    struct Prim {
        dnnl::matmul matmul;
        size_t scratch_bytes = 0;
    };
    // By (kernel, row count, block width, dst row stride); each distinct key is created once.
    using Key = std::tuple<int, int64_t, int64_t, int64_t>;
    mutable std::map<Key, Prim> cache;

    Prim primitive(GemmKernel kind, int64_t rows, int64_t k, int64_t width, int64_t ldc,
                   const dnnl::memory::desc& wdesc) const {
        std::lock_guard<std::mutex> lock(mu);
        const Key key(static_cast<int>(kind), rows, width, ldc);
        auto it = cache.find(key);
        if (it != cache.end()) return it->second;
        if (cache.size() >= 64) cache.erase(cache.begin());
        const auto pd = make_pd(rows, k, width, wdesc, kind == GemmKernel::F32 ? dt::f32 : dt::bf16, ldc);
        Prim prim{dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
        cache.emplace(key, prim);
        return prim;
    }

    // dst[rows][width] (row stride ldc) = a[rows][k] . wmem (a's type per kind, f32 dst), on stream s.
    void run(dnnl::stream& s, GemmKernel kind, const void* a, int64_t rows, float* dst, int64_t ldc,
             int64_t k, int64_t width, const dnnl::memory::desc& wdesc, const dnnl::memory& wmem) const {
        thread_local AlignedVec<uint8_t> pad;
        const Prim prim = primitive(kind, rows, k, width, ldc, wdesc);
        if (pad.size() < prim.scratch_bytes) pad.resize(prim.scratch_bytes);
        const dt at = kind == GemmKernel::F32 ? dt::f32 : dt::bf16;
        dnnl::memory am({{rows, k}, at, tag::ab}, dnnl_engine(), const_cast<void*>(a));
        dnnl::memory cm({{rows, width}, dt::f32, dnnl::memory::dims{ldc, 1}}, dnnl_engine(), dst);
        dnnl::memory sm({{static_cast<int64_t>(prim.scratch_bytes)}, dt::u8, tag::a}, dnnl_engine(),
                        pad.data());
        prim.matmul.execute(
            s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}});
        s.wait();
    }

    void forward_bf16(const float* x, int64_t m, float* y, int64_t n, int64_t k, GemmKernel kind) const;
    void forward_f32(const float* x, int64_t m, float* y, int64_t n, int64_t k) const;
    void forward_own(const float* x, int64_t m, float* y, int64_t n, int64_t k, Precision p) const;
    void own_panels(const float* xs, int64_t m, float* y, int64_t n, int64_t k, const void* panels,
                    int64_t p_begin, int64_t p_end) const;
};

GemmBackend PackedLinear::auto_backend(WeightType t) {
    // CLEF_GEMM_BACKEND=onednn|simd|scalar overrides the choice (for measurements), when available.
    if (const char* e = std::getenv("CLEF_GEMM_BACKEND")) {
        const std::string v(e);
        const GemmBackend b = v == "onednn"   ? GemmBackend::OneDnn
                              : v == "simd"   ? GemmBackend::Simd
                              : v == "scalar" ? GemmBackend::Scalar
                                              : GemmBackend::Auto;
        if (b != GemmBackend::Auto && backend_available(b, t)) return b;
    }
    if (t == WeightType::BF16 && gemm_plan().bf16_weights == GemmBackend::OneDnn &&
        backend_available(GemmBackend::OneDnn, t))
        return GemmBackend::OneDnn;
    return GemmBackend::Simd;
}

bool PackedLinear::backend_available(GemmBackend b, WeightType t) {
    switch (b) {
        case GemmBackend::Auto:
        case GemmBackend::Scalar:
        case GemmBackend::Simd:
            return true;
        case GemmBackend::OneDnn:
            return t == WeightType::BF16 && dnnl_f32_jit();
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
        throw Error("PackedLinear: backend not available on this CPU / weight type: onednn");
    return b;
}

// Packs rows [j0, j0 + nrows) of a row-major [.][k] source (already at row j0) into panel layout.
// In tiles of 64 values of t, so that the tile being written (4-8 KiB) stays in L1 while each of the 32 rows
// is read sequentially (streamed layers pack on every forward).
template <class T>
void to_panel(const T* rows, int nrows, int64_t k, T* panel) {
    constexpr int64_t kTile = 64;
    for (int64_t t0 = 0; t0 < k; t0 += kTile) {
        const int64_t t1 = std::min(k, t0 + kTile);
        for (int c = 0; c < kNR; ++c) {
            if (c >= nrows) {
                for (int64_t t = t0; t < t1; ++t) panel[t * kNR + c] = T(0);
                continue;
            }
            const T* src = rows + c * k;
            for (int64_t t = t0; t < t1; ++t) panel[t * kNR + c] = src[t];
        }
    }
}

// Packs the n rows of a row-major [n][k] source into its (n + kNR - 1) / kNR panels at `out`
// ([panel][k][kNR], the last one zero-padded), the panels in parallel.
template <class T>
void to_panels(const T* rows, int64_t n, int64_t k, T* out) {
    const int64_t np = (n + kNR - 1) / kNR;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < np; ++p)
        to_panel(rows + p * kNR * k, static_cast<int>(std::min<int64_t>(kNR, n - p * kNR)), k,
                 out + p * k * kNR);
}

// An [n][k] weight of element type T in panel layout, in memory of its own.
template <class T>
std::vector<T> packed_panels(const void* weight, int64_t n, int64_t k) {
    std::vector<T> panels(static_cast<size_t>((n + kNR - 1) / kNR * k * kNR));
    to_panels(static_cast<const T*>(weight), n, k, panels.data());
    return panels;
}

// The own kernels fetch a provider's rows in groups of panels of at most 8 MiB of bf16
// (CLEF_GEMM_STREAM_MIB): small enough that the fetched rows and their panels stay in the last-level cache
// while they are used.
int64_t panels_per_group(int64_t k) {
    static const int64_t budget = env_mib("CLEF_GEMM_STREAM_MIB", 8);
    return std::max<int64_t>(1, budget / (2 * kNR * k));
}

// Fetches the rows of panels [p0, p0 + g) of an [n][k] weight from `rows` into `buf` and packs them into
// `out` ([g][k][kNR], zero-padded).
void fetch_panels(const RowProvider& rows, int64_t n, int64_t k, int64_t p0, int64_t g, uint16_t* buf,
                  uint16_t* out) {
    const int64_t r0 = p0 * kNR, nr = std::min(g * kNR, n - r0);
    rows(r0, nr, buf);
    to_panels(buf, nr, k, out);
}

// Column block width for a [n][k] weight of `elem` bytes per value: at most `budget` bytes per block, a
// multiple of 64 columns, blocks of near-equal width.
int64_t block_width(int64_t n, int64_t k, int64_t elem, int64_t budget) {
    const int64_t cap = std::max<int64_t>(64, budget / (elem * k) / 64 * 64);
    if (n <= cap) return n;
    const int64_t nblocks = (n + cap - 1) / cap;
    return ((n + nblocks - 1) / nblocks + 63) / 64 * 64;
}

// The bf16 column blocks of a [n][k] weight (CLEF_GEMM_BLOCK_MIB, default 32 MiB each) and their weight
// descriptors (no weights yet): rows [j0, j0 + width) of the row-major weight, read as the [k][width] matrix
// oneDNN multiplies by.
void plan_dnnl(PackedLinear::Impl& im, int64_t n, int64_t k) {
    static const int64_t budget = env_mib("CLEF_GEMM_BLOCK_MIB", 32);
    const int64_t bw = block_width(n, k, 2, budget);
    for (int64_t j0 = 0; j0 < n; j0 += bw) {
        PackedLinear::Impl::ColBlock b;
        b.j0 = j0;
        b.width = std::min(bw, n - j0);
        b.wdesc = dnnl::memory::desc({k, b.width}, dt::bf16, dnnl::memory::dims{1, k});
        im.blocks.push_back(std::move(b));
    }
}

// Points every column block at its rows of w (a row-major [n][k] bf16 weight that outlives the blocks).
void bind_dnnl(PackedLinear::Impl& im, const uint16_t* w, int64_t k) {
    for (auto& b : im.blocks) {
        b.w = w + b.j0 * k;
        b.wmem = dnnl::memory(b.wdesc, dnnl_engine(), const_cast<uint16_t*>(b.w));
    }
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
    if (w.type == WeightType::F32)
        im.panels32 = packed_panels<float>(w.data, n, k);
    else
        im.panels16 = packed_panels<uint16_t>(w.data, n, k);
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
    if (residency == Residency::Streamed) {  // own kernels: panels packed per forward from the provider
        im.stream_rows = rows;
        return;
    }
    const int64_t np = (n + kNR - 1) / kNR, group = panels_per_group(k);
    im.panels16.resize(static_cast<size_t>(np * k * kNR));
    std::vector<uint16_t> buf(static_cast<size_t>(std::min(group * kNR, n) * k));
    for (int64_t p0 = 0; p0 < np; p0 += group)
        fetch_panels(rows, n, k, p0, std::min(group, np - p0), buf.data(), im.panels16.data() + p0 * k * kNR);
}

std::string PackedLinear::backend_name() const {
    if (!impl_) return "empty";
    switch (impl_->backend) {
        case GemmBackend::OneDnn:
            return std::string("onednn(").append(gemm_plan_string()).append(")");
        case GemmBackend::Simd:
            return std::string("simd(").append(simd_target()).append(")");
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

// bf16 activations (BF16: rounded once; BF16x3: the three split terms stacked into 3r rows) times the bf16
// weights, in row blocks of near-equal size (each size gets one cached primitive).
void PackedLinear::Impl::forward_bf16(const float* x, int64_t m, float* y, int64_t n, int64_t k,
                                      GemmKernel kind) const {
    thread_local AlignedVec<uint16_t> abuf;
    thread_local AlignedVec<float> dbuf;
    dnnl::stream s(dnnl_engine());
    auto block_rows = [m](int64_t cap) {
        const int64_t nb = (m + cap - 1) / cap;
        return (m + nb - 1) / nb;
    };
    const int terms = kind == GemmKernel::BF16 ? 1 : 3;
    const int64_t mb = block_rows(terms == 1 ? 1024 : 256);
    // Activations of the r rows from row i0 as the bf16 term(s) oneDNN multiplies.
    auto prepare = [&](int64_t i0, int64_t r, uint16_t* a) {
        if (terms == 1)
            round_bf16(x + i0 * k, r * k, a);
        else
            split3(x + i0 * k, r, k, a, a + r * k, a + 2 * r * k);
    };
    // Rows [i0, i0 + r) times column block b into y (through the per-thread dbuf for three terms).
    auto product = [&](const uint16_t* a, int64_t i0, int64_t r, const ColBlock& b) {
        const int64_t w = b.width;
        float* yb = y + i0 * n + b.j0;
        if (terms == 1) {  // straight into y
            run(s, kind, a, r, yb, n, k, w, b.wdesc, b.wmem);
            return;
        }
        float* d = scratch(dbuf, static_cast<size_t>(terms * r * w));
        run(s, kind, a, terms * r, d, w, k, w, b.wdesc, b.wmem);
        // y[:, block] = hi + (mid + lo).
#pragma omp parallel for schedule(static) if (r * w > (1 << 15))
        for (int64_t i = 0; i < r; ++i) {
            float* yr = yb + i * n;
            const float* dh = d + i * w;
            const float* dm = dh + r * w;
            const float* dl = dm + r * w;
#pragma omp simd
            for (int64_t t = 0; t < w; ++t) yr[t] = dh[t] + (dm[t] + dl[t]);
        }
    };
    if (!stream_rows) {
        for (int64_t i0 = 0; i0 < m; i0 += mb) {
            const int64_t r = std::min(mb, m - i0);
            uint16_t* a = scratch(abuf, static_cast<size_t>(terms * r * k));
            prepare(i0, r, a);
            for (const auto& b : blocks) product(a, i0, r, b);
        }
        return;
    }
    // Streamed weights: each column block is fetched once per group of up to ~2048 rows (the same row blocks
    // as above, so the same primitives and bit-identical results), whose activations are prepared first.
    thread_local AlignedVec<uint16_t> plain;
    const int64_t group = mb * std::max<int64_t>(1, 2048 / mb);
    for (int64_t g0 = 0; g0 < m; g0 += group) {
        const int64_t gm = std::min(group, m - g0);
        uint16_t* a = scratch(abuf, static_cast<size_t>(terms * gm * k));
        for (int64_t i0 = g0; i0 < g0 + gm; i0 += mb)
            prepare(i0, std::min(mb, m - i0), a + terms * (i0 - g0) * k);
        for (const auto& b : blocks) {
            uint16_t* w = scratch(plain, static_cast<size_t>(b.width * k));
            stream_rows(b.j0, b.width, w);
            ColBlock cur = b;
            cur.wmem = dnnl::memory(b.wdesc, dnnl_engine(), w);
            for (int64_t i0 = g0; i0 < g0 + gm; i0 += mb)
                product(a + terms * (i0 - g0) * k, i0, std::min(mb, m - i0), cur);
        }
    }
}

// fp32 activations times fp32 weights (exact by construction): every column block's bf16 rows are widened to
// fp32 in sub-blocks of at most CLEF_GEMM_F32_BLOCK_MIB (default 4) MiB, a per-thread buffer that stays in
// the cache while oneDNN's fp32 matmul multiplies all m rows by it. No fp32 copy of the whole weight exists.
void PackedLinear::Impl::forward_f32(const float* x, int64_t m, float* y, int64_t n, int64_t k) const {
    static const int64_t budget = env_mib("CLEF_GEMM_F32_BLOCK_MIB", 4);
    thread_local AlignedVec<float> wf;
    thread_local AlignedVec<uint16_t> plain;
    dnnl::stream s(dnnl_engine());
    for (const auto& b : blocks) {
        const uint16_t* w = b.w;
        if (!w) {  // streamed
            uint16_t* fetched = scratch(plain, static_cast<size_t>(b.width * k));
            stream_rows(b.j0, b.width, fetched);
            w = fetched;
        }
        const int64_t sw = block_width(b.width, k, 4, budget);
        for (int64_t j = 0; j < b.width; j += sw) {
            const int64_t width = std::min(sw, b.width - j);
            float* f = scratch(wf, static_cast<size_t>(width * k));
            const uint16_t* src = w + j * k;
#pragma omp parallel for schedule(static) if (width * k > (1 << 16))
            for (int64_t r = 0; r < width; ++r) simd::bf16_to_f32(src + r * k, f + r * k, k);
            const dnnl::memory::desc wdesc({k, width}, dt::f32, dnnl::memory::dims{1, k});
            const dnnl::memory wmem(wdesc, dnnl_engine(), f);
            run(s, GemmKernel::F32, x, m, y + b.j0 + j, n, k, width, wdesc, wmem);
        }
    }
}

// The own panel kernels (Highway-dispatched, or the scalar reference). BF16 precision: the activations
// rounded once to bf16 (kept as fp32 values). Streamed weights are packed into panels per forward, a group of
// panels (<= 8 MiB of bf16) at a time, and multiplied by all m rows before the next group is fetched.
void PackedLinear::Impl::forward_own(const float* x, int64_t m, float* y, int64_t n, int64_t k,
                                     Precision p) const {
    const float* xs = x;
    thread_local AlignedVec<float> xr;
    if (p == Precision::BF16) {
        float* b = scratch(xr, static_cast<size_t>(m * k));
#pragma omp parallel for simd schedule(static) if (m * k > (1 << 15))
        for (int64_t t = 0; t < m * k; ++t) b[t] = bf16_to_f32(to_bf16(x[t]));
        xs = b;
    }
    const int64_t np = (n + kNR - 1) / kNR;
    if (!stream_rows) {
        const void* panels =
            type == WeightType::F32 ? static_cast<const void*>(panels32.data()) : panels16.data();
        own_panels(xs, m, y, n, k, panels, 0, np);
        return;
    }
    const int64_t group = panels_per_group(k);
    thread_local AlignedVec<uint16_t> plain, packed;
    for (int64_t p0 = 0; p0 < np; p0 += group) {
        const int64_t g = std::min(group, np - p0);
        uint16_t* pan = scratch(packed, static_cast<size_t>(g * kNR * k));
        fetch_panels(stream_rows, n, k, p0, g, scratch(plain, static_cast<size_t>(g * kNR * k)), pan);
        own_panels(xs, m, y, n, k, pan, p0, p0 + g);
    }
}

// Panels [p_begin, p_end) (panel p at panels + (p - p_begin) * k * kNR elements) times all m rows, into their
// columns of y.
void PackedLinear::Impl::own_panels(const float* xs, int64_t m, float* y, int64_t n, int64_t k,
                                    const void* panels, int64_t p_begin, int64_t p_end) const {
    const int64_t nb = (m + kMR - 1) / kMR;
    const bool own_simd = backend == GemmBackend::Simd;
    const size_t esz = type == WeightType::F32 ? 4 : 2;
#pragma omp parallel for collapse(2) schedule(static) if (m * n * k > (1 << 16))
    for (int64_t pj = p_begin; pj < p_end; ++pj)
        for (int64_t bi = 0; bi < nb; ++bi) {
            const int rows = static_cast<int>(std::min<int64_t>(kMR, m - bi * kMR));
            const int ncols = static_cast<int>(std::min<int64_t>(kNR, n - pj * kNR));
            const float* xb = xs + bi * kMR * k;
            float* yb = y + bi * kMR * n + pj * kNR;
            const void* panel =
                static_cast<const char*>(panels) + static_cast<size_t>((pj - p_begin) * k * kNR) * esz;
            if (own_simd)
                simd::panel_block(xb, k, panel, panel_type(type), rows, ncols, yb, n);
            else
                scalar_panel_block(xb, k, panel, type, rows, ncols, yb, n);
        }
}

void PackedLinear::forward(const float* x, int64_t m, float* y, Precision p, const float* bias) const {
    if (!impl_) throw Error("PackedLinear: forward on an empty layer");
    if (m < 0) throw Error("PackedLinear: negative row count");
    if (m == 0) return;
    if (!x || !y) throw Error("PackedLinear: null input or output");
    const Impl& im = *impl_;
    const int64_t n = n_, k = k_;
    num_threads();  // applies the global thread setting to this thread
    if (im.backend != GemmBackend::OneDnn) {
        im.forward_own(x, m, y, n, k, p);
    } else {
        const GemmKernel kind = p == Precision::BF16 ? gemm_plan().bf16 : gemm_plan().exact;
        if (kind == GemmKernel::F32)
            im.forward_f32(x, m, y, n, k);
        else
            im.forward_bf16(x, m, y, n, k, kind);
    }
    if (bias) {
#pragma omp parallel for schedule(static) if (m * n > (1 << 15))
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
    }
}

// ------------------------------------------------------------------ small_gemm_acc

void small_gemm_acc(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    simd::small_gemm_acc(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

}  // namespace clef::ops
