// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// GPU sparse codec: encode (new, old) -> COO sorted by (tile, element) with its tile index,
// entirely on the device, and in-place apply of a local COO to a CUDA weight. This header needs
// no CUDA headers: device memory is a small value type, never a host pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse::cuda {

/// Device memory: an address on a device, never dereferenced on the host.
struct DevicePtr {
    std::uintptr_t address = 0;
    int device = 0;
};

/// An array in device memory. `ptr` is element [0, ..., 0] and `bytes` counts the elements'
/// bytes (not the memory a strided view spreads over).
struct DeviceArray {
    DType dtype = DType::kUInt8;
    Shape shape;
    DevicePtr ptr;
    std::uint64_t bytes = 0;
    /// Element strides; empty means C-contiguous. Only ApplySparse's weight may be a strided
    /// view (a TP slice of a fused parameter, a transposed view); every other array must be
    /// C-contiguous.
    std::vector<std::int64_t> strides;
};

/// True when the CUDA runtime finds at least one device (false on machines without a GPU or
/// without a driver; never throws or aborts).
bool Available();

/// Owned device memory (cudaMallocAsync on the given stream, freed stream-ordered). The device's
/// default pool keeps up to 4 GiB of freed memory for reuse (its release threshold), so the
/// buffers of one step are reused by the next instead of being mapped again.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& o) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    /// Errors: ResourceExhausted (out of device memory), Unavailable (no device).
    static Result<DeviceBuffer> Allocate(std::uint64_t bytes, int device, std::uintptr_t stream);

    DevicePtr ptr() const { return {address_, device_}; }
    std::uint64_t bytes() const { return bytes_; }

private:
    std::uintptr_t address_ = 0;
    std::uint64_t bytes_ = 0;
    int device_ = 0;
    std::uintptr_t stream_ = 0;
};

/// A global COO produced on the device, sorted by (tile, element), with its tile index. The
/// four members are views into device memory that `keepalive` owns (a batch shares one
/// allocation among all its items).
struct GpuEncoded {
    DType index_dtype = DType::kUInt16;
    DType value_dtype = DType::kBFloat16;
    std::size_t rank = 2;
    std::uint64_t nnz = 0;
    std::uint64_t num_tiles = 0;
    Shape tile_shape;
    DevicePtr indices;      ///< [nnz, rank] of index_dtype
    DevicePtr values;       ///< [nnz] of value_dtype
    DevicePtr tile_coords;  ///< [num_tiles, rank] uint32
    DevicePtr tile_ptr;     ///< [num_tiles + 1] uint64
    std::shared_ptr<const void> keepalive;

    std::uint64_t indices_bytes() const { return nnz * rank * DTypeSize(index_dtype); }
    std::uint64_t values_bytes() const { return nnz * DTypeSize(value_dtype); }
};

struct GpuEncodeOptions {
    ApplyMode apply = ApplyMode::kOverwrite;
    double threshold = 0.0;           ///< scatter_add: keep |new - old| > threshold
    std::optional<Shape> tile_shape;  ///< Default: the CPU codec's DefaultTileShape.
    std::uintptr_t stream = 0;        ///< cudaStream_t; work is ordered after the caller's.
};

/// Encodes a batch of updates (a step's tensors) on the device: pair i is (news[i], olds[i]),
/// rank 1 to 3, bfloat16, float16 or float32, C-contiguous, all on one device. The whole batch
/// takes a fixed number of launches (two passes per (value dtype, index width) group, two scans
/// and three index kernels) and ONE host sync, which reads every item's nnz to size the
/// outputs; all items' members then live in one device allocation. A batch of more than 2^24
/// chunks (tile rows: about 4·10^9 elements of 7168x2048 tensors) runs as a few such
/// sub-batches, one sync and one allocation each. Overwrite keeps coordinates whose bits differ
/// (values = new); scatter_add keeps new - old (rounded to the dtype) where |new - old| >
/// threshold. Results are ordered on options.stream (use them on that stream, or sync it).
/// Errors: InvalidArgument (an item's shape/dtype mismatch, rank, devices differ: "item i: ...",
/// nothing is encoded); ResourceExhausted (device memory); Unavailable.
Result<std::vector<GpuEncoded>> EncodeUpdates(std::span<const DeviceArray> news,
                                              std::span<const DeviceArray> olds,
                                              const GpuEncodeOptions& options = {});

/// EncodeUpdates of one pair.
Result<GpuEncoded> EncodeUpdate(const DeviceArray& new_values, const DeviceArray& old_values,
                                const GpuEncodeOptions& options = {});

/// One object of a batched apply: a local COO (indices uint16/uint32 [nnz, rank], values [nnz],
/// C-contiguous device arrays) and the weight it updates in place.
struct ApplyItem {
    DeviceArray weight;
    DeviceArray indices;
    DeviceArray values;
    ApplyMode apply = ApplyMode::kOverwrite;
};

