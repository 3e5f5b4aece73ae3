// The state cache's effect (docs/CACHE.md): one decision on a long state, the same state with another
// question set, the state grown at its end, each timed with the cache on and off, the largest probability
// difference between the two, and where the best cached decisions spent their time (DecisionProfile).
// Usage: bench_state_cache MODEL [STATE_CHARS=2000] [GROW_CHARS=100] [REPEAT=3] [QUESTIONS=3] (the synthetic
// tokenizer of `clef make-model` gives one token per character).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "decision/engine.h"
#include "util/json.h"
#include "util/memory.h"

using namespace clef;

namespace {

// n choice questions on the state ("team": `question`; with more, each asked of another aspect of the
// ticket).
DecisionRequest request(const std::string& state, const std::string& question, int n) {
    static const char* aspects[] = {"the ticket", "its first message", "its latest message", "the customer"};
    JsonValue body = JsonValue::object();
    body.set("model", JsonValue::string("m"));
    body.set("state", JsonValue::string(state));
    JsonValue qs = JsonValue::object();
    for (int i = 0; i < n; ++i) {
        JsonValue q = JsonValue::object();
        q.set("type", JsonValue::string("choice"));
        q.set("instructions",
              JsonValue::string(n == 1 ? question : question + " Consider " + aspects[i % 4] + "."));
        JsonValue criteria = JsonValue::object();
        for (const char* o : {"billing", "engineering", "sales"})
            criteria.set(o, JsonValue::string(std::string("The ") + o + " team."));
        q.set("criteria", std::move(criteria));
        qs.set(n == 1 ? std::string("team") : "team" + std::to_string(i + 1), std::move(q));
    }
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

double seconds(const Engine& e, const DecisionRequest& r, Decision& out, DecisionProfile* profile = nullptr) {
    DecideOptions opt;
    opt.profile = profile;
    const auto t0 = std::chrono::steady_clock::now();
    out = e.decide(r, opt);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The timed decision's parts: the state cache's lookup and restore, the prefill, the head, the answers and
// the response, and what is left (prepare: the prompt's encoding).
std::string breakdown(double seconds, const DecisionProfile& p) {
    const double head = p.head_features + p.head_decide;
    char s[256];
    std::snprintf(s, sizeof s,
                  "{\"total\": %.4f, \"state_cache\": %.4f, \"prefill\": %.4f, \"head\": %.4f, "
                  "\"answers_response\": %.4f, \"other\": %.4f}",
                  seconds, p.state_cache, p.backbone_total, head, p.answers,
                  seconds - p.state_cache - p.backbone_total - head - p.answers);
    return s;
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
        std::fprintf(stderr,
                     "usage: bench_state_cache MODEL [STATE_CHARS] [GROW_CHARS] [REPEAT] [QUESTIONS]\n");
        return 2;
    }
    keep_freed_memory();  // as the clef binary runs decisions
    const size_t chars = argc > 2 ? std::stoul(argv[2]) : 2000, grow = argc > 3 ? std::stoul(argv[3]) : 100;
    const int repeat = argc > 4 ? std::stoi(argv[4]) : 3, questions = argc > 5 ? std::stoi(argv[5]) : 3;
    LoadOptions on;
    on.cache_bytes = uint64_t{4} << 30;
    const auto cached = Engine::load(argv[1], "", on);
    const auto plain = Engine::load(argv[1]);
    double first = 1e9, same = 1e9, grown = 1e9, p_first = 1e9, p_same = 1e9, p_grown = 1e9, diff = 0;
    int64_t tokens = 0, reused_same = 0, reused_grown = 0;
    std::string same_parts, grown_parts;
    for (int r = 0; r < repeat; ++r) {
        std::string state = "#";  // a new state per repetition (it differs at its start)
        state.append(std::to_string(r)).append(" ").append(ticket(chars));
        const DecisionRequest a = request(state, "Which team should handle this ticket?", questions);
        const DecisionRequest b =
            request(state, "Which team owns the product area of this complaint?", questions);
        const DecisionRequest c = request(state + " " + ticket(grow),
                                          "Which team owns the product area of this complaint?", questions);
        Decision d, e;
        DecisionProfile ps, pg;
        first = std::min(first, seconds(*cached, a, d));
        p_first = std::min(p_first, seconds(*plain, a, e));
        diff = std::max(diff, max_diff(d, e));
        tokens = static_cast<int64_t>(d.prompt.input_ids.size());
        const double ts = seconds(*cached, b, d, &ps);
        if (ts < same) same = ts, same_parts = breakdown(ts, ps);
        reused_same = d.tokens_reused;
        p_same = std::min(p_same, seconds(*plain, b, e));
        diff = std::max(diff, max_diff(d, e));
        const double tg = seconds(*cached, c, d, &pg);
        if (tg < grown) grown = tg, grown_parts = breakdown(tg, pg);
        reused_grown = d.tokens_reused;
        p_grown = std::min(p_grown, seconds(*plain, c, e));
        diff = std::max(diff, max_diff(d, e));
    }
    std::printf(
        "{\"prompt_tokens\": %lld, \"first_s\": %.4f, \"same_state_s\": %.4f, \"grown_state_s\": %.4f, "
        "\"same_state_speedup\": %.2f, \"grown_state_speedup\": %.2f, \"reused_same\": %lld, "
        "\"reused_grown\": %lld, "
        "\"cache_off_s\": [%.4f, %.4f, %.4f], \"max_prob_diff_vs_cache_off\": %.3g, \"same_state_parts\": "
        "%s, \"grown_state_parts\": %s}\n",
        static_cast<long long>(tokens), first, same, grown, first / same, first / grown,
        static_cast<long long>(reused_same), static_cast<long long>(reused_grown), p_first, p_same, p_grown,
        diff, same_parts.c_str(), grown_parts.c_str());
    return 0;
}
