// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// ShmStore: the node daemon's ObjectStore over shared-memory segments (docs/design.md §5-6). Member
// payloads live in memfd segments that client processes map read-only, so a client reads a
// leased object zero-copy; metadata and the object table live in the daemon's heap.
//
// Why it is built this way:
// - Every object's members share ONE extent of one segment (64-byte aligned), so a lease is one
//   (segment, offsets) pair. Extents come from a first-fit free list per segment whose free
//   blocks are coalesced on release; the segments bound the capacity.
// - Objects are immutable once visible: the table maps a key to a shared_ptr, and a Put swaps
//   that pointer under the table lock. An extent is freed when the last reference goes (the
//   table, an in-flight read or a lease), so nobody ever reads memory that was reused.
// - An upsert of the same allocation size writes in place when nobody holds a lease on the
//   old object. An in-place rewrite holds the extent's lock exclusively from the first byte it
//   writes until the new table entry is installed, and bumps the extent's stamp; readers copy
//   under the shared lock and retry when the stamp of their snapshot is stale, so a reader sees
//   the old object or the new one, never a mix. With a lease held (a client may be reading the
//   mapped bytes without any lock) the upsert takes a fresh extent instead.
// - When an allocation does not fit, unpinned entries without leases are evicted, least
//   recently used first. If even evicting all of them could not free enough bytes, the Put
//   fails with ResourceExhausted before anything is evicted.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake/sparse/status.h"
#include "store/object_store.h"
#include "store/pinned_memory.h"
#include "store/segment_preparer.h"

namespace mooncake::sparse {

struct ShmStoreOptions {
    /// Bytes of one segment (a positive multiple of the page size). An object's members must
    /// fit in one segment.
    std::uint64_t segment_size = std::uint64_t{256} << 20;
    std::uint32_t num_segments = 4;
    /// Segment bytes to register with cudaHostRegister (in segment order) when CUDA is present;
    /// the rest stays pageable. 0: none.
    std::uint64_t pinned_quota_bytes = 0;
    /// Populate every segment page ahead of use (store/segment_preparer.h), so that a copy into
    /// fresh memory does not page-fault. Commits the whole capacity to RAM.
    bool prefault = true;
    /// Segments in transparent huge pages where the kernel gives shared memory those
    /// (ShmSegmentOptions::huge_pages).
    bool huge_pages = false;
    /// Threads that pre-fault and pin the segments.
    std::uint32_t prepare_threads = 4;
    /// Create returns at once and the segments are prepared in the background (a segment not
    /// yet pinned serves as pageable memory). False: Create waits until they are prepared.
    bool prepare_in_background = true;
    /// Stand-in for cudaHostRegister (tests); empty: the CUDA runtime.
    RegisterPinnedFn register_pinned;
    /// Bound on the daemon-heap bytes of keys, metadata and member tables.
    std::uint64_t metadata_capacity_bytes = std::uint64_t{256} << 20;
    /// Label of the memfd files (shows in /proc/<pid>/maps).
    std::string name = "mooncake_sparse";
};

/// One segment, as the server hands it to clients.
struct ShmSegmentDesc {
    std::uint32_t id = 0;
    std::uint64_t size = 0;
    std::uint64_t pinned_bytes = 0;  ///< Prefix registered with cudaHostRegister.
    int read_only_fd = -1;           ///< Owned by the store; send a copy (SCM_RIGHTS dups it).
};

struct ShmStoreStats {
    std::uint32_t segments = 0;
    std::uint64_t capacity_bytes = 0;      ///< Sum of segment sizes.
    std::uint64_t used_bytes = 0;          ///< Allocated extents (incl. replaced, still leased).
    std::uint64_t largest_free_bytes = 0;  ///< Largest allocation that fits right now.
    std::uint64_t objects = 0;             ///< Keys in the table.
    std::uint64_t metadata_bytes = 0;
    std::uint64_t leases = 0;  ///< Live leases (incl. published objects).
    std::uint64_t evictions = 0;
    std::uint64_t evicted_bytes = 0;
    std::uint64_t in_place_upserts = 0;
    std::uint64_t realloc_upserts = 0;
    std::uint64_t published_objects = 0;  ///< Publish calls (anonymous leased objects).
    std::uint64_t pinned_bytes = 0;  ///< Registered so far (grows while preparing).
    std::uint64_t pageable_bytes = 0;
    SegmentPreparation preparation;
};

namespace internal {
struct ShmExtent;
struct ShmObject;
struct ShmState;
}  // namespace internal

/// A read lease on one object: while it lives, the object's bytes stay where they are and are
/// never rewritten (an upsert reallocates, eviction skips it). Move-only; released by the
/// destructor. It keeps the segments mapped by itself, so it may outlive its store.
class ObjectLease {
public:
    ObjectLease() = default;
    ~ObjectLease();
    ObjectLease(ObjectLease&& other) noexcept;
    ObjectLease& operator=(ObjectLease&& other) noexcept;
    ObjectLease(const ObjectLease&) = delete;
    ObjectLease& operator=(const ObjectLease&) = delete;

    bool valid() const { return object_ != nullptr; }
    const ObjectInfo& info() const;
    /// The segment of every member (meaningless when the object has no member bytes).
    std::uint32_t segment_id() const;
    /// Byte offset of member i within its segment.
    std::uint64_t member_offset(std::size_t i) const;
    /// Member i's bytes in this process's writable mapping (the daemon side).
    std::span<const std::byte> Bytes(std::size_t i) const;

private:
    friend class ShmStore;
    explicit ObjectLease(std::shared_ptr<const internal::ShmObject> object);

