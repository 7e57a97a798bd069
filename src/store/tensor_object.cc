// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "store/tensor_object.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace mooncake::sparse {
namespace {

namespace off = tensor_header_offsets;

void PutLE(std::span<std::byte> out, std::size_t offset, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out[offset + i] = static_cast<std::byte>(v >> (8 * i));
}

std::uint64_t GetLE(std::span<const std::byte> in, std::size_t offset, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(in[offset + i])) << (8 * i);
    return v;
}

std::int32_t GetI32(std::span<const std::byte> in, std::size_t offset) {
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(GetLE(in, offset, 4)));
}
std::int64_t GetI64(std::span<const std::byte> in, std::size_t offset) {
    return static_cast<std::int64_t>(GetLE(in, offset, 8));
}

Status Bad(const std::string& what) {
    return InvalidArgument("not a valid tensor object: " + what);
}

}  // namespace

std::int32_t ToUpstreamDType(DType dtype) {
    switch (dtype) {
        case DType::kFloat32: return 0;
        case DType::kFloat64: return 1;
        case DType::kInt8: return 2;
        case DType::kUInt8: return 3;
        case DType::kInt16: return 4;
        case DType::kUInt16: return 5;
        case DType::kInt32: return 6;
        case DType::kUInt32: return 7;
        case DType::kInt64: return 8;
        case DType::kUInt64: return 9;
        case DType::kBool: return 10;
        case DType::kFloat16: return 11;
        case DType::kBFloat16: return 12;
        case DType::kFloat8E4M3: return 13;
        case DType::kFloat8E5M2: return 14;
    }
    return -1;
}

Result<DType> FromUpstreamDType(std::int32_t value) {
    static constexpr DType kTable[kNumUpstreamDTypes] = {
        DType::kFloat32, DType::kFloat64,  DType::kInt8,       DType::kUInt8,
        DType::kInt16,   DType::kUInt16,   DType::kInt32,      DType::kUInt32,
        DType::kInt64,   DType::kUInt64,   DType::kBool,       DType::kFloat16,
        DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2,
    };
    if (value < 0 || value >= kNumUpstreamDTypes) {
        return InvalidArgument("tensor dtype value " + std::to_string(value) +
                               " is not one of upstream's TensorDtype values 0 .. " +
                               std::to_string(kNumUpstreamDTypes - 1));
    }
    return kTable[value];
}

Result<std::uint64_t> ShapeElements(const Shape& shape) {
    std::uint64_t n = 1;
    for (const Index e : shape) {
        if (e < 0) return InvalidArgument("shape " + ShapeString(shape) + " has a negative extent");
        if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(e), &n)) {
            return InvalidArgument("shape " + ShapeString(shape) + " overflows");
        }
    }
    return n;
}

