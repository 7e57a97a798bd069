// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "executor/sparse_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <thread>
#include <random>
#include <set>

#include "../status_matchers.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::StatusIsWithMessage;
using ::testing::IsEmpty;

/// Wraps the real embedded store and records every member read, so tests can assert which
/// bytes the executor asked for (the real store still serves them).
class RecordingStore : public ObjectStore {
public:
    RecordingStore() : inner_(MakeEmbeddedStore()) {}
    Status Put(std::string_view key, std::string_view metadata, std::span<const MemberData> members,
               const PutOptions& options) override {
        if (fail_puts_with_prefix_.size() && key.starts_with(fail_puts_with_prefix_)) {
            return ResourceExhausted("injected failure");
        }
        return inner_->Put(key, metadata, members, options);
    }
    Result<ObjectInfo> Stat(std::string_view key) override { return inner_->Stat(key); }
    Status ReadMember(std::string_view key, std::string_view member, std::span<std::byte> dst) override {
        whole_reads.emplace_back(key, member);
        return inner_->ReadMember(key, member, dst);
    }
    Status ReadRanges(std::span<const RangeRead> reads) override {
        for (const RangeRead& r : reads) {
            ranges.push_back({std::string(r.key), std::string(r.member), r.row_start, r.row_end});
        }
        return inner_->ReadRanges(reads);
    }
    Status Remove(std::string_view key) override { return inner_->Remove(key); }
    Result<std::vector<std::string>> List(std::string_view prefix) override { return inner_->List(prefix); }
    StoreCounters Counters() const override { return inner_->Counters(); }

    struct Range {
        std::string key, member;
        std::uint64_t start, end;
    };
    std::vector<std::pair<std::string, std::string>> whole_reads;
    std::vector<Range> ranges;
    std::string fail_puts_with_prefix_;

private:
    std::unique_ptr<ObjectStore> inner_;
};

struct Coo {
    std::vector<std::int64_t> idx;
    std::vector<float> val;
};

Coo RandomCoo(std::mt19937_64& rng, const Shape& shape, std::size_t nnz) {
    std::set<std::vector<std::int64_t>> seen;
    Coo c;
    while (seen.size() < nnz) {
        std::vector<std::int64_t> p;
        for (Index e : shape) p.push_back(std::int64_t(rng() % std::uint64_t(e)));
        if (seen.insert(p).second) {
            c.idx.insert(c.idx.end(), p.begin(), p.end());
            c.val.push_back(float(seen.size()));
        }
    }
    return c;
}

HostArray Arr(const std::vector<std::int64_t>& v, std::size_t rank) {
    return {DType::kInt64, {Index(v.size() / rank), Index(rank)},
            std::as_bytes(std::span(v))};
}
HostArray Arr(const std::vector<float>& v) {
    return {DType::kFloat32, {Index(v.size())}, std::as_bytes(std::span(v))};
}

PutSparseRequest Request(const std::string& id, const Shape& shape, const Coo& c,
                         const std::string& policy = "replicate(ep)", Generation g = {0, 1}) {
    PutSparseRequest r;
    r.tensor_id = id;
    r.global_shape = shape;
    r.indices = Arr(c.idx, shape.size());
    r.values = Arr(c.val);
    r.placement_policy = *PlacementPolicy::Parse(policy);
    r.generation = g;
    return r;
}

TargetDescriptor Target(const std::string& id, const std::string& tensor, const std::string& node,
                        Shape offset, Shape local, std::vector<NamedAxes::Entry> axes = {}) {
    return *TargetDescriptor::Make(id, node, tensor, *NamedAxes::Make(std::move(axes)), offset, local);
}

std::map<std::vector<std::int64_t>, float> Entries(const TargetObject& o) {
    std::map<std::vector<std::int64_t>, float> out;
    const auto& d = o.object.desc;
    const std::size_t isz = DTypeSize(d.index_dtype);
    for (std::uint64_t i = 0; i < d.nnz; ++i) {
        std::vector<std::int64_t> p;
        for (std::size_t k = 0; k < d.rank(); ++k) {
            std::uint64_t v = 0;
            std::memcpy(&v, o.object.indices.data() + (i * d.rank() + k) * isz, isz);
            p.push_back(std::int64_t(v));
        }
        float f;
        std::memcpy(&f, o.object.values.data() + i * 4, 4);
        out[p] = f;
    }
    return out;
}

TEST(SparseStoreTest, NonEpEp2Tp2AcceptanceThroughExecutor) {
    auto rec = std::make_shared<RecordingStore>();
    SparseStore store(rec);
    std::mt19937_64 rng(7);
    const Shape shape{2048, 7168};
    Coo coo = RandomCoo(rng, shape, 5000);
    ASSERT_TRUE(store.PutSparseObject(Request("shared.w1", shape, coo)).ok());
    auto manifest = store.Manifest({0, 1});
    ASSERT_TRUE(manifest.ok());
    ASSERT_EQ(manifest->size(), 1u);
    std::vector<TargetDescriptor> targets;
    for (int ep = 0; ep < 2; ++ep) {
        for (int tp = 0; tp < 2; ++tp) {
            targets.push_back(Target("node0/rank" + std::to_string(ep * 2 + tp), "shared.w1", "node0",
                                     {tp * 1024, 0}, {1024, 7168}, {{"ep", ep}, {"tp", tp}}));
        }
    }
    auto objs = store.ReadSparseObjects(*manifest, targets);
    ASSERT_TRUE(objs.ok()) << objs.status().ToString();
    const SparseMetrics m = store.Metrics();
    EXPECT_EQ(m.source_objects_put, 1u);
    EXPECT_EQ(m.range_gets, 2u);
    EXPECT_EQ(m.full_gets, 0u);
    EXPECT_EQ(m.index_gets, 0u);  // the commit cached the tile index for the node's reads
    EXPECT_EQ(m.index_cache_hits, 1u);
    EXPECT_EQ(m.target_objects_published, 4u);
    // The store saw no whole read of indices/values, and no entry was read twice.
    for (const auto& [key, member] : rec->whole_reads) {
        EXPECT_THAT(member, ::testing::AnyOf("tile_coords", "tile_ptr"));
    }
    std::vector<int> hits(coo.val.size(), 0);
    for (const auto& r : rec->ranges) {
        if (r.member != "values") continue;
        for (auto i = r.start; i < r.end; ++i) ++hits[i];
    }
    for (int h : hits) EXPECT_EQ(h, 1);
    // EP replicas get identical content; TP halves partition the entries.
    EXPECT_EQ(Entries((*objs)[0]), Entries((*objs)[2]));
    EXPECT_EQ(Entries((*objs)[0]).size() + Entries((*objs)[1]).size(), coo.val.size());
}

