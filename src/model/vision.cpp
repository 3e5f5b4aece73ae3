#include "model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "io/model_dir.h"
#include "model/tensors.h"
#include "ops/attention_fast.h"
#include "ops/basic.h"
#include "ops/cpu.h"
#include "ops/gemm.h"
#include "ops/rope.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

namespace {

constexpr float kNormEps = 1e-6f;            // every vision LayerNorm (blocks and merger)
constexpr double kRopeTheta = 10000.0;       // VisionRotaryEmbedding's default; not in vision_config
constexpr int64_t kMlpRowChunk = 2048;       // rows per MLP slice (bounds the [rows][intermediate] buffer)
constexpr int64_t kParallelElems = 1 << 15;  // elementwise work below which the fast path stays on one thread

const TensorView& checked(const WeightSource& ckpt, const std::string& name,
                          const std::vector<int64_t>& shape) {
    const TensorView& t = ckpt.get(name);
    if (t.shape != shape)
        throw Error(ckpt.description() + ": tensor " + name + " has shape " + shape_str(t.shape) +
                    ", expected " + shape_str(shape) + " (from vision_config)");
    return t;
}

std::vector<float> load(const WeightSource& ckpt, const std::string& name,
                        const std::vector<int64_t>& shape) {
    return checked(ckpt, name, shape).to_f32();
}

// A module's weight (model/tensors.h's vision table names it and gives its shape).
std::vector<float> load(const WeightSource& ckpt, const ModuleRef& m) {
    return load(ckpt, m.weight, m.shape);
}

// The projection m (its weight viewed as [out][in], and its bias [out]) on the tower's path.
Linear load_linear(const WeightSource& ckpt, const ModuleRef& m, bool reference) {
    const TensorView& w = checked(ckpt, m.weight, m.shape);  // checked before the bias
    return Linear(w, reference ? LinearPath::Reference : LinearPath::Fast, load(ckpt, m.bias, {m.shape[0]}));
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

}  // namespace

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

bool VisionTower::in_checkpoint(const WeightSource& ckpt, const std::string& prefix) {
    return ckpt.find(vision_modules(VisionConfig{}, prefix).at(VisionModule::PatchEmbed).weight) != nullptr;
}

bool VisionTower::in_model_dir(const std::string& model_dir) {
    const ModelDir dir = locate_model_dir(model_dir);
    return load_model_config(dir.config_path).vision.has_value() &&
           in_checkpoint(WeightSource(Checkpoint::open(dir.weights_path)));
}

VisionTower::VisionTower(const VisionConfig& cfg, const WeightSource& ckpt, const std::string& prefix,
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

    load_weights(ckpt, prefix);
}

void VisionTower::load_weights(const WeightSource& ckpt, const std::string& prefix) {
    using M = VisionModule;
    const ModuleIndex m = vision_modules(cfg_, prefix);
    patch_embed_ = load_linear(ckpt, m.at(M::PatchEmbed), reference_);
    pos_embed_ = load(ckpt, m.at(M::PosEmbed));
    blocks_.resize(static_cast<size_t>(cfg_.depth));
    for (int l = 0; l < cfg_.depth; ++l) {
        Block& b = blocks_[static_cast<size_t>(l)];
        b.norm1 = load_norm(ckpt, m.at(M::Norm1, l));
        b.norm2 = load_norm(ckpt, m.at(M::Norm2, l));
        b.qkv = load_linear(ckpt, m.at(M::Qkv, l), reference_);
        b.proj = load_linear(ckpt, m.at(M::Proj, l), reference_);
        b.fc1 = load_linear(ckpt, m.at(M::Fc1, l), reference_);
        b.fc2 = load_linear(ckpt, m.at(M::Fc2, l), reference_);
    }
    merger_norm_ = load_norm(ckpt, m.at(M::MergerNorm));
    merger_fc1_ = load_linear(ckpt, m.at(M::MergerFc1), reference_);
    merger_fc2_ = load_linear(ckpt, m.at(M::MergerFc2), reference_);
}

VisionTower::LayerNormW VisionTower::load_norm(const WeightSource& ckpt, const ModuleRef& m) {
    return {load(ckpt, m), load(ckpt, m.bias, m.shape)};
}

// The patch grid of one image: each patch's row and column in merge-block order (the same for every frame).
struct VisionTower::Grid {
    int t = 0, h = 0, w = 0;
    int64_t frame = 0, N = 0;  // patches per frame, patches in all
    std::vector<int32_t> rows, cols;
};

VisionTower::Grid VisionTower::patch_grid(int grid_t, int grid_h, int grid_w) const {
    const int m = cfg_.spatial_merge_size;
    if (grid_t < 1 || grid_h < 1 || grid_w < 1 || grid_h % m != 0 || grid_w % m != 0)
        throw Error("vision tower: grid " + std::to_string(grid_t) + "x" + std::to_string(grid_h) + "x" +
                    std::to_string(grid_w) + " is not a whole number of " + std::to_string(m) + "x" +
                    std::to_string(m) + " merge blocks");
    Grid g{grid_t, grid_h, grid_w, int64_t{grid_h} * grid_w, int64_t{grid_h} * grid_w * grid_t, {}, {}};
    for (int bh = 0; bh < grid_h / m; ++bh)
        for (int bw = 0; bw < grid_w / m; ++bw)
            for (int ih = 0; ih < m; ++ih)
                for (int iw = 0; iw < m; ++iw) {
                    g.rows.push_back(bh * m + ih);
                    g.cols.push_back(bw * m + iw);
                }
    return g;
}

void VisionTower::add_rows(float* acc, const float* y, int64_t rows) const {
    const int64_t H = cfg_.hidden_size;
    for_row_blocks(!reference_, rows, H, [&](int64_t r0, int64_t r1) {
        ops::add_inplace(acc + r0 * H, y + r0 * H, static_cast<size_t>((r1 - r0) * H));
    });
}

// The learned position grid interpolated bilinearly (align_corners) to the image's patch grid, added to x.
void VisionTower::add_position_embedding(const Grid& g, float* x, VisionTrace* trace) const {
    const int S = grid_side_;
    const int64_t H = cfg_.hidden_size;
    auto axis = [S](int i, int n, int& lo, int& hi, double& frac) {
        const double pos = n > 1 ? static_cast<double>(i) * (S - 1) / (n - 1) : 0.0;
        lo = static_cast<int>(pos);
        hi = std::min(lo + 1, S - 1);
        frac = pos - lo;
    };
    std::vector<float> pos(static_cast<size_t>(g.frame * H));
    std::vector<double> acc(static_cast<size_t>(H));
    for (int64_t p = 0; p < g.frame; ++p) {
        int r0, r1, c0, c1;
        double dr, dc;
        axis(g.rows[p], g.h, r0, r1, dr);
        axis(g.cols[p], g.w, c0, c1, dc);
        const int idx[4] = {r0 * S + c0, r0 * S + c1, r1 * S + c0, r1 * S + c1};
        const double wt[4] = {(1 - dr) * (1 - dc), (1 - dr) * dc, dr * (1 - dc), dr * dc};
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int q = 0; q < 4; ++q) {
            const float* e = pos_embed_.data() + static_cast<size_t>(idx[q]) * H;
            for (int64_t d = 0; d < H; ++d) acc[d] += wt[q] * e[d];
        }
        for (int64_t d = 0; d < H; ++d) pos[p * H + d] = static_cast<float>(acc[d]);
    }
    for (int64_t t = 0; t < g.t; ++t) ops::add_inplace(x + t * g.frame * H, pos.data(), pos.size());
    if (!trace) return;
    trace->pos_embed.clear();
    for (int64_t t = 0; t < g.t; ++t) trace->pos_embed.insert(trace->pos_embed.end(), pos.begin(), pos.end());
    trace->embeddings.assign(x, x + g.N * H);
}

