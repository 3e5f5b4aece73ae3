#include "ops/int8_gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "ops/cpu.h"
#include "ops/int8_kernels.h"
#include "ops/simd.h"
#include "util/error.h"

namespace clef::ops {

using i8::kI8Bias;
using i8::kI8Block;
using i8::kI8Cols;
using i8::kI8PanelBlockBytes;
using i8::kI8Rows;
using i8::kI8TileCols;
using i8::panel_block_bytes;

namespace {

// Output columns per task at most (one claim of the shared counter; a streamed task decodes them kMinCols at
// a time). Tasks narrow to kMinCols as the columns run out, so that no thread waits long for the last
// (docs/PERFORMANCE.md, int8 in situ).
constexpr int64_t kColBlock = 16 * kI8Cols;
constexpr int64_t kMinCols = 4 * kI8Cols;
// Blocks of k per kernel call at most: a tile's weights over them come from the L2 cache while every row of
// the activations passes, so they take at most half of it (1 MiB: 455 signed blocks, whole k for Clef-Flash's
// projections; y is then written once); 64 where the L2 is not reported.
int64_t max_slice_blocks(int64_t block_bytes) {
    const int64_t l2 = cpu_features().l2_bytes;
    const int64_t tile_block = kI8TileCols / kI8Cols * block_bytes;  // a tile's bytes per block
    return l2 > 0 ? std::clamp<int64_t>(l2 / 2 / tile_block, 16, 1024) : 64;
}
// The yardstick's shape (int8_kernel_gops): 64 rows against 4 panels over 16 blocks, every operand in the L1
// cache.
constexpr int64_t kYardRows = 64, kYardCols = 4 * kI8Cols, kYardBlocks = 16;

using QuantizeFn = void (*)(const float*, int64_t, int8_t*, float*);
using QuantizeActsFn = void (*)(const float*, int64_t, unsigned char*, bool);

// Scatters one weight row (column c of its panel) into the panel layout of a kind (bits, ops/int8_kernels.h):
// block b's level bytes lv (kI8Block of them, or kI8Block / 2 of nibble pairs: level_row_bytes; each byte xor
// 0x80 for signed panels: w + kI8Bias for int8 levels w) four at a time, 64 bytes apart, then one fp32 per
// array in f (f[a][b]) after the levels, kI8Cols floats apart.
void scatter_row(const void* lv, int bits, std::initializer_list<const float*> f, int64_t nb, int64_t c,
                 unsigned char* panel) {
    const auto* l = static_cast<const unsigned char*>(lv);
    const uint32_t flip = bits == 0 ? 0x80808080u : 0u;
    const int64_t block_bytes = panel_block_bytes(bits), row_bytes = level_row_bytes(bits, kI8Block);
    for (int64_t b = 0; b < nb; ++b) {
        unsigned char* pb = panel + b * block_bytes;
        for (int64_t st = 0; st < row_bytes / 4; ++st) {
            uint32_t four;
            std::memcpy(&four, l + b * row_bytes + st * 4, 4);
            four ^= flip;
            std::memcpy(pb + st * kI8Cols * 4 + c * 4, &four, 4);
        }
        int64_t at = i8::panel_level_bytes(bits);
        for (const float* a : f) {
            std::memcpy(pb + at + c * 4, a + b, 4);
            at += kI8Cols * 4;
        }
    }
}

// nr rows of int8 levels q [nr][nb * kI8Block] with scales s [nr][nb] into the signed panels they fall in
// (column j of panel j / kI8Cols). Columns without a row keep what panels held (the caller zero-fills: a zero
// scale).
void pack_int8(const int8_t* q, const float* s, int64_t nr, int64_t nb, unsigned char* panels) {
    for (int64_t j = 0; j < nr; ++j)
        scatter_row(q + j * nb * kI8Block, 0, {s + j * nb}, nb, j % kI8Cols,
                    panels + (j / kI8Cols) * nb * kI8PanelBlockBytes);
}

// The same for nr rows of `bits` levels u [nr][level_row_bytes(bits, nb * kI8Block)] with D and O [nr][nb]
// (nibble or level panels, no bias).
void pack_levels(const uint8_t* u, int bits, const float* D, const float* O, int64_t nr, int64_t nb,
                 unsigned char* panels) {
    const int64_t row_bytes = level_row_bytes(bits, nb * kI8Block);
    for (int64_t j = 0; j < nr; ++j)
        scatter_row(u + j * row_bytes, bits, {D + j * nb, O + j * nb}, nb, j % kI8Cols,
                    panels + (j / kI8Cols) * nb * panel_block_bytes(bits));
}

}  // namespace

// The weights' source: one of the three providers (ops/int8_gemm.h).
struct Int8Linear::Providers {
    RowProviderF32 rows;
    LevelProvider levels;
    Int8Provider int8;
    bool any() const { return rows || levels || int8; }
};

struct Int8Linear::Impl {
    int64_t nb = 0, kp = 0;
    int bits = 0;                       // level panels of this many bits, else 0 (signed panels)
    Providers src;                      // streamed: the provider, read on every forward
    std::vector<unsigned char> packed;  // all panels, column block after column block (packed only)

