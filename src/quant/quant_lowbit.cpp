#include "quant/quant_lowbit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "ops/iq_tables.h"
#include "ops/quant_blocks.h"
#include "util/half.h"

namespace clef::quant_detail {

namespace {

using ops::BlockIQ4_NL;
using ops::BlockIQ4_XS;
using ops::BlockQ2_K;
using ops::BlockQ3_K;
using ops::kIq4nlValues;

int nearest_int(float v) {
    return static_cast<int>(std::lrintf(v));
}

// The value of largest magnitude of n values (its sign kept); 0 for an all-zero (or non-finite) block.
float signed_max(const float* x, int n) {
    float amax = 0, vmax = 0;
    for (int j = 0; j < n; ++j)
        if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), vmax = x[j];
    return std::isfinite(vmax) && amax > 1e-30f ? vmax : 0.f;
}

// One candidate inverse scale: the levels level(iscale * x_j) refitted by weighted least squares (scale
// sum w x v / sum w v^2); kept in best when its gain (sum w x v)^2 / sum w v^2 -- by how much it lowers the
// weighted squared error sum w x^2 -- is the largest so far.
template <class Level>
void try_scale(const float* x, const float* w, int n, float iscale, Level level, float& best,
               float& best_gain) {
    double sxv = 0, svv = 0;
    for (int j = 0; j < n; ++j) {
        const double v = level(iscale * x[j]);
        sxv += static_cast<double>(w[j]) * x[j] * v;
        svv += static_cast<double>(w[j]) * v * v;
    }
    if (svv <= 0) return;
    const float gain = static_cast<float>(sxv * sxv / svv);
    if (gain > best_gain) best_gain = gain, best = static_cast<float>(sxv / svv);
}

// Scale s (sign included) for x ~ s * L, L an integer in [lo, hi]: candidates put the value of largest
// magnitude at lo or hi times a factor in [0.8, 1.2] (try_scale). 0 for an all-zero block.
float fit_symmetric(const float* x, const float* w, int n, int lo, int hi) {
    const float vmax = signed_max(x, n);
    if (vmax == 0) return 0;
    float best_s = 0, best_gain = 0;
    auto level = [lo, hi](float v) { return std::clamp(nearest_int(v), lo, hi); };
    for (int target : {lo, hi})
        for (int t = -4; t <= 4; ++t)
            try_scale(x, w, n, static_cast<float>(target) * (1.f + 0.05f * static_cast<float>(t)) / vmax,
                      level, best_s, best_gain);
    return best_s;
}

// Scale s >= 0 and min m >= 0 for x ~ s * L - m, L in [0, nmax]: candidate level assignments over the block's
// range (stretched by factors around 1), each refitted by weighted least squares (m clamped at 0).
void fit_with_min(const float* x, const float* w, int n, int nmax, float& s_out, float& m_out) {
    float lo = 0, hi = x[0];
    for (int j = 0; j < n; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    s_out = 0, m_out = -lo;
    if (!(hi > lo) || !std::isfinite(hi - lo)) return;
    double best = INFINITY;
    int L[256];
    for (int t = -6; t <= 6; ++t) {
        const float iscale = (static_cast<float>(nmax) + 0.1f * static_cast<float>(t)) / (hi - lo);
        double sw = 0, sl = 0, sll = 0, sx = 0, slx = 0;
        for (int j = 0; j < n; ++j) {
            L[j] = std::clamp(nearest_int(iscale * (x[j] - lo)), 0, nmax);
            sw += w[j], sl += w[j] * L[j], sll += static_cast<double>(w[j]) * L[j] * L[j];
            sx += w[j] * x[j], slx += static_cast<double>(w[j]) * L[j] * x[j];
        }
        const double det = sw * sll - sl * sl;
        if (det <= 0) continue;
        double a = (sw * slx - sl * sx) / det, b = (sll * sx - sl * slx) / det;
        if (b > 0) b = 0, a = slx / sll;  // the min is stored as m >= 0 (x ~ a L + b, b = -m)
        if (!(a > 0)) continue;
        double err = 0;
        for (int j = 0; j < n; ++j) {
            const double e = a * L[j] + b - x[j];
            err += w[j] * e * e;
        }
        if (err < best) best = err, s_out = static_cast<float>(a), m_out = static_cast<float>(-b);
    }
}

// The index of the IQ4 level nearest to v, the lower one on a tie (0 for NaN): the count of midpoints between
// neighbouring levels below v, without branches on v.
int nearest_iq4(float v) {
    static const auto mids = [] {
        std::array<float, 15> m{};
        for (int k = 0; k < 15; ++k) m[k] = 0.5f * static_cast<float>(kIq4nlValues[k] + kIq4nlValues[k + 1]);
        return m;
    }();
    int l = 0;
    for (float m : mids) l += v > m;
    return l;
}

// Scale d for x ~ d * kIq4nlValues[L]: candidates map the value of largest magnitude near either end of the
// table, 15 near -127 and 5 near 113 (try_scale). 0 for an all-zero block.
float fit_iq4(const float* x, const float* w, int n) {
    const float vmax = signed_max(x, n);
    if (vmax == 0) return 0;
    float best_d = 0, best_gain = 0;
    auto level = [](float v) { return kIq4nlValues[nearest_iq4(v)]; };
    for (int end : {0, 15}) {  // the table's long end (-127) gets the finer search
        const int tries = end == 0 ? 7 : 2;
        for (int t = -tries; t <= tries; ++t)
            try_scale(x, w, n, (static_cast<float>(kIq4nlValues[end]) + 1.5f * static_cast<float>(t)) / vmax,
                      level, best_d, best_gain);
    }
    return best_d;
}

// 32 values as IQ4 nibbles (value j low nibble of q[j], value j + 16 high) for the stored scale dl.
void iq4_nibbles(const float* x, float dl, uint8_t* q) {
    const float id = dl != 0 ? 1.f / dl : 0.f;
    for (int j = 0; j < 16; ++j)
        q[j] = static_cast<uint8_t>(nearest_iq4(id * x[j]) | (nearest_iq4(id * x[j + 16]) << 4));
}

}  // namespace

void value_weights(const float* x, const float* importance, int n, float* w) {
    double ss = 0;
    for (int j = 0; j < n; ++j) ss += static_cast<double>(x[j]) * x[j];
    const float ms = static_cast<float>(ss / n);
    for (int j = 0; j < n; ++j) w[j] = (importance ? importance[j] : 1.f) * std::sqrt(ms + x[j] * x[j]);
}

// Q2_K: 16 sub-blocks of 16 (sub-block k holds values 16k..16k+15; its 2-bit levels sit in
// qs[32h + 16p + l] at bits 2s, k = 8h + 2s + p), 4-bit scale and min per sub-block, fp16 d and dmin.
void quant_q2_k(const float* x, const float* importance, void* blocks, int64_t nb) {
    auto* b = static_cast<BlockQ2_K*>(blocks);
    float w[256], s[16], m[16];
    for (int64_t i = 0; i < nb; ++i, x += 256, importance = importance ? importance + 256 : nullptr) {
        value_weights(x, importance, 256, w);
        float smax = 0, mmax = 0;
        for (int k = 0; k < 16; ++k) {
            fit_with_min(x + 16 * k, w + 16 * k, 16, 3, s[k], m[k]);
            smax = std::max(smax, s[k]), mmax = std::max(mmax, m[k]);
        }
        std::memset(&b[i], 0, sizeof b[i]);
        b[i].d = f32_to_f16(smax / 15.f);
        b[i].dmin = f32_to_f16(mmax / 15.f);
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int k = 0; k < 16; ++k) {
            const int sc = d > 0 ? std::clamp(nearest_int(s[k] / d), 0, 15) : 0;
            const int mc = dmin > 0 ? std::clamp(nearest_int(m[k] / dmin), 0, 15) : 0;
            b[i].scales[k] = static_cast<uint8_t>(sc | (mc << 4));
            const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mc);
            const int h = k / 8, sh = 2 * ((k / 2) % 4), p = k % 2;
            for (int l = 0; l < 16; ++l) {
                const int q = dl > 0 ? std::clamp(nearest_int((x[16 * k + l] + ml) / dl), 0, 3) : 0;
                b[i].qs[32 * h + 16 * p + l] |= static_cast<uint8_t>(q << sh);
            }
        }
    }
}

