// Helpers of the state-cache tests (test_state_cache.cpp, test_state_cache_parity.cpp): the tiny fixture with
// the cache off and on, and the largest probability difference between two decisions.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "decision/engine.h"
#include "test_util.h"

namespace clef::testing::state_cache {

inline const std::string kModel = std::string(CLEF_TEST_DATA) + "/tiny-clef";

inline const Engine& plain_engine() {
    static const std::unique_ptr<Engine> e = Engine::load(kModel);
    return *e;
}

// Snapshots every 8 tokens: the fixture's states are short.
inline std::unique_ptr<Engine> cached_engine(uint64_t budget = uint64_t{64} << 20) {
    LoadOptions o;
    o.cache_bytes = budget;
    o.cache_granularity = 8;
    return Engine::load(kModel, "", o);
}

inline double max_prob_diff(const Decision& a, const Decision& b) {
    double m = 0;
    for (size_t i = 0; i < a.probabilities.size(); ++i)
        for (size_t j = 0; j < a.probabilities[i].size(); ++j)
            m = std::max(m, static_cast<double>(std::fabs(a.probabilities[i][j] - b.probabilities[i][j])));
    return m;
}

}  // namespace clef::testing::state_cache
