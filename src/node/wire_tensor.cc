// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Rules of the tensor fast path messages; see wire_tensor.h.
#include "node/wire_tensor.h"

#include <string>

namespace mooncake::sparse::wire {

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
    return Status::Ok();
}

Status TensorPutRequest::Validate() const {
    if (items.empty()) return InvalidArgument("TensorPut carries no tensors");
    return Status::Ok();
}

Status TensorGetRequest::Validate() const {
    if (items.empty()) return InvalidArgument("TensorGet carries no tensors");
    return Status::Ok();
}

}  // namespace mooncake::sparse::wire
