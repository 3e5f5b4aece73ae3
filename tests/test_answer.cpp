// Answers: Python rounding, the reference answer shapes, and the confidence conventions checked against the
// numbers the hosted service and Ollama published (docs/API.md "Confidence conventions"), not against our own
// output.
#include <gtest/gtest.h>

#include <cmath>

#include "decision/answer.h"
#include "ops/basic.h"

using namespace clef;

TEST(PythonRound, MatchesCPython) {
    EXPECT_DOUBLE_EQ(python_round(0.39964091777801514, 4), 0.3996);
    EXPECT_DOUBLE_EQ(python_round(2.675, 2), 2.67);      // 2.675 is 2.67499999... in binary
    EXPECT_DOUBLE_EQ(python_round(0.03125, 4), 0.0312);  // exact tie: to even
    EXPECT_DOUBLE_EQ(python_round(0.09375, 4), 0.0938);  // exact tie: to even
    EXPECT_DOUBLE_EQ(python_round(1.28125, 4), 1.2812);
    EXPECT_DOUBLE_EQ(python_round(0.99995, 4), 1.0);  // 0.99995 is 0.9999500000000000055 in binary
    EXPECT_DOUBLE_EQ(python_round(0.99996, 4), 1.0);
    EXPECT_EQ(python_round(-0.00001, 4), 0.0);
    EXPECT_TRUE(std::signbit(python_round(-0.00001, 4)));  // Python: round(-1e-05, 4) == -0.0
}

TEST(Softmax, Float32) {
    auto p = ops::softmax_f32({1.f, 2.f, 3.f});
    EXPECT_NEAR(p[0], 0.09003057f, 1e-7);
    EXPECT_NEAR(p[1], 0.24472847f, 1e-7);
    EXPECT_NEAR(p[2], 0.66524096f, 1e-7);
    auto big = ops::softmax_f32({1000.f, 1000.f});
    EXPECT_FLOAT_EQ(big[0], 0.5f);
}

TEST(Confidence, PublishedNumbers) {
    // TypeSafe's score formula, live and README examples.
    // The note rounds it to 0.858 (Jev answered 0.86); exactly 1 - 0.17 / 1.2.
    EXPECT_NEAR(confidence({0, 0, .01, .83, .16}, QuestionType::Score, ConfidenceConvention::TypeSafe), 1 - 0.17 / 1.2,
                1e-12);
    EXPECT_NEAR(confidence({.005, .005, .04, .25, .70}, QuestionType::Score, ConfidenceConvention::TypeSafe),
                0.6958333333333333, 1e-12);
    EXPECT_NEAR(confidence({0, .95, .05}, QuestionType::Score, ConfidenceConvention::TypeSafe), 0.925, 1e-12);
    EXPECT_NEAR(confidence({.02, .88, .10}, QuestionType::Score, ConfidenceConvention::TypeSafe), 0.82, 1e-12);
    // TypeSafe's choice formula: (0.92 - 1/3)/(2/3) = 0.88; (0.89 - 0.5)/0.5 = 0.78.
    EXPECT_NEAR(confidence({.92, .06, .02}, QuestionType::Choice, ConfidenceConvention::TypeSafe), 0.88, 1e-12);
    EXPECT_NEAR(confidence({.89, .11}, QuestionType::Choice, ConfidenceConvention::TypeSafe), 0.78, 1e-12);
    // Ollama's documented example (normalised entropy): 0.8906, from probabilities shown to 4 decimals.
    EXPECT_NEAR(confidence({.0125, .9781, .0093}, QuestionType::Choice, ConfidenceConvention::Entropy), 0.8906, 5e-4);
    // colibri: (n peak - 1)/(n - 1); Workers AI: normalised purity.
    EXPECT_NEAR(confidence({.7, .2, .1}, QuestionType::Choice, ConfidenceConvention::Colibri), 0.55, 1e-12);
    EXPECT_NEAR(confidence({.7, .2, .1}, QuestionType::Choice, ConfidenceConvention::WorkersAI),
                (0.49 + 0.04 + 0.01 - 1.0 / 3) / (1 - 1.0 / 3), 1e-12);
    EXPECT_DOUBLE_EQ(confidence({.7, .2, .1}, QuestionType::Choice, ConfidenceConvention::Reference), 0.7);
    EXPECT_DOUBLE_EQ(confidence({1.0}, QuestionType::Choice, ConfidenceConvention::TypeSafe), 1.0);
    EXPECT_DOUBLE_EQ(confidence({1.0}, QuestionType::Score, ConfidenceConvention::Entropy), 1.0);
}

TEST(Confidence, Names) {
    ConfidenceConvention c;
    for (const auto& n : confidence_convention_names()) EXPECT_TRUE(parse_confidence_convention(n, c)) << n;
    EXPECT_FALSE(parse_confidence_convention("max", c));
}

TEST(Answer, ChoiceKeepsRequestOrderAndFirstMaximum) {
    Question q;
    q.id = "pick";
    q.type = QuestionType::Choice;
    q.answer_order = {"zeta", "alpha", "mid"};
    EncodedQuestion eq;
    eq.option_ids = {"alpha", "mid", "zeta"};  // encoded order is sorted
    // alpha and zeta tie: zeta comes first in request order, so it wins.
    JsonValue a = make_answer(q, eq, {0.4f, 0.2f, 0.4f});
    EXPECT_EQ(a.find("choice")->as_string(), "zeta");
    const auto& probs = a.find("probabilities")->members();
    ASSERT_EQ(probs.size(), 3u);
    EXPECT_EQ(probs[0].first, "zeta");
    EXPECT_EQ(probs[1].first, "alpha");
    EXPECT_EQ(probs[2].first, "mid");
    EXPECT_EQ(write_json(a), R"({"type":"choice","choice":"zeta","confidence":0.4,"probabilities":{"zeta":0.4,"alpha":0.4,"mid":0.2}})");
}

TEST(Answer, ScoreExpectedLevelAndLegend) {
    Question q;
    q.id = "s";
    q.type = QuestionType::Score;
    q.answer_order = {"0", "1", "2"};
    q.criteria = JsonValue::array({JsonValue::string("low"), JsonValue::null(), JsonValue::integer(7)});
    EncodedQuestion eq;
    eq.option_ids = {"0", "1", "2"};
    JsonValue a = make_answer(q, eq, {0.25f, 0.25f, 0.5f});
    EXPECT_EQ(write_json(a),
              R"({"type":"score","score":1.25,"confidence":0.5,"legend":{"0":"low","1":null,"2":7},"probabilities":{"0":0.25,"1":0.25,"2":0.5}})");
    Question n;
    n.id = "n";
    n.type = QuestionType::Noul;
    n.answer_order = {"true", "false"};
    EncodedQuestion en;
    en.option_ids = {"true", "false"};
    EXPECT_EQ(write_json(make_answer(n, en, {0.75f, 0.25f})), R"({"type":"noul","noul":0.75})");
    EXPECT_THROW(make_answer(n, en, std::vector<float>{std::nanf(""), 0.5f}), clef::Error);
}
