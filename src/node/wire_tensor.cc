// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Rules of the tensor fast path messages; see wire_tensor.h.
#include "node/wire_tensor.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace mooncake::sparse::wire {

TensorLocation CudaLocation(const CudaIpcExport& e, std::uint64_t offset, std::uint64_t bytes) {
    TensorLocation loc;
    loc.ref.kind = BufferKind::kCudaIpc;
    loc.ref.offset = offset;
    loc.ref.size = bytes;
    loc.ref.cuda_ipc_handle.assign(reinterpret_cast<const char*>(e.handle.data()),
                                   e.handle.size());
    loc.ref.device = e.device;
    loc.cuda_base = e.base;
    loc.cuda_alloc_size = e.alloc_size;
    loc.pci_bus_id = e.pci_bus_id;
    return loc;
}

CudaIpcExport ExportOf(const TensorLocation& loc) {
    CudaIpcExport e;
    std::memcpy(e.handle.data(), loc.ref.cuda_ipc_handle.data(),
                std::min(e.handle.size(), loc.ref.cuda_ipc_handle.size()));
    e.base = loc.cuda_base;
    e.alloc_size = loc.cuda_alloc_size;
    e.offset = loc.ref.offset;
    e.bytes = loc.ref.size;
    e.device = loc.ref.device;
    e.pci_bus_id = loc.pci_bus_id;
    return e;
}

Status TensorLocation::Validate() const {
    if (ref.kind == BufferKind::kCudaIpc) {
        if (ref.offset > cuda_alloc_size || ref.size > cuda_alloc_size - ref.offset) {
            return InvalidArgument("CUDA IPC range [" + std::to_string(ref.offset) + ", +" +
                                   std::to_string(ref.size) + ") runs past its allocation of " +
                                   std::to_string(cuda_alloc_size) + " bytes");
        }
    } else if (cuda_base != 0 || cuda_alloc_size != 0 || !pci_bus_id.empty()) {
        return InvalidArgument("a client-buffer tensor location carries no CUDA allocation");
    }
    return Status::Ok();
}

Status TensorItem::Validate() const {
    if (!strides.empty() && strides.size() != shape.size()) {
        return InvalidArgument(std::to_string(strides.size()) + " tensor strides for rank " +
                               std::to_string(shape.size()));
    }
    if (!strides.empty() && location.ref.kind != BufferKind::kCudaIpc) {
        return InvalidArgument("only a CUDA tensor location carries strides");
    }
    if (!box_origin.empty() && box_origin.size() != shape.size()) {
        return InvalidArgument("a box origin of rank " + std::to_string(box_origin.size()) +
                               " for a tensor of rank " + std::to_string(shape.size()));
    }
    for (std::int64_t c : box_origin) {
        if (c < 0) return InvalidArgument("a box origin with a negative coordinate");
    }
    return Status::Ok();
}

Status TensorPutRequest::Validate() const {
    if (items.empty()) return InvalidArgument("TensorPut carries no tensors");
    for (const TensorItem& item : items) {
        if (!item.box_origin.empty()) {
            return InvalidArgument("a TensorPut item carries a box origin");
        }
    }
    return Status::Ok();
}

Status TensorGetRequest::Validate() const {
    if (items.empty()) return InvalidArgument("TensorGet carries no tensors");
    return Status::Ok();
}

}  // namespace mooncake::sparse::wire
