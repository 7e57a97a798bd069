// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The CUDA runtime, loaded at run time (docs/design.md §5): libcudart (and libcuda for one driver call)
// are dlopen'ed on first use, so libmooncake_sparse builds without CUDA and imports on machines
// without a GPU; every entry point then answers Unimplemented. Only the functions the tensor fast
// path uses are exposed: copies (flat and 2-D pitched) and stream sync, pointer attributes,
// allocation ranges, CUDA IPC, host registration/allocation and the current device.
//
// Why it is built this way:
// - A runtime already in the process (torch's) is preferred over loading another copy: both
//   would work, since they share the driver's primary context, but one is less to go wrong.
//   MOONCAKE_SPARSE_CUDART names a library to use instead.
// - Streams cross this interface as integers (cudaStream_t values): 0 is the legacy default
//   stream, 2 is cudaStreamPerThread; a caller's stream (torch's current stream) orders our copies
//   after its pending work.
// - A failed runtime call leaves a "last error" in the calling thread, which frameworks check
//   after their own kernel launches: every failure here is cleared (cudaGetLastError) so that it
//   is reported once, by us, as a Status.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// A cudaStream_t value.
using CudaStream = std::uintptr_t;
inline constexpr CudaStream kCudaLegacyStream = 0;
inline constexpr CudaStream kCudaPerThreadStream = 2;

/// A range of device memory. Never a host span: nothing here may dereference it.
struct DeviceMemory {
    std::uintptr_t address = 0;
    std::uint64_t bytes = 0;
    int device = -1;
};

inline constexpr std::size_t kCudaIpcHandleSize = 64;  ///< sizeof(cudaIpcMemHandle_t)
using CudaIpcHandle = std::array<std::byte, kCudaIpcHandleSize>;

namespace cuda {

struct Support {
    bool runtime_loaded = false;
    bool driver_loaded = false;   ///< libcuda (for AllocationRange).
    int device_count = 0;
    bool available = false;       ///< Runtime loaded and at least one device.
    bool ipc_available = false;   ///< available, IPC entry points and the driver present.
    int runtime_version = 0;
    int driver_version = 0;
    std::string detail;           ///< Which libraries were loaded, or why not.
};

/// Loads the runtime once (thread-safe) and says what it offers. Never fails.
const Support& GetSupport();

/// Unimplemented("<what>: CUDA is not available here (<why>)") unless GetSupport().available.
Status RequireCuda(std::string_view what);

enum class MemoryType : std::uint8_t { kUnregistered = 0, kHost = 1, kDevice = 2, kManaged = 3 };

struct PointerInfo {
    MemoryType type = MemoryType::kUnregistered;
    int device = -1;
};

/// cudaPointerGetAttributes. Plain host memory is kUnregistered (not an error).
/// Errors: Unimplemented; Internal.
Result<PointerInfo> DescribePointer(const void* ptr);

struct AllocationRange {
    std::uintptr_t base = 0;
    std::uint64_t size = 0;
};

/// The driver's id of the allocation holding `address`: unique per allocation for the life of
/// the process (a freed and reused address gets a new id).
/// Errors: Unimplemented (no libcuda), InvalidArgument (not device memory).
Result<std::uint64_t> AllocationBufferId(std::uintptr_t address, int device);

/// The cudaMalloc allocation that contains `address` on `device` (cuMemGetAddressRange).
/// Errors: Unimplemented; InvalidArgument (not device memory of that device).
Result<AllocationRange> GetAllocationRange(std::uintptr_t address, int device);

enum class CopyKind : std::uint8_t { kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3 };

/// cudaMemcpyAsync on `stream` with `device` current. `bytes` may be 0.
/// Errors: Unimplemented; Internal (the runtime's message).
Status MemcpyAsync(void* dst, const void* src, std::uint64_t bytes, CopyKind kind,
                   CudaStream stream, int device);

/// cudaMemcpy2DAsync on `stream` with `device` current: `height` rows of `width` bytes, rows
/// `src_pitch` / `dst_pitch` bytes apart (each >= width). Writes a strided view in place.
/// Errors: Unimplemented; Internal.
Status Memcpy2DAsync(void* dst, std::uint64_t dst_pitch, const void* src, std::uint64_t src_pitch,
                     std::uint64_t width, std::uint64_t height, CopyKind kind, CudaStream stream,
                     int device);

/// cudaStreamSynchronize with `device` current.
/// Errors: Unimplemented; Internal.
Status StreamSynchronize(CudaStream stream, int device);

/// cudaIpcGetMemHandle of an allocation base.
/// Errors: Unimplemented; InvalidArgument (not an IPC-exportable allocation, e.g. memory from
/// cuMemCreate / expandable segments).
Result<CudaIpcHandle> IpcGetMemHandle(std::uintptr_t base, int device);

/// cudaIpcOpenMemHandle (cudaIpcMemLazyEnablePeerAccess) on `device`: the base of the mapping.
/// Errors: Unimplemented; InvalidArgument (a handle this process cannot open).
Result<std::uintptr_t> IpcOpenMemHandle(const CudaIpcHandle& handle, int device);

/// cudaIpcCloseMemHandle.
Status IpcCloseMemHandle(std::uintptr_t base, int device);

/// cudaHostAlloc(cudaHostAllocPortable) / cudaFreeHost.
/// Errors: Unimplemented; ResourceExhausted.
Result<void*> HostAlloc(std::uint64_t bytes);
Status FreeHost(void* ptr);

/// cudaMalloc / cudaFree on `device` (made current for the call): memory that legacy CUDA IPC
/// can export. Errors: Unimplemented; ResourceExhausted (DeviceAlloc); Internal.
Result<std::uintptr_t> DeviceAlloc(std::uint64_t bytes, int device);
Status DeviceFree(std::uintptr_t address, int device);

/// cudaHostRegister(cudaHostRegisterPortable) / cudaHostUnregister.
Status HostRegister(void* ptr, std::uint64_t bytes);
Status HostUnregister(void* ptr);

/// cudaGetDevice / cudaSetDevice.
Result<int> GetDevice();
Status SetDevice(int device);

/// cudaDeviceGetPCIBusId ("0000:3b:00.0") and back: device ordinals differ between processes
/// with different CUDA_VISIBLE_DEVICES, bus ids do not.
Result<std::string> DevicePciBusId(int device);
Result<int> DeviceByPciBusId(const std::string& bus_id);

/// Makes `device` current for a scope and restores the previous one (destructor logs failures).
class DeviceGuard {
public:
    /// Errors: as SetDevice.
    static Result<DeviceGuard> Make(int device);
    DeviceGuard() = default;
    ~DeviceGuard();
    DeviceGuard(DeviceGuard&& other) noexcept;
    DeviceGuard& operator=(DeviceGuard&& other) noexcept;
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    int previous_ = -1;
};

}  // namespace cuda
}  // namespace mooncake::sparse
