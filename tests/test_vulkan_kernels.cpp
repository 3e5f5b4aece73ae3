// Every kernel of the Vulkan device (device/vk_device.cpp, src/device/shaders) against the CPU device's
// scalar oracles (a reference stream of dev::cpu()), at awkward sizes: not multiples of the tiles, one row,
// long rows, spans at odd offsets, strided rows. Runs on lavapipe (scripts/setup installs Mesa's Vulkan
// drivers) under the Khronos validation layer (CLEF_VULKAN_VALIDATION=1, set below), which must report no
// error.
//
// Tolerances are derived from the arithmetic, per element, not a blanket number. u = 2^-24 is fp32's unit
// roundoff and gamma_n(n) = n u / (1 - n u) bounds the relative error of an n-term fp32 sum of products in
// any order (Higham, Accuracy and Stability of Numerical Algorithms, ch. 3), so two implementations that sum
// the same terms in different orders differ by at most 2 gamma_n(n) * sum |terms|. The Vulkan spec allows exp
// (3 + 2|x|) ulp, division 2.5 ulp, inversesqrt 2 ulp, and log an absolute 2^-21 on [0.5, 2]; those enter
// where the kernels call them. Every comparison also checks that its largest bound is under 1e-3 of the
// largest output value (1e-2 for attention, memory attention and the delta rule, whose worst-case sums run
// over up to 256 terms and then through a softmax or a recurrence), so a kernel that reads a wrong element,
// row, head or tile, drops a term or flips a sign (errors of the order of the values themselves) fails. Each
// test prints the largest |diff| and the largest |diff| / bound it saw. Guard values around every span and
// the gaps of strided rows must come back untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "device/device.h"
#include "device/vulkan.h"
#include "io/safetensors.h"
#include "quant/quant.h"
#include "util/half.h"

using namespace clef;

namespace {

// The first Vulkan device of any type (lavapipe here), opened once for the suite.
dev::Device& gpu() {
    static std::unique_ptr<dev::Device> d = [] {
        setenv("CLEF_VULKAN_VALIDATION", "1", 0);
        const dev::DeviceChoice c = dev::choose_device("vulkan", dev::probe_vulkan());
        if (!c.vulkan) throw std::runtime_error("no Vulkan device: " + c.reason);
        return dev::open_vulkan(c.index);
    }();
    return *d;
}

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

// Host values on a device, through a stream's upload.
dev::Tensor on(dev::Stream& s, const std::vector<float>& v) {
    dev::Tensor t = s.scratch(static_cast<int64_t>(v.size()));
    s.upload(t.span(), v.data());
    return t;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

constexpr double kU = 0x1p-24;  // fp32 unit roundoff
double gamma_n(double n) {
    return n * kU / (1 - n * kU);
}

// One run on both devices: the Vulkan stream and the CPU's reference stream.
struct Pair {
    std::unique_ptr<dev::Stream> g = gpu().stream({});
    std::unique_ptr<dev::Stream> c = dev::cpu().stream({true});
};

constexpr float kGuard = -777.25f;  // around every span: a kernel that writes past its span changes one

// The same values on both devices, at element offset `off` of a buffer with guard values before and after.
struct Both {
    dev::Tensor gt, ct;
    int64_t off = 0, n = 0;
    dev::Span g() const { return gt.at(off, n); }
    dev::Span c() const { return ct.at(off, n); }
    // The span's values on one device; the guards must be intact.
    std::vector<float> read(Pair& p, bool on_gpu) const {
        std::vector<float> all = (on_gpu ? p.g : p.c)->read((on_gpu ? gt : ct).span());
        for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
            if (i < off || i >= off + n) {
                EXPECT_EQ(all[i], kGuard) << (on_gpu ? "gpu" : "cpu") << " guard " << i;
            }
        }
        return std::vector<float>(all.begin() + off, all.begin() + off + n);
    }
};
Both both(Pair& p, const std::vector<float>& v, int64_t off = 0) {
    std::vector<float> all(static_cast<size_t>(off), kGuard);
    all.insert(all.end(), v.begin(), v.end());
    all.insert(all.end(), 3, kGuard);
    return {on(*p.g, all), on(*p.c, all), off, static_cast<int64_t>(v.size())};
}
// A weight vector on both devices (Device::vector).
Both weights(const std::vector<float>& v) {
    return {gpu().vector(v), dev::cpu().vector(v), 0, static_cast<int64_t>(v.size())};
}

// The largest |got - want| and |got - want| / bound over one test's comparisons, printed at its end.
class Tally {
public:
    explicit Tally(std::string name) : name_(std::move(name)) {}
    ~Tally() {
        std::printf("[  bounds  ] %-28s %4d comparisons: max |diff| %.3g, max |diff|/bound %.3g\n",
                    name_.c_str(), count_, max_diff_, max_ratio_);
    }
    // Every |got[i] - want[i]| <= bound[i] (a NaN fails); bound 0 asks for equality. The largest bound must
    // be under `tight` times the outputs' scale: `scale`, or where 0 the largest |want|.
    void check(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
               const std::vector<double>& bound, double tight = 1e-3, double scale = 0) {
        ++count_;
        ASSERT_EQ(got.size(), want.size()) << what;
        ASSERT_EQ(got.size(), bound.size()) << what;
        int failures = 0;
        double max_bound = 0, max_want = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const double d = std::abs(static_cast<double>(got[i]) - want[i]);
            max_bound = std::max(max_bound, bound[i]);
            max_want = std::max(max_want, std::abs(static_cast<double>(want[i])));
            if (!(d <= bound[i])) {
                if (++failures <= 3)
                    ADD_FAILURE() << what << ": element " << i << " vulkan " << got[i] << " cpu " << want[i]
                                  << " |diff| " << d << " > bound " << bound[i];
                continue;
            }
            max_diff_ = std::max(max_diff_, d);
            if (bound[i] > 0) max_ratio_ = std::max(max_ratio_, d / bound[i]);
        }
        EXPECT_EQ(failures, 0) << what;
        if (max_bound > 0) {
            EXPECT_LT(max_bound, tight * (scale > 0 ? scale : max_want)) << what << ": a loose bound";
        }
    }

private:
    std::string name_;
    int count_ = 0;
    double max_diff_ = 0, max_ratio_ = 0;
};

std::string label(std::initializer_list<std::pair<const char*, int64_t>> kv) {
    std::string s;
    for (const auto& [k, v] : kv) s += std::string(s.empty() ? "" : " ") + k + "=" + std::to_string(v);
    return s;
}

}  // namespace

TEST(VulkanKernels, Add) {
    // Exact: one fp32 addition per element on both sides (a wrong element or a missed tail differs by O(1)).
    // 65535 * 256 + 3: more workgroups than one grid dimension holds (the host splits them over y).
    for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{1000}, int64_t{70001}, int64_t{65535} * 256 + 3}) {
        const auto a = random_values(n, 1), b = random_values(n, 2);
        std::vector<float> want(a);
        for (int64_t i = 0; i < n; ++i) want[i] += b[i];
        auto s = gpu().stream({});
        dev::Tensor ta = on(*s, a), tb = on(*s, b);
        s->add(ta.span(), tb.span());
        EXPECT_EQ(max_abs_diff(s->read(ta.span()), want), 0.f) << n;
    }
    {  // at odd offsets, against the CPU device
        Pair p;
        const Both h = both(p, random_values(257, 3), 3), x = both(p, random_values(257, 4), 1);
        p.g->add(h.g(), x.g());
        p.c->add(h.c(), x.c());
        EXPECT_EQ(max_abs_diff(h.read(p, true), h.read(p, false)), 0.f);
    }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

