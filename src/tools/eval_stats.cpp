#include "tools/eval_stats.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "ops/basic.h"

namespace clef::eval {

namespace {

constexpr double kMinProb = 1e-15;  // log loss clamps p here (a probability that underflowed to 0)

JsonValue num_or_null(bool defined, double v) {
    return defined ? JsonValue::number(v) : JsonValue::null();
}

JsonValue size_json(size_t v) {
    return JsonValue::integer(static_cast<int64_t>(v));
}

int bin_of(double confidence) {
    return std::clamp(static_cast<int>(std::floor(confidence * kBins)), 0, kBins - 1);
}

void add_confusion(Metrics& m, const std::vector<const Item*>& labelled) {
    std::map<std::string, size_t> index;
    for (const Item* it : labelled) {
        index[it->options[static_cast<size_t>(it->expected)]];
        index[it->options[static_cast<size_t>(predicted(*it))]];
    }
    for (auto& [label, i] : index) {
        i = m.labels.size();
        m.labels.push_back(label);
    }
    m.confusion.assign(m.labels.size(), std::vector<size_t>(m.labels.size(), 0));
    for (const Item* it : labelled)
        ++m.confusion[index[it->options[static_cast<size_t>(it->expected)]]]
                     [index[it->options[static_cast<size_t>(predicted(*it))]]];
    double f1 = 0;
    for (size_t c = 0; c < m.labels.size(); ++c) {
        size_t row = 0, col = 0;
        for (size_t j = 0; j < m.labels.size(); ++j) {
            row += m.confusion[c][j];
            col += m.confusion[j][c];
        }
        const size_t tp = m.confusion[c][c];
        f1 += 2.0 * static_cast<double>(tp) / static_cast<double>(row + col);  // row + col >= 1: c was seen
    }
    m.macro_f1 = m.labels.empty() ? 0 : f1 / static_cast<double>(m.labels.size());
}

void add_level_errors(Metrics& m, const std::vector<const Item*>& labelled) {
    double level = 0, expected = 0;
    for (const Item* it : labelled) {
        double score = 0;
        for (size_t i = 0; i < it->probs.size(); ++i) score += static_cast<double>(i) * it->probs[i];
        level += std::fabs(predicted(*it) - it->expected);
        expected += std::fabs(score - it->expected);
    }
    m.mae_level = level / static_cast<double>(labelled.size());
    m.mae_expected_score = expected / static_cast<double>(labelled.size());
}

}  // namespace

int predicted(const Item& it) {
    size_t best = 0;
    for (size_t i = 1; i < it.probs.size(); ++i)
        if (it.probs[i] > it.probs[best]) best = i;
    return static_cast<int>(best);
}

Interval wilson_interval(size_t successes, size_t n, double z) {
    if (n == 0) return {};
    const double dn = static_cast<double>(n), p = static_cast<double>(successes) / dn, z2 = z * z;
    const double centre = (p + z2 / (2 * dn)) / (1 + z2 / dn);
    const double half = z / (1 + z2 / dn) * std::sqrt(p * (1 - p) / dn + z2 / (4 * dn * dn));
    return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

double mcnemar_exact_p(size_t b, size_t c) {
    const size_t n = b + c, k = std::min(b, c);
    if (n == 0) return 1.0;
    double tail = 0;
    for (size_t i = 0; i <= k; ++i)
        tail += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) -
                         static_cast<double>(n) * std::log(2.0));
    return std::min(1.0, 2 * tail);
}

double percentile(std::vector<double> values, double q) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    const double rank = std::ceil(q / 100.0 * static_cast<double>(values.size()));
    const size_t at = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(values.size()))) - 1;
    return values[at];
}

