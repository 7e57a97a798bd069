// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// SparseStore::PutIndexedObjects (a commit whose entries a fill callback writes straight into the
// store's memory, as the GPU commit does) against PutSparseObjects of the same updates: the same
// results, source objects, manifest and metrics; a failing object fails alone; a fill error or a
// batch the store cannot write at once leaves nothing behind. The entries here are host arrays
// that the fill memcpys; PlanIndexedSource + FinishCanonicalEntries stand in for the device's
// checks, as the binding uses them.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../status_matchers.h"
#include "../store/store_test_util.h"
#include "executor/sparse_store.h"

namespace mooncake::sparse {
namespace {

/// A store's metrics without its clocks.
std::vector<std::pair<std::string, double>> Counted(const SparseStore& store) {
    std::vector<std::pair<std::string, double>> items = store.Metrics().Items();
    std::erase_if(items, [](const auto& item) { return item.first.ends_with("_seconds"); });
    return items;
}

using ::mooncake::sparse::testing::StatusIs;
using ::testing::IsEmpty;

/// One update: canonical entries (sorted, narrowest index dtype) in host arrays, and its request.
struct Update {
    std::vector<std::byte> indices;
    std::vector<std::byte> values;
    PutSparseRequest request;
};

/// An update of `nnz` distinct random coordinates of `shape` (inside `box` when given), made
/// canonical by a host encode.
std::unique_ptr<Update> MakeUpdate(std::mt19937_64& rng, const std::string& id, const Shape& shape,
                                   std::size_t nnz, Generation g = {0, 1},
                                   std::optional<Box> box = std::nullopt) {
    const Box b = box ? *box : *Box::Whole(shape);
    std::set<std::pair<std::int64_t, std::int64_t>> seen;
    std::vector<std::int64_t> idx;
    std::vector<float> val;
    while (seen.size() < nnz) {
        const std::int64_t r = b.begin(0) + std::int64_t(rng() % std::uint64_t(b.shape()[0]));
        const std::int64_t c = b.begin(1) + std::int64_t(rng() % std::uint64_t(b.shape()[1]));
        if (!seen.insert({r, c}).second) continue;
        idx.insert(idx.end(), {r, c});
        val.push_back(float(rng() % 1000) - 7.5f);
    }
    auto u = std::make_unique<Update>();
    PutSparseRequest& req = u->request;
    req.tensor_id = id;
    req.global_shape = shape;
    if (box) {
        req.global_offset = Shape(b.origin().begin(), b.origin().end());
        req.local_shape = Shape(b.shape().begin(), b.shape().end());
    }
    req.placement_policy = *PlacementPolicy::Parse("none");
    req.generation = g;
    req.indices = {DType::kInt64, {Index(nnz), 2}, std::as_bytes(std::span(idx))};
    req.values = {DType::kFloat32, {Index(nnz)}, std::as_bytes(std::span(val))};
    Result<SparseObject> built = BuildSourceObject(req);
    EXPECT_TRUE(built.ok()) << built.status().ToString();
    u->indices.assign(built->indices.begin(), built->indices.end());
    u->values.assign(built->values.begin(), built->values.end());
    req.indices = {built->desc.index_dtype, {Index(nnz), 2}, u->indices};
    req.values = {DType::kFloat32, {Index(nnz)}, u->values};
    return u;
}

CooLayout LayoutOf(const PutSparseRequest& r) {
    return {r.indices.dtype, r.indices.shape, r.indices.data.size(),
            r.values.dtype,  r.values.shape,  r.values.data.size()};
}

/// The object the GPU commit makes of a canonical update: planned without its entries, then
/// finished with the tile index and checksums (here the host's, standing in for the device's).
SparseObject IndexedObject(const PutSparseRequest& r) {
    std::optional<SourceDescriptor> planned = PlanIndexedSource(r, LayoutOf(r));
    EXPECT_TRUE(planned.has_value()) << r.tensor_id;
    std::optional<SparseObject> host = IndexSourceObject(r);
    EXPECT_TRUE(host.has_value()) << r.tensor_id;
    std::optional<SparseObject> obj = FinishCanonicalEntries(
        *planned, host->tile_coords, host->tile_ptr, Checksum(r.indices.data),
        Checksum(r.values.data));
    EXPECT_TRUE(obj.has_value()) << r.tensor_id;
    return std::move(*obj);
}

/// A fill that copies each target's entries from the updates' host arrays; counts its calls.
struct HostFill {
    std::vector<const Update*> of;  ///< Per object of the batch.
    int calls = 0;
    std::vector<bool> pinned;

