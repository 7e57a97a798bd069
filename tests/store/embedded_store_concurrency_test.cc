// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Concurrency of the embedded ObjectStore: atomic visibility of upserts, exclusive create,
// capacity under racing writers, Remove churn. Meant to run under TSan as well.
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

#include "store/object_store.h"
#include "store_test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::StatusIs;

constexpr std::uint64_t kMinRows = 256;

/// Rows of the object tagged `tag`: two sizes, in runs of four tags, so that upserts often
/// replace an object of the same size (where an in-place overwrite would tear) and sometimes
/// of a different shape.
std::uint64_t RowsOf(std::uint64_t tag) { return kMinRows + ((tag >> 2) & 1) * 16; }

/// An object whose every member is the 8-byte `tag` repeated.
struct TaggedObject {
    std::uint64_t tag = 0;
    std::uint64_t rows = 0;
    std::vector<std::byte> indices;   // uint16 [rows, 4]
    std::vector<std::byte> values;    // uint64 [rows]
    std::vector<std::byte> tile_ptr;  // uint32 [rows, 2]
    std::string metadata;
    std::vector<MemberData> members;

    explicit TaggedObject(std::uint64_t t) : tag(t), rows(RowsOf(t)) {
        for (auto* buf : {&indices, &values, &tile_ptr}) {
            buf->resize(rows * 8);
            for (std::uint64_t r = 0; r < rows; ++r) std::memcpy(buf->data() + r * 8, &tag, 8);
        }
        metadata = std::to_string(tag);
        const auto n = static_cast<Index>(rows);
        members = {{"indices", DType::kUInt16, {n, 4}, indices, tag},
                   {"values", DType::kUInt64, {n}, values, tag},
                   {"tile_ptr", DType::kUInt32, {n, 2}, tile_ptr, tag}};
    }
};

/// The tag repeated throughout `bytes`, or 0 when the bytes are not one tag repeated.
std::uint64_t UniformTag(const std::vector<std::byte>& bytes) {
    if (bytes.size() < 8 || bytes.size() % 8 != 0) return 0;
    std::uint64_t tag;
    std::memcpy(&tag, bytes.data(), 8);
    for (std::size_t off = 8; off < bytes.size(); off += 8) {
        if (std::memcmp(bytes.data() + off, &tag, 8) != 0) return 0;
    }
    return tag;
}

/// Counts a reader thread out when it leaves, however it leaves (a failed ASSERT returns early),
/// so that writers waiting for reader progress never wait for a reader that is gone.
class ExitCounter {
public:
    explicit ExitCounter(std::atomic<int>& exited) : exited_(exited) {}
    ~ExitCounter() { exited_.fetch_add(1); }
    ExitCounter(const ExitCounter&) = delete;
    ExitCounter& operator=(const ExitCounter&) = delete;

private:
    std::atomic<int>& exited_;
};

std::uint64_t MakeTag(std::uint64_t writer, std::uint64_t iteration) {
    return (writer + 1) << 32 | (iteration + 1);
}

/// Checks that one Stat describes exactly one TaggedObject.
bool StatIsConsistent(const ObjectInfo& info) {
    const std::uint64_t tag = std::stoull(info.metadata);
    if (info.members.size() != 3) return false;
    for (const MemberInfo& m : info.members) {
        if (m.checksum != tag || m.size_bytes != RowsOf(tag) * 8) return false;
    }
    return true;
}

