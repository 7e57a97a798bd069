// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// PlanBatch and Plan (batch_plan.h): batch planning with per-node dedup, the §4 acceptance
// case, the plan's layout, its inputs, and planning budgets.

#include "mooncake/sparse/batch_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::Axes;
using ::mooncake::sparse::testing::BruteForceScan;
using ::mooncake::sparse::testing::BuildSource;
using ::mooncake::sparse::testing::BuiltSource;
using ::mooncake::sparse::testing::DenseCoords;
using ::mooncake::sparse::testing::ExpectSamePlan;
using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::LookupOf;
using ::mooncake::sparse::testing::MakeBox;
using ::mooncake::sparse::testing::MakeTarget;
using ::mooncake::sparse::testing::ManifestOf;
using ::mooncake::sparse::testing::PlannedRegion;
using ::mooncake::sparse::testing::Policy;
using ::mooncake::sparse::testing::R;
using ::mooncake::sparse::testing::RandomCoords;
using ::mooncake::sparse::testing::RegionsOf;
using ::mooncake::sparse::testing::SelectEntries;
using ::mooncake::sparse::testing::SourceSpec;
using ::mooncake::sparse::testing::Spec2D;
using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::ValueOrDie;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

// ---- batch planning ----------------------------------------------------------------------------

/// EP x TP targets of one 2-D tensor: TP splits dim 0 in equal parts, every EP replica takes
/// the same TP boxes. Target ids "<node>/rank<i>".
std::vector<TargetDescriptor> EpTpTargets(const std::string& tensor, const Shape& shape, int ep,
                                          int tp, const std::vector<std::string>& node_of_ep) {
    std::vector<TargetDescriptor> out;
    const Index rows = shape[0] / tp;
    int rank = 0;
    for (int e = 0; e < ep; ++e) {
        for (int t = 0; t < tp; ++t, ++rank) {
            const std::string& node = node_of_ep[static_cast<std::size_t>(e)];
            out.push_back(MakeTarget(node + "/rank" + std::to_string(rank), node, tensor,
                                     Axes({{"ep", e}, {"tp", t}}), {rows * t, 0},
                                     {rows, shape[1]}));
        }
    }
    return out;
}

class PlannerTest : public ::testing::Test {
protected:
    void SetUp() override {
        SourceSpec spec = Spec2D("sparse/layers.0.mlp.down_proj.weight/0-1",
                                 "layers.0.mlp.down_proj.weight", kShape, {128, 128});
        spec.placement = Axes({{"ep", 0}});
        spec.policy = Policy("replicate(ep)");
        std::mt19937_64 rng(2048);
        sources_.push_back(ValueOrDie(
            BuildSource(spec, RandomCoords(rng, MakeBox({0, 0}, kShape), 20000))));
        manifest_ = ManifestOf(sources_);
    }
    const Shape kShape{2048, 7168};
    std::vector<BuiltSource> sources_;
    std::vector<SourceDescriptor> manifest_;
};

