// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Shared helpers of the planner tests: build a source object's metadata and tile index from COO
// coordinates the way a commit does (sort by tile, then by element, both row-major), a
// brute-force reference scan, the boundary filter a reader applies, gmock matchers, and the
// sample sources that the tests of several planner headers share.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/planner.h"
#include "mooncake/sparse/status.h"
#include "../status_matchers.h"

namespace mooncake::sparse {

// Printers so that failures show ranges instead of bytes.
inline void PrintTo(const Box& b, std::ostream* os) { *os << b.ToString(); }
inline void PrintTo(const EntryRange& r, std::ostream* os) {
    *os << "[" << r.start << ", " << r.end << (r.exact_coordinate_filter ? ") filter" : ")");
}

namespace testing {

/// Unwraps a Result that the test set up to succeed (records a fatal-looking failure and aborts
/// the process otherwise, since callers are often not void functions).
template <typename T>
T ValueOrDie(Result<T> r, const char* what = "result") {
    if (!r.ok()) {
        ADD_FAILURE() << what << ": " << r.status().ToString();
        std::abort();
    }
    return std::move(r).value();
}

inline Box MakeBox(std::initializer_list<Index> origin, std::initializer_list<Index> shape) {
    return ValueOrDie(Box::Make(origin, shape), "Box::Make");
}
inline Box MakeBox(const Shape& origin, const Shape& shape) {
    return ValueOrDie(Box::Make(origin, shape), "Box::Make");
}
inline NamedAxes Axes(std::vector<NamedAxes::Entry> entries) {
    return ValueOrDie(NamedAxes::Make(std::move(entries)), "NamedAxes::Make");
}
inline PlacementPolicy Policy(std::string_view text) {
    return ValueOrDie(PlacementPolicy::Parse(text), "PlacementPolicy::Parse");
}

/// What a test wants a source object to be; everything but the shape has a default.
struct SourceSpec {
    std::string source_ref = "src";
    std::string tensor_id = "tensor";
    Shape global_shape;
    Shape box_origin;  ///< Empty: zeros (a complete delta).
    Shape box_shape;   ///< Empty: global_shape.
    Shape tile_shape;
    Generation generation{0, 1};
    NamedAxes placement;
    PlacementPolicy policy;
    ApplyMode apply = ApplyMode::kOverwrite;
    DType value_dtype = DType::kBFloat16;
};

/// A committed source as the planner and a reader see it: the descriptor, the sorted entries
/// (`indices`, [nnz, rank] row-major; values are not needed), and the tile index arrays.
struct BuiltSource {
    SourceDescriptor desc;
    std::vector<Index> indices;
    std::vector<TileCoord> tile_coords;
    std::vector<std::uint64_t> tile_ptr;
    std::shared_ptr<TileIndex> index;

    std::size_t rank() const { return desc.rank(); }
    std::uint64_t nnz() const { return desc.nnz; }
    std::span<const Index> entry(std::uint64_t i) const {
        return std::span<const Index>(indices).subspan(i * rank(), rank());
    }
};

/// Sorts COO coordinates (flat, [n, rank], any order, unique, inside the source box) by
/// (tile row-major, element row-major), computes tile_coords / tile_ptr, and builds the
/// descriptor and the TileIndex through their validating factories.
inline Result<BuiltSource> BuildSource(const SourceSpec& spec, std::vector<Index> coords) {
    const std::size_t rank = spec.global_shape.size();
    if (rank == 0 || coords.size() % rank != 0) {
        return InvalidArgument("test helper: coordinate count is not a multiple of the rank");
    }
    const std::size_t n = coords.size() / rank;
    Shape origin = spec.box_origin.empty() ? Shape(rank, 0) : spec.box_origin;
    Shape extent = spec.box_shape.empty() ? spec.global_shape : spec.box_shape;
    MCS_ASSIGN_OR_RETURN(Box box, Box::Make(origin, extent));

    SourceDescriptor d;
    d.source_ref = spec.source_ref;
    d.tensor_id = spec.tensor_id;
    d.global_shape = spec.global_shape;
    d.box = box;
    d.generation = spec.generation;
    d.placement = spec.placement;
    d.policy = spec.policy;
    d.tile_shape = spec.tile_shape;
    d.nnz = n;
    d.apply = spec.apply;
    d.index_dtype = NarrowestIndexDType(
        *std::max_element(spec.global_shape.begin(), spec.global_shape.end()));
    d.value_dtype = spec.value_dtype;

    // Sort key: tile coordinates, then element coordinates, both row-major.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    auto key_less = [&](std::size_t a, std::size_t b) {
        for (std::size_t k = 0; k < rank; ++k) {
            const Index ta = coords[a * rank + k] / spec.tile_shape[k];
            const Index tb = coords[b * rank + k] / spec.tile_shape[k];
            if (ta != tb) return ta < tb;
        }
        for (std::size_t k = 0; k < rank; ++k) {
            if (coords[a * rank + k] != coords[b * rank + k]) {
                return coords[a * rank + k] < coords[b * rank + k];
            }
        }
        return false;
    };
    if (spec.tile_shape.size() != rank ||
        std::any_of(spec.tile_shape.begin(), spec.tile_shape.end(),
                    [](Index t) { return t < 1; })) {
        // Let the descriptor factory produce the typed error.
        d.num_tiles = 0;
        MCS_ASSIGN_OR_RETURN(d, SourceDescriptor::Make(std::move(d)));
        return Internal("test helper: invalid tile shape accepted");
    }
    std::sort(order.begin(), order.end(), key_less);

