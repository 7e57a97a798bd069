// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// codec/fast_div.h (the division by a tile extent of the GPU's commit index) against the `/`
// operator: every small divisor and dividend, powers of two and their neighbours, the largest
// values, and random pairs.

#include "codec/fast_div.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace mooncake::sparse {
namespace {

void ExpectDivides(std::uint32_t n, std::uint32_t d) {
    ASSERT_EQ(Divide(n, FastDiv::Of(d)), n / d) << n << " / " << d;
}

TEST(FastDivTest, EverySmallDivisorAndDividend) {
    for (std::uint32_t d = 1; d <= 1024; ++d) {
        const FastDiv f = FastDiv::Of(d);
        for (std::uint32_t n = 0; n <= 5000; ++n) ASSERT_EQ(Divide(n, f), n / d) << n << " / " << d;
    }
}

TEST(FastDivTest, EdgesOfBothOperands) {
    constexpr std::uint32_t kMax = std::numeric_limits<std::uint32_t>::max();
    std::vector<std::uint32_t> edges = {0, 1, 2, 3, kMax, kMax - 1, kMax / 2, kMax / 2 + 1};
    for (int b = 1; b < 32; ++b) {
        const std::uint32_t p = std::uint32_t{1} << b;
        edges.insert(edges.end(), {p - 1, p, p + 1});
    }
    for (std::uint32_t d : edges) {
        if (d == 0) continue;
        for (std::uint32_t n : edges) ExpectDivides(n, d);
        // Around every multiple that brackets the largest dividends.
        const std::uint32_t q = kMax / d;
        for (std::uint32_t k : {q, q - 1}) {
            const std::uint64_t at = std::uint64_t{k} * d;
            for (std::int64_t delta = -2; delta <= 2; ++delta) {
                const std::int64_t n = static_cast<std::int64_t>(at) + delta;
                if (n >= 0 && n <= kMax) ExpectDivides(static_cast<std::uint32_t>(n), d);
            }
        }
    }
}

TEST(FastDivTest, RandomPairs) {
    std::mt19937 rng(7);
    for (int i = 0; i < 2'000'000; ++i) {
        const std::uint32_t d = std::max<std::uint32_t>(1, rng() >> (rng() % 32));
        ExpectDivides(rng(), d);
    }
}

}  // namespace
}  // namespace mooncake::sparse
