// clef make-model: random checkpoints in the publisher layout, checked against the tiny-clef fixture (the
// reader is the oracle for the layout), plus the safetensors writer against the reference library's bytes.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "decision/engine.h"
#include "decision/request.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/backbone.h"
#include "model/config.h"
#include "tools/make_model.h"
#include "util/error.h"
#include "util/json.h"

using namespace clef;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(CLEF_TEST_DATA) + "/tiny-clef";

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

nlohmann::json read_json(const fs::path& p) {
    return nlohmann::json::parse(read_file(p));
}

// A fresh directory under the system temp dir, removed at the end of the test program.
class TempDirs {
public:
    ~TempDirs() {
        std::error_code ec;
        if (!root_.empty()) fs::remove_all(root_, ec);
    }
    fs::path make(const std::string& name) {
        if (root_.empty()) {
            root_ = fs::temp_directory_path() / ("clef_test_make_model_" + std::to_string(::getpid()));
            fs::remove_all(root_);
            fs::create_directories(root_);
        }
        const fs::path p = root_ / name;
        fs::remove_all(p);
        return p;
    }

private:
    fs::path root_;
};

TempDirs& temp() {
    static TempDirs t;
    return t;
}

// The tiny preset with the default options, written once per test program.
const fs::path& tiny_dir() {
    static const fs::path dir = [] {
        const fs::path d = temp().make("tiny");
        MakeModelOptions opt;
        opt.preset = "tiny";
        make_model(opt, d.string());
        return d;
    }();
    return dir;
}

struct Layout {
    std::string dtype;
    std::vector<int64_t> shape;
    bool operator==(const Layout& o) const { return dtype == o.dtype && shape == o.shape; }
};

std::map<std::string, Layout> layout_of(const SafetensorsFile& f) {
    std::map<std::string, Layout> m;
    for (const TensorView& t : f.tensors()) m[t.name] = {std::string(dtype_name(t.dtype)), t.shape};
    return m;
}

std::string show(const Layout& l) {
    std::string s = l.dtype + "[";
    for (size_t i = 0; i < l.shape.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(l.shape[i]);
    }
    return s + "]";
}

void expect_same_layout(const std::string& got_path, const std::string& want_path) {
    const auto got = layout_of(SafetensorsFile::open(got_path));
    const auto want = layout_of(SafetensorsFile::open(want_path));
    EXPECT_EQ(got.size(), want.size()) << got_path;
    for (const auto& [name, l] : want) {
        auto it = got.find(name);
        if (it == got.end()) {
            ADD_FAILURE() << got_path << ": missing " << name;
            continue;
        }
        EXPECT_EQ(it->second, l) << name << ": got " << show(it->second) << ", want " << show(l);
    }
    for (const auto& [name, l] : got)
        if (!want.count(name)) ADD_FAILURE() << got_path << ": extra tensor " << name << " " << show(l);
}

struct Stats {
    double mean = 0, std = 0, min = 0, max = 0;
    size_t n = 0;
};

Stats stats_of(const std::vector<float>& v) {
    Stats s;
    s.n = v.size();
    s.min = s.max = v.empty() ? 0 : v[0];
    double sum = 0, sq = 0;
    for (float x : v) {
        sum += x;
        s.min = std::min<double>(s.min, x);
        s.max = std::max<double>(s.max, x);
    }
    s.mean = sum / static_cast<double>(v.size());
    for (float x : v) sq += (x - s.mean) * (x - s.mean);
    s.std = std::sqrt(sq / static_cast<double>(v.size()));
    return s;
}

