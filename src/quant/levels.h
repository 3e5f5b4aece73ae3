// The affine 32-value blocks of Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q5_K as unsigned integer levels: value =
// D * u + O with u in [0, 2^bits) and one (D, O) per 32 values, exactly the file's numbers (D = d or d * sc,
// O = -8d, -16d, m or -dmin * m). ops::Int8Linear multiplies these levels in integer arithmetic
// (Precision::Int8) without requantising them.
#pragma once

#include <cstdint>

#include "quant/quant.h"

namespace clef {

// 4 or 5 for the types above, else 0.
int affine_level_bits(GgmlType t);

// The n values (a multiple of the type's block) of row data p as levels u (ops::level_row_bytes(bits, n)
// bytes: 4-bit levels two per byte) and per-32 (D, O)[n / 32].
void row_levels(GgmlType t, const void* p, int64_t n, uint8_t* u, float* D, float* O);

// Whether m's rows have levels: an affine type, whole 32-value blocks, column groups (if any) of whole
// blocks.
bool has_levels(const QuantMatrix& m);

// Logical row r of m (maps applied) as levels; false when !has_levels(m) (then nothing is written).
bool matrix_row_levels(const QuantMatrix& m, int64_t r, uint8_t* u, float* D, float* O);

// Q8_0's blocks as they are: int8 levels q[n] and one scale s per 32 values (value = s * q, exactly the
// file's numbers), which ops::Int8Linear multiplies as its signed panels without requantising them. Whether
// m's rows come so (Q8_0, whole blocks, column groups of whole blocks), and logical row r of m (maps
// applied); false when !has_int8_levels(m) (then nothing is written).
bool has_int8_levels(const QuantMatrix& m);
// Whether t's blocks are such int8 levels (Q8_0).
bool int8_level_type(GgmlType t);
bool matrix_row_int8(const QuantMatrix& m, int64_t r, int8_t* q, float* s);

}  // namespace clef
