// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The address-free contracts of the sparse object layer (docs/design.md §2-4): element types, apply
// modes, generations, source and target descriptors, the compact tile index, and the regions a
// plan is made of. Every descriptor is built through a factory that validates it and returns
// Result<T>; nothing here knows about a store, a transport or a payload address.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

inline constexpr std::string_view kSparseObjectSchema = "mooncake.sparse_object";
inline constexpr int kSparseObjectVersion = 1;

/// Element types of object members. The numbering is this library's own wire value.
enum class DType : std::uint8_t {
    kBool = 0,
    kUInt8 = 1,
    kInt8 = 2,
    kUInt16 = 3,
    kInt16 = 4,
    kUInt32 = 5,
    kInt32 = 6,
    kUInt64 = 7,
    kInt64 = 8,
    kFloat16 = 9,
    kBFloat16 = 10,
    kFloat32 = 11,
    kFloat64 = 12,
    kFloat8E4M3 = 13,
    kFloat8E5M2 = 14,
};
inline constexpr int kNumDTypes = 15;

constexpr std::size_t DTypeSize(DType t) {
    switch (t) {
        case DType::kBool:
        case DType::kUInt8:
        case DType::kInt8:
        case DType::kFloat8E4M3:
        case DType::kFloat8E5M2: return 1;
        case DType::kUInt16:
        case DType::kInt16:
        case DType::kFloat16:
        case DType::kBFloat16: return 2;
        case DType::kUInt32:
        case DType::kInt32:
        case DType::kFloat32: return 4;
        case DType::kUInt64:
        case DType::kInt64:
        case DType::kFloat64: return 8;
    }
    return 0;
}

constexpr std::string_view DTypeName(DType t) {
    switch (t) {
        case DType::kBool: return "bool";
        case DType::kUInt8: return "uint8";
        case DType::kInt8: return "int8";
        case DType::kUInt16: return "uint16";
        case DType::kInt16: return "int16";
        case DType::kUInt32: return "uint32";
        case DType::kInt32: return "int32";
        case DType::kUInt64: return "uint64";
        case DType::kInt64: return "int64";
        case DType::kFloat16: return "float16";
        case DType::kBFloat16: return "bfloat16";
        case DType::kFloat32: return "float32";
        case DType::kFloat64: return "float64";
        case DType::kFloat8E4M3: return "float8_e4m3fn";
        case DType::kFloat8E5M2: return "float8_e5m2";
    }
    return "unknown";
}

/// Errors: InvalidArgument for an unknown name.
inline Result<DType> ParseDType(std::string_view name) {
    for (int i = 0; i < kNumDTypes; ++i) {
        auto t = static_cast<DType>(i);
        if (DTypeName(t) == name) return t;
    }
    if (name == "bf16") return DType::kBFloat16;
    if (name == "fp16" || name == "half") return DType::kFloat16;
    if (name == "fp32" || name == "float") return DType::kFloat32;
    return InvalidArgument("unknown dtype '" + std::string(name) + "'");
}

constexpr bool IsUnsignedIndexDType(DType t) {
    return t == DType::kUInt16 || t == DType::kUInt32 || t == DType::kUInt64;
}
constexpr bool IsFloatingDType(DType t) {
    return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 ||
           t == DType::kFloat64 || t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2;
}

/// The narrowest unsigned index type that holds every coordinate below `max_extent`.
constexpr DType NarrowestIndexDType(Index max_extent) {
    if (max_extent <= Index{1} << 16) return DType::kUInt16;
    if (max_extent <= Index{1} << 32) return DType::kUInt32;
    return DType::kUInt64;
}

enum class ApplyMode : std::uint8_t {
    kOverwrite = 0,   ///< W[idx] = v: lossless, bit-exact.
    kScatterAdd = 1,  ///< W[idx] += v.
};

constexpr std::string_view ApplyModeName(ApplyMode m) {
    return m == ApplyMode::kOverwrite ? "overwrite" : "scatter_add";
}

