#include "quant/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/quant_blocks.h"
#include "ops/quant_kernels.h"
#include "quant/dequant_lowbit.h"
#include "quant/quant_lowbit.h"
#include "util/error.h"
#include "util/half.h"
#include "util/mmap.h"

namespace clef {

namespace {

using ops::BlockQ4_0;
using ops::BlockQ4_1;
using ops::BlockQ4_K;
using ops::BlockQ5_0;
using ops::BlockQ5_1;
using ops::BlockQ5_K;
using ops::BlockQ6_K;
using ops::BlockQ8_0;
using ops::kQK;
using ops::kQKK;
using ops::scale_min_k4;

float h2f(uint16_t h) { return f16_to_f32(h); }

uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

void set_scale_min_k4(int j, uint8_t* q, int sc, int m) {
    if (j < 4) {
        q[j] = static_cast<uint8_t>((q[j] & 0xC0) | (sc & 63));
        q[j + 4] = static_cast<uint8_t>((q[j + 4] & 0xC0) | (m & 63));
    } else {
        q[j + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
        q[j - 4] = static_cast<uint8_t>(q[j - 4] | ((sc >> 4) << 6));
        q[j] = static_cast<uint8_t>(q[j] | ((m >> 4) << 6));
    }
}

void deq_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void deq_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
            y[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
        }
    }
}

void deq_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = h2f(b[i].d);
        const uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < 16; ++j) {
            const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = static_cast<float>(((b[i].qs[j] & 0xF) | (h0 << 4)) - 16) * d;
            y[j + 16] = static_cast<float>(((b[i].qs[j] >> 4) | (h1 << 4)) - 16) * d;
        }
    }
}

void deq_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        const uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < 16; ++j) {
            const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = static_cast<float>((b[i].qs[j] & 0xF) | (h0 << 4)) * d + m;
            y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) | (h1 << 4)) * d + m;
        }
    }
}

void deq_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
    }
}

void deq_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t* q = b[i].qs;
        for (int g = 0; g < 4; ++g, q += 32) {
            int sc, m;
            scale_min_k4(2 * g, b[i].scales, sc, m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            scale_min_k4(2 * g + 1, b[i].scales, sc, m);
            const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
            for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
        }
    }
}

void deq_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t* ql = b[i].qs;
        const uint8_t* qh = b[i].qh;
        for (int g = 0; g < 4; ++g, ql += 32) {
            int sc, m;
            scale_min_k4(2 * g, b[i].scales, sc, m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            scale_min_k4(2 * g + 1, b[i].scales, sc, m);
            const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
            const int u1 = 1 << (2 * g), u2 = 2 << (2 * g);
            for (int l = 0; l < 32; ++l)
                *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l)
                *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

void deq_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = h2f(b[i].d);
        const uint8_t* ql = b[i].ql;
        const uint8_t* qh = b[i].qh;
        const int8_t* sc = b[i].scales;
        for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                // (d * scale) * level, in ggml's order (the rounding and the sign of a zero depend on it)
                y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
                y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
                y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
                y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
            }
        }
    }
}

// ---- vector dequantisation
// --------------------------------------------------------------------------------- ops/quant_blocks.h's
// Highway kernels (every CPU target), bit-identical to the scalar loops above; test_quant compares them on
// random blocks on every target.

bool g_simd = true;

// Dequantises n values with the vector kernels; false when the type has none or SIMD is off.
template <class Out>
bool simd_row(GgmlType type, const unsigned char* p, Out* y, int64_t n) {
    using DT = ops::DequantType;
    if (!g_simd) return false;
    DT t;
    switch (type) {
        case GgmlType::Q8_0:
            t = DT::Q8_0;
            break;
        case GgmlType::Q4_K:
            t = DT::Q4_K;
            break;
        case GgmlType::Q5_K:
            t = DT::Q5_K;
            break;
        case GgmlType::Q6_K:
            t = DT::Q6_K;
            break;
        case GgmlType::Q2_K:
            t = DT::Q2_K;
            break;
        case GgmlType::Q3_K:
            t = DT::Q3_K;
            break;
        case GgmlType::IQ4_NL:
            t = DT::IQ4_NL;
            break;
        case GgmlType::IQ4_XS:
            t = DT::IQ4_XS;
            break;
        case GgmlType::IQ2_XXS:
            t = DT::IQ2_XXS;
            break;
        case GgmlType::IQ2_XS:
            t = DT::IQ2_XS;
            break;
        case GgmlType::IQ2_S:
            t = DT::IQ2_S;
            break;
        case GgmlType::IQ3_XXS:
            t = DT::IQ3_XXS;
            break;
        case GgmlType::IQ3_S:
            t = DT::IQ3_S;
            break;
        case GgmlType::IQ1_S:
            t = DT::IQ1_S;
            break;
        case GgmlType::IQ1_M:
            t = DT::IQ1_M;
            break;
        default: return false;
    }
    ops::dequant_blocks(t, p, n / ggml_type_traits(static_cast<uint32_t>(type)).block_size, y);
    return true;
}

