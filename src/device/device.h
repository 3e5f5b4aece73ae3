// The device seam: what the model parts (model/backbone.cpp first) need from the hardware that runs their
// layers, written once so that a second backend is a new implementation of these three classes, not a rewrite
// of the model. docs/ARCHITECTURE.md "The device seam" shows the data flow of one decision through it.
//
//   Device   owns memory: buffers, weight matrices resident in their file's type, weight vectors.
//   Stream   one run's queue of kernels over that memory (the CPU runs each call at once; a GPU records them
//            and runs them when the host needs a result: download(), sync()).
//   Span     n values at an element offset of a buffer: what every kernel reads and writes.
//
// The CPU device (device/cpu.h) is today's kernels (src/ops) behind this interface: its buffers are host
// memory, wrap() is free, and a Stream with reference = true runs the scalar oracles instead of the fast
// kernels. Layouts are row-major with the row strides named in each kernel.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "ops/basic.h"
#include "ops/gemm.h"
#include "quant/quant.h"
#include "util/error.h"

namespace clef::dev {

// What one element of a buffer is.
enum class Elem : uint8_t { F32, BF16 };

// Memory on a device. bytes() is its size; host() its address where the CPU addresses it (the CPU device),
// else nullptr.
class Buffer {
public:
    virtual ~Buffer() = default;
    virtual size_t bytes() const = 0;
    virtual void* host() = 0;
};

// n elements of type `elem` from element offset `off` of buf.
struct Span {
    Buffer* buf = nullptr;
    int64_t off = 0;
    int64_t n = 0;
    Elem elem = Elem::F32;
    // The sub-span [o, o + len).
    Span at(int64_t o, int64_t len) const { return {buf, off + o, len, elem}; }
    bool empty() const { return n == 0; }
    // Host addresses of the first element (CPU device only: nullptr elsewhere).
    void* host() const;
    float* f32() const { return static_cast<float*>(host()); }
    uint16_t* u16() const { return static_cast<uint16_t*>(host()); }
};

// A buffer with its one span: weight vectors, scratch activations, wrapped host arrays.
class Tensor {
public:
    Tensor() = default;
    Tensor(std::unique_ptr<Buffer> b, int64_t n, Elem e = Elem::F32) : buf_(std::move(b)), n_(n), elem_(e) {}
    Span span() const { return {buf_.get(), 0, n_, elem_}; }
    Span at(int64_t o, int64_t len) const { return span().at(o, len); }
    int64_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    float* f32() const { return span().f32(); }

private:
    std::unique_ptr<Buffer> buf_;
    int64_t n_ = 0;
    Elem elem_ = Elem::F32;
};

// A weight matrix W [out][in] resident on a device, in its file's type or a packed form of it:
// y = x Wᵀ + b.
class Matrix {
public:
    virtual ~Matrix() = default;
    virtual int64_t out() const = 0;
    virtual int64_t in() const = 0;
    // Bytes of the weights the device holds for it (0 where they stay in the mapped file).
    virtual size_t resident_bytes() const = 0;
    // Whether each run reads the weights from the mapped file again (a streamed quantised matrix).
    virtual bool streamed() const = 0;
};

// Which of a CPU stream's two paths (StreamOptions::reference) will run a matrix: a model part loaded for one
// path keeps only that path's weights and need not keep its source alive; Both reads BF16 reference rows from
// the mapped source in place (the source outlives the matrix). Other devices have one path and ignore it.
enum class Paths : uint8_t { Both, Fast, Reference };

// Where a matrix's weights come from: a checkpoint tensor in its dtype, or a quantised matrix of a GGUF file
// (quant_residency: ops::Residency, how the block-quantised kinds are held); bias [out] or empty. int8: the
// fast path in int8 (Precision::Int8, ops/int8_gemm.h; the CPU device only, others ignore it).
struct MatrixSource {
    const TensorView* tensor = nullptr;
    const QuantMatrix* quant = nullptr;
    ops::Residency quant_residency = ops::Residency::Streamed;
    std::vector<float> bias;
    Paths paths = Paths::Both;
    bool int8 = false;
};

// How a stream computes.
struct StreamOptions {
    bool reference = false;  // the scalar oracles (the CPU device only), else the fast kernels
    ops::Precision precision = ops::Precision::Exact;  // activations entering the projections
};

// The gated delta rule over a chunk (ops/delta_rule.h DeltaRuleArgs, on spans): q, k [T][Hk][dk] at row
// strides q_ld / k_ld, v [T][Hv][dv] at v_ld, beta and g [T][Hv], out [T][Hv][dv], state [Hv][dk][dv]
// (read, then overwritten with the state after the chunk).
struct DeltaRule {
    int64_t T = 0;
    int Hk = 0, Hv = 0, dk = 0, dv = 0;
    Span q, k, v, beta, g, out, state;
    int64_t q_ld = 0, k_ld = 0, v_ld = 0;
    bool chunked = true;  // 64-token chunked (WY) form, else token-serial
};

// Attention of T query rows over key/value rows. Causal (the backbone's, against its K/V cache): query i of
// the chunk sees rows [0, p0 + i] (p0 rows precede the chunk). Bidirectional (causal = false: the vision
// tower within a frame, the joint head over its memory): every query sees all kv rows (0: p0 + T).
// q and out [T][nh*hd], k and v [rows][nkv*hd] (F32 or BF16), each at its row stride (0: packed).
struct Attention {
    int64_t T = 0, p0 = 0;
    int nh = 0, nkv = 0, hd = 0;
    float scale = 1;
    Span q, k, v, out;
    bool causal = true;
    bool small = false;  // a handful of rows (the joint head's): the CPU runs the plain scalar kernel
    int64_t kv = 0;
    int64_t q_ld = 0, k_ld = 0, v_ld = 0, out_ld = 0;
    int64_t keys() const { return kv > 0 ? kv : p0 + T; }
    int64_t qs() const { return q_ld > 0 ? q_ld : int64_t{nh} * hd; }
    int64_t ks() const { return k_ld > 0 ? k_ld : int64_t{nkv} * hd; }
    int64_t vs() const { return v_ld > 0 ? v_ld : int64_t{nkv} * hd; }
    int64_t os() const { return out_ld > 0 ? out_ld : int64_t{nh} * hd; }
};

class Stream {
public:
    virtual ~Stream() = default;
    virtual const StreamOptions& options() const = 0;

