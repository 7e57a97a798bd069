// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// ManifestIndex (manifest_index.h): a manifest's sources by tensor_id, grouped in manifest
// order, reused across selections, and the candidate records SelectSources matches against.

#include "mooncake/sparse/manifest_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
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
using ::mooncake::sparse::testing::DenseCoords;
using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::LookupOf;
using ::mooncake::sparse::testing::MakeBox;
using ::mooncake::sparse::testing::MakeTarget;
using ::mooncake::sparse::testing::ManifestOf;
using ::mooncake::sparse::testing::Policy;
using ::mooncake::sparse::testing::RandomCoords;
using ::mooncake::sparse::testing::SelectEntries;
using ::mooncake::sparse::testing::SourceSpec;
using ::mooncake::sparse::testing::Spec2D;
using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::ValueOrDie;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// ---- manifest index ---------------------------------------------------------------------------

TEST(ManifestIndexTest, FindsEveryTensorsSourcesInManifestOrder) {
    std::vector<BuiltSource> sources;
    for (int i = 0; i < 6; ++i) {
        // Tensors w0 (sources 0, 3), w1 (1, 4), w2 (2, 5): two partial boxes each.
        SourceSpec spec = Spec2D("s" + std::to_string(i), "w" + std::to_string(i % 3), {16, 8},
                                 {4, 4});
        spec.box_origin = {8 * (i / 3), 0};
        spec.box_shape = {8, 8};
        sources.push_back(ValueOrDie(BuildSource(spec, {8 * (i / 3) + 1, 1})));
    }
    const auto manifest = ManifestOf(sources);
    ASSERT_OK_AND_ASSIGN(ManifestIndex index, ManifestIndex::Make(manifest));
    EXPECT_EQ(index.size(), 6u);
    EXPECT_THAT(index.Find("w0"), ElementsAre(0u, 3u));
    EXPECT_THAT(index.Find("w1"), ElementsAre(1u, 4u));
    EXPECT_THAT(index.Find("w2"), ElementsAre(2u, 5u));
    EXPECT_THAT(index.Find("w3"), IsEmpty());
    EXPECT_THAT(index.Find(""), IsEmpty());
    ASSERT_OK_AND_ASSIGN(ManifestIndex empty, ManifestIndex::Make({}));
    EXPECT_THAT(empty.Find("w0"), IsEmpty());
}

TEST(ManifestIndexTest, ConsecutiveSourcesOfOneTensorShareOneGroup) {
    // Regression: looking up the group created just before (the next source of the same
    // tensor) must compare against that group's complete id.
    const BuiltSource proto = ValueOrDie(BuildSource(Spec2D("p", "p", {8, 8}, {4, 4}), {1, 1}));
    std::vector<SourceDescriptor> manifest;
    for (int t = 0; t < 300; ++t) {
        for (int part = 0; part < 1 + t % 3; ++part) {
            SourceDescriptor d = proto.desc;
            d.tensor_id = std::string(static_cast<std::size_t>(t % 7), 'x') + "t" + std::to_string(t);
            d.source_ref = d.tensor_id + "/" + std::to_string(part);
            manifest.push_back(d);
        }
    }
    ASSERT_OK_AND_ASSIGN(ManifestIndex index, ManifestIndex::Make(manifest));
    std::size_t i = 0;
    for (int t = 0; t < 300; ++t) {
        std::vector<std::uint32_t> expected;
        for (int part = 0; part < 1 + t % 3; ++part) expected.push_back(static_cast<std::uint32_t>(i++));
        const auto found = index.Find(manifest[expected[0]].tensor_id);
        EXPECT_EQ(std::vector<std::uint32_t>(found.begin(), found.end()), expected) << t;
    }
}

TEST(ManifestIndexTest, ManyTensorsAndHashCollisionsOfPrefixes) {
    // Ids that share long prefixes and differ in one byte anywhere, as layer/expert names do.
    std::vector<SourceDescriptor> manifest;
    const BuiltSource proto = ValueOrDie(BuildSource(Spec2D("p", "p", {8, 8}, {4, 4}), {1, 1}));
    for (int layer = 0; layer < 40; ++layer) {
        for (int expert = 0; expert < 50; ++expert) {
            SourceDescriptor d = proto.desc;
            d.tensor_id = "layers." + std::to_string(layer) + ".mlp.experts." +
                          std::to_string(expert) + ".w1";
            d.source_ref = "src/" + d.tensor_id;
            manifest.push_back(d);
        }
    }
    ASSERT_OK_AND_ASSIGN(ManifestIndex index, ManifestIndex::Make(manifest));
    for (std::size_t i = 0; i < manifest.size(); ++i) {
        ASSERT_THAT(index.Find(manifest[i].tensor_id), ElementsAre(i)) << manifest[i].tensor_id;
    }
    EXPECT_THAT(index.Find("layers.1.mlp.experts.1.w2"), IsEmpty());
    EXPECT_THAT(index.Find("layers.1.mlp.experts.1.w"), IsEmpty());
}

