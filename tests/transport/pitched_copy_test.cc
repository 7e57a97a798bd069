// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The plan of 2-D copies into strided CUDA views, run on host memory: what the copy engine
// would write must be exactly what StridedCopy writes, and nothing outside the view.
#include "transport/pitched_copy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "transport/host_copy.h"

namespace mooncake::sparse {
namespace {

using ::testing::HasSubstr;

std::vector<std::int64_t> CStrides(const std::vector<std::int64_t>& shape) {
    std::vector<std::int64_t> s(shape.size());
    std::int64_t n = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
        s[d] = n;
        n *= shape[d];
    }
    return s;
}

/// A view of a parent buffer: shape, strides and the element offset of [0, ..., 0].
struct View {
    std::vector<std::int64_t> shape;
    std::vector<std::int64_t> strides;
    std::int64_t origin = 0;
};

/// Copies a C-contiguous source into `view` of a parent of `parent_elems` 2-byte elements both
/// through the plan and through StridedCopy; the parents must come out identical.
void ExpectPlanMatchesStridedCopy(const View& view, std::int64_t parent_elems) {
    constexpr std::size_t kItem = 2;
    std::int64_t n = 1;
    for (std::int64_t e : view.shape) n *= e;
    std::vector<std::uint16_t> src(static_cast<std::size_t>(n));
    std::iota(src.begin(), src.end(), std::uint16_t{1});
    std::vector<std::uint16_t> expect(static_cast<std::size_t>(parent_elems), 0xdead);
    std::vector<std::uint16_t> got = expect;
    StridedCopy(reinterpret_cast<std::byte*>(expect.data() + view.origin), view.strides,
                reinterpret_cast<const std::byte*>(src.data()), {}, view.shape, kItem);
    auto plan = PlanPitchedCopies(view.shape, view.strides, kItem);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    std::vector<std::byte> staging;
    const std::byte* from = reinterpret_cast<const std::byte*>(src.data());
    if (plan->gather) {
        staging.resize(static_cast<std::size_t>(n) * kItem);
        StridedCopy(staging.data(), {}, from + plan->gather_src_offset, plan->gather_strides,
                    plan->gather_shape, kItem);
        from = staging.data();
    }
    RunPitchedCopiesOnHost(*plan, reinterpret_cast<std::byte*>(got.data() + view.origin), from);
    EXPECT_EQ(got, expect);
}

TEST(PitchedCopyTest, ContiguousIsOneFlatCopy) {
    auto plan = PlanPitchedCopies(std::vector<std::int64_t>{4, 6}, {}, 2);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_FALSE(plan->gather);
    EXPECT_EQ(plan->copies[0], (PitchedCopy{0, 0, 48, 1, 0, 0}));
}

TEST(PitchedCopyTest, TpSliceOfColumnsIsOne2DCopyWithThePitch) {
    // w[:, 1024:2048] of a [4096, 4096] bf16 parameter.
    const std::vector<std::int64_t> shape{4096, 1024}, strides{4096, 1};
    auto plan = PlanPitchedCopies(shape, strides, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_FALSE(plan->gather);
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_EQ(plan->copies[0], (PitchedCopy{0, 0, 2048, 4096, 8192, 2048}));
}

TEST(PitchedCopyTest, EveryOtherRowIsOne2DCopy) {
    const std::vector<std::int64_t> shape{8, 16}, strides{32, 1};  // w[::2] of [16, 16]
    auto plan = PlanPitchedCopies(shape, strides, 4);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_EQ(plan->copies[0], (PitchedCopy{0, 0, 64, 8, 128, 64}));
}

TEST(PitchedCopyTest, ExpertSliceOfFusedTensorMergesIntoOneCopy) {
    // w[:, :, 256:512] of [8, 64, 1024]: the expert and row dims merge into 512 rows.
    const std::vector<std::int64_t> shape{8, 64, 256}, strides{64 * 1024, 1024, 1};
    auto plan = PlanPitchedCopies(shape, strides, 2);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_EQ(plan->copies[0], (PitchedCopy{0, 0, 512, 512, 2048, 512}));
}

TEST(PitchedCopyTest, TransposeGathersThenCopiesFlat) {
    // w.t() of a contiguous [6, 4]: shape [4, 6], strides [1, 4]; in memory order it is dense.
    const std::vector<std::int64_t> shape{4, 6}, strides{1, 4};
    auto plan = PlanPitchedCopies(shape, strides, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(plan->gather);
    EXPECT_EQ(plan->gather_shape, (std::vector<std::int64_t>{6, 4}));
    EXPECT_EQ(plan->gather_strides, (std::vector<std::int64_t>{1, 6}));
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_EQ(plan->copies[0].width, 48u);
    EXPECT_EQ(plan->copies[0].height, 1u);
    ExpectPlanMatchesStridedCopy({shape, strides, 0}, 24);
}

TEST(PitchedCopyTest, UniformInnerStrideMergesAcrossRows) {
    // w[:, ::2] of [3, 100]: every other element of the whole tensor, one copy of 150 rows.
    const std::vector<std::int64_t> shape{3, 50}, strides{100, 2};
    auto plan = PlanPitchedCopies(shape, strides, 2);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_EQ(plan->copies[0], (PitchedCopy{0, 0, 2, 150, 4, 2}));
    ExpectPlanMatchesStridedCopy({shape, strides, 0}, 300);
}

TEST(PitchedCopyTest, InnerStrideUsesTheLongerDimensionAsRows) {
    // w[:, :40:2] of [3, 100]: runs of one element; 20 columns beat 3 rows as the copy's rows.
    const std::vector<std::int64_t> shape{3, 20}, strides{100, 2};
    auto plan = PlanPitchedCopies(shape, strides, 2);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->copies.size(), 3u);
    EXPECT_EQ(plan->copies[1], (PitchedCopy{200, 40, 2, 20, 4, 2}));
    ExpectPlanMatchesStridedCopy({shape, strides, 0}, 300);
}

TEST(PitchedCopyTest, RejectsOverlapRankMismatchAndOverflow) {
    const std::vector<std::int64_t> shape{4, 4};
    auto overlap = PlanPitchedCopies(shape, std::vector<std::int64_t>{0, 1}, 2);
    ASSERT_FALSE(overlap.ok());
    EXPECT_EQ(overlap.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(overlap.status().message(), HasSubstr("overlapping"));
    EXPECT_FALSE(PlanPitchedCopies(shape, std::vector<std::int64_t>{1}, 2).ok());
    auto huge = PlanPitchedCopies(shape, std::vector<std::int64_t>{INT64_MAX / 2, 1}, 2);
    ASSERT_FALSE(huge.ok());
    EXPECT_THAT(huge.status().message(), HasSubstr("2^63"));
}

TEST(PitchedCopyTest, CopyBudgetFailsClosed) {
    // [200, 200, 4] with gaps after every run and every row: no dimension merges, so one copy
    // per 200-row block: 200 copies.
    const std::vector<std::int64_t> shape{200, 200, 4}, strides{200 * 4 * 8, 4 * 2, 1};
    auto small = PlanPitchedCopies(shape, strides, 2, /*max_copies=*/100);
    ASSERT_FALSE(small.ok());
    EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(small.status().message(), HasSubstr("more than 100"));
    auto plan = PlanPitchedCopies(shape, strides, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->copies.size(), 200u);
    ExpectPlanMatchesStridedCopy({shape, strides, 0}, 200 * 200 * 4 * 8);
}

TEST(PitchedCopyTest, EmptyTensorPlansNothing) {
    auto plan = PlanPitchedCopies(std::vector<std::int64_t>{0, 5}, std::vector<std::int64_t>{9, 1}, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(plan->copies.empty());
}

TEST(PitchedCopyTest, RandomViewsMatchStridedCopy) {
    // Random views of a random parent: slices with steps (of either sign), permutations.
    std::mt19937_64 rng(20260101);
    for (int trial = 0; trial < 400; ++trial) {
        const std::size_t rank = 1 + rng() % 4;
        std::vector<std::int64_t> parent(rank);
        for (auto& e : parent) e = 1 + std::int64_t(rng() % 6);
        const std::vector<std::int64_t> pstrides = CStrides(parent);
        std::int64_t parent_elems = 1;
        for (std::int64_t e : parent) parent_elems *= e;
        View v;
        for (std::size_t d = 0; d < rank; ++d) {
            const std::int64_t step = 1 + std::int64_t(rng() % 2);
            const std::int64_t start = std::int64_t(rng() % parent[d]);
            const std::int64_t room = parent[d] - start;
            std::int64_t extent = 1 + std::int64_t(rng() % ((room + step - 1) / step));
            const bool reverse = rng() % 4 == 0;
            if (reverse) {
                // Walk backwards from start + (extent - 1) * step.
                v.origin += (start + (extent - 1) * step) * pstrides[d];
                v.strides.push_back(-step * pstrides[d]);
            } else {
                v.origin += start * pstrides[d];
                v.strides.push_back(step * pstrides[d]);
            }
            v.shape.push_back(extent);
        }
        // A random permutation of the view's dimensions (a transpose).
        std::vector<std::size_t> perm(rank);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        View p{{}, {}, v.origin};
        for (std::size_t d : perm) {
            p.shape.push_back(v.shape[d]);
            p.strides.push_back(v.strides[d]);
        }
        SCOPED_TRACE(::testing::Message() << "trial " << trial);
        ExpectPlanMatchesStridedCopy(p, parent_elems);
    }
}

/// Copies the box [origin, origin + box) of a C-contiguous parent of `parent` into `view` of a
/// destination parent of `dst_elems` 2-byte elements, through PlanStridedCopies and through
/// StridedCopy; the destinations must come out identical.
void ExpectBoxPlanMatchesStridedCopy(const std::vector<std::int64_t>& parent,
                                     const std::vector<std::int64_t>& origin, const View& view,
                                     std::int64_t dst_elems) {
    constexpr std::size_t kItem = 2;
    std::int64_t n = 1;
    for (std::int64_t e : parent) n *= e;
    std::vector<std::uint16_t> src(static_cast<std::size_t>(n));
    std::iota(src.begin(), src.end(), std::uint16_t{1});
    const std::vector<std::int64_t> src_strides = CStrides(parent);
    std::int64_t at = 0;
    for (std::size_t d = 0; d < parent.size(); ++d) at += origin[d] * src_strides[d];
    const std::byte* box = reinterpret_cast<const std::byte*>(src.data() + at);
    std::vector<std::uint16_t> expect(static_cast<std::size_t>(dst_elems), 0xdead);
    std::vector<std::uint16_t> got = expect;
    StridedCopy(reinterpret_cast<std::byte*>(expect.data() + view.origin), view.strides, box,
                src_strides, view.shape, kItem);
    auto plan = PlanStridedCopies(view.shape, view.strides, src_strides, kItem);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    std::vector<std::byte> staging;
    const std::byte* from = box;
    if (plan->gather) {
        std::int64_t m = 1;
        for (std::int64_t e : view.shape) m *= e;
        staging.resize(static_cast<std::size_t>(m) * kItem);
        StridedCopy(staging.data(), {}, from + plan->gather_src_offset, plan->gather_strides,
                    plan->gather_shape, kItem);
        from = staging.data();
    } else {
        // Without a gather the copies read only the box's own elements.
        for (const PitchedCopy& c : plan->copies) {
            const std::uint64_t last = c.src_offset + (c.height - 1) * c.src_pitch + c.width;
            EXPECT_LE(std::int64_t(at * kItem + last), n * std::int64_t(kItem));
            EXPECT_GE(c.src_pitch, c.height > 1 ? c.width : 0);
        }
    }
    RunPitchedCopiesOnHost(*plan, reinterpret_cast<std::byte*>(got.data() + view.origin), from);
    EXPECT_EQ(got, expect);
}

TEST(PitchedCopyTest, ColumnBoxIntoContiguousIsOne2DCopy) {
    // [:, 256:512] of a [1024, 1024] float32 anchor into a contiguous [1024, 256] shard: rows of
    // the box are 1024 elements apart in the store, 256 in the shard.
    const std::vector<std::int64_t> shape{1024, 256}, src{1024, 1};
    auto plan = PlanStridedCopies(shape, {}, src, 4);
    ASSERT_TRUE(plan.ok());
    EXPECT_FALSE(plan->gather);
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_EQ(plan->copies[0], (PitchedCopy{0, 0, 1024, 1024, 1024, 4096}));
}

TEST(PitchedCopyTest, BoxMergesTheTrailingDimensionsItSpansFully) {
    // [2:6, 16:48, :] of [8, 64, 128]: the last dimension is whole, so a box row is 128 * 32
    // contiguous elements; the outer dimension gives the rows of one 2-D copy.
    const std::vector<std::int64_t> shape{4, 32, 128}, src{64 * 128, 128, 1};
    auto plan = PlanStridedCopies(shape, {}, src, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_FALSE(plan->gather);
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_EQ(plan->copies[0], (PitchedCopy{0, 0, 32 * 128 * 2, 4, 32 * 128 * 2, 64 * 128 * 2}));
}

TEST(PitchedCopyTest, BoxIntoAPitchedDestination) {
    // A [16, 8] box of a [32, 64] parent into columns [8:16] of a [16, 24] destination.
    const std::vector<std::int64_t> shape{16, 8}, dst{24, 1}, src{64, 1};
    auto plan = PlanStridedCopies(shape, dst, src, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_FALSE(plan->gather);
    ASSERT_EQ(plan->copies.size(), 1u);
    EXPECT_EQ(plan->copies[0], (PitchedCopy{0, 0, 16, 16, 48, 128}));
}

TEST(PitchedCopyTest, BoxIntoATransposedDestinationGathers) {
    const std::vector<std::int64_t> shape{4, 8}, dst{1, 4}, src{64, 1};
    auto plan = PlanStridedCopies(shape, dst, src, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(plan->gather);
    EXPECT_EQ(plan->gather_strides, (std::vector<std::int64_t>{1, 64}));
    ExpectBoxPlanMatchesStridedCopy({8, 64}, {2, 3}, View{shape, dst, 0}, 32);
}

TEST(PitchedCopyTest, SourceStridesOfAnotherRankAreRejected) {
    auto plan = PlanStridedCopies(std::vector<std::int64_t>{4, 8}, {},
                                  std::vector<std::int64_t>{64}, 2);
    EXPECT_FALSE(plan.ok());
    auto overflow = PlanStridedCopies(std::vector<std::int64_t>{4, 8}, {},
                                      std::vector<std::int64_t>{std::int64_t{1} << 62, 1}, 2);
    EXPECT_FALSE(overflow.ok());
}

TEST(PitchedCopyTest, RandomBoxesIntoRandomViewsMatchStridedCopy) {
    std::mt19937_64 rng(20260213);
    for (int trial = 0; trial < 400; ++trial) {
        const std::size_t rank = 1 + rng() % 4;
        std::vector<std::int64_t> parent(rank), origin(rank), box(rank);
        for (std::size_t d = 0; d < rank; ++d) {
            parent[d] = 1 + std::int64_t(rng() % 7);
            box[d] = 1 + std::int64_t(rng() % parent[d]);
            origin[d] = std::int64_t(rng() % (parent[d] - box[d] + 1));
        }
        // The destination: a box-shaped view of a larger buffer (padded rows, steps, reversed
        // or permuted dimensions), or contiguous.
        View v;
        std::int64_t dst_elems = 1;
        std::vector<std::int64_t> pad(rank);
        for (std::size_t d = 0; d < rank; ++d) {
            pad[d] = box[d] * (1 + std::int64_t(rng() % 2)) + std::int64_t(rng() % 2);
            dst_elems *= pad[d];
        }
        if (rng() % 4 == 0) {
            v.shape = box;
            v.strides = {};
        } else {
            const std::vector<std::int64_t> pstrides = CStrides(pad);
            std::vector<std::size_t> perm(rank);
            std::iota(perm.begin(), perm.end(), 0);
            if (rng() % 3 == 0) std::shuffle(perm.begin(), perm.end(), rng);
            // Dimension d of the box lies along dimension perm[d] of the padded buffer.
            std::vector<std::int64_t> strides(rank);
            for (std::size_t d = 0; d < rank; ++d) {
                const std::int64_t step = pad[perm[d]] >= 2 * box[d] && rng() % 2 ? 2 : 1;
                if (box[d] > pad[perm[d]]) {
                    strides.clear();
                    break;
                }
                strides[d] = step * pstrides[perm[d]];
                if (rng() % 5 == 0) {
                    v.origin += (box[d] - 1) * strides[d];
                    strides[d] = -strides[d];
                }
            }
            if (strides.empty()) {
                v.origin = 0;
                v.shape = box;
            } else {
                v.shape = box;
                v.strides = strides;
            }
        }
        SCOPED_TRACE(::testing::Message() << "trial " << trial);
        ExpectBoxPlanMatchesStridedCopy(parent, origin, v, dst_elems);
    }
}

TEST(PitchedCopyTest, ViewSpanCoversLowestToHighestElement) {
    const std::vector<std::int64_t> shape{4, 3};
    auto flat = StridedViewSpan(shape, {}, 2);
    ASSERT_TRUE(flat.ok());
    EXPECT_EQ(flat->first, 0);
    EXPECT_EQ(flat->bytes, 24u);
    // w[:, 2:5] of [4, 10]: rows 10 apart, 3 elements each.
    auto slice = StridedViewSpan(shape, std::vector<std::int64_t>{10, 1}, 2);
    ASSERT_TRUE(slice.ok());
    EXPECT_EQ(slice->first, 0);
    EXPECT_EQ(slice->bytes, (3 * 10 + 2 + 1) * 2u);
    // Rows walked backwards: the lowest element lies 30 elements below [0, 0].
    auto reversed = StridedViewSpan(shape, std::vector<std::int64_t>{-10, 1}, 2);
    ASSERT_TRUE(reversed.ok());
    EXPECT_EQ(reversed->first, -60);
    EXPECT_EQ(reversed->bytes, 66u);
    // Strides a peer could send to reach past 2^63 fail instead of wrapping.
    EXPECT_FALSE(StridedViewSpan(shape, std::vector<std::int64_t>{INT64_MAX / 3, 1}, 2).ok());
    EXPECT_FALSE(StridedViewSpan(shape, std::vector<std::int64_t>{INT64_MIN, 1}, 2).ok());
    EXPECT_FALSE(StridedViewSpan(shape, std::vector<std::int64_t>{1}, 2).ok());
}

}  // namespace
}  // namespace mooncake::sparse
