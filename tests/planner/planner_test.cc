// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The planner (planner.h): tile index queries on the 2-D row/column paths and the N-D path,
// boundary filter flags, placement filtering and coverage (SelectSources), batch planning with
// per-node dedup (PlanBatch / Plan), the §4 acceptance case, and planning budgets.

#include "mooncake/sparse/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <span>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::Axes;
using ::mooncake::sparse::testing::BruteForceScan;
using ::mooncake::sparse::testing::BuildSource;
using ::mooncake::sparse::testing::BuiltSource;
using ::mooncake::sparse::testing::DenseCoords;
using ::mooncake::sparse::testing::ExpectWellFormedRanges;
using ::mooncake::sparse::testing::ExpectSamePlan;
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
using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::UniqueCoords;
using ::mooncake::sparse::testing::ValueOrDie;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

/// Runs one query and returns its ranges.
std::vector<EntryRange> QueryRanges(const BuiltSource& src, const Box& box, QueryStats& stats,
                                    const PlanningLimits& limits = {}) {
    std::vector<EntryRange> out;
    Status s = src.index->Query(box, limits, out, stats);
    EXPECT_THAT(s, IsOk());
    return out;
}

/// Checks a query against the brute-force scan and the structural promises.
void ExpectMatchesBruteForce(const BuiltSource& src, const Box& box,
                             const std::vector<EntryRange>& ranges) {
    ExpectWellFormedRanges(src, ranges, box);
    EXPECT_EQ(SelectEntries(src, ranges, box), BruteForceScan(src, box)) << box.ToString();
}

/// A dense 64x64 tensor with 8x8 tiles: tile (r, c) holds entries [64 * (8r + c), +64).
BuiltSource Dense64() {
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.tile_shape = {8, 8};
    return ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {64, 64}))));
}

/// Dense64 without its last tile (7, 7): every other tile keeps its entries and offsets, but
/// the index is no longer dense, so queries search its row and column groups.
BuiltSource NearlyDense64() {
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.tile_shape = {8, 8};
    std::vector<Index> coords = DenseCoords(MakeBox({0, 0}, {64, 64}));
    std::vector<Index> kept;
    for (std::size_t i = 0; i < coords.size(); i += 2) {
        if (coords[i] >= 56 && coords[i + 1] >= 56) continue;
        kept.push_back(coords[i]);
        kept.push_back(coords[i + 1]);
    }
    return ValueOrDie(BuildSource(spec, kept));
}

/// A 64x64 tensor with 8x8 tiles whose entries fill only tile columns 0..2 (24 tiles): tile
/// (r, c) holds entries [64 * (3r + c), +64). Sparse enough that the column path is cheaper for
/// a band of two tile columns.
BuiltSource ThreeColumns64() {
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.tile_shape = {8, 8};
    return ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {64, 24}))));
}

EntryRange R(std::uint64_t start, std::uint64_t end, bool filter = false) {
    return {start, end, filter};
}

// ---- 2-D row and column lookups ----------------------------------------------------------------

TEST(TileIndexQueryTest, RowLookupCoalescesAdjacentTiles) {
    const BuiltSource src = Dense64();
    QueryStats stats;
    // One tile row, three tile columns: fewer row groups, so the row path.
    const Box box = MakeBox({8, 16}, {8, 24});
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.queries, 1u);
    EXPECT_EQ(stats.row_path, 1u);
    EXPECT_EQ(stats.column_path, 0u);
    EXPECT_EQ(stats.nd_path, 0u);
    EXPECT_EQ(stats.whole_source, 0u);
    // Tiles (1,2), (1,3), (1,4) are adjacent in entry order: one range.
    EXPECT_THAT(ranges, ElementsAre(R(64 * 10, 64 * 13)));
    EXPECT_EQ(stats.groups_visited, 1u);
    EXPECT_EQ(stats.tiles_visited, 3u);
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, RowLookupTwoRows) {
    const BuiltSource src = Dense64();
    QueryStats stats;
    const Box box = MakeBox({8, 16}, {16, 24});  // 2 tile rows x 3 tile columns
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.row_path, 1u);
    EXPECT_EQ(stats.column_path, 0u);
    EXPECT_THAT(ranges, ElementsAre(R(64 * 10, 64 * 13), R(64 * 18, 64 * 21)));
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, RowPathOnTieOfGroups) {
    const BuiltSource src = Dense64();
    QueryStats stats;
    const Box box = MakeBox({8, 8}, {16, 16});  // 2 x 2 tiles
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.row_path, 1u);
    EXPECT_EQ(stats.column_path, 0u);
    EXPECT_THAT(ranges, ElementsAre(R(64 * 9, 64 * 11), R(64 * 17, 64 * 19)));
}