std::vector<std::string> files_in(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Writer

// Rewriting the fixture's tensors (written by the Python safetensors library) gives the same bytes: data
// order (dtype, then name), header order, compact JSON and space padding all match the reference.
TEST(SafetensorsWriter, ReproducesReferenceLibraryBytes) {
    for (const char* name : {"model.safetensors", "joint_head.safetensors"}) {
        const std::string src = kFixture + "/" + name;
        const SafetensorsFile in = SafetensorsFile::open(src);
        std::vector<TensorSource> tensors;
        for (const TensorView& t : in.tensors())
            tensors.push_back(tensor_from_bytes(t.name, t.dtype, t.shape,
                                                std::vector<unsigned char>(t.data, t.data + t.nbytes)));
        const fs::path out = temp().make(std::string("rewrite_") + name);
        SafetensorsWriteOptions opt;
        opt.metadata = in.metadata();
        opt.block_bytes = 1000;  // many blocks, not a multiple of the tensor sizes
        write_safetensors(out.string(), tensors, opt);
        EXPECT_EQ(read_file(out), read_file(src)) << name;
        EXPECT_EQ(fs::file_size(out), safetensors_file_size(tensors, opt.metadata));
        EXPECT_FALSE(fs::exists(out.string() + ".partial"));
    }
}

TEST(SafetensorsWriter, HeaderIsPaddedAndAligned) {
    std::vector<TensorSource> t;
    t.push_back(tensor_from_f32("b", DType::BF16, {3}, {1, 2, 3}));
    t.push_back(tensor_from_f32("a", DType::F16, {1}, {0.5f}));
    t.push_back(tensor_from_f32("c", DType::F32, {}, {7}));
    std::vector<size_t> order;
    const std::string h = safetensors_header(t, {}, &order);
    EXPECT_EQ(h.size() % 8, 0u);
    EXPECT_EQ(order, (std::vector<size_t>{2, 0, 1}));  // F32, BF16, F16
    EXPECT_EQ(h.substr(0, h.find_last_not_of(' ') + 1),
              R"({"c":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
              R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[4,10]},)"
              R"("a":{"dtype":"F16","shape":[1],"data_offsets":[10,12]}})");

    const fs::path out = temp().make("small.safetensors");
    write_safetensors(out.string(), t);
    const SafetensorsFile f = SafetensorsFile::open(out.string());
    EXPECT_TRUE(f.metadata().empty());
    EXPECT_EQ(f.find("b")->to_f32(), (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(f.find("a")->to_f32(), (std::vector<float>{0.5f}));
    EXPECT_EQ(f.find("c")->to_f32(), (std::vector<float>{7}));
}

TEST(SafetensorsWriter, RejectsBadInput) {
    std::vector<TensorSource> dup;
    dup.push_back(tensor_from_f32("x", DType::F32, {1}, {1}));
    dup.push_back(tensor_from_f32("x", DType::F32, {1}, {2}));
    EXPECT_THROW(safetensors_header(dup, {}), Error);
    std::vector<TensorSource> meta;
    meta.push_back(tensor_from_f32("__metadata__", DType::F32, {1}, {1}));
    EXPECT_THROW(safetensors_header(meta, {}), Error);
    EXPECT_THROW(tensor_from_bytes("y", DType::BF16, {2}, std::vector<unsigned char>(3)), Error);
    // A failing source leaves no file behind.
    TensorSource bad;
    bad.name = "z";
    bad.dtype = DType::F32;
    bad.shape = {4};
    bad.fill = [](unsigned char*, uint64_t, size_t) { throw Error("boom"); };
    const fs::path out = temp().make("bad.safetensors");
    EXPECT_THROW(write_safetensors(out.string(), {bad}), Error);
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out.string() + ".partial"));
}

// ---------------------------------------------------------------------------------------------------------------
// make_model, tiny preset

TEST(MakeModel, WritesThePublisherFiles) {
    EXPECT_EQ(files_in(tiny_dir()),
              (std::vector<std::string>{"config.json", "joint_head.safetensors", "joint_head_config.json",
                                        "model.safetensors", "processor_config.json", "tokenizer.json",
                                        "tokenizer_config.json"}));
}

// (a) Every tensor name, shape and dtype equals the fixture's.
TEST(MakeModel, TinyTensorLayoutMatchesFixture) {
    expect_same_layout((tiny_dir() / "model.safetensors").string(), kFixture + "/model.safetensors");
    expect_same_layout((tiny_dir() / "joint_head.safetensors").string(),
                       kFixture + "/joint_head.safetensors");
    const SafetensorsFile f = SafetensorsFile::open((tiny_dir() / "model.safetensors").string());
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
}

