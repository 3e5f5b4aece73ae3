#include "model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "io/model_dir.h"
#include "ops/basic.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "ops/rope.h"
#include "util/error.h"

namespace clef {

namespace {

constexpr float kNormEps = 1e-6f;            // every vision LayerNorm (blocks and merger)
constexpr double kRopeTheta = 10000.0;       // VisionRotaryEmbedding's default; not in vision_config
constexpr int64_t kMlpRowChunk = 2048;       // rows per MLP slice (bounds the [rows][intermediate] buffer)
constexpr int64_t kParallelElems = 1 << 15;  // elementwise work below which the fast path stays on one thread

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

const TensorView& checked(const Checkpoint& ckpt, const std::string& name,
                          const std::vector<int64_t>& shape) {
    const TensorView& t = ckpt.get(name);
    if (t.shape != shape)
        throw Error(ckpt.description() + ": tensor " + name + " has shape " + shape_str(t.shape) +
                    ", expected " + shape_str(shape) + " (from vision_config)");
    return t;
}

std::vector<float> load(const Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape) {
    return checked(ckpt, name, shape).to_f32();
}

// The weight `name` (shape `shape`, viewed as [out][in]) into l: fp32 for the reference path; packed for the
// fast path, from the mapped BF16/F16 bytes as they are (exact in the packed kernels) or through a temporary
// fp32 copy for other dtypes.
void load_weight(const Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape,
                 int64_t out, int64_t in, bool reference, VisionTower::Linear& l) {
    l.in = in;
    l.out = out;
    const TensorView& t = checked(ckpt, name, shape);
    if (reference) {
        l.weight = t.to_f32();
        return;
    }
    const bool aligned16 = reinterpret_cast<uintptr_t>(t.data) % alignof(uint16_t) == 0;
    if (t.dtype == DType::BF16 && aligned16) {
        l.packed = ops::PackedLinear({t.data, ops::WeightType::BF16}, out, in, ops::GemmBackend::Auto,
                                     ops::Residency::InPlace);
    } else if (t.dtype == DType::F16 && aligned16) {
        l.packed = ops::PackedLinear({t.data, ops::WeightType::F16}, out, in);
    } else {
        const std::vector<float> w = t.to_f32();
        l.packed = ops::PackedLinear({w.data(), ops::WeightType::F32}, out, in);
    }
}

VisionTower::Linear load_linear(const Checkpoint& ckpt, const std::string& name, int64_t out, int64_t in,
                                bool reference) {
    VisionTower::Linear l;
    load_weight(ckpt, name + ".weight", {out, in}, out, in, reference, l);
    l.bias = load(ckpt, name + ".bias", {out});
    return l;
}

// A tile of y = x·Wᵀ + b: rows [0, m) of x against output columns [j0, j1). Four rows by two columns at a
// time, each dot product vectorised over k. Compiled twice (AVX2+FMA-capable x86-64-v3, and the baseline) and
// picked at run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void linear_tile(const float* x, int64_t m, int64_t k, const float* w, const float* bias, int64_t j0, int64_t j1,
                 float* y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        const float* x0 = x + i * k;
        const float* x1 = x0 + k;
        const float* x2 = x1 + k;
        const float* x3 = x2 + k;
        int64_t j = j0;
        for (; j + 2 <= j1; j += 2) {
            const float* w0 = w + j * k;
            const float* w1 = w0 + k;
            float a00 = 0, a01 = 0, a10 = 0, a11 = 0, a20 = 0, a21 = 0, a30 = 0, a31 = 0;
#pragma omp simd reduction(+ : a00, a01, a10, a11, a20, a21, a30, a31)
            for (int64_t t = 0; t < k; ++t) {
                const float u = w0[t], v = w1[t];
                a00 += x0[t] * u;
                a01 += x0[t] * v;
                a10 += x1[t] * u;
                a11 += x1[t] * v;
                a20 += x2[t] * u;
                a21 += x2[t] * v;
                a30 += x3[t] * u;
                a31 += x3[t] * v;
            }
            const float b0 = bias ? bias[j] : 0.f, b1 = bias ? bias[j + 1] : 0.f;
            y[i * n + j] = a00 + b0;
            y[i * n + j + 1] = a01 + b1;
            y[(i + 1) * n + j] = a10 + b0;
            y[(i + 1) * n + j + 1] = a11 + b1;
            y[(i + 2) * n + j] = a20 + b0;
            y[(i + 2) * n + j + 1] = a21 + b1;
            y[(i + 3) * n + j] = a30 + b0;
            y[(i + 3) * n + j + 1] = a31 + b1;
        }
        for (; j < j1; ++j) {
            const float* w0 = w + j * k;
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
            for (int64_t t = 0; t < k; ++t) {
                a0 += x0[t] * w0[t];
                a1 += x1[t] * w0[t];
                a2 += x2[t] * w0[t];
                a3 += x3[t] * w0[t];
            }
            const float b = bias ? bias[j] : 0.f;
            y[i * n + j] = a0 + b;
            y[(i + 1) * n + j] = a1 + b;
            y[(i + 2) * n + j] = a2 + b;
            y[(i + 3) * n + j] = a3 + b;
        }
    }
    for (; i < m; ++i) {
        const float* xi = x + i * k;
        for (int64_t j = j0; j < j1; ++j) {
            const float* wj = w + j * k;
            float a = 0;
#pragma omp simd reduction(+ : a)
            for (int64_t t = 0; t < k; ++t) a += xi[t] * wj[t];
            y[i * n + j] = a + (bias ? bias[j] : 0.f);
        }
    }
}