    BuiltSource out;
    out.indices.reserve(coords.size());
    out.tile_ptr.push_back(0);
    std::vector<Index> prev_tile;
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t e = order[i];
        std::vector<Index> tile(rank);
        for (std::size_t k = 0; k < rank; ++k) {
            out.indices.push_back(coords[e * rank + k]);
            tile[k] = coords[e * rank + k] / spec.tile_shape[k];
        }
        if (i == 0 || tile != prev_tile) {
            if (i != 0) out.tile_ptr.push_back(i);
            for (Index c : tile) out.tile_coords.push_back(static_cast<TileCoord>(c));
            prev_tile = tile;
        }
    }
    if (n != 0) out.tile_ptr.push_back(n);
    d.num_tiles = out.tile_ptr.size() - 1;

    MCS_ASSIGN_OR_RETURN(out.desc, SourceDescriptor::Make(std::move(d)));
    MCS_ASSIGN_OR_RETURN(TileIndex index,
                         TileIndex::Make(out.desc, out.tile_coords, out.tile_ptr));
    out.index = std::make_shared<TileIndex>(std::move(index));
    return out;
}

/// Every element of `box` in row-major order, flat [n, rank].
inline std::vector<Index> DenseCoords(const Box& box) {
    std::vector<Index> out;
    const std::size_t rank = box.rank();
    std::vector<Index> p(box.origin().begin(), box.origin().end());
    for (Index i = 0; i < box.NumElements(); ++i) {
        out.insert(out.end(), p.begin(), p.end());
        for (std::size_t d = rank; d-- > 0;) {
            if (++p[d] < box.end(d)) break;
            p[d] = box.begin(d);
        }
    }
    return out;
}

/// `count` distinct random points of `box` (capped at its element count), flat [n, rank].
inline std::vector<Index> RandomCoords(std::mt19937_64& rng, const Box& box, std::int64_t count) {
    const Index total = box.NumElements();
    count = std::min<std::int64_t>(count, total);
    std::vector<Index> linear;
    if (count * 2 >= total) {
        linear.resize(static_cast<std::size_t>(total));
        std::iota(linear.begin(), linear.end(), Index{0});
        std::shuffle(linear.begin(), linear.end(), rng);
        linear.resize(static_cast<std::size_t>(count));
    } else {
        std::unordered_set<Index> seen;
        std::uniform_int_distribution<Index> pick(0, total - 1);
        while (static_cast<std::int64_t>(linear.size()) < count) {
            const Index v = pick(rng);
            if (seen.insert(v).second) linear.push_back(v);
        }
    }
    std::vector<Index> out;
    out.reserve(linear.size() * box.rank());
    std::vector<Index> p(box.rank());
    for (Index v : linear) {
        for (std::size_t d = box.rank(); d-- > 0;) {
            p[d] = box.begin(d) + v % box.shape()[d];
            v /= box.shape()[d];
        }
        out.insert(out.end(), p.begin(), p.end());
    }
    return out;
}

/// Drops repeated points from flat [n, rank] coordinates (keeps first occurrences, in order).
inline std::vector<Index> UniqueCoords(const std::vector<Index>& coords, std::size_t rank) {
    std::vector<Index> out;
    std::vector<std::vector<Index>> seen;
    for (std::size_t i = 0; i + rank <= coords.size(); i += rank) {
        std::vector<Index> p(coords.begin() + static_cast<std::ptrdiff_t>(i),
                             coords.begin() + static_cast<std::ptrdiff_t>(i + rank));
        auto it = std::lower_bound(seen.begin(), seen.end(), p);
        if (it != seen.end() && *it == p) continue;
        seen.insert(it, p);
        out.insert(out.end(), p.begin(), p.end());
    }
    return out;
}