/// Applies a batch of local COOs to CUDA weights (rank 1 to 3) in place, ordered on `stream`,
/// in a fixed number of launches: one check of every coordinate of every item, one host sync,
/// then one apply launch per (value dtype, index width) group. One out-of-range coordinate
/// anywhere fails the whole call with every weight unchanged. The coordinates of one object
/// must be unique (objects built by this library are), so no atomics are needed. A weight may
/// be a strided view (`weight.strides`, elements, any sign) whose elements do not overlap:
/// element (i, j) is written at ptr + i * strides[0] + j * strides[1] (and so on), so a TP slice
/// `w[:, a:b]` of a fused parameter is updated where it lies. Items whose weights' memory
/// overlaps apply in list order (in successive launches); others apply together.
/// Errors: InvalidArgument ("item i: " dtype/rank mismatch, out-of-range coordinate, an
/// overlapping or malformed weight view, strided indices/values, devices differ); Unavailable.
Status ApplySparseBatch(std::span<const ApplyItem> items, std::uintptr_t stream = 0);

/// ApplySparseBatch of one item.
Status ApplySparse(const DeviceArray& weight, const DeviceArray& indices, const DeviceArray& values,
                   ApplyMode apply, std::uintptr_t stream = 0);

/// One copy between host memory and device memory of a batch (`host.size()` bytes).
struct HostDeviceCopy {
    DevicePtr device;
    std::span<std::byte> host;
};

/// Copies a batch of device ranges into host memory (device -> host), ordered on `stream`;
/// complete when the call returns. Ranges adjacent on both sides are merged into one copy, so a
/// batch's members laid out back to back (EncodeUpdates' results) move in a few large copies.
/// Errors: Unavailable / Internal (CUDA error).
Status CopyBatchToHost(std::span<const HostDeviceCopy> copies, std::uintptr_t stream);

/// CopyBatchToHost whose copies run on the copy engine while alongside() queues other work on
/// `stream` (a kernel: the two share the PCIe link): the copies start after the work queued on
/// `stream` before the call, and everything is complete when the call returns.
/// Errors: those of CopyBatchToHost, or alongside()'s.
Status CopyBatchToHostAlongside(std::span<const HostDeviceCopy> copies, std::uintptr_t stream,
                                const std::function<Status()>& alongside);

/// Copies a batch of host ranges into device memory (host -> device), merged as CopyBatchToHost
/// merges them; complete when the call returns.
Status CopyBatchToDevice(std::span<const HostDeviceCopy> copies, std::uintptr_t stream);

/// CopyBatchToDevice without the wait: the copies are ordered on `stream` and may still run
/// when the call returns (Synchronize(stream) waits); the host ranges must stay unchanged until
/// then. Copies from page-locked memory so overlap with the caller's next host work.
Status EnqueueCopiesToDevice(std::span<const HostDeviceCopy> copies, std::uintptr_t stream);

/// EnqueueCopiesToDevice whose copies run on the copy engine (a side stream that starts after the
/// work queued on `stream` before the call) while alongside() queues other work on `stream`;
/// `stream` then waits for the copies. Nothing is waited for on the host unless an error is
/// returned (then everything queued has run).
/// Errors: those of EnqueueCopiesToDevice, or alongside()'s.
Status EnqueueCopiesToDeviceAlongside(std::span<const HostDeviceCopy> copies, std::uintptr_t stream,
                                      const std::function<Status()>& alongside);

/// Page-locked host memory for staging copies at the copy engine's full speed: one buffer per
/// process, grown on demand and kept (pinning memory is slow; reusing it is free). A lease
/// holds the buffer exclusively until it is destroyed; a second caller waits.
class PinnedStaging {
public:
    class Lease {
    public:
        Lease(Lease&&) noexcept;
        Lease& operator=(Lease&&) noexcept;
        Lease(const Lease&) = delete;
        Lease& operator=(const Lease&) = delete;
        ~Lease();
        std::span<std::byte> bytes() const { return bytes_; }

    private:
        friend class PinnedStaging;
        Lease(void* owner, std::span<std::byte> bytes) : owner_(owner), bytes_(bytes) {}
        void* owner_ = nullptr;
        std::span<std::byte> bytes_;
    };

    /// A lease of at least `bytes` bytes of pinned memory.
    /// Errors: ResourceExhausted (the host cannot pin that much); Unavailable.
    static Result<Lease> Acquire(std::uint64_t bytes);
};

/// Waits for the work queued on `stream`. Errors: Unavailable / Internal (CUDA error).
Status Synchronize(std::uintptr_t stream);

/// Copies host bytes into device memory, ordered on `stream`; the copy has completed when the
/// call returns (the host bytes may be reused at once).
/// Errors: Unavailable (no device / CUDA error).
Status CopyToDevice(std::span<const std::byte> src, DevicePtr dst, std::uintptr_t stream);

/// Copies device bytes into host memory, ordered on `stream`; completed when the call returns.
/// Errors: Unavailable.
Status CopyToHost(DevicePtr src, std::span<std::byte> dst, std::uintptr_t stream);

}  // namespace mooncake::sparse::cuda
