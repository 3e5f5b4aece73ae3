// The ggml block layouts of the quantised types, as the GGUF format stores them (one owner: the dequantisers
// in ops/dequant_kernels.cpp, the quantisers and scalar references in quant/quant.cpp and the scalar
// dequantisers of the low-bit types in quant/dequant_lowbit.cpp read these; the i-quants' lookup tables are
// in ops/iq_tables.h).
#pragma once

#include <cstdint>

namespace clef::ops {

constexpr int kQK = 32;    // the 32-value blocks
constexpr int kQKK = 256;  // the K super-blocks

#pragma pack(push, 1)
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[16];
};
struct BlockQ4_1 {
    uint16_t d, m;
    uint8_t qs[16];
};
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};
struct BlockQ5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
};
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[32];
};
struct BlockQ4_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
};
struct BlockQ5_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
};
struct BlockQ6_K {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
};
// The low-bit types (scalar references in quant/dequant_lowbit.cpp). d fields are fp16.
struct BlockQ2_K {
    uint8_t scales[16];  // 4-bit scale (low nibble) and 4-bit min (high nibble) of each 16-value sub-block
    uint8_t qs[64];      // 2-bit quants
    uint16_t d, dmin;
};
struct BlockQ3_K {
    uint8_t hmask[32];   // high bit of each quant
    uint8_t qs[64];      // low 2 bits
    uint8_t scales[12];  // 16 x 6-bit scales (biased by 32)
    uint16_t d;
};
struct BlockIQ2_XXS {
    uint16_t d;
    uint8_t qs[64];  // per 32 values: 4 grid indices (8 bit), then 4 x 7-bit signs + 4-bit scale (u32)
};
struct BlockIQ2_XS {
    uint16_t d;
    uint16_t qs[32];    // 9-bit grid index | 7-bit signs << 9
    uint8_t scales[8];  // two 4-bit scales per 32 values
};
struct BlockIQ2_S {
    uint16_t d;
    uint8_t qs[32];     // low 8 bits of the grid indices
    uint8_t signs[32];  // one sign bit per value
    uint8_t qh[8];      // high 2 bits of the 4 indices of each 32 values
    uint8_t scales[8];
};
struct BlockIQ3_XXS {
    uint16_t d;
    uint8_t qs[64];            // grid indices, 8 per 32 values
    uint8_t scales_signs[32];  // per 32 values a u32: 4 x 7-bit signs + 4-bit scale
};
struct BlockIQ3_S {
    uint16_t d;
    uint8_t qs[64];     // low 8 bits of the grid indices
    uint8_t qh[8];      // their 9th bits
    uint8_t signs[32];  // one sign bit per value
    uint8_t scales[4];  // 4-bit scales, one per 32 values
};
struct BlockIQ1_S {
    uint16_t d;
    uint8_t qs[32];  // low 8 bits of the grid indices
    uint16_t qh[8];  // per 32 values: 4 x 3 high index bits, 3-bit scale, delta sign
};
struct BlockIQ1_M {
    uint8_t qs[32];     // low 8 bits of the grid indices
    uint8_t qh[16];     // per 8 values a nibble: 3 high index bits, delta sign
    uint8_t scales[8];  // 4 x u16: 3-bit scales, and the fp16 d in their top nibbles
};
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[16];
};
struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;    // high 2 bits of the 8 scales
    uint8_t scales_l[4];  // low 4 bits
    uint8_t qs[128];
};
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockIQ2_XXS) == 66 &&
              sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82 && sizeof(BlockIQ3_XXS) == 98 &&
              sizeof(BlockIQ3_S) == 110 && sizeof(BlockIQ1_S) == 50 && sizeof(BlockIQ1_M) == 56 &&
              sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block.
inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Vector dequantisers (Highway, dispatched per CPU target) for the types of the GGUF files we meet: nb blocks
// (Q8_0, IQ4_NL: 32 values, the others 256) into fp32 or bf16 (round to nearest even, NaN kept).
// Bit-identical to the scalar loops of quant/quant.cpp and quant/dequant_lowbit.cpp (the same operations in
// the same order, no fused multiply-adds).
enum class DequantType {
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    Q2_K,
    Q3_K,
    IQ4_NL,
    IQ4_XS,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ3_XXS,
    IQ3_S,
    IQ1_S,
    IQ1_M
};
void dequant_blocks(DequantType t, const void* blocks, int64_t nb, float* out);
void dequant_blocks(DequantType t, const void* blocks, int64_t nb, uint16_t* bf16_out);

}  // namespace clef::ops