// 2-D rotary tables [N][head_dim/2]: frequency i < head_dim/4 turns with the patch row, the next head_dim/4
// with the column (angles in double, as the reference's float64 grid).
void VisionTower::rotary_tables(const Grid& g, std::vector<float>& cos_t, std::vector<float>& sin_t,
                                VisionTrace* trace) const {
    const int64_t hd = head_dim_, half = hd / 2, quarter = hd / 4;
    cos_t.resize(static_cast<size_t>(g.N * half));
    sin_t.resize(static_cast<size_t>(g.N * half));
    std::vector<double> inv(static_cast<size_t>(quarter));
    for (int64_t i = 0; i < quarter; ++i)
        inv[i] = std::pow(kRopeTheta, -2.0 * static_cast<double>(i) / static_cast<double>(half));
    for (int64_t n = 0; n < g.N; ++n) {
        const int64_t p = n % g.frame;
        for (int64_t i = 0; i < half; ++i) {
            const double ang = i < quarter ? g.rows[p] * inv[i] : g.cols[p] * inv[i - quarter];
            cos_t[n * half + i] = static_cast<float>(std::cos(ang));
            sin_t[n * half + i] = static_cast<float>(std::sin(ang));
        }
    }
    if (!trace) return;
    trace->rotary_row_col.resize(static_cast<size_t>(g.N * 2));
    trace->rotary_cos.resize(static_cast<size_t>(g.N * hd));
    trace->rotary_sin.resize(static_cast<size_t>(g.N * hd));
    for (int64_t n = 0; n < g.N; ++n) {
        trace->rotary_row_col[n * 2] = g.rows[n % g.frame];
        trace->rotary_row_col[n * 2 + 1] = g.cols[n % g.frame];
        for (int64_t i = 0; i < hd; ++i) {
            trace->rotary_cos[n * hd + i] = cos_t[n * half + i % half];
            trace->rotary_sin[n * hd + i] = sin_t[n * half + i % half];
        }
    }
}

