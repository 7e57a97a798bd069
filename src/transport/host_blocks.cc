// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/host_blocks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define MCS_HOST_BLOCKS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MCS_HOST_BLOCKS_ASAN 1
#endif
#endif
#ifdef MCS_HOST_BLOCKS_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace mooncake::sparse {
namespace {

void Poison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) {
#ifdef MCS_HOST_BLOCKS_ASAN
    ASAN_POISON_MEMORY_REGION(p, n);
#endif
}

void Unpoison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) {
#ifdef MCS_HOST_BLOCKS_ASAN
    ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
}

std::uint64_t DefaultLimit() {
    if (const char* env = std::getenv("MOONCAKE_SPARSE_HOST_CACHE_BYTES"); env != nullptr && *env) {
        char* end = nullptr;
        const unsigned long long v = std::strtoull(env, &end, 10);
        if (end != env && *end == '\0') return v;
    }
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    const std::uint64_t phys =
        pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
    return std::min<std::uint64_t>(phys / 8, std::uint64_t{4} << 30);
}

/// The free blocks, by capacity, each with the sequence number of its free (the oldest goes
/// first when the limit is reached).
class Cache {
public:
    Cache() : limit_(DefaultLimit()) {}

    void* Allocate(std::size_t capacity) {
        {
            std::lock_guard lock(mu_);
            ++allocations_;
            auto it = free_.find(capacity);
            if (it != free_.end()) {
                void* p = it->second.back().second;
                it->second.pop_back();
                if (it->second.empty()) free_.erase(it);
                free_bytes_ -= capacity;
                --free_blocks_;
                ++reuses_;
                Unpoison(p, capacity);
                return p;
            }
        }
        return std::malloc(capacity);
    }

    void Free(void* p, std::size_t capacity) {
        std::vector<void*> release;
        {
            std::lock_guard lock(mu_);
            if (capacity > limit_) {
                release.push_back(p);
            } else {
                EvictLocked(limit_ - capacity, release);
                Poison(p, capacity);
                free_[capacity].emplace_back(++seq_, p);
                free_bytes_ += capacity;
                ++free_blocks_;
            }
        }
        for (void* q : release) std::free(q);
    }

    /// Sets the limit (nullopt: keeps it) and frees the oldest blocks until at most `keep`
    /// free bytes remain (at most the limit).
    void Shrink(std::optional<std::uint64_t> limit, std::uint64_t keep) {
        std::vector<void*> release;
        {
            std::lock_guard lock(mu_);
            if (limit) limit_ = *limit;
            EvictLocked(std::min(keep, limit_), release);
        }
        for (void* q : release) std::free(q);
    }

    HostBlockCacheStats Stats() {
        std::lock_guard lock(mu_);
        return {limit_, free_bytes_, free_blocks_, allocations_, reuses_};
    }

private:
    /// Takes the oldest free blocks out until at most `keep` free bytes remain.
    void EvictLocked(std::uint64_t keep, std::vector<void*>& release) {
        while (free_bytes_ > keep) {
            auto oldest = free_.end();
            for (auto it = free_.begin(); it != free_.end(); ++it) {
                if (oldest == free_.end() || it->second.front().first < oldest->second.front().first) {
                    oldest = it;
                }
            }
            const std::size_t capacity = oldest->first;
            void* p = oldest->second.front().second;
            oldest->second.pop_front();
            if (oldest->second.empty()) free_.erase(oldest);  // no empty lists are kept
            free_bytes_ -= capacity;
            --free_blocks_;
            Unpoison(p, capacity);
            release.push_back(p);
        }
    }

    std::mutex mu_;
    std::uint64_t limit_;
    std::uint64_t seq_ = 0;
    std::map<std::size_t, std::deque<std::pair<std::uint64_t, void*>>> free_;  // capacity -> blocks, oldest first
    std::uint64_t free_bytes_ = 0;
    std::uint64_t free_blocks_ = 0;
    std::uint64_t allocations_ = 0;
    std::uint64_t reuses_ = 0;
};

Cache& TheCache() {
    static Cache* cache = new Cache();  // Never destroyed: blocks may be freed at exit.
    return *cache;
}

/// Pooled blocks: the chunks they are carved from. A chunk's first bytes count its references:
/// one per live block, and one while a thread carves from it.
struct alignas(64) ChunkHeader {
    std::atomic<std::uint64_t> refs{0};
};
static_assert(sizeof(ChunkHeader) == 64);
constexpr std::size_t kPooledAlign = 64;  // a cache line: copies into the blocks stay aligned

class ChunkPool {
public:
    /// A chunk with no reference, from the free ones or the system (nullptr: none left).
    ChunkHeader* Take() {
        {
            std::lock_guard lock(mu_);
            if (!free_.empty()) {
                ChunkHeader* c = free_.back();
                free_.pop_back();
                ++reuses_;
                return c;
            }
        }
        // Twice the size, then the unaligned ends go: the chunk is aligned to its size, so a
        // block finds its chunk by masking its address.
        void* raw = mmap(nullptr, 2 * kPoolChunkBytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) return nullptr;
        const auto start = reinterpret_cast<std::uintptr_t>(raw);
        const std::uintptr_t aligned = (start + kPoolChunkBytes - 1) & ~(kPoolChunkBytes - 1);
        if (aligned > start) munmap(raw, aligned - start);
        const std::uintptr_t tail = aligned + kPoolChunkBytes;
        if (start + 2 * kPoolChunkBytes > tail) munmap(reinterpret_cast<void*>(tail), start + 2 * kPoolChunkBytes - tail);
        void* chunk = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
        madvise(chunk, kPoolChunkBytes, MADV_HUGEPAGE);  // best effort: 2 MiB faults, not 4 KiB
#endif
        auto* header = new (chunk) ChunkHeader();
        Poison(reinterpret_cast<std::byte*>(chunk) + sizeof(ChunkHeader),
               kPoolChunkBytes - sizeof(ChunkHeader));
        std::lock_guard lock(mu_);
        ++chunks_;
        return header;
    }

