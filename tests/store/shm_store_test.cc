// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// ShmStore and its shared-memory segments: sealing and read-only hand-out, the extent allocator
// (first fit, coalescing, capacity), upsert in place versus reallocation under a lease, LRU
// eviction, hard pin, quota errors that leave the store unchanged, leases and Publish.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "store/object_store.h"
#include "store/pinned_memory.h"
#include "store/shm_segment.h"
#include "store/shm_store.h"
#include "store_test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::Create;
using ::mooncake::sparse::testing::EachBatch;
using ::mooncake::sparse::testing::ExpectPutEachIsPutInOrder;
using ::mooncake::sparse::testing::ExpectPutEachIsPutInOrderOnFreshStores;
using ::mooncake::sparse::testing::OwnedMember;
using ::mooncake::sparse::testing::Upsert;
using ::mooncake::sparse::testing::PatternMember;
using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::Views;
using ::testing::ElementsAre;

constexpr std::uint64_t kKiB = 1024;

std::unique_ptr<ShmStore> MakeStore(std::uint64_t segment_size, std::uint32_t segments = 1,
                                    std::uint64_t metadata_capacity = 1 << 20) {
    ShmStoreOptions options;
    options.segment_size = segment_size;
    options.num_segments = segments;
    options.metadata_capacity_bytes = metadata_capacity;
    options.name = "shm_store_test";
    auto store = ShmStore::Create(options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
}

/// One uint8 member of `bytes` bytes filled with `seed`'s pattern.
std::vector<OwnedMember> Blob(std::uint64_t bytes, std::uint8_t seed) {
    return {PatternMember("data", DType::kUInt8, {static_cast<Index>(bytes)}, seed, seed)};
}

Status PutBlob(ShmStore& store, std::string_view key, std::uint64_t bytes, std::uint8_t seed,
               PutMode mode = PutMode::kCreate, bool pin = false) {
    const auto members = Blob(bytes, seed);
    return store.Put(key, "meta-" + std::to_string(seed), Views(members), {mode, pin});
}

std::vector<std::byte> ReadBlob(ShmStore& store, std::string_view key) {
    auto info = store.Stat(key);
    if (!info.ok()) return {};
    std::vector<std::byte> out(info->members[0].size_bytes);
    if (!store.ReadMember(key, "data", out).ok()) return {};
    return out;
}

std::vector<std::string> Keys(ShmStore& store) {
    auto keys = store.List("");
    return keys.ok() ? *keys : std::vector<std::string>{};
}

// ---------------------------------------------------------------------------------------------
// Segments.
// ---------------------------------------------------------------------------------------------

TEST(ShmSegmentTest, CreateMapsSealedMemoryAndReadOnlyFdCannotWrite) {
    auto seg = ShmSegment::Create("seg_test", 4 * PageSize());
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    std::memset(seg->data(), 0x5a, seg->size());
    const int seals = ::fcntl(seg->fd(), F_GET_SEALS);
    EXPECT_TRUE(seals & F_SEAL_SHRINK);
    EXPECT_TRUE(seals & F_SEAL_GROW);
    EXPECT_TRUE(seals & F_SEAL_SEAL);

    // The read-only fd maps read-only, and sees our writes.
    void* ro = ::mmap(nullptr, seg->size(), PROT_READ, MAP_SHARED, seg->read_only_fd(), 0);
    ASSERT_NE(ro, MAP_FAILED);
    EXPECT_EQ(static_cast<unsigned char*>(ro)[17], 0x5a);
    ::munmap(ro, seg->size());
    EXPECT_EQ(::mmap(nullptr, seg->size(), PROT_READ | PROT_WRITE, MAP_SHARED,
                     seg->read_only_fd(), 0),
              MAP_FAILED);
    EXPECT_NE(::ftruncate(seg->read_only_fd(), 0), 0);

    // Even reopening it read-write through /proc gives no writable mapping (FUTURE_WRITE seal).
    if (seg->write_sealed()) {
        const std::string path = "/proc/self/fd/" + std::to_string(seg->read_only_fd());
        const int rw = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
        if (rw >= 0) {
            EXPECT_EQ(::mmap(nullptr, seg->size(), PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0),
                      MAP_FAILED);
            EXPECT_LT(::pwrite(rw, "x", 1, 0), 0);
            EXPECT_NE(::ftruncate(rw, 0), 0);
            ::close(rw);
        }
    }
}

// A segment that asks for huge pages is the same memory to its users; whether the kernel backs
// it with them depends on its shmem setting, which HugePageBytes reports (never past the size).
TEST(ShmSegmentTest, HugePagesAreAskedForAndReported) {
    constexpr std::uint64_t kSize = std::uint64_t{8} << 20;
    for (const bool huge : {false, true}) {
        ShmSegmentOptions options;
        options.huge_pages = huge;
        auto seg = ShmSegment::Create("seg_huge", kSize, options);
        ASSERT_TRUE(seg.ok()) << seg.status().ToString();
        if (!huge) {
            EXPECT_FALSE(seg->huge_pages_advised());
        }
        std::memset(seg->data(), 0x3c, seg->size());
        void* ro = ::mmap(nullptr, seg->size(), PROT_READ, MAP_SHARED, seg->read_only_fd(), 0);
        ASSERT_NE(ro, MAP_FAILED);
        EXPECT_EQ(static_cast<unsigned char*>(ro)[kSize - 1], 0x3c);
        ::munmap(ro, seg->size());
        auto bytes = seg->HugePageBytes();
        ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
        EXPECT_LE(*bytes, kSize);
        EXPECT_EQ(*bytes % (std::uint64_t{2} << 20), 0u);
        const bool advised = seg->huge_pages_advised();
        ShmSegment moved = std::move(*seg);
        EXPECT_EQ(moved.huge_pages_advised(), advised);
    }
    ShmStoreOptions o;
    o.segment_size = std::uint64_t{4} << 20;
    o.num_segments = 2;
    o.huge_pages = true;
    o.prepare_in_background = false;
    auto store = ShmStore::Create(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_LE((*store)->SegmentHugePageBytes(), 2 * o.segment_size);
}

TEST(ShmSegmentTest, RejectsSizesThatAreNotWholePages) {
    EXPECT_THAT(ShmSegment::Create("x", 0), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ShmSegment::Create("x", PageSize() + 1), StatusIs(StatusCode::kInvalidArgument));
}

TEST(ShmMappingTest, MapsSealedMemfdAndRejectsOthers) {
    auto seg = ShmSegment::Create("map_test", PageSize(), {.seal_future_write = false});
    ASSERT_TRUE(seg.ok());
    auto rw = ShmMapping::Map(seg->fd(), PageSize(), /*writable=*/true);
    ASSERT_TRUE(rw.ok()) << rw.status().ToString();
    rw->data()[3] = std::byte{7};
    EXPECT_EQ(seg->data()[3], std::byte{7});
    EXPECT_THAT(rw->Slice(PageSize() - 1, 2), StatusIs(StatusCode::kOutOfRange));
    EXPECT_THAT(rw->Slice(~std::uint64_t{0}, 2), StatusIs(StatusCode::kOutOfRange));
    EXPECT_TRUE(rw->Slice(PageSize() - 1, 1).ok());
    // Larger than the file: refused before mmap (a fault there would be SIGBUS).
    EXPECT_THAT(ShmMapping::Map(seg->fd(), 2 * PageSize(), false),
                StatusIs(StatusCode::kInvalidArgument));

    // An unsealed memfd could shrink under the mapping: refused.
    const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
    ASSERT_GE(unsealed, 0);
    ASSERT_EQ(::ftruncate(unsealed, PageSize()), 0);
    EXPECT_THAT(ShmMapping::Map(unsealed, PageSize(), false),
                StatusIs(StatusCode::kInvalidArgument));
    ::close(unsealed);
    // Not a memfd at all.
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    EXPECT_THAT(ShmMapping::Map(fds[0], PageSize(), false),
                StatusIs(StatusCode::kInvalidArgument));
    ::close(fds[0]);
    ::close(fds[1]);
}

TEST(PinnedMemoryTest, NoDeviceMeansUnimplementedNotACrash) {
    const PinningSupport& support = GetPinningSupport();
    EXPECT_FALSE(support.detail.empty());
    if (!support.available) {
        std::vector<std::byte> buf(PageSize());
        EXPECT_THAT(PinnedRegion::Register(buf.data(), buf.size()),
                    StatusIs(StatusCode::kUnimplemented));
    }
}

TEST(ShmStoreTest, PinnedQuotaWithoutCudaLeavesEverythingPageable) {
    ShmStoreOptions options;
    options.segment_size = 16 * PageSize();
    options.num_segments = 2;
    options.pinned_quota_bytes = 20 * PageSize();
    auto store = ShmStore::Create(options);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->WaitPrepared(std::chrono::seconds(60)));
    const ShmStoreStats stats = (*store)->Stats();
    EXPECT_EQ(stats.pinned_bytes + stats.pageable_bytes, 32 * PageSize());
    if (!GetPinningSupport().available) {
        EXPECT_EQ(stats.pinned_bytes, 0u);
    } else {
        EXPECT_EQ(stats.pinned_bytes, 20 * PageSize());
    }
}

// ---------------------------------------------------------------------------------------------
// Object store behaviour.
// ---------------------------------------------------------------------------------------------

TEST(ShmStoreTest, RoundTripStatReadMemberAndRanges) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    std::vector<OwnedMember> members = {
        PatternMember("indices", DType::kUInt16, {100, 2}, 1, 11),
        PatternMember("values", DType::kBFloat16, {100}, 2, 22),
        PatternMember("empty", DType::kUInt64, {0}, 3, 33),
    };
    MCS_ASSERT_OK(store->Put("obj", "{\"m\":1}", Views(members), {}));
    auto info = store->Stat("obj");
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->metadata, "{\"m\":1}");
    EXPECT_EQ(info->version, 1u);
    ASSERT_EQ(info->members.size(), 3u);
    EXPECT_EQ(info->members[0].size_bytes, 400u);
    EXPECT_EQ(info->members[1].checksum, 22u);

    std::vector<std::byte> whole(400);
    MCS_ASSERT_OK(store->ReadMember("obj", "indices", whole));
    EXPECT_EQ(whole, members[0].bytes);
    std::vector<std::byte> rows(4 * 10), vals(2 * 5), none;
    std::vector<RangeRead> reads = {{"obj", "indices", 10, 20, rows},
                                    {"obj", "values", 95, 100, vals},
                                    {"obj", "empty", 0, 0, none}};
    MCS_ASSERT_OK(store->ReadRanges(reads));
    EXPECT_TRUE(std::equal(rows.begin(), rows.end(), members[0].bytes.begin() + 40));
    EXPECT_TRUE(std::equal(vals.begin(), vals.end(), members[1].bytes.begin() + 190));

    EXPECT_THAT(store->Put("obj", "", Views(members), {}), StatusIs(StatusCode::kConflict));
    EXPECT_THAT(store->ReadMember("nope", "indices", whole), StatusIs(StatusCode::kNotFound));
    std::vector<RangeRead> bad = {{"obj", "indices", 99, 101, rows}};
    EXPECT_THAT(store->ReadRanges(bad), StatusIs(StatusCode::kOutOfRange));
    MCS_ASSERT_OK(store->Remove("obj"));
    EXPECT_THAT(store->Stat("obj"), StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(store->Stats().used_bytes, 0u);
    // A key written again after Remove never repeats a version.
    MCS_ASSERT_OK(store->Put("obj", "", Views(members), {}));
    EXPECT_EQ(store->Stat("obj")->version, 2u);
}

