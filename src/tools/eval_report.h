// The report of `clef eval` (docs/EVAL.md): the JSON summary of one or two models' decisions on a labelled
// set, the temperature fit, and a self-contained HTML page rendered from that summary (inline SVG plots, no
// script, nothing fetched).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tools/eval_stats.h"
#include "util/json.h"

namespace clef::eval {

// One model's pass over the data.
struct ModelRun {
    std::string model;
    std::vector<Item> items;      // every decided question, in line and request order
    std::vector<double> seconds;  // per decided line
    int64_t tokens = 0;           // prompt tokens of the decided lines
    double wall_seconds = 0;
    std::vector<std::pair<size_t, std::string>> errors;  // refused lines: 0-based line, error body
};

// {model, lines_decided, errors, questions, labelled, metrics: {overall, noul, choice, score}, latency}.
JsonValue run_json(const ModelRun& r);
// Agreement of b with a, overall and per type (questions matched by line and id).
JsonValue compare_json(const ModelRun& a, const ModelRun& b);

// Temperature scaling per question type on the labelled items: temperature[type] is fitted on all of them;
// the returned JSON has, per type, {temperature, examples, log_loss_uncalibrated} and the metrics of the
// out-of-fold calibrated probabilities (K-fold, `folds`), and the same metrics overall.
JsonValue fit_temperatures(const std::vector<Item>& items, int folds, std::array<double, 3>& temperature);

// The HTML page of a summary ({data, model: run_json, compare?, temperature_fit?}).
std::string report_html(const JsonValue& summary);

}  // namespace clef::eval
