// The statistics of `clef eval` (docs/EVAL.md): accuracy with Wilson intervals, calibration (log loss, Brier
// score, ECE and reliability bins), macro-F1 and the confusion matrix of choice questions, the level error of
// score questions, agreement between two models with an exact McNemar test, latency percentiles, and
// temperature scaling (one temperature per question type, fitted by a 1-D search, cross-validated).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "decision/request.h"
#include "util/json.h"

namespace clef::eval {

// One decided question.
struct Item {
    size_t line = 0;       // 0-based line of the data file
    std::string question;  // question id
    QuestionType type = QuestionType::Noul;
    std::vector<std::string> options;   // answer order: noul true, false; choice request order; score levels
    std::vector<double> logits, probs;  // per option, answer order
    int expected = -1;                  // option index; -1 without an expectation
};
// The predicted option: the first maximum of probs (as the answer's `choice`).
int predicted(const Item& it);

struct Interval {
    double lo = 0, hi = 0;
};
// The Wilson score interval of a proportion (95 % by default).
Interval wilson_interval(size_t successes, size_t n, double z = 1.959963984540054);
// Two-sided exact McNemar test: b and c are the discordant pairs; p = min(1, 2 P(X <= min(b, c))), X ~
// Bin(b+c, 1/2).
double mcnemar_exact_p(size_t b, size_t c);
// Nearest-rank percentile (q in (0, 100]): the ceil(q/100 n)-th smallest value; 0 for no values.
double percentile(std::vector<double> values, double q);

constexpr int kBins = 10;
struct Bin {
    size_t n = 0;
    double confidence = 0, accuracy = 0;  // means over the bin's items
};

struct Metrics {
    size_t n = 0, correct = 0;  // labelled items
    double accuracy = 0;
    Interval ci95;
    double log_loss = 0, brier = 0, ece = 0;
    std::array<Bin, kBins> reliability{};  // bin b: confidence in [b/10, (b+1)/10), the last one closed
    // Choice questions: labels (option ids, sorted) and counts [expected][predicted].
    std::vector<std::string> labels;
    std::vector<std::vector<size_t>> confusion;
    double macro_f1 = 0;
    // Score questions: mean |argmax level - expected| and mean |expected score - expected|.
    double mae_level = 0, mae_expected_score = 0;
};
// Metrics of the labelled items. The confusion matrix and F1 are filled for choice items, the level errors
// for score items (the others are left out of them).
Metrics compute_metrics(const std::vector<const Item*>& items);
// {n, correct, accuracy, ci95, log_loss, brier, ece, reliability[, macro_f1, confusion][, mae_level,
// mae_expected_score]}; null for what is undefined (n = 0).
JsonValue metrics_json(const Metrics& m, bool choice, bool score);

// Two models on the same questions (pairs a[i], b[i]).
struct Agreement {
    size_t n = 0, agreeing = 0;              // decided by both; same predicted option
    double mean_abs_dp = 0, max_abs_dp = 0;  // per question max over options |p_a - p_b|
    size_t labelled = 0, a_correct = 0, b_correct = 0;
    size_t only_a = 0, only_b = 0;  // right under one model only (McNemar's b and c)
    double p_value = 1;
};
Agreement compare(const std::vector<const Item*>& a, const std::vector<const Item*>& b);
JsonValue agreement_json(const Agreement& g);

// Temperature scaling: p = softmax(logits / T).
struct Example {
    std::vector<double> logits;
    int label = 0;
};
std::vector<double> softmax_t(const std::vector<double>& logits, double t);
double mean_log_loss(const std::vector<Example>& examples, double t);
// The T in [lo, hi] of least mean log loss (golden-section search on log T: the loss is convex in 1/T).
// 1 for no examples.
double fit_temperature(const std::vector<Example>& examples, double lo = 0.01, double hi = 100.0);
// K-fold cross-validation (example i in fold i mod K): each example's temperature fitted on the other folds.
std::vector<double> cross_validated_temperatures(const std::vector<Example>& examples, int folds);

}  // namespace clef::eval
