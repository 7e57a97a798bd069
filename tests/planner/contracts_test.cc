// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The address-free contracts (contracts.h): dtypes, apply modes, generations, source and target
// descriptors, tile index validation and regions. Bad input must come back as a typed error.

#include "mooncake/sparse/contracts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::Axes;
using ::mooncake::sparse::testing::BuildSource;
using ::mooncake::sparse::testing::BuiltSource;
using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::MakeBox;
using ::mooncake::sparse::testing::MakeTarget;
using ::mooncake::sparse::testing::Policy;
using ::mooncake::sparse::testing::SourceSpec;
using ::mooncake::sparse::testing::StatusIs;
using ::testing::HasSubstr;

constexpr Index kMax = std::numeric_limits<Index>::max();

TEST(DTypeTest, NamesRoundTrip) {
    for (int i = 0; i < kNumDTypes; ++i) {
        const auto t = static_cast<DType>(i);
        ASSERT_OK_AND_ASSIGN(DType parsed, ParseDType(DTypeName(t)));
        EXPECT_EQ(parsed, t) << DTypeName(t);
        EXPECT_GT(DTypeSize(t), 0u) << DTypeName(t);
    }
    EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
    EXPECT_EQ(DTypeSize(DType::kUInt64), 8u);
    EXPECT_EQ(DTypeSize(DType::kFloat8E4M3), 1u);
}

TEST(DTypeTest, Aliases) {
    EXPECT_THAT(ParseDType("bf16"), ::testing::AllOf(IsOk()));
    EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
    EXPECT_EQ(*ParseDType("fp16"), DType::kFloat16);
    EXPECT_EQ(*ParseDType("half"), DType::kFloat16);
    EXPECT_EQ(*ParseDType("fp32"), DType::kFloat32);
    EXPECT_EQ(*ParseDType("float"), DType::kFloat32);
}

TEST(DTypeTest, UnknownNamesAreErrors) {
    for (const char* bad : {"", "unknown", "BF16", "float128", "int128", " int32", "uint16 "}) {
        EXPECT_THAT(ParseDType(bad), StatusIs(StatusCode::kInvalidArgument)) << bad;
    }
    EXPECT_EQ(DTypeName(static_cast<DType>(200)), "unknown");
    EXPECT_EQ(DTypeSize(static_cast<DType>(200)), 0u);
}

TEST(DTypeTest, IndexAndFloatingPredicates) {
    EXPECT_TRUE(IsUnsignedIndexDType(DType::kUInt16));
    EXPECT_TRUE(IsUnsignedIndexDType(DType::kUInt32));
    EXPECT_TRUE(IsUnsignedIndexDType(DType::kUInt64));
    EXPECT_FALSE(IsUnsignedIndexDType(DType::kUInt8));
    EXPECT_FALSE(IsUnsignedIndexDType(DType::kInt64));
    EXPECT_FALSE(IsUnsignedIndexDType(DType::kFloat32));
    EXPECT_TRUE(IsFloatingDType(DType::kBFloat16));
    EXPECT_TRUE(IsFloatingDType(DType::kFloat8E5M2));
    EXPECT_FALSE(IsFloatingDType(DType::kInt8));
}

TEST(DTypeTest, NarrowestIndexDType) {
    EXPECT_EQ(NarrowestIndexDType(1), DType::kUInt16);
    EXPECT_EQ(NarrowestIndexDType(7168), DType::kUInt16);
    EXPECT_EQ(NarrowestIndexDType(65536), DType::kUInt16);  // coordinates < 65536
    EXPECT_EQ(NarrowestIndexDType(65537), DType::kUInt32);
    EXPECT_EQ(NarrowestIndexDType(Index{1} << 32), DType::kUInt32);
    EXPECT_EQ(NarrowestIndexDType((Index{1} << 32) + 1), DType::kUInt64);
    EXPECT_EQ(NarrowestIndexDType(kMax), DType::kUInt64);
}