void add_inplace(float* x, const float* y, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

// f(r0, r1) over `rows` rows of `width` elements: on the fast path in row blocks on the kernel threads (every
// row computed exactly as in one call, so the result does not depend on the thread count), else in one call.
template <class F>
void for_row_blocks(bool fast, int64_t rows, int64_t width, const F& f) {
    if (!fast || rows * width < kParallelElems || ops::num_threads() <= 1) {
        f(int64_t{0}, rows);
        return;
    }
    const int64_t blocks = std::min<int64_t>(rows, 8 * ops::num_threads());
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) f(rows * b / blocks, rows * (b + 1) / blocks);
}

// gelu_tanh(x) = 0.5·x·(1 + tanh(u)) = x·sigmoid(2u) = x / (1 + exp(-2u)), u = sqrt(2/π)·(x + 0.044715·x³),
// with the polynomial exp of the fast kernels (~2 ulp); the exponent is capped where the result is 0 anyway.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "default")))
#endif
void gelu_tanh_span(float* x, int64_t n) {
    constexpr float kMinus2C = -1.5957691216057307f;  // -2·sqrt(2/π)
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        x[i] = v / (1.f + ops::exp_poly(std::min(kMinus2C * (v + 0.044715f * v * v * v), 80.f)));
    }
}

// Bidirectional attention of one frame on the fast path: qkv [rows][q | k | v] (heads x hd each) -> out
// [rows][heads x hd], the reference's arithmetic (scores, softmax over all keys, weighted sum of V) in blocks
// of kQueryBlock queries of one head: S = scale·Q·Kᵀ and O = P·V as ops::small_gemm_acc products (AVX-512
// register blocks, any head dim), the rows of S through ops::softmax_inplace_fast_f32. Blocks run on the
// kernel threads; S is kQueryBlock x rows per thread. kt is scratch for Kᵀ ([heads][hd][rows]), reused across
// calls.
void frame_attention_fast(const float* qkv, int64_t rows, int64_t heads, int64_t hd, float scale, float* out,
                          std::vector<float>& kt) {
    constexpr int64_t kQueryBlock = 32;
    const int64_t H = heads * hd, ld = 3 * H;
    kt.resize(static_cast<size_t>(H * rows));
    ops::num_threads();  // applies the global thread setting to this thread
    const bool par = rows * rows * H > (int64_t{1} << 16);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t c = 0; c < H; ++c)  // column c of K (head c / hd, dim c % hd) becomes row c of Kᵀ
        for (int64_t r = 0; r < rows; ++r) kt[static_cast<size_t>(c * rows + r)] = qkv[r * ld + H + c];
    const int64_t blocks = (rows + kQueryBlock - 1) / kQueryBlock;