TEST(TileIndexQueryTest, ColumnLookup) {
    const BuiltSource src = NearlyDense64();
    QueryStats stats;
    // Five tile rows, one tile column: one column group of 5 tiles costs less than five row
    // searches, so the column path.
    const Box box = MakeBox({0, 8}, {40, 8});
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.column_path, 1u);
    EXPECT_EQ(stats.row_path, 0u);
    EXPECT_EQ(stats.nd_path, 0u);
    std::vector<EntryRange> expected;
    for (std::uint64_t r = 0; r < 5; ++r) expected.push_back(R(64 * (8 * r + 1), 64 * (8 * r + 2)));
    EXPECT_EQ(ranges, expected);
    EXPECT_EQ(stats.groups_visited, 1u);
    EXPECT_EQ(stats.tiles_visited, 5u);
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, ColumnLookupCoalescesAdjacentTiles) {
    const BuiltSource src = ThreeColumns64();
    QueryStats stats;
    const Box box = MakeBox({0, 8}, {40, 16});  // 5 tile rows x 2 tile columns
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.column_path, 1u);
    EXPECT_EQ(stats.row_path, 0u);
    EXPECT_EQ(stats.groups_visited, 2u);
    EXPECT_EQ(stats.tiles_visited, 10u);
    // The column path emits one range per tile; (r,1) and (r,2) are adjacent and coalesce.
    std::vector<EntryRange> expected;
    for (std::uint64_t r = 0; r < 5; ++r) expected.push_back(R(64 * (3 * r + 1), 64 * (3 * r + 3)));
    EXPECT_EQ(ranges, expected);
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, ColumnBandOfDenseIndexTakesRowPath) {
    // The same band over a dense index: each tile row is one coalesced range found in O(1),
    // against gathering and sorting all ten tiles on the column path.
    const BuiltSource src = Dense64();
    ASSERT_TRUE(src.index->dense());
    QueryStats stats;
    const Box box = MakeBox({0, 8}, {40, 16});
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.row_path, 1u);
    EXPECT_EQ(stats.column_path, 0u);
    EXPECT_EQ(stats.groups_visited, 5u);
    EXPECT_EQ(stats.tiles_visited, 10u);
    std::vector<EntryRange> expected;
    for (std::uint64_t r = 0; r < 5; ++r) expected.push_back(R(64 * (8 * r + 1), 64 * (8 * r + 3)));
    EXPECT_EQ(ranges, expected);
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, PathChoiceWeighsGroupsByTheirCost) {
    // A row-parallel TP half of a Kimi-K2 expert w2 ([7168, 2048], 256x128 tiles: 28 x 16 tile
    // grid): 28 candidate rows against 8 candidate columns. Counting groups alone would pick
    // the columns and then gather and sort all 224 tiles; weighted by their cost, the rows win
    // (one coalesced range each), for a dense and a sparse index alike.
    SourceSpec spec;
    spec.global_shape = {7168, 2048};
    spec.tile_shape = {256, 128};
    const Box half = MakeBox({0, 1024}, {7168, 1024});
    std::mt19937_64 rng(21);
    for (int density : {100, 5}) {  // entries per tile on average
        SCOPED_TRACE(density);
        std::vector<Index> coords;
        for (Index tr = 0; tr < 28; ++tr) {
            for (Index tc = 0; tc < 16; ++tc) {
                if (density < 100 && (tr + tc) % 3 == 0) continue;  // some tiles empty
                const auto tile_box = MakeBox({tr * 256, tc * 128}, {256, 128});
                const auto pts = RandomCoords(rng, tile_box, density < 100 ? 2 : 3);
                coords.insert(coords.end(), pts.begin(), pts.end());
            }
        }
        const BuiltSource src = ValueOrDie(BuildSource(spec, coords));
        EXPECT_EQ(src.index->dense(), density == 100);
        QueryStats stats;
        auto ranges = QueryRanges(src, half, stats);
        EXPECT_EQ(stats.row_path, 1u);
        EXPECT_EQ(stats.column_path, 0u);
        EXPECT_EQ(stats.groups_visited, 28u);
        EXPECT_EQ(ranges.size(), 28u);
        ExpectMatchesBruteForce(src, half, ranges);
    }
}