    int64_t block_bytes() const { return panel_block_bytes(bits); }
    int64_t panel_bytes() const { return nb * block_bytes(); }
    bool streamed() const { return src.any(); }
    // One thread's scratch for one column block.
    struct Scratch {
        std::vector<float> f32, d, o;
        std::vector<uint8_t> u;
        std::vector<int8_t> q;
        std::vector<float> s;
    };
    // Columns [c0, c0 + nc) into `panels` (whole panels from column c0 on; the rest of the last one zeroed
    // here) from the provider in pv, kMinCols rows per call (the scratch holds no more); fp32 rows are
    // quantised with `quantize`.
    void decode(const Providers& pv, int64_t c0, int64_t nc, int64_t k, Scratch& sc, unsigned char* panels,
                QuantizeFn quantize) const {
        if (nc % kI8Cols != 0) std::fill_n(panels + nc / kI8Cols * panel_bytes(), panel_bytes(), 0);
        for (int64_t j = 0; j < nc; j += kMinCols)
            decode_rows(pv, c0 + j, std::min(kMinCols, nc - j), k, sc, panels + j / kI8Cols * panel_bytes(),
                        quantize);
    }
    void decode_rows(const Providers& pv, int64_t r0, int64_t nr, int64_t k, Scratch& sc,
                     unsigned char* panels, QuantizeFn quantize) const {
        sc.s.resize(static_cast<size_t>(kMinCols * nb));
        if (pv.levels) {
            sc.u.resize(static_cast<size_t>(kMinCols * level_row_bytes(bits, kp)));
            sc.o.resize(sc.s.size());
            pv.levels(r0, nr, sc.u.data(), sc.s.data(), sc.o.data());
            return pack_levels(sc.u.data(), bits, sc.s.data(), sc.o.data(), nr, nb, panels);
        }
        sc.q.resize(static_cast<size_t>(kMinCols * kp));
        if (pv.int8) {
            pv.int8(r0, nr, sc.q.data(), sc.s.data());
        } else {
            sc.f32.resize(static_cast<size_t>(kMinCols * k));
            pv.rows(r0, nr, sc.f32.data());
            for (int64_t j = 0; j < nr; ++j)
                quantize(sc.f32.data() + j * k, k, sc.q.data() + j * kp, sc.s.data() + j * nb);
        }
        pack_int8(sc.q.data(), sc.s.data(), nr, nb, panels);
    }
    // Packs every column once (a packed layer): whole panels, the last one zero-padded.
    void pack_all(const Providers& pv, int64_t n, int64_t k) {
        packed.assign(static_cast<size_t>(int8_packed_bytes(n, k, bits)), 0);
        Scratch sc;
        decode(pv, 0, n, k, sc, packed.data(), i8::quantize_row);
    }
    // Keeps pv (streamed) or packs from it.
    void take(Providers pv, int64_t n, int64_t k, bool streamed) {
        if (streamed)
            src = std::move(pv);
        else
            pack_all(pv, n, k);
    }
};

uint64_t int8_packed_bytes(int64_t n, int64_t k, int bits) {
    const int64_t nb = (k + kI8Block - 1) / kI8Block;
    return static_cast<uint64_t>((n + kI8Cols - 1) / kI8Cols * nb * panel_block_bytes(bits));
}

uint64_t int8_stream_scratch_bytes(int64_t k) {
    const int64_t nb = (k + kI8Block - 1) / kI8Block, kp = nb * kI8Block;
    // Impl::Scratch for kMinCols rows: fp32 rows, their levels, two fp32 per block; their panels (the largest
    // kind).
    const int64_t rows = kMinCols * (k * 4 + kp + nb * 8);
    return static_cast<uint64_t>(rows) + int8_packed_bytes(kMinCols, k, 5);
}

Int8Linear::Int8Linear() = default;
Int8Linear::Int8Linear(Int8Linear&&) noexcept = default;
Int8Linear& Int8Linear::operator=(Int8Linear&&) noexcept = default;
Int8Linear::~Int8Linear() = default;

Int8Linear::Int8Linear(const RowProviderF32& rows, int64_t n, int64_t k, bool streamed)
    : n_(n), k_(k), impl_(std::make_unique<Impl>()) {
    if (n <= 0 || k <= 0) throw Error("int8 linear: empty weight matrix");
    Impl& p = *impl_;
    p.nb = (k + kI8Block - 1) / kI8Block;
    p.kp = p.nb * kI8Block;
    p.take({rows, {}, {}}, n, k, streamed);
}

Int8Linear::Int8Linear(const LevelProvider& levels, int bits, int64_t n, int64_t k, bool streamed)
    : n_(n), k_(k), impl_(std::make_unique<Impl>()) {
    if (n <= 0 || k <= 0) throw Error("int8 linear: empty weight matrix");
    if (k % kI8Block != 0) throw Error("int8 linear: levels need whole 32-value blocks");
    if (bits != 4 && bits != 5) throw Error("int8 linear: levels of 4 or 5 bits");
    Impl& p = *impl_;
    p.nb = k / kI8Block;
    p.kp = k;
    p.bits = bits;
    p.take({{}, levels, {}}, n, k, streamed);
}

Int8Linear::Int8Linear(const Int8Provider& levels, int64_t n, int64_t k, bool streamed)
    : n_(n), k_(k), impl_(std::make_unique<Impl>()) {
    if (n <= 0 || k <= 0) throw Error("int8 linear: empty weight matrix");
    if (k % kI8Block != 0) throw Error("int8 linear: int8 levels need whole 32-value blocks");
    Impl& p = *impl_;
    p.nb = k / kI8Block;
    p.kp = k;
    p.take({{}, {}, levels}, n, k, streamed);
}

bool Int8Linear::streamed() const {
    return impl_ && impl_->streamed();
}

size_t Int8Linear::packed_bytes() const {
    return impl_ ? impl_->packed.size() : 0;
}

namespace {

// The dispatched target and the kernels' extension, e.g. "AVX2" or "NEON+dotprod".
std::string int8_target() {
    const std::string ext = i8::kernel_extension();
    return simd_target() + (ext.empty() ? "" : "+" + ext);
}

}  // namespace

std::string int8_plan_string() {
    return "int8(" + int8_target() + ")";
}

std::string Int8Linear::backend_name() const {
    return impl_ && impl_->bits ? "int8-levels(" + int8_target() + ")" : int8_plan_string();
}

namespace {

// Quantised activations [m][k] (ops/int8_kernels.h), rows ld bytes apart (not zeroed: every row is written
// whole).
struct Activations {
    std::unique_ptr<unsigned char[]> p;
    int64_t ld = 0, nb = 0;