TEST(SparseStoreTest, RangeDedupPerNodeNotAcrossNodes) {
    auto rec = std::make_shared<RecordingStore>();
    SparseStore store(rec);
    std::mt19937_64 rng(8);
    const Shape shape{256, 256};
    const Coo coo = RandomCoo(rng, shape, 900);
    ASSERT_TRUE(store.PutSparseObject(Request("w", shape, coo)).ok());
    auto manifest = *store.Manifest({0, 1});
    std::vector<TargetDescriptor> targets = {
        Target("a0", "w", "nodeA", {0, 0}, {128, 256}), Target("a1", "w", "nodeA", {0, 0}, {128, 256}),
        Target("b0", "w", "nodeB", {0, 0}, {128, 256})};
    ASSERT_TRUE(store.ReadSparseObjects(manifest, targets).ok());
    EXPECT_EQ(store.Metrics().range_gets, 2u);  // one per node
}

TEST(SparseStoreTest, SecondBatchHitsNodeCache) {
    auto rec = std::make_shared<RecordingStore>();
    SparseStore store(rec);
    std::mt19937_64 rng(9);
    const Shape shape{128, 512};
    const Coo coo = RandomCoo(rng, shape, 700);
    ASSERT_TRUE(store.PutSparseObject(Request("w", shape, coo)).ok());
    auto manifest = *store.Manifest({0, 1});
    ASSERT_TRUE(store.ReadSparseObjects(manifest, {{Target("r0", "w", "n", {0, 0}, {128, 256})}}).ok());
    const auto first = store.Metrics();
    ASSERT_TRUE(store.ReadSparseObjects(manifest, {{Target("r1", "w", "n", {0, 0}, {128, 256})}}).ok());
    const auto second = store.Metrics();
    EXPECT_EQ(second.range_gets, first.range_gets);
    EXPECT_EQ(second.index_gets, 0u);  // cached by the commit
    EXPECT_EQ(second.index_cache_hits, 2u);
    EXPECT_GT(second.cache_hits, first.cache_hits);
}

TEST(SparseStoreTest, ACommitCachesItsTileIndexesForTheNodesReads) {
    // The store that commits a step keeps its sources' tile indexes: its first read of the step
    // loads none. Another store over the same objects (another process) loads each once.
    auto rec = std::make_shared<RecordingStore>();
    SparseStore store(rec);
    std::mt19937_64 rng(21);
    const Shape shape{128, 512};
    std::vector<PutSparseRequest> requests;
    std::vector<Coo> coos;
    for (int k = 0; k < 3; ++k) coos.push_back(RandomCoo(rng, shape, 600));
    for (int k = 0; k < 3; ++k) requests.push_back(Request("w" + std::to_string(k), shape, coos[k]));
    for (const auto& r : store.PutSparseObjects(requests)) ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto manifest = *store.Manifest({0, 1});
    std::vector<TargetDescriptor> targets;
    for (int k = 0; k < 3; ++k) {
        targets.push_back(Target("r" + std::to_string(k), "w" + std::to_string(k), "n", {0, 0},
                                 {128, 256}));
    }
    auto objs = store.ReadSparseObjects(manifest, targets);
    ASSERT_TRUE(objs.ok()) << objs.status().ToString();
    EXPECT_EQ(store.Metrics().index_gets, 0u);
    EXPECT_EQ(store.Metrics().index_cache_hits, 3u);
    for (const auto& [key, member] : rec->whole_reads) {
        EXPECT_NE(member, "tile_coords") << key;
        EXPECT_NE(member, "tile_ptr") << key;
    }
    SparseStore other(rec);
    auto again = other.ReadSparseObjects(manifest, targets);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(other.Metrics().index_gets, 3u);
    EXPECT_EQ(other.Metrics().index_cache_hits, 0u);
    for (std::size_t k = 0; k < targets.size(); ++k) {
        EXPECT_EQ(Entries((*objs)[k]), Entries((*again)[k]));
        EXPECT_FALSE(Entries((*objs)[k]).empty());
    }
    // A commit of the same update again (idempotent) creates nothing and caches nothing new;
    // one that fails caches nothing.
    ASSERT_TRUE(store.PutSparseObject(requests[0]).ok());
    PutSparseRequest bad = Request("w9", shape, coos[0]);
    bad.global_shape = {64, 512};  // its entries fall outside
    EXPECT_FALSE(store.PutSparseObject(bad).ok());
    auto third = store.ReadSparseObjects(manifest, targets);
    ASSERT_TRUE(third.ok());
    EXPECT_EQ(store.Metrics().index_gets, 0u);

    // A store told that its readers are elsewhere caches nothing at the commit.
    SparseStoreOptions options;
    options.cache_committed_indexes = false;
    SparseStore remote(std::make_shared<RecordingStore>(), options);
    for (const auto& r : remote.PutSparseObjects(requests)) ASSERT_TRUE(r.ok());
    ASSERT_TRUE(remote.ReadSparseObjects(*remote.Manifest({0, 1}), targets).ok());
    EXPECT_EQ(remote.Metrics().index_gets, 3u);
}

