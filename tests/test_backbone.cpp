// The fp32 reference backbone against the float64 goldens of tests/data/tiny-clef: backbone_probe.json layer
// by layer (with GDN internals of layer 0 and attention internals of layer 3), then last_hidden_state of
// every answered case in cases.json, with the token-serial and the chunked delta rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "io/safetensors.h"
#include "model/backbone.h"
#include "model/config.h"
#include "test_util.h"
#include "util/error.h"

namespace clef {
namespace {

using nlohmann::json;

const std::string kDir = std::string(CLEF_TEST_DATA) + "/tiny-clef";

json read_json(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    return json::parse(f);
}

void flatten(const json& j, std::vector<double>& out) {
    if (j.is_array())
        for (const auto& e : j) flatten(e, out);
    else
        out.push_back(j.get<double>());
}

std::vector<double> flat(const json& j) {
    std::vector<double> out;
    flatten(j, out);
    return out;
}

struct Err {
    double max = 0, mean = 0;
};

Err compare(const std::vector<float>& got, const std::vector<double>& want) {
    EXPECT_EQ(got.size(), want.size());
    Err e;
    const size_t n = std::min(got.size(), want.size());
    for (size_t i = 0; i < n; ++i) {
        const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
        e.max = std::max(e.max, d);
        e.mean += d;
    }
    if (n) e.mean /= static_cast<double>(n);
    return e;
}

// Loaded once per test binary: the checkpoint, the backbone and the goldens.
struct Fixture {
    Checkpoint ckpt;
    TextConfig cfg;
    std::unique_ptr<Backbone> backbone;
    json probe;
    json cases;

