// Highway dequantisers of the ggml block types (ops/quant_blocks.h), compiled per target and dispatched at
// run time. They compute exactly what quant/quant.cpp's scalar loops compute: every product and difference
// rounded separately (this file is built with -ffp-contract=off), so a tensor dequantises to the same bits on
// every CPU; tests/test_quant.cpp compares them on every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/dequant_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/cpu.h"
#include "ops/iq_groups.h"
#include "ops/quant_blocks.h"
#include "ops/simd.h"
#include "util/half.h"

HWY_BEFORE_NAMESPACE();
namespace clef::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;

template <class D>
HWY_INLINE void store(D df, hn::Vec<D> v, float* y) {
    hn::StoreU(v, df, y);
}

// util/half.h's f32_to_bf16 on every lane: round to nearest even, NaN kept a NaN (quiet bit set).
template <class D>
HWY_INLINE void store(D df, hn::Vec<D> v, uint16_t* y) {
    const hn::RebindToUnsigned<D> du;
    const hn::RebindToSigned<D> di;
    const hn::Rebind<uint16_t, D> d16;
    const auto u = hn::BitCast(du, v);
    const auto hi = hn::ShiftRight<16>(u);
    const auto lsb = hn::And(hi, hn::Set(du, 1u));
    const auto r = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), lsb));
    const auto mag = hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu)));
    const auto nan = hn::RebindMask(du, hn::Gt(mag, hn::Set(di, 0x7f800000)));
    const auto out = hn::IfThenElse(nan, hn::Or(hi, hn::Set(du, 0x40u)), r);
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, out)), d16, y);
    (void)df;
}

// N unsigned bytes as 32-bit lanes.
HWY_INLINE hn::Vec<DI> load_u8(const uint8_t* p) {
    const DI di;
    const hn::Rebind<uint8_t, DI> d8;
    return hn::BitCast(di, hn::PromoteTo(DU(), hn::LoadU(d8, p)));
}

// d * l - m on N integer levels.
HWY_INLINE hn::Vec<DF> scale_sub(hn::Vec<DI> l, float d, float m) {
    const DF df;
    return hn::Sub(hn::Mul(hn::Set(df, d), hn::ConvertTo(df, l)), hn::Set(df, m));
}

template <class Out>
void q8_0(const BlockQ8_0* b, Out* y, int64_t nb) {
    const DF df;
    const DI di;
    const hn::Rebind<int8_t, DI> d8;
    const int N = static_cast<int>(hn::Lanes(df));
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const auto d = hn::Set(df, f16_to_f32(b[i].d));
        for (int j = 0; j < kQK; j += N)
            store(df, hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, b[i].qs + j))), d), y + j);
    }
}

// Q4_K (kBits 4) and Q5_K (kBits 5): 64-value groups, low nibbles then high nibbles, Q5_K's fifth bit from
// qh.
template <int kBits, class Block, class Out>
void qk_minmax(const Block* b, Out* y, int64_t nb) {
    const DF df;
    const DI di;
    const int N = static_cast<int>(hn::Lanes(df));
    const auto nib = hn::Set(di, 0xF), sixteen = hn::Set(di, 16), zero = hn::Zero(di);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        const uint8_t* q = b[i].qs;
        for (int g = 0; g < 4; ++g, q += 32, y += 64) {
            int sc, m;
            scale_min_k4(2 * g, b[i].scales, sc, m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            scale_min_k4(2 * g + 1, b[i].scales, sc, m);
            const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
            for (int l = 0; l < 32; l += N) {
                const auto v = load_u8(q + l);
                auto lo = hn::And(v, nib), hi = hn::ShiftRight<4>(v);
                if constexpr (kBits == 5) {
                    const auto qh = load_u8(b[i].qh + l);
                    lo = hn::IfThenElse(hn::Eq(hn::And(qh, hn::Set(di, 1 << (2 * g))), zero), lo,
                                        hn::Add(lo, sixteen));
                    hi = hn::IfThenElse(hn::Eq(hn::And(qh, hn::Set(di, 2 << (2 * g))), zero), hi,
                                        hn::Add(hi, sixteen));
                }
                store(df, scale_sub(lo, d1, m1), y + l);
                store(df, scale_sub(hi, d2, m2), y + 32 + l);
            }
        }
    }
}

