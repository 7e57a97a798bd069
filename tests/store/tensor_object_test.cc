// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The tensor object format against upstream Mooncake's layout (integration_utils.h): size 304,
// every field offset, the dtype numbering both ways, and header validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "store/tensor_object.h"
#include "store_test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::StatusIsWithMessage;

// An independent transcription of upstream's structs (natural alignment, x86-64): the layout our
// explicit codec must reproduce byte for byte.
namespace upstream {
struct TensorShape {
    std::int64_t dims[8];
};
struct LayoutAxis {
    std::int32_t kind;
    std::int32_t axis_index;
    std::int32_t shard_rank;
    std::int32_t shard_count;
    std::int32_t split_dim;
    std::int32_t reserved0;
    std::int64_t reserved1;
};
struct TensorLayoutMetadata {
    TensorShape global_shape;
    TensorShape local_shape;
    std::uint32_t axis_count;
    std::uint32_t reserved0;
    LayoutAxis axes[4];
};
struct TensorObjectHeader {
    std::uint32_t magic;
    std::uint16_t version;
    std::uint16_t header_size;
    std::int32_t dtype;
    std::int32_t ndim;
    std::uint32_t layout_kind;
    std::uint32_t reserved_flags;
    std::uint64_t data_offset;
    std::uint64_t data_bytes;
};
struct TensorMetadata {
    TensorObjectHeader header;
    TensorLayoutMetadata layout;
};
}  // namespace upstream

namespace off = tensor_header_offsets;

TEST(TensorObjectTest, LayoutMatchesUpstreamStructs) {
    static_assert(sizeof(upstream::TensorObjectHeader) == 40);
    static_assert(sizeof(upstream::TensorLayoutMetadata) == 264);
    static_assert(sizeof(upstream::TensorMetadata) == kTensorHeaderBytes);
    static_assert(sizeof(upstream::LayoutAxis) == kTensorLayoutAxisBytes);
    using H = upstream::TensorObjectHeader;
    using M = upstream::TensorMetadata;
    EXPECT_EQ(offsetof(H, magic), off::kMagic);
    EXPECT_EQ(offsetof(H, version), off::kVersion);
    EXPECT_EQ(offsetof(H, header_size), off::kHeaderSize);
    EXPECT_EQ(offsetof(H, dtype), off::kDType);
    EXPECT_EQ(offsetof(H, ndim), off::kNdim);
    EXPECT_EQ(offsetof(H, layout_kind), off::kLayoutKind);
    EXPECT_EQ(offsetof(H, reserved_flags), off::kReservedFlags);
    EXPECT_EQ(offsetof(H, data_offset), off::kDataOffset);
    EXPECT_EQ(offsetof(H, data_bytes), off::kDataBytes);
    EXPECT_EQ(offsetof(M, layout) + offsetof(upstream::TensorLayoutMetadata, global_shape),
              off::kGlobalShape);
    EXPECT_EQ(offsetof(M, layout) + offsetof(upstream::TensorLayoutMetadata, local_shape),
              off::kLocalShape);
    EXPECT_EQ(offsetof(M, layout) + offsetof(upstream::TensorLayoutMetadata, axis_count),
              off::kAxisCount);
    EXPECT_EQ(offsetof(M, layout) + offsetof(upstream::TensorLayoutMetadata, reserved0),
              off::kLayoutReserved0);
    EXPECT_EQ(offsetof(M, layout) + offsetof(upstream::TensorLayoutMetadata, axes), off::kAxes);
}

