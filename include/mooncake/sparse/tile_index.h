// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// A source object's tile index and its queries (docs/design.md §4 step 4): the sorted, coalesced
// entry ranges of the tiles that meet a box, each flagged when its tiles cross the box's
// boundary. It reads no payload and never scans nnz: a query costs O(log R + groups * log C + K)
// on the 2-D path.
//
// Choosing the 2-D direction. docs/design.md asks for "the direction with fewer candidate groups".
// Groups are not equally expensive, so the planner counts candidate groups weighted by what one
// group costs on each path, with the index's fill f = tiles / tile-grid cells standing in for
// the tiles actually present (a box of R tile rows x C tile columns holds K ~ f R C tiles):
//
//   row path    = R * (2 log2(f * grid_columns + 2) + 1)
//                 each tile row: two binary searches among its tiles, and at most one range out
//                 (a row's selected tiles are consecutive in entry order); in a dense index
//                 (every tile present) a row's tiles sit at known offsets: the searches are O(1)
//                 and a row costs 1;
//   column path = C * 2 log2(f * grid_rows + 2) + K * (1 + log2(K + 1))
//                 each tile column: two binary searches among its tiles, then every selected
//                 tile is gathered and sorted back into entry order (columns interleave).
//
// The cheaper estimate wins (ties: the row path). So a column band (a row-parallel TP half) is
// planned by rows: one coalesced range per tile row, not K tiles to sort; the column path wins
// only for tall, narrow boxes over sparse tile grids, where few of the candidate rows hold a
// tile. Boxes that span whole tile rows take neither: their tiles are one contiguous run.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/internal/compiler.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// Work budgets that fail closed with ResourceExhausted instead of running away.
struct PlanningLimits {
    std::uint64_t max_tiles_per_query = std::uint64_t{1} << 26;   ///< Tiles visited by one query.
    std::uint64_t max_groups_per_query = std::uint64_t{1} << 24;  ///< Row/column/N-D groups.
    /// Regions in one batch plan (never more than Region::kMaxReadIndex, so that every region
    /// and read index fits 31 bits).
    std::uint64_t max_regions = std::uint64_t{1} << 28;
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

/// A run of consecutive tiles [first, last) of one tile index (positions in tile_coords /
/// tile_ptr order): the entries [tile_ptr[first], tile_ptr[last]).
struct TileRange {
    std::uint32_t first = 0;
    std::uint32_t last = 0;
    bool exact_coordinate_filter = false;
};

/// A source object's tile index plus lazily built secondary indexes (row groups and column
/// groups, each built once, O(T), on first use by a query that needs it). Thread-safe for
/// concurrent queries. Owns its arrays (the executor caches one per source per node).
///
/// A dense index (every tile of the source box's tile grid present, as in any update that
/// changes more than a few entries per tile) needs no secondary index at all: a tile's position
/// follows from its coordinates, so its queries read only `tile_ptr`.
///
/// Layout: a batch plan reads tens of thousands of these objects once each, cold, so what a
/// query reads sits in the first cache lines: line 0 holds the scalars and tile_ptr, line 1 + d
/// everything about dimension d (aligned to a cache line, so a 2-D query reads 3 lines); the
/// rest (tile_coords, the accessors' Box and tile shape, the lazy indexes) follows.
class alignas(64) TileIndex {
public:
    TileIndex(TileIndex&&) noexcept = default;
    TileIndex& operator=(TileIndex&&) noexcept = default;
    TileIndex(const TileIndex&) = delete;
    TileIndex& operator=(const TileIndex&) = delete;

