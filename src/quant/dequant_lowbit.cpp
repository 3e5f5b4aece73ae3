#include "quant/dequant_lowbit.h"

#include <cstring>

#include "ops/iq_groups.h"
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
using ops::kIq4nlValues;

// Eight values db * magnitude_j, negated where bit j of signs is set. ggml writes the product with -1, which
// the compiler turns into this negation: the same bits for every number, NaN's sign flipped.
void put8(float* y, const ops::IqGroup& q) {
    for (int j = 0; j < 8; ++j) {
        const float v = q.db * static_cast<float>(q.mags[j]);
        y[j] = (q.signs >> j) & 1 ? -v : v;
    }
}

// Eight values dl * (level_j + delta) of an IQ1 group.
void put8(float* y, const ops::Iq1Group& q) {
    for (int j = 0; j < 8; ++j) y[j] = q.dl * (static_cast<float>(q.levels[j]) + q.delta);
}

// The 32 groups of 8 values of each of nb blocks of a grid i-quant (ops/iq_groups.h).
template <class Block, class Group>
void deq_groups(const void* blocks, float* y, int64_t nb, Group group) {
    const auto* b = static_cast<const Block*>(blocks);
    for (int64_t i = 0; i < nb; ++i)
        for (int g = 0; g < 32; ++g, y += 8) put8(y, group(b[i], g));
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

// The grid i-quants, one group of 8 at a time (ops/iq_groups.h says how each block is read).
void deq_iq2_xxs(const void* blocks, float* y, int64_t nb) {
    deq_groups<BlockIQ2_XXS>(blocks, y, nb, ops::iq2_xxs_group);
}
void deq_iq2_xs(const void* blocks, float* y, int64_t nb) {
    deq_groups<BlockIQ2_XS>(blocks, y, nb, ops::iq2_xs_group);
}
void deq_iq2_s(const void* blocks, float* y, int64_t nb) {
    deq_groups<BlockIQ2_S>(blocks, y, nb, ops::iq2_s_group);
}
void deq_iq3_xxs(const void* blocks, float* y, int64_t nb) {
    deq_groups<BlockIQ3_XXS>(blocks, y, nb, ops::iq3_xxs_group);
}
void deq_iq3_s(const void* blocks, float* y, int64_t nb) {
    deq_groups<BlockIQ3_S>(blocks, y, nb, ops::iq3_s_group);
}
void deq_iq1_s(const void* blocks, float* y, int64_t nb) {
    deq_groups<BlockIQ1_S>(blocks, y, nb, ops::iq1_s_group);
}
void deq_iq1_m(const void* blocks, float* y, int64_t nb) {
    deq_groups<BlockIQ1_M>(blocks, y, nb, ops::iq1_m_group);
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
