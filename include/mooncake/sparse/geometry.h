// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Boxes in a global coordinate space, their intersection, the mapping from element boxes to tile
// boxes, and global-to-local rebasing. Free functions over an owning Box; only the standard
// library, no payload, no addresses.
#pragma once

#include <algorithm>
#include <array>
#include <initializer_list>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// Element coordinates and extents. Signed so that differences never wrap silently; every
/// factory rejects negative values and products that overflow.
using Index = std::int64_t;
using Shape = std::vector<Index>;
/// Tile coordinates as stored in a source object's `tile_coords` member.
using TileCoord = std::uint32_t;

constexpr std::size_t kMaxRank = 8;

namespace internal {
inline std::string JoinIndices(std::span<const Index> v) {
    std::string s = "(";
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(v[i]);
    }
    s += ")";
    return s;
}
/// a * b without overflow, or nullopt.
inline std::optional<Index> CheckedMul(Index a, Index b) {
    Index out;
    if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
    return out;
}
inline std::optional<Index> CheckedAdd(Index a, Index b) {
    Index out;
    if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
    return out;
}
}  // namespace internal

/// Returns OK when `shape` has rank 1..kMaxRank, every extent >= 1, and the element count fits
/// in int64.
/// Errors: InvalidArgument.
inline Status ValidateShape(std::span<const Index> shape) {
    if (shape.empty() || shape.size() > kMaxRank) {
        return InvalidArgument("shape rank " + std::to_string(shape.size()) +
                               " is outside [1, " + std::to_string(kMaxRank) + "]");
    }
    Index count = 1;
    for (Index extent : shape) {
        if (extent < 1) {
            return InvalidArgument("shape " + internal::JoinIndices(shape) +
                                   " has a non-positive extent");
        }
        auto next = internal::CheckedMul(count, extent);
        if (!next) {
            return InvalidArgument("shape " + internal::JoinIndices(shape) +
                                   " overflows int64 element count");
        }
        count = *next;
    }
    return Status::Ok();
}

inline Index NumElements(std::span<const Index> shape) {
    Index n = 1;
    for (Index e : shape) n *= e;
    return n;
}

/// A non-empty half-open box `[origin[d], origin[d] + shape[d])` in each dimension. Fixed
/// capacity (kMaxRank), so it is trivially copyable and never allocates: plans hold one per
/// region.
class Box {
public:
    Box() = default;

    /// Errors: InvalidArgument for rank mismatch, rank 0 or > kMaxRank, negative origin,
    /// empty or inverted extents, or an end that overflows int64.
    static Result<Box> Make(std::span<const Index> origin, std::span<const Index> shape) {
        if (origin.size() != shape.size()) {
            return InvalidArgument("box origin rank " + std::to_string(origin.size()) +
                                   " != shape rank " + std::to_string(shape.size()));
        }
        if (Status s = ValidateShape(shape); !s.ok()) return s.WithContext("box");
        for (std::size_t d = 0; d < origin.size(); ++d) {
            if (origin[d] < 0) {
                return InvalidArgument("box origin " + internal::JoinIndices(origin) +
                                       " is negative");
            }
            if (!internal::CheckedAdd(origin[d], shape[d])) {
                return InvalidArgument("box end overflows int64 in dim " + std::to_string(d));
            }
        }
        return Unchecked(origin, shape);
    }
    static Result<Box> Make(std::initializer_list<Index> origin, std::initializer_list<Index> shape) {
        return Make(std::span<const Index>(origin.begin(), origin.size()),
                    std::span<const Index>(shape.begin(), shape.size()));
    }

    /// The whole tensor: origin 0, extents `shape`.
    static Result<Box> Whole(std::span<const Index> shape) {
        std::array<Index, kMaxRank> zeros{};
        if (shape.size() > kMaxRank) return ValidateShape(shape);
        return Make(std::span<const Index>(zeros.data(), shape.size()), shape);
    }

    /// Caller guarantees validity (rank <= kMaxRank, extents >= 1).
    static Box Unchecked(std::span<const Index> origin, std::span<const Index> shape) {
        Box b;
        b.rank_ = static_cast<std::uint8_t>(shape.size());
        std::copy(origin.begin(), origin.end(), b.origin_.begin());
        std::copy(shape.begin(), shape.end(), b.shape_.begin());
        return b;
    }

