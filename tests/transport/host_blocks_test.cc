// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The host block cache: a freed large block serves the next allocation of its size class, the
// free bytes stay within the limit (the oldest blocks go first), small blocks are never kept,
// and concurrent allocations never share a block. Pooled blocks: carved from chunks that come
// back once their last block is freed, so a repeated step takes no new memory.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <set>
#include <utility>
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

// ---- Pooled blocks --------------------------------------------------------------------------

/// Fills [p, p + n) with a pattern of `seed` and checks it is still there.
void Fill(void* p, std::size_t n, unsigned seed) {
    auto* b = static_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < n; i += 97) b[i] = static_cast<unsigned char>(seed + i);
    b[n - 1] = static_cast<unsigned char>(seed);
}
bool Holds(const void* p, std::size_t n, unsigned seed) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; i += 97) {
        if (i != n - 1 && b[i] != static_cast<unsigned char>(seed + i)) return false;
    }
    return b[n - 1] == static_cast<unsigned char>(seed);
}

TEST_F(HostBlocksTest, PooledBlocksAreDisjointAlignedAndKeepTheirBytes) {
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (unsigned i = 0; i < 600; ++i) {
        const std::size_t n = 1 + (i * 7919) % (48 * 1024);
        void* p = AllocatePooledBlock(n);
        ASSERT_NE(p, nullptr);
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
        Fill(p, n, i);
        blocks.emplace_back(p, n);
    }
    // Every chunk holds a live block or is the one this thread carves from: none is free.
    EXPECT_EQ(GetPooledBlockStats().free_chunks, 0u);
    std::vector<std::pair<void*, std::size_t>> sorted = blocks;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 1; i < sorted.size(); ++i) {
        EXPECT_LE(static_cast<char*>(sorted[i - 1].first) + sorted[i - 1].second,
                  static_cast<char*>(sorted[i].first));
    }
    for (unsigned i = 0; i < blocks.size(); ++i) {
        EXPECT_TRUE(Holds(blocks[i].first, blocks[i].second, i)) << i;
        FreePooledBlock(blocks[i].first, blocks[i].second);
    }
    EXPECT_EQ(AllocatePooledBlock(0), nullptr);
    FreePooledBlock(nullptr, 0);
}

TEST_F(HostBlocksTest, ARepeatedStepTakesNoNewChunks) {
    // A step's target objects: thousands of small buffers, all freed before the next step
    // builds the same again (in another order). After the first step no chunk is new.
    constexpr std::size_t kBlocks = 3000;
    std::uint64_t chunks_after_first = 0;
    for (int step = 0; step < 4; ++step) {
        std::vector<std::pair<void*, std::size_t>> blocks;
        for (std::size_t i = 0; i < kBlocks; ++i) {
            const std::size_t n = 4096 + (i * 131 + static_cast<std::size_t>(step) * 17) % 60000;
            void* p = AllocatePooledBlock(n);
            ASSERT_NE(p, nullptr);
            Fill(p, n, static_cast<unsigned>(i));
            blocks.emplace_back(p, n);
        }
        if (step % 2 == 1) std::reverse(blocks.begin(), blocks.end());
        for (auto [p, n] : blocks) FreePooledBlock(p, n);
        const PooledBlockStats s = GetPooledBlockStats();
        if (step == 0) {
            chunks_after_first = s.chunks;
            EXPECT_GE(s.chunks, 2u);
        } else {
            // At most one more: a step starts carving where the last one stopped.
            EXPECT_LE(s.chunks, chunks_after_first + 1) << "step " << step;
        }
        // Every chunk but the one this thread still carves from is free.
        EXPECT_GE(s.free_chunks + 1, s.chunks);
    }
    EXPECT_GT(GetPooledBlockStats().chunk_reuses, 0u);
    TrimHostBlockCache();
    EXPECT_LE(GetPooledBlockStats().chunks, 1u);  // the open chunk stays
}

TEST_F(HostBlocksTest, LargePooledRequestsAreHostBlocks) {
    const std::uint64_t before = GetHostBlockCacheStats().allocations;
    const std::size_t n = 2 * kMiB + 5;
    void* p = AllocatePooledBlock(n);
    ASSERT_NE(p, nullptr);
    Fill(p, n, 3);
    EXPECT_EQ(GetHostBlockCacheStats().allocations, before + 1);
    FreePooledBlock(p, n);
    EXPECT_EQ(GetHostBlockCacheStats().free_bytes, HostBlockCapacity(n));
}

TEST_F(HostBlocksTest, PooledBlocksFreedOnOtherThreadsGoBackToThePool) {
    // Producers carve blocks, consumers on other threads check and free them.
    constexpr int kThreads = 4, kPerThread = 2000;
    std::vector<std::vector<std::pair<void*, std::size_t>>> made(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([t, &made] {
            for (int i = 0; i < kPerThread; ++i) {
                const std::size_t n = 64 + static_cast<std::size_t>(i * 37 + t * 1000) % 30000;
                void* p = AllocatePooledBlock(n);
                ASSERT_NE(p, nullptr);
                Fill(p, n, static_cast<unsigned>(t * kPerThread + i));
                made[t].emplace_back(p, n);
            }
        });
    }
    for (auto& th : threads) th.join();
    threads.clear();
    std::vector<int> bad(kThreads, 0);
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([t, &made, &bad] {
            const int from = (t + 1) % kThreads;  // another thread's blocks
            for (int i = 0; i < kPerThread; ++i) {
                auto [p, n] = made[from][i];
                if (!Holds(p, n, static_cast<unsigned>(from * kPerThread + i))) ++bad[t];
                FreePooledBlock(p, n);
            }
        });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << t;
    // The producers have exited: their open chunks went back too.
    const PooledBlockStats s = GetPooledBlockStats();
    EXPECT_GE(s.free_chunks + 1, s.chunks);
}

TEST_F(HostBlocksTest, APooledByteBufferKeepsItsMemoryThroughMovesCopiesAndSwaps) {
    const DefaultInitAllocator<std::byte> pooled(HostMemory::kPooled);
    const std::uint64_t before = GetPooledBlockStats().allocations;
    ByteBuffer a(1000, pooled);
    Fill(a.data(), a.size(), 9);
    EXPECT_EQ(GetPooledBlockStats().allocations, before + 1);
    ByteBuffer moved = std::move(a);
    EXPECT_EQ(moved.get_allocator().memory, HostMemory::kPooled);
    ByteBuffer plain(500);
    Fill(plain.data(), plain.size(), 4);
    std::swap(plain, moved);  // each buffer takes its memory's allocator along
    EXPECT_EQ(plain.get_allocator().memory, HostMemory::kPooled);
    EXPECT_EQ(moved.get_allocator().memory, HostMemory::kBlocks);
    EXPECT_TRUE(Holds(plain.data(), plain.size(), 9));
    EXPECT_TRUE(Holds(moved.data(), moved.size(), 4));
    ByteBuffer copy = plain;
    EXPECT_TRUE(Holds(copy.data(), copy.size(), 9));
    moved = plain;  // copy assignment: the target takes the source's memory
    EXPECT_EQ(moved.get_allocator().memory, HostMemory::kPooled);
    plain.resize(200000);  // grows within the pool
    EXPECT_TRUE(Holds(plain.data(), 1000, 9));
    plain.resize(1 << 20);  // beyond a pooled block: a host block
    EXPECT_TRUE(Holds(plain.data(), 1000, 9));
    plain = ByteBuffer(300);
    EXPECT_EQ(plain.get_allocator().memory, HostMemory::kBlocks);
}

}  // namespace
}  // namespace mooncake::sparse
