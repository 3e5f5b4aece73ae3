// Quantisers of the grid i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (quant_lowbit.h).
//
// Written from the block formats (dequant_lowbit.cpp decodes them). Every value is x = db * g * sign: g a
// magnitude of a grid entry (8 values for IQ2, 4 for IQ3; ops/iq_tables.h), db a sub-block scale and the sign
// a bit of the block. The magnitudes are fitted to |x| (the targets t): a sub-block's scale s is the best of
// a few candidates, each followed by the nearest grid entries of the targets t / s and a weighted
// least-squares refit of s; the block's fp16 d then quantises the sub-block scales to 4 bits, and the entries
// are chosen again for the scales as stored. The types whose sign bytes keep an even count of negative values
// (IQ2_XXS, IQ2_XS, IQ3_XXS) flip the sign of the least important value of a group with an odd count; its
// target becomes -|x|, which the smallest magnitude fits best.
//
// Nearest entries (GridSearch): the grids' magnitudes take K levels (IQ2: 3, IQ3: 8), so rounding each target
// to its nearest level gives a point of a lattice of K^width points (6,561 or 4,096). When that point is an
// entry it is the best one (each value's error is smallest at its nearest level); otherwise the best of the
// point's kNeighbours nearest entries (unweighted distance, precomputed once per grid) under the values'
// weights is taken.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "ops/iq_tables.h"
#include "ops/quant_blocks.h"
#include "quant/quant_lowbit.h"
#include "util/half.h"

namespace clef::quant_detail {

namespace {

using ops::BlockIQ2_S;
using ops::BlockIQ2_XS;
using ops::BlockIQ2_XXS;
using ops::BlockIQ3_S;
using ops::BlockIQ3_XXS;

constexpr int kNeighbours = 16;

class GridSearch {
public:
    // entries grid entries of width magnitudes each; magnitude(e, j) = byte j of entry e.
    template <class Entry>
    GridSearch(const Entry* grid, int entries, int width) : width_(width), entries_(entries) {
        for (int e = 0; e < entries; ++e)
            for (int j = 0; j < width; ++j) mags_.push_back(static_cast<float>((grid[e] >> (8 * j)) & 0xFF));
        levels_ = mags_;
        std::sort(levels_.begin(), levels_.end());
        levels_.erase(std::unique(levels_.begin(), levels_.end()), levels_.end());
        for (size_t k = 0; k + 1 < levels_.size(); ++k) mids_.push_back(0.5f * (levels_[k] + levels_[k + 1]));
        build_map();
    }

    int width() const { return width_; }
    float top() const { return levels_.back(); }
    const float* magnitudes(int e) const { return mags_.data() + static_cast<size_t>(e) * width_; }

    // The entry whose magnitudes times s best fit the width targets t under the weights w (s > 0).
    int nearest(const float* t, const float* w, float s) const {
        const float is = 1.f / s;
        int point = 0;
        for (int j = width_ - 1; j >= 0; --j) point = point * levels() + level_of(t[j] * is);
        const int32_t m = map_[static_cast<size_t>(point)];
        if (m >= 0) return m;
        const uint16_t* list = near_.data() + (-m - 1);
        int best = list[0];
        float best_err = INFINITY;
        for (int k = 0; k < kNeighbours; ++k) {
            const float* g = magnitudes(list[k]);
            float err = 0;
            for (int j = 0; j < width_; ++j) {
                const float e = s * g[j] - t[j];
                err += w[j] * e * e;
            }
            if (err < best_err) best_err = err, best = list[k];
        }
        return best;
    }

private:
    int levels() const { return static_cast<int>(levels_.size()); }

    // The index of the level nearest to v (0 for NaN), without branches on v.
    int level_of(float v) const {
        int l = 0;
        for (float m : mids_) l += v >= m;
        return l;
    }

