// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// HostCopyPool: the kept threads of a copy pipeline copy every byte of every Run, once, and a
// Run returns only when all of them are done; concurrent callers take turns.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "transport/host_copy.h"

namespace mooncake::sparse {
namespace {

std::vector<std::byte> Random(std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::byte> v(n);
    for (auto& b : v) b = std::byte(rng() & 0xff);
    return v;
}

TEST(HostCopyPoolTest, ManyRunsOfPiecesAcrossItemsCopyEveryByte) {
    HostCopyPool pool(4);
    const std::size_t n = std::size_t{40} << 20;
    const std::vector<std::byte> src = Random(n, 1);
    for (int run = 0; run < 20; ++run) {
        std::vector<std::byte> dst(n, std::byte{0});
        // Items of odd sizes, some under a piece, one over several pieces.
        std::vector<HostCopy> copies;
        std::mt19937 rng(run);
        for (std::size_t off = 0; off < n;) {
            const std::size_t len = std::min<std::size_t>(n - off, 1 + rng() % (9 << 20));
            copies.push_back({dst.data() + off, src.data() + off, len});
            off += len;
        }
        pool.Run(copies);
        ASSERT_EQ(dst, src) << "run " << run;
    }
}

TEST(HostCopyPoolTest, SmallAndEmptyBatchesStayOnTheCaller) {
    HostCopyPool pool(8);
    pool.Run({});
    const std::vector<std::byte> src = Random(4096, 2);
    std::vector<std::byte> dst(4096);
    const HostCopy c{dst.data(), src.data(), src.size()};
    pool.Run({&c, 1});
    EXPECT_EQ(dst, src);
}

TEST(HostCopyPoolTest, ConcurrentCallersTakeTurns) {
    HostCopyPool pool(3);
    const std::size_t n = std::size_t{20} << 20;
    const std::vector<std::byte> src = Random(n, 3);
    std::vector<std::vector<std::byte>> dsts(4, std::vector<std::byte>(n));
    std::vector<std::thread> callers;
    for (auto& dst : dsts) {
        callers.emplace_back([&pool, &src, &dst] {
            for (int i = 0; i < 5; ++i) {
                const HostCopy c{dst.data(), src.data(), src.size()};
                pool.Run({&c, 1});
            }
        });
    }
    for (auto& t : callers) t.join();
    for (const auto& dst : dsts) EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace mooncake::sparse