TEST_F(PlannerTest, NonEpEp2Tp2OneNode) {
    // §4 acceptance: a non-EP weight read by EP2 x TP2 on one node: one source, two unique
    // ranges (one per TP half, shared by both EP replicas), no whole-object read.
    const auto targets = EpTpTargets(manifest_[0].tensor_id, kShape, 2, 2, {"node0", "node0"});
    ASSERT_EQ(targets[3].target_id, "node0/rank3");
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest_, targets, LookupOf(sources_)));

    EXPECT_EQ(plan.stats.sources_matched, 1u);
    EXPECT_THAT(plan.nodes, ElementsAre("node0"));
    ASSERT_THAT(plan.reads, SizeIs(2));
    EXPECT_EQ(plan.stats.unique_ranges, 2u);
    ASSERT_THAT(plan.read_groups, SizeIs(1));
    EXPECT_EQ(plan.read_groups[0].source_index, 0u);
    EXPECT_EQ(plan.read_groups[0].node, 0u);
    EXPECT_EQ(plan.read_groups[0].begin, 0u);
    EXPECT_EQ(plan.read_groups[0].end, 2u);
    const std::uint64_t nnz = sources_[0].nnz();
    const std::vector<std::uint32_t> consumers = plan.ReadConsumers();
    int full_reads = 0;
    for (std::size_t i = 0; i < plan.reads.size(); ++i) {
        const UniqueRead& r = plan.reads[i];
        if (r.start == 0 && r.end == nnz) ++full_reads;
        EXPECT_EQ(consumers[i], 2u);  // both EP replicas of one TP box
        EXPECT_EQ(plan.group_of_read(i).source_index, 0u);
        EXPECT_EQ(plan.group_of_read(i).node, 0u);
    }
    EXPECT_EQ(full_reads, 0);
    EXPECT_EQ(plan.stats.query.whole_source, 0u);
    // The two TP halves split the entries exactly: no entry read twice, none missing.
    EXPECT_EQ(plan.reads[0].start, 0u);
    EXPECT_EQ(plan.reads[0].end, plan.reads[1].start);
    EXPECT_EQ(plan.reads[1].end, nnz);
    EXPECT_EQ(plan.stats.planned_entries, nnz);
    EXPECT_EQ(plan.stats.requested_entries, 2 * nnz);
    EXPECT_EQ(plan.stats.planned_bytes, nnz * 6);  // uint16 x 2 + bf16

    // Each target: one unflagged region (TP boundary 1024 is tile aligned) served by its read.
    ASSERT_EQ(plan.num_targets(), 4u);
    for (std::size_t t = 0; t < 4; ++t) {
        const auto regions = RegionsOf(plan, t, manifest_, targets);
        ASSERT_THAT(regions, SizeIs(1)) << t;
        const Region& r = regions[0].region;
        const RegionInfo& info = regions[0].info;
        EXPECT_EQ(info.target_index, t);
        EXPECT_EQ(info.target_id, targets[t].target_id);
        EXPECT_EQ(info.source_index, 0u);
        EXPECT_EQ(info.source_ref, manifest_[0].source_ref);
        EXPECT_FALSE(r.exact_coordinate_filter());
        EXPECT_EQ(r.read_index(), t % 2);
        EXPECT_EQ(info.read_index, t % 2);
        EXPECT_EQ(info.overlap, targets[t].box);
        EXPECT_EQ(info.generation, manifest_[0].generation);
        EXPECT_EQ(info.apply, manifest_[0].apply);
        EXPECT_EQ(info.range, r.range());
        EXPECT_EQ(r.start, plan.reads[r.read_index()].start);
        EXPECT_EQ(r.end(), plan.reads[r.read_index()].end);
        std::vector<EntryRange> ranges = {r.range()};
        EXPECT_EQ(SelectEntries(sources_[0], ranges, targets[t].box),
                  BruteForceScan(sources_[0], targets[t].box));
    }
}

TEST_F(PlannerTest, ReadCoalesceGapZeroMergesAdjacentTpRanges) {
    const auto targets = EpTpTargets(manifest_[0].tensor_id, kShape, 2, 2, {"node0", "node0"});
    PlanOptions options;
    options.read_coalesce_gap = 0;
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest_, targets, LookupOf(sources_), options));
    ASSERT_THAT(plan.reads, SizeIs(1));
    EXPECT_EQ(plan.reads[0].start, 0u);
    EXPECT_EQ(plan.reads[0].end, sources_[0].nnz());
    EXPECT_THAT(plan.ReadConsumers(), ElementsAre(4u));
    for (const Region& r : plan.regions) EXPECT_EQ(r.read_index(), 0u);
    EXPECT_THAT(plan.regions, SizeIs(4));
    // Regions keep their own narrower ranges; only the physical read grows.
    EXPECT_EQ(plan.CollectRegions(0)[0].start, 0u);
    EXPECT_LT(plan.CollectRegions(0)[0].end(), sources_[0].nnz());
}

