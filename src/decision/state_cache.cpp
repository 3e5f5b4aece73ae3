#include "decision/state_cache.h"

#include <algorithm>
#include <cstring>

namespace clef {

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

uint64_t hash_ids(uint64_t h, const int32_t* ids, int64_t n) {
    for (int64_t i = 0; i < n; ++i) h = mix(h, static_cast<uint32_t>(ids[i]));
    return mix(h, static_cast<uint64_t>(n));
}

template <class T>
uint64_t vector_bytes(const std::vector<T>& v) {
    return v.size() * sizeof(T);
}

template <class T>
void append(std::vector<T>& to, const std::vector<T>& from) {
    to.insert(to.end(), from.begin(), from.end());
}

// The K/V rows of a chain of stored stretches (fp32 or bf16, as the cache holds them) into a cache with room
// for `rows` rows (the whole prompt's, so the prefill appends without moving them again).
template <class Node>
void restore_rows(BackboneState::Layer& to, const std::vector<const Node*>& chain, size_t l, int64_t rows) {
    auto pair = [&](auto member) {
        const Node& last = *chain.back();
        const size_t row = (last.layers[l].*member).size() / static_cast<size_t>(last.end - last.begin);
        auto& dst = to.*member;
        dst.clear();
        dst.reserve(row * static_cast<size_t>(rows));
        for (const Node* n : chain) append(dst, n->layers[l].*member);
    };
    pair(&BackboneState::Layer::k), pair(&BackboneState::Layer::v);
    pair(&BackboneState::Layer::kb), pair(&BackboneState::Layer::vb);
}

// The K/V rows of positions [begin, end) (the last end - begin of the cache) of an attention layer.
void copy_stretch(const BackboneState::Layer& s, int64_t begin, int64_t end, BackboneState::Layer& d) {
    auto tail = [&](const auto& from, auto& to) {
        if (from.empty()) return;
        const size_t row = from.size() / static_cast<size_t>(end);
        to.assign(from.begin() + static_cast<std::ptrdiff_t>(row * static_cast<size_t>(begin)), from.end());
    };
    tail(s.k, d.k), tail(s.v, d.v), tail(s.kb, d.kb), tail(s.vb, d.vb);
}

}  // namespace

struct StateCache::Node {
    uint64_t key = 0;
    std::shared_ptr<Node> parent;
    int64_t begin = 0, end = 0;
    std::vector<int32_t> tokens;               // [begin, end)
    std::vector<BackboneState::Layer> layers;  // conv + delta at end; K/V rows of [begin, end) only
    std::vector<float> memory;                 // head memory rows of [begin, end)
    uint64_t bytes = 0, last_use = 0;
    int children = 0;
};

StateCache::StateCache(uint64_t budget_bytes, int64_t granularity)
    : budget_(budget_bytes), granularity_(std::max<int64_t>(granularity, 1)) {
    stats_.budget = budget_bytes;
}

StateCache::Plan StateCache::plan(const std::vector<int32_t>& ids, uint64_t media_key,
                                  int64_t state_end) const {
    Plan p;
    state_end = std::min<int64_t>(state_end, static_cast<int64_t>(ids.size()));
    for (int64_t s = granularity_; s < state_end; s += granularity_) p.stops.push_back(s);
    if (state_end > 0) p.stops.push_back(state_end);
    uint64_t h = mix(0x636c6566ull, media_key);
    int64_t prev = 0;
    for (int64_t s : p.stops) {
        h = hash_ids(h, ids.data() + prev, s - prev);
        p.keys.push_back(h);
        prev = s;
    }
    return p;
}