/// Brute force: offsets of the entries of `src` that lie inside `box`, ascending.
inline std::vector<std::uint64_t> BruteForceScan(const BuiltSource& src, const Box& box) {
    std::vector<std::uint64_t> out;
    for (std::uint64_t i = 0; i < src.nnz(); ++i) {
        if (ContainsPoint(box, src.entry(i))) out.push_back(i);
    }
    return out;
}

/// What a reader does with planned ranges: keep every entry of an unflagged range (and check
/// that each of them is inside `box`: an unflagged range must need no filter), and apply the
/// boundary filter to flagged ranges. Returns the selected offsets in range order.
inline std::vector<std::uint64_t> SelectEntries(const BuiltSource& src,
                                                std::span<const EntryRange> ranges,
                                                const Box& box) {
    std::vector<std::uint64_t> out;
    for (const EntryRange& r : ranges) {
        for (std::uint64_t i = r.start; i < r.end && i < src.nnz(); ++i) {
            const bool inside = ContainsPoint(box, src.entry(i));
            if (!r.exact_coordinate_filter) {
                EXPECT_TRUE(inside) << "entry " << i << " of unflagged range [" << r.start
                                    << ", " << r.end << ") lies outside " << box.ToString();
                out.push_back(i);
            } else if (inside) {
                out.push_back(i);
            }
        }
    }
    return out;
}

/// The tiles (indexes into the tile index) that `r` spans; fails the test when `r` does not
/// start and end on tile boundaries.
inline std::vector<std::size_t> TilesOfRange(const BuiltSource& src, const EntryRange& r) {
    auto lo = std::lower_bound(src.tile_ptr.begin(), src.tile_ptr.end(), r.start);
    auto hi = std::lower_bound(src.tile_ptr.begin(), src.tile_ptr.end(), r.end);
    EXPECT_TRUE(lo != src.tile_ptr.end() && *lo == r.start)
        << "range start " << r.start << " is not a tile boundary";
    EXPECT_TRUE(hi != src.tile_ptr.end() && *hi == r.end)
        << "range end " << r.end << " is not a tile boundary";
    std::vector<std::size_t> out;
    for (auto it = lo; it < hi; ++it) {
        out.push_back(static_cast<std::size_t>(it - src.tile_ptr.begin()));
    }
    return out;
}

/// Checks the structural promises of one query's output: non-empty, sorted, non-overlapping,
/// non-adjacent (coalesced), inside [0, nnz), aligned to tiles, and touching no tile that
/// misses `box`.
inline void ExpectWellFormedRanges(const BuiltSource& src, std::span<const EntryRange> ranges,
                                   const Box& box) {
    for (std::size_t i = 0; i < ranges.size(); ++i) {
        const EntryRange& r = ranges[i];
        EXPECT_LT(r.start, r.end) << "empty range at " << i;
        EXPECT_LE(r.end, src.nnz());
        if (i > 0) {
            EXPECT_GT(r.start, ranges[i - 1].end)
                << "ranges " << i - 1 << " and " << i << " overlap or are adjacent";
        }
        for (std::size_t t : TilesOfRange(src, r)) {
            const Box tile_box = TileElementBox(
                std::span<const TileCoord>(src.tile_coords).subspan(t * src.rank(), src.rank()),
                src.desc.tile_shape, src.desc.global_shape);
            EXPECT_TRUE(Intersect(tile_box, box).has_value())
                << "range [" << r.start << ", " << r.end << ") touches tile " << t << " "
                << tile_box.ToString() << " that misses " << box.ToString();
        }
    }
}

/// The tile indexes of built sources, by manifest position (pass to PlanBatch / Plan).
inline std::vector<const TileIndex*> LookupOf(const std::vector<BuiltSource>& sources) {
    std::vector<const TileIndex*> out;
    for (const BuiltSource& s : sources) out.push_back(s.index.get());
    return out;
}

/// One planned region with what it indexes resolved (BatchPlan::Describe).
struct PlannedRegion {
    Region region;
    RegionInfo info;
};

/// Target t's regions, match by match, each resolved against the planned spans.
inline std::vector<PlannedRegion> RegionsOf(const BatchPlan& plan, std::size_t t,
                                            std::span<const SourceDescriptor> manifest,
                                            std::span<const TargetDescriptor> targets) {
    std::vector<PlannedRegion> out;
    const auto [first, last] = plan.match_range(t);
    for (std::size_t m = first; m < last; ++m) {
        for (const Region& r : plan.regions_of_match(m)) {
            out.push_back({r, plan.Describe(m, r, manifest, targets)});
        }
    }
    return out;
}