    std::size_t rank() const { return rank_; }
    std::span<const Index> origin() const { return {origin_.data(), rank_}; }
    std::span<const Index> shape() const { return {shape_.data(), rank_}; }
    Index begin(std::size_t d) const { return origin_[d]; }
    Index end(std::size_t d) const { return origin_[d] + shape_[d]; }
    Index NumElements() const { return sparse::NumElements(shape()); }

    std::string ToString() const {
        std::string s = "[";
        for (std::size_t d = 0; d < rank(); ++d) {
            if (d) s += ", ";
            s += std::to_string(begin(d)) + ":" + std::to_string(end(d));
        }
        return s + "]";
    }

    friend bool operator==(const Box& a, const Box& b) {
        if (a.rank_ != b.rank_) return false;
        for (std::size_t d = 0; d < a.rank_; ++d) {  // a loop: ranks are tiny, no memcmp call
            if (a.origin_[d] != b.origin_[d] || a.shape_[d] != b.shape_[d]) return false;
        }
        return true;
    }

private:
    std::array<Index, kMaxRank> origin_{};
    std::array<Index, kMaxRank> shape_{};
    std::uint8_t rank_ = 0;
};

/// The intersection of two boxes of equal rank, or nullopt when they are disjoint (or of
/// different rank).
inline std::optional<Box> Intersect(const Box& a, const Box& b) {
    if (a.rank() != b.rank()) return std::nullopt;
    std::array<Index, kMaxRank> origin{}, shape{};
    const std::size_t rank = a.rank();
    for (std::size_t d = 0; d < a.rank(); ++d) {
        Index lo = std::max(a.begin(d), b.begin(d));
        Index hi = std::min(a.end(d), b.end(d));
        if (hi <= lo) return std::nullopt;
        origin[d] = lo;
        shape[d] = hi - lo;
    }
    return Box::Unchecked({origin.data(), rank}, {shape.data(), rank});
}

/// True when `inner` lies entirely inside `outer`.
inline bool Contains(const Box& outer, const Box& inner) {
    if (outer.rank() != inner.rank()) return false;
    for (std::size_t d = 0; d < outer.rank(); ++d) {
        if (inner.begin(d) < outer.begin(d) || inner.end(d) > outer.end(d)) return false;
    }
    return true;
}

/// True when the point (any integer type) lies in `box`.
template <typename T>
inline bool ContainsPoint(const Box& box, std::span<const T> point) {
    for (std::size_t d = 0; d < box.rank(); ++d) {
        const auto v = static_cast<Index>(point[d]);
        if (v < box.begin(d) || v >= box.end(d)) return false;
    }
    return true;
}

/// True when `box` lies inside the tensor `[0, shape)`.
inline bool InsideShape(const Box& box, std::span<const Index> shape) {
    if (box.rank() != shape.size()) return false;
    for (std::size_t d = 0; d < box.rank(); ++d) {
        if (box.end(d) > shape[d]) return false;
    }
    return true;
}

/// Validates a tile shape against a tensor shape: same rank, every extent in [1, tensor extent]
/// (so a tile's volume never exceeds the tensor's, which ValidateShape keeps within int64), and
/// the number of tiles per dimension fits TileCoord.
/// Errors: InvalidArgument.
inline Status ValidateTileShape(std::span<const Index> tile_shape,
                                std::span<const Index> global_shape) {
    if (tile_shape.size() != global_shape.size()) {
        return InvalidArgument("tile_shape rank " + std::to_string(tile_shape.size()) +
                               " != tensor rank " + std::to_string(global_shape.size()));
    }
    for (std::size_t d = 0; d < tile_shape.size(); ++d) {
        if (tile_shape[d] < 1) {
            return InvalidArgument("tile_shape " + internal::JoinIndices(tile_shape) +
                                   " has a non-positive extent");
        }
        if (tile_shape[d] > global_shape[d]) {
            return InvalidArgument("tile_shape " + internal::JoinIndices(tile_shape) +
                                   " is larger than the tensor shape " +
                                   internal::JoinIndices(global_shape) + " in dim " +
                                   std::to_string(d));
        }
        // Ceiling division without `extent + tile - 1`, which overflows near INT64_MAX.
        const Index tiles = global_shape[d] / tile_shape[d] + (global_shape[d] % tile_shape[d] != 0);
        if (tiles > static_cast<Index>(std::numeric_limits<TileCoord>::max())) {
            return InvalidArgument("tile_shape " + internal::JoinIndices(tile_shape) +
                                   " gives more than 2^32-1 tiles in dim " + std::to_string(d));
        }
    }
    return Status::Ok();
}

