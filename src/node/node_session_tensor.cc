// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's handlers of the tensor fast path (src/node/wire_tensor.h): host tensors
// in the client buffer, CUDA tensors through the connection's IPC mappings.
#include <algorithm>
#include <utility>

#include "codec/codec.h"
#include "node/node_session.h"
#include "node/wire.h"
#include "transport/pitched_copy.h"

namespace mooncake::sparse {

using node_internal::AsBytes;
using node_internal::kMaxReadThreads;
using node_internal::Product;

Result<std::vector<TensorRef>> NodeServer::Session::ResolveTensors(
    const std::vector<wire::TensorItem>& items, bool destination,
    std::vector<std::shared_ptr<const CudaIpcMapping>>& holders) {
    std::vector<TensorRef> refs;
    refs.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
        const wire::TensorItem& item = items[i];
        const std::string what = std::string(destination ? "destination " : "") + "tensor " +
                                 std::to_string(i) + " '" + item.key.substr(0, 200) + "'";
        const wire::BufferRef& ref = item.location.ref;
        if (ref.kind == wire::BufferKind::kClientBuffer) {
            MCS_ASSIGN_OR_RETURN(std::span<std::byte> bytes, ClientBytes(ref, what));
            refs.push_back(TensorRef::Host(item.dtype, item.shape, bytes));
            continue;
        }
        // A view's strides come from the peer: the memory they reach must be exactly the range
        // it exported (and that range lies inside the allocation mapped below), so no stride
        // can make the copies write outside the mapping.
        ViewSpan span;
        if (!item.strides.empty()) {
            auto s = StridedViewSpan(item.shape, item.strides, DTypeSize(item.dtype));
            if (!s.ok()) return s.status().WithContext(what);
            if (s->bytes != ref.size) {
                return InvalidArgument(what + ": its strides span " + std::to_string(s->bytes) +
                                       " bytes, the exported range has " +
                                       std::to_string(ref.size));
            }
            span = *s;
        }
        auto mapped = MapCuda(item.location);
        if (!mapped.ok()) return mapped.status().WithContext(what);
        holders.push_back(std::move(mapped->second));
        // Copies run on this thread's own stream: connections do not serialize on one stream.
        DeviceMemory memory = mapped->first;
        if (!item.strides.empty()) {
            memory.address += static_cast<std::uint64_t>(-span.first);  // element [0, ..., 0]
            memory.bytes = 0;
            if (auto full = MakeFullTensorHeader(item.dtype, item.shape); full.ok()) {
                memory.bytes = full->data_bytes;  // the elements' bytes, as TensorRef counts them
            }
        }
        TensorRef t = TensorRef::Cuda(item.dtype, item.shape, memory, kCudaPerThreadStream);
        t.strides = item.strides;
        refs.push_back(std::move(t));
    }
    return refs;
}

Result<std::pair<DeviceMemory, std::shared_ptr<const CudaIpcMapping>>>
NodeServer::Session::MapCuda(const wire::TensorLocation& location) {
    const CudaIpcCacheStats before = ipc_cache_.Stats();
    auto mapped = ipc_cache_.Map(wire::ExportOf(location));
    const CudaIpcCacheStats after = ipc_cache_.Stats();
    server_.cuda_ipc_opens_.fetch_add(after.opens - before.opens, std::memory_order_relaxed);
    server_.cuda_ipc_hits_.fetch_add(after.hits - before.hits, std::memory_order_relaxed);
    return mapped;
}

Result<NodeServer::Session::Reply> NodeServer::Session::TensorPut(
    const wire::TensorPutRequest& req) {
    std::vector<std::shared_ptr<const CudaIpcMapping>> holders;
    MCS_ASSIGN_OR_RETURN(std::vector<TensorRef> refs, ResolveTensors(req.items, false, holders));
    std::vector<std::string> keys;
    keys.reserve(req.items.size());
    for (const wire::TensorItem& item : req.items) keys.push_back(item.key);
    MCS_RETURN_IF_ERROR(server_.tensors_->Put(keys, refs, {req.mode, req.hard_pin}));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::TensorGet(
    const wire::TensorGetRequest& req) {
    std::vector<std::shared_ptr<const CudaIpcMapping>> holders;
    MCS_ASSIGN_OR_RETURN(std::vector<TensorRef> refs, ResolveTensors(req.items, true, holders));
    std::vector<std::string> keys;
    std::vector<Shape> box_origins;
    keys.reserve(req.items.size());
    bool boxes = false;
    for (const wire::TensorItem& item : req.items) {
        keys.push_back(item.key);
        box_origins.push_back(item.box_origin);
        boxes |= !item.box_origin.empty();
    }
    if (!boxes) box_origins.clear();
    MCS_RETURN_IF_ERROR(server_.tensors_->GetInto(keys, refs, box_origins));
    return Reply{wire::OkReply{}, {}};
}

// ---------------------------------------------------------------------------------------------
// NodeServer
// ---------------------------------------------------------------------------------------------

}  // namespace mooncake::sparse
