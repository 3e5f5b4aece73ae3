// The CPU device: host memory and src/ops' kernels behind device/device.h. A stream with reference = true
// runs the scalar oracles (the tests' reference path), else the fast kernels; every call runs before it
// returns.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "device/device.h"
#include "device/linear.h"
#include "ops/attention_fast.h"
#include "ops/conv.h"
#include "ops/cpu.h"
#include "ops/delta_rule.h"
#include "ops/rope.h"
#include "util/error.h"
#include "util/half.h"

namespace clef::dev {

namespace {

size_t elem_bytes(Elem e) {
    return e == Elem::F32 ? 4 : 2;
}

// Memory the CPU addresses: owned (a vector of bytes) or borrowed (a caller's array).
class HostBuffer final : public Buffer {
public:
    explicit HostBuffer(size_t bytes) : owned_(new unsigned char[bytes]), p_(owned_.get()), bytes_(bytes) {}
    HostBuffer(void* p, size_t bytes) : p_(p), bytes_(bytes) {}
    size_t bytes() const override { return bytes_; }
    void* host() override { return p_; }

private:
    std::unique_ptr<unsigned char[]> owned_;
    void* p_;
    size_t bytes_;
};

Tensor host_tensor(int64_t n, Elem e) {
    return Tensor(std::make_unique<HostBuffer>(static_cast<size_t>(std::max<int64_t>(n, 0)) * elem_bytes(e)),
                  n, e);
}

// f(r0, r1) over `rows` rows of `width` elements: on the fast path in row blocks on the kernel threads (each
// row computed exactly as in one call, so results do not depend on the thread count), else in one call.
template <class F>
void row_blocks(bool fast, int64_t rows, int64_t width, const F& f) {
    constexpr int64_t kParallelElems = 1 << 15;  // below this the work stays on one thread
    if (!fast || rows * width < kParallelElems || ops::num_threads() <= 1) {
        f(int64_t{0}, rows);
        return;
    }
    const int64_t blocks = std::min<int64_t>(rows, 8 * ops::num_threads());
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) f(rows * b / blocks, rows * (b + 1) / blocks);
}

// The scalar oracle of attention (ops::attention): causal over a cache, query i of the chunk seeing rows
// 0 .. p0 + i, or bidirectional over all kv rows; a bf16 cache is widened first.
void reference_attention(const Attention& a) {
    std::vector<float> kw, vw;
    const float *k = a.k.f32(), *v = a.v.f32();
    if (a.k.elem == Elem::BF16) {
        for (auto [src, dst] : {std::pair{a.k, &kw}, std::pair{a.v, &vw}}) {
            dst->resize(src.n);
            const uint16_t* s = src.u16();
            for (int64_t i = 0; i < src.n; ++i) (*dst)[i] = bf16_to_f32(s[i]);
        }
        k = kw.data(), v = vw.data();
    }
    const float* q = a.q.f32();
    float* out = a.out.f32();
    if (!a.causal || a.p0 == 0) {
        ops::attention(q, a.qs(), k, a.ks(), v, a.vs(), a.T, a.keys(), a.nh, a.nkv, a.hd, a.scale, a.causal,
                       out, a.os());
        return;
    }
    for (int64_t i = 0; i < a.T; ++i)
        ops::attention(q + i * a.qs(), a.qs(), k, a.ks(), v, a.vs(), 1, a.p0 + i + 1, a.nh, a.nkv, a.hd,
                       a.scale, false, out + i * a.os(), a.os());
}

class CpuStream final : public Stream {
public:
    explicit CpuStream(const StreamOptions& o) : opt_(o) {}
    const StreamOptions& options() const override { return opt_; }
    Tensor scratch(int64_t n, Elem e) override { return host_tensor(n, e); }
    void upload(Span dst, const void* src) override {
        if (dst.n > 0) std::memcpy(dst.host(), src, static_cast<size_t>(dst.n) * elem_bytes(dst.elem));
    }
    void download(void* dst, Span src) override {
        if (src.n > 0) std::memcpy(dst, src.host(), static_cast<size_t>(src.n) * elem_bytes(src.elem));
    }
    void fetch(void* dst, Span src) override { download(dst, src); }
    void zero(Span dst) override {
        if (dst.n > 0) std::memset(dst.host(), 0, static_cast<size_t>(dst.n) * elem_bytes(dst.elem));
    }
    void sync() override {}