/// Errors: InvalidArgument.
inline Result<ApplyMode> ParseApplyMode(std::string_view name) {
    if (name == "overwrite") return ApplyMode::kOverwrite;
    if (name == "scatter_add") return ApplyMode::kScatterAdd;
    return InvalidArgument("unknown apply mode '" + std::string(name) +
                           "' (expected overwrite or scatter_add)");
}

/// An update moves a tensor from `base` to `delta` (delta > base).
struct Generation {
    std::uint64_t base = 0;
    std::uint64_t delta = 0;

    /// Errors: InvalidArgument when delta <= base.
    static Result<Generation> Make(std::uint64_t base, std::uint64_t delta) {
        if (delta <= base) {
            return InvalidArgument("delta generation " + std::to_string(delta) +
                                   " must be greater than base generation " + std::to_string(base));
        }
        return Generation{base, delta};
    }
    std::string ToString() const {
        return "(" + std::to_string(base) + ", " + std::to_string(delta) + ")";
    }
    friend auto operator<=>(const Generation&, const Generation&) = default;
};

namespace internal {
inline Status ValidateId(std::string_view what, std::string_view id) {
    if (id.empty()) return InvalidArgument(std::string(what) + " is empty");
    if (id.size() > 1024) return InvalidArgument(std::string(what) + " longer than 1024 bytes");
    for (char c : id) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
            return InvalidArgument(std::string(what) + " '" + std::string(id) +
                                   "' contains a control character");
        }
    }
    return Status::Ok();
}
}  // namespace internal

/// One committed source object as the manifest describes it (its metadata, no payload).
struct SourceDescriptor {
    std::string source_ref;  ///< The store's reference (key) of the structured object.
    std::string tensor_id;
    Shape global_shape;
    Box box;  ///< global_offset / local_shape: the source box in global coordinates.
    Generation generation;
    NamedAxes placement;
    PlacementPolicy policy;
    Shape tile_shape;
    std::uint64_t nnz = 0;
    std::uint64_t num_tiles = 0;
    ApplyMode apply = ApplyMode::kOverwrite;
    DType index_dtype = DType::kUInt16;
    DType value_dtype = DType::kBFloat16;

    /// Validates every field against the others.
    /// Errors: InvalidArgument.
    static Result<SourceDescriptor> Make(SourceDescriptor d) {
        MCS_RETURN_IF_ERROR(Validate(d));
        return d;
    }

    /// Make's checks, of a descriptor in place. Errors: InvalidArgument.
    static Status Validate(const SourceDescriptor& d) {
        MCS_RETURN_IF_ERROR(internal::ValidateId("source_ref", d.source_ref));
        MCS_RETURN_IF_ERROR(internal::ValidateId("tensor_id", d.tensor_id));
        if (Status s = ValidateShape(d.global_shape); !s.ok()) {
            return s.WithContext("source " + d.tensor_id + " global_shape");
        }
        if (d.box.rank() != d.global_shape.size() || !InsideShape(d.box, d.global_shape)) {
            return InvalidArgument("source " + d.tensor_id + " box " + d.box.ToString() +
                                   " is not inside global_shape " +
                                   internal::JoinIndices(d.global_shape));
        }
        if (d.generation.delta <= d.generation.base) {
            return InvalidArgument("source " + d.tensor_id + " generation " +
                                   d.generation.ToString() + " must have delta > base");
        }
        if (Status s = ValidateTileShape(d.tile_shape, d.global_shape); !s.ok()) {
            return s.WithContext("source " + d.tensor_id);
        }
        if (Status s = d.policy.ValidateSource(d.placement); !s.ok()) {
            return s.WithContext("source " + d.tensor_id);
        }
        if (!IsUnsignedIndexDType(d.index_dtype)) {
            return InvalidArgument("source " + d.tensor_id + " index_dtype " +
                                   std::string(DTypeName(d.index_dtype)) + " is not unsigned");
        }
        Index max_extent = *std::max_element(d.global_shape.begin(), d.global_shape.end());
        if (DTypeSize(d.index_dtype) < DTypeSize(NarrowestIndexDType(max_extent))) {
            return InvalidArgument("source " + d.tensor_id + " index_dtype " +
                                   std::string(DTypeName(d.index_dtype)) +
                                   " cannot hold its coordinates");
        }
        if (d.num_tiles > d.nnz) {
            return InvalidArgument("source " + d.tensor_id + " has more tiles than entries");
        }
        return Status::Ok();
    }

