// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The address-free sparse planner (DESIGN.md §4 steps 1, 2, 4 and 5): placement filtering and
// box intersection from the manifest alone, entry-range planning on a source's compact tile
// index, and batch planning of a whole target set with dedup per node. It reads no payload and
// never scans nnz: a query costs O(log R + groups * log C + K) on the 2-D path.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// Work budgets that fail closed with ResourceExhausted instead of running away.
struct PlanningLimits {
    std::uint64_t max_tiles_per_query = std::uint64_t{1} << 26;   ///< Tiles visited by one query.
    std::uint64_t max_groups_per_query = std::uint64_t{1} << 24;  ///< Row/column/N-D groups.
    std::uint64_t max_regions = std::uint64_t{1} << 28;           ///< Regions in one batch plan.
};

struct PlanOptions {
    PlanningLimits limits;
    /// Physical reads of one source on one node whose gap is at most this many entries are
    /// merged into one read. -1 merges only overlapping requests (so no entry is read twice
    /// and adjacent TP ranges stay separate reads); 0 also merges adjacent ones.
    std::int64_t read_coalesce_gap = -1;
};

/// Counters of the planning work; the executor folds them into the §4 metrics.
struct QueryStats {
    std::uint64_t queries = 0;
    std::uint64_t whole_source = 0;   ///< Overlap covered the whole source box: O(1).
    std::uint64_t row_path = 0;       ///< 2-D, row-group index.
    std::uint64_t column_path = 0;    ///< 2-D, column-group index.
    std::uint64_t nd_path = 0;        ///< 1-D or > 2-D generic lexicographic path (nd_fallbacks).
    std::uint64_t groups_visited = 0;
    std::uint64_t tiles_visited = 0;

    QueryStats& operator+=(const QueryStats& o) {
        queries += o.queries;
        whole_source += o.whole_source;
        row_path += o.row_path;
        column_path += o.column_path;
        nd_path += o.nd_path;
        groups_visited += o.groups_visited;
        tiles_visited += o.tiles_visited;
        return *this;
    }
};

/// A source object's tile index plus lazily built secondary indexes (row groups and column
/// groups, each built once, O(T), on first use by a query that needs it). Thread-safe for
/// concurrent queries. Owns its arrays (the executor caches one per source per node).
class TileIndex {
public:
    TileIndex(TileIndex&&) noexcept = default;
    TileIndex& operator=(TileIndex&&) noexcept = default;
    TileIndex(const TileIndex&) = delete;
    TileIndex& operator=(const TileIndex&) = delete;

    /// Validates the index against its source (ValidateTileIndex) and takes ownership.
    /// Errors: InvalidArgument.
    static Result<TileIndex> Make(const SourceDescriptor& source, std::vector<TileCoord> coords,
                                  std::vector<std::uint64_t> ptr) {
        TileIndexView view{source.rank(), coords, ptr};
        if (Status s = ValidateTileIndex(view, source); !s.ok()) {
            return s.WithContext("tile index of " + source.source_ref);
        }
        if (view.num_tiles() >= (std::uint64_t{1} << 32)) {
            return InvalidArgument("tile index of " + source.source_ref + " has >= 2^32 tiles");
        }
        return TileIndex(source, std::move(coords), std::move(ptr));
    }

    TileIndexView view() const { return {rank_, coords_, ptr_}; }
    std::size_t rank() const { return rank_; }
    std::size_t num_tiles() const { return ptr_.size() - 1; }
    std::uint64_t nnz() const { return ptr_.back(); }
    const Box& source_box() const { return source_box_; }
    std::span<const Index> tile_shape() const { return {tile_shape_.data(), rank_}; }

    /// Bytes held, including any secondary index built so far.
    std::size_t MemoryBytes() const {
        std::size_t bytes = coords_.size() * sizeof(TileCoord) + ptr_.size() * sizeof(std::uint64_t);
        if (lazy_->row_built) bytes += lazy_->row_values.size() * (sizeof(TileCoord) + 4);
        if (lazy_->col_built) {
            bytes += lazy_->col_values.size() * (sizeof(TileCoord) + 4) +
                     lazy_->col_tiles.size() * 4;
        }
        return bytes;
    }

