// The device seam (src/device/device.h): the backbone, the vision tower and the joint head run every layer
// through it. A second backend is
// stood in for by a decorator of the CPU device that counts what crosses the seam: its output must equal the
// CPU device's bit for bit (the same kernels run), every kernel must come through its stream, and one chunk
// must move only its inputs in (embeddings, RoPE tables) and its hidden states out: no host round trip per
// layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "io/safetensors.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/head.h"
#include "model/vision.h"
#include "test_util.h"

using namespace clef;
using clef::testing::data_path;

namespace {

// What crossed the seam, by kind.
struct Counts {
    std::map<std::string, int> kernels;
    int uploads = 0, downloads = 0, fetches = 0, streams = 0, matrices = 0, vectors = 0, buffers = 0;
};

// A stream that forwards to the CPU device's and counts.
class CountingStream final : public dev::Stream {
public:
    CountingStream(std::unique_ptr<dev::Stream> s, Counts& c) : s_(std::move(s)), c_(c) {}
    const dev::StreamOptions& options() const override { return s_->options(); }
    dev::Tensor scratch(int64_t n, dev::Elem e) override { return s_->scratch(n, e); }
    void upload(dev::Span dst, const void* src) override { ++c_.uploads, s_->upload(dst, src); }
    void download(void* dst, dev::Span src) override { ++c_.downloads, s_->download(dst, src); }
    void fetch(void* dst, dev::Span src) override { ++c_.fetches, s_->fetch(dst, src); }
    void zero(dev::Span dst) override { k("zero"), s_->zero(dst); }
    void sync() override { s_->sync(); }
    void linear(const dev::Matrix& w, dev::Span x, int64_t m, dev::Span y) override {
        k("linear"), s_->linear(w, x, m, y);
    }
    void rms_norm(dev::Span x, int64_t r, int64_t d, dev::Span w, float eps, bool zc, dev::Span y) override {
        k("rms_norm"), s_->rms_norm(x, r, d, w, eps, zc, y);
    }
    void layer_norm(dev::Span x, int64_t r, int64_t d, dev::Span w, dev::Span b, float eps,
                    dev::Span y) override {
        k("layer_norm"), s_->layer_norm(x, r, d, w, b, eps, y);
    }
    void gelu(dev::Span x, int64_t rows, bool tanh) override { k("gelu"), s_->gelu(x, rows, tanh); }
    void add(dev::Span h, dev::Span x) override { k("add"), s_->add(h, x); }
    void silu_mul(dev::Span g, dev::Span u, dev::Span o) override { k("silu_mul"), s_->silu_mul(g, u, o); }
    void sigmoid_mul(dev::Span x, dev::Span g, dev::Span o) override {
        k("sigmoid_mul"), s_->sigmoid_mul(x, g, o);
    }
    void conv1d_silu(dev::Span x, int64_t T, int64_t C, dev::Span w, int K, dev::Span st,
                     dev::Span y) override {
        k("conv1d_silu"), s_->conv1d_silu(x, T, C, w, K, st, y);
    }
    void l2_norm_heads(dev::Span x, int64_t ld, int64_t T, int h, int d, float eps, float sc,
                       dev::Span y) override {
        k("l2_norm_heads"), s_->l2_norm_heads(x, ld, T, h, d, eps, sc, y);
    }
    void gdn_gates(dev::Span b, dev::Span a, int64_t T, int Hv, dev::Span ne, dev::Span dt) override {
        k("gdn_gates"), s_->gdn_gates(b, a, T, Hv, ne, dt);
    }
    void delta_rule(const dev::DeltaRule& d) override { k("delta_rule"), s_->delta_rule(d); }
    void rms_norm_gated(dev::Span x, dev::Span z, int64_t r, int64_t d, dev::Span w, float eps,
                        ops::NormGate g, dev::Span y) override {
        k("rms_norm_gated"), s_->rms_norm_gated(x, z, r, d, w, eps, g, y);
    }
    void split_query_gate(dev::Span qg, int64_t T, int nh, int hd, dev::Span q, dev::Span g) override {
        k("split_query_gate"), s_->split_query_gate(qg, T, nh, hd, q, g);
    }
    void rope(dev::Span x, int64_t T, int h, int hd, int64_t ld, int rd, dev::Span c, dev::Span s) override {
        k("rope"), s_->rope(x, T, h, hd, ld, rd, c, s);
    }
    void copy(dev::Span src, dev::Span dst) override { k("copy"), s_->copy(src, dst); }
    void attention(const dev::Attention& a) override { k("attention"), s_->attention(a); }
    void memory_attention(dev::Span q, int64_t lq, int h, int64_t w, dev::Span wk, dev::Span wv, dev::Span bv,
                          dev::Span m, int64_t T, dev::Span o) override {
        k("memory_attention"), s_->memory_attention(q, lq, h, w, wk, wv, bv, m, T, o);
    }

private:
    void k(const char* name) { ++c_.kernels[name]; }
    std::unique_ptr<dev::Stream> s_;
    Counts& c_;
};

class CountingDevice final : public dev::Device {
public:
    std::string name() const override { return "counting"; }
    bool is_cpu() const override { return false; }
    std::string kind() const override { return "counting"; }
    dev::Tensor vector(std::vector<float> v) override { return ++c.vectors, dev::cpu().vector(std::move(v)); }
    dev::Tensor buffer(int64_t n, dev::Elem e) override { return ++c.buffers, dev::cpu().buffer(n, e); }
    std::unique_ptr<dev::Matrix> matrix(const dev::MatrixSource& s) override {
        return ++c.matrices, dev::cpu().matrix(s);
    }
    dev::Tensor wrap(void* host, int64_t n, dev::Elem e) override { return dev::cpu().wrap(host, n, e); }
    std::unique_ptr<dev::Stream> stream(const dev::StreamOptions& o) override {
        ++c.streams;
        return std::make_unique<CountingStream>(dev::cpu().stream(o), c);
    }
    Counts c;
};

struct Tiny {
    Checkpoint ckpt = Checkpoint::open(data_path("tiny-clef/model.safetensors"));
    TextConfig cfg = load_model_config(data_path("tiny-clef/config.json")).text;
};

// The tiny backbone twice: on the CPU and through a counting device.
struct TinyOnBoth : Tiny {
    CountingDevice counting;
    const Backbone cpu{cfg, ckpt};
    const Backbone seam{cfg, ckpt, ops::Residency::Streamed, counting};
};

std::vector<int32_t> ids(int64_t n, int64_t vocab) {
    std::vector<int32_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
    return v;
}

}  // namespace