namespace {

// GEMM variants (dev::force_vulkan_gemm; shape "" = the plan's own choice). Every weight type runs through
// both kernels, the fp32 tiles as the plan picks them and the tensor-core kernel (its emulation on a device
// without them): kernel and type decide the code that runs (the loads, the dequantisation). The tile
// shapes and splits of K only change specialisation constants and grids: every shape, K whole and split
// into slices, runs on BF16 weights here and on BF16 and Q4_K in LinearLargeShapes.
struct GemmVariant {
    const char* shape;
    int slices;
};
const std::vector<GemmVariant> kPlanAndTensorCores = {{"", 0}, {"coopmat", 0}};
const std::vector<GemmVariant> kEveryShape = {{"medium", 1}, {"large", 1}, {"small", 1},  {"coopmat", 1},
                                              {"medium", 3}, {"small", 2}, {"coopmat", 3}};

// Forces one variant for its lifetime.
struct ForceGemm {
    explicit ForceGemm(const GemmVariant& v) { dev::force_vulkan_gemm(v.shape, v.slices); }
    ~ForceGemm() { dev::force_vulkan_gemm("", 0); }
    ForceGemm(const ForceGemm&) = delete;
    ForceGemm& operator=(const ForceGemm&) = delete;
};

std::string variant_label(const GemmVariant& v) {
    return (*v.shape ? std::string(v.shape) : std::string("plan")) + "/" + std::to_string(v.slices) + " ";
}

// |v~ - v| for v rounded to fp16 (to nearest): 2^-11 relative in the normal range, 2^-25 absolute below it.
double f16_err(double v) {
    return std::max(std::abs(v) * 0x1p-11, 0x1p-25);
}

// y = x Wᵀ + b on both devices from the same weights w (fp32 values of the matrix as both devices read it)
// and checks y. Bound: both sum the in + 1 terms x_k w_k and b in fp32 (the shader with fma, in 16-wide
// steps or split over slices of K; the oracle in its own order): 2 gamma_n(in + 1) (sum_k |x_k w_k| + |b|).
// The tensor-core kernel (fp16 = true) first rounds x_k and w_k to fp16: each product moves by at most
// e_x |w| + |x| e_w + e_x e_w (f16_err), added to the bound. A transposed or misaligned weight read, a lost K
// tile or a wrong nibble gives |diff| of the order of |y| ~ sqrt(in) / 3, about 10^4 fp32 bounds.
// tight: the largest bound allowed relative to the outputs' scale. The worst-case sum bound grows as in^2 and
// the outputs as sqrt(in): rows of 512 values and more (the block types' several-block rows) need 1e-2, still
// far below the O(1) error of a misread block, row or scale; fp16 operands 5e-2.
void run_linear(Tally& tally, const std::string& what, const dev::Matrix& mg, const dev::Matrix& mc,
                const std::vector<float>& w, const std::vector<float>& bias, int64_t m, int64_t in,
                int64_t out, double tight = 1e-3, bool fp16 = false) {
    Pair p;
    const auto x = random_values(m * in, static_cast<uint32_t>(m * 7 + in));
    const Both bx = both(p, x, 3), by = both(p, std::vector<float>(m * out, 0.f), 5);
    p.g->linear(mg, bx.g(), m, by.g());
    p.c->linear(mc, bx.c(), m, by.c());
    std::vector<double> bound(m * out);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < out; ++j) {
            double abs_terms = bias.empty() ? 0 : std::abs(bias[j]), rounding = 0;
            for (int64_t k = 0; k < in; ++k) {
                const double xv = x[i * in + k], wv = w[j * in + k];
                abs_terms += std::abs(xv * wv);
                if (fp16)
                    rounding +=
                        f16_err(xv) * std::abs(wv) + std::abs(xv) * f16_err(wv) + f16_err(xv) * f16_err(wv);
            }
            bound[i * out + j] = 2 * gamma_n(in + 1) * (abs_terms + rounding) + rounding;
        }
    // The outputs' scale: |y| ~ sqrt(in) / 3 for x and w uniform on [-1, 1] (one output can be near 0).
    tally.check(what + label({{"m", m}}), by.read(p, true), by.read(p, false), bound, fp16 ? 5e-2 : tight,
                std::sqrt(in) / 3);
}

// run_linear under each of these GEMM variants.
void run_linear_variants(const std::vector<GemmVariant>& variants, Tally& tally, const std::string& what,
                         const dev::Matrix& mg, const dev::Matrix& mc, const std::vector<float>& w,
                         const std::vector<float>& bias, int64_t m, int64_t in, int64_t out,
                         double tight = 1e-3) {
    for (const GemmVariant& v : variants) {
        const ForceGemm force(v);
        run_linear(tally, variant_label(v) + what, mg, mc, w, bias, m, in, out, tight,
                   std::string(v.shape) == "coopmat");
    }
}

std::vector<unsigned char> encode(DType t, const std::vector<float>& v) {
    std::vector<unsigned char> b(v.size() * dtype_size(t));
    for (size_t i = 0; i < v.size(); ++i) {
        if (t == DType::F32) std::memcpy(&b[i * 4], &v[i], 4);
        const uint16_t h = t == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        if (t != DType::F32) std::memcpy(&b[i * 2], &h, 2);
    }
    return b;
}

}  // namespace

TEST(VulkanKernels, LinearFloatWeights) {
    Tally tally("linear F32/BF16/F16");
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
        for (int64_t in : {32, 96, 100})
            for (int64_t out : {1, 67, 130}) {
                const std::vector<unsigned char> bytes =
                    encode(dt, random_values(out * in, static_cast<uint32_t>(out * 131 + in)));
                TensorView tv;
                tv.name = "w", tv.dtype = dt, tv.shape = {out, in}, tv.data = bytes.data(),
                tv.nbytes = bytes.size();
                const std::vector<float> w = tv.to_f32();
                for (bool with_bias : {false, true}) {
                    dev::MatrixSource src;
                    src.tensor = &tv;
                    if (with_bias) src.bias = random_values(out, static_cast<uint32_t>(out + 5));
                    const auto mg = gpu().matrix(src);
                    src.paths = dev::Paths::Reference;
                    const auto mc = dev::cpu().matrix(src);
                    for (int64_t m : {1, 5, 70})
                        run_linear_variants(dt == DType::BF16 ? kEveryShape : kPlanAndTensorCores, tally,
                                            std::string(dtype_name(dt)) +
                                                label({{" in", in}, {"out", out}, {"bias", with_bias}}) + " ",
                                            *mg, *mc, w, src.bias, m, in, out);
                }
            }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

namespace {

// out rows of `in` values in a ggml block type: quantised from random values where clef has the type's
// quantiser, else (IQ1_S, IQ1_M) random block bytes with a sane fp16 scale.
std::vector<unsigned char> quantised_rows(GgmlType type, int64_t out, int64_t in, uint32_t seed) {
    QuantMatrix q;
    q.type = type, q.rows = out, q.cols = in;
    std::vector<unsigned char> bytes(out * q.row_bytes());
    if (ggml_type_writable(type)) {
        const auto values = random_values(out * in, seed);
        for (int64_t r = 0; r < out; ++r)
            quantize_row(type, values.data() + r * in, bytes.data() + r * q.row_bytes(), in);
        return bytes;
    }
    std::mt19937 rng(seed);
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng());
    const int64_t block = type == GgmlType::IQ1_S ? 50 : 56;
    const uint16_t d = f32_to_f16(0.0625f);
    for (size_t at = 0; at < bytes.size(); at += block) {
        if (type == GgmlType::IQ1_S) {
            std::memcpy(&bytes[at], &d, 2);
        } else {  // IQ1_M: the scale's four nibbles on top of the four u16 scale words at byte 48
            for (int i = 0; i < 4; ++i) {
                uint16_t sc;
                std::memcpy(&sc, &bytes[at + 48 + 2 * i], 2);
                sc = static_cast<uint16_t>((sc & 0x0fff) | (((d >> (4 * i)) & 0xf) << 12));
                std::memcpy(&bytes[at + 48 + 2 * i], &sc, 2);
            }
        }
    }
    return bytes;
}

// A block-quantised matrix's weights as both devices multiply by them: dequantised, rounded to bf16 (the
// CPU's row provider, docs/GGUF.md), widened.
std::vector<float> bf16_weights(const QuantMatrix& q) {
    std::vector<uint16_t> row(q.cols);
    std::vector<float> w(q.rows * q.cols);
    for (int64_t r = 0; r < q.rows; ++r) {
        q.row_bf16(r, row.data());
        for (int64_t c = 0; c < q.cols; ++c) w[r * q.cols + c] = bf16_to_f32(row[c]);
    }
    return w;
}

// The CPU reference stream's matrix of these fp32 weights (the oracle of a GEMM on the device).
std::unique_ptr<dev::Matrix> cpu_matrix(const std::vector<float>& w, int64_t out, int64_t in,
                                        std::vector<float> bias) {
    TensorView tv;
    tv.name = "w", tv.dtype = DType::F32, tv.shape = {out, in};
    tv.data = reinterpret_cast<const unsigned char*>(w.data()), tv.nbytes = w.size() * 4;
    dev::MatrixSource src;
    src.tensor = &tv, src.bias = std::move(bias), src.paths = dev::Paths::Reference;
    return dev::cpu().matrix(src);
}

// The weights of a matrix on the device, read back exactly: one-hot input rows (row k selects column k) make
// y = Wᵀ with every other product an exact zero.
std::vector<float> read_back_weights(const dev::Matrix& mg, int64_t in, int64_t out) {
    Pair p;
    std::vector<float> x(in * in, 0.f);
    for (int64_t k = 0; k < in; ++k) x[k * in + k] = 1.f;
    const dev::Tensor gx = on(*p.g, x), gy = p.g->scratch(in * out);
    p.g->linear(mg, gx.span(), in, gy.span());
    const std::vector<float> y = p.g->read(gy.span());
    std::vector<float> w(out * in);
    for (int64_t k = 0; k < in; ++k)
        for (int64_t o = 0; o < out; ++o) w[o * in + k] = y[k * out + o];
    return w;
}

}  // namespace