TEST(TensorObjectTest, DTypeNumberingBothWays) {
    const std::pair<DType, std::int32_t> table[] = {
        {DType::kFloat32, 0},  {DType::kFloat64, 1},  {DType::kInt8, 2},
        {DType::kUInt8, 3},    {DType::kInt16, 4},    {DType::kUInt16, 5},
        {DType::kInt32, 6},    {DType::kUInt32, 7},   {DType::kInt64, 8},
        {DType::kUInt64, 9},   {DType::kBool, 10},    {DType::kFloat16, 11},
        {DType::kBFloat16, 12}, {DType::kFloat8E4M3, 13}, {DType::kFloat8E5M2, 14},
    };
    ASSERT_EQ(std::size(table), static_cast<std::size_t>(kNumDTypes));
    for (const auto& [dtype, value] : table) {
        EXPECT_EQ(ToUpstreamDType(dtype), value) << DTypeName(dtype);
        auto back = FromUpstreamDType(value);
        ASSERT_TRUE(back.ok());
        EXPECT_EQ(*back, dtype) << value;
    }
    EXPECT_THAT(FromUpstreamDType(-1), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(FromUpstreamDType(15), StatusIs(StatusCode::kInvalidArgument));
}

TEST(TensorObjectTest, EncodedHeaderReadsBackThroughUpstreamStruct) {
    auto h = MakeFullTensorHeader(DType::kBFloat16, {3, 5, 7});
    ASSERT_TRUE(h.ok());
    std::array<std::byte, kTensorHeaderBytes> bytes;
    EncodeTensorHeader(*h, bytes);
    upstream::TensorMetadata m;
    std::memcpy(&m, bytes.data(), sizeof(m));
    EXPECT_EQ(m.header.magic, 0x4d4f4f4eu);
    EXPECT_EQ(m.header.version, 1);
    EXPECT_EQ(m.header.header_size, 304);
    EXPECT_EQ(m.header.dtype, 12);
    EXPECT_EQ(m.header.ndim, 3);
    EXPECT_EQ(m.header.layout_kind, 0u);
    EXPECT_EQ(m.header.reserved_flags, 0u);
    EXPECT_EQ(m.header.data_offset, 304u);
    EXPECT_EQ(m.header.data_bytes, 3u * 5 * 7 * 2);
    const std::int64_t expect_dims[8] = {3, 5, 7, -1, -1, -1, -1, -1};
    for (int d = 0; d < 8; ++d) {
        EXPECT_EQ(m.layout.global_shape.dims[d], expect_dims[d]) << d;
        EXPECT_EQ(m.layout.local_shape.dims[d], expect_dims[d]) << d;
    }
    EXPECT_EQ(m.layout.axis_count, 0u);
    EXPECT_EQ(m.layout.reserved0, 0u);
    // The "NOOM" magic in memory order.
    EXPECT_EQ(std::to_integer<char>(bytes[0]), 'N');
    EXPECT_EQ(std::to_integer<char>(bytes[3]), 'M');
}

TEST(TensorObjectTest, UpstreamWrittenShardHeaderDecodes) {
    // As upstream's BuildTensorMetadata writes a TP shard: global [8, 4], local [4, 4].
    upstream::TensorMetadata m{};
    m.header = {0x4d4f4f4eu, 1, 304, /*dtype=*/0, /*ndim=*/2, /*layout=*/1, 0, 304, 4 * 4 * 4};
    for (int d = 0; d < 8; ++d) m.layout.global_shape.dims[d] = m.layout.local_shape.dims[d] = -1;
    m.layout.global_shape.dims[0] = 8;
    m.layout.global_shape.dims[1] = 4;
    m.layout.local_shape.dims[0] = 4;
    m.layout.local_shape.dims[1] = 4;
    m.layout.axis_count = 1;
    m.layout.axes[0] = {/*TP*/ 1, 0, /*rank*/ 1, /*count*/ 2, /*split_dim*/ 0, 0, 0};
    std::vector<std::byte> object(304 + 64);
    std::memcpy(object.data(), &m, sizeof(m));
    auto h = DecodeTensorHeader(object, object.size());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->dtype, DType::kFloat32);
    EXPECT_EQ(h->layout_kind, TensorLayoutKind::kShard);
    EXPECT_EQ(h->global_shape, (Shape{8, 4}));
    EXPECT_EQ(h->local_shape, (Shape{4, 4}));
    ASSERT_EQ(h->axes.size(), 1u);
    EXPECT_EQ(h->axes[0].shard_rank, 1);
    EXPECT_EQ(h->axes[0].shard_count, 2);
    // Re-encoding reproduces upstream's bytes exactly.
    std::array<std::byte, kTensorHeaderBytes> again;
    EncodeTensorHeader(*h, again);
    EXPECT_EQ(std::memcmp(again.data(), object.data(), kTensorHeaderBytes), 0);
}

