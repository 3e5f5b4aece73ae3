// RoPE scaling (ops/rope.h, docs/LONG_CONTEXT.md): the engine's cos / sin tables for every type against the
// float64 golden of tests/oracle/rope_scaling_f64.py (transformers' formulas written independently), the
// default type bit for bit as transformers' fp32 formula, YaRN applied below the original context too, the
// whole prompt's length deciding dynamic scaling in a chunked prefill, config errors, and the GGUF round
// trip.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "ops/rope.h"
#include "test_util.h"
#include "tools/gguf_convert.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace clef;
using clef::testing::data_path;

namespace {

json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

const json& golden() {
    static const json g = read_json(data_path("rope/rope_scaling_golden.json"));
    return g;
}

const json& golden_case(const std::string& name) {
    for (const json& c : golden()["cases"])
        if (c["name"] == name) return c;
    throw std::runtime_error("no golden case " + name);
}

// tiny-clef's config.json with the text_config keys a golden case sets.
json config_for(const json& rope_parameters, int head_dim, int max_position_embeddings) {
    json j = read_json(data_path("tiny-clef/config.json"));
    json& t = j["text_config"];
    t["head_dim"] = head_dim;
    t["max_position_embeddings"] = max_position_embeddings;
    t["rope_parameters"] = rope_parameters;
    return j;
}

TextConfig parse_text(const json& j) {
    return parse_model_config(j.dump(), "config.json").text;
}

TextConfig case_config(const json& c) {
    return parse_text(
        config_for(c["rope_parameters"], c["head_dim"].get<int>(), c["max_position_embeddings"].get<int>()));
}

struct Tables {
    int64_t T = 0;
    int half = 0;
    std::vector<int32_t> pos;  // [3][T]
    std::vector<float> cos, sin;
};

Tables tables(const ops::RopeParams& p, const json& positions) {
    Tables r;
    r.T = static_cast<int64_t>(positions[0].size());
    r.half = p.rotary_dim / 2;
    for (const json& axis : positions)
        for (const json& v : axis) r.pos.push_back(v.get<int32_t>());
    r.cos.resize(r.T * r.half);
    r.sin.resize(r.T * r.half);
    ops::rope_tables(p, r.pos.data(), r.T, r.cos.data(), r.sin.data());
    return r;
}

Tables case_tables(const json& c) {
    return tables(rope_params(case_config(c), c["seq_len"].get<int64_t>()), c["positions"]);
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
    return m;
}

// The interleaved-MRoPE axis of frequency i for sections {11, 11, 10} (the golden's).
int golden_axis(int i) {
    if (i % 3 == 1 && i < 33) return 1;
    if (i % 3 == 2 && i < 30) return 2;
    return 0;
}

// fp32 tables against the float64 golden. Each fp32 step (exponent 2i/d, pow, reciprocal, the scaling's
// products) is off by at most an ulp; the exponent's error is magnified ln(base) times by pow. So the angle
// is within (ln(base) + 16) ulps relative, and cos / sin within that times |angle| plus their own rounding,
// all scaled by the attention factor.
void expect_matches_golden(const json& c, const Tables& got) {
    const std::vector<double> inv = c["inv_freq"].get<std::vector<double>>();
    const double att = c["attention_factor"], rel = (std::log(c["base"].get<double>()) + 16) * 0x1p-24;
    ASSERT_EQ(static_cast<int>(inv.size()), got.half);
    double worst = 0;  // the largest error as a fraction of its tolerance
    for (int64_t t = 0; t < got.T; ++t)
        for (int i = 0; i < got.half; ++i) {
            const double angle = got.pos[golden_axis(i) * got.T + t] * inv[i];
            const double tol = att * (std::fabs(angle) * rel + 0x1p-22);
            const double dc = std::fabs(got.cos[t * got.half + i] - c["cos"][t][i].get<double>());
            const double ds = std::fabs(got.sin[t * got.half + i] - c["sin"][t][i].get<double>());
            worst = std::max(worst, std::max(dc, ds) / tol);
        }
    EXPECT_LE(worst, 1.0) << c["name"];
}

TEST(RopeScaling, TablesMatchTheFloat64Golden) {
    ASSERT_EQ(golden()["cases"].size(), 12u);
    for (const json& c : golden()["cases"]) {
        SCOPED_TRACE(c["name"].get<std::string>());
        const TextConfig t = case_config(c);
        EXPECT_NEAR(t.rope_scaling.attention_factor, c["attention_factor"].get<double>(), 1e-14);
        // The double formulas exactly; the engine's fp32 tables within fp32 rounding.
        const int64_t L = c["seq_len"].get<int64_t>();
        const std::vector<double> inv = ops::rope_inv_freq(rope_params(t, L), L);
        const std::vector<double> want = c["inv_freq"].get<std::vector<double>>();
        ASSERT_EQ(inv.size(), want.size());
        for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR(inv[i], want[i], want[i] * 1e-13) << i;
        expect_matches_golden(c, case_tables(c));
        ops::RopeParams p64 = rope_params(t, L);
        p64.fp64_angles = true;
        expect_matches_golden(c, tables(p64, c["positions"]));
    }
}

TEST(RopeScaling, DefaultIsTransformersFp32FormulaBitForBit) {
    const json& c = golden_case("default");
    const Tables got = case_tables(c);
    for (int64_t t = 0; t < got.T; ++t)
        for (int i = 0; i < got.half; ++i) {
            const float inv = 1.0f / std::pow(1e7f, static_cast<float>(2 * i) / 64.0f);
            const float angle = static_cast<float>(got.pos[golden_axis(i) * got.T + t]) * inv;
            ASSERT_EQ(got.cos[t * got.half + i], std::cos(angle)) << t << " " << i;
            ASSERT_EQ(got.sin[t * got.half + i], std::sin(angle)) << t << " " << i;
        }
}

// transformers applies YaRN at every length: positions all below original_max_position_embeddings rotate with
// the blended frequencies and are scaled by the attention factor. With factor 1 the blend and the factor are
// the identity (up to fp32 rounding of the blend).
TEST(RopeScaling, YarnAppliesBelowTheOriginalContext) {
    const json& c = golden_case("yarn_qwen_short");
    json plain = c;
    plain["rope_parameters"] = golden_case("default")["rope_parameters"];
    const Tables yarn = case_tables(c), dflt = case_tables(plain);
    EXPECT_GT(max_diff(yarn.cos, dflt.cos), 0.1);
    EXPECT_NEAR(case_config(c).rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1, 1e-15);
    EXPECT_FLOAT_EQ(yarn.cos[0], 1.1386294f);  // position 0: cos 0 times the attention factor

    const json& one = golden_case("yarn_factor1");
    json one_plain = one;
    one_plain["rope_parameters"] = plain["rope_parameters"];
    const Tables y1 = case_tables(one), d1 = case_tables(one_plain);
    EXPECT_EQ(case_config(one).rope_scaling.attention_factor, 1.0);
    EXPECT_LT(max_diff(y1.cos, d1.cos), 0.05);  // angles up to 1e6 rad: fp32 rounding of the blend only
}

// Dynamic and longrope decide on RopeParams::seq_len; 0 = the table's largest position + 1.
TEST(RopeScaling, LengthDependentTypesDecideOnSeqLen) {
    for (const char* name : {"dynamic_long", "longrope_long"}) {
        const json& c = golden_case(name);
        const TextConfig t = case_config(c);
        const Tables whole = tables(rope_params(t, c["seq_len"]), c["positions"]);
        const Tables own = tables(rope_params(t, 0), c["positions"]);  // largest position 4095: short
        expect_matches_golden(
            golden_case(name == std::string("dynamic_long") ? "dynamic_short" : "longrope_short"), own);
        EXPECT_GT(max_diff(whole.cos, own.cos), 0.01) << name;
    }
}

// The backbone decides dynamic scaling on the whole prompt: chunked prefill equals the one-shot forward,
// which equals the default type with the dynamic base theta' of the prompt's length. Chunks deciding on their
// own length (forward_chunk with rope_seq_len 0) differ.
TEST(RopeScaling, ChunkedPrefillUsesThePromptLength) {
    Checkpoint ckpt = Checkpoint::open(data_path("tiny-clef/model.safetensors"));
    TextConfig cfg = load_model_config(data_path("tiny-clef/config.json")).text;
    cfg.rope_scaling.type = ops::RopeType::Dynamic;
    cfg.rope_scaling.factor = 4;
    cfg.rope_scaling.original_max = 16;
    const Backbone dyn(cfg, ckpt);
    const int64_t T = 96;
    std::vector<int32_t> ids(T);
    for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 37 + 11) % 256);
    BackboneOptions whole, chunked;
    whole.prefill_chunk = 0;
    chunked.prefill_chunk = 8;
    const std::vector<float> a = dyn.forward(ids, whole), b = dyn.forward(ids, chunked);
    EXPECT_LE(max_diff(a, b), 1e-3);

    TextConfig plain = load_model_config(data_path("tiny-clef/config.json")).text;
    const int d = plain.rotary_dim;
    plain.rope_theta = 1e7 * std::pow(4.0 * T / 16 - 3, static_cast<double>(d) / (d - 2));
    EXPECT_LE(max_diff(a, Backbone(plain, ckpt).forward(ids, whole)), 1e-3);

    BackboneState st = dyn.start();
    std::vector<float> own(a.size());
    const int64_t H = cfg.hidden_size;
    for (int64_t t0 = 0; t0 < T; t0 += 8) {
        dyn.embed_into(ids.data() + t0, 8, own.data() + t0 * H);
        dyn.forward_chunk(st, own.data() + t0 * H, 8, nullptr, 0, whole, own.data() + t0 * H);
    }
    EXPECT_GT(max_diff(a, own), 1e-2);
}