// (b) config.json parses to the fixture's numbers; the JSON files equal the fixture's.
TEST(MakeModel, TinyConfigMatchesFixture) {
    const ModelConfig got = load_model_config((tiny_dir() / "config.json").string());
    const ModelConfig want = load_model_config(kFixture + "/config.json");
    const TextConfig &g = got.text, &w = want.text;
    EXPECT_EQ(got.architecture, want.architecture);
    EXPECT_EQ(got.model_type, want.model_type);
    EXPECT_EQ(g.vocab_size, w.vocab_size);
    EXPECT_EQ(g.hidden_size, w.hidden_size);
    EXPECT_EQ(g.intermediate_size, w.intermediate_size);
    EXPECT_EQ(g.num_layers, w.num_layers);
    EXPECT_EQ(g.layer_types, w.layer_types);
    EXPECT_EQ(g.num_heads, w.num_heads);
    EXPECT_EQ(g.num_kv_heads, w.num_kv_heads);
    EXPECT_EQ(g.head_dim, w.head_dim);
    EXPECT_EQ(g.attn_output_gate, w.attn_output_gate);
    EXPECT_EQ(g.rope_theta, w.rope_theta);
    EXPECT_EQ(g.partial_rotary_factor, w.partial_rotary_factor);
    EXPECT_EQ(g.rotary_dim, w.rotary_dim);
    EXPECT_EQ(g.mrope_section, w.mrope_section);
    EXPECT_EQ(g.mrope_interleaved, w.mrope_interleaved);
    EXPECT_EQ(g.linear_num_key_heads, w.linear_num_key_heads);
    EXPECT_EQ(g.linear_num_value_heads, w.linear_num_value_heads);
    EXPECT_EQ(g.linear_key_head_dim, w.linear_key_head_dim);
    EXPECT_EQ(g.linear_value_head_dim, w.linear_value_head_dim);
    EXPECT_EQ(g.linear_conv_kernel, w.linear_conv_kernel);
    EXPECT_EQ(g.rms_norm_eps, w.rms_norm_eps);
    EXPECT_EQ(g.tie_word_embeddings, w.tie_word_embeddings);
    EXPECT_EQ(g.max_position_embeddings, w.max_position_embeddings);
    EXPECT_EQ(g.mtp_num_hidden_layers, w.mtp_num_hidden_layers);
    ASSERT_TRUE(got.vision.has_value());
    EXPECT_EQ(got.vision->depth, want.vision->depth);
    EXPECT_EQ(got.vision->hidden_size, want.vision->hidden_size);
    EXPECT_EQ(got.vision->num_heads, want.vision->num_heads);
    EXPECT_EQ(got.vision->intermediate_size, want.vision->intermediate_size);
    EXPECT_EQ(got.vision->num_position_embeddings, want.vision->num_position_embeddings);
    EXPECT_EQ(got.vision->out_hidden_size, want.vision->out_hidden_size);
    EXPECT_EQ(got.image_token_id, want.image_token_id);
    EXPECT_EQ(got.video_token_id, want.video_token_id);
    EXPECT_EQ(got.vision_start_token_id, want.vision_start_token_id);
    EXPECT_EQ(got.vision_end_token_id, want.vision_end_token_id);

    const HeadConfig hg = load_head_config((tiny_dir() / "joint_head_config.json").string());
    const HeadConfig hw = load_head_config(kFixture + "/joint_head_config.json");
    EXPECT_EQ(hg.hidden_size, hw.hidden_size);
    EXPECT_EQ(hg.width, hw.width);
    EXPECT_EQ(hg.routing_layers, hw.routing_layers);
    EXPECT_EQ(hg.layers, hw.layers);
    EXPECT_EQ(hg.heads, hw.heads);
    EXPECT_EQ(hg.feedforward, hw.feedforward);

    // The whole documents agree with the fixture's, key for key.
    for (const char* f :
         {"config.json", "joint_head_config.json", "tokenizer_config.json", "processor_config.json"})
        EXPECT_EQ(read_json(tiny_dir() / f), read_json(fs::path(kFixture) / f)) << f;
    // They are even byte-identical (Python json.dump(indent=2) formatting, trailing newline).
    for (const char* f : {"config.json", "joint_head_config.json", "tokenizer_config.json",
                          "processor_config.json", "tokenizer.json"})
        EXPECT_TRUE(read_file(tiny_dir() / f) == read_file(fs::path(kFixture) / f)) << f;
}

