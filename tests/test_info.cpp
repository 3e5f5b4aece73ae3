// `clef info` and the pieces behind it: locate_model_dir, compute_model_info, and the CLI output on
// tiny-clef. Expected parameter counts are computed here from the safetensors headers, parsed independently
// with nlohmann::json, never through the code under test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/model_dir.h"
#include "model/gguf_model.h"
#include "quant/quant.h"
#include "tools/gguf_convert.h"
#include "tools/model_info.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kTiny = std::string(CLEF_TEST_DATA) + "/tiny-clef";

// ---- independent reference numbers ----

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The JSON header of a safetensors file.
json read_header(const std::string& path) {
    const std::string bytes = read_file(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes.at(i));
    return json::parse(bytes.substr(8, n));
}

int64_t numel(const json& entry) {
    int64_t n = 1;
    for (const auto& d : entry["shape"]) n *= d.get<int64_t>();
    return n;
}

bool starts_with(const std::string& s, const std::string& p) {
    return s.rfind(p, 0) == 0;
}

struct Tally {
    int64_t tensors = 0;
    int64_t params = 0;
};

// Component -> counts for tiny-clef, by name prefix; layer N's type comes from config.json's layer_types.
std::map<std::string, Tally> reference_counts() {
    const json cfg = json::parse(read_file(kTiny + "/config.json"));
    const json& types = cfg["text_config"]["layer_types"];
    std::map<std::string, Tally> m;
    auto add = [&](const std::string& key, const json& e) {
        m[key].tensors += 1;
        m[key].params += numel(e);
    };
    const json backbone = read_header(kTiny + "/model.safetensors");
    const json head = read_header(kTiny + "/joint_head.safetensors");
    for (const auto& [name, e] : backbone.items()) {
        if (name == "__metadata__") continue;
        const std::string layers = "model.language_model.layers.";
        if (starts_with(name, layers)) {
            const size_t dot = name.find('.', layers.size());
            const int idx = std::stoi(name.substr(layers.size(), dot - layers.size()));
            add(types.at(idx) == "full_attention" ? "full_attention_layers" : "linear_attention_layers", e);
        } else if (starts_with(name, "model.language_model.embed_tokens.")) {
            add("embed_tokens", e);
        } else if (starts_with(name, "model.language_model.norm.")) {
            add("final_norm", e);
        } else if (starts_with(name, "lm_head.")) {
            add("lm_head", e);
        } else if (starts_with(name, "model.visual.")) {
            add("vision", e);
        } else {
            add("other", e);
        }
    }
    for (const auto& [name, e] : head.items())
        if (name != "__metadata__") add("head", e);
    return m;
}

// 1234567 -> "1,234,567" (the test's own formatter).
std::string commas(int64_t v) {
    const std::string digits = std::to_string(v);
    std::string out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
        out.push_back(digits[i]);
    }
    return out;
}

struct RunResult {
    int exit_code = -1;
    std::string output;
};

RunResult run_clef(const std::string& args) {
    RunResult r;
    if (!fs::exists(CLEF_BINARY)) {
        ADD_FAILURE() << CLEF_BINARY << " does not exist: build the clef target before running test_info";
        return r;
    }
    const std::string cmd = std::string(CLEF_BINARY) + " " + args;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
    const int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

// The line of the text output that starts with "  <label>" (after the two-space indent).
std::string line_of(const std::string& text, const std::string& label) {
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(pos, end - pos);
        if (starts_with(line, "  " + label + " ")) return line;
        pos = end + 1;
    }
    return {};
}

const std::vector<std::pair<std::string, std::string>> kComponents = {
    {"linear_attention_layers", "linear-attention layers"},
    {"full_attention_layers", "full-attention layers"},
    {"final_norm", "final norm"},
    {"embed_tokens", "embed_tokens"},
    {"lm_head", "lm_head"},
    {"vision", "vision tower"},
    {"head", "joint head"},
};

// ---- fixtures ----