// Every ggml block type that GGUF files of these models use is read as it is (shaders/dequant.glsl): its
// weights widen to the very values the CPU's row provider gives (dequantised, rounded to bf16; read back
// through one-hot inputs), and the GEMM agrees with the CPU's within the fp32 sum bound. Rows of one block
// and of several, 1 to 130 rows.
TEST(VulkanKernels, LinearQuantisedWeights) {
    Tally tally("linear, ggml block types");
    const GgmlType types[] = {GgmlType::Q8_0,    GgmlType::Q4_0,   GgmlType::Q4_1,   GgmlType::Q5_0,
                              GgmlType::Q5_1,    GgmlType::Q2_K,   GgmlType::Q3_K,   GgmlType::Q4_K,
                              GgmlType::Q5_K,    GgmlType::Q6_K,   GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                              GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,  GgmlType::IQ3_XXS,
                              GgmlType::IQ3_S,   GgmlType::IQ1_S,  GgmlType::IQ1_M};
    for (GgmlType type : types) {
        const std::string name = ggml_type_name(static_cast<uint32_t>(type));
        const int64_t block = ggml_type_traits(static_cast<uint32_t>(type)).block_size;
        for (int64_t in : {block, 3 * block})
            for (int64_t out : {1, 67, 130}) {
                SCOPED_TRACE(name + label({{" in", in}, {"out", out}}));
                const auto bytes = quantised_rows(type, out, in, static_cast<uint32_t>(out * 17 + in));
                QuantMatrix q;
                q.type = type, q.rows = out, q.cols = in, q.data = bytes.data();
                const std::vector<float> w = bf16_weights(q);
                dev::MatrixSource src;
                src.quant = &q;
                if (in == block) {  // without a bias
                    const auto plain = gpu().matrix(src);
                    EXPECT_EQ(plain->resident_bytes(), (bytes.size() + 3) & ~size_t{3})
                        << "not resident as it is";
                    const std::vector<float> got = read_back_weights(*plain, in, out);
                    size_t differ = 0;
                    for (size_t i = 0; i < w.size(); ++i) differ += got[i] != w[i];
                    EXPECT_EQ(differ, 0u) << "weights that widen to another value than on the CPU";
                }
                src.bias = random_values(out, static_cast<uint32_t>(out + 9));
                const auto mg = gpu().matrix(src);
                const auto mc = cpu_matrix(w, out, in, src.bias);
                for (int64_t m : {1, 70})
                    run_linear_variants(kPlanAndTensorCores, tally,
                                        name + label({{" in", in}, {"out", out}}) + " ", *mg, *mc, w,
                                        src.bias, m, in, out, 1e-2);
            }
    }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

// A GGUF's tiled value heads (QuantMatrix col_map: logical column group g stored as group col_map[g]): the
// device keeps the file's rows and puts the input's groups in the stored order first.
TEST(VulkanKernels, LinearStoredColumnOrder) {
    Tally tally("linear, permuted column groups");
    const int64_t group = 128, groups = 4, in = group * groups, out = 70;
    for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q8_0}) {
        const auto bytes = quantised_rows(type, out, in, 99);
        QuantMatrix q;
        q.type = type, q.rows = out, q.cols = in, q.data = bytes.data();
        q.col_group = group, q.col_map = {2, 0, 3, 1};
        const std::vector<float> w = bf16_weights(q);  // logical order
        dev::MatrixSource src;
        src.quant = &q;
        const auto mg = gpu().matrix(src);
        const auto mc = cpu_matrix(w, out, in, {});
        for (int64_t m : {1, 9})
            run_linear_variants(kPlanAndTensorCores, tally, ggml_type_name(static_cast<uint32_t>(type)) + " ",
                                *mg, *mc, w, {}, m, in, out, 1e-2);
    }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

