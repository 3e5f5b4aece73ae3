// The x86 VNNI bodies of the int8 panel kernels (ops/int8_kernels.cpp), included by it twice in each Highway
// target of AVX2 and above, once per encoding of vpdpbusd, with
//   CLEF_VNNI_NS      the namespace of the copy,
//   CLEF_VNNI_ATTR    its functions' target attribute (added to the Highway target's options),
//   CLEF_VNNI_DPBUSD  that encoding's 256-bit vpdpbusd intrinsic:
// a function template cannot take its target attribute from a template argument, and the intrinsic only
// inlines into functions compiled for its extension, so the one body is compiled twice this way. No include
// guard (on purpose). Uses broadcast4, add_block, add_level_block and store_rows of int8_kernels.cpp
// (inlined: their target's options are a subset of CLEF_VNNI_ATTR's). The blocks' integer sums are the AVX2
// kernels' and the twins' exactly (int8_kernels.cpp says why), and the fp32 epilogue is the AVX2 kernels' own
// code.

namespace CLEF_VNNI_NS {

// panel_rows_avx2 with one vpdpbusd per row and step in place of vpmaddubsw + vpmaddwd + vpaddd. The weights'
// signs still move onto the activations (vpsignb): vpdpbusd's first operand is unsigned.
template <int R>
CLEF_VNNI_ATTR void panel_rows(const int8_t* xq, const float* xs, int64_t nb, const unsigned char* panel,
                               int ncols, float* y, int64_t ldy) {
    const int64_t kp = nb * kI8Block;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const unsigned char* pb = panel + b * kI8PanelBlockBytes;
        __m256i sum[R];
        for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
        for (int st = 0; st < kI8Block / 4; ++st) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + st * 32));
            const __m256i aw = _mm256_abs_epi8(w);
            for (int r = 0; r < R; ++r) {
                const __m256i xv = _mm256_sign_epi8(broadcast4(xq + r * kp + b * kI8Block + st * 4), w);
                sum[r] = CLEF_VNNI_DPBUSD(sum[r], aw, xv);
            }
        }
        add_block<R>(acc, sum, pb, xs, nb, b);
    }
    store_rows<R>(acc, ncols, y, ldy);
}

// level_rows_avx2 with one vpdpbusd per row and step: the levels (u < 32) are the unsigned operand as they
// are, every step goes straight into the int32 sums (no 16-bit pair sums to widen, whatever the bits).
template <int R>
CLEF_VNNI_ATTR void level_rows(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t nb,
                               const unsigned char* panel, int ncols, float* y, int64_t ldy) {
    const int64_t kp = nb * kI8Block;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const unsigned char* pb = panel + b * kU8PanelBlockBytes;
        __m256i sum[R];
        for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
        for (int st = 0; st < kI8Block / 4; ++st) {
            const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + st * 32));
            for (int r = 0; r < R; ++r)
                sum[r] = CLEF_VNNI_DPBUSD(sum[r], u, broadcast4(xq + r * kp + b * kI8Block + st * 4));
        }
        add_level_block<R>(acc, sum, pb, xs, xsum, nb, b);
    }
    store_rows<R>(acc, ncols, y, ldy);
}

}  // namespace CLEF_VNNI_NS
