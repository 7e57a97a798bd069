// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Segment preparation in the background: ShmStore::Create returns before any pinned byte is
// registered, registrations run in parallel and become visible to the copy path as they land,
// pre-faulting makes every page resident, and stopping early neither hangs nor leaks a
// registration.
#include <sys/mman.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/object_store.h"
#include "store/pinned_memory.h"
#include "store/segment_preparer.h"
#include "store/shm_segment.h"
#include "store/shm_store.h"

namespace mooncake::sparse {
namespace {

using std::chrono::milliseconds;

/// A stand-in for cudaHostRegister that blocks every call until Open(), and counts.
class GatedRegistrar {
public:
    RegisterPinnedFn Fn() {
        return [this](std::byte* data, std::uint64_t size) -> Result<PinnedRegion> {
            std::unique_lock lock(mu_);
            ++inside_;
            max_inside_ = std::max(max_inside_, inside_);
            cv_.notify_all();
            cv_.wait(lock, [&] { return open_; });
            --inside_;
            ++registered_;
            return PinnedRegion::Adopt(data, size, [this](void*) { unregistered_.fetch_add(1); });
        };
    }
    void Open() {
        std::lock_guard lock(mu_);
        open_ = true;
        cv_.notify_all();
    }
    /// Waits until `n` registrations are blocked at once.
    bool WaitInside(int n, milliseconds timeout) {
        std::unique_lock lock(mu_);
        return cv_.wait_for(lock, timeout, [&] { return inside_ >= n; });
    }
    int max_inside() {
        std::lock_guard lock(mu_);
        return max_inside_;
    }
    int registered() {
        std::lock_guard lock(mu_);
        return registered_;
    }
    int unregistered() const { return unregistered_.load(); }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool open_ = false;
    int inside_ = 0;
    int max_inside_ = 0;
    int registered_ = 0;
    std::atomic<int> unregistered_{0};
};

/// Puts one `bytes`-byte object through PutFilled; returns whether its target was pinned.
Result<bool> PutFilledBlob(ShmStore& store, std::string key, std::uint64_t bytes) {
    const MemberSpec spec{"data", DType::kUInt8, {static_cast<Index>(bytes)}, 0};
    const FilledPut put{key, {}, std::span<const MemberSpec>(&spec, 1)};
    bool pinned = false;
    MCS_RETURN_IF_ERROR(store.PutFilled(
        std::span<const FilledPut>(&put, 1), {PutMode::kCreate, false},
        [&](std::span<const FillTarget> targets) {
            pinned = targets[0].pinned;
            std::memset(targets[0].members[0].data(), 7, targets[0].members[0].size());
            return Status::Ok();
        },
        nullptr));
    return pinned;
}

/// Pages of `fd` (a segment of `size` bytes) resident in memory.
std::uint64_t ResidentPages(int fd, std::uint64_t size) {
    auto mapping = ShmMapping::Map(fd, size, /*writable=*/false);
    EXPECT_TRUE(mapping.ok()) << mapping.status().ToString();
    if (!mapping.ok()) return 0;
    std::vector<unsigned char> vec(size / PageSize());
    EXPECT_EQ(::mincore(mapping->data(), size, vec.data()), 0);
    std::uint64_t n = 0;
    for (unsigned char v : vec) n += v & 1;
    return n;
}

TEST(SegmentPreparationTest, CreateReturnsBeforePinningWhichRunsInParallelInTheBackground) {
    GatedRegistrar gate;
    ShmStoreOptions options;
    options.segment_size = 64 * PageSize();
    options.num_segments = 4;
    options.pinned_quota_bytes = 3 * options.segment_size + 8 * PageSize();  // 3.x segments
    options.prepare_threads = 4;
    options.register_pinned = gate.Fn();
    options.name = "preparer_test";
    auto created = ShmStore::Create(options);  // Would hang here if it registered inline.
    struct OpenOnExit {  // Destroying the store joins the blocked registrations: open first.
        GatedRegistrar& gate;
        ~OpenOnExit() { gate.Open(); }
    } open_on_exit{gate};
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    ShmStore& store = **created;

    // Serving while nothing is registered yet: the memory is used as pageable.
    ASSERT_TRUE(gate.WaitInside(4, milliseconds(10000))) << "registrations did not overlap";
    ShmStoreStats stats = store.Stats();
    EXPECT_EQ(stats.pinned_bytes, 0u);
    EXPECT_EQ(stats.preparation.pinned_target_bytes, options.pinned_quota_bytes);
    EXPECT_FALSE(stats.preparation.complete);
    EXPECT_FALSE(store.WaitPrepared(milliseconds(1)));
    auto pinned = PutFilledBlob(store, "before", 4 * PageSize());
    ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
    EXPECT_FALSE(*pinned);
    for (const ShmSegmentDesc& d : store.Segments()) EXPECT_EQ(d.pinned_bytes, 0u);

    gate.Open();
    ASSERT_TRUE(store.WaitPrepared(milliseconds(10000)));
    stats = store.Stats();
    EXPECT_TRUE(stats.preparation.complete);
    EXPECT_EQ(stats.pinned_bytes, options.pinned_quota_bytes);
    EXPECT_EQ(stats.pageable_bytes, 4 * options.segment_size - options.pinned_quota_bytes);
    EXPECT_EQ(stats.preparation.pin_failures, 0u);
    EXPECT_EQ(gate.registered(), 4);
    EXPECT_EQ(gate.max_inside(), 4);
    const std::vector<ShmSegmentDesc> segments = store.Segments();
    EXPECT_EQ(segments[0].pinned_bytes, options.segment_size);
    EXPECT_EQ(segments[3].pinned_bytes, 8 * PageSize());
    pinned = PutFilledBlob(store, "after", 4 * PageSize());
    ASSERT_TRUE(pinned.ok());
    EXPECT_TRUE(*pinned);  // First fit: segment 0, registered now.

    created->reset();
    EXPECT_EQ(gate.unregistered(), 4);  // Every registration released with the store.
}

TEST(SegmentPreparationTest, APinFailureLeavesTheRestPageable) {
    ShmStoreOptions options;
    options.segment_size = 16 * PageSize();
    options.num_segments = 3;
    options.pinned_quota_bytes = 3 * options.segment_size;
    options.prepare_threads = 1;  // In segment order: the second one fails.
    std::atomic<int> calls{0};
    options.register_pinned = [&](std::byte* data, std::uint64_t size) -> Result<PinnedRegion> {
        if (calls.fetch_add(1) == 1) return Unavailable("cudaHostRegister: out of memory");
        return PinnedRegion::Adopt(data, size, [](void*) {});
    };
    auto store = ShmStore::Create(options);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->WaitPrepared(milliseconds(10000)));
    const ShmStoreStats stats = (*store)->Stats();
    EXPECT_EQ(stats.pinned_bytes, options.segment_size);
    EXPECT_EQ(stats.preparation.pin_failures, 1u);
    EXPECT_THAT(stats.preparation.detail, ::testing::HasSubstr("out of memory"));
    EXPECT_EQ(calls.load(), 2);
}

TEST(SegmentPreparationTest, PrefaultMakesEveryPageResident) {
    for (bool prefault : {false, true}) {
        ShmStoreOptions options;
        options.segment_size = 256 * PageSize();
        options.num_segments = 2;
        options.prefault = prefault;
        options.prepare_in_background = false;  // Create waits for it.
        auto store = ShmStore::Create(options);
        ASSERT_TRUE(store.ok());
        const ShmStoreStats stats = (*store)->Stats();
        EXPECT_TRUE(stats.preparation.complete);
        for (const ShmSegmentDesc& d : (*store)->Segments()) {
            const std::uint64_t resident = ResidentPages(d.read_only_fd, d.size);
            if (prefault) {
                EXPECT_EQ(resident, d.size / PageSize()) << "segment " << d.id;
            } else {
                EXPECT_EQ(resident, 0u) << "segment " << d.id;
            }
        }
        EXPECT_EQ(stats.preparation.prefaulted_bytes, prefault ? 2 * options.segment_size : 0);
    }
}

TEST(SegmentPreparationTest, PrefaultRangeRunsChunksTheBackgroundHasNotReached) {
    auto seg = ShmSegment::Create("preparer_range", 64 * PageSize());
    ASSERT_TRUE(seg.ok());
    GatedRegistrar gate;  // Holds the only worker in its registration of segment 0...
    auto other = ShmSegment::Create("preparer_range_pin", 4 * PageSize());
    ASSERT_TRUE(other.ok());
    SegmentPreparerOptions options;
    options.threads = 1;
    options.chunk_bytes = 4 * PageSize();
    options.register_pinned = gate.Fn();
    SegmentPreparer preparer({{other->data(), other->fd(), other->size(), other->size()},
                              {seg->data(), seg->fd(), seg->size(), 0}},
                             options);
    struct OpenOnExit {
        GatedRegistrar& gate;
        ~OpenOnExit() { gate.Open(); }
    } open_on_exit{gate};
    ASSERT_TRUE(gate.WaitInside(1, milliseconds(10000)));
    // ... so the chunks of segment 1 are the put path's to run.
    preparer.PrefaultRange(1, 10 * PageSize(), 6 * PageSize());  // chunks 2, 3
    EXPECT_EQ(ResidentPages(seg->read_only_fd(), seg->size()), 8u);
    EXPECT_EQ(preparer.Progress().prefaulted_bytes, 4 * PageSize() + 8 * PageSize());
    gate.Open();
    EXPECT_TRUE(preparer.Wait(milliseconds(10000)));
    EXPECT_EQ(ResidentPages(seg->read_only_fd(), seg->size()), 64u);
    EXPECT_EQ(preparer.Progress().prefaulted_bytes, 68 * PageSize());
    EXPECT_EQ(preparer.PinnedBytes(0), 4 * PageSize());
}

TEST(SegmentPreparationTest, StoppingEarlyIsPromptAndReleasesWhatWasRegistered) {
    ShmStoreOptions options;
    options.segment_size = 4096 * PageSize();  // 16 MiB per segment with 4 KiB pages
    options.num_segments = 8;
    options.pinned_quota_bytes = 8 * options.segment_size;
    options.prepare_threads = 1;
    std::atomic<int> registered{0}, unregistered{0};
    options.register_pinned = [&](std::byte* data, std::uint64_t size) -> Result<PinnedRegion> {
        registered.fetch_add(1);
        return PinnedRegion::Adopt(data, size, [&](void*) { unregistered.fetch_add(1); });
    };
    auto store = ShmStore::Create(options);
    ASSERT_TRUE(store.ok());
    const auto t0 = std::chrono::steady_clock::now();
    store->reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    EXPECT_EQ(registered.load(), unregistered.load());
}

}  // namespace
}  // namespace mooncake::sparse
