// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The small pieces: DefaultTileShape, Checksum/UpdateChecksums, BuildTileIndex, and
// FilterRebase against a reference.

#include "codec/codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "codec/codec_internal.h"
#include "codec_test_util.h"

#define XXH_INLINE_ALL
#define XXH_VECTOR 0  // XXH_SCALAR: the reference the library's kernels must match
#include <xxhash.h>

namespace mooncake::sparse {
namespace {

using codec_testing::DecodeIndices;
using codec_testing::MakeDesc;
using codec_testing::RandomUniqueCoords;
using codec_testing::StatusIs;
using codec_testing::View;
using ::testing::HasSubstr;

TEST(DefaultTileShapeTest, EightTilesPerDimension) {
    EXPECT_EQ(DefaultTileShape(Shape{7168, 16384}), (Shape{896, 2048}));
    EXPECT_EQ(DefaultTileShape(Shape{2048, 7168}), (Shape{256, 896}));
    EXPECT_EQ(DefaultTileShape(Shape{10, 31, 32, 48}), (Shape{2, 4, 4, 6}));
    EXPECT_EQ(DefaultTileShape(Shape{1}), (Shape{1}));
    EXPECT_EQ(DefaultTileShape(Shape{}), (Shape{}));
}

TEST(DividerTest, MatchesDivisionForEveryDivisorShape) {
    // Shifts for powers of two (any n), the multiply for the rest (n and d below 2^32): the
    // quotient and remainder of every divisor kind against the divide instruction, at the
    // edges (multiples, one below, the largest n) and at random.
    using codec_internal::Divider;
    std::mt19937_64 rng(0xd1u);
    std::vector<std::uint64_t> divisors = {1, 2, 3, 5, 7, 64, 448, 896, 2048, 2304, 3072,
                                           65535, 65537, (1ull << 31) - 1, (1ull << 32) - 1};
    for (int i = 0; i < 200; ++i) divisors.push_back(1 + rng() % ((1ull << 32) - 1));
    for (const std::uint64_t d : divisors) {
        const Divider div(d);
        ASSERT_TRUE(div.Exact((1ull << 32) - 1)) << d;
        std::vector<std::uint64_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, (1ull << 32) - 1,
                                         ((1ull << 32) - 1) / d * d, ((1ull << 32) - 1) / d * d - 1};
        for (int i = 0; i < 2000; ++i) ns.push_back(rng() & 0xffffffffu);
        for (const std::uint64_t n : ns) {
            if (n >= (1ull << 32)) continue;
            ASSERT_EQ(div.Div(n), n / d) << n << " / " << d;
            ASSERT_EQ(div.Mod(n), n % d) << n << " % " << d;
        }
    }
    // Powers of two stay exact past 2^32; other divisors say they are not.
    EXPECT_TRUE(Divider(4096).Exact(~0ull));
    EXPECT_EQ(Divider(4096).Div((1ull << 50) + 4097), ((1ull << 50) + 4097) / 4096);
    EXPECT_FALSE(Divider(896).Exact(1ull << 32));
}

TEST(ChecksumTest, IsXxh3AndCoversEveryMember) {
    EXPECT_EQ(Checksum({}), 0x2D06800538D394C2ull);  // XXH3_64bits of no bytes
    const std::vector<std::byte> a = {std::byte{1}, std::byte{2}};
    const std::vector<std::byte> b = {std::byte{1}, std::byte{3}};
    EXPECT_EQ(Checksum(a), Checksum(a));
    EXPECT_NE(Checksum(a), Checksum(b));

    SparseObject obj;
    obj.indices.assign(a.begin(), a.end());
    obj.values.assign(b.begin(), b.end());
    obj.tile_coords = {1, 2};
    obj.tile_ptr = {0, 1};
    UpdateChecksums(obj);
    EXPECT_EQ(obj.checksum_indices, Checksum(a));
    EXPECT_EQ(obj.checksum_values, Checksum(b));
    EXPECT_EQ(obj.checksum_tile_coords, Checksum(std::as_bytes(std::span(obj.tile_coords))));
    EXPECT_EQ(obj.checksum_tile_ptr, Checksum(std::as_bytes(std::span(obj.tile_ptr))));
}

TEST(ChecksumTest, EqualsThePortableXxh3AtEverySizeAndAlignment) {
    // Checksum may run a vector kernel (AVX2 where the CPU has it); XXH3 is defined by its
    // scalar form, which this file builds (XXH_VECTOR 0).
    std::mt19937_64 rng(64);
    std::vector<std::byte> bytes(300000);
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    for (std::size_t size : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4096, 65537,
                             299990}) {
        for (std::size_t offset : {0, 1, 7}) {
            const std::span<const std::byte> s(bytes.data() + offset, size);
            ASSERT_EQ(Checksum(s), XXH3_64bits(s.data(), s.size())) << size << " at " << offset;
        }
    }
}

