// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// GPU sparse codec: encode (new, old) -> COO sorted by (tile, element) with its tile index,
// entirely on the device, and in-place apply of a local COO to a CUDA weight. This header needs
// no CUDA headers: device memory is a small value type, never a host pointer.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// Owned device memory (cudaMallocAsync on the given stream, freed stream-ordered).
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

/// A global COO produced on the device, sorted by (tile, element), with its tile index.
struct GpuEncoded {
    DType index_dtype = DType::kUInt16;
    DType value_dtype = DType::kBFloat16;
    std::size_t rank = 2;
    std::uint64_t nnz = 0;
    std::uint64_t num_tiles = 0;
    Shape tile_shape;
    DeviceBuffer indices;      ///< [nnz, rank] of index_dtype
    DeviceBuffer values;       ///< [nnz] of value_dtype
    DeviceBuffer tile_coords;  ///< [num_tiles, rank] uint32
    DeviceBuffer tile_ptr;     ///< [num_tiles + 1] uint64
};

struct GpuEncodeOptions {
    ApplyMode apply = ApplyMode::kOverwrite;
    double threshold = 0.0;           ///< scatter_add: keep |new - old| > threshold
    std::optional<Shape> tile_shape;  ///< Default: the CPU codec's DefaultTileShape.
    std::uintptr_t stream = 0;        ///< cudaStream_t; work is ordered after the caller's.
};

/// Encodes a 2-D update on the device (bfloat16, float16 or float32; both C-contiguous). One host sync reads nnz
/// to size the outputs. Overwrite keeps coordinates whose bits differ (values = new);
/// scatter_add keeps new - old (rounded to the dtype) where |new - old| > threshold.
/// Errors: InvalidArgument (shape/dtype mismatch, rank != 2, devices differ); Unavailable.
Result<GpuEncoded> EncodeUpdate(const DeviceArray& new_values, const DeviceArray& old_values,
                                const GpuEncodeOptions& options = {});

/// Applies a local COO (indices uint16/uint32 [nnz, 2] and values [nnz], device arrays) to a
/// 2-D CUDA weight in place, ordered on `stream`. Every coordinate is checked on the device
/// first; one out of range fails the call with the weight unchanged (one host sync). The
/// coordinates must be unique (objects built by this library are), so no atomics are needed.
/// The weight may be a strided view (`weight.strides`, elements, any sign) whose elements do
/// not overlap: element (i, j) is written at ptr + i * strides[0] + j * strides[1], so a TP
/// slice `w[:, a:b]` of a fused parameter is updated where it lies.
/// Errors: InvalidArgument (dtype/rank mismatch, out-of-range coordinate, an overlapping or
/// malformed weight view, strided indices/values); Unavailable.
Status ApplySparse(const DeviceArray& weight, const DeviceArray& indices, const DeviceArray& values,
                   ApplyMode apply, std::uintptr_t stream = 0);

/// Copies host bytes into device memory, ordered on `stream`; the copy has completed when the
/// call returns (the host bytes may be reused at once).
/// Errors: Unavailable (no device / CUDA error).
Status CopyToDevice(std::span<const std::byte> src, DevicePtr dst, std::uintptr_t stream);

/// Copies device bytes into host memory, ordered on `stream`; completed when the call returns.
/// Errors: Unavailable.
Status CopyToHost(DevicePtr src, std::span<std::byte> dst, std::uintptr_t stream);

}  // namespace mooncake::sparse::cuda