    EntryFill Fn() {
        return [this](std::span<const EntryTarget> targets) -> Status {
            ++calls;
            for (const EntryTarget& t : targets) {
                if (t.object >= of.size() || of[t.object] == nullptr) return Internal("no such");
                const Update& u = *of[t.object];
                if (t.indices.size() != u.indices.size() || t.values.size() != u.values.size()) {
                    return Internal("size");
                }
                std::memcpy(t.indices.data(), u.indices.data(), u.indices.size());
                std::memcpy(t.values.data(), u.values.data(), u.values.size());
                pinned.push_back(t.pinned);
            }
            return Status::Ok();
        };
    }
};

/// Updates as one PutIndexedObjects batch: their indexed objects, pins, and the fill of their
/// entries.
struct IndexedBatch {
    std::vector<SparseObject> objects;
    std::vector<bool> pins;
    HostFill fill;
};

IndexedBatch BatchOf(const std::vector<std::unique_ptr<Update>>& updates) {
    IndexedBatch b;
    for (const auto& u : updates) {
        b.objects.push_back(IndexedObject(u->request));
        b.pins.push_back(u->request.hard_pin);
        b.fill.of.push_back(u.get());
    }
    return b;
}

/// Every key under "mcs/" with its metadata and member checksums and bytes.
std::map<std::string, std::string> Snapshot(ObjectStore& os) {
    std::map<std::string, std::string> out;
    const Result<std::vector<std::string>> keys = os.List("mcs/");
    EXPECT_OK(keys.status());
    for (const std::string& key : *keys) {
        Result<ObjectInfo> info = os.Stat(key);
        if (!info.ok()) continue;
        std::string s = info->metadata;
        for (const MemberInfo& m : info->members) {
            std::vector<std::byte> bytes(m.size_bytes);
            EXPECT_OK(os.ReadMember(key, m.name, bytes));
            s += "|" + m.name + ":" + std::to_string(m.checksum) + ":" +
                 std::to_string(Checksum(bytes));
        }
        out[key] = s;
    }
    return out;
}

/// Source objects are not listed: the snapshot of each result's source object.
std::string SourceSnapshot(ObjectStore& os, const std::string& ref) {
    Result<ObjectInfo> info = os.Stat(ref);
    if (!info.ok()) return "missing";
    std::string s = info->metadata;
    for (const MemberInfo& m : info->members) {
        std::vector<std::byte> bytes(m.size_bytes);
        EXPECT_OK(os.ReadMember(ref, m.name, bytes));
        s += "|" + m.name + ":" + std::to_string(m.checksum) + ":" +
             std::to_string(Checksum(bytes));
    }
    return s;
}

TEST(DeviceCommitGroupsTest, GroupsGrowThreefoldAndTheLastTakesTheRest) {
    constexpr std::uint64_t M = std::uint64_t{1} << 20;
    using Bounds = std::vector<std::size_t>;
    // A layer's commit: 262 MB in 296 updates of about 0.9 MB -> 16, 48 MiB and the rest.
    std::vector<std::uint64_t> layer(296, 885 * 1024);
    const Bounds layer_bounds = DeviceCommitGroups(layer, 16 * M);
    ASSERT_EQ(layer_bounds.size(), 4u);
    EXPECT_EQ(layer_bounds.front(), 0u);
    EXPECT_EQ(layer_bounds.back(), layer.size());
    const auto bytes_of = [&](std::size_t g) {
        std::uint64_t b = 0;
        for (std::size_t i = layer_bounds[g]; i < layer_bounds[g + 1]; ++i) b += layer[i];
        return b;
    };
    EXPECT_GE(bytes_of(0), 16 * M);
    EXPECT_LT(bytes_of(0), 16 * M + 885 * 1024);
    EXPECT_GE(bytes_of(1), 48 * M);
    EXPECT_LT(bytes_of(1), 48 * M + 885 * 1024);
    EXPECT_GE(bytes_of(2), 144 * M / 3);  // the rest, less than the third target
    // Off, empty, one item, and a batch whose rest never reaches a group's target: one group.
    EXPECT_EQ(DeviceCommitGroups(layer, 0), (Bounds{0, 296}));
    EXPECT_EQ(DeviceCommitGroups({}, 16 * M), (Bounds{0, 0}));
    EXPECT_EQ(DeviceCommitGroups(std::vector<std::uint64_t>{100 * M}, 16 * M), (Bounds{0, 1}));
    EXPECT_EQ(DeviceCommitGroups(std::vector<std::uint64_t>{20 * M, 10 * M}, 16 * M),
              (Bounds{0, 2}));
    // Exact targets close a group at the item that reaches them; a large item is one group.
    EXPECT_EQ(DeviceCommitGroups(std::vector<std::uint64_t>{8, 8, 24, 24, 200, 1}, 16),
              (Bounds{0, 2, 4, 6}));
    EXPECT_EQ(DeviceCommitGroups(std::vector<std::uint64_t>{1000, 1000, 5000}, 16),
              (Bounds{0, 1, 2, 3}));
    // No overflow of the target.
    const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max() / 2;
    EXPECT_EQ(DeviceCommitGroups(std::vector<std::uint64_t>{1, 1, 1}, huge), (Bounds{0, 3}));
}

TEST(IndexedCommitTest, PlanAndFinishMakeTheObjectIndexSourceObjectMakes) {
    std::mt19937_64 rng(1);
    const Shape shape{300, 70000};  // uint32 indices
    std::vector<std::unique_ptr<Update>> updates;
    updates.push_back(MakeUpdate(rng, "a", {64, 48}, 200));
    updates.push_back(MakeUpdate(rng, "b", shape, 500));
    updates.push_back(MakeUpdate(rng, "c", {64, 48}, 100, {0, 1}, *Box::Make({8, 16}, {40, 20})));
    for (const auto& u : updates) {
        const SparseObject got = IndexedObject(u->request);
        const SparseObject want = *IndexSourceObject(u->request);
        EXPECT_EQ(got.desc, want.desc);
        EXPECT_EQ(got.tile_coords, want.tile_coords);
        EXPECT_EQ(got.tile_ptr, want.tile_ptr);
        EXPECT_EQ(got.checksum_indices, want.checksum_indices);
        EXPECT_EQ(got.checksum_values, want.checksum_values);
        EXPECT_EQ(got.checksum_tile_coords, want.checksum_tile_coords);
        EXPECT_EQ(got.checksum_tile_ptr, want.checksum_tile_ptr);
        EXPECT_TRUE(got.indices.empty() && got.values.empty());
    }
    // What the sorted fast path never takes, whatever the entries: no plan.
    auto u = MakeUpdate(rng, "d", {64, 48}, 10);
    CooLayout wide = LayoutOf(u->request);
    wide.index_dtype = DType::kUInt32;
    EXPECT_FALSE(PlanIndexedSource(u->request, wide).has_value());
    PutSparseRequest sum = u->request;
    sum.apply = ApplyMode::kScatterAdd;
    sum.encode.duplicates = DuplicatePolicy::kSum;
    EXPECT_FALSE(PlanIndexedSource(sum, LayoutOf(sum)).has_value());
    CooLayout empty = LayoutOf(u->request);
    empty.index_shape = {0, 2};
    empty.value_shape = {0};
    empty.index_bytes = empty.value_bytes = 0;
    EXPECT_FALSE(PlanIndexedSource(u->request, empty).has_value());
    // A tile index that does not fit the plan is refused.
    std::optional<SourceDescriptor> planned = PlanIndexedSource(u->request, LayoutOf(u->request));
    ASSERT_TRUE(planned.has_value());
    EXPECT_FALSE(FinishCanonicalEntries(*planned, {0, 0}, {0, 3}, 0, 0).has_value());
}

class IndexedCommitBatchTest : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(IndexedCommitBatchTest, CommitsWhatPutSparseObjectsCommits) {
    SparseStoreOptions options;
    options.pinned_quota_bytes = GetParam();
    auto os_host = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    auto os_dev = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore host(os_host, options), dev(os_dev, options);
    std::mt19937_64 rng(7);
    std::vector<std::unique_ptr<Update>> updates;
    for (int i = 0; i < 40; ++i) {
        const Shape shape = i % 7 == 3 ? Shape{5, 70000} : Shape{96, 80};
        updates.push_back(MakeUpdate(rng, "t" + std::to_string(i), shape, 1 + rng() % 400));
    }
    // Two boxes of one tensor, an object that is not hard-pinned, and a host-built object with
    // its own entries (an update the device would not take: unsorted) in the same batch.
    for (const Index row : {0, 48}) {
        updates.push_back(
            MakeUpdate(rng, "boxes", {96, 80}, 50, {0, 1}, *Box::Make({row, 0}, {48, 80})));
    }
    updates[5]->request.hard_pin = false;
    std::vector<PutSparseRequest> reqs;
    for (const auto& u : updates) reqs.push_back(u->request);
    std::vector<std::int64_t> unsorted_idx = {5, 7, 1, 2, 3, 3};
    std::vector<float> unsorted_val = {1, 2, 3};
    PutSparseRequest unsorted = reqs[0];
    unsorted.tensor_id = "unsorted";
    unsorted.indices = {DType::kInt64, {3, 2}, std::as_bytes(std::span(unsorted_idx))};
    unsorted.values = {DType::kFloat32, {3}, std::as_bytes(std::span(unsorted_val))};
    reqs.push_back(unsorted);

