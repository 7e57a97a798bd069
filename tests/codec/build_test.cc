// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// BuildSparseObject: the (tile, element) sort against a reference, the tile index, index
// narrowing, duplicates, checksums, and a typed error for every kind of bad input.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec_test_util.h"

namespace mooncake::sparse {
namespace {

using codec_testing::ByteView;
using codec_testing::DecodeIndices;
using codec_testing::DecodeValues;
using codec_testing::MakeDesc;
using codec_testing::RandomUniqueCoords;
using codec_testing::ReferenceOrder;
using codec_testing::StatusIs;
using codec_testing::View;
using ::testing::HasSubstr;

template <typename T>
std::vector<T> Cast(const std::vector<std::int64_t>& v) {
    return std::vector<T>(v.begin(), v.end());
}

/// Checks everything a built object promises about itself.
void ExpectWellFormed(const SparseObject& obj) {
    const SourceDescriptor& d = obj.desc;
    EXPECT_EQ(obj.indices.size(), d.nnz * d.rank() * DTypeSize(d.index_dtype));
    EXPECT_EQ(obj.values.size(), d.nnz * DTypeSize(d.value_dtype));
    EXPECT_EQ(d.num_tiles + 1, obj.tile_ptr.size());
    EXPECT_EQ(obj.tile_coords.size(), d.num_tiles * d.rank());
    EXPECT_EQ(obj.coordinate_space, "global");
    TileIndexView view{d.rank(), obj.tile_coords, obj.tile_ptr};
    EXPECT_OK(ValidateTileIndex(view, d));
    // Every entry lies in the tile that lists it.
    const auto idx = DecodeIndices(obj.indices, d.index_dtype);
    for (std::size_t t = 0; t < d.num_tiles; ++t) {
        for (std::uint64_t e = obj.tile_ptr[t]; e < obj.tile_ptr[t + 1]; ++e) {
            for (std::size_t k = 0; k < d.rank(); ++k) {
                ASSERT_EQ(idx[e * d.rank() + k] / static_cast<std::uint64_t>(d.tile_shape[k]),
                          obj.tile_coords[t * d.rank() + k])
                    << "entry " << e << " tile " << t;
            }
        }
    }
    EXPECT_EQ(obj.checksum_indices, Checksum(obj.indices));
    EXPECT_EQ(obj.checksum_values, Checksum(obj.values));
    EXPECT_EQ(obj.checksum_tile_coords, Checksum(std::as_bytes(std::span(obj.tile_coords))));
    EXPECT_EQ(obj.checksum_tile_ptr, Checksum(std::as_bytes(std::span(obj.tile_ptr))));
}

struct SortCase {
    Shape shape;
    Shape tile_shape;  // empty: default
    std::int64_t nnz;
    DType index_dtype;
    int threads;
};

class BuildSortTest : public ::testing::TestWithParam<SortCase> {};

TEST_P(BuildSortTest, MatchesReferenceSort) {
    const SortCase& c = GetParam();
    std::mt19937_64 rng(c.nnz * 31 + static_cast<int>(c.shape.size()));
    const std::vector<std::int64_t> coords = RandomUniqueCoords(rng, c.shape, c.nnz);
    const std::size_t rank = c.shape.size();
    const std::size_t n = coords.size() / rank;
    // Values: the entry number, so the test sees which input entry landed where.
    std::vector<std::uint32_t> values(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<std::uint32_t>(i);

    EncodeOptions opts;
    if (!c.tile_shape.empty()) opts.tile_shape = c.tile_shape;
    opts.num_threads = c.threads;
    const Shape ts = c.tile_shape.empty() ? DefaultTileShape(c.shape) : c.tile_shape;

    std::vector<std::byte> index_bytes;
    switch (c.index_dtype) {
        case DType::kInt64:
            index_bytes = codec_testing::ToBytes(coords);
            break;
        case DType::kInt32:
            index_bytes = codec_testing::ToBytes(Cast<std::int32_t>(coords));
            break;
        case DType::kUInt16:
            index_bytes = codec_testing::ToBytes(Cast<std::uint16_t>(coords));
            break;
        case DType::kUInt64:
            index_bytes = codec_testing::ToBytes(Cast<std::uint64_t>(coords));
            break;
        default:
            FAIL() << "unsupported test dtype";
    }
    ASSERT_OK_AND_ASSIGN(
        SparseObject obj,
        BuildSparseObject(
            MakeDesc(c.shape),
            ByteView(index_bytes, c.index_dtype, {static_cast<Index>(n), static_cast<Index>(rank)}),
            View(values, {static_cast<Index>(n)}), opts));
    ExpectWellFormed(obj);
    EXPECT_EQ(obj.desc.nnz, n);
    EXPECT_EQ(obj.desc.tile_shape, ts);
    EXPECT_EQ(obj.desc.value_dtype, DType::kUInt32);
    EXPECT_EQ(obj.desc.index_dtype,
              NarrowestIndexDType(*std::max_element(c.shape.begin(), c.shape.end())));

    const std::vector<std::size_t> order = ReferenceOrder(coords, ts);
    const auto got_idx = DecodeIndices(obj.indices, obj.desc.index_dtype);
    const auto got_val = DecodeValues<std::uint32_t>(obj.values);
    ASSERT_EQ(got_val.size(), n);
    for (std::size_t j = 0; j < n; ++j) {
        ASSERT_EQ(got_val[j], order[j]) << "sorted position " << j;
        for (std::size_t d = 0; d < rank; ++d) {
            ASSERT_EQ(got_idx[j * rank + d],
                      static_cast<std::uint64_t>(coords[order[j] * rank + d]));
        }
    }

    // Feeding the sorted result back (already sorted: no sort) gives the same object.
    ASSERT_OK_AND_ASSIGN(
        SparseObject again,
        BuildSparseObject(MakeDesc(c.shape),
                          ByteView(obj.indices, obj.desc.index_dtype,
                                   {static_cast<Index>(n), static_cast<Index>(rank)}),
                          ByteView(obj.values, DType::kUInt32, {static_cast<Index>(n)}), opts));
    EXPECT_EQ(again.indices, obj.indices);
    EXPECT_EQ(again.values, obj.values);
    EXPECT_EQ(again.tile_coords, obj.tile_coords);
    EXPECT_EQ(again.tile_ptr, obj.tile_ptr);
    EXPECT_EQ(again.checksum_indices, obj.checksum_indices);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BuildSortTest,
    ::testing::Values(
        SortCase{{1000}, {64}, 300, DType::kInt64, 1},
        SortCase{{1000}, {7}, 1000, DType::kInt32, 1}, SortCase{{1000}, {}, 10, DType::kUInt16, 1},
        SortCase{{300, 200}, {16, 32}, 5000, DType::kInt64, 1},
        SortCase{{300, 200}, {7, 13}, 5000, DType::kInt32, 1},
        SortCase{{300, 200}, {1, 1}, 2000, DType::kUInt16, 1},
        SortCase{{300, 200}, {300, 200}, 2000, DType::kUInt64, 1},
        SortCase{{2048, 7168}, {}, 20000, DType::kInt64, 1},
        SortCase{{2048, 7168}, {}, 150000, DType::kInt64, 4},  // parallel keys + radix sort
        SortCase{{2048, 7168}, {100, 300}, 150000, DType::kUInt16, 3},
        SortCase{{20, 30, 40}, {4, 8, 16}, 3000, DType::kInt64, 1},
        SortCase{{20, 30, 40}, {3, 5, 7}, 24000, DType::kInt32, 1},  // all elements
        SortCase{{4, 5, 6, 7, 8}, {2, 2, 3, 4, 5}, 3000, DType::kInt64, 2},
        SortCase{{70000, 3}, {}, 90000, DType::kInt64, 2},  // uint32 output
        // 50-bit keys + 15-bit entry numbers do not pack into 64 bits: (key, entry) pairs.
        SortCase{{Index{1} << 25, Index{1} << 25}, {}, 20000, DType::kInt64, 2}));

TEST(BuildSparseObjectTest, ThreadCountDoesNotChangeTheResult) {
    std::mt19937_64 rng(11);
    const Shape shape{4096, 4096};
    const auto coords = RandomUniqueCoords(rng, shape, 300000);
    std::vector<float> values(coords.size() / 2);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
    const HostArray idx = View(coords, {static_cast<Index>(values.size()), 2});
    const HostArray val = View(values, {static_cast<Index>(values.size())});
    EncodeOptions one, many;
    one.num_threads = 1;
    many.num_threads = 5;
    ASSERT_OK_AND_ASSIGN(SparseObject a, BuildSparseObject(MakeDesc(shape), idx, val, one));
    ASSERT_OK_AND_ASSIGN(SparseObject b, BuildSparseObject(MakeDesc(shape), idx, val, many));
    EXPECT_EQ(a.indices, b.indices);
    EXPECT_EQ(a.values, b.values);
    EXPECT_EQ(a.tile_coords, b.tile_coords);
    EXPECT_EQ(a.tile_ptr, b.tile_ptr);
}

TEST(BuildSparseObjectTest, FillsTheDescriptorAndKeepsTheCallersFields) {
    SourceDescriptor d = MakeDesc({2048, 7168}, ApplyMode::kScatterAdd);
    d.tensor_id = "layers.3.mlp.experts.37.w1";
    d.generation = {4, 5};
    d.placement = NamedAxes::Make({{"expert", 37}}).value();
    d.policy = PlacementPolicy::Owner("expert").value();
    const std::vector<std::int32_t> idx = {5, 6, 1, 2};
    const std::vector<float> val = {1.0f, 2.0f};
    ASSERT_OK_AND_ASSIGN(SparseObject obj, BuildSparseObject(d, View(idx, {2, 2}), View(val, {2})));
    EXPECT_EQ(obj.desc.tensor_id, d.tensor_id);
    EXPECT_EQ(obj.desc.generation, d.generation);
    EXPECT_EQ(obj.desc.placement, d.placement);
    EXPECT_EQ(obj.desc.apply, ApplyMode::kScatterAdd);
    EXPECT_EQ(obj.desc.box, Box::Whole(d.global_shape).value());  // rank-0 box: whole tensor
    EXPECT_EQ(obj.desc.source_ref, "");                           // assigned by the store at commit
    EXPECT_EQ(obj.desc.nnz, 2u);
    EXPECT_EQ(obj.desc.num_tiles, 1u);
    EXPECT_EQ(obj.desc.tile_shape, (Shape{256, 896}));
    EXPECT_EQ(obj.desc.index_dtype, DType::kUInt16);
    EXPECT_EQ(obj.desc.value_dtype, DType::kFloat32);
    EXPECT_EQ(DecodeIndices(obj.indices, DType::kUInt16), (std::vector<std::uint64_t>{1, 2, 5, 6}));
    EXPECT_EQ(DecodeValues<float>(obj.values), (std::vector<float>{2.0f, 1.0f}));
    EXPECT_EQ(obj.PayloadBytes(), 8u + 8u + 2 * 4u + 2 * 8u);
}

TEST(BuildSparseObjectTest, AcceptsFlatIndicesForRankOne) {
    const std::vector<std::uint64_t> idx = {9, 3, 7};
    const std::vector<double> val = {9.0, 3.0, 7.0};
    ASSERT_OK_AND_ASSIGN(SparseObject obj,
                         BuildSparseObject(MakeDesc({10}), View(idx, {3}), View(val, {3})));
    EXPECT_EQ(DecodeIndices(obj.indices, DType::kUInt16), (std::vector<std::uint64_t>{3, 7, 9}));
    EXPECT_EQ(DecodeValues<double>(obj.values), (std::vector<double>{3.0, 7.0, 9.0}));
}

TEST(BuildSparseObjectTest, SourceBoxBoundsTheCoordinates) {
    SourceDescriptor d = MakeDesc({2048, 7168});
    d.box = Box::Make({1024, 0}, {1024, 7168}).value();
    const std::vector<std::int64_t> ok = {1024, 0, 2047, 7167, 1500, 3};
    const std::vector<std::uint16_t> val(3, 1);
    ASSERT_OK_AND_ASSIGN(SparseObject obj,
                         BuildSparseObject(d, View(ok, {3, 2}), View(val, {3}, DType::kBFloat16)));
    ExpectWellFormed(obj);
    const std::vector<std::int64_t> bad = {1024, 0, 1023, 5};
    auto r = BuildSparseObject(d, View(bad, {2, 2}),
                               View(std::vector<std::uint16_t>(2), {2}, DType::kBFloat16));
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(),
                HasSubstr("entry 1 coordinate 1023 in dim 0 is outside the source box "
                          "[1024:2048, 0:7168]"));
}

TEST(BuildSparseObjectTest, NarrowsIndicesAtTheUint16AndUint32Boundaries) {
    {
        const std::vector<std::int64_t> idx = {65535, 0, 0, 1};
        ASSERT_OK_AND_ASSIGN(SparseObject obj,
                             BuildSparseObject(MakeDesc({65536, 2}), View(idx, {2, 2}),
                                               View(std::vector<float>{1, 2}, {2})));
        EXPECT_EQ(obj.desc.index_dtype, DType::kUInt16);
        EXPECT_EQ(DecodeIndices(obj.indices, DType::kUInt16),
                  (std::vector<std::uint64_t>{0, 1, 65535, 0}));
    }
    {
        const std::vector<std::int64_t> idx = {65536, 0, 0, 1};
        ASSERT_OK_AND_ASSIGN(SparseObject obj,
                             BuildSparseObject(MakeDesc({65537, 2}), View(idx, {2, 2}),
                                               View(std::vector<float>{1, 2}, {2})));
        EXPECT_EQ(obj.desc.index_dtype, DType::kUInt32);
        EXPECT_EQ(DecodeIndices(obj.indices, DType::kUInt32),
                  (std::vector<std::uint64_t>{0, 1, 65536, 0}));
    }
    {
        const Index big = (Index{1} << 32) + 1;
        const std::vector<std::uint64_t> idx = {static_cast<std::uint64_t>(big - 1), 0};
        ASSERT_OK_AND_ASSIGN(SparseObject obj,
                             BuildSparseObject(MakeDesc({big}), View(idx, {2, 1}),
                                               View(std::vector<float>{1, 2}, {2})));
        EXPECT_EQ(obj.desc.index_dtype, DType::kUInt64);
        EXPECT_EQ(DecodeIndices(obj.indices, DType::kUInt64),
                  (std::vector<std::uint64_t>{0, static_cast<std::uint64_t>(big - 1)}));
        ExpectWellFormed(obj);
    }
}

TEST(BuildSparseObjectTest, EmptyObjectIsValid) {
    ASSERT_OK_AND_ASSIGN(
        SparseObject obj,
        BuildSparseObject(MakeDesc({2048, 7168}), View(std::vector<std::int64_t>{}, {0, 2}),
                          View(std::vector<float>{}, {0})));
    EXPECT_EQ(obj.desc.nnz, 0u);
    EXPECT_EQ(obj.desc.num_tiles, 0u);
    EXPECT_EQ(obj.tile_ptr, (std::vector<std::uint64_t>{0}));
    EXPECT_TRUE(obj.tile_coords.empty());
    EXPECT_TRUE(obj.indices.empty());
    ExpectWellFormed(obj);
}

// ---------------------------------------------------------------------------------------------
// Duplicates
// ---------------------------------------------------------------------------------------------
TEST(BuildSparseObjectTest, DuplicatesAreRejectedByDefault) {
    const std::vector<std::int64_t> idx = {3, 5, 1, 1, 3, 5};
    auto r = BuildSparseObject(MakeDesc({10, 10}), View(idx, {3, 2}),
                               View(std::vector<float>{1, 2, 3}, {3}));
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(), HasSubstr("duplicate coordinate (3, 5) at entries 0 and 2"));
}

TEST(BuildSparseObjectTest, DuplicatesInSortedInputAreRejected) {
    const std::vector<std::int64_t> idx = {1, 1, 3, 5, 3, 5};
    auto r = BuildSparseObject(MakeDesc({10, 10}), View(idx, {3, 2}),
                               View(std::vector<float>{1, 2, 3}, {3}));
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(), HasSubstr("(3, 5)"));
}