TEST(TileIndexQueryTest, FullWidthRowsAreOneRange) {
    const BuiltSource src = Dense64();
    QueryStats stats;
    // Whole tile rows are contiguous in entry order: one range, whatever the row count.
    const Box box = MakeBox({8, 0}, {48, 64});
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.row_path, 1u);
    EXPECT_EQ(stats.column_path, 0u);
    EXPECT_THAT(ranges, ElementsAre(R(64 * 8, 64 * 56)));
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, SparseTilesOnlyVisitsPresentTiles) {
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.tile_shape = {8, 8};
    // One entry in tiles (0,0), (2,5), (5,2), (7,7).
    const BuiltSource src = ValueOrDie(BuildSource(spec, {1, 1, 17, 41, 42, 18, 63, 63}));
    ASSERT_EQ(src.index->num_tiles(), 4u);
    // Tiles (2,5) and (5,2) are the only non-empty tiles in these boxes; the empty tiles
    // between them in entry order cost nothing, so their ranges coalesce into [1, 3).
    for (const Box& box : {MakeBox({16, 16}, {32, 32}), MakeBox({17, 16}, {31, 40}),
                           MakeBox({16, 16}, {40, 32}), MakeBox({16, 19}, {40, 32})}) {
        QueryStats stats;
        auto ranges = QueryRanges(src, box, stats);
        ASSERT_THAT(ranges, SizeIs(1)) << box.ToString();
        EXPECT_EQ(ranges[0].start, 1u);
        EXPECT_EQ(ranges[0].end, 3u);
        EXPECT_EQ(stats.tiles_visited, 2u) << box.ToString();
        EXPECT_EQ(stats.groups_visited, 2u) << box.ToString();
        ExpectMatchesBruteForce(src, box, ranges);
    }
    // A box whose tiles are all empty plans nothing.
    QueryStats stats;
    EXPECT_THAT(QueryRanges(src, MakeBox({24, 24}, {16, 16}), stats), IsEmpty());
}

// ---- boundary filter flags -------------------------------------------------------------------

TEST(TileIndexQueryTest, AlignedBoxIsUnflagged) {
    const BuiltSource src = Dense64();
    for (const Box& box : {MakeBox({8, 16}, {8, 24}), MakeBox({0, 8}, {40, 8}),
                           MakeBox({16, 0}, {16, 64}), MakeBox({56, 56}, {8, 8})}) {
        QueryStats stats;
        auto ranges = QueryRanges(src, box, stats);
        ASSERT_THAT(ranges, Not(IsEmpty()));
        for (const EntryRange& r : ranges) {
            EXPECT_FALSE(r.exact_coordinate_filter) << box.ToString();
        }
        ExpectMatchesBruteForce(src, box, ranges);
    }
}