    std::vector<Result<CommitResult>> want = host.PutSparseObjects(reqs);

    auto [objects, pins, fill] = BatchOf(updates);
    objects.push_back(*BuildSourceObject(unsorted));
    pins.push_back(true);
    fill.of.push_back(nullptr);
    ASSERT_OK_AND_ASSIGN(std::vector<Result<CommitResult>> got,
                         dev.PutIndexedObjects(std::move(objects), pins, fill.Fn(), 2));
    EXPECT_EQ(fill.calls, 2);  // hard-pinned objects, then the one that is not
    EXPECT_EQ(fill.pinned.size(), updates.size());
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_OK(want[i].status());
        ASSERT_OK(got[i].status()) << i;
        EXPECT_EQ(got[i]->source_ref, want[i]->source_ref);
        EXPECT_EQ(got[i]->created, want[i]->created);
        EXPECT_EQ(got[i]->nnz, want[i]->nnz);
        EXPECT_EQ(got[i]->bytes, want[i]->bytes);
        EXPECT_EQ(SourceSnapshot(*os_dev, got[i]->source_ref),
                  SourceSnapshot(*os_host, want[i]->source_ref));
    }
    EXPECT_EQ(Snapshot(*os_dev), Snapshot(*os_host));  // manifest entries and heads
    EXPECT_EQ(Counted(dev), Counted(host));
    EXPECT_EQ(*dev.Manifest({0, 1}), *host.Manifest({0, 1}));

