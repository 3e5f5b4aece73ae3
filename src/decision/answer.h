// Turning per-option logits into System One answers. The default follows the reference `systemone_answer`:
// float32 softmax per question, noul = P(true), choice = the first maximum in request order with
// confidence = max p, score = expected level with confidence = max p and the legend; every number rounded like
// Python's round(x, 4). Other servers' confidence conventions can be chosen by name (docs/API.md).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "decision/prompt.h"
#include "decision/request.h"
#include "util/json.h"

namespace clef {

enum class ConfidenceConvention {
    Reference,  // max p (joint_schema_model.py)
    TypeSafe,   // choice (max p - 1/K)/(1 - 1/K); score 1 - E|i - mode| / MAD(uniform) (TypeSafe's published formulas)
    WorkersAI,  // (sum p^2 - 1/n)/(1 - 1/n), normalised purity
    Colibri,    // (n max p - 1)/(n - 1)
    Entropy,    // 1 - H(p)/ln n (Ollama, OpenJev)
};

// Names: reference, typesafe, workers-ai, colibri, entropy. Returns false for an unknown name.
bool parse_confidence_convention(std::string_view name, ConfidenceConvention& out);
std::vector<std::string> confidence_convention_names();

struct AnswerOptions {
    ConfidenceConvention confidence = ConfidenceConvention::Reference;
    int decimals = 4;  // rounding of every emitted number; negative = unrounded
    // Temperature scaling per question type (indexed by QuestionType; docs/EVAL.md): the probabilities are
    // softmax(logits / T). 1 everywhere (the default) gives the reference's numbers exactly.
    std::array<double, 3> temperature = {1.0, 1.0, 1.0};
    std::string calibration;  // the calibration file's name ("" = none), for the server's x-clef-calibration
};

// The probabilities of one question: float32 softmax of logits / T, T the temperature of its type
// (at T = 1 exactly ops::softmax_f32 of the logits).
std::vector<float> answer_probabilities(const std::vector<float>& logits, QuestionType type,
                                        const AnswerOptions& opt);

// Calibration files (clef eval --fit-temperature): {"format": "clef-calibration v1", "temperature": {"noul":
// T, "choice": T, "score": T}, ...}; types left out keep T = 1.
JsonValue calibration_json(const std::array<double, 3>& temperature);
// Reads a calibration file into opt.temperature and opt.calibration (the file's name); throws clef::Error
// naming the file and the problem.
void load_calibration(const std::string& path, AnswerOptions& opt);

// Python's round(x, ndigits) for floats: correctly rounded, ties to even on the exact binary value.
double python_round(double x, int ndigits);
// Confidence of a distribution under a convention (the type decides which formula applies).
double confidence(const std::vector<double>& p, QuestionType type, ConfidenceConvention conv);

// One answer object. probs are in encoded option order (EncodedQuestion::option_ids).
JsonValue make_answer(const Question& q, const EncodedQuestion& eq, const std::vector<float>& probs,
                      const AnswerOptions& opt = {});

}  // namespace clef
