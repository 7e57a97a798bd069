// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// NodeCache: what a SparseStore keeps for its node across reads (docs/design.md §4 steps 3 and
// 6): each source's tile index with the stored descriptor it was built from, range reads of
// sources, and the reads in progress. A request that needs data another request is reading
// right now waits for that read instead of issuing its own (single flight); with the caches
// this makes each tile index and each unique range one physical read per node, also when
// requests arrive concurrently (the node daemon serves all processes of a node from one
// SparseStore). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "executor/read_buffers.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/planner.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// Entry data a region reads from: a physical read (or a cached one that contains it). The
/// bytes live in `slab`, which the read shares with the other reads of its chunk.
struct ReadData {
    std::shared_ptr<const ReadSlab> slab;
    std::span<const std::byte> indices;
    std::span<const std::byte> values;
    std::uint64_t base = 0;  ///< Entry offset of the buffers' first row.
};

/// A source's tile index with the descriptor it was built from: the stored object's own
/// metadata, never a requester's manifest entry (which may describe another object).
struct SourceIndex {
    /// The stored object's descriptor: its own copy, or the requester's manifest entry (which
    /// says exactly the stored metadata) shared with the manifest that holds it.
    std::shared_ptr<const SourceDescriptor> source;
    TileIndex index;
};

class NodeCache {
public:
    using IndexResult = Result<std::shared_ptr<const SourceIndex>>;

    /// Each cache evicts least recently used entries beyond its capacity, keeping at least one.
    /// The range cache charges each read slab its cached ranges pin, whole, so that its capacity
    /// bounds the memory it keeps. The slab pool keeps up to max(range capacity,
    /// kMinFreeSlabBytes) of free slabs between reads.
    NodeCache(std::uint64_t index_capacity_bytes, std::uint64_t range_capacity_bytes);

    static constexpr std::uint64_t kMinFreeSlabBytes = std::uint64_t{256} << 20;

    /// Where range reads are written: recycled between chunks and calls.
    ReadSlabPool& slabs() { return slabs_; }
    NodeCache(const NodeCache&) = delete;
    NodeCache& operator=(const NodeCache&) = delete;

    // ---- Tile indexes ----------------------------------------------------------------------

    /// The cached index of source `ref`, or nullptr.
    std::shared_ptr<const SourceIndex> FindIndex(const std::string& ref);

    /// The indexes one request read, completed together: other requests wait on them.
    using IndexBatch = std::shared_ptr<const std::vector<IndexResult>>;

    /// An index another request is reading: its batch and its place there.
    struct IndexWait {
        std::size_t ref = 0;  ///< Into the claimed refs.
        std::shared_future<IndexBatch> batch;
        std::size_t slot = 0;  ///< Into the batch.
    };

    /// How a request gets the indexes of its sources: each is cached (`hits`), another
    /// request's read to wait for (`waits`), or the caller's to read (`missing`), which other
    /// requests then wait for until FinishIndexes. A ref the call names twice is read once: its
    /// repeats are in `repeats` (ref, place in `missing`).
    struct IndexClaims {
        std::vector<std::shared_ptr<const SourceIndex>> hits;  ///< Per ref: cached, or null.
        std::vector<IndexWait> waits;
        std::vector<std::size_t> missing;
        std::vector<std::pair<std::size_t, std::size_t>> repeats;
        std::promise<IndexBatch> flight;
    };

    /// Claims the index of every ref under one lock.
    IndexClaims ClaimIndexes(std::span<const std::string* const> refs);

    /// Ends the caller's reads of `claims.missing` (`results[k]` for missing[k]): caches those
    /// that are ok and retires their flights under one lock, then completes the flight.
    void FinishIndexes(std::span<const std::string* const> refs, IndexClaims& claims,
                       const std::vector<IndexResult>& results);

    /// Caches the indexes of sources just written, which their writer knows (a commit's
    /// objects), each under its `source->source_ref`, under one lock: the first read of a step
    /// then finds them. A source already cached, or being read, is left as it is.
    void AddIndexes(std::span<const std::shared_ptr<const SourceIndex>> indexes);

