// The System One response of one decision (docs/API.md): {model, answers, usage} and, when asked, the debug
// object (input ids, spans, logits and probabilities per question).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "decision/answer.h"
#include "decision/prompt.h"
#include "decision/request.h"
#include "util/json.h"

namespace clef {

// logits / probabilities: per question, in encoded option order.
JsonValue decision_response(const DecisionRequest& req, const EncodedPrompt& prompt,
                            const std::vector<std::vector<float>>& logits,
                            const std::vector<std::vector<float>>& probabilities,
                            const AnswerOptions& answers, bool debug);

// System One error bodies (docs/API.md "Errors"): {"detail": {"error_type": type, "message": message}} (the
// message left out when empty), and {"detail": "message"}.
JsonValue error_detail(const std::string& error_type, const std::string& message);
JsonValue error_detail_text(const std::string& message);
// The status and body of a rejected request: 400 {"detail": "..."} for a protocol limit, 400 api_usage_error
// for image problems, 422 with the Pydantic-style list of every validation error otherwise.
std::pair<int, JsonValue> request_error_response(const std::vector<RequestError>& errors);

}  // namespace clef
