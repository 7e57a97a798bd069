// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Page-locking (pinning) host memory for the CUDA copy engine without linking CUDA: libcudart is
// dlopen'ed on first use, so the library loads and works on machines without a GPU (docs/design.md §5:
// segments registered as pinned under a byte quota; over quota they stay pageable, never pinned
// per operation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// What this process can do with CUDA host registration.
struct PinningSupport {
    bool available = false;  ///< libcudart loaded and at least one device present.
    int device_count = 0;
    std::string detail;  ///< Why not, or which library was loaded.
};

/// Loads libcudart once (thread-safe) and reports whether pinning can work here.
const PinningSupport& GetPinningSupport();

/// A host range registered with cudaHostRegister; unregistered by the destructor. Move-only.
class PinnedRegion {
public:
    /// Registers `[data, data + size)`. Both should be page-aligned.
    /// Errors: Unimplemented (no libcudart or no device); Unavailable (cudaHostRegister failed).
    static Result<PinnedRegion> Register(void* data, std::uint64_t size);

    /// A range registered by other means; `unregister` runs once, on destruction (tests stand
    /// in for cudaHostRegister with it).
    static PinnedRegion Adopt(void* data, std::uint64_t size,
                              std::function<void(void*)> unregister);

    PinnedRegion() = default;
    ~PinnedRegion();
    PinnedRegion(PinnedRegion&& other) noexcept;
    PinnedRegion& operator=(PinnedRegion&& other) noexcept;
    PinnedRegion(const PinnedRegion&) = delete;
    PinnedRegion& operator=(const PinnedRegion&) = delete;

    std::uint64_t size() const { return size_; }

private:
    void Reset();

    void* data_ = nullptr;
    std::uint64_t size_ = 0;
    std::function<void(void*)> unregister_;  ///< Empty: cudaHostUnregister.
};

}  // namespace mooncake::sparse