TEST(ApplyModeTest, ParseAndName) {
    EXPECT_EQ(*ParseApplyMode("overwrite"), ApplyMode::kOverwrite);
    EXPECT_EQ(*ParseApplyMode("scatter_add"), ApplyMode::kScatterAdd);
    EXPECT_EQ(ApplyModeName(ApplyMode::kOverwrite), "overwrite");
    EXPECT_EQ(ApplyModeName(ApplyMode::kScatterAdd), "scatter_add");
    for (const char* bad : {"", "add", "Overwrite", "scatter-add", "sum"}) {
        EXPECT_THAT(ParseApplyMode(bad), StatusIs(StatusCode::kInvalidArgument)) << bad;
    }
}

TEST(GenerationTest, DeltaMustExceedBase) {
    ASSERT_OK_AND_ASSIGN(Generation g, Generation::Make(3, 4));
    EXPECT_EQ(g.base, 3u);
    EXPECT_EQ(g.delta, 4u);
    EXPECT_EQ(g.ToString(), "(3, 4)");
    EXPECT_THAT(Generation::Make(4, 4), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(Generation::Make(5, 4), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(Generation::Make(0, std::numeric_limits<std::uint64_t>::max()), IsOk());
    EXPECT_LT(Generation({0, 1}), Generation({0, 2}));
    EXPECT_LT(Generation({0, 5}), Generation({1, 2}));
}

/// A valid 2-D source descriptor to mutate.
SourceDescriptor ValidSource() {
    SourceDescriptor d;
    d.source_ref = "sparse/w/0-1";
    d.tensor_id = "layers.0.mlp.down_proj.weight";
    d.global_shape = {2048, 7168};
    d.box = MakeBox({0, 0}, {2048, 7168});
    d.generation = {0, 1};
    d.placement = Axes({{"ep", 0}});
    d.policy = Policy("replicate(ep)");
    d.tile_shape = {128, 128};
    d.nnz = 100;
    d.num_tiles = 10;
    d.apply = ApplyMode::kOverwrite;
    d.index_dtype = DType::kUInt16;
    d.value_dtype = DType::kBFloat16;
    return d;
}

TEST(SourceDescriptorTest, ValidSourceAndEntryBytes) {
    ASSERT_OK_AND_ASSIGN(SourceDescriptor d, SourceDescriptor::Make(ValidSource()));
    EXPECT_EQ(d.rank(), 2u);
    EXPECT_EQ(d.EntryBytes(), 6u);  // 2 x uint16 + bf16
    d.index_dtype = DType::kUInt64;
    d.value_dtype = DType::kFloat32;
    EXPECT_EQ(d.EntryBytes(), 20u);
}

TEST(SourceDescriptorTest, EmptyUpdateIsValid) {
    SourceDescriptor d = ValidSource();
    d.nnz = 0;
    d.num_tiles = 0;
    EXPECT_THAT(SourceDescriptor::Make(d), IsOk());
}

TEST(SourceDescriptorTest, RejectsBadIds) {
    SourceDescriptor d = ValidSource();
    d.source_ref = "";
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d = ValidSource();
    d.tensor_id = "";
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d = ValidSource();
    d.tensor_id = std::string("a\nb");
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d = ValidSource();
    d.source_ref = std::string(1025, 'k');
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SourceDescriptorTest, RejectsBadShapesAndBoxes) {
    SourceDescriptor d = ValidSource();
    d.global_shape = {2048, 0};
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d = ValidSource();
    d.global_shape = {kMax, 2};  // element count overflows
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d = ValidSource();
    d.box = MakeBox({0, 0}, {2048, 7169});  // outside the tensor
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d = ValidSource();
    d.box = MakeBox({0}, {2048});  // rank mismatch
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d = ValidSource();
    d.box = Box();  // never set
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SourceDescriptorTest, RejectsTilesLargerThanTheTensor) {
    // What a peer may send: a tile whose volume wraps to 0 in 64 bits must never reach a
    // divider.
    for (const Shape& tile : {Shape{Index{1} << 32, Index{1} << 32}, Shape{Index{1} << 62, 8},
                              Shape{4096, 128}}) {
        SourceDescriptor d = ValidSource();
        d.tile_shape = tile;
        EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    }
    EXPECT_EQ(ClampTileShape(Shape{Index{1} << 62, 8}, Shape{64, 64}), (Shape{64, 8}));
    EXPECT_EQ(ClampTileShape(Shape{0, 99}, Shape{64, 64}), (Shape{0, 64}));
    EXPECT_EQ(ClampTileShape(Shape{8}, Shape{64, 64}), (Shape{8}));
}

TEST(SourceDescriptorTest, RejectsDeltaNotAfterBase) {
    SourceDescriptor d = ValidSource();
    d.generation = {5, 5};
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d.generation = {6, 5};
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SourceDescriptorTest, RejectsInvalidTileShapes) {
    for (const Shape& tile : {Shape{}, Shape{128}, Shape{128, 0}, Shape{-1, 128},
                              Shape{128, 128, 1}}) {
        SourceDescriptor d = ValidSource();
        d.tile_shape = tile;
        EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    }
}

TEST(SourceDescriptorTest, RejectsOwnerPolicyWithoutAxis) {
    SourceDescriptor d = ValidSource();
    d.policy = Policy("owner(expert)");
    d.placement = Axes({{"ep", 3}});
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d.placement = Axes({{"ep", 3}, {"expert", 37}});
    EXPECT_THAT(SourceDescriptor::Make(d), IsOk());
}

TEST(SourceDescriptorTest, RejectsInvalidIndexDType) {
    for (DType t : {DType::kInt16, DType::kInt32, DType::kInt64, DType::kUInt8, DType::kFloat32,
                    DType::kBFloat16, DType::kBool}) {
        SourceDescriptor d = ValidSource();
        d.index_dtype = t;
        EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument))
            << DTypeName(t);
    }
    // Too narrow for the coordinates: extent 70000 needs uint32.
    SourceDescriptor d = ValidSource();
    d.global_shape = {70000, 16};
    d.box = MakeBox({0, 0}, {70000, 16});
    d.tile_shape = {128, 16};
    d.index_dtype = DType::kUInt16;
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d.index_dtype = DType::kUInt32;
    EXPECT_THAT(SourceDescriptor::Make(d), IsOk());
    d.index_dtype = DType::kUInt64;  // wider than needed is allowed
    EXPECT_THAT(SourceDescriptor::Make(d), IsOk());
}