    Activations(int64_t m, int64_t nblocks)
        : p(new unsigned char[static_cast<size_t>(m * nblocks * i8::kI8ActBytes)]),
          ld(nblocks * i8::kI8ActBytes),
          nb(nblocks) {}
    // Rows [i0, i0 + rows), blocks from kb0 on.
    i8::I8Rows rows(int64_t i0, int rows, int64_t kb0) const {
        i8::I8Rows r;
        r.p = p.get() + i0 * ld + kb0 * i8::kI8ActBytes;
        r.ld = ld;
        r.rows = rows;
        return r;
    }
};

// The columns [c0, c0 + width) the next task takes: kColBlock while at least two such tasks per thread are
// left, then the remaining columns shared out, kMinCols at least (whole panels; the last task takes what is
// left). {n, 0} when none are left.
std::pair<int64_t, int64_t> next_columns(std::atomic<int64_t>& next, int64_t n, int threads) {
    int64_t c0 = next.load(std::memory_order_relaxed);
    for (;;) {
        if (c0 >= n) return {n, 0};
        const int64_t share = (n - c0) / (2 * threads) / kI8Cols * kI8Cols;
        const int64_t w = std::min(std::clamp(share, kMinCols, kColBlock), n - c0);
        if (next.compare_exchange_weak(c0, c0 + w, std::memory_order_relaxed)) return {c0, w};
    }
}

// y[m][c0 + j] for j < nc (<= kColBlock) from the column block's panels (panel_bytes apart): per slice of
// kb blocks, per tile of kI8TileCols columns, every row in groups of kI8Rows (bits: 0 signed panels).
// slice_blocks: kb for nb blocks, the slices as even as max_slice_blocks allows.
int64_t slice_blocks(int64_t nb, int bits) {
    const int64_t most = max_slice_blocks(panel_block_bytes(bits));
    const int64_t slices = (nb + most - 1) / most;
    return (nb + slices - 1) / slices;
}

void column_block(const Activations& a, int64_t m, const unsigned char* panels, int64_t panel_bytes, int bits,
                  int64_t nc, float* y, int64_t ldy, bool reference, int64_t kb) {
    const int64_t bb = panel_block_bytes(bits);
    for (int64_t kb0 = 0; kb0 < a.nb; kb0 += kb)
        for (int64_t j = 0; j < nc; j += kI8TileCols) {
            i8::I8Tile t;
            t.panel = panels + (j / kI8Cols) * panel_bytes + kb0 * bb;
            t.panel_stride = panel_bytes;
            t.nb = std::min(kb, a.nb - kb0);
            t.ncols = static_cast<int>(std::min<int64_t>(kI8TileCols, nc - j));
            t.ldy = ldy;
            t.accumulate = kb0 > 0;
            for (int64_t i0 = 0; i0 < m; i0 += kI8Rows) {
                const i8::I8Rows x = a.rows(i0, static_cast<int>(std::min<int64_t>(kI8Rows, m - i0)), kb0);
                t.y = y + i0 * ldy + j;
                if (bits)
                    (reference ? i8::panel_block_u_ref : i8::panel_block_u)(x, t, bits);
                else
                    (reference ? i8::panel_block_ref : i8::panel_block)(x, t);
            }
        }
}

}  // namespace

void Int8Linear::forward(const float* x, int64_t m, float* y, const float* bias, bool reference) const {
    if (m <= 0) return;
    if (!impl_) throw Error("int8 linear: empty layer");
    const Impl& p = *impl_;
    const int64_t n = n_, k = k_, nb = p.nb;
    const QuantizeFn quantize = reference ? i8::quantize_row_ref : i8::quantize_row;
    const QuantizeActsFn quantize_acts = reference ? i8::quantize_acts_ref : i8::quantize_acts;
    num_threads();  // applies the global thread setting to this thread
    const Activations a(m, nb);
#pragma omp parallel for schedule(static) if (m * k > (1 << 15))
    for (int64_t i = 0; i < m; ++i) quantize_acts(x + i * k, k, a.p.get() + i * a.ld, p.bits != 0);
    std::atomic<int64_t> next{0};
    const int64_t kb = slice_blocks(nb, p.bits);
#pragma omp parallel if (m * n * k > (1 << 18))
    {
        Impl::Scratch sc;
        std::vector<unsigned char> own;
        for (;;) {
            const auto [c0, nc] = next_columns(next, n, omp_get_num_threads());
            if (nc == 0) break;
            if (!p.streamed()) {
                column_block(a, m, p.packed.data() + (c0 / kI8Cols) * p.panel_bytes(), p.panel_bytes(),
                             p.bits, nc, y + c0, n, reference, kb);
                continue;
            }
            // Streamed: kMinCols columns decoded at a time and used while their panels are in the L2 cache.
            own.resize(static_cast<size_t>((kMinCols / kI8Cols) * p.panel_bytes()));
            for (int64_t j = 0; j < nc; j += kMinCols) {
                const int64_t w = std::min(kMinCols, nc - j);
                p.decode(p.src, c0 + j, w, k, sc, own.data(), quantize);
                column_block(a, m, own.data(), p.panel_bytes(), p.bits, w, y + c0 + j, n, reference, kb);
            }
        }
    }
    if (!bias) return;
#pragma omp parallel for schedule(static) if (m * n > (1 << 15))
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}

double int8_kernel_gops(int iters, int bits) {
    // The yardstick's shape (kYardRows ...), the tiles called as the forward calls them: ~1 ms per timed run.
    constexpr int64_t m = kYardRows, n = kYardCols, nb = kYardBlocks, k = nb * kI8Block, reps = 32;
    const auto value = [](int64_t i) { return static_cast<float>((i * 7919) % 2001 - 1000) / 1000.0f; };
    Int8Linear::Impl w;  // the panels, packed as a layer packs them
    w.nb = nb;
    w.kp = k;
    w.bits = bits;
    Int8Linear::Providers pv;
    if (bits)
        pv.levels = [&](int64_t r0, int64_t nr, uint8_t* u, float* D, float* O) {
            const int64_t row_bytes = level_row_bytes(bits, k);  // nibble pairs: any byte
            for (int64_t i = 0; i < nr * row_bytes; ++i)
                u[i] = static_cast<uint8_t>((r0 * row_bytes + i) % (bits == 4 ? 256 : 1 << bits));
            for (int64_t i = 0; i < nr * nb; ++i) D[i] = 0.01f, O[i] = -0.08f;
        };
    else
        pv.rows = [&](int64_t r0, int64_t nr, float* out) {
            for (int64_t i = 0; i < nr * k; ++i) out[i] = value(r0 * k + i);
        };
    w.pack_all(pv, n, k);
    const int threads = num_threads();
    double best = 0;
    std::vector<double> secs(static_cast<size_t>(threads), 0);
#pragma omp parallel num_threads(threads)
    {
        const std::vector<unsigned char> panels = w.packed;  // each thread's own copy, in its core's cache
        const Activations a(m, nb);
        std::vector<float> x(static_cast<size_t>(k));
        for (int64_t i = 0; i < m; ++i) {
            for (int64_t t = 0; t < k; ++t) x[t] = value(i * 31 + t);
            i8::quantize_acts(x.data(), k, a.p.get() + i * a.ld, bits != 0);
        }
        std::vector<float> y(static_cast<size_t>(m * n));
        for (int it = 0; it <= iters; ++it) {
#pragma omp barrier
            const double t0 = omp_get_wtime();
            for (int64_t rep = 0; rep < reps; ++rep)
                column_block(a, m, panels.data(), w.panel_bytes(), bits, n, y.data(), n, false, nb);
            const double dt = omp_get_wtime() - t0;
            secs[static_cast<size_t>(omp_get_thread_num())] = dt;
#pragma omp barrier
#pragma omp single
            if (it > 0)
                best = std::max(best, threads * 2.0 * reps * m * k * n /
                                          *std::max_element(secs.begin(), secs.end()) / 1e9);
        }
    }
    return best;
}

}  // namespace clef::ops
