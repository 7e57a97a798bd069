// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace mooncake::sparse::cuda {
namespace {

// The runtime's C ABI: cudaError_t is an int enum, handles are pointers.
struct IpcHandleAbi {
    char reserved[kCudaIpcHandleSize];
};
using GetDeviceCountFn = int (*)(int*);
using GetDeviceFn = int (*)(int*);
using CuPointerGetAttributeFn = int (*)(void*, int, unsigned long long);
using SetDeviceFn = int (*)(int);
using PointerGetAttributesFn = int (*)(void*, const void*);
using MemcpyAsyncFn = int (*)(void*, const void*, std::size_t, int, void*);
using Memcpy2DAsyncFn = int (*)(void*, std::size_t, const void*, std::size_t, std::size_t,
                                std::size_t, int, void*);
using StreamSynchronizeFn = int (*)(void*);
using IpcGetMemHandleFn = int (*)(IpcHandleAbi*, void*);
using IpcOpenMemHandleFn = int (*)(void**, IpcHandleAbi, unsigned int);
using IpcCloseMemHandleFn = int (*)(void*);
using HostAllocFn = int (*)(void**, std::size_t, unsigned int);
using FreeHostFn = int (*)(void*);
using HostRegisterFn = int (*)(void*, std::size_t, unsigned int);
using HostUnregisterFn = int (*)(void*);
using GetErrorStringFn = const char* (*)(int);
using GetLastErrorFn = int (*)();
using VersionFn = int (*)(int*);
using DeviceGetPciBusIdFn = int (*)(char*, int, int);
using DeviceGetByPciBusIdFn = int (*)(int*, const char*);
using MallocFn = int (*)(void**, std::size_t);
using FreeFn = int (*)(void*);
// Driver API.
using CuMemGetAddressRangeFn = int (*)(unsigned long long*, std::size_t*, unsigned long long);

constexpr unsigned int kHostAllocPortable = 0x01;
constexpr unsigned int kHostRegisterPortable = 0x01;
constexpr unsigned int kIpcMemLazyEnablePeerAccess = 0x01;
constexpr int kErrorCudartUnloading = 4;

struct Runtime {
    Support support;
    GetDeviceFn get_device = nullptr;
    SetDeviceFn set_device = nullptr;
    PointerGetAttributesFn pointer_attributes = nullptr;
    MemcpyAsyncFn memcpy_async = nullptr;
    Memcpy2DAsyncFn memcpy_2d_async = nullptr;
    StreamSynchronizeFn stream_synchronize = nullptr;
    IpcGetMemHandleFn ipc_get = nullptr;
    IpcOpenMemHandleFn ipc_open = nullptr;
    IpcCloseMemHandleFn ipc_close = nullptr;
    HostAllocFn host_alloc = nullptr;
    FreeHostFn free_host = nullptr;
    HostRegisterFn host_register = nullptr;
    HostUnregisterFn host_unregister = nullptr;
    GetErrorStringFn error_string = nullptr;
    GetLastErrorFn get_last_error = nullptr;
    DeviceGetPciBusIdFn pci_bus_id = nullptr;
    DeviceGetByPciBusIdFn by_pci_bus_id = nullptr;
    MallocFn malloc = nullptr;
    FreeFn free = nullptr;
    CuMemGetAddressRangeFn mem_get_address_range = nullptr;
    CuPointerGetAttributeFn pointer_get_attribute = nullptr;

