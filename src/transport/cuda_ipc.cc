// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/cuda_ipc.h"

#include <cstdio>
#include <optional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace mooncake::sparse {

namespace {

/// Exported handles by allocation: cudaIpcGetMemHandle is a driver round trip on every put/get
/// of a CUDA tensor, while the allocation's buffer id (unique for the life of the process, so a
/// freed and reused address never matches) is a cheap query.
struct ExportedHandle {
    std::uint64_t buffer_id = 0;
    std::uint64_t alloc_size = 0;
    CudaIpcHandle handle{};
};

Result<CudaIpcHandle> ExportHandle(const cuda::AllocationRange& range, int device) {
    static std::mutex mu;
    static std::map<std::pair<int, std::uintptr_t>, ExportedHandle> cache;
    auto id = cuda::AllocationBufferId(range.base, device);
    const std::pair<int, std::uintptr_t> key{device, range.base};
    if (id.ok()) {
        std::lock_guard lock(mu);
        auto it = cache.find(key);
        if (it != cache.end() && it->second.buffer_id == *id && it->second.alloc_size == range.size) {
            return it->second.handle;
        }
    }
    MCS_ASSIGN_OR_RETURN(CudaIpcHandle handle, cuda::IpcGetMemHandle(range.base, device));
    if (id.ok()) {
        std::lock_guard lock(mu);
        if (cache.size() >= 4096) cache.clear();  // bounded; entries are cheap to rebuild
        cache[key] = {*id, range.size, handle};
    }
    return handle;
}

}  // namespace

Result<CudaIpcExport> ExportCudaIpc(const DeviceMemory& region) {
    MCS_RETURN_IF_ERROR(cuda::RequireCuda("exporting a CUDA IPC handle"));
    if (!cuda::GetSupport().ipc_available) {
        return Unimplemented("CUDA IPC is not available here (" + cuda::GetSupport().detail + ")");
    }
    MCS_ASSIGN_OR_RETURN(const cuda::PointerInfo info,
                         cuda::DescribePointer(reinterpret_cast<const void*>(region.address)));
    if (info.type != cuda::MemoryType::kDevice || info.device != region.device) {
        return InvalidArgument("address " + std::to_string(region.address) +
                               " is not device memory of CUDA device " +
                               std::to_string(region.device));
    }
    MCS_ASSIGN_OR_RETURN(const cuda::AllocationRange range,
                         cuda::GetAllocationRange(region.address, region.device));
    if (region.address < range.base ||
        !CudaRangeWithin(region.address - range.base, region.bytes, range.size)) {
        return InvalidArgument("device range of " + std::to_string(region.bytes) +
                               " bytes at " + std::to_string(region.address) +
                               " runs past its allocation");
    }
    CudaIpcExport out;
    MCS_ASSIGN_OR_RETURN(out.handle, ExportHandle(range, region.device));
    out.base = range.base;
    out.alloc_size = range.size;
    out.offset = region.address - range.base;
    out.bytes = region.bytes;
    out.device = region.device;
    if (auto bus = cuda::DevicePciBusId(region.device); bus.ok()) out.pci_bus_id = *bus;
    return out;
}

Result<CudaIpcMapping> CudaIpcMapping::Open(const CudaIpcHandle& handle, int device) {
    MCS_ASSIGN_OR_RETURN(const std::uintptr_t base, cuda::IpcOpenMemHandle(handle, device));
    CudaIpcMapping m;
    m.base_ = base;
    m.device_ = device;
    auto range = cuda::GetAllocationRange(base, device);
    if (!range.ok()) return range.status().WithContext("measuring an opened CUDA IPC mapping");
    m.size_ = range->size;
    return m;
}

CudaIpcMapping::~CudaIpcMapping() { Reset(); }

void CudaIpcMapping::Reset() {
    if (base_ != 0) {
        if (Status s = cuda::IpcCloseMemHandle(base_, device_); !s.ok()) {
            std::fprintf(stderr, "mooncake_sparse: %s\n", s.ToString().c_str());
        }
        base_ = 0;
        size_ = 0;
    }
}

