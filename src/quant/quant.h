// ggml tensor types: the block formats of GGUF tensor data, their scalar dequantisation (the oracle), row
// dequantisation to fp32 / bf16, and the quantisers `clef convert` writes.
//
// Block layouts (little-endian, fp16 = IEEE half), QK = values per block:
//   Q4_0  QK 32,  18 B: f16 d; u8 qs[16]                 x = (nibble - 8) * d
//   Q4_1  QK 32,  20 B: f16 d, m; u8 qs[16]              x = nibble * d + m
//   Q5_0  QK 32,  22 B: f16 d; u8 qh[4]; u8 qs[16]       x = (nibble | high bit << 4) - 16) * d
//   Q5_1  QK 32,  24 B: f16 d, m; u8 qh[4]; u8 qs[16]    x = (nibble | high bit << 4) * d + m
//   Q8_0  QK 32,  34 B: f16 d; i8 qs[32]                 x = q * d
//   Q4_K  QK 256, 144 B: f16 d, dmin; u8 scales[12] (8 x 6-bit scale + 6-bit min); u8 qs[128]
//   Q5_K  QK 256, 176 B: f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
//   Q6_K  QK 256, 210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
//   Q2_K  QK 256, 84 B: u8 scales[16] (4-bit scale + 4-bit min per 16); u8 qs[64]; f16 d, dmin
//   Q3_K  QK 256, 110 B: u8 hmask[32]; u8 qs[64] (low 2 bits); u8 scales[12] (16 x 6-bit); f16 d
//   IQ2_XXS QK 256, 66 B: f16 d; u8 qs[64] (per 32: 4 grid indices, u32 of 4 x 7-bit signs + 4-bit scale)
//   IQ2_XS  QK 256, 74 B: f16 d; u16 qs[32] (9-bit grid index, 7-bit signs); u8 scales[8]
//   IQ2_S   QK 256, 82 B: f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8] (index bits 8-9); u8 scales[8]
//   IQ3_XXS QK 256, 98 B: f16 d; u8 qs[64] (grid indices); u8 scales_signs[32] (as IQ2_XXS)
//   IQ3_S   QK 256, 110 B: f16 d; u8 qs[64]; u8 qh[8] (index bit 8); u8 signs[32]; u8 scales[4]
//   IQ1_S   QK 256, 50 B: f16 d; u8 qs[32]; u16 qh[8] (index bits 8-10, 3-bit scale, delta sign)
//   IQ1_M   QK 256, 56 B: u8 qs[32]; u8 qh[16]; u8 scales[8] (3-bit scales; f16 d in the top nibbles)
//   IQ4_NL  QK 32,  18 B: f16 d; u8 qs[16]                 x = kvalues[nibble] * d (non-linear levels)
//   IQ4_XS  QK 256, 136 B: f16 d; u16 scales_h; u8 scales_l[4] (8 x 6-bit); u8 qs[128] (IQ4_NL's nibbles)
// In the 32-blocks value j < 16 is the low nibble of qs[j], value j + 16 its high nibble (qh bit j / j + 16).
// In the K blocks, each 64-value group g uses the low nibbles of qs[32g..32g+31] for its first 32 values and
// the high nibbles for the next 32 (Q5_K: qh bit 2g / 2g + 1); Q6_K works on 128-value halves (see
// quant.cpp). The i-quants (IQ*) index lookup tables of 4 or 8 values (ops/iq_tables.h). Scalar references of
// Q2_K, Q3_K and the IQ types: quant/dequant_lowbit.cpp; their quantisers: quant/quant_lowbit.h (all but
// IQ1_S and IQ1_M, which clef reads only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace clef {

enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
};

struct GgmlTypeTraits {
    const char* name = nullptr;  // ggml's spelling: "f32", "q4_K", ...
    uint32_t block_size = 0;     // values per block
    uint32_t type_size = 0;      // bytes per block
    bool supported = false;      // clef can dequantise it
};