TEST_F(PlannerTest, EpReplicasOnDifferentNodesReadSeparately) {
    const auto targets = EpTpTargets(manifest_[0].tensor_id, kShape, 2, 2, {"node0", "node1"});
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest_, targets, LookupOf(sources_)));
    EXPECT_THAT(plan.nodes, ElementsAre("node0", "node1"));
    ASSERT_THAT(plan.reads, SizeIs(4));  // each node reads each TP half once
    EXPECT_THAT(plan.ReadConsumers(), ElementsAre(1u, 1u, 1u, 1u));
    EXPECT_EQ(plan.group_of_read(0).node, 0u);
    EXPECT_EQ(plan.group_of_read(1).node, 0u);
    EXPECT_EQ(plan.group_of_read(2).node, 1u);
    EXPECT_EQ(plan.group_of_read(3).node, 1u);
    ASSERT_THAT(plan.read_groups, SizeIs(2));
    EXPECT_EQ(plan.stats.planned_entries, 2 * sources_[0].nnz());
    for (std::size_t t = 0; t < targets.size(); ++t) {
        const Region r = plan.CollectRegions(t)[0];
        EXPECT_EQ(plan.nodes[plan.group_of_read(r.read_index()).node], targets[t].node_id);
    }
}

TEST_F(PlannerTest, EpOnlyTargetReadsWholeObject) {
    // EP-only: the target box is the complete tensor: one range [0, nnz), no filter, O(1).
    std::vector<TargetDescriptor> targets = {
        MakeTarget("node0/rank0", "node0", manifest_[0].tensor_id, Axes({{"ep", 0}}), {0, 0},
                   kShape),
        MakeTarget("node0/rank1", "node0", manifest_[0].tensor_id, Axes({{"ep", 1}}), {0, 0},
                   kShape)};
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest_, targets, LookupOf(sources_)));
    EXPECT_EQ(plan.stats.query.whole_source, 2u);
    ASSERT_THAT(plan.reads, SizeIs(1));
    EXPECT_EQ(plan.reads[0].start, 0u);
    EXPECT_EQ(plan.reads[0].end, sources_[0].nnz());
    EXPECT_THAT(plan.ReadConsumers(), ElementsAre(2u));
    for (std::size_t t = 0; t < plan.num_targets(); ++t) {
        const auto regions = plan.CollectRegions(t);
        ASSERT_THAT(regions, SizeIs(1));
        EXPECT_EQ(regions[0].range(), R(0, sources_[0].nnz()));
        EXPECT_FALSE(regions[0].exact_coordinate_filter());
    }
}

TEST_F(PlannerTest, UnalignedTpBoxesAreFilteredAndRebased) {
    // TP3 over 2048 rows does not align with 128-row tiles: boundary ranges carry the filter,
    // and filtering + rebasing yields exactly the target's local entries.
    std::vector<TargetDescriptor> targets;
    const Index cuts[] = {0, 700, 1400, 2048};
    for (int t = 0; t < 3; ++t) {
        targets.push_back(MakeTarget("node0/rank" + std::to_string(t), "node0",
                                     manifest_[0].tensor_id, Axes({{"tp", t}}), {cuts[t], 0},
                                     {cuts[t + 1] - cuts[t], kShape[1]}));
    }
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest_, targets, LookupOf(sources_)));
    // Reads are disjoint on the node: the shared boundary tiles are read once.
    for (std::size_t i = 1; i < plan.reads.size(); ++i) {
        EXPECT_GE(plan.reads[i].start, plan.reads[i - 1].end);
    }
    for (std::size_t t = 0; t < targets.size(); ++t) {
        const TargetDescriptor& tgt = targets[t];
        bool any_flag = false;
        std::vector<std::vector<Index>> local;
        for (const PlannedRegion& pr : RegionsOf(plan, t, manifest_, targets)) {
            const Region& r = pr.region;
            any_flag |= r.exact_coordinate_filter();
            const UniqueRead& read = plan.reads[r.read_index()];
            EXPECT_LE(read.start, r.start);
            EXPECT_GE(read.end, r.end());
            for (std::uint64_t i = r.start; i < r.end(); ++i) {
                std::vector<Index> p(sources_[0].entry(i).begin(), sources_[0].entry(i).end());
                if (r.exact_coordinate_filter() &&
                    !ContainsPoint(pr.info.overlap, std::span<const Index>(p))) {
                    continue;
                }
                RebaseInPlace(std::span<Index>(p), tgt.box.origin());
                local.push_back(p);
            }
        }
        EXPECT_TRUE(any_flag) << tgt.target_id;
        std::vector<std::vector<Index>> expected;
        for (std::uint64_t i : BruteForceScan(sources_[0], tgt.box)) {
            std::vector<Index> p(sources_[0].entry(i).begin(), sources_[0].entry(i).end());
            p[0] -= tgt.box.begin(0);
            expected.push_back(p);
        }
        std::sort(local.begin(), local.end());
        std::sort(expected.begin(), expected.end());
        EXPECT_EQ(local, expected) << tgt.target_id;
        const Box local_box =
            MakeBox(Shape{0, 0}, Shape(tgt.box.shape().begin(), tgt.box.shape().end()));
        for (const auto& p : local) {
            EXPECT_TRUE(ContainsPoint(local_box, std::span<const Index>(p)));
        }
    }
}