void check_n(GgmlType type, int64_t n) {
    const GgmlTypeTraits t = ggml_type_traits(static_cast<uint32_t>(type));
    if (!t.name) throw Error("ggml " + ggml_type_name(static_cast<uint32_t>(type)) + " is not a ggml type");
    if (!t.supported)
        throw Error("ggml type " + std::string(t.name) + " is not supported (clef reads " +
                    readable_ggml_types() + ")");
    if (n < 0 || n % t.block_size != 0)
        throw Error("ggml type " + std::string(t.name) + ": " + std::to_string(n) +
                    " values are not a whole number of blocks of " + std::to_string(t.block_size));
}

// ---- quantisers --------------------------------------------------------------------------------------------

int nearest_int(float x) { return static_cast<int>(std::lrintf(x)); }

// Q8_0 (levels -127..127, ggml's block format). The levels are always computed with the fp16 scale that is
// stored (not the fp32 one it was rounded from), and the scale is chosen among amax / 127 in fp16 and the
// fp16 values around the least-squares scale of the current levels (d = sum x q / sum q^2), keeping the one
// with the smallest squared error of the dequantised block.
void quant_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
    int8_t q[32];
    // Levels for the fp16 scale h into out; the block's squared error (infinite for a zero / non-finite
    // scale).
    auto levels = [](uint16_t h, int8_t* out, const float* xb) {
        const float d = h2f(h);
        if (!(d > 0) || !std::isfinite(d)) return INFINITY;
        const float id = 1.f / d;
        float e = 0;
        for (int j = 0; j < 32; ++j) {
            const int l = std::clamp(nearest_int(xb[j] * id), -127, 127);
            out[j] = static_cast<int8_t>(l);
            const float diff = static_cast<float>(l) * d - xb[j];
            e += diff * diff;
        }
        return e;
    };
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        b[i].d = 0;
        std::memset(b[i].qs, 0, sizeof b[i].qs);
        uint16_t best_h = f32_to_f16(amax / 127.f);
        float best = levels(best_h, b[i].qs, x);
        if (!std::isfinite(best)) {  // all zeros, or amax / 127 below fp16's range: the block decodes to 0
            std::memset(b[i].qs, 0, sizeof b[i].qs);
            continue;
        }
        for (int iter = 0; iter < 3; ++iter) {
            double sxq = 0, sqq = 0;
            for (int j = 0; j < 32; ++j) {
                sxq += static_cast<double>(x[j]) * b[i].qs[j];
                sqq += static_cast<double>(b[i].qs[j]) * b[i].qs[j];
            }
            if (sqq <= 0) break;
            const uint16_t h = f32_to_f16(static_cast<float>(sxq / sqq));
            bool improved = false;
            for (int delta = -1; delta <= 1; ++delta) {
                const uint16_t c = static_cast<uint16_t>(h + delta);
                if (c == best_h) continue;
                const float e = levels(c, q, x);
                if (e < best) {
                    best = e;
                    best_h = c;
                    std::memcpy(b[i].qs, q, sizeof q);
                    improved = true;
                }
            }
            if (!improved) break;
        }
        b[i].d = best_h;
    }
}