TEST(EmbeddedStoreConcurrencyTest, UpsertIsAtomicForReadRangesAndReadMember) {
    auto store = MakeEmbeddedStore();
    {
        TaggedObject initial(MakeTag(99, 0));
        ASSERT_TRUE(store->Put("k", initial.metadata, initial.members, {}).ok());
    }
    constexpr int kWriters = 2;
    constexpr int kReaders = 3;
    constexpr int kMinUpserts = 500;
    constexpr int kMaxUpserts = 1'000'000;
    constexpr std::uint64_t kMinReadCalls = 300;
    std::atomic<std::uint64_t> upserts{0};
    std::atomic<int> readers_exited{0};
    std::atomic<int> writers_left{kWriters};
    std::atomic<std::uint64_t> range_calls{0}, member_calls{0}, stat_calls{0}, version_changes{0};
    std::latch start(kWriters + kReaders);

    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
        threads.emplace_back([&, w] {
            start.arrive_and_wait();
            // Write at least kMinUpserts versions, and keep writing until the readers have
            // made kMinReadCalls calls, so that reads really overlap writes however the threads
            // are scheduled (kMaxUpserts bounds a broken run).
            for (int i = 0; i < kMaxUpserts; ++i) {
                if (i >= kMinUpserts &&
                    (range_calls.load() >= kMinReadCalls || readers_exited.load() == kReaders)) {
                    break;
                }
                TaggedObject obj(
                    MakeTag(static_cast<std::uint64_t>(w), static_cast<std::uint64_t>(i)));
                Status s = store->Put("k", obj.metadata, obj.members, {PutMode::kUpsert, false});
                EXPECT_TRUE(s.ok()) << s.ToString();
                if (!s.ok()) break;
                upserts.fetch_add(1);
            }
            writers_left.fetch_sub(1);
        });
    }
    for (int r = 0; r < kReaders; ++r) {
        threads.emplace_back([&, r] {
            ExitCounter exit_counter(readers_exited);
            start.arrive_and_wait();
            std::vector<std::byte> a(kMinRows * 8), b(192 * 8), c(4 * 8), whole;
            std::uint64_t last_tag = 0;  // 0: nothing read yet.
            // Keep reading until every writer is done, and at least a few rounds after.
            for (int after = 0; after < 20; after += writers_left.load() == 0 ? 1 : 0) {
                // One batch across three members of one object: one version only.
                std::vector<RangeRead> reads = {{"k", "indices", 0, kMinRows, a},
                                                {"k", "values", 8, 200, b},
                                                {"k", "tile_ptr", kMinRows - 4, kMinRows, c}};
                Status s = store->ReadRanges(reads);
                EXPECT_TRUE(s.ok()) << s.ToString();
                const std::uint64_t tag = UniformTag(a);
                EXPECT_NE(tag, 0u) << "torn member in a range read";
                EXPECT_EQ(UniformTag(b), tag);
                EXPECT_EQ(UniformTag(c), tag);
                if (!s.ok() || tag == 0 || UniformTag(b) != tag || UniformTag(c) != tag) return;
                if (last_tag != 0 && tag != last_tag) {
                    version_changes.fetch_add(1, std::memory_order_relaxed);
                }
                last_tag = tag;
                range_calls.fetch_add(1, std::memory_order_relaxed);

                // Stat describes one version; a whole-member read sized from it either sees
                // a version of that size or fails cleanly because the size changed.
                auto info = store->Stat("k");
                EXPECT_TRUE(info.ok());
                if (!info.ok()) return;
                EXPECT_TRUE(StatIsConsistent(*info)) << info->metadata;
                stat_calls.fetch_add(1, std::memory_order_relaxed);
                const MemberInfo* m = info->FindMember(r % 2 ? "values" : "indices");
                ASSERT_NE(m, nullptr);
                whole.assign(m->size_bytes, std::byte{0});
                s = store->ReadMember("k", m->name, whole);
                if (s.ok()) {
                    EXPECT_NE(UniformTag(whole), 0u) << "torn member read";
                    EXPECT_EQ(RowsOf(UniformTag(whole)) * 8, whole.size());
                    member_calls.fetch_add(1, std::memory_order_relaxed);
                } else {
                    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
                }
            }
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_GE(range_calls.load(), kMinReadCalls);
    EXPECT_GT(stat_calls.load(), 0u);
    // The readers really saw versions change under them.
    EXPECT_GT(version_changes.load(), 0u);
    RecordProperty("range_calls", std::to_string(range_calls.load()));
    RecordProperty("member_calls", std::to_string(member_calls.load()));
    RecordProperty("version_changes", std::to_string(version_changes.load()));
    auto info = store->Stat("k");
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->version, 1u + upserts.load());
    EXPECT_EQ(store->Counters().puts, 1u + upserts.load());
}

TEST(EmbeddedStoreConcurrencyTest, OneBatchSeesOneStateAcrossKeys) {
    // A single writer upserts "x" then "y" with the same increasing tag, so at every instant
    // tag(x) is tag(y) or tag(y) + 1. One ReadRanges batch naming both must observe that.
    auto store = MakeEmbeddedStore();
    TaggedObject first(1);
    ASSERT_TRUE(store->Put("x", first.metadata, first.members, {}).ok());
    ASSERT_TRUE(store->Put("y", first.metadata, first.members, {}).ok());
    constexpr int kReaders = 2;
    std::atomic<bool> done{false};
    std::latch start(1 + kReaders);
    std::atomic<std::uint64_t> batches{0};
    std::atomic<int> readers_exited{0};
    std::thread writer([&] {
        start.arrive_and_wait();
        // At least 2000 versions, and on until the readers have made 300 batches.
        for (std::uint64_t tag = 2; tag < 1'000'000; ++tag) {
            if (tag >= 2000 && (batches.load() >= 300 || readers_exited.load() == kReaders)) break;
            TaggedObject obj(tag);
            EXPECT_TRUE(store->Put("x", obj.metadata, obj.members, {PutMode::kUpsert}).ok());
            EXPECT_TRUE(store->Put("y", obj.metadata, obj.members, {PutMode::kUpsert}).ok());
        }
        done.store(true);
    });
    std::vector<std::thread> readers;
    for (int r = 0; r < kReaders; ++r) {
        readers.emplace_back([&] {
            ExitCounter exit_counter(readers_exited);
            start.arrive_and_wait();
            // 64 items alternating y and x: every key is resolved again and again in the batch.
            constexpr int kItems = 64;
            std::vector<std::vector<std::byte>> dst(kItems, std::vector<std::byte>(16));
            std::vector<RangeRead> reads;
            for (int i = 0; i < kItems; ++i) {
                const auto row = static_cast<std::uint64_t>(i);
                reads.push_back({i % 2 ? "x" : "y", i % 4 < 2 ? "values" : "indices", row, row + 2,
                                 dst[static_cast<std::size_t>(i)]});
            }
            do {
                ASSERT_TRUE(store->ReadRanges(reads).ok());
                const std::uint64_t y = UniformTag(dst[0]), x = UniformTag(dst[1]);
                for (int i = 0; i < kItems; ++i) {
                    ASSERT_EQ(UniformTag(dst[static_cast<std::size_t>(i)]), i % 2 ? x : y)
                        << "item " << i << " saw another state of the store";
                }
                ASSERT_TRUE(x == y || x == y + 1) << "x=" << x << " y=" << y;
                batches.fetch_add(1);
            } while (!done.load());
        });
    }
    writer.join();
    for (auto& t : readers) t.join();
}

TEST(EmbeddedStoreConcurrencyTest, RacingCreatesHaveExactlyOneWinner) {
    auto store = MakeEmbeddedStore();
    constexpr int kThreads = 4;
    constexpr int kKeys = 100;
    std::vector<std::vector<Status>> results(kKeys, std::vector<Status>(kThreads));
    for (int k = 0; k < kKeys; ++k) {
        const std::string key = "race/" + std::to_string(k);
        std::latch start(kThreads);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([&, t] {
                TaggedObject obj(MakeTag(static_cast<std::uint64_t>(t), 0));
                start.arrive_and_wait();
                results[k][t] = store->Put(key, obj.metadata, obj.members, {PutMode::kCreate});
            });
        }
        for (auto& th : threads) th.join();
        int winners = 0, winner = -1;
        for (int t = 0; t < kThreads; ++t) {
            if (results[k][t].ok()) {
                ++winners;
                winner = t;
            } else {
                EXPECT_THAT(results[k][t], StatusIs(StatusCode::kConflict));
            }
        }
        ASSERT_EQ(winners, 1) << key;
        auto info = store->Stat(key);
        ASSERT_TRUE(info.ok());
        EXPECT_EQ(info->metadata, std::to_string(MakeTag(static_cast<std::uint64_t>(winner), 0)));
        EXPECT_EQ(info->version, 1u);
    }
    EXPECT_EQ(store->Counters().puts, static_cast<std::uint64_t>(kKeys));
}