TEST(BuildSparseObjectTest, SumDuplicatesNeedsScatterAdd) {
    EncodeOptions opts;
    opts.duplicates = DuplicatePolicy::kSum;
    const std::vector<std::int64_t> idx = {3, 5, 3, 5};
    auto r = BuildSparseObject(MakeDesc({10, 10}, ApplyMode::kOverwrite), View(idx, {2, 2}),
                               View(std::vector<float>{1, 2}, {2}), opts);
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(), HasSubstr("scatter_add"));
}

TEST(BuildSparseObjectTest, LastDuplicateWinsWithOverwrite) {
    EncodeOptions opts;
    opts.duplicates = DuplicatePolicy::kLast;
    // (3, 5) three times, (0, 0) twice: the last in input order wins, whatever the sort does.
    const std::vector<std::int64_t> idx = {3, 5, 0, 0, 3, 5, 9, 9, 3, 5, 0, 0};
    const std::vector<float> val = {1.0f, 10.0f, 2.0f, 100.0f, 4.0f, 20.0f};
    ASSERT_OK_AND_ASSIGN(SparseObject obj,
                         BuildSparseObject(MakeDesc({10, 10}, ApplyMode::kOverwrite),
                                           View(idx, {6, 2}), View(val, {6}), opts));
    ExpectWellFormed(obj);
    EXPECT_EQ(obj.desc.nnz, 3u);
    EXPECT_EQ(DecodeIndices(obj.indices, DType::kUInt16),
              (std::vector<std::uint64_t>{0, 0, 3, 5, 9, 9}));
    EXPECT_EQ(DecodeValues<float>(obj.values), (std::vector<float>{20.0f, 4.0f, 100.0f}));
}

