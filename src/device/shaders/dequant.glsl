// Weights of a [N][K] matrix in a ggml block type, read where they lie in the file's bytes, 8 values of a row at
// a time: what the GEMMs' tile loads call (gemm_tile.glsl). The layouts and the arithmetic are those of ops/quant_blocks.h,
// quant/quant.cpp, quant/dequant_lowbit.cpp and ops/iq_groups.h, operation for operation (products and
// differences rounded separately: `precise` keeps the compiler from fusing them), so a weight widens to the
// same value as on the CPU (quant/quant.h dequantize_row_bf16: fp32, then bf16). The i-quants' grids come in a table buffer (binding 4) that the host fills
// from ops/iq_tables.h in the order of the TAB_ offsets below (device/vk_device.cpp iq_table_words).
//
// The including shader declares `w` (uint words, binding 1), `tab` (uint words, binding 4) and WTYPE:
//   3 Q8_0, 4 Q4_0, 5 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q2_K, 9 Q3_K, 10 Q4_K, 11 Q5_K, 12 Q6_K, 13 IQ4_NL, 14 IQ4_XS,
//   15 IQ2_XXS, 16 IQ2_XS, 17 IQ2_S, 18 IQ3_XXS, 19 IQ3_S, 20 IQ1_S, 21 IQ1_M.

// Word offsets of the tables (64-bit grid entries take two words, 32-bit ones one; bytes little-endian).
#define TAB_IQ2XXS 0u     // 256 x 8 bytes
#define TAB_IQ2XS 512u    // 512 x 8
#define TAB_IQ2S 1536u    // 1024 x 8
#define TAB_IQ3XXS 3584u  // 256 x 4
#define TAB_IQ3S 3840u    // 512 x 4
#define TAB_IQ1S 4352u    // 2048 x 8 (int8 levels)
#define TAB_SIGNS 8448u   // 128 bytes
#define TAB_IQ4NL 8480u   // 16 int8 levels
#define TAB_WORDS 8484u

uint byte_at(uint b) { return (w[b >> 2] >> (8u * (b & 3u))) & 0xffu; }
uint u16_at(uint b) { return byte_at(b) | (byte_at(b + 1u) << 8); }
uint u32_at(uint b) { return u16_at(b) | (u16_at(b + 2u) << 16); }
int i8_at(uint b) { return int(byte_at(b) << 24) >> 24; }
float half_at(uint b) { return unpackHalf2x16(u16_at(b)).x; }

uint tab_byte(uint word0, uint b) { return (tab[word0 + (b >> 2)] >> (8u * (b & 3u))) & 0xffu; }
int tab_i8(uint word0, uint b) { return int(tab_byte(word0, b) << 24) >> 24; }

// Block values and bytes of each type.
#if WTYPE == 3
#define QK 32u
#define BS 34u
#elif WTYPE == 4 || WTYPE == 13
#define QK 32u
#define BS 18u
#elif WTYPE == 5
#define QK 32u
#define BS 20u
#elif WTYPE == 6
#define QK 32u
#define BS 22u
#elif WTYPE == 7
#define QK 32u
#define BS 24u
#else
#define QK 256u
#endif
#if WTYPE == 8
#define BS 84u
#elif WTYPE == 9 || WTYPE == 19
#define BS 110u
#elif WTYPE == 10
#define BS 144u
#elif WTYPE == 11
#define BS 176u
#elif WTYPE == 12
#define BS 210u
#elif WTYPE == 14
#define BS 136u
#elif WTYPE == 15
#define BS 66u
#elif WTYPE == 16
#define BS 74u
#elif WTYPE == 17
#define BS 82u
#elif WTYPE == 18
#define BS 98u
#elif WTYPE == 20
#define BS 50u
#elif WTYPE == 21
#define BS 56u
#endif

// The nibble of value j0 + i (j0 a multiple of 8, i < 8) of a 32-value block whose 16 bytes start at q: low
// nibbles first.
uint nibble32(uint q, uint j0, uint i) { return (byte_at(q + (j0 & 15u) + i) >> (j0 < 16u ? 0u : 4u)) & 15u; }

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block whose 12 scale bytes start at s.
void scale_min_k4(uint j, uint s, out uint sc, out uint m) {
    if (j < 4u) {
        sc = byte_at(s + j) & 63u;
        m = byte_at(s + j + 4u) & 63u;
    } else {
        sc = (byte_at(s + j + 4u) & 15u) | ((byte_at(s + j - 4u) >> 6) << 4);
        m = (byte_at(s + j + 4u) >> 4) | ((byte_at(s + j) >> 6) << 4);
    }
}

// The 4-bit IQ2 scale of group g (per 16 values) from the scale bytes at s, as a factor of d.
float iq2_scale(float d, uint code) {
    precise float r = d * (0.5 + float(code)) * 0.25;
    return r;
}
uint iq2_code(uint s, uint g) { return (byte_at(s + g / 4u) >> (4u * ((g % 4u) / 2u))) & 15u; }

