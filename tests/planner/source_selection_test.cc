// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// SelectSources (source_selection.h): placement filtering, box intersection and coverage, and
// the region bound it derives from geometry alone.

#include "mooncake/sparse/source_selection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::Axes;
using ::mooncake::sparse::testing::BruteForceScan;
using ::mooncake::sparse::testing::BuildSource;
using ::mooncake::sparse::testing::BuiltSource;
using ::mooncake::sparse::testing::Dense64;
using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::LookupOf;
using ::mooncake::sparse::testing::MakeBox;
using ::mooncake::sparse::testing::MakeTarget;
using ::mooncake::sparse::testing::ManifestOf;
using ::mooncake::sparse::testing::PlannedRegion;
using ::mooncake::sparse::testing::Policy;
using ::mooncake::sparse::testing::RandomCoords;
using ::mooncake::sparse::testing::RegionsOf;
using ::mooncake::sparse::testing::SelectEntries;
using ::mooncake::sparse::testing::SourceSpec;
using ::mooncake::sparse::testing::Spec2D;
using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::ThreeColumns64;
using ::mooncake::sparse::testing::ValueOrDie;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// ---- placement filtering and coverage (SelectSources) -----------------------------------------

TEST(SelectSourcesTest, OwnerExpertMatchesOnlyHostingTarget) {
    // Training EP 16 (expert 37 on training rank 9), inference EP 8 (expert 37 on rank 4):
    // owner(expert) compares expert ids, so the sizes need not agree.
    std::mt19937_64 rng(37);
    std::vector<BuiltSource> sources;
    for (int expert : {36, 37, 38}) {
        const std::string tensor = "layers.3.mlp.experts." + std::to_string(expert) + ".w1";
        SourceSpec spec = Spec2D("src/" + tensor, tensor, {256, 128}, {32, 32});
        spec.placement = Axes({{"expert", expert}, {"ep", expert / 4}});
        spec.policy = Policy("owner(expert)");
        sources.push_back(
            ValueOrDie(BuildSource(spec, RandomCoords(rng, MakeBox({0, 0}, {256, 128}), 500))));
    }
    const auto manifest = ManifestOf(sources);
    const std::string w37 = "layers.3.mlp.experts.37.w1";
    std::vector<TargetDescriptor> targets = {
        MakeTarget("node0/rank8", "node0", w37, Axes({{"expert", 37}, {"ep", 4}, {"tp", 0}}),
                   {0, 0}, {128, 128}),
        MakeTarget("node0/rank9", "node0", w37, Axes({{"expert", 37}, {"ep", 4}, {"tp", 1}}),
                   {128, 0}, {128, 128}),
    };
    ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, targets));
    ASSERT_EQ(sel.num_targets(), 2u);
    ASSERT_THAT(sel.matches_of(0), SizeIs(1));
    ASSERT_THAT(sel.matches_of(1), SizeIs(1));
    EXPECT_EQ(sel.matches_of(0)[0].source_index, 1u);
    EXPECT_EQ(sel.matches_of(0)[0].target_index, 0u);
    EXPECT_EQ(sel.matches_of(1)[0].target_index, 1u);
    EXPECT_EQ(sel.matches_of(0)[0].Overlap(manifest, targets), MakeBox({0, 0}, {128, 128}));
    EXPECT_EQ(sel.matches_of(1)[0].Overlap(manifest, targets), MakeBox({128, 0}, {128, 128}));
    EXPECT_THAT(sel.target_begin, ElementsAre(0u, 1u, 2u));
    EXPECT_THAT(sel.needed_sources, ElementsAre(1u));

    // A rank that does not host expert 37 matches none of its sources.
    std::vector<TargetDescriptor> wrong = {MakeTarget(
        "node0/rank0", "node0", w37, Axes({{"expert", 36}, {"ep", 4}}), {0, 0}, {256, 128})};
    EXPECT_THAT(SelectSources(manifest, wrong), StatusIs(StatusCode::kNotFound));
    std::vector<TargetDescriptor> no_axis = {
        MakeTarget("node0/rank0", "node0", w37, Axes({{"ep", 4}}), {0, 0}, {256, 128})};
    EXPECT_THAT(SelectSources(manifest, no_axis), StatusIs(StatusCode::kNotFound));
}