TEST(ShmStoreTest, StatSharedIsTheVersionItSawAfterAnUpsertOrRemove) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    std::vector<OwnedMember> members = {PatternMember("values", DType::kBFloat16, {40}, 1, 7)};
    MCS_ASSERT_OK(store->Put("k", "first", Views(members), {}));
    auto shared = store->StatShared("k");
    MCS_ASSERT_OK(shared);
    auto copied = store->Stat("k");
    MCS_ASSERT_OK(copied);
    EXPECT_EQ((*shared)->metadata, copied->metadata);
    EXPECT_EQ((*shared)->version, copied->version);
    // Rewritten in place (same size) and then removed: the shared info is still the first one.
    std::vector<OwnedMember> same = {PatternMember("values", DType::kBFloat16, {40}, 2, 8)};
    MCS_ASSERT_OK(store->Put("k", "second", Views(same), {PutMode::kUpsert, false}));
    EXPECT_EQ((*store->StatShared("k"))->metadata, "second");
    MCS_ASSERT_OK(store->Remove("k"));
    EXPECT_EQ((*shared)->metadata, "first");
    EXPECT_EQ((*shared)->version, copied->version);
    EXPECT_THAT(store->StatShared("k"), StatusIs(StatusCode::kNotFound));
}

TEST(ShmStoreTest, FindIsStatSharedWithAMissAsNull) {
    // The base implementation (through StatShared).
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    auto missing = store->Find("k");
    MCS_ASSERT_OK(missing);
    EXPECT_EQ(*missing, nullptr);
    std::vector<OwnedMember> members = {PatternMember("values", DType::kBFloat16, {40}, 1, 7)};
    MCS_ASSERT_OK(store->Put("k", "first", Views(members), {}));
    auto found = store->Find("k");
    MCS_ASSERT_OK(found);
    ASSERT_NE(*found, nullptr);
    EXPECT_EQ((*found)->metadata, "first");
}