std::string ShapeString(const Shape& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

Result<TensorHeader> MakeFullTensorHeader(DType dtype, const Shape& shape) {
    const auto dtype_value = static_cast<int>(dtype);
    if (dtype_value < 0 || dtype_value >= kNumDTypes) {
        return InvalidArgument("unknown dtype value " + std::to_string(dtype_value));
    }
    if (shape.size() > kTensorMaxDims) {
        return InvalidArgument("tensor of rank " + std::to_string(shape.size()) +
                               ": the tensor object format holds at most " +
                               std::to_string(kTensorMaxDims) + " dimensions");
    }
    for (const Index e : shape) {
        if (e < 1) {
            return InvalidArgument("tensor shape " + ShapeString(shape) +
                                   " has an extent < 1; the tensor object format (upstream's "
                                   "header) requires every extent >= 1");
        }
    }
    MCS_ASSIGN_OR_RETURN(const std::uint64_t elements, ShapeElements(shape));
    std::uint64_t bytes = 0;
    if (__builtin_mul_overflow(elements, std::uint64_t{DTypeSize(dtype)}, &bytes) ||
        bytes > std::uint64_t{1} << 62) {
        return InvalidArgument("tensor shape " + ShapeString(shape) + " of " +
                               std::string(DTypeName(dtype)) + " is too large");
    }
    TensorHeader h;
    h.dtype = dtype;
    h.global_shape = shape;
    h.local_shape = shape;
    h.data_bytes = bytes;
    return h;
}

void EncodeTensorHeader(const TensorHeader& h, std::span<std::byte, kTensorHeaderBytes> out_fixed) {
    std::span<std::byte> out(out_fixed);
    std::memset(out.data(), 0, out.size());
    PutLE(out, off::kMagic, kTensorObjectMagic, 4);
    PutLE(out, off::kVersion, kTensorObjectVersion, 2);
    PutLE(out, off::kHeaderSize, kTensorHeaderBytes, 2);
    PutLE(out, off::kDType, static_cast<std::uint32_t>(ToUpstreamDType(h.dtype)), 4);
    PutLE(out, off::kNdim, static_cast<std::uint32_t>(h.local_shape.size()), 4);
    PutLE(out, off::kLayoutKind, static_cast<std::uint32_t>(h.layout_kind), 4);
    PutLE(out, off::kReservedFlags, h.reserved_flags, 4);
    PutLE(out, off::kDataOffset, h.data_offset, 8);
    PutLE(out, off::kDataBytes, h.data_bytes, 8);
    for (std::size_t d = 0; d < kTensorMaxDims; ++d) {
        const std::int64_t g = d < h.global_shape.size() ? h.global_shape[d] : -1;
        const std::int64_t l = d < h.local_shape.size() ? h.local_shape[d] : -1;
        PutLE(out, off::kGlobalShape + 8 * d, static_cast<std::uint64_t>(g), 8);
        PutLE(out, off::kLocalShape + 8 * d, static_cast<std::uint64_t>(l), 8);
    }
    const std::size_t axes = std::min(h.axes.size(), kTensorMaxLayoutAxes);
    PutLE(out, off::kAxisCount, axes, 4);
    for (std::size_t i = 0; i < axes; ++i) {
        const TensorLayoutAxis& a = h.axes[i];
        const std::size_t base = off::kAxes + i * kTensorLayoutAxisBytes;
        PutLE(out, base + 0, static_cast<std::uint32_t>(a.kind), 4);
        PutLE(out, base + 4, static_cast<std::uint32_t>(a.axis_index), 4);
        PutLE(out, base + 8, static_cast<std::uint32_t>(a.shard_rank), 4);
        PutLE(out, base + 12, static_cast<std::uint32_t>(a.shard_count), 4);
        PutLE(out, base + 16, static_cast<std::uint32_t>(a.split_dim), 4);
        PutLE(out, base + 20, static_cast<std::uint32_t>(a.reserved0), 4);
        PutLE(out, base + 24, static_cast<std::uint64_t>(a.reserved1), 8);
    }
}

Result<TensorHeader> DecodeTensorHeader(std::span<const std::byte> in, std::uint64_t object_bytes) {
    if (in.size() < kTensorHeaderBytes || object_bytes < kTensorHeaderBytes) {
        return Bad(std::to_string(std::min<std::uint64_t>(in.size(), object_bytes)) +
                   " bytes, shorter than the " + std::to_string(kTensorHeaderBytes) +
                   "-byte header");
    }
    if (const auto magic = GetLE(in, off::kMagic, 4); magic != kTensorObjectMagic) {
        return Bad("magic is " + std::to_string(magic) + ", expected " +
                   std::to_string(kTensorObjectMagic));
    }
    if (const auto v = GetLE(in, off::kVersion, 2); v != kTensorObjectVersion) {
        return Bad("version " + std::to_string(v) + " (this build reads version " +
                   std::to_string(kTensorObjectVersion) + ")");
    }
    if (const auto hs = GetLE(in, off::kHeaderSize, 2); hs != kTensorHeaderBytes) {
        return Bad("header_size " + std::to_string(hs) + ", expected " +
                   std::to_string(kTensorHeaderBytes));
    }
    TensorHeader h;
    auto dtype = FromUpstreamDType(GetI32(in, off::kDType));
    if (!dtype.ok()) return Bad(dtype.status().message());
    h.dtype = *dtype;
    const std::int32_t ndim = GetI32(in, off::kNdim);
    if (ndim < 0 || ndim > static_cast<std::int32_t>(kTensorMaxDims)) {
        return Bad("ndim " + std::to_string(ndim) + " is not within 0 .. " +
                   std::to_string(kTensorMaxDims));
    }
    const auto layout = static_cast<std::uint32_t>(GetLE(in, off::kLayoutKind, 4));
    if (layout > static_cast<std::uint32_t>(TensorLayoutKind::kShard)) {
        return Bad("layout_kind " + std::to_string(layout));
    }
    h.layout_kind = static_cast<TensorLayoutKind>(layout);
    h.reserved_flags = static_cast<std::uint32_t>(GetLE(in, off::kReservedFlags, 4));
    h.data_offset = GetLE(in, off::kDataOffset, 8);
    h.data_bytes = GetLE(in, off::kDataBytes, 8);
    if (h.data_offset < kTensorHeaderBytes || h.data_offset > object_bytes) {
        return Bad("data_offset " + std::to_string(h.data_offset) + " is not within [" +
                   std::to_string(kTensorHeaderBytes) + ", " + std::to_string(object_bytes) + "]");
    }
    if (h.data_bytes != object_bytes - h.data_offset) {
        return Bad("data_bytes " + std::to_string(h.data_bytes) + " but the object holds " +
                   std::to_string(object_bytes - h.data_offset) + " bytes after data_offset");
    }
    for (std::size_t d = 0; d < kTensorMaxDims; ++d) {
        const std::int64_t g = GetI64(in, off::kGlobalShape + 8 * d);
        const std::int64_t l = GetI64(in, off::kLocalShape + 8 * d);
        if (d < static_cast<std::size_t>(ndim)) {
            if (g <= 0 || l < 0) {
                return Bad("extent " + std::to_string(g) + " (global) / " + std::to_string(l) +
                           " (local) on dim " + std::to_string(d));
            }
            h.global_shape.push_back(g);
            h.local_shape.push_back(l);
        } else if (g != -1 || l != -1) {
            return Bad("unused dim " + std::to_string(d) + " is not -1");
        }
    }
    const auto axis_count = static_cast<std::uint32_t>(GetLE(in, off::kAxisCount, 4));
    if (axis_count > kTensorMaxLayoutAxes) {
        return Bad("axis_count " + std::to_string(axis_count));
    }
    for (std::uint32_t i = 0; i < axis_count; ++i) {
        const std::size_t base = off::kAxes + i * kTensorLayoutAxisBytes;
        TensorLayoutAxis a;
        a.kind = GetI32(in, base + 0);
        a.axis_index = GetI32(in, base + 4);
        a.shard_rank = GetI32(in, base + 8);
        a.shard_count = GetI32(in, base + 12);
        a.split_dim = GetI32(in, base + 16);
        a.reserved0 = GetI32(in, base + 20);
        a.reserved1 = GetI64(in, base + 24);
        if (a.kind < 0 || a.kind > 4 || a.shard_count <= 0 || a.shard_rank < 0 ||
            a.shard_rank >= a.shard_count || a.split_dim < -1 || a.split_dim >= ndim) {
            return Bad("layout axis " + std::to_string(i) + " is malformed");
        }
        h.axes.push_back(a);
    }
    auto elements = ShapeElements(h.local_shape);
    std::uint64_t expect = 0;
    if (!elements.ok() ||
        __builtin_mul_overflow(*elements, std::uint64_t{DTypeSize(h.dtype)}, &expect) ||
        expect != h.data_bytes) {
        return Bad("local_shape " + ShapeString(h.local_shape) + " of " +
                   std::string(DTypeName(h.dtype)) + " does not match data_bytes " +
                   std::to_string(h.data_bytes));
    }
    return h;
}

}  // namespace mooncake::sparse