// x += proj(attn(rope2d(qkv(LN1(x))))): bidirectional attention within each frame.
void VisionTower::attention_block(const Block& b, const Grid& g, float* x, BlockScratch& s,
                                  VisionTrace::Block* tb) const {
    const int64_t H = cfg_.hidden_size, hd = head_dim_, heads = cfg_.num_heads, N = g.N, half = hd / 2;
    const size_t NH = static_cast<size_t>(N * H);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    b.norm1.forward(x, N, s.xn.data(), kNormEps);
    b.qkv.forward(s.xn.data(), N, s.qkv.data());
    // q and k rotate in place inside the packed [q | k | v] rows (2·heads adjacent heads of hd per row).
    for_row_blocks(!reference_, N, 2 * H, [&](int64_t r0, int64_t r1) {
        ops::rope_apply(s.qkv.data() + r0 * 3 * H, r1 - r0, static_cast<int>(2 * heads), static_cast<int>(hd),
                        3 * H, static_cast<int>(hd), s.cos.data() + r0 * half, s.sin.data() + r0 * half);
    });
    for (int64_t t = 0; t < g.t; ++t) {
        const float* base = s.qkv.data() + t * g.frame * 3 * H;
        float* out = s.attn.data() + t * g.frame * H;
        const int nh = static_cast<int>(heads), d = static_cast<int>(hd);
        if (reference_)
            ops::attention(base, 3 * H, base + H, 3 * H, base + 2 * H, 3 * H, g.frame, g.frame, nh, nh, d,
                           scale, false, out, H);
        else
            ops::attention_fast(base, 3 * H, base + H, 3 * H, base + 2 * H, 3 * H, g.frame, g.frame, nh, nh,
                                d, scale, false, out, H);
    }
    b.proj.forward(s.attn.data(), N, s.tmp.data());
    if (tb) {
        tb->norm1 = s.xn;
        tb->q_rope.resize(NH);
        tb->k_rope.resize(NH);
        tb->v.resize(NH);
        for (int64_t n = 0; n < N; ++n) {
            std::copy_n(s.qkv.data() + n * 3 * H, H, tb->q_rope.data() + n * H);
            std::copy_n(s.qkv.data() + n * 3 * H + H, H, tb->k_rope.data() + n * H);
            std::copy_n(s.qkv.data() + n * 3 * H + 2 * H, H, tb->v.data() + n * H);
        }
        tb->attn = s.attn;
        tb->attn_out = s.tmp;
    }
    add_rows(x, s.tmp.data(), N);
}