TEST(ShmStoreTest, ParallelRangeReadsReadWhatRangeReadsRead) {
    auto store = MakeStore(32 * 1024 * kKiB);
    ASSERT_NE(store, nullptr);
    testing::ExpectParallelRangeReadsMatch(*store);
}

TEST(ShmStoreTest, MetadataOnlyObjectsTakeNoSegmentMemory) {
    auto store = MakeStore(4 * kKiB);
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 100; ++i) {
        MCS_ASSERT_OK(store->Put("k" + std::to_string(i), "writer", {}, {}));
    }
    EXPECT_EQ(store->Stats().used_bytes, 0u);
    EXPECT_EQ(store->Stats().objects, 100u);
}

TEST(ShmStoreTest, AllocatorIsFirstFitAndCoalescesFreedNeighbours) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 4; ++i) {
        MCS_ASSERT_OK(PutBlob(*store, "b" + std::to_string(i), 16 * kKiB, i, PutMode::kCreate,
                              /*pin=*/true));
    }
    EXPECT_EQ(store->Stats().largest_free_bytes, 0u);
    MCS_ASSERT_OK(store->Remove("b1"));
    EXPECT_EQ(store->Stats().largest_free_bytes, 16 * kKiB);
    MCS_ASSERT_OK(store->Remove("b2"));
    // b1 and b2 were neighbours: one 32 KiB block now.
    EXPECT_EQ(store->Stats().largest_free_bytes, 32 * kKiB);
    MCS_ASSERT_OK(PutBlob(*store, "big", 32 * kKiB, 9, PutMode::kCreate, true));
    EXPECT_EQ(ReadBlob(*store, "big"), Blob(32 * kKiB, 9)[0].bytes);
    EXPECT_EQ(ReadBlob(*store, "b0"), Blob(16 * kKiB, 0)[0].bytes);
    EXPECT_EQ(ReadBlob(*store, "b3"), Blob(16 * kKiB, 3)[0].bytes);
    // Everything is pinned: the next one does not fit, and nothing changed.
    EXPECT_THAT(PutBlob(*store, "more", 64, 1), StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(Keys(*store), ElementsAre("b0", "b3", "big"));
}