// Expects the config to be refused with "config.json: <key>: " and every fragment.
void expect_error(const json& j, const std::string& key, std::initializer_list<std::string> fragments) {
    try {
        parse_text(j);
        FAIL() << "expected an error for " << key;
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind("config.json: " + key + ": ", 0), 0u) << msg;
        for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << f << " not in: " << msg;
    }
}

json with_rope(const json& rp) {
    json base = {{"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}, {"mrope_section", {11, 11, 10}}};
    base.update(rp);
    return config_for(base, 256, 262144);
}

TEST(RopeScaling, ConfigErrors) {
    const std::string rp = "text_config.rope_parameters.";
    expect_error(with_rope({{"rope_type", "ntk"}}), rp + "rope_type",
                 {"unsupported rope type 'ntk'", "yarn"});
    expect_error(with_rope({{"rope_type", "linear"}}), rp + "factor", {"missing", "linear"});
    expect_error(with_rope({{"rope_type", "dynamic"}, {"factor", 0.5}}), rp + "factor",
                 {"at least 1", "0.5"});
    expect_error(with_rope({{"rope_type", "yarn"}, {"factor", "4"}}), rp + "factor", {"expected a number"});
    expect_error(with_rope({{"rope_type", "yarn"}, {"factor", 4.0}}), rp + "original_max_position_embeddings",
                 {"missing", "pre-training context length"});
    const json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 262144}};
    auto yarn_with = [&](const json& extra) {
        json r = yarn;
        r.update(extra);
        return with_rope(r);
    };
    expect_error(yarn_with({{"original_max_position_embeddings", 0}}),
                 rp + "original_max_position_embeddings", {"must be positive"});
    expect_error(yarn_with({{"beta_fast", -1.0}}), rp + "beta_fast", {"negative"});
    expect_error(yarn_with({{"beta_fast", 1.0}, {"beta_slow", 2.0}}), rp + "beta_fast",
                 {"less than beta_slow"});
    expect_error(yarn_with({{"attention_factor", 0.0}}), rp + "attention_factor", {"more than 0"});
    expect_error(yarn_with({{"truncate", "yes"}}), rp + "truncate", {"true or false"});
    expect_error(with_rope({{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"original_max_position_embeddings", 8192},
                            {"low_freq_factor", 4.0},
                            {"high_freq_factor", 1.0}}),
                 rp + "high_freq_factor", {"more than 4"});
    expect_error(with_rope({{"rope_type", "longrope"},
                            {"original_max_position_embeddings", 4096},
                            {"short_factor", {1.0, 2.0}},
                            {"long_factor", {1.0, 2.0}}}),
                 rp + "short_factor", {"rotary_dim/2 = 32"});
    json dyn = with_rope({{"rope_type", "dynamic"}, {"factor", 2.0}});
    dyn["text_config"].erase("max_position_embeddings");
    expect_error(dyn, "text_config.max_position_embeddings", {"missing", "dynamic"});
    json both = with_rope(yarn);
    both["text_config"]["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    expect_error(both, "text_config.rope_scaling.type", {"'linear'", "'yarn'", "keep one"});
}

// The older spelling (rope_theta beside rope_scaling with `type`, as Qwen's documentation showed) reads the
// same as rope_parameters; so does a scaling rope_scaling beside a default rope_parameters.
TEST(RopeScaling, OlderKeys) {
    const TextConfig want = parse_text(
        with_rope({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 262144}}));
    json old = with_rope(json::object());
    json& t = old["text_config"];
    t.erase("rope_parameters");
    t["rope_theta"] = 1e7;
    t["partial_rotary_factor"] = 0.25;
    t["rope_scaling"] = {{"type", "yarn"},
                         {"factor", 4.0},
                         {"original_max_position_embeddings", 262144},
                         {"mrope_section", {11, 11, 10}}};
    json beside = with_rope({{"rope_type", "default"}});
    beside["text_config"]["rope_scaling"] = {
        {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 262144}};
    for (const json& j : {old, beside}) {
        const TextConfig got = parse_text(j);
        EXPECT_EQ(got.rope_scaling.type, ops::RopeType::Yarn);
        EXPECT_EQ(got.rope_scaling.factor, want.rope_scaling.factor);
        EXPECT_EQ(got.rope_scaling.original_max, 262144);
        EXPECT_EQ(got.rope_scaling.attention_factor, want.rope_scaling.attention_factor);
        EXPECT_EQ(got.mrope_section, want.mrope_section);
    }
}