    /// The runtime's text for `code`; clears the thread's last error so that it is not reported
    /// again by whoever checks next (e.g. torch after its next kernel launch).
    std::string Error(int code) const {
        if (get_last_error) (void)get_last_error();
        const char* s = error_string ? error_string(code) : nullptr;
        return (s ? std::string(s) : std::string("cudaError")) + " (" + std::to_string(code) + ")";
    }
};

template <typename Fn>
bool Load(void* lib, const char* name, Fn& out) {
    out = reinterpret_cast<Fn>(::dlsym(lib, name));
    return out != nullptr;
}

void* OpenLibrary(std::initializer_list<const char*> names, std::string& loaded) {
    // A copy already in the process first (torch's), then the usual search path.
    for (const int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
        for (const char* name : names) {
            if (void* lib = ::dlopen(name, flags)) {  // Never closed: lives as long as the process.
                loaded = name;
                return lib;
            }
        }
    }
    return nullptr;
}

Runtime LoadRuntime() {
    Runtime rt;
    std::string loaded;
    void* lib = nullptr;
    if (const char* env = std::getenv("MOONCAKE_SPARSE_CUDART"); env != nullptr && *env) {
        lib = ::dlopen(env, RTLD_NOW | RTLD_LOCAL);
        loaded = env;
        if (lib == nullptr) {
            rt.support.detail = std::string("MOONCAKE_SPARSE_CUDART=") + env + ": " + ::dlerror();
            return rt;
        }
    } else {
        lib = OpenLibrary({"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                           "libcudart.so"},
                          loaded);
    }
    if (lib == nullptr) {
        rt.support.detail = "libcudart not found";
        return rt;
    }
    GetDeviceCountFn count = nullptr;
    VersionFn runtime_version = nullptr;
    VersionFn driver_version = nullptr;
    const bool core = Load(lib, "cudaGetDeviceCount", count) &&
                      Load(lib, "cudaGetDevice", rt.get_device) &&
                      Load(lib, "cudaSetDevice", rt.set_device) &&
                      Load(lib, "cudaPointerGetAttributes", rt.pointer_attributes) &&
                      Load(lib, "cudaMemcpyAsync", rt.memcpy_async) &&
                      Load(lib, "cudaMemcpy2DAsync", rt.memcpy_2d_async) &&
                      Load(lib, "cudaStreamSynchronize", rt.stream_synchronize) &&
                      Load(lib, "cudaHostAlloc", rt.host_alloc) &&
                      Load(lib, "cudaFreeHost", rt.free_host) &&
                      Load(lib, "cudaHostRegister", rt.host_register) &&
                      Load(lib, "cudaHostUnregister", rt.host_unregister) &&
                      Load(lib, "cudaGetErrorString", rt.error_string) &&
                      Load(lib, "cudaGetLastError", rt.get_last_error);
    if (!core) {
        rt.support.detail = loaded + " lacks runtime entry points";
        return rt;
    }
    const bool ipc = Load(lib, "cudaIpcGetMemHandle", rt.ipc_get) &&
                     Load(lib, "cudaIpcOpenMemHandle", rt.ipc_open) &&
                     Load(lib, "cudaIpcCloseMemHandle", rt.ipc_close);
    Load(lib, "cudaDeviceGetPCIBusId", rt.pci_bus_id);
    Load(lib, "cudaDeviceGetByPCIBusId", rt.by_pci_bus_id);
    Load(lib, "cudaMalloc", rt.malloc);
    Load(lib, "cudaFree", rt.free);
    if (Load(lib, "cudaRuntimeGetVersion", runtime_version)) {
        (void)runtime_version(&rt.support.runtime_version);
    }
    if (Load(lib, "cudaDriverGetVersion", driver_version)) {
        (void)driver_version(&rt.support.driver_version);
    }
    rt.support.runtime_loaded = true;
    std::string driver_name;
    if (void* drv = OpenLibrary({"libcuda.so.1", "libcuda.so"}, driver_name)) {
        rt.support.driver_loaded = Load(drv, "cuMemGetAddressRange_v2", rt.mem_get_address_range);
        (void)Load(drv, "cuPointerGetAttribute", rt.pointer_get_attribute);  // optional
    }
    int devices = 0;
    if (const int err = count(&devices); err != 0) {
        rt.support.detail = loaded + ": " + rt.Error(err);
        return rt;
    }
    rt.support.device_count = devices;
    rt.support.available = devices > 0;
    rt.support.ipc_available = rt.support.available && ipc && rt.support.driver_loaded;
    rt.support.detail = loaded + (rt.support.driver_loaded ? " + " + driver_name : "") + ", " +
                        std::to_string(devices) + " device(s)";
    return rt;
}

const Runtime& Rt() {
    static const Runtime runtime = LoadRuntime();
    return runtime;
}

Status Fail(StatusCode code, const std::string& what, int err) {
    return {code, what + ": " + Rt().Error(err)};
}

void* AsStream(CudaStream s) { return reinterpret_cast<void*>(s); }

}  // namespace

const Support& GetSupport() { return Rt().support; }

Status RequireCuda(std::string_view what) {
    const Support& s = GetSupport();
    if (s.available) return Status::Ok();
    return Unimplemented(std::string(what) + ": CUDA is not available here (" + s.detail + ")");
}

Result<PointerInfo> DescribePointer(const void* ptr) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaPointerGetAttributes"));
    // cudaPointerAttributes grew over releases (88 bytes in CUDA 13); type and device lead.
    alignas(16) unsigned char attrs[512] = {};
    if (const int err = Rt().pointer_attributes(attrs, ptr); err != 0) {
        return Fail(StatusCode::kInternal, "cudaPointerGetAttributes", err);
    }
    int type = 0;
    int device = -1;
    std::memcpy(&type, attrs, sizeof(int));
    std::memcpy(&device, attrs + sizeof(int), sizeof(int));
    PointerInfo info;
    info.type = type >= 0 && type <= 3 ? static_cast<MemoryType>(type) : MemoryType::kUnregistered;
    info.device = device;
    return info;
}

