// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// ReadOptions::view_in_place: targets materialized straight from a store's memory are exactly
// those materialized from copied range reads (entries, tile index, descriptor, checksums), for
// the embedded and the shared-memory store; a store that copies ignores the option; a viewed
// object that does not hold the planned rows fails the read. A planned read (ReadPlanned, the
// device read's host half) hands the same ranges and pieces to its caller: built on the host
// from them, its targets are those of the read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "executor/sparse_store.h"
#include "store/shm_store.h"
#include "../planned_host_build.h"

namespace mooncake::sparse {
namespace {

/// The embedded store, counting range reads; `in_place` says whether it offers views in place,
/// and `short_values` makes every viewed `values` member one entry short.
class ForwardingStore : public ObjectStore {
public:
    explicit ForwardingStore(bool in_place) : inner_(MakeEmbeddedStore()), in_place_(in_place) {}
    Status Put(std::string_view key, std::string_view metadata, std::span<const MemberData> members,
               const PutOptions& options) override {
        return inner_->Put(key, metadata, members, options);
    }
    Result<ObjectInfo> Stat(std::string_view key) override { return inner_->Stat(key); }
    Status ReadMember(std::string_view key, std::string_view member,
                      std::span<std::byte> dst) override {
        return inner_->ReadMember(key, member, dst);
    }
    Status ReadRanges(std::span<const RangeRead> reads) override {
        range_reads += reads.size();
        return inner_->ReadRanges(reads);
    }
    Status Remove(std::string_view key) override { return inner_->Remove(key); }
    Result<std::vector<std::string>> List(std::string_view prefix) override {
        return inner_->List(prefix);
    }
    StoreCounters Counters() const override { return inner_->Counters(); }
    Status ViewObjects(std::span<const std::string_view> keys, const ViewFn& fn,
                       PinnedHostPool* pool) override {
        ++view_calls;
        if (!short_values) return inner_->ViewObjects(keys, fn, pool);
        return inner_->ViewObjects(keys, [&](std::span<const ObjectView> views) {
            std::vector<std::vector<std::span<const std::byte>>> members;
            std::vector<ObjectView> cut;
            for (const ObjectView& v : views) {
                members.emplace_back(v.members.begin(), v.members.end());
                const MemberInfo* m = v.info->FindMember("values");
                auto& span = members.back()[static_cast<std::size_t>(m - v.info->members.data())];
                span = span.first(span.size() - m->RowBytes());
            }
            for (std::size_t i = 0; i < views.size(); ++i) {
                cut.push_back({views[i].info, members[i], views[i].pinned});
            }
            return fn(cut);
        }, pool);
    }
    bool ViewsInPlace() const override { return in_place_; }