#pragma omp parallel if (par)
    {
        std::vector<float> sc(static_cast<size_t>(kQueryBlock * rows));
#pragma omp for collapse(2) schedule(dynamic)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t b = 0; b < blocks; ++b) {
                const int64_t i0 = b * kQueryBlock, m = std::min(kQueryBlock, rows - i0);
                std::fill_n(sc.data(), m * rows, 0.f);
                ops::small_gemm_acc(m, rows, hd, scale, qkv + i0 * ld + h * hd, ld, kt.data() + h * hd * rows,
                                    rows, sc.data(), rows);
                for (int64_t i = 0; i < m; ++i) ops::softmax_inplace_fast_f32(sc.data() + i * rows, rows);
                float* o = out + i0 * H + h * hd;
                for (int64_t i = 0; i < m; ++i) std::fill_n(o + i * H, hd, 0.f);
                ops::small_gemm_acc(m, hd, rows, 1.f, sc.data(), rows, qkv + 2 * H + h * hd, ld, o, H);
            }
    }
}

}  // namespace

void VisionTower::apply(const Linear& l, const float* x, int64_t rows, float* y) const {
    if (rows == 0) return;
    if (reference_)
        linear(x, rows, l, y);
    else
        l.packed.forward(x, rows, y, ops::Precision::Exact, l.bias.empty() ? nullptr : l.bias.data());
}

double vision_flops(const VisionConfig& c, int64_t grid_t, int64_t grid_h, int64_t grid_w) {
    const double frame = static_cast<double>(grid_h) * static_cast<double>(grid_w);
    const double N = frame * static_cast<double>(grid_t);
    const double H = c.hidden_size, I = c.intermediate_size, O = c.out_hidden_size;
    const double dim =
        static_cast<double>(c.in_channels) * c.temporal_patch_size * c.patch_size * c.patch_size;
    const double m2 = static_cast<double>(c.spatial_merge_size) * c.spatial_merge_size;
    const double per_block = 2 * N * H * 3 * H + 2 * N * H * H + 4 * N * frame * H + 4 * N * H * I;
    const double merger = 2 * (N / m2) * (m2 * H) * (m2 * H) + 2 * (N / m2) * (m2 * H) * O;
    return 2 * N * dim * H + c.depth * per_block + merger;
}

void VisionTower::linear(const float* x, int64_t rows, const Linear& l, float* y) {
    const int64_t k = l.in, n = l.out;
    // Tasks of 64 rows x 64 output columns: a 64-column slice of W (≤ 1.2 MB for k = 4608) stays in L2 while
    // 16 groups of 4 rows stream past it.
    constexpr int64_t kRowBlock = 64, kColBlock = 64;
    const int64_t rb = (rows + kRowBlock - 1) / kRowBlock, cb = (n + kColBlock - 1) / kColBlock;
    const float* w = l.weight.data();
    const float* b = l.bias.empty() ? nullptr : l.bias.data();
#pragma omp parallel for collapse(2) schedule(dynamic) if (rows * n * k > (1 << 18))
    for (int64_t bi = 0; bi < rb; ++bi)
        for (int64_t bj = 0; bj < cb; ++bj) {
            const int64_t i0 = bi * kRowBlock, i1 = std::min(rows, i0 + kRowBlock);
            const int64_t j0 = bj * kColBlock, j1 = std::min(n, j0 + kColBlock);
            linear_tile(x + i0 * k, i1 - i0, k, w, b, j0, j1, y + i0 * n, n);
        }
}

bool VisionTower::in_checkpoint(const Checkpoint& ckpt, const std::string& prefix) {
    return ckpt.find(prefix + "patch_embed.proj.weight") != nullptr;
}

bool VisionTower::in_model_dir(const std::string& model_dir) {
    const ModelDir dir = locate_model_dir(model_dir);
    return load_model_config(dir.config_path).vision.has_value() &&
           in_checkpoint(Checkpoint::open(dir.weights_path));
}

