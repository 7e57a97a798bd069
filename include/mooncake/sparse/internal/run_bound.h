// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// How many runs a tile index query can return, from geometry alone: what SelectSources sums into
// SourceSelection::region_bound so that PlanBatch sizes its output arrays once.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "mooncake/sparse/geometry.h"

namespace mooncake::sparse::internal {

/// The tile coordinate of element coordinate x >= 0 for tile extent t >= 1 (a shift for the
/// usual power-of-two tiles: SelectSources calls this per match).
inline Index TileCoordOf(Index x, Index t) {
    return (t & (t - 1)) == 0 ? x >> std::countr_zero(static_cast<std::uint64_t>(t)) : x / t;
}

/// An upper bound, from geometry alone, on the runs TileIndex::QueryTiles returns for the
/// overlap [lo[d], hi[d]) of a source box [begin[d], end[d]) tiled by `tile` with `tiles`
/// tiles present. Every query path emits at most one run per combination of tile coordinates
/// in the dims before the longest suffix of dims whose tile grid the overlap spans (see
/// QueryState::full_from; the 2-D row and column paths: at most one per tile row), and every
/// run holds a tile of its own. A tile extent < 1 (a malformed descriptor) gives `tiles`.
inline std::uint64_t RunBound(std::size_t rank, const Index* lo, const Index* hi,
                              std::span<const Index> begin, std::span<const Index> end,
                              std::span<const Index> tile, std::uint64_t tiles) {
    for (std::size_t d = 0; d < rank; ++d) {
        if (tile[d] < 1) return tiles;
    }
    // k: the first dim of the longest fully spanned suffix.
    std::size_t k = rank;
    while (k > 0) {
        const std::size_t d = k - 1;
        const bool full = (lo[d] == begin[d] && hi[d] == end[d]) ||
                          (TileCoordOf(lo[d], tile[d]) == TileCoordOf(begin[d], tile[d]) &&
                           TileCoordOf(hi[d] - 1, tile[d]) == TileCoordOf(end[d] - 1, tile[d]));
        if (!full) break;
        --k;
    }
    // Runs are emitted at depth k - 1 (one per prefix of dims < k - 1), or once when k == 0.
    std::uint64_t bound = 1;
    for (std::size_t d = 0; d + 1 < k && bound < tiles; ++d) {
        const auto extent = static_cast<std::uint64_t>(TileCoordOf(hi[d] - 1, tile[d]) -
                                                       TileCoordOf(lo[d], tile[d]) + 1);
        bound = extent > tiles / bound ? tiles : bound * extent;
    }
    return std::min(bound, tiles);
}

}  // namespace mooncake::sparse::internal
