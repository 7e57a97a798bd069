// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// ObjectStore: the storage contract the sparse layer needs (docs/design.md §2, §4, §6). A structured
// object is metadata (bytes, opaque to the store) plus named members, each with dtype, shape
// and checksum. The interface is deliberately small so that it maps onto upstream Mooncake's
// public Store API: a member is a key written with put_from/batch_put_from_multi_buffers, the
// metadata key is written last (atomic visibility), range reads map to get_into_ranges,
// PutMode::kUpsert to upsert_from and hard_pin to ReplicateConfig.with_hard_pin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

class PinnedHostPool;

/// One member to write.
struct MemberData {
    std::string name;
    DType dtype = DType::kUInt8;
    Shape shape;  ///< Axis 0 is the row axis that range reads address.
    std::span<const std::byte> bytes;
    std::uint64_t checksum = 0;
};

/// One member as stored.
struct MemberInfo {
    std::string name;
    DType dtype = DType::kUInt8;
    Shape shape;
    std::uint64_t size_bytes = 0;
    std::uint64_t checksum = 0;

    /// Bytes of one row along axis 0 (the product of the other extents times the dtype size).
    std::uint64_t RowBytes() const;
};

struct ObjectInfo {
    std::string key;
    std::string metadata;
    std::vector<MemberInfo> members;
    std::uint64_t version = 0;  ///< Increases with every successful Put of this key.
    bool hard_pinned = false;

    const MemberInfo* FindMember(std::string_view name) const;
};

enum class PutMode : std::uint8_t {
    kCreate = 0,  ///< Fails with Conflict when the key exists (exclusive create: admission).
    kUpsert = 1,  ///< Creates or replaces; readers see the old object or the new one, never a mix.
};

struct PutOptions {
    PutMode mode = PutMode::kCreate;
    bool hard_pin = false;  ///< Never evicted.
    /// False: the key is never listed (List need not find it), so a store that keeps listing
    /// state per directory (upstream Mooncake has no listing of its own) need not record it.
    bool listed = true;
};

/// One object of ObjectStore::PutEach: Put's arguments.
struct EachPut {
    std::string_view key;
    std::string_view metadata;
    std::span<const MemberData> members;
    PutOptions options;
};

/// Copy rows [row_start, row_end) of one member into `dst` (exactly the rows' bytes).
struct RangeRead {
    std::string_view key;
    std::string_view member;
    std::uint64_t row_start = 0;
    std::uint64_t row_end = 0;
    std::span<std::byte> dst;
};

/// Where the rows of a range read lie in its object: the member's index in
/// ObjectInfo::members, and the byte offset and count of the rows in it.
struct RangeSlice {
    std::size_t member = 0;
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
};

struct ObjectInfo;

/// The checks every store makes of read `index` of a ReadRanges batch against its object.
/// Errors: NotFound (no such member); OutOfRange (rows outside the member); InvalidArgument
/// (the destination is not exactly the rows' bytes).
Result<RangeSlice> LocateRangeRead(const RangeRead& read, std::size_t index,
                                   const ObjectInfo& info);


/// One member of a PutFilled: MemberData without the bytes, which the fill callback writes.
struct MemberSpec {
    std::string name;
    DType dtype = DType::kUInt8;
    Shape shape;
    std::uint64_t checksum = 0;
};

/// One object of a PutFilled batch.
struct FilledPut {
    std::string_view key;
    std::string_view metadata;
    std::span<const MemberSpec> members;
};

/// The memory of one not-yet-visible object of a PutFilled batch: `members[m]` is exactly the
/// bytes of member m, in the object's final location (no staging).
struct FillTarget {
    std::size_t index = 0;  ///< Into the PutFilled batch.
    std::span<const std::span<std::byte>> members;
    bool pinned = false;  ///< Page-locked: the CUDA copy engine runs at full speed on it.
};

/// Writes every target's member bytes (e.g. memcpy, or a device-to-host copy that has completed
/// when it returns). An error abandons the whole batch: nothing becomes visible.
using FillFn = std::function<Status(std::span<const FillTarget> targets)>;

/// An immutable view of one object version, valid only during the ViewFn call.
struct ObjectView {
    const ObjectInfo* info = nullptr;
    std::span<const std::span<const std::byte>> members;  ///< Same order as info->members.
    bool pinned = false;  ///< The bytes are page-locked.
    /// The viewing store's own reference to the version viewed (null where it keeps none):
    /// what a store-specific call during the ViewFn takes instead of looking the key up again
    /// (ShmStore::LeaseViewed). `store` names the store that set it.
    const void* store = nullptr;
    const void* handle = nullptr;
};

/// Reads the views (all taken from one state of the store); its Status is ViewObjects' result.
using ViewFn = std::function<Status(std::span<const ObjectView> views)>;