TEST(SparseStoreTest, FullSourceBaselineCountsFullGets) {
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(10);
    const Shape shape{64, 64};
    const Coo coo = RandomCoo(rng, shape, 100);
    ASSERT_TRUE(store.PutSparseObject(Request("w", shape, coo)).ok());
    auto manifest = *store.Manifest({0, 1});
    ReadOptions opts;
    opts.strategy = ReadStrategy::kFullSourcePerTarget;
    auto objs = store.ReadSparseObjects(
        manifest, {{Target("r0", "w", "n", {0, 0}, {32, 64}), Target("r1", "w", "n", {32, 0}, {32, 64})}}, opts);
    ASSERT_TRUE(objs.ok());
    EXPECT_EQ(store.Metrics().full_gets, 2u);
    EXPECT_EQ(store.Metrics().range_gets, 0u);
    EXPECT_EQ(Entries((*objs)[0]).size() + Entries((*objs)[1]).size(), 100u);
}

TEST(SparseStoreTest, PlanningBudgetFallsBackVisibly) {
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(11);
    const Shape shape{64, 64};
    Coo coo = RandomCoo(rng, shape, 300);
    PutSparseRequest req = Request("w", shape, coo);
    req.encode.tile_shape = Shape{4, 4};
    ASSERT_TRUE(store.PutSparseObject(req).ok());
    auto manifest = *store.Manifest({0, 1});
    ReadOptions opts;
    opts.plan.limits.max_tiles_per_query = 2;
    auto objs = store.ReadSparseObjects(manifest, {{Target("r", "w", "n", {1, 1}, {40, 40})}}, opts);
    ASSERT_TRUE(objs.ok()) << objs.status().ToString();
    EXPECT_EQ(store.Metrics().dense_fallbacks, 1u);
    EXPECT_EQ(store.Metrics().full_gets, 1u);
    std::size_t inside = 0;
    for (std::size_t i = 0; i < coo.val.size(); ++i) {
        inside += coo.idx[2 * i] >= 1 && coo.idx[2 * i] < 41 && coo.idx[2 * i + 1] >= 1 && coo.idx[2 * i + 1] < 41;
    }
    EXPECT_EQ(Entries((*objs)[0]).size(), inside);
}

TEST(SparseStoreTest, FailedCommitLeavesStoreUnchanged) {
    auto rec = std::make_shared<RecordingStore>();
    SparseStore store(rec);
    std::mt19937_64 rng(12);
    const Shape shape{32, 32};
    rec->fail_puts_with_prefix_ = "mcs/head/";
    const Coo coo = RandomCoo(rng, shape, 10);
    auto r = store.PutSparseObject(Request("w", shape, coo));
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(rec->List("")->empty());
    EXPECT_EQ(store.Metrics().source_objects_put, 0u);
}

TEST(SparseStoreTest, ABatchWhosePublishFailsForSomeObjectsLeavesNothingOfThem) {
    // A batch large enough that its store puts go side by side (PutEach): the manifest entry of
    // one tensor and the head of another cannot be written. Those objects fail with the store's
    // error and leave nothing visible; the batch's second generation of a third tensor commits
    // after its first, and every other object commits with its tensor's head at its step.
    auto rec = std::make_shared<RecordingStore>();
    SparseStore store(rec);
    std::mt19937_64 rng(17);
    const Shape shape{32, 32};
    std::vector<Coo> coos;  // the requests view their entries
    coos.reserve(202);
    const auto coo = [&]() -> const Coo& { return coos.emplace_back(RandomCoo(rng, shape, 5)); };
    std::vector<PutSparseRequest> reqs;
    for (int i = 0; i < 100; ++i) {
        reqs.push_back(Request("t" + std::to_string(i), shape, coo(), "none", {0, 1}));
    }
    reqs.push_back(Request("t2", shape, coo(), "none", {1, 2}));
    rec->fail_puts_with_prefix_ = "mcs/manifest/0-1/t7";
    auto results = store.PutSparseObjects(reqs);
    ASSERT_EQ(results.size(), reqs.size());
    // "t7" and every "t7x": the prefix names them all.
    for (std::size_t i = 0; i < reqs.size(); ++i) {
        const std::string& id = reqs[i].tensor_id;
        if (id.starts_with("t7")) {
            EXPECT_THAT(results[i].status(), StatusIs(StatusCode::kResourceExhausted)) << id;
            EXPECT_THAT(*rec->List("mcs/manifest/0-1/" + id), IsEmpty());
            EXPECT_FALSE(store.CurrentGeneration(id)->has_value()) << id;
            continue;
        }
        ASSERT_TRUE(results[i].ok()) << id << ": " << results[i].status().ToString();
        EXPECT_TRUE(results[i]->created);
    }
    EXPECT_EQ(*store.CurrentGeneration("t2"), (Generation{1, 2}));
    EXPECT_EQ(*store.CurrentGeneration("t3"), (Generation{0, 1}));

    // A head that cannot move: the objects of that tensor fail and leave nothing; the others
    // of the step commit.
    std::vector<PutSparseRequest> next;
    for (int i = 0; i < 100; ++i) {
        next.push_back(Request("t" + std::to_string(i), shape, coo(), "none", {1, 2}));
    }
    next[2] = Request("u", shape, coo(), "none", {1, 2});
    rec->fail_puts_with_prefix_ = "mcs/head/t5";
    const std::size_t objects_before = rec->List("mcs/")->size();
    results = store.PutSparseObjects(next);
    std::size_t created = 0;
    for (std::size_t i = 0; i < next.size(); ++i) {
        const std::string& id = next[i].tensor_id;
        if (id.starts_with("t5")) {
            EXPECT_THAT(results[i].status(), StatusIs(StatusCode::kResourceExhausted)) << id;
            EXPECT_THAT(*rec->List("mcs/manifest/1-2/" + id), IsEmpty());
            continue;
        }
        ASSERT_TRUE(results[i].ok()) << id << ": " << results[i].status().ToString();
        created += results[i]->created ? 1 : 0;
        EXPECT_EQ(*store.CurrentGeneration(id), (Generation{1, 2})) << id;
    }
    // Each created object added its source and manifest entry; heads moved in place but for
    // tensors without one before ("u", and those of the first batch's failures, "t7x").
    ASSERT_OK_AND_ASSIGN(auto manifest, store.Manifest({1, 2}));
    EXPECT_EQ(manifest.size(), created + 1);  // + the first batch's "t2" at (1, 2)
    EXPECT_GT(rec->List("mcs/")->size(), objects_before);
}