class TempDirTest : public ::testing::Test {
protected:
    void SetUp() override {
        std::random_device rd;
        dir_ = fs::temp_directory_path() /
               ("clef_test_info_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
        fs::create_directories(dir_);
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    // A copy of tiny-clef (all files except the large goldens).
    void copy_tiny() {
        for (const char* f :
             {"config.json", "joint_head_config.json", "joint_head.safetensors", "model.safetensors",
              "tokenizer.json", "tokenizer_config.json", "processor_config.json"})
            fs::copy_file(kTiny + "/" + f, dir_ / f);
    }
    void expect_locate_error(std::initializer_list<std::string> fragments) {
        try {
            clef::locate_model_dir(dir_.string());
            FAIL() << "expected an error";
        } catch (const clef::Error& e) {
            const std::string msg = e.what();
            EXPECT_EQ(msg.rfind(dir_.string() + ": ", 0), 0u) << msg;
            for (const auto& f : fragments)
                EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
        }
    }
    fs::path dir_;
};

// ---- locate_model_dir ----

TEST(ModelDir, TinyClef) {
    const clef::ModelDir d = clef::locate_model_dir(kTiny);
    EXPECT_EQ(d.root, kTiny);
    EXPECT_EQ(d.config_path, kTiny + "/config.json");
    EXPECT_EQ(d.head_config_path, kTiny + "/joint_head_config.json");
    EXPECT_EQ(d.head_weights_path, kTiny + "/joint_head.safetensors");
    EXPECT_EQ(d.tokenizer_path, kTiny + "/tokenizer.json");
    EXPECT_EQ(d.tokenizer_config_path, kTiny + "/tokenizer_config.json");
    EXPECT_EQ(d.processor_config_path, kTiny + "/processor_config.json");
    EXPECT_EQ(d.weights_path, kTiny + "/model.safetensors");
    EXPECT_EQ(d.weights_index_path, "");
    EXPECT_FALSE(d.backbone_only);
    EXPECT_TRUE(d.has_head());
    EXPECT_TRUE(d.notes.empty());
}

TEST_F(TempDirTest, LocateMissingRequiredFiles) {
    copy_tiny();
    fs::remove(dir_ / "config.json");
    expect_locate_error({"missing config.json"});
    fs::copy_file(kTiny + "/config.json", dir_ / "config.json");

    fs::remove(dir_ / "tokenizer.json");
    expect_locate_error({"missing tokenizer.json"});
    fs::copy_file(kTiny + "/tokenizer.json", dir_ / "tokenizer.json");

    fs::remove(dir_ / "model.safetensors");
    expect_locate_error({"missing the backbone weights", "model.safetensors"});
    fs::copy_file(kTiny + "/model.safetensors", dir_ / "model.safetensors");

    fs::remove(dir_ / "joint_head.safetensors");
    expect_locate_error({"missing joint_head.safetensors", "joint_head_config.json is present"});
    fs::copy_file(kTiny + "/joint_head.safetensors", dir_ / "joint_head.safetensors");

    fs::remove(dir_ / "joint_head_config.json");
    expect_locate_error({"missing joint_head_config.json", "joint_head.safetensors is present"});

    fs::remove(dir_ / "joint_head.safetensors");
    const clef::ModelDir d = clef::locate_model_dir(dir_.string());
    EXPECT_TRUE(d.backbone_only);
    EXPECT_FALSE(d.has_head());
    EXPECT_EQ(d.head_config_path, "");
    EXPECT_EQ(d.head_weights_path, "");
    ASSERT_FALSE(d.notes.empty());
    EXPECT_NE(d.notes[0].find("backbone only"), std::string::npos);
}

TEST_F(TempDirTest, LocateOptionalFilesAndShardedWeights) {
    copy_tiny();
    fs::remove(dir_ / "tokenizer_config.json");
    fs::remove(dir_ / "processor_config.json");
    fs::rename(dir_ / "model.safetensors", dir_ / "model-00001-of-00001.safetensors");
    clef::ModelDir d = clef::locate_model_dir(dir_.string());
    EXPECT_EQ(d.tokenizer_config_path, "");
    EXPECT_EQ(d.processor_config_path, "");
    EXPECT_EQ(d.weights_path, dir_.string());
    EXPECT_EQ(d.weights_index_path, "");

    std::ofstream(dir_ / "model.safetensors.index.json") << "{}";
    d = clef::locate_model_dir(dir_.string());
    EXPECT_EQ(d.weights_path, dir_.string());
    EXPECT_EQ(d.weights_index_path, (dir_ / "model.safetensors.index.json").string());
}

TEST_F(TempDirTest, LocateNotADirectory) {
    try {
        clef::locate_model_dir((dir_ / "nothing").string());
        FAIL();
    } catch (const clef::Error& e) {
        EXPECT_EQ(std::string(e.what()), (dir_ / "nothing").string() + ": model directory does not exist");
    }
    std::ofstream(dir_ / "file") << "x";
    try {
        clef::locate_model_dir((dir_ / "file").string());
        FAIL();
    } catch (const clef::Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind((dir_ / "file").string() + ": not a directory", 0), 0u)
            << e.what();
    }
    fs::create_directories(dir_ / "config.json");
    expect_locate_error({"config.json is not a regular file"});
}

// ---- compute_model_info ----

TEST(ModelInfo, TinyClefCountsFromHeaders) {
    const auto ref = reference_counts();
    const clef::ModelInfo info = clef::compute_model_info(kTiny);
    EXPECT_EQ(info.text_prefix, "model.language_model.");
    EXPECT_EQ(info.layer_pattern, "3×linear + 1×full, repeated 2×");
    EXPECT_EQ(info.backbone_tensors, 142);
    EXPECT_EQ(info.head_tensors, 122);
    EXPECT_EQ(ref.count("other"), 0u);

    std::map<std::string, const clef::ComponentInfo*> by_key;
    for (const auto& c : info.components) by_key[c.key] = &c;
    EXPECT_EQ(by_key.size(), kComponents.size());  // no "other" row for tiny-clef
    int64_t total = 0;
    for (const auto& [key, label] : kComponents) {
        ASSERT_TRUE(by_key.count(key)) << key;
        const clef::ComponentInfo& c = *by_key[key];
        EXPECT_EQ(c.label, label);
        EXPECT_EQ(c.actual, ref.at(key).params) << key;
        EXPECT_EQ(c.tensors, ref.at(key).tensors) << key;
        EXPECT_EQ(c.expected, c.actual) << key << ": the tiny checkpoint matches its config";
        total += ref.at(key).params;
    }
    EXPECT_EQ(info.actual.linear_attention_layers, ref.at("linear_attention_layers").params);
    EXPECT_EQ(info.actual.full_attention_layers, ref.at("full_attention_layers").params);
    EXPECT_EQ(info.actual.backbone_layers(), ref.at("linear_attention_layers").params +
                                                 ref.at("full_attention_layers").params +
                                                 ref.at("final_norm").params);
    EXPECT_EQ(info.actual.total(), total);
    EXPECT_EQ(info.expected.total(), total);
    EXPECT_TRUE(info.counts_match());
    EXPECT_TRUE(info.warnings.empty()) << info.warnings.front();

    // Dtypes: BF16 everywhere except the six F32 A_log tensors.
    ASSERT_EQ(info.dtypes.size(), 2u);
    EXPECT_EQ(info.dtypes[0].dtype, "BF16");
    EXPECT_EQ(info.dtypes[0].tensors, 142 - 6 + 122);
    EXPECT_EQ(info.dtypes[1].dtype, "F32");
    EXPECT_EQ(info.dtypes[1].tensors, 6);
    EXPECT_EQ(info.dtypes[1].params, 6 * 4);
    EXPECT_EQ(info.dtypes[1].bytes, 6u * 4u * 4u);
    EXPECT_EQ(info.dtypes[0].params + info.dtypes[1].params, total);

    // Files and their sizes.
    std::map<std::string, const clef::FileEntry*> files;
    for (const auto& f : info.files) files[f.name] = &f;
    for (const char* name :
         {"config.json", "model.safetensors", "joint_head_config.json", "joint_head.safetensors",
          "tokenizer.json", "tokenizer_config.json", "processor_config.json"}) {
        ASSERT_TRUE(files.count(name)) << name;
        EXPECT_EQ(files[name]->bytes, fs::file_size(kTiny + "/" + name)) << name;
    }
    EXPECT_EQ(files["model.safetensors"]->bytes, 1013256u);
    EXPECT_EQ(files["model.safetensors"]->tensors, 142);
    EXPECT_EQ(files["joint_head.safetensors"]->bytes, 182120u);
    EXPECT_EQ(files["joint_head.safetensors"]->tensors, 122);
    EXPECT_EQ(files["config.json"]->tensors, -1);
}

TEST(ModelInfo, JsonForm) {
    const auto ref = reference_counts();
    const json j = clef::model_info_to_json(clef::compute_model_info(kTiny));
    EXPECT_EQ(j["architecture"], "Qwen3_5ForConditionalGeneration");
    EXPECT_EQ(j["layers"]["full_attention"], json({3, 7}));
    EXPECT_EQ(j["layers"]["types"][3], "full_attention");
    EXPECT_EQ(j["text"]["hidden_size"], 64);
    EXPECT_EQ(j["vision"]["depth"], 2);
    EXPECT_EQ(j["head"]["width"], 32);
    for (const auto& [key, label] : kComponents) {
        EXPECT_EQ(j["parameters"][key]["actual"], ref.at(key).params) << key;
        EXPECT_EQ(j["parameters"][key]["match"], true) << key;
    }
    EXPECT_EQ(j["counts_match"], true);
    EXPECT_EQ(j["dtypes"]["F32"]["tensors"], 6);
}

TEST_F(TempDirTest, MismatchIsFlagged) {
    copy_tiny();
    json cfg = json::parse(read_file(kTiny + "/config.json"));
    cfg["text_config"]["vocab_size"] = 384;
    cfg["text_config"]["intermediate_size"] = 96;
    std::ofstream(dir_ / "config.json") << cfg.dump();
    const clef::ModelInfo info = clef::compute_model_info(dir_.string());
    EXPECT_FALSE(info.counts_match());
    const auto ref = reference_counts();
    for (const auto& c : info.components) {
        const bool affected = c.key == "embed_tokens" || c.key == "lm_head" ||
                              c.key == "linear_attention_layers" || c.key == "full_attention_layers";
        EXPECT_EQ(c.matches(), !affected) << c.key;
        EXPECT_EQ(c.actual, ref.at(c.key).params) << c.key;
    }
    bool found = false;
    for (const auto& w : info.warnings)
        if (w == "embed_tokens: 20,480 parameters in the files, 24,576 expected from the config")
            found = true;
    EXPECT_TRUE(found);
    const std::string text = clef::format_model_info(info);
    EXPECT_NE(line_of(text, "embed_tokens").find("MISMATCH"), std::string::npos) << text;
    EXPECT_NE(line_of(text, "final norm").find("ok"), std::string::npos) << text;
}

// A text-only checkpoint: Qwen3_5ForCausalLM names (prefix model.), plain text config, no vision, no head,
// plus an unknown mtp tensor.
TEST_F(TempDirTest, TextOnlyLayoutBackboneOnly) {
    const std::string bytes = read_file(kTiny + "/model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    const json header = json::parse(bytes.substr(8, n));
    std::string data = bytes.substr(8 + n);
    json out = json::object();
    int64_t text_params = 0;
    for (const auto& [name, e] : header.items()) {
        if (starts_with(name, "model.visual.")) continue;
        if (name == "__metadata__") {
            out[name] = e;
        } else if (starts_with(name, "model.language_model.")) {
            out["model." + name.substr(std::string("model.language_model.").size())] = e;
            text_params += numel(e);
        } else {
            out[name] = e;  // lm_head.weight
            text_params += numel(e);
        }
    }
    const uint64_t end = data.size();
    out["mtp.fc.weight"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {end, end + 8}}};
    data += std::string(8, '\0');
    const std::string h = out.dump();
    std::string file;
    for (int i = 0; i < 8; ++i) file += static_cast<char>((h.size() >> (8 * i)) & 0xff);
    std::ofstream(dir_ / "model.safetensors", std::ios::binary) << file << h << data;

    json cfg = json::parse(read_file(kTiny + "/config.json"))["text_config"];
    cfg["architectures"] = {"Qwen3_5ForCausalLM"};
    std::ofstream(dir_ / "config.json") << cfg.dump();
    fs::copy_file(kTiny + "/tokenizer.json", dir_ / "tokenizer.json");

    const clef::ModelInfo info = clef::compute_model_info(dir_.string());
    EXPECT_TRUE(info.dir.backbone_only);
    EXPECT_EQ(info.text_prefix, "model.");
    EXPECT_EQ(info.config.model_type, "qwen3_5_text");
    EXPECT_FALSE(info.head.has_value());
    EXPECT_EQ(info.actual.vision, 0);
    EXPECT_EQ(info.actual.head, 0);
    EXPECT_EQ(info.actual.other, 2);
    EXPECT_EQ(info.actual.total() - info.actual.other, text_params);
    for (const auto& c : info.components) EXPECT_EQ(c.matches(), c.key != "other") << c.key;
    ASSERT_EQ(info.other_tensors, std::vector<std::string>{"mtp.fc.weight"});
    ASSERT_EQ(info.warnings.size(), 2u);
    EXPECT_NE(info.warnings[0].find("backbone only"), std::string::npos);
    EXPECT_NE(info.warnings[1].find("mtp.fc.weight"), std::string::npos);
    const std::string text = clef::format_model_info(info);
    EXPECT_NE(text.find("Qwen3_5ForCausalLM text-only layout"), std::string::npos) << text;
    EXPECT_NE(text.find("none (backbone only)"), std::string::npos) << text;
}

TEST_F(TempDirTest, ShardedWeightsThroughAnIndex) {
    copy_tiny();
    fs::rename(dir_ / "model.safetensors", dir_ / "model-00001-of-00001.safetensors");
    const json header = read_header((dir_ / "model-00001-of-00001.safetensors").string());
    json weight_map = json::object();
    for (const auto& [name, e] : header.items())
        if (name != "__metadata__") weight_map[name] = "model-00001-of-00001.safetensors";
    std::ofstream(dir_ / "model.safetensors.index.json") << json({{"weight_map", weight_map}}).dump();

    const clef::ModelInfo info = clef::compute_model_info(dir_.string());
    EXPECT_TRUE(info.counts_match());
    EXPECT_EQ(info.backbone_tensors, 142);
    std::vector<std::string> names;
    for (const auto& f : info.files) names.push_back(f.name);
    EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors.index.json",
                                               "model-00001-of-00001.safetensors", "joint_head_config.json",
                                               "joint_head.safetensors", "tokenizer.json",
                                               "tokenizer_config.json", "processor_config.json"}));
    EXPECT_EQ(info.files[2].tensors, 142);
    EXPECT_EQ(info.files[2].bytes, 1013256u);
}

