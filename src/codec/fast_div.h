// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Division of 32-bit unsigned integers by a divisor fixed ahead of time, as a multiply-high, a
// subtract, an add and two shifts (Granlund and Montgomery, "Division by invariant integers
// using multiplication", 1994, figure 4.1): the GPU's integer division is a sequence of
// instructions of its own, and the commit's index kernels divide every entry's coordinates by
// its tile shape. Exact for every dividend and every divisor from 1 to 2^32 - 1. Header-only,
// standard library only: `__host__ __device__` under nvcc, plain inline functions under a host
// compiler (a CPU test checks them against the `/` operator).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MCS_FAST_DIV_FN __host__ __device__ inline
#else
#define MCS_FAST_DIV_FN inline
#endif

namespace mooncake::sparse {

/// A divisor d in [1, 2^32) with what dividing by it takes: n / d ==
/// (t + ((n - t) >> 1)) >> (l - 1) for t = mulhi(n, m), l = ceil(log2 d), when l >= 1 (d = 1:
/// n itself).
struct FastDiv {
    std::uint32_t multiplier = 0;
    std::uint32_t shift = 0;  ///< ceil(log2 d): 0 only for d = 1.

    /// The divisor d (1 <= d < 2^32).
    static constexpr FastDiv Of(std::uint32_t d) {
        std::uint32_t l = 0;
        while (l < 32 && (std::uint64_t{1} << l) < d) ++l;
        FastDiv f;
        f.shift = l;
        // floor(2^32 (2^l - d) / d) + 1 < 2^32, since 2^l - d < d.
        f.multiplier = static_cast<std::uint32_t>(
            ((std::uint64_t{1} << 32) * ((std::uint64_t{1} << l) - d)) / d + 1);
        return f;
    }
};

/// n / d for the divisor `f` describes.
MCS_FAST_DIV_FN std::uint32_t Divide(std::uint32_t n, FastDiv f) {
    if (f.shift == 0) return n;
#if defined(__CUDA_ARCH__)
    const std::uint32_t t = __umulhi(n, f.multiplier);
#else
    const auto t = static_cast<std::uint32_t>((std::uint64_t{n} * f.multiplier) >> 32);
#endif
    return (t + ((n - t) >> 1)) >> (f.shift - 1);
}

}  // namespace mooncake::sparse