/// Traffic counters of a store (monotonic).
struct StoreCounters {
    std::uint64_t puts = 0;
    std::uint64_t bytes_put = 0;
    std::uint64_t member_gets = 0;     ///< Whole-member reads.
    std::uint64_t member_bytes = 0;
    std::uint64_t range_reads = 0;     ///< RangeRead items served.
    std::uint64_t range_bytes = 0;
    std::uint64_t removes = 0;
    /// ViewObjects of a distributed store: objects whose chosen replica is in this process's own
    /// memory (viewed in place), objects read from another node's replica (and their bytes),
    /// and the batched network transfers those reads and PutFilled batches took.
    std::uint64_t local_views = 0;
    std::uint64_t remote_views = 0;
    std::uint64_t remote_view_bytes = 0;
    std::uint64_t batch_transfers = 0;
};

class ObjectStore {
public:
    virtual ~ObjectStore() = default;

    /// Writes an object with atomic visibility. Member names must be unique and non-empty;
    /// every member's bytes must equal prod(shape) * dtype size.
    /// Errors: InvalidArgument; Conflict (kCreate on an existing key); ResourceExhausted.
    virtual Status Put(std::string_view key, std::string_view metadata,
                       std::span<const MemberData> members, const PutOptions& options) = 0;

    /// Puts every item as Put would, each alone: the result's [i] is item i's status, with
    /// Put's errors. Items take effect in order (a key given twice is two Puts in order). A
    /// batch of a step's small objects (its sources, manifest entries and heads): stores that
    /// hold objects in this process build them on up to `num_threads` threads (0: every
    /// hardware thread) and make them visible under one lock, once built (a conflict is then
    /// found after the copy). The base implementation Puts each item.
    virtual std::vector<Status> PutEach(std::span<const EachPut> items, int /*num_threads*/) {
        std::vector<Status> out;
        out.reserve(items.size());
        for (const EachPut& item : items) {
            out.push_back(Put(item.key, item.metadata, item.members, item.options));
        }
        return out;
    }

    /// Metadata and member table of an object.
    /// Errors: NotFound.
    virtual Result<ObjectInfo> Stat(std::string_view key) = 0;

    /// Stat without the copy where the store can share its own immutable copy (the embedded and
    /// shared-memory stores); the base implementation wraps Stat. The info stays valid as long
    /// as the pointer.
    /// Errors: NotFound.
    virtual Result<std::shared_ptr<const ObjectInfo>> StatShared(std::string_view key) {
        MCS_ASSIGN_OR_RETURN(ObjectInfo info, Stat(key));
        return std::make_shared<const ObjectInfo>(std::move(info));
    }

    /// StatShared for a lookup that expects to miss as often as not (a commit's idempotence
    /// check, a tensor's first head): null when there is no such object, without the NotFound
    /// error a miss of StatShared builds. The base implementation wraps StatShared.
    /// Errors: those of StatShared other than NotFound.
    virtual Result<std::shared_ptr<const ObjectInfo>> Find(std::string_view key) {
        auto info = StatShared(key);
        if (!info.ok() && info.status().code() == StatusCode::kNotFound) {
            return std::shared_ptr<const ObjectInfo>();
        }
        return info;
    }

    /// Copies a whole member into `dst` (exactly its size): the index-only GET reads
    /// tile_coords and tile_ptr this way.
    /// Errors: NotFound; InvalidArgument (dst size).
    virtual Status ReadMember(std::string_view key, std::string_view member,
                              std::span<std::byte> dst) = 0;

    /// Batched aligned range reads into caller buffers. Every item is validated against one
    /// snapshot of the objects it names before any byte is copied: on error no destination
    /// has been written, and a concurrent upsert never mixes two versions within one call.
    /// Errors: NotFound; OutOfRange (rows past the member); InvalidArgument (dst size).
    virtual Status ReadRanges(std::span<const RangeRead> reads) = 0;

    /// ReadRanges whose copies may run on up to `num_threads` threads (0: every hardware
    /// thread; the caller's included) when the batch is large: the same validation against one
    /// snapshot, the same errors, the same bytes. Stores that copy in this process override it;
    /// the default is ReadRanges.
    virtual Status ReadRangesParallel(std::span<const RangeRead> reads, int /*num_threads*/) {
        return ReadRanges(reads);
    }

    /// Errors: NotFound.
    virtual Status Remove(std::string_view key) = 0;

    /// Keys starting with `prefix`, sorted.
    virtual Result<std::vector<std::string>> List(std::string_view prefix) = 0;

    /// List with each key's StatShared, in one pass where the store can (the embedded store
    /// walks its sorted keys once instead of looking each one up): a manifest reads every
    /// entry of a step. A key removed between the two is left out. The default: List, then
    /// StatShared per key.
    /// Errors: as List and StatShared (NotFound aside).
    virtual Result<std::vector<std::pair<std::string, std::shared_ptr<const ObjectInfo>>>>
    ListInfos(std::string_view prefix) {
        MCS_ASSIGN_OR_RETURN(std::vector<std::string> keys, List(prefix));
        std::vector<std::pair<std::string, std::shared_ptr<const ObjectInfo>>> out;
        out.reserve(keys.size());
        for (std::string& key : keys) {
            auto info = StatShared(key);
            if (!info.ok()) {
                if (info.status().code() == StatusCode::kNotFound) continue;  // removed meanwhile
                return info.status();
            }
            out.emplace_back(std::move(key), std::move(info).value());
        }
        return out;
    }