    /// Appends to `out` the sorted, coalesced entry ranges of every tile that intersects
    /// `overlap` (a box inside the source box), each flagged with exact_coordinate_filter when
    /// its tiles cross the overlap's boundary. Never touches a tile that misses the box.
    /// Errors: InvalidArgument for a box of the wrong rank or outside the source box;
    /// ResourceExhausted when `limits` are exceeded.
    Status Query(const Box& overlap, const PlanningLimits& limits, std::vector<EntryRange>& out,
                 QueryStats& stats) const {
        if (overlap.rank() != rank_ || !Contains(source_box_, overlap)) {
            return InvalidArgument("query box " + overlap.ToString() +
                                   " is not inside the source box " + source_box_.ToString());
        }
        ++stats.queries;
        if (num_tiles() == 0) return Status::Ok();
        if (Contains(overlap, source_box_)) {
            ++stats.whole_source;
            out.push_back({0, nnz(), false});
            return Status::Ok();
        }
        QueryState q(*this, overlap, limits, stats);
        const std::size_t first = out.size();
        Status status;
        if (rank_ == 2 && !q.full_from[1]) {
            const Index rows = q.tiles.shape()[0];
            const Index cols = q.tiles.shape()[1];
            if (rows <= cols) {
                ++stats.row_path;
                status = RowPath(q, out);
            } else {
                ++stats.column_path;
                status = ColumnPath(q, out);
            }
        } else {
            if (rank_ != 2) ++stats.nd_path; else ++stats.row_path;
            status = Lexicographic(q, 0, num_tiles(), 0, false, out);
        }
        if (!status.ok()) {
            out.resize(first);
            return status;
        }
        SortAndCoalesce(out, first);
        return Status::Ok();
    }

private:
    TileIndex(const SourceDescriptor& source, std::vector<TileCoord> coords,
              std::vector<std::uint64_t> ptr)
        : rank_(source.rank()),
          source_box_(source.box),
          grid_(TileBounds(source.box, source.tile_shape)),
          coords_(std::move(coords)),
          ptr_(std::move(ptr)),
          lazy_(std::make_unique<Lazy>()) {
        std::copy(source.tile_shape.begin(), source.tile_shape.end(), tile_shape_.begin());
        std::copy(source.global_shape.begin(), source.global_shape.end(), global_shape_.begin());
    }

    struct Lazy {
        std::once_flag row_once;
        std::once_flag col_once;
        bool row_built = false;
        bool col_built = false;
        // Row groups: distinct tile rows and the first tile of each (+ sentinel).
        std::vector<TileCoord> row_values;
        std::vector<std::uint32_t> row_begin;
        // Column groups: distinct tile columns, their offsets into col_tiles (+ sentinel), and
        // the tile ids of each column in increasing row order.
        std::vector<TileCoord> col_values;
        std::vector<std::uint32_t> col_begin;
        std::vector<std::uint32_t> col_tiles;
    };

    /// Per-query constants: the overlap's tile bounds and which of its edge tiles are only
    /// partly inside the overlap.
    struct QueryState {
        QueryState(const TileIndex& index, const Box& box, const PlanningLimits& lim,
                   QueryStats& st)
            : overlap(box), tiles(TileBounds(box, index.tile_shape())), limits(lim), stats(st) {
            const std::size_t rank = index.rank_;
            for (std::size_t d = 0; d < rank; ++d) {
                const Index t = index.tile_shape_[d];
                const Index first_lo = tiles.begin(d) * t;
                const Index last_lo = (tiles.end(d) - 1) * t;
                // lo + min(t, G - lo) == min(lo + t, G) without overflowing near INT64_MAX.
                const Index g = index.global_shape_[d];
                const Index last_hi = last_lo + std::min(t, g - last_lo);
                partial_lo[d] = first_lo < box.begin(d) ||
                                first_lo + std::min(t, g - first_lo) > box.end(d);
                partial_hi[d] = last_lo < box.begin(d) || last_hi > box.end(d);
            }
            // full_from[d]: every dim >= d spans the whole tile grid of the source box, so the
            // matching tiles of one prefix are contiguous.
            full_from[rank] = true;
            for (std::size_t d = rank; d-- > 0;) {
                full_from[d] = full_from[d + 1] && tiles.begin(d) <= index.grid_.begin(d) &&
                               tiles.end(d) >= index.grid_.end(d);
            }
            for (std::size_t d = rank; d-- > 0;) {
                any_partial_from[d] = any_partial_from[d + 1] || partial_lo[d] || partial_hi[d];
            }
        }
        bool EdgePartial(std::size_t d, Index c) const {
            return (c == tiles.begin(d) && partial_lo[d]) || (c == tiles.end(d) - 1 && partial_hi[d]);
        }
        Status Charge(std::uint64_t groups, std::uint64_t tiles_seen) {
            stats.groups_visited += groups;
            stats.tiles_visited += tiles_seen;
            groups_used += groups;
            tiles_used += tiles_seen;
            if (groups_used > limits.max_groups_per_query || tiles_used > limits.max_tiles_per_query) {
                return ResourceExhausted("planning query over budget (" +
                                         std::to_string(groups_used) + " groups, " +
                                         std::to_string(tiles_used) + " tiles)");
            }
            return Status::Ok();
        }

