// clef eval's statistics (src/tools/eval_stats.h) against hand-computed values, temperature fitting on
// synthetic logits with a known temperature, calibration files applied by the engine and the server
// (decision/answer.h), and --fit-temperature recovering a known temperature from the tiny model's own logits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "decision/answer.h"
#include "decision/engine.h"
#include "ops/basic.h"
#include "test_server_util.h"
#include "test_util.h"
#include "tools/eval_stats.h"
#include "util/error.h"
#include "util/json.h"

using namespace clef;
using namespace clef::eval;

namespace {

// A directory of its own under the system's temporary directory, removed at the end of the test.
struct TempDir {
    std::string path;
    TempDir() {
        path = (std::filesystem::temp_directory_path() /
                ("clef-test-eval-" + std::to_string(::getpid()) + "-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                   .string();
        std::filesystem::create_directories(path);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

Item item(QuestionType type, std::vector<std::string> options, std::vector<double> probs, int expected) {
    Item it;
    it.type = type;
    it.options = std::move(options);
    it.probs = std::move(probs);
    it.expected = expected;
    return it;
}

using clef::testing::softmax_ref;

}  // namespace

TEST(EvalStats, WilsonIntervalMatchesPublishedValues) {
    const Interval a = wilson_interval(8, 10);
    EXPECT_NEAR(a.lo, 0.4902, 1e-4);
    EXPECT_NEAR(a.hi, 0.9433, 1e-4);
    const Interval b = wilson_interval(0, 10);  // lo 0, hi z^2 / (n + z^2)
    EXPECT_EQ(b.lo, 0.0);
    EXPECT_NEAR(b.hi, 3.8415 / 13.8415, 1e-4);
}

TEST(EvalStats, McNemarExactIsTheTwoSidedBinomialTail) {
    EXPECT_DOUBLE_EQ(mcnemar_exact_p(0, 5), 2.0 / 32);
    EXPECT_NEAR(mcnemar_exact_p(1, 9), 22.0 / 1024, 1e-12);  // 2 (C(10,0) + C(10,1)) / 2^10
    EXPECT_DOUBLE_EQ(mcnemar_exact_p(3, 3), 1.0);
    EXPECT_DOUBLE_EQ(mcnemar_exact_p(0, 0), 1.0);
}

TEST(EvalStats, PercentileIsNearestRank) {
    std::vector<double> v(100);
    std::iota(v.begin(), v.end(), 1.0);
    EXPECT_EQ(percentile(v, 50), 50);
    EXPECT_EQ(percentile(v, 95), 95);
    EXPECT_EQ(percentile(v, 99), 99);
    EXPECT_EQ(percentile({5, 1, 3}, 50), 3);
    EXPECT_EQ(percentile({}, 50), 0);
}

TEST(EvalStats, MetricsOfAHandWorkedSet) {
    const std::vector<Item> items = {
        item(QuestionType::Choice, {"a", "b", "c"}, {0.7, 0.2, 0.1}, 0),    // right, confidence 0.7
        item(QuestionType::Choice, {"a", "b", "c"}, {0.25, 0.65, 0.1}, 0),  // wrong (b), confidence 0.65
        item(QuestionType::Choice, {"a", "b", "c"}, {0.1, 0.15, 0.75}, 2),  // right, confidence 0.75
        item(QuestionType::Choice, {"a", "b", "c"}, {0.3, 0.3, 0.4}, -1),   // unlabelled: left out
    };
    std::vector<const Item*> ptr;
    for (const Item& it : items) ptr.push_back(&it);
    const Metrics m = compute_metrics(ptr);
    EXPECT_EQ(m.n, 3u);
    EXPECT_EQ(m.correct, 2u);
    EXPECT_NEAR(m.log_loss, -(std::log(0.7) + std::log(0.25) + std::log(0.75)) / 3, 1e-12);
    const double brier = (0.09 + 0.04 + 0.01) + (0.5625 + 0.4225 + 0.01) + (0.01 + 0.0225 + 0.0625);
    EXPECT_NEAR(m.brier, brier / 3, 1e-12);
    // Bin 6 holds 0.65 (wrong), bin 7 holds 0.7 and 0.75 (both right).
    EXPECT_EQ(m.reliability[6].n, 1u);
    EXPECT_EQ(m.reliability[7].n, 2u);
    EXPECT_NEAR(m.ece, 1.0 / 3 * 0.65 + 2.0 / 3 * (1 - 0.725), 1e-12);
    // Confusion over a, b, c: a->a, a->b, c->c. F1: a 2/3, b 0, c 1.
    ASSERT_EQ(m.labels, (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(m.confusion[0], (std::vector<size_t>{1, 1, 0}));
    EXPECT_EQ(m.confusion[2], (std::vector<size_t>{0, 0, 1}));
    EXPECT_NEAR(m.macro_f1, (2.0 / 3 + 0 + 1) / 3, 1e-12);
}

TEST(EvalStats, ScoreLevelErrors) {
    const Item a = item(QuestionType::Score, {"0", "1", "2"}, {0.2, 0.5, 0.3}, 2);  // argmax 1, E = 1.1
    const Item b = item(QuestionType::Score, {"0", "1", "2"}, {0.6, 0.3, 0.1}, 0);  // argmax 0, E = 0.5
    const Metrics m = compute_metrics({&a, &b});
    EXPECT_NEAR(m.mae_level, 0.5, 1e-12);
    EXPECT_NEAR(m.mae_expected_score, (0.9 + 0.5) / 2, 1e-12);
}

TEST(EvalStats, AgreementAndPairedCounts) {
    const Item a1 = item(QuestionType::Noul, {"true", "false"}, {0.9, 0.1}, 0);
    const Item b1 = item(QuestionType::Noul, {"true", "false"}, {0.8, 0.2}, 0);
    const Item a2 = item(QuestionType::Noul, {"true", "false"}, {0.6, 0.4}, 1);
    const Item b2 = item(QuestionType::Noul, {"true", "false"}, {0.3, 0.7}, 1);
    const Agreement g = compare({&a1, &a2}, {&b1, &b2});
    EXPECT_EQ(g.n, 2u);
    EXPECT_EQ(g.agreeing, 1u);
    EXPECT_NEAR(g.mean_abs_dp, (0.1 + 0.3) / 2, 1e-12);
    EXPECT_NEAR(g.max_abs_dp, 0.3, 1e-12);
    EXPECT_EQ(g.only_a, 0u);
    EXPECT_EQ(g.only_b, 1u);
    EXPECT_DOUBLE_EQ(g.p_value, 1.0);
}

// Labels sampled from softmax(logits / T0): the fit recovers T0 (over- and under-confident models).
TEST(EvalStats, FitTemperatureRecoversKnownTemperature) {
    for (double t0 : {1.8, 0.6}) {
        std::mt19937 rng(20261204);
        std::normal_distribution<double> logit(0.0, 3.0);
        std::vector<Example> examples(20000);
        for (Example& e : examples) {
            e.logits.resize(4);
            for (double& l : e.logits) l = logit(rng);
            const std::vector<double> p = softmax_ref(e.logits, t0);
            e.label = static_cast<int>(std::discrete_distribution<int>(p.begin(), p.end())(rng));
        }
        const double t = fit_temperature(examples);
        EXPECT_NEAR(t / t0, 1.0, 0.05) << "T0 " << t0 << " fitted " << t;
        EXPECT_LT(mean_log_loss(examples, t), mean_log_loss(examples, 1.0));
        for (double cv : cross_validated_temperatures(examples, 5)) ASSERT_NEAR(cv / t0, 1.0, 0.05);
    }
    EXPECT_EQ(fit_temperature({}), 1.0);
}

TEST(Calibration, TemperatureDividesTheLogitsBeforeTheSoftmax) {
    const std::vector<float> logits = {2.966f, 3.31f, 3.688f};
    AnswerOptions opt;
    EXPECT_EQ(answer_probabilities(logits, QuestionType::Choice, opt), ops::softmax_f32(logits));
    opt.temperature = {1.0, 2.0, 0.5};
    const std::vector<double> want = softmax_ref({2.966, 3.31, 3.688}, 2.0);
    const std::vector<float> got = answer_probabilities(logits, QuestionType::Choice, opt);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6);
    EXPECT_EQ(answer_probabilities(logits, QuestionType::Noul, opt), ops::softmax_f32(logits));
}

TEST(Calibration, FileRoundTripAndPreciseErrors) {
    TempDir dir;
    const std::string path = dir.path + "/cal.json";
    std::ofstream(path) << write_json(calibration_json({1.5, 2.0, 0.75}));
    AnswerOptions opt;
    load_calibration(path, opt);
    EXPECT_EQ(opt.temperature, (std::array<double, 3>{1.5, 2.0, 0.75}));
    EXPECT_EQ(opt.calibration, "cal.json");
    const std::pair<std::string, std::string> bad[] = {
        {R"({"format":"other","temperature":{}})", "not a calibration file"},
        {R"({"format":"clef-calibration v1","temperature":{"maybe":2}})", "unknown question type 'maybe'"},
        {R"({"format":"clef-calibration v1","temperature":{"noul":-1}})", "must be a positive number"},
        {R"({"format":"clef-calibration v1"})", "\"temperature\" must be an object"},
        {"{", "cal.json"},
    };
    for (const auto& [text, message] : bad) {
        std::ofstream(path, std::ios::trunc) << text;
        try {
            load_calibration(path, opt);
            ADD_FAILURE() << "accepted " << text;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
        }
    }
}

// The server applies a calibration file and names it in x-clef-calibration; without one the header is absent.
TEST(Calibration, ServerAppliesItAndSaysSo) {
    const JsonValue& c = clef::testing::tiny_case("basic_mixed");
    const std::string body = c.find("request_body")->as_string();
    ServerOptions opt;
    opt.answers.temperature = {3.0, 0.5, 1.0};
    opt.answers.calibration = "cal.json";
    clef::testing::RunningServer server(opt);
    auto res = server.client().Post("/v1/systemone", body, "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("x-clef-calibration"), "cal.json");
    const JsonValue r = parse_json_or_throw(res->body, "response");
    const auto& qs = c.find("questions")->items();
    auto golden_logits = [&](size_t i) {
        std::vector<double> l;
        for (const auto& v : qs[i].find("logits")->items()) l.push_back(v.as_double());
        return l;
    };
    EXPECT_NEAR(r.find("answers")->find("is_bug")->find("noul")->as_double(),
                softmax_ref(golden_logits(0), 3.0)[0], 2e-4);
    const std::vector<double> team = softmax_ref(golden_logits(1), 0.5);  // billing, engineering, sales
    EXPECT_NEAR(r.find("answers")->find("team")->find("probabilities")->find("sales")->as_double(), team[2],
                2e-4);

    clef::testing::RunningServer plain{ServerOptions{}};
    auto res2 = plain.client().Post("/v1/systemone", body, "application/json");
    ASSERT_TRUE(res2);
    EXPECT_FALSE(res2->has_header("x-clef-calibration"));
}

TEST(EvalCli, RefusesABadExpectationWithOneLine) {
    TempDir dir;
    const std::string data = dir.path + "/data.jsonl";
    std::ofstream(data) << R"({"model":"m","state":"x","questions":{"q":{"type":"choice","instructions":"?",)"
                        << R"("criteria":{"a":null,"b":null}}},"expected":{"q":"c"}})"
                        << "\n";
    int status = 0;
    const std::string out =
        clef::testing::run_command(std::string(CLEF_BINARY) + " eval --model " +
                                       clef::testing::data_path("tiny-clef") + " --data " + data + " 2>&1",
                                   status);
    EXPECT_EQ(WEXITSTATUS(status), 2);
    EXPECT_EQ(out, "clef: " + data +
                       ":1: expected.q: \"c\" is not an option of choice question q (noul: true/false, "
                       "choice: an option id, score: a level index)\n");
}

// A model compared with itself agrees everywhere with |dp| 0; the report and the summary are written.
TEST(EvalCli, AModelAgainstItselfAndTheReportFiles) {
    TempDir dir;
    const JsonValue& c = clef::testing::tiny_case("basic_mixed");
    {
        std::string body = c.find("request_body")->as_string();
        body.pop_back();  // the closing brace
        std::ofstream(dir.path + "/data.jsonl")
            << body << R"(, "expected": {"is_bug": false, "team": "sales"}})"
            << "\n";
    }
    const std::string model = clef::testing::data_path("tiny-clef");
    int status = 0;
    const std::string out = clef::testing::run_command(
        std::string(CLEF_BINARY) + " eval --model " + model + " --compare " + model + " --data " + dir.path +
            "/data.jsonl --report " + dir.path + "/r 2>/dev/null",
        status);
    ASSERT_EQ(WEXITSTATUS(status), 0);
    const JsonValue s = parse_json_or_throw(out, "summary");
    const JsonValue& g = *s.find("compare")->find("agreement")->find("overall");
    EXPECT_EQ(g.find("questions")->as_int64(), 3);
    EXPECT_EQ(g.find("agreeing")->as_int64(), 3);
    EXPECT_EQ(g.find("max_abs_dp")->as_double(), 0.0);
    EXPECT_EQ(g.find("mcnemar")->find("p_value")->as_double(), 1.0);
    // Golden: is_bug P(true) 0.3996 (false is right), team: sales 0.4606 is the maximum.
    EXPECT_EQ(s.find("model")->find("metrics")->find("overall")->find("correct")->as_int64(), 2);
    EXPECT_EQ(clef::testing::read_file(dir.path + "/r/summary.json"), out);
    EXPECT_NE(clef::testing::read_file(dir.path + "/r/index.html").find("id=\"reliability-choice\""),
              std::string::npos);
}
