// Scalar dequantisers of the low-bit ggml types (Q2_K, Q3_K and the i-quants): the references of the vector
// kernels (ops/dequant_kernels.cpp), internal to src/quant: quant.cpp's dequantize_ref calls them. Each turns
// nb blocks (IQ4_NL: 32 values per block, the others 256) at `blocks` (any alignment) into fp32 at y,
// bit-identical to ggml's reference dequantize_row_* (the same fp32 operations in the same order; the file is
// compiled without fused multiply-adds). Block layouts: ops/quant_blocks.h; lookup tables: ops/iq_tables.h;
// the grid types' groups of 8: ops/iq_groups.h.
#pragma once

#include <cstdint>

namespace clef::quant_detail {

void deq_q2_k(const void* blocks, float* y, int64_t nb);
void deq_q3_k(const void* blocks, float* y, int64_t nb);
void deq_iq2_xxs(const void* blocks, float* y, int64_t nb);
void deq_iq2_xs(const void* blocks, float* y, int64_t nb);
void deq_iq2_s(const void* blocks, float* y, int64_t nb);
void deq_iq3_xxs(const void* blocks, float* y, int64_t nb);
void deq_iq3_s(const void* blocks, float* y, int64_t nb);
void deq_iq1_s(const void* blocks, float* y, int64_t nb);
void deq_iq1_m(const void* blocks, float* y, int64_t nb);
void deq_iq4_nl(const void* blocks, float* y, int64_t nb);
void deq_iq4_xs(const void* blocks, float* y, int64_t nb);

}  // namespace clef::quant_detail