        const Box& overlap;
        Box tiles;
        const PlanningLimits& limits;
        QueryStats& stats;
        std::array<bool, kMaxRank> partial_lo{};
        std::array<bool, kMaxRank> partial_hi{};
        std::array<bool, kMaxRank + 1> full_from{};
        std::array<bool, kMaxRank + 1> any_partial_from{};
        std::uint64_t groups_used = 0;
        std::uint64_t tiles_used = 0;
    };

    Index Coord(std::size_t tile, std::size_t d) const {
        return static_cast<Index>(coords_[tile * rank_ + d]);
    }

    /// First tile in [lo, hi) whose coordinate in dim d is >= value, given that [lo, hi) is
    /// sorted by dim d.
    std::size_t LowerBound(std::size_t lo, std::size_t hi, std::size_t d, Index value) const {
        while (lo < hi) {
            std::size_t mid = lo + (hi - lo) / 2;
            if (Coord(mid, d) < value) lo = mid + 1; else hi = mid;
        }
        return lo;
    }

    /// Generic path: tiles [lo, hi) share their coordinates in dims < d and are therefore
    /// sorted by dim d. Narrow to the overlap in dim d, then either emit one contiguous range
    /// (when every later dim spans the whole grid) or recurse group by group.
    Status Lexicographic(QueryState& q, std::size_t lo, std::size_t hi, std::size_t d,
                         bool prefix_partial, std::vector<EntryRange>& out) const {
        const std::size_t a = LowerBound(lo, hi, d, q.tiles.begin(d));
        const std::size_t z = LowerBound(a, hi, d, q.tiles.end(d));
        if (a >= z) return Status::Ok();
        if (d + 1 == rank_ || q.full_from[d + 1]) {
            MCS_RETURN_IF_ERROR(q.Charge(1, z - a));
            const bool flag = prefix_partial || q.EdgePartial(d, Coord(a, d)) ||
                              q.EdgePartial(d, Coord(z - 1, d)) ||
                              (d + 1 < rank_ && q.any_partial_from[d + 1]);
            out.push_back({ptr_[a], ptr_[z], flag});
            return Status::Ok();
        }
        std::size_t g = a;
        while (g < z) {
            const Index v = Coord(g, d);
            const std::size_t ge = LowerBound(g, z, d, v + 1);
            MCS_RETURN_IF_ERROR(q.Charge(1, 0));
            MCS_RETURN_IF_ERROR(
                Lexicographic(q, g, ge, d + 1, prefix_partial || q.EdgePartial(d, v), out));
            g = ge;
        }
        return Status::Ok();
    }

    void BuildRowGroups() const {
        std::call_once(lazy_->row_once, [this] {
            Lazy& l = *lazy_;
            const std::size_t n = num_tiles();
            std::size_t start = 0;
            while (start < n) {
                const Index row = Coord(start, 0);
                l.row_values.push_back(static_cast<TileCoord>(row));
                l.row_begin.push_back(static_cast<std::uint32_t>(start));
                // Rows are sorted: gallop to the end of this row instead of scanning its tiles.
                std::size_t step = 1, hi = start + 1;
                while (hi < n && Coord(hi, 0) == row) {
                    start = hi;
                    step *= 2;
                    hi = std::min(n, start + step);
                }
                start = LowerBound(start, hi, 0, row + 1);
            }
            l.row_begin.push_back(static_cast<std::uint32_t>(n));
            l.row_built = true;
        });
    }

