// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "executor/node_cache.h"

#include <algorithm>
#include <iterator>

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
        // One entry per source holds its cached index and its read in progress.
        auto [it, added] = index_.try_emplace(*refs[k]);
        IndexEntry& e = it->second;
        if (e.index) {
            index_lru_.MoveToFront(&e);
            claims.hits[k] = e.index;
            continue;
        }
        if (e.flight.valid()) {
            if (e.call == call) {
                claims.repeats.emplace_back(k, e.slot);
            } else {
                claims.waits.push_back({k, e.flight, e.slot});
            }
            continue;
        }
        if (!mine.valid()) mine = claims.flight.get_future().share();
        e.key = &it->first;
        e.flight = mine;
        e.slot = claims.missing.size();
        e.call = call;
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
            auto it = index_.find(*refs[claims.missing[j]]);
            if (it == index_.end()) continue;  // not possible: an entry in flight stays
            it->second.flight = {};
            if (results[j].ok() && !it->second.index) {
                AddIndex(*it, *results[j]);  // may evict, never the entry just added
            } else if (!it->second.index) {
                index_.erase(it);
            }
        }
    }
    claims.flight.set_value(std::make_shared<const std::vector<IndexResult>>(results));
}

void NodeCache::AddIndexes(std::span<const std::shared_ptr<const SourceIndex>> indexes) {
    std::lock_guard lock(mu_);
    for (const std::shared_ptr<const SourceIndex>& idx : indexes) {
        if (!idx || !idx->source) continue;
        auto [it, added] = index_.try_emplace(idx->source->source_ref);
        if (!added && (it->second.index || it->second.flight.valid())) continue;
        AddIndex(*it, idx);  // may evict, never the entry just added
    }
}

std::shared_ptr<const SourceIndex> NodeCache::FindIndexLocked(const std::string& ref) {
    auto it = index_.find(ref);
    if (it == index_.end() || !it->second.index) return nullptr;
    index_lru_.MoveToFront(&it->second);
    return it->second.index;
}

void NodeCache::AddIndex(IndexMap::value_type& entry, std::shared_ptr<const SourceIndex> idx) {
    IndexEntry& e = entry.second;
    e.bytes = idx->index.MemoryBytes() + sizeof(SourceIndex);
    e.index = std::move(idx);
    e.key = &entry.first;
    index_lru_.PushFront(&e);
    index_bytes_ += e.bytes;
    while (index_bytes_ > index_capacity_bytes_ && index_lru_.size() > 1) {
        DropIndex(index_.find(*index_lru_.back()->key));
    }
}

void NodeCache::DropIndex(IndexMap::iterator it) {
    IndexEntry& e = it->second;
    if (!e.index) return;
    index_bytes_ -= e.bytes;
    index_lru_.Remove(&e);
    e.index.reset();
    e.bytes = 0;
    if (!e.flight.valid()) index_.erase(it);
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
    // The entry of `ref` (its cached ranges and reads in progress): found, or made for the
    // first read of ours it needs. Elements of an unordered_map keep their address while others
    // are inserted, and nothing is erased here.
    RangeSourceEntry* entry = nullptr;
    for (std::size_t r = 0; r < ranges.size(); ++r) {
        const RangeKey& key = ranges[r];
        if (ref == nullptr || !SameSource(key.source_ref, ref)) {
            ref = key.source_ref;
            auto it = ranges_.find(*ref);
            entry = it == ranges_.end() ? nullptr : &it->second;
        }
        if (entry != nullptr) {
            if (auto hit = FindRange(entry->cached, key.start, key.end)) {
                reads[r] = *hit;
                ++claims.hits;
                continue;
            }
            if (RangeFlight* f = FindFlight(entry->flights, key.start, key.end, caller)) {
                f->batch->waited = true;
                claims.waits.push_back({r, f->batch->done, f->slot});
                continue;
            }
        } else {
            entry = &ranges_[*ref];
        }
        entry->flights.push_back({key.start, key.end, caller, claims.batch, claims.missing.size()});
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
        const auto retire = [&] {
            if (source == nullptr) return;
            std::vector<RangeFlight>& v = source->second.flights;
            const RangeBatch* batch = claims.batch.get();
            v.erase(std::remove_if(v.begin(), v.end(),
                                   [&](const RangeFlight& f) { return f.batch.get() == batch; }),
                    v.end());
            EraseRangeSourceIfEmpty(*source);
        };
        for (std::size_t r : claims.missing) {
            const RangeKey& key = ranges[r];
            if (ref == nullptr || !SameSource(key.source_ref, ref)) {
                retire();
                ref = key.source_ref;
                // Held by our flights until retire(), so eviction never erases it meanwhile;
                // made again when a later run of the same source finds it erased.
                source = &*ranges_.try_emplace(*ref).first;
            }
            if (status.ok()) AddRange(*source, key.start, key.end, reads[r]);
        }
        retire();
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
    range_lru_.MoveToFront(&e->second);
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
    RangeMap& m = source.second.cached;
    auto [it, added] = m.try_emplace(start);
    if (!added) return;
    it->second = RangeEntry{end, data, {}, &source, start};
    range_lru_.PushFront(&it->second);
    PinSlab(data.slab.get());
    // The slab memory goes back to the pool once no cached range and no call holds it.
    while (range_bytes_ > range_capacity_bytes_ && range_lru_.size() > 1) {
        RangeEntry* victim = range_lru_.back();
        RangeSource* source = victim->source;
        UnpinSlab(victim->data.slab.get());
        range_lru_.Remove(victim);
        source->second.cached.erase(victim->start);
        EraseRangeSourceIfEmpty(*source);
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

void NodeCache::EraseRangeSourceIfEmpty(RangeSource& source) {
    if (source.second.cached.empty() && source.second.flights.empty()) {
        ranges_.erase(ranges_.find(source.first));
    }
}

void NodeCache::Clear() {
    std::lock_guard lock(mu_);
    // Reads in progress keep their entries (their requests finish them).
    for (auto it = index_.begin(); it != index_.end();) {
        if (it->second.flight.valid()) {
            it->second.index.reset();
            it->second.bytes = 0;
            ++it;
        } else {
            it = index_.erase(it);
        }
    }
    index_lru_.clear();
    index_bytes_ = 0;
    for (auto it = ranges_.begin(); it != ranges_.end();) {
        it->second.cached.clear();
        it = it->second.flights.empty() ? ranges_.erase(it) : std::next(it);
    }
    range_lru_.clear();
    slab_pins_.clear();
    range_bytes_ = 0;
}

void NodeCache::Forget(std::span<const std::string> refs) {
    std::lock_guard lock(mu_);
    for (const std::string& ref : refs) {
        if (auto it = index_.find(ref); it != index_.end()) DropIndex(it);
        if (auto it = ranges_.find(ref); it != ranges_.end()) {
            for (auto& [start, entry] : it->second.cached) {
                UnpinSlab(entry.data.slab.get());
                range_lru_.Remove(&entry);
            }
            it->second.cached.clear();
            EraseRangeSourceIfEmpty(*it);
        }
    }
}

}  // namespace mooncake::sparse
