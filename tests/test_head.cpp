// Joint schema head (fp32) against the float64 goldens of tests/data/tiny-clef: the submodule probe of case
// basic_mixed, the logits and probabilities of every answered case, the derived scalars, and the errors.
#include "model/head.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "ops/basic.h"
#include "quant/quant.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace clef {
namespace {

const std::string kDir = std::string(CLEF_TEST_DATA) + "/tiny-clef";

// Tolerances from tests/data/tiny-clef/README.md ("Recommended tolerances for an fp32 engine").
constexpr double kProbeTol = 1e-4;
constexpr double kLogitTol = 2e-4;
constexpr double kProbTol = 2e-5;

json read_json(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    return json::parse(in);
}

struct CaseInput {
    int64_t T = 0;
    std::vector<float> hidden;  // [T][hidden]
    std::vector<int32_t> ids;
    std::vector<HeadQuestion> questions;
};

CaseInput case_input(const json& c) {
    CaseInput in;
    const json& rows = c.at("last_hidden_state");
    in.T = static_cast<int64_t>(rows.size());
    for (const json& row : rows)
        for (const json& v : row) in.hidden.push_back(static_cast<float>(v.get<double>()));
    for (const json& id : c.at("input_ids")) in.ids.push_back(id.get<int32_t>());
    for (const json& q : c.at("questions")) {
        HeadQuestion hq;
        hq.type = q.at("question_type").get<int>();
        hq.span_begin = q.at("question_span")[0].get<int>();
        hq.span_end = q.at("question_span")[1].get<int>();
        for (const json& s : q.at("option_spans"))
            hq.option_spans.emplace_back(s[0].get<int>(), s[1].get<int>());
        in.questions.push_back(std::move(hq));
    }
    return in;
}

void flatten(const json& j, std::vector<double>& out) {
    if (j.is_array()) {
        for (const json& e : j) flatten(e, out);
    } else {
        out.push_back(j.get<double>());
    }
}

// Max |got - want| over a nested JSON array; fails on a size mismatch.
double max_abs_diff(const std::vector<float>& got, const json& want, const std::string& what) {
    std::vector<double> w;
    flatten(want, w);
    EXPECT_EQ(got.size(), w.size()) << what;
    if (got.size() != w.size()) return INFINITY;
    double m = 0.0;
    for (size_t i = 0; i < w.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(got[i]) - w[i]));
    return m;
}

// Runs f and checks that it throws clef::Error whose message contains every one of the given parts.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
    try {
        f();
        ADD_FAILURE() << "expected clef::Error containing '" << parts.front() << "'";
    } catch (const Error& e) {
        const std::string msg = e.what();
        for (const auto& p : parts)
            EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nlacks: " << p;
    }
}

// A minimal safetensors writer (F32 only) for doctored head files.
struct OutTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
};

void write_safetensors(const std::string& path, const std::vector<OutTensor>& tensors) {
    json header = json::object();
    size_t offset = 0;
    for (const auto& t : tensors) {
        const size_t bytes = t.data.size() * sizeof(float);
        header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    header["__metadata__"] = {{"format", "pt"}};
    std::string h = header.dump();
    while (h.size() % 8) h += ' ';
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);  // little-endian host
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& t : tensors)
        out.write(reinterpret_cast<const char*>(t.data.data()),
                  static_cast<std::streamsize>(t.data.size() * 4));
    if (!out) throw std::runtime_error("cannot write " + path);
}

// Every tensor of the real head file, as F32.
std::vector<OutTensor> head_tensors_f32(const SafetensorsFile& f) {
    std::vector<OutTensor> out;
    for (const auto& t : f.tensors()) out.push_back({t.name, t.shape, t.to_f32()});
    return out;
}

// Everything the tests read, loaded once per binary on first use.
struct Fixture {
    HeadConfig cfg;
    SafetensorsFile head_file;
    Checkpoint model;
    std::unique_ptr<JointHead> head;
    json cases, probe;
    fs::path tmp;