// (c) tokenizer.json: same model, added tokens, normalizer and pre-tokenizer as the fixture's.
TEST(MakeModel, TinyTokenizerMatchesFixture) {
    const nlohmann::json got = read_json(tiny_dir() / "tokenizer.json");
    const nlohmann::json want = read_json(kFixture + "/tokenizer.json");
    for (const char* key :
         {"model", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder"})
        EXPECT_EQ(got.at(key), want.at(key)) << key;
    EXPECT_EQ(got, want);
    EXPECT_EQ(got.at("model").at("vocab").size(), 256u);
    EXPECT_EQ(got.at("model").at("vocab").at("\u0120"), 220);  // "Ġ" = space
}

// (d) Same seed, same bytes; another seed, other weights (but the same JSON files).
TEST(MakeModel, DeterministicPerSeed) {
    MakeModelOptions opt;
    opt.preset = "tiny";
    const fs::path again = temp().make("tiny_again");
    make_model(opt, again.string());
    for (const char* f : {"model.safetensors", "joint_head.safetensors", "config.json", "tokenizer.json"})
        EXPECT_TRUE(read_file(again / f) == read_file(tiny_dir() / f)) << f;

    // The thread count does not change the values.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const fs::path serial = temp().make("tiny_serial");
    make_model(opt, serial.string());
    omp_set_num_threads(threads);
    EXPECT_TRUE(read_file(serial / "model.safetensors") == read_file(tiny_dir() / "model.safetensors"));

    opt.seed = 2;
    const fs::path other = temp().make("tiny_seed2");
    make_model(opt, other.string());
    EXPECT_TRUE(read_file(other / "config.json") == read_file(tiny_dir() / "config.json"));
    const SafetensorsFile a = SafetensorsFile::open((tiny_dir() / "model.safetensors").string());
    const SafetensorsFile b = SafetensorsFile::open((other / "model.safetensors").string());
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (size_t i = 0; i < a.tensors().size(); ++i) {
        const TensorView &x = a.tensors()[i], &y = b.tensors()[i];
        ASSERT_EQ(x.nbytes, y.nbytes);
        EXPECT_NE(std::memcmp(x.data, y.data, x.nbytes), 0) << x.name;
    }
    const SafetensorsFile ha = SafetensorsFile::open((tiny_dir() / "joint_head.safetensors").string());
    const SafetensorsFile hb = SafetensorsFile::open((other / "joint_head.safetensors").string());
    EXPECT_NE(
        std::memcmp(ha.find("memory_projection.weight")->data, hb.find("memory_projection.weight")->data,
                    ha.find("memory_projection.weight")->nbytes),
        0);
}

// (e) --layers keeps the 3:1 pattern, also for counts that are not multiples of 4; other tensors are
// unchanged.
TEST(MakeModel, LayerCountKeepsPattern) {
    MakeModelOptions opt;
    opt.preset = "tiny";
    opt.layers = 6;
    const fs::path d = temp().make("tiny_6");
    make_model(opt, d.string());
    const ModelConfig c = load_model_config((d / "config.json").string());
    using L = LayerType;
    EXPECT_EQ(c.text.num_layers, 6);
    EXPECT_EQ(c.text.layer_types, (std::vector<L>{L::LinearAttention, L::LinearAttention, L::LinearAttention,
                                                  L::FullAttention, L::LinearAttention, L::LinearAttention}));
    const SafetensorsFile f = SafetensorsFile::open((d / "model.safetensors").string());
    EXPECT_NE(f.find("model.language_model.layers.5.linear_attn.in_proj_qkv.weight"), nullptr);
    EXPECT_NE(f.find("model.language_model.layers.3.self_attn.q_proj.weight"), nullptr);
    EXPECT_EQ(f.find("model.language_model.layers.6.input_layernorm.weight"), nullptr);
    EXPECT_EQ(f.tensors().size(),
              142u - 14 - 11);  // layers 6 (GDN, 14 tensors) and 7 (attention, 11) dropped
    // A tensor's values depend only on the seed and its name.
    const SafetensorsFile full = SafetensorsFile::open((tiny_dir() / "model.safetensors").string());
    const TensorView* a = f.find("model.language_model.layers.4.mlp.up_proj.weight");
    const TensorView* b = full.find("model.language_model.layers.4.mlp.up_proj.weight");
    ASSERT_TRUE(a && b);
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0);

    opt.layers = 0;
    EXPECT_THROW(make_model(opt, temp().make("tiny_0").string()), Error);
    opt.layers = -1;
    opt.preset = "huge";
    EXPECT_THROW(make_model(opt, temp().make("huge").string()), Error);
}

TEST(MakeModel, NoVision) {
    MakeModelOptions opt;
    opt.preset = "tiny";
    opt.vision = false;
    const fs::path d = temp().make("tiny_novision");
    make_model(opt, d.string());
    EXPECT_FALSE(load_model_config((d / "config.json").string()).vision.has_value());
    const SafetensorsFile f = SafetensorsFile::open((d / "model.safetensors").string());
    EXPECT_EQ(f.tensors().size(), 109u);
    for (const TensorView& t : f.tensors()) EXPECT_EQ(t.name.rfind("model.visual.", 0), std::string::npos);
}

// (f) Sharded output: the index covers every tensor, Checkpoint::open reads it, and the values are those of
// the single-file output.
TEST(MakeModel, ShardedOutput) {
    MakeModelOptions opt;
    opt.preset = "tiny";
    opt.shard_bytes = 200000;
    const fs::path d = temp().make("tiny_sharded");
    fs::create_directories(d);
    { std::ofstream(d / "model.safetensors") << "stale"; }  // removed: it would contradict the index
    uint64_t last_done = 0, last_total = 0;
    make_model(opt, d.string(), [&](uint64_t done, uint64_t total) {
        EXPECT_GE(done, last_done);
        last_done = done;
        last_total = total;
    });
    EXPECT_EQ(last_done, last_total);
    EXPECT_EQ(last_total, make_model_weight_bytes(opt));
    EXPECT_FALSE(fs::exists(d / "model.safetensors"));

    const nlohmann::json index = read_json(d / "model.safetensors.index.json");
    const auto& wm = index.at("weight_map");
    const SafetensorsFile single = SafetensorsFile::open((tiny_dir() / "model.safetensors").string());
    EXPECT_EQ(wm.size(), single.tensors().size());
    std::set<std::string> shards;
    for (auto it = wm.begin(); it != wm.end(); ++it) shards.insert(it.value().get<std::string>());
    ASSERT_GT(shards.size(), 2u);
    const std::string n = std::to_string(shards.size());
    EXPECT_TRUE(shards.count("model-00001-of-0000" + n + ".safetensors"));
    EXPECT_TRUE(shards.count("model-0000" + n + "-of-0000" + n + ".safetensors"));
    uint64_t total = 0;
    for (const TensorView& t : single.tensors()) total += t.nbytes;
    EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
    for (const std::string& s : shards)
        EXPECT_LE(SafetensorsFile::open((d / s).string()).file_size(), 200000u + 16384u);

    const Checkpoint ck = Checkpoint::open(d.string());
    EXPECT_EQ(ck.all().size(), single.tensors().size());
    for (const TensorView& t : single.tensors()) {
        const TensorView* s = ck.find(t.name);
        ASSERT_NE(s, nullptr) << t.name;
        EXPECT_EQ(s->shape, t.shape);
        EXPECT_EQ(s->dtype, t.dtype);
        EXPECT_EQ(std::memcmp(s->data, t.data, t.nbytes), 0) << t.name;
        EXPECT_EQ(wm.at(t.name).get<std::string>(), fs::path(s->file).filename().string());
    }
}

// (g) Value scales.
TEST(MakeModel, ValueScales) {
    const Checkpoint ck = Checkpoint::open((tiny_dir() / "model.safetensors").string());
    const std::string l0 = "model.language_model.layers.0.";
    auto st = [&](const std::string& name) { return stats_of(ck.get(name).to_f32()); };

    for (const char* w : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "linear_attn.in_proj_z.weight"}) {
        const Stats s = st(l0 + w);
        EXPECT_NEAR(s.std, 1.0 / 8.0, 0.1 / 8.0) << w;  // fan_in 64
        EXPECT_NEAR(s.mean, 0.0, 0.01) << w;
    }
    EXPECT_NEAR(st(l0 + "mlp.down_proj.weight").std, 1.0 / std::sqrt(128.0), 0.1 / std::sqrt(128.0));
    EXPECT_NEAR(st("model.language_model.layers.3.self_attn.o_proj.weight").std, 1.0 / std::sqrt(128.0),
                0.1 / std::sqrt(128.0));
    // in_proj_qkv: q and k rows at fan_in^-0.5, v rows 2.5x.
    {
        const std::vector<float> v = ck.get(l0 + "linear_attn.in_proj_qkv.weight").to_f32();
        const Stats qk = stats_of(std::vector<float>(v.begin(), v.begin() + 64 * 64));
        const Stats vv = stats_of(std::vector<float>(v.begin() + 64 * 64, v.end()));
        EXPECT_NEAR(qk.std, 0.125, 0.0125);
        EXPECT_NEAR(vv.std, 0.3125, 0.03125);
    }
    const Stats emb = st("model.language_model.embed_tokens.weight");
    EXPECT_NEAR(emb.std, 1.0, 0.05);
    EXPECT_NEAR(emb.mean, 0.0, 0.03);
    EXPECT_LT(emb.max, 6.0);
    EXPECT_GT(emb.min, -6.0);
    EXPECT_NEAR(st("lm_head.weight").std, 1.0, 0.05);

    // Norms: zero-centred ones near 0, the gated GDN norm near 1 (aggregated over layers for a usable
    // sample).
    std::vector<float> zero_centred, gated;
    for (int i = 0; i < 8; ++i) {
        const std::string l = "model.language_model.layers." + std::to_string(i) + ".";
        for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight"}) {
            auto v = ck.get(l + n).to_f32();
            zero_centred.insert(zero_centred.end(), v.begin(), v.end());
        }
        if ((i + 1) % 4 != 0) {
            auto v = ck.get(l + "linear_attn.norm.weight").to_f32();
            gated.insert(gated.end(), v.begin(), v.end());
        }
    }
    const Stats zc = stats_of(zero_centred), gn = stats_of(gated);
    EXPECT_NEAR(zc.mean, 0.0, 0.02);
    EXPECT_NEAR(zc.std, 0.1, 0.015);
    EXPECT_NEAR(gn.mean, 1.0, 0.05);
    EXPECT_NEAR(gn.std, 0.1, 0.03);

    // A_log = log(U(1, 16)) in F32, dt_bias ~ U(-4, -1).
    const TensorView& alog = ck.get(l0 + "linear_attn.A_log");
    EXPECT_EQ(alog.dtype, DType::F32);
    for (int i = 0; i < 8; ++i) {
        if ((i + 1) % 4 == 0) continue;
        const std::string l = "model.language_model.layers." + std::to_string(i) + ".linear_attn.";
        for (float x : ck.get(l + "A_log").to_f32()) {
            EXPECT_GE(x, 0.0f);
            EXPECT_LE(x, std::log(16.0f));
        }
        for (float x : ck.get(l + "dt_bias").to_f32()) {
            EXPECT_GE(x, -4.0f);
            EXPECT_LE(x, -1.0f);
        }
    }

    const SafetensorsFile head = SafetensorsFile::open((tiny_dir() / "joint_head.safetensors").string());
    EXPECT_EQ(head.find("prior_logit_scale")->to_f32(), (std::vector<float>{0.5f}));
    EXPECT_EQ(head.find("joint_logit_scale")->to_f32(), (std::vector<float>{2.0f}));
    EXPECT_EQ(head.find("residual_gate")->to_f32(), (std::vector<float>{0.0f}));
    EXPECT_NEAR(stats_of(head.find("residual_scorer.0.weight")->to_f32()).std, 1.0 / std::sqrt(128.0),
                0.1 / std::sqrt(128.0));
    EXPECT_NEAR(stats_of(head.find("memory_projection.weight")->to_f32()).std, 0.125, 0.0125);
    std::vector<float> ln_w, ln_b;
    for (const TensorView& t : head.tensors()) {
        if (t.name.find("norm") == std::string::npos) continue;
        auto v = t.to_f32();
        auto& dst = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0 ? ln_w : ln_b;
        dst.insert(dst.end(), v.begin(), v.end());
    }
    EXPECT_NEAR(stats_of(ln_w).mean, 1.0, 0.02);
    EXPECT_NEAR(stats_of(ln_w).std, 0.1, 0.015);
    EXPECT_NEAR(stats_of(ln_b).mean, 0.0, 0.02);
    EXPECT_NEAR(stats_of(ln_b).std, 0.1, 0.015);
}

