// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// What the CUDA translation units of this directory share: CUDA errors as Status, stream
// handles, the current device, workspaces carved out of one device allocation. Internal:
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

template <typename P>
P* At(const DeviceBuffer& b, std::uint64_t offset) {
    return reinterpret_cast<P*>(b.ptr().address + offset);
}

}  // namespace mooncake::sparse::cuda