TEST(TileIndexQueryTest, UnalignedBoxIsFlagged) {
    const BuiltSource src = Dense64();
    // Row 9 starts inside tile row 1: every tile of the range crosses the box edge.
    {
        QueryStats stats;
        const Box box = MakeBox({9, 16}, {7, 24});
        auto ranges = QueryRanges(src, box, stats);
        EXPECT_THAT(ranges, ElementsAre(R(64 * 10, 64 * 13, true)));
        ExpectMatchesBruteForce(src, box, ranges);
    }
    // Only the last column tile is partial; the coalesced range carries the flag.
    {
        QueryStats stats;
        const Box box = MakeBox({8, 16}, {8, 20});
        auto ranges = QueryRanges(src, box, stats);
        EXPECT_THAT(ranges, ElementsAre(R(64 * 10, 64 * 13, true)));
        ExpectMatchesBruteForce(src, box, ranges);
    }
    // Column path: the partial edge row is flagged, the inner rows are not.
    {
        const BuiltSource nearly = NearlyDense64();
        QueryStats stats;
        const Box box = MakeBox({4, 8}, {36, 8});  // rows 4..39: tile rows 0 (partial) .. 4
        auto ranges = QueryRanges(nearly, box, stats);
        EXPECT_EQ(stats.column_path, 1u);
        ASSERT_THAT(ranges, SizeIs(5));
        EXPECT_TRUE(ranges[0].exact_coordinate_filter);
        for (std::size_t i = 1; i < 5; ++i) EXPECT_FALSE(ranges[i].exact_coordinate_filter) << i;
        ExpectMatchesBruteForce(nearly, box, ranges);
    }
    // The same box on the dense index (row path): the same flags.
    {
        QueryStats stats;
        const Box box = MakeBox({4, 8}, {36, 8});
        auto ranges = QueryRanges(src, box, stats);
        EXPECT_EQ(stats.row_path, 1u);
        ASSERT_THAT(ranges, SizeIs(5));
        EXPECT_TRUE(ranges[0].exact_coordinate_filter);
        for (std::size_t i = 1; i < 5; ++i) EXPECT_FALSE(ranges[i].exact_coordinate_filter) << i;
        ExpectMatchesBruteForce(src, box, ranges);
    }
    // A single element.
    {
        QueryStats stats;
        const Box box = MakeBox({13, 21}, {1, 1});
        auto ranges = QueryRanges(src, box, stats);
        EXPECT_THAT(ranges, ElementsAre(R(64 * 10, 64 * 11, true)));
        ExpectMatchesBruteForce(src, box, ranges);
    }
}

TEST(TileIndexQueryTest, EdgeTilesClippedToTensorAreUnflagged) {
    // 60 is not a multiple of 8: the last tile row and column are 4 wide, and a box that ends
    // at the tensor edge holds them entirely.
    SourceSpec spec;
    spec.global_shape = {60, 60};
    spec.tile_shape = {8, 8};
    const BuiltSource src = ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {60, 60}))));
    const Box box = MakeBox({56, 24}, {4, 36});
    QueryStats stats;
    auto ranges = QueryRanges(src, box, stats);
    ASSERT_THAT(ranges, SizeIs(1));
    EXPECT_FALSE(ranges[0].exact_coordinate_filter);
    ExpectMatchesBruteForce(src, box, ranges);
}

// ---- whole source, empty source, errors ------------------------------------------------------

TEST(TileIndexQueryTest, WholeSourceIsOneUnflaggedRange) {
    const BuiltSource src = Dense64();
    QueryStats stats;
    auto ranges = QueryRanges(src, MakeBox({0, 0}, {64, 64}), stats);
    EXPECT_THAT(ranges, ElementsAre(R(0, src.nnz())));
    EXPECT_EQ(stats.whole_source, 1u);
    EXPECT_EQ(stats.row_path + stats.column_path + stats.nd_path, 0u);
    EXPECT_EQ(stats.tiles_visited, 0u);  // O(1)
}

TEST(TileIndexQueryTest, WholePartialSourceBox) {
    // A source that covers rows 32..63 only: querying its whole box is the O(1) path.
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.box_origin = {32, 0};
    spec.box_shape = {32, 64};
    spec.tile_shape = {8, 8};
    std::mt19937_64 rng(3);
    const BuiltSource src =
        ValueOrDie(BuildSource(spec, RandomCoords(rng, MakeBox({32, 0}, {32, 64}), 300)));
    QueryStats stats;
    auto ranges = QueryRanges(src, MakeBox({32, 0}, {32, 64}), stats);
    EXPECT_THAT(ranges, ElementsAre(R(0, 300)));
    EXPECT_EQ(stats.whole_source, 1u);
}

