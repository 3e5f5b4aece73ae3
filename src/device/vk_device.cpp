// The Vulkan device behind the seam (device/device.h): buffers in device memory, weights in their file's
// type, every kernel a compute shader of src/device/shaders. A stream records its kernels into one command
// buffer, each followed by a barrier, and runs them when the host needs a result (download, sync): one
// submission per host read. Host arrays wrapped for a run (the backbone's recurrent state and K/V cache) are
// copied in when a stream first uses them and, where a kernel wrote them, copied back at that stream's sync.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "device/device.h"
#include "device/vk_context.h"
#include "device/vk_shaders.h"
#include "device/vulkan.h"
#include "ops/iq_tables.h"
#include "util/error.h"
#include "util/text.h"

namespace clef::dev {

namespace {

using vk::Alloc;
using vk::Context;

uint64_t elem_bytes(Elem e) {
    return e == Elem::F32 ? 4 : 2;
}

// Free scratch allocations by power-of-two size class. A stream's pool hands a freed allocation to the
// stream's later kernels at once (they run after the earlier ones, barrier by barrier); when the stream has
// finished, what it freed goes to the device's pool, which every stream draws from.
class Pool {
public:
    Pool(Context& ctx, std::shared_ptr<Pool> parent) : ctx_(ctx), parent_(std::move(parent)) {}
    std::shared_ptr<Alloc> take(uint64_t bytes) {
        const uint64_t c = pool_bytes(bytes, ctx_.max_range());
        {
            std::lock_guard<std::mutex> lk(mu_);
            auto& v = free_[c];
            if (!v.empty()) {
                auto a = std::move(v.back());
                v.pop_back();
                return a;
            }
        }
        if (parent_) return parent_->take(bytes);
        return ctx_.alloc(c);
    }
    void give(std::shared_ptr<Alloc> a) {
        std::lock_guard<std::mutex> lk(mu_);
        if (closed_ && parent_) return parent_->give(std::move(a));
        free_[a->bytes].push_back(std::move(a));
    }
    // The stream's work is done: its free allocations (and later ones) go to the device's pool.
    void close() {
        std::lock_guard<std::mutex> lk(mu_);
        closed_ = true;
        if (!parent_) return;
        for (auto& [c, v] : free_)
            for (auto& a : v) parent_->give(std::move(a));
        free_.clear();
    }

private:
    Context& ctx_;
    std::shared_ptr<Pool> parent_;
    std::mutex mu_;
    bool closed_ = false;
    std::map<uint64_t, std::vector<std::shared_ptr<Alloc>>> free_;
};

// A host array wrapped for a run: its device copy, and whether a stream has copied it in / written it.
struct Wrapped {
    std::shared_ptr<Alloc> a;
    void* host = nullptr;
    uint64_t bytes = 0;
    bool on_device = false;
    bool dirty = false;  // a kernel or upload wrote the device copy
};

class DeviceBuffer final : public Buffer {
public:
    DeviceBuffer(std::shared_ptr<Alloc> a, std::shared_ptr<Pool> pool)
        : a_(std::move(a)), pool_(std::move(pool)) {}
    explicit DeviceBuffer(std::shared_ptr<Wrapped> w) : a_(w->a), wrapped_(std::move(w)) {}
    ~DeviceBuffer() override {
        if (pool_) pool_->give(std::move(a_));
    }
    size_t bytes() const override { return a_->bytes; }
    void* host() override { return nullptr; }
    const std::shared_ptr<Alloc>& alloc() const { return a_; }
    const std::shared_ptr<Wrapped>& wrapped() const { return wrapped_; }

private:
    std::shared_ptr<Alloc> a_;
    std::shared_ptr<Pool> pool_;
    std::shared_ptr<Wrapped> wrapped_;
};

DeviceBuffer& vk_buffer(const Span& s) {
    auto* b = dynamic_cast<DeviceBuffer*>(s.buf);
    if (!b) throw Error("vulkan: a kernel was given a buffer of another device");
    return *b;
}

// A weight matrix in device memory: row blocks of at most the device's storage range, each in the file's
// type (the GEMM kernels linear_<type>, linear_cm_<type>, linear_cmnv_<type>), and the bias.
class VkMatrix final : public Matrix {
public:
    struct Part {
        std::shared_ptr<Alloc> w;
        int64_t row0 = 0, rows = 0;
    };
    int64_t out() const override { return out_; }
    int64_t in() const override { return in_; }
    size_t resident_bytes() const override {
        size_t b = 0;
        for (const Part& p : parts_) b += p.w->bytes;
        return b;
    }
    bool streamed() const override { return false; }