    void linear(const Matrix& w, Span x, int64_t m, Span y) override {
        static_cast<const Linear&>(w).forward(x.f32(), m, y.f32(), opt_.reference, opt_.precision);
    }
    void rms_norm(Span x, int64_t rows, int64_t d, Span w, float eps, bool zc, Span y) override {
        const auto f = zc ? (opt_.reference ? ops::rms_norm_zc : ops::rms_norm_zc_fast)
                          : (opt_.reference ? ops::rms_norm : ops::rms_norm_fast);
        f(x.f32(), rows, d, w.f32(), eps, y.f32());
    }
    void layer_norm(Span x, int64_t rows, int64_t d, Span w, Span b, float eps, Span y) override {
        (opt_.reference ? ops::layer_norm : ops::layer_norm_fast)(x.f32(), rows, d, w.f32(), b.f32(), eps,
                                                                  y.f32());
    }
    void gelu(Span x, int64_t rows, bool tanh) override {
        const int64_t width = rows > 0 ? x.n / rows : 0;
        float* p = x.f32();
        row_blocks(!opt_.reference, rows, width, [&](int64_t r0, int64_t r1) {
            const int64_t n = (r1 - r0) * width;
            if (!tanh)
                ops::gelu_erf_inplace(p + r0 * width, n);
            else if (!opt_.reference)
                ops::gelu_tanh_inplace_fast(p + r0 * width, n);
            else
                ops::gelu_tanh_inplace(p + r0 * width, n);
        });
    }
    void add(Span h, Span x) override {
        constexpr int64_t kRow = 1024;  // elements per block on the kernel threads
        float *hp = h.f32(), *xp = x.f32();
        row_blocks(!opt_.reference, (h.n + kRow - 1) / kRow, kRow, [&](int64_t b0, int64_t b1) {
            const int64_t e = std::min(h.n, b1 * kRow);
            ops::add_inplace(hp + b0 * kRow, xp + b0 * kRow, static_cast<size_t>(e - b0 * kRow));
        });
    }
    void silu_mul(Span gate, Span up, Span out) override {
        (opt_.reference ? ops::silu_mul : ops::silu_mul_fast)(gate.f32(), up.f32(), out.n, out.f32());
    }
    // The exact form on both paths (the attention output gate: a small share of the time).
    void sigmoid_mul(Span x, Span gate, Span out) override {
        ops::sigmoid_mul(x.f32(), gate.f32(), out.n, out.f32());
    }
    // The exact default keeps the reference's bits (libm's exp); the opt-in faster precisions take the
    // vectorised form.
    void conv1d_silu(Span x, int64_t T, int64_t C, Span w, int K, Span state, Span y) override {
        const bool fast = !opt_.reference && opt_.precision != ops::Precision::Exact;
        (fast ? ops::causal_conv1d_silu_fast : ops::causal_conv1d_silu)(x.f32(), T, C, C, w.f32(), K,
                                                                        state.f32(), state.f32(), y.f32(), C);
    }
    void l2_norm_heads(Span x, int64_t x_ld, int64_t T, int heads, int d, float eps, float scale,
                       Span y) override {
        const auto l2 = opt_.reference ? ops::l2_norm : ops::l2_norm_fast;
        const float* xp = x.f32();
        float* yp = y.f32();
        const int64_t y_ld = int64_t{heads} * d;
#pragma omp parallel for schedule(static) if (!opt_.reference && T * y_ld > (1 << 15))
        for (int64_t t = 0; t < T; ++t) l2(xp + t * x_ld, heads, d, eps, scale, yp + t * y_ld);
    }
    void gdn_gates(Span b, Span a, int64_t T, int Hv, Span A_log, Span dt_bias) override {
        float *bp = b.f32(), *ap = a.f32();
        const float *al = A_log.f32(), *dt = dt_bias.f32();
        std::vector<float> neg_exp_A(Hv);
        for (int h = 0; h < Hv; ++h) neg_exp_A[h] = -std::exp(al[h]);
        for (int64_t t = 0; t < T; ++t)
            for (int h = 0; h < Hv; ++h) {
                bp[t * Hv + h] = ops::sigmoid(bp[t * Hv + h]);
                ap[t * Hv + h] = neg_exp_A[h] * ops::softplus(ap[t * Hv + h] + dt[h]);
            }
    }
    void delta_rule(const DeltaRule& r) override;
    void rms_norm_gated(Span x, Span z, int64_t rows, int64_t d, Span w, float eps, ops::NormGate gate,
                        Span y) override {
        (opt_.reference ? ops::rms_norm_gated : ops::rms_norm_gated_fast)(x.f32(), z.f32(), rows, d, w.f32(),
                                                                          eps, y.f32(), gate);
    }
    void split_query_gate(Span qg, int64_t T, int nh, int hd, Span q, Span gate) override {
        const int64_t qdim = int64_t{nh} * hd;
        for (int64_t t = 0; t < T; ++t)
            for (int h = 0; h < nh; ++h) {
                const float* src = qg.f32() + (t * nh + h) * 2 * hd;
                std::copy_n(src, hd, q.f32() + t * qdim + int64_t{h} * hd);
                std::copy_n(src + hd, hd, gate.f32() + t * qdim + int64_t{h} * hd);
            }
    }
    void rope(Span x, int64_t T, int heads, int hd, int64_t ld, int rotary_dim, Span cos, Span sin) override {
        const int64_t half = rotary_dim / 2;
        row_blocks(!opt_.reference, T, int64_t{heads} * hd, [&](int64_t r0, int64_t r1) {
            ops::rope_apply(x.f32() + r0 * ld, r1 - r0, heads, hd, ld, rotary_dim, cos.f32() + r0 * half,
                            sin.f32() + r0 * half);
        });
    }
    void copy(Span src, Span dst) override {
        if (dst.elem == Elem::F32) {
            std::copy_n(src.f32(), src.n, dst.f32());
            return;
        }
        const float* s = src.f32();
        uint16_t* d = dst.u16();
        for (int64_t i = 0; i < src.n; ++i) d[i] = f32_to_bf16(s[i]);
    }
    void attention(const Attention& a) override;
    void memory_attention(Span q, int64_t lq, int heads, int64_t w, Span wk, Span wv, Span bv, Span m,
                          int64_t T, Span out) override {
        ops::memory_attention_fast(q.f32(), lq, heads, w, wk.f32(), wv.f32(), bv.f32(), m.f32(), T,
                                   out.f32());
    }

private:
    StreamOptions opt_;
};

void CpuStream::delta_rule(const DeltaRule& r) {
    ops::DeltaRuleArgs d;
    d.T = r.T;
    d.num_k_heads = r.Hk;
    d.num_v_heads = r.Hv;
    d.dk = r.dk;
    d.dv = r.dv;
    d.q = r.q.f32();
    d.q_stride = r.q_ld;
    d.k = r.k.f32();
    d.k_stride = r.k_ld;
    d.v = r.v.f32();
    d.v_stride = r.v_ld;
    d.beta = r.beta.f32();
    d.beta_stride = r.Hv;
    d.g = r.g.f32();
    d.g_stride = r.Hv;
    d.out = r.out.f32();
    d.out_stride = int64_t{r.Hv} * r.dv;
    d.initial_state = r.state.f32();
    d.final_state = r.state.f32();
    if (r.chunked && !opt_.reference)
        ops::gated_delta_rule_chunked_fast(d, 64);
    else if (r.chunked)
        ops::gated_delta_rule_chunked(d, 64);
    else
        ops::gated_delta_rule_serial(d);
}

void CpuStream::attention(const Attention& a) {
    if (opt_.reference || (a.small && a.k.elem == Elem::F32)) return reference_attention(a);
    if (a.k.elem == Elem::BF16)
        ops::attention_fast(a.q.f32(), a.qs(), a.k.u16(), a.ks(), a.v.u16(), a.vs(), a.T, a.keys(), a.nh,
                            a.nkv, a.hd, a.scale, a.causal, a.out.f32(), a.os(), opt_.precision);
    else
        ops::attention_fast(a.q.f32(), a.qs(), a.k.f32(), a.ks(), a.v.f32(), a.vs(), a.T, a.keys(), a.nh,
                            a.nkv, a.hd, a.scale, a.causal, a.out.f32(), a.os(), opt_.precision);
}

class CpuDevice final : public Device {
public:
    std::string name() const override { return "cpu"; }
    bool is_cpu() const override { return true; }
    std::string kind() const override { return "cpu"; }
    Tensor vector(std::vector<float> v) override {
        Tensor t = host_tensor(static_cast<int64_t>(v.size()), Elem::F32);
        std::copy(v.begin(), v.end(), t.f32());
        return t;
    }
    Tensor buffer(int64_t n, Elem e) override { return host_tensor(n, e); }
    std::unique_ptr<Matrix> matrix(const MatrixSource& s) override {
        const LinearPath path = s.paths == Paths::Fast        ? LinearPath::Fast
                                : s.paths == Paths::Reference ? LinearPath::Reference
                                                              : LinearPath::Both;
        if (s.quant) {
            const GgmlType ty = s.quant->type;
            const bool block = ty != GgmlType::F32 && ty != GgmlType::F16 && ty != GgmlType::BF16;
            return std::make_unique<Linear>(
                *s.quant, path, block ? s.quant_residency : ops::Residency::Packed, s.bias, s.int8);
        }
        if (!s.tensor) throw Error("device: a matrix needs a tensor or a quantised matrix");
        return std::make_unique<Linear>(*s.tensor, path, s.bias, s.int8);
    }
    Tensor wrap(void* host, int64_t n, Elem e) override {
        return Tensor(std::make_unique<HostBuffer>(host, static_cast<size_t>(n) * elem_bytes(e)), n, e);
    }
    std::unique_ptr<Stream> stream(const StreamOptions& opt) override {
        return std::make_unique<CpuStream>(opt);
    }
};

}  // namespace

void* Span::host() const {
    return buf && buf->host() ? static_cast<unsigned char*>(buf->host()) + off * elem_bytes(elem) : nullptr;
}

Device& cpu() {
    static CpuDevice d;
    return d;
}

}  // namespace clef::dev