TEST(PlanBatchTest, FusedExpertsEp2Tp2) {
    // A fused [experts, out, in] tensor: EP is a box on the expert dim, TP a box on out.
    std::mt19937_64 rng(8);
    SourceSpec spec;
    spec.source_ref = "sparse/experts.w1";
    spec.tensor_id = "layers.3.mlp.experts.w1";
    spec.global_shape = {8, 64, 32};
    spec.tile_shape = {1, 16, 16};
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(spec, RandomCoords(rng, MakeBox({0, 0, 0}, {8, 64, 32}), 3000)))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets;
    for (int ep = 0; ep < 2; ++ep) {
        for (int tp = 0; tp < 2; ++tp) {
            targets.push_back(MakeTarget("node0/rank" + std::to_string(2 * ep + tp), "node0",
                                         spec.tensor_id, Axes({{"ep", ep}, {"tp", tp}}),
                                         {4 * ep, 32 * tp, 0}, {4, 32, 32}));
        }
    }
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest, targets, LookupOf(sources)));
    EXPECT_EQ(plan.stats.query.nd_path, 4u);
    // Every (expert, TP half) is one contiguous unflagged range: 8 experts x 2 halves, each a
    // separate read since every target reads different entries.
    EXPECT_THAT(plan.reads, SizeIs(16));
    EXPECT_EQ(plan.stats.planned_entries, sources[0].nnz());
    for (std::size_t t = 0; t < targets.size(); ++t) {
        std::vector<EntryRange> ranges;
        for (const Region& r : plan.CollectRegions(t)) {
            EXPECT_FALSE(r.exact_coordinate_filter());
            ranges.push_back(r.range());
        }
        EXPECT_THAT(ranges, SizeIs(4));
        EXPECT_EQ(SelectEntries(sources[0], ranges, targets[t].box),
                  BruteForceScan(sources[0], targets[t].box));
    }
}

TEST(PlanBatchTest, OwnerExpertTargetsReadOnlyTheirExpert) {
    // Per-expert objects under owner(expert); inference EP2 hosts experts 0-3 and 4-7, TP2.
    std::mt19937_64 rng(4);
    std::vector<BuiltSource> sources;
    for (int expert = 0; expert < 8; ++expert) {
        const std::string tensor = "layers.1.mlp.experts." + std::to_string(expert) + ".w2";
        SourceSpec spec = Spec2D("src/" + tensor, tensor, {128, 64}, {32, 32});
        spec.placement = Axes({{"expert", expert}, {"ep", expert % 4}});  // training EP 4
        spec.policy = Policy("owner(expert)");
        sources.push_back(
            ValueOrDie(BuildSource(spec, RandomCoords(rng, MakeBox({0, 0}, {128, 64}), 100))));
    }
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets;
    for (int ep = 0; ep < 2; ++ep) {
        for (int tp = 0; tp < 2; ++tp) {
            for (int expert = 4 * ep; expert < 4 * ep + 4; ++expert) {
                targets.push_back(MakeTarget(
                    "node0/rank" + std::to_string(2 * ep + tp), "node0",
                    "layers.1.mlp.experts." + std::to_string(expert) + ".w2",
                    Axes({{"expert", expert}, {"ep", ep}, {"tp", tp}}), {64 * tp, 0}, {64, 64}));
            }
        }
    }
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest, targets, LookupOf(sources)));
    EXPECT_EQ(plan.stats.sources_matched, 8u);
    for (std::size_t t = 0; t < targets.size(); ++t) {
        const std::int64_t expert = *targets[t].placement.Get("expert");
        const auto regions = RegionsOf(plan, t, manifest, targets);
        EXPECT_THAT(regions, Not(IsEmpty()));
        for (const PlannedRegion& r : regions) {
            EXPECT_EQ(r.info.source_index, static_cast<std::size_t>(expert));
        }
    }
    // Each expert's two TP halves are two reads with one consumer each.
    EXPECT_EQ(plan.stats.planned_entries, 8u * 100u);
    for (std::uint32_t c : plan.ReadConsumers()) EXPECT_EQ(c, 1u);
}