    std::shared_ptr<const internal::ShmObject> object_;
};

class ShmStore final : public ObjectStore {
public:
    /// Creates and maps the segments, then pre-faults them and pins a prefix of them when CUDA
    /// is present: in the background unless `prepare_in_background` is false.
    /// Errors: InvalidArgument (segment_size, num_segments); Unavailable (memfd/mmap failed).
    static Result<std::unique_ptr<ShmStore>> Create(const ShmStoreOptions& options);

    ~ShmStore() override;
    ShmStore(const ShmStore&) = delete;
    ShmStore& operator=(const ShmStore&) = delete;

    /// ObjectStore. Put errors as documented there; ResourceExhausted when the members do not
    /// fit (after evicting what may be evicted) or the metadata bound is reached.
    Status Put(std::string_view key, std::string_view metadata,
               std::span<const MemberData> members, const PutOptions& options) override;
    /// Each object validated, placed and copied into a fresh extent in parallel, then the batch
    /// installed under one table lock, item by item as Put installs one. A batch that upserts
    /// members (which Put may rewrite in place) Puts each item instead.
    std::vector<Status> PutEach(std::span<const EachPut> items, int num_threads) override;
    Result<ObjectInfo> Stat(std::string_view key) override;
    Result<std::shared_ptr<const ObjectInfo>> StatShared(std::string_view key) override;
    Status ReadMember(std::string_view key, std::string_view member,
                      std::span<std::byte> dst) override;
    Status ReadRanges(std::span<const RangeRead> reads) override {
        return ReadRangesParallel(reads, 1);
    }
    Status ReadRangesParallel(std::span<const RangeRead> reads, int num_threads) override;
    Status Remove(std::string_view key) override;
    Result<std::vector<std::string>> List(std::string_view prefix) override;
    StoreCounters Counters() const override;
    /// Direct path: every object gets a fresh extent (never the in-place rewrite, so a failed
    /// fill cannot touch a visible object), `fill` writes straight into segment memory
    /// (FillTarget::pinned when the extent lies in the registered prefix of its segment), and
    /// the batch is installed under one table lock. `host_pool` is not used.
    Status PutFilled(std::span<const FilledPut> puts, const PutOptions& options,
                     const FillFn& fill, PinnedHostPool* host_pool) override;
    /// Direct path: snapshots every key under one table lock and holds a lease on each extent
    /// (no in-place rewrite, no eviction) while `fn` reads segment memory in place.
    Status ViewObjects(std::span<const std::string_view> keys, const ViewFn& fn,
                       PinnedHostPool* host_pool = nullptr) override;
    bool ViewsInPlace() const override { return true; }
    bool FillsInPlace() const override { return true; }

    /// Leases the current version of `key` for zero-copy reads.
    /// Errors: NotFound.
    Result<ObjectLease> Lease(std::string_view key);

    /// Leases the version a view of this store's ViewObjects shows, during its ViewFn call,
    /// without looking its key up again: the lease holds the bytes the view holds (even if
    /// the key has been upserted since the view was taken).
    /// Errors: InvalidArgument (not a view of this store).
    Result<ObjectLease> LeaseViewed(const ObjectView& view);

    /// Copies an object into segment memory WITHOUT a key: it is reachable only through the
    /// returned lease and freed when the lease goes (target-local objects handed to a client).
    /// `key_label` only names it in ObjectInfo::key and errors.
    /// Errors: InvalidArgument; ResourceExhausted.
    Result<ObjectLease> Publish(std::string_view key_label, std::string_view metadata,
                                std::span<const MemberData> members);

    std::vector<ShmSegmentDesc> Segments() const;
    ShmStoreStats Stats() const;
    /// Bytes of the segments that huge pages back now (ShmStoreOptions::huge_pages), read from
    /// /proc/self/smaps: for a log line, not a hot path. 0 where unreadable.
    std::uint64_t SegmentHugePageBytes() const;
    /// Waits until the segments are prepared (pre-faulted, pinned up to the quota). False on
    /// timeout.
    bool WaitPrepared(std::chrono::milliseconds timeout) const;
    const ShmStoreOptions& options() const { return options_; }

private:
    struct Layout;

    ShmStore(const ShmStoreOptions& options, std::shared_ptr<internal::ShmState> state);

    Result<Layout> Validate(std::string_view key, std::string_view metadata,
                            std::span<const MemberData> members) const;
    Result<Layout> ValidateSpecs(std::string_view key, std::string_view metadata,
                                 std::span<const MemberSpec> members) const;
    template <typename Member, typename SizeOf>
    Result<Layout> ValidateImpl(std::string_view key, std::string_view metadata,
                                std::span<const Member> members, SizeOf&& size_of) const;
    /// Writes an upsert into the old object's extent if that is allowed; false: take the
    /// realloc path. Errors: ResourceExhausted (metadata bound; nothing written).
    Result<bool> TryInPlace(std::string_view key, std::string_view metadata,
                            std::span<const MemberData> members, const PutOptions& options,
                            const Layout& layout);
    /// Allocates an extent, evicting unpinned unleased entries (LRU) when needed.
    Result<std::shared_ptr<internal::ShmExtent>> AllocateExtent(std::string_view key, std::uint64_t size);
    std::shared_ptr<const internal::ShmObject> Snapshot(std::string_view key) const;

    const ShmStoreOptions options_;
    std::shared_ptr<internal::ShmState> state_;
};

}  // namespace mooncake::sparse
