// GFLOP/s of the packed linear layers (every backend, both precisions) on the yardstick 512x4096x4096 and the
// Clef-Flash projection shapes, next to the raw oneDNN bf16 matmul peak on the same machine.
//   bench_gemm --benchmark_counters_tabular=true
// Counter "GFLOPs" = 2 m n k / time; "peak_frac" = fraction of the oneDNN BF16 yardstick measured first.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "ops/attention_fast.h"
#include "ops/basic.h"
#include "ops/cpu.h"
#include "ops/delta_rule.h"
#include "ops/gemm.h"
#include "ops/int8_gemm.h"
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
    std::vector<float> xv(static_cast<size_t>(m * k) + 16, 0.5f), yv(static_cast<size_t>(m * n) + 16);
    // 64-byte aligned rows (as the engine's activation buffers should be).
    auto align = [](float* p) {
        return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
    };
    float* x = align(xv.data());
    float* y = align(yv.data());
    lin.forward(x, m, y, p);  // warm-up: primitive creation, scratch
    for (auto _ : st) {
        lin.forward(x, m, y, p);
        benchmark::DoNotOptimize(y);
    }
    const double flops = 2.0 * m * n * k;
    st.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
    if (g_peak > 0)
        st.counters["peak_frac"] =
            benchmark::Counter(flops / 1e9 / g_peak, benchmark::Counter::kIsIterationInvariantRate);
    st.SetLabel(lin.backend_name());
}

