#include "ops/conv.h"

#include <vector>

#include "ops/basic.h"
#include "ops/elementwise_kernels.h"

namespace clef::ops {

namespace {

// Row of the input at sequence position p (p < 0: a state row, or null for zero padding).
const float* conv_row(const float* x, int64_t x_stride, const float* state, int64_t C, int K, int64_t p) {
    if (p >= 0) return x + p * x_stride;
    return state ? state + (K - 1 + p) * C : nullptr;
}

// new_state: the last K - 1 inputs of (state ++ x). Row r is position T - K + 1 + r; with new_state == state
// a state row is read from index r + T >= r, which has not been overwritten yet.
void carry_state(const float* x, int64_t T, int64_t C, int64_t x_stride, int K, const float* state,
                 float* new_state) {
    for (int64_t r = 0; r < K - 1; ++r) {
        const float* src = conv_row(x, x_stride, state, C, K, T - K + 1 + r);
        float* dst = new_state + r * C;
        if (src == dst) continue;
        for (int64_t c = 0; c < C; ++c) dst[c] = src ? src[c] : 0.f;
    }
}

}  // namespace

void causal_conv1d_silu(const float* x, int64_t T, int64_t C, int64_t x_stride, const float* w, int K,
                        const float* state, float* new_state, float* y, int64_t y_stride) {
#pragma omp parallel for schedule(static) if (T * C * K > (1 << 18))
    for (int64_t t = 0; t < T; ++t) {
        float* yr = y + t * y_stride;
        for (int64_t c = 0; c < C; ++c) yr[c] = 0.f;
        for (int j = 0; j < K; ++j) {
            const float* xr = conv_row(x, x_stride, state, C, K, t - K + 1 + j);
            if (!xr) continue;
            for (int64_t c = 0; c < C; ++c) yr[c] += w[c * K + j] * xr[c];
        }
        for (int64_t c = 0; c < C; ++c) yr[c] = silu(yr[c]);
    }
    if (new_state) carry_state(x, T, C, x_stride, K, state, new_state);
}

void causal_conv1d_silu_fast(const float* x, int64_t T, int64_t C, int64_t x_stride, const float* w, int K,
                             const float* state, float* new_state, float* y, int64_t y_stride) {
    std::vector<float> wt(static_cast<size_t>(K * C));  // [K][C]: the taps as rows
    for (int64_t c = 0; c < C; ++c)
        for (int j = 0; j < K; ++j) wt[static_cast<size_t>(j * C + c)] = w[c * K + j];
#pragma omp parallel if (T * C * K > (1 << 18))
    {
        std::vector<const float*> rows(static_cast<size_t>(K));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; ++t) {
            for (int j = 0; j < K; ++j)
                rows[static_cast<size_t>(j)] = conv_row(x, x_stride, state, C, K, t - K + 1 + j);
            simd::conv_silu_row(rows.data(), wt.data(), K, C, y + t * y_stride);
        }
    }
    if (new_state) carry_state(x, T, C, x_stride, K, state, new_state);
}

}  // namespace clef::ops