    Fixture() {
        cfg = load_head_config(kDir + "/joint_head_config.json");
        head_file = SafetensorsFile::open(kDir + "/joint_head.safetensors");
        model = Checkpoint::open(kDir + "/model.safetensors");
        head = std::make_unique<JointHead>(cfg, head_file, model.get("lm_head.weight"));
        cases = read_json(kDir + "/cases.json");
        probe = read_json(kDir + "/head_probe.json");
        tmp = fs::temp_directory_path() / ("clef_test_head_" + std::to_string(::getpid()));
        fs::create_directories(tmp);
    }
    ~Fixture() {
        std::error_code ec;
        fs::remove_all(tmp, ec);
    }
};

const Fixture& fixture() {
    static const Fixture f;
    return f;
}

class HeadTest : public ::testing::Test {
protected:
    void SetUp() override {
        const Fixture& f = fixture();
        cfg_ = f.cfg;
        head_file_ = &f.head_file;
        head_ = f.head.get();
        cases_ = &f.cases;
        probe_ = &f.probe;
        tmp_ = f.tmp;
    }

    static const TensorView& lm_head() { return fixture().model.get("lm_head.weight"); }
    const json& find_case(const std::string& name) const {
        for (const json& c : cases_->at("cases"))
            if (c.at("name") == name) return c;
        throw std::runtime_error("no case " + name);
    }

    HeadConfig cfg_;
    const SafetensorsFile* head_file_ = nullptr;
    const JointHead* head_ = nullptr;
    const json* cases_ = nullptr;
    const json* probe_ = nullptr;
    fs::path tmp_;
};

TEST_F(HeadTest, DerivedScalars) {
    // README: prior_logit_scale 0.5 -> P = e^0.5; joint_logit_scale 4.75 is clamped at ln 100 -> J = 100 (not
    // e^4.75 = 115.6); sigmoid(residual_gate = -2) = 0.1192.
    EXPECT_NEAR(head_->prior_scale(), std::exp(0.5), 1e-6);
    EXPECT_NEAR(head_->joint_scale(), 100.0, 1e-5);
    EXPECT_NEAR(head_->residual_gate(), 1.0 / (1.0 + std::exp(2.0)), 1e-7);
    EXPECT_NEAR(head_->residual_gate(), 0.1192, 1e-4);
    const json& d = probe_->at("derived_scales");
    EXPECT_NEAR(head_->prior_scale(), d.at("prior_scale").get<double>(), 1e-6);
    EXPECT_NEAR(head_->joint_scale(), d.at("joint_scale").get<double>(), 1e-5);
    EXPECT_NEAR(head_->residual_gate(), d.at("residual_gate_sigmoid").get<double>(), 1e-7);
    EXPECT_EQ(head_->vocab_size(), 320);
}

TEST_F(HeadTest, ProbeBasicMixed) {
    ASSERT_EQ(probe_->at("case").get<std::string>(), "basic_mixed");
    const CaseInput in = case_input(find_case("basic_mixed"));
    HeadTrace tr;
    head_->logits(in.hidden.data(), in.T, in.ids, in.questions, &tr);

    std::map<std::string, std::vector<const std::vector<float>*>> got;
    got["memory_projection"] = {&tr.memory_projection};
    got["question_projection"] = {&tr.question_projection};
    got["global_projection"] = {&tr.global_projection};
    for (size_t k = 0; k < tr.evidence_layers.size(); ++k)
        got["evidence_layers." + std::to_string(k)] = {&tr.evidence_layers[k]};
    got["option_summary_norm"] = {&tr.option_summary_norm};
    for (size_t k = 0; k < tr.layers.size(); ++k) got["layers." + std::to_string(k)] = {&tr.layers[k]};
    got["field_norm"] = {&tr.field_norm};
    for (const auto& v : tr.option_norm) got["option_norm"].push_back(&v);
    for (const auto& v : tr.residual_scorer) got["residual_scorer"].push_back(&v);

    const json& modules = probe_->at("modules");
    EXPECT_EQ(modules.size(), got.size());
    double worst = 0.0;
    for (auto it = modules.begin(); it != modules.end(); ++it) {
        auto g = got.find(it.key());
        ASSERT_NE(g, got.end()) << "probe entry " << it.key() << " is not traced";
        ASSERT_EQ(g->second.size(), it.value().size()) << it.key() << ": number of calls";
        double m = 0.0;
        for (size_t call = 0; call < g->second.size(); ++call)
            m = std::max(m, max_abs_diff(*g->second[call], it.value()[call], it.key()));
        std::printf("[ probe ] %-22s max|diff| = %.3g\n", it.key().c_str(), m);
        EXPECT_LE(m, kProbeTol) << it.key();
        worst = std::max(worst, m);
    }
    RecordProperty("probe_max_abs_diff", std::to_string(worst));
}