    // A retry is idempotent and fills nothing.
    std::vector<SparseObject> again;
    for (const auto& u : updates) again.push_back(IndexedObject(u->request));
    again.push_back(*BuildSourceObject(unsorted));
    const int calls = fill.calls;
    ASSERT_OK_AND_ASSIGN(std::vector<Result<CommitResult>> retry,
                         dev.PutIndexedObjects(std::move(again), pins, fill.Fn()));
    std::vector<Result<CommitResult>> host_retry = host.PutSparseObjects(reqs);
    EXPECT_EQ(fill.calls, calls);
    for (std::size_t i = 0; i < retry.size(); ++i) {
        ASSERT_OK(retry[i].status());
        EXPECT_FALSE(retry[i]->created);
        EXPECT_EQ(retry[i]->bytes, host_retry[i]->bytes);
    }
    EXPECT_EQ(Counted(dev), Counted(host));
}

INSTANTIATE_TEST_SUITE_P(PinnedQuota, IndexedCommitBatchTest,
                         ::testing::Values(std::uint64_t{0}, std::uint64_t{64} << 20));

TEST(IndexedCommitTest, AFailingObjectFailsAlone) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore store(os);
    std::mt19937_64 rng(11);
    const Shape shape{64, 48};
    auto ok = MakeUpdate(rng, "ok", shape, 30);
    auto conflict = MakeUpdate(rng, "conflict", shape, 30);
    auto malformed = MakeUpdate(rng, "malformed", shape, 30);
    // "stale" is at (1, 2) already; "conflict" has another payload under the same key.
    auto ahead0 = MakeUpdate(rng, "stale", shape, 5, {0, 1});
    auto ahead1 = MakeUpdate(rng, "stale", shape, 5, {1, 2});
    auto first = MakeUpdate(rng, "conflict", shape, 12);
    ASSERT_OK(store.PutSparseObject(ahead0->request));
    ASSERT_OK(store.PutSparseObject(ahead1->request));
    ASSERT_OK(store.PutSparseObject(first->request));
    auto stale_step = MakeUpdate(rng, "stale", shape, 30, {0, 3});  // base 0 < head's delta 2

