// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// What the CUDA translation units of this directory share: CUDA errors as Status, stream
// handles, the current device, workspaces carved out of one device allocation, the segment
// search of the batch kernels (which item an element belongs to). Internal:
// included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/gpu_codec.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse::cuda {

/// A CUDA error as a Status naming the call: ResourceExhausted for device memory, Unavailable
/// for no device or driver, Internal otherwise.
inline Status CudaError(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::Ok();
    std::string msg = std::string(what) + ": " + cudaGetErrorString(e);
    if (e == cudaErrorMemoryAllocation) return ResourceExhausted(msg);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return Unavailable(msg);
    return Internal(msg);
}

/// Returns from the enclosing function with CudaError's Status when a CUDA call fails.
#define MCS_CUDA(expr) MCS_RETURN_IF_ERROR(::mooncake::sparse::cuda::CudaError((expr), #expr))

/// A stream handle of the public API (0: the legacy default stream) as a cudaStream_t.
inline cudaStream_t AsStream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

/// Makes `device` current for this thread when it is not.
inline Status UseDevice(int device) {
    int current = 0;
    MCS_CUDA(cudaGetDevice(&current));
    if (current != device) MCS_CUDA(cudaSetDevice(device));
    return Status::Ok();
}

inline std::uint64_t AlignUp(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

/// A workspace carved out of one device allocation, each part 256-byte aligned.
class Carve {
public:
    std::uint64_t Add(std::uint64_t bytes) {
        const std::uint64_t at = size_;
        size_ = AlignUp(size_ + bytes, 256);
        return at;
    }
    std::uint64_t size() const { return size_; }

private:
    std::uint64_t size_ = 0;
};

/// The last position p in sorted[0, n) with sorted[p] <= x (sorted[0] <= x is given).
__device__ __forceinline__ std::uint32_t FindSegment(const std::uint64_t* __restrict__ sorted,
                                                     std::uint32_t n, std::uint64_t x) {
    std::uint32_t lo = 0, hi = n;  // invariant: sorted[lo] <= x, answer in [lo, hi)
    while (hi - lo > 1) {
        const std::uint32_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] <= x) lo = mid; else hi = mid;
    }
    return lo;
}

template <typename P>
P* At(const DeviceBuffer& b, std::uint64_t offset) {
    return reinterpret_cast<P*>(b.ptr().address + offset);
}

}  // namespace mooncake::sparse::cuda
