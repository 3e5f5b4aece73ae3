// The int8 kernel yardstick against the hardware (docs/PERFORMANCE.md, "Int8 kernel yardstick"): for this
// process's CPU class (CLEF_MAX_ISA) and thread count (OMP_NUM_THREADS, default the physical cores),
//   dot rate   the rate of the multiply-add instructions the dispatched int8 kernel is built on, in registers
//              (12 independent accumulators, an asm loop): 512-bit vpdpbusd (AVX512-VNNI, 64 multiply-adds
//              per instruction), 256-bit VEX vpdpbusd (AVX-VNNI, 32), or AVX2's vpsignb + vpmaddubsw +
//              vpmaddwd + vpaddd (32 per four instructions); two operations per multiply-add;
//   fma rate   the same for vfmadd231ps on the widest vectors the class has (512 or 256 bits);
//   fp32 yard  the exact path's fp32 yardstick (oneDNN's fp32 matmul 512x4096x4096, what clef bench measures
//              exact precision against);
//   kernel     the int8 panel kernels with their operands in cache, signed and 4-bit nibble panels
//              (ops::int8_kernel_gops, clef bench's int8 yardstick),
// and the ratios: kernel / fp32 yardstick (the targets: >= 3x with AVX512-VNNI, >= 1.8x with
// AVX-VNNI,
// >= 1.3x on AVX2) and kernel / dot rate. The instruction mix of the kernels' loops: bench/int8_mix.py.
//   bench_int8 [iters]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu.h"
#include "ops/gemm.h"
#include "ops/int8_gemm.h"
#include "ops/int8_kernels.h"
#include "ops/simd.h"

