// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The synthetic data of the Kimi-K2-shaped benchmarks: their random generator (plan_bench too)
// and the update of one source (node_scale_bench, planned_read_bench), every element changed
// with a given probability, drawn as sorted COO (uint16 coordinates, bf16 values) in the
// codec's default tile order.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"

namespace mooncake::sparse::synthetic {


inline std::uint64_t SplitMix64(std::uint64_t& state) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/// xoshiro256**: a fast UniformRandomBitGenerator; one per source, seeded from (seed, stream),
/// so a multi-threaded build draws exactly what a single-threaded one does.
class Rng {
  public:
    using result_type = std::uint64_t;
    Rng(std::uint64_t seed, std::uint64_t stream) {
        std::uint64_t st = seed ^ (stream * 0xd1b54a32d192ed03ull);
        for (auto& s : s_) s = SplitMix64(st);
    }
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return ~result_type{0}; }
    result_type operator()() {
        const std::uint64_t r = Rotl(s_[1] * 5, 7) * 9;
        const std::uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = Rotl(s_[3], 45);
        return r;
    }

  private:
    static std::uint64_t Rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    std::array<std::uint64_t, 4> s_{};
};

/// A 2-D source update: uint16 [nnz, 2] coordinates and bf16 [nnz] values, sorted by (tile,
/// element) for the codec's default tile shape.
struct Coo {
    std::vector<std::uint16_t> indices;
    std::vector<std::uint16_t> values;
    std::uint64_t nnz() const { return values.size(); }
};

/// Every element of `shape` changes with probability `density`: a Bernoulli process walked
/// tile by tile (row-major over tiles, then row-major inside a tile), with geometric gaps
/// between changed elements.
inline Coo Synthesize(const Shape& shape, double density, std::uint64_t seed, std::uint64_t stream) {
    const Shape tile = DefaultTileShape(shape);
    Rng rng(seed, stream);
    Coo out;
    const double expected = double(NumElements(shape)) * density;
    out.values.reserve(static_cast<std::size_t>(expected + 6 * std::sqrt(expected) + 16));
    out.indices.reserve(out.values.capacity() * 2);
    // Gap to the next changed element: 1 + floor(log(u) / log(1 - p)), u in (0, 1].
    const double inv_log_q = density < 1.0 ? 1.0 / std::log1p(-density) : 0.0;
    auto gap = [&]() -> std::uint64_t {
        if (density >= 1.0) return 1;
        const double u = double((rng() >> 11) + 1) * 0x1.0p-53;
        const double g = std::floor(std::log(u) * inv_log_q);
        return g >= 1e18 ? std::uint64_t{1} << 62 : 1 + static_cast<std::uint64_t>(g);
    };
    for (Index r0 = 0; r0 < shape[0]; r0 += tile[0]) {
        const Index rows = std::min(tile[0], shape[0] - r0);
        for (Index c0 = 0; c0 < shape[1]; c0 += tile[1]) {
            const Index cols = std::min(tile[1], shape[1] - c0);
            const auto n = static_cast<std::uint64_t>(rows * cols);
            for (std::uint64_t pos = gap() - 1; pos < n; pos += gap()) {
                const auto r = static_cast<std::uint16_t>(r0 + Index(pos / std::uint64_t(cols)));
                const auto c = static_cast<std::uint16_t>(c0 + Index(pos % std::uint64_t(cols)));
                out.indices.push_back(r);
                out.indices.push_back(c);
                // A finite bf16 of either sign, exponent 2^-8 .. 2^-1: a plausible weight.
                const std::uint64_t x = rng();
                out.values.push_back(static_cast<std::uint16_t>(((x & 1) << 15) |
                                                                ((0x77 + (x >> 1) % 8) << 7) |
                                                                ((x >> 8) & 0x7f)));
            }
        }
    }
    return out;
}


}  // namespace mooncake::sparse::synthetic
