// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "executor/read_buffers.h"

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>

namespace mooncake::sparse {

std::unique_ptr<ReadSlab> ReadSlab::Allocate(std::size_t capacity) {
    // Default-initialized: no zero fill, and no page is touched before the read writes it.
    std::unique_ptr<std::byte[]> bytes(new (std::nothrow) std::byte[capacity == 0 ? 1 : capacity]);
    if (!bytes) return nullptr;
    return std::unique_ptr<ReadSlab>(new ReadSlab(std::move(bytes), capacity));
}

struct ReadSlabPool::State {
    explicit State(std::uint64_t max_free) : max_free_bytes(max_free) {}

    /// Takes back a slab whose last reference went: kept while the free bytes stay in bound.
    void Return(ReadSlab* slab) {
        std::unique_ptr<ReadSlab> owned(slab);
        std::lock_guard lock(mu);
        if (free_bytes + slab->capacity() > max_free_bytes) return;  // freed here
        free_bytes += slab->capacity();
        free.emplace(slab->capacity(), std::move(owned));
    }

    const std::uint64_t max_free_bytes;
    mutable std::mutex mu;
    std::multimap<std::uint64_t, std::unique_ptr<ReadSlab>> free;  // by capacity; guarded by mu
    std::uint64_t free_bytes = 0;
    std::uint64_t allocated = 0;
    std::uint64_t reused = 0;
};

ReadSlabPool::ReadSlabPool(std::uint64_t max_free_bytes)
    : state_(std::make_shared<State>(max_free_bytes)) {}

std::uint64_t ReadSlabPool::SizeClass(std::uint64_t bytes) {
    const std::uint64_t granule = std::max<std::uint64_t>(64, std::bit_floor(bytes | 1) / 8);
    return (bytes + granule - 1) / granule * granule;
}

Result<std::shared_ptr<ReadSlab>> ReadSlabPool::Acquire(std::uint64_t bytes) {
    std::unique_ptr<ReadSlab> slab;
    {
        std::lock_guard lock(state_->mu);
        // A much larger slab would be pinned whole by a small read (the node cache charges
        // whole slabs), so only one of at most twice the request is taken.
        auto it = state_->free.lower_bound(bytes);
        if (it != state_->free.end() && it->first / 2 <= bytes) {
            slab = std::move(it->second);
            state_->free.erase(it);
            state_->free_bytes -= slab->capacity();
            ++state_->reused;
        } else {
            ++state_->allocated;
        }
    }
    if (!slab) {
        const std::uint64_t capacity = SizeClass(bytes);
        slab = ReadSlab::Allocate(static_cast<std::size_t>(capacity));
        if (!slab) {
            return ResourceExhausted("cannot allocate a read buffer of " +
                                     std::to_string(capacity) + " bytes");
        }
    }
    // The deleter holds the pool's state, so a slab may outlive the pool object.
    return std::shared_ptr<ReadSlab>(slab.release(), [state = state_](ReadSlab* s) {
        state->Return(s);
    });
}

void ReadSlabPool::Trim() {
    std::multimap<std::uint64_t, std::unique_ptr<ReadSlab>> dropped;
    std::lock_guard lock(state_->mu);
    dropped.swap(state_->free);
    state_->free_bytes = 0;
}

ReadSlabPool::Stats ReadSlabPool::stats() const {
    std::lock_guard lock(state_->mu);
    return {state_->allocated, state_->reused, state_->free.size(), state_->free_bytes};
}

std::uint64_t ReadSlabPool::max_free_bytes() const { return state_->max_free_bytes; }

}  // namespace mooncake::sparse