template <class Out>
void q6_k(const BlockQ6_K* b, Out* y, int64_t nb) {
    const DF df;
    const DI di;
    const int N = static_cast<int>(hn::Lanes(df));
    const auto nib = hn::Set(di, 0xF), three = hn::Set(di, 3), off = hn::Set(di, 32);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        const uint8_t* ql = b[i].ql;
        const uint8_t* qh = b[i].qh;
        const int8_t* sc = b[i].scales;
        for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l += N) {  // sub-block scale index l / 16
                const int is = l / 16;
                const auto a = load_u8(ql + l), c = load_u8(ql + 32 + l), hb = load_u8(qh + l);
                // Levels of y[32 * j + l, ...) in q<j>: named, not an array (SVE, see ops/named_vectors.h).
                const auto q0 = hn::Or(hn::And(a, nib), hn::ShiftLeft<4>(hn::And(hb, three)));
                const auto q1 =
                    hn::Or(hn::And(c, nib), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), three)));
                const auto q2 =
                    hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), three)));
                const auto q3 =
                    hn::Or(hn::ShiftRight<4>(c), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<6>(hb), three)));
#define CLEF_STORE(j)                                                                  \
    {                                                                                  \
        const auto ds = hn::Set(df, d * static_cast<float>(sc[is + 2 * j]));           \
        store(df, hn::Mul(ds, hn::ConvertTo(df, hn::Sub(q##j, off))), y + 32 * j + l); \
    }
                // (d * scale) * level, ggml's order
                CLEF_STORE(0) CLEF_STORE(1) CLEF_STORE(2) CLEF_STORE(3)
#undef CLEF_STORE
            }
        }
    }
}

// Q2_K: 16 sub-blocks of 16 (quant/dequant_lowbit.cpp's layout): dl * level - ml.
template <class Out>
void q2_k(const BlockQ2_K* b, Out* y, int64_t nb) {
    const DF df;
    const DI di;
    const int N = static_cast<int>(hn::Lanes(df));
    const auto three = hn::Set(di, 3);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int k = 0; k < 16; ++k, y += 16) {
            const int h = k / 8, s = (k / 2) % 4, p = k % 2;
            const float dl = d * static_cast<float>(b[i].scales[k] & 0xF);
            const float ml = dmin * static_cast<float>(b[i].scales[k] >> 4);
            for (int l = 0; l < 16; l += N) {
                const auto q =
                    hn::And(hn::ShiftRightSame(load_u8(b[i].qs + 32 * h + 16 * p + l), 2 * s), three);
                store(df, scale_sub(q, dl, ml), y + l);
            }
        }
    }
}

// Q3_K: as Q2_K, level = 2-bit field - (hmask bit set ? 0 : 4), times dl = d * (scale - 32).
template <class Out>
void q3_k(const BlockQ3_K* b, Out* y, int64_t nb) {
    const DF df;
    const DI di;
    const int N = static_cast<int>(hn::Lanes(df));
    const auto three = hn::Set(di, 3), four = hn::Set(di, 4), zero = hn::Zero(di);
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int k = 0; k < 16; ++k, y += 16) {
            const int h = k / 8, s = (k / 2) % 4, p = k % 2;
            const int sc = ((b[i].scales[k % 8] >> (4 * (k / 8))) & 0xF) |
                           (((b[i].scales[8 + k % 4] >> (2 * (k / 4))) & 3) << 4);
            const auto dl = hn::Set(df, d * static_cast<float>(sc - 32));
            const auto hbit = hn::Set(di, 1 << (4 * h + s));
            for (int l = 0; l < 16; l += N) {
                const auto q =
                    hn::And(hn::ShiftRightSame(load_u8(b[i].qs + 32 * h + 16 * p + l), 2 * s), three);
                const auto high = hn::Eq(hn::And(load_u8(b[i].hmask + 16 * p + l), hbit), zero);
                store(df, hn::Mul(dl, hn::ConvertTo(df, hn::IfThenElse(high, hn::Sub(q, four), q))), y + l);
            }
        }
    }
}

