// The ggml block layouts of the quantised types, as the GGUF format stores them (one owner: the dequantisers
// in ops/dequant_kernels.cpp and the quantisers and scalar references in quant/quant.cpp read these).
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
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

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

// Vector dequantisers (Highway, dispatched per CPU target) for the types the GGUF files we meet use most:
// nb blocks (Q8_0: 32 values, K types: 256) into fp32 or bf16 (round to nearest even, NaN kept).
// Bit-identical to quant/quant.cpp's scalar loops (the same operations in the same order, no fused
// multiply-adds).
enum class DequantType { Q8_0, Q4_K, Q5_K, Q6_K };
void dequant_blocks(DequantType t, const void* blocks, int64_t nb, float* out);
void dequant_blocks(DequantType t, const void* blocks, int64_t nb, uint16_t* bf16_out);

}  // namespace clef::ops
