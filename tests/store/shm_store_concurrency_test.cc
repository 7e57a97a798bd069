// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Concurrency of ShmStore: in-place upserts racing readers, leases racing upserts and eviction.
// Every object is one 8-byte tag repeated, so a torn read shows as a non-uniform buffer. Meant
// to run under TSan as well.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "store/shm_store.h"
#include "store_test_util.h"

namespace mooncake::sparse {
namespace {

constexpr std::uint64_t kRows = 512;  // 4 KiB per member

struct Tagged {
    std::vector<std::byte> a, b;
    std::string metadata;
    std::vector<MemberData> members;

    explicit Tagged(std::uint64_t tag) : a(kRows * 8), b(kRows * 8), metadata(std::to_string(tag)) {
        for (std::uint64_t r = 0; r < kRows; ++r) {
            std::memcpy(a.data() + r * 8, &tag, 8);
            std::memcpy(b.data() + r * 8, &tag, 8);
        }
        members = {{"a", DType::kUInt64, {Index(kRows)}, a, tag},
                   {"b", DType::kUInt64, {Index(kRows)}, b, tag}};
    }
};

std::uint64_t UniformTag(std::span<const std::byte> bytes) {
    if (bytes.size() < 8 || bytes.size() % 8 != 0) return 0;
    std::uint64_t tag;
    std::memcpy(&tag, bytes.data(), 8);
    for (std::size_t off = 8; off < bytes.size(); off += 8) {
        if (std::memcmp(bytes.data() + off, &tag, 8) != 0) return 0;
    }
    return tag;
}

std::unique_ptr<ShmStore> MakeStore(std::uint64_t segment_size) {
    ShmStoreOptions options;
    options.segment_size = segment_size;
    options.num_segments = 1;
    options.name = "shm_concurrency_test";
    auto store = ShmStore::Create(options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
}

TEST(ShmStoreConcurrencyTest, InPlaceUpsertsNeverTearReadsOrLeases) {
    auto store = MakeStore(1 << 20);
    ASSERT_NE(store, nullptr);
    {
        Tagged first(1);
        MCS_ASSERT_OK(store->Put("k", first.metadata, first.members, {}));
    }
    constexpr int kWriters = 2;
    constexpr int kReaders = 2;
    constexpr int kLeasers = 2;
    constexpr std::uint64_t kMinReads = 300;
    std::atomic<int> writers_left{kWriters};
    std::atomic<std::uint64_t> reads{0}, leased_reads{0}, version_changes{0};
    std::atomic<bool> failed{false};
    std::latch start(kWriters + kReaders + kLeasers);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
        threads.emplace_back([&, w] {
            start.arrive_and_wait();
            for (std::uint64_t i = 0; i < 200000; ++i) {
                if (i >= 300 && (reads.load() >= kMinReads || failed.load())) break;
                Tagged t((std::uint64_t(w) + 2) << 32 | (i + 1));
                Status s = store->Put("k", t.metadata, t.members, {PutMode::kUpsert, false});
                if (!s.ok()) {
                    ADD_FAILURE() << s.ToString();
                    failed = true;
                    break;
                }
            }
            writers_left.fetch_sub(1);
        });
    }
    for (int r = 0; r < kReaders; ++r) {
        threads.emplace_back([&] {
            start.arrive_and_wait();
            std::vector<std::byte> a(kRows * 8), b(100 * 8);
            std::uint64_t last = 0;
            for (int after = 0; after < 20 && !failed.load();
                 after += writers_left.load() == 0 ? 1 : 0) {
                std::vector<RangeRead> batch = {{"k", "a", 0, kRows, a}, {"k", "b", 7, 107, b}};
                Status s = store->ReadRanges(batch);
                const std::uint64_t tag = UniformTag(a);
                if (!s.ok() || tag == 0 || UniformTag(b) != tag) {
                    ADD_FAILURE() << "torn or failed batch read: " << s.ToString();
                    failed = true;
                    return;
                }
                if (last != 0 && last != tag) version_changes.fetch_add(1);
                last = tag;
                std::vector<std::byte> whole(kRows * 8);
                s = store->ReadMember("k", "b", whole);
                if (!s.ok() || UniformTag(whole) == 0) {
                    ADD_FAILURE() << "torn or failed member read: " << s.ToString();
                    failed = true;
                    return;
                }
                reads.fetch_add(1);
            }
        });
    }
    for (int l = 0; l < kLeasers; ++l) {
        threads.emplace_back([&] {
            start.arrive_and_wait();
            for (int after = 0; after < 20 && !failed.load();
                 after += writers_left.load() == 0 ? 1 : 0) {
                auto lease = store->Lease("k");
                if (!lease.ok()) {
                    ADD_FAILURE() << lease.status().ToString();
                    failed = true;
                    return;
                }
                // Read the bytes twice with no lock at all: a lease pins them.
                const std::uint64_t tag = UniformTag(lease->Bytes(0));
                const std::uint64_t meta = std::stoull(lease->info().metadata);
                std::this_thread::yield();
                if (tag == 0 || tag != meta || UniformTag(lease->Bytes(1)) != tag ||
                    UniformTag(lease->Bytes(0)) != tag) {
                    ADD_FAILURE() << "a leased object changed under its lease";
                    failed = true;
                    return;
                }
                leased_reads.fetch_add(1);
            }
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_FALSE(failed.load());
    EXPECT_GE(reads.load(), kMinReads);
    EXPECT_GT(leased_reads.load(), 0u);
    const ShmStoreStats stats = store->Stats();
    EXPECT_GT(stats.in_place_upserts, 0u);
    EXPECT_EQ(stats.leases, 0u);
    // Only the live version's extent is left.
    EXPECT_EQ(stats.used_bytes, 2 * kRows * 8);
    RecordProperty("in_place_upserts", std::to_string(stats.in_place_upserts));
    RecordProperty("realloc_upserts", std::to_string(stats.realloc_upserts));
    RecordProperty("version_changes", std::to_string(version_changes.load()));
}

TEST(ShmStoreConcurrencyTest, EvictionChurnWithLeasesAndReaders) {
    // 16 slots of 8 KiB objects in a 64 KiB segment: constant eviction.
    auto store = MakeStore(64 * 1024);
    ASSERT_NE(store, nullptr);
    constexpr int kWriters = 2;
    constexpr int kKeys = 16;
    std::atomic<bool> failed{false};
    std::atomic<int> writers_left{kWriters};
    std::latch start(kWriters + 2);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
        threads.emplace_back([&, w] {
            start.arrive_and_wait();
            for (std::uint64_t i = 0; i < 400 && !failed.load(); ++i) {
                const std::uint64_t tag = (std::uint64_t(w) + 1) << 32 | (i + 1);
                Tagged t(tag);
                Status s = store->Put("k" + std::to_string((i * 7 + w) % kKeys), t.metadata,
                                      t.members, {PutMode::kUpsert, false});
                // Leases may hold every slot for a moment: that is the only acceptable error.
                if (!s.ok() && s.code() != StatusCode::kResourceExhausted) {
                    ADD_FAILURE() << s.ToString();
                    failed = true;
                }
            }
            writers_left.fetch_sub(1);
        });
    }
    for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
            start.arrive_and_wait();
            std::vector<std::byte> buf(kRows * 8);
            for (std::uint64_t i = 0; writers_left.load() > 0 && !failed.load(); ++i) {
                const std::string key = "k" + std::to_string((i * 5 + r) % kKeys);
                if (r == 0) {
                    auto lease = store->Lease(key);
                    if (!lease.ok()) continue;  // evicted or not yet written
                    const std::uint64_t tag = UniformTag(lease->Bytes(0));
                    if (tag == 0 || tag != std::stoull(lease->info().metadata)) {
                        ADD_FAILURE() << "leased bytes torn";
                        failed = true;
                    }
                } else {
                    Status s = store->ReadMember(key, "a", buf);
                    if (s.ok() && UniformTag(buf) == 0) {
                        ADD_FAILURE() << "member read torn";
                        failed = true;
                    }
                }
            }
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_FALSE(failed.load());
    const ShmStoreStats stats = store->Stats();
    EXPECT_GT(stats.evictions, 0u);
    EXPECT_EQ(stats.leases, 0u);
    EXPECT_LE(stats.used_bytes, stats.capacity_bytes);
    // Every surviving key is whole.
    auto keys = store->List("");
    ASSERT_TRUE(keys.ok());
    std::vector<std::byte> buf(kRows * 8);
    for (const auto& k : *keys) {
        MCS_ASSERT_OK(store->ReadMember(k, "b", buf));
        EXPECT_NE(UniformTag(buf), 0u);
    }
}

}  // namespace
}  // namespace mooncake::sparse
