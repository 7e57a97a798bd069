// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Local memcpy of large host buffers across threads (docs/design.md §7: one thread copies ~6 GB/s,
// sixteen ~46 GB/s on an H200 host). Small copies stay on the calling thread. And copies
// between strided layouts (numpy / torch views: transposed, sliced, Fortran order), so that a
// caller's view is read or written in place instead of through a contiguous staging copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace mooncake::sparse {

/// Copies `bytes` from `src` to `dst` (not overlapping) with up to `threads` threads, each
/// taking at least 8 MiB.
void ParallelMemcpy(std::byte* dst, const std::byte* src, std::uint64_t bytes, unsigned threads);

/// One host-to-host copy of a batch.
struct HostCopy {
    std::byte* dst;
    const std::byte* src;
    std::uint64_t bytes;
};

/// Runs a batch of copies across up to `threads` threads: large ones split with ParallelMemcpy,
/// many small ones cut into 1-8 MiB pieces that the threads take in turn.
void ParallelCopies(std::span<const HostCopy> copies, unsigned threads);

/// The default thread count for ParallelMemcpy: hardware concurrency, at most 8.
unsigned DefaultCopyThreads();

/// ParallelCopies on threads kept for the pool's life, for callers that copy in many steps (a
/// pipeline of chunks), where starting threads per step would cost a sixth of each step. The
/// workers start on the first Run. One Run at a time (a second caller waits for the first).
class HostCopyPool {
public:
    explicit HostCopyPool(unsigned threads);
    ~HostCopyPool();
    HostCopyPool(const HostCopyPool&) = delete;
    HostCopyPool& operator=(const HostCopyPool&) = delete;

    /// Copies every item of `copies` (cut as ParallelCopies cuts them); returns when all are done.
    void Run(std::span<const HostCopy> copies);

    unsigned threads() const { return threads_; }

private:
    void Work(std::uint64_t job);
    void WorkerLoop();

    const unsigned threads_;
    std::mutex run_mu_;  ///< One Run at a time.
    std::mutex mu_;
    std::condition_variable wake_;
    std::condition_variable done_;
    std::vector<std::thread> workers_;
    std::vector<HostCopy> pieces_;
    std::atomic<std::size_t> next_{0};
    std::uint64_t job_ = 0;       ///< Counts Runs; a worker takes each job once.
    unsigned busy_ = 0;           ///< Workers still inside the current job.
    bool stop_ = false;
};

/// Strides are in elements and may be negative or zero; an empty stride list means C-contiguous.

/// Whether `strides` lay `shape` out C-contiguously. Extent-1 dimensions may have any stride,
/// and a tensor with no elements is contiguous whatever its strides (numpy and torch both give
/// empty tensors stride 0).
bool IsCContiguous(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides);

/// Whether no two elements of `shape` share an address. A sufficient test (dimensions sorted by
/// stride, each stride at least the span of the ones below it); it holds for every layout numpy
/// and torch produce by slicing, transposing and reshaping, and fails for broadcasts.
bool IsNonOverlapping(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides);

/// The lowest and highest element offset, relative to element [0, ..., 0], of a non-empty
/// tensor (both 0 for an empty one).
std::pair<std::int64_t, std::int64_t> StridedExtent(std::span<const std::int64_t> shape,
                                                    std::span<const std::int64_t> strides);

/// Copies every element of `shape` (`item` bytes each) from `src` laid out by `src_strides` to
/// `dst` laid out by `dst_strides`; both point at element [0, ..., 0]. Runs of contiguous
/// elements move by memcpy. Preconditions: the ranks match, the destination does not overlap
/// itself or the source.
void StridedCopy(std::byte* dst, std::span<const std::int64_t> dst_strides, const std::byte* src,
                 std::span<const std::int64_t> src_strides, std::span<const std::int64_t> shape,
                 std::size_t item);

}  // namespace mooncake::sparse
