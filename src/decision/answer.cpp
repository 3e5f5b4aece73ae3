#include "decision/answer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "ops/basic.h"
#include "util/error.h"

namespace clef {

namespace {
struct ConventionName {
    const char* name;
    ConfidenceConvention conv;
};
constexpr ConventionName kConventions[] = {
    {"reference", ConfidenceConvention::Reference}, {"typesafe", ConfidenceConvention::TypeSafe},
    {"workers-ai", ConfidenceConvention::WorkersAI}, {"colibri", ConfidenceConvention::Colibri},
    {"entropy", ConfidenceConvention::Entropy},
};
}  // namespace

bool parse_confidence_convention(std::string_view name, ConfidenceConvention& out) {
    for (const auto& c : kConventions)
        if (name == c.name) {
            out = c.conv;
            return true;
        }
    return false;
}

std::vector<std::string> confidence_convention_names() {
    std::vector<std::string> v;
    for (const auto& c : kConventions) v.emplace_back(c.name);
    return v;
}

double python_round(double x, int ndigits) {
    if (!std::isfinite(x)) return x;
    // glibc's printf is exact (ties to even on the exact binary value), like CPython's dtoa-based round().
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", ndigits, x);
    double r = std::strtod(buf, nullptr);
    if (r == 0.0) r = std::copysign(0.0, x);
    return r;
}

double confidence(const std::vector<double>& p, QuestionType type, ConfidenceConvention conv) {
    const size_t n = p.size();
    if (n == 0) return 0.0;
    size_t mode = 0;
    for (size_t i = 1; i < n; ++i)
        if (p[i] > p[mode]) mode = i;  // first maximum, as Python's max()
    const double peak = p[mode];
    if (conv == ConfidenceConvention::Reference) return peak;
    if (n == 1) return 1.0;
    const double dn = static_cast<double>(n);
    switch (conv) {
        case ConfidenceConvention::TypeSafe: {
            if (type != QuestionType::Score) return std::max(0.0, (peak - 1.0 / dn) / (1.0 - 1.0 / dn));
            double d = 0.0, mad = 0.0;
            const double c = (dn - 1.0) / 2.0;
            for (size_t i = 0; i < n; ++i) {
                d += p[i] * std::fabs(static_cast<double>(i) - static_cast<double>(mode));
                mad += std::fabs(static_cast<double>(i) - c);
            }
            mad /= dn;
            return std::max(0.0, 1.0 - d / mad);
        }
        case ConfidenceConvention::WorkersAI: {
            double s = 0.0;
            for (double x : p) s += x * x;
            return (s - 1.0 / dn) / (1.0 - 1.0 / dn);
        }
        case ConfidenceConvention::Colibri: return (dn * peak - 1.0) / (dn - 1.0);
        case ConfidenceConvention::Entropy: {
            double h = 0.0;
            for (double x : p)
                if (x > 0) h -= x * std::log(x);
            return 1.0 - h / std::log(dn);
        }
        case ConfidenceConvention::Reference: break;
    }
    return peak;
}

std::vector<float> answer_probabilities(const std::vector<float>& logits, QuestionType type,
                                        const AnswerOptions& opt) {
    const double t = opt.temperature[static_cast<size_t>(type)];
    if (t == 1.0) return ops::softmax_f32(logits);
    std::vector<float> scaled(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) scaled[i] = static_cast<float>(logits[i] / t);
    return ops::softmax_f32(scaled);
}

namespace {
constexpr const char* kCalibrationFormat = "clef-calibration v1";
constexpr QuestionType kTypes[] = {QuestionType::Noul, QuestionType::Choice, QuestionType::Score};
}  // namespace

JsonValue calibration_json(const std::array<double, 3>& temperature) {
    JsonValue t = JsonValue::object();
    for (QuestionType q : kTypes)
        t.set(question_type_name(q), JsonValue::number(temperature[static_cast<size_t>(q)]));
    JsonValue out = JsonValue::object();
    out.set("format", JsonValue::string(kCalibrationFormat));
    out.set("temperature", std::move(t));
    return out;
}

void load_calibration(const std::string& path, AnswerOptions& opt) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const JsonValue v = parse_json_or_throw(text, path);
    const JsonValue* format = v.find("format");
    if (!format || !format->is_string() || format->as_string() != kCalibrationFormat)
        throw Error(path + ": not a calibration file (expected \"format\": \"" + kCalibrationFormat + "\")");
    const JsonValue* t = v.find("temperature");
    if (!t || !t->is_object()) throw Error(path + ": \"temperature\" must be an object");
    for (const auto& [name, value] : t->members()) {
        size_t type = 0;
        while (type < 3 && name != question_type_name(kTypes[type])) ++type;
        if (type == 3) throw Error(path + ": unknown question type '" + name + "' in \"temperature\"");
        if (!value.is_number() || !(value.as_double() > 0) || !std::isfinite(value.as_double()))
            throw Error(path + ": temperature of " + name + " must be a positive number");
        opt.temperature[type] = value.as_double();
    }
    opt.calibration = std::filesystem::path(path).filename().string();
}

JsonValue make_answer(const Question& q, const EncodedQuestion& eq, const std::vector<float>& probs,
                      const AnswerOptions& opt) {
    if (probs.size() != eq.option_ids.size()) throw Error("answer for " + q.id + ": probability count mismatch");
    std::map<std::string, double> by_id;  // Python floats of the float32 probabilities
    for (size_t i = 0; i < probs.size(); ++i) {
        if (!std::isfinite(probs[i])) throw Error("the model produced a non-finite probability for " + q.id);
        by_id[eq.option_ids[i]] = static_cast<double>(probs[i]);
    }
    auto num = [&](double x) { return JsonValue::number(opt.decimals >= 0 ? python_round(x, opt.decimals) : x); };
    // Probabilities in answer order (request order for choice).
    std::vector<double> ordered;
    for (const auto& id : q.answer_order) ordered.push_back(by_id.at(id));

    JsonValue a = JsonValue::object();
    a.set("type", JsonValue::string(question_type_name(q.type)));
    switch (q.type) {
        case QuestionType::Noul: a.set("noul", num(by_id.at("true"))); break;
        case QuestionType::Choice: {
            size_t best = 0;
            for (size_t i = 1; i < ordered.size(); ++i)
                if (ordered[i] > ordered[best]) best = i;
            a.set("choice", JsonValue::string(q.answer_order[best]));
            a.set("confidence", num(confidence(ordered, q.type, opt.confidence)));
            JsonValue p = JsonValue::object();
            for (size_t i = 0; i < ordered.size(); ++i) p.set(q.answer_order[i], num(ordered[i]));
            a.set("probabilities", std::move(p));
            break;
        }
        case QuestionType::Score: {
            double expected = 0.0;  // Python: sum(index * p) left to right
            for (size_t i = 0; i < ordered.size(); ++i) expected += static_cast<double>(i) * ordered[i];
            a.set("score", num(expected));
            a.set("confidence", num(confidence(ordered, q.type, opt.confidence)));
            JsonValue legend = JsonValue::object(), p = JsonValue::object();
            for (size_t i = 0; i < ordered.size(); ++i) {
                legend.set(q.answer_order[i], q.criteria.items()[i]);
                p.set(q.answer_order[i], num(ordered[i]));
            }
            a.set("legend", std::move(legend));
            a.set("probabilities", std::move(p));
            break;
        }
    }
    return a;
}

}  // namespace clef
