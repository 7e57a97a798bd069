// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Large host blocks recycled across steps. Every step of an RL run allocates the same shapes of
// memory again: the source objects a commit writes, the target objects a read builds, the COO of
// an encode. Fresh large blocks come from the kernel (glibc maps them one by one), and the first
// write to each of their pages faults and zero-fills it: measured on a layer step, those faults
// took about half of the commit and of the read. Freed large blocks are therefore kept, within a
// byte limit, and handed to the next allocation of the same size class.
//
// - Only blocks of at least kMinCachedBlockBytes are cached; smaller ones are plain malloc/free.
// - A block's capacity is its size class: sizes rounded up to at most 1/8 more, so that the
//   slightly different sizes of one tensor's objects from step to step share blocks.
// - The limit (default: an eighth of physical memory, at most 4 GiB; the environment variable
//   MOONCAKE_SPARSE_HOST_CACHE_BYTES overrides it, 0 disables the cache) bounds the free bytes
//   held; a block freed beyond it goes back to the system. Trim() returns every free block.
// - Under AddressSanitizer a cached block is poisoned until it is handed out again.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mooncake::sparse {

/// Blocks below this size are never cached.
inline constexpr std::size_t kMinCachedBlockBytes = std::size_t{1} << 20;

struct HostBlockCacheStats {
    std::uint64_t limit_bytes = 0;
    std::uint64_t free_bytes = 0;   ///< Held now, ready for reuse.
    std::uint64_t free_blocks = 0;
    std::uint64_t allocations = 0;  ///< Large blocks handed out...
    std::uint64_t reuses = 0;       ///< ... of which from the cache.
};

/// `bytes` of host memory, not zero-filled; nullptr when the system has none (or bytes == 0).
/// Must be freed with FreeHostBlock(ptr, bytes) with the same `bytes`.
void* AllocateHostBlock(std::size_t bytes) noexcept;
void FreeHostBlock(void* ptr, std::size_t bytes) noexcept;

/// The capacity a block of `bytes` occupies (its size class; `bytes` itself below
/// kMinCachedBlockBytes).
std::size_t HostBlockCapacity(std::size_t bytes) noexcept;

/// Returns every free block to the system.
void TrimHostBlockCache() noexcept;
/// Sets the free bytes the cache may hold (0: none; frees what is over it now).
void SetHostBlockCacheLimit(std::uint64_t bytes) noexcept;
HostBlockCacheStats GetHostBlockCacheStats() noexcept;

}  // namespace mooncake::sparse
