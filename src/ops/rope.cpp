#include "ops/rope.h"

#include <cmath>
#include <string>
#include <vector>

#include "util/error.h"

namespace clef::ops {

namespace {

void check_params(const RopeParams& p) {
    if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0)
        throw Error("rope: rotary_dim must be positive and even, got " + std::to_string(p.rotary_dim));
    const auto& s = p.mrope_section;
    const bool plain = s[0] == 0 && s[1] == 0 && s[2] == 0;
    if (!plain && (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[0] + s[1] + s[2] != p.rotary_dim / 2))
        throw Error("rope: mrope_section must sum to rotary_dim/2 = " + std::to_string(p.rotary_dim / 2));
}

int axis_unchecked(const RopeParams& p, int i) {
    const auto& s = p.mrope_section;
    if (s[0] == 0 && s[1] == 0 && s[2] == 0) return 0;
    if (p.interleaved) {
        if (i % 3 == 1 && i < 3 * s[1]) return 1;
        if (i % 3 == 2 && i < 3 * s[2]) return 2;
        return 0;
    }
    if (i < s[0]) return 0;
    if (i < s[0] + s[1]) return 1;
    return 2;
}

}  // namespace

int rope_axis(const RopeParams& p, int i) {
    check_params(p);
    return axis_unchecked(p, i);
}

void rope_tables(const RopeParams& p, const int32_t* positions, int64_t T, float* cos, float* sin) {
    check_params(p);
    const int half = p.rotary_dim / 2;
    std::vector<int> axis(half);
    std::vector<float> inv_f(half);
    std::vector<double> inv_d(half);
    for (int i = 0; i < half; ++i) {
        axis[i] = axis_unchecked(p, i);
        // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in fp32.
        const float e = static_cast<float>(2 * i) / static_cast<float>(p.rotary_dim);
        inv_f[i] = 1.0f / std::pow(static_cast<float>(p.theta), e);
        inv_d[i] = std::pow(p.theta, -2.0 * i / p.rotary_dim);
    }
    for (int64_t t = 0; t < T; ++t)
        for (int i = 0; i < half; ++i) {
            const int32_t pos = positions[axis[i] * T + t];
            if (p.fp64_angles) {
                const double ang = static_cast<double>(pos) * inv_d[i];
                cos[t * half + i] = static_cast<float>(std::cos(ang));
                sin[t * half + i] = static_cast<float>(std::sin(ang));
            } else {
                const float ang = static_cast<float>(pos) * inv_f[i];
                cos[t * half + i] = std::cos(ang);
                sin[t * half + i] = std::sin(ang);
            }
        }
}

void rope_apply(float* x, int64_t T, int heads, int head_dim, int64_t stride, int rotary_dim,
                const float* cos, const float* sin) {
    const int half = rotary_dim / 2;
    for (int64_t t = 0; t < T; ++t) {
        const float* c = cos + t * half;
        const float* s = sin + t * half;
        for (int h = 0; h < heads; ++h) {
            float* xh = x + t * stride + static_cast<int64_t>(h) * head_dim;
            for (int i = 0; i < half; ++i) {
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c[i] - b * s[i];
                xh[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

}  // namespace clef::ops