// The int8 path (ops/int8_gemm.h) on the same shapes: weights packed at load (range 3 = 0) or quantised again
// per call (1, a streamed GGUF matrix; its fp32 rows come from memory here, not from a file's blocks).
// "kernel_frac" = fraction of the int8 kernel's own in-cache peak (ops::int8_kernel_gops).
void BM_Int8(benchmark::State& st, bool streamed) {
    const int64_t m = st.range(0), k = st.range(1), n = st.range(2);
    const auto w16 = random_bf16(static_cast<size_t>(n * k), 1);
    std::vector<float> w(w16.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = clef::bf16_to_f32(w16[i]);
    const clef::ops::Int8Linear lin(
        [&](int64_t r0, int64_t nr, float* out) { std::copy_n(w.data() + r0 * k, nr * k, out); }, n, k,
        streamed);
    std::vector<float> x(static_cast<size_t>(m * k), 0.5f), y(static_cast<size_t>(m * n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.f;
    lin.forward(x.data(), m, y.data());
    for (auto _ : st) {
        lin.forward(x.data(), m, y.data());
        benchmark::DoNotOptimize(y.data());
    }
    static const double peak = clef::ops::int8_kernel_gops(20);
    const double flops = 2.0 * m * n * k;
    st.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
    st.counters["kernel_frac"] =
        benchmark::Counter(flops / 1e9 / peak, benchmark::Counter::kIsIterationInvariantRate);
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

// Causal attention over L tokens: fast (Exact / BF16) vs the scalar oracle. Args: L, hq, hkv, dh, kind
// (0 = ops::attention, 1 = fast Exact, 2 = fast BF16). GFLOPs counts 4 L^2/2 hq dh (QK^T and PV, causal
// half).
void BM_Attention(benchmark::State& st) {
    const int64_t L = st.range(0);
    const int hq = static_cast<int>(st.range(1)), hkv = static_cast<int>(st.range(2)),
              dh = static_cast<int>(st.range(3));
    const int kind = static_cast<int>(st.range(4));
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(L * hq * dh), k(L * hkv * dh), v(L * hkv * dh), o(L * hq * dh);
    for (auto* vec : {&q, &k, &v})
        for (float& x : *vec) x = nd(rng);
    const float scale = 1.f / std::sqrt(float(dh));
    for (auto _ : st) {
        if (kind == 0)
            clef::ops::attention(q.data(), hq * dh, k.data(), hkv * dh, v.data(), hkv * dh, L, L, hq, hkv, dh,
                                 scale, true, o.data(), hq * dh);
        else
            clef::ops::attention_fast(q.data(), hq * dh, k.data(), hkv * dh, v.data(), hkv * dh, L, L, hq,
                                      hkv, dh, scale, true, o.data(), hq * dh,
                                      kind == 1 ? Precision::Exact : Precision::BF16);
        benchmark::DoNotOptimize(o.data());
    }
    st.counters["GFLOPs"] =
        benchmark::Counter(2.0 * L * L * hq * dh / 1e9, benchmark::Counter::kIsIterationInvariantRate);
    st.SetLabel(kind == 0 ? "ops::attention" : kind == 1 ? "attention_fast Exact" : "attention_fast BF16");
}
BENCHMARK(BM_Attention)
    ->Args({2048, 16, 2, 256, 0})
    ->Args({2048, 16, 2, 256, 1})
    ->Args({2048, 16, 2, 256, 2})
    ->Args({4096, 16, 4, 256, 1})
    ->Args({4096, 16, 4, 256, 2})
    ->Args({2048, 4, 2, 32, 0})
    ->Args({2048, 4, 2, 32, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Gated delta rule over T tokens, Flash-like heads (Hk 16, Hv 32, dk = dv = 128). Arg 1: 0 serial, 1 chunked,
// 2 fast.
void BM_DeltaRule(benchmark::State& st) {
    const int64_t T = st.range(0);
    const int kind = static_cast<int>(st.range(1));
    const int Hk = 16, Hv = 32, dk = 128, dv = 128;
    std::mt19937 rng(2);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::vector<float> q(T * Hk * dk), k(T * Hk * dk), v(T * Hv * dv), beta(T * Hv), g(T * Hv),
        o(T * Hv * dv);
    for (auto* vec : {&q, &k, &v})
        for (float& x : *vec) x = nd(rng);
    clef::ops::l2_norm(q.data(), T * Hk, dk, 1e-6f, 1.f / std::sqrt(float(dk)), q.data());
    clef::ops::l2_norm(k.data(), T * Hk, dk, 1e-6f, 1.f, k.data());
    for (size_t i = 0; i < beta.size(); ++i) {
        beta[i] = u(rng);
        g[i] = -0.02f - 2.f * u(rng);
    }
    clef::ops::DeltaRuleArgs a;
    a.T = T;
    a.num_k_heads = Hk;
    a.num_v_heads = Hv;
    a.dk = dk;
    a.dv = dv;
    a.q = q.data();
    a.k = k.data();
    a.q_stride = a.k_stride = Hk * dk;
    a.v = v.data();
    a.v_stride = Hv * dv;
    a.beta = beta.data();
    a.g = g.data();
    a.beta_stride = a.g_stride = Hv;
    a.out = o.data();
    a.out_stride = Hv * dv;
    for (auto _ : st) {
        if (kind == 0)
            clef::ops::gated_delta_rule_serial(a);
        else if (kind == 1)
            clef::ops::gated_delta_rule_chunked(a);
        else
            clef::ops::gated_delta_rule_chunked_fast(a);
        benchmark::DoNotOptimize(o.data());
    }
    st.counters["tokens/s"] = benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
    st.SetLabel(kind == 0 ? "serial" : kind == 1 ? "chunked" : "chunked_fast");
}
BENCHMARK(BM_DeltaRule)
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Args({1024, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Fused elementwise kernels on a 512 x 4096 activation: scalar reference (0) vs fast (1). Arg 0: which kernel
// (0 rms_norm_zc, 1 silu_mul, 2 sigmoid_mul, 3 rms_norm_gated).
void BM_Fused(benchmark::State& st) {
    const int which = static_cast<int>(st.range(0));
    const bool fast = st.range(1) != 0;
    const int64_t rows = 512, d = 4096, n = rows * d;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(n), z(n), w(d), y(n);
    for (auto* vec : {&x, &z, &w})
        for (float& e : *vec) e = nd(rng);
    namespace o = clef::ops;
    for (auto _ : st) {
        switch (which) {
            case 0:
                (fast ? o::rms_norm_zc_fast : o::rms_norm_zc)(x.data(), rows, d, w.data(), 1e-6f, y.data());
                break;
            case 1:
                (fast ? o::silu_mul_fast : o::silu_mul)(x.data(), z.data(), n, y.data());
                break;
            case 2:
                (fast ? o::sigmoid_mul_fast : o::sigmoid_mul)(x.data(), z.data(), n, y.data());
                break;
            default:
                (fast ? o::rms_norm_gated_fast : o::rms_norm_gated)(x.data(), z.data(), rows, d, w.data(),
                                                                    1e-6f, y.data(), o::NormGate::Silu);
        }
        benchmark::DoNotOptimize(y.data());
    }
    static const char* names[] = {"rms_norm_zc", "silu_mul", "sigmoid_mul", "rms_norm_gated"};
    st.SetLabel(std::string(names[which]) + (fast ? " fast" : " scalar"));
    st.counters["Gelem/s"] =
        benchmark::Counter(double(n) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Fused)->ArgsProduct({{0, 1, 2, 3}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    std::printf("cpu: %s\n", clef::ops::cpu_features_string().c_str());
    try {
        g_peak = measure_peak();  // the yardstick first, so the other rows can report their fraction of it
        benchmark::RegisterBenchmark("OneDnnPeak_bf16/512/4096/4096", BM_OneDnnPeak)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    } catch (const dnnl::error&) {  // no bf16 matmul on this CPU (AVX2 class): rows without peak_frac
        std::printf("oneDNN bf16 yardstick: not available on this CPU\n");
    }
    const struct {
        const char* name;
        GemmBackend be;
        Precision p;
    } cases[] = {
        {"OneDnn_Exact", GemmBackend::OneDnn, Precision::Exact},
        {"OneDnn_BF16", GemmBackend::OneDnn, Precision::BF16},
        {"Simd_Exact", GemmBackend::Simd, Precision::Exact},
        {"Simd_BF16", GemmBackend::Simd, Precision::BF16},
    };
    for (const auto& c : cases) benchmark::RegisterBenchmark(c.name, BM_Linear, c.be, c.p)->Apply(shapes);
    benchmark::RegisterBenchmark("Int8_Packed", BM_Int8, false)->Apply(shapes);
    benchmark::RegisterBenchmark("Int8_Streamed", BM_Int8, true)->Apply(shapes);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
