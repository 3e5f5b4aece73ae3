#include "quant/dequant_lowbit.h"

#include <cstring>

#include "ops/iq_tables.h"
#include "ops/quant_blocks.h"
#include "util/half.h"

namespace clef::quant_detail {

namespace {

using ops::BlockIQ1_M;
using ops::BlockIQ1_S;
using ops::BlockIQ2_S;
using ops::BlockIQ2_XS;
using ops::BlockIQ2_XXS;
using ops::BlockIQ3_S;
using ops::BlockIQ3_XXS;
using ops::BlockIQ4_NL;
using ops::BlockIQ4_XS;
using ops::BlockQ2_K;
using ops::BlockQ3_K;
using ops::kIq1Delta;
using ops::kIq4nlValues;

uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// Byte j of a grid entry (a magnitude) as fp32.
float magnitude(uint64_t entry, int j) {
    return static_cast<float>((entry >> (8 * j)) & 0xFF);
}

// Eight values db * magnitude_j * (bit j of signs ? -1 : 1): ggml multiplies by the sign, so do we (the same
// bits for NaN as well).
void put8(float* y, float db, uint64_t entry, uint8_t signs) {
    for (int j = 0; j < 8; ++j) y[j] = db * magnitude(entry, j) * ((signs >> j) & 1 ? -1.f : 1.f);
}

// Eight values dl * (level_j + delta) of an IQ1 grid entry (levels int8 -1, 0, 1).
void put8_iq1(float* y, float dl, uint64_t entry, float delta) {
    for (int j = 0; j < 8; ++j)
        y[j] = dl * (static_cast<float>(static_cast<int8_t>(entry >> (8 * j))) + delta);
}

// The 4-bit IQ2 scale s as a factor: d * (0.5 + s) * 0.25.
float iq2_scale(float d, int s) {
    return d * (0.5f + static_cast<float>(s)) * 0.25f;
}

}  // namespace

// Q2_K: 16 sub-blocks of 16; sub-block k = 8h + 2s + p (h: 128-value half, s: 2-bit shift, p: 16-value part),
// value l = d * (sc & 15) * ((qs[32h + 16p + l] >> 2s) & 3) - dmin * (sc >> 4), sc = scales[k].
void deq_q2_k(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockQ2_K*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int k = 0; k < 16; ++k, y += 16) {
            const int h = k / 8, s = (k / 2) % 4, p = k % 2;
            const float dl = d * static_cast<float>(b[i].scales[k] & 0xF);
            const float ml = dmin * static_cast<float>(b[i].scales[k] >> 4);
            const uint8_t* q = b[i].qs + 32 * h + 16 * p;
            for (int l = 0; l < 16; ++l) y[l] = dl * static_cast<float>((q[l] >> (2 * s)) & 3) - ml;
        }
    }
}

// Q3_K: sub-blocks as Q2_K; value l = d * (sc - 32) * (q - (hmask[16p + l] has bit 4h + s ? 0 : 4)), q the
// 2-bit field as Q2_K; 6-bit sc: low 4 bits from nibble k / 8 of scales[k % 8], high 2 from bits 2 (k / 4) of
// scales[8 + k % 4].
void deq_q3_k(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockQ3_K*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int k = 0; k < 16; ++k, y += 16) {
            const int h = k / 8, s = (k / 2) % 4, p = k % 2;
            const int sc = ((b[i].scales[k % 8] >> (4 * (k / 8))) & 0xF) |
                           (((b[i].scales[8 + k % 4] >> (2 * (k / 4))) & 3) << 4);
            const float dl = d * static_cast<float>(sc - 32);
            const uint8_t* q = b[i].qs + 32 * h + 16 * p;
            const uint8_t* hm = b[i].hmask + 16 * p;
            const int hbit = 1 << (4 * h + s);
            for (int l = 0; l < 16; ++l)
                y[l] = dl * static_cast<float>(((q[l] >> (2 * s)) & 3) - ((hm[l] & hbit) ? 0 : 4));
        }
    }
}

// IQ2_XXS: per 32 values 8 bytes: 4 grid indices (one per 8 values), then a u32 holding 4 x 7-bit sign
// indices (bits 7l) and a 4-bit scale s (bits 28..31); x = d * (0.5 + s) * 0.25 * grid byte * sign.
void deq_iq2_xxs(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ2_XXS*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int ib = 0; ib < 8; ++ib) {
            const uint8_t* q = b[i].qs + 8 * ib;
            const uint32_t aux = load_u32(q + 4);
            const float db = iq2_scale(d, static_cast<int>(aux >> 28));
            for (int l = 0; l < 4; ++l, y += 8)
                put8(y, db, ops::kIq2xxsGrid[q[l]], ops::kIq2Signs[(aux >> (7 * l)) & 127]);
        }
    }
}

// IQ2_XS: per 8 values a u16 = 9-bit grid index | 7-bit sign index << 9; per 32 values a byte of two 4-bit
// scales (low nibble: first 16 values); x = d * (0.5 + s) * 0.25 * grid byte * sign.
void deq_iq2_xs(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ2_XS*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int g = 0; g < 32; ++g, y += 8) {
            const uint16_t q = b[i].qs[g];
            const float db = iq2_scale(d, (b[i].scales[g / 4] >> (4 * ((g % 4) / 2))) & 0xF);
            put8(y, db, ops::kIq2xsGrid[q & 511], ops::kIq2Signs[q >> 9]);
        }
    }
}