namespace {

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr long kLoops = 20000000;  // ~0.1 s per thread and measure

#if defined(__x86_64__)
// kLoops iterations of the asm body (12 instructions on 12 accumulators) on every thread at once: seconds.
#define CLEF_X12(op, a, b, p)                                                                                \
    op " %%" a ", %%" b ", %%" p "0\n\t" op " %%" a ", %%" b ", %%" p "1\n\t" op " %%" a ", %%" b ", %%" p   \
       "2\n\t" op " %%" a ", %%" b ", %%" p "3\n\t" op " %%" a ", %%" b ", %%" p "4\n\t" op " %%" a ", %%" b \
       ", %%" p "5\n\t" op " %%" a ", %%" b ", %%" p "6\n\t" op " %%" a ", %%" b ", %%" p "7\n\t" op " %%" a \
       ", %%" b ", %%" p "8\n\t" op " %%" a ", %%" b ", %%" p "9\n\t" op " %%" a ", %%" b ", %%" p           \
       "10\n\t" op " %%" a ", %%" b ", %%" p "11\n\t"
#define CLEF_ASM_LOOP(body)                                                                                 \
    do {                                                                                                    \
        long n = kLoops;                                                                                    \
        __asm__ volatile("1:\n\t" body "dec %0\n\tjnz 1b"                                                   \
                         : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", \
                           "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");                   \
    } while (0)

__attribute__((target("avx512f"), noinline)) void fma512() {
    CLEF_ASM_LOOP(CLEF_X12("vfmadd231ps", "zmm12", "zmm13", "zmm"));
}
__attribute__((target("avx2,fma"), noinline)) void fma256() {
    CLEF_ASM_LOOP(CLEF_X12("vfmadd231ps", "ymm12", "ymm13", "ymm"));
}
__attribute__((target("avx512f,avx512vnni"), noinline)) void dp512() {
    CLEF_ASM_LOOP(CLEF_X12("vpdpbusd", "zmm12", "zmm13", "zmm"));
}
__attribute__((target("avx2,avxvnni"), noinline)) void dp256() {
    CLEF_ASM_LOOP(CLEF_X12("%{vex%} vpdpbusd", "ymm12", "ymm13", "ymm"));
}
// AVX2's four instructions per 32 multiply-adds (int8_kernels.cpp's Avx2), six chains.
__attribute__((target("avx2"), noinline)) void avx2_dot() {
    CLEF_ASM_LOOP(
        "vpsignb %%ymm12, %%ymm13, %%ymm6\n\t vpsignb %%ymm12, %%ymm13, %%ymm7\n\t"
        "vpsignb %%ymm12, %%ymm13, %%ymm8\n\t vpsignb %%ymm12, %%ymm13, %%ymm9\n\t"
        "vpsignb %%ymm12, %%ymm13, %%ymm10\n\t vpsignb %%ymm12, %%ymm13, %%ymm11\n\t"
        "vpmaddubsw %%ymm6, %%ymm14, %%ymm6\n\t vpmaddubsw %%ymm7, %%ymm14, %%ymm7\n\t"
        "vpmaddubsw %%ymm8, %%ymm14, %%ymm8\n\t vpmaddubsw %%ymm9, %%ymm14, %%ymm9\n\t"
        "vpmaddubsw %%ymm10, %%ymm14, %%ymm10\n\t vpmaddubsw %%ymm11, %%ymm14, %%ymm11\n\t"
        "vpmaddwd %%ymm6, %%ymm15, %%ymm6\n\t vpmaddwd %%ymm7, %%ymm15, %%ymm7\n\t"
        "vpmaddwd %%ymm8, %%ymm15, %%ymm8\n\t vpmaddwd %%ymm9, %%ymm15, %%ymm9\n\t"
        "vpmaddwd %%ymm10, %%ymm15, %%ymm10\n\t vpmaddwd %%ymm11, %%ymm15, %%ymm11\n\t"
        "vpaddd %%ymm6, %%ymm0, %%ymm0\n\t vpaddd %%ymm7, %%ymm1, %%ymm1\n\t vpaddd %%ymm8, %%ymm2, "
        "%%ymm2\n\t"
        "vpaddd %%ymm9, %%ymm3, %%ymm3\n\t vpaddd %%ymm10, %%ymm4, %%ymm4\n\t vpaddd %%ymm11, %%ymm5, "
        "%%ymm5\n\t");
}
#endif

// G operations per second of fn (ops_per_loop operations per asm iteration) on `threads` threads at once.
double rate(void (*fn)(), double ops_per_loop, int threads) {
    double worst = 0;
#pragma omp parallel num_threads(threads) reduction(max : worst)
    {
        fn();  // warm: clocks up
        const double t0 = now();
        fn();
        worst = now() - t0;
    }
    return threads * ops_per_loop * kLoops / worst / 1e9;
}

struct Rates {
    const char* dot = "";
    double dot_1 = 0, dot_all = 0;
    const char* fma = "";
    double fma_1 = 0, fma_all = 0;
};

// The dot-product and FMA rates of this CPU class: the kernel's instruction set as int8_kernels.cpp picks it.
Rates hardware_rates(int threads) {
    Rates r;
#if defined(__x86_64__)
    const clef::ops::CpuFeatures& f = clef::ops::cpu_features();
    const std::string ext = clef::ops::i8::kernel_extension();
    void (*dot)() = nullptr;
    double per_loop = 0;
    if (ext == "avx512-vnni") {
        r.dot = "vpdpbusd zmm", dot = dp512, per_loop = 12 * 64 * 2;
    } else if (ext == "avx-vnni") {
        r.dot = "vpdpbusd ymm (VEX)", dot = dp256, per_loop = 12 * 32 * 2;
    } else if (f.avx2) {
        r.dot = "vpsignb+vpmaddubsw+vpmaddwd+vpaddd ymm", dot = avx2_dot, per_loop = 6 * 32 * 2;
    }
    if (dot) {
        r.dot_1 = rate(dot, per_loop, 1);
        r.dot_all = rate(dot, per_loop, threads);
    }
    void (*fma)() = f.has_avx512() ? fma512 : f.avx2 ? fma256 : nullptr;
    r.fma = f.has_avx512() ? "vfmadd231ps zmm" : "vfmadd231ps ymm";
    const double fma_loop = 12.0 * (f.has_avx512() ? 16 : 8) * 2;
    if (fma) {
        r.fma_1 = rate(fma, fma_loop, 1);
        r.fma_all = rate(fma, fma_loop, threads);
    }
#else
    (void)threads;
#endif
    return r;
}

// GOP/s of Int8Linear::forward in place (best of `iters`): m rows of k against n packed signed-panel columns,
// the weights from memory and the activations quantised on every call, as a decision runs a projection.
double in_situ_gops(int64_t m, int64_t k, int64_t n, int iters) {
    namespace ops = clef::ops;
    const auto value = [](int64_t i) { return static_cast<float>((i * 7919) % 2001 - 1000) / 1000.0f; };
    const ops::Int8Linear w(
        [&](int64_t r0, int64_t nr, float* out) {
            for (int64_t i = 0; i < nr * k; ++i) out[i] = value(r0 * k + i);
        },
        n, k, false);
    std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = value(static_cast<int64_t>(i) * 31);
    double best = 0;
    for (int it = 0; it <= iters; ++it) {
        const double t0 = now();
        w.forward(x.data(), m, y.data());
        if (it > 0) best = std::max(best, 2.0 * m * k * n / (now() - t0) / 1e9);
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    namespace ops = clef::ops;
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    const int threads = ops::num_threads();
    const std::string ext = ops::i8::kernel_extension();
    std::printf("cpu: %s; simd %s; int8 kernels %s; %d threads\n", ops::cpu_features_string().c_str(),
                ops::simd_target().c_str(), ext.empty() ? "(no extension)" : ext.c_str(), threads);
    const Rates hw = hardware_rates(threads);
    const double yard = ops::dnnl_matmul_gflops(false, 512, 4096, 4096, 5);
    const double signed_gops = ops::int8_kernel_gops(iters, 0), level_gops = ops::int8_kernel_gops(iters, 4);
    const double best = std::max(signed_gops, level_gops);
    std::printf("| measure | 1 thread | %d threads |\n|---|---|---|\n", threads);
    std::printf("| dot rate: %s, GOP/s | %.0f | %.0f |\n", hw.dot, hw.dot_1, hw.dot_all);
    std::printf("| fma rate: %s, GFLOP/s | %.0f | %.0f |\n", hw.fma, hw.fma_1, hw.fma_all);
    std::printf("| fp32 yardstick: oneDNN fp32 matmul 512x4096x4096, GFLOP/s | | %.0f |\n", yard);
    std::printf("| int8 kernel in cache, signed panels, GOP/s | | %.0f |\n", signed_gops);
    std::printf("| int8 kernel in cache, 4-bit nibble panels, GOP/s | | %.0f |\n", level_gops);
    if (yard > 0) std::printf("| kernel / fp32 yardstick | | %.2fx |\n", best / yard);
    if (hw.dot_all > 0) std::printf("| kernel / dot rate | | %.0f %% |\n", 100.0 * best / hw.dot_all);
    if (hw.fma_all > 0) std::printf("| dot rate / fma rate | | %.2fx |\n", hw.dot_all / hw.fma_all);
    // Clef-Flash's two MLP shapes at 512 tokens, in place against the kernel in cache.
    for (const auto& [k, n] : {std::pair<int64_t, int64_t>{4096, 12288}, {12288, 4096}}) {
        const double g = in_situ_gops(512, k, n, std::max(2, iters / 4));
        std::printf(
            "| int8 in place, 512 x %lld -> %lld, GOP/s (of the signed kernel in cache) | | %.0f (%.0f %%) "
            "|\n",
            static_cast<long long>(k), static_cast<long long>(n), g, 100.0 * g / signed_gops);
    }
    return 0;
}