// db * mag, negated where bit jj of signs is set (ops/iq_groups.h IqGroup).
float signed_mag(float db, uint mag, uint signs, uint jj) {
    precise float v = db * float(mag);
    return ((signs >> jj) & 1u) != 0u ? -v : v;
}

// Value j = j0 + i (j0 a multiple of 8, i < 8) of the block at byte b. No sub-block of any type is narrower
// than 8 values, so everything decoded from j / N or j < N (N a multiple of 8) depends on j0 alone: the
// 8 values of a run share their scale decoding (dequant8), which the compiler hoists out of the unrolled run.
float dequant(uint b, uint j0, uint i) {
#if WTYPE == 3
    return half_at(b) * float(i8_at(b + 2u + j0 + i));
#elif WTYPE == 4
    precise float v = float(int(nibble32(b + 2u, j0, i)) - 8) * half_at(b);
    return v;
#elif WTYPE == 5
    precise float v = float(nibble32(b + 4u, j0, i)) * half_at(b) + half_at(b + 2u);
    return v;
#elif WTYPE == 6
    uint h = (u32_at(b + 2u) >> (j0 + i)) & 1u;
    precise float v = float(int(nibble32(b + 6u, j0, i) | (h << 4)) - 16) * half_at(b);
    return v;
#elif WTYPE == 7
    uint h = (u32_at(b + 4u) >> (j0 + i)) & 1u;
    precise float v = float(nibble32(b + 8u, j0, i) | (h << 4)) * half_at(b) + half_at(b + 2u);
    return v;
#elif WTYPE == 8  // Q2_K: 16 sub-blocks of 16
    uint k = j0 / 16u, l = j0 % 16u + i, h = k / 8u, s = (k / 2u) % 4u, p = k % 2u, sc = byte_at(b + k);
    precise float dl = half_at(b + 80u) * float(sc & 15u);
    precise float ml = half_at(b + 82u) * float(sc >> 4);
    precise float v = dl * float((byte_at(b + 16u + 32u * h + 16u * p + l) >> (2u * s)) & 3u) - ml;
    return v;
#elif WTYPE == 9  // Q3_K
    uint k = j0 / 16u, l = j0 % 16u + i, h = k / 8u, s = (k / 2u) % 4u, p = k % 2u;
    uint sc = ((byte_at(b + 96u + k % 8u) >> (4u * (k / 8u))) & 15u) |
              (((byte_at(b + 104u + k % 4u) >> (2u * (k / 4u))) & 3u) << 4);
    precise float dl = half_at(b + 108u) * float(int(sc) - 32);
    int q = int((byte_at(b + 32u + 32u * h + 16u * p + l) >> (2u * s)) & 3u);
    bool high = (byte_at(b + 16u * p + l) & (1u << (4u * h + s))) != 0u;
    precise float v = dl * float(q - (high ? 0 : 4));
    return v;
#elif WTYPE == 10 || WTYPE == 11  // Q4_K, Q5_K: 4 groups of 64, low nibbles then high nibbles
    uint g = j0 / 64u, hi = (j0 % 64u) / 32u, l = j0 % 32u + i, sc, m;
    scale_min_k4(2u * g + hi, b + 4u, sc, m);
    precise float d1 = half_at(b) * float(sc);
    precise float m1 = half_at(b + 2u) * float(m);
#if WTYPE == 10
    uint q = (byte_at(b + 16u + 32u * g + l) >> (4u * hi)) & 15u;
#else
    uint q = ((byte_at(b + 48u + 32u * g + l) >> (4u * hi)) & 15u) +
             ((byte_at(b + 16u + l) & (1u << (2u * g + hi))) != 0u ? 16u : 0u);
#endif
    precise float v = d1 * float(q) - m1;
    return v;
#elif WTYPE == 12  // Q6_K: two halves of 128, four quarters of 32
    uint half_ = j0 / 128u, quarter = (j0 % 128u) / 32u, l = j0 % 32u + i;
    uint ql = (byte_at(b + 64u * half_ + 32u * (quarter & 1u) + l) >> (quarter < 2u ? 0u : 4u)) & 15u;
    uint qh = (byte_at(b + 128u + 32u * half_ + l) >> (2u * quarter)) & 3u;
    int sc = i8_at(b + 192u + 8u * half_ + (j0 % 32u) / 16u + 2u * quarter);
    precise float v = half_at(b + 208u) * float(sc) * float(int(ql | (qh << 4)) - 32);
    return v;
#elif WTYPE == 13  // IQ4_NL
    precise float v = half_at(b) * float(tab_i8(TAB_IQ4NL, nibble32(b + 2u, j0, i)));
    return v;
#elif WTYPE == 14  // IQ4_XS: 8 groups of 32
    uint ib = j0 / 32u;
    uint s = ((byte_at(b + 4u + ib / 2u) >> (4u * (ib % 2u))) & 15u) | (((u16_at(b + 2u) >> (2u * ib)) & 3u) << 4);
    precise float dl = half_at(b) * float(int(s) - 32);
    precise float v = dl * float(tab_i8(TAB_IQ4NL, nibble32(b + 8u + 16u * ib, j0 % 32u, i)));
    return v;
#else  // the grid i-quants: 32 groups of 8
    uint g = j0 / 8u, jj = i;
#if WTYPE == 15  // IQ2_XXS
    uint q = b + 2u + 8u * (g / 4u), aux = u32_at(q + 4u);
    float db = iq2_scale(half_at(b), aux >> 28);
    uint signs = tab_byte(TAB_SIGNS, (aux >> (7u * (g % 4u))) & 127u);
    return signed_mag(db, tab_byte(TAB_IQ2XXS + 2u * byte_at(q + g % 4u), jj), signs, jj);
#elif WTYPE == 16  // IQ2_XS
    uint q = u16_at(b + 2u + 2u * g);
    float db = iq2_scale(half_at(b), iq2_code(b + 66u, g));
    return signed_mag(db, tab_byte(TAB_IQ2XS + 2u * (q & 511u), jj), tab_byte(TAB_SIGNS, q >> 9), jj);
#elif WTYPE == 17  // IQ2_S
    uint idx = byte_at(b + 2u + g) | (((byte_at(b + 66u + g / 4u) >> (2u * (g % 4u))) & 3u) << 8);
    float db = iq2_scale(half_at(b), iq2_code(b + 74u, g));
    return signed_mag(db, tab_byte(TAB_IQ2S + 2u * idx, jj), byte_at(b + 34u + g), jj);
#elif WTYPE == 18  // IQ3_XXS
    uint aux = u32_at(b + 66u + 4u * (g / 4u));
    precise float db = half_at(b) * (0.5 + float(aux >> 28)) * 0.5;
    uint signs = tab_byte(TAB_SIGNS, (aux >> (7u * (g % 4u))) & 127u);
    uint entry = byte_at(b + 2u + 2u * g + jj / 4u);
    return signed_mag(db, tab_byte(TAB_IQ3XXS + entry, jj % 4u), signs, jj);
#elif WTYPE == 19  // IQ3_S
    uint n = 2u * g + jj / 4u, ib = g / 4u;
    uint idx = byte_at(b + 2u + n) | (((byte_at(b + 66u + n / 8u) >> (n % 8u)) & 1u) << 8);
    uint s = (byte_at(b + 106u + ib / 2u) >> (4u * (ib % 2u))) & 15u;
    precise float db = half_at(b) * float(1u + 2u * s);
    return signed_mag(db, tab_byte(TAB_IQ3S + idx, jj % 4u), byte_at(b + 74u + g), jj);
#elif WTYPE == 20  // IQ1_S
    uint qh = u16_at(b + 34u + 2u * (g / 4u));
    precise float dl = half_at(b) * float(2u * ((qh >> 12) & 7u) + 1u);
    float delta = (qh & 0x8000u) != 0u ? -0.125 : 0.125;
    uint idx = byte_at(b + 2u + g) | (((qh >> (3u * (g % 4u))) & 7u) << 8);
    precise float v = dl * (float(tab_i8(TAB_IQ1S + 2u * idx, jj)) + delta);
    return v;
#elif WTYPE == 21  // IQ1_M
    uint s0 = u16_at(b + 48u), s1 = u16_at(b + 50u), s2 = u16_at(b + 52u), s3 = u16_at(b + 54u);
    float d = unpackHalf2x16((s0 >> 12) | ((s1 >> 8) & 0xf0u) | ((s2 >> 4) & 0xf00u) | (s3 & 0xf000u)).x;
    uint n = (byte_at(b + 32u + g / 2u) >> (4u * (g % 2u))) & 15u;
    uint sg = u16_at(b + 48u + 2u * (g / 8u));
    precise float dl = d * float(2u * ((sg >> (3u * ((g / 2u) % 4u))) & 7u) + 1u);
    float delta = (n & 8u) != 0u ? -0.125 : 0.125;
    uint idx = byte_at(b + g) | ((n & 7u) << 8);
    precise float v = dl * (float(tab_i8(TAB_IQ1S + 2u * idx, jj)) + delta);
    return v;
#endif
#endif
}

// Elements (o, k .. k+7) of the matrix (k a multiple of 8): rows of K / QK whole blocks, each value rounded to
// bf16 (to nearest even) as the CPU's row provider rounds them (docs/GGUF.md: compute runs on bf16 weights),
// so both devices multiply by the same weights. The run lies in one block and one sub-block.
void dequant8(uint o, uint k, uint K, out float v[8]) {
    uint b = (o * (K / QK) + k / QK) * BS, j0 = k % QK;
    [[unroll]] for (uint i = 0u; i < 8u; ++i) v[i] = uintBitsToFloat(bf16_bits(dequant(b, j0, i)) << 16);
}