VisionTower::VisionTower(const VisionConfig& cfg, const Checkpoint& ckpt, const std::string& prefix,
                         bool reference)
    : cfg_(cfg), reference_(reference) {
    auto fail = [](const std::string& what) { throw Error("vision config: " + what); };
    if (cfg.depth <= 0 || cfg.hidden_size <= 0 || cfg.num_heads <= 0 || cfg.intermediate_size <= 0 ||
        cfg.out_hidden_size <= 0 || cfg.patch_size <= 0 || cfg.temporal_patch_size <= 0 ||
        cfg.spatial_merge_size <= 0 || cfg.in_channels <= 0 || cfg.num_position_embeddings <= 0)
        fail("sizes must be positive");
    if (cfg.hidden_size % cfg.num_heads != 0) fail("hidden_size must be a multiple of num_heads");
    head_dim_ = cfg.hidden_size / cfg.num_heads;
    if (head_dim_ % 4 != 0) fail("head_dim must be a multiple of 4 (2-D rotary over row and column)");
    grid_side_ = static_cast<int>(std::lround(std::sqrt(static_cast<double>(cfg.num_position_embeddings))));
    if (grid_side_ * grid_side_ != cfg.num_position_embeddings)
        fail("num_position_embeddings must be a square");
    if (cfg.hidden_act == "gelu_pytorch_tanh" || cfg.hidden_act == "gelu_tanh")
        act_tanh_ = true;
    else if (cfg.hidden_act == "gelu")
        act_tanh_ = false;
    else
        fail("hidden_act '" + cfg.hidden_act + "' is not supported (gelu_pytorch_tanh or gelu)");

    const int64_t H = cfg.hidden_size, I = cfg.intermediate_size,
                  M2 = cfg.spatial_merge_size * cfg.spatial_merge_size;
    load_weight(ckpt, prefix + "patch_embed.proj.weight",
                {H, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size}, H, patch_dim(),
                reference, patch_embed_);
    patch_embed_.bias = load(ckpt, prefix + "patch_embed.proj.bias", {H});
    pos_embed_ = load(ckpt, prefix + "pos_embed.weight", {cfg.num_position_embeddings, H});
    blocks_.resize(static_cast<size_t>(cfg.depth));
    for (int l = 0; l < cfg.depth; ++l) {
        const std::string p = prefix + "blocks." + std::to_string(l) + ".";
        Block& b = blocks_[static_cast<size_t>(l)];
        b.norm1.weight = load(ckpt, p + "norm1.weight", {H});
        b.norm1.bias = load(ckpt, p + "norm1.bias", {H});
        b.norm2.weight = load(ckpt, p + "norm2.weight", {H});
        b.norm2.bias = load(ckpt, p + "norm2.bias", {H});
        b.qkv = load_linear(ckpt, p + "attn.qkv", 3 * H, H, reference);
        b.proj = load_linear(ckpt, p + "attn.proj", H, H, reference);
        b.fc1 = load_linear(ckpt, p + "mlp.linear_fc1", I, H, reference);
        b.fc2 = load_linear(ckpt, p + "mlp.linear_fc2", H, I, reference);
    }
    merger_norm_.weight = load(ckpt, prefix + "merger.norm.weight", {H});
    merger_norm_.bias = load(ckpt, prefix + "merger.norm.bias", {H});
    merger_fc1_ = load_linear(ckpt, prefix + "merger.linear_fc1", M2 * H, M2 * H, reference);
    merger_fc2_ = load_linear(ckpt, prefix + "merger.linear_fc2", cfg.out_hidden_size, M2 * H, reference);
}

