// Model and head configs: tiny-clef parsed field by field, the plain text layout, older rope keys, error
// cases, and the parameter-count arithmetic on the real Clef-Flash and Clef shapes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "io/model_dir.h"
#include "model/config.h"
#include "test_util.h"
#include "tools/model_info.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using clef::LayerType;
using clef::ModelConfig;

const std::string kTiny = std::string(CLEF_TEST_DATA) + "/tiny-clef";
constexpr LayerType L = LayerType::LinearAttention;
constexpr LayerType F = LayerType::FullAttention;

json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

json tiny_config() {
    return read_json(kTiny + "/config.json");
}

ModelConfig parse(const json& j) {
    return clef::parse_model_config(j.dump(), "config.json");
}

// Expects parse_model_config to throw a clef::Error whose message starts with "config.json: <key>: " and
// contains every fragment.
void expect_config_error(const json& j, const std::string& key,
                         std::initializer_list<std::string> fragments = {}) {
    try {
        parse(j);
        FAIL() << "expected an error for " << key;
    } catch (const clef::Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind("config.json: " + key + ": ", 0), 0u) << msg;
        for (const auto& f : fragments)
            EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
    }
}

void expect_head_error(const json& j, const std::string& key,
                       std::initializer_list<std::string> fragments = {}) {
    try {
        clef::parse_head_config(j.dump(), "joint_head_config.json");
        FAIL() << "expected an error for " << key;
    } catch (const clef::Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind("joint_head_config.json: " + key + ": ", 0), 0u) << msg;
        for (const auto& f : fragments)
            EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
    }
}

void expect_tiny_text(const clef::TextConfig& t) {
    EXPECT_EQ(t.vocab_size, 320);
    EXPECT_EQ(t.hidden_size, 64);
    EXPECT_EQ(t.intermediate_size, 128);
    EXPECT_EQ(t.num_layers, 8);
    EXPECT_EQ(t.layer_types, (std::vector<LayerType>{L, L, L, F, L, L, L, F}));
    EXPECT_EQ(t.num_heads, 4);
    EXPECT_EQ(t.num_kv_heads, 2);
    EXPECT_EQ(t.head_dim, 32);
    EXPECT_TRUE(t.attn_output_gate);
    EXPECT_EQ(t.rope_theta, 1e7);
    EXPECT_EQ(t.partial_rotary_factor, 0.25);
    EXPECT_EQ(t.rotary_dim, 8);
    EXPECT_EQ(t.mrope_section, (std::vector<int>{2, 1, 1}));
    EXPECT_TRUE(t.mrope_interleaved);
    EXPECT_EQ(t.linear_num_key_heads, 2);
    EXPECT_EQ(t.linear_num_value_heads, 4);
    EXPECT_EQ(t.linear_key_head_dim, 16);
    EXPECT_EQ(t.linear_value_head_dim, 16);
    EXPECT_EQ(t.linear_conv_kernel, 4);
    EXPECT_FLOAT_EQ(t.rms_norm_eps, 1e-6f);
    EXPECT_FALSE(t.tie_word_embeddings);
    EXPECT_EQ(t.max_position_embeddings, 262144);
    EXPECT_EQ(t.mtp_num_hidden_layers, 0);
    EXPECT_EQ(t.num_layers_of(L), 6);
    EXPECT_EQ(t.num_layers_of(F), 2);
}

// The text_config of tiny-clef moved to the top level (Qwen3_5ForCausalLM layout).
json tiny_plain_config() {
    json j = tiny_config()["text_config"];
    j["architectures"] = {"Qwen3_5ForCausalLM"};
    return j;
}

TEST(Config, TinyClef) {
    const ModelConfig c = clef::load_model_config(kTiny + "/config.json");
    EXPECT_EQ(c.architecture, "Qwen3_5ForConditionalGeneration");
    EXPECT_EQ(c.model_type, "qwen3_5");
    expect_tiny_text(c.text);
    EXPECT_EQ(c.image_token_id, 261);
    EXPECT_EQ(c.video_token_id, 262);
    EXPECT_EQ(c.vision_start_token_id, 259);
    EXPECT_EQ(c.vision_end_token_id, 260);
    ASSERT_TRUE(c.vision.has_value());
    const clef::VisionConfig& v = *c.vision;
    EXPECT_EQ(v.depth, 2);
    EXPECT_EQ(v.hidden_size, 32);
    EXPECT_EQ(v.num_heads, 2);
    EXPECT_EQ(v.intermediate_size, 48);
    EXPECT_EQ(v.patch_size, 16);
    EXPECT_EQ(v.temporal_patch_size, 2);
    EXPECT_EQ(v.spatial_merge_size, 2);
    EXPECT_EQ(v.num_position_embeddings, 16);
    EXPECT_EQ(v.out_hidden_size, 64);
    EXPECT_EQ(v.in_channels, 3);
    EXPECT_EQ(v.hidden_act, "gelu_pytorch_tanh");
}