    int64_t out_ = 0, in_ = 0;
    std::string type;  // the weights' type as the kernel names spell it: "bf16", "q4_k", ...
    std::vector<Part> parts_;
    std::shared_ptr<Alloc> bias;
    // Column groups stored out of order (QuantMatrix col_map): stored group s holds logical group from[s], of
    // col_group columns; the input is gathered into that order before the GEMM.
    std::shared_ptr<Alloc> from;
    int64_t col_group = 0;
    std::shared_ptr<Alloc> tables;  // the i-quant grids its kernel reads (the device's one copy), else null
};

// 32-bit push constants, in the order the shader's block declares them.
struct Push {
    uint32_t w[32] = {};
    uint32_t n = 0;
    Push& u(int64_t v) {
        if (v < 0 || v > 0xffffffffLL)
            throw Error(fmt::format("vulkan: {} does not fit a 32-bit kernel argument", v));
        w[n++] = static_cast<uint32_t>(v);
        return *this;
    }
    Push& f(float v) {
        std::memcpy(&w[n++], &v, 4);
        return *this;
    }
};

struct Grid {
    uint32_t x = 1, y = 1, z = 1;
};

// Workgroups for `items` items of `per` invocations each, split over x and y (65,535 per dimension).
Grid grid_for(int64_t items) {
    const int64_t x = std::min<int64_t>(std::max<int64_t>(items, 1), 65535);
    return {static_cast<uint32_t>(x), static_cast<uint32_t>((items + x - 1) / x), 1};
}
Grid grid_1d(int64_t n, int64_t local = 256) {
    return grid_for((n + local - 1) / local);
}

// ---- the projection GEMM's plan: kernel, tile shape, split of K ----

// A tile shape of the GEMM kernels (shaders/linear.comp, linear_cm.comp): the kernel's name after "linear_"
// and before the weight type, its tile of y, and its specialisation constants.
struct GemmShape {
    std::string name;    // as force_vulkan_gemm names it
    std::string kernel;  // "" (fp32 FMA tiles), "cm_" (tensor-core emulation), "cmnv_" (NV tensor cores)
    int64_t bm = 0, bn = 0;
    std::vector<uint32_t> constants;
};

// linear.comp's shapes: workgroup size, BM, BN, TM, TN. large needs 32 KiB of shared memory (two buffers of
// 16 x 128 values of x and of W); the others 16 and 18 KiB.
GemmShape tiled(const std::string& name) {
    if (name == "large") return {name, "", 128, 128, {256, 128, 128, 8, 8}};
    if (name == "small") return {name, "", 16, 128, {128, 16, 128, 4, 4}};
    return {"medium", "", 64, 64, {256, 64, 64, 4, 4}};
}

// linear_cm.comp for a subgroup size: 64 x 64 tiles, 128 invocations (the emulation: up to 16 subgroups of
// at least 8).
GemmShape tensor_cores(bool nv, uint32_t subgroup) {
    return {"coopmat", nv ? "cmnv_" : "cm_", 64, 64, {128, subgroup}};
}

// What the plan reads of the device (device/vulkan.h VulkanDeviceInfo). coop_emulated: the environment has
// CLEF_VULKAN_EMULATE_TENSOR_CORES=1, and --precision fp16 runs the tensor-core kernel's emulation where the
// device has no tensor cores (to measure what fp16 operands cost in answers on any device: docs/GPU.md).
struct GemmDevice {
    bool gpu = false;
    bool fp16 = false;
    bool coop_nv = false;
    bool coop_emulated = false;
    uint32_t shared_memory = 0, subgroup = 0;
};

struct GemmPlan {
    GemmShape shape;
    int64_t slices = 1;   // K split into this many slices (workgroups in z)
    uint32_t kchunk = 0;  // K per slice, a multiple of 16
};

std::mutex g_force_mu;
std::string g_force_shape;  // under g_force_mu
int g_force_slices = 0;

GemmShape gemm_shape(const GemmDevice& d, ops::Precision precision, int64_t m, int64_t n) {
    std::string forced;
    {
        std::lock_guard<std::mutex> lk(g_force_mu);
        forced = g_force_shape;
    }
    if (forced == "coopmat") {
        if (!d.fp16 || (!d.coop_nv && (d.subgroup < 8 || d.subgroup > 128)))
            throw Error(
                "vulkan: this device cannot run the tensor-core GEMM (fp16 and a subgroup of 8 to 128)");
        return tensor_cores(d.coop_nv, d.subgroup);
    }
    if (!forced.empty()) {
        if (forced == "large" && d.shared_memory < 32768)
            throw Error("vulkan: this device's shared memory is too small for the large GEMM tiles");
        return tiled(forced);
    }
    if (precision == ops::Precision::F16 && (d.coop_nv || (d.coop_emulated && d.fp16)))
        return tensor_cores(d.coop_nv, d.subgroup);
    if (m <= 16) return tiled("small");
    // A CPU-type device (lavapipe) runs the large tiles twice as fast as the medium ones on Clef-Flash's
    // projections (docs/GPU.md), but compiles their pipeline for seconds: only where a GEMM is that large.
    const bool large = d.gpu ? m > 64 && n > 64 : m >= 128 && n >= 1024;
    if (large && d.shared_memory >= 32768) return tiled("large");
    return tiled("medium");
}

// The GEMM of y [m][n] = x [m][k] W[n][k]ᵀ on a device: the tile shape, and K split where the tiles alone
// would leave the device idle (fewer than 128 workgroups on a GPU, 4 on a CPU-type device such as
// lavapipe), into slices of at least 256 values, at most 16.
GemmPlan plan_gemm(const GemmDevice& d, ops::Precision precision, int64_t m, int64_t n, int64_t k) {
    GemmPlan g;
    g.shape = gemm_shape(d, precision, m, n);
    const int64_t tiles = ((m + g.shape.bm - 1) / g.shape.bm) * ((n + g.shape.bn - 1) / g.shape.bn);
    const int64_t target = d.gpu ? 128 : 4;
    int64_t slices = 0;
    {
        std::lock_guard<std::mutex> lk(g_force_mu);
        slices = g_force_slices;
    }
    if (slices <= 0)
        slices =
            tiles < target ? std::clamp<int64_t>(std::min((target + tiles - 1) / tiles, k / 256), 1, 16) : 1;
    const int64_t chunk = ((k + slices - 1) / slices + 15) / 16 * 16;
    g.kchunk = static_cast<uint32_t>(std::max<int64_t>(chunk, 16));
    g.slices = std::max<int64_t>(1, (k + g.kchunk - 1) / g.kchunk);
    return g;
}

class VulkanDevice;

class VkStream final : public Stream {
public:
    VkStream(VulkanDevice& d, const StreamOptions& o);
    ~VkStream() override;
    const StreamOptions& options() const override { return opt_; }
    Tensor scratch(int64_t n, Elem e) override;
    void upload(Span dst, const void* src) override;
    void download(void* dst, Span src) override;
    void fetch(void* dst, Span src) override;
    void zero(Span dst) override;
    void sync() override;

    void linear(const Matrix& w, Span x, int64_t m, Span y) override;
    void rms_norm(Span x, int64_t rows, int64_t d, Span w, float eps, bool zc, Span y) override {
        norm(x, rows, d, 1, d, w, {}, y, 0, w.empty() ? 0 : zc ? 2 : 1, 0, eps, 1.f);
    }
    void layer_norm(Span x, int64_t rows, int64_t d, Span w, Span b, float eps, Span y) override {
        norm(x, rows, d, 1, d, w, b, y, 1, 0, 0, eps, 1.f);
    }
    void gelu(Span x, int64_t, bool tanh) override { elementwise(tanh ? 4 : 3, x, {}, {}); }
    void add(Span h, Span x) override { elementwise(0, h, x, {}); }
    void silu_mul(Span gate, Span up, Span out) override { elementwise(1, gate, up, out); }
    void sigmoid_mul(Span x, Span gate, Span out) override { elementwise(2, x, gate, out); }
    void conv1d_silu(Span x, int64_t T, int64_t C, Span w, int K, Span state, Span y) override;
    void l2_norm_heads(Span x, int64_t x_ld, int64_t T, int heads, int d, float eps, float scale,
                       Span y) override {
        norm(x, T * heads, d, heads, x_ld, {}, {}, y, 2, 0, 0, eps, scale);
    }
    void gdn_gates(Span b, Span a, int64_t T, int Hv, Span A_log, Span dt_bias) override;
    void delta_rule(const DeltaRule& d) override;
    void rms_norm_gated(Span x, Span z, int64_t rows, int64_t d, Span w, float eps, ops::NormGate gate,
                        Span y) override {
        norm(x, rows, d, 1, d, w, z, y, 0, 1, gate == ops::NormGate::Silu ? 1 : 2, eps, 1.f);
    }
    void split_query_gate(Span qg, int64_t T, int nh, int hd, Span q, Span gate) override;
    void rope(Span x, int64_t T, int heads, int hd, int64_t ld, int rotary_dim, Span cos, Span sin) override;
    void copy(Span src, Span dst) override;
    void attention(const Attention& a) override;
    void memory_attention(Span q, int64_t lq, int heads, int64_t w, Span wk, Span wv, Span bv, Span m,
                          int64_t T, Span out) override;

private:
    void begin();
    // Orders this stream's next command after the earlier ones that touch the same buffers: a barrier when
    // one of `uses` (a buffer, and whether the next command writes it) reads what an earlier command since
    // the last barrier wrote, or writes what one read or wrote; independent kernels run without one.
    void depend(std::initializer_list<std::pair<VkBuffer, bool>> uses);
    void depend(const std::vector<std::pair<VkBuffer, bool>>& uses);
    void barrier();
    // Records one kernel over `spans` (binding i = spans[i]; `written` marks the ones it writes).
    void dispatch(const std::string& kernel, std::initializer_list<Span> spans, uint32_t written,
                  const Push& pc, Grid g, double flops = 0, const std::vector<uint32_t>& constants = {});
    // The timestamps of the kernels run by the last submission, into the device's kernel times.
    void collect_times();
    DeviceBuffer& use(const Span& s, bool written);
    // `bytes` of this run's staging memory for copies to the device (Memory::Upload) or back (Readback): the
    // buffer and the offset in it.
    std::pair<Alloc*, uint64_t> stage(uint64_t bytes, vk::Memory where);
    void elementwise(uint32_t op, Span a, Span b, Span c);
    void norm(Span x, int64_t rows, int64_t d, int64_t per, int64_t x_ld, Span w, Span bz, Span y,
              uint32_t kind, uint32_t wmode, uint32_t gate, float eps, float scale);
    void delta_rule_serial(const DeltaRule& d);
    void delta_rule_chunked(const DeltaRule& d);