TEST(DeviceSeam, BackboneRunsEveryLayerThroughTheSeam) {
    TinyOnBoth t;
    const int linear_layers = static_cast<int>(
        std::count(t.cfg.layer_types.begin(), t.cfg.layer_types.end(), LayerType::LinearAttention));
    const int attention_layers = t.cfg.num_layers - linear_layers;
    ASSERT_GT(linear_layers, 0);
    ASSERT_GT(attention_layers, 0);
    // Every projection is a device matrix: 4 MLP-and-norm-free projections per GDN layer + out, 4 per
    // attention layer, 3 MLP per layer.
    EXPECT_EQ(t.counting.c.matrices, linear_layers * 5 + attention_layers * 4 + t.cfg.num_layers * 3);

    const std::vector<int32_t> prompt = ids(37, t.cfg.vocab_size);
    for (bool reference : {false, true}) {
        BackboneOptions opt;
        opt.reference = reference;
        t.counting.c = {};
        EXPECT_EQ(t.seam.forward(prompt, opt), t.cpu.forward(prompt, opt)) << reference;
        // One chunk (the prompt is shorter than a chunk): one stream, the embeddings and the RoPE tables in,
        // the hidden states out; the fresh state made on the device (zeros), nothing of it copied.
        EXPECT_EQ(t.counting.c.streams, 1);
        EXPECT_EQ(t.counting.c.uploads, 3);
        EXPECT_EQ(t.counting.c.downloads, 1);
        EXPECT_EQ(t.counting.c.fetches, 0);
        EXPECT_EQ(t.counting.c.buffers, 2 * t.cfg.num_layers);  // conv + delta, or K + V, per layer
        EXPECT_EQ(t.counting.c.kernels["zero"], 2 * linear_layers);
        EXPECT_EQ(t.counting.c.kernels["delta_rule"], linear_layers);
        EXPECT_EQ(t.counting.c.kernels["attention"], attention_layers);
        EXPECT_EQ(t.counting.c.kernels["linear"],
                  linear_layers * 5 + attention_layers * 4 + t.cfg.num_layers * 3);
        // input norm, post norm per layer, q/k norms per attention layer, the final norm
        EXPECT_EQ(t.counting.c.kernels["rms_norm"], 2 * t.cfg.num_layers + 2 * attention_layers + 1);
    }
}

