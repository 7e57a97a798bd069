// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "node/node_tensor_store.h"

#include <atomic>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "transport/cuda_ipc.h"
#include "transport/host_copy.h"
#include "transport/pitched_copy.h"

namespace mooncake::sparse {
namespace {

std::string ItemName(std::size_t i, std::size_t n, std::string_view key) {
    std::string out = "tensor ";
    if (n > 1) out += std::to_string(i) + " ";
    return out + "'" + std::string(key.substr(0, 200)) + "'";
}

class NodeTensorStore final : public TensorStore {
public:
    explicit NodeTensorStore(std::shared_ptr<NodeClient> client) : client_(std::move(client)) {}

    Status Put(std::span<const std::string> keys, std::span<const TensorRef> tensors,
               const TensorPutOptions& options) override {
        std::vector<NodeTensor> items;
        MCS_RETURN_IF_ERROR(Prepare(keys, tensors, /*destination=*/false, items));
        MCS_RETURN_IF_ERROR(client_->PutTensors(items, options.mode, options.hard_pin));
        Count(items, tensors_put_, bytes_put_);
        return Status::Ok();
    }

    using TensorStore::GetInto;
    Status GetInto(std::span<const std::string> keys, std::span<const TensorRef> destinations,
                   std::span<const Shape> box_origins) override {
        MCS_RETURN_IF_ERROR(internal::CheckPerKey(keys.size(), box_origins.size(),
                                                  "box origins", /*optional=*/true));
        std::vector<NodeTensor> items;
        MCS_RETURN_IF_ERROR(Prepare(keys, destinations, /*destination=*/true, items));
        for (std::size_t i = 0; i < box_origins.size(); ++i) {
            if (box_origins[i].empty()) continue;
            // Checked here too, so that a bad origin fails before the request is sent.
            MCS_RETURN_IF_ERROR(internal::ValidateBoxOrigin(
                box_origins[i], destinations[i].shape,
                "destination " + ItemName(i, keys.size(), keys[i])));
            items[i].box_origin = box_origins[i];
        }
        MCS_RETURN_IF_ERROR(client_->GetTensorsInto(items));
        Count(items, tensors_read_, bytes_read_);
        return Status::Ok();
    }

    Result<HostTensor> Get(std::string_view key) override {
        MCS_RETURN_IF_ERROR(internal::ValidateTensorKey(key, "tensor"));
        // Zero-copy view of the daemon's segment (leased while we copy), one copy out.
        MCS_ASSIGN_OR_RETURN(LeasedObject leased, client_->Lease(key));
        if (leased.members.size() != 1) {
            return InvalidArgument("object '" + std::string(key) + "' is not a tensor object");
        }
        const ObjectView view{&leased.info, leased.members, false};
        MCS_ASSIGN_OR_RETURN(TensorHeader h, internal::ReadTensorObjectHeader(view, key));
        HostTensor out;
        MCS_ASSIGN_OR_RETURN(out.data, HostBuffer::Pageable(h.data_bytes));
        ParallelMemcpy(out.data.data(), leased.members[0].data() + h.data_offset, h.data_bytes,
                       DefaultCopyThreads());
        out.dtype = h.dtype;
        out.shape = h.local_shape;
        tensors_read_.fetch_add(1, std::memory_order_relaxed);
        bytes_read_.fetch_add(h.data_bytes, std::memory_order_relaxed);
        return out;
    }

    Result<TensorInfo> Stat(std::string_view key) override {
        MCS_RETURN_IF_ERROR(internal::ValidateTensorKey(key, "tensor"));
        MCS_ASSIGN_OR_RETURN(LeasedObject leased, client_->Lease(key));
        if (leased.members.size() != 1) {
            return InvalidArgument("object '" + std::string(key) + "' is not a tensor object");
        }
        const ObjectView view{&leased.info, leased.members, false};
        TensorInfo info;
        MCS_ASSIGN_OR_RETURN(info.header, internal::ReadTensorObjectHeader(view, key));
        info.version = leased.info.version;
        info.hard_pinned = leased.info.hard_pinned;
        return info;
    }

