#include "ops/attention_fast.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "ops/attention_kernels.h"
#include "ops/basic.h"
#include "ops/cpu.h"
#include "ops/simd_kernels.h"
#include "util/error.h"

namespace clef::ops {

namespace {

void check(const simd::AttnCall& a) {
    const int64_t lq = a.lq, lk = a.lk;
    const int hq = a.hq, hkv = a.hkv, dh = a.dh;
    if (lq <= 0 || lk <= 0 || hq <= 0 || hkv <= 0 || dh <= 0 || hq % hkv != 0)
        throw Error(
            "attention_fast: bad shape (lq, lk, heads and head dim must be positive, hq a multiple of hkv)");
    if (a.causal && lq > lk) throw Error("attention_fast: causal attention needs lq <= lk");
    if (!a.q || !a.k || !a.v || !a.out) throw Error("attention_fast: null input or output");
}

// Kᵀ scratch of at least n floats, reused by the calls on this thread (a fresh zeroed buffer per call cost
// the vision tower ~6 %: every block zeroed and faulted in MiBs); done() drops one larger than kKeepFloats.
class KtScratch {
public:
    static constexpr size_t kKeepFloats = size_t{8} << 20;  // 32 MiB
    float* get(size_t n) {
        if (n > cap_) buf_.reset(new float[n]), cap_ = n;
        return buf_.get();
    }
    void done() {
        if (cap_ > kKeepFloats) buf_.reset(), cap_ = 0;
    }

private:
    std::unique_ptr<float[]> buf_;
    size_t cap_ = 0;
};

// Bidirectional fp32 attention with whole score rows (the vision tower's frames, the head's memory): per
// query head and block of kDenseRows queries, S = scale·Q·Kᵀ and O = P·V as small_gemm_acc products (register
// blocks, any head dim) and each row of S through softmax_inplace_fast_f32. Kᵀ ([hkv·dh][lk]) is built once
// per call into the thread's KtScratch; blocks run on the kernel threads with kDenseRows x lk scores each.
void dense(const simd::AttnCall& a) {
    constexpr int64_t kDenseRows = 32;
    const int64_t lk = a.lk, dh = a.dh, cols = static_cast<int64_t>(a.hkv) * dh;
    const auto* k = static_cast<const float*>(a.k);
    const auto* v = static_cast<const float*>(a.v);
    thread_local KtScratch kt;
    float* ktp = kt.get(static_cast<size_t>(cols * lk));
    num_threads();  // applies the global thread setting to this thread
    const bool par = a.lq * lk * a.hq * dh > (int64_t{1} << 16);
    // Column c of K (kv head c / dh, dim c % dh) becomes row c of Kᵀ, in tiles of kTile x kTile values that
    // stay in the L1 cache (column by column, each value read was a cache line of its own).
    constexpr int64_t kTile = 32;
    const int64_t col_tiles = (cols + kTile - 1) / kTile, row_tiles = (lk + kTile - 1) / kTile;
#pragma omp parallel for collapse(2) schedule(static) if (par)
    for (int64_t ct = 0; ct < col_tiles; ++ct)
        for (int64_t rt = 0; rt < row_tiles; ++rt) {
            const int64_t c1 = std::min(cols, (ct + 1) * kTile), r1 = std::min(lk, (rt + 1) * kTile);
            for (int64_t c = ct * kTile; c < c1; ++c)
                for (int64_t r = rt * kTile; r < r1; ++r) ktp[c * lk + r] = k[r * a.ks + c];
        }
    const int64_t blocks = (a.lq + kDenseRows - 1) / kDenseRows, group = a.hq / a.hkv;
#pragma omp parallel if (par)
    {
        std::vector<float> sc(static_cast<size_t>(kDenseRows * lk));
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t h = 0; h < a.hq; ++h)
            for (int64_t b = 0; b < blocks; ++b) {
                const int64_t i0 = b * kDenseRows, m = std::min(kDenseRows, a.lq - i0), g = h / group;
                std::fill_n(sc.data(), m * lk, 0.f);
                simd::small_gemm_acc(m, lk, dh, a.scale, a.q + i0 * a.qs + h * dh, a.qs, ktp + g * dh * lk,
                                     lk, sc.data(), lk);
                for (int64_t i = 0; i < m; ++i) softmax_inplace_fast_f32(sc.data() + i * lk, lk);
                float* o = a.out + i0 * a.os + h * dh;
                for (int64_t i = 0; i < m; ++i) std::fill_n(o + i * a.os, dh, 0.f);
                simd::small_gemm_acc(m, dh, lk, 1.f, sc.data(), lk, v + g * dh, a.vs, o, a.os);
            }
    }
    kt.done();
}

// Tasks are (kv head, block of query rows); causal blocks near the end see more keys, so the longest go first
// and threads take them one at a time.
void run(const simd::AttnCall& a) {
    check(a);
    if (!a.causal && !a.kv_bf16 && !a.round_bf16) return dense(a);
    const int64_t nqb = (a.lq + simd::kAttnQueryRows - 1) / simd::kAttnQueryRows;
    const int64_t tasks = nqb * a.hkv;
    const int64_t scratch = simd::attention_scratch_floats(a);
    num_threads();  // applies the global thread setting to this thread
#pragma omp parallel if (a.lq * a.lk * a.hq * int64_t(a.dh) > (1 << 16))
    {
        std::vector<float> buf(static_cast<size_t>(scratch));
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
            const int64_t i0 = (nqb - 1 - t / a.hkv) * simd::kAttnQueryRows;
            const int n = static_cast<int>(std::min<int64_t>(simd::kAttnQueryRows, a.lq - i0));
            simd::attention_task(a, static_cast<int>(t % a.hkv), i0, n, buf.data());
        }
    }
}

}  // namespace