    Fixture() : ckpt(Checkpoint::open(kDir + "/model.safetensors")) {
        cfg = load_model_config(kDir + "/config.json").text;
        backbone = std::make_unique<Backbone>(cfg, ckpt);
        probe = read_json(kDir + "/backbone_probe.json");
        cases = read_json(kDir + "/cases.json");
    }
};

Fixture& fixture() {
    static Fixture f;
    return f;
}

std::vector<int32_t> ids_of(const json& j) {
    std::vector<int32_t> ids;
    for (const auto& v : j) ids.push_back(v.get<int32_t>());
    return ids;
}

TEST(Backbone, ConfigMatchesTheTinyReadme) {
    const TextConfig& c = fixture().backbone->config();
    EXPECT_EQ(fixture().backbone->prefix(), "model.language_model.");
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.num_layers, 8);
    EXPECT_EQ(c.rotary_dim, 8);
    EXPECT_EQ(c.mrope_section, (std::vector<int>{2, 1, 1}));
    EXPECT_TRUE(c.mrope_interleaved);
    EXPECT_EQ(c.layer_types[3], LayerType::FullAttention);
    EXPECT_EQ(c.layer_types[7], LayerType::FullAttention);
    EXPECT_EQ(c.linear_num_value_heads / c.linear_num_key_heads, 2);
}

class Probe : public ::testing::TestWithParam<bool> {};

TEST_P(Probe, LayerByLayer) {
    const bool chunked = GetParam();
    Fixture& f = fixture();
    const json& p = f.probe;
    const auto ids = ids_of(p["input_ids"]);
    const int64_t T = static_cast<int64_t>(ids.size());
    ASSERT_EQ(T, 72);
    constexpr double kTol = 5e-3;

    const std::vector<float> emb = f.backbone->embed(ids);
    const Err e_emb = compare(emb, flat(p["embeddings"]));
    EXPECT_EQ(e_emb.max, 0.0) << "embedding rows are bf16 values, exact in fp32";

    BackboneTrace tr;
    tr.internals_for_layers = {0, 3};
    BackboneOptions opt;
    opt.chunked_delta_rule = chunked;
    const std::vector<float> out = f.backbone->forward_embeddings(emb, T, nullptr, opt, &tr);
    ASSERT_EQ(tr.layers.size(), 8u);

    double worst = 0;
    auto check = [&](const std::string& what, const std::vector<float>& got, const json& want) {
        const Err e = compare(got, flat(want));
        worst = std::max(worst, e.max);
        std::printf("  probe %-8s %-22s max %.2e mean %.2e\n", chunked ? "chunked" : "serial", what.c_str(),
                    e.max, e.mean);
        EXPECT_LE(e.max, kTol) << what;
    };
    for (int l = 0; l < 8; ++l) {
        const json& L = p["layers"][l];
        ASSERT_EQ(L["index"].get<int>(), l);
        const auto& tl = tr.layers[l];
        std::string pre = "L";
        pre += std::to_string(l);
        pre += '.';
        check(pre + "input_norm", tl.input_norm, L["input_norm"]);
        if (l == 0) {
            ASSERT_EQ(L["type"], "linear_attention");
            const auto& g = tl.gdn;
            check(pre + "conv_silu", g.conv_silu, L["conv_silu"]);
            check(pre + "q", g.q, L["q"]);
            check(pre + "k", g.k, L["k"]);
            check(pre + "v", g.v, L["v"]);
            check(pre + "z", g.z, L["z"]);
            check(pre + "beta", g.beta, L["beta"]);
            check(pre + "g", g.g, L["g"]);
            check(pre + "delta_out", g.delta_out, L["delta_out"]);
            check(pre + "gated_norm", g.gated_norm, L["gated_norm"]);
        }
        if (l == 3) {
            ASSERT_EQ(L["type"], "full_attention");
            const auto& a = tl.attention;
            check(pre + "q_rope", a.q_rope, L["q_rope"]);
            check(pre + "k_rope", a.k_rope, L["k_rope"]);
            check(pre + "v", a.v, L["v"]);
            check(pre + "gate", a.gate, L["gate"]);
            check(pre + "attn", a.attn, L["attn"]);
        }
        check(pre + "mixer_out", tl.mixer_out, L["mixer_out"]);
        check(pre + "layer_out", tl.layer_out, L["layer_out"]);
    }
    check("last_hidden_state", out, p["last_hidden_state"]);
    std::printf("probe (%s delta rule): worst max abs error %.2e over every entry\n",
                chunked ? "chunked" : "serial", worst);
    // Layers without recorded internals leave them empty.
    EXPECT_TRUE(tr.layers[1].gdn.q.empty());
    EXPECT_TRUE(tr.layers[7].attention.q_rope.empty());
}

INSTANTIATE_TEST_SUITE_P(DeltaRule, Probe, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Chunked" : "Serial"; });

TEST(Backbone, CasesLastHiddenState) {
    Fixture& f = fixture();
    int answered = 0, index = 0;
    for (const json& c : f.cases["cases"]) {
        if (!c.contains("last_hidden_state")) continue;
        ++answered;
        if (clef::testing::kSanitized && index++ % 4 != 0) continue;  // a sample there (test_util.h)
        const std::string name = c["name"].get<std::string>();
        const auto ids = ids_of(c["input_ids"]);
        const std::vector<double> want = flat(c["last_hidden_state"]);
        ASSERT_EQ(want.size(), ids.size() * 64) << name;
        for (bool chunked : {false, true}) {
            BackboneOptions opt;
            opt.chunked_delta_rule = chunked;
            const auto t0 = std::chrono::steady_clock::now();
            const std::vector<float> got = f.backbone->forward(ids, opt);
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            const Err e = compare(got, want);
            std::printf("case %-32s T=%5zu %-7s max abs %.3e  mean abs %.3e  (%.0f ms)\n", name.c_str(),
                        ids.size(), chunked ? "chunked" : "serial", e.max, e.mean, ms);
            EXPECT_LE(e.max, 5e-3) << name << (chunked ? " chunked" : " serial");
            EXPECT_LE(e.mean, 2e-5) << name << (chunked ? " chunked" : " serial");
        }
    }
    EXPECT_EQ(answered, 8);
}

TEST(Backbone, ForwardEqualsEmbedThenForwardEmbeddings) {
    Fixture& f = fixture();
    const std::vector<int32_t> ids = {257, 82, 88, 0, 319, 13};
    const auto a = f.backbone->forward(ids);
    std::vector<int32_t> pos(3 * ids.size());
    for (int ax = 0; ax < 3; ++ax)
        for (size_t t = 0; t < ids.size(); ++t) pos[ax * ids.size() + t] = static_cast<int32_t>(t);
    const auto b = f.backbone->forward_embeddings(f.backbone->embed(ids), 6, pos.data());
    EXPECT_EQ(a, b);
    // Different H/W positions change the attention layers' output (MRoPE is wired in).
    for (size_t t = 0; t < ids.size(); ++t) pos[ids.size() + t] += 5;
    const auto c = f.backbone->forward_embeddings(f.backbone->embed(ids), 6, pos.data());
    EXPECT_NE(a, c);
    // An empty prompt gives an empty output.
    EXPECT_TRUE(f.backbone->forward({}).empty());
}

TEST(Backbone, RejectsBadInput) {
    Fixture& f = fixture();
    EXPECT_THROW(f.backbone->embed({1, 320}), Error);
    EXPECT_THROW(f.backbone->embed({-1}), Error);
    EXPECT_THROW(f.backbone->forward({5, 400}), Error);
    EXPECT_THROW(f.backbone->forward_embeddings(std::vector<float>(63), 1, nullptr), Error);
}

TEST(Backbone, ShapeMismatchNamesTheTensor) {
    Fixture& f = fixture();
    TextConfig c = f.cfg;
    c.intermediate_size = 96;
    try {
        Backbone b(c, f.ckpt);
        FAIL() << "expected clef::Error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("model.language_model.layers.0.mlp.gate_proj.weight"),
                  std::string::npos)
            << e.what();
    }
    c = f.cfg;
    c.linear_value_head_dim = 8;
    c.linear_key_head_dim = 8;
    try {
        Backbone b(c, f.ckpt);
        FAIL() << "expected clef::Error";
    } catch (const Error& e) {
        // The first tensor of model/tensors.h's table whose shape depends on the head dims.
        EXPECT_NE(std::string(e.what()).find("layers.0.linear_attn.conv1d.weight"), std::string::npos)
            << e.what();
    }
    c = f.cfg;
    c.num_layers = 9;
    c.layer_types.push_back(LayerType::LinearAttention);
    try {
        Backbone b(c, f.ckpt);
        FAIL() << "expected clef::Error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("layers.8."), std::string::npos) << e.what();
    }
    c = f.cfg;
    c.mrope_section = {2, 2, 1};
    EXPECT_THROW(Backbone(c, f.ckpt), Error);
}

TEST(Backbone, DetectsThePlainModelPrefix) {
    // Rewrite the checkpoint with text tensors named "model.*" (the Qwen3_5ForCausalLM layout).
    Fixture& f = fixture();
    const std::string src = kDir + "/model.safetensors";
    std::ifstream in(src, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t hlen = 0;
    std::memcpy(&hlen, bytes.data(), 8);
    json header = json::parse(std::string(bytes.data() + 8, hlen));
    json renamed = json::object();
    for (auto it = header.begin(); it != header.end(); ++it) {
        std::string key = it.key();
        const std::string lm = "model.language_model.";
        if (key.rfind(lm, 0) == 0) key = "model." + key.substr(lm.size());
        renamed[key] = it.value();
    }
    std::string h = renamed.dump();
    h.append((8 - h.size() % 8) % 8, ' ');
    const uint64_t new_len = h.size();
    const auto path = std::filesystem::temp_directory_path() /
                      ("clef_test_backbone_prefix_" + std::to_string(::getpid()) + ".safetensors");
    {
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(&new_len), 8);
        out.write(h.data(), static_cast<std::streamsize>(h.size()));
        out.write(bytes.data() + 8 + hlen, static_cast<std::streamsize>(bytes.size() - 8 - hlen));
    }
    {
        Checkpoint ck = Checkpoint::open(path.string());
        Backbone b(f.cfg, ck);
        EXPECT_EQ(b.prefix(), "model.");
        const std::vector<int32_t> ids = {257, 82, 88, 82, 83};
        EXPECT_EQ(b.forward(ids), f.backbone->forward(ids));
    }
    std::filesystem::remove(path);
}

}  // namespace
}  // namespace clef