std::vector<float> VisionTower::forward(const float* pixel_values, int grid_t, int grid_h, int grid_w,
                                        VisionTrace* trace) const {
    const int m = cfg_.spatial_merge_size;
    if (grid_t < 1 || grid_h < 1 || grid_w < 1 || grid_h % m != 0 || grid_w % m != 0)
        throw Error("vision tower: grid " + std::to_string(grid_t) + "x" + std::to_string(grid_h) + "x" +
                    std::to_string(grid_w) + " is not a whole number of " + std::to_string(m) + "x" +
                    std::to_string(m) + " merge blocks");
    const int64_t H = cfg_.hidden_size, hd = head_dim_, heads = cfg_.num_heads;
    const int64_t frame = static_cast<int64_t>(grid_h) * grid_w;
    const int64_t N = frame * grid_t;
    const size_t NH = static_cast<size_t>(N * H);
    const bool fast = !reference_;
    // The elementwise steps, row block by row block on the fast path (same arithmetic per row).
    auto layer_norm = [&](const float* in, const LayerNormW& w, float* out) {
        for_row_blocks(fast, N, H, [&](int64_t r0, int64_t r1) {
            ops::layer_norm(in + r0 * H, r1 - r0, H, w.weight.data(), w.bias.data(), kNormEps, out + r0 * H);
        });
    };
    auto add_rows = [&](float* acc, const float* y) {
        for_row_blocks(fast, N, H, [&](int64_t r0, int64_t r1) {
            add_inplace(acc + r0 * H, y + r0 * H, static_cast<size_t>((r1 - r0) * H));
        });
    };

    // 1. Patch embedding.
    std::vector<float> x(NH);
    apply(patch_embed_, pixel_values, N, x.data());
    if (trace) trace->patch_embed = x;

    // Patch coordinates in merge-block order (the same for every frame).
    std::vector<int32_t> rows(static_cast<size_t>(frame)), cols(static_cast<size_t>(frame));
    {
        size_t p = 0;
        for (int bh = 0; bh < grid_h / m; ++bh)
            for (int bw = 0; bw < grid_w / m; ++bw)
                for (int ih = 0; ih < m; ++ih)
                    for (int iw = 0; iw < m; ++iw, ++p) {
                        rows[p] = bh * m + ih;
                        cols[p] = bw * m + iw;
                    }
    }

    // 2. Position embedding: bilinear (align_corners) interpolation of the learned grid, added.
    {
        const int S = grid_side_;
        auto axis = [S](int i, int n, int& lo, int& hi, double& frac) {
            const double pos = n > 1 ? static_cast<double>(i) * (S - 1) / (n - 1) : 0.0;
            lo = static_cast<int>(pos);
            hi = std::min(lo + 1, S - 1);
            frac = pos - lo;
        };
        std::vector<float> pos(static_cast<size_t>(frame * H));
        std::vector<double> acc(static_cast<size_t>(H));
        for (int64_t p = 0; p < frame; ++p) {
            int r0, r1, c0, c1;
            double dr, dc;
            axis(rows[p], grid_h, r0, r1, dr);
            axis(cols[p], grid_w, c0, c1, dc);
            const int idx[4] = {r0 * S + c0, r0 * S + c1, r1 * S + c0, r1 * S + c1};
            const double wt[4] = {(1 - dr) * (1 - dc), (1 - dr) * dc, dr * (1 - dc), dr * dc};
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int q = 0; q < 4; ++q) {
                const float* e = pos_embed_.data() + static_cast<size_t>(idx[q]) * H;
                for (int64_t d = 0; d < H; ++d) acc[d] += wt[q] * e[d];
            }
            for (int64_t d = 0; d < H; ++d) pos[p * H + d] = static_cast<float>(acc[d]);
        }
        for (int64_t t = 0; t < grid_t; ++t) add_inplace(x.data() + t * frame * H, pos.data(), pos.size());
        if (trace) {
            trace->pos_embed.clear();
            for (int64_t t = 0; t < grid_t; ++t)
                trace->pos_embed.insert(trace->pos_embed.end(), pos.begin(), pos.end());
            trace->embeddings = x;
        }
    }

    // 3. 2-D rotary tables: frequency i < hd/4 turns with the patch row, the next hd/4 with the column.
    const int64_t half = hd / 2, quarter = hd / 4;
    std::vector<float> cos_t(static_cast<size_t>(N * half)), sin_t(static_cast<size_t>(N * half));
    {
        std::vector<double> inv(static_cast<size_t>(quarter));
        for (int64_t i = 0; i < quarter; ++i)
            inv[i] = std::pow(kRopeTheta, -2.0 * static_cast<double>(i) / static_cast<double>(half));
        for (int64_t n = 0; n < N; ++n) {
            const int64_t p = n % frame;
            for (int64_t i = 0; i < half; ++i) {
                const double ang = i < quarter ? rows[p] * inv[i] : cols[p] * inv[i - quarter];
                cos_t[n * half + i] = static_cast<float>(std::cos(ang));
                sin_t[n * half + i] = static_cast<float>(std::sin(ang));
            }
        }
        if (trace) {
            trace->rotary_row_col.resize(static_cast<size_t>(N * 2));
            trace->rotary_cos.resize(static_cast<size_t>(N * hd));
            trace->rotary_sin.resize(static_cast<size_t>(N * hd));
            for (int64_t n = 0; n < N; ++n) {
                trace->rotary_row_col[n * 2] = rows[n % frame];
                trace->rotary_row_col[n * 2 + 1] = cols[n % frame];
                for (int64_t i = 0; i < hd; ++i) {
                    trace->rotary_cos[n * hd + i] = cos_t[n * half + i % half];
                    trace->rotary_sin[n * hd + i] = sin_t[n * half + i % half];
                }
            }
        }
    }

    // 4. Blocks.
    std::vector<float> xn(NH), qkv(static_cast<size_t>(N * 3 * H)), attn(NH), tmp(NH), attn_scratch;
    const int64_t I = cfg_.intermediate_size;
    std::vector<float> mid(static_cast<size_t>(std::min<int64_t>(N, kMlpRowChunk) * I));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    if (trace) trace->blocks.assign(blocks_.size(), {});
    for (size_t l = 0; l < blocks_.size(); ++l) {
        const Block& b = blocks_[l];
        layer_norm(x.data(), b.norm1, xn.data());
        apply(b.qkv, xn.data(), N, qkv.data());
        // q and k rotate in place inside the packed [q | k | v] rows (q and k heads are adjacent: 2·heads
        // heads of hd per row).
        for_row_blocks(fast, N, 2 * H, [&](int64_t r0, int64_t r1) {
            ops::rope_apply(qkv.data() + r0 * 3 * H, r1 - r0, static_cast<int>(2 * heads),
                            static_cast<int>(hd), 3 * H, static_cast<int>(hd), cos_t.data() + r0 * half,
                            sin_t.data() + r0 * half);
        });
        // Bidirectional attention within each frame of the image.
        for (int64_t t = 0; t < grid_t; ++t) {
            const float* base = qkv.data() + t * frame * 3 * H;
            if (fast)
                frame_attention_fast(base, frame, heads, hd, scale, attn.data() + t * frame * H,
                                     attn_scratch);
            else
                ops::attention(base, 3 * H, base + H, 3 * H, base + 2 * H, 3 * H, frame, frame,
                               static_cast<int>(heads), static_cast<int>(heads), static_cast<int>(hd), scale,
                               false, attn.data() + t * frame * H, H);
        }
        apply(b.proj, attn.data(), N, tmp.data());
        if (trace) {
            VisionTrace::Block& tb = trace->blocks[l];
            tb.norm1 = xn;
            tb.q_rope.resize(NH);
            tb.k_rope.resize(NH);
            tb.v.resize(NH);
            for (int64_t n = 0; n < N; ++n) {
                std::copy_n(qkv.data() + n * 3 * H, H, tb.q_rope.data() + n * H);
                std::copy_n(qkv.data() + n * 3 * H + H, H, tb.k_rope.data() + n * H);
                std::copy_n(qkv.data() + n * 3 * H + 2 * H, H, tb.v.data() + n * H);
            }
            tb.attn = attn;
            tb.attn_out = tmp;
        }
        add_rows(x.data(), tmp.data());

        layer_norm(x.data(), b.norm2, xn.data());
        for (int64_t r0 = 0; r0 < N; r0 += kMlpRowChunk) {
            const int64_t rn = std::min(kMlpRowChunk, N - r0);
            apply(b.fc1, xn.data() + r0 * H, rn, mid.data());
            for_row_blocks(fast, rn, I, [&](int64_t i0, int64_t i1) {
                float* p = mid.data() + i0 * I;
                const int64_t n = (i1 - i0) * I;
                if (!act_tanh_)
                    ops::gelu_erf_inplace(p, n);
                else if (fast)
                    gelu_tanh_span(p, n);
                else
                    ops::gelu_tanh_inplace(p, n);
            });
            apply(b.fc2, mid.data(), rn, tmp.data() + r0 * H);
        }
        add_rows(x.data(), tmp.data());
        if (trace) {
            VisionTrace::Block& tb = trace->blocks[l];
            tb.norm2 = xn;
            tb.mlp_out = tmp;
            tb.block_out = x;
        }
    }

    // 5. Merger: LayerNorm per patch, m x m consecutive rows concatenated, fc1, exact GELU, fc2.
    layer_norm(x.data(), merger_norm_, xn.data());
    const int64_t M2 = static_cast<int64_t>(m) * m, T = N / M2;
    std::vector<float> h1(static_cast<size_t>(T * M2 * H));
    apply(merger_fc1_, xn.data(), T, h1.data());  // xn viewed as [T][M2·H]
    if (trace) {
        trace->merger_norm = xn;
        trace->merger_in = xn;
    }
    for_row_blocks(fast, T, M2 * H, [&](int64_t r0, int64_t r1) {
        ops::gelu_erf_inplace(h1.data() + r0 * M2 * H, (r1 - r0) * M2 * H);
    });
    if (trace) trace->merger_fc1_gelu = h1;
    std::vector<float> out(static_cast<size_t>(T * cfg_.out_hidden_size));
    apply(merger_fc2_, h1.data(), T, out.data());
    if (trace) trace->merged = out;
    return out;
}

}  // namespace clef