// x += fc2(act(fc1(LN2(x)))), in slices of kMlpRowChunk rows.
void VisionTower::mlp_block(const Block& b, int64_t N, float* x, BlockScratch& s,
                            VisionTrace::Block* tb) const {
    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    b.norm2.forward(x, N, s.xn.data(), kNormEps);
    for (int64_t r0 = 0; r0 < N; r0 += kMlpRowChunk) {
        const int64_t rn = std::min(kMlpRowChunk, N - r0);
        b.fc1.forward(s.xn.data() + r0 * H, rn, s.mid.data());
        for_row_blocks(!reference_, rn, I, [&](int64_t i0, int64_t i1) {
            float* p = s.mid.data() + i0 * I;
            const int64_t n = (i1 - i0) * I;
            if (!act_tanh_)
                ops::gelu_erf_inplace(p, n);
            else if (!reference_)
                ops::gelu_tanh_inplace_fast(p, n);
            else
                ops::gelu_tanh_inplace(p, n);
        });
        b.fc2.forward(s.mid.data(), rn, s.tmp.data() + r0 * H);
    }
    add_rows(x, s.tmp.data(), N);
    if (tb) {
        tb->norm2 = s.xn;
        tb->mlp_out = s.tmp;
        tb->block_out.assign(x, x + N * H);
    }
}

// LayerNorm per patch, m x m consecutive rows concatenated, fc1, exact GELU, fc2.
std::vector<float> VisionTower::merge(const float* x, int64_t N, BlockScratch& s, VisionTrace* trace) const {
    const int64_t H = cfg_.hidden_size, M2 = int64_t{cfg_.spatial_merge_size} * cfg_.spatial_merge_size;
    const int64_t T = N / M2;
    merger_norm_.forward(x, N, s.xn.data(), kNormEps);
    std::vector<float> h1(static_cast<size_t>(T * M2 * H));
    merger_fc1_.forward(s.xn.data(), T, h1.data());  // xn viewed as [T][M2·H]
    if (trace) trace->merger_norm = trace->merger_in = s.xn;
    for_row_blocks(!reference_, T, M2 * H, [&](int64_t r0, int64_t r1) {
        ops::gelu_erf_inplace(h1.data() + r0 * M2 * H, (r1 - r0) * M2 * H);
    });
    if (trace) trace->merger_fc1_gelu = h1;
    std::vector<float> out(static_cast<size_t>(T * cfg_.out_hidden_size));
    merger_fc2_.forward(h1.data(), T, out.data());
    if (trace) trace->merged = out;
    return out;
}

std::vector<float> VisionTower::forward(const float* pixel_values, int grid_t, int grid_h, int grid_w,
                                        VisionTrace* trace) const {
    const Grid g = patch_grid(grid_t, grid_h, grid_w);
    const int64_t H = cfg_.hidden_size, N = g.N;
    std::vector<float> x(static_cast<size_t>(N * H));
    patch_embed_.forward(pixel_values, N, x.data());
    if (trace) trace->patch_embed = x;
    add_position_embedding(g, x.data(), trace);
    BlockScratch s;
    rotary_tables(g, s.cos, s.sin, trace);
    s.xn.resize(x.size());
    s.attn.resize(x.size());
    s.tmp.resize(x.size());
    s.qkv.resize(static_cast<size_t>(N * 3 * H));
    s.mid.resize(static_cast<size_t>(std::min<int64_t>(N, kMlpRowChunk) * cfg_.intermediate_size));
    if (trace) trace->blocks.assign(blocks_.size(), {});
    for (size_t l = 0; l < blocks_.size(); ++l) {
        VisionTrace::Block* tb = trace ? &trace->blocks[l] : nullptr;
        attention_block(blocks_[l], g, x.data(), s, tb);
        mlp_block(blocks_[l], N, x.data(), s, tb);
    }
    return merge(x.data(), N, s, trace);
}

}  // namespace clef