SparseObject BuiltObject(const Shape& shape, const Shape& tile, std::int64_t nnz,
                         std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    const auto coords = RandomUniqueCoords(rng, shape, nnz);
    const std::size_t n = coords.size() / shape.size();
    std::vector<std::uint16_t> val(n);
    for (std::size_t i = 0; i < n; ++i) val[i] = static_cast<std::uint16_t>(i);
    EncodeOptions opts;
    opts.tile_shape = tile;
    auto r = BuildSparseObject(
        MakeDesc(shape), View(coords, {static_cast<Index>(n), static_cast<Index>(shape.size())}),
        View(val, {static_cast<Index>(n)}, DType::kBFloat16), opts);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
}

TEST(BuildTileIndexTest, RebuildsTheIndexOfASortedObject) {
    for (const auto& [shape, tile] :
         std::vector<std::pair<Shape, Shape>>{{{300, 200}, {16, 32}},
                                              {{300, 200}, {7, 13}},
                                              {{1000}, {10}},
                                              {{9, 10, 11}, {2, 3, 4}}}) {
        SparseObject obj = BuiltObject(shape, tile, 500, 1);
        const auto coords = obj.tile_coords;
        const auto ptr = obj.tile_ptr;
        obj.tile_coords = {9, 9, 9};
        obj.tile_ptr.clear();
        obj.desc.num_tiles = 0;
        ASSERT_OK(BuildTileIndex(obj));
        EXPECT_EQ(obj.tile_coords, coords);
        EXPECT_EQ(obj.tile_ptr, ptr);
        EXPECT_EQ(obj.desc.num_tiles, ptr.size() - 1);
    }
}

TEST(BuildTileIndexTest, RejectsUnsortedAndRepeatedEntries) {
    SparseObject obj = BuiltObject({300, 200}, {16, 32}, 500, 2);
    SparseObject swapped = obj;
    // Swap the first and last entries (different tiles).
    ByteBuffer& idx = swapped.indices;
    std::swap_ranges(idx.begin(), idx.begin() + 4, idx.end() - 4);
    EXPECT_THAT(BuildTileIndex(swapped), StatusIs(StatusCode::kInvalidArgument));

    SparseObject repeated = obj;
    std::memcpy(repeated.indices.data() + 4, repeated.indices.data(), 4);  // entry 1 := entry 0
    Status s = BuildTileIndex(repeated);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(s.message(), HasSubstr("entry 1 repeats the coordinate of entry 0"));

    SparseObject short_idx = obj;
    short_idx.indices.pop_back();
    EXPECT_THAT(BuildTileIndex(short_idx), StatusIs(StatusCode::kInvalidArgument));

    SparseObject empty = obj;
    empty.indices.clear();
    empty.desc.nnz = 0;
    ASSERT_OK(BuildTileIndex(empty));
    EXPECT_EQ(empty.tile_ptr, (std::vector<std::uint64_t>{0}));
    EXPECT_TRUE(empty.tile_coords.empty());
}

// ---------------------------------------------------------------------------------------------
// FilterRebase
// ---------------------------------------------------------------------------------------------
template <typename T>
std::vector<std::byte> Encode(const std::vector<std::uint64_t>& v) {
    std::vector<std::byte> out(v.size() * sizeof(T));
    for (std::size_t i = 0; i < v.size(); ++i) {
        const T x = static_cast<T>(v[i]);
        std::memcpy(out.data() + i * sizeof(T), &x, sizeof(T));
    }
    return out;
}

std::vector<std::byte> EncodeAs(DType t, const std::vector<std::uint64_t>& v) {
    switch (t) {
        case DType::kUInt16:
            return Encode<std::uint16_t>(v);
        case DType::kUInt32:
            return Encode<std::uint32_t>(v);
        default:
            return Encode<std::uint64_t>(v);
    }
}

struct FilterCase {
    std::size_t rank;
    DType in;
    DType out;
    std::size_t value_bytes;
    bool filter;
};

class FilterRebaseTest : public ::testing::TestWithParam<FilterCase> {};