TEST(Config, TinyHead) {
    const clef::HeadConfig h = clef::load_head_config(kTiny + "/joint_head_config.json");
    EXPECT_EQ(h.hidden_size, 64);
    EXPECT_EQ(h.width, 32);
    EXPECT_EQ(h.routing_layers, 2);
    EXPECT_EQ(h.layers, 4);
    EXPECT_EQ(h.heads, 4);
    EXPECT_EQ(h.feedforward, 64);
}

TEST(Config, LayerTypeNames) {
    EXPECT_STREQ(clef::layer_type_name(L), "linear_attention");
    EXPECT_STREQ(clef::layer_type_name(F), "full_attention");
}

TEST(Config, PlainTextLayout) {
    const ModelConfig c = parse(tiny_plain_config());
    EXPECT_EQ(c.model_type, "qwen3_5_text");
    EXPECT_EQ(c.architecture, "Qwen3_5ForCausalLM");
    expect_tiny_text(c.text);
    EXPECT_FALSE(c.vision.has_value());
    EXPECT_EQ(c.image_token_id, -1);

    json j = tiny_plain_config();
    j.erase("architectures");
    EXPECT_EQ(parse(j).architecture, "Qwen3_5ForCausalLM");
}

TEST(Config, OlderRopeKeys) {
    json j = tiny_config();
    json& t = j["text_config"];
    t.erase("rope_parameters");
    t["rope_theta"] = 1e7;
    t["partial_rotary_factor"] = 0.25;
    t["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {2, 1, 1}}, {"mrope_interleaved", true}};
    expect_tiny_text(parse(j).text);

    // No mrope at all: plain 1-D rope, empty section.
    t.erase("rope_scaling");
    const ModelConfig c = parse(j);
    EXPECT_TRUE(c.text.mrope_section.empty());
    EXPECT_EQ(c.text.rotary_dim, 8);

    // rope_parameters wins over the older keys.
    json k = tiny_config();
    k["text_config"]["rope_theta"] = 5.0;
    EXPECT_EQ(parse(k).text.rope_theta, 1e7);
}

TEST(Config, LayerTypesFromFullAttentionInterval) {
    json j = tiny_config();
    j["text_config"].erase("layer_types");
    EXPECT_EQ(parse(j).text.layer_types, (std::vector<LayerType>{L, L, L, F, L, L, L, F}));
    j["text_config"]["full_attention_interval"] = 2;
    EXPECT_EQ(parse(j).text.layer_types, (std::vector<LayerType>{L, F, L, F, L, F, L, F}));
    j["text_config"].erase("full_attention_interval");  // transformers' default is 4
    EXPECT_EQ(parse(j).text.layer_types, (std::vector<LayerType>{L, L, L, F, L, L, L, F}));
    j["text_config"]["full_attention_interval"] = 0;
    expect_config_error(j, "text_config.full_attention_interval", {"must be positive"});
}

TEST(Config, TieWordEmbeddings) {
    json j = tiny_config();
    j["tie_word_embeddings"] = true;
    j["text_config"]["tie_word_embeddings"] = true;
    EXPECT_TRUE(parse(j).text.tie_word_embeddings);
    j["text_config"].erase("tie_word_embeddings");
    EXPECT_TRUE(parse(j).text.tie_word_embeddings);  // the top-level value applies
    j["text_config"]["tie_word_embeddings"] = false;
    expect_config_error(j, "text_config.tie_word_embeddings", {"disagrees"});
}

// ---- errors ----

TEST(ConfigErrors, NotJsonOrNotObject) {
    try {
        clef::parse_model_config("{\"model_type\": ", "config.json");
        FAIL();
    } catch (const clef::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("config.json: not valid JSON", 0), 0u) << e.what();
    }
    try {
        clef::parse_model_config("[1, 2]", "config.json");
        FAIL();
    } catch (const clef::Error& e) {
        EXPECT_NE(std::string(e.what()).find("config.json: expected a JSON object"), std::string::npos)
            << e.what();
    }
    try {
        clef::load_model_config(kTiny + "/does-not-exist.json");
        FAIL();
    } catch (const clef::Error& e) {
        EXPECT_NE(std::string(e.what()).find(kTiny + "/does-not-exist.json: cannot open"), std::string::npos)
            << e.what();
    }
}

