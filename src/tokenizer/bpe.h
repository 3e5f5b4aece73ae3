// Internal: the byte-level BPE merge loop, its merge table and the per-word result cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace clef::tok {

// (left id, right id) -> (rank, merged id). Open addressing over 64-bit keys.
class MergeTable {
public:
    struct Entry {
        uint64_t key;  // kEmpty when unused
        uint32_t rank;
        int32_t id;
    };
    static constexpr uint64_t kEmpty = ~uint64_t{0};

    void reserve(size_t n);
    // Inserts or (when `replace`) overwrites. Returns false when the pair existed and was kept.
    bool insert(int32_t a, int32_t b, uint32_t rank, int32_t id, bool replace);
    const Entry* find(int32_t a, int32_t b) const {
        const uint64_t key = make_key(a, b);
        size_t i = slot(key);
        while (true) {
            const Entry& e = slots_[i];
            if (e.key == key) return &e;
            if (e.key == kEmpty) return nullptr;
            i = (i + 1) & mask_;
        }
    }
    size_t size() const { return count_; }

private:
    static uint64_t make_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
    size_t slot(uint64_t key) const {
        return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
    }
    void grow();

    std::vector<Entry> slots_ = std::vector<Entry>(16, Entry{kEmpty, 0, 0});
    size_t mask_ = 15;
    int shift_ = 60;
    size_t count_ = 0;
};

// Reusable buffers for bpe_merge (one per encode call; avoids per-word allocations).
struct BpeScratch {
    struct Sym {
        int32_t id;
        int32_t prev;
        int32_t next;
    };
    struct Cand {
        uint32_t rank;
        int32_t pos;
        int32_t left;  // ids the pair had when queued (stale entries are skipped)
        int32_t right;
    };
    std::vector<Sym> syms;
    std::vector<uint32_t> pair_rank;  // linear path: rank of (i, next(i)), UINT32_MAX when none
    std::vector<int32_t> merged_id;   // linear path: id that pair would merge into
    std::vector<Cand> heap;
};

// Merges `ids` (the initial per-byte symbols of one pre-token) by rank, lowest rank first, leftmost on ties;
// appends the result to out. Identical to Hugging Face's BPE::merge_word without dropout.
void bpe_merge(const int32_t* ids, size_t n, const MergeTable& merges, BpeScratch& scratch,
               std::vector<int32_t>& out);

// Bounded cache: pre-token bytes -> ids. Thread-safe; cleared wholesale when full.
class WordCache {
public:
    static constexpr size_t kMaxKeyLen = 128;
    explicit WordCache(size_t max_entries = 1 << 16);
    // Appends the cached ids for key to out; false when absent.
    bool lookup(std::string_view key, size_t hash, std::vector<int32_t>& out) const;
    void insert(std::string_view key, size_t hash, const int32_t* ids, size_t n);
    void clear();

private:
    struct Slot {
        size_t hash;
        uint32_t key_off;
        uint32_t key_len;  // 0 marks an empty slot (empty keys are never cached)
        uint32_t ids_off;
        uint32_t ids_len;
    };
    void clear_locked();

    mutable std::mutex mu_;
    size_t max_entries_;
    size_t count_ = 0;
    std::vector<Slot> slots_;
    std::string keys_;
    std::vector<int32_t> ids_;
};

}  // namespace clef::tok