    // map_: every lattice point -> its entry, or -(1 + offset) of its kNeighbours nearest entries in near_.
    void build_map() {
        size_t points = 1;
        for (int j = 0; j < width_; ++j) points *= levels_.size();
        map_.assign(points, -1);
        for (int e = entries_ - 1; e >= 0; --e) {  // the first of equal entries wins
            int point = 0;
            for (int j = width_ - 1; j >= 0; --j) point = point * levels() + level_of(magnitudes(e)[j]);
            map_[static_cast<size_t>(point)] = e;
        }
        std::vector<float> v(static_cast<size_t>(width_));
        std::vector<std::pair<float, int>> dist(static_cast<size_t>(entries_));
        for (size_t p = 0; p < points; ++p) {
            if (map_[p] >= 0) continue;
            for (size_t q = p, j = 0; j < v.size(); ++j, q /= levels_.size())
                v[j] = levels_[q % levels_.size()];
            for (int e = 0; e < entries_; ++e) {
                float d2 = 0;
                for (int j = 0; j < width_; ++j) d2 += (magnitudes(e)[j] - v[j]) * (magnitudes(e)[j] - v[j]);
                dist[static_cast<size_t>(e)] = {d2, e};
            }
            std::partial_sort(dist.begin(), dist.begin() + kNeighbours, dist.end());
            map_[p] = -1 - static_cast<int32_t>(near_.size());
            for (int k = 0; k < kNeighbours; ++k) near_.push_back(static_cast<uint16_t>(dist[k].second));
        }
    }

