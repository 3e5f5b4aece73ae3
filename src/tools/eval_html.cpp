// report_html (tools/eval_report.h): one HTML page, styles inline, plots as inline SVG, no script.
#include <cstdio>
#include <string>

#include "tools/eval_report.h"

namespace clef::eval {

namespace {

std::string esc(const std::string& s) {
    std::string out;
    for (char c : s) switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            default:
                out += c;
        }
    return out;
}

std::string fmt(double v, const char* f = "%.4f") {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

// A number member, "–" when absent or null.
std::string num(const JsonValue* o, const char* key, const char* f = "%.4f") {
    const JsonValue* v = o ? o->find(key) : nullptr;
    return v && v->is_number() ? fmt(v->as_double(), f) : "&ndash;";
}

const JsonValue* path(const JsonValue& root, std::initializer_list<const char*> keys) {
    const JsonValue* v = &root;
    for (const char* k : keys)
        if (!(v = v->find(k))) return nullptr;
    return v;
}

std::string accuracy_cell(const JsonValue* m) {
    const JsonValue* ci = m ? m->find("ci95") : nullptr;
    std::string s = num(m, "accuracy", "%.3f");
    if (ci && ci->is_array())
        s += " [" + fmt(ci->items()[0].as_double(), "%.3f") + ", " + fmt(ci->items()[1].as_double(), "%.3f") +
             "]";
    return s;
}

// Per type: n, accuracy [95 % CI], log loss, Brier, ECE (+ the cross-validated calibrated ones).
std::string metrics_table(const JsonValue& s) {
    const JsonValue* fit = s.find("temperature_fit");
    std::string h =
        "<table><tr><th>type</th><th>labelled</th><th>accuracy [95 % CI]</th><th>log loss</th>"
        "<th>Brier</th><th>ECE</th>";
    if (fit) h += "<th>T</th><th>log loss (T, CV)</th><th>Brier (T, CV)</th><th>ECE (T, CV)</th>";
    h += "</tr>";
    for (const char* t : {"overall", "noul", "choice", "score"}) {
        const JsonValue* m = path(s, {"model", "metrics", t});
        h += std::string("<tr><td>") + t + "</td><td>" + num(m, "n", "%.0f") + "</td><td>" +
             accuracy_cell(m) + "</td><td>" + num(m, "log_loss") + "</td><td>" + num(m, "brier") +
             "</td><td>" + num(m, "ece") + "</td>";
        if (fit) {
            const bool all = std::string(t) == "overall";
            const JsonValue* f = all ? nullptr : fit->find(t);
            const JsonValue* cv =
                all ? fit->find("overall_cross_validated") : (f ? f->find("cross_validated") : nullptr);
            h += "<td>" + num(f, "temperature", "%.3f") + "</td><td>" + num(cv, "log_loss") + "</td><td>" +
                 num(cv, "brier") + "</td><td>" + num(cv, "ece") + "</td>";
        }
        h += "</tr>";
    }
    return h + "</table>";
}

// Reliability diagram: accuracy per confidence bin (bars), the gap to the bin's mean confidence, the
// diagonal; dots: the cross-validated calibrated bins when a temperature was fitted.
std::string reliability_svg(const std::string& title, const JsonValue* bins, const JsonValue* calibrated) {
    const int W = 280, M = 36;  // plot size, margin
    auto X = [&](double v) { return fmt(M + v * W, "%.1f"); };
    auto Y = [&](double v) { return fmt(M / 2 + (1 - v) * W, "%.1f"); };
    std::string s = "<figure><svg class=\"reliability\" id=\"reliability-" + esc(title) + "\" width=\"" +
                    std::to_string(W + M + 10) + "\" height=\"" + std::to_string(W + M + 24) +
                    "\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">";
    s += "<rect x=\"" + X(0) + "\" y=\"" + Y(1) + "\" width=\"" + std::to_string(W) + "\" height=\"" +
         std::to_string(W) + "\" fill=\"#fafafa\" stroke=\"#999\"/>";
    for (int b = 0; bins && b < static_cast<int>(bins->size()); ++b) {
        const JsonValue& bin = bins->items()[static_cast<size_t>(b)];
        const JsonValue *acc = bin.find("accuracy"), *conf = bin.find("confidence");
        if (!acc || !acc->is_number()) continue;
        const double a = acc->as_double(), c = conf->as_double(), lo = b / 10.0;
        const std::string tip = "<title>confidence " + fmt(lo, "%.1f") + "-" + fmt(lo + 0.1, "%.1f") +
                                ": n " + num(&bin, "n", "%.0f") + ", accuracy " + fmt(a, "%.3f") +
                                ", mean confidence " + fmt(c, "%.3f") + "</title>";
        s += "<rect class=\"bar\" x=\"" + X(lo + 0.005) + "\" y=\"" + Y(a) + "\" width=\"" +
             fmt(0.09 * W, "%.1f") + "\" height=\"" + fmt(a * W, "%.1f") + "\" fill=\"#3366cc\">" + tip +
             "</rect>";
        s += "<rect x=\"" + X(lo + 0.005) + "\" y=\"" + Y(std::max(a, c)) + "\" width=\"" +
             fmt(0.09 * W, "%.1f") + "\" height=\"" + fmt(std::abs(a - c) * W, "%.1f") +
             "\" fill=\"#dc3912\" fill-opacity=\"0.35\"/>";
        s += "<text x=\"" + X(lo + 0.05) + "\" y=\"" + fmt(M / 2 + W + 12.0, "%.1f") +
             "\" font-size=\"9\" text-anchor=\"middle\">" + num(&bin, "n", "%.0f") + "</text>";
    }
    for (size_t b = 0; calibrated && b < calibrated->size(); ++b) {
        const JsonValue& bin = calibrated->items()[b];
        const JsonValue *acc = bin.find("accuracy"), *conf = bin.find("confidence");
        if (acc && acc->is_number())
            s += "<circle cx=\"" + X(conf->as_double()) + "\" cy=\"" + Y(acc->as_double()) +
                 "\" r=\"4\" fill=\"#ff9900\" stroke=\"#663d00\"/>";
    }
    s += "<line x1=\"" + X(0) + "\" y1=\"" + Y(0) + "\" x2=\"" + X(1) + "\" y2=\"" + Y(1) +
         "\" stroke=\"#333\" stroke-dasharray=\"4 3\"/>";
    for (int t = 0; t <= 10; t += 5) {
        s += "<text x=\"" + X(t / 10.0) + "\" y=\"" + fmt(M / 2 + W + 24.0, "%.1f") +
             "\" font-size=\"10\" text-anchor=\"middle\">" + fmt(t / 10.0, "%.1f") + "</text>";
        s += "<text x=\"" + fmt(M - 4.0, "%.1f") + "\" y=\"" + Y(t / 10.0) +
             "\" font-size=\"10\" text-anchor=\"end\">" + fmt(t / 10.0, "%.1f") + "</text>";
    }
    s += "</svg><figcaption>" + esc(title) +
         ": accuracy (blue) against confidence of the predicted option; red: " +
         "gap to the mean confidence; numbers: questions per bin" +
         (calibrated ? "; orange: after temperature (CV)" : "") + "</figcaption></figure>";
    return s;
}

std::string reliability_section(const JsonValue& s) {
    std::string h = "<h2>Reliability</h2><div class=\"plots\">";
    for (const char* t : {"overall", "noul", "choice", "score"}) {
        const JsonValue* m = path(s, {"model", "metrics", t});
        if (!m || !m->find("n") || m->find("n")->as_int64() == 0) continue;
        const JsonValue* fit = s.find("temperature_fit");
        const JsonValue* cv = nullptr;
        if (fit)
            cv = std::string(t) == "overall" ? fit->find("overall_cross_validated")
                                             : path(*fit, {t, "cross_validated"});
        h += reliability_svg(t, m->find("reliability"), cv ? cv->find("reliability") : nullptr);
    }
    return h + "</div>";
}

std::string confusion_section(const JsonValue& s) {
    const JsonValue* m = path(s, {"model", "metrics", "choice"});
    const JsonValue* c = m ? m->find("confusion") : nullptr;
    if (!c || c->find("labels")->size() == 0) return "";
    const auto& labels = c->find("labels")->items();
    const auto& rows = c->find("matrix")->items();
    std::string h =
        "<h2>Choice questions</h2><p>macro-F1 " + num(m, "macro_f1") +
        "; rows: expected option, columns: predicted.</p><table class=\"confusion\"><tr><th></th>";
    for (const auto& l : labels) h += "<th>" + esc(l.as_string()) + "</th>";
    h += "</tr>";
    for (size_t i = 0; i < rows.size(); ++i) {
        int64_t total = 0;
        for (const auto& v : rows[i].items()) total += v.as_int64();
        h += "<tr><th>" + esc(labels[i].as_string()) + "</th>";
        for (size_t j = 0; j < rows[i].size(); ++j) {
            const int64_t v = rows[i].items()[j].as_int64();
            const double share = total ? static_cast<double>(v) / static_cast<double>(total) : 0;
            const char* hue = i == j ? "51,102,204" : "220,57,18";
            h += "<td style=\"background:rgba(" + std::string(hue) + "," + fmt(share * 0.8, "%.2f") + ")\">" +
                 std::to_string(v) + "</td>";
        }
        h += "</tr>";
    }
    return h + "</table>";
}

std::string score_section(const JsonValue& s) {
    const JsonValue* m = path(s, {"model", "metrics", "score"});
    if (!m || m->find("n")->as_int64() == 0) return "";
    return "<h2>Score questions</h2><p>Mean absolute level error: " + num(m, "mae_level") +
           " (most probable level), " + num(m, "mae_expected_score") + " (expected score).</p>";
}

std::string compare_section(const JsonValue& s) {
    const JsonValue* c = s.find("compare");
    if (!c) return "";
    std::string h =
        "<h2>Agreement with " + esc(path(*c, {"model", "model"})->as_string()) +
        "</h2><table><tr><th>type</th><th>questions</th><th>agreement</th><th>mean |&Delta;p|</th>"
        "<th>max |&Delta;p|</th><th>accuracy A</th><th>accuracy B</th><th>B &minus; A</th>"
        "<th>McNemar p (exact)</th></tr>";
    for (const char* t : {"overall", "noul", "choice", "score"}) {
        const JsonValue* g = path(*c, {"agreement", t});
        h += std::string("<tr><td>") + t + "</td><td>" + num(g, "questions", "%.0f") + "</td><td>" +
             num(g, "agreement") + "</td><td>" + num(g, "mean_abs_dp", "%.2e") + "</td><td>" +
             num(g, "max_abs_dp", "%.2e") + "</td><td>" + num(g, "accuracy_a", "%.3f") + "</td><td>" +
             num(g, "accuracy_b", "%.3f") + "</td><td>" + num(g, "accuracy_diff", "%+.3f") + "</td><td>" +
             num(g ? g->find("mcnemar") : nullptr, "p_value", "%.4g") + "</td></tr>";
    }
    return h + "</table>";
}

std::string latency_row(const char* name, const JsonValue* run) {
    const JsonValue* l = run ? run->find("latency") : nullptr;
    return std::string("<tr><td>") + name + "</td><td>" + esc(run ? run->find("model")->as_string() : "") +
           "</td><td>" + num(l, "decisions", "%.0f") + "</td><td>" + num(l, "p50_ms", "%.1f") + "</td><td>" +
           num(l, "p95_ms", "%.1f") + "</td><td>" + num(l, "p99_ms", "%.1f") + "</td><td>" +
           num(l, "tokens_per_s", "%.0f") + "</td></tr>";
}

std::string latency_section(const JsonValue& s) {
    std::string h =
        "<h2>Latency</h2><table><tr><th></th><th>model</th><th>decisions</th><th>p50 ms</th>"
        "<th>p95 ms</th><th>p99 ms</th><th>tokens/s</th></tr>" +
        latency_row("A", s.find("model"));
    if (const JsonValue* c = s.find("compare")) h += latency_row("B", c->find("model"));
    return h + "</table>";
}

std::string errors_section(const JsonValue& s) {
    const JsonValue* e = path(s, {"model", "errors"});
    if (!e || e->size() == 0) return "";
    std::string h = "<h2>Refused lines</h2><ul>";
    for (const auto& x : e->items())
        h += "<li>line " + std::to_string(x.find("line")->as_int64()) + ": <code>" +
             esc(x.find("error")->as_string()) + "</code></li>";
    return h + "</ul>";
}

constexpr const char* kStyle =
    "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f0f0f0}"
    ".plots{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}figcaption{font-size:12px;max-width:320px}"
    "code{font-size:12px}";

}  // namespace

std::string report_html(const JsonValue& s) {
    const JsonValue* model = s.find("model");
    std::string h =
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>clef eval</title><style>";
    h += kStyle;
    h += "</style></head><body><h1>clef eval</h1><p>Model <code>" + esc(model->find("model")->as_string()) +
         "</code> on <code>" + esc(s.find("data")->as_string()) +
         "</code>: " + num(model, "lines_decided", "%.0f") + " lines decided, " +
         num(model, "questions", "%.0f") + " questions, " + num(model, "labelled", "%.0f") +
         " labelled. Definitions: docs/EVAL.md.</p>";
    h += metrics_table(s) + reliability_section(s) + confusion_section(s) + score_section(s) +
         compare_section(s) + latency_section(s) + errors_section(s);
    return h + "</body></html>\n";
}

}  // namespace clef::eval
