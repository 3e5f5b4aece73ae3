// Clef 27B's differences on its tiny-shaped fixture (tests/data/tiny-clef27): the GDN gated norm's activation
// chosen by text_config.output_gate_type. The publisher-code goldens cover "swish" (test_decision runs every
// case of both fixtures); "sigmoid" is checked against an independent float64 forward written for the tests
// (tests/oracle/qwen35_f64.py, itself checked against the swish goldens to 6e-14 by ctest
// clef27_oracle_check), whose output for the first 256 ids of basic_mixed is
// tests/data/tiny-clef27/sigmoid_gate_basic_mixed_256.json.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decision/engine.h"
#include "model/config.h"
#include "test_util.h"
#include "util/error.h"

using namespace clef;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(CLEF_TEST_DATA) / "tiny-clef27";

nlohmann::json config_with_gate(const std::string& gate) {
    nlohmann::json j = nlohmann::json::parse(clef::testing::read_file((kDir / "config.json").string()));
    j["text_config"]["output_gate_type"] = gate;
    return j;
}

// A copy of the fixture whose config names another gate activation (the weights are the same files).
fs::path fixture_with_gate(const std::string& gate) {
    // Per process: ctest runs each test of this file as its own process, in parallel, and a copy written over
    // files another process has mapped faults it (SIGBUS).
    const fs::path dir =
        fs::path(::testing::TempDir()) / ("clef27_gate_" + gate + "_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    for (const char* f : {"model.safetensors", "joint_head.safetensors", "joint_head_config.json",
                          "tokenizer.json", "tokenizer_config.json", "processor_config.json"})
        fs::copy_file(kDir / f, dir / f, fs::copy_options::overwrite_existing);
    std::ofstream(dir / "config.json") << config_with_gate(gate).dump(2);
    return dir;
}

struct HiddenDiff {
    double max = 0, mean = 0;
};

// The engine's last hidden state on basic_mixed (all 1362 tokens) against the oracle's first 256 positions:
// the model is causal, so position t depends on ids 0..t only.
HiddenDiff against_oracle(const Engine& e) {
    const JsonValue golden = parse_json_or_throw(
        clef::testing::read_file((kDir / "sigmoid_gate_basic_mixed_256.json").string()), "oracle golden");
    const JsonValue& c = clef::testing::tiny_case_of(kDir.string(), "basic_mixed");
    DecisionRequest req;
    std::vector<RequestError> errors;
    EXPECT_TRUE(clef::testing::parse_case_request(c, req, errors));
    DecideOptions opt;
    opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
    const Decision d = e.decide(req, opt, /*keep_hidden=*/true);
    const auto& ids = golden.find("input_ids")->items();
    const auto& case_ids = c.find("input_ids")->items();
    for (size_t t = 0; t < ids.size(); ++t) EXPECT_EQ(ids[t].as_int64(), case_ids[t].as_int64()) << t;
    const auto& rows = golden.find("last_hidden_state")->items();
    const size_t H = rows[0].items().size();
    HiddenDiff r;
    for (size_t t = 0; t < rows.size(); ++t)
        for (size_t k = 0; k < H; ++k) {
            const double err = std::fabs(d.last_hidden_state[t * H + k] - rows[t].items()[k].as_double());
            r.max = std::max(r.max, err);
            r.mean += err;
        }
    r.mean /= static_cast<double>(rows.size() * H);
    return r;
}

}  // namespace

TEST(Clef27, ConfigReadsTheRatiosAndTheGate) {
    const ModelConfig c = load_model_config((kDir / "config.json").string());
    EXPECT_EQ(c.text.hidden_size, 80);
    EXPECT_EQ(c.text.linear_num_value_heads / c.text.linear_num_key_heads, 3);
    EXPECT_EQ(c.text.num_heads / c.text.num_kv_heads, 6);
    EXPECT_EQ(c.text.gdn_norm_gate, ops::NormGate::Silu);  // "swish", as Cloudflare/clef's config
    auto gate_of = [](const std::string& g) {
        return parse_model_config(config_with_gate(g).dump(), "config.json").text.gdn_norm_gate;
    };
    EXPECT_EQ(gate_of("silu"), ops::NormGate::Silu);
    EXPECT_EQ(gate_of("sigmoid"), ops::NormGate::Sigmoid);
    try {
        gate_of("tanh");
        ADD_FAILURE() << "tanh accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("output_gate_type"), std::string::npos) << e.what();
    }
}

// Both variants against the oracle's sigmoid output: the sigmoid model meets the fixture's hidden-state
// bounds, the swish model misses them by far (so the comparison can tell the variants apart).
TEST(Clef27, SigmoidGateMatchesTheIndependentOracle) {
    const auto sigmoid = Engine::load(fixture_with_gate("sigmoid").string());
    const HiddenDiff d = against_oracle(*sigmoid);
    std::printf("  sigmoid gate vs float64 oracle: max %.2e mean %.2e\n", d.max, d.mean);
    EXPECT_LE(d.max, 5e-3);
    EXPECT_LE(d.mean, 2e-5);
    const auto swish = Engine::load(kDir.string());
    EXPECT_GT(against_oracle(*swish).max, 0.5);
}

// The gate survives GGUF (clef architecture: clef.ssm.norm_gate); llama.cpp's qwen35 has no key for it.
TEST(Clef27, SigmoidGateThroughGguf) {
    const fs::path dir = fixture_with_gate("sigmoid");
    const std::string out = (fs::path(::testing::TempDir()) / "clef27_sigmoid.gguf").string();
    int status = 0;
    std::string log = clef::testing::run_command(
        std::string(CLEF_BINARY) + " convert --model " + dir.string() + " --out " + out + " --type bf16 2>&1",
        status);
    ASSERT_EQ(status, 0) << log;
    const auto e = Engine::load(out);
    EXPECT_EQ(e->config().text.gdn_norm_gate, ops::NormGate::Sigmoid);
    const HiddenDiff d = against_oracle(*e);
    EXPECT_LE(d.max, 5e-3);
    EXPECT_LE(d.mean, 2e-5);

    log = clef::testing::run_command(std::string(CLEF_BINARY) + " convert --model " + dir.string() +
                                         " --out " + out + ".qwen35 --type bf16 --arch qwen35 2>&1",
                                     status);
    EXPECT_EQ(WEXITSTATUS(status), 2) << log;
    EXPECT_NE(log.find("output_gate_type sigmoid"), std::string::npos) << log;
}