    std::vector<SparseObject> objects;
    HostFill fill;
    for (const Update* u : {ok.get(), stale_step.get(), conflict.get(), malformed.get()}) {
        objects.push_back(IndexedObject(u->request));
        fill.of.push_back(u);
    }
    objects[3].tile_ptr.pop_back();  // its tile index no longer fits its descriptor
    ASSERT_OK_AND_ASSIGN(std::vector<Result<CommitResult>> got,
                         store.PutIndexedObjects(std::move(objects), {}, fill.Fn()));
    ASSERT_EQ(got.size(), 4u);
    ASSERT_OK(got[0].status());
    EXPECT_TRUE(got[0]->created);
    EXPECT_THAT(got[1].status(), StatusIs(StatusCode::kStaleGeneration));
    EXPECT_THAT(got[2].status(), StatusIs(StatusCode::kConflict));
    EXPECT_THAT(got[3].status(), StatusIs(StatusCode::kInvalidArgument));
    // The host path says the same of the first three.
    SparseStore twin(MakeEmbeddedStore());
    ASSERT_OK(twin.PutSparseObject(ahead0->request));
    ASSERT_OK(twin.PutSparseObject(ahead1->request));
    ASSERT_OK(twin.PutSparseObject(first->request));
    std::vector<PutSparseRequest> reqs = {ok->request, stale_step->request, conflict->request};
    std::vector<Result<CommitResult>> want = twin.PutSparseObjects(reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_EQ(got[i].status().code(), want[i].status().code()) << i;
    }
    // Nothing of the failing ones stays.
    EXPECT_THAT(*os->List("mcs/manifest/0-3/"), IsEmpty());
    EXPECT_THAT(*os->List("mcs/manifest/0-1/malformed"), IsEmpty());
    EXPECT_THAT(*os->List("mcs/head/malformed"), IsEmpty());
    ASSERT_OK_AND_ASSIGN(std::optional<Generation> head, store.CurrentGeneration("stale"));
    EXPECT_EQ(*head, (Generation{1, 2}));
    EXPECT_EQ(store.Metrics().source_objects_put, 4u);  // three before, "ok" now
}

