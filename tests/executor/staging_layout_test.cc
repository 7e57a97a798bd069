// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// LayOutStaging: a device read's range members laid out in host address order, in runs that
// one copy each moves (gaps of at most kMaxGap included), every member inside the layout at its
// host address modulo 16, no two runs overlapping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "executor/sparse_service.h"

namespace mooncake::sparse {
namespace {

using Range = PlannedRead::Range;

struct Arena {
    alignas(64) std::byte bytes[1 << 16];
};

std::span<const std::byte> At(const Arena& a, std::size_t offset, std::size_t size) {
    return {a.bytes + offset, size};
}

/// Where member m's bytes lie, relative to the layout: offset - host address.
std::intptr_t Shift(const StagingLayout& l, std::span<const std::byte> bytes, std::size_t m) {
    return static_cast<std::intptr_t>(l.at[m]) -
           static_cast<std::intptr_t>(reinterpret_cast<std::uintptr_t>(bytes.data()));
}

TEST(StagingLayoutTest, AnObjectsIndicesAndValuesAndItsNeighbourMoveAsOneRun) {
    static Arena a;
    // Object 0: indices [0, 4000), values [4096, 6096); object 1 right after: indices
    // [6144, 9144), values [9216, 10716). Ranges listed values-far-first to show the order
    // is the addresses', not the ranges'.
    const std::vector<Range> ranges = {
        {At(a, 6144, 3000), At(a, 9216, 1500), 1, true},
        {At(a, 0, 4000), At(a, 4096, 2000), 0, true},
    };
    const StagingLayout l = LayOutStaging(ranges);
    ASSERT_EQ(l.at.size(), 4u);
    const std::intptr_t shift = Shift(l, ranges[1].indices, 2);
    EXPECT_EQ(Shift(l, ranges[1].values, 3), shift);
    EXPECT_EQ(Shift(l, ranges[0].indices, 0), shift);
    EXPECT_EQ(Shift(l, ranges[0].values, 1), shift);
    EXPECT_EQ(l.at[2], 0u);  // the arena is 64-byte aligned: offset 0
    EXPECT_EQ(l.total, 10716u);
    // Different sources: no range follows another for a caller that merges within objects.
    EXPECT_EQ(l.follows, std::vector<bool>(4, false));
}

TEST(StagingLayoutTest, AGapPastTheLimitStartsARunAlignedAsItsAddress) {
    static Arena a;
    const std::size_t far = 100 + StagingLayout::kMaxGap + 1;
    const std::vector<Range> ranges = {
        {At(a, 3, 97), At(a, far + 5, 10), 0, true},
    };
    const StagingLayout l = LayOutStaging(ranges);
    EXPECT_EQ(l.at[0], 3u);
    EXPECT_EQ(l.at[1] % 16, (far + 5) % 16);
    EXPECT_GE(l.at[1], 100u);
    EXPECT_LT(l.at[1], 100u + 32);
    EXPECT_EQ(l.total, l.at[1] + 10);
}

TEST(StagingLayoutTest, RangesOfOneMemberFollowEachOtherWithinAGap) {
    static Arena a;
    // One source: indices ranges at [0, 100) and [200, 300) (a gap of 100), values at
    // [20000, 20050) and [20100, 20150); a third range far past the gap.
    const std::size_t far = 300 + StagingLayout::kMaxGap + 64;
    const std::vector<Range> ranges = {
        {At(a, 0, 100), At(a, 20000, 50), 7, true},
        {At(a, 200, 100), At(a, 20100, 50), 7, true},
        {At(a, far, 100), At(a, 20200, 50), 7, true},
    };
    const StagingLayout l = LayOutStaging(ranges);
    EXPECT_EQ(l.follows, (std::vector<bool>{false, false, true, true, false, true}));
    EXPECT_EQ(l.at[2] - l.at[0], 200u);
    EXPECT_EQ(l.at[3] - l.at[1], 100u);
}

TEST(StagingLayoutTest, OverlappingAndDuplicateRangesShareTheirBytes) {
    static Arena a;
    const std::vector<Range> ranges = {
        {At(a, 0, 400), At(a, 1000, 200), 0, true},
        {At(a, 200, 400), At(a, 1100, 200), 0, true},
        {At(a, 0, 400), At(a, 1000, 200), 0, true},
    };
    const StagingLayout l = LayOutStaging(ranges);
    const std::intptr_t shift = Shift(l, ranges[0].indices, 0);
    for (std::size_t m = 0; m < 6; ++m) {
        EXPECT_EQ(Shift(l, m % 2 ? ranges[m / 2].values : ranges[m / 2].indices, m), shift) << m;
    }
    EXPECT_EQ(l.total, 1300u);
    // Range 1 starts inside range 0: a copy cannot simply extend range 0's.
    EXPECT_FALSE(l.follows[2]);
}

TEST(StagingLayoutTest, EmptyMembersTakeNoRoomAndNothingOverlapsAcrossRuns) {
    static Arena a;
    std::mt19937 rng(7);
    std::vector<Range> ranges;
    for (int i = 0; i < 300; ++i) {
        const std::size_t off = rng() % 60000, size = rng() % 2 ? rng() % 3000 : 0;
        const std::size_t voff = rng() % 60000, vsize = rng() % 500;
        ranges.push_back({At(a, off, std::min(size, sizeof(a.bytes) - off)),
                          At(a, voff, std::min(vsize, sizeof(a.bytes) - voff)),
                          static_cast<std::uint32_t>(rng() % 5), true});
    }
    const StagingLayout l = LayOutStaging(ranges);
    // Every member inside the layout, at its address modulo 16; any two members either keep
    // their host distance (one run) or do not overlap in the layout.
    struct M {
        std::uintptr_t p;
        std::uint64_t at, size;
    };
    std::vector<M> ms;
    for (std::size_t m = 0; m < 2 * ranges.size(); ++m) {
        const auto b = m % 2 ? ranges[m / 2].values : ranges[m / 2].indices;
        if (b.empty()) continue;
        const auto p = reinterpret_cast<std::uintptr_t>(b.data());
        EXPECT_LE(l.at[m] + b.size(), l.total);
        EXPECT_EQ(l.at[m] % 16, p % 16);
        ms.push_back({p, l.at[m], b.size()});
    }
    for (const M& x : ms) {
        for (const M& y : ms) {
            const bool same_shift = x.at - x.p == y.at - y.p;
            const bool apart = x.at + x.size <= y.at || y.at + y.size <= x.at;
            EXPECT_TRUE(same_shift || apart);
        }
    }
    // No more room than the arena's span and at most 31 bytes of alignment a run.
    EXPECT_LE(l.total, sizeof(a.bytes) + 31 * ms.size());
}

TEST(StagingLayoutTest, NoRangesNoBytes) {
    const StagingLayout l = LayOutStaging({});
    EXPECT_TRUE(l.at.empty());
    EXPECT_EQ(l.total, 0u);
}

}  // namespace
}  // namespace mooncake::sparse