    VulkanDevice& dev_;
    Context& ctx_;
    StreamOptions opt_;
    std::shared_ptr<Pool> pool_;
    VkCommandBuffer cb_ = VK_NULL_HANDLE;
    VkFence fence_ = VK_NULL_HANDLE;
    bool recording_ = false;
    struct Arena {
        std::vector<std::shared_ptr<Alloc>> bufs;
        uint64_t used = 0;  // in bufs.back()
    };
    Arena up_, down_;  // staging for uploads and for readbacks
    // The buffers read and written by the commands recorded since the last barrier.
    std::vector<VkBuffer> reads_, writes_;
    std::vector<std::shared_ptr<Wrapped>> wrapped_;
    std::vector<std::shared_ptr<Alloc>> held_;  // every allocation the recorded kernels use
    struct Readback {
        void* host;
        Alloc* stage;
        uint64_t off, bytes;
    };
    std::vector<Readback> readbacks_;
    // Kernel timing (Device::time_kernels): a pair of timestamps around each kernel of a submission.
    static constexpr uint32_t kMaxQueries = 8192;
    VkQueryPool queries_ = VK_NULL_HANDLE;
    bool timing_ = false;  // this recording writes timestamps
    struct Timed {
        std::string kernel;
        double flops;
    };
    std::vector<Timed> timed_;  // one per pair of queries
};

class VulkanDevice final : public Device {
public:
    explicit VulkanDevice(int index)
        : ctx_(index), pool_(std::make_shared<Pool>(ctx_, nullptr)), dummy_(ctx_.alloc(16)) {}
    std::string name() const override { return ctx_.info().name; }
    bool is_cpu() const override { return false; }
    std::string kind() const override { return "vulkan"; }
    DeviceMemory memory() const override {
        return {ctx_.info().device_local_bytes(), ctx_.allocated(), ctx_.max_range()};
    }
    Tensor vector(std::vector<float> v) override {
        auto a = ctx_.alloc(v.size() * 4);
        ctx_.write(*a, 0, v.data(), v.size() * 4);
        return Tensor(std::make_unique<DeviceBuffer>(std::move(a), nullptr), static_cast<int64_t>(v.size()));
    }
    Tensor buffer(int64_t n, Elem e) override {
        return Tensor(
            std::make_unique<DeviceBuffer>(
                ctx_.alloc(static_cast<uint64_t>(std::max<int64_t>(n, 0)) * elem_bytes(e)), nullptr),
            n, e);
    }
    Transfers transfers() const override { return ctx_.transfers(); }
    std::unique_ptr<Matrix> matrix(const MatrixSource& src) override;
    Tensor wrap(void* host, int64_t n, Elem e) override {
        auto w = std::make_shared<Wrapped>();
        w->bytes = static_cast<uint64_t>(std::max<int64_t>(n, 0)) * elem_bytes(e);
        w->a = ctx_.alloc(w->bytes);
        w->host = host;
        return Tensor(std::make_unique<DeviceBuffer>(std::move(w)), n, e);
    }
    std::unique_ptr<Stream> stream(const StreamOptions& opt) override {
        return std::make_unique<VkStream>(*this, opt);
    }

    // The i-quants' lookup tables (shaders/dequant.glsl), uploaded with the first matrix that needs them.
    const std::shared_ptr<Alloc>& iq_tables();
    GemmDevice gemm_device() const {
        const VulkanDeviceInfo& i = ctx_.info();
        static const bool emulate = std::getenv("CLEF_VULKAN_EMULATE_TENSOR_CORES") &&
                                    std::string(std::getenv("CLEF_VULKAN_EMULATE_TENSOR_CORES")) == "1";
        return {i.gpu(), i.fp16, i.coop_matrix_nv, emulate, i.shared_memory, i.subgroup_size};
    }

    Context ctx_;
    std::shared_ptr<Pool> pool_;
    std::shared_ptr<Alloc> dummy_;  // bound where a kernel's optional input is absent