// 32 IQ4 values: dl * kIq4nlValues[nibble], value j < 16 the low nibble of q[j], j + 16 the high one.
template <class Out>
HWY_INLINE void iq4_32(const uint8_t* q, float dl, Out* y) {
    const DF df;
    const DI di;
    const hn::Rebind<int8_t, DI> d8;
    const int N = static_cast<int>(hn::Lanes(df));
    const hn::CappedTag<int8_t, 16> d16;  // one table lookup per 16 nibbles (HWY_SCALAR: one lane, by hand)
    const hn::RebindToUnsigned<decltype(d16)> du16;
    int8_t levels[32];
    if (hn::Lanes(d16) == 16) {
        const auto table = hn::LoadU(d16, kIq4nlValues);
        const auto v = hn::LoadU(du16, q);
        hn::StoreU(hn::TableLookupBytes(table, hn::BitCast(d16, hn::And(v, hn::Set(du16, 0xF)))), d16,
                   levels);
        hn::StoreU(hn::TableLookupBytes(table, hn::BitCast(d16, hn::ShiftRight<4>(v))), d16, levels + 16);
    } else {
        for (int j = 0; j < 16; ++j)
            levels[j] = kIq4nlValues[q[j] & 0xF], levels[j + 16] = kIq4nlValues[q[j] >> 4];
    }
    const auto vdl = hn::Set(df, dl);
    for (int j = 0; j < 32; j += N)
        store(df, hn::Mul(vdl, hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, levels + j)))), y + j);
}

template <class Out>
void iq4_nl(const BlockIQ4_NL* b, Out* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) iq4_32(b[i].qs, f16_to_f32(b[i].d), y);
}

template <class Out>
void iq4_xs(const BlockIQ4_XS* b, Out* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int ib = 0; ib < 8; ++ib, y += 32) {
            const int s =
                ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b[i].scales_h >> (2 * ib)) & 3) << 4);
            iq4_32(b[i].qs + 16 * ib, d * static_cast<float>(s - 32), y);
        }
    }
}

// The grid i-quants, a group of 8 at a time (ops/iq_groups.h), in lanes of at most 8.
using D8 = hn::CappedTag<float, 8>;

template <class Out>
HWY_INLINE void put8(const IqGroup& q, Out* y) {
    const D8 df;
    const hn::RebindToSigned<D8> di;
    const hn::Rebind<uint8_t, D8> d8;
    const int N = static_cast<int>(hn::Lanes(df));
    const auto bit = hn::Shl(hn::Set(di, 1), hn::Iota(di, 0)), zero = hn::Zero(di);
    const auto db = hn::Set(df, q.db);
    for (int j = 0; j < 8; j += N) {
        const auto mag = hn::ConvertTo(
            df, hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<D8>(), hn::LoadU(d8, q.mags + j))));
        const auto v = hn::Mul(db, mag);
        const auto positive = hn::RebindMask(df, hn::Eq(hn::And(hn::Set(di, q.signs >> j), bit), zero));
        store(df, hn::IfThenElse(positive, v, hn::Neg(v)), y + j);
    }
}

