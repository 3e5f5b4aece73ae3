#include "quant/levels.h"

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "ops/int8_gemm.h"
#include "ops/quant_blocks.h"
#include "util/error.h"
#include "util/half.h"

namespace clef {

namespace {

using ops::kQK;
using ops::kQKK;

// Q4_0 / Q4_1 / Q5_0 / Q5_1: element j in the low nibble of qs[j], j + 16 in the high one (4 bits: the
// levels' own layout, ops/int8_gemm.h level_row_bytes); Q5's fifth bits in qh (bit j for element j).
template <class Block, bool kFifth>
void small_blocks(const Block* b, int64_t nb, uint8_t* u, float* D, float* O, float offset_levels) {
    for (int64_t i = 0; i < nb; ++i, u += ops::level_row_bytes(kFifth ? 5 : 4, kQK)) {
        if constexpr (kFifth) {
            uint32_t qh = 0;
            std::memcpy(&qh, b[i].qh, 4);
            for (int j = 0; j < 16; ++j) {
                u[j] = static_cast<uint8_t>((b[i].qs[j] & 0xF) | ((qh >> j) & 1) << 4);
                u[j + 16] = static_cast<uint8_t>((b[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
            }
        } else {
            std::memcpy(u, b[i].qs, kQK / 2);
        }
        D[i] = f16_to_f32(b[i].d);
        if constexpr (requires { b[i].m; })
            O[i] = f16_to_f32(b[i].m);
        else
            O[i] = -offset_levels * D[i];
    }
}

// Q4_K / Q5_K: 64-value groups, low nibbles (sub-block 2g) then high nibbles (2g + 1); Q5_K's fifth bits in
// qh (bits 2g and 2g + 1 of qh[l]). Q4_K's levels two per byte (ops/int8_gemm.h level_row_bytes): byte j of
// sub-block 2g holds the low nibbles of qs[j] and qs[j + 16], of sub-block 2g + 1 their high ones.
template <class Block, bool kFifth>
void k_blocks(const Block* b, int64_t nb, uint8_t* u, float* D, float* O) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int g = 0; g < 4; ++g, u += ops::level_row_bytes(kFifth ? 5 : 4, 2 * kQK), D += 2, O += 2) {
            for (int h = 0; h < 2; ++h) {
                int sc, m;
                ops::scale_min_k4(2 * g + h, b[i].scales, sc, m);
                D[h] = d * static_cast<float>(sc);
                O[h] = -(dmin * static_cast<float>(m));
            }
            if constexpr (!kFifth) {
                uint8_t q[32], out[32];  // local copies: byte pointers may alias, arrays vectorise
                std::memcpy(q, b[i].qs + 32 * g, 32);
                for (int j = 0; j < 16; ++j) {
                    out[j] = static_cast<uint8_t>((q[j] & 0x0f) | (q[j + 16] << 4));
                    out[16 + j] = static_cast<uint8_t>((q[j] >> 4) | (q[j + 16] & 0xf0));
                }
                std::memcpy(u, out, 32);
                continue;
            }
            for (int l = 0; l < 32; ++l) {
                const uint8_t q = b[i].qs[32 * g + l];
                int lo = q & 0xF, hi = q >> 4;
                if constexpr (kFifth) {
                    lo |= ((b[i].qh[l] >> (2 * g)) & 1) << 4;
                    hi |= ((b[i].qh[l] >> (2 * g + 1)) & 1) << 4;
                }
                u[l] = static_cast<uint8_t>(lo);
                u[32 + l] = static_cast<uint8_t>(hi);
            }
        }
    }
}

}  // namespace

int affine_level_bits(GgmlType t) {
    switch (t) {
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q4_K:
            return 4;
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q5_K:
            return 5;
        default:
            return 0;
    }
}

void row_levels(GgmlType t, const void* p, int64_t n, uint8_t* u, float* D, float* O) {
    switch (t) {
        case GgmlType::Q4_0:
            return small_blocks<ops::BlockQ4_0, false>(static_cast<const ops::BlockQ4_0*>(p), n / kQK, u, D,
                                                       O, 8);
        case GgmlType::Q4_1:
            return small_blocks<ops::BlockQ4_1, false>(static_cast<const ops::BlockQ4_1*>(p), n / kQK, u, D,
                                                       O, 0);
        case GgmlType::Q5_0:
            return small_blocks<ops::BlockQ5_0, true>(static_cast<const ops::BlockQ5_0*>(p), n / kQK, u, D, O,
                                                      16);
        case GgmlType::Q5_1:
            return small_blocks<ops::BlockQ5_1, true>(static_cast<const ops::BlockQ5_1*>(p), n / kQK, u, D, O,
                                                      0);
        case GgmlType::Q4_K:
            return k_blocks<ops::BlockQ4_K, false>(static_cast<const ops::BlockQ4_K*>(p), n / kQKK, u, D, O);
        case GgmlType::Q5_K:
            return k_blocks<ops::BlockQ5_K, true>(static_cast<const ops::BlockQ5_K*>(p), n / kQKK, u, D, O);
        default:
            throw Error("levels: the type has no affine 32-value blocks");
    }
}

bool has_levels(const QuantMatrix& m) {
    return affine_level_bits(m.type) > 0 && m.cols % kQK == 0 &&
           (m.col_map.empty() || m.col_group % kQK == 0);
}

namespace {

// Logical row r of m (maps applied) from decode(stored row, levels, per-32 arrays): block_bytes bytes of
// levels and kArrays floats per 32 values (f[a][block]), column groups moved as col_map says.
template <size_t kArrays, class Decode>
void mapped_row(const QuantMatrix& m, int64_t r, int64_t block_bytes, unsigned char* levels,
                const std::array<float*, kArrays>& f, Decode decode) {
    if (r < 0 || r >= m.rows) throw Error("levels: row " + std::to_string(r) + " is outside the matrix");
    const unsigned char* src =
        m.data + static_cast<uint64_t>(m.row_map.empty() ? r : m.row_map[r]) * m.row_bytes();
    if (m.col_map.empty()) return decode(src, levels, f);
    const int64_t nb = m.cols / kQK, gb = m.col_group / kQK;  // blocks per row, per column group
    std::vector<unsigned char> tl(static_cast<size_t>(nb * block_bytes));
    std::vector<float> tf(static_cast<size_t>(nb) * kArrays);
    std::array<float*, kArrays> tp;
    for (size_t a = 0; a < kArrays; ++a) tp[a] = tf.data() + a * nb;
    decode(src, tl.data(), tp);
    for (size_t g = 0; g < m.col_map.size(); ++g) {
        const int64_t from = m.col_map[g];
        std::memcpy(levels + g * gb * block_bytes, tl.data() + from * gb * block_bytes,
                    static_cast<size_t>(gb * block_bytes));
        for (size_t a = 0; a < kArrays; ++a)
            std::memcpy(f[a] + g * gb, tp[a] + from * gb, static_cast<size_t>(gb) * sizeof(float));
    }
}

}  // namespace

bool matrix_row_levels(const QuantMatrix& m, int64_t r, uint8_t* u, float* D, float* O) {
    if (!has_levels(m)) return false;
    mapped_row<2>(m, r, ops::level_row_bytes(affine_level_bits(m.type), kQK), u, {D, O},
                  [&m](const unsigned char* src, unsigned char* lv, const std::array<float*, 2>& f) {
                      row_levels(m.type, src, m.cols, lv, f[0], f[1]);
                  });
    return true;
}

bool int8_level_type(GgmlType t) {
    return t == GgmlType::Q8_0;
}

bool has_int8_levels(const QuantMatrix& m) {
    return int8_level_type(m.type) && m.cols % kQK == 0 && (m.col_map.empty() || m.col_group % kQK == 0);
}

bool matrix_row_int8(const QuantMatrix& m, int64_t r, int8_t* q, float* s) {
    if (!has_int8_levels(m)) return false;
    mapped_row<1>(m, r, kQK, reinterpret_cast<unsigned char*>(q), {s},
                  [&m](const unsigned char* src, unsigned char* lv, const std::array<float*, 1>& f) {
                      const auto* b = reinterpret_cast<const ops::BlockQ8_0*>(src);
                      for (int64_t i = 0; i < m.cols / kQK; ++i) {
                          std::memcpy(lv + i * kQK, b[i].qs, kQK);
                          f[0][i] = f16_to_f32(b[i].d);
                      }
                  });
    return true;
}

}  // namespace clef