    /// Called once every key under `prefix` (a directory List takes, ending in '/') has been
    /// removed and none will be written again (a step freed by retention): a store that keeps
    /// listing state of its own per directory frees it. The default keeps none.
    virtual Status ForgetDirectory(std::string_view /*prefix*/) { return Status::Ok(); }

    virtual StoreCounters Counters() const = 0;

    /// Writes a batch of objects whose member bytes are produced by `fill` directly into the
    /// objects' own memory, then makes the whole batch visible at once (all or nothing). Every
    /// item is validated as Put validates it, and kCreate conflicts are detected, before `fill`
    /// runs; keys must be distinct. `host_pool` (may be null) is where a store that allocates
    /// host memory per object takes it from (the tensor layer's pinned pool).
    /// The base implementation stages the bytes in temporary buffers (from `host_pool` when
    /// given) and Puts each object (not atomic across items); stores with a direct path override
    /// it.
    /// Errors: as Put (InvalidArgument, Conflict, ResourceExhausted); whatever `fill` returns.
    virtual Status PutFilled(std::span<const FilledPut> puts, const PutOptions& options,
                             const FillFn& fill, PinnedHostPool* host_pool);

    /// Calls `fn` once with views of the current versions of `keys` (duplicates allowed), all
    /// from one state of the store and immutable while `fn` runs, so a reader can validate every
    /// item before copying any byte. The base implementation copies the objects (Stat +
    /// ReadMember) into temporary buffers first (from `host_pool` when given: pinned, so that
    /// a host-to-device copy out of them runs at full speed); stores with a direct path
    /// override it and ignore `host_pool`.
    /// Errors: NotFound (the first missing key); whatever `fn` returns.
    virtual Status ViewObjects(std::span<const std::string_view> keys, const ViewFn& fn,
                               PinnedHostPool* host_pool = nullptr);

    /// Whether ViewObjects views the stored bytes in place. False (the base implementation):
    /// it copies whole objects, so a reader that needs part of an object (a box of a tensor)
    /// reads that part with ReadRanges instead.
    virtual bool ViewsInPlace() const { return false; }

    /// Whether PutFilled fills the objects' own memory in this process, all or nothing (no
    /// staging copy, no per-item visibility): then a batch of puts is cheaper as one PutFilled.
    virtual bool FillsInPlace() const { return false; }
};

namespace internal {

inline constexpr std::size_t kMaxKeyBytes = 4096;
inline constexpr std::size_t kMaxMemberNameBytes = 4096;

/// Checks an object key: non-empty, at most kMaxKeyBytes, no NUL byte.
/// Errors: InvalidArgument.
Status ValidateObjectKey(std::string_view key);

/// Checks one member and returns its byte size: a valid name, a known dtype, rank >= 1, axis 0
/// >= 0 (an empty member has zero rows), every other extent >= 1, no overflow, and
/// bytes.size() == prod(shape) * dtype size. Every store validates members with it.
/// Errors: InvalidArgument.
Result<std::uint64_t> ValidateMemberData(const MemberData& member);

/// ValidateMemberData without the bytes: the byte size the member's shape and dtype need.
/// Errors: InvalidArgument.
Result<std::uint64_t> ValidateMemberSpec(const MemberSpec& member);

/// Below this many bytes a batch of range copies runs on the calling thread alone.
inline constexpr std::uint64_t kParallelCopyBytes = std::uint64_t{8} << 20;

/// Copies sources[i] into reads[i].dst for every i (sizes already checked equal), `total` bytes
/// in all: on the calling thread, or, from kParallelCopyBytes on with num_threads != 1, on up to
/// num_threads threads (0: the hardware's), as ParallelCopies cuts a batch.
void CopyRangeReads(std::span<const RangeRead> reads,
                    std::span<const std::span<const std::byte>> sources, std::uint64_t total,
                    int num_threads);

}  // namespace internal

struct EmbeddedStoreOptions {
    std::uint64_t capacity_bytes = 0;  ///< 0: unlimited. Put beyond it: ResourceExhausted.
};

/// The in-process default store: a map of immutable objects behind a shared mutex; an upsert
/// swaps a pointer, so readers never see a torn object.
///
/// Embedded specifics: capacity counts metadata plus member bytes of every stored object (an
/// upsert is charged its size minus the size of the object it replaces); nothing is evicted,
/// so hard_pin is recorded but changes nothing. A new key starts at version 1, or above every
/// version a removed object had, so a key written again after Remove never repeats a version.
std::unique_ptr<ObjectStore> MakeEmbeddedStore(const EmbeddedStoreOptions& options = {});

}  // namespace mooncake::sparse