TEST(ShmStoreTest, ObjectsSpreadOverSegmentsButNeverSpanTwo) {
    auto store = MakeStore(16 * kKiB, /*segments=*/2);
    ASSERT_NE(store, nullptr);
    MCS_ASSERT_OK(PutBlob(*store, "a", 12 * kKiB, 1, PutMode::kCreate, true));
    MCS_ASSERT_OK(PutBlob(*store, "b", 12 * kKiB, 2, PutMode::kCreate, true));
    EXPECT_THAT(PutBlob(*store, "c", 12 * kKiB, 3), StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(PutBlob(*store, "huge", 17 * kKiB, 3), StatusIs(StatusCode::kResourceExhausted));
    auto la = store->Lease("a");
    auto lb = store->Lease("b");
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_NE(la->segment_id(), lb->segment_id());
}

TEST(ShmStoreTest, UpsertOfSameSizeWritesInPlaceWithoutALease) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    MCS_ASSERT_OK(PutBlob(*store, "k", 8 * kKiB, 1));
    std::uint64_t offset_before = 0;
    {
        auto lease = store->Lease("k");
        ASSERT_TRUE(lease.ok());
        offset_before = lease->member_offset(0);
    }
    MCS_ASSERT_OK(PutBlob(*store, "k", 8 * kKiB, 2, PutMode::kUpsert));
    EXPECT_EQ(store->Stats().in_place_upserts, 1u);
    EXPECT_EQ(store->Stats().realloc_upserts, 0u);
    EXPECT_EQ(store->Stats().used_bytes, 8 * kKiB);
    auto lease = store->Lease("k");
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(lease->member_offset(0), offset_before);
    EXPECT_EQ(ReadBlob(*store, "k"), Blob(8 * kKiB, 2)[0].bytes);
    EXPECT_EQ(store->Stat("k")->version, 2u);
    EXPECT_EQ(store->Stat("k")->metadata, "meta-2");
}