TEST(SparseStoreTest, StaleAndConflictingCommits) {
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(13);
    const Shape shape{32, 32};
    Coo coo = RandomCoo(rng, shape, 10);
    ASSERT_TRUE(store.PutSparseObject(Request("w", shape, coo, "none", {0, 1})).ok());
    ASSERT_TRUE(store.PutSparseObject(Request("w", shape, coo, "none", {1, 2})).ok());
    EXPECT_EQ(store.PutSparseObject(Request("w", shape, coo, "none", {0, 3})).status().code(),
              StatusCode::kStaleGeneration);
    auto again = store.PutSparseObject(Request("w", shape, coo, "none", {1, 2}));
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->created);
    Coo other = coo;
    other.val[0] += 1;
    EXPECT_EQ(store.PutSparseObject(Request("w", shape, other, "none", {1, 2})).status().code(),
              StatusCode::kConflict);
}

TEST(SparseStoreTest, ABatchCommitsLikeSingleCommitsAndABadUpdateFailsAlone) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore batch_store(os);
    SparseStore single_store(MakeEmbeddedStore());
    std::mt19937_64 rng(31);
    const Shape shape{48, 40};
    std::vector<Coo> coos;
    std::vector<PutSparseRequest> reqs;
    for (int i = 0; i < 1200; ++i) coos.push_back(RandomCoo(rng, shape, 1 + rng() % 30));
    for (int i = 0; i < 1200; ++i) {
        reqs.push_back(Request("t" + std::to_string(i), shape, coos[i], "none", {0, 1}));
    }
    // Two boxes of one tensor in the same batch, and a stale, a conflicting and a bad update.
    ASSERT_OK(single_store.PutSparseObject(Request("stale", shape, coos[0], "none", {0, 1})));
    ASSERT_OK(batch_store.PutSparseObject(Request("stale", shape, coos[0], "none", {0, 1})));
    ASSERT_OK(batch_store.PutSparseObject(Request("stale", shape, coos[0], "none", {1, 2})));
    reqs[10] = Request("stale", shape, coos[10], "none", {0, 1});  // a different payload: Conflict
    reqs[11] = Request("fresh", shape, coos[11], "none", {0, 1});
    const std::vector<std::int64_t> out_of_range = {48, 0};
    const std::vector<float> one = {1.0f};
    reqs[11].indices = Arr(out_of_range, 2);
    reqs[11].values = Arr(one);
    ASSERT_OK(batch_store.PutSparseObject(Request("ahead", shape, coos[12], "none", {0, 1})));
    ASSERT_OK(batch_store.PutSparseObject(Request("ahead", shape, coos[12], "none", {1, 2})));
    reqs[12] = Request("ahead", shape, coos[12], "none", {0, 3});  // base 0 < head 2: stale
    Coo top, bottom;
    for (std::size_t e = 0; e < coos[13].val.size(); ++e) {
        Coo& half = coos[13].idx[2 * e] < 24 ? top : bottom;
        half.idx.insert(half.idx.end(), {coos[13].idx[2 * e], coos[13].idx[2 * e + 1]});
        half.val.push_back(coos[13].val[e]);
    }
    // Indices are global: each half is its box's entries as they are.
    reqs[13] = Request("boxes", shape, top, "none", {0, 1});
    reqs[13].global_offset = Shape{0, 0};
    reqs[13].local_shape = Shape{24, 40};
    reqs.push_back(Request("boxes", shape, bottom, "none", {0, 1}));
    reqs.back().global_offset = Shape{24, 0};
    reqs.back().local_shape = Shape{24, 40};

    const StoreCounters before = os->Counters();
    std::vector<Result<CommitResult>> results = batch_store.PutSparseObjects(reqs);
    ASSERT_EQ(results.size(), reqs.size());
    EXPECT_THAT(results[10].status(), StatusIs(StatusCode::kConflict));
    EXPECT_THAT(results[11].status(), StatusIsWithMessage(StatusCode::kInvalidArgument, "update 11"));
    EXPECT_THAT(results[12].status(), StatusIs(StatusCode::kStaleGeneration));
    std::size_t created = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
        if (i >= 10 && i <= 12) continue;
        ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status().ToString();
        EXPECT_TRUE(results[i]->created);
        ++created;
        if (i < 10 || i > 13) {
            if (i == reqs.size() - 1) continue;
            // The same source object a single commit makes.
            ASSERT_OK_AND_ASSIGN(CommitResult one, single_store.PutSparseObject(reqs[i]));
            EXPECT_EQ(one.source_ref, results[i]->source_ref);
            EXPECT_EQ(os->Stat(results[i]->source_ref)->metadata,
                      single_store.object_store().Stat(one.source_ref)->metadata);
        }
    }
    // The failed updates left nothing behind; the manifest holds every other one.
    EXPECT_THAT(*os->List("mcs/manifest/0-1/fresh"), IsEmpty());
    EXPECT_THAT(*os->List("mcs/head/fresh"), IsEmpty());
    ASSERT_OK_AND_ASSIGN(auto manifest, batch_store.Manifest({0, 1}));
    EXPECT_EQ(manifest.size(), created + 2);  // + "stale" and "ahead" at (0, 1), before
    EXPECT_EQ(batch_store.Metrics().source_objects_put, created + 4);
    EXPECT_GT(os->Counters().puts, before.puts);
    // A retry of the whole batch is idempotent; into a sealed step, every update is refused.
    std::vector<Result<CommitResult>> again = batch_store.PutSparseObjects(reqs);
    for (std::size_t i = 0; i < again.size(); ++i) {
        if (i >= 10 && i <= 12) continue;
        ASSERT_TRUE(again[i].ok()) << i;
        EXPECT_FALSE(again[i]->created);
    }
    std::vector<std::string> ids;
    for (const auto& d : manifest) ids.push_back(d.tensor_id);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    ids.push_back("late");
    ASSERT_OK(batch_store.SealGeneration({0, 1}, ids));
    std::vector<PutSparseRequest> late = {Request("late", shape, coos[1], "none", {0, 1}),
                                          Request("late", shape, coos[2], "none", {0, 1})};
    late[1].global_offset = Shape{0, 0};
    for (const auto& r : batch_store.PutSparseObjects(late)) {
        EXPECT_THAT(r.status(), StatusIs(StatusCode::kConflict));
    }
}