void attention_fast(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                    int64_t v_stride, int64_t lq, int64_t lk, int hq, int hkv, int dh, float scale,
                    bool causal, float* out, int64_t out_stride, Precision p) {
    run({q, q_stride, k, v, k_stride, v_stride, false, p == Precision::BF16, lq, lk, hq, hkv, dh, scale,
         causal, out, out_stride});
}

void attention_fast(const float* q, int64_t q_stride, const uint16_t* k, int64_t k_stride, const uint16_t* v,
                    int64_t v_stride, int64_t lq, int64_t lk, int hq, int hkv, int dh, float scale,
                    bool causal, float* out, int64_t out_stride, Precision p) {
    run({q, q_stride, k, v, k_stride, v_stride, true, p == Precision::BF16, lq, lk, hq, hkv, dh, scale,
         causal, out, out_stride});
}

void memory_attention_fast(const float* q, int64_t lq, int heads, int64_t w, const float* wk, const float* wv,
                           const float* bv, const float* m, int64_t T, float* out) {
    const int64_t dh = w / heads, R = lq * heads;
    std::vector<float> qt(static_cast<size_t>(R * w)), ctx(static_cast<size_t>(R * w)),
        ch(static_cast<size_t>(lq * w)), oh(static_cast<size_t>(lq * dh));
    const float scale = 1.f / std::sqrt(static_cast<float>(dh));
    // Row (i, h) of qt = scale · q_i,h · W_k,h: the query of head h in memory space ([lq][heads][w]).
    for (int64_t h = 0; h < heads; ++h)
        simd::small_gemm_acc(lq, w, dh, scale, q + h * dh, w, wk + h * dh * w, w, qt.data() + h * w,
                             heads * w);
    // The lq * heads rows of qt as the queries of one head of width w over the memory rows as keys and
    // values: every row sees the same keys, so a block of rows reads them once for all heads (one pass per
    // head of each block read the T x w rows heads times; each row's arithmetic is the same either way).
    attention_fast(qt.data(), w, m, w, m, w, R, T, 1, 1, static_cast<int>(w), 1.f, false, ctx.data(), w);
    for (int64_t h = 0; h < heads; ++h) {  // o_i,h = W_v,h · ctx_i,h + b_v,h
        for (int64_t i = 0; i < lq; ++i) std::copy_n(ctx.data() + (i * heads + h) * w, w, ch.data() + i * w);
        linear(ch.data(), lq, w, wv + h * dh * w, dh, bv + h * dh, oh.data());
        for (int64_t i = 0; i < lq; ++i) std::copy_n(oh.data() + i * dh, dh, out + i * w + h * dh);
    }
}

}  // namespace clef::ops