TEST(TileIndexQueryTest, EmptySourcePlansNothing) {
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.tile_shape = {8, 8};
    const BuiltSource src = ValueOrDie(BuildSource(spec, {}));
    QueryStats stats;
    EXPECT_THAT(QueryRanges(src, MakeBox({0, 0}, {64, 64}), stats), IsEmpty());
    EXPECT_THAT(QueryRanges(src, MakeBox({3, 5}, {7, 9}), stats), IsEmpty());
    EXPECT_EQ(stats.queries, 2u);
}

TEST(TileIndexQueryTest, RejectsBoxOfWrongRankOrOutsideSource) {
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.box_origin = {0, 0};
    spec.box_shape = {32, 64};
    spec.tile_shape = {8, 8};
    const BuiltSource src = ValueOrDie(BuildSource(spec, {1, 1, 17, 41}));
    std::vector<EntryRange> out;
    QueryStats stats;
    EXPECT_THAT(src.index->Query(MakeBox({0}, {8}), {}, out, stats),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(src.index->Query(MakeBox({0, 0, 0}, {8, 8, 1}), {}, out, stats),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(src.index->Query(MakeBox({24, 0}, {16, 8}), {}, out, stats),
                StatusIs(StatusCode::kInvalidArgument));  // rows 32..39 are not in the source
    EXPECT_THAT(src.index->Query(Box(), {}, out, stats), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(out, IsEmpty());
}

TEST(TileIndexQueryTest, AppendsAfterExistingRanges) {
    const BuiltSource src = Dense64();
    std::vector<EntryRange> out = {R(5000, 5001)};
    QueryStats stats;
    ASSERT_THAT(src.index->Query(MakeBox({0, 8}, {40, 16}), {}, out, stats), IsOk());
    ASSERT_THAT(out, SizeIs(6));
    EXPECT_EQ(out[0], R(5000, 5001));  // untouched, not sorted into the new ones
    EXPECT_EQ(out[1], R(64, 192));
}

// ---- N-D and 1-D -------------------------------------------------------------------------------

/// A dense fused experts tensor [8 experts, 64 out, 32 in] with tiles [1, 16, 16]: tile
/// (e, r, c) holds entries [256 * (8e + 2r + c), +256).
BuiltSource DenseExperts() {
    SourceSpec spec;
    spec.tensor_id = "layers.3.mlp.experts.w1";
    spec.global_shape = {8, 64, 32};
    spec.tile_shape = {1, 16, 16};
    return ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0, 0}, {8, 64, 32}))));
}

TEST(TileIndexQueryTest, FusedExpertsEpBoxTpOnOutDim) {
    const BuiltSource src = DenseExperts();
    QueryStats stats;
    // EP rank 1 of 4 hosts experts 2..3; TP rank 0 of 2 takes out rows 0..31.
    const Box box = MakeBox({2, 0, 0}, {2, 32, 32});
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.nd_path, 1u);
    EXPECT_EQ(stats.row_path + stats.column_path + stats.whole_source, 0u);
    EXPECT_THAT(ranges, ElementsAre(R(256 * 16, 256 * 20), R(256 * 24, 256 * 28)));
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, FusedExpertsEpBoxTpOnInDim) {
    const BuiltSource src = DenseExperts();
    QueryStats stats;
    const Box box = MakeBox({2, 0, 16}, {2, 64, 16});  // TP rank 1 of 2 on the in dim
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.nd_path, 1u);
    std::vector<EntryRange> expected;
    for (std::uint64_t e = 2; e < 4; ++e) {
        for (std::uint64_t r = 0; r < 4; ++r) {
            const std::uint64_t tile = 8 * e + 2 * r + 1;
            expected.push_back(R(256 * tile, 256 * (tile + 1)));
        }
    }
    EXPECT_EQ(ranges, expected);
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, FusedExpertsEpOnlyIsOneRange) {
    const BuiltSource src = DenseExperts();
    QueryStats stats;
    const Box box = MakeBox({4, 0, 0}, {4, 64, 32});  // experts 4..7, everything else whole
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.nd_path, 1u);
    EXPECT_THAT(ranges, ElementsAre(R(256 * 32, 256 * 64)));
}