    // ---- Range reads -----------------------------------------------------------------------

    /// One unique read of a call: entries [start, end) of the source `*source_ref`.
    struct RangeKey {
        const std::string* source_ref = nullptr;
        std::uint64_t start = 0;
        std::uint64_t end = 0;
    };

    /// The data of one claim's missing reads (in the order of RangeClaims::missing) as the calls
    /// that waited on them get it, or the error of their read.
    using RangeBatchResult = Result<std::shared_ptr<const std::vector<ReadData>>>;

    /// The reads of one claim that other calls may wait on: they complete together.
    struct RangeBatch {
        std::shared_future<RangeBatchResult> done;
        bool waited = false;  ///< Another call waits on one of them (guarded by the cache's lock).
    };

    /// A read that waits on another call's: its batch and its place in the batch.
    struct RangeWait {
        std::size_t read = 0;  ///< Into the claimed ranges.
        std::shared_future<RangeBatchResult> batch;
        std::size_t slot = 0;  ///< Into the batch's data.
    };

    /// How a call gets its unique reads: each is a cache hit, a wait on another call's read
    /// that contains it, or a read of the caller's own that other calls may wait on.
    struct RangeClaims {
        std::uint64_t hits = 0;  ///< Served from the cache.
        std::vector<RangeWait> waits;
        std::vector<std::size_t> missing;  ///< The caller's to read.
        /// One flight for every read of `missing`: completed by FinishRanges.
        std::promise<RangeBatchResult> flight;
        std::shared_ptr<RangeBatch> batch;
    };

    /// Claims every read of `ranges` under one lock; writes the data of each hit to
    /// `reads[r]`. `caller` identifies the call: its own flights are never merged here, since
    /// the planner already deduplicated the batch per node, and what it kept separate (e.g. the
    /// same range for two nodes) stays separate. A source is looked up once for a run of
    /// adjacent ranges of it, so ranges sorted by source cost one lookup per source.
    RangeClaims ClaimRanges(std::span<const NodeCache::RangeKey> ranges, const void* caller,
                            std::span<ReadData> reads);

    /// Ends the caller's reads of `claims.missing`: caches them (`reads[r]`, when `status` is
    /// ok) and retires their flights under one lock, so that a later request finds one or the
    /// other, then completes the flights with the data or with `status` (the data is gathered
    /// only when another call waits on it).
    void FinishRanges(std::span<const NodeCache::RangeKey> ranges, const void* caller,
                      const Status& status, std::span<const ReadData> reads,
                      RangeClaims& claims);

    /// Drops every cached index and range (reads in progress finish as claimed).
    void Clear();
    /// Drops the cached index and ranges of each source in `refs` (freed by retention).
    void Forget(std::span<const std::string> refs);

private:
    /// Links of an element of an IntrusiveLru.
    template <typename T>
    struct LruLinks {
        T* prev = nullptr;
        T* next = nullptr;
    };
    /// A least-recently-used order threaded through its elements' `lru` links: no allocation
    /// per element (a step's read adds tens of thousands of indexes and ranges).
    template <typename T>
    class IntrusiveLru {
    public:
        void PushFront(T* e) {
            e->lru = {nullptr, head_};
            (head_ != nullptr ? head_->lru.prev : tail_) = e;
            head_ = e;
            ++size_;
        }
        void Remove(T* e) {
            (e->lru.prev != nullptr ? e->lru.prev->lru.next : head_) = e->lru.next;
            (e->lru.next != nullptr ? e->lru.next->lru.prev : tail_) = e->lru.prev;
            e->lru = {};
            --size_;
        }
        void MoveToFront(T* e) {
            if (e == head_) return;
            Remove(e);
            PushFront(e);
        }
        T* back() const { return tail_; }
        std::size_t size() const { return size_; }
        /// Forgets every element (whose links are then stale: they are erased or re-added).
        void clear() {
            head_ = tail_ = nullptr;
            size_ = 0;
        }