CudaIpcMapping::CudaIpcMapping(CudaIpcMapping&& other) noexcept
    : base_(std::exchange(other.base_, 0)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)) {}

CudaIpcMapping& CudaIpcMapping::operator=(CudaIpcMapping&& other) noexcept {
    if (this != &other) {
        Reset();
        base_ = std::exchange(other.base_, 0);
        size_ = std::exchange(other.size_, 0);
        device_ = std::exchange(other.device_, -1);
    }
    return *this;
}

Result<std::pair<DeviceMemory, std::shared_ptr<const CudaIpcMapping>>> CudaIpcCache::Map(
    const CudaIpcExport& e) {
    if (!CudaRangeWithin(e.offset, e.bytes, e.alloc_size)) {
        return InvalidArgument("CUDA IPC range [" + std::to_string(e.offset) + ", +" +
                               std::to_string(e.bytes) + ") is outside its allocation of " +
                               std::to_string(e.alloc_size) + " bytes");
    }
    int device = e.device;
    if (!e.pci_bus_id.empty()) {
        // Resolved once per bus id: the runtime's lookup costs far more than a mapping hit.
        std::optional<int> known;
        {
            std::lock_guard lock(mu_);
            for (const auto& [bus, ordinal] : bus_devices_) {
                if (bus == e.pci_bus_id) known = ordinal;
            }
        }
        if (!known) {
            MCS_ASSIGN_OR_RETURN(const int resolved, cuda::DeviceByPciBusId(e.pci_bus_id));
            std::lock_guard lock(mu_);
            bus_devices_.emplace_back(e.pci_bus_id, resolved);
            known = resolved;
        }
        device = *known;
    }
    std::shared_ptr<const CudaIpcMapping> mapping;
    std::vector<std::shared_ptr<const CudaIpcMapping>> closed;  // Closed after the lock.
    {
        std::lock_guard lock(mu_);
        for (auto it = lru_.begin(); it != lru_.end();) {
            const bool same_handle = it->handle == e.handle;
            const bool same_identity = it->device == device && it->remote_base == e.base &&
                                       it->alloc_size == e.alloc_size;
            if (same_handle && same_identity) {
                mapping = it->mapping;
                lru_.splice(lru_.begin(), lru_, it);
                ++stats_.hits;
                break;
            }
            // Same handle with another identity, or the same address under another handle (the
            // exporter freed and reallocated): the entry is stale.
            if (same_handle || (it->device == device && it->remote_base == e.base)) {
                closed.push_back(std::move(it->mapping));
                it = lru_.erase(it);
                ++stats_.evictions;
                continue;
            }
            ++it;
        }
    }
    closed.clear();
    if (!mapping) {
        // Opened outside the lock: the first open of an allocation takes ~0.1 s.
        auto opened = CudaIpcMapping::Open(e.handle, device);
        if (!opened.ok()) return opened.status();
        if (opened->size() != e.alloc_size) {
            return InvalidArgument("the CUDA IPC allocation is " + std::to_string(opened->size()) +
                                   " bytes here, but the exporter says " +
                                   std::to_string(e.alloc_size));
        }
        mapping = std::make_shared<const CudaIpcMapping>(std::move(opened).value());
        std::lock_guard lock(mu_);
        ++stats_.opens;
        lru_.push_front({e.handle, device, e.base, e.alloc_size, mapping});
        while (lru_.size() > max_entries_) {
            closed.push_back(std::move(lru_.back().mapping));
            lru_.pop_back();
            ++stats_.evictions;
        }
    }
    closed.clear();
    DeviceMemory region{mapping->base() + e.offset, e.bytes, device};
    return std::make_pair(region, std::move(mapping));
}

CudaIpcCacheStats CudaIpcCache::Stats() const {
    std::lock_guard lock(mu_);
    CudaIpcCacheStats s = stats_;
    s.entries = lru_.size();
    return s;
}

void CudaIpcCache::Clear() {
    std::list<Entry> dropped;
    {
        std::lock_guard lock(mu_);
        dropped.swap(lru_);
    }
}

}  // namespace mooncake::sparse