// The normals look normal: moments of 65536 values of a flash-sized row block would be too slow here, so use
// the tiny embedding and lm_head (40960 values).
TEST(MakeModel, NormalMoments) {
    const Checkpoint ck = Checkpoint::open((tiny_dir() / "model.safetensors").string());
    std::vector<float> v = ck.get("model.language_model.embed_tokens.weight").to_f32();
    const std::vector<float> w = ck.get("lm_head.weight").to_f32();
    v.insert(v.end(), w.begin(), w.end());
    double m2 = 0, m3 = 0, m4 = 0;
    for (float x : v) {
        m2 += x * x;
        m3 += x * x * x;
        m4 += static_cast<double>(x) * x * x * x;
    }
    const double n = static_cast<double>(v.size());
    m2 /= n, m3 /= n, m4 /= n;
    EXPECT_NEAR(m2, 1.0, 0.03);
    EXPECT_NEAR(m3, 0.0, 0.05);
    EXPECT_NEAR(m4 / (m2 * m2), 3.0, 0.1);
    size_t within1 = 0;
    for (float x : v) within1 += std::fabs(x) < 1.0f;
    EXPECT_NEAR(static_cast<double>(within1) / n, 0.6827, 0.01);
}

TEST(MakeModel, FlashShapedSizes) {
    MakeModelOptions opt;
    opt.preset = "flash-shaped";
    opt.layers = 4;
    opt.vision = false;
    // Text: embed + lm_head (2 x 248320 x 4096), 3 GDN layers, 1 attention layer, final norm; bf16 + F32
    // A_log.
    const uint64_t gdn = (8192ull * 4096 + 4096ull * 4096 + 2 * 32ull * 4096 + 8192ull * 4 + 32 + 128 +
                          4096ull * 4096 + 3 * 12288ull * 4096 + 2 * 4096) *
                             2 +
                         32 * 4;
    const uint64_t attn =
        (8192ull * 4096 + 2 * 1024ull * 4096 + 4096ull * 4096 + 2 * 256 + 3 * 12288ull * 4096 + 2 * 4096) * 2;
    const uint64_t text = 2 * 248320ull * 4096 * 2 + 3 * gdn + attn + 4096 * 2;
    const uint64_t head_bytes =
        121762820ull * 2;  // Clef-Flash's joint head: 121,762,820 bf16 params (docs/ARCHITECTURE.md)
    const uint64_t total = make_model_weight_bytes(opt);
    EXPECT_GT(total, text + head_bytes);
    EXPECT_LT(total, text + head_bytes + 2 * 100000);  // plus two headers
    opt.vision = true;
    EXPECT_NEAR(static_cast<double>(make_model_weight_bytes(opt) - total), 456010480.0 * 2, 200000.0);
}

