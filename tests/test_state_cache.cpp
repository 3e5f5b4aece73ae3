// The state cache (decision/state_cache.h): a state asked again or grown resumes its cached prefix and
// answers within 2e-5 of the same decision without the cache; an entry whose tokens differ is a miss. (Every
// fixture case against the goldens and the budget: test_state_cache_parity.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "decision/engine.h"
#include "decision/state_cache.h"
#include "test_state_cache_util.h"

using namespace clef;
using namespace clef::testing::state_cache;

// Another question set on the same state resumes the state; a state grown at its end resumes the snapshot
// before the change.
TEST(StateCache, NewQuestionsAndGrownStates) {
    const std::unique_ptr<Engine> e = cached_engine();
    DecisionRequest req;
    std::string err;
    const std::string state(400, 'x');
    auto request = [&](const std::string& st, const char* question) {
        const std::string body = R"({"model":"tiny-clef","state":")" + st +
                                 R"(","questions":{"q":{"type":"noul","instructions":")" + question +
                                 R"("}}})";
        DecisionRequest r;
        std::vector<RequestError> errors;
        EXPECT_TRUE(parse_request(parse_json_or_throw(body, "request"), r, errors))
            << describe_errors(errors);
        return r;
    };
    const Decision a = e->decide(request(state + " the long ticket text", "Is it urgent?"));
    const Decision b = e->decide(request(state + " the long ticket text", "Is it a bug?"));
    EXPECT_EQ(b.tokens_reused, b.prompt.state_end);
    const Decision grown =
        e->decide(request(state + " the long ticket text and one more line", "Is it a bug?"));
    EXPECT_GT(grown.tokens_reused, 0);
    EXPECT_LT(grown.tokens_reused, grown.prompt.state_end);
    const Decision plain =
        plain_engine().decide(request(state + " the long ticket text and one more line", "Is it a bug?"));
    EXPECT_LE(max_prob_diff(grown, plain), 2e-5);
    EXPECT_GT(a.prompt.state_end, 0);
}

// With a bf16 K/V cache (BackboneOptions::kv_bf16) the entries hold the bf16 rows, and a resumed decision
// answers as the same decision without the cache.
TEST(StateCache, Bf16KvRowsResume) {
    const std::unique_ptr<Engine> e = cached_engine();
    DecideOptions opt;
    opt.backbone.kv_bf16 = true;
    auto request = [](const char* question) {
        const std::string body = R"({"model":"tiny-clef","state":")" + std::string(300, 'y') +
                                 R"( a refund request","questions":{"q":{"type":"noul","instructions":")" +
                                 question + R"("}}})";
        DecisionRequest r;
        std::vector<RequestError> errors;
        EXPECT_TRUE(parse_request(parse_json_or_throw(body, "request"), r, errors))
            << describe_errors(errors);
        return r;
    };
    e->decide(request("Is it urgent?"), opt);
    const Decision b = e->decide(request("Is it a refund?"), opt);
    EXPECT_EQ(b.tokens_reused, b.prompt.state_end);
    const Decision plain = plain_engine().decide(request("Is it a refund?"), opt);
    EXPECT_LE(max_prob_diff(b, plain), 2e-5);
    DecideOptions f32;  // the same state with an fp32 cache differs (the option is in effect)
    EXPECT_GT(max_prob_diff(plain_engine().decide(request("Is it a refund?"), f32), plain), 0.0);
}

// A prompt whose tokens differ from an entry with the same key (a forged collision) is a miss.
TEST(StateCache, MismatchedTokensAreAMiss) {
    StateCache cache(1 << 20, 4);
    const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    StateCache::Plan plan = cache.plan(ids, 0, 8);
    ASSERT_EQ(plan.stops, (std::vector<int64_t>{4, 8}));
    BackboneState st;
    st.layers.resize(1);
    st.position = 4;
    const std::vector<float> memory(4 * 2, 1.f);
    cache.put(plan, 0, ids, st, memory.data(), 2);
    BackboneState fresh;
    fresh.layers.resize(1);
    EXPECT_EQ(cache.find(plan, ids, fresh, 2).position, 4);
    std::vector<int32_t> other = ids;
    other[2] = 99;  // same plan keys (forged), other tokens
    EXPECT_EQ(cache.find(plan, other, fresh, 2).position, 0);
    EXPECT_EQ(cache.find(cache.plan(other, 0, 8), other, fresh, 2).position, 0);
    EXPECT_EQ(cache.find(cache.plan(ids, 7, 8), ids, fresh, 2).position, 0);  // other images
}