TEST(SelectSourcesTest, OwnerFilterSkipsOtherOwnersOfOneTensor) {
    // Two owners' objects under one tensor id: the filter runs before the overlap check, so a
    // target sees only its owner's object.
    std::vector<BuiltSource> sources;
    for (int expert : {5, 6}) {
        SourceSpec spec = Spec2D("src/" + std::to_string(expert), "w", {32, 32}, {8, 8});
        spec.placement = Axes({{"expert", expert}});
        spec.policy = Policy("owner(expert)");
        sources.push_back(ValueOrDie(BuildSource(spec, {1, 2, 30, 31})));
    }
    const auto manifest = ManifestOf(sources);
    for (int expert : {5, 6}) {
        std::vector<TargetDescriptor> targets = {MakeTarget(
            "t", "n", "w", Axes({{"expert", expert}, {"tp", 0}}), {0, 0}, {32, 32})};
        ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, targets));
        ASSERT_THAT(sel.matches_of(0), SizeIs(1));
        EXPECT_EQ(sel.matches_of(0)[0].source_index, static_cast<std::size_t>(expert - 5));
    }
}

TEST(SelectSourcesTest, ReplicateAndNoneMatchEveryTarget) {
    for (const char* policy : {"replicate(ep)", "none"}) {
        SourceSpec spec = Spec2D("s", "w", {32, 32}, {8, 8});
        spec.placement = Axes({{"ep", 0}});
        spec.policy = Policy(policy);
        std::vector<BuiltSource> sources = {ValueOrDie(BuildSource(spec, {1, 2, 30, 31}))};
        const auto manifest = ManifestOf(sources);
        std::vector<TargetDescriptor> targets;
        for (int ep = 0; ep < 4; ++ep) {
            targets.push_back(MakeTarget("r" + std::to_string(ep), "n", "w",
                                         Axes({{"ep", ep}, {"tp", 0}}), {0, 0}, {32, 32}));
        }
        targets.push_back(MakeTarget("bare", "n", "w", NamedAxes(), {0, 0}, {32, 32}));
        ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, targets));
        ASSERT_EQ(sel.num_targets(), targets.size());
        for (std::size_t t = 0; t < targets.size(); ++t) {
            EXPECT_THAT(sel.matches_of(t), SizeIs(1)) << policy;
        }
    }
}

TEST(SelectSourcesTest, PartialSourcesTogetherCoverTarget) {
    // Two sources each cover half of the rows; a target straddling both reads both.
    std::mt19937_64 rng(2);
    std::vector<BuiltSource> sources;
    for (int half = 0; half < 2; ++half) {
        SourceSpec spec = Spec2D("s" + std::to_string(half), "w", {64, 32}, {8, 8});
        spec.box_origin = {32 * half, 0};
        spec.box_shape = {32, 32};
        sources.push_back(ValueOrDie(
            BuildSource(spec, RandomCoords(rng, MakeBox({32 * half, 0}, {32, 32}), 200))));
    }
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("t", "n", "w", NamedAxes(), {20, 4}, {24, 20})};
    ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, targets));
    ASSERT_THAT(sel.matches_of(0), SizeIs(2));
    EXPECT_EQ(sel.matches_of(0)[0].Overlap(manifest, targets), MakeBox({20, 4}, {12, 20}));
    EXPECT_EQ(sel.matches_of(0)[1].Overlap(manifest, targets), MakeBox({32, 4}, {12, 20}));
    EXPECT_THAT(sel.needed_sources, ElementsAre(0u, 1u));

    ASSERT_OK_AND_ASSIGN(BatchPlan plan,
                         PlanBatch(manifest, targets, sel, LookupOf(sources)));
    EXPECT_EQ(plan.stats.sources_matched, 2u);
    // Reading both sources through the plan gives exactly the target's entries.
    const auto regions = RegionsOf(plan, 0, manifest, targets);
    for (std::size_t s = 0; s < 2; ++s) {
        std::vector<EntryRange> ranges;
        for (const PlannedRegion& r : regions) {
            if (r.info.source_index == s) ranges.push_back(r.region.range());
        }
        EXPECT_EQ(SelectEntries(sources[s], ranges, targets[0].box),
                  BruteForceScan(sources[s], targets[0].box));
    }
}

