// CPU feature detection and the global OpenMP thread setting shared by the fast kernels.
//
// One cap for every kernel layer:
// CLEF_MAX_ISA=baseline|sse4|avx2|avx_vnni|avx512|avx512_vnni|avx512_bf16|native (default native) limits the
// features reported here, the Highway targets the own kernels dispatch to (ops/simd.h) and the ISA oneDNN may
// JIT for, so a machine can measure and test the paths of a smaller CPU class. Each level is a CPU class:
// avx_vnni is AVX2 plus AVX-VNNI (Alder Lake), avx512 Skylake-X (no VNNI), avx512_vnni Cascade Lake
// (AVX512-VNNI, no AVX-VNNI), avx512_bf16 Cooper Lake (the same VNNI); only native keeps both VNNI forms (the
// int8 kernels' x86 extensions, ops/int8_kernels.h). On aarch64 the levels are baseline|neon|dotprod|native:
// baseline and neon turn off the int8 kernels' dotprod path (ops/int8_kernels.h), dotprod leaves it on but
// reports no i8mm; Highway's NEON target is aarch64's baseline and stays. An unknown value (or the other
// architecture's name) means native.
#pragma once

#include <cstdint>
#include <string>

namespace clef::ops {

struct CpuFeatures {
    bool avx2 = false;
    bool fma = false;
    bool f16c = false;
    bool avx512f = false;
    bool avx512bw = false;
    bool avx512vl = false;
    bool avx512dq = false;
    bool avx512_bf16 = false;
    bool amx_bf16 = false;
    bool amx_tile = false;
    // x86 AVX-VNNI (VEX vpdpbusd) with avx2; AVX512-VNNI (EVEX vpdpbusd) with avx512f and avx512vl.
    bool avx_vnni = false;
    bool avx512_vnni = false;
    bool asimd_dotprod = false;      // aarch64 FEAT_DotProd (sdot), HWCAP_ASIMDDP
    bool i8mm = false;               // aarch64 FEAT_I8MM (smmla), HWCAP2_I8MM: reported, no kernel uses it
    std::string isa_cap = "native";  // CLEF_MAX_ISA as applied
    int logical_cpus = 1;    // online logical CPUs
    int physical_cores = 1;  // distinct (package, core) pairs; logical_cpus when the topology is unknown
    int64_t l2_bytes = 0;    // one core's L2 cache (sysconf _SC_LEVEL2_CACHE_SIZE); 0 when not reported

    // The own AVX-512 kernels need f, bw, vl, dq (and f16c/fma, implied on every AVX-512 CPU).
    bool has_avx512() const { return avx512f && avx512bw && avx512vl && avx512dq && fma && f16c; }
    bool has_bf16_hw() const { return amx_bf16 || avx512_bf16; }
};

// Detected once (cpuid via the compiler builtins or getauxval's hardware caps, /sys topology for the core
// count), CLEF_MAX_ISA applied; the first call also applies the cap to Highway and oneDNN, so kernels call it
// before dispatching.
const CpuFeatures& cpu_features();
// e.g. "avx512f avx512bw ... amx_bf16, 2 physical cores / 2 logical CPUs".
std::string cpu_features_string();

// Number of OpenMP threads the kernels use. Default: OMP_NUM_THREADS when set, else the physical core count.
// Also applies the setting to the calling thread (OpenMP keeps the count per thread); the fast kernels call
// it.
int num_threads();
// Sets the thread count for all later kernel calls (omp_set_num_threads); n <= 0 restores the default.
void set_num_threads(int n);

}  // namespace clef::ops