Metrics compute_metrics(const std::vector<const Item*>& items) {
    Metrics m;
    std::vector<const Item*> labelled, choices, scores;
    for (const Item* it : items) {
        if (it->expected < 0) continue;
        labelled.push_back(it);
        if (it->type == QuestionType::Choice) choices.push_back(it);
        if (it->type == QuestionType::Score) scores.push_back(it);
    }
    m.n = labelled.size();
    if (m.n == 0) return m;
    for (const Item* it : labelled) {
        const size_t y = static_cast<size_t>(it->expected), guess = static_cast<size_t>(predicted(*it));
        const bool right = guess == y;
        m.correct += right;
        m.log_loss -= std::log(std::max(it->probs[y], kMinProb));
        for (size_t k = 0; k < it->probs.size(); ++k) {
            const double d = it->probs[k] - (k == y ? 1.0 : 0.0);
            m.brier += d * d;
        }
        Bin& b = m.reliability[static_cast<size_t>(bin_of(it->probs[guess]))];
        ++b.n;
        b.confidence += it->probs[guess];
        b.accuracy += right;
    }
    const double n = static_cast<double>(m.n);
    m.accuracy = static_cast<double>(m.correct) / n;
    m.ci95 = wilson_interval(m.correct, m.n);
    m.log_loss /= n;
    m.brier /= n;
    for (Bin& b : m.reliability) {
        if (b.n == 0) continue;
        b.confidence /= static_cast<double>(b.n);
        b.accuracy /= static_cast<double>(b.n);
        m.ece += static_cast<double>(b.n) / n * std::fabs(b.accuracy - b.confidence);
    }
    if (!choices.empty()) add_confusion(m, choices);
    if (!scores.empty()) add_level_errors(m, scores);
    return m;
}

JsonValue metrics_json(const Metrics& m, bool choice, bool score) {
    const bool any = m.n > 0;
    JsonValue o = JsonValue::object();
    o.set("n", size_json(m.n));
    o.set("correct", size_json(m.correct));
    o.set("accuracy", num_or_null(any, m.accuracy));
    o.set("ci95", any ? JsonValue::array({JsonValue::number(m.ci95.lo), JsonValue::number(m.ci95.hi)})
                      : JsonValue::null());
    o.set("log_loss", num_or_null(any, m.log_loss));
    o.set("brier", num_or_null(any, m.brier));
    o.set("ece", num_or_null(any, m.ece));
    JsonValue bins = JsonValue::array();
    for (int b = 0; b < kBins; ++b) {
        const Bin& bin = m.reliability[static_cast<size_t>(b)];
        JsonValue j = JsonValue::object();
        j.set("lo", JsonValue::number(b / 10.0));
        j.set("hi", JsonValue::number((b + 1) / 10.0));
        j.set("n", size_json(bin.n));
        j.set("confidence", num_or_null(bin.n > 0, bin.confidence));
        j.set("accuracy", num_or_null(bin.n > 0, bin.accuracy));
        bins.items().push_back(std::move(j));
    }
    o.set("reliability", std::move(bins));
    if (choice) {
        o.set("macro_f1", num_or_null(any, m.macro_f1));
        JsonValue labels = JsonValue::array(), rows = JsonValue::array();
        for (const auto& l : m.labels) labels.items().push_back(JsonValue::string(l));
        for (const auto& r : m.confusion) {
            JsonValue row = JsonValue::array();
            for (size_t c : r) row.items().push_back(size_json(c));
            rows.items().push_back(std::move(row));
        }
        JsonValue conf = JsonValue::object();
        conf.set("labels", std::move(labels));
        conf.set("matrix", std::move(rows));
        o.set("confusion", std::move(conf));
    }
    if (score) {
        o.set("mae_level", num_or_null(any, m.mae_level));
        o.set("mae_expected_score", num_or_null(any, m.mae_expected_score));
    }
    return o;
}

Agreement compare(const std::vector<const Item*>& a, const std::vector<const Item*>& b) {
    Agreement g;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        const Item &x = *a[i], &y = *b[i];
        ++g.n;
        g.agreeing += predicted(x) == predicted(y);
        double dp = 0;
        for (size_t k = 0; k < x.probs.size() && k < y.probs.size(); ++k)
            dp = std::max(dp, std::fabs(x.probs[k] - y.probs[k]));
        g.mean_abs_dp += dp;
        g.max_abs_dp = std::max(g.max_abs_dp, dp);
        if (x.expected < 0) continue;
        ++g.labelled;
        const bool ra = predicted(x) == x.expected, rb = predicted(y) == x.expected;
        g.a_correct += ra;
        g.b_correct += rb;
        g.only_a += ra && !rb;
        g.only_b += rb && !ra;
    }
    if (g.n) g.mean_abs_dp /= static_cast<double>(g.n);
    g.p_value = mcnemar_exact_p(g.only_a, g.only_b);
    return g;
}