// Shapes with many tiles in every direction and long K (several double-buffered steps per slice, full and
// partial tiles), as the plan chooses them on this device and under every variant: BF16 and Q4_K weights.
TEST(VulkanKernels, LinearLargeShapes) {
    Tally tally("linear, large shapes");
    const int64_t in = 1024, out = 260;
    const std::vector<float> values = random_values(out * in, 41);
    const std::vector<unsigned char> bf16 = encode(DType::BF16, values);
    TensorView tv;
    tv.name = "w", tv.dtype = DType::BF16, tv.shape = {out, in}, tv.data = bf16.data(),
    tv.nbytes = bf16.size();
    const auto q4 = quantised_rows(GgmlType::Q4_K, out, in, 42);
    QuantMatrix q;
    q.type = GgmlType::Q4_K, q.rows = out, q.cols = in, q.data = q4.data();
    const std::vector<float> bias = random_values(out, 43);
    for (bool quant : {false, true}) {
        dev::MatrixSource src;
        src.bias = bias;
        if (quant)
            src.quant = &q;
        else
            src.tensor = &tv;
        const std::vector<float> w = quant ? bf16_weights(q) : tv.to_f32();
        const auto mg = gpu().matrix(src);
        const auto mc = cpu_matrix(w, out, in, bias);
        for (int64_t m : {1, 130}) {
            run_linear(tally, std::string(quant ? "q4_K" : "bf16") + " planned ", *mg, *mc, w, bias, m, in,
                       out, 1e-2);
            run_linear_variants(kEveryShape, tally, quant ? "q4_K " : "bf16 ", *mg, *mc, w, bias, m, in, out,
                                1e-2);
        }
    }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

namespace {

// The relative error of an RMS or L2 row scale 1 / sqrt(sum of squares / d + eps) times two products: the
// shader sums the d positive squares in fp32 (relative gamma_n(d)), halved by the square root; its division,
// inversesqrt-based sqrt and reciprocal cost at most 10 ulp, the two products 2; the oracle sums in double
// and rounds the scale once, then 2 products.
double rms_rel(int64_t d) {
    return gamma_n(d) / 2 + 16 * kU;
}
// The relative error of silu(z) or sigmoid(z) (exp: (3 + 2|z|) ulp on the GPU, the division 2.5, the sum and
// the product one each; the oracle's within 4 ulp) and of the product by it.
double gate_rel(double z) {
    return (12 + 2 * std::abs(z)) * kU;
}

}  // namespace

TEST(VulkanKernels, RmsNorm) {
    // Bound: |y| rms_rel(d) (a missing weight, 1 + w for w, or a wrong row's scale is off by O(|y|)).
    Tally tally("rms_norm");
    std::vector<std::pair<int64_t, int64_t>> shapes;  // rows, d
    for (int64_t rows : {1, 3})
        for (int64_t d : {1, 5, 100, 1000, 3001}) shapes.emplace_back(rows, d);
    shapes.emplace_back(65537, 2);  // more workgroups than one grid dimension holds
    for (auto [rows, d] : shapes)
        for (int mode : {0, 1, 2}) {  // zero-centred with w, plain with w, plain with an empty weight span
            Pair p;
            const auto x = random_values(rows * d, static_cast<uint32_t>(d + rows), 2.f);
            const auto wv = random_values(d, static_cast<uint32_t>(d * 3), 1.f);
            const Both bx = both(p, x, 1), bw = both(p, wv, 3), by = both(p, std::vector<float>(rows * d), 2);
            const bool zc = mode == 0;
            p.g->rms_norm(bx.g(), rows, d, mode == 2 ? dev::Span{} : bw.g(), 1e-6f, zc, by.g());
            p.c->rms_norm(bx.c(), rows, d, mode == 2 ? dev::Span{} : bw.c(), 1e-6f, zc, by.c());
            const auto want = by.read(p, false);
            std::vector<double> bound(want.size());
            for (size_t i = 0; i < want.size(); ++i) bound[i] = std::abs(want[i]) * rms_rel(d);
            tally.check(label({{"rows", rows}, {"d", d}, {"mode", mode}}), by.read(p, true), want, bound);
            if (mode != 1) continue;  // in place (y = x) as well
            p.g->rms_norm(bx.g(), rows, d, bw.g(), 1e-6f, false, bx.g());
            tally.check(label({{"in place rows", rows}, {"d", d}}), bx.read(p, true), want, bound);
        }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, LayerNorm) {
    // y = (x - mean) inv w + b. The shader's mean is off by at most e_mean = gamma_n(d) mean(|x|) (an fp32
    // sum; the oracle's is double). Its variance sums (x - mean)^2 in fp32: relative error gamma_n(d), plus
    // 2 e_mean mean(|x - mean|) / var from the mean; the square root halves that, the divisions and the
    // square root add 10 ulp (rel_inv). So |dy| <= |w| inv (e_mean + |x - mean| rel_inv) + 4 u (|y| + |b|).
    Tally tally("layer_norm");
    for (int64_t rows : {1, 4})
        for (int64_t d : {1, 7, 130, 2049}) {
            Pair p;
            auto x = random_values(rows * d, static_cast<uint32_t>(d + 11 * rows), 2.f);
            for (float& v : x) v += 0.75f;  // a mean away from 0
            const auto wv = random_values(d, static_cast<uint32_t>(d + 1)), bv = random_values(d, d + 2);
            const Both bx = both(p, x, 1), bw = weights(wv), bb = weights(bv),
                       by = both(p, std::vector<float>(rows * d), 1);
            p.g->layer_norm(bx.g(), rows, d, bw.g(), bb.g(), 1e-5f, by.g());
            p.c->layer_norm(bx.c(), rows, d, bw.c(), bb.c(), 1e-5f, by.c());
            const auto want = by.read(p, false);
            std::vector<double> bound(want.size());
            for (int64_t r = 0; r < rows; ++r) {
                const float* xr = x.data() + r * d;
                double mean = 0, mean_abs = 0, var = 0, mean_abs_c = 0;
                for (int64_t i = 0; i < d; ++i) mean += xr[i], mean_abs += std::abs(xr[i]);
                mean /= d, mean_abs /= d;
                for (int64_t i = 0; i < d; ++i)
                    var += (xr[i] - mean) * (xr[i] - mean), mean_abs_c += std::abs(xr[i] - mean);
                var /= d, mean_abs_c /= d;
                const double inv = 1 / std::sqrt(var + 1e-5), e_mean = gamma_n(d) * mean_abs;
                const double rel_inv = (gamma_n(d) + 2 * e_mean * mean_abs_c / (var + 1e-5)) / 2 + 10 * kU;
                for (int64_t i = 0; i < d; ++i)
                    bound[r * d + i] = std::abs(wv[i]) * inv * (e_mean + std::abs(xr[i] - mean) * rel_inv) +
                                       4 * kU * (std::abs(want[r * d + i]) + std::abs(bv[i]));
            }
            tally.check(label({{"rows", rows}, {"d", d}}), by.read(p, true), want, bound);
        }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, Gelu) {
    // gelu(x) = 0.5 x (1 + f), the products and the sum within 4 ulp of |y|, f's absolute error scaled by
    // 0.5 |x|. erf: the shader's rational fit is within 1.2e-7 of erfc (its exp adds (3 + 2 z^2) ulp of
    // erfc(z), at most 0.8 u). tanh(a): the spec inherits the error of (e^a - e^-a) / (e^a + e^-a), two exps
    // of (3 + 2|a|) ulp and a division of 2.5: (9 + 4|a|) u absolute; past |a| = 9 tanh is 1 within u/2, so
    // |a| is capped there. The values include 0, tiny ones and |x| up to 100 (an unclamped exp overflows
    // there: inf / inf). The other branch (tanh for erf) is off by up to ~5e-4, over 1000 bounds.
    Tally tally("gelu");
    for (bool tanh : {false, true})
        for (int64_t rows : {1, 3})
            for (int64_t width : {1, 333}) {
                Pair p;
                auto x = random_values(rows * width, static_cast<uint32_t>(width + rows), 6.f);
                const float specials[] = {0.f,   1e-3f, -1e-3f, 10.f, -10.f, 30.f,
                                          -30.f, 100.f, -100.f, 3.5f, -5.f};
                for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[i] = specials[i];
                const Both bx = both(p, x, 5);
                p.g->gelu(bx.g(), rows, tanh);
                p.c->gelu(bx.c(), rows, tanh);
                const auto want = bx.read(p, false);
                std::vector<double> bound(want.size());
                for (size_t i = 0; i < want.size(); ++i) {
                    const double a = 0.7978845608 * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
                    const double e = tanh ? (9 + 4 * std::min(std::abs(a), 9.0)) * kU : 1.2e-7 + 2 * kU;
                    bound[i] = 0.5 * std::abs(x[i]) * e + 4 * kU * std::abs(want[i]);
                }
                tally.check(label({{"tanh", tanh}, {"rows", rows}, {"width", width}}), bx.read(p, true), want,
                            bound);
            }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, SiluMulSigmoidMul) {
    // |y| gate_rel(gate) (the gate's exp dominates). Gates up to +-90 (exp overflows to inf: the sigmoid
    // must still be 0 or 1). Swapping the operands is off by O(|y|).
    Tally tally("silu_mul / sigmoid_mul");
    for (int64_t n : {1, 1000, 4097})
        for (int op : {0, 1})
            for (bool in_place : {false, true}) {
                Pair p;
                auto a = random_values(n, static_cast<uint32_t>(n + op), 8.f),
                     b = random_values(n, n + 3, 3.f);
                if (n > 4) a[1] = 90.f, a[2] = -90.f, b[3] = 90.f, b[4] = -90.f;
                const Both ba = both(p, a, 1), bb = both(p, b, 2), bo = both(p, std::vector<float>(n), 3);
                // silu_mul(gate = a, up = b, out); sigmoid_mul(x = b, gate = a, out); in place: out = a or b.
                const Both& out = in_place ? (op == 0 ? ba : bb) : bo;
                if (op == 0) {
                    p.g->silu_mul(ba.g(), bb.g(), out.g());
                    p.c->silu_mul(ba.c(), bb.c(), out.c());
                } else {
                    p.g->sigmoid_mul(bb.g(), ba.g(), out.g());
                    p.c->sigmoid_mul(bb.c(), ba.c(), out.c());
                }
                const auto want = out.read(p, false);
                std::vector<double> bound(n);
                for (int64_t i = 0; i < n; ++i) bound[i] = std::abs(want[i]) * gate_rel(a[i]);
                tally.check(label({{"n", n}, {"op", op}, {"in_place", in_place}}), out.read(p, true), want,
                            bound);
            }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, Conv1dSilu) {
    // y = silu(sum_j w_j x_(t-3+j)) over K = 4 taps (state rows before the chunk): the K-term sums differ by
    // 2 gamma_n(K) sum |w x|, which silu (slope <= 1.1) carries, plus gate_rel of y. The state after the
    // chunk is a copy of input rows: equal. A second call continues from the updated state; a tap or state
    // row out of place is off by O(|y|).
    Tally tally("conv1d_silu");
    const int K = 4;
    for (int64_t C : {1, 37, 300})
        for (int64_t T : {1, 7}) {
            Pair p;
            const auto w = random_values(C * K, static_cast<uint32_t>(C), 1.f);
            const Both bw = both(p, w, 1), bs = both(p, random_values((K - 1) * C, C + 1, 2.f), 3);
            std::vector<float> state = bs.read(p, false);
            for (int call = 0; call < 2; ++call) {
                const auto x = random_values(T * C, static_cast<uint32_t>(C * 5 + T + call), 2.f);
                const Both bx = both(p, x, 2), by = both(p, std::vector<float>(T * C), 5);
                p.g->conv1d_silu(bx.g(), T, C, bw.g(), K, bs.g(), by.g());
                p.c->conv1d_silu(bx.c(), T, C, bw.c(), K, bs.c(), by.c());
                const auto want = by.read(p, false);
                std::vector<double> bound(T * C);
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t c = 0; c < C; ++c) {
                        double abs_terms = 0, acc = 0;
                        for (int j = 0; j < K; ++j) {
                            const int64_t pos = t - (K - 1) + j;
                            const double xv = pos >= 0 ? x[pos * C + c] : state[(K - 1 + pos) * C + c];
                            abs_terms += std::abs(w[c * K + j] * xv), acc += w[c * K + j] * xv;
                        }
                        bound[t * C + c] =
                            1.1 * 2 * gamma_n(K) * abs_terms + std::abs(want[t * C + c]) * gate_rel(acc);
                    }
                const std::string what = label({{"C", C}, {"T", T}, {"call", call}});
                tally.check(what, by.read(p, true), want, bound);
                state = bs.read(p, false);
                tally.check(what + " state", bs.read(p, true), state, std::vector<double>(state.size(), 0.0));
            }
        }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, L2NormHeads) {
    // Rows of `heads` heads at stride x_ld > heads * d: |y| rms_rel(d) (as RMSNorm: a sum of d squares).
    Tally tally("l2_norm_heads");
    for (int64_t T : {1, 5})
        for (int d : {16, 130}) {
            const int heads = 3;
            const int64_t x_ld = int64_t{heads} * d + 7;
            Pair p;
            const auto x = random_values(T * x_ld, static_cast<uint32_t>(T + d), 2.f);
            const Both bx = both(p, x, 3), by = both(p, std::vector<float>(T * heads * d), 1);
            const float scale = 1.f / std::sqrt(static_cast<float>(d));
            p.g->l2_norm_heads(bx.g(), x_ld, T, heads, d, 1e-6f, scale, by.g());
            p.c->l2_norm_heads(bx.c(), x_ld, T, heads, d, 1e-6f, scale, by.c());
            const auto want = by.read(p, false);
            std::vector<double> bound(want.size());
            for (size_t i = 0; i < want.size(); ++i) bound[i] = std::abs(want[i]) * rms_rel(d);
            tally.check(label({{"T", T}, {"d", d}}), by.read(p, true), want, bound);
        }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, GdnGates) {
    // beta = sigmoid(b): |beta| gate_rel(b). g = -exp(A_log) softplus(x), x = a + dt_bias: softplus(x) =
    // log(1 + e^x) (x <= 20) moves by sigmoid(x) |x| u for x's rounding and sigmoid(x) (3 + 2|x|) u for
    // exp's; log is allowed an absolute 2^-21 on [1, 2] (x <= 0), else 3 ulp; the oracle's log1p 1 ulp. So
    // |dg| <= exp(A) (sigmoid(x) (4 + 3|x|) u + 2^-21 + 5 u softplus + u) + |g| (3 + 2|A| + 2) u. A swapped
    // head (A_log and dt_bias per head) or a missing softplus is off by O(|g|).
    Tally tally("gdn_gates");
    for (int64_t T : {1, 70}) {
        const int Hv = 5;
        Pair p;
        const auto b = random_values(T * Hv, static_cast<uint32_t>(T), 8.f),
                   a = random_values(T * Hv, T + 1, 8.f);
        const auto A_log = random_values(Hv, 3, 1.5f), dt = random_values(Hv, 4, 2.f);
        const Both bb = both(p, b, 1), ba = both(p, a, 2), bl = both(p, A_log, 3), bd = both(p, dt, 1);
        p.g->gdn_gates(bb.g(), ba.g(), T, Hv, bl.g(), bd.g());
        p.c->gdn_gates(bb.c(), ba.c(), T, Hv, bl.c(), bd.c());
        const auto want_beta = bb.read(p, false), want_g = ba.read(p, false);
        std::vector<double> bound_beta(T * Hv), bound_g(T * Hv);
        for (int64_t i = 0; i < T * Hv; ++i) {
            const int h = static_cast<int>(i % Hv);
            const double x = static_cast<double>(a[i]) + dt[h], sig = 1 / (1 + std::exp(-x));
            const double sp = x > 20 ? x : std::log1p(std::exp(x)), eA = std::exp(A_log[h]);
            bound_beta[i] = std::abs(want_beta[i]) * gate_rel(b[i]);
            bound_g[i] =
                eA * (sig * (4 + 3 * std::abs(x)) * kU + (x <= 20 ? 0x1p-21 : 0) + 5 * kU * sp + kU) +
                std::abs(want_g[i]) * (5 + 2 * std::abs(A_log[h])) * kU;
        }
        tally.check(label({{"beta T", T}}), bb.read(p, true), want_beta, bound_beta);
        tally.check(label({{"g T", T}}), ba.read(p, true), want_g, bound_g);
    }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

namespace {

// A running error bound for the gated delta rule (ops/delta_rule.h), per value head h and value column j
// with the state column s = S[:, j]. Per token the exact map is s <- d (I - beta k kᵀ) s + beta v_j k with
// d = exp(g) <= 1, beta in (0, 1) and |k| = 1, a contraction: an error e in s carries to at most d |e|
// (2-norm), and each token adds its own rounding
//   decay       d |s_i| r_d              (r_d: the decay's relative error, (4 + 2|g|) u)
//   u_j         beta (gamma_n(n) sum |s_i k_i| + u (|v_j| + |s.k|)) + u |u_j|, spread along k (|k| = 1)
//   update      u (|s_i| + |k_i u_j|)
// and o_j = s.q is off by |q| |e| + gamma_n(n) sum |s_i q_i| + u |o_j|. The state is exact (double) here;
// each implementation keeps its own |e| bound per column, carried across calls. The serial forms (the
// shader's and the oracle's) sum n = dk terms. The oracle's chunked (WY) form also sums over the chunk's
// positions (the substitution and the intra-chunk attention: n = dk + 2C) and exponentiates cumulative decays
// G (relative error 2 gamma_n(C) sum|g| + 2 u sum|g| + 4 u): the same model with those.
struct DeltaModel {
    int Hk, Hv, dk, dv;
    std::vector<double> S;             // [Hv][dk][dv]
    std::vector<double> e_gpu, e_cpu;  // [Hv][dv]
    DeltaModel(int hk, int hv, int k, int v, const std::vector<float>& s0)
        : Hk(hk), Hv(hv), dk(k), dv(v), S(s0.begin(), s0.end()), e_gpu(hv * v, 0.0), e_cpu(hv * v, 0.0) {}

    // Advances over T tokens; returns the bound on |o_gpu - o_cpu| per output [T][Hv][dv].
    std::vector<double> run(int64_t T, const std::vector<float>& q, int64_t q_ld, const std::vector<float>& k,
                            int64_t k_ld, const std::vector<float>& v, int64_t v_ld,
                            const std::vector<float>& beta, const std::vector<float>& g, bool chunked) {
        std::vector<double> bound(T * Hv * dv);
        const int64_t C = std::min<int64_t>(64, T);
        const double n_gpu = dk, n_cpu = chunked ? dk + 2.0 * C : dk;
        std::vector<double> s(dk), loc_g(dk), loc_c(dk);
        for (int64_t t = 0; t < T; ++t)
            for (int h = 0; h < Hv; ++h) {
                const int kh = h / (Hv / Hk);
                const float* qt = q.data() + t * q_ld + kh * dk;
                const float* kt = k.data() + t * k_ld + kh * dk;
                const double gt = g[t * Hv + h], d = std::exp(gt), b = beta[t * Hv + h];
                double g_chunk = 0;  // sum |g| over this token's chunk
                for (int64_t t2 = t / 64 * 64; t2 < std::min(T, t / 64 * 64 + 64); ++t2)
                    g_chunk += std::abs(g[t2 * Hv + h]);
                const double rd_gpu = (4 + 2 * std::abs(gt)) * kU;
                const double rd_cpu = chunked ? 2 * gamma_n(C) * g_chunk + 2 * kU * g_chunk + 4 * kU : rd_gpu;
                double qn = 0, kn = 0;
                for (int i = 0; i < dk; ++i) qn += double{qt[i]} * qt[i], kn += double{kt[i]} * kt[i];
                qn = std::sqrt(qn), kn = std::sqrt(kn);
                for (int j = 0; j < dv; ++j) {
                    double dot = 0, abs_dot = 0;
                    for (int i = 0; i < dk; ++i) {
                        const double si = S[(static_cast<size_t>(h) * dk + i) * dv + j];
                        loc_g[i] = d * std::abs(si) * rd_gpu, loc_c[i] = d * std::abs(si) * rd_cpu;
                        s[i] = d * si;
                        dot += s[i] * kt[i], abs_dot += std::abs(s[i] * kt[i]);
                    }
                    const double vj = v[t * v_ld + h * dv + j], uj = b * (vj - dot);
                    const double eu_base = b * kU * (std::abs(vj) + std::abs(dot)) + kU * std::abs(uj);
                    const double eu_gpu = b * gamma_n(n_gpu) * abs_dot + eu_base,
                                 eu_cpu = b * gamma_n(n_cpu) * abs_dot + eu_base;
                    double o = 0, abs_o = 0, ng = 0, nc = 0;
                    for (int i = 0; i < dk; ++i) {
                        s[i] += kt[i] * uj;
                        const double upd = kU * (std::abs(s[i]) + std::abs(kt[i] * uj));
                        ng += (loc_g[i] + upd) * (loc_g[i] + upd), nc += (loc_c[i] + upd) * (loc_c[i] + upd);
                        o += s[i] * qt[i], abs_o += std::abs(s[i] * qt[i]);
                        S[(static_cast<size_t>(h) * dk + i) * dv + j] = s[i];
                    }
                    double& eg = e_gpu[h * dv + j];
                    double& ec = e_cpu[h * dv + j];
                    eg = d * eg + std::sqrt(ng) + kn * eu_gpu;
                    ec = d * ec + std::sqrt(nc) + kn * eu_cpu;
                    bound[(t * Hv + h) * dv + j] =
                        qn * (eg + ec) + (gamma_n(n_gpu) + gamma_n(n_cpu)) * abs_o + 2 * kU * std::abs(o);
                }
            }
        return bound;
    }
    // The bound on |state_gpu - state_cpu| per state value [Hv][dk][dv] (an entry is within its column's
    // norm).
    std::vector<double> state_bound() const {
        std::vector<double> b(S.size());
        for (int h = 0; h < Hv; ++h)
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j)
                    b[(static_cast<size_t>(h) * dk + i) * dv + j] = e_gpu[h * dv + j] + e_cpu[h * dv + j];
        return b;
    }
};

// Rows of `heads` heads of d values at stride ld, each head scaled to norm `norm` (the model's q and k
// after l2_norm_heads).
std::vector<float> unit_heads(int64_t T, int heads, int d, int64_t ld, float norm, uint32_t seed) {
    std::vector<float> x = random_values(T * ld, seed);
    for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h) {
            float* p = x.data() + t * ld + int64_t{h} * d;
            double ss = 0;
            for (int i = 0; i < d; ++i) ss += double{p[i]} * p[i];
            for (int i = 0; i < d; ++i) p[i] = static_cast<float>(p[i] * norm / std::sqrt(ss));
        }
    return x;
}

}  // namespace