TEST(SourceDescriptorTest, RejectsMoreTilesThanEntries) {
    SourceDescriptor d = ValidSource();
    d.nnz = 3;
    d.num_tiles = 4;
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SourceDescriptorTest, HugeExtentsValidateWithoutOverflow) {
    // Regression (UBSan): ValidateTileShape computed (extent + tile - 1) / tile.
    SourceDescriptor d = ValidSource();
    d.global_shape = {kMax, 1};
    d.box = MakeBox({0, 0}, {kMax, 1});
    d.index_dtype = DType::kUInt64;
    d.tile_shape = {2, 1};  // 2^62 tiles in dim 0
    EXPECT_THAT(SourceDescriptor::Make(d), StatusIs(StatusCode::kInvalidArgument));
    d.tile_shape = {Index{1} << 40, 1};
    EXPECT_THAT(SourceDescriptor::Make(d), IsOk());
}

TEST(TargetDescriptorTest, MakeValid) {
    ASSERT_OK_AND_ASSIGN(TargetDescriptor t,
                         TargetDescriptor::Make("node0/rank3", "node0", "w", Axes({{"ep", 1}}),
                                                {1024, 0}, {1024, 7168}));
    EXPECT_EQ(t.target_id, "node0/rank3");
    EXPECT_EQ(t.node_id, "node0");
    EXPECT_EQ(t.tensor_id, "w");
    EXPECT_EQ(t.box, MakeBox({1024, 0}, {1024, 7168}));
}