// The scales keep the residual stream O(1) through many layers: 32 layers of the tiny widths, 96 tokens.
TEST(MakeModel, ActivationsStayOrderOneThroughManyLayers) {
    MakeModelOptions opt;
    opt.preset = "tiny";
    opt.layers = 32;
    opt.vision = false;
    const fs::path d = temp().make("tiny_32");
    make_model(opt, d.string());
    const ModelConfig cfg = load_model_config((d / "config.json").string());
    const Checkpoint ck = Checkpoint::open(d.string());
    const Backbone bb(cfg.text, ck);
    const int64_t T = 96;
    std::vector<int32_t> ids(T);
    for (int64_t i = 0; i < T; ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % 265);
    BackboneTrace trace;
    const std::vector<float> h = bb.forward_embeddings(bb.embed(ids), T, nullptr, {}, &trace);
    ASSERT_EQ(trace.layers.size(), 32u);
    auto rms = [](const std::vector<float>& v) {
        double s = 0;
        for (float x : v) s += static_cast<double>(x) * x;
        return std::sqrt(s / static_cast<double>(v.size()));
    };
    for (size_t l = 0; l < trace.layers.size(); ++l) {
        const double out = rms(trace.layers[l].layer_out), mix = rms(trace.layers[l].mixer_out);
        EXPECT_TRUE(std::isfinite(out)) << "layer " << l;
        EXPECT_GT(out, 0.5) << "layer " << l;
        EXPECT_LT(out, 12.0) << "layer " << l;  // ~sqrt(1 + layers * O(1)): grows slowly, never explodes
        EXPECT_GT(mix, 0.02) << "layer " << l;  // the mixers contribute (nothing vanishes)
        EXPECT_LT(mix, 5.0) << "layer " << l;
        if (l == 0 || l == 3 || l == 31)
            std::printf("layer %2zu: residual rms %.3f, mixer rms %.3f\n", l, out, mix);
    }
    const double last = rms(h);
    EXPECT_GT(last, 0.5);
    EXPECT_LT(last, 2.0);
}