TEST(VulkanKernels, DeltaRule) {
    // The shader is token-serial; the oracle runs serial (chunked = false) and in 64-token chunks (chunked =
    // true). Two calls per case carry the state. Bounds: DeltaModel. A wrong key head for a value head, a
    // missing decay or a lost state column is off by O(|o|).
    Tally tally("delta_rule");
    const int Hk = 2, Hv = 4;
    // T = 600 at dk = dv = 128: one dispatch over every token went wrong on lavapipe from token 249 on
    // (token 492 at 64), and the device now runs the tokens in dispatches of 64.
    std::vector<std::tuple<int, int, int64_t>> shapes;
    for (auto [dk, dv] : {std::pair{16, 16}, std::pair{128, 128}, std::pair{16, 96}})
        for (int64_t T : {1, 5, 70}) shapes.emplace_back(dk, dv, T);
    shapes.emplace_back(128, 128, 600);
    for (auto [dk, dv, T] : shapes)
        for (bool chunked : {false, true}) {
            Pair p;
            const int64_t q_ld = int64_t{Hk} * dk + 3, k_ld = int64_t{Hk} * dk + 5,
                          v_ld = int64_t{Hv} * dv + 1;
            const auto s0 = random_values(int64_t{Hv} * dk * dv, static_cast<uint32_t>(dk + dv), 0.5f);
            const Both bs = both(p, s0, 3);
            DeltaModel model(Hk, Hv, dk, dv, s0);
            for (int call = 0; call < 2; ++call) {
                const uint32_t seed = static_cast<uint32_t>(T * 1000 + dk + dv + call);
                const auto q = unit_heads(T, Hk, dk, q_ld, 1.f / std::sqrt(static_cast<float>(dk)), seed);
                const auto k = unit_heads(T, Hk, dk, k_ld, 1.f, seed + 1);
                const auto v = random_values(T * v_ld, seed + 2);
                auto beta = random_values(T * Hv, seed + 3, 4.f), g = random_values(T * Hv, seed + 4);
                for (float& x : beta) x = 1.f / (1.f + std::exp(-x));
                for (float& x : g) x = -0.15f * (x + 1.01f);  // log decays in (-0.3, 0)
                const Both bq = both(p, q, 1), bk = both(p, k, 2), bv = both(p, v, 3), bb = both(p, beta, 1),
                           bg = both(p, g, 2), bo = both(p, std::vector<float>(T * Hv * dv), 1);
                for (bool on_gpu : {true, false}) {
                    dev::DeltaRule d;
                    d.T = T, d.Hk = Hk, d.Hv = Hv, d.dk = dk, d.dv = dv, d.chunked = chunked;
                    d.q_ld = q_ld, d.k_ld = k_ld, d.v_ld = v_ld;
                    const auto sp = [&](const Both& b) { return on_gpu ? b.g() : b.c(); };
                    d.q = sp(bq), d.k = sp(bk), d.v = sp(bv), d.beta = sp(bb), d.g = sp(bg), d.out = sp(bo);
                    d.state = sp(bs);
                    (on_gpu ? p.g : p.c)->delta_rule(d);
                }
                const auto bound = model.run(T, q, q_ld, k, k_ld, v, v_ld, beta, g, chunked);
                const std::string what =
                    label({{"dk", dk}, {"dv", dv}, {"T", T}, {"chunked", chunked}, {"call", call}});
                tally.check(what, bo.read(p, true), bo.read(p, false), bound, 1e-2);
                tally.check(what + " state", bs.read(p, true), bs.read(p, false), model.state_bound(), 1e-2);
            }
        }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, RmsNormGated) {
    // rms_norm(x, w) * gate(z): |y| (rms_rel(d) + gate_rel(z)). Silu for Sigmoid or a z of another row is off
    // by O(|y|).
    Tally tally("rms_norm_gated");
    for (auto gate : {ops::NormGate::Silu, ops::NormGate::Sigmoid})
        for (int64_t rows : {1, 6})
            for (int64_t d : {16, 130, 2000}) {
                Pair p;
                const auto x = random_values(rows * d, static_cast<uint32_t>(rows + d), 2.f);
                const auto z = random_values(rows * d, static_cast<uint32_t>(rows + d + 1), 6.f);
                const auto w = random_values(d, static_cast<uint32_t>(d));
                const Both bx = both(p, x, 1), bz = both(p, z, 2), bw = both(p, w, 3),
                           by = both(p, std::vector<float>(rows * d), 1);
                p.g->rms_norm_gated(bx.g(), bz.g(), rows, d, bw.g(), 1e-6f, gate, by.g());
                p.c->rms_norm_gated(bx.c(), bz.c(), rows, d, bw.c(), 1e-6f, gate, by.c());
                const auto want = by.read(p, false);
                std::vector<double> bound(want.size());
                for (size_t i = 0; i < want.size(); ++i)
                    bound[i] = std::abs(want[i]) * (rms_rel(d) + gate_rel(z[i]));
                tally.check(label({{"sigmoid", gate == ops::NormGate::Sigmoid}, {"rows", rows}, {"d", d}}),
                            by.read(p, true), want, bound);
            }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, SplitQueryGate) {
    // Copies: equal.
    Tally tally("split_query_gate");
    for (int64_t T : {1, 5})
        for (int hd : {16, 33}) {
            const int nh = 3;
            Pair p;
            const int64_t n = T * nh * hd;
            const Both qg = both(p, random_values(2 * n, static_cast<uint32_t>(T + hd)), 3),
                       q = both(p, std::vector<float>(n), 1), gate = both(p, std::vector<float>(n), 2);
            p.g->split_query_gate(qg.g(), T, nh, hd, q.g(), gate.g());
            p.c->split_query_gate(qg.c(), T, nh, hd, q.c(), gate.c());
            const std::vector<double> zero(n, 0.0);
            tally.check(label({{"q T", T}, {"hd", hd}}), q.read(p, true), q.read(p, false), zero);
            tally.check(label({{"gate T", T}, {"hd", hd}}), gate.read(p, true), gate.read(p, false), zero);
        }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, Rope) {
    // x[i] = a c - b s, x[i + half] = b c + a s on the first rotary_dim dims of each head (each side within
    // u (|a c| + |b s|) + u |result|, fused or not): 4 u (|a c| + |b s|); the other dims and the gaps of the
    // strided rows (ld > heads * hd) untouched: equal. The pair (i, i + 1) for (i, i + half) or a rotation by
    // the other row's angle is off by O(|x|).
    Tally tally("rope");
    for (int64_t T : {1, 5})
        for (auto [hd, rot] : {std::pair{64, 24}, std::pair{32, 32}, std::pair{80, 64}}) {
            const int heads = 3;
            const int64_t ld = int64_t{heads} * hd + 10, half = rot / 2;
            Pair p;
            const auto x = random_values(T * ld, static_cast<uint32_t>(T + hd + rot), 2.f);
            std::vector<float> cs(T * half), sn(T * half);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t i = 0; i < half; ++i) {
                    const double ang = (t + 3) * std::pow(10000.0, -2.0 * i / rot);
                    cs[t * half + i] = static_cast<float>(std::cos(ang));
                    sn[t * half + i] = static_cast<float>(std::sin(ang));
                }
            const Both bx = both(p, x, 5), bc = both(p, cs, 1), bs = both(p, sn, 2);
            p.g->rope(bx.g(), T, heads, hd, ld, rot, bc.g(), bs.g());
            p.c->rope(bx.c(), T, heads, hd, ld, rot, bc.c(), bs.c());
            std::vector<double> bound(T * ld, 0.0);
            for (int64_t t = 0; t < T; ++t)
                for (int h = 0; h < heads; ++h)
                    for (int64_t i = 0; i < half; ++i) {
                        const int64_t e = t * ld + h * hd + i;
                        const double c = cs[t * half + i], s = sn[t * half + i];
                        bound[e] = bound[e + half] = 4 * kU *
                                                     (std::abs(x[e] * c) + std::abs(x[e + half] * s) +
                                                      std::abs(x[e + half] * c) + std::abs(x[e] * s));
                    }
            tally.check(label({{"T", T}, {"hd", hd}, {"rot", rot}}), bx.read(p, true), bx.read(p, false),
                        bound);
        }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, Copy) {
    // F32 to F32: equal. F32 to BF16 at odd and even element offsets: util/half.h f32_to_bf16's bits
    // (round to nearest even, NaN kept quiet), and the neighbouring bf16 values of the buffer untouched.
    for (auto [off, n] : {std::pair<int64_t, int64_t>{0, 1}, {1, 1}, {3, 2}, {1, 1000}, {5, 6}, {0, 7}}) {
        Pair p;
        auto src = random_values(n, static_cast<uint32_t>(off + n), 100.f);
        const float specials[] = {0.f,
                                  -0.f,
                                  std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN(),
                                  1e-40f,                              // subnormal
                                  std::bit_cast<float>(0x3f808000u),   // a tie, even: rounds down
                                  std::bit_cast<float>(0x3f818000u),   // a tie, odd: rounds up
                                  std::bit_cast<float>(0x7f7fffffu)};  // FLT_MAX: rounds to inf
        for (size_t i = 0; i < std::size(specials) && i < src.size(); ++i) src[i] = specials[i];
        {  // F32
            const Both bs = both(p, src, 3), bd = both(p, std::vector<float>(n), off);
            p.g->copy(bs.g(), bd.g());
            const auto got = bd.read(p, true);
            EXPECT_EQ(std::memcmp(got.data(), src.data(), n * 4), 0) << "f32 off " << off << " n " << n;
        }
        const int64_t total = off + n + 3;
        dev::Tensor dst = p.g->scratch(total, dev::Elem::BF16);
        std::vector<uint16_t> init(total);
        for (int64_t i = 0; i < total; ++i) init[i] = static_cast<uint16_t>(0xabc0 + i);
        p.g->upload(dst.span(), init.data());
        const dev::Tensor ts = on(*p.g, src);
        p.g->copy(ts.span(), dst.at(off, n));
        std::vector<uint16_t> got(total);
        p.g->download(got.data(), dst.span());
        for (int64_t i = 0; i < total; ++i) {
            const uint16_t want = i >= off && i < off + n ? f32_to_bf16(src[i - off]) : init[i];
            EXPECT_EQ(got[i], want) << "bf16 off " << off << " n " << n << " element " << i;
        }
    }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

namespace {

// The bound on |out_gpu - out_cpu| of attention for one query row and head. Scores s_j = scale q.k_j: each
// side within ds = gamma_n(hd) scale sum_d |q_d k_jd| + u |s_j|. p_j = exp(s_j - m) / l then moves by at
// most 2 ds per side, plus the exps' (3 + 2 (m - s_j)) ulp and as much again for each of the shader's
// online-softmax rescalings (one per 128-key block); the sums over the keys (of p_j v_jd and of p_j) add
// gamma_n(keys + 1) each. With R = m - min_j s_j, both sides together:
//   |dout_d| <= sum_j p_j |v_jd| (4 ds + 2 (4 + 2 R) u (1 + blocks) + 4 gamma_n(keys + 1)).
void attention_bound(const float* q, const float* k, int64_t k_ld, const float* v, int64_t v_ld, int64_t keys,
                     int hd, double scale, double* bound) {
    std::vector<double> s(keys);
    double ds = 0, m = -1e300, mn = 1e300;
    for (int64_t j = 0; j < keys; ++j) {
        double dot = 0, abs_dot = 0;
        for (int d = 0; d < hd; ++d) {
            dot += double{q[d]} * k[j * k_ld + d];
            abs_dot += std::abs(double{q[d]} * k[j * k_ld + d]);
        }
        s[j] = dot * scale;
        ds = std::max(ds, gamma_n(hd) * scale * abs_dot + kU * std::abs(s[j]));
        m = std::max(m, s[j]), mn = std::min(mn, s[j]);
    }
    double l = 0;
    for (int64_t j = 0; j < keys; ++j) l += s[j] = std::exp(s[j] - m);
    const double rel =
        4 * ds + 2 * (4 + 2 * (m - mn)) * kU * (1 + (keys + 127) / 128) + 4 * gamma_n(keys + 1);
    for (int d = 0; d < hd; ++d) {
        double pv = 0;
        for (int64_t j = 0; j < keys; ++j) pv += s[j] / l * std::abs(v[j * v_ld + d]);
        bound[d] = pv * rel;
    }
}

std::vector<float> bf16_round(std::vector<float> v) {
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
}

}  // namespace

TEST(VulkanKernels, Attention) {
    // nh = 4 query heads over nkv = 2 (GQA), strided q and out rows, K/V in F32 and BF16. Causal: p0 = 17
    // cache rows precede the chunk (and p0 = 0), and the cache holds rows after the chunk's last (NaN: a
    // query that reads past its row gives NaN). Bidirectional over kv = T + 9 rows. The gaps of the strided
    // out rows are compared too (untouched: equal). Bound: attention_bound. A wrong kv head or one key
    // more or less is off by O(|out|).
    Tally tally("attention");
    const int nh = 4, nkv = 2;
    for (int hd : {32, 80, 256})
        for (int64_t T : {1, 3, 130})
            for (int mode : {0, 1, 2})  // causal p0 = 17, bidirectional, causal p0 = 0 (T = 3 only)
                for (bool bf16 : {false, true}) {
                    if (mode == 2 && T != 3) continue;
                    const bool causal = mode != 1;
                    const int64_t p0 = mode == 0 ? 17 : 0, kv = causal ? 0 : T + 9;
                    const int64_t rows = causal ? p0 + T + 5 : kv, keys_max = causal ? p0 + T : kv;
                    const int64_t q_ld = int64_t{nh} * hd + 8, out_ld = int64_t{nh} * hd + 3;
                    const int64_t k_ld = int64_t{nkv} * hd + 2, v_ld = int64_t{nkv} * hd + 6;
                    const uint32_t seed = static_cast<uint32_t>(hd * 1000 + T * 10 + mode);
                    const auto q = random_values(T * q_ld, seed, 3.f);
                    auto k = random_values(rows * k_ld, seed + 1), v = random_values(rows * v_ld, seed + 2);
                    if (bf16) k = bf16_round(k), v = bf16_round(v);
                    for (int64_t j = keys_max; j < rows; ++j)
                        for (int64_t d = 0; d < k_ld; ++d) k[j * k_ld + d] = v[j * v_ld + d] = std::nanf("");
                    Pair p;
                    const Both bq = both(p, q, 1), bo = both(p, std::vector<float>(T * out_ld, 0.f), 2);
                    std::vector<dev::Tensor> keep;
                    // K or V on one device at element offset `off`, F32 or BF16.
                    const auto kv_on = [&](dev::Stream& s, const std::vector<float>& x, int64_t off) {
                        const int64_t n = static_cast<int64_t>(x.size());
                        if (bf16) {
                            std::vector<uint16_t> bits(off + n, 0);
                            for (int64_t i = 0; i < n; ++i) bits[off + i] = f32_to_bf16(x[i]);
                            keep.push_back(s.scratch(off + n, dev::Elem::BF16));
                            s.upload(keep.back().span(), bits.data());
                        } else {
                            std::vector<float> padded(off, kGuard);
                            padded.insert(padded.end(), x.begin(), x.end());
                            keep.push_back(on(s, padded));
                        }
                        return keep.back().at(off, n);
                    };
                    for (bool on_gpu : {true, false}) {
                        dev::Stream& s = on_gpu ? *p.g : *p.c;
                        dev::Attention a;
                        a.T = T, a.p0 = p0, a.nh = nh, a.nkv = nkv, a.hd = hd, a.causal = causal, a.kv = kv;
                        a.scale = 1.f / std::sqrt(static_cast<float>(hd));
                        a.q_ld = q_ld, a.out_ld = out_ld, a.k_ld = k_ld, a.v_ld = v_ld;
                        a.q = on_gpu ? bq.g() : bq.c(), a.out = on_gpu ? bo.g() : bo.c();
                        a.k = kv_on(s, k, 3), a.v = kv_on(s, v, 1);
                        s.attention(a);
                    }
                    std::vector<double> bound(T * out_ld, 0.0);
                    for (int64_t i = 0; i < T; ++i)
                        for (int h = 0; h < nh; ++h) {
                            const int g = h / (nh / nkv);
                            attention_bound(q.data() + i * q_ld + h * hd, k.data() + g * hd, k_ld,
                                            v.data() + g * hd, v_ld, causal ? p0 + i + 1 : kv, hd,
                                            1.0 / std::sqrt(static_cast<float>(hd)),
                                            &bound[i * out_ld + h * hd]);
                        }
                    tally.check(label({{"hd", hd}, {"T", T}, {"mode", mode}, {"bf16", bf16}}),
                                bo.read(p, true), bo.read(p, false), bound, 1e-2);
                }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

TEST(VulkanKernels, MemoryAttention) {
    // out[i][h] = W_v,h (sum_j p_j m_j) + b_v,h with scores (scale W_k,hᵀ q_i,h) . m_j
    // (ops/attention_fast.h). Bound, propagated stage by stage (each stage: both sides within gamma_n(terms)
    // sum |terms| of exact):
    //   qt_c        e_qt_c = 2 (gamma_n(dh) + u) scale sum_d |q_d wk_dc|
    //   s_j         ds_j = sum_c e_qt_c |m_jc| + 2 gamma_n(w) sum_c |qt_c m_jc|
    //   ctx_c       e_ctx_c = sum_j p_j |m_jc| (2 max ds + 2 (4 + 2 R) u (1 + blocks) + 2 gamma_n(T + 1))
    //   out         sum_c |wv_c| e_ctx_c + 2 gamma_n(w + 1) (sum_c |wv_c ctx_c| + |bv|).
    // A transposed W_k or W_v, or the bias of another head, is off by O(|out|).
    Tally tally("memory_attention");
    const int64_t lq = 3;
    const int heads = 4;
    for (int64_t w : {32, 96})
        for (int64_t T : {1, 50}) {
            const int64_t dh = w / heads;
            Pair p;
            const uint32_t seed = static_cast<uint32_t>(w + T);
            const auto q = random_values(lq * w, seed, 2.f), wk = random_values(w * w, seed + 1, 0.5f),
                       wv = random_values(w * w, seed + 2, 0.5f), bv = random_values(w, seed + 3),
                       m = random_values(T * w, seed + 4);
            const Both bq = both(p, q, 1), bk = both(p, wk, 2), bw = both(p, wv, 3), bb = both(p, bv, 1),
                       bm = both(p, m, 2), bo = both(p, std::vector<float>(lq * w), 3);
            p.g->memory_attention(bq.g(), lq, heads, w, bk.g(), bw.g(), bb.g(), bm.g(), T, bo.g());
            p.c->memory_attention(bq.c(), lq, heads, w, bk.c(), bw.c(), bb.c(), bm.c(), T, bo.c());
            std::vector<double> bound(lq * w);
            const double scale = 1 / std::sqrt(static_cast<double>(dh));
            for (int64_t i = 0; i < lq; ++i)
                for (int h = 0; h < heads; ++h) {
                    std::vector<double> qt(w), e_qt(w), s(T), ctx(w, 0.0), e_ctx(w, 0.0);
                    for (int64_t c = 0; c < w; ++c) {
                        double acc = 0, abs_acc = 0;
                        for (int64_t d = 0; d < dh; ++d) {
                            const double t = double{q[i * w + h * dh + d]} * wk[(h * dh + d) * w + c];
                            acc += t, abs_acc += std::abs(t);
                        }
                        qt[c] = scale * acc, e_qt[c] = 2 * (gamma_n(dh) + kU) * scale * abs_acc;
                    }
                    double ds = 0, mx = -1e300, mn = 1e300;
                    for (int64_t j = 0; j < T; ++j) {
                        double acc = 0, e = 0, abs_acc = 0;
                        for (int64_t c = 0; c < w; ++c) {
                            acc += qt[c] * m[j * w + c];
                            e += e_qt[c] * std::abs(m[j * w + c]);
                            abs_acc += std::abs(qt[c] * m[j * w + c]);
                        }
                        s[j] = acc, ds = std::max(ds, e + 2 * gamma_n(w) * abs_acc);
                        mx = std::max(mx, acc), mn = std::min(mn, acc);
                    }
                    double l = 0;
                    for (int64_t j = 0; j < T; ++j) l += std::exp(s[j] - mx);
                    const double rel =
                        2 * ds + 2 * (4 + 2 * (mx - mn)) * kU * (1 + (T + 127) / 128) + 2 * gamma_n(T + 1);
                    for (int64_t j = 0; j < T; ++j)
                        for (int64_t c = 0; c < w; ++c) {
                            const double pj = std::exp(s[j] - mx) / l;
                            ctx[c] += pj * m[j * w + c], e_ctx[c] += pj * std::abs(m[j * w + c]) * rel;
                        }
                    for (int64_t d = 0; d < dh; ++d) {
                        const int64_t col = h * dh + d;
                        double prop = 0, abs_acc = std::abs(bv[col]);
                        for (int64_t c = 0; c < w; ++c) {
                            prop += std::abs(wv[col * w + c]) * e_ctx[c];
                            abs_acc += std::abs(wv[col * w + c] * ctx[c]);
                        }
                        bound[i * w + col] = prop + 2 * gamma_n(w + 1) * abs_acc;
                    }
                }
            tally.check(label({{"w", w}, {"T", T}}), bo.read(p, true), bo.read(p, false), bound, 1e-2);
        }
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}

// Device::kernel_times (clef bench's per-kernel table): the device's timestamps give each kernel its calls
// and a positive time, and the work counted for a projection and for causal attention is the arithmetic's (2
// m out in; 4 heads hd times the keys each query row sees).
TEST(VulkanKernels, KernelTimes) {
    dev::Device& g = gpu();
    g.time_kernels(true);
    const auto before = g.kernel_times();
    Pair p;
    const int64_t m = 7, in = 96, out = 67;
    const std::vector<float> w = random_values(out * in, 3);
    TensorView tv;
    tv.name = "w", tv.dtype = DType::F32, tv.shape = {out, in};
    tv.data = reinterpret_cast<const unsigned char*>(w.data()), tv.nbytes = w.size() * 4;
    dev::MatrixSource src;
    src.tensor = &tv;
    const auto wg = g.matrix(src);
    const dev::Tensor x = on(*p.g, random_values(m * in, 4)), y = p.g->scratch(m * out);
    p.g->linear(*wg, x.span(), m, y.span());
    dev::Attention a;
    a.T = 5, a.p0 = 3, a.nh = 2, a.nkv = 1, a.hd = 16, a.scale = 0.25f;
    const dev::Tensor q = on(*p.g, random_values(a.T * 2 * 16, 5)), kv = on(*p.g, random_values(8 * 16, 6)),
                      o = p.g->scratch(a.T * 2 * 16);
    a.q = q.span(), a.k = kv.span(), a.v = kv.span(), a.out = o.span();
    p.g->attention(a);
    p.g->sync();
    g.time_kernels(false);
    const auto after = g.kernel_times();
    if (after.empty()) GTEST_SKIP() << "this device's queue has no timestamps";
    auto delta = [&](const std::string& k) {
        dev::KernelTime t = after.at(k);
        if (auto it = before.find(k); it != before.end())
            t.calls -= it->second.calls, t.seconds -= it->second.seconds, t.flops -= it->second.flops;
        return t;
    };
    const dev::KernelTime lt = delta("linear_f32"), at = delta("attention");
    EXPECT_EQ(lt.calls, 1);
    EXPECT_GT(lt.seconds, 0);
    EXPECT_DOUBLE_EQ(lt.flops, 2.0 * m * out * in);
    EXPECT_EQ(at.calls, 1);
    EXPECT_GT(at.seconds, 0);
    double keys = 0;
    for (int64_t i = 0; i < a.T; ++i) keys += static_cast<double>(a.p0 + i + 1);
    EXPECT_DOUBLE_EQ(at.flops, 4.0 * a.nh * a.hd * keys);
    EXPECT_EQ(dev::vulkan_validation_errors(), 0);
}