TEST(SparseStoreTest, AdmissionRaceHasOneWinner) {
    SparseStore store(MakeEmbeddedStore());
    std::vector<std::thread> threads;
    std::atomic<int> winners{0};
    for (int r = 0; r < 8; ++r) {
        threads.emplace_back([&, r] {
            auto ok = store.Admit("w", {0, 1}, *PlacementPolicy::Parse("replicate(ep)"), {},
                                  "rank" + std::to_string(r));
            if (ok.ok() && *ok) ++winners;
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(winners.load(), 1);
}

TEST(SparseStoreTest, MetadataRoundTrip) {
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(14);
    const Shape shape{40, 50, 60};
    const Coo coo = RandomCoo(rng, shape, 77);
    PutSparseRequest req = Request("fused", shape, coo, "owner(expert)");
    req.source_placement = *NamedAxes::Make({{"expert", 3}});
    auto c = store.PutSparseObject(req);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto manifest = *store.Manifest({0, 1});
    ASSERT_EQ(manifest.size(), 1u);
    EXPECT_EQ(manifest[0].source_ref, c->source_ref);
    EXPECT_EQ(manifest[0].nnz, 77u);
    EXPECT_EQ(manifest[0].placement.Get("expert"), 3);
    EXPECT_EQ(manifest[0].policy.ToString(), "owner(expert)");
    EXPECT_EQ(DecodeObjectMetadata("x", "{").status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(DecodeObjectMetadata("x", "{\"schema\":\"other\"}").status().code(),
              StatusCode::kInvalidArgument);
}

// Source keys are what other versions of the library find a step's objects by: their text
// stays exactly as it was (a run's store outlives a library upgrade).
TEST(SparseStoreTest, SourceKeysKeepTheirFormat) {
    const Box box = *Box::Make({0, 128, 7}, {4, 64, 9});
    const NamedAxes expert = *NamedAxes::Make({{"expert", 12}});
    EXPECT_EQ(SourceObjectKey("layers.3.w1", {17, 18}, *PlacementPolicy::Parse("owner(expert)"),
                              expert, box),
              "mcs/src/layers.3.w1/g17-18/owner(expert)/expert=12/at0_128_7");
    EXPECT_EQ(SourceObjectKey("w", {0, 1}, *PlacementPolicy::Parse("replicate(ep)"), {},
                              *Box::Make({0}, {5})),
              "mcs/src/w/g0-1/replicate(ep)/at0");
    // Generations beyond 2^63 print as the unsigned numbers they are.
    EXPECT_EQ(SourceObjectKey("w", {18446744073709551614ull, 18446744073709551615ull},
                              *PlacementPolicy::Parse("none"), {}, *Box::Make({3, 4}, {1, 1})),
              "mcs/src/w/g18446744073709551614-18446744073709551615/none/at3_4");
    // A committed source is named the same way under the store's namespace.
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(15);
    const Shape shape{40, 50, 60};
    const Coo coo = RandomCoo(rng, shape, 9);  // the request views it
    PutSparseRequest req = Request("fused", shape, coo, "owner(expert)");
    req.source_placement = expert;
    ASSERT_OK_AND_ASSIGN(CommitResult c, store.PutSparseObject(req));
    EXPECT_EQ(c.source_ref.substr(c.source_ref.find("fused/")),
              "fused/g0-1/owner(expert)/expert=12/at0_0_0");
}

// A read trusts only what the store holds: a manifest entry describing a stored object with
// other numbers (another tile shape, a huge nnz or tile count) fails its own read with a typed
// error before anything is sized from it, and never changes what honest readers get.
TEST(SparseStoreTest, ManifestEntryThatMisdescribesTheStoredObjectIsRejected) {
    auto rec = std::make_shared<RecordingStore>();
    SparseStore store(rec);
    std::mt19937_64 rng(21);
    const Shape shape{64, 64};
    const Coo coo = RandomCoo(rng, shape, 32);
    PutSparseRequest req = Request("w", shape, coo);
    req.encode.tile_shape = Shape{16, 16};
    ASSERT_TRUE(store.PutSparseObject(req).ok());
    // The commit cached the object's tile index; the first round reads it from the store.
    ASSERT_OK(store.ClearCaches());
    const auto manifest = *store.Manifest({0, 1});
    const std::vector<TargetDescriptor> targets = {Target("r0", "w", "n", {0, 0}, {64, 64})};

    auto lie = [&](auto edit) {
        std::vector<SourceDescriptor> m = manifest;
        edit(m[0]);
        return m;
    };
    const auto other_tiles = lie([](SourceDescriptor& d) { d.tile_shape = {8, 8}; });
    const auto huge_nnz = lie([](SourceDescriptor& d) { d.nnz = std::uint64_t{1} << 40; });
    const auto huge_tiles = lie([](SourceDescriptor& d) {
        d.nnz = ~std::uint64_t{0};
        d.num_tiles = ~std::uint64_t{0};
    });
    const auto missing = lie([](SourceDescriptor& d) { d.source_ref += "x"; });

    // Before the honest reader fills the cache, and after.
    for (int round = 0; round < 2; ++round) {
        for (const auto* m : {&other_tiles, &huge_nnz, &huge_tiles}) {
            for (ReadStrategy strategy :
                 {ReadStrategy::kSparseRanges, ReadStrategy::kFullSourcePerTarget}) {
                ReadOptions opts;
                opts.strategy = strategy;
                const Status st = store.ReadSparseObjects(*m, targets, opts).status();
                EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
                EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("does not describe"));
            }
        }
        auto r = store.ReadSparseObjects(missing, targets);
        EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();

        auto honest = store.ReadSparseObjects(manifest, targets);
        ASSERT_TRUE(honest.ok()) << honest.status().ToString();
        EXPECT_EQ(Entries((*honest)[0]).size(), 32u);
    }
    EXPECT_EQ(store.Metrics().index_gets, 1u);
    // Nothing whole was read for a lying entry: only the honest reader's index-only GET.
    for (const auto& [key, member] : rec->whole_reads) {
        EXPECT_THAT(member, ::testing::AnyOf("tile_coords", "tile_ptr"));
    }
}

// A read of many sources loads their indexes side by side and builds many small targets on
// several threads: the same objects as one thread builds; the error of a call whose manifest
// misdescribes several sources is the first one's in manifest order, and honest reads after it
// are unchanged.
TEST(SparseStoreTest, ManySourcesLoadInParallelAndFailInManifestOrder) {
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(23);
    const Shape shape{48, 40};
    constexpr int kSources = 300;
    std::vector<TargetDescriptor> targets;
    for (int i = 0; i < kSources; ++i) {
        const std::string name = "w" + std::to_string(i);
        const Coo coo = RandomCoo(rng, shape, 20 + i % 7);
        PutSparseRequest req = Request(name, shape, coo);
        req.encode.tile_shape = Shape{16, 16};
        ASSERT_TRUE(store.PutSparseObject(req).ok());
        targets.push_back(Target("a/" + name, name, "n", {0, 0}, {48, 40}));
        targets.push_back(Target("b/" + name, name, "n", {8, 4}, {24, 30}));  // boundary tiles
    }
    const auto manifest = *store.Manifest({0, 1});
    ASSERT_EQ(manifest.size(), std::size_t{kSources});
    ReadOptions one;
    one.num_threads = 1;
    auto serial = store.ReadSparseObjects(manifest, targets, one);
    ASSERT_TRUE(serial.ok()) << serial.status().ToString();
    for (int round = 0; round < 2; ++round) {
        ASSERT_OK(store.ClearCaches());
        ReadOptions many;
        many.num_threads = 4;
        auto parallel = store.ReadSparseObjects(manifest, targets, many);
        ASSERT_TRUE(parallel.ok()) << parallel.status().ToString();
        ASSERT_EQ(parallel->size(), serial->size());
        for (std::size_t t = 0; t < serial->size(); ++t) {
            EXPECT_EQ(Entries((*parallel)[t]), Entries((*serial)[t])) << t;
        }
        // Sources 120 (missing) and 150, 250 (other numbers) misdescribed: the first one fails
        // the call, whichever thread loads it.
        std::vector<SourceDescriptor> lies = manifest;
        lies[120].source_ref += "x";
        lies[150].nnz = std::uint64_t{1} << 40;
        lies[250].tile_shape = {8, 8};
        ASSERT_OK(store.ClearCaches());
        const Status st = store.ReadSparseObjects(lies, targets, many).status();
        EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
        lies[120] = manifest[120];
        const Status st2 = store.ReadSparseObjects(lies, targets, many).status();
        EXPECT_EQ(st2.code(), StatusCode::kInvalidArgument) << st2.ToString();
        EXPECT_THAT(std::string(st2.message()), ::testing::HasSubstr(manifest[150].source_ref));
    }
}

TEST(SparseStoreTest, TileShapeLargerThanTheTensorIsStoredClamped) {
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(22);
    const Shape shape{64, 64};
    const Coo coo = RandomCoo(rng, shape, 10);
    // A caller's extent beyond the tensor's means one tile along that dimension: stored
    // clamped, so no descriptor ever holds a tile larger than its tensor.
    const Shape huge[] = {{Index{1} << 32, Index{1} << 32}, {Index{1} << 62, 8}, {128, 8}};
    const Shape stored[] = {{64, 64}, {64, 8}, {64, 8}};
    for (int i = 0; i < 3; ++i) {
        SparseStore s(MakeEmbeddedStore());
        PutSparseRequest req = Request("w", shape, coo);
        req.encode.tile_shape = huge[i];
        auto r = s.PutSparseObject(req);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        auto manifest = *s.Manifest({0, 1});
        ASSERT_EQ(manifest.size(), 1u);
        EXPECT_EQ(manifest[0].tile_shape, stored[i]);
        auto objs = s.ReadSparseObjects(manifest, {{Target("r", "w", "n", {0, 0}, {64, 64})}});
        ASSERT_TRUE(objs.ok()) << objs.status().ToString();
        EXPECT_EQ(Entries((*objs)[0]).size(), 10u);
    }
    for (const Shape& bad : {Shape{0, 8}, Shape{-1, 8}, Shape{8}}) {
        PutSparseRequest req = Request("w", shape, coo);
        req.encode.tile_shape = bad;
        EXPECT_EQ(store.PutSparseObject(req).status().code(), StatusCode::kInvalidArgument);
    }
    EXPECT_TRUE(store.Manifest({0, 1})->empty());
}

}  // namespace
/// Every target object, whichever way it was built (its tile index taken from its sources' when
/// its origin lies on their tile grid, otherwise built from its entries), is exactly the object
/// BuildSparseObject makes from its entries: same entries, tile index, descriptor and checksums.
TEST(SparseStoreTest, TargetObjectsAreThoseBuiltFromTheirEntries) {
    struct Case {
        Shape shape, tile;
        std::vector<std::pair<Shape, Shape>> source_boxes;  // (offset, extents); empty: whole
        std::vector<std::pair<Shape, Shape>> targets;       // (offset, extents)
    };
    const std::vector<Case> cases = {
        // 2-D: tile-aligned halves and quarters, a box cut mid-tile at its far end, a box
        // smaller than a tile, unaligned origins (built from the entries).
        {{64, 96}, {8, 16}, {},
         {{{0, 0}, {32, 96}}, {{32, 0}, {32, 96}}, {{0, 48}, {64, 48}}, {{8, 16}, {20, 37}},
          {{16, 32}, {5, 7}}, {{3, 5}, {40, 60}}, {{0, 0}, {64, 96}}, {{60, 90}, {4, 6}}}},
        // Two sources split by rows and by columns (their tiles interleave in a target's order).
        {{48, 64}, {8, 8}, {{{0, 0}, {24, 64}}, {{24, 0}, {24, 64}}},
         {{{0, 0}, {48, 64}}, {{16, 8}, {16, 32}}, {{20, 0}, {8, 64}}}},
        {{48, 64}, {8, 8}, {{{0, 0}, {48, 32}}, {{0, 32}, {48, 32}}},
         {{{0, 0}, {48, 64}}, {{8, 24}, {16, 16}}, {{0, 32}, {48, 32}}}},
        // 1-D and 3-D.
        {{1000}, {64}, {}, {{{0}, {512}}, {{512}, {488}}, {{100}, {300}}}},
        {{8, 40, 24}, {2, 8, 8}, {},
         {{{0, 0, 0}, {4, 40, 24}}, {{2, 8, 8}, {4, 20, 10}}, {{1, 3, 5}, {3, 30, 12}}}},
    };
    std::mt19937_64 rng(20261201);
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        SCOPED_TRACE("case " + std::to_string(ci));
        SparseStore store(MakeEmbeddedStore());
        std::size_t volume = 1;
        for (Index e : c.shape) volume *= std::size_t(e);
        const Coo coo = RandomCoo(rng, c.shape, volume / 20);
        const std::string id = "t" + std::to_string(ci);
        const std::size_t rank = c.shape.size();
        auto boxes = c.source_boxes;
        if (boxes.empty()) boxes.push_back({Shape(rank, 0), c.shape});
        for (const auto& [offset, extents] : boxes) {
            Coo part;
            for (std::size_t e = 0; e < coo.val.size(); ++e) {
                bool inside = true;
                for (std::size_t d = 0; d < rank; ++d) {
                    const auto x = coo.idx[e * rank + d];
                    inside &= x >= offset[d] && x < offset[d] + extents[d];
                }
                if (!inside) continue;
                part.idx.insert(part.idx.end(), coo.idx.begin() + e * rank,
                                coo.idx.begin() + (e + 1) * rank);
                part.val.push_back(coo.val[e]);
            }
            PutSparseRequest req = Request(id, c.shape, part, "none");
            req.global_offset = offset;
            req.local_shape = extents;
            req.encode.tile_shape = c.tile;
            ASSERT_OK(store.PutSparseObject(req).status());
        }
        ASSERT_OK_AND_ASSIGN(std::vector<SourceDescriptor> manifest, store.Manifest({0, 1}));
        std::vector<TargetDescriptor> targets;
        for (std::size_t t = 0; t < c.targets.size(); ++t) {
            targets.push_back(Target("r" + std::to_string(t), id, "node0", c.targets[t].first,
                                     c.targets[t].second));
        }
        ASSERT_OK_AND_ASSIGN(std::vector<TargetObject> objs,
                             store.ReadSparseObjects(manifest, targets));
        ASSERT_EQ(objs.size(), targets.size());
        for (std::size_t t = 0; t < objs.size(); ++t) {
            SCOPED_TRACE("target " + std::to_string(t));
            const SparseObject& got = objs[t].object;
            const auto& [offset, extents] = c.targets[t];
            // The brute-force filter of the source entries, rebased.
            std::map<std::vector<std::int64_t>, float> expected;
            for (std::size_t e = 0; e < coo.val.size(); ++e) {
                std::vector<std::int64_t> p;
                for (std::size_t d = 0; d < rank; ++d) {
                    const auto x = coo.idx[e * rank + d];
                    if (x < offset[d] || x >= offset[d] + extents[d]) break;
                    p.push_back(x - offset[d]);
                }
                if (p.size() == rank) expected[p] = coo.val[e];
            }
            EXPECT_EQ(Entries(objs[t]), expected);
            // The object BuildSparseObject makes of the same entries.
            SourceDescriptor desc = got.desc;
            const HostArray idx{got.desc.index_dtype, {Index(got.desc.nnz), Index(rank)},
                                std::span(got.indices)};
            const HostArray val{got.desc.value_dtype, {Index(got.desc.nnz)}, std::span(got.values)};
            EncodeOptions enc;
            enc.tile_shape = got.desc.tile_shape;
            ASSERT_OK_AND_ASSIGN(SparseObject built, BuildSparseObject(desc, idx, val, enc));
            EXPECT_EQ(got.desc.tile_shape, built.desc.tile_shape);
            EXPECT_EQ(got.desc.num_tiles, built.desc.num_tiles);
            EXPECT_EQ(got.desc.nnz, built.desc.nnz);
            EXPECT_EQ(got.desc.index_dtype, built.desc.index_dtype);
            EXPECT_EQ(got.tile_coords, built.tile_coords);
            EXPECT_EQ(got.tile_ptr, built.tile_ptr);
            EXPECT_EQ(got.indices, built.indices);
            EXPECT_EQ(got.values, built.values);
            EXPECT_EQ(got.checksum_indices, built.checksum_indices);
            EXPECT_EQ(got.checksum_values, built.checksum_values);
            EXPECT_EQ(got.checksum_tile_coords, built.checksum_tile_coords);
            EXPECT_EQ(got.checksum_tile_ptr, built.checksum_tile_ptr);
            EXPECT_EQ(got.coordinate_space, "local");
            for (std::size_t d = 0; d < rank; ++d) {
                EXPECT_EQ(got.desc.tile_shape[d], std::min(c.tile[d], extents[d]));
            }
        }
    }
}

/// A batch whose source objects do not all fit: the batch write fails as a whole, and the
/// objects are then committed one by one, each succeeding or failing alone, nothing of a failed
/// one left behind. And a batch holding two steps of one tensor commits them in order.
TEST(SparseStoreTest, ABatchOverCapacityCommitsWhatFitsAndEachFailureIsItsOwn) {
    // Four objects of 400,000 entries (3.2 MB each: a batch over the size from which it is
    // written by one PutFilled on several threads), room for two and a half.
    const Shape shape{2048, 2048};
    constexpr std::int64_t kEntries = 400000;
    std::vector<Coo> coos(4);
    for (int i = 0; i < 4; ++i) {
        for (std::int64_t k = 0; k < kEntries; ++k) {
            const std::int64_t linear = (k * 13 + i) % (2048 * 2048);  // distinct for k < 2^22 / 13
            coos[i].idx.insert(coos[i].idx.end(), {linear / 2048, linear % 2048});
            coos[i].val.push_back(float(k % 1000) - 3.5f);
        }
    }
    EmbeddedStoreOptions options;
    options.capacity_bytes = 2 * kEntries * 8 + 1'000'000;
    SparseStore store(MakeEmbeddedStore(options));
    std::vector<PutSparseRequest> reqs;
    for (int i = 0; i < 4; ++i) reqs.push_back(Request("w" + std::to_string(i), shape, coos[i], "none"));
    std::vector<Result<CommitResult>> results = store.PutSparseObjects(reqs, 2);
    ASSERT_EQ(results.size(), 4u);
    std::size_t ok = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
        if (results[i].ok()) {
            ++ok;
            EXPECT_TRUE(results[i]->created);
            continue;
        }
        EXPECT_THAT(results[i].status(), StatusIs(StatusCode::kResourceExhausted)) << i;
    }
    EXPECT_EQ(ok, 2u);
    ASSERT_OK_AND_ASSIGN(std::vector<SourceDescriptor> manifest, store.Manifest({0, 1}));
    EXPECT_EQ(manifest.size(), ok);
    for (const SourceDescriptor& d : manifest) {
        const auto it = std::find_if(results.begin(), results.end(), [&](const auto& r) {
            return r.ok() && r->source_ref == d.source_ref;
        });
        EXPECT_NE(it, results.end()) << d.source_ref;
    }
    EXPECT_EQ(store.Metrics().source_objects_put, ok);

    // Two steps of one tensor (a worker catching up) and another tensor, in one batch.
    SparseStore steps(MakeEmbeddedStore());
    std::vector<PutSparseRequest> two = {Request("a", shape, coos[0], "none", {0, 1}),
                                         Request("b", shape, coos[1], "none", {0, 1}),
                                         Request("a", shape, coos[2], "none", {1, 2})};
    std::vector<Result<CommitResult>> done = steps.PutSparseObjects(two);
    for (std::size_t i = 0; i < done.size(); ++i) ASSERT_OK(done[i].status()) << i;
    ASSERT_OK_AND_ASSIGN(std::optional<Generation> head, steps.CurrentGeneration("a"));
    ASSERT_TRUE(head.has_value());
    EXPECT_EQ(*head, (Generation{1, 2}));
    ASSERT_OK_AND_ASSIGN(std::vector<SourceDescriptor> second, steps.Manifest({1, 2}));
    ASSERT_EQ(second.size(), 1u);
    EXPECT_EQ(second[0].tensor_id, "a");
    // A stale step of "a" in a later batch fails alone.
    std::vector<PutSparseRequest> stale = {Request("a", shape, coos[3], "none", {0, 1}),
                                           Request("b", shape, coos[3], "none", {1, 2})};
    done = steps.PutSparseObjects(stale);
    EXPECT_THAT(done[0].status(), StatusIs(StatusCode::kConflict));  // a different payload
    ASSERT_OK(done[1].status());
}