TEST(SelectSourcesTest, UncoveredTargetIsNotFound) {
    SourceSpec spec = Spec2D("s", "w", {64, 32}, {8, 8});
    spec.box_origin = {0, 0};
    spec.box_shape = {32, 32};  // rows 32..63 have no source
    std::vector<BuiltSource> sources = {ValueOrDie(BuildSource(spec, {1, 1}))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("t", "n", "w", NamedAxes(), {16, 0}, {32, 32})};
    EXPECT_THAT(SelectSources(manifest, targets), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(Plan(manifest, targets, LookupOf(sources)), StatusIs(StatusCode::kNotFound));
    // Fully inside the source box: fine.
    targets = {MakeTarget("t", "n", "w", NamedAxes(), {0, 0}, {32, 32})};
    EXPECT_THAT(SelectSources(manifest, targets), IsOk());
}

TEST(SelectSourcesTest, TensorWithoutSourceIsNotFound) {
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(Spec2D("s", "w", {8, 8}, {4, 4}), {1, 1}))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("t", "n", "other", NamedAxes(), {0, 0}, {8, 8})};
    EXPECT_THAT(SelectSources(manifest, targets), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(SelectSources({}, targets), StatusIs(StatusCode::kNotFound));
}

TEST(SelectSourcesTest, OverlappingSourcesAreInvalid) {
    std::vector<BuiltSource> sources;
    for (int i = 0; i < 2; ++i) {
        SourceSpec spec = Spec2D("s" + std::to_string(i), "w", {64, 32}, {8, 8});
        spec.box_origin = {24 * i, 0};  // rows 0..39 and 24..63 overlap on 24..39
        spec.box_shape = {40, 32};
        sources.push_back(ValueOrDie(BuildSource(spec, {24 * i + 1, 1})));
    }
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> targets = {
        MakeTarget("t", "n", "w", NamedAxes(), {0, 0}, {64, 32})};
    EXPECT_THAT(SelectSources(manifest, targets), StatusIs(StatusCode::kInvalidArgument));
    // Even when the target only touches the overlap.
    targets = {MakeTarget("t", "n", "w", NamedAxes(), {30, 0}, {4, 4})};
    EXPECT_THAT(SelectSources(manifest, targets), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SelectSourcesTest, TargetRankOrShapeMismatchIsInvalid) {
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(Spec2D("s", "w", {8, 8}, {4, 4}), {1, 1}))};
    const auto manifest = ManifestOf(sources);
    std::vector<TargetDescriptor> rank3 = {
        MakeTarget("t", "n", "w", NamedAxes(), {0, 0, 0}, {8, 8, 1})};
    EXPECT_THAT(SelectSources(manifest, rank3), StatusIs(StatusCode::kInvalidArgument));
    std::vector<TargetDescriptor> rank1 = {MakeTarget("t", "n", "w", NamedAxes(), {0}, {8})};
    EXPECT_THAT(SelectSources(manifest, rank1), StatusIs(StatusCode::kInvalidArgument));
    std::vector<TargetDescriptor> outside = {
        MakeTarget("t", "n", "w", NamedAxes(), {4, 0}, {8, 8})};
    EXPECT_THAT(SelectSources(manifest, outside), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SelectSourcesTest, EmptyTargetSetSelectsNothing) {
    std::vector<BuiltSource> sources = {
        ValueOrDie(BuildSource(Spec2D("s", "w", {8, 8}, {4, 4}), {1, 1}))};
    ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(ManifestOf(sources), {}));
    EXPECT_EQ(sel.num_targets(), 0u);
    EXPECT_THAT(sel.matches, IsEmpty());
    EXPECT_THAT(sel.needed_sources, IsEmpty());
    ASSERT_OK_AND_ASSIGN(BatchPlan plan, Plan(ManifestOf(sources), {}, LookupOf(sources)));
    EXPECT_THAT(plan.reads, IsEmpty());
    EXPECT_THAT(plan.regions, IsEmpty());
    EXPECT_THAT(plan.read_groups, IsEmpty());
    EXPECT_EQ(plan.num_targets(), 0u);
}

