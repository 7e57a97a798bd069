// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// TileIndex (tile_index.h): queries on the 2-D row/column paths and the N-D path, boundary
// filter flags, whole and empty sources, planning budgets, and the lazily built secondary
// indexes.

#include "mooncake/sparse/tile_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::BruteForceScan;
using ::mooncake::sparse::testing::BuildSource;
using ::mooncake::sparse::testing::BuiltSource;
using ::mooncake::sparse::testing::Dense64;
using ::mooncake::sparse::testing::DenseCoords;
using ::mooncake::sparse::testing::ExpectWellFormedRanges;
using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::MakeBox;
using ::mooncake::sparse::testing::R;
using ::mooncake::sparse::testing::RandomCoords;
using ::mooncake::sparse::testing::SelectEntries;
using ::mooncake::sparse::testing::SourceSpec;
using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::ThreeColumns64;
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

}  // namespace
}  // namespace mooncake::sparse