TEST(TensorObjectTest, ScalarAndEveryDTypeRoundTrip) {
    for (int i = 0; i < kNumDTypes; ++i) {
        const auto dtype = static_cast<DType>(i);
        for (const Shape& shape : {Shape{}, Shape{1}, Shape{2, 3, 4, 5, 6, 7, 8, 9}}) {
            auto h = MakeFullTensorHeader(dtype, shape);
            ASSERT_TRUE(h.ok());
            std::vector<std::byte> object(kTensorHeaderBytes + h->data_bytes);
            EncodeTensorHeader(*h, std::span<std::byte, kTensorHeaderBytes>(object.data(), kTensorHeaderBytes));
            auto back = DecodeTensorHeader(object, object.size());
            ASSERT_TRUE(back.ok()) << back.status().ToString();
            EXPECT_EQ(*back, *h);
        }
    }
}

TEST(TensorObjectTest, MakeRejectsWhatUpstreamCannotRead) {
    EXPECT_THAT(MakeFullTensorHeader(DType::kFloat32, {1, 2, 3, 4, 5, 6, 7, 8, 9}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "at most 8"));
    EXPECT_THAT(MakeFullTensorHeader(DType::kFloat32, {4, 0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "extent < 1"));
    EXPECT_THAT(MakeFullTensorHeader(DType::kFloat32, {-1}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(MakeFullTensorHeader(DType::kFloat64, {Index{1} << 31, Index{1} << 31, 8}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(MakeFullTensorHeader(static_cast<DType>(99), {1}),
                StatusIs(StatusCode::kInvalidArgument));
}

TEST(TensorObjectTest, DecodeRejectsEveryBadField) {
    auto h = MakeFullTensorHeader(DType::kInt32, {2, 2});
    ASSERT_TRUE(h.ok());
    std::vector<std::byte> good(kTensorHeaderBytes + 16);
    EncodeTensorHeader(*h, std::span<std::byte, kTensorHeaderBytes>(good.data(), kTensorHeaderBytes));
    ASSERT_TRUE(DecodeTensorHeader(good, good.size()).ok());

    auto corrupt = [&](std::size_t offset, std::uint64_t value, int n) {
        std::vector<std::byte> b = good;
        for (int i = 0; i < n; ++i) b[offset + i] = static_cast<std::byte>(value >> (8 * i));
        return DecodeTensorHeader(b, b.size());
    };
    EXPECT_THAT(corrupt(off::kMagic, 0x12345678, 4), StatusIsWithMessage(StatusCode::kInvalidArgument, "magic"));
    EXPECT_THAT(corrupt(off::kVersion, 2, 2), StatusIsWithMessage(StatusCode::kInvalidArgument, "version"));
    EXPECT_THAT(corrupt(off::kHeaderSize, 40, 2), StatusIsWithMessage(StatusCode::kInvalidArgument, "header_size"));
    EXPECT_THAT(corrupt(off::kDType, 15, 4), StatusIsWithMessage(StatusCode::kInvalidArgument, "dtype"));
    EXPECT_THAT(corrupt(off::kNdim, 9, 4), StatusIsWithMessage(StatusCode::kInvalidArgument, "ndim"));
    EXPECT_THAT(corrupt(off::kLayoutKind, 2, 4), StatusIsWithMessage(StatusCode::kInvalidArgument, "layout_kind"));
    EXPECT_THAT(corrupt(off::kDataOffset, 100, 8), StatusIsWithMessage(StatusCode::kInvalidArgument, "data_offset"));
    EXPECT_THAT(corrupt(off::kDataBytes, 15, 8), StatusIsWithMessage(StatusCode::kInvalidArgument, "data_bytes"));
    EXPECT_THAT(corrupt(off::kGlobalShape, 0, 8), StatusIsWithMessage(StatusCode::kInvalidArgument, "extent"));
    EXPECT_THAT(corrupt(off::kLocalShape + 8 * 2, 5, 8), StatusIsWithMessage(StatusCode::kInvalidArgument, "unused dim"));
    EXPECT_THAT(corrupt(off::kLocalShape, 3, 8), StatusIsWithMessage(StatusCode::kInvalidArgument, "does not match data_bytes"));
    EXPECT_THAT(corrupt(off::kAxisCount, 5, 4), StatusIsWithMessage(StatusCode::kInvalidArgument, "axis_count"));
    EXPECT_THAT(DecodeTensorHeader(std::span<const std::byte>(good).first(100), 100),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "shorter"));
    // The object size decides data_bytes: a truncated object is not a tensor.
    EXPECT_THAT(DecodeTensorHeader(good, good.size() - 1), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace mooncake::sparse
