// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The tensor fast path of the node daemon's protocol (executor/tensor_store.h,
// docs/design.md §5):
//
//     TensorPutRequest -> OkReply     tensors from the client buffer / CUDA IPC
//     TensorGetRequest -> OkReply     stored tensors into the same
//
// Each message lists its fields once (wire_format.h); the list is the wire order, so a new
// field is one line in Fields (and one member), at the position it takes on the wire.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "node/wire_common.h"
#include "transport/cuda_ipc.h"

namespace mooncake::sparse::wire {

/// Where one tensor's bytes are in the client: its registered buffer, or a CUDA allocation
/// exported by IPC (`ref` = handle of the allocation base + offset of the tensor + its size).
struct TensorLocation {
    BufferRef ref;
    /// kCudaIpc: the allocation's base address and size in the client — with the handle they
    /// identify the allocation (the daemon's mapping cache key); offset + size <= alloc_size.
    std::uint64_t cuda_base = 0;
    std::uint64_t cuda_alloc_size = 0;
    /// kCudaIpc: the device's PCI bus id (ordinals differ between processes); "" = ordinal.
    std::string pci_bus_id;

    static void Fields(auto& v, auto& m) {
        v("ref", m.ref);
        v("cuda_base", m.cuda_base);
        v("cuda_alloc_size", m.cuda_alloc_size);
        v("pci_bus_id", m.pci_bus_id, kMaxNameBytes);
    }
    Status Validate() const;
    friend bool operator==(const TensorLocation&, const TensorLocation&) = default;
};

/// The location of `bytes` at `offset` of the allocation `exported` names (its handle, base,
/// size, device), and the export a location names (what the daemon maps).
TensorLocation CudaLocation(const CudaIpcExport& exported, std::uint64_t offset,
                            std::uint64_t bytes);
CudaIpcExport ExportOf(const TensorLocation& location);

/// One tensor of a TensorPut (the source) or TensorGet (the destination, whose dtype and shape
/// the stored tensor must match, or the box of it at `box_origin`).
struct TensorItem {
    std::string key;
    DType dtype = DType::kFloat32;
    Shape shape;  ///< At most kMaxRank extents (the daemon's TensorStore validates them).
    TensorLocation location;
    /// Element strides of a kCudaIpc tensor (a strided view, e.g. a TP slice of a fused
    /// parameter); empty: C-contiguous, else one per extent. With strides, `location.ref` covers
    /// the view's extent — from its lowest to its highest element — so the daemon checks that
    /// extent against what it mapped before it writes.
    std::vector<std::int64_t> strides;
    /// TensorGet: the origin of the box of the stored tensor this destination receives (a
    /// dense box read, `shape` the box's extents); empty: the whole tensor. A put carries none.
    Shape box_origin;

    static void Fields(auto& v, auto& m) {
        v("key", m.key, kMaxKeyBytes);
        v("dtype", m.dtype);
        v("tensor shape", m.shape, kMaxRank);
        v("location", m.location);
        v("tensor strides", m.strides, kMaxRank);
        v("box origin", m.box_origin, kMaxRank);
    }
    Status Validate() const;
    friend bool operator==(const TensorItem&, const TensorItem&) = default;
};

/// put_tensor / upsert_tensor of a batch (all or nothing).
struct TensorPutRequest {
    static constexpr MessageType kType = MessageType::kTensorPut;
    std::vector<TensorItem> items;  ///< 1 .. kMaxBatchItems.
    PutMode mode = PutMode::kCreate;
    bool hard_pin = false;

    static void Fields(auto& v, auto& m) {
        v("tensors", m.items, kMaxBatchItems);
        v("put mode", m.mode);
        v("hard_pin", m.hard_pin);
    }
    Status Validate() const;
    friend bool operator==(const TensorPutRequest&, const TensorPutRequest&) = default;
};

/// get_tensor_into of a batch: every item validated before any byte is written.
struct TensorGetRequest {
    static constexpr MessageType kType = MessageType::kTensorGet;
    std::vector<TensorItem> items;  ///< 1 .. kMaxBatchItems.

    static void Fields(auto& v, auto& m) { v("tensors", m.items, kMaxBatchItems); }
    Status Validate() const;
    friend bool operator==(const TensorGetRequest&, const TensorGetRequest&) = default;
};

}  // namespace mooncake::sparse::wire