TEST(ConfigErrors, UnknownModelType) {
    json j = tiny_config();
    j["model_type"] = "llama";
    expect_config_error(j, "model_type", {"unsupported model type 'llama'", "qwen3_5"});
    j["model_type"] = "qwen3_5_moe";
    expect_config_error(j, "model_type", {"'qwen3_5_moe'"});
    j.erase("model_type");
    expect_config_error(j, "model_type", {"missing"});
    json k = tiny_config();
    k["text_config"]["model_type"] = "qwen3_next";
    expect_config_error(k, "text_config.model_type", {"'qwen3_next'"});
    json v = tiny_config();
    v["vision_config"]["model_type"] = "siglip";
    expect_config_error(v, "vision_config.model_type", {"'siglip'"});
}

TEST(ConfigErrors, MissingKeys) {
    for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
                            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"}) {
        json j = tiny_config();
        j["text_config"].erase(key);
        expect_config_error(j, std::string("text_config.") + key, {"missing"});
        json p = tiny_plain_config();
        p.erase(key);
        expect_config_error(p, key, {"missing"});
    }
    json j = tiny_config();
    j.erase("text_config");
    expect_config_error(j, "text_config", {"missing"});
    json r = tiny_config();
    r["text_config"]["rope_parameters"].erase("rope_theta");
    expect_config_error(r, "text_config.rope_parameters.rope_theta", {"missing"});
    json v = tiny_config();
    v["vision_config"].erase("depth");
    expect_config_error(v, "vision_config.depth", {"missing"});
}

TEST(ConfigErrors, BadValues) {
    json j = tiny_config();
    j["text_config"]["hidden_size"] = 0;
    expect_config_error(j, "text_config.hidden_size", {"must be positive, got 0"});
    j["text_config"]["hidden_size"] = -64;
    expect_config_error(j, "text_config.hidden_size", {"must be positive"});
    j["text_config"]["hidden_size"] = "64";
    expect_config_error(j, "text_config.hidden_size", {"expected an integer", "\"64\""});
    j["text_config"]["hidden_size"] = 64.5;
    expect_config_error(j, "text_config.hidden_size", {"expected an integer"});
    j["text_config"]["hidden_size"] = 1e12;
    expect_config_error(j, "text_config.hidden_size", {"expected an integer"});
    j["text_config"]["hidden_size"] = 4294967296ull;
    expect_config_error(j, "text_config.hidden_size", {"too large"});

    json b = tiny_config();
    b["text_config"]["attn_output_gate"] = "yes";
    expect_config_error(b, "text_config.attn_output_gate", {"expected true or false"});
    json e = tiny_config();
    e["text_config"]["rms_norm_eps"] = 0;
    expect_config_error(e, "text_config.rms_norm_eps", {"must be positive"});
    json t = tiny_config();
    t["text_config"] = "nope";
    expect_config_error(t, "text_config", {"expected an object"});
    json a = tiny_config();
    a["architectures"] = json::array();
    expect_config_error(a, "architectures", {"non-empty array"});
    json id = tiny_config();
    id["image_token_id"] = 320;
    expect_config_error(id, "image_token_id", {"outside the vocabulary"});
}

TEST(ConfigErrors, BadLayerTypes) {
    json j = tiny_config();
    j["text_config"]["layer_types"].erase(7);
    expect_config_error(j, "text_config.layer_types", {"7 entries", "num_hidden_layers is 8"});
    json k = tiny_config();
    k["text_config"]["layer_types"][2] = "sliding_attention";
    expect_config_error(k, "text_config.layer_types", {"entry 2", "sliding_attention"});
    json n = tiny_config();
    n["text_config"]["layer_types"][0] = 1;
    expect_config_error(n, "text_config.layer_types", {"entry 0"});
    json s = tiny_config();
    s["text_config"]["layer_types"] = "full_attention";
    expect_config_error(s, "text_config.layer_types", {"expected an array"});
}