// Signed-max symmetric blocks (Q4_0: levels -8..7, Q5_0: -16..15): the value of largest magnitude maps to -half.
template <class Block, int kHalf>
void quant_sym(const float* x, Block* b, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float amax = 0, vmax = 0;
        for (int j = 0; j < 32; ++j)
            if (std::fabs(x[j]) > amax) {
                amax = std::fabs(x[j]);
                vmax = x[j];
            }
        const float d = vmax / -static_cast<float>(kHalf), id = d != 0 ? 1.f / d : 0.f;
        b[i].d = f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const int q0 = std::clamp(nearest_int(x[j] * id) + kHalf, 0, 2 * kHalf - 1);
            const int q1 = std::clamp(nearest_int(x[j + 16] * id) + kHalf, 0, 2 * kHalf - 1);
            b[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
            qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
        }
        if constexpr (kHalf == 16) std::memcpy(b[i].qh, &qh, 4);
    }
}

// Min/scale blocks (Q4_1: 0..15, Q5_1: 0..31).
template <class Block, int kMax>
void quant_minmax(const float* x, Block* b, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float lo = x[0], hi = x[0];
        for (int j = 1; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
        const float d = (hi - lo) / kMax, id = d != 0 ? 1.f / d : 0.f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(lo);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const int q0 = std::clamp(nearest_int((x[j] - lo) * id), 0, kMax);
            const int q1 = std::clamp(nearest_int((x[j + 16] - lo) * id), 0, kMax);
            b[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
            qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
            qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
        }
        if constexpr (kMax == 31) std::memcpy(b[i].qh, &qh, 4);
    }
}

// ---- K-quant scale searches
// ---------------------------------------------------------------------------------
//
// The K types pick each sub-block's scale (and min) by a small grid search: ops/quant_kernels.h's Highway
// kernels (every CPU target) or their scalar reference, which give identical results (tests/test_kernels.cpp
// compares them on every target, tests/test_quant.cpp whole rows), so a file's bytes do not depend on the CPU
// that wrote it.

void fit_scale_min(const float* x, int nmax, float& scale, float& min_out) {
    if (g_simd)
        ops::fit_scale_min(x, nmax, scale, min_out);
    else
        ops::fit_scale_min_ref(x, nmax, scale, min_out);
}

float fit_scale_sym(const float* x) {
    return g_simd ? ops::fit_scale_sym(x) : ops::fit_scale_sym_ref(x);
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scale and min, super-block fp16 d and dmin.
template <int kMax>
void quant_k_minmax(const float* x, uint16_t& d_out, uint16_t& dmin_out, uint8_t* scales, uint8_t* L) {
    float sc[8], mn[8];
    float max_sc = 0, max_mn = 0;
    for (int j = 0; j < 8; ++j) {
        fit_scale_min(x + 32 * j, kMax, sc[j], mn[j]);
        max_sc = std::max(max_sc, sc[j]);
        max_mn = std::max(max_mn, mn[j]);
    }
    const float inv_sc = max_sc > 0 ? 63.f / max_sc : 0.f, inv_mn = max_mn > 0 ? 63.f / max_mn : 0.f;
    std::memset(scales, 0, 12);
    for (int j = 0; j < 8; ++j)
        set_scale_min_k4(j, scales, std::min(63, nearest_int(inv_sc * sc[j])),
                         std::min(63, nearest_int(inv_mn * mn[j])));
    d_out = f32_to_f16(max_sc / 63.f);
    dmin_out = f32_to_f16(max_mn / 63.f);
    const float d = h2f(d_out), dmin = h2f(dmin_out);
    for (int j = 0; j < 8; ++j) {
        int s, m;
        scale_min_k4(j, scales, s, m);
        const float dd = d * static_cast<float>(s), dm = dmin * static_cast<float>(m);
        for (int i = 0; i < 32; ++i)
            L[32 * j + i] = dd != 0
                                ? static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + i] + dm) / dd), 0, kMax))
                                : 0;
    }
}

void quant_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
    uint8_t L[256];
    for (int64_t i = 0; i < nb; ++i, x += kQKK) {
        quant_k_minmax<15>(x, b[i].d, b[i].dmin, b[i].scales, L);
        for (int g = 0; g < 4; ++g)
            for (int l = 0; l < 32; ++l)
                b[i].qs[32 * g + l] = static_cast<uint8_t>(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
    }
}

