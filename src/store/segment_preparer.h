// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// SegmentPreparer: readies a store's shared-memory segments in background threads, so that the
// node daemon serves from its first millisecond instead of after every pinned byte is registered
// (cudaHostRegister runs at ~2 GB/s: 18 s for 32 GiB, minutes for a node's 100+ GiB).
//
// Why it is built this way:
// - Two jobs, both in parallel chunks on a few threads, in segment order (first-fit allocation
//   fills segment 0 first, so the first segments are ready first):
//   1. pre-fault: populate every page of the segment (MADV_POPULATE_WRITE; fallocate of the
//      memfd on kernels before 5.14). A fresh shared-memory page is allocated and zeroed on its
//      first touch; when that touch is a CUDA copy into pageable memory, the copy runs at the
//      page-fault rate (~2 GB/s) instead of the pageable copy rate (~15 GB/s). Populating never
//      changes a byte, so it is safe while the store already serves.
//   2. pin: once every chunk of a segment is resident, register its pinned prefix (the page
//      zeroing, the expensive part of a registration, has then run in parallel already). Until
//      its registration is published a segment is used as pageable memory: correct, just slower.
// - One registration per segment, never several adjacent ones: whether the copy engine takes
//   the pinned path for a copy that spans two registrations is up to the driver.
// - The put path may claim chunks the background has not reached (PrefaultRange), so a copy
//   into memory that is still fresh does not fault either.
// - Stop() (and the destructor) cancel the remaining work and join the threads; registrations
//   made so far live until the preparer is destroyed, which must happen before the segments
//   are unmapped.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake/sparse/status.h"
#include "store/pinned_memory.h"

namespace mooncake::sparse {

/// Registers `[data, data + size)` as pinned host memory (page-aligned).
using RegisterPinnedFn = std::function<Result<PinnedRegion>(std::byte* data, std::uint64_t size)>;

/// One segment to prepare.
struct PrepareSegment {
    std::byte* data = nullptr;  ///< This process's writable mapping (page-aligned).
    int fd = -1;                ///< The memfd (for the fallocate fallback).
    std::uint64_t size = 0;
    std::uint64_t pin_bytes = 0;  ///< Prefix to register (page multiple, <= size).
};

struct SegmentPreparerOptions {
    /// Populate every page up front (commits the whole capacity to RAM at start-up).
    bool prefault = true;
    /// Worker threads (at least 1).
    std::uint32_t threads = 4;
    /// Pre-fault granularity (a page multiple).
    std::uint64_t chunk_bytes = std::uint64_t{64} << 20;
    /// Empty: PinnedRegion::Register (cudaHostRegister through the dlopen'ed runtime, when a
    /// device is present). Tests inject a fake to observe and delay registration.
    RegisterPinnedFn register_pinned;
};

/// Where preparation stands.
struct SegmentPreparation {
    std::uint64_t pinned_target_bytes = 0;    ///< Pinned bytes it will register (0: cannot pin).
    std::uint64_t pinned_bytes = 0;           ///< Registered so far.
    std::uint64_t prefault_target_bytes = 0;  ///< 0 when pre-faulting is off.
    std::uint64_t prefaulted_bytes = 0;
    std::uint32_t pin_failures = 0;
    std::uint32_t prefault_failures = 0;
    bool complete = false;  ///< Every job ran (successfully or not); false while running or stopped.
    std::string detail;     ///< Why pinning cannot happen, or the first failure.
};

class SegmentPreparer {
public:
    /// Starts the threads at once; returns without waiting for any work.
    SegmentPreparer(std::vector<PrepareSegment> segments, SegmentPreparerOptions options);
    ~SegmentPreparer();
    SegmentPreparer(const SegmentPreparer&) = delete;
    SegmentPreparer& operator=(const SegmentPreparer&) = delete;

    /// Cancels what has not started and joins the threads (a registration in progress
    /// finishes first). Idempotent.
    void Stop();

    /// The registered prefix of `segment` (0 until its registration is published).
    std::uint64_t PinnedBytes(std::uint32_t segment) const {
        return segments_[segment].pinned.load(std::memory_order_acquire);
    }

    /// Makes `[offset, offset + size)` of `segment` resident now, in this thread, unless the
    /// background has done it or is doing it. Cheap when the range is ready.
    void PrefaultRange(std::uint32_t segment, std::uint64_t offset, std::uint64_t size);

    SegmentPreparation Progress() const;

    /// Waits until preparation is complete. False on timeout or when it was stopped first.
    bool Wait(std::chrono::milliseconds timeout) const;

private:
    enum ChunkState : std::uint8_t { kPending = 0, kClaimed = 1, kDone = 2 };
    struct Chunk {
        std::uint32_t segment = 0;
        std::uint64_t offset = 0;
        std::uint64_t size = 0;
    };
    struct Segment {
        PrepareSegment desc;
        std::size_t first_chunk = 0;  ///< Index into chunks_ of its first chunk.
        std::size_t num_chunks = 0;
        std::atomic<std::size_t> chunks_left{0};
        std::atomic<bool> pin_claimed{false};
        std::atomic<std::uint64_t> pinned{0};
        PinnedRegion region;  ///< Written once by the thread that claimed the pin.
    };

    void Work();
    /// Claims chunk `i` and populates it; true when this call did it.
    bool RunChunk(std::size_t i);
    /// Registers `s`'s prefix if it is resident and nobody claimed it yet.
    void TryPin(Segment& s);
    void RecordFailure(std::atomic<std::uint32_t>& counter, const Status& status);

    const SegmentPreparerOptions options_;
    std::unique_ptr<Segment[]> segments_;
    std::size_t num_segments_ = 0;
    std::vector<Chunk> chunks_;
    std::unique_ptr<std::atomic<std::uint8_t>[]> chunk_state_;
    std::atomic<std::size_t> next_chunk_{0};
    std::atomic<bool> stop_{false};
    std::atomic<bool> pin_disabled_{false};  ///< After a failure: the rest stays pageable.
    std::atomic<std::uint64_t> prefaulted_{0};
    std::atomic<std::uint32_t> pin_failures_{0};
    std::atomic<std::uint32_t> prefault_failures_{0};
    std::uint64_t requested_pin_ = 0;    ///< Sum of the segments' pin_bytes (immutable).
    std::uint64_t prefault_target_ = 0;  ///< Immutable after construction.
    std::uint64_t pinned_target_ = 0;    // Guarded by mu_: 0 once pinning is known impossible.

    mutable std::mutex mu_;
    mutable std::condition_variable done_cv_;
    std::uint32_t running_ = 0;  // Guarded by mu_.
    bool cancelled_ = false;     // Guarded by mu_: a worker stopped before its work was done.
    std::string detail_;         // Guarded by mu_.
    std::vector<std::thread> threads_;
};

}  // namespace mooncake::sparse