// IQ2_S: per 8 values (group g) grid index qs[g] | bits 2 (g % 4) of qh[g / 4] << 8, 8 sign bits signs[g];
// scales as IQ2_XS; x = d * (0.5 + s) * 0.25 * grid byte * sign.
void deq_iq2_s(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ2_S*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int g = 0; g < 32; ++g, y += 8) {
            const int idx = b[i].qs[g] | (((b[i].qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
            const float db = iq2_scale(d, (b[i].scales[g / 4] >> (4 * ((g % 4) / 2))) & 0xF);
            put8(y, db, ops::kIq2sGrid[idx], b[i].signs[g]);
        }
    }
}

// IQ3_XXS: one grid index (4 values) per byte of qs; per 32 values a u32 of 4 x 7-bit sign indices and a
// 4-bit scale s (bits 28..31); x = d * (0.5 + s) * 0.5 * grid byte * sign.
void deq_iq3_xxs(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ3_XXS*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int g = 0; g < 32; ++g, y += 8) {
            const uint32_t aux = load_u32(b[i].scales_signs + 4 * (g / 4));
            const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
            const uint64_t entry = ops::kIq3xxsGrid[b[i].qs[2 * g]] |
                                   static_cast<uint64_t>(ops::kIq3xxsGrid[b[i].qs[2 * g + 1]]) << 32;
            put8(y, db, entry, ops::kIq2Signs[(aux >> (7 * (g % 4))) & 127]);
        }
    }
}

// IQ3_S: grid index n (4 values) = qs[n] | bit n % 8 of qh[n / 8] << 8; one sign bit per value (signs[g],
// g = group of 8); a 4-bit scale s per 32 values (scales[ib / 2], low nibble for even ib);
// x = d * (1 + 2s) * grid byte * sign.
void deq_iq3_s(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ3_S*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        auto index = [&](int n) { return b[i].qs[n] | (((b[i].qh[n / 8] >> (n % 8)) & 1) << 8); };
        for (int g = 0; g < 32; ++g, y += 8) {
            const int ib = g / 4, s = (b[i].scales[ib / 2] >> (4 * (ib % 2))) & 0xF;
            const float db = d * static_cast<float>(1 + 2 * s);
            const uint64_t entry =
                ops::kIq3sGrid[index(2 * g)] | static_cast<uint64_t>(ops::kIq3sGrid[index(2 * g + 1)]) << 32;
            put8(y, db, entry, b[i].signs[g]);
        }
    }
}

// IQ1_S: per 32 values a u16 qh: 4 x 3 high index bits (bits 3l), a 3-bit scale s (bits 12..14) and the
// delta's sign (bit 15); per 8 values grid index qs[g] | high bits << 8; x = d * (2s + 1) * (level +- 0.125).
void deq_iq1_s(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ1_S*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int g = 0; g < 32; ++g, y += 8) {
            const uint16_t qh = b[i].qh[g / 4];
            const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
            put8_iq1(y, dl, ops::kIq1sGrid[b[i].qs[g] | (((qh >> (3 * (g % 4))) & 7) << 8)], delta);
        }
    }
}

// IQ1_M: per 8 values (group g) a nibble of qh[g / 2] (low nibble for even g): 3 high index bits and the
// delta's sign (bit 3); per 16 values a 3-bit scale s (bits 3 ((g / 2) % 4) of the u16 scales[g / 8]); the
// fp16 d is the top nibbles of the 4 scale u16s (first = lowest); x = d * (2s + 1) * (level +- 0.125).
void deq_iq1_m(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ1_M*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        uint16_t sc[4];
        for (int k = 0; k < 4; ++k) sc[k] = load_u16(b[i].scales + 2 * k);
        const float d = f16_to_f32(static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) |
                                                         ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)));
        for (int g = 0; g < 32; ++g, y += 8) {
            const int n = (b[i].qh[g / 2] >> (4 * (g % 2))) & 0xF;
            const float dl = d * static_cast<float>(2 * ((sc[g / 8] >> (3 * ((g / 2) % 4))) & 7) + 1);
            const float delta = n & 8 ? -kIq1Delta : kIq1Delta;
            put8_iq1(y, dl, ops::kIq1sGrid[b[i].qs[g] | ((n & 7) << 8)], delta);
        }
    }
}

// IQ4_NL: 32 values; x_j = d * kIq4nlValues[nibble] (j < 16: low nibble of qs[j], else high nibble of
// qs[j - 16]).
void deq_iq4_nl(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ4_NL*>(blocks);
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 16; ++j) {
            y[j] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] & 0xF]);
            y[j + 16] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] >> 4]);
        }
    }
}

// IQ4_XS: 8 groups of 32 in IQ4_NL's nibble order, each with a 6-bit scale s (low 4 bits: nibble ib % 2 of
// scales_l[ib / 2], high 2: bits 2ib of scales_h); x = d * (s - 32) * kIq4nlValues[nibble].
void deq_iq4_xs(const void* blocks, float* y, int64_t nb) {
    const auto* b = static_cast<const BlockIQ4_XS*>(blocks);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        const uint16_t scales_h = b[i].scales_h;
        for (int ib = 0; ib < 8; ++ib, y += 32) {
            const int s =
                ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * static_cast<float>(s - 32);
            const uint8_t* q = b[i].qs + 16 * ib;
            for (int j = 0; j < 16; ++j) {
                y[j] = dl * static_cast<float>(kIq4nlValues[q[j] & 0xF]);
                y[j + 16] = dl * static_cast<float>(kIq4nlValues[q[j] >> 4]);
            }
        }
    }
}

}  // namespace clef::quant_detail
