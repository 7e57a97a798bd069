// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// CUDA IPC handoff of device memory between processes of one node (docs/design.md §5): the exporter
// (a DummyClient) hands out the handle of the ALLOCATION BASE plus the offset of its tensor, the
// importer (the node daemon) opens the allocation once and caches the mapping.
//
// Why it is built this way:
// - cudaIpcGetMemHandle names a whole cudaMalloc allocation and cudaIpcOpenMemHandle returns its
//   base, so a tensor inside a caching allocator's block is (base handle, offset); both sides
//   check offset + bytes against the allocation size with overflow checks, and the importer
//   checks the size the exporter claims against the size of what it actually mapped.
// - Opening costs ~0.1 s the first time, ~0.2 ms after: mappings are cached. The key is the
//   handle bytes (which identify the allocation) plus device, the exporter's base address and
//   allocation size. An entry whose handle matches but whose base or size does not — or whose
//   base matches with another handle: the address was freed and reused — is closed and evicted,
//   so a freed and reused allocation is never confused with the old one. The cache is bounded
//   (LRU), and an importer keeps one cache per peer, dropped with the peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mooncake/sparse/status.h"
#include "transport/cuda_runtime.h"

namespace mooncake::sparse {

/// What an exporter sends for one device range.
struct CudaIpcExport {
    CudaIpcHandle handle{};
    std::uintptr_t base = 0;         ///< The allocation base in the exporter's address space.
    std::uint64_t alloc_size = 0;    ///< The allocation's size.
    std::uint64_t offset = 0;        ///< Of the range within the allocation.
    std::uint64_t bytes = 0;         ///< Of the range.
    int device = -1;                 ///< The exporter's device ordinal.
    std::string pci_bus_id;          ///< The device's PCI bus id (ordinals differ by process).
};

/// Exports `region` (device memory of this process).
/// Errors: Unimplemented (no CUDA / no IPC); InvalidArgument (not device memory of
/// region.device, outside its allocation, or not IPC-exportable).
Result<CudaIpcExport> ExportCudaIpc(const DeviceMemory& region);

/// `[offset, offset + bytes)` within `[0, size)`, without overflow.
inline bool CudaRangeWithin(std::uint64_t offset, std::uint64_t bytes, std::uint64_t size) {
    return offset <= size && bytes <= size - offset;
}

/// An opened CUDA IPC mapping; closed by the destructor (failures logged). Move-only.
class CudaIpcMapping {
public:
    /// Opens `handle` on `device` and measures what was mapped.
    /// Errors: Unimplemented; InvalidArgument.
    static Result<CudaIpcMapping> Open(const CudaIpcHandle& handle, int device);

    CudaIpcMapping() = default;
    ~CudaIpcMapping();
    CudaIpcMapping(CudaIpcMapping&& other) noexcept;
    CudaIpcMapping& operator=(CudaIpcMapping&& other) noexcept;
    CudaIpcMapping(const CudaIpcMapping&) = delete;
    CudaIpcMapping& operator=(const CudaIpcMapping&) = delete;

    std::uintptr_t base() const { return base_; }
    std::uint64_t size() const { return size_; }
    int device() const { return device_; }

private:
    void Reset();

    std::uintptr_t base_ = 0;
    std::uint64_t size_ = 0;
    int device_ = -1;
};

struct CudaIpcCacheStats {
    std::uint64_t opens = 0;
    std::uint64_t hits = 0;
    std::uint64_t evictions = 0;  ///< LRU evictions and stale entries closed.
    std::uint64_t entries = 0;
};

/// The importer's cache of opened mappings (see the file comment). Thread-safe.
class CudaIpcCache {
public:
    explicit CudaIpcCache(std::size_t max_entries = 64) : max_entries_(max_entries) {}

    /// A device range of this process for `exported`, valid while the returned holder lives.
    /// The device is resolved from the PCI bus id when one is given, else the ordinal.
    /// Errors: Unimplemented; InvalidArgument (bad bounds, size mismatch, cannot open).
    Result<std::pair<DeviceMemory, std::shared_ptr<const CudaIpcMapping>>> Map(
        const CudaIpcExport& exported);

    CudaIpcCacheStats Stats() const;
    /// Closes every mapping not in use.
    void Clear();

private:
    struct Entry {
        CudaIpcHandle handle{};
        int device = -1;
        std::uintptr_t remote_base = 0;
        std::uint64_t alloc_size = 0;
        std::shared_ptr<const CudaIpcMapping> mapping;
    };

    const std::size_t max_entries_;
    mutable std::mutex mu_;
    std::list<Entry> lru_;  // Most recent first. Guarded by mu_.
    std::vector<std::pair<std::string, int>> bus_devices_;  // PCI bus id -> ordinal. Guarded by mu_.
    CudaIpcCacheStats stats_;  // Guarded by mu_.
};

}  // namespace mooncake::sparse
