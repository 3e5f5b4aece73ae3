// Lookup tables of ggml's i-quant types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL,
// IQ4_XS), defined in iq_tables.cpp (the values of ggml's ggml-common.h). A grid entry packs the magnitudes
// of 8 (IQ2, IQ1: uint64_t) or 4 (IQ3: uint32_t) consecutive values, one byte each, value j in byte j
// (little-endian); the block stores the entry's index and the signs separately.
#pragma once

#include <cstdint>

namespace clef::ops {

extern const uint64_t kIq2xxsGrid[256];  // bytes in {8, 25, 43}
extern const uint64_t kIq2xsGrid[512];   // bytes in {8, 25, 43}
extern const uint64_t kIq2sGrid[1024];   // bytes in {8, 25, 43}
extern const uint32_t kIq3xxsGrid[256];  // bytes in {4, 12, 20, 28, 36, 44, 52, 62}
extern const uint32_t kIq3sGrid[512];    // bytes in {1, 3, 5, 7, 9, 11, 13, 15}
extern const uint64_t kIq1sGrid[2048];   // bytes are int8_t in {-1, 0, 1}

// Sign patterns of 8 values from a 7-bit index: bit j set -> value j negative (bit 7 makes the count of set
// bits even).
extern const uint8_t kIq2Signs[128];

// The 16 levels of IQ4_NL / IQ4_XS, indexed by a nibble.
extern const int8_t kIq4nlValues[16];

// IQ1_S / IQ1_M: the shift added to every grid level of a group of 8 (its sign is a bit of the block).
constexpr float kIq1Delta = 0.125f;

}  // namespace clef::ops