// Q3_K: 16 sub-blocks of 16 as Q2_K, levels -4..3 (low 2 bits in qs, the third in hmask[16p + l] bit 4h + s),
// a signed 6-bit scale per sub-block (stored + 32), fp16 d.
void quant_q3_k(const float* x, const float* importance, void* blocks, int64_t nb) {
    auto* b = static_cast<BlockQ3_K*>(blocks);
    float w[256], s[16];
    for (int64_t i = 0; i < nb; ++i, x += 256, importance = importance ? importance + 256 : nullptr) {
        value_weights(x, importance, 256, w);
        for (int k = 0; k < 16; ++k) s[k] = fit_symmetric(x + 16 * k, w + 16 * k, 16, -4, 3);
        const float smax = signed_max(s, 16);
        std::memset(&b[i], 0, sizeof b[i]);
        b[i].d = f32_to_f16(smax != 0 ? smax / -32.f : 0.f);
        const float d = f16_to_f32(b[i].d);
        for (int k = 0; k < 16; ++k) {
            const int sc = d != 0 ? std::clamp(nearest_int(s[k] / d), -32, 31) : 0;
            const int u = sc + 32;
            b[i].scales[k % 8] |= static_cast<uint8_t>((u & 0xF) << (4 * (k / 8)));
            b[i].scales[8 + k % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (k / 4)));
            const float dl = d * static_cast<float>(sc);
            const int h = k / 8, sh = (k / 2) % 4, p = k % 2;
            for (int l = 0; l < 16; ++l) {
                const int q = (dl != 0 ? std::clamp(nearest_int(x[16 * k + l] / dl), -4, 3) : 0) + 4;
                b[i].qs[32 * h + 16 * p + l] |= static_cast<uint8_t>((q & 3) << (2 * sh));
                if (q & 4) b[i].hmask[16 * p + l] |= static_cast<uint8_t>(1 << (4 * h + sh));
            }
        }
    }
}

