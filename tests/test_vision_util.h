// Shared by the image tests (test_image_decision, test_mmproj).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "decision/engine.h"
#include "image/image.h"
#include "test_util.h"
#include "util/json.h"

namespace clef::testing {

// Nested int arrays of a golden, flattened in order.
inline std::vector<int32_t> ints_of(const JsonValue& arr) {
    std::vector<int32_t> v;
    for (const auto& x : arr.items()) {
        if (x.is_array()) {
            const auto inner = ints_of(x);
            v.insert(v.end(), inner.begin(), inner.end());
        } else {
            v.push_back(static_cast<int32_t>(x.as_int64()));
        }
    }
    return v;
}

// A prepared image or video request against its case's goldens: ids, lengths, the media offset, token types,
// MRoPE positions and every prompt segment.
inline void expect_media_prompt_matches(const Engine::Prepared& p, const JsonValue& c) {
    EXPECT_EQ(p.prompt.input_ids, ints_of(*c.find("input_ids")));
    EXPECT_EQ(p.prompt.fixed_length, c.find("fixed_length")->as_int64());
    EXPECT_EQ(p.prompt.state_tokens_total, c.find("state_tokens_total")->as_int64());
    EXPECT_EQ(p.prompt.state_tokens_kept, c.find("state_tokens_kept")->as_int64());
    EXPECT_EQ(p.prompt.media_token_offset, c.find("media_token_offset")->as_int64());
    EXPECT_EQ(p.mm_token_type_ids, ints_of(*c.find("mm_token_type_ids")));
    EXPECT_EQ(p.position_ids, ints_of(*c.find("position_ids")));
    EXPECT_EQ(p.rope_delta, c.find("rope_delta")->as_int64());
    const auto& segs = c.find("segments")->items();
    ASSERT_EQ(p.prompt.segments.size(), segs.size());
    for (size_t i = 0; i < segs.size(); ++i) {
        EXPECT_EQ(p.prompt.segments[i].role, segs[i].find("role")->as_string()) << i;
        EXPECT_EQ(p.prompt.segments[i].ids, ints_of(*segs[i].find("ids"))) << i;
        EXPECT_EQ(p.prompt.segments[i].text, segs[i].find("text")->as_string()) << i;
    }
}

// An engine without a vision tower refuses a request with images ("no vision tower") and, once the images
// are taken out, answers it.
inline void expect_refuses_images_answers_text(Engine& e, DecisionRequest req) {
    EXPECT_EQ(e.vision(), nullptr);
    try {
        e.prepare(req);
        ADD_FAILURE() << "expected ImageError";
    } catch (const ImageError& err) {
        EXPECT_NE(std::string(err.what()).find("no vision tower"), std::string::npos) << err.what();
    }
    req.decoded_images.clear();
    EXPECT_NO_THROW(e.decide(req));
}

struct GoldenDiff {
    double hidden_max = 0, hidden_mean = 0, logits_max = 0, probabilities_max = 0;
};

// A decision (run with keep_hidden) against an image or video case's float64 goldens, with the fixture's
// tolerances (tests/data/tiny-clef/README.md "Tolerances observed"): the same ids, last hidden state max 5e-3
// / mean 2e-5, logits 2e-4, probabilities 2e-5, response numbers 1e-4. Returns the differences measured.
inline GoldenDiff expect_matches_image_golden(const Decision& d, const JsonValue& c) {
    GoldenDiff g;
    std::vector<int32_t> ids;
    for (const auto& x : c.find("input_ids")->items()) ids.push_back(static_cast<int32_t>(x.as_int64()));
    EXPECT_EQ(d.prompt.input_ids, ids);
    // The hidden states are left out of the trimmed video goldens (tests/data/tiny-clef/PROVENANCE.md).
    if (const JsonValue* hidden_golden = c.find("last_hidden_state")) {
        const auto& lhs = hidden_golden->items();
        const size_t hidden = lhs.empty() ? 0 : lhs[0].items().size();
        EXPECT_EQ(d.last_hidden_state.size(), lhs.size() * hidden);
        if (d.last_hidden_state.size() != lhs.size() * hidden) return g;
        double hsum = 0;
        for (size_t t = 0; t < lhs.size(); ++t)
            for (size_t j = 0; j < hidden; ++j) {
                const double e =
                    std::abs(d.last_hidden_state[t * hidden + j] - lhs[t].items()[j].as_double());
                g.hidden_max = std::max(g.hidden_max, e);
                hsum += e;
            }
        g.hidden_mean = hsum / static_cast<double>(std::max<size_t>(1, lhs.size() * hidden));
        EXPECT_LE(g.hidden_max, 5e-3);
        EXPECT_LE(g.hidden_mean, 2e-5);
    }
    const auto& qs = c.find("questions")->items();
    EXPECT_EQ(d.logits.size(), qs.size());
    for (size_t i = 0; i < qs.size() && i < d.logits.size(); ++i) {
        const auto& lg = qs[i].find("logits")->items();
        const auto& pr = qs[i].find("probabilities")->items();
        EXPECT_EQ(d.logits[i].size(), lg.size());
        for (size_t j = 0; j < lg.size() && j < d.logits[i].size(); ++j) {
            g.logits_max = std::max(g.logits_max, std::abs(d.logits[i][j] - lg[j].as_double()));
            g.probabilities_max =
                std::max(g.probabilities_max, std::abs(d.probabilities[i][j] - pr[j].as_double()));
        }
    }
    EXPECT_LE(g.logits_max, 2e-4);
    EXPECT_LE(g.probabilities_max, 2e-5);
    expect_json_near(d.response, *c.find("response"), 1e-4, "response");
    return g;
}

}  // namespace clef::testing