TEST(ConfigErrors, InconsistentHeads) {
    json j = tiny_config();
    j["text_config"]["num_attention_heads"] = 5;
    expect_config_error(j, "text_config.num_attention_heads",
                        {"5 is not a multiple of num_key_value_heads 2"});
    json k = tiny_config();
    k["text_config"]["linear_num_value_heads"] = 3;
    expect_config_error(k, "text_config.linear_num_value_heads",
                        {"3 is not a multiple of linear_num_key_heads 2"});
    json v = tiny_config();
    v["vision_config"]["num_heads"] = 3;
    expect_config_error(v, "vision_config.hidden_size", {"not a multiple of num_heads 3"});
}

TEST(ConfigErrors, BadRope) {
    json j = tiny_config();
    j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.3;  // 32 * 0.3 = 9.6
    expect_config_error(j, "text_config.rope_parameters.partial_rotary_factor", {"not a whole number"});
    j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.15625;  // 5: odd
    expect_config_error(j, "text_config.rope_parameters.partial_rotary_factor", {"rotary_dim 5", "even"});
    j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 1.5;  // 48 > head_dim
    expect_config_error(j, "text_config.rope_parameters.partial_rotary_factor", {"(0, 1]"});
    j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0;
    expect_config_error(j, "text_config.rope_parameters.partial_rotary_factor", {"(0, 1]"});

    json m = tiny_config();
    m["text_config"]["rope_parameters"]["mrope_section"] = {2, 2, 1};
    expect_config_error(m, "text_config.rope_parameters.mrope_section", {"sums to 5", "rotary_dim/2 = 4"});
    m["text_config"]["rope_parameters"]["mrope_section"] = {2, -1, 3};
    expect_config_error(m, "text_config.rope_parameters.mrope_section", {"non-negative"});
    m["text_config"]["rope_parameters"]["mrope_section"] = json::array();
    expect_config_error(m, "text_config.rope_parameters.mrope_section", {"non-empty array"});

    json o = tiny_config();
    o["text_config"].erase("rope_parameters");
    o["text_config"]["rope_theta"] = 1e7;
    o["text_config"]["rope_scaling"] = {{"mrope_section", {1, 1, 1}}};
    expect_config_error(o, "text_config.rope_scaling.mrope_section", {"sums to 3"});

    json y = tiny_config();
    y["text_config"]["rope_parameters"]["rope_type"] = "ntk";
    expect_config_error(y, "text_config.rope_parameters.rope_type", {"unsupported rope type 'ntk'"});
    json t = tiny_config();
    t["text_config"]["rope_parameters"]["rope_theta"] = -1;
    expect_config_error(t, "text_config.rope_parameters.rope_theta", {"must be positive"});
}

TEST(ConfigErrors, BadVision) {
    json j = tiny_config();
    j["vision_config"]["out_hidden_size"] = 32;
    expect_config_error(j, "vision_config.out_hidden_size", {"32 does not match the text hidden_size 64"});
    json k = tiny_config();
    k["vision_config"]["num_position_embeddings"] = 15;
    expect_config_error(k, "vision_config.num_position_embeddings", {"not a square"});
    json d = tiny_config();
    d["vision_config"]["deepstack_visual_indexes"] = {3, 7};
    expect_config_error(d, "vision_config.deepstack_visual_indexes", {"DeepStack is not supported"});
}

TEST(HeadConfigErrors, All) {
    json h = read_json(kTiny + "/joint_head_config.json");
    for (const char* key : {"hidden_size", "width", "routing_layers", "layers", "heads", "feedforward"}) {
        json j = h;
        j.erase(key);
        expect_head_error(j, key, {"missing"});
        j[key] = 0;
        expect_head_error(j, key, {"must be positive"});
    }
    json w = h;
    w["heads"] = 5;
    expect_head_error(w, "width", {"32 is not a multiple of heads 5"});
    json d = h;
    d["dropout"] = 0.1;
    EXPECT_EQ(clef::parse_head_config(d.dump(), "joint_head_config.json").width, 32);
    try {
        clef::parse_head_config("nope", "joint_head_config.json");
        FAIL();
    } catch (const clef::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("joint_head_config.json: not valid JSON", 0), 0u) << e.what();
    }
}

// ---- model directory configs ----