TEST(EmbeddedStoreConcurrencyTest, RacingPutsNeverExceedCapacity) {
    // Objects large enough that copying one takes a while: the capacity check before the copy
    // is only advisory, the one under the exclusive lock must hold against racing writers.
    constexpr std::uint64_t kObjectBytes = 128 * 1024;
    constexpr std::uint64_t kFit = 10;
    auto store = MakeEmbeddedStore({.capacity_bytes = kFit * kObjectBytes});
    constexpr int kThreads = 4;
    constexpr int kKeysPerThread = 8;
    constexpr int kRounds = 10;
    std::vector<std::byte> bytes(kObjectBytes);
    const MemberData m{"a", DType::kUInt8, {static_cast<Index>(kObjectBytes)}, bytes, 0};
    for (int round = 0; round < kRounds; ++round) {
        std::atomic<int> accepted{0};
        std::latch start(kThreads);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([&, t] {
                start.arrive_and_wait();
                for (int i = 0; i < kKeysPerThread; ++i) {
                    const std::string key = std::to_string(t) + "/" + std::to_string(i);
                    Status s = store->Put(key, "", {&m, 1}, {PutMode::kCreate});
                    if (s.ok()) {
                        accepted.fetch_add(1);
                    } else {
                        EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted));
                    }
                }
            });
        }
        for (auto& th : threads) th.join();
        ASSERT_EQ(accepted.load(), static_cast<int>(kFit)) << "round " << round;
        auto keys = store->List("");
        ASSERT_TRUE(keys.ok());
        ASSERT_EQ(keys->size(), kFit);
        for (const std::string& key : *keys) ASSERT_TRUE(store->Remove(key).ok());
    }
}