TEST(BuildSparseObjectTest, LastDuplicatesNeedsOverwrite) {
    EncodeOptions opts;
    opts.duplicates = DuplicatePolicy::kLast;
    const std::vector<std::int64_t> idx = {3, 5, 3, 5};
    auto r = BuildSparseObject(MakeDesc({10, 10}, ApplyMode::kScatterAdd), View(idx, {2, 2}),
                               View(std::vector<float>{1, 2}, {2}), opts);
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(), HasSubstr("overwrite"));
}

TEST(BuildSparseObjectTest, SumDuplicatesCoalescesWithScatterAdd) {
    EncodeOptions opts;
    opts.duplicates = DuplicatePolicy::kSum;
    const std::vector<std::int64_t> idx = {3, 5, 0, 0, 3, 5, 9, 9, 3, 5, 0, 0};
    {
        const std::vector<float> val = {1.0f, 10.0f, 2.0f, 100.0f, 4.0f, 20.0f};
        ASSERT_OK_AND_ASSIGN(SparseObject obj,
                             BuildSparseObject(MakeDesc({10, 10}, ApplyMode::kScatterAdd),
                                               View(idx, {6, 2}), View(val, {6}), opts));
        ExpectWellFormed(obj);
        EXPECT_EQ(obj.desc.nnz, 3u);
        EXPECT_EQ(DecodeIndices(obj.indices, DType::kUInt16),
                  (std::vector<std::uint64_t>{0, 0, 3, 5, 9, 9}));
        EXPECT_EQ(DecodeValues<float>(obj.values), (std::vector<float>{30.0f, 7.0f, 100.0f}));
    }
    {  // bf16 sums in float32, rounded once: 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly.
        const std::vector<std::uint16_t> val = {
            FloatToBFloat16(1.0f), 0, FloatToBFloat16(0x1p-8f), 0, FloatToBFloat16(0x1p-8f), 0};
        ASSERT_OK_AND_ASSIGN(
            SparseObject obj,
            BuildSparseObject(MakeDesc({10, 10}, ApplyMode::kScatterAdd), View(idx, {6, 2}),
                              View(val, {6}, DType::kBFloat16), opts));
        const auto got = DecodeValues<std::uint16_t>(obj.values);
        ASSERT_EQ(got.size(), 3u);
        EXPECT_EQ(BFloat16ToFloat(got[1]), 1.0f + 0x1p-7f);
    }
    {  // integers wrap like the apply kernel
        const std::vector<std::int8_t> val = {100, 1, 100, 2, -50, 3};
        ASSERT_OK_AND_ASSIGN(SparseObject obj,
                             BuildSparseObject(MakeDesc({10, 10}, ApplyMode::kScatterAdd),
                                               View(idx, {6, 2}), View(val, {6}), opts));
        EXPECT_EQ(DecodeValues<std::int8_t>(obj.values),
                  (std::vector<std::int8_t>{4, static_cast<std::int8_t>(150), 2}));
    }
}

