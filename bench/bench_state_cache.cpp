// The state cache's effect (docs/CACHE.md): one decision on a long state, the same state with another
// question set, the state grown at its end, each timed with the cache on and off, and the largest probability
// difference between the two. Usage: bench_state_cache MODEL [STATE_CHARS=2000] [GROW_CHARS=100] [REPEAT=3]
// (the synthetic tokenizer of `clef make-model` gives one token per character).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "decision/engine.h"
#include "util/json.h"

using namespace clef;

namespace {

DecisionRequest request(const std::string& state, const std::string& question) {
    JsonValue body = JsonValue::object();
    body.set("model", JsonValue::string("m"));
    body.set("state", JsonValue::string(state));
    JsonValue q = JsonValue::object();
    q.set("type", JsonValue::string("choice"));
    q.set("instructions", JsonValue::string(question));
    JsonValue criteria = JsonValue::object();
    for (const char* o : {"billing", "engineering", "sales"})
        criteria.set(o, JsonValue::string(std::string("The ") + o + " team."));
    q.set("criteria", std::move(criteria));
    JsonValue qs = JsonValue::object();
    qs.set("team", std::move(q));
    body.set("questions", std::move(qs));
    DecisionRequest r;
    std::vector<RequestError> errors;
    if (!parse_request(body, r, errors)) throw Error(describe_errors(errors));
    return r;
}

// The text of a long ticket: words over the printable range, deterministic.
std::string ticket(size_t chars) {
    static const char* words[] = {"the",      "app",   "crashes", "when",   "I",      "open",
                                  "settings", "after", "update",  "refund", "please", "invoice",
                                  "late",     "error", "screen",  "again"};
    std::string s;
    for (size_t i = 0; s.size() < chars; ++i) s += std::string(words[(i * 7 + i / 3) % 16]) + " ";
    s.resize(chars);
    return s;
}

double seconds(const Engine& e, const DecisionRequest& r, Decision& out) {
    const auto t0 = std::chrono::steady_clock::now();
    out = e.decide(r);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double max_diff(const Decision& a, const Decision& b) {
    double m = 0;
    for (size_t i = 0; i < a.probabilities.size(); ++i)
        for (size_t j = 0; j < a.probabilities[i].size(); ++j)
            m = std::max(m, static_cast<double>(std::fabs(a.probabilities[i][j] - b.probabilities[i][j])));
    return m;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: bench_state_cache MODEL [STATE_CHARS] [GROW_CHARS] [REPEAT]\n");
        return 2;
    }
    const size_t chars = argc > 2 ? std::stoul(argv[2]) : 2000, grow = argc > 3 ? std::stoul(argv[3]) : 100;
    const int repeat = argc > 4 ? std::stoi(argv[4]) : 3;
    LoadOptions on;
    on.cache_bytes = uint64_t{4} << 30;
    const auto cached = Engine::load(argv[1], "", on);
    const auto plain = Engine::load(argv[1]);
    double first = 1e9, same = 1e9, grown = 1e9, p_first = 1e9, p_same = 1e9, p_grown = 1e9, diff = 0;
    int64_t tokens = 0, reused_same = 0, reused_grown = 0;
    for (int r = 0; r < repeat; ++r) {
        std::string state = "#";  // a new state per repetition (it differs at its start)
        state.append(std::to_string(r)).append(" ").append(ticket(chars));
        const DecisionRequest a = request(state, "Which team should handle this ticket?");
        const DecisionRequest b = request(state, "Which team owns the product area of this complaint?");
        const DecisionRequest c =
            request(state + " " + ticket(grow), "Which team owns the product area of this complaint?");
        Decision d, e;
        first = std::min(first, seconds(*cached, a, d));
        p_first = std::min(p_first, seconds(*plain, a, e));
        diff = std::max(diff, max_diff(d, e));
        tokens = static_cast<int64_t>(d.prompt.input_ids.size());
        same = std::min(same, seconds(*cached, b, d));
        reused_same = d.tokens_reused;
        p_same = std::min(p_same, seconds(*plain, b, e));
        diff = std::max(diff, max_diff(d, e));
        grown = std::min(grown, seconds(*cached, c, d));
        reused_grown = d.tokens_reused;
        p_grown = std::min(p_grown, seconds(*plain, c, e));
        diff = std::max(diff, max_diff(d, e));
    }
    std::printf(
        "{\"prompt_tokens\": %lld, \"first_s\": %.4f, \"same_state_s\": %.4f, \"grown_state_s\": %.4f, "
        "\"same_state_speedup\": %.2f, \"grown_state_speedup\": %.2f, \"reused_same\": %lld, "
        "\"reused_grown\": %lld, "
        "\"cache_off_s\": [%.4f, %.4f, %.4f], \"max_prob_diff_vs_cache_off\": %.3g}\n",
        static_cast<long long>(tokens), first, same, grown, first / same, first / grown,
        static_cast<long long>(reused_same), static_cast<long long>(reused_grown), p_first, p_same, p_grown,
        diff);
    return 0;
}