    private:
        T* head_ = nullptr;
        T* tail_ = nullptr;
        std::size_t size_ = 0;
    };

    /// A source's tile index: cached (`index` set, in the LRU list), or being read by a
    /// request (`flight` valid), or both for an instant while that read's result joins.
    struct IndexEntry {
        std::shared_ptr<const SourceIndex> index;
        std::uint64_t bytes = 0;
        LruLinks<IndexEntry> lru;  ///< In index_lru_ while `index` is set.
        const std::string* key = nullptr;  ///< Its key in index_ (whose nodes never move).
        /// A read in progress: the reading request's batch, its place there, and the
        /// ClaimIndexes that made it.
        std::shared_future<IndexBatch> flight;
        std::size_t slot = 0;
        std::uint64_t call = 0;
    };
    using IndexMap = std::unordered_map<std::string, IndexEntry>;
    struct RangeEntry;
    using RangeMap = std::map<std::uint64_t, RangeEntry>;
    struct RangeFlight {
        std::uint64_t start = 0;
        std::uint64_t end = 0;
        const void* owner = nullptr;  ///< The call reading it.
        std::shared_ptr<RangeBatch> batch;
        std::size_t slot = 0;  ///< Into the batch.
    };
    /// A source's cached ranges and its range reads in progress. Erased once both are empty.
    struct RangeSourceEntry {
        RangeMap cached;
        std::vector<RangeFlight> flights;
    };
    /// An element of ranges_: its address stays valid until it is erased (which happens only
    /// once it holds no cached range, so no LRU entry points to it any more, and no flight).
    using RangeSource = std::pair<const std::string, RangeSourceEntry>;
    struct RangeEntry {
        std::uint64_t end = 0;
        ReadData data;
        LruLinks<RangeEntry> lru;
        RangeSource* source = nullptr;  ///< Where it is cached, at key `start`.
        std::uint64_t start = 0;
    };

    // All below hold mu_.
    std::shared_ptr<const SourceIndex> FindIndexLocked(const std::string& ref);
    /// Caches `idx` in `entry` (the entry of `key`), evicting beyond the capacity.
    void AddIndex(IndexMap::value_type& entry, std::shared_ptr<const SourceIndex> idx);
    /// Drops the cached index of `it`, and the entry itself unless a read of it is in flight.
    void DropIndex(IndexMap::iterator it);
    /// A cached read of the source `ranges` containing [start, end), if any.
    std::optional<ReadData> FindRange(RangeMap& ranges, std::uint64_t start, std::uint64_t end);
    void AddRange(RangeSource& source, std::uint64_t start, std::uint64_t end,
                  const ReadData& data);
    /// Counts a cached range's reference to its slab (charging the slab on its first).
    void PinSlab(const ReadSlab* slab);
    void UnpinSlab(const ReadSlab* slab);
    /// A read in progress of a source (`flights`, its reads in progress) by another call than
    /// `caller` that contains [start, end), or nullptr.
    static RangeFlight* FindFlight(std::vector<RangeFlight>& flights, std::uint64_t start,
                                   std::uint64_t end, const void* caller);
    /// Erases a source's entry of ranges_ once it holds neither a cached range nor a flight.
    void EraseRangeSourceIfEmpty(RangeSource& source);

    const std::uint64_t index_capacity_bytes_;
    const std::uint64_t range_capacity_bytes_;

    std::mutex mu_;
    IndexMap index_;
    IntrusiveLru<IndexEntry> index_lru_;
    std::uint64_t index_bytes_ = 0;
    std::uint64_t index_claims_ = 0;  ///< ClaimIndexes calls so far.
    std::unordered_map<std::string, RangeSourceEntry> ranges_;
    IntrusiveLru<RangeEntry> range_lru_;
    std::uint64_t range_bytes_ = 0;  ///< Capacity of the slabs cached ranges pin.
    std::unordered_map<const ReadSlab*, std::uint32_t> slab_pins_;  ///< Cached ranges per slab.
    ReadSlabPool slabs_;
};

}  // namespace mooncake::sparse