TEST(ShmStoreTest, UpsertUnderALeaseReallocatesAndTheLeaseKeepsTheOldBytes) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    MCS_ASSERT_OK(PutBlob(*store, "k", 8 * kKiB, 1));
    auto lease = store->Lease("k");
    ASSERT_TRUE(lease.ok());
    const std::vector<std::byte> old = Blob(8 * kKiB, 1)[0].bytes;

    MCS_ASSERT_OK(PutBlob(*store, "k", 8 * kKiB, 2, PutMode::kUpsert));
    EXPECT_EQ(store->Stats().in_place_upserts, 0u);
    EXPECT_EQ(store->Stats().realloc_upserts, 1u);
    // The lease still reads version 1, untouched; the store serves version 2.
    auto held = lease->Bytes(0);
    EXPECT_TRUE(std::equal(held.begin(), held.end(), old.begin(), old.end()));
    EXPECT_EQ(lease->info().metadata, "meta-1");
    EXPECT_EQ(ReadBlob(*store, "k"), Blob(8 * kKiB, 2)[0].bytes);
    EXPECT_EQ(store->Stats().used_bytes, 16 * kKiB);
    // Releasing the lease frees version 1's extent.
    *lease = ObjectLease();
    EXPECT_EQ(store->Stats().used_bytes, 8 * kKiB);
    EXPECT_EQ(store->Stats().leases, 0u);
    // A different size always reallocates.
    MCS_ASSERT_OK(PutBlob(*store, "k", 4 * kKiB, 3, PutMode::kUpsert));
    EXPECT_EQ(store->Stats().realloc_upserts, 2u);
    EXPECT_EQ(store->Stats().used_bytes, 4 * kKiB);
}

TEST(ShmStoreTest, EvictsLeastRecentlyUsedUnpinnedUnleasedEntriesFirst) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    MCS_ASSERT_OK(PutBlob(*store, "pinned", 16 * kKiB, 0, PutMode::kCreate, /*pin=*/true));
    MCS_ASSERT_OK(PutBlob(*store, "a", 16 * kKiB, 1));
    MCS_ASSERT_OK(PutBlob(*store, "b", 16 * kKiB, 2));
    MCS_ASSERT_OK(PutBlob(*store, "c", 16 * kKiB, 3));
    ASSERT_FALSE(ReadBlob(*store, "a").empty());  // a is now more recent than b and c
    auto lease_b = store->Lease("b");             // and b is leased
    ASSERT_TRUE(lease_b.ok());

    MCS_ASSERT_OK(PutBlob(*store, "d", 16 * kKiB, 4));
    EXPECT_THAT(Keys(*store), ElementsAre("a", "b", "d", "pinned"));  // c: oldest evictable
    MCS_ASSERT_OK(PutBlob(*store, "e", 16 * kKiB, 5));
    EXPECT_THAT(Keys(*store), ElementsAre("b", "d", "e", "pinned"));  // then a
    EXPECT_EQ(store->Stats().evictions, 2u);
    EXPECT_EQ(store->Stats().evicted_bytes, 32 * kKiB);
    // The pinned and the leased one survive; their bytes are intact.
    EXPECT_EQ(ReadBlob(*store, "pinned"), Blob(16 * kKiB, 0)[0].bytes);
    EXPECT_EQ(ReadBlob(*store, "b"), Blob(16 * kKiB, 2)[0].bytes);
}

TEST(ShmStoreTest, QuotaExhaustionLeavesTheStoreUnchanged) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    MCS_ASSERT_OK(PutBlob(*store, "pinned", 32 * kKiB, 0, PutMode::kCreate, true));
    MCS_ASSERT_OK(PutBlob(*store, "cache", 16 * kKiB, 1));
    const auto keys = Keys(*store);
    const auto before = store->Stats();
    // 40 KiB: 16 free + 16 evictable < 40, so nothing may be evicted for a failure.
    EXPECT_THAT(PutBlob(*store, "big", 40 * kKiB, 2), StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(PutBlob(*store, "cache", 40 * kKiB, 2, PutMode::kUpsert),
                StatusIs(StatusCode::kResourceExhausted));
    EXPECT_EQ(Keys(*store), keys);
    EXPECT_EQ(store->Stats().used_bytes, before.used_bytes);
    EXPECT_EQ(store->Stats().evictions, 0u);
    EXPECT_EQ(ReadBlob(*store, "cache"), Blob(16 * kKiB, 1)[0].bytes);
    EXPECT_EQ(store->Stat("cache")->version, 1u);
    // Larger than a segment: refused up front.
    EXPECT_THAT(PutBlob(*store, "huge", 65 * kKiB, 2), StatusIs(StatusCode::kResourceExhausted));
}

