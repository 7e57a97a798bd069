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