// The answered cases of cases.json, listed so that each is its own test (AnsweredCasesAreListed checks the
// list).
const std::vector<std::string> kAnswered = {
    "basic_mixed",
    "instructions_fallback_and_json",
    "json_state_rendering",
    "nfc_normalisation",
    "special_tokens_in_text",
    "choice_1_and_40_options",
    "score_10_levels_numeric_ids",
    "long_state_truncated",
};

TEST_F(HeadTest, AnsweredCasesAreListed) {
    std::set<std::string> answered;
    for (const json& c : cases_->at("cases"))
        if (!c.contains("expected_error")) answered.insert(c.at("name").get<std::string>());
    EXPECT_EQ(answered, std::set<std::string>(kAnswered.begin(), kAnswered.end()));
}

class HeadCaseTest : public HeadTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(HeadCaseTest, LogitsAndProbabilities) {
    const json& c = find_case(GetParam());
    const CaseInput in = case_input(c);
    const auto logits = head_->logits(in.hidden.data(), in.T, in.ids, in.questions);
    const json& qs = c.at("questions");
    ASSERT_EQ(logits.size(), qs.size());
    double dl = 0.0, dp = 0.0;
    for (size_t i = 0; i < qs.size(); ++i) {
        ASSERT_EQ(logits[i].size(), qs[i].at("option_spans").size());
        dl = std::max(dl, max_abs_diff(logits[i], qs[i].at("logits"), "logits"));
        std::vector<float> p = logits[i];
        ops::softmax_inplace(p.data(), static_cast<int64_t>(p.size()));
        dp = std::max(dp, max_abs_diff(p, qs[i].at("probabilities"), "probabilities"));
    }
    std::printf("[ case  ] %-32s T=%5lld Q=%zu  max|dlogit| = %.3g  max|dprob| = %.3g\n", GetParam().c_str(),
                static_cast<long long>(in.T), qs.size(), dl, dp);
    RecordProperty("max_abs_logit_diff", std::to_string(dl));
    RecordProperty("max_abs_prob_diff", std::to_string(dp));
    EXPECT_LE(dl, kLogitTol);
    EXPECT_LE(dp, kProbTol);
}

