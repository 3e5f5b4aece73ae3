// The state cache (decision/state_cache.h) over every fixture case: decisions that resume a cached prompt
// prefix answer as the publisher's reference does (tests/data/tiny-clef/cases.json goldens) and within 2e-5
// of the same decision without the cache; the cache stays within its budget. (The lighter cache tests, which
// the sanitizer run also runs, are in test_state_cache.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "decision/engine.h"
#include "decision/state_cache.h"
#include "test_state_cache_util.h"

using namespace clef;
using namespace clef::testing::state_cache;

namespace {

struct Case {
    std::string name;
    DecisionRequest req;
    DecideOptions opt;
    const JsonValue* questions = nullptr;
};

std::vector<Case> decision_cases() {
    std::vector<Case> out;
    for (const auto& c : clef::testing::tiny_cases().items()) {
        if (c.find("expected_error")) continue;
        Case k;
        k.name = c.find("name")->as_string();
        std::vector<RequestError> errors;
        EXPECT_TRUE(clef::testing::parse_case_request(c, k.req, errors)) << k.name;
        k.opt.max_length = static_cast<int>(c.find("max_length")->as_int64());
        k.questions = c.find("questions");
        out.push_back(std::move(k));
    }
    return out;
}

double max_golden_diff(const Decision& d, const JsonValue& questions) {
    double m = 0;
    const auto& qs = questions.items();
    for (size_t i = 0; i < qs.size(); ++i) {
        const auto& wp = qs[i].find("probabilities")->items();
        for (size_t j = 0; j < wp.size(); ++j)
            m = std::max(m, std::fabs(d.probabilities[i][j] - wp[j].as_double()));
    }
    return m;
}

}  // namespace

// Every fixture case twice on one cached engine: the second run resumes the whole state (the first at most
// the shared system prefix); both match the goldens (the tolerance of tests/test_decision.cpp) and the
// uncached engine within 2e-5.
TEST(StateCache, HitsAnswerAsTheReference) {
    const std::unique_ptr<Engine> e = cached_engine();
    int hits = 0;
    for (const Case& c : decision_cases()) {
        SCOPED_TRACE(c.name);
        const Decision plain = plain_engine().decide(c.req, c.opt);
        const Decision first = e->decide(c.req, c.opt);
        const Decision again = e->decide(c.req, c.opt);
        // The first run may resume the system prefix the earlier cases share, never the whole state.
        EXPECT_LT(first.tokens_reused, first.prompt.state_end);
        EXPECT_EQ(again.tokens_reused, again.prompt.state_end);
        hits += again.tokens_reused > 0;
        EXPECT_LE(max_prob_diff(first, plain), 2e-5);
        EXPECT_LE(max_prob_diff(again, plain), 2e-5);
        EXPECT_LE(max_golden_diff(again, *c.questions), 2e-5);
        // The answers as served: rounded to 4 decimals, so probabilities within 2e-5 of each other may round
        // one unit apart where they straddle a rounding edge (special_tokens_in_text's injection: 0.401849);
        // every string (choices, legends) is exact.
        clef::testing::expect_json_near(*again.response.find("answers"), *plain.response.find("answers"),
                                        1e-4 * (1 + 1e-9), "answers");
    }
    EXPECT_GE(hits, 6);
    const StateCacheStats s = e->state_cache_stats();
    EXPECT_GE(s.hits, static_cast<uint64_t>(hits));
    EXPECT_GT(s.tokens_reused, 0u);
    EXPECT_LE(s.bytes, s.budget);
}

// Under a small budget with many distinct states the bytes never exceed it, and decisions stay right.
TEST(StateCache, StaysWithinItsBudget) {
    const uint64_t budget = 256 << 10;
    const std::unique_ptr<Engine> e = cached_engine(budget);
    const std::vector<Case> cases = decision_cases();
    for (int round = 0; round < 3; ++round)
        for (const Case& c : cases) {
            const Decision d = e->decide(c.req, c.opt);
            EXPECT_LE(e->state_cache_stats().bytes, budget);
            EXPECT_LE(max_golden_diff(d, *c.questions), 2e-5) << c.name;
        }
    EXPECT_GT(e->state_cache_stats().entries, 0u);
}