TEST(PlanBatchTest, OverlappingRequestsOnOneNodeAreUnited) {
    // Two targets on one node whose boxes overlap: their ranges overlap, and the node reads the
    // union once. On different nodes each reads its own.
    SourceSpec spec = Spec2D("s", "w", {64, 64}, {8, 8});
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {64, 64}))))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> same_node = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 0}, {16, 64}),
        MakeTarget("b", "n0", "w", NamedAxes(), {8, 0}, {16, 64})};
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest, same_node, LookupOf(sources)));
    ASSERT_THAT(plan.reads, SizeIs(1));
    EXPECT_EQ(plan.reads[0].start, 0u);
    EXPECT_EQ(plan.reads[0].end, 64u * 8 * 3);
    EXPECT_THAT(plan.ReadConsumers(), ElementsAre(2u));
    EXPECT_EQ(plan.stats.requested_entries, 2u * 64 * 16);
    EXPECT_EQ(plan.stats.planned_entries, 64u * 24);

    std::vector<TargetDescriptor> two_nodes = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 0}, {16, 64}),
        MakeTarget("b", "n1", "w", NamedAxes(), {8, 0}, {16, 64})};
    ASSERT_OK_AND_ASSIGN(BatchPlan plan2, Plan(manifest, two_nodes, LookupOf(sources)));
    ASSERT_THAT(plan2.reads, SizeIs(2));
    EXPECT_EQ(plan2.stats.planned_entries, 2u * 64 * 16);
}

TEST(PlanBatchTest, ReadCoalesceGapMergesNearbyRanges) {
    SourceSpec spec = Spec2D("s", "w", {64, 64}, {8, 8});
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {64, 64}))))};
    const auto manifest = ManifestOf(sources);
    // Tile rows 0 and 2: a gap of one tile row (512 entries) between the two reads.
    std::vector<TargetDescriptor> targets = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 0}, {8, 64}),
        MakeTarget("b", "n0", "w", NamedAxes(), {16, 0}, {8, 64})};
    for (auto [gap, reads] : std::vector<std::pair<std::int64_t, std::size_t>>{
             {-1, 2}, {0, 2}, {511, 2}, {512, 1}, {100000, 1}}) {
        PlanOptions options;
        options.read_coalesce_gap = gap;
        ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest, targets, LookupOf(sources), options));
        EXPECT_THAT(plan.reads, SizeIs(reads)) << "gap " << gap;
        EXPECT_EQ(plan.stats.unique_ranges, reads);
        for (std::size_t t = 0; t < 2; ++t) {
            const Region r = plan.CollectRegions(t)[0];
            EXPECT_LE(plan.reads[r.read_index()].start, r.start);
            EXPECT_GE(plan.reads[r.read_index()].end, r.end());
        }
    }
}