    int width_, entries_;
    std::vector<float> mags_, levels_, mids_;
    std::vector<int32_t> map_;
    std::vector<uint16_t> near_;
};

const GridSearch& iq2xxs_grid() {
    static const GridSearch g(ops::kIq2xxsGrid, 256, 8);
    return g;
}
const GridSearch& iq2xs_grid() {
    static const GridSearch g(ops::kIq2xsGrid, 512, 8);
    return g;
}
const GridSearch& iq2s_grid() {
    static const GridSearch g(ops::kIq2sGrid, 1024, 8);
    return g;
}
const GridSearch& iq3xxs_grid() {
    static const GridSearch g(ops::kIq3xxsGrid, 256, 4);
    return g;
}
const GridSearch& iq3s_grid() {
    static const GridSearch g(ops::kIq3sGrid, 512, 4);
    return g;
}

// Signs and targets of 256 values, per group of 8: sign bit j of signs[g] set when value 8g + j is stored
// negative, t = x * stored sign (|x|, or -|x| for a flipped value). With even_parity each group keeps an even
// count of set bits, flipping the value of least w x^2 when needed.
void split_signs(const float* x, const float* w, bool even_parity, uint8_t* signs, float* t) {
    for (int g = 0; g < 32; ++g) {
        const float* xg = x + 8 * g;
        uint8_t s = 0;
        for (int j = 0; j < 8; ++j)
            if (std::signbit(xg[j])) s |= static_cast<uint8_t>(1 << j);
        if (even_parity && std::popcount(s) % 2) {
            int least = 0;
            for (int j = 1; j < 8; ++j)
                if (w[8 * g + j] * xg[j] * xg[j] < w[8 * g + least] * xg[least] * xg[least]) least = j;
            s ^= static_cast<uint8_t>(1 << least);
        }
        signs[g] = s;
        for (int j = 0; j < 8; ++j) t[8 * g + j] = (s >> j) & 1 ? -xg[j] : xg[j];
    }
}

// The entries of n targets (groups of the grid's width) at scale s > 0, and the least-squares scale for them:
// returns the gain (sum w t g)^2 / sum w g^2, by how much the fit lowers the weighted error sum w t^2.
float assign(const GridSearch& gs, const float* t, const float* w, int n, float s, uint16_t* idx,
             float& refit) {
    double stg = 0, sgg = 0;
    for (int k = 0; k < n / gs.width(); ++k) {
        const int o = k * gs.width();
        idx[k] = static_cast<uint16_t>(gs.nearest(t + o, w + o, s));
        const float* g = gs.magnitudes(idx[k]);
        for (int j = 0; j < gs.width(); ++j) {
            stg += static_cast<double>(w[o + j]) * t[o + j] * g[j];
            sgg += static_cast<double>(w[o + j]) * g[j] * g[j];
        }
    }
    refit = sgg > 0 ? static_cast<float>(stg / sgg) : 0.f;
    return sgg > 0 && stg > 0 ? static_cast<float>(stg * stg / sgg) : 0.f;
}

// The scale (>= 0) of n targets: candidates put the largest target at the top level times a factor in
// [0.76, 1.24], each assigned and refitted; the best is then refitted twice more.
float fit_scale(const GridSearch& gs, const float* t, const float* w, int n) {
    float tmax = 0;
    for (int j = 0; j < n; ++j) tmax = std::max(tmax, t[j]);
    if (!(tmax > 1e-30f) || !std::isfinite(tmax)) return 0;
    uint16_t idx[32];
    float best = 0, best_gain = 0, refit = 0;
    for (int k = -6; k <= 6; ++k) {
        const float s = tmax / (gs.top() * (1.f + 0.04f * static_cast<float>(k)));
        const float gain = assign(gs, t, w, n, s, idx, refit);
        if (gain > best_gain && refit > 0) best_gain = gain, best = refit;
    }
    for (int it = 0; it < 2 && best > 0; ++it) {
        const float gain = assign(gs, t, w, n, best, idx, refit);
        if (!(gain > best_gain) || !(refit > 0)) break;
        best_gain = gain, best = refit;
    }
    return best;
}

// A 4-bit sub-block scale as stored: db = d * (a + b q), q in [0, 15].
struct ScaleCode {
    float a, b;
    // The block's d for the largest sub-block scale.
    float d_for(float smax) const { return smax / (a + 15 * b); }
    int code(float s, float d) const {
        return d > 0 ? std::clamp(static_cast<int>(std::lrintf((s / d - a) / b)), 0, 15) : 0;
    }
    float scale(float d, int q) const { return d * (a + b * static_cast<float>(q)); }
};

// One block of 256 values: signs, the sub-block scale codes (sub values each) and the grid entries (one per
// width values) for the scales as stored; returns the block's fp16 d.
struct IqBlock {
    uint8_t signs[32];
    uint8_t q[16];
    uint16_t idx[64];
    uint16_t d;
};

IqBlock quant_block(const GridSearch& gs, ScaleCode sc, int sub, bool even_parity, const float* x,
                    const float* importance) {
    float w[256], t[256], s[16];
    IqBlock b{};
    value_weights(x, importance, 256, w);
    split_signs(x, w, even_parity, b.signs, t);
    float smax = 0;
    for (int k = 0; k < 256 / sub; ++k)
        smax = std::max(smax, s[k] = fit_scale(gs, t + k * sub, w + k * sub, sub));
    b.d = f32_to_f16(sc.d_for(smax));
    const float d = f16_to_f32(b.d);
    for (int k = 0; k < 256 / sub; ++k) {
        b.q[k] = static_cast<uint8_t>(sc.code(s[k], d));
        const float db = sc.scale(d, b.q[k]);
        float refit = 0;
        if (db > 0) assign(gs, t + k * sub, w + k * sub, sub, db, b.idx + k * sub / gs.width(), refit);
    }
    return b;
}

template <class Block, class Pack>
void quant_iq(const GridSearch& gs, ScaleCode sc, int sub, bool even_parity, const float* x,
              const float* importance, void* blocks, int64_t nb, Pack pack) {
    auto* out = static_cast<Block*>(blocks);
    for (int64_t i = 0; i < nb; ++i, x += 256, importance = importance ? importance + 256 : nullptr) {
        std::memset(&out[i], 0, sizeof out[i]);
        pack(quant_block(gs, sc, sub, even_parity, x, importance), out[i]);
    }
}

constexpr ScaleCode kIq2Scale{0.125f, 0.25f};   // d * (0.5 + q) * 0.25
constexpr ScaleCode kIq3xxsScale{0.25f, 0.5f};  // d * (0.5 + q) * 0.5
constexpr ScaleCode kIq3sScale{1.f, 2.f};       // d * (1 + 2q)

}  // namespace

// IQ2_XXS: per 32 values 4 entry bytes, then a u32 of 4 x 7-bit sign indices and the 4-bit scale (bits 28+).
void quant_iq2_xxs(const float* x, const float* importance, void* blocks, int64_t nb) {
    quant_iq<BlockIQ2_XXS>(iq2xxs_grid(), kIq2Scale, 32, true, x, importance, blocks, nb,
                           [](const IqBlock& b, BlockIQ2_XXS& o) {
                               o.d = b.d;
                               for (int ib = 0; ib < 8; ++ib) {
                                   uint32_t aux = static_cast<uint32_t>(b.q[ib]) << 28;
                                   for (int l = 0; l < 4; ++l) {
                                       o.qs[8 * ib + l] = static_cast<uint8_t>(b.idx[4 * ib + l]);
                                       aux |= static_cast<uint32_t>(b.signs[4 * ib + l] & 127) << (7 * l);
                                   }
                                   std::memcpy(o.qs + 8 * ib + 4, &aux, 4);
                               }
                           });
}

// IQ2_XS: per 8 values a u16 entry | 7-bit sign index << 9; a 4-bit scale per 16 values.
void quant_iq2_xs(const float* x, const float* importance, void* blocks, int64_t nb) {
    quant_iq<BlockIQ2_XS>(iq2xs_grid(), kIq2Scale, 16, true, x, importance, blocks, nb,
                          [](const IqBlock& b, BlockIQ2_XS& o) {
                              o.d = b.d;
                              for (int g = 0; g < 32; ++g)
                                  o.qs[g] = static_cast<uint16_t>(b.idx[g] | (b.signs[g] & 127) << 9);
                              for (int k = 0; k < 16; ++k)
                                  o.scales[k / 2] |= static_cast<uint8_t>(b.q[k] << 4 * (k % 2));
                          });
}

// IQ2_S: per 8 values the entry's low 8 bits, its high 2 in qh, 8 sign bits; a 4-bit scale per 16 values.
void quant_iq2_s(const float* x, const float* importance, void* blocks, int64_t nb) {
    quant_iq<BlockIQ2_S>(iq2s_grid(), kIq2Scale, 16, false, x, importance, blocks, nb,
                         [](const IqBlock& b, BlockIQ2_S& o) {
                             o.d = b.d;
                             for (int g = 0; g < 32; ++g) {
                                 o.qs[g] = static_cast<uint8_t>(b.idx[g]);
                                 o.qh[g / 4] |= static_cast<uint8_t>((b.idx[g] >> 8) << 2 * (g % 4));
                                 o.signs[g] = b.signs[g];
                             }
                             for (int k = 0; k < 16; ++k)
                                 o.scales[k / 2] |= static_cast<uint8_t>(b.q[k] << 4 * (k % 2));
                         });
}

// IQ3_XXS: one entry byte per 4 values; per 32 values a u32 of 4 x 7-bit sign indices and the 4-bit scale.
void quant_iq3_xxs(const float* x, const float* importance, void* blocks, int64_t nb) {
    quant_iq<BlockIQ3_XXS>(iq3xxs_grid(), kIq3xxsScale, 32, true, x, importance, blocks, nb,
                           [](const IqBlock& b, BlockIQ3_XXS& o) {
                               o.d = b.d;
                               for (int n = 0; n < 64; ++n) o.qs[n] = static_cast<uint8_t>(b.idx[n]);
                               for (int ib = 0; ib < 8; ++ib) {
                                   uint32_t aux = static_cast<uint32_t>(b.q[ib]) << 28;
                                   for (int l = 0; l < 4; ++l)
                                       aux |= static_cast<uint32_t>(b.signs[4 * ib + l] & 127) << (7 * l);
                                   std::memcpy(o.scales_signs + 4 * ib, &aux, 4);
                               }
                           });
}

// IQ3_S: per 4 values the entry's low 8 bits, its 9th in qh; 8 sign bits per 8 values; a 4-bit scale per 32.
void quant_iq3_s(const float* x, const float* importance, void* blocks, int64_t nb) {
    quant_iq<BlockIQ3_S>(iq3s_grid(), kIq3sScale, 32, false, x, importance, blocks, nb,
                         [](const IqBlock& b, BlockIQ3_S& o) {
                             o.d = b.d;
                             for (int n = 0; n < 64; ++n) {
                                 o.qs[n] = static_cast<uint8_t>(b.idx[n]);
                                 o.qh[n / 8] |= static_cast<uint8_t>((b.idx[n] >> 8) << (n % 8));
                             }
                             std::memcpy(o.signs, b.signs, 32);
                             for (int k = 0; k < 8; ++k)
                                 o.scales[k / 2] |= static_cast<uint8_t>(b.q[k] << 4 * (k % 2));
                         });
}

}  // namespace clef::quant_detail