// Traits of a raw ggml type id; name == nullptr for an id ggml does not define (or has retired).
GgmlTypeTraits ggml_type_traits(uint32_t type);
// "q4_K" / "type 31" for an unknown id.
std::string ggml_type_name(uint32_t type);
// The types clef can dequantise, by name in id order ("f32, f16, q4_0, ...": for error messages).
std::string readable_ggml_types();
// Bytes of a row of n values (n must be a multiple of the block size: checked by callers via row_fits).
inline uint64_t ggml_row_bytes(const GgmlTypeTraits& t, uint64_t n) {
    return n / t.block_size * t.type_size;
}

// Q8_0, Q4_K, Q5_K and Q6_K dequantise with ops' Highway kernels on every CPU (the other types take the
// scalar path); the K-quant scale searches of the quantisers have AVX-512 kernels, used where
// quant_simd_available() (AVX-512, under CLEF_MAX_ISA). set_quant_simd(false) forces the scalar paths of both
// (tests compare).
bool quant_simd_available();
void set_quant_simd(bool enabled);

// Scalar reference: dequantises n values (n a multiple of the block size) of a supported type to fp32.
// Throws clef::Error for unsupported types or a bad n.
void dequantize_ref(GgmlType type, const void* src, float* dst, int64_t n);
// Fast row dequantisation (same results as dequantize_ref, bit for bit).
void dequantize_row_f32(GgmlType type, const void* src, float* dst, int64_t n);
// Row dequantisation to bf16 (round to nearest even of the fp32 values).
void dequantize_row_bf16(GgmlType type, const void* src, uint16_t* dst, int64_t n);

// A row-major matrix [rows][cols] stored in a ggml type (typically a quantised GGUF tensor), read row by row so
// that it is never converted as a whole. Optional index maps reorder it on the fly (GGUF tiles value heads
// where Hugging Face groups them): logical row r is stored row row_map[r]; with col_group > 0, logical column
// group g (col_group consecutive columns) is stored group col_map[g]. owner keeps the storage (the mapping)
// alive.
struct QuantMatrix {
    GgmlType type = GgmlType::F32;
    const unsigned char* data = nullptr;
    int64_t rows = 0, cols = 0;
    std::vector<int64_t> row_map;  // empty: identity
    int64_t col_group = 0;
    std::vector<int64_t> col_map;  // empty: identity
    std::shared_ptr<const void> owner;
    // data lies in a read-only file mapping: drop_pages() may release its pages (they are re-read on use).
    bool file_mapped = false;

    uint64_t row_bytes() const { return ggml_row_bytes(ggml_type_traits(static_cast<uint32_t>(type)), cols); }
    // Logical row r as fp32 / bf16 (cols values). Throws clef::Error for r outside [0, rows).
    void row_f32(int64_t r, float* dst) const;
    void row_bf16(int64_t r, uint16_t* dst) const;
    // Releases the whole pages of the matrix from this process's resident set (madvise MADV_DONTNEED) when it
    // is file_mapped, e.g. once it has been packed; a later read faults them back in from the page cache.
    // No-op otherwise.
    void drop_pages() const;
    // Checks type, sizes and maps (clef::Error naming `what`).
    void validate(const std::string& what) const;
};

// Matrices kept outside a Checkpoint (a GGUF model's quantised weights), by Hugging Face tensor name.
using QuantTensors = std::map<std::string, QuantMatrix, std::less<>>;

// Quantises n values (a multiple of the block size) to one of the types clef writes: F32, F16, BF16, Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS. dst must hold ggml_row_bytes(traits,
// n) bytes. `importance` (nullable: n non-negative weights, e.g. a row of an importance matrix,
// tools/imatrix.h) weighs the error the scales minimise for Q2_K, Q3_K, IQ4_NL and IQ4_XS
// (quant/quant_lowbit.h); the other types do not use it.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n, const float* importance = nullptr);
// Whether quantize_row writes the type.
bool ggml_type_writable(GgmlType type);

}  // namespace clef