class ModelDirConfigTest : public ::testing::Test {
protected:
    void SetUp() override {
        fs::copy_file(kTiny + "/config.json", dir_ / "config.json");
        fs::copy_file(kTiny + "/joint_head_config.json", dir_ / "joint_head_config.json");
        // locate_model_dir only checks that these exist.
        for (const char* f : {"tokenizer.json", "model.safetensors", "joint_head.safetensors"})
            std::ofstream(dir_ / f) << "";
    }
    clef::testing::ScratchDir scratch_{"clef_test_config"};
    fs::path dir_ = scratch_.path();
};

TEST_F(ModelDirConfigTest, LoadsBothConfigs) {
    const clef::ModelDirConfig c = clef::load_model_dir_config(clef::locate_model_dir(dir_.string()));
    expect_tiny_text(c.model.text);
    ASSERT_TRUE(c.head.has_value());
    EXPECT_EQ(c.head->width, 32);
}

TEST_F(ModelDirConfigTest, BackboneOnlyHasNoHeadConfig) {
    fs::remove(dir_ / "joint_head_config.json");
    fs::remove(dir_ / "joint_head.safetensors");
    const clef::ModelDirConfig c = clef::load_model_dir_config(clef::locate_model_dir(dir_.string()));
    EXPECT_FALSE(c.head.has_value());
}

TEST_F(ModelDirConfigTest, HeadHiddenSizeMustMatchTheBackbone) {
    json h = read_json(kTiny + "/joint_head_config.json");
    h["hidden_size"] = 4096;
    std::ofstream(dir_ / "joint_head_config.json") << h.dump();
    const clef::ModelDir d = clef::locate_model_dir(dir_.string());
    try {
        clef::load_model_dir_config(d);
        FAIL();
    } catch (const clef::Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(
            msg.rfind(d.head_config_path + ": hidden_size: 4096 does not match the backbone hidden_size 64",
                      0),
            0u)
            << msg;
    }
}

// ---- parameter-count arithmetic on the real shapes ----

// config.json of Clef-Flash (Qwen3.5-9B text tower + vision tower), as documented in the architecture notes.
json clef_flash_config() {
    json layer_types = json::array();
    for (int i = 0; i < 32; ++i)
        layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
    return {
        {"architectures", {"Qwen3_5ForConditionalGeneration"}},
        {"model_type", "qwen3_5"},
        {"image_token_id", 248056},
        {"video_token_id", 248057},
        {"vision_start_token_id", 248053},
        {"vision_end_token_id", 248054},
        {"tie_word_embeddings", false},
        {"text_config",
         {{"model_type", "qwen3_5_text"},
          {"vocab_size", 248320},
          {"hidden_size", 4096},
          {"intermediate_size", 12288},
          {"num_hidden_layers", 32},
          {"layer_types", layer_types},
          {"full_attention_interval", 4},
          {"num_attention_heads", 16},
          {"num_key_value_heads", 4},
          {"head_dim", 256},
          {"attn_output_gate", true},
          {"rms_norm_eps", 1e-6},
          {"rope_parameters",
           {{"rope_type", "default"},
            {"rope_theta", 10000000},
            {"partial_rotary_factor", 0.25},
            {"mrope_section", {11, 11, 10}},
            {"mrope_interleaved", true}}},
          {"linear_num_key_heads", 16},
          {"linear_num_value_heads", 32},
          {"linear_key_head_dim", 128},
          {"linear_value_head_dim", 128},
          {"linear_conv_kernel_dim", 4},
          {"max_position_embeddings", 262144},
          {"mtp_num_hidden_layers", 0},
          {"tie_word_embeddings", false}}},
        {"vision_config",
         {{"model_type", "qwen3_5_vision"},
          {"depth", 27},
          {"hidden_size", 1152},
          {"num_heads", 16},
          {"intermediate_size", 4304},
          {"patch_size", 16},
          {"temporal_patch_size", 2},
          {"spatial_merge_size", 2},
          {"num_position_embeddings", 2304},
          {"out_hidden_size", 4096},
          {"in_channels", 3},
          {"hidden_act", "gelu_pytorch_tanh"},
          {"deepstack_visual_indexes", json::array()}}},
    };
}