JsonValue agreement_json(const Agreement& g) {
    const double l = static_cast<double>(g.labelled);
    JsonValue o = JsonValue::object();
    o.set("questions", size_json(g.n));
    o.set("agreeing", size_json(g.agreeing));
    o.set("agreement", num_or_null(g.n > 0, static_cast<double>(g.agreeing) / static_cast<double>(g.n)));
    o.set("mean_abs_dp", num_or_null(g.n > 0, g.mean_abs_dp));
    o.set("max_abs_dp", num_or_null(g.n > 0, g.max_abs_dp));
    o.set("labelled", size_json(g.labelled));
    o.set("accuracy_a", num_or_null(g.labelled > 0, static_cast<double>(g.a_correct) / l));
    o.set("accuracy_b", num_or_null(g.labelled > 0, static_cast<double>(g.b_correct) / l));
    o.set("accuracy_diff",
          num_or_null(g.labelled > 0,
                      (static_cast<double>(g.b_correct) - static_cast<double>(g.a_correct)) / l));
    JsonValue mc = JsonValue::object();
    mc.set("only_a_correct", size_json(g.only_a));
    mc.set("only_b_correct", size_json(g.only_b));
    mc.set("p_value", JsonValue::number(g.p_value));
    o.set("mcnemar", std::move(mc));
    return o;
}

std::vector<double> softmax_t(const std::vector<double>& logits, double t) {
    std::vector<double> p(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) p[i] = logits[i] / t;
    ops::softmax_inplace(p.data(), static_cast<int64_t>(p.size()));
    return p;
}

double mean_log_loss(const std::vector<Example>& examples, double t) {
    if (examples.empty()) return 0;
    double loss = 0;
    std::vector<double> z;
    for (const Example& e : examples) {
        // The logits over t, each less the top one first (a common offset cancels before the division):
        // the term is -log softmax(z)[label].
        const double top = *std::max_element(e.logits.begin(), e.logits.end());
        z.resize(e.logits.size());
        for (size_t i = 0; i < z.size(); ++i) z[i] = (e.logits[i] - top) / t;
        loss += ops::log_sum_exp(z.data(), static_cast<int64_t>(z.size())) - z[static_cast<size_t>(e.label)];
    }
    return loss / static_cast<double>(examples.size());
}

double fit_temperature(const std::vector<Example>& examples, double lo, double hi) {
    if (examples.empty()) return 1.0;
    const double g = (std::sqrt(5.0) - 1) / 2;
    double a = std::log(lo), b = std::log(hi);
    double c = b - g * (b - a), d = a + g * (b - a);
    double fc = mean_log_loss(examples, std::exp(c)), fd = mean_log_loss(examples, std::exp(d));
    while (b - a > 1e-7) {
        if (fc <= fd) {
            b = d, d = c, fd = fc;
            c = b - g * (b - a);
            fc = mean_log_loss(examples, std::exp(c));
        } else {
            a = c, c = d, fc = fd;
            d = a + g * (b - a);
            fd = mean_log_loss(examples, std::exp(d));
        }
    }
    return std::exp((a + b) / 2);
}

std::vector<double> cross_validated_temperatures(const std::vector<Example>& examples, int folds) {
    std::vector<double> t(examples.size(), 1.0);
    const size_t k = static_cast<size_t>(std::max(folds, 2));
    if (examples.size() < k) return t;
    for (size_t f = 0; f < k; ++f) {
        std::vector<Example> train;
        for (size_t i = 0; i < examples.size(); ++i)
            if (i % k != f) train.push_back(examples[i]);
        const double tf = fit_temperature(train);
        for (size_t i = f; i < examples.size(); i += k) t[i] = tf;
    }
    return t;
}

}  // namespace clef::eval