TEST(TargetDescriptorTest, RejectsBadIdsAndBoxes) {
    auto make = [](std::string tid, std::string node, std::string tensor, Shape origin,
                   Shape shape) {
        return TargetDescriptor::Make(std::move(tid), std::move(node), std::move(tensor),
                                      NamedAxes(), std::move(origin), std::move(shape));
    };
    EXPECT_THAT(make("", "n", "w", {0}, {4}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "", "w", {0}, {4}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "n", "", {0}, {4}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t\x01", "n", "w", {0}, {4}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "n", "w", {0, 0}, {0, 4}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "n", "w", {0, 0}, {-4, 4}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "n", "w", {-1, 0}, {4, 4}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "n", "w", {0}, {4, 4}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "n", "w", {}, {}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "n", "w", {0, 0}, {kMax, 2}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(make("t", "n", "w", {2}, {kMax - 1}),  // end overflows
                StatusIs(StatusCode::kInvalidArgument));
    auto err = make("rank7", "n", "w", {0, 0}, {0, 4});
    EXPECT_THAT(err.status().message(), HasSubstr("rank7"));
}

// ---- tile index validation -------------------------------------------------------------------

/// A 2-D 16x16 source with 4x4 tiles and `nnz` entries.
SourceDescriptor Small2D(std::uint64_t nnz, std::uint64_t num_tiles) {
    SourceDescriptor d;
    d.source_ref = "s";
    d.tensor_id = "w";
    d.global_shape = {16, 16};
    d.box = MakeBox({0, 0}, {16, 16});
    d.generation = {0, 1};
    d.tile_shape = {4, 4};
    d.nnz = nnz;
    d.num_tiles = num_tiles;
    return testing::ValueOrDie(SourceDescriptor::Make(d));
}

TEST(TileIndexValidationTest, AcceptsValidIndex) {
    const SourceDescriptor src = Small2D(6, 3);
    const std::vector<TileCoord> coords = {0, 0, 0, 3, 2, 1};
    const std::vector<std::uint64_t> ptr = {0, 1, 4, 6};
    EXPECT_THAT(ValidateTileIndex({2, coords, ptr}, src), IsOk());
    EXPECT_THAT(TileIndex::Make(src, coords, ptr), IsOk());
}

TEST(TileIndexValidationTest, AcceptsEmptyIndexForEmptyUpdate) {
    const SourceDescriptor src = Small2D(0, 0);
    ASSERT_OK_AND_ASSIGN(TileIndex index, TileIndex::Make(src, {}, {0}));
    EXPECT_EQ(index.num_tiles(), 0u);
    EXPECT_EQ(index.nnz(), 0u);
}

TEST(TileIndexValidationTest, RejectsNonMonotonicTilePtr) {
    const SourceDescriptor src = Small2D(6, 3);
    const std::vector<TileCoord> coords = {0, 0, 0, 3, 2, 1};
    // Decreasing.
    EXPECT_THAT(TileIndex::Make(src, coords, {0, 4, 1, 6}), StatusIs(StatusCode::kInvalidArgument));
    // A listed tile with no entries (not strictly increasing).
    EXPECT_THAT(TileIndex::Make(src, coords, {0, 1, 1, 6}), StatusIs(StatusCode::kInvalidArgument));
}

TEST(TileIndexValidationTest, RejectsBadTilePtrEnds) {
    const SourceDescriptor src = Small2D(6, 3);
    const std::vector<TileCoord> coords = {0, 0, 0, 3, 2, 1};
    EXPECT_THAT(TileIndex::Make(src, coords, {1, 2, 4, 6}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(TileIndex::Make(src, coords, {0, 1, 4, 5}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(TileIndex::Make(src, coords, {0, 1, 4, 7}), StatusIs(StatusCode::kInvalidArgument));
    // tile_ptr needs num_tiles + 1 values: empty, or one too few / too many for the coordinates.
    EXPECT_THAT(TileIndex::Make(src, coords, {}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(TileIndex::Make(src, coords, {0, 1, 6}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(TileIndex::Make(src, coords, {0, 1, 2, 4, 6}),
                StatusIs(StatusCode::kInvalidArgument));
    // tile_coords not a multiple of the rank.
    EXPECT_THAT(TileIndex::Make(src, {0, 0, 0, 3, 2}, {0, 1, 4, 6}),
                StatusIs(StatusCode::kInvalidArgument));
    // An empty index for a non-empty source.
    EXPECT_THAT(TileIndex::Make(src, {}, {0}), StatusIs(StatusCode::kInvalidArgument));
}

TEST(TileIndexValidationTest, RejectsTilesOutsideShapeOrSourceBox) {
    const SourceDescriptor src = Small2D(6, 3);
    // 16 / 4 = 4 tiles per dimension: coordinate 4 lies outside the tensor.
    EXPECT_THAT(TileIndex::Make(src, {0, 0, 0, 3, 4, 1}, {0, 1, 4, 6}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(TileIndex::Make(src, {0, 0, 0, 4, 2, 1}, {0, 1, 4, 6}),
                StatusIs(StatusCode::kInvalidArgument));
    // A partial source box (rows 8..15): tile row 0 lies outside it.
    SourceDescriptor half = src;
    half.box = MakeBox({8, 0}, {8, 16});
    half = testing::ValueOrDie(SourceDescriptor::Make(half));
    EXPECT_THAT(TileIndex::Make(half, {0, 0, 2, 3, 3, 1}, {0, 1, 4, 6}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(TileIndex::Make(half, {2, 0, 2, 3, 3, 1}, {0, 1, 4, 6}), IsOk());
}

TEST(TileIndexValidationTest, RejectsUnsortedOrDuplicateTiles) {
    const SourceDescriptor src = Small2D(6, 3);
    EXPECT_THAT(TileIndex::Make(src, {0, 3, 0, 0, 2, 1}, {0, 1, 4, 6}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(TileIndex::Make(src, {2, 1, 0, 0, 0, 3}, {0, 1, 4, 6}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(TileIndex::Make(src, {0, 3, 0, 3, 2, 1}, {0, 1, 4, 6}),
                StatusIs(StatusCode::kInvalidArgument));
}

TEST(TileIndexValidationTest, RejectsRankMismatch) {
    const SourceDescriptor src = Small2D(6, 3);
    const std::vector<TileCoord> coords = {0, 0, 0, 3, 2, 1};
    const std::vector<std::uint64_t> ptr = {0, 1, 4, 6};
    EXPECT_THAT(ValidateTileIndex({3, coords, ptr}, src), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateTileIndex({1, coords, ptr}, src), StatusIs(StatusCode::kInvalidArgument));
}

TEST(TileIndexValidationTest, RejectsTileCountDifferentFromDescriptor) {
    // The descriptor (the manifest) and the fetched index must agree on num_tiles: an index of
    // another commit, or a truncated one, is refused before any query trusts it.
    const std::vector<TileCoord> coords = {0, 0, 0, 3, 2, 1};
    const std::vector<std::uint64_t> ptr = {0, 1, 4, 6};
    for (std::uint64_t described : {2u, 4u, 6u}) {
        auto r = TileIndex::Make(Small2D(6, described), coords, ptr);
        EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument)) << described;
        EXPECT_THAT(r.status().message(), HasSubstr("num_tiles")) << described;
        EXPECT_THAT(r.status().message(), HasSubstr("tile index of s")) << described;
    }
    EXPECT_THAT(TileIndex::Make(Small2D(6, 3), coords, ptr), IsOk());
    // An empty update: no tiles on either side.
    EXPECT_THAT(TileIndex::Make(Small2D(0, 0), {}, {0}), IsOk());
}

TEST(TileIndexValidationTest, ErrorNamesTheSource) {
    const SourceDescriptor src = Small2D(6, 3);
    auto r = TileIndex::Make(src, {0, 0, 0, 3, 2, 1}, {0, 1, 4, 5});
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(), HasSubstr("tile index of s"));
}

TEST(TileIndexViewTest, TileAccess) {
    const std::vector<TileCoord> coords = {0, 0, 0, 3, 2, 1};
    const std::vector<std::uint64_t> ptr = {0, 1, 4, 6};
    TileIndexView v{2, coords, ptr};
    EXPECT_EQ(v.num_tiles(), 3u);
    EXPECT_THAT(v.tile(1), ::testing::ElementsAre(0u, 3u));
    EXPECT_THAT(v.tile(2), ::testing::ElementsAre(2u, 1u));
    EXPECT_EQ(TileIndexView{}.num_tiles(), 0u);
}

// ---- regions -----------------------------------------------------------------------------------

class RegionTest : public ::testing::Test {
protected:
    void SetUp() override {
        SourceDescriptor d = Small2D(10, 2);
        d.box = MakeBox({0, 0}, {8, 16});
        d.generation = {3, 4};
        d.apply = ApplyMode::kScatterAdd;
        manifest_.push_back(testing::ValueOrDie(SourceDescriptor::Make(d)));
        targets_.push_back(MakeTarget("t0", "n0", "w", NamedAxes(), {4, 0}, {8, 8}));
    }
    std::vector<SourceDescriptor> manifest_;
    std::vector<TargetDescriptor> targets_;
};

TEST_F(RegionTest, MakeValid) {
    const std::vector<SourceMatch> matches = {{0, 0}};
    ASSERT_OK_AND_ASSIGN(Region r, Region::Make(manifest_, targets_, matches, 0, {2, 7, true}));
    EXPECT_EQ(r.start, 2u);
    EXPECT_EQ(r.end(), 7u);
    EXPECT_EQ(r.size(), 5u);
    EXPECT_EQ(r.range(), (EntryRange{2, 7, true}));
    EXPECT_EQ(r.range().size(), 5u);
    EXPECT_TRUE(r.exact_coordinate_filter());
    EXPECT_EQ(r.read_index(), 0u);  // assigned by the planner's dedup
    // What the region names, through its match: source_ref, generation, apply, target and the
    // overlap of the two boxes.
    const SourceMatch& m = matches[0];
    EXPECT_EQ(manifest_[m.source_index].source_ref, "s");
    EXPECT_EQ(manifest_[m.source_index].generation, (Generation{3, 4}));
    EXPECT_EQ(manifest_[m.source_index].apply, ApplyMode::kScatterAdd);
    EXPECT_EQ(targets_[m.target_index].target_id, "t0");
    EXPECT_EQ(m.Overlap(manifest_, targets_), MakeBox({4, 0}, {4, 8}));
}

TEST_F(RegionTest, ReadIndexAndFlagShareOneWord) {
    Region r;
    EXPECT_EQ(sizeof(Region), 16u);
    r.set_exact_coordinate_filter(true);
    r.set_read_index(Region::kMaxReadIndex);
    EXPECT_EQ(r.read_index(), Region::kMaxReadIndex);
    EXPECT_TRUE(r.exact_coordinate_filter());
    r.set_exact_coordinate_filter(false);
    EXPECT_EQ(r.read_index(), Region::kMaxReadIndex);
    EXPECT_FALSE(r.exact_coordinate_filter());
    r.set_read_index(5);
    r.set_exact_coordinate_filter(true);
    EXPECT_EQ(r.read_index(), 5u);
    EXPECT_TRUE(r.exact_coordinate_filter());
}

TEST_F(RegionTest, MakeErrors) {
    const std::vector<SourceMatch> matches = {{0, 0}, {1, 0}, {0, 1}};
    EXPECT_THAT(Region::Make(manifest_, targets_, matches, 3, {0, 1}),
                StatusIs(StatusCode::kInvalidArgument));  // match index
    EXPECT_THAT(Region::Make(manifest_, targets_, matches, 1, {0, 1}),
                StatusIs(StatusCode::kInvalidArgument));  // source index
    EXPECT_THAT(Region::Make(manifest_, targets_, matches, 2, {0, 1}),
                StatusIs(StatusCode::kInvalidArgument));  // target index
    EXPECT_THAT(Region::Make(manifest_, targets_, matches, 0, {3, 3}),
                StatusIs(StatusCode::kInvalidArgument));  // empty range
    EXPECT_THAT(Region::Make(manifest_, targets_, matches, 0, {4, 3}),
                StatusIs(StatusCode::kInvalidArgument));  // inverted range
    EXPECT_THAT(Region::Make(manifest_, targets_, matches, 0, {0, 11}),
                StatusIs(StatusCode::kInvalidArgument));  // past nnz
    // The source and target boxes must overlap: disjoint, or of different rank.
    std::vector<TargetDescriptor> far = {MakeTarget("t1", "n0", "w", NamedAxes(), {8, 0}, {8, 8})};
    EXPECT_THAT(Region::Make(manifest_, far, matches, 0, {0, 10}),
                StatusIs(StatusCode::kInvalidArgument));
    std::vector<TargetDescriptor> flat = {MakeTarget("t1", "n0", "w", NamedAxes(), {4}, {4})};
    EXPECT_THAT(Region::Make(manifest_, flat, matches, 0, {0, 10}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(Region::Make(manifest_, targets_, matches, 0, {0, 10}), IsOk());
    // Longer than one region holds (a source of 2^32 entries or more).
    SourceDescriptor huge = manifest_[0];
    huge.nnz = std::uint64_t{1} << 33;
    const std::vector<SourceDescriptor> big = {huge};
    EXPECT_THAT(Region::Make(big, targets_, matches, 0, {0, Region::kMaxLength}), IsOk());
    EXPECT_THAT(Region::Make(big, targets_, matches, 0, {0, Region::kMaxLength + 1}),
                StatusIs(StatusCode::kInvalidArgument));
}

TEST(SourceMatchTest, OverlapOfUnrelatedIndexesIsEmpty) {
    const std::vector<SourceDescriptor> none;
    const std::vector<TargetDescriptor> targets;
    EXPECT_EQ(SourceMatch{}.Overlap(none, targets).rank(), 0u);
}

TEST(UniqueReadTest, Size) {
    UniqueRead r{10, 25};
    EXPECT_EQ(r.size(), 15u);
    EXPECT_EQ(sizeof(UniqueRead), 16u);
    ReadGroup g{3, 1, 4, 9};
    EXPECT_EQ(g.size(), 5u);
}

TEST(BuildSourceHelperTest, SortsByTileThenElement) {
    // The helper itself: entries grouped by row-major tile, row-major inside a tile.
    SourceSpec spec;
    spec.global_shape = {4, 4};
    spec.tile_shape = {2, 2};
    // (3,3) (0,2) (1,0) (0,0) (2,1) (0,1) (1,3)
    ASSERT_OK_AND_ASSIGN(BuiltSource s,
                         BuildSource(spec, {3, 3, 0, 2, 1, 0, 0, 0, 2, 1, 0, 1, 1, 3}));
    EXPECT_THAT(s.indices,
                ::testing::ElementsAre(0, 0, 0, 1, 1, 0, /*tile (0,1)*/ 0, 2, 1, 3,
                                       /*tile (1,0)*/ 2, 1, /*tile (1,1)*/ 3, 3));
    EXPECT_THAT(s.tile_coords, ::testing::ElementsAre(0u, 0u, 0u, 1u, 1u, 0u, 1u, 1u));
    EXPECT_THAT(s.tile_ptr, ::testing::ElementsAre(0u, 3u, 5u, 6u, 7u));
    EXPECT_EQ(s.desc.num_tiles, 4u);
    EXPECT_EQ(s.desc.nnz, 7u);
    EXPECT_EQ(s.index->num_tiles(), 4u);
}

}  // namespace
}  // namespace mooncake::sparse