    void BuildColumnGroups() const {
        std::call_once(lazy_->col_once, [this] {
            Lazy& l = *lazy_;
            const std::size_t n = num_tiles();
            const Index c0 = grid_.begin(1);
            const std::size_t width = static_cast<std::size_t>(grid_.shape()[1]);
            if (width > 4 * n + 1024) {
                // A sparse, very wide grid: sort instead of counting. O(T log T).
                l.col_tiles.resize(n);
                for (std::size_t t = 0; t < n; ++t) l.col_tiles[t] = static_cast<std::uint32_t>(t);
                std::stable_sort(l.col_tiles.begin(), l.col_tiles.end(),
                                 [&](std::uint32_t a, std::uint32_t b) { return Coord(a, 1) < Coord(b, 1); });
                for (std::size_t k = 0; k < n; ++k) {
                    const Index c = Coord(l.col_tiles[k], 1);
                    if (k == 0 || c != Coord(l.col_tiles[k - 1], 1)) {
                        l.col_values.push_back(static_cast<TileCoord>(c));
                        l.col_begin.push_back(static_cast<std::uint32_t>(k));
                    }
                }
                l.col_begin.push_back(static_cast<std::uint32_t>(n));
                l.col_built = true;
                return;
            }
            // Counting sort by column; stable over row-major order, so each column's tiles stay
            // in increasing row order. O(T + width).
            std::vector<std::uint32_t> count(width + 1, 0);
            for (std::size_t t = 0; t < n; ++t) ++count[static_cast<std::size_t>(Coord(t, 1) - c0) + 1];
            for (std::size_t c = 0; c < width; ++c) {
                if (count[c + 1] != 0) l.col_values.push_back(static_cast<TileCoord>(c0 + Index(c)));
                count[c + 1] += count[c];
            }
            l.col_tiles.resize(n);
            std::vector<std::uint32_t> cursor(count.begin(), count.end() - 1);
            for (std::size_t t = 0; t < n; ++t) {
                l.col_tiles[cursor[static_cast<std::size_t>(Coord(t, 1) - c0)]++] =
                    static_cast<std::uint32_t>(t);
            }
            for (TileCoord c : l.col_values) l.col_begin.push_back(count[static_cast<std::size_t>(c - c0)]);
            l.col_begin.push_back(static_cast<std::uint32_t>(n));
            l.col_built = true;
        });
    }

    /// 2-D row path: O(log R + selected rows * log C + K).
    Status RowPath(QueryState& q, std::vector<EntryRange>& out) const {
        BuildRowGroups();
        const Lazy& l = *lazy_;
        const Index r0 = q.tiles.begin(0), r1 = q.tiles.end(0);
        const Index c0 = q.tiles.begin(1), c1 = q.tiles.end(1);
        auto it = std::lower_bound(l.row_values.begin(), l.row_values.end(), r0,
                                   [](TileCoord v, Index r) { return Index(v) < r; });
        for (std::size_t i = std::size_t(it - l.row_values.begin());
             i < l.row_values.size() && Index(l.row_values[i]) < r1; ++i) {
            const std::size_t a = LowerBound(l.row_begin[i], l.row_begin[i + 1], 1, c0);
            const std::size_t z = LowerBound(a, l.row_begin[i + 1], 1, c1);
            MCS_RETURN_IF_ERROR(q.Charge(1, z - a));
            if (a == z) continue;
            const bool flag = q.EdgePartial(0, Index(l.row_values[i])) ||
                              q.EdgePartial(1, Coord(a, 1)) || q.EdgePartial(1, Coord(z - 1, 1));
            out.push_back({ptr_[a], ptr_[z], flag});
        }
        return Status::Ok();
    }

