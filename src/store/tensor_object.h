// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The tensor object format (docs/design.md §5): byte-compatible with upstream Mooncake's put_tensor /
// get_tensor, so that a tensor written by one is readable by the other. An object's bytes are
//
//     [ TensorObjectHeader (40 bytes) | TensorLayoutMetadata (264 bytes) ][ tensor data ]
//
// i.e. a 304-byte header followed by the C-contiguous data, all little-endian. The field offsets
// below are upstream's `struct TensorMetadata { TensorObjectHeader header; TensorLayoutMetadata
// layout; }` (integration_utils.h) with natural alignment:
//
//     offset size  field
//          0    4  magic           0x4d4f4f4e ("NOOM" in memory, upstream's kTensorObjectMagic)
//          4    2  version         1
//          6    2  header_size     304 (sizeof(TensorMetadata))
//          8    4  dtype           upstream's TensorDtype numbering (UpstreamDType below)
//         12    4  ndim            0 .. 8
//         16    4  layout_kind     0 FULL, 1 SHARD
//         20    4  reserved_flags  0
//         24    8  data_offset     304 (>= 304; where the data starts)
//         32    8  data_bytes      object bytes - data_offset
//         40   64  global_shape    int64[8], unused dims -1
//        104   64  local_shape     int64[8], unused dims -1 (the shape of the stored data)
//        168    4  axis_count      0 .. 4
//        172    4  reserved0
//        176  128  axes            4 x {i32 kind, axis_index, shard_rank, shard_count, split_dim,
//                                       reserved0; i64 reserved1} (32 bytes each)
//
// In this library a tensor object is an ObjectStore object with ONE member, kTensorMemberName
// (uint8, [304 + data bytes]), whose bytes are exactly upstream's value for the key, and empty
// metadata. The codec here is explicit (fixed offsets, little-endian), not a memcpy of a struct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// Upstream's TensorDtype values (an int32 in the header). Not the same numbering as DType.
enum class UpstreamDType : std::int32_t {
    kFloat32 = 0,
    kFloat64 = 1,
    kInt8 = 2,
    kUInt8 = 3,
    kInt16 = 4,
    kUInt16 = 5,
    kInt32 = 6,
    kUInt32 = 7,
    kInt64 = 8,
    kUInt64 = 9,
    kBool = 10,
    kFloat16 = 11,
    kBFloat16 = 12,
    kFloat8E4M3 = 13,
    kFloat8E5M2 = 14,
};
inline constexpr std::int32_t kNumUpstreamDTypes = 15;

/// DType -> upstream's number (every DType has one).
std::int32_t ToUpstreamDType(DType dtype);
/// Upstream's number -> DType.
/// Errors: InvalidArgument (outside 0 .. 14).
Result<DType> FromUpstreamDType(std::int32_t value);

inline constexpr std::uint32_t kTensorObjectMagic = 0x4d4f4f4eu;
inline constexpr std::uint16_t kTensorObjectVersion = 1;
inline constexpr std::size_t kTensorMaxDims = 8;
inline constexpr std::size_t kTensorMaxLayoutAxes = 4;
inline constexpr std::size_t kTensorHeaderBytes = 304;
inline constexpr std::size_t kTensorLayoutAxisBytes = 32;
/// The member that holds [header][data] in an ObjectStore object.
inline constexpr std::string_view kTensorMemberName = "tensor";

/// Byte offsets of the header fields (see the table above).
namespace tensor_header_offsets {
inline constexpr std::size_t kMagic = 0;
inline constexpr std::size_t kVersion = 4;
inline constexpr std::size_t kHeaderSize = 6;
inline constexpr std::size_t kDType = 8;
inline constexpr std::size_t kNdim = 12;
inline constexpr std::size_t kLayoutKind = 16;
inline constexpr std::size_t kReservedFlags = 20;
inline constexpr std::size_t kDataOffset = 24;
inline constexpr std::size_t kDataBytes = 32;
inline constexpr std::size_t kGlobalShape = 40;
inline constexpr std::size_t kLocalShape = 104;
inline constexpr std::size_t kAxisCount = 168;
inline constexpr std::size_t kLayoutReserved0 = 172;
inline constexpr std::size_t kAxes = 176;
}  // namespace tensor_header_offsets

enum class TensorLayoutKind : std::uint32_t {
    kFull = 0,   ///< The object holds the whole tensor (what put_tensor writes).
    kShard = 1,  ///< The object holds one shard (upstream's *_with_tp / parallelism writers).
};

/// Upstream's LayoutAxis, kept verbatim so that shard objects round-trip.
struct TensorLayoutAxis {
    std::int32_t kind = 0;  ///< 0 DP, 1 TP, 2 EP, 3 PP, 4 RESERVED.
    std::int32_t axis_index = 0;
    std::int32_t shard_rank = 0;
    std::int32_t shard_count = 1;
    std::int32_t split_dim = -1;
    std::int32_t reserved0 = 0;
    std::int64_t reserved1 = 0;

    friend bool operator==(const TensorLayoutAxis&, const TensorLayoutAxis&) = default;
};

/// A decoded header. `local_shape` is the shape of the data the object holds.
struct TensorHeader {
    DType dtype = DType::kFloat32;
    Shape global_shape;
    Shape local_shape;
    TensorLayoutKind layout_kind = TensorLayoutKind::kFull;
    std::uint32_t reserved_flags = 0;
    std::vector<TensorLayoutAxis> axes;  ///< At most kTensorMaxLayoutAxes.
    std::uint64_t data_offset = kTensorHeaderBytes;
    std::uint64_t data_bytes = 0;

    friend bool operator==(const TensorHeader&, const TensorHeader&) = default;
};

/// Elements of `shape` (1 for rank 0), or nullopt-like failure on overflow.
/// Errors: InvalidArgument (negative extent, overflow).
Result<std::uint64_t> ShapeElements(const Shape& shape);

/// "[2, 3]".
std::string ShapeString(const Shape& shape);

/// The header put_tensor writes for a whole C-contiguous tensor: FULL layout, global_shape ==
/// local_shape == shape, data right after the header.
/// Errors: InvalidArgument (rank > 8, an extent < 1 — upstream's reader rejects them —, the byte
/// size overflows).
Result<TensorHeader> MakeFullTensorHeader(DType dtype, const Shape& shape);

/// Writes the 304 header bytes. The header must be valid (MakeFullTensorHeader or a decoded one).
void EncodeTensorHeader(const TensorHeader& header, std::span<std::byte, kTensorHeaderBytes> out);

/// Parses and validates the header at the start of a tensor object of `object_bytes` bytes
/// (`bytes` holds at least the first kTensorHeaderBytes of it), with upstream's checks
/// (magic, version, header_size, dtype, ndim, layout kind, axes, data_offset/data_bytes against
/// the object size, unused dims -1, extents) plus: data_bytes equals the byte size of
/// local_shape, so the header alone tells a reader what to allocate.
/// Errors: InvalidArgument naming the first bad field.
Result<TensorHeader> DecodeTensorHeader(std::span<const std::byte> bytes, std::uint64_t object_bytes);

}  // namespace mooncake::sparse
