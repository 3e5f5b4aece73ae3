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

// A hit copies the last entry's recurrent state and the chain's K/V rows once, into caches with room for the
// whole prompt (the prefill then appends in place), and hands out the chain's memory rows in place, kept
// alive by the Resume when the cache drops its entries.
TEST(StateCache, AHitRestoresTheChainOnceWithRoomForThePrompt) {
    const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const int64_t kv = 2, width = 3;  // K/V values per row, memory values per row
    // The state at `end` tokens: layer 0 recurrent (conv, delta), layer 1 attention with K/V row t = (t, -t).
    auto state_at = [&](int64_t end) {
        BackboneState s;
        s.position = end;
        s.layers.resize(2);
        s.layers[0].conv = {float(end), 1.f};
        s.layers[0].delta = {float(end), 2.f, 3.f};
        for (int64_t t = 0; t < end; ++t)
            for (int64_t c = 0; c < kv; ++c) {
                s.layers[1].k.push_back(float(c ? -t : t));
                s.layers[1].v.push_back(float(100 * t + c));
            }
        return s;
    };
    std::vector<float> memory(8 * width);  // row t = (t, t + 0.5, t + 0.25)
    for (int64_t t = 0; t < 8; ++t)
        for (int64_t c = 0; c < width; ++c) memory[t * width + c] = float(t) + (c ? 1.f / float(2 * c) : 0.f);
    StateCache::Resume r;
    {
        StateCache cache(1 << 20, 4);
        const StateCache::Plan plan = cache.plan(ids, 0, 8);
        ASSERT_EQ(plan.stops, (std::vector<int64_t>{4, 8}));
        cache.put(plan, 0, ids, state_at(4), memory.data(), width);
        cache.put(plan, 1, ids, state_at(8), memory.data() + 4 * width, width);
        BackboneState fresh;
        fresh.layers.resize(2);
        r = cache.find(plan, ids, fresh, width);
    }  // the cache and its lists are gone; the Resume holds the entries it hands out
    ASSERT_EQ(r.position, 8);
    EXPECT_EQ(r.stops_done, 2u);
    const BackboneState want = state_at(8);
    EXPECT_EQ(r.state.position, 8);
    EXPECT_EQ(r.state.layers[0].conv, want.layers[0].conv);
    EXPECT_EQ(r.state.layers[0].delta, want.layers[0].delta);
    EXPECT_TRUE(r.state.layers[0].k.empty() && r.state.layers[0].kb.empty());
    EXPECT_EQ(r.state.layers[1].k, want.layers[1].k);
    EXPECT_EQ(r.state.layers[1].v, want.layers[1].v);
    // Room for the 12 tokens' rows: the prefill's 4 more rows do not move the 8 restored ones.
    EXPECT_GE(r.state.layers[1].k.capacity(), ids.size() * kv);
    EXPECT_GE(r.state.layers[1].v.capacity(), ids.size() * kv);
    std::vector<float> got;
    for (const auto& [rows, n] : r.memory) got.insert(got.end(), rows, rows + n * width);
    EXPECT_EQ(got, memory);
    EXPECT_EQ(r.memory.size(), 2u);  // one stretch per entry, read in place
}