    /// 2-D column path: O(log C + selected columns * log R + K log K). Tiles of different
    /// columns interleave in entry order, so their ids are gathered and sorted as 4-byte keys;
    /// a run of consecutive tile ids is one contiguous entry range (tile_ptr is strictly
    /// increasing), so the ranges come out sorted and coalesced.
    Status ColumnPath(QueryState& q, std::vector<EntryRange>& out) const {
        BuildColumnGroups();
        const Lazy& l = *lazy_;
        const Index r0 = q.tiles.begin(0), r1 = q.tiles.end(0);
        const Index c0 = q.tiles.begin(1), c1 = q.tiles.end(1);
        auto it = std::lower_bound(l.col_values.begin(), l.col_values.end(), c0,
                                   [](TileCoord v, Index c) { return Index(v) < c; });
        auto row_of = [&](std::uint32_t k) { return Coord(l.col_tiles[k], 0); };
        std::vector<std::uint32_t> picked;
        for (std::size_t j = std::size_t(it - l.col_values.begin());
             j < l.col_values.size() && Index(l.col_values[j]) < c1; ++j) {
            std::uint32_t lo = l.col_begin[j], hi = l.col_begin[j + 1];
            auto bound = [&](std::uint32_t from, std::uint32_t to, Index row) {
                while (from < to) {
                    std::uint32_t mid = from + (to - from) / 2;
                    if (row_of(mid) < row) from = mid + 1; else to = mid;
                }
                return from;
            };
            const std::uint32_t a = bound(lo, hi, r0);
            const std::uint32_t z = bound(a, hi, r1);
            MCS_RETURN_IF_ERROR(q.Charge(1, z - a));
            picked.insert(picked.end(), l.col_tiles.begin() + a, l.col_tiles.begin() + z);
        }
        std::sort(picked.begin(), picked.end());
        auto flag_of = [&](std::uint32_t t) {
            return q.EdgePartial(1, Coord(t, 1)) || q.EdgePartial(0, Coord(t, 0));
        };
        for (std::size_t i = 0; i < picked.size();) {
            std::size_t k = i + 1;
            bool flag = flag_of(picked[i]);
            for (; k < picked.size() && picked[k] == picked[k - 1] + 1; ++k) {
                flag |= flag_of(picked[k]);
            }
            out.push_back({ptr_[picked[i]], ptr_[picked[k - 1] + 1], flag});
            i = k;
        }
        return Status::Ok();
    }

    static void SortAndCoalesce(std::vector<EntryRange>& out, std::size_t first) {
        auto begin = out.begin() + static_cast<std::ptrdiff_t>(first);
        std::sort(begin, out.end(),
                  [](const EntryRange& a, const EntryRange& b) { return a.start < b.start; });
        std::size_t w = first;
        for (std::size_t r = first; r < out.size(); ++r) {
            if (w > first && out[w - 1].end == out[r].start) {
                out[w - 1].end = out[r].end;
                out[w - 1].exact_coordinate_filter |= out[r].exact_coordinate_filter;
            } else {
                out[w++] = out[r];
            }
        }
        out.resize(w);
    }

    std::size_t rank_ = 0;
    Box source_box_;
    Box grid_;  ///< Tile coordinates the source box spans.
    std::array<Index, kMaxRank> tile_shape_{};
    std::array<Index, kMaxRank> global_shape_{};
    std::vector<TileCoord> coords_;
    std::vector<std::uint64_t> ptr_;
    std::unique_ptr<Lazy> lazy_;
};

/// A source that a target reads, and the part of the target it covers.
struct SourceMatch {
    std::size_t source_index = 0;
    Box overlap;
};

/// Steps 1-2: which sources each target reads, from the manifest alone.
struct SourceSelection {
    std::vector<std::vector<SourceMatch>> per_target;
    std::vector<std::size_t> needed_sources;  ///< Sorted, unique: whose tile index to fetch.
};

/// Placement filtering and box intersection for a batch of targets. Every target must be
/// covered exactly by the boxes of the sources it matches: a gap is an error, never a silent
/// hole in the weights.
/// Errors: InvalidArgument (shape mismatch, target outside the tensor, overlapping sources);
/// NotFound (no source for the tensor, or a target box not fully covered).
inline Result<SourceSelection> SelectSources(std::span<const SourceDescriptor> manifest,
                                             std::span<const TargetDescriptor> targets) {
    std::unordered_map<std::string_view, std::vector<std::size_t>> by_tensor;
    by_tensor.reserve(manifest.size());
    for (std::size_t i = 0; i < manifest.size(); ++i) by_tensor[manifest[i].tensor_id].push_back(i);

    SourceSelection sel;
    sel.per_target.resize(targets.size());
    std::vector<bool> needed(manifest.size(), false);
    for (std::size_t t = 0; t < targets.size(); ++t) {
        const TargetDescriptor& tgt = targets[t];
        auto it = by_tensor.find(tgt.tensor_id);
        if (it == by_tensor.end()) {
            return NotFound("target " + tgt.target_id + ": tensor '" + tgt.tensor_id +
                            "' has no source object in the manifest");
        }
        Index covered = 0;
        auto& matches = sel.per_target[t];
        for (std::size_t si : it->second) {
            const SourceDescriptor& src = manifest[si];
            if (tgt.box.rank() != src.rank() || !InsideShape(tgt.box, src.global_shape)) {
                return InvalidArgument("target " + tgt.target_id + " box " + tgt.box.ToString() +
                                       " is not inside tensor '" + tgt.tensor_id + "' of shape " +
                                       internal::JoinIndices(src.global_shape));
            }
            if (!src.policy.Matches(src.placement, tgt.placement)) continue;
            auto overlap = Intersect(src.box, tgt.box);
            if (!overlap) continue;
            for (const SourceMatch& m : matches) {
                if (Intersect(manifest[m.source_index].box, src.box)) {
                    return InvalidArgument("target " + tgt.target_id + " matches overlapping sources " +
                                           manifest[m.source_index].source_ref + " and " +
                                           src.source_ref);
                }
            }
            covered += overlap->NumElements();
            matches.push_back({si, *overlap});
            needed[si] = true;
        }
        if (covered != tgt.box.NumElements()) {
            return NotFound("target " + tgt.target_id + " box " + tgt.box.ToString() + " of '" +
                            tgt.tensor_id + "' is covered by sources for " +
                            std::to_string(covered) + " of " +
                            std::to_string(tgt.box.NumElements()) + " elements");
        }
    }
    for (std::size_t i = 0; i < needed.size(); ++i) {
        if (needed[i]) sel.needed_sources.push_back(i);
    }
    return sel;
}