TEST(ParamCounts, ClefFlashFromConfigAlone) {
    const ModelConfig c = clef::parse_model_config(clef_flash_config().dump(), "clef-flash/config.json");
    EXPECT_EQ(c.text.rotary_dim, 64);
    EXPECT_EQ(c.text.num_layers_of(L), 24);
    EXPECT_EQ(c.text.num_layers_of(F), 8);
    const clef::HeadConfig h = clef::parse_head_config(
        R"({"hidden_size": 4096, "width": 1024, "routing_layers": 2, "layers": 4, "heads": 16,)"
        R"( "feedforward": 4096})",
        "clef-flash/joint_head_config.json");
    const clef::ParamCounts p = clef::expected_param_counts(c, &h);
    EXPECT_EQ(p.backbone_layers(), 6919565824);
    EXPECT_EQ(p.final_norm, 4096);
    EXPECT_EQ(p.embed_tokens, 1017118720);
    EXPECT_EQ(p.lm_head, 1017118720);
    EXPECT_EQ(p.vision, 456010480);
    EXPECT_EQ(p.head, 121762820);
    EXPECT_EQ(p.other, 0);
    // Backbone params (all BF16): 9,409,813,744.
    EXPECT_EQ(p.backbone_layers() + p.embed_tokens + p.lm_head + p.vision, 9409813744);
    // Per-layer figures quoted in the backbone notes: ~218.4M (GDN) and ~209.7M (attention).
    EXPECT_EQ(clef::expected_layer_params(c.text, L), 218407104);
    EXPECT_EQ(clef::expected_layer_params(c.text, F), 209723904);
    EXPECT_EQ(p.linear_attention_layers, 24 * 218407104ll);
    EXPECT_EQ(p.full_attention_layers, 8 * 209723904ll);

    // Without a head, or with tied embeddings.
    EXPECT_EQ(clef::expected_param_counts(c, nullptr).head, 0);
    json tied = clef_flash_config();
    tied["tie_word_embeddings"] = true;
    tied["text_config"]["tie_word_embeddings"] = true;
    EXPECT_EQ(clef::expected_param_counts(parse(tied), nullptr).lm_head, 0);
}

TEST(ParamCounts, Clef27BFromConfigAlone) {
    json j = clef_flash_config();
    json& t = j["text_config"];
    t["hidden_size"] = 5120;
    t["intermediate_size"] = 17408;
    t["num_hidden_layers"] = 64;
    t.erase("layer_types");  // derived from full_attention_interval 4
    t["num_attention_heads"] = 24;
    t["linear_num_value_heads"] = 48;
    j["vision_config"]["out_hidden_size"] = 5120;
    const ModelConfig c = parse(j);
    EXPECT_EQ(c.text.num_layers_of(F), 16);
    const clef::HeadConfig h = clef::parse_head_config(
        R"({"hidden_size": 5120, "width": 1024, "routing_layers": 2, "layers": 4, "heads": 16,)"
        R"( "feedforward": 4096})",
        "clef/joint_head_config.json");
    const clef::ParamCounts p = clef::expected_param_counts(c, &h);
    EXPECT_EQ(p.backbone_layers(), 24353201664);
    EXPECT_EQ(p.embed_tokens, 1271398400);
    EXPECT_EQ(p.lm_head, 1271398400);
    EXPECT_EQ(p.vision, 460730096);
    EXPECT_EQ(p.head, 128056324);
    EXPECT_EQ(p.backbone_layers() + p.embed_tokens + p.lm_head + p.vision, 27356728560);
}

TEST(ParamCounts, LayerPatternAndThousands) {
    EXPECT_EQ(clef::describe_layer_pattern({L, L, L, F, L, L, L, F}), "3×linear + 1×full, repeated 2×");
    EXPECT_EQ(clef::describe_layer_pattern({L, F}), "1×linear + 1×full");
    EXPECT_EQ(clef::describe_layer_pattern({F, F, F}), "1×full, repeated 3×");
    EXPECT_EQ(clef::describe_layer_pattern({L, L, F, L}), "2×linear + 1×full + 1×linear");
    EXPECT_EQ(clef::describe_layer_pattern({}), "none");
    EXPECT_EQ(clef::with_thousands(0), "0");
    EXPECT_EQ(clef::with_thousands(999), "999");
    EXPECT_EQ(clef::with_thousands(1000), "1,000");
    EXPECT_EQ(clef::with_thousands(6919565824), "6,919,565,824");
    EXPECT_EQ(clef::with_thousands(-1234567), "-1,234,567");
}

}  // namespace
