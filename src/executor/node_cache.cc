// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "executor/node_cache.h"

#include <algorithm>

namespace mooncake::sparse {

NodeCache::NodeCache(std::uint64_t index_capacity_bytes, std::uint64_t range_capacity_bytes)
    : index_capacity_bytes_(index_capacity_bytes),
      range_capacity_bytes_(range_capacity_bytes),
      slabs_(std::max(range_capacity_bytes, kMinFreeSlabBytes)) {}

// ---- Tile indexes ------------------------------------------------------------------------------

std::shared_ptr<const SourceIndex> NodeCache::FindIndex(const std::string& ref) {
    std::lock_guard lock(mu_);
    return FindIndexLocked(ref);
}

NodeCache::IndexClaims NodeCache::ClaimIndexes(std::span<const std::string* const> refs) {
    IndexClaims claims;
    claims.hits.resize(refs.size());
    std::shared_future<IndexBatch> mine;
    std::lock_guard lock(mu_);
    const std::uint64_t call = ++index_claims_;
    for (std::size_t k = 0; k < refs.size(); ++k) {
        const std::string& ref = *refs[k];
        if ((claims.hits[k] = FindIndexLocked(ref))) continue;
        if (auto it = index_flights_.find(ref); it != index_flights_.end()) {
            if (it->second.call == call) {
                claims.repeats.emplace_back(k, it->second.slot);
            } else {
                claims.waits.push_back({k, it->second.batch, it->second.slot});
            }
            continue;
        }
        if (!mine.valid()) mine = claims.flight.get_future().share();
        index_flights_.emplace(ref, IndexFlight{mine, claims.missing.size(), call});
        claims.missing.push_back(k);
    }
    return claims;
}

void NodeCache::FinishIndexes(std::span<const std::string* const> refs, IndexClaims& claims,
                              const std::vector<IndexResult>& results) {
    if (claims.missing.empty()) return;
    {
        // Cache and retire the flights under one lock: a later request finds one or the other.
        std::lock_guard lock(mu_);
        for (std::size_t j = 0; j < claims.missing.size(); ++j) {
            const std::string& ref = *refs[claims.missing[j]];
            if (results[j].ok()) AddIndex(ref, *results[j]);
            index_flights_.erase(ref);
        }
    }
    claims.flight.set_value(std::make_shared<const std::vector<IndexResult>>(results));
}

std::shared_ptr<const SourceIndex> NodeCache::FindIndexLocked(const std::string& ref) {
    auto it = index_.find(ref);
    if (it == index_.end()) return nullptr;
    index_lru_.splice(index_lru_.begin(), index_lru_, it->second.lru);
    return it->second.index;
}

void NodeCache::AddIndex(const std::string& ref, std::shared_ptr<const SourceIndex> idx) {
    if (index_.count(ref)) return;
    const std::uint64_t bytes = idx->index.MemoryBytes() + sizeof(SourceIndex);
    index_lru_.push_front(ref);
    index_.emplace(ref, IndexEntry{std::move(idx), bytes, index_lru_.begin()});
    index_bytes_ += bytes;
    while (index_bytes_ > index_capacity_bytes_ && index_lru_.size() > 1) {
        auto victim = index_.find(index_lru_.back());
        index_bytes_ -= victim->second.bytes;
        index_.erase(victim);
        index_lru_.pop_back();
    }
}

// ---- Range reads -------------------------------------------------------------------------------

namespace {

/// Whether two keys name the same source: the same string, or equal ones.
bool SameSource(const std::string* a, const std::string* b) {
    return a == b || (a != nullptr && b != nullptr && *a == *b);
}

}  // namespace

NodeCache::RangeClaims NodeCache::ClaimRanges(std::span<const RangeKey> ranges,
                                              const void* caller, std::span<ReadData> reads) {
    RangeClaims claims;
    claims.batch = std::make_shared<RangeBatch>();
    claims.batch->done = claims.flight.get_future().share();
    std::lock_guard lock(mu_);
    const std::string* ref = nullptr;
    RangeMap* cached = nullptr;                   // The cached ranges of `ref`, if any.
    std::vector<RangeFlight>* flights = nullptr;  // Its reads in progress, if any.
    for (std::size_t r = 0; r < ranges.size(); ++r) {
        const RangeKey& key = ranges[r];
        if (ref == nullptr || !SameSource(key.source_ref, ref)) {
            ref = key.source_ref;
            auto c = ranges_.find(*ref);
            cached = c == ranges_.end() ? nullptr : &c->second;
            auto f = range_flights_.find(*ref);
            flights = f == range_flights_.end() ? nullptr : &f->second;
        }
        if (cached != nullptr) {
            if (auto hit = FindRange(*cached, key.start, key.end)) {
                reads[r] = *hit;
                ++claims.hits;
                continue;
            }
        }
        if (flights != nullptr) {
            if (RangeFlight* f = FindFlight(*flights, key.start, key.end, caller)) {
                f->batch->waited = true;
                claims.waits.push_back({r, f->batch->done, f->slot});
                continue;
            }
        }
        // Elements of an unordered_map keep their address while others are inserted.
        if (flights == nullptr) flights = &range_flights_[*ref];
        flights->push_back({key.start, key.end, caller, claims.batch, claims.missing.size()});
        claims.missing.push_back(r);
    }
    return claims;
}

void NodeCache::FinishRanges(std::span<const RangeKey> ranges, const void* /*caller*/,
                             const Status& status, std::span<const ReadData> reads,
                             RangeClaims& claims) {
    if (claims.missing.empty()) return;  // No flight was registered.
    bool waited = false;
    {
        // Cache and retire the flights under one lock: a later request finds one or the other.
        std::lock_guard lock(mu_);
        const std::string* ref = nullptr;
        RangeSource* source = nullptr;
        for (std::size_t r : claims.missing) {
            const RangeKey& key = ranges[r];
            if (ref == nullptr || !SameSource(key.source_ref, ref)) {
                ref = key.source_ref;
                EraseFlights(*ref, claims.batch.get());
                // Not erased while we add to it: eviction spares the range added last.
                if (status.ok()) source = &*ranges_.try_emplace(*ref).first;
            }
            if (status.ok()) AddRange(*source, key.start, key.end, reads[r]);
        }
        waited = claims.batch->waited;
    }
    if (!waited) {
        claims.flight.set_value(RangeBatchResult(std::shared_ptr<const std::vector<ReadData>>()));
    } else if (!status.ok()) {
        claims.flight.set_value(RangeBatchResult(status));
    } else {
        auto data = std::make_shared<std::vector<ReadData>>();
        data->reserve(claims.missing.size());
        for (std::size_t r : claims.missing) data->push_back(reads[r]);
        claims.flight.set_value(RangeBatchResult(std::shared_ptr<const std::vector<ReadData>>(
            std::move(data))));
    }
}

std::optional<ReadData> NodeCache::FindRange(RangeMap& m, std::uint64_t start, std::uint64_t end) {
    auto e = m.upper_bound(start);
    if (e == m.begin()) return std::nullopt;
    --e;
    if (e->second.end < end) return std::nullopt;
    range_lru_.splice(range_lru_.begin(), range_lru_, e->second.lru);
    ReadData hit = e->second.data;
    hit.base = e->first;
    return hit;
}

void NodeCache::PinSlab(const ReadSlab* slab) {
    if (++slab_pins_[slab] == 1) range_bytes_ += slab->capacity();
}

void NodeCache::UnpinSlab(const ReadSlab* slab) {
    auto it = slab_pins_.find(slab);
    if (--it->second == 0) {
        range_bytes_ -= slab->capacity();
        slab_pins_.erase(it);
    }
}

void NodeCache::AddRange(RangeSource& source, std::uint64_t start, std::uint64_t end,
                         const ReadData& data) {
    RangeMap& m = source.second;
    auto [it, added] = m.try_emplace(start);
    if (!added) return;
    range_lru_.emplace_front(&source, start);
    it->second = RangeEntry{end, data, range_lru_.begin()};
    PinSlab(data.slab.get());
    // The slab memory goes back to the pool once no cached range and no call holds it.
    while (range_bytes_ > range_capacity_bytes_ && range_lru_.size() > 1) {
        auto [victim, vstart] = range_lru_.back();
        auto ve = victim->second.find(vstart);
        UnpinSlab(ve->second.data.slab.get());
        victim->second.erase(ve);
        range_lru_.pop_back();
        if (victim->second.empty()) ranges_.erase(ranges_.find(victim->first));
    }
}

NodeCache::RangeFlight* NodeCache::FindFlight(std::vector<RangeFlight>& flights,
                                              std::uint64_t start, std::uint64_t end,
                                              const void* caller) {
    for (RangeFlight& f : flights) {
        if (f.owner != caller && f.start <= start && end <= f.end) return &f;
    }
    return nullptr;
}

void NodeCache::EraseFlights(const std::string& ref, const RangeBatch* batch) {
    auto it = range_flights_.find(ref);
    if (it == range_flights_.end()) return;
    auto& v = it->second;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [&](const RangeFlight& f) { return f.batch.get() == batch; }),
            v.end());
    if (v.empty()) range_flights_.erase(it);
}

void NodeCache::Clear() {
    std::lock_guard lock(mu_);
    index_.clear();
    index_lru_.clear();
    index_bytes_ = 0;
    ranges_.clear();
    range_lru_.clear();
    slab_pins_.clear();
    range_bytes_ = 0;
}

void NodeCache::Forget(std::span<const std::string> refs) {
    std::lock_guard lock(mu_);
    for (const std::string& ref : refs) {
        if (auto it = index_.find(ref); it != index_.end()) {
            index_bytes_ -= it->second.bytes;
            index_lru_.erase(it->second.lru);
            index_.erase(it);
        }
        if (auto it = ranges_.find(ref); it != ranges_.end()) {
            for (auto& [start, entry] : it->second) {
                UnpinSlab(entry.data.slab.get());
                range_lru_.erase(entry.lru);
            }
            ranges_.erase(it);
        }
    }
}

}  // namespace mooncake::sparse