// ---------------------------------------------------------------------------------------------------------------
// The engine loads the output and answers.

TEST(MakeModel, EngineAnswersOnTinyOutput) {
    std::unique_ptr<Engine> engine = Engine::load(tiny_dir().string());
    const JsonValue body = parse_json_or_throw(
        R"({"model":"clef-flash","state":"The app crashes when I open settings.","questions":{)"
        R"("bug":{"type":"noul","instructions":"Is this a bug?"},)"
        R"("team":{"type":"choice","instructions":"Which team?","criteria":{"billing":"Refunds.","eng":null,"sales":null}},)"
        R"("urgency":{"type":"score","instructions":"How urgent?","criteria":["low","mid","high"]}}})",
        "request");
    DecisionRequest req;
    std::vector<RequestError> errors;
    ASSERT_TRUE(parse_request(body, req, errors)) << describe_errors(errors);
    const Decision d = engine->decide(req);
    ASSERT_EQ(d.probabilities.size(), 3u);
    const size_t sizes[] = {2, 3, 3};
    for (size_t q = 0; q < 3; ++q) {
        ASSERT_EQ(d.probabilities[q].size(), sizes[q]);
        double sum = 0;
        for (float p : d.probabilities[q]) {
            EXPECT_TRUE(std::isfinite(p));
            EXPECT_GE(p, 0.0f);
            sum += p;
        }
        EXPECT_NEAR(sum, 1.0, 1e-5);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// CLI

TEST(MakeModel, Cli) {
    if (!fs::exists(CLEF_BINARY)) GTEST_SKIP() << "clef binary not built";
    const fs::path d = temp().make("cli");
    const std::string base = std::string(CLEF_BINARY) +
                             " make-model --preset tiny --layers 4 --seed 7 --out " + d.string() + " 2>" +
                             (d.parent_path() / "cli_err.txt").string();
    ASSERT_EQ(std::system(base.c_str()), 0);
    EXPECT_EQ(load_model_config((d / "config.json").string()).text.num_layers, 4);
    // Quiet when stderr is not a terminal.
    EXPECT_EQ(read_file(d.parent_path() / "cli_err.txt"), "");
    // A non-empty directory is refused without --force.
    const int rc = std::system(base.c_str());
    ASSERT_TRUE(WIFEXITED(rc));
    EXPECT_EQ(WEXITSTATUS(rc), 2);
    EXPECT_NE(read_file(d.parent_path() / "cli_err.txt").find("not empty"), std::string::npos);
    const std::string forced =
        std::string(CLEF_BINARY) +
        " make-model --preset tiny --seed 7 --no-vision --shard-size 300kb --force --out " + d.string() +
        " 2>/dev/null";
    ASSERT_EQ(std::system(forced.c_str()), 0);
    EXPECT_TRUE(fs::exists(d / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(d / "model.safetensors"));
    EXPECT_EQ(Checkpoint::open(d.string()).all().size(), 109u);
    const std::string bad = std::string(CLEF_BINARY) + " make-model --preset big --out " +
                            (d.parent_path() / "cli_bad").string() + " 2>/dev/null";
    EXPECT_NE(std::system(bad.c_str()), 0);
}
