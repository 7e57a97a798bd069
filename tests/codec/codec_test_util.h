// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Helpers of the codec tests: typed host arrays over std::vectors, a descriptor factory, a
// reference (tile, element) sort, decoding of narrowed indices, and Status matchers.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "codec/codec.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/status.h"
#include "../status_matchers.h"

namespace mooncake::sparse {

namespace codec_testing {

using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::StatusIs;


template <typename T>
constexpr DType DTypeOf() {
    if constexpr (std::is_same_v<T, std::uint8_t>) return DType::kUInt8;
    if constexpr (std::is_same_v<T, std::int8_t>) return DType::kInt8;
    if constexpr (std::is_same_v<T, std::uint16_t>) return DType::kUInt16;
    if constexpr (std::is_same_v<T, std::int16_t>) return DType::kInt16;
    if constexpr (std::is_same_v<T, std::uint32_t>) return DType::kUInt32;
    if constexpr (std::is_same_v<T, std::int32_t>) return DType::kInt32;
    if constexpr (std::is_same_v<T, std::uint64_t>) return DType::kUInt64;
    if constexpr (std::is_same_v<T, std::int64_t>) return DType::kInt64;
    if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
    if constexpr (std::is_same_v<T, double>) return DType::kFloat64;
    return DType::kBool;
}

/// A read-only view of `v` as `dtype` with `shape` (dtype defaults to the C++ type's).
template <typename T>
HostArray View(const std::vector<T>& v, Shape shape, DType dtype = DTypeOf<T>()) {
    return HostArray{dtype, std::move(shape), std::as_bytes(std::span(v))};
}
template <typename T>
MutableHostArray MutableView(std::vector<T>& v, Shape shape, DType dtype = DTypeOf<T>()) {
    return MutableHostArray{dtype, std::move(shape), std::as_writable_bytes(std::span(v))};
}
inline HostArray ByteView(std::span<const std::byte> v, DType dtype, Shape shape) {
    return HostArray{dtype, std::move(shape), std::span<const std::byte>(v)};
}

inline SourceDescriptor MakeDesc(Shape global_shape, ApplyMode apply = ApplyMode::kOverwrite) {
    SourceDescriptor d;
    d.tensor_id = "layers.0.w";
    d.global_shape = std::move(global_shape);
    d.generation = Generation{0, 1};
    d.apply = apply;
    return d;
}

/// Row-major coordinates of a linear element offset.
inline std::vector<std::int64_t> Unravel(std::int64_t lin, const Shape& shape) {
    std::vector<std::int64_t> c(shape.size());
    for (std::size_t d = shape.size(); d-- > 0;) {
        c[d] = lin % shape[d];
        lin /= shape[d];
    }
    return c;
}

/// `count` distinct random coordinates of `shape`, flat [count, rank], in random order.
inline std::vector<std::int64_t> RandomUniqueCoords(std::mt19937_64& rng, const Shape& shape,
                                                    std::int64_t count) {
    const std::int64_t total = NumElements(shape);
    count = std::min(count, total);
    std::vector<std::int64_t> lin;
    if (count * 2 >= total) {
        lin.resize(static_cast<std::size_t>(total));
        std::iota(lin.begin(), lin.end(), std::int64_t{0});
        std::shuffle(lin.begin(), lin.end(), rng);
        lin.resize(static_cast<std::size_t>(count));
    } else {
        std::unordered_set<std::int64_t> seen;
        std::uniform_int_distribution<std::int64_t> pick(0, total - 1);
        while (static_cast<std::int64_t>(lin.size()) < count) {
            const std::int64_t v = pick(rng);
            if (seen.insert(v).second) lin.push_back(v);
        }
    }
    std::vector<std::int64_t> out;
    for (std::int64_t v : lin) {
        auto c = Unravel(v, shape);
        out.insert(out.end(), c.begin(), c.end());
    }
    return out;
}

/// The order of entries sorted by (tile row-major, element row-major); stable.
inline std::vector<std::size_t> ReferenceOrder(const std::vector<std::int64_t>& coords,
                                               const Shape& tile_shape) {
    const std::size_t rank = tile_shape.size();
    const std::size_t n = coords.size() / rank;
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        for (std::size_t d = 0; d < rank; ++d) {
            const std::int64_t ta = coords[a * rank + d] / tile_shape[d];
            const std::int64_t tb = coords[b * rank + d] / tile_shape[d];
            if (ta != tb) return ta < tb;
        }
        for (std::size_t d = 0; d < rank; ++d) {
            if (coords[a * rank + d] != coords[b * rank + d]) {
                return coords[a * rank + d] < coords[b * rank + d];
            }
        }
        return false;
    });
    return order;
}

/// Decodes [n, rank] indices of an unsigned index dtype to uint64.
inline std::vector<std::uint64_t> DecodeIndices(std::span<const std::byte> bytes, DType dtype) {
    std::vector<std::uint64_t> out;
    const std::size_t size = DTypeSize(dtype);
    for (std::size_t off = 0; off + size <= bytes.size(); off += size) {
        std::uint64_t v = 0;
        switch (dtype) {
            case DType::kUInt16: {
                std::uint16_t x;
                std::memcpy(&x, bytes.data() + off, 2);
                v = x;
                break;
            }
            case DType::kUInt32: {
                std::uint32_t x;
                std::memcpy(&x, bytes.data() + off, 4);
                v = x;
                break;
            }
            default:
                std::memcpy(&v, bytes.data() + off, 8);
                break;
        }
        out.push_back(v);
    }
    return out;
}

template <typename T>
std::vector<T> DecodeValues(std::span<const std::byte> bytes) {
    std::vector<T> out(bytes.size() / sizeof(T));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
    return out;
}

template <typename T>
std::vector<std::byte> ToBytes(const std::vector<T>& v) {
    std::vector<std::byte> out(v.size() * sizeof(T));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

}  // namespace codec_testing
}  // namespace mooncake::sparse