TEST(SelectSourcesTest, RegionBoundFromGeometry) {
    // Dense64 (8 x 8 tiles of 8 x 8): the whole tensor is 1 range, a TP column half one range
    // per tile row (8), a TP row half 1 (its tile rows are complete), and an unaligned box
    // over tile rows 0..2 and part of their columns 3; dense, so the bound is exact.
    {
        const std::vector<BuiltSource> sources = {Dense64()};
        const auto manifest = ManifestOf(sources);
        const std::vector<TargetDescriptor> targets = {
            MakeTarget("t0", "n", "tensor", NamedAxes(), {0, 0}, {64, 64}),
            MakeTarget("t1", "n", "tensor", NamedAxes(), {0, 32}, {64, 32}),
            MakeTarget("t2", "n", "tensor", NamedAxes(), {32, 0}, {32, 64}),
            MakeTarget("t3", "n", "tensor", NamedAxes(), {3, 5}, {19, 7})};
        ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, targets));
        EXPECT_EQ(sel.region_bound, 1u + 8u + 1u + 3u);
        ASSERT_OK_AND_ASSIGN(BatchPlan plan, PlanBatch(manifest, targets, sel, LookupOf(sources)));
        EXPECT_EQ(plan.regions.size(), sel.region_bound);
    }
    // ThreeColumns64 (24 tiles, in tile columns 0..2): a band over tile columns 0..1 plans one
    // range per tile row (8), one over tile columns 4..7 plans none; the bound does not know
    // which tiles exist (8 each), but never exceeds the tiles there are.
    {
        const std::vector<BuiltSource> sources = {ThreeColumns64()};
        const auto manifest = ManifestOf(sources);
        const std::vector<TargetDescriptor> targets = {
            MakeTarget("t0", "n", "tensor", NamedAxes(), {0, 0}, {64, 16}),
            MakeTarget("t1", "n", "tensor", NamedAxes(), {0, 32}, {64, 32})};
        ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, targets));
        EXPECT_EQ(sel.region_bound, 16u);
        ASSERT_OK_AND_ASSIGN(BatchPlan plan, PlanBatch(manifest, targets, sel, LookupOf(sources)));
        EXPECT_EQ(plan.regions.size(), 8u);
    }
    // The bound never exceeds the tiles present, and without a usable tile shape it is them.
    const std::vector<Index> lo = {0, 0}, hi = {64, 32}, begin = {0, 0}, end = {64, 64};
    const std::vector<Index> tile = {1, 1}, no_tile = {0, 8};
    EXPECT_EQ(internal::RunBound(2, lo.data(), hi.data(), begin, end, tile, 1000), 64u);
    EXPECT_EQ(internal::RunBound(2, lo.data(), hi.data(), begin, end, tile, 10), 10u);
    EXPECT_EQ(internal::RunBound(2, lo.data(), hi.data(), begin, end, no_tile, 10), 10u);
    EXPECT_EQ(internal::RunBound(2, lo.data(), hi.data(), begin, end, tile, 0), 0u);
}

}  // namespace
}  // namespace mooncake::sparse