void quant_q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
    uint8_t L[256];
    for (int64_t i = 0; i < nb; ++i, x += kQKK) {
        quant_k_minmax<31>(x, b[i].d, b[i].dmin, b[i].scales, L);
        std::memset(b[i].qh, 0, 32);
        for (int g = 0; g < 4; ++g)
            for (int l = 0; l < 32; ++l) {
                const int a = L[64 * g + l], c = L[64 * g + 32 + l];
                b[i].qs[32 * g + l] = static_cast<uint8_t>((a & 0xF) | ((c & 0xF) << 4));
                b[i].qh[l] = static_cast<uint8_t>(b[i].qh[l] | ((a >> 4) << (2 * g)) | ((c >> 4) << (2 * g + 1)));
            }
    }
}

void quant_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
    uint8_t L[256];
    for (int64_t i = 0; i < nb; ++i, x += kQKK) {
        float sc[16], max_abs = 0, max_sc = 0;
        for (int j = 0; j < 16; ++j) {
            sc[j] = fit_scale_sym(x + 16 * j);
            if (std::fabs(sc[j]) > max_abs) max_abs = std::fabs(sc[j]), max_sc = sc[j];
        }
        std::memset(b[i].ql, 0, sizeof b[i].ql);
        std::memset(b[i].qh, 0, sizeof b[i].qh);
        if (max_abs == 0) {
            std::memset(b[i].scales, 0, 16);
            b[i].d = 0;
            continue;
        }
        const float iscale = -128.f / max_sc;
        b[i].d = f32_to_f16(1.f / iscale);
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; ++j) {
            b[i].scales[j] = static_cast<int8_t>(std::clamp(nearest_int(iscale * sc[j]), -128, 127));
            const float dd = d * static_cast<float>(b[i].scales[j]);
            for (int k = 0; k < 16; ++k)
                L[16 * j + k] = static_cast<uint8_t>(
                    dd != 0 ? std::clamp(nearest_int(x[16 * j + k] / dd), -32, 31) + 32 : 32);
        }
        for (int half = 0; half < 2; ++half) {
            uint8_t* ql = b[i].ql + 64 * half;
            uint8_t* qh = b[i].qh + 32 * half;
            const uint8_t* Lh = L + 128 * half;
            for (int l = 0; l < 32; ++l) {
                const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
                ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

}  // namespace

GgmlTypeTraits ggml_type_traits(uint32_t type) {
    switch (static_cast<GgmlType>(type)) {
        case GgmlType::F32: return {"f32", 1, 4, true};
        case GgmlType::F16: return {"f16", 1, 2, true};
        case GgmlType::BF16: return {"bf16", 1, 2, true};
        case GgmlType::Q4_0: return {"q4_0", 32, 18, true};
        case GgmlType::Q4_1: return {"q4_1", 32, 20, true};
        case GgmlType::Q5_0: return {"q5_0", 32, 22, true};
        case GgmlType::Q5_1: return {"q5_1", 32, 24, true};
        case GgmlType::Q8_0: return {"q8_0", 32, 34, true};
        case GgmlType::Q8_1: return {"q8_1", 32, 36, false};
        case GgmlType::Q2_K:
            return {"q2_K", 256, 84, true};
        case GgmlType::Q3_K:
            return {"q3_K", 256, 110, true};
        case GgmlType::Q4_K: return {"q4_K", 256, 144, true};
        case GgmlType::Q5_K: return {"q5_K", 256, 176, true};
        case GgmlType::Q6_K: return {"q6_K", 256, 210, true};
        case GgmlType::Q8_K: return {"q8_K", 256, 292, false};
        case GgmlType::IQ2_XXS:
            return {"iq2_xxs", 256, 66, true};
        case GgmlType::IQ2_XS:
            return {"iq2_xs", 256, 74, true};
        case GgmlType::IQ3_XXS:
            return {"iq3_xxs", 256, 98, true};
        case GgmlType::IQ1_S:
            return {"iq1_s", 256, 50, true};
        case GgmlType::IQ4_NL:
            return {"iq4_nl", 32, 18, true};
        case GgmlType::IQ3_S:
            return {"iq3_s", 256, 110, true};
        case GgmlType::IQ2_S:
            return {"iq2_s", 256, 82, true};
        case GgmlType::IQ4_XS:
            return {"iq4_xs", 256, 136, true};
        case GgmlType::I8: return {"i8", 1, 1, false};
        case GgmlType::I16: return {"i16", 1, 2, false};
        case GgmlType::I32: return {"i32", 1, 4, false};
        case GgmlType::I64: return {"i64", 1, 8, false};
        case GgmlType::F64: return {"f64", 1, 8, false};
        case GgmlType::IQ1_M:
            return {"iq1_m", 256, 56, true};
        case GgmlType::TQ1_0: return {"tq1_0", 256, 54, false};
        case GgmlType::TQ2_0: return {"tq2_0", 256, 66, false};
        case GgmlType::MXFP4: return {"mxfp4", 32, 17, false};
    }
    return {};
}

std::string readable_ggml_types() {
    std::string out;
    for (uint32_t id = 0; id < 64; ++id) {
        const GgmlTypeTraits t = ggml_type_traits(id);
        if (t.name && t.supported) out += (out.empty() ? "" : ", ") + std::string(t.name);
    }
    return out;
}

std::string ggml_type_name(uint32_t type) {
    const GgmlTypeTraits t = ggml_type_traits(type);
    return t.name ? std::string(t.name) : "type " + std::to_string(type);
}

void dequantize_ref(GgmlType type, const void* src, float* y, int64_t n) {
    check_n(type, n);
    const auto* p = static_cast<const unsigned char*>(src);
    switch (type) {
        case GgmlType::F32: std::memcpy(y, p, static_cast<size_t>(n) * 4); return;
        case GgmlType::F16:
            widen<f16_to_f32>(p, y, static_cast<size_t>(n));
            return;
        case GgmlType::BF16:
            widen<bf16_to_f32>(p, y, static_cast<size_t>(n));
            return;
        case GgmlType::Q4_0: deq_q4_0(reinterpret_cast<const BlockQ4_0*>(p), y, n / kQK); return;
        case GgmlType::Q4_1: deq_q4_1(reinterpret_cast<const BlockQ4_1*>(p), y, n / kQK); return;
        case GgmlType::Q5_0: deq_q5_0(reinterpret_cast<const BlockQ5_0*>(p), y, n / kQK); return;
        case GgmlType::Q5_1: deq_q5_1(reinterpret_cast<const BlockQ5_1*>(p), y, n / kQK); return;
        case GgmlType::Q8_0: deq_q8_0(reinterpret_cast<const BlockQ8_0*>(p), y, n / kQK); return;
        case GgmlType::Q4_K: deq_q4_k(reinterpret_cast<const BlockQ4_K*>(p), y, n / kQKK); return;
        case GgmlType::Q5_K: deq_q5_k(reinterpret_cast<const BlockQ5_K*>(p), y, n / kQKK); return;
        case GgmlType::Q6_K: deq_q6_k(reinterpret_cast<const BlockQ6_K*>(p), y, n / kQKK); return;
        case GgmlType::Q2_K:
            quant_detail::deq_q2_k(p, y, n / kQKK);
            return;
        case GgmlType::Q3_K:
            quant_detail::deq_q3_k(p, y, n / kQKK);
            return;
        case GgmlType::IQ2_XXS:
            quant_detail::deq_iq2_xxs(p, y, n / kQKK);
            return;
        case GgmlType::IQ2_XS:
            quant_detail::deq_iq2_xs(p, y, n / kQKK);
            return;
        case GgmlType::IQ2_S:
            quant_detail::deq_iq2_s(p, y, n / kQKK);
            return;
        case GgmlType::IQ3_XXS:
            quant_detail::deq_iq3_xxs(p, y, n / kQKK);
            return;
        case GgmlType::IQ3_S:
            quant_detail::deq_iq3_s(p, y, n / kQKK);
            return;
        case GgmlType::IQ1_S:
            quant_detail::deq_iq1_s(p, y, n / kQKK);
            return;
        case GgmlType::IQ1_M:
            quant_detail::deq_iq1_m(p, y, n / kQKK);
            return;
        case GgmlType::IQ4_NL:
            quant_detail::deq_iq4_nl(p, y, n / kQK);
            return;
        case GgmlType::IQ4_XS:
            quant_detail::deq_iq4_xs(p, y, n / kQKK);
            return;
        default: break;
    }
    throw Error("ggml type " + ggml_type_name(static_cast<uint32_t>(type)) + " cannot be dequantised");
}

// The vector kernels (Highway) have a target on every CPU.
bool quant_simd_available() {
    return true;
}

void set_quant_simd(bool enabled) {
    g_simd = enabled;
}

void dequantize_row_f32(GgmlType type, const void* src, float* dst, int64_t n) {
    check_n(type, n);
    if (!simd_row(type, static_cast<const unsigned char*>(src), dst, n)) dequantize_ref(type, src, dst, n);
}

void dequantize_row_bf16(GgmlType type, const void* src, uint16_t* dst, int64_t n) {
    check_n(type, n);
    if (type == GgmlType::BF16) {
        std::memcpy(dst, src, static_cast<size_t>(n) * 2);
        return;
    }
    const auto* p = static_cast<const unsigned char*>(src);
    if (simd_row(type, p, dst, n)) return;
    float buf[1024];
    const GgmlTypeTraits t = ggml_type_traits(static_cast<uint32_t>(type));
    const int64_t chunk = 1024 / t.block_size * t.block_size;
    for (int64_t i = 0; i < n; i += chunk) {
        const int64_t m = std::min(chunk, n - i);
        dequantize_ref(type, p + i / t.block_size * t.type_size, buf, m);
        for (int64_t j = 0; j < m; ++j) dst[i + j] = f32_to_bf16(buf[j]);
    }
}

void QuantMatrix::validate(const std::string& what) const {
    const GgmlTypeTraits t = ggml_type_traits(static_cast<uint32_t>(type));
    if (!t.supported) throw Error(what + ": ggml type " + ggml_type_name(static_cast<uint32_t>(type)) + " is not supported");
    if (!data || rows <= 0 || cols <= 0 || cols % t.block_size != 0)
        throw Error(what + ": not a [rows][cols] matrix of whole " + t.name + " blocks");
    auto check_map = [&](const std::vector<int64_t>& map, int64_t n, const char* kind) {
        if (map.empty()) return;
        std::vector<bool> seen(static_cast<size_t>(n));
        if (static_cast<int64_t>(map.size()) != n) throw Error(what + ": " + kind + " map has the wrong size");
        for (int64_t v : map) {
            if (v < 0 || v >= n || seen[static_cast<size_t>(v)]) throw Error(what + ": " + kind + " map is not a permutation");
            seen[static_cast<size_t>(v)] = true;
        }
    };
    check_map(row_map, rows, "row");
    if (!col_map.empty()) {
        if (col_group <= 0 || col_group * static_cast<int64_t>(col_map.size()) != cols)
            throw Error(what + ": column groups do not cover the row");
        check_map(col_map, static_cast<int64_t>(col_map.size()), "column");
    }
}

namespace {

// Dequantises logical row r of m into dst through `row` (a dequantize_row_* function), applying the maps.
template <class T, class RowFn>
void matrix_row(const QuantMatrix& m, int64_t r, T* dst, RowFn row) {
    if (r < 0 || r >= m.rows)
        throw Error("row " + std::to_string(r) + " is outside the matrix's " + std::to_string(m.rows) + " rows");
    const unsigned char* src = m.data + static_cast<uint64_t>(m.row_map.empty() ? r : m.row_map[r]) * m.row_bytes();
    if (m.col_map.empty()) {
        row(m.type, src, dst, m.cols);
        return;
    }
    std::vector<T> tmp(static_cast<size_t>(m.cols));
    row(m.type, src, tmp.data(), m.cols);
    for (size_t g = 0; g < m.col_map.size(); ++g)
        std::memcpy(dst + g * m.col_group, tmp.data() + m.col_map[g] * m.col_group, m.col_group * sizeof(T));
}

}  // namespace

void QuantMatrix::drop_pages() const {
    if (file_mapped) drop_mapped_pages(data, static_cast<size_t>(static_cast<uint64_t>(rows) * row_bytes()));
}

void QuantMatrix::row_f32(int64_t r, float* dst) const { matrix_row(*this, r, dst, dequantize_row_f32); }
void QuantMatrix::row_bf16(int64_t r, uint16_t* dst) const { matrix_row(*this, r, dst, dequantize_row_bf16); }

namespace {

// A quantiser of n values (whole blocks) at x into p; importance may be null (quant.h).
using RowQuantiser = void (*)(const float* x, const float* importance, unsigned char* p, int64_t n);

// A low-bit quantiser (quant_lowbit.h: nb blocks of kBlock values, importance weights) as a RowQuantiser.
template <void (*Quant)(const float*, const float*, void*, int64_t), int64_t kBlock>
void low_bit(const float* x, const float* importance, unsigned char* p, int64_t n) {
    Quant(x, importance, p, n / kBlock);
}

// The one list of the types clef writes: their quantisers; nullptr for the others.
RowQuantiser quantiser_of(GgmlType type) {
    switch (type) {
        case GgmlType::F32:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                std::memcpy(p, x, static_cast<size_t>(n) * 4);
            };
        case GgmlType::F16:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                for (int64_t i = 0; i < n; ++i) {
                    const uint16_t h = f32_to_f16(x[i]);
                    std::memcpy(p + 2 * i, &h, 2);
                }
            };
        case GgmlType::BF16:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                for (int64_t i = 0; i < n; ++i) {
                    const uint16_t h = f32_to_bf16(x[i]);
                    std::memcpy(p + 2 * i, &h, 2);
                }
            };
        case GgmlType::Q4_0:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                quant_sym<BlockQ4_0, 8>(x, reinterpret_cast<BlockQ4_0*>(p), n / kQK);
            };
        case GgmlType::Q5_0:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                quant_sym<BlockQ5_0, 16>(x, reinterpret_cast<BlockQ5_0*>(p), n / kQK);
            };
        case GgmlType::Q4_1:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                quant_minmax<BlockQ4_1, 15>(x, reinterpret_cast<BlockQ4_1*>(p), n / kQK);
            };
        case GgmlType::Q5_1:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                quant_minmax<BlockQ5_1, 31>(x, reinterpret_cast<BlockQ5_1*>(p), n / kQK);
            };
        case GgmlType::Q8_0:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                quant_q8_0(x, reinterpret_cast<BlockQ8_0*>(p), n / kQK);
            };
        case GgmlType::Q4_K:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                quant_q4_k(x, reinterpret_cast<BlockQ4_K*>(p), n / kQKK);
            };
        case GgmlType::Q5_K:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                quant_q5_k(x, reinterpret_cast<BlockQ5_K*>(p), n / kQKK);
            };
        case GgmlType::Q6_K:
            return [](const float* x, const float*, unsigned char* p, int64_t n) {
                quant_q6_k(x, reinterpret_cast<BlockQ6_K*>(p), n / kQKK);
            };
        case GgmlType::Q2_K:
            return low_bit<quant_detail::quant_q2_k, kQKK>;
        case GgmlType::Q3_K:
            return low_bit<quant_detail::quant_q3_k, kQKK>;
        case GgmlType::IQ4_NL:
            return low_bit<quant_detail::quant_iq4_nl, kQK>;
        case GgmlType::IQ4_XS:
            return low_bit<quant_detail::quant_iq4_xs, kQKK>;
        case GgmlType::IQ2_XXS:
            return low_bit<quant_detail::quant_iq2_xxs, kQKK>;
        case GgmlType::IQ2_XS:
            return low_bit<quant_detail::quant_iq2_xs, kQKK>;
        case GgmlType::IQ2_S:
            return low_bit<quant_detail::quant_iq2_s, kQKK>;
        case GgmlType::IQ3_XXS:
            return low_bit<quant_detail::quant_iq3_xxs, kQKK>;
        case GgmlType::IQ3_S:
            return low_bit<quant_detail::quant_iq3_s, kQKK>;
        default:
            return nullptr;
    }
}

}  // namespace

bool ggml_type_writable(GgmlType type) {
    return quantiser_of(type) != nullptr;
}

void quantize_row(GgmlType type, const float* x, void* dst, int64_t n, const float* importance) {
    check_n(type, n);
    const RowQuantiser q = quantiser_of(type);
    if (!q) throw Error("clef cannot quantise to ggml type " + ggml_type_name(static_cast<uint32_t>(type)));
    q(x, importance, static_cast<unsigned char*>(dst), n);
}

}  // namespace clef
