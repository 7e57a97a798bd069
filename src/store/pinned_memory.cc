// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "store/pinned_memory.h"

#include <dlfcn.h>

#include <cstdio>
#include <utility>

namespace mooncake::sparse {
namespace {

// The few runtime entry points used, with the CUDA runtime's C ABI (cudaError_t is an int enum).
using CudaGetDeviceCountFn = int (*)(int*);
using CudaHostRegisterFn = int (*)(void*, std::size_t, unsigned int);
using CudaHostUnregisterFn = int (*)(void*);
using CudaGetErrorStringFn = const char* (*)(int);

constexpr unsigned int kCudaHostRegisterPortable = 0x01;  // usable from every CUDA context

struct CudaRuntime {
    PinningSupport support;
    CudaHostRegisterFn host_register = nullptr;
    CudaHostUnregisterFn host_unregister = nullptr;
    CudaGetErrorStringFn error_string = nullptr;

    std::string ErrorText(int code) const {
        const char* s = error_string ? error_string(code) : nullptr;
        return s ? std::string(s) : "cudaError " + std::to_string(code);
    }
};

const CudaRuntime& Runtime() {
    static const CudaRuntime runtime = [] {
        CudaRuntime rt;
        void* lib = nullptr;
        const char* loaded = nullptr;
        for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                 "libcudart.so.11.0"}) {
            // Never closed: the runtime stays loaded for the life of the process.
            lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
            if (lib != nullptr) {
                loaded = name;
                break;
            }
        }
        if (lib == nullptr) {
            rt.support.detail = "libcudart not found";
            return rt;
        }
        auto count = reinterpret_cast<CudaGetDeviceCountFn>(::dlsym(lib, "cudaGetDeviceCount"));
        rt.host_register = reinterpret_cast<CudaHostRegisterFn>(::dlsym(lib, "cudaHostRegister"));
        rt.host_unregister =
            reinterpret_cast<CudaHostUnregisterFn>(::dlsym(lib, "cudaHostUnregister"));
        rt.error_string = reinterpret_cast<CudaGetErrorStringFn>(::dlsym(lib, "cudaGetErrorString"));
        if (!count || !rt.host_register || !rt.host_unregister) {
            rt.support.detail = std::string(loaded) + " lacks the host-registration entry points";
            return rt;
        }
        int devices = 0;
        if (const int err = count(&devices); err != 0) {
            rt.support.detail = std::string(loaded) + ": " + rt.ErrorText(err);
            return rt;
        }
        rt.support.device_count = devices;
        rt.support.available = devices > 0;
        rt.support.detail = std::string(loaded) + ", " + std::to_string(devices) + " device(s)";
        return rt;
    }();
    return runtime;
}

}  // namespace

const PinningSupport& GetPinningSupport() { return Runtime().support; }

Result<PinnedRegion> PinnedRegion::Register(void* data, std::uint64_t size) {
    const CudaRuntime& rt = Runtime();
    if (!rt.support.available) {
        return Unimplemented("cannot pin host memory: " + rt.support.detail);
    }
    if (const int err = rt.host_register(data, size, kCudaHostRegisterPortable); err != 0) {
        return Unavailable("cudaHostRegister(" + std::to_string(size) +
                           " bytes): " + rt.ErrorText(err));
    }
    PinnedRegion region;
    region.data_ = data;
    region.size_ = size;
    return region;
}

PinnedRegion PinnedRegion::Adopt(void* data, std::uint64_t size,
                                 std::function<void(void*)> unregister) {
    PinnedRegion region;
    region.data_ = data;
    region.size_ = size;
    region.unregister_ = std::move(unregister);
    return region;
}

PinnedRegion::~PinnedRegion() { Reset(); }

void PinnedRegion::Reset() {
    if (data_ != nullptr && unregister_) {
        std::exchange(unregister_, nullptr)(std::exchange(data_, nullptr));
        size_ = 0;
    } else if (data_ != nullptr) {
        const CudaRuntime& rt = Runtime();
        if (const int err = rt.host_unregister(data_); err != 0) {
            std::fprintf(stderr, "mooncake_sparse: cudaHostUnregister failed: %s\n",
                         rt.ErrorText(err).c_str());
        }
        data_ = nullptr;
        size_ = 0;
    }
}

PinnedRegion::PinnedRegion(PinnedRegion&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      unregister_(std::exchange(other.unregister_, nullptr)) {}

PinnedRegion& PinnedRegion::operator=(PinnedRegion&& other) noexcept {
    if (this != &other) {
        Reset();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        unregister_ = std::exchange(other.unregister_, nullptr);
    }
    return *this;
}

}  // namespace mooncake::sparse
