// The state cache: prompt prefixes computed once and resumed by later decisions (docs/CACHE.md).
//
// Clef's prompt puts the state before the questions (prefix → [media] → state → schema → suffix), the Gated
// DeltaNet layers carry a fixed-size state and attention a K/V cache, and the head reads nothing from before
// the schema but its per-token memory rows. So everything up to the end of the state can be kept and resumed.
//
// Entries form chains: a node holds the tokens [begin, end) of one stretch of a prompt, the attention K/V
// rows and head memory rows of that stretch, and the recurrent state (conv taps, delta-rule matrices) at its
// end. Its key hashes its parent's key with its tokens (the chain's root key hashes the images), so a prompt
// finds the longest cached prefix by walking its own stop positions; every hit is verified token by token, so
// a hash collision can only cause a miss. Stops are every `granularity` tokens inside the state and the end
// of the state. The cache evicts least-recently-used leaves to stay within its byte budget.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "image/preprocess.h"
#include "model/backbone.h"

namespace clef {

struct StateCacheStats {
    uint64_t lookups = 0, hits = 0;  // a hit resumes at least one cached token
    uint64_t tokens_reused = 0;
    uint64_t bytes = 0, entries = 0, budget = 0;
};

class StateCache {
public:
    // budget_bytes: the most the entries may hold. granularity: tokens between stops inside a state.
    explicit StateCache(uint64_t budget_bytes, int64_t granularity = 256);

    // A prompt's stops (ascending: every granularity tokens inside the state, then the state's end) and the
    // key of the prefix [0, stop) for each.
    struct Plan {
        std::vector<int64_t> stops;
        std::vector<uint64_t> keys;
    };
    // media_key: the images' key (0 without images); state_end: where the state ends (the schema begins).
    Plan plan(const std::vector<int32_t>& ids, uint64_t media_key, int64_t state_end) const;

    // One resumed prefix: the backbone state at `position` (K/V rows of [0, position) included, with room
    // for the rest of the prompt's) and the head's memory rows [0, position), one stretch ([rows][width]) per
    // entry of the chain, read in place: `entries` keeps those alive (an eviction meanwhile only unlists
    // them).
    struct Resume {
        int64_t position = 0;
        size_t stops_done = 0;  // how many of the plan's stops the resumed prefix covers
        BackboneState state;
        std::vector<std::pair<const float*, int64_t>> memory;  // (rows, how many)
        std::vector<std::shared_ptr<const void>> entries;
    };
    // The longest cached prefix of ids among the plan's stops; position 0 and `fresh` (the backbone's start()
    // state) on a miss. A hit copies the recurrent state of its last entry and the K/V rows of the chain
    // once, into K/V caches sized for all of ids.
    Resume find(const Plan& plan, const std::vector<int32_t>& ids, BackboneState fresh, int64_t width);
    // Stores the stretch that ends at plan.stops[i] (from the previous stop): its tokens, the state there
    // (its K/V rows of the stretch) and the head memory rows of the stretch ([stretch][width]).
    void put(const Plan& plan, size_t i, const std::vector<int32_t>& ids, const BackboneState& state,
             const float* memory_rows, int64_t width);

    StateCacheStats stats() const;
    uint64_t budget() const { return budget_; }

private:
    struct Node;
    void touch(Node* n);
    void evict_to(uint64_t budget);

    uint64_t budget_;
    int64_t granularity_;
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, std::shared_ptr<Node>> nodes_;
    uint64_t tick_ = 0;
    StateCacheStats stats_;
};

// A key for a prompt's images (their resized pixels and sizes); 0 without images.
uint64_t media_key_of(const std::vector<ProcessedImage>& images);

}  // namespace clef