/// The tile shape a caller asked for, as a descriptor holds it: an extent larger than the
/// tensor's becomes the tensor's (one tile along that dimension), which is what it means.
/// Other extents, and a rank mismatch, are left for ValidateTileShape to report.
inline Shape ClampTileShape(std::span<const Index> tile_shape,
                            std::span<const Index> global_shape) {
    Shape out(tile_shape.begin(), tile_shape.end());
    if (out.size() != global_shape.size()) return out;
    for (std::size_t d = 0; d < out.size(); ++d) {
        if (global_shape[d] >= 1) out[d] = std::min(out[d], global_shape[d]);
    }
    return out;
}

/// The tile shape of a source whose writer names none: 8 tiles per dimension (each extent / 8,
/// rounded up, at least 1). Why 8: a reader that splits a dimension into 2, 4 or 8 equal parts
/// (TP within a node) cuts it on tile edges whenever the extent is a multiple of 8, so it reads
/// no entry outside its box; and tiles are stored in row-major order, so a box that splits the
/// last dimension costs one entry range per tile row, which a finer grid multiplies.
inline Shape DefaultTileShape(std::span<const Index> global_shape) {
    Shape out;
    out.reserve(global_shape.size());
    for (const Index extent : global_shape) out.push_back(std::max<Index>(1, extent / 8 + (extent % 8 != 0)));
    return out;
}

/// The box of tile coordinates touched by an element box: `[origin / t, (end - 1) / t + 1)`.
inline Box TileBounds(const Box& elements, std::span<const Index> tile_shape) {
    std::array<Index, kMaxRank> origin{}, shape{};
    const std::size_t rank = elements.rank();
    for (std::size_t d = 0; d < elements.rank(); ++d) {
        const Index first = elements.begin(d) / tile_shape[d];
        const Index last = (elements.end(d) - 1) / tile_shape[d];
        origin[d] = first;
        shape[d] = last - first + 1;
    }
    return Box::Unchecked({origin.data(), rank}, {shape.data(), rank});
}

/// The element box a tile covers, clipped to the tensor shape.
template <typename T>
inline Box TileElementBox(std::span<const T> tile, std::span<const Index> tile_shape,
                          std::span<const Index> global_shape) {
    std::array<Index, kMaxRank> origin{}, shape{};
    const std::size_t rank = tile.size();
    for (std::size_t d = 0; d < tile.size(); ++d) {
        origin[d] = static_cast<Index>(tile[d]) * tile_shape[d];
        shape[d] = std::min(tile_shape[d], global_shape[d] - origin[d]);
    }
    return Box::Unchecked({origin.data(), rank}, {shape.data(), rank});
}

/// True when the tile (clipped to the tensor) lies entirely inside `box`: its entries need no
/// coordinate filter. Allocation-free; called once per planned tile.
template <typename T>
inline bool TileInside(std::span<const T> tile, std::span<const Index> tile_shape,
                       std::span<const Index> global_shape, const Box& box) {
    for (std::size_t d = 0; d < tile.size(); ++d) {
        const Index lo = static_cast<Index>(tile[d]) * tile_shape[d];
        const Index hi = lo + std::min(tile_shape[d], global_shape[d] - lo);  // no lo + t overflow
        if (lo < box.begin(d) || hi > box.end(d)) return false;
    }
    return true;
}

/// Global coordinates to coordinates local to a box with origin `origin`. The caller has
/// checked that the point lies in the box.
template <typename T>
inline void RebaseInPlace(std::span<T> point, std::span<const Index> origin) {
    for (std::size_t d = 0; d < point.size(); ++d) {
        point[d] = static_cast<T>(static_cast<Index>(point[d]) - origin[d]);
    }
}

}  // namespace mooncake::sparse