    /// Validates the index against its source (ValidateTileIndex, and the descriptor's
    /// num_tiles against the index's tile count) and takes ownership.
    /// Errors: InvalidArgument.
    static Result<TileIndex> Make(const SourceDescriptor& source, std::vector<TileCoord> coords,
                                  std::vector<std::uint64_t> ptr) {
        TileIndexView view{source.rank(), coords, ptr};
        if (Status s = ValidateTileIndex(view, source); !s.ok()) {
            return s.WithContext("tile index of " + source.source_ref);
        }
        if (view.num_tiles() != source.num_tiles) {
            return InvalidArgument("tile index of " + source.source_ref + " has " +
                                   std::to_string(view.num_tiles()) +
                                   " tiles, its descriptor says num_tiles " +
                                   std::to_string(source.num_tiles));
        }
        if (view.num_tiles() >= (std::uint64_t{1} << 32)) {
            return InvalidArgument("tile index of " + source.source_ref + " has >= 2^32 tiles");
        }
        return TileIndex(source, std::move(coords), std::move(ptr));
    }

    TileIndexView view() const { return {rank_, coords_, ptr_}; }
    std::size_t rank() const { return rank_; }
    std::size_t num_tiles() const { return num_tiles_; }
    std::uint64_t nnz() const { return nnz_; }
    const Box& source_box() const { return source_box_; }
    std::span<const Index> tile_shape() const { return {tile_shape_.data(), rank_}; }
    /// Every tile of the source box's tile grid is present.
    bool dense() const { return dense_; }

    /// Appends to `out` the sorted, coalesced entry ranges of every tile that intersects
    /// `overlap` (a box inside the source box), each flagged with exact_coordinate_filter when
    /// its tiles cross the overlap's boundary. Never touches a tile that misses the box.
    /// Errors: InvalidArgument for a box of the wrong rank or outside the source box;
    /// ResourceExhausted when `limits` are exceeded (then `out` is left as it was).
    Status Query(const Box& overlap, const PlanningLimits& limits, std::vector<EntryRange>& out,
                 QueryStats& stats) const {
        thread_local std::vector<TileRange> tiles;  // reused: no allocation per query
        tiles.clear();
        MCS_RETURN_IF_ERROR(QueryTiles(overlap, limits, tiles, stats));
        out.reserve(out.size() + tiles.size());
        for (const TileRange& t : tiles) out.push_back(Entries(t));
        return Status::Ok();
    }

    /// Query in tile space: appends the sorted, coalesced runs of consecutive tiles (indexes
    /// into the tile index) that intersect `overlap`. Reads tile_coords (or nothing, when
    /// dense) but not tile_ptr, so a batch can fetch the tile_ptr lines of many queries ahead
    /// of converting them with Entries(). Same errors and limits as Query.
    Status QueryTiles(const Box& overlap, const PlanningLimits& limits,
                      std::vector<TileRange>& out, QueryStats& stats) const {
        if (overlap.rank() != rank_ || !Contains(source_box_, overlap)) {
            return InvalidArgument("query box " + overlap.ToString() +
                                   " is not inside the source box " + source_box_.ToString());
        }
        std::array<Index, kMaxRank> lo{}, hi{};
        for (std::size_t d = 0; d < rank_; ++d) {
            lo[d] = overlap.begin(d);
            hi[d] = overlap.end(d);
        }
        return Run(lo.data(), hi.data(), limits, out, stats);
    }

    /// QueryTiles for the intersection of the source box with `box` (a box of any position,
    /// of this index's rank), without building the intersection: what a batch plan calls once
    /// per (target, source) match. Sets `disjoint` (and appends nothing) when the two boxes do
    /// not meet. Same errors and limits as QueryTiles.
    Status QueryTilesIntersecting(const Box& box, const PlanningLimits& limits,
                                  std::vector<TileRange>& out, QueryStats& stats,
                                  bool& disjoint) const {
        disjoint = box.rank() != rank_;
        std::array<Index, kMaxRank> lo{}, hi{};
        for (std::size_t d = 0; d < rank_ && !disjoint; ++d) {
            lo[d] = std::max(dims_[d].box_begin, box.begin(d));
            hi[d] = std::min(dims_[d].box_end, box.end(d));
            disjoint = hi[d] <= lo[d];
        }
        if (disjoint) return Status::Ok();
        return Run(lo.data(), hi.data(), limits, out, stats);
    }