    std::size_t rank() const { return global_shape.size(); }
    friend bool operator==(const SourceDescriptor&, const SourceDescriptor&) = default;
    /// Bytes of one entry across `indices` and `values` (e.g. 6 for 2-D uint16 + bf16).
    std::uint64_t EntryBytes() const {
        return rank() * DTypeSize(index_dtype) + DTypeSize(value_dtype);
    }
};

/// One inference-side consumer of one tensor: a rank's box in global coordinates.
struct TargetDescriptor {
    std::string target_id;
    std::string node_id;
    std::string tensor_id;
    NamedAxes placement;
    Box box;  ///< global_offset / local_shape.

    /// Errors: InvalidArgument for empty ids or an invalid box.
    static Result<TargetDescriptor> Make(std::string target_id, std::string node_id,
                                         std::string tensor_id, NamedAxes placement,
                                         Shape global_offset, Shape local_shape) {
        MCS_RETURN_IF_ERROR(internal::ValidateId("target_id", target_id));
        MCS_RETURN_IF_ERROR(internal::ValidateId("node_id", node_id));
        MCS_RETURN_IF_ERROR(internal::ValidateId("tensor_id", tensor_id));
        auto box = Box::Make(global_offset, local_shape);
        if (!box.ok()) return box.status().WithContext("target " + target_id);
        return TargetDescriptor{std::move(target_id), std::move(node_id), std::move(tensor_id),
                                std::move(placement), std::move(box).value()};
    }

    friend bool operator==(const TargetDescriptor&, const TargetDescriptor&) = default;
};

/// A non-owning view of a source object's compact tile index.
/// `tile_coords` is [num_tiles, rank] row-major; `tile_ptr` is [num_tiles + 1].
struct TileIndexView {
    std::size_t rank = 0;
    std::span<const TileCoord> tile_coords;
    std::span<const std::uint64_t> tile_ptr;

    std::size_t num_tiles() const { return tile_ptr.empty() ? 0 : tile_ptr.size() - 1; }
    std::span<const TileCoord> tile(std::size_t i) const {
        return tile_coords.subspan(i * rank, rank);
    }
};

