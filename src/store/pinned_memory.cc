// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "store/pinned_memory.h"

#include <cstdio>
#include <utility>

#include "transport/cuda_runtime.h"  // the one loader of the CUDA runtime

namespace mooncake::sparse {

const PinningSupport& GetPinningSupport() {
    static const PinningSupport support = [] {
        const cuda::Support& cuda = cuda::GetSupport();
        PinningSupport s;
        s.available = cuda.available;
        s.device_count = cuda.device_count;
        s.detail = cuda.detail;
        return s;
    }();
    return support;
}

Result<PinnedRegion> PinnedRegion::Register(void* data, std::uint64_t size) {
    if (!GetPinningSupport().available) {
        return Unimplemented("cannot pin host memory: " + GetPinningSupport().detail);
    }
    MCS_RETURN_IF_ERROR(cuda::HostRegister(data, size));
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
        if (Status s = cuda::HostUnregister(data_); !s.ok()) {
            std::fprintf(stderr, "mooncake_sparse: %s\n", s.ToString().c_str());
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