    /// The index was made for a source with this descriptor's nnz, rank, num_tiles and box:
    /// what a batch checks of every index it is handed, from the index's hot lines only.
    bool Describes(const SourceDescriptor& src) const {
        if (nnz_ != src.nnz || rank_ != src.rank() || num_tiles_ != src.num_tiles ||
            src.box.rank() != rank_) {
            return false;
        }
        for (std::size_t d = 0; d < rank_; ++d) {
            if (dims_[d].box_begin != src.box.begin(d) || dims_[d].box_end != src.box.end(d)) {
                return false;
            }
        }
        return true;
    }

    /// The entry range of a run of tiles. The ends of the index are known without reading
    /// tile_ptr (0 and nnz), so a whole-source range costs no load at all.
    EntryRange Entries(const TileRange& t) const {
        return {t.first == 0 ? 0 : ptr_[t.first], t.last == num_tiles_ ? nnz_ : ptr_[t.last],
                t.exact_coordinate_filter};
    }

    /// Starts fetching the tile_ptr lines that Entries(t) will read.
    void PrefetchEntries(const TileRange& t) const {
        if (t.first != 0) internal::Prefetch(ptr_.data() + t.first);
        if (t.last != num_tiles_) internal::Prefetch(ptr_.data() + t.last);
    }

    /// Starts fetching what validation and a query read first (see internal::Prefetch): the
    /// object's hot lines of a 1-D or 2-D index (see the class comment). Its rank is not read,
    /// as that would wait for the very line being fetched.
    void PrefetchSelf() const {
        internal::Prefetch(this);
        internal::Prefetch(&dims_[0]);
        internal::Prefetch(&dims_[1]);
    }

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

private:
    /// Everything a query needs about one dimension, in one cache line.
    struct alignas(64) Dim {
        Index tile = 1;        ///< Tile extent.
        Index global = 0;      ///< Tensor extent.
        Index box_begin = 0;   ///< Source box.
        Index box_end = 0;
        Index grid_begin = 0;  ///< Tile coordinates the source box spans: [grid_begin, grid_end).
        Index grid_end = 0;
        std::uint64_t stride = 0;  ///< Dense only: tiles per step in this dimension.
        int shift = -1;            ///< log2(tile) when tile is a power of two, else -1.

        /// The tile coordinate of element coordinate x >= 0: a shift for the usual power-of-two
        /// tiles instead of a 64-bit division (several per query).
        Index TileOf(Index x) const { return shift >= 0 ? x >> shift : x / tile; }
        Index grid_extent() const { return grid_end - grid_begin; }
    };