TEST(SparseStoreTest, GenerationHeadsOfOtherWritersAreReadAndCorruptOnesAreDataLoss) {
    std::shared_ptr<ObjectStore> objects = MakeEmbeddedStore();
    SparseStore store(objects);
    const auto head = [&](const std::string& tensor, const std::string& text) {
        ASSERT_OK(objects->Put("mcs/head/" + tensor, text, {}, {PutMode::kUpsert, true}));
    };
    // The form this library writes, and JSON of the same meaning formatted otherwise.
    head("a", R"({"base":4,"delta":5})");
    head("b", R"({ "delta": 9, "base": 7 })");
    head("c", R"({"base":18446744073709551614,"delta":18446744073709551615})");
    EXPECT_EQ(**store.CurrentGeneration("a"), (Generation{4, 5}));
    EXPECT_EQ(**store.CurrentGeneration("b"), (Generation{7, 9}));
    EXPECT_EQ(**store.CurrentGeneration("c"),
              (Generation{18446744073709551614ull, 18446744073709551615ull}));
    for (const std::string& bad : {std::string(R"({"base":4})"), std::string(R"({"base":"4","delta":5})"),
                                   std::string(R"({"base":-1,"delta":5})"), std::string("[4,5]"),
                                   std::string(R"({"base":4,"delta":5}x)"), std::string("")}) {
        head("d", bad);
        EXPECT_THAT(store.CurrentGeneration("d"), StatusIs(StatusCode::kDataLoss)) << bad;
    }
    EXPECT_FALSE(store.CurrentGeneration("none")->has_value());
}

}  // namespace mooncake::sparse
