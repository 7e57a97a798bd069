// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Read slabs recycled between chunks and calls: the pool reuses what fits and stays within its
// bound, the node cache charges the slabs its ranges pin, and reads that reuse slabs across
// calls return exactly what fresh ones do.
#include "executor/read_buffers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "executor/node_cache.h"
#include "executor/sparse_store.h"

namespace mooncake::sparse {
namespace {

TEST(ReadSlabPoolTest, ReusesAReturnedSlabThatFits) {
    ReadSlabPool pool(1 << 20);
    const std::byte* first = nullptr;
    {
        auto slab = pool.Acquire(1000);
        ASSERT_TRUE(slab.ok());
        EXPECT_GE((*slab)->capacity(), 1000u);
        first = (*slab)->data();
    }
    EXPECT_EQ(pool.stats().free_slabs, 1u);
    auto again = pool.Acquire(900);  // Same size class range: served from the free list.
    ASSERT_TRUE(again.ok());
    EXPECT_EQ((*again)->data(), first);
    EXPECT_EQ(pool.stats().allocated, 1u);
    EXPECT_EQ(pool.stats().reused, 1u);
    EXPECT_EQ(pool.stats().free_slabs, 0u);
}

TEST(ReadSlabPoolTest, NeverServesASmallRequestFromAMuchLargerSlab) {
    ReadSlabPool pool(1 << 20);
    { ASSERT_TRUE(pool.Acquire(64 << 10).ok()); }
    auto small = pool.Acquire(100);
    ASSERT_TRUE(small.ok());
    EXPECT_LT((*small)->capacity(), 1024u);
    EXPECT_EQ(pool.stats().reused, 0u);
    EXPECT_EQ(pool.stats().free_slabs, 1u);  // The large one is still there.
}

TEST(ReadSlabPoolTest, KeepsAtMostItsBoundOfFreeBytes) {
    ReadSlabPool pool(100 << 10);
    {
        std::vector<std::shared_ptr<ReadSlab>> held;
        for (int i = 0; i < 8; ++i) held.push_back(*pool.Acquire(32 << 10));
    }
    const auto stats = pool.stats();
    EXPECT_LE(stats.free_bytes, 100u << 10);
    EXPECT_EQ(stats.free_slabs, 3u);  // 3 x 32 KiB fit in 100 KiB, the rest were freed.
    pool.Trim();
    EXPECT_EQ(pool.stats().free_bytes, 0u);
}

TEST(ReadSlabPoolTest, SizeClassesBoundTheWaste) {
    for (std::uint64_t n : {1ull, 63ull, 64ull, 1000ull, 4097ull, (64ull << 20) + 12345}) {
        const std::uint64_t c = ReadSlabPool::SizeClass(n);
        EXPECT_GE(c, n);
        EXPECT_LE(c, n + std::max<std::uint64_t>(64, n / 4)) << n;
    }
    // The executor's chunks (a little over 64 MiB each) share one class.
    EXPECT_EQ(ReadSlabPool::SizeClass((64ull << 20) + 1), ReadSlabPool::SizeClass(70ull << 20));
}

TEST(ReadSlabPoolTest, ASlabMayOutliveItsPool) {
    std::shared_ptr<ReadSlab> slab;
    {
        ReadSlabPool pool(1 << 20);
        slab = *pool.Acquire(4096);
    }
    std::memset(slab->data(), 1, 4096);
    slab.reset();  // Returns to the pool's state, which the slab kept alive.
}

/// Claims and finishes one range of `ref`, read into a slab of its own from the cache's pool.
void CacheOneRange(NodeCache& cache, const std::string& ref, std::uint64_t start,
                   std::uint64_t bytes) {
    const NodeCache::RangeKey key{&ref, start, start + 1};
    std::vector<ReadData> reads(1);
    NodeCache::RangeClaims claims = cache.ClaimRanges({&key, 1}, &cache, reads);
    ASSERT_EQ(claims.missing.size(), 1u);
    auto slab = cache.slabs().Acquire(bytes);
    ASSERT_TRUE(slab.ok());
    reads[0] = {*slab, {(*slab)->data(), bytes / 2}, {(*slab)->data() + bytes / 2, bytes / 2},
                start};
    cache.FinishRanges({&key, 1}, &cache, Status::Ok(), reads, claims);
}

TEST(NodeCacheSlabTest, CachedRangesPinAtMostTheCapacityInSlabs) {
    constexpr std::uint64_t kSlab = 64 << 10;
    NodeCache cache(1 << 20, 4 * kSlab);  // Room for four slabs.
    const std::string ref = "src";
    for (std::uint64_t i = 0; i < 16; ++i) CacheOneRange(cache, ref, 10 * i, kSlab);
    // Twelve slabs were evicted (back in the pool, within its bound); four stay cached.
    const auto stats = cache.slabs().stats();
    EXPECT_EQ(stats.allocated + stats.reused, 16u);
    EXPECT_LE(stats.allocated, 5u);  // Evicted slabs served the later ranges.
    const std::string other = "other";
    std::vector<ReadData> reads(16);
    std::vector<NodeCache::RangeKey> keys;
    for (std::uint64_t i = 0; i < 16; ++i) keys.push_back({&ref, 10 * i, 10 * i + 1});
    NodeCache::RangeClaims claims = cache.ClaimRanges(keys, &other, reads);
    EXPECT_EQ(claims.hits, 4u);
    cache.FinishRanges(keys, &other, InvalidArgument("not read"), reads, claims);
    reads.clear();
    cache.Clear();
    EXPECT_EQ(cache.slabs().stats().free_slabs, stats.free_slabs + 4);
}

TEST(NodeCacheFlightTest, AWaiterGetsTheDataOfTheReadThatHoldsItsRange) {
    NodeCache cache(1 << 20, 1 << 20);
    const std::string a = "a", b = "b";
    const std::string a_again = "a";  // Another string naming the same source.
    // The owner claims two ranges of each source, sorted by source.
    const std::vector<NodeCache::RangeKey> owned = {
        {&a, 0, 10}, {&a, 20, 30}, {&b, 0, 5}, {&b, 100, 200}};
    std::vector<ReadData> owner_reads(owned.size());
    const int owner = 0, waiter = 1;
    NodeCache::RangeClaims mine = cache.ClaimRanges(owned, &owner, owner_reads);
    ASSERT_EQ(mine.missing.size(), 4u);
    // The waiter needs parts of the second read of `b` and the second of `a`, and one range
    // nobody reads.
    const std::vector<NodeCache::RangeKey> wanted = {
        {&b, 120, 150}, {&a_again, 22, 30}, {&a_again, 10, 20}};
    std::vector<ReadData> waiter_reads(wanted.size());
    NodeCache::RangeClaims theirs = cache.ClaimRanges(wanted, &waiter, waiter_reads);
    ASSERT_EQ(theirs.waits.size(), 2u);
    ASSERT_EQ(theirs.missing, std::vector<std::size_t>{2});
    auto slab = cache.slabs().Acquire(4 * 64);
    ASSERT_TRUE(slab.ok());
    for (std::size_t k = 0; k < owned.size(); ++k) {
        owner_reads[k] = {*slab, {(*slab)->data() + 64 * k, 32},
                          {(*slab)->data() + 64 * k + 32, 32}, owned[k].start};
    }
    cache.FinishRanges(owned, &owner, Status::Ok(), owner_reads, mine);
    for (const NodeCache::RangeWait& w : theirs.waits) {
        const NodeCache::RangeBatchResult& got = w.batch.get();
        ASSERT_TRUE(got.ok());
        ASSERT_NE(*got, nullptr);
        ASSERT_LT(w.slot, (*got)->size());
        const ReadData& data = (**got)[w.slot];
        const std::size_t expected = w.read == 0 ? 3 : 1;  // b[100, 200) and a[20, 30)
        EXPECT_EQ(data.base, owned[expected].start);
        EXPECT_EQ(data.indices.data(), owner_reads[expected].indices.data());
    }
    cache.FinishRanges(wanted, &waiter, InvalidArgument("not read"), waiter_reads, theirs);
    // The owner's reads are cached now; the waiter's failed one is not.
    std::vector<ReadData> again(wanted.size());
    const int third = 2;
    NodeCache::RangeClaims later = cache.ClaimRanges(wanted, &third, again);
    EXPECT_EQ(later.hits, 2u);
    EXPECT_EQ(later.missing, std::vector<std::size_t>{2});
    EXPECT_EQ(again[0].base, 100u);
    EXPECT_EQ(again[1].base, 20u);
    cache.FinishRanges(wanted, &third, InvalidArgument("not read"), again, later);
}

TEST(NodeCacheFlightTest, AFailedReadFailsItsWaiters) {
    NodeCache cache(1 << 20, 1 << 20);
    const std::string a = "a";
    const std::vector<NodeCache::RangeKey> keys = {{&a, 0, 10}};
    std::vector<ReadData> owner_reads(1), waiter_reads(1);
    const int owner = 0, waiter = 1;
    NodeCache::RangeClaims mine = cache.ClaimRanges(keys, &owner, owner_reads);
    NodeCache::RangeClaims theirs = cache.ClaimRanges(keys, &waiter, waiter_reads);
    ASSERT_EQ(theirs.waits.size(), 1u);
    cache.FinishRanges(keys, &owner, Unavailable("store down"), owner_reads, mine);
    const NodeCache::RangeBatchResult& got = theirs.waits[0].batch.get();
    EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
    // Nothing was cached, and no flight is left: the next claim reads it itself.
    NodeCache::RangeClaims next = cache.ClaimRanges(keys, &waiter, waiter_reads);
    EXPECT_EQ(next.missing.size(), 1u);
    EXPECT_TRUE(next.waits.empty());
    cache.FinishRanges(keys, &waiter, Unavailable("store down"), waiter_reads, next);
}

TEST(NodeCacheFlightTest, IndexClaimsOfACallAreReadOnceAndWaitedForByOthers) {
    NodeCache cache(1 << 20, 1 << 20);
    const std::string a = "a", b = "b", c = "c", a_again = "a";
    const auto index_of = [](const std::string& ref) {
        SourceDescriptor d;
        d.tensor_id = "w";
        d.source_ref = ref;
        d.global_shape = {16, 16};
        d.box = Box::Make({0, 0}, {16, 16}).value();
        d.generation = {0, 1};
        d.tile_shape = {4, 4};
        d.nnz = 0;
        d.num_tiles = 0;
        Result<TileIndex> index = TileIndex::Make(d, {}, {0});
        EXPECT_TRUE(index.ok());
        return std::make_shared<const SourceIndex>(SourceIndex{std::make_shared<const SourceDescriptor>(d), std::move(index).value()});
    };
    // One call names `a` twice: it reads it once.
    const std::vector<const std::string*> first = {&a, &b, &a_again};
    NodeCache::IndexClaims mine = cache.ClaimIndexes(first);
    EXPECT_EQ(mine.missing, (std::vector<std::size_t>{0, 1}));
    ASSERT_EQ(mine.repeats.size(), 1u);
    EXPECT_EQ(mine.repeats[0], (std::pair<std::size_t, std::size_t>{2, 0}));
    EXPECT_TRUE(mine.waits.empty());
    // Another call waits for `b` and `a`, and reads `c` itself.
    const std::vector<const std::string*> second = {&c, &b, &a_again};
    NodeCache::IndexClaims theirs = cache.ClaimIndexes(second);
    EXPECT_EQ(theirs.missing, std::vector<std::size_t>{0});
    ASSERT_EQ(theirs.waits.size(), 2u);
    cache.FinishIndexes(first, mine, {index_of("a"), NotFound("no b")});
    for (const NodeCache::IndexWait& w : theirs.waits) {
        const NodeCache::IndexResult& got = (*w.batch.get())[w.slot];
        if (w.ref == 2) {
            ASSERT_TRUE(got.ok());
            EXPECT_EQ((*got)->source->source_ref, "a");
        } else {
            EXPECT_EQ(w.ref, 1u);
            EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
        }
    }
    cache.FinishIndexes(second, theirs, {index_of("c")});
    // `a` and `c` are cached; the failed `b` is not, and no flight is left for it.
    NodeCache::IndexClaims later = cache.ClaimIndexes(second);
    EXPECT_TRUE(later.hits[0] && later.hits[2]);
    EXPECT_EQ(later.missing, std::vector<std::size_t>{1});
    EXPECT_TRUE(later.waits.empty());
    cache.FinishIndexes(second, later, {NotFound("no b")});
}

TEST(NodeCacheFlightTest, ASourceInTwoRunsOfOneCallIsCachedWhileEvictionRuns) {
    // One call reads a, b, a (the planner groups by (source, node), so a source can come back),
    // with room for one range: caching b evicts a's first range, and a's second run must still
    // find (or make again) its source's entry.
    constexpr std::uint64_t kSlab = 64 << 10;
    NodeCache cache(1 << 20, kSlab);
    const std::string a = "a", b = "b";
    const std::vector<NodeCache::RangeKey> keys = {{&a, 0, 10}, {&b, 0, 10}, {&a, 50, 60}};
    std::vector<ReadData> reads(keys.size());
    const int caller = 0;
    NodeCache::RangeClaims claims = cache.ClaimRanges(keys, &caller, reads);
    ASSERT_EQ(claims.missing.size(), 3u);
    for (std::size_t k = 0; k < keys.size(); ++k) {
        auto slab = cache.slabs().Acquire(kSlab);
        ASSERT_TRUE(slab.ok());
        reads[k] = {*slab, {(*slab)->data(), 32}, {(*slab)->data() + 32, 32}, keys[k].start};
    }
    cache.FinishRanges(keys, &caller, Status::Ok(), reads, claims);
    // Only the range added last stays cached, and no flight is left behind.
    std::vector<ReadData> again(keys.size());
    const int later = 1;
    NodeCache::RangeClaims next = cache.ClaimRanges(keys, &later, again);
    EXPECT_EQ(next.hits, 1u);
    EXPECT_EQ(again[2].base, 50u);
    EXPECT_EQ(next.missing, (std::vector<std::size_t>{0, 1}));
    EXPECT_TRUE(next.waits.empty());
    cache.FinishRanges(keys, &later, InvalidArgument("not read"), again, next);
}

TEST(NodeCacheFlightTest, ClearAndForgetKeepReadsInProgress) {
    NodeCache cache(1 << 20, 1 << 20);
    const std::string a = "a";
    const std::vector<const std::string*> refs = {&a};
    NodeCache::IndexClaims mine = cache.ClaimIndexes(refs);
    ASSERT_EQ(mine.missing.size(), 1u);
    const std::vector<NodeCache::RangeKey> keys = {{&a, 0, 10}};
    std::vector<ReadData> reads(1), waiter_reads(1);
    const int owner = 0, waiter = 1;
    NodeCache::RangeClaims ranges = cache.ClaimRanges(keys, &owner, reads);
    cache.Clear();
    cache.Forget(std::vector<std::string>{"a"});
    // Another call still waits on both reads instead of starting its own.
    NodeCache::IndexClaims theirs = cache.ClaimIndexes(refs);
    EXPECT_TRUE(theirs.missing.empty());
    ASSERT_EQ(theirs.waits.size(), 1u);
    NodeCache::RangeClaims their_ranges = cache.ClaimRanges(keys, &waiter, waiter_reads);
    EXPECT_EQ(their_ranges.waits.size(), 1u);
    SourceDescriptor d;
    d.tensor_id = "w";
    d.source_ref = "a";
    d.global_shape = {16, 16};
    d.box = Box::Make({0, 0}, {16, 16}).value();
    d.generation = {0, 1};
    d.tile_shape = {4, 4};
    Result<TileIndex> index = TileIndex::Make(d, {}, {0});
    ASSERT_TRUE(index.ok());
    cache.FinishIndexes(refs, mine, {std::make_shared<const SourceIndex>(
                                        SourceIndex{std::make_shared<const SourceDescriptor>(d), std::move(index).value()})});
    EXPECT_TRUE((*theirs.waits[0].batch.get())[0].ok());
    EXPECT_NE(cache.FindIndex(a), nullptr);  // cached once its read ended
    auto slab = cache.slabs().Acquire(64);
    ASSERT_TRUE(slab.ok());
    reads[0] = {*slab, {(*slab)->data(), 32}, {(*slab)->data() + 32, 32}, 0};
    cache.FinishRanges(keys, &owner, Status::Ok(), reads, ranges);
    EXPECT_TRUE(their_ranges.waits[0].batch.get().ok());
    std::vector<ReadData> again(1);
    NodeCache::RangeClaims hit = cache.ClaimRanges(keys, &waiter, again);
    EXPECT_EQ(hit.hits, 1u);
}

// ---- Through SparseStore: reuse across calls keeps results identical. ----------------------

std::map<std::vector<std::uint64_t>, std::uint32_t> Entries(const TargetObject& o) {
    std::map<std::vector<std::uint64_t>, std::uint32_t> out;
    const auto& d = o.object.desc;
    const std::size_t isz = DTypeSize(d.index_dtype);
    for (std::uint64_t i = 0; i < d.nnz; ++i) {
        std::vector<std::uint64_t> p;
        for (std::size_t k = 0; k < d.rank(); ++k) {
            std::uint64_t v = 0;
            std::memcpy(&v, o.object.indices.data() + (i * d.rank() + k) * isz, isz);
            p.push_back(v);
        }
        std::uint32_t bits = 0;
        std::memcpy(&bits, o.object.values.data() + i * 4, 4);
        out[p] = bits;
    }
    return out;
}

TEST(ReadSlabReuseTest, RepeatedReadsWithClearedCachesMatchAFreshStore) {
    // Several tensors, a tiny range cache (every call evicts and recycles) and reads repeated
    // after ClearCaches: each call's objects equal those of a store that never reused memory.
    std::mt19937_64 rng(42);
    const Shape shape{256, 384};
    std::vector<PutSparseRequest> requests;
    std::vector<std::vector<std::int64_t>> idx(6);
    std::vector<std::vector<float>> val(6);
    for (int t = 0; t < 6; ++t) {
        std::set<std::pair<std::int64_t, std::int64_t>> seen;
        while (seen.size() < 3000) seen.insert({std::int64_t(rng() % 256), std::int64_t(rng() % 384)});
        for (const auto& [r, c] : seen) {
            idx[t].push_back(r);
            idx[t].push_back(c);
            val[t].push_back(float(rng() % 1000) - 500.0f);
        }
        PutSparseRequest q;
        q.tensor_id = "w" + std::to_string(t);
        q.global_shape = shape;
        q.indices = {DType::kInt64, {Index(val[t].size()), 2}, std::as_bytes(std::span(idx[t]))};
        q.values = {DType::kFloat32, {Index(val[t].size())}, std::as_bytes(std::span(val[t]))};
        q.placement_policy = *PlacementPolicy::Parse("replicate(ep)");
        q.generation = {0, 1};
        requests.push_back(std::move(q));
    }
    std::vector<TargetDescriptor> targets;
    for (int t = 0; t < 6; ++t) {
        for (Index r0 : {Index(0), Index(100)}) {
            for (Index c0 : {Index(0), Index(190)}) {
                targets.push_back(*TargetDescriptor::Make(
                    "t" + std::to_string(targets.size()), "n", "w" + std::to_string(t),
                    *NamedAxes::Make({}), {r0, c0}, {150, 194}));
            }
        }
    }
    SparseStoreOptions small;
    small.range_cache_capacity_bytes = 1;
    SparseStore reused(MakeEmbeddedStore(), small);
    SparseStore fresh(MakeEmbeddedStore());
    for (const auto& q : requests) {
        ASSERT_TRUE(reused.PutSparseObject(q).ok());
        ASSERT_TRUE(fresh.PutSparseObject(q).ok());
    }
    auto expected = fresh.ReadSparseObjects(*fresh.Manifest({0, 1}), targets);
    ASSERT_TRUE(expected.ok());
    const auto manifest = *reused.Manifest({0, 1});
    for (int call = 0; call < 4; ++call) {
        if (call % 2 == 1) {
            ASSERT_TRUE(reused.ClearCaches().ok());
        }
        auto got = reused.ReadSparseObjects(manifest, targets);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        ASSERT_EQ(got->size(), expected->size());
        for (std::size_t t = 0; t < got->size(); ++t) {
            EXPECT_EQ((*got)[t].object.indices, (*expected)[t].object.indices) << call << " " << t;
            EXPECT_EQ((*got)[t].object.values, (*expected)[t].object.values);
            EXPECT_EQ((*got)[t].object.tile_ptr, (*expected)[t].object.tile_ptr);
            EXPECT_FALSE(Entries((*got)[t]).empty());
        }
    }
}

}  // namespace
}  // namespace mooncake::sparse