    TensorCapabilities Capabilities() const override {
        const cuda::Support& s = cuda::GetSupport();
        TensorCapabilities c;
        c.backend = "node";
        c.cuda_available = s.available;
        c.cuda_ipc_available = s.ipc_available;
        c.cuda_devices = s.device_count;
        c.cuda_detail = s.detail;
        if (auto metrics = client_->Metrics(false); metrics.ok()) {
            bool daemon_ipc = false;
            for (const auto& [name, value] : *metrics) {
                if (name == "pinned_quota_bytes") c.host.pinned_quota_bytes = std::uint64_t(value);
                if (name == "pinned_bytes") c.host.pinned_bytes = std::uint64_t(value);
                if (name == "pageable_bytes") c.host.pageable_bytes = std::uint64_t(value);
                if (name == "cuda_ipc_available") daemon_ipc = value != 0;
            }
            // Both ends must be able to do it.
            c.cuda_ipc_available = c.cuda_ipc_available && daemon_ipc;
        }
        return c;
    }

    TensorStoreStats Stats() const override {
        TensorStoreStats s;
        s.tensors_put = tensors_put_.load(std::memory_order_relaxed);
        s.bytes_put = bytes_put_.load(std::memory_order_relaxed);
        s.tensors_read = tensors_read_.load(std::memory_order_relaxed);
        s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
        return s;
    }

private:
    /// Validates every tensor, exports CUDA ones and synchronizes their streams.
    Status Prepare(std::span<const std::string> keys, std::span<const TensorRef> tensors,
                   bool destination, std::vector<NodeTensor>& items) {
        MCS_RETURN_IF_ERROR(internal::CheckPerKey(keys.size(), tensors.size(), "tensors"));
        items.clear();
        items.reserve(keys.size());
        std::vector<std::pair<int, CudaStream>> streams;
        for (std::size_t i = 0; i < keys.size(); ++i) {
            const TensorRef& t = tensors[i];
            const std::string what =
                (destination ? "destination " : "") + ItemName(i, keys.size(), keys[i]);
            MCS_RETURN_IF_ERROR(internal::ValidateTensorKey(keys[i], what));
            MCS_ASSIGN_OR_RETURN(TensorHeader h, internal::ValidateTensorRef(t, destination, what));
            NodeTensor item;
            item.key = keys[i];
            item.dtype = t.dtype;
            item.shape = t.shape;
            if (t.memory == TensorMemory::kHost) {
                item.host = {t.host, static_cast<std::size_t>(h.data_bytes)};
                if (!IsCContiguous(t.shape, t.strides)) item.host_strides = t.strides;
            } else {
                // A view is exported as the memory it spreads over; the daemon finds element
                // [0, ..., 0] from the strides and checks that span against what it maps.
                DeviceMemory region = t.device;
                if (!IsCContiguous(t.shape, t.strides)) {
                    auto span = StridedViewSpan(t.shape, t.strides, DTypeSize(t.dtype));
                    if (!span.ok()) return span.status().WithContext(what);
                    region.address = t.device.address + span->first;
                    region.bytes = span->bytes;
                    item.cuda_strides = t.strides;
                }
                auto exported = ExportCudaIpc(region);
                if (!exported.ok()) return exported.status().WithContext(what);
                item.cuda = wire::CudaLocation(*exported, exported->offset, exported->bytes);
                bool seen = false;
                for (const auto& [d, s] : streams) seen |= d == t.device.device && s == t.stream;
                if (!seen) streams.emplace_back(t.device.device, t.stream);
            }
            items.push_back(std::move(item));
        }
        // The daemon's copies must come after the caller's pending work on these tensors.
        for (const auto& [device, stream] : streams) {
            MCS_RETURN_IF_ERROR(cuda::StreamSynchronize(stream, device));
        }
        return Status::Ok();
    }

    static void Count(const std::vector<NodeTensor>& items, std::atomic<std::uint64_t>& n,
                      std::atomic<std::uint64_t>& bytes) {
        std::uint64_t total = 0;
        for (const NodeTensor& t : items) {
            std::uint64_t n = DTypeSize(t.dtype);  // elements' bytes, not a view's extent
            for (Index e : t.shape) n *= static_cast<std::uint64_t>(e);
            total += t.cuda ? n : t.host.size();
        }
        n.fetch_add(items.size(), std::memory_order_relaxed);
        bytes.fetch_add(total, std::memory_order_relaxed);
    }

    const std::shared_ptr<NodeClient> client_;
    std::atomic<std::uint64_t> tensors_put_{0};
    std::atomic<std::uint64_t> bytes_put_{0};
    std::atomic<std::uint64_t> tensors_read_{0};
    std::atomic<std::uint64_t> bytes_read_{0};
};

}  // namespace

std::unique_ptr<TensorStore> MakeNodeTensorStore(std::shared_ptr<NodeClient> client) {
    return std::make_unique<NodeTensorStore>(std::move(client));
}

}  // namespace mooncake::sparse
