// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The Python SparseObject of both backends: a target-local object's descriptor and member bytes,
// plus what keeps the bytes alive — the owned TargetObject of the embedded store, or a lease on
// the node daemon's read-only segment memory (zero-copy, released when the object is collected).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "arrays.h"
#include "executor/sparse_store.h"
#include "mooncake/sparse/contracts.h"

namespace mooncake::sparse::py {

struct SparseObjectView {
    std::string target_id;
    std::string node_id;
    Box target_box;
    SourceDescriptor desc;  ///< desc.global_shape is the local shape.
    std::string coordinate_space;
    std::span<const std::byte> indices;      ///< [nnz, rank] of desc.index_dtype
    std::span<const std::byte> values;       ///< [nnz] of desc.value_dtype
    std::span<const std::byte> tile_coords;  ///< [num_tiles, rank] uint32
    std::span<const std::byte> tile_ptr;     ///< [num_tiles + 1] uint64
    std::shared_ptr<const void> keepalive;

    std::uint64_t nbytes() const {
        return indices.size() + values.size() + tile_coords.size() + tile_ptr.size();
    }
};

/// A view owning an embedded-store result.
std::shared_ptr<SparseObjectView> ViewOf(TargetObject&& object);

/// Registers the SparseObject class (read-only properties; members as zero-copy numpy arrays).
void RegisterSparseObject(pyb::module_& m);

}  // namespace mooncake::sparse::py
