// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/pageable_cuda_copy.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace mooncake::sparse {
namespace {

/// A piece of one copy that lies in one chunk.
struct Piece {
    std::size_t copy;
    std::uint64_t offset;        ///< Into the copy.
    std::uint64_t bytes;
    std::uint64_t chunk_offset;  ///< Into the chunk.
};

/// The chunks of a batch: pieces in order, chunk k holding pieces [starts[k], starts[k + 1]).
struct ChunkPlan {
    std::vector<Piece> pieces;
    std::vector<std::size_t> starts;

    std::size_t size() const { return starts.size() - 1; }
    std::span<const Piece> chunk(std::size_t k) const {
        return {pieces.data() + starts[k], starts[k + 1] - starts[k]};
    }
};

ChunkPlan CutChunks(std::span<const PageableCudaCopy> copies, std::uint64_t chunk_bytes) {
    ChunkPlan plan;
    plan.starts.push_back(0);
    std::uint64_t used = 0;
    for (std::size_t i = 0; i < copies.size(); ++i) {
        for (std::uint64_t off = 0; off < copies[i].bytes;) {
            if (used == chunk_bytes) {
                plan.starts.push_back(plan.pieces.size());
                used = 0;
            }
            const std::uint64_t n = std::min(chunk_bytes - used, copies[i].bytes - off);
            plan.pieces.push_back({i, off, n, used});
            used += n;
            off += n;
        }
    }
    if (used > 0) plan.starts.push_back(plan.pieces.size());
    return plan;
}

/// The distinct (device, stream) pairs of a set of pieces.
class Streams {
public:
    void Add(int device, CudaStream stream) {
        if (std::find(list_.begin(), list_.end(), std::pair{device, stream}) == list_.end()) {
            list_.emplace_back(device, stream);
        }
    }
    /// Synchronizes every stream, all of them even after a failure; the first error.
    Status SyncAll() {
        Status first;
        for (const auto& [device, stream] : list_) {
            Status s = cuda::StreamSynchronize(stream, device);
            if (!s.ok() && first.ok()) first = std::move(s);
        }
        list_.clear();
        return first;
    }

private:
    std::vector<std::pair<int, CudaStream>> list_;
};

}  // namespace

PageableCudaCopier::PageableCudaCopier(unsigned threads, std::uint64_t chunk_bytes)
    : chunk_bytes_(std::max<std::uint64_t>(chunk_bytes, 1 << 20)), pool_(threads) {}

PageableCudaCopier::~PageableCudaCopier() {
    for (std::byte* c : chunks_) {
        if (c != nullptr) (void)cuda::FreeHost(c);
    }
}

bool PageableCudaCopier::EnsureChunks() {
    if (chunks_[1] != nullptr) return true;
    if (alloc_failed_) return false;
    for (std::byte*& c : chunks_) {
        auto allocated = cuda::HostAlloc(chunk_bytes_);
        if (!allocated.ok()) {
            alloc_failed_ = true;
            return false;
        }
        c = static_cast<std::byte*>(*allocated);
    }
    return true;
}

Status PageableCudaCopier::RunDirect(std::span<const PageableCudaCopy> copies,
                                     CopyDirection direction, std::size_t* failed) {
    Streams streams;
    Status status;
    for (std::size_t i = 0; i < copies.size() && status.ok(); ++i) {
        const PageableCudaCopy& c = copies[i];
        void* dev = reinterpret_cast<void*>(c.device_ptr);
        status = direction == CopyDirection::kDeviceToHost
                     ? cuda::MemcpyAsync(c.host, dev, c.bytes, cuda::CopyKind::kDeviceToHost,
                                         c.stream, c.device)
                     : cuda::MemcpyAsync(dev, c.host, c.bytes, cuda::CopyKind::kHostToDevice,
                                         c.stream, c.device);
        if (!status.ok() && failed != nullptr) *failed = i;
        streams.Add(c.device, c.stream);
    }
    Status synced = streams.SyncAll();
    if (status.ok() && !synced.ok() && failed != nullptr) *failed = 0;
    return status.ok() ? synced : status;
}

Status PageableCudaCopier::Run(std::span<const PageableCudaCopy> copies, CopyDirection direction,
                               std::size_t* failed) {
    std::uint64_t total = 0;
    for (const PageableCudaCopy& c : copies) total += c.bytes;
    if (total == 0) return Status::Ok();
    std::lock_guard lock(mu_);
    // Below two chunks nothing overlaps: the driver's copies are as fast.
    if (total < 2 * chunk_bytes_ || !EnsureChunks()) return RunDirect(copies, direction, failed);

    const ChunkPlan plan = CutChunks(copies, chunk_bytes_);
    const std::size_t n = plan.size();
    std::vector<HostCopy> host;
    const auto host_copies = [&](std::size_t k) {
        host.clear();
        std::byte* chunk = chunks_[k % 2];
        for (const Piece& p : plan.chunk(k)) {
            std::byte* mem = copies[p.copy].host + p.offset;
            if (direction == CopyDirection::kDeviceToHost) {
                host.push_back({mem, chunk + p.chunk_offset, p.bytes});
            } else {
                host.push_back({chunk + p.chunk_offset, mem, p.bytes});
            }
        }
        pool_.Run(host);
    };
    Streams streams;
    // Issues chunk k's DMA; then, while it runs, `overlap` moves the other chunk on the host.
    const auto dma = [&](std::size_t k, auto&& overlap) -> Status {
        std::byte* chunk = chunks_[k % 2];
        Status status;
        for (const Piece& p : plan.chunk(k)) {
            const PageableCudaCopy& c = copies[p.copy];
            void* dev = reinterpret_cast<void*>(c.device_ptr + p.offset);
            status = direction == CopyDirection::kDeviceToHost
                         ? cuda::MemcpyAsync(chunk + p.chunk_offset, dev, p.bytes,
                                             cuda::CopyKind::kDeviceToHost, c.stream, c.device)
                         : cuda::MemcpyAsync(dev, chunk + p.chunk_offset, p.bytes,
                                             cuda::CopyKind::kHostToDevice, c.stream, c.device);
            if (!status.ok()) {
                if (failed != nullptr) *failed = p.copy;
                break;
            }
            streams.Add(c.device, c.stream);
        }
        if (status.ok()) overlap();
        // Every issued DMA completes before the chunk is touched again or the call returns.
        Status synced = streams.SyncAll();
        if (status.ok() && !synced.ok() && failed != nullptr) *failed = plan.chunk(k)[0].copy;
        return status.ok() ? synced : status;
    };
    if (direction == CopyDirection::kDeviceToHost) {
        // The DMA of chunk k fills one buffer while the host drains chunk k - 1 from the other.
        for (std::size_t k = 0; k < n; ++k) {
            MCS_RETURN_IF_ERROR(dma(k, [&] {
                if (k > 0) host_copies(k - 1);
            }));
        }
        host_copies(n - 1);
    } else {
        // The host fills chunk k + 1 while the DMA of chunk k reads the other buffer.
        host_copies(0);
        for (std::size_t k = 0; k < n; ++k) {
            MCS_RETURN_IF_ERROR(dma(k, [&] {
                if (k + 1 < n) host_copies(k + 1);
            }));
        }
    }
    chunked_batches_.fetch_add(1, std::memory_order_relaxed);
    chunks_moved_.fetch_add(n, std::memory_order_relaxed);
    return Status::Ok();
}

}  // namespace mooncake::sparse
