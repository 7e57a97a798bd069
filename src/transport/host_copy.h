// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Local memcpy of large host buffers across threads (docs/design.md §7: one thread copies ~6 GB/s,
// sixteen ~46 GB/s on an H200 host). Small copies stay on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

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

}  // namespace mooncake::sparse
