// The memory plan (model/memory_plan.h) on tiny-clef, against sizes worked out by hand here from the config's
// numbers (tests/data/tiny-clef/config.json, joint_head_config.json) and from the safetensors header read
// with nlohmann::json; then `clef info --tokens`.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "decision/engine.h"
#include "model/config.h"
#include "model/memory_plan.h"
#include "test_util.h"
#include "tools/make_model.h"
#include "tools/model_info.h"

namespace {

using clef::testing::data_path;
using clef::testing::read_file;
using nlohmann::json;

// tiny-clef: hidden 64, intermediate 128, 8 layers (6 GDN, 2 attention), 4 query heads, 2 KV heads,
// head_dim 32, output gate, rotary_dim 8; GDN 2 key heads, 4 value heads, head dims 16, conv kernel 4;
// vocab 320. Head: width 32, 2 routing layers, 4 field layers, 4 heads, feedforward 64.
constexpr int64_t kN = 1000, kChunk = 512, kQ = 8, kO = 32;

clef::MemoryPlanInput tiny_input(uint64_t cache_bytes) {
    clef::MemoryPlanInput in;
    in.tokens = kN;
    in.schema_tokens = 100;
    in.questions = kQ;
    in.options = kO;
    in.option_tokens = 256;
    in.cache_bytes = cache_bytes;
    in.onednn = false;  // the own kernels' panels (32 rows per panel)
    return in;
}

clef::MemoryPlan tiny_plan(uint64_t cache_bytes) {
    return clef::compute_memory_plan(data_path("tiny-clef"), "", tiny_input(cache_bytes));
}

TEST(MemoryPlan, ConfigIsTheOneWorkedOut) {
    const clef::ModelConfig c = clef::load_model_config(data_path("tiny-clef/config.json"));
    const clef::TextConfig& t = c.text;
    EXPECT_EQ(t.hidden_size, 64);
    EXPECT_EQ(t.intermediate_size, 128);
    EXPECT_EQ(t.num_layers_of(clef::LayerType::FullAttention), 2);
    EXPECT_EQ(t.num_layers_of(clef::LayerType::LinearAttention), 6);
    EXPECT_EQ(t.num_heads, 4);
    EXPECT_EQ(t.num_kv_heads, 2);
    EXPECT_EQ(t.head_dim, 32);
    EXPECT_EQ(t.rotary_dim, 8);
    EXPECT_EQ(t.linear_num_key_heads, 2);
    EXPECT_EQ(t.linear_num_value_heads, 4);
    EXPECT_EQ(t.linear_key_head_dim, 16);
    EXPECT_EQ(t.linear_value_head_dim, 16);
    EXPECT_EQ(t.linear_conv_kernel, 4);
    const clef::HeadConfig h = clef::load_head_config(data_path("tiny-clef/joint_head_config.json"));
    EXPECT_EQ(h.width, 32);
    EXPECT_EQ(h.heads, 4);
}

TEST(MemoryPlan, DecisionPartsOnTinyClef) {
    const clef::DecisionMemory d = tiny_plan(0).decision;
    EXPECT_EQ(d.chunk, kChunk);  // BF16 weights are packed, not streamed: the 512-token chunk
    // K and V: 2 layers x 2 x N rows x (2 KV heads x 32) x 4 bytes.
    EXPECT_EQ(d.kv_cache, 2u * 2 * 1000 * 64 * 4);
    // Per GDN layer: conv taps (4-1) x conv_dim (2*32 + 64 = 128) and the delta state 4 x 16 x 16, fp32.
    EXPECT_EQ(d.recurrent, 6u * (3 * 128 + 4 * 16 * 16) * 4);
    // buf_, h, xn, mix, the head's normed_ (512 x 64 each) and cos, sin (512 x 4 each).
    EXPECT_EQ(d.chunk_buffers, (5u * 512 * 64 + 2 * 512 * 4) * 4);
    // The largest layer: attention once q/k/v are split, before the fused q|gate rows are freed: qg (512 x
    // 256), k, v (512 x 64), q, gate (512 x 128). (During attention_fast it holds less: it reads the cache in
    // place.)
    const uint64_t attention = 512u * (256 + 64 + 64 + 128 + 128) * 4;
    EXPECT_EQ(d.layer_scratch, attention);
    // Memory rows N x 32, question means 8 x 64, option context and lexical 2 x 32 x 64, the last row 64,
    // span sums (8 + 32) x 64 in double.
    const uint64_t features = (1000u * 32 + 8 * 64 + 2 * 32 * 64 + 64) * 4 + (8u + 32) * 64 * 8;
    EXPECT_EQ(d.head_features, features);
    // Evidence routing: r, x, tmp (32 options x 32), normalised memory and values (N x 32), attend_memory for
    // 32 options x 4 heads = 128 rows: q (32 x 32), q·W_k (128 x 32), scores (128 x N), context (128 x 32),
    // output (32 x 32).
    const uint64_t route =
        (3u * 32 * 32 + 2 * 1000 * 32 + 32 * 32 + 128 * 32 + 128 * 1000 + 128 * 32 + 32 * 32) * 4;
    EXPECT_EQ(d.head_scratch, route);
    EXPECT_EQ(d.gemm_scratch, 0u);  // nothing streamed, exact activations
    EXPECT_EQ(d.state_cache, 0u);
    EXPECT_EQ(d.prompt, 3u * 1000 * 4);
    // Everything is below 32 MiB, so on the heap: the peak is the prefill's largest live set, attention's.
    const uint64_t kept = (1000u * 32 + 8 * 64 + 2 * 32 * 64 + 64) * 4 + 3 * 1000 * 4;
    const uint64_t during = kept + d.kv_cache + d.recurrent + d.chunk_buffers + (8u + 32) * 64 * 8;
    EXPECT_EQ(d.peak, during + attention);
    EXPECT_EQ(d.heap_retained, 0u);
    // A bf16 K/V cache (--kv-type bf16) halves the cache and nothing else.
    clef::MemoryPlanInput in16 = tiny_input(0);
    in16.backbone.kv_bf16 = true;
    const clef::DecisionMemory d16 = clef::compute_memory_plan(data_path("tiny-clef"), "", in16).decision;
    EXPECT_EQ(d16.kv_cache, d.kv_cache / 2);
    EXPECT_EQ(d16.peak, d.peak - d.kv_cache / 2);
}

TEST(MemoryPlan, StateCacheAndItsChunk) {
    const clef::DecisionMemory d = tiny_plan(uint64_t{1} << 30).decision;
    // 900 state tokens: stops every 256 -> 4 snapshots of the 6 GDN states; per state token the K/V rows of
    // both attention layers (2 x 2 x 64), a memory row (32) and its id.
    EXPECT_EQ(d.state_cache, 4u * 6 * (3 * 128 + 4 * 16 * 16) * 4 + 900u * (2 * 2 * 64 + 32 + 1) * 4);
    EXPECT_EQ(d.chunk, 256);  // stops every 256 tokens; the 100 schema tokens fit in one
    EXPECT_EQ(tiny_plan(1000).decision.state_cache, 1000u);  // capped by the budget
}

int64_t numel(const json& e) {
    int64_t n = 1;
    for (const auto& d : e["shape"]) n *= d.get<int64_t>();
    return n;
}

// The header of a safetensors file, parsed here.
json header(const std::string& path) {
    const std::string bytes = read_file(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes.at(i));
    return json::parse(bytes.substr(8, n));
}

TEST(MemoryPlan, WeightsOnTinyClef) {
    const json h = header(data_path("tiny-clef/model.safetensors"));
    uint64_t packed = 0, vectors = 0, rows = 0, vision = 0, largest = 0;
    for (const auto& [name, e] : h.items()) {
        if (name == "__metadata__") continue;
        const int64_t n = numel(e),
                      bytes = e["data_offsets"][1].get<int64_t>() - e["data_offsets"][0].get<int64_t>();
        const bool visual = name.rfind("model.visual.", 0) == 0;
        const bool table = name.find("embed_tokens") != std::string::npos || name == "lm_head.weight";
        const bool matrix = !table && name.find("pos_embed") == std::string::npos &&
                            (e["shape"].size() == 2 || e["shape"].size() == 5);
        ASSERT_TRUE(!matrix || e["dtype"] == "BF16") << name;
        if (table) {  // the 265 embedding rows the tokenizer's ids reach (of 320; N = 1000 tokens can hold
                      // no more distinct ids), 256 lm_head rows, 64 bf16 values each
            rows += (name == "lm_head.weight" ? 256u : 265u) * 64 * 2;
        } else if (matrix) {  // bf16 panels of 32 rows
            const int64_t r = e["shape"][0].get<int64_t>(), padded = (r + 31) / 32 * 32;
            (visual ? vision : packed) += static_cast<uint64_t>(padded * (n / r) * 2);
            if (!visual) largest = std::max<uint64_t>(largest, bytes);
        } else {  // fp32 copy, and the mapped bytes read at load
            (visual ? vision : vectors) += static_cast<uint64_t>(n * 4 + bytes);
        }
    }
    // The head in fp32: hidden_norm (2 x 64); 6 projections 32 x 64; type_embedding 3 x 32; per attention
    // q, k, v panels (32 x 32) + k, v rows kept (32 x 32) + in_proj_bias 96 + out_proj 32 x 32 + bias 32;
    // per routing layer 3 norms (2 x 32), feedforward 64 x 32 + 64 and 32 x 64 + 32; option_summary_norm;
    // per field layer 2 attentions, linear1, linear2, 3 norms; field and option norms; the scorer 32 x 128 +
    // 32 and its output row padded to a 32-row panel (32 x 32) + 1; 3 scalars.
    const uint64_t attention = 6 * 32 * 32 + 96 + 32;
    const uint64_t ff = 64 * 32 + 64 + 32 * 64 + 32;
    const uint64_t head =
        4 * (2 * 64 + 6 * 32 * 64 + 3 * 32 + 2 * (3 * 64 + attention + ff) + 64 +
             4 * (2 * attention + ff + 3 * 64) + 2 * 64 + (32 * 128 + 32) + (32 * 32 + 1) + 3);
    const clef::WeightMemory w = tiny_plan(0).weights;
    EXPECT_EQ(w.packed, packed);
    EXPECT_EQ(w.mapped, 0u);
    EXPECT_FALSE(w.streamed);
    EXPECT_EQ(w.vectors, vectors);
    EXPECT_EQ(w.embedding_rows, rows);
    EXPECT_EQ(w.vision, vision);
    EXPECT_EQ(w.head, head);
    EXPECT_EQ(w.load_transient, 182120u + largest);  // the head file, mapped while it converts
    // 5 bytes per byte of tokenizer.json; the runtime's 16 MiB.
    EXPECT_EQ(w.tokenizer, 5u * read_file(data_path("tiny-clef/tokenizer.json")).size());
    EXPECT_EQ(w.runtime, 16u << 20);
}

// --precision int8 (ops/int8_gemm.h): the backbone's BF16 matrices become int8 panels of 64-row column
// blocks, k rounded up to 32, one fp32 scale per 32 values (1.125 bytes per weight); the plan counts what the
// loaded layers hold, and the chunk's activation levels in the GEMM scratch.
TEST(MemoryPlan, Int8WeightsAreWhatTheLayersHold) {
    clef::MemoryPlanInput in = tiny_input(0);
    in.backbone.precision = clef::ops::Precision::Int8;
    const clef::MemoryPlan plan = clef::compute_memory_plan(data_path("tiny-clef"), "", in);
    clef::LoadOptions o;
    o.precision = clef::ops::Precision::Int8;
    const std::unique_ptr<clef::Engine> e = clef::Engine::load(data_path("tiny-clef"), "", o);
    EXPECT_EQ(plan.weights.packed, e->backbone().packed_weight_bytes());
    EXPECT_LT(plan.weights.packed, tiny_plan(0).weights.packed) << "int8 panels are smaller than bf16 ones";
    EXPECT_GE(plan.decision.gemm_scratch, static_cast<uint64_t>(kChunk * 128));
}

struct CliRun {
    int code = -1;
    std::string out;
};

CliRun clef_cli(const std::string& args) {
    int status = 0;
    CliRun r;
    r.out = clef::testing::run_command(std::string(CLEF_BINARY) + " " + args + " 2>&1", status);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

TEST(MemoryPlanCli, JsonHasThePlan) {
    const CliRun r =
        clef_cli("info --model " + data_path("tiny-clef") + " --tokens 1000 --cache-mib 0 --json");
    ASSERT_EQ(r.code, 0) << r.out;
    const json j = json::parse(r.out);
    const json& p = j.at("memory_plan");
    EXPECT_EQ(p.at("tokens"), 1000);
    EXPECT_EQ(p.at("chunk"), 512);
    for (const char* k :
         {"mapped", "packed", "vectors", "embedding_rows", "head", "vision", "load_transient", "total"})
        EXPECT_TRUE(p.at("weights").contains(k)) << k;
    for (const char* k : {"kv_cache", "recurrent", "chunk_buffers", "layer_scratch", "gemm_scratch",
                          "head_features", "head_scratch", "state_cache", "prompt", "heap_retained", "peak"})
        EXPECT_TRUE(p.at("decision").contains(k)) << k;
    EXPECT_EQ(p.at("decision").at("kv_cache"), 2 * 2 * 1000 * 64 * 4);
    EXPECT_EQ(p.at("decision").at("state_cache"), 0);
    EXPECT_GE(p.at("peak").get<uint64_t>(),
              p.at("weights").at("total").get<uint64_t>() + p.at("decision").at("peak").get<uint64_t>());
    // Without --tokens, no plan.
    const CliRun plain = clef_cli("info --model " + data_path("tiny-clef") + " --json");
    ASSERT_EQ(plain.code, 0) << plain.out;
    EXPECT_FALSE(json::parse(plain.out).contains("memory_plan"));
}

TEST(MemoryPlanCli, TextHasThePlan) {
    const CliRun r = clef_cli("info --model " + data_path("tiny-clef") + " --tokens 1000");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("memory plan for 1,000 tokens"), std::string::npos) << r.out;
    const size_t kv = r.out.find("\n  K/V cache ");
    ASSERT_NE(kv, std::string::npos) << r.out;
    EXPECT_NE(r.out.substr(kv, r.out.find('\n', kv + 1) - kv).find(" 1.0 MiB"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("  total peak"), std::string::npos) << r.out;
}

TEST(MemoryPlanCli, BadTokensExitTwoWithOneLine) {
    for (const char* bad : {"0", "-3", "abc", "12x", "1.5"}) {
        const CliRun r = clef_cli("info --model " + data_path("tiny-clef") + " --tokens=" + bad);
        EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
        EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << bad << ": " << r.out;
        EXPECT_EQ(r.out.rfind("clef: --tokens: ", 0), 0u) << bad << ": " << r.out;
    }
    const CliRun r = clef_cli("info --model " + data_path("tiny-clef") + " --tokens -5");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

}  // namespace

// Issue 29, point 4, on paper: Clef-Flash from an IQ2_M GGUF, a 1,000-token text decision with the whole
// backbone and the joint head on a Vulkan device, plans under 4 GiB of device memory. The configs are
// `clef make-model --preset flash-shaped --configs-only` (Clef-Flash's shapes); the state is worked out here:
// 24 GDN layers x ((4 - 1) conv taps x 8192 conv channels + 32 value heads x 128 x 128) + 8 attention layers
// x 2 (K, V) x 1000 rows x (4 KV heads x 256), fp32.
TEST(MemoryPlan, ClefFlashIq2mOnA4GiBCard) {
    const std::string dir = ::testing::TempDir() + "/clef_flash_configs";
    clef::MakeModelOptions o;
    o.preset = "flash-shaped";
    o.configs_only = true;
    clef::make_model(o, dir);
    const clef::ModelConfig c = clef::load_model_config(dir + "/config.json");
    const clef::HeadConfig h = clef::load_head_config(dir + "/joint_head_config.json");
    clef::MemoryPlanInput in = tiny_input(0);
    in.device = true;
    const clef::MemoryPlan p = clef::config_memory_plan(c, &h, "iq2_m", in);
    ASSERT_TRUE(p.device);
    EXPECT_EQ(p.device->layers, 32);
    EXPECT_EQ(p.device->state, (24u * (3 * 8192 + 32 * 128 * 128) + 8u * 2 * 1000 * 1024) * 4);
    EXPECT_LT(p.device->total(), uint64_t{4} << 30);
    std::printf("Clef-Flash IQ2_M, 1,000 tokens on the device: %.0f MiB (weights %.0f MiB)\n",
                static_cast<double>(p.device->total()) / (1 << 20),
                static_cast<double>(p.device->weights()) / (1 << 20));
    // Half the layers on the device: less of it.
    in.device_layers = 16;
    const clef::MemoryPlan half = clef::config_memory_plan(c, &h, "iq2_m", in);
    EXPECT_EQ(half.device->layers, 16);
    EXPECT_LT(half.device->backbone, p.device->backbone * 6 / 10);
}
