#include "ops/attention_fast.h"

#include <algorithm>
#include <vector>

#include "ops/attention_kernels.h"
#include "ops/cpu.h"
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

// Tasks are (kv head, block of query rows); causal blocks near the end see more keys, so the longest go first
// and threads take them one at a time.
void run(const simd::AttnCall& a) {
    check(a);
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

}  // namespace clef::ops