TEST(PlanBatchTest, RecycledPlanIsWrittenIntoTheOldStorage) {
    // A planning loop hands the last step's index and plan back: the next plan is the same
    // as a fresh one and lands in the same arrays (no new pages), and what was recycled is
    // left empty.
    SourceSpec spec = Spec2D("s", "w", {64, 64}, {8, 8});
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {64, 64}))))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 0}, {64, 32}),
        MakeTarget("b", "n0", "w", NamedAxes(), {0, 32}, {64, 32})};
    ASSERT_OK_AND_ASSIGN(BatchPlan fresh, Plan(manifest, targets, LookupOf(sources)));
    ASSERT_EQ(fresh.regions.size(), 16u);  // one per tile row per column half

    ASSERT_OK_AND_ASSIGN(ManifestIndex index, ManifestIndex::Make(manifest));
    ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, index, targets));
    ASSERT_OK_AND_ASSIGN(BatchPlan last,
                         PlanBatch(manifest, targets, std::move(sel), LookupOf(sources)));
    const Region* regions = last.regions.data();
    const UniqueRead* reads = last.reads.data();
    const SourceMatch* matches = last.selection.matches.data();

    ASSERT_OK_AND_ASSIGN(ManifestIndex next_index, ManifestIndex::Make(manifest, &index));
    EXPECT_EQ(index.size(), 0u);
    ASSERT_OK_AND_ASSIGN(SourceSelection next_sel,
                         SelectSources(manifest, next_index, targets, &last.selection));
    EXPECT_EQ(next_sel.matches.data(), matches);
    EXPECT_TRUE(last.selection.matches.empty());
    ASSERT_OK_AND_ASSIGN(BatchPlan next, PlanBatch(manifest, targets, std::move(next_sel),
                                                   LookupOf(sources), {}, &last));
    ExpectSamePlan(next, fresh);
    EXPECT_EQ(next.regions.data(), regions);
    EXPECT_EQ(next.reads.data(), reads);
    EXPECT_EQ(next.selection.matches.data(), matches);
    EXPECT_TRUE(last.regions.empty() && last.reads.empty() && last.read_groups.empty() &&
                last.nodes.empty() && last.stats.regions == 0);

    // A smaller batch into the bigger storage: only its own regions.
    targets.resize(1);
    ASSERT_OK_AND_ASSIGN(SourceSelection one, SelectSources(manifest, next_index, targets));
    ASSERT_OK_AND_ASSIGN(BatchPlan smaller, PlanBatch(manifest, targets, std::move(one),
                                                      LookupOf(sources), {}, &next));
    ASSERT_OK_AND_ASSIGN(BatchPlan smaller_fresh, Plan(manifest, targets, LookupOf(sources)));
    ExpectSamePlan(smaller, smaller_fresh);
    EXPECT_EQ(smaller.regions.data(), regions);
}

TEST(PlanBatchTest, RegionsCarrySourceMetadata) {
    SourceSpec spec = Spec2D("s", "w", {16, 16}, {4, 4});
    spec.generation = {7, 9};
    spec.apply = ApplyMode::kScatterAdd;
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {16, 16}))))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("a", "n0", "w", NamedAxes(), {2, 2}, {9, 5})};
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest, targets, LookupOf(sources)));
    const auto regions = RegionsOf(plan, 0, manifest, targets);
    ASSERT_THAT(regions, Not(IsEmpty()));
    std::uint64_t prev_start = 0;
    for (const PlannedRegion& r : regions) {
        EXPECT_EQ(r.info.generation, (Generation{7, 9}));
        EXPECT_EQ(r.info.apply, ApplyMode::kScatterAdd);
        EXPECT_EQ(r.info.overlap, MakeBox({2, 2}, {9, 5}));
        EXPECT_EQ(r.info.source_ref, "s");
        EXPECT_EQ(r.info.target_id, "a");
        EXPECT_GE(r.region.start, prev_start);  // sorted by (source, start)
        prev_start = r.region.start;
    }
    EXPECT_EQ(plan.stats.regions, regions.size());
}

TEST(PlanBatchTest, MissingTileIndexIsNotFound) {
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(Spec2D("s", "w", {8, 8}, {4, 4}), {1, 1}))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 0}, {4, 4})};
    const std::vector<const TileIndex*> none(manifest.size(), nullptr);
    EXPECT_THAT(Plan(manifest, targets, none), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(Plan(manifest, targets, TileIndexLookup{}), StatusIs(StatusCode::kNotFound));
}

TEST(PlanBatchTest, MismatchedTileIndexIsInvalid) {
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(Spec2D("s", "w", {8, 8}, {4, 4}), {1, 1})),
        ValueOrDie(BuildSource(Spec2D("t", "v", {8, 8}, {4, 4}), {1, 1, 5, 5}))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 0}, {4, 4})};
    // The lookup hands back the other source's index (nnz 2 instead of 1).
    const std::vector<const TileIndex*> wrong = {sources[1].index.get(), sources[1].index.get()};
    EXPECT_THAT(Plan(manifest, targets, wrong), StatusIs(StatusCode::kInvalidArgument));
}