Result<AllocationRange> GetAllocationRange(std::uintptr_t address, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cuMemGetAddressRange"));
    if (Rt().mem_get_address_range == nullptr) {
        return Unimplemented("cuMemGetAddressRange: libcuda was not loaded");
    }
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    // A driver call needs a current context on this thread: cudaSetDevice makes the device's
    // primary context current even where the guard had nothing to change.
    MCS_RETURN_IF_ERROR(SetDevice(device));
    unsigned long long base = 0;
    std::size_t size = 0;
    if (const int err = Rt().mem_get_address_range(&base, &size, address); err != 0) {
        return InvalidArgument("cuMemGetAddressRange(" + std::to_string(address) + ") on device " +
                               std::to_string(device) + " failed with CUresult " +
                               std::to_string(err) + " (not device memory of that device?)");
    }
    return AllocationRange{static_cast<std::uintptr_t>(base), static_cast<std::uint64_t>(size)};
}

Result<std::uint64_t> AllocationBufferId(std::uintptr_t address, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cuPointerGetAttribute"));
    if (Rt().pointer_get_attribute == nullptr) {
        return Unimplemented("cuPointerGetAttribute: libcuda was not loaded");
    }
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    MCS_RETURN_IF_ERROR(SetDevice(device));
    constexpr int kBufferIdAttribute = 7;  // CU_POINTER_ATTRIBUTE_BUFFER_ID
    unsigned long long id = 0;
    if (const int err = Rt().pointer_get_attribute(&id, kBufferIdAttribute, address); err != 0) {
        return InvalidArgument("cuPointerGetAttribute(BUFFER_ID) failed with CUresult " +
                               std::to_string(err));
    }
    return static_cast<std::uint64_t>(id);
}

Status MemcpyAsync(void* dst, const void* src, std::uint64_t bytes, CopyKind kind,
                   CudaStream stream, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaMemcpyAsync"));
    if (bytes == 0) return Status::Ok();
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    if (const int err = Rt().memcpy_async(dst, src, bytes, static_cast<int>(kind), AsStream(stream));
        err != 0) {
        return Fail(StatusCode::kInternal,
                    "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes on device " +
                        std::to_string(device),
                    err);
    }
    return Status::Ok();
}

Status Memcpy2DAsync(void* dst, std::uint64_t dst_pitch, const void* src, std::uint64_t src_pitch,
                     std::uint64_t width, std::uint64_t height, CopyKind kind, CudaStream stream,
                     int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaMemcpy2DAsync"));
    if (width == 0 || height == 0) return Status::Ok();
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    if (const int err = Rt().memcpy_2d_async(dst, dst_pitch, src, src_pitch, width, height,
                                             static_cast<int>(kind), AsStream(stream));
        err != 0) {
        return Fail(StatusCode::kInternal,
                    "cudaMemcpy2DAsync of " + std::to_string(height) + " rows of " +
                        std::to_string(width) + " bytes (pitches " + std::to_string(dst_pitch) +
                        ", " + std::to_string(src_pitch) + ") on device " + std::to_string(device),
                    err);
    }
    return Status::Ok();
}

Status StreamSynchronize(CudaStream stream, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaStreamSynchronize"));
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    if (const int err = Rt().stream_synchronize(AsStream(stream)); err != 0) {
        return Fail(StatusCode::kInternal, "cudaStreamSynchronize on device " + std::to_string(device),
                    err);
    }
    return Status::Ok();
}