// A model directory that is tiny-clef with its config's text_config.rope_parameters replaced.
class TinyWithRope {
public:
    explicit TinyWithRope(const json& rope_parameters) {
        for (const auto& e : fs::directory_iterator(data_path("tiny-clef")))
            if (e.path().filename() != "config.json")
                fs::create_symlink(e.path(), dir_.path() / e.path().filename());
        json j = read_json(data_path("tiny-clef/config.json"));
        j["text_config"]["rope_parameters"] = rope_parameters;
        std::ofstream(dir_.path() / "config.json") << j.dump(2);
    }
    std::string dir() const { return dir_.path().string(); }
    std::string gguf() const { return (dir_.path() / "out.gguf").string(); }

private:
    clef::testing::ScratchDir dir_{"clef_rope_scaling"};
};

json tiny_rope(const json& extra) {
    json rp = read_json(data_path("tiny-clef/config.json"))["text_config"]["rope_parameters"];
    rp.update(extra);
    return rp;
}

// Converted with a scaling and read back: the same scaling, the same tables.
TEST(RopeScaling, GgufRoundTrip) {
    const json cases[] = {
        {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 262144}},
        {{"rope_type", "yarn"},
         {"factor", 8.0},
         {"original_max_position_embeddings", 32768},
         {"beta_fast", 16.0},
         {"beta_slow", 2.0},
         {"attention_factor", 1.25}},
        {{"rope_type", "linear"}, {"factor", 2.0}},
    };
    for (const json& extra : cases) {
        SCOPED_TRACE(extra.dump());
        TinyWithRope m(tiny_rope(extra));
        const TextConfig src = load_model_config(m.dir() + "/config.json").text;
        ConvertOptions opt;
        opt.arch = "qwen35";
        convert_to_gguf(m.dir(), m.gguf(), opt);
        const GgufFile f = GgufFile::open(m.gguf());
        EXPECT_EQ(f.get_string("qwen35.rope.scaling.type"), extra["rope_type"].get<std::string>());
        const TextConfig got = read_gguf_model_config(f).config.text;
        const ops::RopeScaling &a = src.rope_scaling, &b = got.rope_scaling;
        EXPECT_EQ(b.type, a.type);
        EXPECT_EQ(b.factor, a.factor);
        EXPECT_EQ(b.original_max, a.original_max);
        EXPECT_EQ(b.beta_fast, a.beta_fast);
        EXPECT_EQ(b.beta_slow, a.beta_slow);
        EXPECT_EQ(static_cast<float>(b.attention_factor), static_cast<float>(a.attention_factor));
        const json pos = golden_case("yarn_qwen")["positions"];
        ops::RopeParams pa = rope_params(src, 0), pb = rope_params(got, 0);
        pa.mrope_section =
            pb.mrope_section = {0, 0, 0};  // tiny-clef's sections sum to 4, the positions' to 32
        const Tables ta = tables(pa, pos), tb = tables(pb, pos);
        EXPECT_EQ(ta.cos, tb.cos);
        EXPECT_EQ(ta.sin, tb.sin);
    }
}

TEST(RopeScaling, GgufRefusesWhatItCannotDescribe) {
    const json refused[] = {
        {{"rope_type", "dynamic"}, {"factor", 2.0}},
        {{"rope_type", "llama3"},
         {"factor", 8.0},
         {"original_max_position_embeddings", 8192},
         {"low_freq_factor", 1.0},
         {"high_freq_factor", 4.0}},
        {{"rope_type", "yarn"},
         {"factor", 4.0},
         {"original_max_position_embeddings", 262144},
         {"truncate", false}},
    };
    for (const json& extra : refused) {
        TinyWithRope m(tiny_rope(extra));
        ConvertOptions opt;
        opt.arch = "qwen35";
        try {
            convert_to_gguf(m.dir(), m.gguf(), opt);
            FAIL() << "converted " << extra.dump();
        } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("config.json: "), std::string::npos) << msg;
            EXPECT_NE(msg.find("no GGUF description"), std::string::npos) << msg;
        }
    }
}

}  // namespace
