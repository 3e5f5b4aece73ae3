#include "model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>

#include "io/model_dir.h"
#include "model/tensors.h"
#include "util/error.h"
#include "util/text.h"

namespace clef {

namespace {

constexpr float kNormEps = 1e-6f;            // every vision LayerNorm (blocks and merger)
constexpr double kRopeTheta = 10000.0;       // VisionRotaryEmbedding's default; not in vision_config
constexpr int64_t kMlpRowChunk = 2048;       // rows per MLP slice (bounds the [rows][intermediate] buffer)

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

// The projection m (its weight viewed as [out][in], and its bias [out]) on the device, for the tower's path.
std::unique_ptr<dev::Matrix> load_linear(dev::Device& device, const WeightSource& ckpt, const ModuleRef& m,
                                         bool reference) {
    dev::MatrixSource src;
    src.tensor = &checked(ckpt, m.weight, m.shape);  // checked before the bias
    src.bias = load(ckpt, m.bias, {m.shape[0]});
    src.paths = reference ? dev::Paths::Reference : dev::Paths::Fast;
    return device.matrix(src);
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
                         bool reference, dev::Device& device)
    : cfg_(cfg), reference_(reference), dev_(&device) {
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
    patch_embed_ = load_linear(*dev_, ckpt, m.at(M::PatchEmbed), reference_);
    pos_embed_ = load(ckpt, m.at(M::PosEmbed));
    blocks_.resize(static_cast<size_t>(cfg_.depth));
    for (int l = 0; l < cfg_.depth; ++l) {
        Block& b = blocks_[static_cast<size_t>(l)];
        b.norm1 = load_norm(ckpt, m.at(M::Norm1, l));
        b.norm2 = load_norm(ckpt, m.at(M::Norm2, l));
        b.qkv = load_linear(*dev_, ckpt, m.at(M::Qkv, l), reference_);
        b.proj = load_linear(*dev_, ckpt, m.at(M::Proj, l), reference_);
        b.fc1 = load_linear(*dev_, ckpt, m.at(M::Fc1, l), reference_);
        b.fc2 = load_linear(*dev_, ckpt, m.at(M::Fc2, l), reference_);
    }
    merger_norm_ = load_norm(ckpt, m.at(M::MergerNorm));
    merger_fc1_ = load_linear(*dev_, ckpt, m.at(M::MergerFc1), reference_);
    merger_fc2_ = load_linear(*dev_, ckpt, m.at(M::MergerFc2), reference_);
}

VisionTower::Norm VisionTower::load_norm(const WeightSource& ckpt, const ModuleRef& m) const {
    return {dev_->vector(load(ckpt, m)), dev_->vector(load(ckpt, m.bias, m.shape))};
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

// One forward pass: its stream, the patch grid, the activations on the device, the trace being filled.
struct VisionTower::Run {
    dev::Stream& s;
    const Grid& g;
    VisionTrace* trace;
    dev::Tensor x, xn, qkv, attn, tmp, mid;  // [N][H], [N][H], [N][3H], [N][H], [N][H], [rows][I]
    dev::Tensor cos, sin;                    // the rotary tables [N][head_dim/2]
};

// The learned position grid interpolated bilinearly (align_corners) to the image's patch grid (on the host,
// as the rotary tables: it depends on the grid only), added to every frame's rows.
void VisionTower::add_position_embedding(Run& r) const {
    const Grid& g = r.g;
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
    dev::Tensor grid = r.s.scratch(g.frame * H);
    r.s.upload(grid.span(), pos.data());
    for (int64_t t = 0; t < g.t; ++t) r.s.add(r.x.at(t * g.frame * H, g.frame * H), grid.span());
    if (!r.trace) return;
    r.trace->pos_embed.clear();
    for (int64_t t = 0; t < g.t; ++t)
        r.trace->pos_embed.insert(r.trace->pos_embed.end(), pos.begin(), pos.end());
    r.trace->embeddings = r.s.read(r.x.span());
}

// 2-D rotary tables [N][head_dim/2]: frequency i < head_dim/4 turns with the patch row, the next head_dim/4
// with the column (angles in double, as the reference's float64 grid).
void VisionTower::rotary_tables(Run& r) const {
    const Grid& g = r.g;
    const int64_t hd = head_dim_, half = hd / 2, quarter = hd / 4;
    std::vector<float> cos_t(static_cast<size_t>(g.N * half)), sin_t(static_cast<size_t>(g.N * half));
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
    r.cos = r.s.scratch(g.N * half);
    r.sin = r.s.scratch(g.N * half);
    r.s.upload(r.cos.span(), cos_t.data());
    r.s.upload(r.sin.span(), sin_t.data());
    if (!r.trace) return;
    VisionTrace& tr = *r.trace;
    tr.rotary_row_col.resize(static_cast<size_t>(g.N * 2));
    tr.rotary_cos.resize(static_cast<size_t>(g.N * hd));
    tr.rotary_sin.resize(static_cast<size_t>(g.N * hd));
    for (int64_t n = 0; n < g.N; ++n) {
        tr.rotary_row_col[n * 2] = g.rows[n % g.frame];
        tr.rotary_row_col[n * 2 + 1] = g.cols[n % g.frame];
        for (int64_t i = 0; i < hd; ++i) {
            tr.rotary_cos[n * hd + i] = cos_t[n * half + i % half];
            tr.rotary_sin[n * hd + i] = sin_t[n * half + i % half];
        }
    }
}

// x += proj(attn(rope2d(qkv(LN1(x))))): bidirectional attention within each frame.
void VisionTower::attention_block(const Block& b, Run& r, VisionTrace::Block* tb) const {
    const Grid& g = r.g;
    dev::Stream& s = r.s;
    const int64_t H = cfg_.hidden_size, N = g.N, F = g.frame;
    const int heads = cfg_.num_heads;
    s.layer_norm(r.x.span(), N, H, b.norm1.w.span(), b.norm1.b.span(), kNormEps, r.xn.span());
    s.linear(*b.qkv, r.xn.span(), N, r.qkv.span());
    // q and k rotate in place inside the packed [q | k | v] rows (2·heads adjacent heads of hd per row).
    s.rope(r.qkv.span(), N, 2 * heads, head_dim_, 3 * H, head_dim_, r.cos.span(), r.sin.span());
    for (int64_t t = 0; t < g.t; ++t) {
        const dev::Span rows = r.qkv.at(t * F * 3 * H, F * 3 * H);
        dev::Attention a;
        a.T = F, a.kv = F, a.causal = false;
        a.nh = a.nkv = heads, a.hd = head_dim_;
        a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
        a.q = rows, a.k = rows.at(H, F * 3 * H - H), a.v = rows.at(2 * H, F * 3 * H - 2 * H);
        a.q_ld = a.k_ld = a.v_ld = 3 * H;
        a.out = r.attn.at(t * F * H, F * H), a.out_ld = H;
        s.attention(a);
    }
    s.linear(*b.proj, r.attn.span(), N, r.tmp.span());
    if (tb) {
        tb->norm1 = r.s.read(r.xn.span());
        const std::vector<float> qkv = r.s.read(r.qkv.span());
        for (auto [dst, col] : {std::pair{&tb->q_rope, 0}, std::pair{&tb->k_rope, 1}, std::pair{&tb->v, 2}}) {
            dst->resize(static_cast<size_t>(N * H));
            for (int64_t n = 0; n < N; ++n)
                std::copy_n(qkv.data() + n * 3 * H + col * H, H, dst->data() + n * H);
        }
        tb->attn = r.s.read(r.attn.span());
        tb->attn_out = r.s.read(r.tmp.span());
    }
    s.add(r.x.span(), r.tmp.span());
}

// x += fc2(act(fc1(LN2(x)))), in slices of kMlpRowChunk rows.
void VisionTower::mlp_block(const Block& b, Run& r, VisionTrace::Block* tb) const {
    dev::Stream& s = r.s;
    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, N = r.g.N;
    s.layer_norm(r.x.span(), N, H, b.norm2.w.span(), b.norm2.b.span(), kNormEps, r.xn.span());
    for (int64_t r0 = 0; r0 < N; r0 += kMlpRowChunk) {
        const int64_t rn = std::min(kMlpRowChunk, N - r0);
        const dev::Span mid = r.mid.at(0, rn * I);
        s.linear(*b.fc1, r.xn.at(r0 * H, rn * H), rn, mid);
        s.gelu(mid, rn, act_tanh_);
        s.linear(*b.fc2, mid, rn, r.tmp.at(r0 * H, rn * H));
    }
    s.add(r.x.span(), r.tmp.span());
    if (tb) {
        tb->norm2 = r.s.read(r.xn.span());
        tb->mlp_out = r.s.read(r.tmp.span());
        tb->block_out = r.s.read(r.x.span());
    }
}

// LayerNorm per patch, m x m consecutive rows concatenated, fc1, exact GELU, fc2.
std::vector<float> VisionTower::merge(Run& r) const {
    dev::Stream& s = r.s;
    const int64_t H = cfg_.hidden_size, M2 = int64_t{cfg_.spatial_merge_size} * cfg_.spatial_merge_size;
    const int64_t N = r.g.N, T = N / M2;
    s.layer_norm(r.x.span(), N, H, merger_norm_.w.span(), merger_norm_.b.span(), kNormEps, r.xn.span());
    dev::Tensor h1 = s.scratch(T * M2 * H), merged = s.scratch(T * cfg_.out_hidden_size);
    s.linear(*merger_fc1_, r.xn.span(), T, h1.span());  // xn viewed as [T][M2·H]
    if (r.trace) r.trace->merger_norm = r.trace->merger_in = r.s.read(r.xn.span());
    s.gelu(h1.span(), T, false);
    if (r.trace) r.trace->merger_fc1_gelu = r.s.read(h1.span());
    s.linear(*merger_fc2_, h1.span(), T, merged.span());
    std::vector<float> out = r.s.read(merged.span());
    if (r.trace) r.trace->merged = out;
    return out;
}

// Through one stream of the tower's device (device/device.h): the pixels and the grid's tables in, the merged
// rows out.
std::vector<float> VisionTower::forward(const float* pixel_values, int grid_t, int grid_h, int grid_w,
                                        VisionTrace* trace) const {
    const Grid g = patch_grid(grid_t, grid_h, grid_w);
    const int64_t H = cfg_.hidden_size, N = g.N;
    const std::unique_ptr<dev::Stream> stream = dev_->stream({reference_, ops::Precision::Exact});
    Run r{*stream, g, trace, {}, {}, {}, {}, {}, {}, {}, {}};
    dev::Stream& s = r.s;
    r.x = s.scratch(N * H);
    {
        dev::Tensor px = s.scratch(N * patch_dim());
        s.upload(px.span(), pixel_values);
        s.linear(*patch_embed_, px.span(), N, r.x.span());
    }
    if (trace) trace->patch_embed = r.s.read(r.x.span());
    add_position_embedding(r);
    rotary_tables(r);
    r.xn = s.scratch(N * H);
    r.attn = s.scratch(N * H);
    r.tmp = s.scratch(N * H);
    r.qkv = s.scratch(N * 3 * H);
    r.mid = s.scratch(std::min<int64_t>(N, kMlpRowChunk) * cfg_.intermediate_size);
    if (trace) trace->blocks.assign(blocks_.size(), {});
    for (size_t l = 0; l < blocks_.size(); ++l) {
        VisionTrace::Block* tb = trace ? &trace->blocks[l] : nullptr;
        attention_block(blocks_[l], r, tb);
        mlp_block(blocks_[l], r, tb);
    }
    return merge(r);
}

}  // namespace clef