    /// Takes back a chunk whose last block went.
    void Give(ChunkHeader* c) {
        std::lock_guard lock(mu_);
        free_.push_back(c);
    }

    void Trim() {
        std::vector<ChunkHeader*> release;
        {
            std::lock_guard lock(mu_);
            release.swap(free_);
            chunks_ -= release.size();
        }
        for (ChunkHeader* c : release) {
            Unpoison(c, kPoolChunkBytes);
            munmap(c, kPoolChunkBytes);
        }
    }

    PooledBlockStats Stats() {
        std::lock_guard lock(mu_);
        return {chunks_, free_.size(), allocations.load(std::memory_order_relaxed), reuses_};
    }

    std::atomic<std::uint64_t> allocations{0};

private:
    std::mutex mu_;
    std::vector<ChunkHeader*> free_;
    std::uint64_t chunks_ = 0;
    std::uint64_t reuses_ = 0;
};

ChunkPool& ThePool() {
    static ChunkPool* pool = new ChunkPool();  // Never destroyed: blocks may be freed at exit.
    return *pool;
}

void Unref(ChunkHeader* c) {
    if (c->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) ThePool().Give(c);
}

/// The chunk this thread carves from, and where its free space starts.
struct OpenChunk {
    OpenChunk() = default;
    OpenChunk(const OpenChunk&) = delete;  // a copy would drop the reference twice
    OpenChunk& operator=(const OpenChunk&) = delete;
    ~OpenChunk() {
        if (chunk != nullptr) Unref(chunk);
    }

    ChunkHeader* chunk = nullptr;
    std::size_t offset = 0;
};
thread_local OpenChunk t_open_chunk;

}  // namespace

void* AllocatePooledBlock(std::size_t bytes) noexcept {
    if (bytes == 0) return nullptr;
    if (bytes > kMaxPooledBlockBytes) return AllocateHostBlock(bytes);
    const std::size_t size = (bytes + kPooledAlign - 1) & ~(kPooledAlign - 1);
    OpenChunk& open = t_open_chunk;
    if (open.chunk == nullptr || open.offset + size > kPoolChunkBytes) {
        if (open.chunk != nullptr) Unref(std::exchange(open.chunk, nullptr));
        ChunkHeader* c = ThePool().Take();
        if (c == nullptr) return nullptr;
        c->refs.store(1, std::memory_order_relaxed);
        open.chunk = c;
        open.offset = sizeof(ChunkHeader);
    }
    std::byte* p = reinterpret_cast<std::byte*>(open.chunk) + open.offset;
    open.offset += size;
    open.chunk->refs.fetch_add(1, std::memory_order_relaxed);
    ThePool().allocations.fetch_add(1, std::memory_order_relaxed);
    Unpoison(p, bytes);  // its padding stays poisoned
    return p;
}

void FreePooledBlock(void* ptr, std::size_t bytes) noexcept {
    if (ptr == nullptr) return;
    if (bytes > kMaxPooledBlockBytes) {
        FreeHostBlock(ptr, bytes);
        return;
    }
    Poison(ptr, (bytes + kPooledAlign - 1) & ~(kPooledAlign - 1));
    Unref(reinterpret_cast<ChunkHeader*>(reinterpret_cast<std::uintptr_t>(ptr) &
                                         ~(kPoolChunkBytes - 1)));
}

PooledBlockStats GetPooledBlockStats() noexcept { return ThePool().Stats(); }

std::size_t HostBlockCapacity(std::size_t bytes) noexcept {
    if (bytes < kMinCachedBlockBytes) return bytes;
    // Eight classes per power of two: at most 1/8 over the request.
    const int e = std::bit_width(bytes) - 1;
    const std::size_t step = std::size_t{1} << (e - 3);
    return (bytes + step - 1) / step * step;
}

void* AllocateHostBlock(std::size_t bytes) noexcept {
    if (bytes == 0) return nullptr;
    if (bytes < kMinCachedBlockBytes) return std::malloc(bytes);
    return TheCache().Allocate(HostBlockCapacity(bytes));
}

void FreeHostBlock(void* ptr, std::size_t bytes) noexcept {
    if (ptr == nullptr) return;
    if (bytes < kMinCachedBlockBytes) {
        std::free(ptr);
        return;
    }
    TheCache().Free(ptr, HostBlockCapacity(bytes));
}

void TrimHostBlockCache() noexcept {
    TheCache().Shrink(std::nullopt, 0);
    ThePool().Trim();
}

void SetHostBlockCacheLimit(std::uint64_t bytes) noexcept { TheCache().Shrink(bytes, bytes); }

HostBlockCacheStats GetHostBlockCacheStats() noexcept { return TheCache().Stats(); }

}  // namespace mooncake::sparse