TEST(ManifestIndexTest, ReusedAcrossSelectionsOfOneManifest) {
    std::mt19937_64 rng(17);
    std::vector<BuiltSource> sources;
    for (int e = 0; e < 4; ++e) {
        const std::string tensor = "experts." + std::to_string(e) + ".w2";
        SourceSpec spec = Spec2D("src/" + tensor, tensor, {64, 32}, {8, 8});
        spec.placement = Axes({{"expert", e}});
        spec.policy = Policy("owner(expert)");
        sources.push_back(
            ValueOrDie(BuildSource(spec, RandomCoords(rng, MakeBox({0, 0}, {64, 32}), 200))));
    }
    const auto manifest = ManifestOf(sources);
    ASSERT_OK_AND_ASSIGN(ManifestIndex index, ManifestIndex::Make(manifest));
    // Two read calls of the same generation (different ranks) share one index, and plan what
    // a fresh index plans.
    for (int tp = 0; tp < 2; ++tp) {
        std::vector<TargetDescriptor> targets;
        for (int e = 0; e < 4; ++e) {
            targets.push_back(MakeTarget("rank" + std::to_string(tp), "node0",
                                         "experts." + std::to_string(e) + ".w2",
                                         Axes({{"expert", e}, {"tp", tp}}), {0, 16 * tp},
                                         {64, 16}));
        }
        ASSERT_OK_AND_ASSIGN(BatchPlan shared, Plan(manifest, index, targets, LookupOf(sources)));
        ASSERT_OK_AND_ASSIGN(BatchPlan fresh, Plan(manifest, targets, LookupOf(sources)));
        EXPECT_EQ(shared.reads, fresh.reads);
        EXPECT_EQ(shared.stats.requested_entries, fresh.stats.requested_entries);
        EXPECT_THAT(shared.selection.needed_sources, ElementsAre(0u, 1u, 2u, 3u));
        for (std::size_t t = 0; t < targets.size(); ++t) {
            std::vector<EntryRange> ranges;
            for (const Region& r : shared.CollectRegions(t)) ranges.push_back(r.range());
            EXPECT_EQ(SelectEntries(sources[t], ranges, targets[t].box),
                      BruteForceScan(sources[t], targets[t].box));
        }
    }
    // An index of another manifest is refused, not trusted.
    const std::vector<SourceDescriptor> fewer(manifest.begin(), manifest.begin() + 3);
    std::vector<TargetDescriptor> one = {MakeTarget("r", "n", "experts.0.w2",
                                                    Axes({{"expert", 0}}), {0, 0}, {64, 32})};
    EXPECT_THAT(SelectSources(fewer, index, one), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(SelectSources(manifest, index, one), IsOk());
}

TEST(ManifestIndexTest, CandidatesCarryBoxTileShapeAndTileCount) {
    // The same records whether each tensor's sources are consecutive in the manifest (kept in
    // place) or interleaved (reordered by tensor).
    for (const bool interleaved : {false, true}) {
        SCOPED_TRACE(interleaved ? "interleaved" : "grouped");
        std::vector<BuiltSource> sources;
        for (int i = 0; i < 4; ++i) {
            const int tensor = interleaved ? i % 2 : i / 2;
            const int part = interleaved ? i / 2 : i % 2;
            SourceSpec spec;
            spec.source_ref = "s" + std::to_string(i);
            spec.tensor_id = "w" + std::to_string(tensor);
            spec.global_shape = {16, 8};
            spec.tile_shape = tensor == 0 ? Shape{4, 4} : Shape{8, 2};
            spec.box_origin = {8 * part, 0};
            spec.box_shape = {8, 8};
            sources.push_back(ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({8 * part, 0},
                                                                               {8 - part, 8})))));
        }
        const auto manifest = ManifestOf(sources);
        ASSERT_OK_AND_ASSIGN(ManifestIndex index, ManifestIndex::Make(manifest));
        for (const std::string id : {"w0", "w1"}) {
            const std::uint32_t group = index.Lookup(ManifestIndex::HashId(id), id);
            ASSERT_NE(group, ManifestIndex::kNone);
            const auto found = index.Find(id);
            const auto candidates = index.candidates(group);
            ASSERT_EQ(candidates.size(), 2u);
            ASSERT_EQ(found.size(), 2u);
            for (std::size_t k = 0; k < 2; ++k) {
                const ManifestIndex::Candidate& c = candidates[k];
                EXPECT_EQ(c.source, found[k]);
                const SourceDescriptor& d = manifest[c.source];
                EXPECT_EQ(d.tensor_id, id);
                EXPECT_EQ(c.rank, 2u);
                EXPECT_EQ(c.tiles, d.num_tiles);
                EXPECT_THAT(index.global_shape(c), ElementsAre(16, 8));
                EXPECT_THAT(index.box_begin(c), ElementsAre(d.box.begin(0), d.box.begin(1)));
                EXPECT_THAT(index.box_end(c), ElementsAre(d.box.end(0), d.box.end(1)));
                EXPECT_THAT(index.tile_shape(c), ElementsAre(d.tile_shape[0], d.tile_shape[1]));
            }
        }
    }
}

}  // namespace
}  // namespace mooncake::sparse
