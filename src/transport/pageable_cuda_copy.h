// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// CUDA copies between device memory and pageable host memory (store memory over the pinned
// quota), as one pipeline for a whole batch. The driver stages a pageable copy itself through
// one thread; here the copy engine moves one pinned chunk at the PCIe rate while host threads
// move the other chunk on. A batch is cut into chunks across its items, so a batch of many small
// tensors (a model's norms and biases next to its experts) pipelines as well as one large one.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>

#include "mooncake/sparse/status.h"
#include "transport/cuda_runtime.h"
#include "transport/host_copy.h"

namespace mooncake::sparse {

/// One copy of a batch: `bytes` between pageable `host` and `device_ptr` on `device`, ordered on
/// `stream`.
struct PageableCudaCopy {
    std::byte* host = nullptr;
    std::uintptr_t device_ptr = 0;
    std::uint64_t bytes = 0;
    CudaStream stream = kCudaLegacyStream;
    int device = -1;
};

enum class CopyDirection : std::uint8_t { kDeviceToHost, kHostToDevice };

class PageableCudaCopier {
public:
    static constexpr std::uint64_t kDefaultChunkBytes = std::uint64_t{32} << 20;

    /// `threads` host threads drain or fill the chunks. The two pinned chunks are allocated on
    /// the first batch that needs them, never per batch.
    explicit PageableCudaCopier(unsigned threads, std::uint64_t chunk_bytes = kDefaultChunkBytes);
    ~PageableCudaCopier();
    PageableCudaCopier(const PageableCudaCopier&) = delete;
    PageableCudaCopier& operator=(const PageableCudaCopier&) = delete;

    /// Runs every copy of `copies` and returns when all of them have completed (also on an
    /// error: nothing is left in flight). A batch under two chunks, or one for which the chunks
    /// cannot be allocated, takes the driver's own copies. Batches of concurrent callers take
    /// turns (PCIe is shared anyway). On an error `*failed` (when given) is the index of the copy
    /// it concerns.
    /// Errors: Unimplemented (no CUDA); Internal (the runtime's message).
    Status Run(std::span<const PageableCudaCopy> copies, CopyDirection direction,
               std::size_t* failed = nullptr);

    /// Batches that went through the chunks, and the chunks they moved (for tests and stats).
    std::uint64_t chunked_batches() const { return chunked_batches_.load(); }
    std::uint64_t chunks_moved() const { return chunks_moved_.load(); }

private:
    Status RunDirect(std::span<const PageableCudaCopy> copies, CopyDirection direction,
                     std::size_t* failed);
    bool EnsureChunks();

    const std::uint64_t chunk_bytes_;
    HostCopyPool pool_;
    std::mutex mu_;
    std::array<std::byte*, 2> chunks_{nullptr, nullptr};
    bool alloc_failed_ = false;
    std::atomic<std::uint64_t> chunked_batches_{0};
    std::atomic<std::uint64_t> chunks_moved_{0};
};

}  // namespace mooncake::sparse