TEST(TileIndexQueryTest, FusedExpertsUnalignedBoxIsFlagged) {
    const BuiltSource src = DenseExperts();
    QueryStats stats;
    const Box box = MakeBox({3, 10, 5}, {1, 30, 20});
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_EQ(stats.nd_path, 1u);
    ASSERT_THAT(ranges, Not(IsEmpty()));
    for (const EntryRange& r : ranges) EXPECT_TRUE(r.exact_coordinate_filter);
    ExpectMatchesBruteForce(src, box, ranges);
}

TEST(TileIndexQueryTest, OneDimensional) {
    SourceSpec spec;
    spec.global_shape = {100};
    spec.tile_shape = {10};
    const BuiltSource src = ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0}, {100}))));
    {
        QueryStats stats;
        const Box box = MakeBox({15}, {32});  // 15..46
        auto ranges = QueryRanges(src, box, stats);
        EXPECT_EQ(stats.nd_path, 1u);
        EXPECT_THAT(ranges, ElementsAre(R(10, 50, true)));
        ExpectMatchesBruteForce(src, box, ranges);
    }
    {
        QueryStats stats;
        auto ranges = QueryRanges(src, MakeBox({20}, {20}), stats);
        EXPECT_EQ(stats.nd_path, 1u);
        EXPECT_THAT(ranges, ElementsAre(R(20, 40)));
    }
    {
        QueryStats stats;
        auto ranges = QueryRanges(src, MakeBox({0}, {100}), stats);
        EXPECT_EQ(stats.whole_source, 1u);
        EXPECT_THAT(ranges, ElementsAre(R(0, 100)));
    }
}

TEST(TileIndexQueryTest, HugeExtentQueryDoesNotOverflow) {
    // Regression (UBSan): a tile's end was computed as lo + tile, which overflows for extents
    // near INT64_MAX with very large tiles.
    const Index kMax = std::numeric_limits<Index>::max();
    SourceSpec spec;
    spec.global_shape = {kMax};
    spec.tile_shape = {Index{1} << 62};
    const Index p = (Index{1} << 62) + 7;
    const BuiltSource src = ValueOrDie(BuildSource(spec, {3, p}));
    EXPECT_EQ(src.desc.index_dtype, DType::kUInt64);
    QueryStats stats;
    const Box box = MakeBox({p - 2}, {5});
    auto ranges = QueryRanges(src, box, stats);
    EXPECT_THAT(ranges, ElementsAre(R(1, 2, true)));
    ExpectMatchesBruteForce(src, box, ranges);
}

// ---- planning budgets --------------------------------------------------------------------------

TEST(TileIndexQueryTest, PlanningLimitsFailClosed) {
    const BuiltSource src = ThreeColumns64();
    const Box box = MakeBox({0, 8}, {40, 16});  // column path, 10 tiles in 2 groups
    {
        PlanningLimits limits;
        limits.max_tiles_per_query = 3;
        std::vector<EntryRange> out = {R(9000, 9001)};
        QueryStats stats;
        EXPECT_THAT(src.index->Query(box, limits, out, stats),
                    StatusIs(StatusCode::kResourceExhausted));
        EXPECT_THAT(out, ElementsAre(R(9000, 9001)));  // nothing half-planned is left behind
    }
    {
        PlanningLimits limits;
        limits.max_groups_per_query = 1;
        std::vector<EntryRange> out;
        QueryStats stats;
        EXPECT_THAT(src.index->Query(box, limits, out, stats),
                    StatusIs(StatusCode::kResourceExhausted));
        EXPECT_THAT(out, IsEmpty());
    }
    {
        PlanningLimits limits;
        limits.max_groups_per_query = 2;
        limits.max_tiles_per_query = 10;
        std::vector<EntryRange> out;
        QueryStats stats;
        EXPECT_THAT(src.index->Query(box, limits, out, stats), IsOk());  // exactly at budget
        EXPECT_EQ(stats.column_path, 1u);
    }
    {
        // The row path of a dense index (one group per tile row) is bounded the same way.
        const BuiltSource dense = Dense64();
        PlanningLimits limits;
        limits.max_groups_per_query = 4;
        std::vector<EntryRange> out = {R(9000, 9001)};
        QueryStats stats;
        EXPECT_THAT(dense.index->Query(box, limits, out, stats),
                    StatusIs(StatusCode::kResourceExhausted));
        EXPECT_THAT(out, ElementsAre(R(9000, 9001)));
        limits.max_groups_per_query = 5;
        limits.max_tiles_per_query = 9;
        EXPECT_THAT(dense.index->Query(box, limits, out, stats),
                    StatusIs(StatusCode::kResourceExhausted));
        limits.max_tiles_per_query = 10;
        EXPECT_THAT(dense.index->Query(box, limits, out, stats), IsOk());  // exactly at budget
        EXPECT_EQ(stats.row_path, 3u);
    }
    {
        // The N-D path is bounded too.
        const BuiltSource experts = DenseExperts();
        PlanningLimits limits;
        limits.max_groups_per_query = 4;
        std::vector<EntryRange> out;
        QueryStats stats;
        EXPECT_THAT(experts.index->Query(MakeBox({0, 0, 16}, {8, 64, 16}), limits, out, stats),
                    StatusIs(StatusCode::kResourceExhausted));
    }
}