TEST(DeviceSeam, ChunksCarryTheirStateThroughTheDevice) {
    TinyOnBoth t;
    BackboneOptions opt;
    opt.prefill_chunk = 16;
    for (bool kv_bf16 : {false, true}) {
        opt.kv_bf16 = kv_bf16;
        const std::vector<int32_t> prompt = ids(53, t.cfg.vocab_size);
        t.counting.c = {};
        EXPECT_EQ(t.seam.forward(prompt, opt), t.cpu.forward(prompt, opt)) << kv_bf16;
        EXPECT_EQ(t.counting.c.streams, 4);  // ceil(53 / 16) chunks, one stream each
        EXPECT_EQ(t.counting.c.downloads, 4);
        // The state stays on the device from chunk to chunk: made once (the K/V cache for the whole
        // prompt), never copied in or back; each chunk brings its embeddings and RoPE tables.
        EXPECT_EQ(t.counting.c.buffers, 2 * t.cfg.num_layers);
        EXPECT_EQ(t.counting.c.uploads, 4 * 3);
        EXPECT_EQ(t.counting.c.fetches, 0);
    }
}

// A state on a device comes back to the host only when asked (Backbone::to_host: the state cache's
// snapshots): the conv and delta-rule state whole and the K/V rows from the asked row on, equal to the CPU
// backbone's state after the same prompt.
TEST(DeviceSeam, StateComesBackToTheHostWhenAsked) {
    TinyOnBoth t;
    BackboneOptions opt;
    opt.prefill_chunk = 16;
    const std::vector<int32_t> prompt = ids(40, t.cfg.vocab_size);
    Backbone::PrefillInput in;
    in.T = static_cast<int64_t>(prompt.size());
    in.ids = prompt.data();
    BackboneState want = t.cpu.start(), got = t.seam.start();
    const auto ignore = [](const float*, int64_t, int64_t) {};
    t.cpu.prefill(want, in, opt, ignore);
    t.seam.prefill(got, in, opt, ignore);
    const int64_t kv_from = 24, kvdim = int64_t{t.cfg.num_kv_heads} * t.cfg.head_dim;
    t.counting.c = {};
    t.seam.to_host(got, kv_from);
    int fetched = 0;
    for (int l = 0; l < t.cfg.num_layers; ++l) {
        const BackboneState::Layer &g = got.layers[l], &w = want.layers[l];
        if (t.cfg.layer_types[l] == LayerType::LinearAttention) {
            EXPECT_EQ(g.conv, w.conv) << l;
            EXPECT_EQ(g.delta, w.delta) << l;
            fetched += 2;
            continue;
        }
        ASSERT_EQ(g.k.size(), w.k.size()) << l;
        EXPECT_TRUE(std::equal(g.k.begin() + kv_from * kvdim, g.k.end(), w.k.begin() + kv_from * kvdim)) << l;
        EXPECT_TRUE(std::equal(g.v.begin() + kv_from * kvdim, g.v.end(), w.v.begin() + kv_from * kvdim)) << l;
        fetched += 2;
    }
    EXPECT_EQ(t.counting.c.fetches, fetched);
    EXPECT_EQ(t.counting.c.streams, 1);
}