Result<CudaIpcHandle> IpcGetMemHandle(std::uintptr_t base, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaIpcGetMemHandle"));
    if (!GetSupport().ipc_available) return Unimplemented("CUDA IPC is not available here");
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    IpcHandleAbi h{};
    if (const int err = Rt().ipc_get(&h, reinterpret_cast<void*>(base)); err != 0) {
        return Fail(StatusCode::kInvalidArgument,
                    "cudaIpcGetMemHandle (is the tensor in memory that CUDA IPC can export? "
                    "cuMemCreate/expandable-segment allocations cannot be)",
                    err);
    }
    CudaIpcHandle out;
    std::memcpy(out.data(), h.reserved, kCudaIpcHandleSize);
    return out;
}

Result<std::uintptr_t> IpcOpenMemHandle(const CudaIpcHandle& handle, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaIpcOpenMemHandle"));
    if (!GetSupport().ipc_available) return Unimplemented("CUDA IPC is not available here");
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    IpcHandleAbi h{};
    std::memcpy(h.reserved, handle.data(), kCudaIpcHandleSize);
    void* ptr = nullptr;
    if (const int err = Rt().ipc_open(&ptr, h, kIpcMemLazyEnablePeerAccess); err != 0) {
        return Fail(StatusCode::kInvalidArgument,
                    "cudaIpcOpenMemHandle on device " + std::to_string(device), err);
    }
    return reinterpret_cast<std::uintptr_t>(ptr);
}

Status IpcCloseMemHandle(std::uintptr_t base, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaIpcCloseMemHandle"));
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    if (const int err = Rt().ipc_close(reinterpret_cast<void*>(base)); err != 0) {
        return Fail(StatusCode::kInternal, "cudaIpcCloseMemHandle", err);
    }
    return Status::Ok();
}

Result<void*> HostAlloc(std::uint64_t bytes) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaHostAlloc"));
    void* ptr = nullptr;
    if (const int err = Rt().host_alloc(&ptr, bytes, kHostAllocPortable); err != 0) {
        return Fail(StatusCode::kResourceExhausted,
                    "cudaHostAlloc(" + std::to_string(bytes) + " bytes)", err);
    }
    return ptr;
}

Status FreeHost(void* ptr) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaFreeHost"));
    if (const int err = Rt().free_host(ptr); err != 0) {
        // At process exit the runtime may be unloading: the memory goes with the process.
        if (err == kErrorCudartUnloading) return Status::Ok();
        return Fail(StatusCode::kInternal, "cudaFreeHost", err);
    }
    return Status::Ok();
}

Result<std::uintptr_t> DeviceAlloc(std::uint64_t bytes, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaMalloc"));
    if (Rt().malloc == nullptr || Rt().free == nullptr) {
        return Unimplemented("cudaMalloc: not in the loaded CUDA runtime");
    }
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    void* ptr = nullptr;
    if (const int err = Rt().malloc(&ptr, bytes); err != 0) {
        return Fail(StatusCode::kResourceExhausted,
                    "cudaMalloc(" + std::to_string(bytes) + " bytes) on device " +
                        std::to_string(device),
                    err);
    }
    return reinterpret_cast<std::uintptr_t>(ptr);
}

Status DeviceFree(std::uintptr_t address, int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaFree"));
    if (Rt().free == nullptr) return Unimplemented("cudaFree: not in the loaded CUDA runtime");
    MCS_ASSIGN_OR_RETURN(DeviceGuard guard, DeviceGuard::Make(device));
    if (const int err = Rt().free(reinterpret_cast<void*>(address)); err != 0) {
        if (err == kErrorCudartUnloading) return Status::Ok();
        return Fail(StatusCode::kInternal, "cudaFree on device " + std::to_string(device), err);
    }
    return Status::Ok();
}

Status HostRegister(void* ptr, std::uint64_t bytes) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaHostRegister"));
    if (const int err = Rt().host_register(ptr, bytes, kHostRegisterPortable); err != 0) {
        return Fail(StatusCode::kUnavailable,
                    "cudaHostRegister(" + std::to_string(bytes) + " bytes)", err);
    }
    return Status::Ok();
}

