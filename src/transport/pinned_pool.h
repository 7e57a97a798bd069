// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Host memory for store objects that the CUDA copy engine reads and writes (docs/design.md §5):
// page-locked (cudaHostAlloc, through the run-time loader) under a byte quota, pageable beyond it.
// Never per-operation pinning: a block is pinned once and reused.
//
// Why it is built this way:
// - Pinning is slow (~0.25 s per GiB to allocate or free) while an RL loop upserts the same
//   tensors every step. Freed pinned blocks are therefore kept (counted in the quota) and handed
//   to the next allocation of about the same size (best fit within +25%); a new block is
//   allocated only when the quota has room, after releasing cached blocks that do not fit.
// - Over the quota, or without CUDA, an allocation is ordinary pageable memory: the store keeps
//   working, only H2D/D2H copies of those objects run at pageable speed. Stats() says which.
// - A HostBuffer returns its block to the pool it came from even after the pool handle is gone
//   (the pool's state is shared), so objects may outlive the store that made them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

namespace internal {
struct PinnedPoolState;
}  // namespace internal

struct HostMemoryStats {
    std::uint64_t pinned_quota_bytes = 0;
    std::uint64_t pinned_bytes = 0;         ///< Pinned blocks in use by live buffers.
    std::uint64_t pinned_cached_bytes = 0;  ///< Pinned blocks kept for reuse (within the quota).
    std::uint64_t pageable_bytes = 0;       ///< Live pageable buffers handed out by the pool.
    std::uint64_t pinned_allocations = 0;   ///< Buffers served pinned (new or reused).
    std::uint64_t pinned_reuses = 0;        ///< ... of which from a cached block.
    std::uint64_t pageable_allocations = 0;
    std::uint64_t pin_failures = 0;         ///< cudaHostAlloc failures (served pageable).
};

/// One host allocation, pinned or pageable. Move-only; released (to its pool) by the destructor.
class HostBuffer {
public:
    /// Pageable memory of `bytes` (not zeroed), or an empty buffer for 0.
    /// Errors: ResourceExhausted.
    static Result<HostBuffer> Pageable(std::uint64_t bytes);

    HostBuffer() = default;
    ~HostBuffer();
    HostBuffer(HostBuffer&& other) noexcept;
    HostBuffer& operator=(HostBuffer&& other) noexcept;
    HostBuffer(const HostBuffer&) = delete;
    HostBuffer& operator=(const HostBuffer&) = delete;

    std::byte* data() const { return data_; }
    std::uint64_t size() const { return size_; }
    bool pinned() const { return pinned_; }

private:
    friend class PinnedHostPool;
    void Reset();

    std::byte* data_ = nullptr;
    std::uint64_t size_ = 0;
    std::uint64_t capacity_ = 0;  ///< Of the pinned block.
    bool pinned_ = false;
    std::shared_ptr<internal::PinnedPoolState> pool_;
};

class PinnedHostPool {
public:
    /// A pool pinning at most `quota_bytes` (0: never pins). Pinning starts at the first
    /// allocation; nothing is allocated here.
    static std::shared_ptr<PinnedHostPool> Make(std::uint64_t quota_bytes);

    /// `bytes` of host memory, pinned when CUDA is present and the quota has room.
    /// Errors: ResourceExhausted (not even pageable memory could be allocated).
    Result<HostBuffer> Allocate(std::uint64_t bytes);

    /// Frees the cached (unused) pinned blocks.
    void Trim();
    HostMemoryStats Stats() const;

    explicit PinnedHostPool(std::shared_ptr<internal::PinnedPoolState> state)
        : state_(std::move(state)) {}

private:
    std::shared_ptr<internal::PinnedPoolState> state_;
};

}  // namespace mooncake::sparse