TEST(PlanBatchTest, SelectionForOtherTargetsIsInvalid) {
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(Spec2D("s", "w", {8, 8}, {4, 4}), {1, 1}))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 0}, {4, 4})};
    SourceSelection empty;
    EXPECT_THAT(PlanBatch(manifest, targets, empty, LookupOf(sources)),
                StatusIs(StatusCode::kInvalidArgument));
}

TEST(PlanBatchTest, PlanningLimitsFailClosed) {
    SourceSpec spec = Spec2D("s", "w", {64, 64}, {8, 8});
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {64, 64}))))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 8}, {40, 8}),
        MakeTarget("b", "n0", "w", NamedAxes(), {0, 24}, {40, 8})};
    {
        PlanOptions options;
        options.limits.max_regions = 7;  // each target needs 5
        EXPECT_THAT(Plan(manifest, targets, LookupOf(sources), options),
                    StatusIs(StatusCode::kResourceExhausted));
        options.limits.max_regions = 10;
        EXPECT_THAT(Plan(manifest, targets, LookupOf(sources), options), IsOk());
    }
    {
        PlanOptions options;
        options.limits.max_tiles_per_query = 1;
        EXPECT_THAT(Plan(manifest, targets, LookupOf(sources), options),
                    StatusIs(StatusCode::kResourceExhausted));
    }
    {
        PlanOptions options;
        options.limits.max_groups_per_query = 0;
        EXPECT_THAT(Plan(manifest, targets, LookupOf(sources), options),
                    StatusIs(StatusCode::kResourceExhausted));
    }
}

// ---- plan layout and inputs ----------------------------------------------------------------------

TEST(PlanBatchTest, RegionsAreGroupedBySourceWithOneSpanPerMatch) {
    // Two tensors, each read by two TP targets; targets listed tensor-major, so target order
    // and source order differ. Every match owns one contiguous, sorted span, and every region
    // lies in its read.
    std::mt19937_64 rng(3);
    std::vector<BuiltSource> sources;
    for (const char* name : {"a", "b"}) {
        sources.push_back(ValueOrDie(BuildSource(Spec2D(name, name, {64, 64}, {8, 8}),
                                                 RandomCoords(rng, MakeBox({0, 0}, {64, 64}), 900))));
    }
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("r0", "n0", "b", NamedAxes(), {0, 0}, {64, 32}),
        MakeTarget("r0", "n0", "a", NamedAxes(), {0, 0}, {64, 32}),
        MakeTarget("r1", "n0", "b", NamedAxes(), {0, 32}, {64, 32}),
        MakeTarget("r1", "n0", "a", NamedAxes(), {0, 32}, {64, 32})};
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest, targets, LookupOf(sources)));
    ASSERT_EQ(plan.match_regions.size(), 4u);
    std::uint32_t next = 0;
    for (std::uint32_t m : {1u, 3u, 0u, 2u}) {  // source a's matches, then source b's
        EXPECT_EQ(plan.match_regions[m].begin, next) << m;
        next = plan.match_regions[m].end;
    }
    EXPECT_EQ(next, plan.regions.size());
    for (std::size_t m = 0; m < 4; ++m) {
        const auto span = plan.regions_of_match(m);
        EXPECT_EQ(span.size(), 8u);  // one range per tile row of a column half
        const SourceMatch& match = plan.matches()[m];
        for (std::size_t k = 0; k < span.size(); ++k) {
            if (k > 0) {
                EXPECT_GT(span[k].start, span[k - 1].end());
            }
            const UniqueRead& read = plan.reads[span[k].read_index()];
            EXPECT_LE(read.start, span[k].start);
            EXPECT_GE(read.end, span[k].end());
            EXPECT_EQ(plan.group_of_read(span[k].read_index()).source_index, match.source_index);
        }
    }
    ASSERT_THAT(plan.read_groups, SizeIs(2));
    EXPECT_EQ(plan.read_groups[0].source_index, 0u);
    EXPECT_EQ(plan.read_groups[1].source_index, 1u);
    EXPECT_EQ(plan.read_groups[0].end, plan.read_groups[1].begin);
    EXPECT_EQ(plan.read_groups[1].end, plan.reads.size());
}

