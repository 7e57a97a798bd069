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
//
// Pooled blocks serve the many small buffers that live and die together, a read's target
// objects (142,144 of them per node and step at Kimi-K2 scale, 46 KB on average). They are
// carved one after another from 4 MiB chunks, huge-page advised, and a chunk goes back to the
// pool once its last buffer is freed; the pool keeps its free chunks (the most it ever held
// is what one step needed at once) until TrimHostBlockCache(). glibc's heap would give such
// buffers back to the system between steps (it trims its top) and fault them in again, at
// about 3 µs a page. A pooled buffer that outlives its step keeps its whole chunk.
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

/// Pooled blocks are at most this large; a larger request is an AllocateHostBlock.
inline constexpr std::size_t kMaxPooledBlockBytes = std::size_t{512} << 10;
/// The chunks pooled blocks are carved from (aligned to their size).
inline constexpr std::size_t kPoolChunkBytes = std::size_t{4} << 20;

/// `bytes` carved from a pooled chunk (AllocateHostBlock above kMaxPooledBlockBytes); nullptr
/// when the system has no memory (or bytes == 0). Thread-safe; each thread carves from its own
/// chunk. Must be freed with FreePooledBlock(ptr, bytes) with the same `bytes`.
void* AllocatePooledBlock(std::size_t bytes) noexcept;
void FreePooledBlock(void* ptr, std::size_t bytes) noexcept;

struct PooledBlockStats {
    std::uint64_t chunks = 0;       ///< Held: in use and free.
    std::uint64_t free_chunks = 0;  ///< Of which no buffer lives in.
    std::uint64_t allocations = 0;  ///< Pooled blocks handed out.
    std::uint64_t chunk_reuses = 0; ///< Chunks taken from the free ones.
};
PooledBlockStats GetPooledBlockStats() noexcept;

/// Returns every free block and every free pooled chunk to the system.
void TrimHostBlockCache() noexcept;
/// Sets the free bytes the cache may hold (0: none; frees what is over it now).
void SetHostBlockCacheLimit(std::uint64_t bytes) noexcept;
HostBlockCacheStats GetHostBlockCacheStats() noexcept;

}  // namespace mooncake::sparse
