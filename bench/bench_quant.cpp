// Quantisation and dequantisation throughput per ggml type (single thread), on one 4096-value row of
// N(0, 1)-like values (fixed-seed PRNG). items_per_second = values per second. Quantisation speed sets
// `clef convert`'s time (K-quants search scales per sub-block); dequantisation speed sets GGUF load time.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "quant/quant.h"

namespace {

using clef::GgmlType;
constexpr int64_t kN = 4096;

std::vector<float> values() {
    std::vector<float> x(kN);
    uint64_t s = 42;
    for (float& v : x) {  // sum of 4 uniforms: roughly normal
        float acc = 0;
        for (int k = 0; k < 4; ++k) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            acc += static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f;
        }
        v = acc * 1.7f;
    }
    return x;
}

std::vector<unsigned char> buffer(GgmlType t) {
    return std::vector<unsigned char>(
        clef::ggml_row_bytes(clef::ggml_type_traits(static_cast<uint32_t>(t)), kN));
}

void BM_Quantize(benchmark::State& st, GgmlType t) {
    const std::vector<float> x = values();
    std::vector<unsigned char> q = buffer(t);
    for (auto _ : st) {
        clef::quantize_row(t, x.data(), q.data(), kN);
        benchmark::DoNotOptimize(q.data());
    }
    st.SetItemsProcessed(st.iterations() * kN);
}

void BM_DequantizeBf16(benchmark::State& st, GgmlType t) {
    const std::vector<float> x = values();
    std::vector<unsigned char> q = buffer(t);
    clef::quantize_row(t, x.data(), q.data(), kN);
    std::vector<uint16_t> y(kN);
    for (auto _ : st) {
        clef::dequantize_row_bf16(t, q.data(), y.data(), kN);
        benchmark::DoNotOptimize(y.data());
    }
    st.SetItemsProcessed(st.iterations() * kN);
}

// The same with the vector kernels off: the scalar references.
void BM_DequantizeBf16Scalar(benchmark::State& st, GgmlType t) {
    clef::set_quant_simd(false);
    BM_DequantizeBf16(st, t);
    clef::set_quant_simd(true);
}

#define CLEF_QUANT_BENCH(T)                               \
    BENCHMARK_CAPTURE(BM_Quantize, T, GgmlType::T);       \
    BENCHMARK_CAPTURE(BM_DequantizeBf16, T, GgmlType::T); \
    BENCHMARK_CAPTURE(BM_DequantizeBf16Scalar, T, GgmlType::T);

CLEF_QUANT_BENCH(Q8_0)
CLEF_QUANT_BENCH(Q4_0)
CLEF_QUANT_BENCH(Q5_1)
CLEF_QUANT_BENCH(Q4_K)
CLEF_QUANT_BENCH(Q5_K)
CLEF_QUANT_BENCH(Q6_K)
CLEF_QUANT_BENCH(Q2_K)
CLEF_QUANT_BENCH(Q3_K)
CLEF_QUANT_BENCH(IQ4_NL)
CLEF_QUANT_BENCH(IQ4_XS)
CLEF_QUANT_BENCH(IQ3_S)
CLEF_QUANT_BENCH(IQ3_XXS)
CLEF_QUANT_BENCH(IQ2_S)
CLEF_QUANT_BENCH(IQ2_XS)
CLEF_QUANT_BENCH(IQ2_XXS)

}  // namespace

BENCHMARK_MAIN();