StateCache::Resume StateCache::find(const Plan& plan, const std::vector<int32_t>& ids, BackboneState fresh,
                                    int64_t width) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.lookups;
    std::shared_ptr<Node> last;
    size_t done = 0;
    for (size_t i = 0; i < plan.stops.size(); ++i) {
        auto it = nodes_.find(plan.keys[i]);
        if (it == nodes_.end()) break;
        const Node& n = *it->second;
        const int64_t begin = i ? plan.stops[i - 1] : 0;
        // Verified token by token (and by its place in the chain): a collision is a miss, never a wrong
        // answer.
        if (n.parent != last || n.begin != begin || n.end != plan.stops[i] ||
            !std::equal(n.tokens.begin(), n.tokens.end(), ids.begin() + begin) ||
            n.layers.size() != fresh.layers.size() ||
            static_cast<int64_t>(n.memory.size()) != (n.end - n.begin) * width)
            break;
        last = it->second;
        done = i + 1;
    }
    // A stretch another prompt stored past the last shared stop (e.g. the end of a state this one extends).
    if (last && !plan.stops.empty()) {
        std::shared_ptr<Node> ext;
        for (const auto& [key, n] : nodes_)
            if (n->parent == last && n->begin == last->end && n->end <= plan.stops.back() &&
                (!ext || n->end > ext->end) && n->layers.size() == fresh.layers.size() &&
                static_cast<int64_t>(n->memory.size()) == (n->end - n->begin) * width &&
                std::equal(n->tokens.begin(), n->tokens.end(), ids.begin() + n->begin))
                ext = n;
        if (ext) last = ext;
    }
    Resume r;
    r.state = std::move(fresh);
    if (!last) return r;
    while (done < plan.stops.size() && plan.stops[done] <= last->end) ++done;
    std::vector<const Node*> chain;
    for (const Node* n = last.get(); n; n = n->parent.get()) chain.push_back(n);
    std::reverse(chain.begin(), chain.end());
    const int64_t T = static_cast<int64_t>(ids.size());
    for (size_t l = 0; l < r.state.layers.size(); ++l) {
        r.state.layers[l].conv = last->layers[l].conv;
        r.state.layers[l].delta = last->layers[l].delta;
        restore_rows(r.state.layers[l], chain, l, T);
    }
    for (const Node* n : chain) r.memory.emplace_back(n->memory.data(), n->end - n->begin);
    for (auto n = last; n; n = n->parent) r.entries.push_back(n);
    r.position = last->end;
    r.state.position = last->end;
    r.stops_done = done;
    touch(last.get());
    ++stats_.hits;
    stats_.tokens_reused += static_cast<uint64_t>(r.position);
    return r;
}

void StateCache::put(const Plan& plan, size_t i, const std::vector<int32_t>& ids, const BackboneState& state,
                     const float* memory_rows, int64_t width) {
    const int64_t begin = i ? plan.stops[i - 1] : 0, end = plan.stops[i];
    if (state.position != end) return;
    auto n = std::make_shared<Node>();
    n->key = plan.keys[i];
    n->begin = begin;
    n->end = end;
    n->tokens.assign(ids.begin() + begin, ids.begin() + end);
    n->memory.assign(memory_rows, memory_rows + (end - begin) * width);
    n->layers.resize(state.layers.size());
    for (size_t l = 0; l < state.layers.size(); ++l) {
        const BackboneState::Layer& s = state.layers[l];
        BackboneState::Layer& d = n->layers[l];
        d.conv = s.conv;
        d.delta = s.delta;
        copy_stretch(s, begin, end, d);
        n->bytes += vector_bytes(d.conv) + vector_bytes(d.delta) + vector_bytes(d.k) + vector_bytes(d.v) +
                    vector_bytes(d.kb) + vector_bytes(d.vb);
    }
    n->bytes += vector_bytes(n->tokens) + vector_bytes(n->memory) + sizeof(Node);
    std::lock_guard<std::mutex> lock(mu_);
    if (n->bytes > budget_ || nodes_.count(n->key)) return;
    if (i > 0) {
        auto p = nodes_.find(plan.keys[i - 1]);
        if (p == nodes_.end() || p->second->end != begin) return;  // the parent was evicted meanwhile
        n->parent = p->second;
        ++n->parent->children;
    }
    touch(n.get());
    stats_.bytes += n->bytes;
    ++stats_.entries;
    nodes_.emplace(n->key, n);
    evict_to(budget_);
}

void StateCache::touch(Node* n) {
    const uint64_t t = ++tick_;
    for (; n; n = n->parent.get()) n->last_use = t;
}

// Removes least-recently-used leaves (entries no other entry extends) until the bytes fit.
void StateCache::evict_to(uint64_t budget) {
    while (stats_.bytes > budget && !nodes_.empty()) {
        auto victim = nodes_.end();
        for (auto it = nodes_.begin(); it != nodes_.end(); ++it)
            if (it->second->children == 0 &&
                (victim == nodes_.end() || it->second->last_use < victim->second->last_use))
                victim = it;
        if (victim == nodes_.end()) return;
        Node& n = *victim->second;
        if (n.parent) --n.parent->children;
        stats_.bytes -= n.bytes;
        --stats_.entries;
        nodes_.erase(victim);
    }
}

StateCacheStats StateCache::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

uint64_t media_key_of(const std::vector<ProcessedImage>& images) {
    if (images.empty()) return 0;
    uint64_t h = 0x6d65646961ull;
    for (const ProcessedImage& img : images) {
        const RgbImage& r = img.resized;
        h = mix(h, static_cast<uint64_t>(r.width) << 32 | static_cast<uint32_t>(r.height));
        h = mix(h, static_cast<uint64_t>(img.grid_t));
        uint64_t word = 0;
        for (size_t j = 0; j < r.pixels.size(); ++j) {
            word = word << 8 | r.pixels[j];
            if (j % 8 == 7) h = mix(h, word), word = 0;
        }
        h = mix(h, word ^ r.pixels.size());
    }
    return h == 0 ? 1 : h;
}

}  // namespace clef