    std::uint64_t range_reads = 0;
    int view_calls = 0;
    bool short_values = false;

private:
    std::unique_ptr<ObjectStore> inner_;
    bool in_place_;
};

PutSparseRequest Request(const std::string& id, const Shape& shape, std::uint64_t seed,
                         std::size_t nnz, std::vector<std::int64_t>& idx,
                         std::vector<float>& val) {
    std::mt19937_64 rng(seed);
    std::set<std::vector<std::int64_t>> seen;
    while (seen.size() < nnz) {
        std::vector<std::int64_t> p;
        for (Index e : shape) p.push_back(std::int64_t(rng() % std::uint64_t(e)));
        if (seen.insert(p).second) {
            idx.insert(idx.end(), p.begin(), p.end());
            val.push_back(float(seen.size()) * 0.5f);
        }
    }
    PutSparseRequest r;
    r.tensor_id = id;
    r.global_shape = shape;
    r.indices = {DType::kInt64, {Index(val.size()), Index(shape.size())},
                 std::as_bytes(std::span(idx))};
    r.values = {DType::kFloat32, {Index(val.size())}, std::as_bytes(std::span(val))};
    r.placement_policy = *PlacementPolicy::Parse("replicate(ep)");
    r.generation = {0, 1};
    return r;
}

TargetDescriptor Target(const std::string& id, const std::string& tensor, const std::string& node,
                        Shape offset, Shape local) {
    return *TargetDescriptor::Make(id, node, tensor, *NamedAxes::Make({}), offset, local);
}

/// Two tensors and targets on two nodes: halves, quarters and boxes off the tile grid (which
/// filter their boundary tiles and build their tile index from their entries).
struct Batch {
    std::vector<SourceDescriptor> manifest;
    std::vector<TargetDescriptor> targets;
};

Batch Commit(SparseStore& store) {
    std::vector<std::int64_t> idx_a, idx_b;
    std::vector<float> val_a, val_b;
    EXPECT_TRUE(store.PutSparseObject(Request("a", {512, 768}, 1, 6000, idx_a, val_a)).ok());
    EXPECT_TRUE(store.PutSparseObject(Request("b", {300, 1000}, 2, 4000, idx_b, val_b)).ok());
    Batch batch;
    batch.manifest = *store.Manifest({0, 1});
    for (const char* node : {"n0", "n1"}) {
        const std::string n = node;
        batch.targets.push_back(Target(n + "/a0", "a", n, {0, 0}, {512, 384}));
        batch.targets.push_back(Target(n + "/a1", "a", n, {0, 384}, {512, 384}));
        batch.targets.push_back(Target(n + "/a2", "a", n, {100, 37}, {201, 555}));
        batch.targets.push_back(Target(n + "/b0", "b", n, {0, 0}, {150, 1000}));
        batch.targets.push_back(Target(n + "/b1", "b", n, {150, 0}, {150, 1000}));
        batch.targets.push_back(Target(n + "/b2", "b", n, {7, 500}, {13, 499}));
    }
    return batch;
}

void ExpectSameObjects(const std::vector<TargetObject>& a, const std::vector<TargetObject>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t t = 0; t < a.size(); ++t) {
        SCOPED_TRACE(a[t].target_id);
        const SparseObject& x = a[t].object;
        const SparseObject& y = b[t].object;
        EXPECT_EQ(a[t].target_id, b[t].target_id);
        EXPECT_GT(x.desc.nnz, 0u);
        EXPECT_EQ(x.desc, y.desc);
        EXPECT_EQ(x.coordinate_space, y.coordinate_space);
        EXPECT_TRUE(std::equal(x.indices.begin(), x.indices.end(), y.indices.begin(),
                               y.indices.end()));
        EXPECT_TRUE(std::equal(x.values.begin(), x.values.end(), y.values.begin(),
                               y.values.end()));
        EXPECT_EQ(x.tile_coords, y.tile_coords);
        EXPECT_EQ(x.tile_ptr, y.tile_ptr);
        EXPECT_EQ(x.checksum_indices, y.checksum_indices);
        EXPECT_EQ(x.checksum_values, y.checksum_values);
        EXPECT_EQ(x.checksum_tile_coords, y.checksum_tile_coords);
        EXPECT_EQ(x.checksum_tile_ptr, y.checksum_tile_ptr);
    }
}

/// Reads the batch copied and then in place (caches cleared in between) and compares them.
void ExpectInPlaceMatchesCopied(SparseStore& store) {
    const Batch batch = Commit(store);
    ReadOptions copied;
    copied.num_threads = 1;
    auto expected = store.ReadSparseObjects(batch.manifest, batch.targets, copied);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    const std::uint64_t unique = store.Metrics().unique_ranges;
    const std::uint64_t bytes = store.Metrics().range_bytes_read;
    ASSERT_TRUE(store.ClearCaches().ok());
    store.ResetMetrics();
    ReadOptions in_place = copied;
    in_place.view_in_place = true;
    auto got = store.ReadSparseObjects(batch.manifest, batch.targets, in_place);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectSameObjects(*expected, *got);
    const SparseMetrics m = store.Metrics();
    EXPECT_EQ(m.unique_ranges, unique);
    EXPECT_EQ(m.range_gets, unique);  // each unique range viewed once
    EXPECT_EQ(m.range_bytes_read, bytes);
    EXPECT_EQ(m.range_cache_hits, 0u);
    EXPECT_EQ(m.single_flight_waits, 0u);
    EXPECT_EQ(m.full_gets, 0u);
    // Nothing was cached: a copied read after it reads every range again.
    store.ResetMetrics();
    auto again = store.ReadSparseObjects(batch.manifest, batch.targets, copied);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(store.Metrics().range_gets, unique);
    ExpectSameObjects(*expected, *again);
}

TEST(ViewInPlaceTest, EmbeddedStoreTargetsMatchCopiedReads) {
    SparseStore store(MakeEmbeddedStore());
    ExpectInPlaceMatchesCopied(store);
}

TEST(ViewInPlaceTest, ShmStoreTargetsMatchCopiedReads) {
    ShmStoreOptions options;
    options.segment_size = 4 << 20;
    options.num_segments = 2;
    options.prepare_in_background = false;
    options.name = "view_in_place_test";
    auto shm = ShmStore::Create(options);
    ASSERT_TRUE(shm.ok()) << shm.status().ToString();
    SparseStore store(std::shared_ptr<ObjectStore>(std::move(shm).value()));
    ExpectInPlaceMatchesCopied(store);
}

TEST(ViewInPlaceTest, TheRangesAreViewedNotCopied) {
    auto forwarding = std::make_shared<ForwardingStore>(/*in_place=*/true);
    SparseStore store(forwarding);
    const Batch batch = Commit(store);
    ReadOptions options;
    options.view_in_place = true;
    // The commit cached the sources' tile indexes: one snapshot for the whole read.
    ASSERT_TRUE(store.ReadSparseObjects(batch.manifest, batch.targets, options).ok());
    EXPECT_EQ(forwarding->view_calls, 1);
    // A reader without them (caches cleared): one view of the sources for their tile indexes
    // (a batch of a few sources), then one snapshot for the whole read.
    ASSERT_TRUE(store.ClearCaches().ok());
    forwarding->view_calls = 0;
    ASSERT_TRUE(store.ReadSparseObjects(batch.manifest, batch.targets, options).ok());
    EXPECT_EQ(forwarding->view_calls, 2);
    EXPECT_EQ(forwarding->range_reads, 0u);
}

TEST(ViewInPlaceTest, AStoreThatCopiesIgnoresTheOption) {
    auto forwarding = std::make_shared<ForwardingStore>(/*in_place=*/false);
    SparseStore store(forwarding);
    const Batch batch = Commit(store);
    ReadOptions options;
    options.view_in_place = true;
    auto objs = store.ReadSparseObjects(batch.manifest, batch.targets, options);
    ASSERT_TRUE(objs.ok()) << objs.status().ToString();
    EXPECT_EQ(forwarding->view_calls, 0);
    EXPECT_GT(forwarding->range_reads, 0u);
    EXPECT_EQ(store.Metrics().range_gets * 2, forwarding->range_reads);  // indices + values
}

TEST(ViewInPlaceTest, AViewThatDoesNotHoldThePlannedRowsFailsTheRead) {
    auto forwarding = std::make_shared<ForwardingStore>(/*in_place=*/true);
    SparseStore store(forwarding);
    const Batch batch = Commit(store);
    forwarding->short_values = true;
    ReadOptions options;
    options.view_in_place = true;
    auto objs = store.ReadSparseObjects(batch.manifest, batch.targets, options);
    EXPECT_EQ(objs.status().code(), StatusCode::kOutOfRange) << objs.status().ToString();
    EXPECT_EQ(store.Metrics().target_objects_published, 0u);
}

using testing::HostBuild;

TEST(PlannedReadTest, TargetsBuiltFromThePlannedPiecesAreTheReadsTargets) {
    SparseStore store(MakeEmbeddedStore());
    const Batch batch = Commit(store);
    ReadOptions options;
    options.num_threads = 1;
    options.view_in_place = true;
    auto expected = store.ReadSparseObjects(batch.manifest, batch.targets, options);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    const SparseMetrics read = store.Metrics();
    store.ResetMetrics();
    HostBuild build;
    auto got = store.ReadPlanned(StepManifestView({0, 1}, batch.manifest, {}), batch.targets,
                                 options, std::ref(build));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(build.calls, 1);
    ASSERT_EQ(got->size(), expected->size());
    for (std::size_t t = 0; t < got->size(); ++t) {
        const TargetObjectView& v = (*got)[t];
        const SparseObject& want = (*expected)[t].object;
        SCOPED_TRACE(v.target_id);
        EXPECT_EQ(v.target_id, (*expected)[t].target_id);
        EXPECT_EQ(v.target_box, (*expected)[t].target_box);
        EXPECT_EQ(v.coordinate_space, "local");
        EXPECT_GT(v.desc.nnz, 0u);
        EXPECT_EQ(v.desc.nnz, want.desc.nnz);
        EXPECT_EQ(v.desc.index_dtype, want.desc.index_dtype);
        EXPECT_EQ(v.desc.value_dtype, want.desc.value_dtype);
        EXPECT_EQ(v.desc.global_shape, want.desc.global_shape);
        EXPECT_EQ(v.desc.tile_shape, want.desc.tile_shape);
        EXPECT_EQ(v.desc.apply, want.desc.apply);
        EXPECT_EQ(v.desc.num_tiles, 0u);  // no tile index: the builder made none
        EXPECT_TRUE(v.indices.empty());
        // The same entries; in the same order where the target's origin lies on the sources'
        // tile grid (elsewhere the read sorts them by the target's own tiles).
        const std::size_t isz = DTypeSize(want.desc.index_dtype) * want.desc.rank();
        const std::size_t vsz = DTypeSize(want.desc.value_dtype);
        const auto entries = [&](std::span<const std::byte> idx, std::span<const std::byte> val) {
            std::vector<std::vector<std::byte>> out;
            for (std::size_t e = 0; e * isz < idx.size(); ++e) {
                std::vector<std::byte> one(idx.begin() + e * isz, idx.begin() + (e + 1) * isz);
                one.insert(one.end(), val.begin() + e * vsz, val.begin() + (e + 1) * vsz);
                out.push_back(std::move(one));
            }
            return out;
        };
        auto mine = entries(build.indices[t], build.values[t]);
        auto theirs = entries(want.indices, want.values);
        const bool on_grid = v.target_box.origin()[0] % want.desc.tile_shape[0] == 0 &&
                             v.target_box.origin()[1] % want.desc.tile_shape[1] == 0;
        if (on_grid) {
            EXPECT_EQ(mine, theirs);
        }
        std::sort(mine.begin(), mine.end());
        std::sort(theirs.begin(), theirs.end());
        EXPECT_EQ(mine, theirs);
    }
    // The same ranges, each viewed once, counted as the in-place read counts them.
    const SparseMetrics m = store.Metrics();
    EXPECT_EQ(m.range_gets, read.range_gets);
    EXPECT_EQ(m.range_bytes_read, read.range_bytes_read);
    EXPECT_EQ(m.fanout_bytes, read.fanout_bytes);
    EXPECT_EQ(m.target_objects_published, batch.targets.size());
    EXPECT_EQ(m.full_gets, 0u);
}

TEST(PlannedReadTest, SourcesInAPinnedPoolCommitAndReadAsAnyOthers) {
    // Source objects placed by a pinned pool (pageable here without CUDA, page-locked with it):
    // single and batch commits, copied and in-place reads, planned reads, all the same.
    SparseStoreOptions pinned;
    pinned.pinned_quota_bytes = std::uint64_t{64} << 20;
    SparseStore store(MakeEmbeddedStore(), pinned);
    SparseStore plain(MakeEmbeddedStore());
    const Batch batch = Commit(store);
    Commit(plain);
    std::vector<std::int64_t> idx;
    std::vector<float> val;
    PutSparseRequest more = Request("c", {64, 4096}, 9, 500, idx, val);
    auto put = store.PutSparseObjects({&more, 1});
    ASSERT_TRUE(put.front().ok()) << put.front().status().ToString();
    ASSERT_TRUE(plain.PutSparseObjects({&more, 1}).front().ok());
    std::vector<TargetDescriptor> targets = batch.targets;
    targets.push_back(Target("n0/c", "c", "n0", {0, 1000}, {64, 2000}));
    ReadOptions options;
    options.num_threads = 1;
    auto want = plain.ReadSparseObjects(*plain.Manifest({0, 1}), targets, options);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    auto got = store.ReadSparseObjects(*store.Manifest({0, 1}), targets, options);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectSameObjects(*want, *got);
    options.view_in_place = true;
    auto viewed = store.ReadSparseObjects(*store.Manifest({0, 1}), targets, options);
    ASSERT_TRUE(viewed.ok()) << viewed.status().ToString();
    ExpectSameObjects(*want, *viewed);
    HostBuild build;
    auto planned = store.ReadPlanned(StepManifestView({0, 1}, *store.Manifest({0, 1}), {}),
                                     targets, options, std::ref(build));
    ASSERT_TRUE(planned.ok()) << planned.status().ToString();
    for (std::size_t t = 0; t < targets.size(); ++t) {
        EXPECT_EQ((*planned)[t].desc.nnz, (*want)[t].object.desc.nnz) << targets[t].target_id;
    }
}

TEST(PlannedReadTest, UnchangedTensorsGetEmptyTargetsAndFoldsAreNotPlanned) {
    SparseStore store(MakeEmbeddedStore());
    Batch batch = Commit(store);
    const std::vector<std::string> ids = {"a", "b", "c"};
    ASSERT_TRUE(store.SealGeneration({0, 1}, ids).ok());
    batch.targets.push_back(Target("n0/c", "c", "n0", {0, 0}, {64, 64}));
    auto step = store.GetManifest({0, 1});
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    HostBuild build;
    auto got = store.ReadPlanned(*step, batch.targets, {}, std::ref(build));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const TargetObjectView& c = got->back();
    EXPECT_EQ(c.desc.nnz, 0u);
    EXPECT_EQ(c.desc.tensor_id, "c");
    EXPECT_EQ(c.desc.global_shape, (Shape{64, 64}));
    EXPECT_TRUE(build.indices.back().empty());

    // A second step makes (0, 2) a fold, which the planned read leaves to ReadViews.
    std::vector<std::int64_t> idx;
    std::vector<float> val;
    PutSparseRequest next = Request("a", {512, 768}, 3, 100, idx, val);
    next.generation = {1, 2};
    ASSERT_TRUE(store.PutSparseObject(next).ok());
    ASSERT_TRUE(store.SealGeneration({1, 2}, ids).ok());
    auto fold = store.GetManifest({0, 2});
    ASSERT_TRUE(fold.ok()) << fold.status().ToString();
    build.calls = 0;
    auto folded = store.ReadPlanned(*fold, batch.targets, {}, std::ref(build));
    EXPECT_EQ(folded.status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(build.calls, 0);
}

TEST(PlannedReadTest, TheBuildersErrorIsTheReadsAndAStoreThatCopiesPlansNothing) {
    SparseStore store(MakeEmbeddedStore());
    const Batch batch = Commit(store);
    auto failed = store.ReadPlanned(StepManifestView({0, 1}, batch.manifest, {}), batch.targets,
                                    {}, [](PlannedRead&) { return ResourceExhausted("no room"); });
    EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(store.Metrics().target_objects_published, 0u);
    // A builder that claims more entries than a target's pieces hold is an internal error.
    auto lying = store.ReadPlanned(StepManifestView({0, 1}, batch.manifest, {}), batch.targets,
                                   {}, [](PlannedRead& r) {
                                       r.kept.assign(r.targets.size(), ~std::uint64_t{0});
                                       return Status::Ok();
                                   });
    EXPECT_EQ(lying.status().code(), StatusCode::kInternal);

    auto forwarding = std::make_shared<ForwardingStore>(/*in_place=*/false);
    SparseStore copying(forwarding);
    const Batch other = Commit(copying);
    HostBuild build;
    auto none = copying.ReadPlanned(StepManifestView({0, 1}, other.manifest, {}), other.targets,
                                    {}, std::ref(build));
    EXPECT_EQ(none.status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(build.calls, 0);
}

}  // namespace
}  // namespace mooncake::sparse
