#include "tools/eval_report.h"

#include <cmath>
#include <cstdio>
#include <map>

namespace clef::eval {

namespace {

constexpr QuestionType kTypes[] = {QuestionType::Noul, QuestionType::Choice, QuestionType::Score};

std::vector<const Item*> of_type(const std::vector<Item>& items, const QuestionType* type) {
    std::vector<const Item*> out;
    for (const Item& it : items)
        if (!type || it.type == *type) out.push_back(&it);
    return out;
}

// {overall, noul, choice, score} metrics of the items.
JsonValue metrics_by_type(const std::vector<Item>& items) {
    JsonValue o = JsonValue::object();
    o.set("overall", metrics_json(compute_metrics(of_type(items, nullptr)), false, false));
    for (QuestionType t : kTypes)
        o.set(question_type_name(t), metrics_json(compute_metrics(of_type(items, &t)),
                                                  t == QuestionType::Choice, t == QuestionType::Score));
    return o;
}

JsonValue latency_json(const ModelRun& r) {
    JsonValue o = JsonValue::object();
    o.set("decisions", JsonValue::integer(static_cast<int64_t>(r.seconds.size())));
    o.set("p50_ms", JsonValue::number(percentile(r.seconds, 50) * 1e3));
    o.set("p95_ms", JsonValue::number(percentile(r.seconds, 95) * 1e3));
    o.set("p99_ms", JsonValue::number(percentile(r.seconds, 99) * 1e3));
    o.set("tokens", JsonValue::integer(r.tokens));
    o.set("wall_s", JsonValue::number(r.wall_seconds));
    o.set("tokens_per_s",
          JsonValue::number(r.wall_seconds > 0 ? static_cast<double>(r.tokens) / r.wall_seconds : 0.0));
    return o;
}

}  // namespace

JsonValue run_json(const ModelRun& r) {
    size_t labelled = 0;
    for (const Item& it : r.items) labelled += it.expected >= 0;
    JsonValue errors = JsonValue::array();
    for (const auto& [line, body] : r.errors) {
        JsonValue e = JsonValue::object();
        e.set("line", JsonValue::integer(static_cast<int64_t>(line + 1)));
        e.set("error", JsonValue::string(body));
        errors.items().push_back(std::move(e));
    }
    JsonValue o = JsonValue::object();
    o.set("model", JsonValue::string(r.model));
    o.set("lines_decided", JsonValue::integer(static_cast<int64_t>(r.seconds.size())));
    o.set("errors", std::move(errors));
    o.set("questions", JsonValue::integer(static_cast<int64_t>(r.items.size())));
    o.set("labelled", JsonValue::integer(static_cast<int64_t>(labelled)));
    o.set("metrics", metrics_by_type(r.items));
    o.set("latency", latency_json(r));
    return o;
}

JsonValue compare_json(const ModelRun& a, const ModelRun& b) {
    std::map<std::pair<size_t, std::string>, const Item*> in_b;
    for (const Item& it : b.items) in_b[{it.line, it.question}] = &it;
    std::array<std::vector<const Item*>, 4> xa, xb;  // by type, then all
    for (const Item& it : a.items) {
        auto found = in_b.find({it.line, it.question});
        if (found == in_b.end()) continue;
        for (size_t slot : {static_cast<size_t>(it.type), size_t{3}}) {
            xa[slot].push_back(&it);
            xb[slot].push_back(found->second);
        }
    }
    JsonValue o = JsonValue::object();
    o.set("overall", agreement_json(compare(xa[3], xb[3])));
    for (QuestionType t : kTypes) {
        const size_t s = static_cast<size_t>(t);
        o.set(question_type_name(t), agreement_json(compare(xa[s], xb[s])));
    }
    return o;
}

JsonValue fit_temperatures(const std::vector<Item>& items, int folds, std::array<double, 3>& temperature) {
    std::vector<Item> calibrated;  // labelled items with out-of-fold calibrated probabilities
    JsonValue o = JsonValue::object();
    o.set("folds", JsonValue::integer(folds));
    for (QuestionType t : kTypes) {
        std::vector<Example> examples;
        std::vector<const Item*> labelled;
        for (const Item& it : items)
            if (it.type == t && it.expected >= 0) {
                examples.push_back({it.logits, it.expected});
                labelled.push_back(&it);
            }
        const double fitted = fit_temperature(examples);
        temperature[static_cast<size_t>(t)] = fitted;
        const std::vector<double> cv = cross_validated_temperatures(examples, folds);
        std::vector<Item> mine;
        for (size_t i = 0; i < labelled.size(); ++i) {
            mine.push_back(*labelled[i]);
            mine.back().probs = softmax_t(labelled[i]->logits, cv[i]);
        }
        JsonValue j = JsonValue::object();
        j.set("temperature", JsonValue::number(fitted));
        j.set("examples", JsonValue::integer(static_cast<int64_t>(examples.size())));
        // At the search's edge the data want a T beyond it (e.g. every labelled answer already right).
        j.set("at_search_bound", JsonValue::boolean(!examples.empty() && (fitted < 0.0101 || fitted > 99)));
        j.set("log_loss_uncalibrated", JsonValue::number(mean_log_loss(examples, 1.0)));
        j.set("log_loss_fitted_in_sample", JsonValue::number(mean_log_loss(examples, fitted)));
        j.set("cross_validated", metrics_json(compute_metrics(of_type(mine, nullptr)), false, false));
        o.set(question_type_name(t), std::move(j));
        calibrated.insert(calibrated.end(), mine.begin(), mine.end());
    }
    o.set("overall_cross_validated",
          metrics_json(compute_metrics(of_type(calibrated, nullptr)), false, false));
    return o;
}

}  // namespace clef::eval
