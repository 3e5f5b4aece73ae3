#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace clef::tok {

// ---------------------------------------------------------------------------------------------------------
// MergeTable

void MergeTable::reserve(size_t n) {
    while ((mask_ + 1) < n * 2 + 2) grow();
}

void MergeTable::grow() {
    std::vector<Entry> old;
    old.swap(slots_);
    const size_t cap = (mask_ + 1) * 2;
    slots_.assign(cap, Entry{kEmpty, 0, 0});
    mask_ = cap - 1;
    shift_ -= 1;
    for (const Entry& e : old) {
        if (e.key == kEmpty) continue;
        size_t i = slot(e.key);
        while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
        slots_[i] = e;
    }
}

bool MergeTable::insert(int32_t a, int32_t b, uint32_t rank, int32_t id, bool replace) {
    if ((count_ + 1) * 2 > mask_ + 1) grow();
    const uint64_t key = make_key(a, b);
    size_t i = slot(key);
    while (slots_[i].key != kEmpty) {
        if (slots_[i].key == key) {
            if (!replace) return false;
            slots_[i].rank = rank;
            slots_[i].id = id;
            return true;
        }
        i = (i + 1) & mask_;
    }
    slots_[i] = Entry{key, rank, id};
    ++count_;
    return true;
}

// ---------------------------------------------------------------------------------------------------------
// BPE

namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
constexpr size_t kLinearMax =
    48;  // words up to this many symbols use the quadratic scan (cheaper when short)

void merge_linear(const int32_t* ids, size_t n, const MergeTable& merges, BpeScratch& sc,
                  std::vector<int32_t>& out) {
    auto& syms = sc.syms;
    auto& rank = sc.pair_rank;
    syms.resize(n);
    rank.resize(n);
    std::vector<int32_t>& merged = sc.merged_id;
    merged.resize(n);
    for (size_t i = 0; i < n; ++i) {
        syms[i] = {ids[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
    }
    auto update = [&](int32_t i) {
        const int32_t j = syms[i].next;
        if (j < 0) {
            rank[i] = kNoRank;
            return;
        }
        const MergeTable::Entry* e = merges.find(syms[i].id, syms[j].id);
        rank[i] = e ? e->rank : kNoRank;
        merged[i] = e ? e->id : -1;
    };
    for (size_t i = 0; i < n; ++i) update(static_cast<int32_t>(i));
    while (true) {
        uint32_t best = kNoRank;
        int32_t at = -1;
        for (int32_t i = 0; i >= 0; i = syms[i].next) {
            if (rank[i] < best) {
                best = rank[i];
                at = i;
            }
        }
        if (at < 0) break;
        const int32_t j = syms[at].next;
        syms[at].id = merged[at];
        syms[at].next = syms[j].next;
        if (syms[j].next >= 0) syms[syms[j].next].prev = at;
        update(at);
        if (syms[at].prev >= 0) update(syms[at].prev);
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

struct CandGreater {
    bool operator()(const BpeScratch::Cand& a, const BpeScratch::Cand& b) const {
        return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    }
};

void merge_heap(const int32_t* ids, size_t n, const MergeTable& merges, BpeScratch& sc,
                std::vector<int32_t>& out) {
    auto& syms = sc.syms;
    auto& heap = sc.heap;
    syms.resize(n);
    heap.clear();
    for (size_t i = 0; i < n; ++i) {
        syms[i] = {ids[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
    }
    auto push = [&](int32_t i) {
        const int32_t j = syms[i].next;
        if (j < 0) return;
        if (const MergeTable::Entry* e = merges.find(syms[i].id, syms[j].id)) {
            heap.push_back({e->rank, i, syms[i].id, syms[j].id});
            std::push_heap(heap.begin(), heap.end(), CandGreater{});
        }
    };
    for (size_t i = 0; i + 1 < n; ++i) {
        if (const MergeTable::Entry* e = merges.find(ids[i], ids[i + 1])) {
            heap.push_back({e->rank, static_cast<int32_t>(i), ids[i], ids[i + 1]});
        }
    }
    std::make_heap(heap.begin(), heap.end(), CandGreater{});
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), CandGreater{});
        const BpeScratch::Cand c = heap.back();
        heap.pop_back();
        BpeScratch::Sym& s = syms[c.pos];
        if (s.id != c.left || s.next < 0) continue;  // merged away or changed since queued
        const int32_t j = s.next;
        if (syms[j].id != c.right) continue;
        const MergeTable::Entry* e = merges.find(c.left, c.right);
        s.id = e->id;
        s.next = syms[j].next;
        if (s.next >= 0) syms[s.next].prev = c.pos;
        syms[j].id = -1;
        if (s.prev >= 0) push(s.prev);
        push(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace

void bpe_merge(const int32_t* ids, size_t n, const MergeTable& merges, BpeScratch& scratch,
               std::vector<int32_t>& out) {
    if (n == 0) return;
    if (n == 1) {
        out.push_back(ids[0]);
        return;
    }
    if (n <= kLinearMax)
        merge_linear(ids, n, merges, scratch, out);
    else
        merge_heap(ids, n, merges, scratch, out);
}

// ---------------------------------------------------------------------------------------------------------
// WordCache

WordCache::WordCache(size_t max_entries) : max_entries_(max_entries) {
    size_t cap = 16;
    while (cap < max_entries * 2) cap *= 2;
    slots_.assign(cap, Slot{0, 0, 0, 0, 0});
}

bool WordCache::lookup(std::string_view key, size_t hash, std::vector<int32_t>& out) const {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        const Slot& s = slots_[i];
        if (s.key_len == 0) return false;
        if (s.hash == hash && s.key_len == key.size() &&
            std::memcmp(keys_.data() + s.key_off, key.data(), key.size()) == 0) {
            out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.ids_len);
            return true;
        }
    }
}

void WordCache::insert(std::string_view key, size_t hash, const int32_t* ids, size_t n) {
    if (key.empty() || key.size() > kMaxKeyLen) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (count_ >= max_entries_) clear_locked();
    const size_t mask = slots_.size() - 1;
    size_t i = hash & mask;
    for (;; i = (i + 1) & mask) {
        const Slot& s = slots_[i];
        if (s.key_len == 0) break;
        if (s.hash == hash && s.key_len == key.size() &&
            std::memcmp(keys_.data() + s.key_off, key.data(), key.size()) == 0)
            return;  // another thread got there first
    }
    slots_[i] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(key.size()),
                     static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(n)};
    keys_.append(key);
    ids_.insert(ids_.end(), ids, ids + n);
    ++count_;
}

void WordCache::clear() {
    std::lock_guard<std::mutex> lock(mu_);
    clear_locked();
}

void WordCache::clear_locked() {
    std::fill(slots_.begin(), slots_.end(), Slot{0, 0, 0, 0, 0});
    keys_.clear();
    ids_.clear();
    count_ = 0;
}

}  // namespace clef::tok