/// Expects two plans of one selection to be identical: every region (range, filter and read
/// index), read, read group, match span, node id and counter.
inline void ExpectSamePlan(const BatchPlan& a, const BatchPlan& b) {
    ASSERT_EQ(a.regions.size(), b.regions.size());
    for (std::size_t i = 0; i < a.regions.size(); ++i) {
        const Region& x = a.regions[i];
        const Region& y = b.regions[i];
        ASSERT_EQ(std::tuple(x.start, x.length, x.read_index(), x.exact_coordinate_filter()),
                  std::tuple(y.start, y.length, y.read_index(), y.exact_coordinate_filter()))
            << "region " << i;
    }
    EXPECT_EQ(a.reads, b.reads);
    ASSERT_EQ(a.read_groups.size(), b.read_groups.size());
    for (std::size_t g = 0; g < a.read_groups.size(); ++g) {
        const ReadGroup& x = a.read_groups[g];
        const ReadGroup& y = b.read_groups[g];
        EXPECT_EQ(std::tuple(x.source_index, x.node, x.begin, x.end),
                  std::tuple(y.source_index, y.node, y.begin, y.end))
            << "read group " << g;
    }
    ASSERT_EQ(a.match_regions.size(), b.match_regions.size());
    for (std::size_t m = 0; m < a.match_regions.size(); ++m) {
        EXPECT_EQ(std::pair(a.match_regions[m].begin, a.match_regions[m].end),
                  std::pair(b.match_regions[m].begin, b.match_regions[m].end))
            << "match " << m;
    }
    EXPECT_EQ(a.nodes, b.nodes);
    const PlanStats& s = a.stats;
    const PlanStats& t = b.stats;
    EXPECT_EQ(std::tuple(s.sources_matched, s.regions, s.requested_entries, s.planned_entries,
                         s.planned_bytes, s.unique_ranges),
              std::tuple(t.sources_matched, t.regions, t.requested_entries, t.planned_entries,
                         t.planned_bytes, t.unique_ranges));
    const QueryStats& q = s.query;
    const QueryStats& r = t.query;
    EXPECT_EQ(std::tuple(q.queries, q.whole_source, q.row_path, q.column_path, q.nd_path,
                         q.groups_visited, q.tiles_visited),
              std::tuple(r.queries, r.whole_source, r.row_path, r.column_path, r.nd_path,
                         r.groups_visited, r.tiles_visited));
}

inline std::vector<SourceDescriptor> ManifestOf(const std::vector<BuiltSource>& sources) {
    std::vector<SourceDescriptor> m;
    for (const BuiltSource& s : sources) m.push_back(s.desc);
    return m;
}

inline TargetDescriptor MakeTarget(std::string target_id, std::string node_id,
                                   std::string tensor_id, NamedAxes placement, Shape origin,
                                   Shape shape) {
    return ValueOrDie(TargetDescriptor::Make(std::move(target_id), std::move(node_id),
                                             std::move(tensor_id), std::move(placement),
                                             std::move(origin), std::move(shape)),
                      "TargetDescriptor::Make");
}

// ---- sources and ranges that the tests of several planner headers share ---------------------

/// A dense 64x64 tensor with 8x8 tiles: tile (r, c) holds entries [64 * (8r + c), +64).
inline BuiltSource Dense64() {
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.tile_shape = {8, 8};
    return ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {64, 64}))));
}

/// A 64x64 tensor with 8x8 tiles whose entries fill only tile columns 0..2 (24 tiles): tile
/// (r, c) holds entries [64 * (3r + c), +64). Sparse enough that the column path is cheaper for
/// a band of two tile columns.
inline BuiltSource ThreeColumns64() {
    SourceSpec spec;
    spec.global_shape = {64, 64};
    spec.tile_shape = {8, 8};
    return ValueOrDie(BuildSource(spec, DenseCoords(MakeBox({0, 0}, {64, 24}))));
}

/// The entry range [start, end), flagged for the boundary filter when `filter`.
inline EntryRange R(std::uint64_t start, std::uint64_t end, bool filter = false) {
    return {start, end, filter};
}

/// A source spec with what the 2-D tests vary; the rest keeps its defaults.
inline SourceSpec Spec2D(std::string ref, std::string tensor, Shape shape, Shape tile) {
    SourceSpec spec;
    spec.source_ref = std::move(ref);
    spec.tensor_id = std::move(tensor);
    spec.global_shape = std::move(shape);
    spec.tile_shape = std::move(tile);
    return spec;
}

}  // namespace testing
}  // namespace mooncake::sparse