    TileIndex(const SourceDescriptor& source, std::vector<TileCoord> coords,
              std::vector<std::uint64_t> ptr)
        : ptr_(std::move(ptr)),
          nnz_(ptr_.back()),
          num_tiles_(static_cast<std::uint32_t>(ptr_.size() - 1)),
          rank_(static_cast<std::uint8_t>(source.rank())),
          coords_(std::move(coords)),
          source_box_(source.box),
          lazy_(std::make_unique<Lazy>()) {
        std::copy(source.tile_shape.begin(), source.tile_shape.end(), tile_shape_.begin());
        // Grid cells as a double: exact while it matters (a dense grid has < 2^32 cells) and
        // free of int64 overflow for huge sparse grids.
        double cells = 1.0;
        for (std::size_t d = 0; d < rank_; ++d) {
            Dim& dim = dims_[d];
            dim.tile = source.tile_shape[d];
            dim.global = source.global_shape[d];
            dim.box_begin = source.box.begin(d);
            dim.box_end = source.box.end(d);
            if ((dim.tile & (dim.tile - 1)) == 0) {
                dim.shift = std::countr_zero(static_cast<std::uint64_t>(dim.tile));
            }
            // TileBounds(source box, tile shape).
            dim.grid_begin = dim.box_begin / dim.tile;
            dim.grid_end = (dim.box_end - 1) / dim.tile + 1;
            cells *= static_cast<double>(dim.grid_extent());
        }
        const double tiles = static_cast<double>(num_tiles());
        dense_ = tiles > 0 && tiles == cells;
        if (dense_) {
            dims_[rank_ - 1].stride = 1;
            for (std::size_t d = rank_ - 1; d > 0; --d) {
                dims_[d - 1].stride =
                    dims_[d].stride * static_cast<std::uint64_t>(dims_[d].grid_extent());
            }
        }
        if (rank_ == 2) {
            const double fill = tiles / cells;
            row_group_cost_ =
                dense_ ? 1.0 : 2.0 * std::log2(fill * double(dims_[1].grid_extent()) + 2.0) + 1.0;
            col_group_cost_ = 2.0 * std::log2(fill * double(dims_[0].grid_extent()) + 2.0);
            fill_ = fill;
        }
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

    /// Per-query constants: the overlap's tile bounds [t0[d], t1[d]) and which of its edge
    /// tiles are only partly inside the overlap.
    struct QueryState {
        QueryState(const TileIndex& index, const Index* lo, const Index* hi,
                   const PlanningLimits& lim, QueryStats& st)
            : limits(lim), stats(st) {
            const std::size_t rank = index.rank_;
            for (std::size_t d = 0; d < rank; ++d) {
                const Dim& dim = index.dims_[d];
                const Index first = dim.TileOf(lo[d]);
                const Index last = dim.TileOf(hi[d] - 1);
                t0[d] = first;
                t1[d] = last + 1;
                const Index t = dim.tile;
                const Index first_lo = first * t;
                const Index last_lo = last * t;
                // lo + min(t, G - lo) == min(lo + t, G) without overflowing near INT64_MAX.
                const Index g = dim.global;
                const Index last_hi = last_lo + std::min(t, g - last_lo);
                partial_lo[d] = first_lo < lo[d] || first_lo + std::min(t, g - first_lo) > hi[d];
                partial_hi[d] = last_lo < lo[d] || last_hi > hi[d];
            }
            // full_from[d]: every dim >= d spans the whole tile grid of the source box, so the
            // matching tiles of one prefix are contiguous.
            full_from[rank] = true;
            for (std::size_t d = rank; d-- > 0;) {
                full_from[d] = full_from[d + 1] && t0[d] <= index.dims_[d].grid_begin &&
                               t1[d] >= index.dims_[d].grid_end;
            }
            for (std::size_t d = rank; d-- > 0;) {
                any_partial_from[d] = any_partial_from[d + 1] || partial_lo[d] || partial_hi[d];
            }
        }
        bool EdgePartial(std::size_t d, Index c) const {
            return (c == t0[d] && partial_lo[d]) || (c == t1[d] - 1 && partial_hi[d]);
        }
        /// Counts work; false once the query is over budget.
        bool Charge(std::uint64_t groups, std::uint64_t tiles_seen) {
            stats.groups_visited += groups;
            stats.tiles_visited += tiles_seen;
            groups_used += groups;
            tiles_used += tiles_seen;
            return groups_used <= limits.max_groups_per_query &&
                   tiles_used <= limits.max_tiles_per_query;
        }

        std::array<Index, kMaxRank> t0{};
        std::array<Index, kMaxRank> t1{};
        const PlanningLimits& limits;
        QueryStats& stats;
        std::array<bool, kMaxRank> partial_lo{};
        std::array<bool, kMaxRank> partial_hi{};
        std::array<bool, kMaxRank + 1> full_from{};
        std::array<bool, kMaxRank + 1> any_partial_from{};
        std::uint64_t groups_used = 0;
        std::uint64_t tiles_used = 0;
    };

    /// The query for the overlap [lo[d], hi[d]) (non-empty, inside the source box).
    Status Run(const Index* lo, const Index* hi, const PlanningLimits& limits,
               std::vector<TileRange>& out, QueryStats& stats) const {
        ++stats.queries;
        if (num_tiles_ == 0) return Status::Ok();
        bool whole = true;
        for (std::size_t d = 0; d < rank_; ++d) {
            whole = whole && lo[d] <= dims_[d].box_begin && hi[d] >= dims_[d].box_end;
        }
        if (whole) {
            ++stats.whole_source;
            out.push_back({0, num_tiles_, false});
            return Status::Ok();
        }
        QueryState q(*this, lo, hi, limits, stats);
        const std::size_t first = out.size();
        bool ok;
        if (rank_ == 2 && !q.full_from[1]) {
            if (PreferRowPath(q.t1[0] - q.t0[0], q.t1[1] - q.t0[1])) {
                ++stats.row_path;
                ok = RowPath(q, out);
            } else {
                ++stats.column_path;
                ok = ColumnPath(q, out);
            }
        } else {
            if (rank_ != 2) ++stats.nd_path; else ++stats.row_path;
            ok = Lexicographic(q, 0, num_tiles(), 0, false, out);
        }
        if (!ok) {
            out.resize(first);
            return ResourceExhausted("planning query over budget (" +
                                     std::to_string(q.groups_used) + " groups, " +
                                     std::to_string(q.tiles_used) + " tiles)");
        }
        // Every path emits its runs in tile order; only adjacent ones remain to be merged. In a
        // dense index none are: two runs are adjacent only across a fully spanned dimension,
        // which the paths already emit as one run.
        if (!dense_) Coalesce(out, first);
        return Status::Ok();
    }

    Index Coord(std::size_t tile, std::size_t d) const {
        return static_cast<Index>(coords_[tile * rank_ + d]);
    }

    /// Coord, computed instead of loaded in a dense index (a cold query would miss in cache on
    /// tile_coords).
    Index CoordAt(std::size_t tile, std::size_t d) const {
        if (!dense_) return Coord(tile, d);
        const Dim& dim = dims_[d];
        const auto extent = static_cast<std::uint64_t>(dim.grid_extent());
        return dim.grid_begin + static_cast<Index>((tile / dim.stride) % extent);
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

    /// LowerBound for a [lo, hi) inside one group of tiles that share their coordinates in
    /// dims < d. O(1) in a dense index: such a group is the full sub-grid of dims >= d, with
    /// coordinate c of dim d at offset (c - grid begin) * stride from the group's start.
    std::size_t Seek(std::size_t lo, std::size_t hi, std::size_t d, Index value) const {
        if (!dense_) return LowerBound(lo, hi, d, value);
        const Dim& dim = dims_[d];
        const std::uint64_t group_tiles =
            dim.stride * static_cast<std::uint64_t>(dim.grid_extent());
        const std::uint64_t group = lo - lo % group_tiles;
        const Index c = std::clamp(value, dim.grid_begin, dim.grid_end);
        const std::uint64_t at =
            group + static_cast<std::uint64_t>(c - dim.grid_begin) * dim.stride;
        return static_cast<std::size_t>(std::clamp<std::uint64_t>(at, lo, hi));
    }

    /// Generic path: tiles [lo, hi) share their coordinates in dims < d and are therefore
    /// sorted by dim d. Narrow to the overlap in dim d, then either emit one contiguous range
    /// (when every later dim spans the whole grid) or recurse group by group.
    bool Lexicographic(QueryState& q, std::size_t lo, std::size_t hi, std::size_t d,
                       bool prefix_partial, std::vector<TileRange>& out) const {
        const std::size_t a = Seek(lo, hi, d, q.t0[d]);
        const std::size_t z = Seek(a, hi, d, q.t1[d]);
        if (a >= z) return true;
        if (d + 1 == rank_ || q.full_from[d + 1]) {
            if (!q.Charge(1, z - a)) return false;
            const bool flag = prefix_partial || q.EdgePartial(d, CoordAt(a, d)) ||
                              q.EdgePartial(d, CoordAt(z - 1, d)) ||
                              (d + 1 < rank_ && q.any_partial_from[d + 1]);
            out.push_back({static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(z), flag});
            return true;
        }
        std::size_t g = a;
        while (g < z) {
            const Index v = CoordAt(g, d);
            const std::size_t ge = Seek(g, z, d, v + 1);
            if (!q.Charge(1, 0)) return false;
            if (!Lexicographic(q, g, ge, d + 1, prefix_partial || q.EdgePartial(d, v), out)) {
                return false;
            }
            g = ge;
        }
        return true;
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
            const Index c0 = dims_[1].grid_begin;
            const std::size_t width = static_cast<std::size_t>(dims_[1].grid_extent());
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

    /// The 2-D path rule of the header comment: candidate groups weighted by their cost. The
    /// tiles term (a log2) is only evaluated when the groups alone do not decide: it is >= 0,
    /// so rows that cost no more than the columns' searches win either way.
    bool PreferRowPath(Index rows, Index cols) const {
        const double row_cost = double(rows) * row_group_cost_;
        const double col_cost = double(cols) * col_group_cost_;
        if (row_cost <= col_cost) return true;
        const double k = fill_ * double(rows) * double(cols);
        return row_cost <= col_cost + k * (1.0 + std::log2(k + 1.0));
    }

    /// First tile in row [lo, hi) whose column is >= c. A row's columns are strictly
    /// increasing and >= the grid's first column g, so the tile at offset j has column >= g + j;
    /// when the tile at offset c - g - 1 has column c - 1 the row is complete below c and the
    /// answer is offset c - g: O(1) for the full rows of a nearly dense index.
    std::size_t RowLowerBound(std::size_t lo, std::size_t hi, Index c) const {
        const auto k = static_cast<std::uint64_t>(c - dims_[1].grid_begin);
        if (k == 0) return lo;
        if (k <= hi - lo && Coord(lo + k - 1, 1) == c - 1) return lo + k;
        return LowerBound(lo, hi, 1, c);
    }

    /// 2-D row path: O(log R + selected rows * log C + K); O(selected rows) when dense.
    bool RowPath(QueryState& q, std::vector<TileRange>& out) const {
        const Index r0 = q.t0[0], r1 = q.t1[0];
        const Index c0 = q.t0[1], c1 = q.t1[1];
        if (dense_) {
            // Row r's tiles are [(r - g0) * W, +W): no search, no row index, no tile_coords.
            const std::uint64_t width = dims_[0].stride;
            const auto first_col = static_cast<std::uint64_t>(c0 - dims_[1].grid_begin);
            const auto cols = static_cast<std::uint64_t>(c1 - c0);
            const auto rows = static_cast<std::uint64_t>(r1 - r0);
            // Every row costs the same: charge them at once (a query over budget emits nothing).
            if (!q.Charge(rows, rows * cols)) return false;
            const bool col_flag = q.EdgePartial(1, c0) || q.EdgePartial(1, c1 - 1);
            const std::size_t first = out.size();
            out.resize(first + rows);
            TileRange* o = out.data() + first;
            std::uint64_t a =
                static_cast<std::uint64_t>(r0 - dims_[0].grid_begin) * width + first_col;
            for (std::uint64_t k = 0; k < rows; ++k, a += width) {
                o[k] = {static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(a + cols), col_flag};
            }
            // Only the first and last tile rows can cross the box's row edges.
            o[0].exact_coordinate_filter |= q.EdgePartial(0, r0);
            o[rows - 1].exact_coordinate_filter |= q.EdgePartial(0, r1 - 1);
            return true;
        }
        BuildRowGroups();
        const Lazy& l = *lazy_;
        auto it = std::lower_bound(l.row_values.begin(), l.row_values.end(), r0,
                                   [](TileCoord v, Index r) { return Index(v) < r; });
        for (std::size_t i = std::size_t(it - l.row_values.begin());
             i < l.row_values.size() && Index(l.row_values[i]) < r1; ++i) {
            const std::size_t a = RowLowerBound(l.row_begin[i], l.row_begin[i + 1], c0);
            const std::size_t z = RowLowerBound(l.row_begin[i], l.row_begin[i + 1], c1);
            if (!q.Charge(1, z - a)) return false;
            if (a == z) continue;
            const bool flag = q.EdgePartial(0, Index(l.row_values[i])) ||
                              q.EdgePartial(1, Coord(a, 1)) || q.EdgePartial(1, Coord(z - 1, 1));
            out.push_back({static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(z), flag});
        }
        return true;
    }

    /// 2-D column path: O(log C + selected columns * log R + K log K). Tiles of different
    /// columns interleave in entry order, so their ids are gathered and sorted as 4-byte keys;
    /// a run of consecutive tile ids is one contiguous entry range (tile_ptr is strictly
    /// increasing), so the ranges come out sorted and coalesced.
    bool ColumnPath(QueryState& q, std::vector<TileRange>& out) const {
        BuildColumnGroups();
        const Lazy& l = *lazy_;
        const Index r0 = q.t0[0], r1 = q.t1[0];
        const Index c0 = q.t0[1], c1 = q.t1[1];
        auto it = std::lower_bound(l.col_values.begin(), l.col_values.end(), c0,
                                   [](TileCoord v, Index c) { return Index(v) < c; });
        auto row_of = [&](std::uint32_t k) { return Coord(l.col_tiles[k], 0); };
        std::vector<std::uint32_t> picked;
        bool single_column = true;
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
            if (!q.Charge(1, z - a)) return false;
            single_column = picked.empty();
            picked.insert(picked.end(), l.col_tiles.begin() + a, l.col_tiles.begin() + z);
        }
        // One column's tiles are already in increasing id order.
        if (!single_column) std::sort(picked.begin(), picked.end());
        auto flag_of = [&](std::uint32_t t) {
            return q.EdgePartial(1, Coord(t, 1)) || q.EdgePartial(0, Coord(t, 0));
        };
        for (std::size_t i = 0; i < picked.size();) {
            std::size_t k = i + 1;
            bool flag = flag_of(picked[i]);
            for (; k < picked.size() && picked[k] == picked[k - 1] + 1; ++k) {
                flag |= flag_of(picked[k]);
            }
            out.push_back({picked[i], picked[k - 1] + 1, flag});
            i = k;
        }
        return true;
    }

    /// Merges adjacent ranges of out[first..], which are sorted and disjoint (adjacent tiles
    /// are adjacent entry ranges: tile_ptr is strictly increasing).
    static void Coalesce(std::vector<TileRange>& out, std::size_t first) {
        std::size_t w = first;
        for (std::size_t r = first; r < out.size(); ++r) {
            if (w > first && out[w - 1].last == out[r].first) {
                out[w - 1].last = out[r].last;
                out[w - 1].exact_coordinate_filter |= out[r].exact_coordinate_filter;
            } else {
                out[w++] = out[r];
            }
        }
        out.resize(w);
    }

    // Line 0 (hot): tile_ptr and the scalars every query reads.
    std::vector<std::uint64_t> ptr_;
    std::uint64_t nnz_ = 0;          ///< ptr_.back(), kept so that checks need not load it.
    std::uint32_t num_tiles_ = 0;    ///< ptr_.size() - 1 (< 2^32: Make checks).
    std::uint8_t rank_ = 0;
    bool dense_ = false;
    double fill_ = 0;            ///< 2-D: tiles / grid cells.
    double row_group_cost_ = 0;  ///< 2-D: estimated cost of one candidate tile row.
    double col_group_cost_ = 0;  ///< 2-D: of one candidate tile column, before its tiles.
    // Lines 1..rank (hot): one per dimension.
    std::array<Dim, kMaxRank> dims_{};
    // Cold: tile_coords (read only by sparse indexes), what the accessors return, lazy indexes.
    std::vector<TileCoord> coords_;
    std::array<Index, kMaxRank> tile_shape_{};
    Box source_box_;
    std::unique_ptr<Lazy> lazy_;
};

}  // namespace mooncake::sparse