TEST(BuildSparseObjectTest, SumDuplicatesOnLargeUnsortedInput) {
    // Parallel key pass + radix sort, then coalescing: compare with a map reference.
    std::mt19937_64 rng(5);
    const Shape shape{512, 512};
    std::uniform_int_distribution<std::int64_t> coord(0, 511);
    const std::size_t n = 200000;
    std::vector<std::int64_t> idx(n * 2);
    std::vector<std::int64_t> val(n);
    std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> ref;
    for (std::size_t i = 0; i < n; ++i) {
        idx[2 * i] = coord(rng);
        idx[2 * i + 1] = coord(rng);
        val[i] = static_cast<std::int64_t>(i % 1000) - 500;
        ref[{idx[2 * i], idx[2 * i + 1]}] += val[i];
    }
    EncodeOptions opts;
    opts.duplicates = DuplicatePolicy::kSum;
    opts.num_threads = 3;
    ASSERT_OK_AND_ASSIGN(SparseObject obj,
                         BuildSparseObject(MakeDesc(shape, ApplyMode::kScatterAdd),
                                           View(idx, {static_cast<Index>(n), 2}),
                                           View(val, {static_cast<Index>(n)}), opts));
    ExpectWellFormed(obj);
    ASSERT_EQ(obj.desc.nnz, ref.size());
    const auto got_idx = DecodeIndices(obj.indices, obj.desc.index_dtype);
    const auto got_val = DecodeValues<std::int64_t>(obj.values);
    for (std::size_t j = 0; j < got_val.size(); ++j) {
        const auto key = std::make_pair(static_cast<std::int64_t>(got_idx[2 * j]),
                                        static_cast<std::int64_t>(got_idx[2 * j + 1]));
        ASSERT_EQ(got_val[j], ref.at(key)) << j;
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input: every kind returns InvalidArgument and names the problem.
// ---------------------------------------------------------------------------------------------
struct BadCase {
    std::string name;
    std::function<Result<SparseObject>()> build;
    std::string message;
};

std::vector<BadCase> BadCases() {
    static const std::vector<std::int64_t> idx2 = {1, 2, 3, 4};
    static const std::vector<float> val2 = {1, 2};
    static const std::vector<float> fidx = {1, 2, 3, 4};
    static const std::vector<std::uint8_t> bools = {1, 0};
    static const std::vector<std::int32_t> negative = {1, 2, 3, -4};
    static const std::vector<std::int64_t> far = {1, 2, 2049, 4};
    static const std::vector<std::int64_t> idx3 = {1, 2, 3, 4, 5, 6};
    const SourceDescriptor d = MakeDesc({2048, 7168});
    return {
        {"out_of_box", [=] { return BuildSparseObject(d, View(far, {2, 2}), View(val2, {2})); },
         "entry 1 coordinate 2049 in dim 0 is outside the source box [0:2048, 0:7168]"},
        {"negative", [=] { return BuildSparseObject(d, View(negative, {2, 2}), View(val2, {2})); },
         "entry 1 coordinate -4 in dim 1 is negative"},
        {"length_mismatch",
         [=] { return BuildSparseObject(d, View(idx2, {2, 2}), View(std::vector<float>{1}, {1})); },
         "values has 1 entries but indices has 2"},
        {"float_indices", [=] { return BuildSparseObject(d, View(fidx, {2, 2}), View(val2, {2})); },
         "indices dtype float32 is not an integer type"},
        {"bool_values",
         [=] { return BuildSparseObject(d, View(idx2, {2, 2}), View(bools, {2}, DType::kBool)); },
         "values dtype bool is not numeric"},
        {"rank_mismatch", [=] { return BuildSparseObject(d, View(idx3, {2, 3}), View(val2, {2})); },
         "indices shape [2, 3] is not [nnz, 2]"},
        {"indices_1d_for_rank_2",
         [=] { return BuildSparseObject(d, View(idx2, {4}), View(val2, {2})); },
         "indices shape [4] is not [nnz, 2]"},
        {"values_2d", [=] { return BuildSparseObject(d, View(idx2, {2, 2}), View(val2, {2, 1})); },
         "values shape [2, 1] is not 1-D"},
        {"index_bytes",
         [=] {
             HostArray h = View(idx2, {2, 2});
             h.data = h.data.first(24);
             return BuildSparseObject(d, h, View(val2, {2}));
         },
         "indices holds 24 bytes"},
        {"value_bytes",
         [=] { return BuildSparseObject(d, View(idx2, {2, 2}), View(val2, {2}, DType::kFloat64)); },
         "values holds 8 bytes"},
        {"tile_shape_zero",
         [=] {
             EncodeOptions o;
             o.tile_shape = Shape{0, 16};
             return BuildSparseObject(d, View(idx2, {2, 2}), View(val2, {2}), o);
         },
         "non-positive"},
        {"tile_shape_rank",
         [=] {
             EncodeOptions o;
             o.tile_shape = Shape{16};
             return BuildSparseObject(d, View(idx2, {2, 2}), View(val2, {2}), o);
         },
         "tile_shape rank 1 != tensor rank 2"},
        {"box_outside_shape",
         [=] {
             SourceDescriptor e = d;
             e.box = Box::Make({2000, 0}, {100, 7168}).value();
             return BuildSparseObject(e, View(idx2, {2, 2}), View(val2, {2}));
         },
         "is not inside global_shape"},
        {"bad_global_shape",
         [=] {
             SourceDescriptor e = d;
             e.global_shape = {2048, 0};
             return BuildSparseObject(e, View(idx2, {2, 2}), View(val2, {2}));
         },
         "non-positive extent"},
        {"empty_tensor_id",
         [=] {
             SourceDescriptor e = d;
             e.tensor_id = "";
             return BuildSparseObject(e, View(idx2, {2, 2}), View(val2, {2}));
         },
         "tensor_id is empty"},
        {"bad_generation",
         [=] {
             SourceDescriptor e = d;
             e.generation = {3, 3};
             return BuildSparseObject(e, View(idx2, {2, 2}), View(val2, {2}));
         },
         "delta > base"},
        {"negative_threads",
         [=] {
             EncodeOptions o;
             o.num_threads = -1;
             return BuildSparseObject(d, View(idx2, {2, 2}), View(val2, {2}), o);
         },
         "num_threads"},
        {"sum_float8",
         [=] {
             EncodeOptions o;
             o.duplicates = DuplicatePolicy::kSum;
             return BuildSparseObject(MakeDesc({2048, 7168}, ApplyMode::kScatterAdd),
                                      View(idx2, {2, 2}), View(bools, {2}, DType::kFloat8E4M3), o);
         },
         "not supported for float8_e4m3fn"},
    };
}

TEST(BuildSparseObjectTest, BadInputGetsInvalidArgumentWithAClearMessage) {
    for (const BadCase& c : BadCases()) {
        SCOPED_TRACE(c.name);
        auto r = c.build();
        EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
        EXPECT_THAT(r.status().message(), HasSubstr(c.message));
    }
}

TEST(BuildSparseObjectTest, NamesTheFirstBadEntryAlsoWhenParallel) {
    std::mt19937_64 rng(3);
    const Shape shape{2048, 7168};
    auto coords = RandomUniqueCoords(rng, shape, 200000);
    coords[2 * 150000 + 1] = 9000;  // late chunk
    coords[2 * 70001] = 4096;       // earlier chunk: this one is reported
    const std::vector<float> val(200000, 1.0f);
    EncodeOptions opts;
    opts.num_threads = 4;
    auto r =
        BuildSparseObject(MakeDesc(shape), View(coords, {200000, 2}), View(val, {200000}), opts);
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(), HasSubstr("entry 70001 coordinate 4096 in dim 0"));
}

TEST(BuildSparseObjectTest, AcceptsEveryIntegerIndexDType) {
    const Shape shape{100, 120};
    const std::vector<std::int64_t> coords = {99, 0, 5, 119, 5, 7};
    const std::vector<float> val = {1, 2, 3};
    auto run = [&](auto tag, DType dtype) {
        using T = decltype(tag);
        const std::vector<T> idx(coords.begin(), coords.end());
        auto r = BuildSparseObject(MakeDesc(shape), View(idx, {3, 2}, dtype), View(val, {3}));
        ASSERT_TRUE(r.ok()) << DTypeName(dtype) << ": " << r.status().ToString();
        EXPECT_EQ(DecodeIndices(r->indices, DType::kUInt16),
                  (std::vector<std::uint64_t>{5, 7, 5, 119, 99, 0}))
            << DTypeName(dtype);
    };
    run(std::uint8_t{}, DType::kUInt8);
    run(std::int8_t{}, DType::kInt8);
    run(std::uint16_t{}, DType::kUInt16);
    run(std::int16_t{}, DType::kInt16);
    run(std::uint32_t{}, DType::kUInt32);
    run(std::int32_t{}, DType::kInt32);
    run(std::uint64_t{}, DType::kUInt64);
    run(std::int64_t{}, DType::kInt64);
}

TEST(BuildSparseObjectTest, KeysBeyond64BitsUseTheTwoKeyPath) {
    // Padded grid volume x tile volume = 2^64: (tile, element) pairs are sorted instead.
    const Index big = (Index{1} << 31) + 1;
    const Index t = Index{1} << 31;
    const Shape shape{big, big};
    EncodeOptions opts;
    opts.tile_shape = Shape{t, t};
    const std::vector<std::int64_t> idx = {t, 0, 0, t, 5, 5, t, t, 0, 0, 0, 7};
    const std::vector<float> val = {1, 2, 3, 4, 5, 6};
    ASSERT_OK_AND_ASSIGN(SparseObject obj,
                         BuildSparseObject(MakeDesc(shape), View(idx, {6, 2}), View(val, {6}), opts));
    ExpectWellFormed(obj);
    EXPECT_EQ(obj.desc.index_dtype, DType::kUInt32);
    const auto u = static_cast<std::uint64_t>(t);
    EXPECT_EQ(DecodeIndices(obj.indices, DType::kUInt32),
              (std::vector<std::uint64_t>{0, 0, 0, 7, 5, 5, 0, u, u, 0, u, u}));
    EXPECT_EQ(DecodeValues<float>(obj.values), (std::vector<float>{5, 6, 3, 2, 1, 4}));
    EXPECT_EQ(obj.tile_coords, (std::vector<TileCoord>{0, 0, 0, 1, 1, 0, 1, 1}));
    EXPECT_EQ(obj.tile_ptr, (std::vector<std::uint64_t>{0, 3, 4, 5, 6}));

    const std::vector<std::int64_t> dup = {t, 0, 5, 5, t, 0};
    auto r = BuildSparseObject(MakeDesc(shape), View(dup, {3, 2}),
                               View(std::vector<float>{1, 2, 3}, {3}), opts);
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(), HasSubstr("duplicate coordinate (2147483648, 0)"));
    opts.duplicates = DuplicatePolicy::kSum;
    ASSERT_OK_AND_ASSIGN(obj, BuildSparseObject(MakeDesc(shape, ApplyMode::kScatterAdd),
                                                View(dup, {3, 2}),
                                                View(std::vector<float>{1, 2, 3}, {3}), opts));
    EXPECT_EQ(DecodeValues<float>(obj.values), (std::vector<float>{2, 4}));
}