TEST(ShmStoreTest, MetadataBoundIsEnforced) {
    auto store = MakeStore(64 * kKiB, 1, /*metadata_capacity=*/4096);
    ASSERT_NE(store, nullptr);
    Status s;
    int stored = 0;
    for (; stored < 1000; ++stored) {
        s = store->Put("key" + std::to_string(stored), std::string(300, 'm'), {}, {});
        if (!s.ok()) break;
    }
    EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted));
    EXPECT_GT(stored, 0);
    EXPECT_EQ(store->Stats().objects, static_cast<std::uint64_t>(stored));
    MCS_ASSERT_OK(store->Remove("key0"));
    MCS_EXPECT_OK(store->Put("again", std::string(300, 'm'), {}, {}));
}

TEST(ShmStoreTest, LeaseViewedHoldsTheViewedVersionWithoutALookup) {
    auto store = MakeStore(64 * kKiB);
    auto other = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    ASSERT_NE(other, nullptr);
    MCS_ASSERT_OK(PutBlob(*store, "k", 8 * kKiB, 1));
    MCS_ASSERT_OK(PutBlob(*other, "k", 8 * kKiB, 1));
    const std::vector<std::byte> old = Blob(8 * kKiB, 1)[0].bytes;
    std::uint64_t offset = 0;
    {
        auto plain = store->Lease("k");
        ASSERT_TRUE(plain.ok());
        offset = plain->member_offset(0);
    }
    ObjectLease held;
    const std::string_view keys[] = {"k"};
    MCS_ASSERT_OK(store->ViewObjects(keys, [&](std::span<const ObjectView> views) -> Status {
        MCS_ASSIGN_OR_RETURN(held, store->LeaseViewed(views[0]));
        EXPECT_EQ(held.Bytes(0).data(), views[0].members[0].data());
        // A view of another store, or no store's, is refused.
        EXPECT_THAT(other->LeaseViewed(views[0]), StatusIs(StatusCode::kInvalidArgument));
        EXPECT_THAT(store->LeaseViewed(ObjectView{}), StatusIs(StatusCode::kInvalidArgument));
        return Status::Ok();
    }));
    // The lease outlives the view and counts as one: an upsert moves the key elsewhere and
    // leaves the leased bytes as they were.
    ASSERT_TRUE(held.valid());
    EXPECT_EQ(held.member_offset(0), offset);
    EXPECT_EQ(store->Stats().leases, 1u);
    MCS_ASSERT_OK(PutBlob(*store, "k", 8 * kKiB, 2, PutMode::kUpsert));
    EXPECT_EQ(store->Stats().in_place_upserts, 0u);
    EXPECT_EQ(store->Stats().realloc_upserts, 1u);
    const auto bytes = held.Bytes(0);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), old.begin(), old.end()));
    EXPECT_EQ(held.info().metadata, "meta-1");
    held = ObjectLease();
    EXPECT_EQ(store->Stats().leases, 0u);
    EXPECT_EQ(store->Stats().used_bytes, 8 * kKiB);
}

TEST(ShmStoreTest, PublishIsReachableOnlyThroughItsLease) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    const auto members = Blob(10 * kKiB, 7);
    auto lease = store->Publish("target/x", "{}", Views(members));
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    EXPECT_TRUE(Keys(*store).empty());
    EXPECT_EQ(lease->info().key, "target/x");
    auto bytes = lease->Bytes(0);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), members[0].bytes.begin()));
    EXPECT_EQ(store->Stats().leases, 1u);
    EXPECT_GE(store->Stats().used_bytes, 10 * kKiB);
    *lease = ObjectLease();
    EXPECT_EQ(store->Stats().used_bytes, 0u);
    EXPECT_EQ(store->Stats().leases, 0u);
}