template <class Out>
HWY_INLINE void put8(const Iq1Group& q, Out* y) {
    const D8 df;
    const hn::RebindToSigned<D8> di;
    const hn::Rebind<int8_t, D8> d8;
    const int N = static_cast<int>(hn::Lanes(df));
    const auto dl = hn::Set(df, q.dl), delta = hn::Set(df, q.delta);
    for (int j = 0; j < 8; j += N)
        store(df,
              hn::Mul(dl, hn::Add(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q.levels + j))), delta)),
              y + j);
}

template <class Block, class Out, class Group>
void grid(const void* p, Out* y, int64_t nb, Group group) {
    const auto* b = static_cast<const Block*>(p);
    for (int64_t i = 0; i < nb; ++i)
        for (int g = 0; g < 32; ++g, y += 8) put8(group(b[i], g), y);
}

template <class Out>
void blocks(DequantType t, const void* p, int64_t nb, Out* y) {
    switch (t) {
        case DequantType::Q8_0:
            return q8_0(static_cast<const BlockQ8_0*>(p), y, nb);
        case DequantType::Q4_K:
            return qk_minmax<4>(static_cast<const BlockQ4_K*>(p), y, nb);
        case DequantType::Q5_K:
            return qk_minmax<5>(static_cast<const BlockQ5_K*>(p), y, nb);
        case DequantType::Q6_K:
            return q6_k(static_cast<const BlockQ6_K*>(p), y, nb);
        case DequantType::Q2_K:
            return q2_k(static_cast<const BlockQ2_K*>(p), y, nb);
        case DequantType::Q3_K:
            return q3_k(static_cast<const BlockQ3_K*>(p), y, nb);
        case DequantType::IQ4_NL:
            return iq4_nl(static_cast<const BlockIQ4_NL*>(p), y, nb);
        case DequantType::IQ4_XS:
            return iq4_xs(static_cast<const BlockIQ4_XS*>(p), y, nb);
        case DequantType::IQ2_XXS:
            return grid<BlockIQ2_XXS>(p, y, nb, iq2_xxs_group);
        case DequantType::IQ2_XS:
            return grid<BlockIQ2_XS>(p, y, nb, iq2_xs_group);
        case DequantType::IQ2_S:
            return grid<BlockIQ2_S>(p, y, nb, iq2_s_group);
        case DequantType::IQ3_XXS:
            return grid<BlockIQ3_XXS>(p, y, nb, iq3_xxs_group);
        case DequantType::IQ3_S:
            return grid<BlockIQ3_S>(p, y, nb, iq3_s_group);
        case DequantType::IQ1_S:
            return grid<BlockIQ1_S>(p, y, nb, iq1_s_group);
        case DequantType::IQ1_M:
            return grid<BlockIQ1_M>(p, y, nb, iq1_m_group);
    }
}

void DequantF32(DequantType t, const void* p, int64_t nb, float* y) {
    note_target(KernelFamily::Dequant, HWY_TARGET);
    blocks(t, p, nb, y);
}
void DequantBf16(DequantType t, const void* p, int64_t nb, uint16_t* y) {
    note_target(KernelFamily::Dequant, HWY_TARGET);
    blocks(t, p, nb, y);
}

}  // namespace HWY_NAMESPACE
}  // namespace clef::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace clef::ops {

HWY_EXPORT(DequantF32);
HWY_EXPORT(DequantBf16);

// CLEF_MAX_ISA reaches Highway before the first dispatch (see simd_kernels.cpp): applied when the program
// starts.
[[maybe_unused]] const bool kIsaCapApplied = (cpu_features(), true);

void dequant_blocks(DequantType t, const void* blocks, int64_t nb, float* out) {
    HWY_DYNAMIC_DISPATCH(DequantF32)(t, blocks, nb, out);
}

void dequant_blocks(DequantType t, const void* blocks, int64_t nb, uint16_t* bf16_out) {
    HWY_DYNAMIC_DISPATCH(DequantBf16)(t, blocks, nb, bf16_out);
}

}  // namespace clef::ops
#endif  // HWY_ONCE