TEST_P(FilterRebaseTest, MatchesReference) {
    const FilterCase& c = GetParam();
    std::mt19937_64 rng(c.rank * 100 + c.value_bytes);
    const std::size_t n = 5000;
    std::uniform_int_distribution<std::uint64_t> coord(0, 999);
    std::vector<std::uint64_t> idx(n * c.rank);
    for (auto& x : idx) x = coord(rng);
    std::vector<std::byte> values(n * c.value_bytes);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::byte>(i * 13);

    Shape lo(c.rank), ext(c.rank), origin(c.rank);
    for (std::size_t d = 0; d < c.rank; ++d) {
        lo[d] = 200 + 50 * static_cast<Index>(d);
        ext[d] = 600;
        origin[d] = 150;  // target box origin <= overlap origin
    }
    const Box overlap = Box::Make(lo, ext).value();
    if (!c.filter) {  // without the filter every entry must lie in the overlap
        for (std::size_t i = 0; i < idx.size(); ++i) {
            idx[i] = static_cast<std::uint64_t>(lo[i % c.rank]) + idx[i] % 600;
        }
    }
    const auto in_bytes = EncodeAs(c.in, idx);

    // Output vectors start non-empty: FilterRebase appends.
    std::vector<std::byte> out_idx(3, std::byte{0xab}), out_val(5, std::byte{0xcd});
    const std::uint64_t kept = FilterRebase(in_bytes, values, n, c.rank, c.in, c.value_bytes,
                                            overlap, c.filter, origin, c.out, out_idx, out_val);

    std::vector<std::uint64_t> want_idx;
    std::vector<std::byte> want_val;
    for (std::size_t i = 0; i < n; ++i) {
        bool inside = true;
        for (std::size_t d = 0; d < c.rank; ++d) {
            const auto v = static_cast<Index>(idx[i * c.rank + d]);
            inside &= v >= overlap.begin(d) && v < overlap.end(d);
        }
        if (!inside) continue;
        for (std::size_t d = 0; d < c.rank; ++d) {
            want_idx.push_back(idx[i * c.rank + d] - static_cast<std::uint64_t>(origin[d]));
        }
        want_val.insert(want_val.end(), values.begin() + i * c.value_bytes,
                        values.begin() + (i + 1) * c.value_bytes);
    }
    ASSERT_EQ(kept, want_val.size() / c.value_bytes);
    if (c.filter) {
        EXPECT_LT(kept, n);
        EXPECT_GT(kept, 0u);
    } else {
        EXPECT_EQ(kept, n);
    }
    ASSERT_EQ(out_idx.size(), 3 + kept * c.rank * DTypeSize(c.out));
    ASSERT_EQ(out_val.size(), 5 + kept * c.value_bytes);
    EXPECT_EQ(out_idx[0], std::byte{0xab});
    EXPECT_EQ(out_val[4], std::byte{0xcd});
    EXPECT_EQ(DecodeIndices(std::span(out_idx).subspan(3), c.out), want_idx);
    EXPECT_TRUE(std::equal(want_val.begin(), want_val.end(), out_val.begin() + 5));
}

INSTANTIATE_TEST_SUITE_P(Cases, FilterRebaseTest,
                         ::testing::Values(FilterCase{2, DType::kUInt16, DType::kUInt16, 2, true},
                                           FilterCase{2, DType::kUInt16, DType::kUInt16, 2, false},
                                           FilterCase{2, DType::kUInt32, DType::kUInt16, 4, false},
                                           FilterCase{2, DType::kUInt16, DType::kUInt32, 2, false},
                                           FilterCase{2, DType::kUInt64, DType::kUInt64, 8, false},
                                           FilterCase{2, DType::kUInt32, DType::kUInt16, 4, true},
                                           FilterCase{2, DType::kUInt16, DType::kUInt64, 8, true},
                                           FilterCase{1, DType::kUInt64, DType::kUInt32, 8, true},
                                           FilterCase{3, DType::kUInt32, DType::kUInt16, 2, true},
                                           FilterCase{3, DType::kUInt16, DType::kUInt16, 1, false},
                                           FilterCase{4, DType::kUInt64, DType::kUInt64, 3, true}));

TEST(FilterRebaseTest, CountIsClampedToTheInput) {
    const std::vector<std::uint64_t> idx = {1, 2, 3, 4};
    const auto in = Encode<std::uint16_t>(idx);
    const std::vector<std::byte> vals(4);
    std::vector<std::byte> oi, ov;
    const Box overlap = Box::Make({0, 0}, {10, 10}).value();
    const Shape origin{0, 0};
    EXPECT_EQ(FilterRebase(in, vals, 100, 2, DType::kUInt16, 2, overlap, true, origin,
                           DType::kUInt16, oi, ov),
              2u);
    EXPECT_EQ(FilterRebase(in, vals, 0, 2, DType::kUInt16, 2, overlap, true, origin, DType::kUInt16,
                           oi, ov),
              0u);
}

}  // namespace
}  // namespace mooncake::sparse