TEST(PlanBatchTest, RangesLongerThanARegionAreSplit) {
    // A source of 6e9 entries in two tiles (only its tile index exists): the whole-source range
    // is longer than one region holds, so it becomes consecutive regions; reads follow the
    // coalescing rule as for any adjacent requests.
    SourceDescriptor d;
    d.source_ref = "huge";
    d.tensor_id = "huge";
    d.global_shape = {1 << 20};
    d.box = MakeBox({0}, {1 << 20});
    d.generation = {0, 1};
    d.tile_shape = {1 << 19};
    d.nnz = 6'000'000'000;
    d.num_tiles = 2;
    d.index_dtype = DType::kUInt32;
    d = ValueOrDie(SourceDescriptor::Make(d));
    const TileIndex index =
        ValueOrDie(TileIndex::Make(d, {0, 1}, {0, 3'000'000'000, 6'000'000'000}));
    const std::vector<SourceDescriptor> manifest = {d};
    const std::vector<const TileIndex*> lookup = {&index};
    const std::vector<TargetDescriptor> targets = {
        MakeTarget("t", "n", "huge", NamedAxes(), {0}, {1 << 20})};
    for (std::int64_t gap : {-1, 0}) {
        PlanOptions options;
        options.read_coalesce_gap = gap;
        ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(manifest, targets, lookup, options));
        EXPECT_EQ(plan.stats.requested_entries, 6'000'000'000u);
        EXPECT_EQ(plan.stats.planned_entries, 6'000'000'000u);
        ASSERT_THAT(plan.regions, SizeIs(2));
        EXPECT_EQ(plan.regions[0].start, 0u);
        EXPECT_EQ(plan.regions[0].size(), Region::kMaxLength);
        EXPECT_EQ(plan.regions[1].start, Region::kMaxLength);
        EXPECT_EQ(plan.regions[1].end(), 6'000'000'000u);
        EXPECT_THAT(plan.reads, SizeIs(gap < 0 ? 2u : 1u));
        EXPECT_EQ(plan.reads.front().start, 0u);
        EXPECT_EQ(plan.reads.back().end, 6'000'000'000u);
    }
}

TEST(PlanBatchTest, InconsistentSelectionIsInvalid) {
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(Spec2D("s", "w", {8, 8}, {4, 4}), {1, 1, 6, 6}))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("a", "n0", "w", NamedAxes(), {0, 0}, {4, 4}),
        MakeTarget("b", "n0", "w", NamedAxes(), {4, 4}, {4, 4})};
    ASSERT_OK_AND_ASSIGN(SourceSelection good, SelectSources(manifest, targets));
    ASSERT_THAT(PlanBatch(manifest, targets, good, LookupOf(sources)), IsOk());
    {
        SourceSelection bad = good;  // a match filed under the wrong target
        std::swap(bad.matches[0].target_index, bad.matches[1].target_index);
        EXPECT_THAT(PlanBatch(manifest, targets, bad, LookupOf(sources)),
                    StatusIs(StatusCode::kInvalidArgument));
    }
    {
        SourceSelection bad = good;  // a source the manifest does not have
        bad.matches[1].source_index = 7;
        EXPECT_THAT(PlanBatch(manifest, targets, bad, LookupOf(sources)),
                    StatusIs(StatusCode::kInvalidArgument));
    }
    {
        SourceSelection bad = good;  // offsets that do not cover the matches
        bad.target_begin = {0, 2, 1};
        EXPECT_THAT(PlanBatch(manifest, targets, bad, LookupOf(sources)),
                    StatusIs(StatusCode::kInvalidArgument));
        bad.target_begin = {0, 1, 1};
        EXPECT_THAT(PlanBatch(manifest, targets, bad, LookupOf(sources)),
                    StatusIs(StatusCode::kInvalidArgument));
    }
}

}  // namespace
}  // namespace mooncake::sparse