TEST(IndexedCommitTest, AFillErrorLeavesNothingBehind) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore store(os);
    std::mt19937_64 rng(13);
    std::vector<std::unique_ptr<Update>> updates;
    for (int i = 0; i < 6; ++i) {
        updates.push_back(MakeUpdate(rng, "f" + std::to_string(i), {64, 48}, 40));
    }
    updates[4]->request.hard_pin = false;  // a second PutFilled, after the first one wrote
    const auto before = Snapshot(*os);
    for (const int failing_call : {1, 2}) {
        auto [objects, pins, fill] = BatchOf(updates);
        int calls = 0;
        EntryFill inner = fill.Fn();
        EntryFill failing = [&](std::span<const EntryTarget> targets) -> Status {
            if (++calls == failing_call) return Unavailable("the device went away");
            return inner(targets);
        };
        Result<std::vector<Result<CommitResult>>> r =
            store.PutIndexedObjects(std::move(objects), pins, failing);
        EXPECT_THAT(r.status(), StatusIs(StatusCode::kUnavailable)) << failing_call;
        EXPECT_EQ(calls, failing_call);
        EXPECT_EQ(Snapshot(*os), before);
        for (const auto& u : updates) {
            const PutSparseRequest& q = u->request;
            const std::string ref =
                SourceObjectKey(q.tensor_id, q.generation, q.placement_policy,
                                q.source_placement, *Box::Whole(q.global_shape));
            EXPECT_THAT(os->Stat(ref).status(), StatusIs(StatusCode::kNotFound)) << ref;
            EXPECT_EQ(*store.CurrentGeneration(u->request.tensor_id), std::nullopt);
        }
        EXPECT_THAT(*store.Manifest({0, 1}), IsEmpty());
        EXPECT_EQ(store.Metrics().source_objects_put, 0u);
    }
    // Then the same batch commits.
    auto [objects, pins, fill] = BatchOf(updates);
    ASSERT_OK_AND_ASSIGN(std::vector<Result<CommitResult>> got,
                         store.PutIndexedObjects(std::move(objects), pins, fill.Fn()));
    for (const auto& r : got) ASSERT_OK(r.status());
    EXPECT_EQ(store.Manifest({0, 1})->size(), updates.size());
}

TEST(IndexedCommitTest, RefusesBatchesItCannotWriteAtOnce) {
    std::mt19937_64 rng(17);
    const Shape shape{512, 512};
    auto a = MakeUpdate(rng, "a", shape, 20000);
    auto b = MakeUpdate(rng, "b", shape, 20000);
    const auto objects_of = [&](std::initializer_list<const Update*> us, HostFill& fill) {
        std::vector<SparseObject> out;
        for (const Update* u : us) {
            out.push_back(IndexedObject(u->request));
            fill.of.push_back(u);
        }
        return out;
    };
    {
        // A store that does not fill in place (PutFilled's base implementation).
        SparseStore store(std::make_shared<testing::ForwardingStore>(MakeEmbeddedStore()));
        HostFill fill;
        EXPECT_THAT(store.PutIndexedObjects(objects_of({a.get()}, fill), {}, fill.Fn()).status(),
                    StatusIs(StatusCode::kFailedPrecondition));
        EXPECT_EQ(fill.calls, 0);
    }
    {
        // Two generations of one tensor.
        SparseStore store(MakeEmbeddedStore());
        auto a2 = MakeUpdate(rng, "a", shape, 10, {1, 2});
        HostFill fill;
        EXPECT_THAT(
            store.PutIndexedObjects(objects_of({a.get(), a2.get()}, fill), {}, fill.Fn()).status(),
            StatusIs(StatusCode::kFailedPrecondition));
        EXPECT_EQ(fill.calls, 0);
        EXPECT_THAT(*store.Manifest({0, 1}), IsEmpty());
    }
    {
        // A store with room for one of the two: nothing is committed; PutSparseObjects then
        // commits what fits.
        EmbeddedStoreOptions small;
        small.capacity_bytes = 20000 * 8 + 100000;
        auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore(small));
        SparseStore store(os);
        HostFill fill;
        EXPECT_THAT(
            store.PutIndexedObjects(objects_of({a.get(), b.get()}, fill), {}, fill.Fn()).status(),
            StatusIs(StatusCode::kFailedPrecondition));
        EXPECT_EQ(fill.calls, 0);
        EXPECT_THAT(*os->List("mcs/"), IsEmpty());
        EXPECT_EQ(store.Metrics().source_objects_put, 0u);
        const std::vector<PutSparseRequest> reqs = {a->request, b->request};
        std::vector<Result<CommitResult>> r = store.PutSparseObjects(reqs);
        EXPECT_NE(r[0].ok(), r[1].ok());
    }
}

}  // namespace
}  // namespace mooncake::sparse
