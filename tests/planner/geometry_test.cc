// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Boxes, intersection, tile bounds, tile element boxes and rebasing (geometry.h).

#include "mooncake/sparse/geometry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::MakeBox;
using ::mooncake::sparse::testing::StatusIs;
using ::testing::ElementsAre;

constexpr Index kMax = std::numeric_limits<Index>::max();

TEST(GeometryTest, BoxIsTriviallyCopyable) {
    // Plans hold one Box per region; it must never allocate.
    static_assert(std::is_trivially_copyable_v<Box>);
    SUCCEED();
}

TEST(GeometryTest, ValidateShapeAcceptsPositiveExtents) {
    EXPECT_THAT(ValidateShape(Shape{1}), IsOk());
    EXPECT_THAT(ValidateShape(Shape{2048, 7168}), IsOk());
    EXPECT_THAT(ValidateShape(Shape(kMaxRank, 2)), IsOk());
    EXPECT_THAT(ValidateShape(Shape{kMax, 1}), IsOk());
}

TEST(GeometryTest, ValidateShapeRejectsBadShapes) {
    EXPECT_THAT(ValidateShape(Shape{}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateShape(Shape(kMaxRank + 1, 2)), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateShape(Shape{4, 0}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateShape(Shape{-1, 4}), StatusIs(StatusCode::kInvalidArgument));
    // The element count overflows int64.
    EXPECT_THAT(ValidateShape(Shape{kMax, 2}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateShape(Shape{Index{1} << 32, Index{1} << 32}),
                StatusIs(StatusCode::kInvalidArgument));
}

TEST(GeometryTest, BoxMakeAndAccessors) {
    Box b = MakeBox({2, 3}, {4, 5});
    EXPECT_EQ(b.rank(), 2u);
    EXPECT_EQ(b.begin(0), 2);
    EXPECT_EQ(b.end(0), 6);
    EXPECT_EQ(b.begin(1), 3);
    EXPECT_EQ(b.end(1), 8);
    EXPECT_THAT(b.origin(), ElementsAre(2, 3));
    EXPECT_THAT(b.shape(), ElementsAre(4, 5));
    EXPECT_EQ(b.NumElements(), 20);
    EXPECT_EQ(b.ToString(), "[2:6, 3:8]");
    EXPECT_EQ(b, MakeBox({2, 3}, {4, 5}));
    EXPECT_FALSE(b == MakeBox({2, 3}, {4, 6}));
    EXPECT_FALSE(b == MakeBox({2}, {4}));
}

TEST(GeometryTest, BoxMakeRejectsEmptyInvertedNegativeAndOverflow) {
    EXPECT_THAT(Box::Make({0, 0}, {0, 4}), StatusIs(StatusCode::kInvalidArgument));   // empty
    EXPECT_THAT(Box::Make({0, 0}, {-3, 4}), StatusIs(StatusCode::kInvalidArgument));  // inverted
    EXPECT_THAT(Box::Make({-1, 0}, {2, 4}), StatusIs(StatusCode::kInvalidArgument));  // negative
    EXPECT_THAT(Box::Make({0}, {2, 4}), StatusIs(StatusCode::kInvalidArgument));      // rank
    EXPECT_THAT(Box::Make(Shape{}, Shape{}), StatusIs(StatusCode::kInvalidArgument));  // rank 0
    EXPECT_THAT(Box::Make({1}, {kMax}), StatusIs(StatusCode::kInvalidArgument));      // end
    EXPECT_THAT(Box::Make({0, 0}, {kMax, 2}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(Box::Make({0}, {kMax}), IsOk());
    EXPECT_THAT(Box::Make(Shape(kMaxRank + 1, 0), Shape(kMaxRank + 1, 1)),
                StatusIs(StatusCode::kInvalidArgument));
}

TEST(GeometryTest, BoxWhole) {
    const Shape shape{8, 16, 4};
    ASSERT_OK_AND_ASSIGN(Box b, Box::Whole(shape));
    EXPECT_THAT(b.origin(), ElementsAre(0, 0, 0));
    EXPECT_THAT(b.shape(), ElementsAre(8, 16, 4));
    EXPECT_THAT(Box::Whole(Shape{}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(Box::Whole(Shape(kMaxRank + 1, 1)), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(Box::Whole(Shape{3, 0}), StatusIs(StatusCode::kInvalidArgument));
}

TEST(GeometryTest, IntersectOverlapping) {
    auto i = Intersect(MakeBox({0, 0}, {10, 10}), MakeBox({5, 8}, {10, 10}));
    ASSERT_TRUE(i.has_value());
    EXPECT_EQ(*i, MakeBox({5, 8}, {5, 2}));
}

TEST(GeometryTest, IntersectDisjointAndTouching) {
    // Half-open boxes that only touch share no element.
    EXPECT_FALSE(Intersect(MakeBox({0, 0}, {10, 10}), MakeBox({10, 0}, {5, 10})).has_value());
    EXPECT_FALSE(Intersect(MakeBox({0, 0}, {10, 10}), MakeBox({20, 20}, {1, 1})).has_value());
    EXPECT_FALSE(Intersect(MakeBox({0, 0}, {10, 10}), MakeBox({0}, {10})).has_value());
}

TEST(GeometryTest, IntersectIsSymmetricAndContained) {
    Box a = MakeBox({1, 2, 3}, {4, 5, 6});
    Box b = MakeBox({2, 0, 5}, {10, 4, 2});
    auto ab = Intersect(a, b);
    auto ba = Intersect(b, a);
    ASSERT_TRUE(ab && ba);
    EXPECT_EQ(*ab, *ba);
    EXPECT_TRUE(Contains(a, *ab));
    EXPECT_TRUE(Contains(b, *ab));
    EXPECT_EQ(*ab, MakeBox({2, 2, 5}, {3, 2, 2}));
}

TEST(GeometryTest, ContainsAndInsideShape) {
    Box outer = MakeBox({0, 0}, {10, 10});
    EXPECT_TRUE(Contains(outer, outer));
    EXPECT_TRUE(Contains(outer, MakeBox({9, 9}, {1, 1})));
    EXPECT_FALSE(Contains(outer, MakeBox({9, 9}, {2, 1})));
    EXPECT_FALSE(Contains(MakeBox({1, 1}, {9, 9}), outer));
    EXPECT_FALSE(Contains(outer, MakeBox({0}, {1})));

    EXPECT_TRUE(InsideShape(outer, Shape{10, 10}));
    EXPECT_FALSE(InsideShape(outer, Shape{10, 9}));
    EXPECT_FALSE(InsideShape(outer, Shape{10}));
}

TEST(GeometryTest, ContainsPointAnyIntegerType) {
    Box b = MakeBox({2, 3}, {2, 2});
    const std::array<std::uint16_t, 2> in{3, 4};
    const std::array<std::uint16_t, 2> out{4, 4};
    const std::array<Index, 2> edge{2, 3};
    EXPECT_TRUE(ContainsPoint(b, std::span<const std::uint16_t>(in)));
    EXPECT_FALSE(ContainsPoint(b, std::span<const std::uint16_t>(out)));
    EXPECT_TRUE(ContainsPoint(b, std::span<const Index>(edge)));
}

TEST(GeometryTest, ValidateTileShape) {
    EXPECT_THAT(ValidateTileShape(Shape{128, 128}, Shape{2048, 7168}), IsOk());
    EXPECT_THAT(ValidateTileShape(Shape{2048, 7168}, Shape{2048, 7168}), IsOk());  // one tile
    // A tile larger than the tensor: its volume could overflow (2^32 x 2^32 wraps to 0).
    EXPECT_THAT(ValidateTileShape(Shape{4096, 8192}, Shape{2048, 7168}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateTileShape(Shape{Index{1} << 32, Index{1} << 32}, Shape{64, 64}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateTileShape(Shape{Index{1} << 62, 8}, Shape{64, 64}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateTileShape(Shape{128}, Shape{2048, 7168}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateTileShape(Shape{0, 128}, Shape{2048, 7168}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateTileShape(Shape{-4, 128}, Shape{2048, 7168}),
                StatusIs(StatusCode::kInvalidArgument));
    // More than 2^32 - 1 tiles in one dimension.
    EXPECT_THAT(ValidateTileShape(Shape{1}, Shape{Index{1} << 33}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateTileShape(Shape{1}, Shape{(Index{1} << 32) - 1}), IsOk());
    EXPECT_THAT(ValidateTileShape(Shape{1}, Shape{Index{1} << 32}),
                StatusIs(StatusCode::kInvalidArgument));
}

TEST(GeometryTest, ValidateTileShapeNearInt64MaxDoesNotOverflow) {
    // Regression: the tile count was computed as (extent + tile - 1) / tile, a signed overflow
    // (UB, flagged by UBSan) for extents near INT64_MAX.
    EXPECT_THAT(ValidateTileShape(Shape{kMax, 1}, Shape{kMax, 1}), IsOk());
    EXPECT_THAT(ValidateTileShape(Shape{Index{1} << 62, 1}, Shape{kMax, 1}), IsOk());
    EXPECT_THAT(ValidateTileShape(Shape{2, 1}, Shape{kMax, 1}),
                StatusIs(StatusCode::kInvalidArgument));  // 2^62 tiles
    EXPECT_THAT(ValidateTileShape(Shape{5}, Shape{5}), IsOk());
    EXPECT_THAT(ValidateTileShape(Shape{kMax}, Shape{5}), StatusIs(StatusCode::kInvalidArgument));
}

TEST(GeometryTest, TileBoundsAligned) {
    const Shape tile{8, 16};
    EXPECT_EQ(TileBounds(MakeBox({0, 0}, {16, 32}), tile), MakeBox({0, 0}, {2, 2}));
    EXPECT_EQ(TileBounds(MakeBox({8, 16}, {8, 16}), tile), MakeBox({1, 1}, {1, 1}));
}

TEST(GeometryTest, TileBoundsUnaligned) {
    const Shape tile{8, 16};
    // Rows 7..9 touch tiles 0 and 1; columns 15..16 touch tiles 0 and 1.
    EXPECT_EQ(TileBounds(MakeBox({7, 15}, {3, 2}), tile), MakeBox({0, 0}, {2, 2}));
    // A single element.
    EXPECT_EQ(TileBounds(MakeBox({17, 33}, {1, 1}), tile), MakeBox({2, 2}, {1, 1}));
}

TEST(GeometryTest, TileElementBoxClipsToShape) {
    const Shape tile{8, 16};
    const Shape shape{20, 40};
    const std::array<TileCoord, 2> inner{1, 1};
    const std::array<TileCoord, 2> edge{2, 2};
    EXPECT_EQ(TileElementBox(std::span<const TileCoord>(inner), tile, shape),
              MakeBox({8, 16}, {8, 16}));
    EXPECT_EQ(TileElementBox(std::span<const TileCoord>(edge), tile, shape),
              MakeBox({16, 32}, {4, 8}));
}

TEST(GeometryTest, TileInside) {
    const Shape tile{8, 16};
    const Shape shape{20, 40};
    const std::array<TileCoord, 2> t11{1, 1};
    const std::array<TileCoord, 2> t22{2, 2};
    const std::span<const TileCoord> s11(t11), s22(t22);
    EXPECT_TRUE(TileInside(s11, tile, shape, MakeBox({8, 16}, {8, 16})));
    EXPECT_FALSE(TileInside(s11, tile, shape, MakeBox({9, 16}, {7, 16})));
    // The edge tile is clipped to the tensor, so a box ending at the tensor edge holds it.
    EXPECT_TRUE(TileInside(s22, tile, shape, MakeBox({16, 32}, {4, 8})));
    EXPECT_FALSE(TileInside(s22, tile, shape, MakeBox({16, 32}, {4, 7})));
}

TEST(GeometryTest, TileHelpersNearInt64MaxDoNotOverflow) {
    // A tile's end used to be computed as lo + tile (signed overflow near INT64_MAX).
    const Shape tile{Index{1} << 62};
    const Shape shape{kMax};
    const std::array<TileCoord, 1> t1{1};
    Box b = TileElementBox(std::span<const TileCoord>(t1), tile, shape);
    EXPECT_EQ(b.begin(0), Index{1} << 62);
    EXPECT_EQ(b.end(0), kMax);
    EXPECT_TRUE(TileInside(std::span<const TileCoord>(t1), tile, shape,
                           MakeBox({Index{1} << 62}, {kMax - (Index{1} << 62)})));
    EXPECT_FALSE(TileInside(std::span<const TileCoord>(t1), tile, shape,
                            MakeBox({(Index{1} << 62) + 1}, {5})));
}

TEST(GeometryTest, RebaseInPlace) {
    const Shape origin{1024, 16};
    std::array<std::uint16_t, 2> p16{1030, 20};
    RebaseInPlace(std::span<std::uint16_t>(p16), origin);
    EXPECT_THAT(p16, ElementsAre(6, 4));

    std::array<Index, 3> p64{5, 6, 7};
    const Shape origin3{5, 0, 7};
    RebaseInPlace(std::span<Index>(p64), origin3);
    EXPECT_THAT(p64, ElementsAre(0, 6, 0));

    std::array<std::uint32_t, 1> p32{4000000000u};
    const Shape origin1{3999999999};
    RebaseInPlace(std::span<std::uint32_t>(p32), origin1);
    EXPECT_THAT(p32, ElementsAre(1u));
}

TEST(GeometryTest, RebaseMapsOverlapToLocalBox) {
    // Every point of an overlap, rebased to the target origin, lies in [0, local_shape).
    Box target = MakeBox({4, 8}, {6, 5});
    Box overlap = MakeBox({5, 8}, {3, 5});
    Box local = MakeBox({0, 0}, {6, 5});
    for (Index r = overlap.begin(0); r < overlap.end(0); ++r) {
        for (Index c = overlap.begin(1); c < overlap.end(1); ++c) {
            std::array<Index, 2> p{r, c};
            RebaseInPlace(std::span<Index>(p), target.origin());
            EXPECT_TRUE(ContainsPoint(local, std::span<const Index>(p)));
            EXPECT_EQ(p[0], r - 4);
            EXPECT_EQ(p[1], c - 8);
        }
    }
}

}  // namespace
}  // namespace mooncake::sparse
