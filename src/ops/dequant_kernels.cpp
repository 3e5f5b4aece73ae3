// Highway dequantisers of the ggml block types (ops/quant_blocks.h), compiled per target and dispatched at
// run time. They compute exactly what quant/quant.cpp's scalar loops compute: every product and difference
// rounded separately (this file is built with -ffp-contract=off), so a tensor dequantises to the same bits on
// every CPU; tests/test_quant.cpp compares them on every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/dequant_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/cpu.h"
#include "ops/quant_blocks.h"
#include "util/half.h"

HWY_BEFORE_NAMESPACE();
namespace clef::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;

HWY_INLINE void store(DF df, hn::Vec<DF> v, float* y) {
    hn::StoreU(v, df, y);
}

// util/half.h's f32_to_bf16 on every lane: round to nearest even, NaN kept a NaN (quiet bit set).
HWY_INLINE void store(DF df, hn::Vec<DF> v, uint16_t* y) {
    const DU du;
    const DI di;
    const hn::Rebind<uint16_t, DF> d16;
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
                const hn::Vec<DI> q[4] = {
                    hn::Or(hn::And(a, nib), hn::ShiftLeft<4>(hn::And(hb, three))),
                    hn::Or(hn::And(c, nib), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), three))),
                    hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), three))),
                    hn::Or(hn::ShiftRight<4>(c), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<6>(hb), three)))};
                for (int j = 0; j < 4; ++j) {  // (d * scale) * level, ggml's order
                    const auto ds = hn::Set(df, d * static_cast<float>(sc[is + 2 * j]));
                    store(df, hn::Mul(ds, hn::ConvertTo(df, hn::Sub(q[j], off))), y + 32 * j + l);
                }
            }
        }
    }
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
    }
}

void DequantF32(DequantType t, const void* p, int64_t nb, float* y) {
    blocks(t, p, nb, y);
}
void DequantBf16(DequantType t, const void* p, int64_t nb, uint16_t* y) {
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