TEST(ShmStoreTest, LeaseKeepsSegmentsMappedAfterTheStoreIsGone) {
    ObjectLease lease;
    {
        auto store = MakeStore(64 * kKiB);
        ASSERT_NE(store, nullptr);
        MCS_ASSERT_OK(PutBlob(*store, "k", 1 * kKiB, 4));
        auto l = store->Lease("k");
        ASSERT_TRUE(l.ok());
        lease = std::move(l).value();
    }
    auto bytes = lease.Bytes(0);
    const auto expected = Blob(1 * kKiB, 4)[0].bytes;
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), expected.begin(), expected.end()));
}

TEST(ShmStoreTest, InvalidInputIsRejected) {
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    const auto members = Blob(64, 1);
    EXPECT_THAT(store->Put("", "", Views(members), {}), StatusIs(StatusCode::kInvalidArgument));
    std::vector<MemberData> dup = {Views(members)[0], Views(members)[0]};
    EXPECT_THAT(store->Put("k", "", dup, {}), StatusIs(StatusCode::kInvalidArgument));
    std::vector<MemberData> wrong = Views(members);
    wrong[0].shape = {65};
    EXPECT_THAT(store->Put("k", "", wrong, {}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store->Put("k", "", Views(members), {static_cast<PutMode>(9), false}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_TRUE(Keys(*store).empty());
    ShmStoreOptions bad;
    bad.segment_size = 1000;
    EXPECT_THAT(ShmStore::Create(bad), StatusIs(StatusCode::kInvalidArgument));
    bad.segment_size = PageSize();
    bad.num_segments = 0;
    EXPECT_THAT(ShmStore::Create(bad), StatusIs(StatusCode::kInvalidArgument));
}

TEST(ShmStoreTest, PutEachIsPutOfEachItemInOrder) {
    ExpectPutEachIsPutInOrderOnFreshStores([] { return MakeStore(64 * kKiB, 2); },
                                           [](ShmStore& each, ShmStore& serial) {
                                               EXPECT_EQ(each.Stats().objects,
                                                         serial.Stats().objects);
                                           });
}

TEST(ShmStoreTest, PutEachRefusesWhatPassesTheMetadataBoundAndFreesItsExtent) {
    // Past the metadata bound, items are ResourceExhausted as Puts in order would be, and the
    // extents built for them return to the allocator.
    std::vector<std::string> keys;
    std::vector<std::vector<MemberData>> members;
    std::vector<OwnedMember> owned;
    const std::vector<EachPut> items = EachBatch(200, keys, members, owned);
    auto each = MakeStore(64 * kKiB, 1, /*metadata_capacity=*/8192);
    auto serial = MakeStore(64 * kKiB, 1, /*metadata_capacity=*/8192);
    ASSERT_NE(each, nullptr);
    ASSERT_NE(serial, nullptr);
    for (ObjectStore* s : {static_cast<ObjectStore*>(each.get()),
                           static_cast<ObjectStore*>(serial.get())}) {
        MCS_ASSERT_OK(s->Put("held", "before", {}, Create()));
    }
    ExpectPutEachIsPutInOrder(*each, *serial, items, 4);
    EXPECT_EQ(each->Stats().objects, serial->Stats().objects);
    EXPECT_EQ(each->Stats().used_bytes, serial->Stats().used_bytes);
}

TEST(ShmStoreTest, PutEachOfUpsertsWithMembersPutsEachItem) {
    // An upsert with members may be rewritten in place by Put: such a batch takes Put's path.
    auto store = MakeStore(64 * kKiB);
    ASSERT_NE(store, nullptr);
    const OwnedMember a = PatternMember("m", DType::kUInt8, {64}, 1);
    const OwnedMember b = PatternMember("m", DType::kUInt8, {64}, 2);
    MCS_ASSERT_OK(store->Put("k", "v1", std::vector<MemberData>{a.View()}, Create()));
    const std::vector<MemberData> mb = {b.View()};
    const std::vector<EachPut> items = {{"k", "v2", mb, Upsert()}, {"j", "v1", mb, Create()}};
    const std::vector<Status> out = store->PutEach(items, 4);
    MCS_EXPECT_OK(out[0]);
    MCS_EXPECT_OK(out[1]);
    std::vector<std::byte> got(64);
    MCS_ASSERT_OK(store->ReadMember("k", "m", got));
    EXPECT_EQ(got, b.bytes);
    EXPECT_EQ(store->Stats().in_place_upserts, 1u);
}

}  // namespace
}  // namespace mooncake::sparse