Status HostUnregister(void* ptr) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaHostUnregister"));
    if (const int err = Rt().host_unregister(ptr); err != 0) {
        if (err == kErrorCudartUnloading) return Status::Ok();
        return Fail(StatusCode::kInternal, "cudaHostUnregister", err);
    }
    return Status::Ok();
}

Result<int> GetDevice() {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaGetDevice"));
    int device = -1;
    if (const int err = Rt().get_device(&device); err != 0) {
        return Fail(StatusCode::kInternal, "cudaGetDevice", err);
    }
    return device;
}

Status SetDevice(int device) {
    MCS_RETURN_IF_ERROR(RequireCuda("cudaSetDevice"));
    if (device < 0 || device >= GetSupport().device_count) {
        return InvalidArgument("CUDA device " + std::to_string(device) + " does not exist here (" +
                               std::to_string(GetSupport().device_count) + " device(s))");
    }
    if (const int err = Rt().set_device(device); err != 0) {
        return Fail(StatusCode::kInternal, "cudaSetDevice(" + std::to_string(device) + ")", err);
    }
    return Status::Ok();
}

// Both directions of the bus-id mapping are fixed for the life of the process and sit on the
// path of every CUDA IPC put/get (exporter and importer), so they are looked up once.
namespace {
std::mutex& PciCacheMutex() {
    static std::mutex mu;
    return mu;
}
std::map<int, std::string>& PciByDevice() {
    static std::map<int, std::string> m;
    return m;
}
std::map<std::string, int>& DeviceByPci() {
    static std::map<std::string, int> m;
    return m;
}
}  // namespace

Result<std::string> DevicePciBusId(int device) {
    {
        std::lock_guard lock(PciCacheMutex());
        if (auto it = PciByDevice().find(device); it != PciByDevice().end()) return it->second;
    }
    MCS_RETURN_IF_ERROR(RequireCuda("cudaDeviceGetPCIBusId"));
    if (Rt().pci_bus_id == nullptr) return Unimplemented("cudaDeviceGetPCIBusId is missing");
    char buf[64] = {};
    if (const int err = Rt().pci_bus_id(buf, sizeof(buf), device); err != 0) {
        return Fail(StatusCode::kInvalidArgument,
                    "cudaDeviceGetPCIBusId(" + std::to_string(device) + ")", err);
    }
    std::lock_guard lock(PciCacheMutex());
    PciByDevice()[device] = buf;
    return std::string(buf);
}

Result<int> DeviceByPciBusId(const std::string& bus_id) {
    {
        std::lock_guard lock(PciCacheMutex());
        if (auto it = DeviceByPci().find(bus_id); it != DeviceByPci().end()) return it->second;
    }
    MCS_RETURN_IF_ERROR(RequireCuda("cudaDeviceGetByPCIBusId"));
    if (Rt().by_pci_bus_id == nullptr) return Unimplemented("cudaDeviceGetByPCIBusId is missing");
    int device = -1;
    if (const int err = Rt().by_pci_bus_id(&device, bus_id.c_str()); err != 0) {
        return Fail(StatusCode::kInvalidArgument,
                    "no CUDA device with PCI bus id '" + bus_id + "' is visible here", err);
    }
    std::lock_guard lock(PciCacheMutex());
    DeviceByPci()[bus_id] = device;
    return device;
}

Result<DeviceGuard> DeviceGuard::Make(int device) {
    MCS_ASSIGN_OR_RETURN(const int current, GetDevice());
    DeviceGuard guard;
    if (current != device) {
        MCS_RETURN_IF_ERROR(SetDevice(device));
        guard.previous_ = current;
    }
    return guard;
}

DeviceGuard::~DeviceGuard() {
    if (previous_ >= 0) {
        if (const int err = Rt().set_device(previous_); err != 0) {
            std::fprintf(stderr, "mooncake_sparse: restoring CUDA device %d failed: %s\n",
                         previous_, Rt().Error(err).c_str());
        }
    }
}

DeviceGuard::DeviceGuard(DeviceGuard&& other) noexcept
    : previous_(std::exchange(other.previous_, -1)) {}

DeviceGuard& DeviceGuard::operator=(DeviceGuard&& other) noexcept {
    if (this != &other) {
        if (previous_ >= 0) (void)Rt().set_device(previous_);
        previous_ = std::exchange(other.previous_, -1);
    }
    return *this;
}

}  // namespace mooncake::sparse::cuda
