// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The memory that range reads land in. A read call reads its unique ranges chunk by chunk
// (docs/design.md §4 step 6); each chunk's ranges are written into one ReadSlab, and a slab whose
// last reference is dropped goes back to a ReadSlabPool, so the next chunk, and the next call
// (the next training step), writes into memory that is already backed instead of first-touching
// new pages (on a VM the kernel's zeroing of a new page costs more than the copy into it).
// The pool keeps a bounded number of free bytes and frees the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// One allocation holding the bytes of one or more range reads. Its bytes are not zero-filled:
/// a reader writes every byte it hands out.
class ReadSlab {
public:
    /// A slab of exactly `capacity` bytes, or nullptr when the allocation fails.
    static std::unique_ptr<ReadSlab> Allocate(std::size_t capacity);

    std::byte* data() { return bytes_.get(); }
    const std::byte* data() const { return bytes_.get(); }
    std::size_t capacity() const { return capacity_; }

private:
    ReadSlab(std::unique_ptr<std::byte[]> bytes, std::size_t capacity)
        : bytes_(std::move(bytes)), capacity_(capacity) {}

    std::unique_ptr<std::byte[]> bytes_;
    std::size_t capacity_ = 0;
};

/// Recycles slabs: Acquire hands out a free slab that fits, and a slab handed out returns to
/// the pool when its last reference (a read call's, the node cache's) is dropped, as long as
/// the free slabs stay within `max_free_bytes`; beyond that it is freed. Thread-safe; slabs may
/// outlive the pool (they are then freed).
class ReadSlabPool {
public:
    struct Stats {
        std::uint64_t allocated = 0;   ///< Slabs newly allocated.
        std::uint64_t reused = 0;      ///< Acquires served from the free list.
        std::uint64_t free_slabs = 0;  ///< Held now, ready for reuse.
        std::uint64_t free_bytes = 0;
    };

    explicit ReadSlabPool(std::uint64_t max_free_bytes);
    ReadSlabPool(const ReadSlabPool&) = delete;
    ReadSlabPool& operator=(const ReadSlabPool&) = delete;

    /// A slab of at least `bytes`: a free one whose capacity is at most twice that, else a new
    /// one with the capacity rounded up to its size class (at most 1/8 more), so that slabs of
    /// similar requests (the executor's chunks) serve one another.
    /// Errors: ResourceExhausted (allocation failed).
    Result<std::shared_ptr<ReadSlab>> Acquire(std::uint64_t bytes);

    /// Frees every free slab.
    void Trim();

    Stats stats() const;
    std::uint64_t max_free_bytes() const;

    /// The capacity Acquire gives a new slab for `bytes`.
    static std::uint64_t SizeClass(std::uint64_t bytes);

private:
    struct State;
    std::shared_ptr<State> state_;
};

}  // namespace mooncake::sparse