/// Batch planning totals.
struct PlanStats {
    QueryStats query;
    std::uint64_t sources_matched = 0;
    std::uint64_t regions = 0;
    std::uint64_t requested_entries = 0;  ///< Sum over regions: what per-target reads would move.
    std::uint64_t planned_entries = 0;    ///< Sum over unique reads: what the node moves.
    std::uint64_t planned_bytes = 0;      ///< planned_entries * entry bytes, per source.
    std::uint64_t unique_ranges = 0;      ///< == reads.size().
};

struct TargetPlan {
    std::vector<Region> regions;  ///< Sorted by (source, range start).
};

/// A whole batch: per target its regions, and per node the unique physical reads.
struct BatchPlan {
    std::vector<TargetPlan> targets;  ///< Same order as the targets given.
    std::vector<UniqueRead> reads;    ///< Sorted by (source, node, start).
    std::vector<std::string> nodes;   ///< Node ids, indexed by UniqueRead::node.
    PlanStats stats;
};

/// Looks up the tile index of `manifest[source_index]`; nullptr when it is not loaded.
using TileIndexLookup = std::function<const TileIndex*(std::size_t source_index)>;

/// Steps 4-5: plans entry ranges for every (target, source) match and dedups them into unique
/// physical reads per node.
/// Errors: NotFound (a needed tile index missing); InvalidArgument; ResourceExhausted.
inline Result<BatchPlan> PlanBatch(std::span<const SourceDescriptor> manifest,
                                   std::span<const TargetDescriptor> targets,
                                   const SourceSelection& selection,
                                   const TileIndexLookup& lookup,
                                   const PlanOptions& options = {}) {
    if (selection.per_target.size() != targets.size()) {
        return InvalidArgument("selection was made for a different target set");
    }
    BatchPlan plan;
    plan.targets.resize(targets.size());
    std::unordered_map<std::string_view, std::uint32_t> node_ids;
    std::vector<std::uint32_t> target_node(targets.size());
    for (std::size_t t = 0; t < targets.size(); ++t) {
        auto [it, inserted] = node_ids.try_emplace(targets[t].node_id,
                                                   static_cast<std::uint32_t>(plan.nodes.size()));
        if (inserted) plan.nodes.push_back(targets[t].node_id);
        target_node[t] = it->second;
    }

    // Regions are made target by target. The unique reads are then formed source by source
    // from compact region references bucketed by source (a counting sort), so that only each
    // source's own requests are sorted by (node, start, end), never the whole batch.
    std::vector<std::size_t> source_begin(manifest.size() + 1, 0);  // Counts, then offsets.
    std::vector<EntryRange> ranges;
    std::vector<bool> seen(manifest.size(), false);
    for (std::size_t t = 0; t < targets.size(); ++t) {
        auto& regions = plan.targets[t].regions;
        for (const SourceMatch& m : selection.per_target[t]) {
            const SourceDescriptor& src = manifest[m.source_index];
            const TileIndex* index = lookup(m.source_index);
            if (index == nullptr) {
                return NotFound("tile index of source " + src.source_ref + " is not loaded");
            }
            if (index->nnz() != src.nnz || index->rank() != src.rank()) {
                return InvalidArgument("tile index of " + src.source_ref +
                                       " does not match its descriptor");
            }
            if (!seen[m.source_index]) {
                seen[m.source_index] = true;
                ++plan.stats.sources_matched;
            }
            ranges.clear();
            MCS_RETURN_IF_ERROR(index->Query(m.overlap, options.limits, ranges, plan.stats.query));
            // Regions are large; grow to the exact size where one doubling would overshoot.
            if (regions.capacity() < regions.size() + ranges.size()) {
                regions.reserve(std::max(regions.size() + ranges.size(), 2 * regions.capacity()));
            }
            for (const EntryRange& r : ranges) {
                Region region;
                region.source_index = m.source_index;
                region.target_index = t;
                region.generation = src.generation;
                region.range = r;
                region.overlap = m.overlap;
                region.apply = src.apply;
                regions.push_back(region);
                plan.stats.requested_entries += r.size();
            }
            source_begin[m.source_index + 1] += ranges.size();
        }
        plan.stats.regions += regions.size();
        if (plan.stats.regions > options.limits.max_regions) {
            return ResourceExhausted("batch plan exceeds " +
                                     std::to_string(options.limits.max_regions) + " regions");
        }
    }

    struct RegionRef {
        std::size_t target;
        std::size_t region;
    };
    for (std::size_t s = 0; s < manifest.size(); ++s) source_begin[s + 1] += source_begin[s];
    std::vector<RegionRef> refs(source_begin.back());
    {
        std::vector<std::size_t> cursor(source_begin.begin(), source_begin.end() - 1);
        for (std::size_t t = 0; t < targets.size(); ++t) {
            const auto& regions = plan.targets[t].regions;
            for (std::size_t i = 0; i < regions.size(); ++i) {
                refs[cursor[regions[i].source_index]++] = {t, i};
            }
        }
    }
    // Requests of one source ordered by (node, start, end); equal requests share a read
    // whichever comes first, so the order among them does not matter.
    auto request_less = [&](const RegionRef& a, const RegionRef& b) {
        const EntryRange& ra = plan.targets[a.target].regions[a.region].range;
        const EntryRange& rb = plan.targets[b.target].regions[b.region].range;
        const std::uint32_t na = target_node[a.target], nb = target_node[b.target];
        if (na != nb) return na < nb;
        if (ra.start != rb.start) return ra.start < rb.start;
        return ra.end < rb.end;
    };
    for (std::size_t s = 0; s < manifest.size(); ++s) {
        const auto first = refs.begin() + static_cast<std::ptrdiff_t>(source_begin[s]);
        const auto last = refs.begin() + static_cast<std::ptrdiff_t>(source_begin[s + 1]);
        if (last - first > 1) std::sort(first, last, request_less);
        for (auto it = first; it != last; ++it) {
            Region& region = plan.targets[it->target].regions[it->region];
            const std::uint32_t node = target_node[it->target];
            UniqueRead* prev = plan.reads.empty() ? nullptr : &plan.reads.back();
            const bool same_group = prev && prev->source_index == s && prev->node == node;
            const bool merge =
                same_group &&
                (region.range.start < prev->end ||
                 (options.read_coalesce_gap >= 0 &&
                  region.range.start <= prev->end + std::uint64_t(options.read_coalesce_gap)));
            if (merge) {
                prev->end = std::max(prev->end, region.range.end);
            } else {
                plan.reads.push_back({s, node, region.range.start, region.range.end, 0});
            }
            plan.reads.back().consumers++;
            region.read_index = plan.reads.size() - 1;
        }
    }
    for (const UniqueRead& r : plan.reads) {
        plan.stats.planned_entries += r.size();
        plan.stats.planned_bytes += r.size() * manifest[r.source_index].EntryBytes();
    }
    plan.stats.unique_ranges = plan.reads.size();
    return plan;
}

/// Steps 1-5 in one call when every tile index is at hand.
inline Result<BatchPlan> Plan(std::span<const SourceDescriptor> manifest,
                              std::span<const TargetDescriptor> targets,
                              const TileIndexLookup& lookup, const PlanOptions& options = {}) {
    MCS_ASSIGN_OR_RETURN(SourceSelection selection, SelectSources(manifest, targets));
    return PlanBatch(manifest, targets, selection, lookup, options);
}

}  // namespace mooncake::sparse
