#include "ops/conv.h"

#include "ops/basic.h"

namespace clef::ops {

void causal_conv1d_silu(const float* x, int64_t T, int64_t C, int64_t x_stride, const float* w, int K,
                        const float* state, float* new_state, float* y, int64_t y_stride) {
    const int64_t pad = K - 1;
    // Input row at sequence position p (p may be negative: then it is a state row or zero padding).
    auto row = [&](int64_t p) -> const float* {
        if (p >= 0) return x + p * x_stride;
        return state ? state + (pad + p) * C : nullptr;
    };
#pragma omp parallel for schedule(static) if (T * C * K > (1 << 18))
    for (int64_t t = 0; t < T; ++t) {
        float* yr = y + t * y_stride;
        for (int64_t c = 0; c < C; ++c) yr[c] = 0.f;
        for (int j = 0; j < K; ++j) {
            const float* xr = row(t - pad + j);
            if (!xr) continue;
            for (int64_t c = 0; c < C; ++c) yr[c] += w[c * K + j] * xr[c];
        }
        for (int64_t c = 0; c < C; ++c) yr[c] = silu(yr[c]);
    }
    if (new_state) {
        // Row r of the new state is position T - pad + r. With new_state == state, a state row is read from
        // index r + T >= r, which has not been overwritten yet.
        for (int64_t r = 0; r < pad; ++r) {
            const float* src = row(T - pad + r);
            float* dst = new_state + r * C;
            if (src == dst) continue;
            for (int64_t c = 0; c < C; ++c) dst[c] = src ? src[c] : 0.f;
        }
    }
}

}  // namespace clef::ops