/// Checks a tile index against its source: sizes, tile_ptr[0] == 0, tile_ptr strictly
/// increasing (every listed tile non-empty) and ending at nnz, tiles strictly increasing in
/// row-major order, and every tile touching the source box.
/// Errors: InvalidArgument.
inline Status ValidateTileIndex(const TileIndexView& v, const SourceDescriptor& src) {
    const std::size_t rank = src.rank();
    if (v.rank != rank) {
        return InvalidArgument("tile index rank " + std::to_string(v.rank) + " != source rank " +
                               std::to_string(rank));
    }
    if (v.tile_ptr.empty()) return InvalidArgument("tile_ptr is empty (needs num_tiles + 1)");
    const std::size_t tiles = v.tile_ptr.size() - 1;
    if (v.tile_coords.size() != tiles * rank) {
        return InvalidArgument("tile_coords has " + std::to_string(v.tile_coords.size()) +
                               " values, expected " + std::to_string(tiles) + " x " +
                               std::to_string(rank));
    }
    if (v.tile_ptr.front() != 0) return InvalidArgument("tile_ptr[0] != 0");
    if (v.tile_ptr.back() != src.nnz) {
        return InvalidArgument("tile_ptr ends at " + std::to_string(v.tile_ptr.back()) +
                               ", expected nnz " + std::to_string(src.nnz));
    }
    for (std::size_t i = 0; i < tiles; ++i) {
        if (v.tile_ptr[i + 1] <= v.tile_ptr[i]) {
            return InvalidArgument("tile_ptr is not strictly increasing at tile " +
                                   std::to_string(i));
        }
    }
    const Box bounds = TileBounds(src.box, src.tile_shape);
    for (std::size_t i = 0; i < tiles; ++i) {
        auto t = v.tile(i);
        for (std::size_t d = 0; d < rank; ++d) {
            const auto c = static_cast<Index>(t[d]);
            if (c < bounds.begin(d) || c >= bounds.end(d)) {
                return InvalidArgument("tile " + std::to_string(i) + " coordinate " +
                                       std::to_string(c) + " in dim " + std::to_string(d) +
                                       " lies outside the source box tiles " + bounds.ToString());
            }
        }
        if (i > 0) {
            auto p = v.tile(i - 1);
            if (!std::lexicographical_compare(p.begin(), p.end(), t.begin(), t.end())) {
                return InvalidArgument("tiles are not strictly increasing in row-major order at "
                                       "tile " + std::to_string(i));
            }
        }
    }
    return Status::Ok();
}

/// A half-open range of entry offsets `[start, end)` into a source's `indices` and `values`.
struct EntryRange {
    std::uint64_t start = 0;
    std::uint64_t end = 0;
    /// Some entries may lie outside the overlap box: test `begin[d] <= idx[d] < end[d]`.
    bool exact_coordinate_filter = false;

    std::uint64_t size() const { return end - start; }
    friend bool operator==(const EntryRange&, const EntryRange&) = default;
};

/// A source that a target reads (docs/design.md §4 steps 1-2): indexes into the manifest and the
/// target set given to the planner. Eight bytes, so that a node's selection stays small; the
/// overlap is derived from the two boxes it names rather than stored.
struct SourceMatch {
    std::uint32_t source_index = 0;  ///< Into the manifest (the SourceDescriptor span).
    std::uint32_t target_index = 0;  ///< Into the TargetDescriptor span.

    /// source box ∩ target box, global coordinates. A match always overlaps; an empty Box
    /// (rank 0) means the indexes do not name an overlapping pair of these spans.
    Box Overlap(std::span<const SourceDescriptor> manifest,
                std::span<const TargetDescriptor> targets) const {
        if (source_index >= manifest.size() || target_index >= targets.size()) return Box();
        return Intersect(manifest[source_index].box, targets[target_index].box).value_or(Box());
    }
};

/// One piece of one target's plan: read entries [start, end()) of the match's source, keep
/// those inside the match's overlap (only needed when exact_coordinate_filter()), subtract the
/// target's origin, and apply with the source's apply mode. A region belongs to one match (one
/// target reading one source; the plan keeps each match's regions together), whose source and
/// target descriptors carry source_ref, generation, apply, target_id and the boxes, and names
/// the physical read that holds it. 16 bytes and trivially copyable: a node's plan holds
/// millions of them, so nothing derivable is stored (BatchPlan::Describe resolves the rest).
struct Region {
    /// The most entries one region holds; the planner splits a longer range into consecutive
    /// regions (only a source of more than 2^32 - 1 entries can have one).
    static constexpr std::uint64_t kMaxLength = (std::uint64_t{1} << 32) - 1;
    /// The largest read index a region can hold (31 bits; the flag takes the last one).
    static constexpr std::uint32_t kMaxReadIndex = (std::uint32_t{1} << 31) - 1;

    std::uint64_t start = 0;   ///< First entry offset into the source's indices/values.
    std::uint32_t length = 0;  ///< Entries: [start, start + length).

