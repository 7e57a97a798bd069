// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The host block cache: a freed large block serves the next allocation of its size class, the
// free bytes stay within the limit (the oldest blocks go first), small blocks are never kept,
// and concurrent allocations never share a block.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "codec/codec.h"
#include "transport/host_blocks.h"

namespace mooncake::sparse {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

/// Each test starts from an empty cache with a known limit and leaves the default behind.
class HostBlocksTest : public ::testing::Test {
protected:
    void SetUp() override {
        saved_ = GetHostBlockCacheStats().limit_bytes;
        SetHostBlockCacheLimit(64 * kMiB);
        TrimHostBlockCache();
    }
    void TearDown() override {
        TrimHostBlockCache();
        SetHostBlockCacheLimit(saved_);
    }
    std::uint64_t saved_ = 0;
};

TEST_F(HostBlocksTest, SizeClassesAreAtMostAnEighthOverTheRequest) {
    EXPECT_EQ(HostBlockCapacity(100), 100u);  // below the cached sizes: as asked
    EXPECT_EQ(HostBlockCapacity(kMinCachedBlockBytes), kMinCachedBlockBytes);
    for (std::size_t n : {kMiB + 1, 3 * kMiB + 12345, 100 * kMiB - 7, (std::size_t{5} << 30) + 1}) {
        const std::size_t c = HostBlockCapacity(n);
        EXPECT_GE(c, n);
        EXPECT_LE(c, n + n / 8) << n;
        EXPECT_EQ(HostBlockCapacity(c), c) << "a capacity is its own class";
    }
    // Slightly different sizes of one tensor's objects share a class.
    EXPECT_EQ(HostBlockCapacity(5 * kMiB + 100), HostBlockCapacity(5 * kMiB + 9000));
}

TEST_F(HostBlocksTest, AFreedBlockServesTheNextAllocationOfItsClass) {
    const std::size_t n = 3 * kMiB + 1000;
    void* a = AllocateHostBlock(n);
    ASSERT_NE(a, nullptr);
    std::memset(a, 0x5a, n);
    FreeHostBlock(a, n);
    HostBlockCacheStats s = GetHostBlockCacheStats();
    EXPECT_EQ(s.free_blocks, 1u);
    EXPECT_EQ(s.free_bytes, HostBlockCapacity(n));
    const std::uint64_t reuses = s.reuses;
    void* b = AllocateHostBlock(n + 2000);  // same class
    EXPECT_EQ(b, a);
    s = GetHostBlockCacheStats();
    EXPECT_EQ(s.reuses, reuses + 1);
    EXPECT_EQ(s.free_bytes, 0u);
    // Another class is not served from it.
    void* c = AllocateHostBlock(9 * kMiB);
    EXPECT_NE(c, a);
    FreeHostBlock(b, n + 2000);
    FreeHostBlock(c, 9 * kMiB);
}

TEST_F(HostBlocksTest, SmallBlocksAreNeverKept) {
    void* p = AllocateHostBlock(kMinCachedBlockBytes - 1);
    ASSERT_NE(p, nullptr);
    FreeHostBlock(p, kMinCachedBlockBytes - 1);
    EXPECT_EQ(GetHostBlockCacheStats().free_blocks, 0u);
    EXPECT_EQ(AllocateHostBlock(0), nullptr);
    FreeHostBlock(nullptr, 0);
}

TEST_F(HostBlocksTest, TheLimitBoundsTheFreeBytesAndTheOldestGoFirst) {
    SetHostBlockCacheLimit(8 * kMiB);
    std::vector<void*> blocks;
    for (int i = 0; i < 4; ++i) blocks.push_back(AllocateHostBlock(3 * kMiB));
    for (void* p : blocks) FreeHostBlock(p, 3 * kMiB);
    HostBlockCacheStats s = GetHostBlockCacheStats();
    EXPECT_EQ(s.free_blocks, 2u);
    EXPECT_EQ(s.free_bytes, 6 * kMiB);
    // The two kept are the last two freed; the newest is handed out first.
    EXPECT_EQ(AllocateHostBlock(3 * kMiB), blocks[3]);
    EXPECT_EQ(AllocateHostBlock(3 * kMiB), blocks[2]);
    FreeHostBlock(blocks[3], 3 * kMiB);
    FreeHostBlock(blocks[2], 3 * kMiB);
    // A block over the limit on its own goes straight back.
    void* big = AllocateHostBlock(16 * kMiB);
    FreeHostBlock(big, 16 * kMiB);
    EXPECT_EQ(GetHostBlockCacheStats().free_bytes, 6 * kMiB);
    // Lowering the limit frees what is over it; 0 disables the cache.
    SetHostBlockCacheLimit(3 * kMiB);
    EXPECT_EQ(GetHostBlockCacheStats().free_bytes, 3 * kMiB);
    SetHostBlockCacheLimit(0);
    EXPECT_EQ(GetHostBlockCacheStats().free_bytes, 0u);
    void* p = AllocateHostBlock(3 * kMiB);
    FreeHostBlock(p, 3 * kMiB);
    EXPECT_EQ(GetHostBlockCacheStats().free_blocks, 0u);
}

TEST_F(HostBlocksTest, ObjectMembersReuseTheLastStepsMemory) {
    // A ByteBuffer (an object member) of a large size takes its memory from the cache.
    const void* first = nullptr;
    {
        ByteBuffer member(4 * kMiB + 77);
        first = member.data();
        member[0] = std::byte{1};
        member.back() = std::byte{2};
    }
    ByteBuffer next(4 * kMiB + 99);
    EXPECT_EQ(next.data(), first);
}

TEST_F(HostBlocksTest, ConcurrentAllocationsNeverShareABlock) {
    constexpr int kThreads = 4, kRounds = 200;
    std::vector<std::thread> threads;
    std::vector<std::vector<void*>> seen(kThreads);
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([t, &seen] {
            for (int r = 0; r < kRounds; ++r) {
                const std::size_t n = (1 + (r + t) % 3) * kMiB;
                auto* p = static_cast<unsigned char*>(AllocateHostBlock(n));
                ASSERT_NE(p, nullptr);
                p[0] = static_cast<unsigned char>(t);
                p[n - 1] = static_cast<unsigned char>(t);
                ASSERT_EQ(p[0], t);  // no other thread writes it while this one holds it
                seen[t].push_back(p);
                FreeHostBlock(p, n);
            }
        });
    }
    for (auto& th : threads) th.join();
    const HostBlockCacheStats s = GetHostBlockCacheStats();
    EXPECT_GT(s.reuses, 0u);
    EXPECT_LE(s.free_bytes, s.limit_bytes);
}

}  // namespace
}  // namespace mooncake::sparse
