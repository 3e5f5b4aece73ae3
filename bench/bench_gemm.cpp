// GFLOP/s of the packed linear layers (every backend, both precisions) on the yardstick 512x4096x4096 and the
// Clef-Flash projection shapes, next to the raw oneDNN bf16 matmul peak on the same machine.
//   bench_gemm --benchmark_counters_tabular=true
// Counter "GFLOPs" = 2 m n k / time; "peak_frac" = fraction of the oneDNN BF16 yardstick measured first.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu.h"
#include "ops/gemm.h"
#include "util/half.h"

namespace {

using clef::ops::GemmBackend;
using clef::ops::PackedLinear;
using clef::ops::Precision;
using clef::ops::WeightType;

double g_peak = 0;  // GFLOP/s of the raw oneDNN bf16 matmul, 512x4096x4096

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 0.02f);
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = clef::f32_to_bf16(d(rng));
    return v;
}

// Raw oneDNN: bf16 src, blocked bf16 weights, f32 dst, no conversions around it.
struct RawOneDnn {
    static constexpr int64_t m = 512, k = 4096, n = 4096;
    dnnl::engine eng{dnnl::engine::kind::cpu, 0};
    dnnl::stream s{eng};
    dnnl::matmul::primitive_desc pd;
    dnnl::memory am, wm, cm;
    dnnl::matmul prim;
    RawOneDnn() {
        using dt = dnnl::memory::data_type;
        using tag = dnnl::memory::format_tag;
        const dnnl::memory::desc a({m, k}, dt::bf16, tag::ab), w({k, n}, dt::bf16, tag::any),
            c({m, n}, dt::f32, tag::ab);
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, w, c), eng);
        am = dnnl::memory(a, eng);
        wm = dnnl::memory(pd.weights_desc(), eng);
        cm = dnnl::memory(c, eng);
        std::fill_n(static_cast<uint16_t*>(am.get_data_handle()), m * k, uint16_t(0x3c00));
        std::fill_n(static_cast<uint8_t*>(wm.get_data_handle()), pd.weights_desc().get_size(), uint8_t(0x3c));
        prim = dnnl::matmul(pd);
    }
    void run() {
        prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}});
        s.wait();
    }
};

void BM_OneDnnPeak(benchmark::State& st) {
    clef::ops::num_threads();
    RawOneDnn g;
    for (auto _ : st) g.run();
    st.counters["GFLOPs"] =
        benchmark::Counter(2.0 * g.m * g.n * g.k / 1e9, benchmark::Counter::kIsIterationInvariantRate);
    st.SetLabel(std::string(g.pd.impl_info_str()) + ", " + std::to_string(clef::ops::num_threads()) +
                " threads");
}

// Best of a few runs, printed before the table and used for peak_frac.
double measure_peak() {
    clef::ops::num_threads();
    RawOneDnn g;
    g.run();
    double best = 1e30;
    for (int i = 0; i < 10; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        g.run();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double gf = 2.0 * g.m * g.n * g.k / best / 1e9;
    std::printf("oneDNN bf16 yardstick 512x4096x4096: %.0f GFLOP/s (%s, %d threads)\n", gf,
                g.pd.impl_info_str(), clef::ops::num_threads());
    return gf;
}

void BM_Linear(benchmark::State& st, GemmBackend be, Precision p) {
    const int64_t m = st.range(0), k = st.range(1), n = st.range(2);
    if (!PackedLinear::backend_available(be, WeightType::BF16)) {
        st.SkipWithError("backend not available");
        return;
    }
    const auto w = random_bf16(static_cast<size_t>(n * k), 1);
    PackedLinear lin({w.data(), WeightType::BF16}, n, k, be);
    std::vector<float> x(static_cast<size_t>(m * k), 0.5f), y(static_cast<size_t>(m * n));
    lin.forward(x.data(), m, y.data(), p);  // warm-up: primitive creation, scratch
    for (auto _ : st) {
        lin.forward(x.data(), m, y.data(), p);
        benchmark::DoNotOptimize(y.data());
    }
    const double flops = 2.0 * m * n * k;
    st.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
    if (g_peak > 0)
        st.counters["peak_frac"] =
            benchmark::Counter(flops / 1e9 / g_peak, benchmark::Counter::kIsIterationInvariantRate);
    st.SetLabel(lin.backend_name());
}

void shapes(benchmark::internal::Benchmark* b) {
    b->Args({512, 4096, 4096});
    for (int64_t m : {512}) {
        b->Args({m, 4096, 8192});
        b->Args({m, 4096, 12288});
        b->Args({m, 12288, 4096});
    }
    b->Args({64, 4096, 4096});
    b->Args({7, 4096, 4096});
    b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    std::printf("cpu: %s\n", clef::ops::cpu_features_string().c_str());
    g_peak = measure_peak();  // the yardstick first, so the other rows can report their fraction of it
    benchmark::RegisterBenchmark("OneDnnPeak_bf16/512/4096/4096", BM_OneDnnPeak)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    const struct {
        const char* name;
        GemmBackend be;
        Precision p;
    } cases[] = {
        {"OneDnn_Exact", GemmBackend::OneDnn, Precision::Exact},
        {"OneDnn_BF16", GemmBackend::OneDnn, Precision::BF16},
        {"Avx512_Exact", GemmBackend::Avx512, Precision::Exact},
        {"Avx512_BF16", GemmBackend::Avx512, Precision::BF16},
    };
    for (const auto& c : cases) benchmark::RegisterBenchmark(c.name, BM_Linear, c.be, c.p)->Apply(shapes);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
