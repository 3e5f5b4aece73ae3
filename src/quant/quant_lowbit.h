// Quantisers of the low-bit ggml types clef writes beside the 4-8 bit ones of quant.cpp: Q2_K, Q3_K, IQ4_NL
// and IQ4_XS (quant_lowbit.cpp), IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (quant_iq.cpp), internal to
// src/quant (quant.cpp's quantize_row calls them). Each turns nb blocks of x (IQ4_NL: 32 values per block,
// the others 256) into the block format of ops/quant_blocks.h. `importance` (nullable) holds a non-negative
// weight per value of x (an importance matrix row, quant.h): the scales minimise the squared error weighted
// by importance * sqrt(mean square + x^2); without it every importance is 1.
//
// Written from the block formats (dequant_lowbit.cpp decodes them), not ported: each sub-block's scale (and
// min) is the best of a small grid of candidates, each refitted by weighted least squares; the super-block
// scale then quantises the sub-block scales, and the levels are chosen again with the scales as stored.
#pragma once

#include <cstdint>

namespace clef::quant_detail {

void quant_q2_k(const float* x, const float* importance, void* blocks, int64_t nb);
void quant_q3_k(const float* x, const float* importance, void* blocks, int64_t nb);
void quant_iq4_nl(const float* x, const float* importance, void* blocks, int64_t nb);
void quant_iq4_xs(const float* x, const float* importance, void* blocks, int64_t nb);
void quant_iq2_xxs(const float* x, const float* importance, void* blocks, int64_t nb);
void quant_iq2_xs(const float* x, const float* importance, void* blocks, int64_t nb);
void quant_iq2_s(const float* x, const float* importance, void* blocks, int64_t nb);
void quant_iq3_xxs(const float* x, const float* importance, void* blocks, int64_t nb);
void quant_iq3_s(const float* x, const float* importance, void* blocks, int64_t nb);

// The weights of n values: importance * sqrt(mean square + x^2) (importance 1 when it is null).
void value_weights(const float* x, const float* importance, int n, float* w);

}  // namespace clef::quant_detail