    // Memory for this run's activations (n elements; contents undefined).
    virtual Tensor scratch(int64_t n, Elem e = Elem::F32) = 0;
    // Host data in and out of device spans (dst.n / src.n elements). download() waits for the work before it;
    // fetch() does not: dst receives the values at the stream's next sync (or download), so several copies
    // back cost one wait.
    virtual void upload(Span dst, const void* src) = 0;
    virtual void download(void* dst, Span src) = 0;
    virtual void fetch(void* dst, Span src) = 0;
    // dst = 0 (an F32 span, or a BF16 span of whole 32-bit words).
    virtual void zero(Span dst) = 0;
    // An F32 span's values on the host (a download into a new vector: traces, host-side scoring).
    std::vector<float> read(Span src) {
        std::vector<float> v(static_cast<size_t>(src.n));
        download(v.data(), src);
        return v;
    }
    // Waits until every kernel queued so far has run (the CPU runs each at once).
    virtual void sync() = 0;

    // y[m][out] = x[m][in] · Wᵀ + b.
    virtual void linear(const Matrix& w, Span x, int64_t m, Span y) = 0;
    // RMSNorm of `rows` rows of d: y = x / rms(x) * (1 + w) (zero_centred, Qwen3.5's) or * w. y may alias x.
    virtual void rms_norm(Span x, int64_t rows, int64_t d, Span w, float eps, bool zero_centred, Span y) = 0;
    // torch.nn.LayerNorm of `rows` rows of d with affine w and b (the vision tower's, the joint head's).
    virtual void layer_norm(Span x, int64_t rows, int64_t d, Span w, Span b, float eps, Span y) = 0;
    // GELU in place over `rows` rows of x: exact (erf) or the tanh approximation.
    virtual void gelu(Span x, int64_t rows, bool tanh) = 0;
    // h += x.
    virtual void add(Span h, Span x) = 0;
    // out = silu(gate) * up; out may alias gate or up.
    virtual void silu_mul(Span gate, Span up, Span out) = 0;
    // out = x * sigmoid(gate); out may alias x.
    virtual void sigmoid_mul(Span x, Span gate, Span out) = 0;
    // Causal depthwise conv1d over T rows of C channels (taps w [C][K]) with SiLU; state holds the last K-1
    // input rows before the chunk and is updated to those after it.
    virtual void conv1d_silu(Span x, int64_t T, int64_t C, Span w, int K, Span state, Span y) = 0;
    // y row t, head h = x[t*x_ld + h*d ..] / max(||.||, eps) * scale, for T rows of `heads` heads; y rows are
    // heads*d apart.
    virtual void l2_norm_heads(Span x, int64_t x_ld, int64_t T, int heads, int d, float eps, float scale,
                               Span y) = 0;
    // The GDN gates in place over [T][Hv]: beta = sigmoid(b), g = -exp(A_log[h]) * softplus(a + dt_bias[h]).
    virtual void gdn_gates(Span b, Span a, int64_t T, int Hv, Span A_log, Span dt_bias) = 0;
    virtual void delta_rule(const DeltaRule& d) = 0;
    // y = rms_norm(x, w) * gate(z), rows of d.
    virtual void rms_norm_gated(Span x, Span z, int64_t rows, int64_t d, Span w, float eps,
                                ops::NormGate gate, Span y) = 0;
    // Splits T rows of nh heads laid out [query hd | gate hd] into q [T][nh*hd] and gate [T][nh*hd].
    virtual void split_query_gate(Span qg, int64_t T, int nh, int hd, Span q, Span gate) = 0;
    // Rotary embedding in place on the first rotary_dim dims of each head: x [T][heads*hd] at row stride ld;
    // cos, sin [T][rotary_dim/2].
    virtual void rope(Span x, int64_t T, int heads, int hd, int64_t ld, int rotary_dim, Span cos,
                      Span sin) = 0;
    // dst = src, converting F32 to dst's element type (BF16: round to nearest even).
    virtual void copy(Span src, Span dst) = 0;
    virtual void attention(const Attention& a) = 0;
    // The joint head's attention of lq queries over memory rows m [T][w] with its key and value projections
    // factored out (ops/attention_fast.h memory_attention_fast): q [lq][w] projected, wk and wv [w][w] the
    // projections' weights, bv [w] the value bias, out [lq][w].
    virtual void memory_attention(Span q, int64_t lq, int heads, int64_t w, Span wk, Span wv, Span bv, Span m,
                                  int64_t T, Span out) = 0;
};

// A device that failed under a decision: out of device memory (that decision cannot run there now), lost (no
// later work will run there) or a kernel its driver would not build. The engine answers the first with an
// error and moves to the CPU on the others (decision/engine.h).
class DeviceError : public Error {
public:
    enum class Kind { OutOfMemory, Lost, Kernel };
    DeviceError(Kind k, const std::string& what) : Error(what), kind_(k) {}
    Kind kind() const { return kind_; }

private:
    Kind kind_;
};

// Device time per kernel (Device::kernel_times): calls, seconds, and the floating-point operations of the
// ones whose work is counted (projections, attention, the delta rule).
struct KernelTime {
    int64_t calls = 0;
    double seconds = 0;
    double flops = 0;
};

// A device's memory: its device-local heaps and what this process holds in them (0 and 0 for the CPU, whose
// memory the server's memory plan counts).
struct DeviceMemory {
    uint64_t total = 0;
    uint64_t used = 0;
};

// What crossed between the host and a device since it was opened (Device::transfers): the host's waits for
// the device (submissions it waited for) and the bytes copied each way. The CPU device counts none.
struct Transfers {
    int64_t syncs = 0;
    uint64_t up = 0, down = 0;
};

// A device: where buffers live and kernels run.
class Device {
public:
    virtual ~Device() = default;
    virtual std::string name() const = 0;
    virtual bool is_cpu() const = 0;
    // "cpu" or "vulkan": the backend, as --device, /v1/models and clef bench name it.
    virtual std::string kind() const = 0;
    virtual DeviceMemory memory() const { return {}; }
    // Timing of every kernel the device runs (timestamp queries on a GPU), from time_kernels(true) on; the
    // CPU and devices without timestamps keep none. Observation only, hence const.
    virtual void time_kernels(bool) const {}
    virtual std::map<std::string, KernelTime> kernel_times() const { return {}; }
    // A weight vector (norms, biases, decays), copied to the device.
    virtual Tensor vector(std::vector<float> v) = 0;
    // Memory that outlives streams, for what a model part keeps on the device from one stream to the next
    // (the backbone's recurrent state and K/V cache over a decision's chunks): n elements, undefined until a
    // stream uploads or writes them.
    virtual Tensor buffer(int64_t n, Elem e = Elem::F32) = 0;
    virtual Transfers transfers() const { return {}; }
    // A weight matrix (src.paths: which paths of a CPU stream can run it).
    virtual std::unique_ptr<Matrix> matrix(const MatrixSource& src) = 0;
    // A host array as a span of this device for the duration of a run: the CPU device's is the array itself;
    // a GPU's is a copy that the stream's sync() writes back.
    virtual Tensor wrap(void* host, int64_t n, Elem e = Elem::F32) = 0;
    virtual std::unique_ptr<Stream> stream(const StreamOptions& opt) = 0;
};

// The CPU device (device/cpu.cpp), shared by every model part.
Device& cpu();

}  // namespace clef::dev
