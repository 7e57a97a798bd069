// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The sorted fast path of a commit on the GPU: for rank-2 COOs that already lie in device memory
// in canonical order (what EncodeUpdates returns), the checks, the tile index and the member
// checksums that IndexCanonicalEntries (codec.h) makes on the host, computed where the entries
// lie, so that a commit copies them once, from the device straight into the store's memory.
// This header needs no CUDA headers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/gpu_codec.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse::cuda {

/// One rank-2 COO in device memory, with the plan of its object (PlanCanonicalEntries, codec.h:
/// box, tile shape and dtypes as the object's descriptor will have them).
struct IndexItem {
    DevicePtr indices;  ///< [nnz, 2] of index_dtype, C-contiguous.
    DevicePtr values;   ///< [nnz] of value_dtype, C-contiguous.
    DType index_dtype = DType::kUInt16;
    DType value_dtype = DType::kBFloat16;
    std::uint64_t nnz = 0;
    Shape global_shape;  ///< [rows, columns]
    Shape box_origin;    ///< The source box, inside global_shape.
    Shape box_shape;
    Shape tile_shape;
};

/// The item of a COO in device memory whose object `plan` describes (PlanCanonicalEntries).
inline IndexItem IndexItemOf(const SourceDescriptor& plan, DevicePtr indices, DevicePtr values) {
    IndexItem it;
    it.indices = indices;
    it.values = values;
    it.index_dtype = plan.index_dtype;
    it.value_dtype = plan.value_dtype;
    it.nnz = plan.nnz;
    it.global_shape = plan.global_shape;
    it.box_origin.assign(plan.box.origin().begin(), plan.box.origin().end());
    it.box_shape.assign(plan.box.shape().begin(), plan.box.shape().end());
    it.tile_shape = plan.tile_shape;
    return it;
}

/// What IndexCanonicalBatch establishes about one item.
struct IndexResult {
    /// True when the index dtype is the narrowest for the shape, every coordinate lies in the
    /// box and the entries strictly increase in (tile row-major, element row-major) order (so
    /// none repeats): then the item's entries are canonical and the other fields are set. False
    /// says nothing more: the host path decides, and reports the error if there is one.
    bool canonical = false;
    std::vector<TileCoord> tile_coords;  ///< [num_tiles, 2]: the sorted fast path's tile index.
    std::vector<std::uint64_t> tile_ptr;  ///< [num_tiles + 1]
    std::uint64_t checksum_indices = 0;   ///< XXH3-64 of the indices bytes.
    std::uint64_t checksum_values = 0;    ///< XXH3-64 of the values bytes.
};

/// Checks, indexes and checksums a batch of rank-2 COOs on the device, ordered on `stream` after
/// the caller's work, in a fixed number of launches for the whole batch (a check of every entry
/// against its box and its predecessor, a scan of the tile openings, the tile index writes, the
/// XXH3 block sums of every member's full 1 KiB blocks, and one pass per member that chains
/// them and hashes the rest) and one host sync, which copies the results and the tile indexes
/// back (a second copy follows only when the tile indexes' bound exceeds 64 MiB: tile shapes
/// far smaller than the default). Items on the host side of the contract (an index dtype that
/// is not the narrowest, or uint64, no entries, a malformed box or tile shape, a misaligned
/// array) are not launched and come back not canonical; the others are unaffected by them. The
/// tile indexes and checksums are bit-exact with IndexCanonicalEntries' on the same bytes.
/// Errors: InvalidArgument (items on different devices); ResourceExhausted (device memory);
/// Unavailable / Internal (CUDA errors). Nothing is left on the device.
Result<std::vector<IndexResult>> IndexCanonicalBatch(std::span<const IndexItem> items,
                                                     std::uintptr_t stream);

}  // namespace mooncake::sparse::cuda