TEST(DeviceSeam, VisionTowerRunsEveryBlockThroughTheSeam) {
    const Checkpoint ckpt = Checkpoint::open(data_path("tiny-clef/model.safetensors"));
    const VisionConfig vc = *load_model_config(data_path("tiny-clef/config.json")).vision;
    CountingDevice counting;
    const int depth = vc.depth;
    // Two frames of 4 x 4 patches (2 x 2 merge blocks each), any pixel values.
    const int gt = 2, gh = 4, gw = 4;
    for (bool reference : {false, true}) {
        counting.c = {};
        const VisionTower cpu_tower(vc, ckpt, kVisionPrefix, reference);
        const VisionTower seam_tower(vc, ckpt, kVisionPrefix, reference, counting);
        EXPECT_EQ(counting.c.matrices, 1 + 4 * depth + 2);   // patch embedding, 4 per block, the merger's 2
        EXPECT_EQ(counting.c.vectors, 2 * (2 * depth + 1));  // LayerNorm weights and biases
        std::vector<float> pixels(static_cast<size_t>(gt * gh * gw * seam_tower.patch_dim()));
        for (size_t i = 0; i < pixels.size(); ++i)
            pixels[i] = static_cast<float>((i * 37 % 101) / 50.0 - 1.0);
        counting.c = {};
        EXPECT_EQ(seam_tower.forward(pixels.data(), gt, gh, gw), cpu_tower.forward(pixels.data(), gt, gh, gw))
            << reference;
        // One stream: the pixels, the position grid and the two rotary tables in, the merged rows out.
        EXPECT_EQ(counting.c.streams, 1);
        EXPECT_EQ(counting.c.uploads, 4);
        EXPECT_EQ(counting.c.downloads, 1);
        EXPECT_EQ(counting.c.kernels["linear"], 1 + 4 * depth + 2);
        EXPECT_EQ(counting.c.kernels["attention"], depth * gt);  // per block and frame
        EXPECT_EQ(counting.c.kernels["layer_norm"], 2 * depth + 1);
        EXPECT_EQ(counting.c.kernels["gelu"], depth + 1);
        EXPECT_EQ(counting.c.kernels["rope"], depth);
    }
}

TEST(DeviceSeam, JointHeadRunsBothStagesThroughTheSeam) {
    const Checkpoint model = Checkpoint::open(data_path("tiny-clef/model.safetensors"));
    const SafetensorsFile head_file = SafetensorsFile::open(data_path("tiny-clef/joint_head.safetensors"));
    const HeadConfig cfg = load_head_config(data_path("tiny-clef/joint_head_config.json"));
    const TensorView& lm_head = model.get("lm_head.weight");
    const int R = cfg.routing_layers, L = cfg.layers;
    // 40 positions of any hidden rows; a yes/no question and a three-way choice.
    const int64_t T = 40, H = cfg.hidden_size;
    std::vector<float> hidden(static_cast<size_t>(T * H));
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<float>((i * 53 % 97) / 48.0 - 1.0);
    const std::vector<int32_t> prompt = ids(T, lm_head.shape[0]);
    std::vector<HeadQuestion> questions(2);
    questions[0] = {0, 2, 6, {{8, 10}, {10, 12}}};
    questions[1] = {1, 14, 20, {{22, 25}, {25, 27}, {27, 33}}};
    const int Q = 2, N = 5;
    for (bool reference : {false, true}) {
        CountingDevice counting;
        const JointHead cpu_head(cfg, head_file, lm_head, reference);
        const JointHead seam_head(cfg, head_file, lm_head, reference, counting);
        // 6 input projections, per routing layer q/k/v/out and the feed-forward pair, per field layer two
        // attentions and linear1/2, the scorer pair.
        EXPECT_EQ(counting.c.matrices, 6 + 6 * R + 10 * L + 2);
        counting.c = {};
        EXPECT_EQ(seam_head.logits(hidden.data(), T, prompt, questions),
                  cpu_head.logits(hidden.data(), T, prompt, questions))
            << reference;
        // Stage 1 (one block of rows) and stage 2: one stream each; the memory rows stay on the device (one
        // buffer). The scorer's input rows of every question go in at once; the fields and the normalised
        // options come out together (two copies, one wait), then the scores.
        EXPECT_EQ(counting.c.streams, 2);
        EXPECT_EQ(counting.c.buffers, 1);
        EXPECT_EQ(counting.c.uploads, 1);
        EXPECT_EQ(counting.c.fetches, 2);
        EXPECT_EQ(counting.c.downloads, 1);
        EXPECT_EQ(counting.c.kernels["memory_attention"], reference ? 0 : R + L);
        // LN_hidden; per routing layer query, memory and feed-forward norms; the summary norm; three per
        // field layer; the field norm; the option norm per question.
        EXPECT_EQ(counting.c.kernels["layer_norm"], 1 + 3 * R + 1 + 3 * L + 1 + Q);
        EXPECT_EQ(counting.c.kernels["attention"], (reference ? R + 2 * L : L) + Q);
        EXPECT_GT(counting.c.kernels["linear"], 2 * N);
    }
}