// ---- lazily built secondary indexes ------------------------------------------------------------

TEST(TileIndexTest, SecondaryIndexesAreBuiltOnDemand) {
    const BuiltSource src = NearlyDense64();
    EXPECT_FALSE(src.index->dense());
    const std::size_t base = src.index->MemoryBytes();
    EXPECT_EQ(base, src.tile_coords.size() * sizeof(TileCoord) +
                        src.tile_ptr.size() * sizeof(std::uint64_t));
    QueryStats stats;
    QueryRanges(src, MakeBox({8, 16}, {8, 24}), stats);  // row path
    EXPECT_EQ(stats.row_path, 1u);
    const std::size_t with_rows = src.index->MemoryBytes();
    EXPECT_GT(with_rows, base);
    QueryRanges(src, MakeBox({0, 8}, {40, 8}), stats);  // column path
    EXPECT_EQ(stats.column_path, 1u);
    EXPECT_GT(src.index->MemoryBytes(), with_rows);
    EXPECT_EQ(src.index->rank(), 2u);
    EXPECT_EQ(src.index->num_tiles(), 63u);
    EXPECT_EQ(src.index->nnz(), 4032u);
    EXPECT_EQ(src.index->source_box(), MakeBox({0, 0}, {64, 64}));
    EXPECT_THAT(src.index->tile_shape(), ElementsAre(8, 8));
}

TEST(TileIndexTest, DenseIndexNeedsNoSecondaryIndex) {
    // Every tile present: positions follow from coordinates, so no query builds anything.
    const BuiltSource src = Dense64();
    EXPECT_TRUE(src.index->dense());
    const std::size_t base = src.index->MemoryBytes();
    QueryStats stats;
    for (const Box& box : {MakeBox({8, 16}, {8, 24}), MakeBox({0, 8}, {40, 8}),
                           MakeBox({3, 5}, {50, 41}), MakeBox({8, 0}, {48, 64})}) {
        ExpectMatchesBruteForce(src, box, QueryRanges(src, box, stats));
    }
    EXPECT_EQ(stats.column_path, 0u);
    EXPECT_EQ(src.index->MemoryBytes(), base);
    // A dense N-D index takes its offsets arithmetically too, with the same ranges.
    SourceSpec spec;
    spec.global_shape = {6, 20, 12};
    spec.tile_shape = {1, 8, 5};  // clipped edge tiles in dims 1 and 2
    const BuiltSource cube =
        ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0, 0}, {6, 20, 12}))));
    EXPECT_TRUE(cube.index->dense());
    for (const Box& box : {MakeBox({1, 3, 2}, {4, 15, 9}), MakeBox({0, 8, 0}, {6, 8, 12}),
                           MakeBox({2, 0, 5}, {3, 20, 5}), MakeBox({5, 19, 11}, {1, 1, 1})}) {
        ExpectMatchesBruteForce(cube, box, QueryRanges(cube, box, stats));
    }
}