    void time_kernels(bool on) const override { timing_on_ = on; }
    bool timing() const { return timing_on_ && ctx_.timestamp_ns() > 0; }
    std::map<std::string, KernelTime> kernel_times() const override {
        std::lock_guard<std::mutex> lk(times_mu_);
        return times_;
    }
    void add_time(const std::string& kernel, double seconds, double flops) const {
        std::lock_guard<std::mutex> lk(times_mu_);
        KernelTime& t = times_[kernel];
        ++t.calls, t.seconds += seconds, t.flops += flops;
    }

private:
    mutable std::atomic<bool> timing_on_{false};
    mutable std::mutex times_mu_;
    mutable std::map<std::string, KernelTime> times_;
    std::once_flag tables_once_;
    std::shared_ptr<Alloc> tables_;
    void upload_rows(VkMatrix& m, const std::vector<unsigned char>& bytes, uint64_t row_bytes);
};

// ---- the stream's recording ----

VkStream::VkStream(VulkanDevice& d, const StreamOptions& o)
    : dev_(d), ctx_(d.ctx_), opt_(o), pool_(std::make_shared<Pool>(d.ctx_, d.pool_)) {
    cb_ = ctx_.new_command_buffer();
    fence_ = ctx_.new_fence();
}

VkStream::~VkStream() {
    try {
        sync();
    } catch (const std::exception&) {  // a lost device: the owner saw the error at its own sync or download
    }
    vkDestroyFence(ctx_.device(), fence_, nullptr);
    if (queries_) vkDestroyQueryPool(ctx_.device(), queries_, nullptr);
    ctx_.free_command_buffer(cb_);
    pool_->close();
}

void VkStream::begin() {
    if (recording_) return;
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(cb_, &bi);
    recording_ = true;
    timing_ = dev_.timing();
    if (!timing_) return;
    if (!queries_) {
        VkQueryPoolCreateInfo qi{};
        qi.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
        qi.queryType = VK_QUERY_TYPE_TIMESTAMP, qi.queryCount = kMaxQueries;
        if (vkCreateQueryPool(ctx_.device(), &qi, nullptr, &queries_) != VK_SUCCESS) {
            queries_ = VK_NULL_HANDLE, timing_ = false;
            return;
        }
    }
    vkCmdResetQueryPool(cb_, queries_, 0, kMaxQueries);
}

void VkStream::collect_times() {
    if (timed_.empty()) return;
    const uint32_t n = static_cast<uint32_t>(timed_.size() * 2);
    std::vector<uint64_t> ticks(n);
    if (vkGetQueryPoolResults(ctx_.device(), queries_, 0, n, n * sizeof(uint64_t), ticks.data(),
                              sizeof(uint64_t),
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS)
        for (size_t i = 0; i < timed_.size(); ++i)
            dev_.add_time(timed_[i].kernel,
                          static_cast<double>(ticks[2 * i + 1] - ticks[2 * i]) * ctx_.timestamp_ns() * 1e-9,
                          timed_[i].flops);
    timed_.clear();
}

void VkStream::barrier() {
    VkMemoryBarrier mb{};
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT |
                       VK_ACCESS_TRANSFER_READ_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT;
    const VkPipelineStageFlags st = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(cb_, st, st, 0, 1, &mb, 0, nullptr, 0, nullptr);
    reads_.clear(), writes_.clear();
}

void VkStream::depend(std::initializer_list<std::pair<VkBuffer, bool>> uses) {
    depend(std::vector<std::pair<VkBuffer, bool>>(uses));
}

void VkStream::depend(const std::vector<std::pair<VkBuffer, bool>>& uses) {
    const auto has = [](const std::vector<VkBuffer>& v, VkBuffer b) {
        return std::find(v.begin(), v.end(), b) != v.end();
    };
    for (const auto& [b, write] : uses)
        if (has(writes_, b) || (write && has(reads_, b))) {
            barrier();
            break;
        }
    for (const auto& [b, write] : uses) (write ? writes_ : reads_).push_back(b);
}

std::pair<Alloc*, uint64_t> VkStream::stage(uint64_t bytes, vk::Memory where) {
    Arena& a = where == vk::Memory::Readback ? down_ : up_;
    ctx_.count_copy(bytes, where == vk::Memory::Upload);
    bytes = (bytes + 15) & ~uint64_t{15};
    if (a.bufs.empty() || a.used + bytes > a.bufs.back()->bytes) {
        a.bufs.push_back(ctx_.alloc(std::max<uint64_t>(bytes, uint64_t{8} << 20), where));
        a.used = 0;
    }
    const uint64_t off = a.used;
    a.used += bytes;
    return {a.bufs.back().get(), off};
}

DeviceBuffer& VkStream::use(const Span& s, bool written) {
    DeviceBuffer& b = vk_buffer(s);
    begin();
    held_.push_back(b.alloc());
    if (const auto& w = b.wrapped()) {
        if (std::find(wrapped_.begin(), wrapped_.end(), w) == wrapped_.end()) wrapped_.push_back(w);
        if (!w->on_device && w->bytes > 0) {  // copied in before its first kernel
            const auto [st, off] = stage(w->bytes, vk::Memory::Upload);
            std::memcpy(static_cast<unsigned char*>(st->mapped) + off, w->host, w->bytes);
            const VkBufferCopy region{off, 0, w->bytes};
            depend({{w->a->buf, true}});
            vkCmdCopyBuffer(cb_, st->buf, w->a->buf, 1, &region);
            w->on_device = true;
        }
        w->dirty = w->dirty || written;
    }
    return b;
}

void VkStream::dispatch(const std::string& kernel, std::initializer_list<Span> spans, uint32_t written,
                        const Push& pc, Grid g, double flops, const std::vector<uint32_t>& constants) {
    const vk::Pipeline& p = ctx_.pipeline(kernel, static_cast<uint32_t>(spans.size()), constants);
    written |= p.writable;  // what the kernel may write in any mode, as the synchronization must assume
    std::vector<VkDescriptorBufferInfo> infos;
    std::vector<std::pair<VkBuffer, bool>> uses;
    uint32_t i = 0;
    for (const Span& s : spans) {
        ::VkBuffer buf = dev_.dummy_->buf;
        if (!s.buf && ((p.writable >> i) & 1))  // the shared dummy is only ever read
            throw Error(
                fmt::format("vulkan: kernel {} may write its binding {}, which has no buffer", kernel, i));
        if (s.buf) {
            const bool w = (written >> i) & 1;
            buf = use(s, w).alloc()->buf;
            uses.emplace_back(buf, w);
        }
        infos.push_back({buf, 0, VK_WHOLE_SIZE});
        ++i;
    }
    begin();
    depend(uses);  // all bindings against the earlier commands only: a kernel may read and write one buffer
    std::vector<VkWriteDescriptorSet> writes(infos.size());
    for (size_t b = 0; b < infos.size(); ++b) {
        writes[b].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        writes[b].dstBinding = static_cast<uint32_t>(b);
        writes[b].descriptorCount = 1;
        writes[b].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        writes[b].pBufferInfo = &infos[b];
    }
    vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
    vkCmdPushDescriptorSetKHR(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0,
                              static_cast<uint32_t>(writes.size()), writes.data());
    vkCmdPushConstants(cb_, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pc.n * 4, pc.w);
    const bool timed = timing_ && timed_.size() * 2 + 2 <= kMaxQueries;
    const uint32_t q = static_cast<uint32_t>(timed_.size() * 2);
    if (timed) vkCmdWriteTimestamp(cb_, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries_, q);
    vkCmdDispatch(cb_, g.x, g.y, g.z);
    if (timed) {
        vkCmdWriteTimestamp(cb_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, q + 1);
        timed_.push_back({kernel, flops});
    }
}

Tensor VkStream::scratch(int64_t n, Elem e) {
    const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(n, 0)) * elem_bytes(e);
    return Tensor(std::make_unique<DeviceBuffer>(pool_->take(bytes), pool_), n, e);
}

void VkStream::upload(Span dst, const void* src) {
    const uint64_t bytes = static_cast<uint64_t>(dst.n) * elem_bytes(dst.elem);
    if (bytes == 0) return;
    DeviceBuffer& b = use(dst, true);
    const auto [st, off] = stage(bytes, vk::Memory::Upload);
    std::memcpy(static_cast<unsigned char*>(st->mapped) + off, src, bytes);
    const VkBufferCopy region{off, static_cast<uint64_t>(dst.off) * elem_bytes(dst.elem), bytes};
    depend({{b.alloc()->buf, true}});
    vkCmdCopyBuffer(cb_, st->buf, b.alloc()->buf, 1, &region);
}

void VkStream::fetch(void* dst, Span src) {
    const uint64_t bytes = static_cast<uint64_t>(src.n) * elem_bytes(src.elem);
    if (bytes == 0) return;
    DeviceBuffer& b = use(src, false);
    const auto [st, off] = stage(bytes, vk::Memory::Readback);
    const VkBufferCopy region{static_cast<uint64_t>(src.off) * elem_bytes(src.elem), off, bytes};
    depend({{b.alloc()->buf, false}});
    vkCmdCopyBuffer(cb_, b.alloc()->buf, st->buf, 1, &region);
    readbacks_.push_back({dst, st, off, bytes});
}

void VkStream::zero(Span dst) {
    const uint64_t bytes = static_cast<uint64_t>(dst.n) * elem_bytes(dst.elem);
    const uint64_t off = static_cast<uint64_t>(dst.off) * elem_bytes(dst.elem);
    if (bytes == 0) return;
    if (off % 4 != 0 || bytes % 4 != 0)
        throw Error("vulkan: zero() of a span that is not whole 32-bit words");
    DeviceBuffer& b = use(dst, true);
    depend({{b.alloc()->buf, true}});
    vkCmdFillBuffer(cb_, b.alloc()->buf, off, bytes, 0);
}

void VkStream::download(void* dst, Span src) {
    fetch(dst, src);
    sync();
}

void VkStream::sync() {
    if (!recording_) return;
    for (const auto& w : wrapped_) {  // the wrapped arrays the kernels wrote, back to the host
        if (w->bytes == 0 || !w->dirty) continue;
        const auto [st, off] = stage(w->bytes, vk::Memory::Readback);
        const VkBufferCopy region{0, off, w->bytes};
        depend({{w->a->buf, false}});
        vkCmdCopyBuffer(cb_, w->a->buf, st->buf, 1, &region);
        readbacks_.push_back({w->host, st, off, w->bytes});
    }
    vkEndCommandBuffer(cb_);
    recording_ = false;
    const auto done = [&] {
        for (const auto& w : wrapped_) w->on_device = w->dirty = false;
        wrapped_.clear();
        held_.clear();
        readbacks_.clear();
        reads_.clear(), writes_.clear();
        for (Arena* a : {&up_, &down_}) {
            a->used = 0;
            if (a->bufs.size() > 1) a->bufs.erase(a->bufs.begin(), a->bufs.end() - 1);
        }
        vkResetCommandBuffer(cb_, 0);
    };
    try {
        ctx_.submit_and_wait(cb_, fence_);
        collect_times();
    } catch (...) {
        timed_.clear();
        done();
        throw;
    }
    for (const Readback& r : readbacks_)
        std::memcpy(r.host, static_cast<const unsigned char*>(r.stage->mapped) + r.off, r.bytes);
    done();
}

// ---- kernels ----

void VkStream::elementwise(uint32_t op, Span a, Span b, Span c) {
    const int64_t n = a.n;
    if (n == 0) return;
    const uint32_t written = op == 0 || op == 3 || op == 4 ? 1u : 4u;
    // The in-place ops bind `a` as c too: the kernel may write c in other ops, and a write the
    // synchronization must assume goes to a buffer this stream tracks, not to the shared dummy.
    if (c.empty()) c = a;
    dispatch("elementwise", {a, b, c}, written, Push().u(n).u(a.off).u(b.off).u(c.off).u(op), grid_1d(n));
}

void VkStream::norm(Span x, int64_t rows, int64_t d, int64_t per, int64_t x_ld, Span w, Span bz, Span y,
                    uint32_t kind, uint32_t wmode, uint32_t gate, float eps, float scale) {
    if (rows == 0) return;
    Push pc;
    pc.u(rows).u(d).u(x.off).u(x_ld).u(per).u(w.off).u(bz.off).u(y.off).u(kind).u(wmode).u(gate).f(eps).f(
        scale);
    dispatch("norm", {x, w, bz, y}, 8u, pc, grid_for(rows));
}

// A device allocation of the device's own (weights, tables) as a span a kernel can bind.
Tensor bound(const std::shared_ptr<Alloc>& a) {
    return a ? Tensor(std::make_unique<DeviceBuffer>(a, nullptr), 1) : Tensor();
}

void VkStream::linear(const Matrix& mat, Span x, int64_t m, Span y) {
    const auto& w = dynamic_cast<const VkMatrix&>(mat);
    if (m == 0) return;
    Tensor gathered;
    if (w.from) {  // the input's column groups in the stored order
        gathered = scratch(m * w.in(), Elem::F32);
        const int64_t groups = w.in() / w.col_group;
        dispatch("gather_cols", {x, bound(w.from).span(), gathered.span()}, 4u,
                 Push().u(m).u(groups).u(w.col_group).u(x.off).u(w.in()).u(0), grid_1d(m * w.in()));
        x = gathered.span();
    }
    const Tensor bias = bound(w.bias), tables = bound(w.tables);
    for (const VkMatrix::Part& p : w.parts_) {
        const GemmPlan g = plan_gemm(dev_.gemm_device(), opt_.precision, m, p.rows, w.in());
        const std::string kernel = "linear_" + std::string(g.shape.kernel) + w.type;
        const Tensor wt = bound(p.w);
        const double flops =
            2.0 * static_cast<double>(m) * static_cast<double>(p.rows) * static_cast<double>(w.in());
        const Grid grid{static_cast<uint32_t>((p.rows + g.shape.bn - 1) / g.shape.bn),
                        static_cast<uint32_t>((m + g.shape.bm - 1) / g.shape.bm),
                        static_cast<uint32_t>(g.slices)};
        Push pc;
        pc.u(m).u(p.rows).u(w.in()).u(x.off).u(w.in());
        if (g.slices == 1) {
            pc.u(y.off).u(w.out()).u(p.row0).u(w.bias ? 1 : 0).u(g.kchunk);
            dispatch(kernel, {x, wt.span(), bias.span(), y, tables.span()}, 8u, pc, grid, flops,
                     g.shape.constants);
            continue;
        }
        // Split K: each slice's partial sums [slice][m][rows], then their sum with the bias into y.
        const Tensor part = scratch(g.slices * m * p.rows, Elem::F32);
        pc.u(0).u(p.rows).u(0).u(0).u(g.kchunk);
        dispatch(kernel, {x, wt.span(), {}, part.span(), tables.span()}, 8u, pc, grid, flops,
                 g.shape.constants);
        dispatch("linear_reduce", {part.span(), bias.span(), y}, 4u,
                 Push().u(m).u(p.rows).u(g.slices).u(y.off).u(w.out()).u(p.row0).u(w.bias ? 1 : 0),
                 grid_1d(m * p.rows));
    }
}

void VkStream::conv1d_silu(Span x, int64_t T, int64_t C, Span w, int K, Span state, Span y) {
    if (K < 1 || K > 17) throw Error("vulkan: conv1d kernels of 1 to 17 taps only");
    if (T == 0) return;
    for (uint32_t phase = 0; phase < 2; ++phase) {
        Push pc;
        pc.u(T).u(C).u(K).u(x.off).u(w.off).u(state.off).u(y.off).u(phase);
        dispatch("conv1d", {x, w, state, y}, phase == 0 ? 8u : 4u, pc, grid_1d(phase == 0 ? T * C : C));
    }
}

void VkStream::gdn_gates(Span b, Span a, int64_t T, int Hv, Span A_log, Span dt_bias) {
    const int64_t n = T * Hv;
    if (n == 0) return;
    dispatch("gates", {b, a, A_log, dt_bias}, 3u,
             Push().u(n).u(Hv).u(b.off).u(a.off).u(A_log.off).u(dt_bias.off), grid_1d(n));
}

// Tokens per dispatch of the token-serial delta rule: the state goes through device memory between
// dispatches.
constexpr int64_t kDeltaRuleTokens = 64;
// The chunked delta rule (shaders/delta_wy.comp, delta_scan.comp): chunk length, the widest key heads and the
// most shared memory its kernels declare, and the most chunks per pair of dispatches (delta_scan loops over
// them, about 60 loop iterations per chunk: no invocation loops more than a few thousand times, and lavapipe
// cuts an invocation's loops off after 65,535 iterations) and scratch bytes for them.
constexpr int64_t kDeltaChunk = 64;
constexpr int kDeltaChunkedKeys = 128;
constexpr uint32_t kDeltaShared = 28928;
constexpr int64_t kDeltaMaxChunks = 64;
constexpr uint64_t kDeltaScratchBytes = uint64_t{32} << 20;

void VkStream::delta_rule(const DeltaRule& d) {
    if (d.dk > 256) throw Error("vulkan: delta rule heads of key width over 256");
    if (d.T == 0) return;
    // Key heads wider than the chunked kernels hold, and devices with less shared memory than they declare,
    // run the token-serial kernel.
    if (d.chunked && d.dk <= kDeltaChunkedKeys && ctx_.info().shared_memory >= kDeltaShared)
        delta_rule_chunked(d);
    else
        delta_rule_serial(d);
}

void VkStream::delta_rule_serial(const DeltaRule& d) {
    for (int64_t t0 = 0; t0 < d.T; t0 += kDeltaRuleTokens) {
        const int64_t T = std::min<int64_t>(kDeltaRuleTokens, d.T - t0);
        Push pc;
        pc.u(T).u(d.Hk).u(d.Hv).u(d.dk).u(d.dv).u(d.q_ld).u(d.k_ld).u(d.v_ld);
        pc.u(d.q.off + t0 * d.q_ld).u(d.k.off + t0 * d.k_ld).u(d.v.off + t0 * d.v_ld);
        pc.u(d.beta.off + t0 * d.Hv).u(d.g.off + t0 * d.Hv).u(d.out.off + t0 * d.Hv * d.dv).u(d.state.off);
        // Per token and state element: the decay, two dot products and the rank-1 update (7 operations).
        dispatch("delta_rule", {d.q, d.k, d.v, d.beta, d.g, d.out, d.state}, (1u << 5) | (1u << 6), pc,
                 {static_cast<uint32_t>(d.Hv), static_cast<uint32_t>((d.dv + 63) / 64), 1},
                 7.0 * static_cast<double>(T) * d.Hv * d.dk * d.dv);
    }
}

// The arithmetic of the chunked form over T tokens (chunks of 64 and the rest), per pass, counted on the
// tokens (the kernels' padding of a partial chunk and the zero triangles of their tiles are not counted):
// delta_wy: the n^2 masked dot products of K Kᵀ and Q Kᵀ, the triangular inverse (n^3 / 3) and W, U (T is
// lower triangular); delta_scan: [W; Q] S, P V' (lower triangular) and the state update.
std::pair<double, double> delta_flops(const DeltaRule& d, int64_t T) {
    double wy = 0, scan = 0;
    const double dk = d.dk, dv = d.dv;
    for (const auto& [n, count] :
         {std::pair{double(kDeltaChunk), double(T / kDeltaChunk)}, std::pair{double(T % kDeltaChunk), 1.0}}) {
        wy += count * (2 * n * n * dk + n * n * n / 3 + n * (n + 1) * (dk + dv));
        scan += count * (6 * n * dk * dv + n * (n + 1) * dv + dk * dv);
    }
    return {wy * d.Hv, scan * d.Hv};
}

// The chunked form: per group of chunks, delta_wy (every chunk's W, U, P and G into a scratch buffer, all
// chunks in parallel), then delta_scan (the state carried across the group's chunks, and the outputs).
void VkStream::delta_rule_chunked(const DeltaRule& d) {
    const int64_t dkp = (d.dk + 3) / 4 * 4;  // the scratch's rows of key width, whole vec4s
    // Scratch floats per chunk: W, Qg and Kd (dkp each), U (dv), P (64) and G (1) per position and value
    // head.
    const int64_t per_chunk = int64_t{d.Hv} * kDeltaChunk * (3 * dkp + d.dv + kDeltaChunk + 1);
    const uint64_t budget = std::min<uint64_t>(kDeltaScratchBytes, ctx_.max_range());
    if (static_cast<uint64_t>(per_chunk) * 4 > ctx_.max_range())
        throw Error(
            fmt::format("vulkan: the delta rule's scratch for {} value heads exceeds the device's largest "
                        "buffer",
                        d.Hv));
    const int64_t chunks = (d.T + kDeltaChunk - 1) / kDeltaChunk;
    const int64_t group = std::clamp<int64_t>(static_cast<int64_t>(budget / (per_chunk * 4)), 1,
                                              std::min(chunks, kDeltaMaxChunks));
    const Tensor x = scratch(group * per_chunk, Elem::F32);
    for (int64_t c0 = 0; c0 < chunks; c0 += group) {
        const int64_t nc = std::min(group, chunks - c0), t0 = c0 * kDeltaChunk;
        const int64_t T = std::min(nc * kDeltaChunk, d.T - t0), rows = int64_t{d.Hv} * nc * kDeltaChunk;
        const int64_t oQ = rows * dkp, oK = 2 * rows * dkp, oU = 3 * rows * dkp, oP = oU + rows * d.dv,
                      oG = oP + rows * kDeltaChunk;
        const auto [wy_flops, scan_flops] = delta_flops(d, T);
        Push wy;
        wy.u(T).u(d.Hk).u(d.Hv).u(d.dk).u(dkp).u(d.dv).u(d.q_ld).u(d.k_ld).u(d.v_ld);
        wy.u(d.q.off + t0 * d.q_ld).u(d.k.off + t0 * d.k_ld).u(d.v.off + t0 * d.v_ld);
        wy.u(d.beta.off + t0 * d.Hv).u(d.g.off + t0 * d.Hv).u(0).u(oQ).u(oK).u(oU).u(oP).u(oG);
        dispatch("delta_wy", {d.q, d.k, d.v, d.beta, d.g, x.span()}, 1u << 5, wy,
                 {static_cast<uint32_t>(nc), static_cast<uint32_t>(d.Hv), 1}, wy_flops);
        Push scan;
        scan.u(T).u(d.Hv).u(d.dk).u(dkp).u(d.dv).u(0).u(oQ).u(oK).u(oU).u(oP).u(oG);
        scan.u(d.out.off + t0 * d.Hv * d.dv).u(d.state.off);
        dispatch("delta_scan", {x.span(), d.out, d.state}, (1u << 1) | (1u << 2), scan,
                 {static_cast<uint32_t>(d.Hv), static_cast<uint32_t>((d.dv + 15) / 16), 1}, scan_flops);
    }
}

void VkStream::split_query_gate(Span qg, int64_t T, int nh, int hd, Span q, Span gate) {
    const int64_t n = T * nh * hd;
    if (n == 0) return;
    Push pc;
    pc.u(T).u(nh).u(hd).u(0).u(0).u(qg.off).u(q.off).u(gate.off).u(1);
    dispatch("rope", {qg, q, gate}, 6u, pc, grid_1d(n));
}

void VkStream::rope(Span x, int64_t T, int heads, int hd, int64_t ld, int rotary_dim, Span cos, Span sin) {
    const int64_t n = T * heads * (rotary_dim / 2);
    if (n == 0) return;
    Push pc;
    pc.u(T).u(heads).u(hd).u(ld).u(rotary_dim / 2).u(x.off).u(cos.off).u(sin.off).u(0);
    dispatch("rope", {x, cos, sin}, 1u, pc, grid_1d(n));
}

void VkStream::copy(Span src, Span dst) {
    if (src.n == 0) return;
    if (dst.elem == Elem::F32) {
        dispatch("elementwise", {src, {}, dst}, 4u, Push().u(src.n).u(src.off).u(0).u(dst.off).u(5),
                 grid_1d(src.n));
        return;
    }
    const int64_t words = (dst.off + src.n + 1) / 2 - dst.off / 2;
    dispatch("to_bf16", {src, dst}, 2u, Push().u(src.n).u(src.off).u(dst.off).u(words), grid_1d(words));
}

// Flash attention's tiles (shaders/attention.comp): a workgroup per kAttnSlots query slots (query rows times
// the heads sharing a KV head) and kAttnCols output dimensions of the head, using kAttnShared bytes of shared
// memory.
constexpr int64_t kAttnSlots = 32, kAttnCols = 256;
constexpr uint32_t kAttnShared = (16 * 256 + 32 * 68 + 2 * 128 + 2 * 32) * 4;

// The loop iterations one invocation of the attention kernel runs (each loop costs its trips plus one), per
// tile of 64 keys: 7, 6 per 32 head dimensions, and P V's: its V sub-tiles (16 keys of a head wider than 128,
// 32 up to 128, 64 up to 64) each a loop over the sub-tile's keys by 8. lavapipe (Mesa's llvmpipe) stops a
// shader after 65,535 in all and leaves its results short, so there the host refuses what would reach that
// (heads of 256: 58k keys; the joint head's 1,024: 19k memory rows) rather than answer wrongly.
void check_attention_loops(const vk::Context& ctx, const Attention& a) {
    if (!ctx.info().name.starts_with("llvmpipe")) return;
    const int64_t keys = a.causal ? std::min(a.keys(), a.p0 + a.T) : a.keys();
    const int64_t width = std::min<int64_t>(a.hd, kAttnCols), sub = width > 128 ? 16 : width > 64 ? 32 : 64;
    const int64_t pv = 64 / sub + 1 + 64 / sub * (sub / 8 + 1);
    const int64_t loops = (keys + 63) / 64 * (7 + pv + 6 * ((a.hd + 31) / 32)) + 1;
    if (loops > 65535)
        throw Error(
            fmt::format("vulkan: attention over {} keys with heads of {} is past what {} runs (65,535 "
                        "loop iterations per invocation)",
                        keys, a.hd, ctx.info().name));
}

void VkStream::attention(const Attention& a) {
    if (a.T == 0) return;
    if (a.nh < 1 || a.nkv < 1 || a.hd < 1 || a.nh % a.nkv != 0 || a.nkv > 65535)
        throw Error(
            fmt::format("vulkan: attention of {} query heads over {} KV heads of width {} (the query "
                        "heads must be a multiple of the 1 to 65,535 KV heads)",
                        a.nh, a.nkv, a.hd));
    if (ctx_.info().shared_memory < kAttnShared)
        throw Error(fmt::format("vulkan: attention needs {} bytes of shared memory; {} has {}", kAttnShared,
                                ctx_.info().name, ctx_.info().shared_memory));
    check_attention_loops(ctx_, a);
    const std::string kernel = a.k.elem == Elem::BF16 ? "attention_bf16" : "attention";
    const int64_t group = a.nh / a.nkv, col_blocks = (a.hd + kAttnCols - 1) / kAttnCols;
    // Query rows per dispatch: at most 65,535 workgroups along x.
    const int64_t per = std::max<int64_t>(1, 65535 * kAttnSlots / group);
    if (group > 65535 * kAttnSlots || col_blocks > 65535)
        throw Error(fmt::format("vulkan: attention of {} query heads per KV head of width {} is too large",
                                group, a.hd));
    for (int64_t i0 = 0; i0 < a.T; i0 += per) {
        const int64_t rows = std::min(a.T - i0, per);
        Push pc;
        pc.u(rows).u(a.p0 + i0).u(a.nh).u(a.nkv).u(a.hd).u(a.keys()).u(a.causal ? 1 : 0);
        pc.u(a.qs()).u(a.ks()).u(a.vs()).u(a.os());
        pc.u(a.q.off + i0 * a.qs()).u(a.k.off).u(a.v.off).u(a.out.off + i0 * a.os()).f(a.scale);
        // The useful work: keys seen by the rows (all of them, or p0 + i0 + i + 1 for row i when causal),
        // each a dot product and a weighted sum of hd values per head (4 hd operations). The masked scores of
        // a tile that is partly visible and the scores recomputed per block of output dimensions (heads wider
        // than kAttnCols) are not counted.
        const double r = static_cast<double>(rows), first = static_cast<double>(a.p0 + i0 + 1);
        const double keys = a.causal ? r * first + r * (r - 1) / 2 : r * static_cast<double>(a.keys());
        const Grid g{static_cast<uint32_t>((rows * group + kAttnSlots - 1) / kAttnSlots),
                     static_cast<uint32_t>(a.nkv), static_cast<uint32_t>(col_blocks)};
        dispatch(kernel, {a.q, a.k, a.v, a.out}, 8u, pc, g, 4.0 * keys * a.nh * a.hd);
    }
}

void VkStream::memory_attention(Span q, int64_t lq, int heads, int64_t w, Span wk, Span wv, Span bv, Span m,
                                int64_t T, Span out) {
    if (lq == 0) return;
    const int64_t R = lq * heads;
    const Tensor qt = scratch(R * w, Elem::F32), ctx = scratch(R * w, Elem::F32);
    const float scale = 1.f / std::sqrt(static_cast<float>(w / heads));
    // Each projection: lq w outputs of w / heads terms per head (qt), or lq w outputs of w terms (out).
    const double proj_flops = 2.0 * static_cast<double>(lq) * static_cast<double>(w) * static_cast<double>(w);
    dispatch("head_proj", {q, wk, {}, qt.span()}, 8u,
             Push().u(lq).u(heads).u(w).u(q.off).u(wk.off).u(0).u(0).u(0).f(scale), grid_1d(R * w),
             proj_flops);
    Attention a;
    a.T = lq, a.nh = heads, a.nkv = 1, a.hd = static_cast<int>(w), a.scale = 1.f, a.causal = false, a.kv = T;
    a.q = qt.span(), a.k = m, a.v = m, a.out = ctx.span();
    a.q_ld = heads * w, a.k_ld = w, a.v_ld = w, a.out_ld = heads * w;
    attention(a);
    dispatch("head_proj", {ctx.span(), wv, bv, out}, 8u,
             Push().u(lq).u(heads).u(w).u(0).u(wv.off).u(bv.off).u(out.off).u(1).f(1.f), grid_1d(lq * w),
             proj_flops);
}

// ---- weights ----

// The GEMM kernels' name of a type the shaders read as it is ("" for the others): the ggml name in lower case
// (kernels linear_q4_k, linear_cm_q4_k, ...).
std::string type_for(GgmlType t) {
    const std::string name = ascii_lower(ggml_type_name(static_cast<uint32_t>(t)));  // "q4_K": linear_q4_k
    for (const GemmWeightType& g : vulkan_gemm_types())
        if (g.name == name) return name;
    return "";
}

// The words of the i-quant table buffer, in the order of shaders/dequant.glsl's TAB_ offsets.
std::vector<uint32_t> iq_table_words() {
    constexpr size_t kWords = 8484;  // dequant.glsl TAB_WORDS
    const std::pair<const void*, size_t> tables[] = {
        {ops::kIq2xxsGrid, sizeof ops::kIq2xxsGrid}, {ops::kIq2xsGrid, sizeof ops::kIq2xsGrid},
        {ops::kIq2sGrid, sizeof ops::kIq2sGrid},     {ops::kIq3xxsGrid, sizeof ops::kIq3xxsGrid},
        {ops::kIq3sGrid, sizeof ops::kIq3sGrid},     {ops::kIq1sGrid, sizeof ops::kIq1sGrid},
        {ops::kIq2Signs, sizeof ops::kIq2Signs},     {ops::kIq4nlValues, sizeof ops::kIq4nlValues}};
    std::vector<uint32_t> v(kWords);
    size_t at = 0;  // in bytes; every table is a whole number of words
    for (const auto& [p, bytes] : tables) {
        if (at + bytes > kWords * 4) throw Error("vulkan: the i-quant tables outgrew the shaders' layout");
        std::memcpy(reinterpret_cast<unsigned char*>(v.data()) + at, p, bytes);
        at += bytes;
    }
    if (at != kWords * 4) throw Error("vulkan: the i-quant tables do not have the layout the shaders read");
    return v;
}

const std::shared_ptr<Alloc>& VulkanDevice::iq_tables() {
    std::call_once(tables_once_, [this] {
        const std::vector<uint32_t> words = iq_table_words();
        tables_ = ctx_.alloc(words.size() * 4);
        ctx_.write(*tables_, 0, words.data(), words.size() * 4);
    });
    return tables_;
}

std::string type_for(DType t) {
    return t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : t == DType::F32 ? "f32" : "";
}

void VulkanDevice::upload_rows(VkMatrix& m, const std::vector<unsigned char>& bytes, uint64_t row_bytes) {
    const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(ctx_.max_range() / row_bytes));
    for (int64_t r0 = 0; r0 < m.out_; r0 += per) {
        const int64_t rows = std::min(per, m.out_ - r0);
        auto a = ctx_.alloc(rows * row_bytes);
        ctx_.write(*a, 0, bytes.data() + r0 * row_bytes, rows * row_bytes);
        m.parts_.push_back({std::move(a), r0, rows});
    }
}

std::unique_ptr<Matrix> VulkanDevice::matrix(const MatrixSource& s) {
    auto m = std::make_unique<VkMatrix>();
    std::vector<unsigned char> bytes;
    uint64_t row_bytes = 0;
    if (s.quant) {
        const QuantMatrix& q = *s.quant;
        m->out_ = q.rows, m->in_ = q.cols;
        m->type = type_for(q.type);
        if (m->type.starts_with("iq")) m->tables = iq_tables();
        if (!m->type.empty() && !q.col_map.empty()) {
            m->col_group = q.col_group;
            std::vector<uint32_t> from(q.col_map.size());
            for (size_t g = 0; g < q.col_map.size(); ++g)
                from.at(static_cast<size_t>(q.col_map[g])) = static_cast<uint32_t>(g);
            m->from = ctx_.alloc(from.size() * 4);
            ctx_.write(*m->from, 0, from.data(), from.size() * 4);
        }
        if (!m->type.empty()) {  // the file's rows as they are, in logical order
            row_bytes = q.row_bytes();
            bytes.resize(q.rows * row_bytes);
            for (int64_t r = 0; r < q.rows; ++r)
                std::memcpy(bytes.data() + r * row_bytes,
                            q.data + (q.row_map.empty() ? r : q.row_map[r]) * row_bytes, row_bytes);
        } else {  // a type no shader reads (none that GGUF files of these models use): widened rows
            m->type = "f32";
            row_bytes = q.cols * 4;
            bytes.resize(q.rows * row_bytes);
            for (int64_t r = 0; r < q.rows; ++r)
                q.row_f32(r, reinterpret_cast<float*>(bytes.data() + r * row_bytes));
        }
    } else {
        if (!s.tensor) throw Error("device: a matrix needs a tensor or a quantised matrix");
        const TensorView& t = *s.tensor;
        // A weight of more dimensions (the vision tower's patch-embedding conv) is [out][the rest].
        if (t.shape.size() < 2 || t.shape[0] <= 0) throw Error("vulkan: " + t.name + " is not a matrix");
        m->out_ = t.shape[0], m->in_ = t.numel() / t.shape[0];
        m->type = type_for(t.dtype);
        if (!m->type.empty()) {
            bytes.assign(t.data, t.data + t.nbytes);
            row_bytes = t.nbytes / m->out_;
        } else {
            m->type = "f32";
            std::vector<float> f = t.to_f32();
            bytes.assign(reinterpret_cast<unsigned char*>(f.data()),
                         reinterpret_cast<unsigned char*>(f.data() + f.size()));
            row_bytes = m->in_ * 4;
        }
    }
    if (m->out_ > 0 && m->in_ > 0) upload_rows(*m, bytes, row_bytes);
    if (!s.bias.empty()) {
        m->bias = ctx_.alloc(s.bias.size() * 4);
        ctx_.write(*m->bias, 0, s.bias.data(), s.bias.size() * 4);
    }
    return m;
}

}  // namespace

std::unique_ptr<Device> open_vulkan(int index) {
    return std::make_unique<VulkanDevice>(index);
}

OpenedDevice open_device(const std::string& spec) {
    OpenedDevice out;
    if (spec == "cpu") return out;
    const DeviceChoice c = choose_device(spec, probe_vulkan());
    if (!c.vulkan) {
        out.reason = c.reason;
        return out;
    }
    try {
        out.device = open_vulkan(c.index);
    } catch (const Error& e) {
        out.reason = e.what();
    }
    return out;
}

void force_vulkan_gemm(const std::string& shape, int slices) {
    std::lock_guard<std::mutex> lk(g_force_mu);
    g_force_shape = shape;
    g_force_slices = slices;
}

int vulkan_validation_errors() {
    return vk::Context::validation_errors();
}

std::span<const GemmWeightType> vulkan_gemm_types() {
    static constexpr GemmWeightType kTypes[] = {
#include "vk_gemm_types.inc"
    };
    return kTypes;
}

bool vulkan_has_kernel(std::string_view name) {
    return vk::find_spirv(name) != nullptr;
}

}  // namespace clef::dev
