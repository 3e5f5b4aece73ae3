// The grid i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) decoded one group of 8 values at
// a time: what the scalar references (quant/dequant_lowbit.cpp) and the vector kernels
// (ops/dequant_kernels.cpp) share, so both read a block the same way and compute the same fp32 scale (both
// files are built without fused multiply-adds). Block layouts: ops/quant_blocks.h; grids: ops/iq_tables.h.
//
//   IQ2 / IQ3 group g (0..31) of a block: x_j = db * mags[j] * (bit j of signs ? -1 : 1)
//   IQ1 group g:                           x_j = dl * (levels[j] + delta)
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "ops/iq_tables.h"
#include "ops/quant_blocks.h"
#include "util/half.h"

namespace clef::ops {

static_assert(std::endian::native == std::endian::little, "grid entries are read as bytes in memory order");

struct IqGroup {
    float db;
    uint8_t mags[8];
    uint8_t signs;
};

struct Iq1Group {
    float dl;
    int8_t levels[8];
    float delta;
};

namespace iq_detail {

inline uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The 4-bit IQ2 scale s as a factor: d * (0.5 + s) * 0.25.
inline float iq2_scale(float d, int s) {
    return d * (0.5f + static_cast<float>(s)) * 0.25f;
}

// The 4-bit scale of group g of IQ2_XS / IQ2_S (one per 16 values: scales[g / 4], low nibble first).
inline int iq2_scale_code(const uint8_t* scales, int g) {
    return (scales[g / 4] >> (4 * ((g % 4) / 2))) & 0xF;
}

inline void put_mags(IqGroup& q, const void* entry, int bytes, int at) {
    std::memcpy(q.mags + at, entry, static_cast<size_t>(bytes));
}

}  // namespace iq_detail

// IQ2_XXS: per 32 values 4 grid indices, then a u32 of 4 x 7-bit sign indices and the 4-bit scale (bits 28+).
inline IqGroup iq2_xxs_group(const BlockIQ2_XXS& b, int g) {
    const uint8_t* q = b.qs + 8 * (g / 4);
    const uint32_t aux = iq_detail::load_u32(q + 4);
    IqGroup r{iq_detail::iq2_scale(f16_to_f32(b.d), static_cast<int>(aux >> 28)), {}, 0};
    iq_detail::put_mags(r, &kIq2xxsGrid[q[g % 4]], 8, 0);
    r.signs = kIq2Signs[(aux >> (7 * (g % 4))) & 127];
    return r;
}

// IQ2_XS: per 8 values a u16 = 9-bit grid index | 7-bit sign index << 9.
inline IqGroup iq2_xs_group(const BlockIQ2_XS& b, int g) {
    const uint16_t q = b.qs[g];
    IqGroup r{
        iq_detail::iq2_scale(f16_to_f32(b.d), iq_detail::iq2_scale_code(b.scales, g)), {}, kIq2Signs[q >> 9]};
    iq_detail::put_mags(r, &kIq2xsGrid[q & 511], 8, 0);
    return r;
}

// IQ2_S: grid index qs[g] | bits 2 (g % 4) of qh[g / 4] << 8, 8 sign bits signs[g].
inline IqGroup iq2_s_group(const BlockIQ2_S& b, int g) {
    const int idx = b.qs[g] | (((b.qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
    IqGroup r{iq_detail::iq2_scale(f16_to_f32(b.d), iq_detail::iq2_scale_code(b.scales, g)), {}, b.signs[g]};
    iq_detail::put_mags(r, &kIq2sGrid[idx], 8, 0);
    return r;
}

// IQ3_XXS: two grid indices (4 values each) per group; per 32 values a u32 of 4 x 7-bit sign indices and the
// 4-bit scale s: db = d * (0.5 + s) * 0.5.
inline IqGroup iq3_xxs_group(const BlockIQ3_XXS& b, int g) {
    const uint32_t aux = iq_detail::load_u32(b.scales_signs + 4 * (g / 4));
    IqGroup r{f16_to_f32(b.d) * (0.5f + static_cast<float>(aux >> 28)) * 0.5f,
              {},
              kIq2Signs[(aux >> (7 * (g % 4))) & 127]};
    iq_detail::put_mags(r, &kIq3xxsGrid[b.qs[2 * g]], 4, 0);
    iq_detail::put_mags(r, &kIq3xxsGrid[b.qs[2 * g + 1]], 4, 4);
    return r;
}

// IQ3_S: grid index n = qs[n] | bit n % 8 of qh[n / 8] << 8; a 4-bit scale s per 32 values (scales[ib / 2],
// low nibble for even ib): db = d * (1 + 2s).
inline IqGroup iq3_s_group(const BlockIQ3_S& b, int g) {
    auto index = [&](int n) { return b.qs[n] | (((b.qh[n / 8] >> (n % 8)) & 1) << 8); };
    const int ib = g / 4, s = (b.scales[ib / 2] >> (4 * (ib % 2))) & 0xF;
    IqGroup r{f16_to_f32(b.d) * static_cast<float>(1 + 2 * s), {}, b.signs[g]};
    iq_detail::put_mags(r, &kIq3sGrid[index(2 * g)], 4, 0);
    iq_detail::put_mags(r, &kIq3sGrid[index(2 * g + 1)], 4, 4);
    return r;
}

// IQ1_S: per 32 values a u16 qh: 4 x 3 high index bits (bits 3l), a 3-bit scale s (bits 12..14) and the
// delta's sign (bit 15); dl = d * (2s + 1).
inline Iq1Group iq1_s_group(const BlockIQ1_S& b, int g) {
    const uint16_t qh = b.qh[g / 4];
    Iq1Group r{f16_to_f32(b.d) * static_cast<float>(2 * ((qh >> 12) & 7) + 1),
               {},
               qh & 0x8000 ? -kIq1Delta : kIq1Delta};
    std::memcpy(r.levels, &kIq1sGrid[b.qs[g] | (((qh >> (3 * (g % 4))) & 7) << 8)], 8);
    return r;
}

// IQ1_M: per 8 values a nibble of qh[g / 2] (low for even g): 3 high index bits and the delta's sign (bit 3);
// per 16 values a 3-bit scale s (bits 3 ((g / 2) % 4) of the u16 scales[g / 8]); the fp16 d is the top
// nibbles of the 4 scale u16s (first = lowest); dl = d * (2s + 1).
inline Iq1Group iq1_m_group(const BlockIQ1_M& b, int g) {
    uint16_t sc[4];
    std::memcpy(sc, b.scales, 8);
    const float d = f16_to_f32(static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) |
                                                     ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)));
    const int n = (b.qh[g / 2] >> (4 * (g % 2))) & 0xF;
    Iq1Group r{d * static_cast<float>(2 * ((sc[g / 8] >> (3 * ((g / 2) % 4))) & 7) + 1),
               {},
               n & 8 ? -kIq1Delta : kIq1Delta};
    std::memcpy(r.levels, &kIq1sGrid[b.qs[g] | ((n & 7) << 8)], 8);
    return r;
}

}  // namespace clef::ops