// ---- the CLI ----

TEST(InfoCli, TextOutputOnTinyClef) {
    const auto ref = reference_counts();
    const RunResult r = run_clef("info --model " + kTiny + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string& out = r.output;
    EXPECT_NE(out.find("Qwen3_5ForConditionalGeneration"), std::string::npos) << out;
    EXPECT_NE(out.find("3×linear + 1×full, repeated 2×"), std::string::npos) << out;
    int64_t total = 0;
    for (const auto& [key, label] : kComponents) {
        const std::string line = line_of(out, label);
        ASSERT_FALSE(line.empty()) << label << " not in:\n" << out;
        const std::string num = commas(ref.at(key).params);
        const size_t first = line.find(" " + num);
        ASSERT_NE(first, std::string::npos) << line;
        EXPECT_NE(line.find(" " + num, first + 1), std::string::npos) << "count and expected: " << line;
        // append, not " " + s + " ": gcc 12 reports a false -Wrestrict on the latter here
        const std::string tensors = std::string(" ").append(std::to_string(ref.at(key).tensors)).append(" ");
        EXPECT_NE(line.find(tensors), std::string::npos) << line;
        EXPECT_NE(line.find("ok"), std::string::npos) << line;
        total += ref.at(key).params;
    }
    EXPECT_GT(total, 1000);
    const std::string total_line = line_of(out, "total");
    EXPECT_NE(total_line.find(commas(total)), std::string::npos) << total_line;
    const std::string layers_line = line_of(out, "backbone layers total");
    EXPECT_NE(layers_line.find(commas(ref.at("linear_attention_layers").params +
                                      ref.at("full_attention_layers").params + ref.at("final_norm").params)),
              std::string::npos)
        << layers_line;
    EXPECT_NE(line_of(out, "model.safetensors").find("1,013,256"), std::string::npos) << out;
    EXPECT_NE(line_of(out, "joint_head.safetensors").find("182,120"), std::string::npos) << out;
    EXPECT_NE(line_of(out, "BF16").find(" 258 "), std::string::npos) << out;
    EXPECT_NE(out.find("warnings\n  none\n"), std::string::npos) << out;
}

TEST(InfoCli, JsonOutputOnTinyClef) {
    const auto ref = reference_counts();
    const RunResult r = run_clef("info --model " + kTiny + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    json j;
    ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
    for (const auto& [key, label] : kComponents) {
        EXPECT_EQ(j["parameters"][key]["actual"], ref.at(key).params) << key;
        EXPECT_EQ(j["parameters"][key]["expected"], ref.at(key).params) << key;
        EXPECT_EQ(j["parameters"][key]["tensors"], ref.at(key).tensors) << key;
    }
    EXPECT_EQ(j["layers"]["pattern"], "3×linear + 1×full, repeated 2×");
    EXPECT_EQ(j["backbone_only"], false);
    EXPECT_EQ(j["warnings"], json::array());
}

// ---- GGUF files ----

// tiny-clef converted in the test; parameters per component must equal the safetensors headers' (the GGUF
// holds no vision tower; the head's packed attention in_proj is split into q/k/v and its three scalars are
// one tensor, so head tensor counts differ but its parameters do not).
TEST_F(TempDirTest, GgufCountsMatchSafetensors) {
    const auto ref = reference_counts();
    const std::string path = (dir_ / "tiny-q4_k_m.gguf").string();
    clef::ConvertOptions opt;
    opt.type = clef::GgufFileType::Q4_K_M;
    const clef::ConvertSummary sum = clef::convert_to_gguf(kTiny, path, opt);
    const clef::ModelInfo info = clef::compute_model_info(path);
    ASSERT_TRUE(info.gguf.has_value());
    const clef::GgufInfo& g = *info.gguf;
    EXPECT_EQ(g.arch, "clef");
    EXPECT_EQ(g.version, 3u);
    EXPECT_EQ(g.file_type, 15);
    EXPECT_EQ(g.file_type_name, "Q4_K_M");
    EXPECT_EQ(g.quantization_version, 2);
    EXPECT_EQ(g.head_source, "in the file");
    const json cfg = json::parse(read_file(kTiny + "/config.json"));
    EXPECT_EQ(g.context_length, cfg["text_config"]["max_position_embeddings"].get<int64_t>());
    EXPECT_FALSE(info.dir.backbone_only);
    EXPECT_FALSE(info.config.vision.has_value());

    // Tensor types and quant types against the converter's own tally.
    std::vector<std::string> quant;
    std::map<std::string, int64_t> by_type;
    for (const auto& d : info.dtypes) by_type[d.dtype] = d.tensors;
    for (const auto& [type, n] : sum.tensors_per_type) {
        EXPECT_EQ(by_type[type], static_cast<int64_t>(n)) << type;
        for (uint32_t id = 0; id < 64; ++id)
            if (clef::ggml_type_name(id) == type && clef::ggml_type_traits(id).block_size > 1)
                quant.push_back(type);
    }
    EXPECT_EQ(by_type.size(), sum.tensors_per_type.size());
    EXPECT_EQ(g.quant_types, quant);
    EXPECT_FALSE(quant.empty());

    std::map<std::string, const clef::ComponentInfo*> by_key;
    for (const auto& c : info.components) by_key[c.key] = &c;
    for (const auto& [key, label] : kComponents) {
        ASSERT_TRUE(by_key.count(key)) << key;
        const clef::ComponentInfo& c = *by_key[key];
        EXPECT_EQ(c.expected, c.actual) << key;
        if (key == "vision") {
            EXPECT_EQ(c.actual, 0);
            continue;
        }
        EXPECT_EQ(c.actual, ref.at(key).params) << key;
        if (key != "head") {
            EXPECT_EQ(c.tensors, ref.at(key).tensors) << key;
        }
    }
    EXPECT_TRUE(info.counts_match());
    EXPECT_TRUE(info.warnings.empty()) << info.warnings.front();
    ASSERT_EQ(info.files.size(), 1u);
    EXPECT_EQ(info.files[0].bytes, fs::file_size(path));
    EXPECT_EQ(info.files[0].tensors, static_cast<int64_t>(sum.tensors));
}

// A qwen35 (backbone-only) GGUF: the head is found beside the file, as the loader finds it; without it the
// summary says the file is a backbone only.
TEST_F(TempDirTest, GgufQwen35HeadBesideTheFile) {
    const auto ref = reference_counts();
    const std::string path = (dir_ / "tiny-qwen35.gguf").string();
    clef::ConvertOptions opt;
    opt.arch = "qwen35";
    clef::convert_to_gguf(kTiny, path, opt);
    clef::ModelInfo info = clef::compute_model_info(path);
    EXPECT_EQ(info.gguf->head_source, "none");
    EXPECT_TRUE(info.dir.backbone_only);
    ASSERT_FALSE(info.warnings.empty());
    EXPECT_NE(info.warnings.back().find("backbone only"), std::string::npos);

    for (const char* f : {"joint_head_config.json", "joint_head.safetensors"})
        fs::copy_file(kTiny + "/" + f, dir_ / f);
    info = clef::compute_model_info(path);
    EXPECT_EQ(info.gguf->arch, "qwen35");
    EXPECT_EQ(info.gguf->file_type_name, "BF16");
    EXPECT_TRUE(info.gguf->quant_types.empty());
    EXPECT_EQ(info.gguf->head_source, "joint_head.safetensors beside the file");
    EXPECT_EQ(info.head_tensors, ref.at("head").tensors);
    EXPECT_EQ(info.actual.head, ref.at("head").params);
    EXPECT_EQ(info.actual.embed_tokens, ref.at("embed_tokens").params);
    EXPECT_TRUE(info.counts_match());
    EXPECT_TRUE(info.warnings.empty()) << info.warnings.front();
    EXPECT_EQ(info.files.size(), 3u);
}

TEST_F(TempDirTest, GgufCliTextAndJson) {
    const auto ref = reference_counts();
    const std::string path = (dir_ / "tiny-q8_0.gguf").string();
    clef::ConvertOptions opt;
    opt.type = clef::GgufFileType::Q8_0;
    clef::convert_to_gguf(kTiny, path, opt);
    RunResult r = run_clef("info --model " + path + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(line_of(r.output, "file type").find("Q8_0 (general.file_type 7)"), std::string::npos)
        << r.output;
    EXPECT_NE(line_of(r.output, "quant types").find("q8_0"), std::string::npos) << r.output;
    EXPECT_NE(line_of(r.output, "head weights").find("in the file"), std::string::npos) << r.output;
    EXPECT_NE(line_of(r.output, "embed_tokens").find("ok"), std::string::npos) << r.output;
    r = run_clef("info --model " + path + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    json j;
    ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
    EXPECT_EQ(j["format"], "gguf");
    EXPECT_EQ(j["gguf"]["file_type_name"], "Q8_0");
    EXPECT_EQ(j["gguf"]["architecture"], "clef");
    for (const char* key :
         {"linear_attention_layers", "full_attention_layers", "embed_tokens", "lm_head", "head"})
        EXPECT_EQ(j["parameters"][key]["actual"], ref.at(key).params) << key;
    EXPECT_EQ(j["counts_match"], true);
    // Bits per weight per type and overall: q8_0 is 34 bytes per 32 values = 8.5 bits.
    EXPECT_NEAR(j["dtypes"]["q8_0"]["bits_per_weight"].get<double>(), 8.5, 1e-9);

    // A tensor relabelled as mxfp4 (17 B / 32 values, smaller than q8_0's 34: still inside the file): a
    // warning names the type and the tensor.
    const clef::GgufFile f = clef::GgufFile::open(path);
    const clef::GgufTensorInfo* t = nullptr;
    for (const clef::GgufTensorInfo& x : f.tensors())
        if (x.ggml_type == 8) t = &x;
    ASSERT_NE(t, nullptr);
    std::string bytes = read_file(path);
    const uint32_t mxfp4 = 39;
    std::memcpy(&bytes[t->info_offset + 8 + t->name.size() + 4 + 8 * t->dims.size()], &mxfp4, 4);
    const std::string bad = (dir_ / "mxfp4.gguf").string();
    std::ofstream(bad, std::ios::binary) << bytes;
    r = run_clef("info --model " + bad + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("1 tensors are mxfp4, which clef cannot read"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(t->name), std::string::npos) << r.output;
}

TEST(InfoCli, Errors) {
    RunResult r = run_clef("info --model /nonexistent/clef-model 2>&1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output, "clef: /nonexistent/clef-model: model directory does not exist\n");
    r = run_clef("info 2>&1");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("--model"), std::string::npos) << r.output;
}

}  // namespace