TEST(EmbeddedStoreConcurrencyTest, RemoveChurnReadersSeeWholeObjectOrNotFound) {
    auto store = MakeEmbeddedStore();
    constexpr int kReaders = 2;
    std::atomic<bool> done{false};
    std::latch start(1 + kReaders);
    std::atomic<std::uint64_t> batches{0};
    std::atomic<int> readers_exited{0};
    std::uint64_t cycles = 0;
    std::thread writer([&] {
        start.arrive_and_wait();
        // At least 1000 create/remove cycles, and on until the readers have made 300 batches.
        for (std::uint64_t i = 1; i < 1'000'000; ++i) {
            if (i > 1000 && (batches.load() >= 300 || readers_exited.load() == kReaders)) break;
            TaggedObject obj(i);
            EXPECT_TRUE(store->Put("r", obj.metadata, obj.members, {PutMode::kCreate}).ok());
            EXPECT_TRUE(store->Remove("r").ok());
            ++cycles;
        }
        done.store(true);
    });
    std::vector<std::thread> readers;
    std::atomic<int> hits{0};
    for (int r = 0; r < kReaders; ++r) {
        readers.emplace_back([&] {
            ExitCounter exit_counter(readers_exited);
            start.arrive_and_wait();
            std::vector<std::byte> a(8 * 8), b(8);
            do {
                std::vector<RangeRead> reads = {{"r", "indices", 0, 8, a},
                                                {"r", "values", kMinRows - 1, kMinRows, b}};
                Status s = store->ReadRanges(reads);
                if (s.ok()) {
                    ASSERT_NE(UniformTag(a), 0u);
                    ASSERT_EQ(UniformTag(a), UniformTag(b));
                    hits.fetch_add(1);
                } else {
                    ASSERT_THAT(s, StatusIs(StatusCode::kNotFound));
                }
                auto keys = store->List("r");
                ASSERT_TRUE(keys.ok());
                ASSERT_LE(keys->size(), 1u);
                batches.fetch_add(1);
            } while (!done.load());
        });
    }
    writer.join();
    for (auto& t : readers) t.join();
    EXPECT_THAT(store->Stat("r"), StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(store->Counters().removes, cycles);
    RecordProperty("hits", std::to_string(hits.load()));
}

}  // namespace
}  // namespace mooncake::sparse
