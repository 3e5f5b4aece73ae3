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

// A decision (run with keep_hidden) against an image case's float64 goldens, with the fixture's tolerances
// (tests/data/tiny-clef/README.md "Tolerances observed"): the same ids, last hidden state max 5e-3 / mean
// 2e-5, logits 2e-4, probabilities 2e-5, response numbers 1e-4. Returns the differences measured.
inline GoldenDiff expect_matches_image_golden(const Decision& d, const JsonValue& c) {
    GoldenDiff g;
    std::vector<int32_t> ids;
    for (const auto& x : c.find("input_ids")->items()) ids.push_back(static_cast<int32_t>(x.as_int64()));
    EXPECT_EQ(d.prompt.input_ids, ids);
    const auto& lhs = c.find("last_hidden_state")->items();
    const size_t hidden = lhs.empty() ? 0 : lhs[0].items().size();
    EXPECT_EQ(d.last_hidden_state.size(), lhs.size() * hidden);
    if (d.last_hidden_state.size() != lhs.size() * hidden) return g;
    double hsum = 0;
    for (size_t t = 0; t < lhs.size(); ++t)
        for (size_t j = 0; j < hidden; ++j) {
            const double e = std::abs(d.last_hidden_state[t * hidden + j] - lhs[t].items()[j].as_double());
            g.hidden_max = std::max(g.hidden_max, e);
            hsum += e;
        }
    g.hidden_mean = hsum / static_cast<double>(std::max<size_t>(1, lhs.size() * hidden));
    EXPECT_LE(g.hidden_max, 5e-3);
    EXPECT_LE(g.hidden_mean, 2e-5);
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
