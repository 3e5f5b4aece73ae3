#include "ops/cpu.h"

#include <omp.h>

#include <hwy/targets.h>
#if CLEF_HAVE_DNNL
#include <dnnl.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <unistd.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#endif

namespace clef::ops {

namespace {

int read_int(const std::string& path, int fallback) {
    std::ifstream f(path);
    int v = fallback;
    if (!(f >> v)) return fallback;
    return v;
}

int count_physical_cores(int logical) {
    std::set<std::pair<int, int>> cores;
    for (int c = 0; c < 4096; ++c) {
        const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
        const int core = read_int(base + "core_id", -1);
        if (core < 0) {
            if (c >= logical) break;
            continue;
        }
        cores.insert({read_int(base + "physical_package_id", 0), core});
    }
    return cores.empty() ? logical : static_cast<int>(cores.size());
}

#if defined(__aarch64__)
// aarch64's CLEF_MAX_ISA levels (ops/cpu.h): only the int8 kernels' extensions are capped; Highway's NEON
// target is the baseline and stays.
void apply_cap(CpuFeatures& f) {
    const char* e = std::getenv("CLEF_MAX_ISA");
    const std::string name = e ? e : "native";
    if (name == "baseline" || name == "neon") {
        f.asimd_dotprod = f.i8mm = false;
    } else if (name == "dotprod") {
        f.i8mm = false;
    } else {
        return;  // native, or an x86 level
    }
    f.isa_cap = name;
}
#else
// CLEF_MAX_ISA levels, lowest first.
enum class Isa { Baseline, Sse4, Avx2, AvxVnni, Avx512, Avx512Vnni, Avx512Bf16, Native };

Isa isa_cap(std::string& name) {
    const char* e = std::getenv("CLEF_MAX_ISA");
    name = e ? e : "native";
    static const std::pair<const char*, Isa> levels[] = {
        {"baseline", Isa::Baseline},     {"sse4", Isa::Sse4},     {"avx2", Isa::Avx2},
        {"avx_vnni", Isa::AvxVnni},      {"avx512", Isa::Avx512}, {"avx512_vnni", Isa::Avx512Vnni},
        {"avx512_bf16", Isa::Avx512Bf16}};
    for (const auto& [n, level] : levels)
        if (name == n) return level;
    name = "native";
    return Isa::Native;
}

// Clears the features above the cap and tells Highway and oneDNN (before either picks an implementation).
void apply_cap(CpuFeatures& f) {
    const Isa cap = isa_cap(f.isa_cap);
    if (cap == Isa::Native) return;
    f.amx_bf16 = f.amx_tile = false;  // every cap is below AMX
    if (cap < Isa::Avx512Bf16) f.avx512_bf16 = false;
    if (cap < Isa::Avx512Vnni) f.avx512_vnni = false;
    if (cap != Isa::AvxVnni) f.avx_vnni = false;  // the only class below native with AVX-VNNI (Alder Lake)
    if (cap < Isa::Avx512) f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = false;
    if (cap < Isa::Avx2) f.avx2 = f.fma = f.f16c = false;
    int64_t off = 0;
    if (cap < Isa::Avx512) off |= HWY_AVX3 | HWY_AVX3_DL;
    if (cap < Isa::Avx2) off |= HWY_AVX2;
    if (cap < Isa::Sse4) off |= HWY_SSE4 | HWY_SSSE3;
    if (off) hwy::DisableTargets(off);
#if CLEF_HAVE_DNNL
    const dnnl::cpu_isa isa = cap <= Isa::Sse4         ? dnnl::cpu_isa::sse41
                              : cap == Isa::Avx2       ? dnnl::cpu_isa::avx2
                              : cap == Isa::AvxVnni    ? dnnl::cpu_isa::avx2_vnni
                              : cap == Isa::Avx512     ? dnnl::cpu_isa::avx512_core
                              : cap == Isa::Avx512Vnni ? dnnl::cpu_isa::avx512_core_vnni
                                                       : dnnl::cpu_isa::avx512_core_bf16;
    try {
        dnnl::set_max_cpu_isa(isa);
    } catch (const dnnl::error&) {
        // Already fixed by an earlier oneDNN call (or by DNNL_MAX_CPU_ISA): the features above stay capped.
    }
#endif
}
#endif

CpuFeatures detect() {
    CpuFeatures f;
#if defined(__x86_64__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512dq = __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    // libgcc sets the AVX and AVX-512 features only where xgetbv says the OS saves their state; the VNNI
    // forms are used with 256-bit vectors, so they also need avx2 (VEX) or avx512f + avx512vl (EVEX). Read
    // from cpuid (clang 14's __builtin_cpu_supports does not know avxvnni): avx512vnni is leaf 7 subleaf 0
    // ECX bit 11, avxvnni leaf 7 subleaf 1 EAX bit 4.
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    const bool leaf7 = a >= 7;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    f.avx512_vnni = leaf7 && ((c >> 11) & 1u) && f.avx512f && f.avx512vl;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    f.avx_vnni = leaf7 && ((a >> 4) & 1u) && f.avx2;
    // f16c, amx: cpuid directly (gcc 12's __builtin_cpu_supports does not know amx).
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    f.f16c = (c >> 29) & 1u;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    f.amx_bf16 = (d >> 22) & 1u;
    f.amx_tile = (d >> 24) & 1u;
#elif defined(__aarch64__) && defined(__linux__)
    f.asimd_dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    f.i8mm = (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#endif
    const unsigned hc = std::thread::hardware_concurrency();
    f.logical_cpus = hc > 0 ? static_cast<int>(hc) : 1;
    f.physical_cores = count_physical_cores(f.logical_cpus);
    f.l2_bytes = std::max<int64_t>(0, sysconf(_SC_LEVEL2_CACHE_SIZE));
    apply_cap(f);
    return f;
}

int default_threads() {
    if (const char* e = std::getenv("OMP_NUM_THREADS")) {
        const int v = std::atoi(e);
        if (v > 0) return v;
    }
    return cpu_features().physical_cores;
}

std::atomic<int> g_threads{0};  // 0 = not yet chosen

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = detect();
    return f;
}

std::string cpu_features_string() {
    const CpuFeatures& f = cpu_features();
    std::string s;
    auto add = [&](bool on, const char* name) {
        if (!on) return;
        if (!s.empty()) s += ' ';
        s += name;
    };
    add(f.avx2, "avx2");
    add(f.fma, "fma");
    add(f.f16c, "f16c");
    add(f.avx512f, "avx512f");
    add(f.avx512bw, "avx512bw");
    add(f.avx512vl, "avx512vl");
    add(f.avx512dq, "avx512dq");
    add(f.avx512_bf16, "avx512_bf16");
    add(f.avx_vnni, "avx_vnni");
    add(f.avx512_vnni, "avx512_vnni");
    add(f.amx_tile, "amx_tile");
    add(f.amx_bf16, "amx_bf16");
    add(f.asimd_dotprod, "asimddp");
    add(f.i8mm, "i8mm");
    if (s.empty()) s = "baseline";
    if (f.isa_cap != "native") s += " (capped: CLEF_MAX_ISA=" + f.isa_cap + ")";
    return s + ", " + std::to_string(f.physical_cores) + " physical cores / " +
           std::to_string(f.logical_cpus) + " logical CPUs";
}

int num_threads() {
    int n = g_threads.load();
    if (n <= 0) {
        set_num_threads(0);
        n = g_threads.load();
    }
    // OpenMP's thread count is per calling thread: apply the global setting to this one (e.g. a server
    // worker).
    if (!omp_in_parallel() && omp_get_max_threads() != n) omp_set_num_threads(n);
    return n;
}

void set_num_threads(int n) {
    const int v = n > 0 ? n : default_threads();
    g_threads.store(v);
    omp_set_num_threads(v);
}

}  // namespace clef::ops