TEST(TileIndexTest, WideSparseGridColumnIndex) {
    // A very wide, very sparse grid takes the sort-based column index build.
    SourceSpec spec;
    spec.global_shape = {64, 1 << 20};
    spec.tile_shape = {8, 16};
    std::mt19937_64 rng(5);
    std::vector<Index> coords = RandomCoords(rng, MakeBox({0, 0}, {64, 1 << 20}), 200);
    const std::vector<Index> near = RandomCoords(rng, MakeBox({0, 4090}, {64, 60}), 150);
    coords.insert(coords.end(), near.begin(), near.end());
    const BuiltSource src = ValueOrDie(BuildSource(spec, UniqueCoords(coords, 2)));
    const Box box = MakeBox({3, 1000}, {60, 200000});  // 8 tile rows, many columns: row path
    QueryStats stats;
    ExpectMatchesBruteForce(src, box, QueryRanges(src, box, stats));
    const Box tall = MakeBox({0, 4096}, {64, 40});  // 8 tile rows x 3 tile columns: columns
    QueryStats tall_stats;
    ExpectMatchesBruteForce(src, tall, QueryRanges(src, tall, tall_stats));
    EXPECT_EQ(tall_stats.column_path, 1u);
}

TEST(TileIndexTest, ConcurrentQueriesShareLazyIndexes) {
    SourceSpec spec;
    spec.global_shape = {256, 256};
    spec.tile_shape = {16, 16};
    std::mt19937_64 rng(9);
    const BuiltSource src =
        ValueOrDie(BuildSource(spec, RandomCoords(rng, MakeBox({0, 0}, {256, 256}), 4000)));
    const std::vector<Box> boxes = {MakeBox({0, 40}, {200, 20}), MakeBox({40, 0}, {20, 200}),
                                    MakeBox({17, 33}, {100, 90}), MakeBox({1, 1}, {255, 3})};
    std::vector<std::vector<EntryRange>> expected;
    for (const Box& b : boxes) {
        // Reference results from a fresh index each, so no lazy state is shared.
        BuiltSource fresh = ValueOrDie(BuildSource(spec, src.indices));
        QueryStats stats;
        expected.push_back(QueryRanges(fresh, b, stats));
    }
    std::atomic<int> mismatches{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < 20; ++i) {
                const std::size_t k = static_cast<std::size_t>(t + i) % boxes.size();
                std::vector<EntryRange> out;
                QueryStats stats;
                if (!src.index->Query(boxes[k], {}, out, stats).ok() || out != expected[k]) {
                    ++mismatches;
                }
            }
        });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0);
}

// ---- placement filtering and coverage (SelectSources) -----------------------------------------

SourceSpec Spec2D(std::string ref, std::string tensor, Shape shape, Shape tile) {
    SourceSpec spec;
    spec.source_ref = std::move(ref);
    spec.tensor_id = std::move(tensor);
    spec.global_shape = std::move(shape);
    spec.tile_shape = std::move(tile);
    return spec;
}

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

TEST(TileIndexTest, DescribesOnlyItsOwnDescriptor) {
    // What PlanBatch checks of every index it is handed (from the index's hot lines): nnz,
    // rank, num_tiles and the box, as TileIndex::Make validated them.
    const BuiltSource src = Dense64();
    EXPECT_TRUE(src.index->Describes(src.desc));
    SourceDescriptor other = src.desc;
    other.nnz += 1;
    EXPECT_FALSE(src.index->Describes(other));
    other = src.desc;
    other.num_tiles -= 1;
    EXPECT_FALSE(src.index->Describes(other));
    other = src.desc;
    other.box = MakeBox({0, 0}, {64, 63});
    EXPECT_FALSE(src.index->Describes(other));
    other = src.desc;
    other.box = MakeBox({1, 0}, {63, 64});
    EXPECT_FALSE(src.index->Describes(other));
    other = src.desc;
    other.global_shape = {64, 64, 1};
    other.box = MakeBox({0, 0, 0}, {64, 64, 1});
    EXPECT_FALSE(src.index->Describes(other));
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