// IQ4_NL: blocks of 32, fp16 d, nibble indices into kIq4nlValues.
void quant_iq4_nl(const float* x, const float* importance, void* blocks, int64_t nb) {
    auto* b = static_cast<BlockIQ4_NL*>(blocks);
    float w[32];
    for (int64_t i = 0; i < nb; ++i, x += 32, importance = importance ? importance + 32 : nullptr) {
        value_weights(x, importance, 32, w);
        b[i].d = f32_to_f16(fit_iq4(x, w, 32));
        iq4_nibbles(x, f16_to_f32(b[i].d), b[i].qs);
    }
}

// IQ4_XS: 8 sub-blocks of 32 in IQ4_NL's nibble order, each with a signed 6-bit scale (stored + 32: low 4
// bits in nibble ib % 2 of scales_l[ib / 2], high 2 in bits 2ib of scales_h), fp16 d.
void quant_iq4_xs(const float* x, const float* importance, void* blocks, int64_t nb) {
    auto* b = static_cast<BlockIQ4_XS*>(blocks);
    float w[256], s[8];
    for (int64_t i = 0; i < nb; ++i, x += 256, importance = importance ? importance + 256 : nullptr) {
        value_weights(x, importance, 256, w);
        for (int ib = 0; ib < 8; ++ib) s[ib] = fit_iq4(x + 32 * ib, w + 32 * ib, 32);
        const float smax = signed_max(s, 8);
        std::memset(&b[i], 0, sizeof b[i]);
        b[i].d = f32_to_f16(smax != 0 ? smax / -32.f : 0.f);
        const float d = f16_to_f32(b[i].d);
        uint16_t scales_h = 0;
        for (int ib = 0; ib < 8; ++ib) {
            const int sc = d != 0 ? std::clamp(nearest_int(s[ib] / d), -32, 31) : 0;
            const int u = sc + 32;
            b[i].scales_l[ib / 2] |= static_cast<uint8_t>((u & 0xF) << (4 * (ib % 2)));
            scales_h |= static_cast<uint16_t>((u >> 4) << (2 * ib));
            iq4_nibbles(x + 32 * ib, d * static_cast<float>(sc), b[i].qs + 16 * ib);
        }
        b[i].scales_h = scales_h;
    }
}

}  // namespace clef::quant_detail