    std::uint64_t end() const { return start + length; }
    std::uint64_t size() const { return length; }
    /// Into BatchPlan::reads: the physical read that holds this region.
    std::uint32_t read_index() const { return read_and_filter_ >> 1; }
    /// Some entries of the range may lie outside the overlap: test `begin[d] <= idx[d] < end[d]`.
    bool exact_coordinate_filter() const { return (read_and_filter_ & 1u) != 0; }
    EntryRange range() const { return {start, end(), exact_coordinate_filter()}; }

    /// `read` must be <= kMaxReadIndex.
    void set_read_index(std::uint32_t read) { read_and_filter_ = (read << 1) | (read_and_filter_ & 1u); }
    void set_exact_coordinate_filter(bool filter) {
        read_and_filter_ = (read_and_filter_ & ~1u) | (filter ? 1u : 0u);
    }

    /// A region of `matches[match_index]` reading `range` (read index 0 until the planner's
    /// dedup assigns one).
    /// Errors: InvalidArgument for a match, source or target index out of range, an empty
    /// range, a range past the source's nnz or longer than kMaxLength, or a source and target
    /// box that do not overlap (different rank, or disjoint).
    static Result<Region> Make(std::span<const SourceDescriptor> manifest,
                               std::span<const TargetDescriptor> targets,
                               std::span<const SourceMatch> matches, std::size_t match_index,
                               EntryRange range) {
        if (match_index >= matches.size()) return InvalidArgument("region match out of range");
        const SourceMatch& m = matches[match_index];
        if (m.source_index >= manifest.size()) return InvalidArgument("region source out of range");
        if (m.target_index >= targets.size()) return InvalidArgument("region target out of range");
        const SourceDescriptor& src = manifest[m.source_index];
        const TargetDescriptor& dst = targets[m.target_index];
        if (range.start >= range.end || range.end > src.nnz) {
            return InvalidArgument("region range [" + std::to_string(range.start) + ", " +
                                   std::to_string(range.end) + ") is empty or beyond nnz " +
                                   std::to_string(src.nnz) + " of " + src.source_ref);
        }
        if (range.size() > kMaxLength) {
            return InvalidArgument("region range of " + std::to_string(range.size()) +
                                   " entries is longer than " + std::to_string(kMaxLength));
        }
        if (!Intersect(src.box, dst.box)) {
            return InvalidArgument("region source box " + src.box.ToString() + " of " +
                                   src.source_ref + " does not overlap target " + dst.target_id +
                                   " box " + dst.box.ToString());
        }
        Region r;
        r.start = range.start;
        r.length = static_cast<std::uint32_t>(range.size());
        r.set_exact_coordinate_filter(range.exact_coordinate_filter);
        return r;
    }

private:
    std::uint32_t read_and_filter_ = 0;  ///< read_index << 1 | exact_coordinate_filter.
};
static_assert(sizeof(Region) == 16, "Region is stored by the million: keep it at 16 bytes");

/// One physical range read of one source for one node: the unit of dedup. Requests with the
/// same `(source_ref, generation, node, range)` collapse into one read, and overlapping
/// requests are united, so no entry is read twice on a node. Which source and node a read
/// belongs to is its ReadGroup's; its fan-out is BatchPlan::ReadConsumers().
struct UniqueRead {
    std::uint64_t start = 0;
    std::uint64_t end = 0;

    std::uint64_t size() const { return end - start; }
    friend bool operator==(const UniqueRead&, const UniqueRead&) = default;
};
static_assert(sizeof(UniqueRead) == 16, "UniqueRead is stored by the million: keep it small");

/// The reads of one source on one node: BatchPlan::reads[begin, end), sorted by start.
struct ReadGroup {
    std::uint32_t source_index = 0;  ///< Into the manifest.
    std::uint32_t node = 0;          ///< Into BatchPlan::nodes.
    std::uint32_t begin = 0;
    std::uint32_t end = 0;

    std::uint32_t size() const { return end - begin; }
};

}  // namespace mooncake::sparse