TEST(BuildSparseObjectTest, HugeUnsignedCoordinateIsOutOfBoxNotNegative) {
    const std::vector<std::uint64_t> idx = {1, std::numeric_limits<std::uint64_t>::max()};
    auto r =
        BuildSparseObject(MakeDesc({10, 10}), View(idx, {1, 2}), View(std::vector<float>{1}, {1}));
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(r.status().message(),
                HasSubstr("coordinate 18446744073709551615 in dim 1 is outside"));
}

}  // namespace
}  // namespace mooncake::sparse

namespace mooncake::sparse {
namespace {

/// The sorted fast paths (views: BuildSparseObjectSortedFirst; owned: the OwnedCoo overload)
/// give exactly what the general path gives, object or error, for canonical input and for every
/// way it can stop being canonical.
void ExpectSameAsGeneral(const SourceDescriptor& d, std::span<const std::byte> idx, DType idx_dtype,
                         std::span<const std::byte> val, DType val_dtype, std::int64_t nnz,
                         const EncodeOptions& opts = {}) {
    const Index rank = Index(d.global_shape.size());
    const HostArray i{idx_dtype, {nnz, rank}, idx};
    const HostArray v{val_dtype, {nnz}, val};
    auto general = BuildSparseObject(d, i, v, opts);
    auto views = BuildSparseObjectSortedFirst(d, i, v, opts);
    OwnedCoo coo{idx_dtype, val_dtype, std::uint64_t(nnz), ByteBuffer(idx.begin(), idx.end()),
                 ByteBuffer(val.begin(), val.end())};
    auto owned = BuildSparseObject(d, std::move(coo), opts);
    for (auto* r : {&views, &owned}) {
        ASSERT_EQ(r->ok(), general.ok()) << (general.ok() ? r->status().ToString() : general.status().ToString());
        if (!general.ok()) {
            EXPECT_EQ(r->status().code(), general.status().code());
            EXPECT_EQ(r->status().message(), general.status().message());
            continue;
        }
        ExpectWellFormed(**r);
        EXPECT_EQ((*r)->indices, general->indices);
        EXPECT_EQ((*r)->values, general->values);
        EXPECT_EQ((*r)->tile_coords, general->tile_coords);
        EXPECT_EQ((*r)->tile_ptr, general->tile_ptr);
        EXPECT_EQ((*r)->desc.index_dtype, general->desc.index_dtype);
        EXPECT_EQ((*r)->desc.tile_shape, general->desc.tile_shape);
        EXPECT_EQ((*r)->desc.nnz, general->desc.nnz);
        EXPECT_EQ((*r)->desc.num_tiles, general->desc.num_tiles);
        EXPECT_EQ((*r)->checksum_indices, general->checksum_indices);
        EXPECT_EQ((*r)->checksum_tile_ptr, general->checksum_tile_ptr);
    }
}

TEST(BuildSortedFastPathTest, CanonicalAndNonCanonicalInputsMatchTheGeneralPath) {
    std::mt19937_64 rng(7);
    const Shape shape = {300, 200};
    SourceDescriptor d = MakeDesc(shape);
    const std::int64_t nnz = 500;
    const auto coords = RandomUniqueCoords(rng, shape, nnz);
    std::vector<std::uint16_t> vals(nnz);
    for (auto& x : vals) x = std::uint16_t(rng());
    // The canonical form: what the general path makes of random input.
    ASSERT_OK_AND_ASSIGN(SparseObject canon,
                         BuildSparseObject(d, View(coords, {nnz, 2}), View(vals, {nnz}, DType::kBFloat16)));
    const ByteBuffer ci = canon.indices, cv = canon.values;
    ExpectSameAsGeneral(d, ci, DType::kUInt16, cv, DType::kBFloat16, nnz);
    // With a tile shape of the caller's and a source box holding every entry.
    EncodeOptions tiled;
    tiled.tile_shape = Shape{16, 64};
    ASSERT_OK_AND_ASSIGN(SparseObject canon2, BuildSparseObject(d, View(coords, {nnz, 2}),
                                                                View(vals, {nnz}, DType::kBFloat16), tiled));
    ExpectSameAsGeneral(d, canon2.indices, DType::kUInt16, canon2.values, DType::kBFloat16, nnz, tiled);
    // Two entries swapped: out of order, so sorted by the general path.
    ByteBuffer swapped = ci;
    std::swap_ranges(swapped.begin(), swapped.begin() + 4, swapped.begin() + 4 * 7);
    ExpectSameAsGeneral(d, swapped, DType::kUInt16, cv, DType::kBFloat16, nnz);
    // A duplicate: entry 1 repeats entry 0 (an error either way).
    ByteBuffer dup = ci;
    std::copy(dup.begin(), dup.begin() + 4, dup.begin() + 4);
    ExpectSameAsGeneral(d, dup, DType::kUInt16, cv, DType::kBFloat16, nnz);
    // An entry outside the source box.
    SourceDescriptor boxed = d;
    boxed.box = Box::Make({0, 0}, {150, 200}).value();
    ExpectSameAsGeneral(boxed, ci, DType::kUInt16, cv, DType::kBFloat16, nnz);
    // Wider index dtype than needed: the general path narrows it.
    std::vector<std::uint32_t> wide(2 * nnz);
    for (std::int64_t k = 0; k < 2 * nnz; ++k) {
        std::uint16_t x;
        std::memcpy(&x, ci.data() + 2 * k, 2);
        wide[k] = x;
    }
    const auto wb = std::as_bytes(std::span(wide));
    ExpectSameAsGeneral(d, {wb.begin(), wb.end()}, DType::kUInt32, cv, DType::kBFloat16, nnz);
    // Values of the wrong length.
    ExpectSameAsGeneral(d, ci, DType::kUInt16, {cv.begin(), cv.end() - 2}, DType::kBFloat16, nnz);
}

TEST(BuildSortedFastPathTest, IndexingCanonicalEntriesGivesTheBuiltObjectWithoutItsMembers) {
    std::mt19937_64 rng(5);
    const Shape shape = {128, 640};
    SourceDescriptor d = MakeDesc(shape);
    const std::int64_t nnz = 300;
    const auto coords = RandomUniqueCoords(rng, shape, nnz);
    const std::vector<float> vals(nnz, 2.0f);
    ASSERT_OK_AND_ASSIGN(SparseObject built, BuildSparseObject(d, View(coords, {nnz, 2}), View(vals, {nnz})));
    const HostArray i{DType::kUInt16, {nnz, 2}, built.indices};
    const HostArray v{DType::kFloat32, {nnz}, built.values};
    std::optional<SparseObject> indexed = IndexCanonicalEntries(d, i, v, {});
    ASSERT_TRUE(indexed.has_value());
    EXPECT_TRUE(indexed->indices.empty() && indexed->values.empty());
    EXPECT_EQ(indexed->tile_coords, built.tile_coords);
    EXPECT_EQ(indexed->tile_ptr, built.tile_ptr);
    EXPECT_EQ(indexed->desc.nnz, built.desc.nnz);
    EXPECT_EQ(indexed->checksum_indices, built.checksum_indices);
    EXPECT_EQ(indexed->checksum_values, built.checksum_values);
    EXPECT_EQ(indexed->checksum_tile_ptr, built.checksum_tile_ptr);
    // Not canonical (the raw, unsorted coordinates in int64): no index, the general path decides.
    EXPECT_FALSE(IndexCanonicalEntries(d, View(coords, {nnz, 2}), View(vals, {nnz}), {}).has_value());
}

TEST(BuildSortedFastPathTest, OtherRanksAndDuplicatePoliciesTakeTheGeneralPath) {
    std::mt19937_64 rng(11);
    for (const Shape& shape : {Shape{4000}, Shape{6, 40, 30}}) {
        SourceDescriptor d = MakeDesc(shape);
        const std::int64_t nnz = 120;
        const auto coords = RandomUniqueCoords(rng, shape, nnz);
        const std::vector<float> vals(nnz, 1.5f);
        ASSERT_OK_AND_ASSIGN(SparseObject canon,
                             BuildSparseObject(d, View(coords, {nnz, Index(shape.size())}), View(vals, {nnz})));
        ExpectSameAsGeneral(d, canon.indices, canon.desc.index_dtype, canon.values, DType::kFloat32, nnz);
    }
    SourceDescriptor sum = MakeDesc({64, 64}, ApplyMode::kScatterAdd);
    EncodeOptions opts;
    opts.duplicates = DuplicatePolicy::kSum;
    const std::vector<std::uint16_t> idx = {1, 1, 1, 1, 2, 3};
    const std::vector<float> vals = {1, 2, 3};
    const auto ib = std::as_bytes(std::span(idx));
    const auto vb = std::as_bytes(std::span(vals));
    ExpectSameAsGeneral(sum, {ib.begin(), ib.end()}, DType::kUInt16, {vb.begin(), vb.end()},
                        DType::kFloat32, 3, opts);
}

}  // namespace
}  // namespace mooncake::sparse