INSTANTIATE_TEST_SUITE_P(Cases, HeadCaseTest, ::testing::ValuesIn(kAnswered),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST_F(HeadTest, StreamedFeaturesMatchOneShot) {
    const CaseInput in = case_input(find_case("choice_1_and_40_options"));
    const auto whole = head_->logits(in.hidden.data(), in.T, in.ids, in.questions);
    HeadFeatureBuilder b(*head_, in.T, in.ids, in.questions), partial(*head_, in.T, in.ids, in.questions);
    const int64_t H = cfg_.hidden_size;
    const int64_t blocks[] = {1, 7, 63, 64, 200};
    int64_t pos = 0;
    for (int64_t n : blocks) {
        b.add_rows(in.hidden.data() + pos * H, n);
        partial.add_rows(in.hidden.data() + pos * H, n);
        pos += n;
    }
    expect_error([&] { partial.finish(); }, {"only 335 of"});
    b.add_rows(in.hidden.data() + pos * H, in.T - pos);
    expect_error([&] { b.add_rows(in.hidden.data(), 1); }, {"more hidden rows"});
    const auto streamed = head_->decide(b.finish(), in.questions);
    EXPECT_EQ(streamed, whole);  // per-row work and span sums are order-identical: bit for bit
}

TEST_F(HeadTest, F32HeadFileGivesSameLogits) {
    const std::string path = (tmp_ / "head_f32.safetensors").string();
    write_safetensors(path, head_tensors_f32(*head_file_));
    const SafetensorsFile f = SafetensorsFile::open(path);
    const JointHead h32(cfg_, f, lm_head());
    const CaseInput in = case_input(find_case("basic_mixed"));
    EXPECT_EQ(h32.logits(in.hidden.data(), in.T, in.ids, in.questions),
              head_->logits(in.hidden.data(), in.T, in.ids, in.questions));
}

// A quantised lm_head (QuantMatrix, as a GGUF model passes it): the same logits, bit for bit, as the
// TensorView head over the dequantised table written as F32; a table of the wrong width is refused.
TEST_F(HeadTest, QuantMatrixLmHeadGivesSameLogits) {
    const std::vector<float> lm = lm_head().to_f32();
    const int64_t rows = lm_head().shape[0], cols = lm_head().shape[1];
    std::vector<uint8_t> q(rows *
                           ggml_row_bytes(ggml_type_traits(static_cast<uint32_t>(GgmlType::Q8_0)), cols));
    quantize_row(GgmlType::Q8_0, lm.data(), q.data(), rows * cols);
    OutTensor deq{"lm_head.weight", {rows, cols}, std::vector<float>(lm.size())};
    dequantize_ref(GgmlType::Q8_0, q.data(), deq.data.data(), rows * cols);
    const std::string path = (tmp_ / "lm_head_q8_dequantised.safetensors").string();
    write_safetensors(path, {deq});
    const SafetensorsFile f = SafetensorsFile::open(path);
    QuantMatrix m;
    m.type = GgmlType::Q8_0;
    m.data = q.data();
    m.rows = rows;
    m.cols = cols;
    const JointHead hq(cfg_, *head_file_, m), hf(cfg_, *head_file_, *f.find("lm_head.weight"));
    EXPECT_EQ(hq.vocab_size(), rows);
    const CaseInput in = case_input(find_case("basic_mixed"));
    EXPECT_EQ(hq.logits(in.hidden.data(), in.T, in.ids, in.questions),
              hf.logits(in.hidden.data(), in.T, in.ids, in.questions));
    m.cols = 32;  // not the hidden size
    expect_error([&] { JointHead(cfg_, *head_file_, m); }, {"lm_head", "32 columns", "hidden_size 64"});
}

TEST_F(HeadTest, DoctoredHeadFilesAreRefused) {
    const auto base = head_tensors_f32(*head_file_);
    auto write = [&](const std::string& name, const std::function<void(std::vector<OutTensor>&)>& edit) {
        auto ts = base;
        edit(ts);
        const std::string path = (tmp_ / name).string();
        write_safetensors(path, ts);
        return path;
    };
    auto find = [](std::vector<OutTensor>& ts, const std::string& name) -> OutTensor& {
        for (auto& t : ts)
            if (t.name == name) return t;
        throw std::runtime_error("no tensor " + name);
    };

    // Wrong shape: memory_projection.weight [32, 63] instead of [32, 64].
    const std::string bad_shape = write("bad_shape.safetensors", [&](auto& ts) {
        OutTensor& t = find(ts, "memory_projection.weight");
        t.shape = {32, 63};
        t.data.resize(32 * 63);
    });
    expect_error([&] { JointHead(cfg_, SafetensorsFile::open(bad_shape), lm_head()); },
                 {bad_shape, "memory_projection.weight", "[32, 63]", "[32, 64]"});

    // Wrong in_proj shape of one attention.
    const std::string bad_attn = write("bad_attn.safetensors", [&](auto& ts) {
        OutTensor& t = find(ts, "layers.2.multihead_attn.in_proj_weight");
        t.shape = {32, 96};
    });
    expect_error([&] { JointHead(cfg_, SafetensorsFile::open(bad_attn), lm_head()); },
                 {"layers.2.multihead_attn.in_proj_weight", "[32, 96]", "[96, 32]"});

    // A scalar stored as [1] instead of 0-dim.
    const std::string bad_scalar =
        write("bad_scalar.safetensors", [&](auto& ts) { find(ts, "joint_logit_scale").shape = {1}; });
    expect_error([&] { JointHead(cfg_, SafetensorsFile::open(bad_scalar), lm_head()); },
                 {"joint_logit_scale", "[1]", "[]"});

    // Missing tensor.
    const std::string missing = write("missing.safetensors", [&](auto& ts) {
        ts.erase(std::remove_if(ts.begin(), ts.end(),
                                [](const OutTensor& t) { return t.name == "option_norm.bias"; }),
                 ts.end());
    });
    expect_error([&] { JointHead(cfg_, SafetensorsFile::open(missing), lm_head()); },
                 {"missing tensor option_norm.bias"});

    // Unexpected extra tensor (strict load), e.g. a third routing layer the config does not have.
    const std::string extra = write("extra.safetensors", [&](auto& ts) {
        ts.push_back({"evidence_layers.2.query_norm.weight", {32}, std::vector<float>(32, 1.f)});
    });
    expect_error([&] { JointHead(cfg_, SafetensorsFile::open(extra), lm_head()); },
                 {"unexpected tensor evidence_layers.2.query_norm.weight"});

    // Config that disagrees with the file: width 32 but 8 layers requested.
    HeadConfig more = cfg_;
    more.layers = 8;
    expect_error([&] { JointHead(more, *head_file_, lm_head()); }, {"missing tensor layers.4."});
    HeadConfig odd = cfg_;
    odd.heads = 5;
    expect_error([&] { JointHead(odd, *head_file_, lm_head()); }, {"not divisible by heads 5"});
}

TEST_F(HeadTest, BadLmHeadIsRefused) {
    TensorView t = lm_head();
    t.shape = {320, 63};
    expect_error([&] { JointHead(cfg_, *head_file_, t); }, {"lm_head.weight", "[320, 63]", "[vocab, 64]"});
    t = lm_head();
    t.dtype = DType::I16;
    expect_error([&] { JointHead(cfg_, *head_file_, t); }, {"lm_head.weight", "I16"});
}

TEST_F(HeadTest, BadQuestionsAreRefused) {
    const CaseInput in = case_input(find_case("basic_mixed"));
    auto run = [&](const std::vector<HeadQuestion>& qs, const std::vector<int32_t>& ids) {
        head_->logits(in.hidden.data(), in.T, ids, qs);
    };
    const std::string T = std::to_string(in.T);
    {
        auto qs = in.questions;
        qs[0].span_end = static_cast<int>(in.T) + 1;
        expect_error([&] { run(qs, in.ids); }, {"question 0 span", "out of range for " + T + " tokens"});
    }
    {
        auto qs = in.questions;
        qs[1].span_begin = -1;
        expect_error([&] { run(qs, in.ids); }, {"question 1 span [-1,", "out of range"});
    }
    {
        auto qs = in.questions;
        qs[2].span_end = qs[2].span_begin;
        expect_error([&] { run(qs, in.ids); }, {"question 2 span", "is empty"});
    }
    {
        auto qs = in.questions;
        qs[1].option_spans.clear();
        expect_error([&] { run(qs, in.ids); }, {"question 1 has no options"});
    }
    {
        auto qs = in.questions;
        qs[1].option_spans[2] = {qs[1].option_spans[2].first, static_cast<int>(in.T) + 5};
        expect_error([&] { run(qs, in.ids); }, {"question 1 option 2 span", "out of range"});
    }
    {
        auto qs = in.questions;
        qs[0].option_spans[1].second = qs[0].option_spans[1].first;
        expect_error([&] { run(qs, in.ids); }, {"question 0 option 1 span", "is empty"});
    }
    {
        auto qs = in.questions;
        qs[0].type = 3;
        expect_error([&] { run(qs, in.ids); }, {"question 0: type 3"});
    }
    expect_error([&] { run({}, in.ids); }, {"no questions"});
    {
        auto ids = in.ids;
        ids.pop_back();
        expect_error([&] { run(in.questions, ids); }, {"input ids for " + T + " positions"});
    }
    {
        auto ids = in.ids;
        const int p = in.questions[0].option_spans[0].first;
        ids[p] = 320;
        expect_error([&] { run(in.questions, ids); },
                     {"input id 320 at position " + std::to_string(p), "vocabulary of 320"});
    }
    expect_error([&] { head_->logits(nullptr, in.T, in.ids, in.questions); }, {"no hidden states"});
    expect_error([&] { head_->logits(in.hidden.data(), 0, {}, in.questions); }, {"empty sequence"});
}

}  // namespace
}  // namespace clef
