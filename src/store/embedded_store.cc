// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The embedded (in-process) ObjectStore: a sorted map of immutable objects behind a shared
// mutex (docs/design.md §6, "embedded default").
//
// Why it is built this way:
// - An object is never modified once it is visible. Put copies the caller's bytes into a new
//   object entirely outside the lock and then swaps one shared_ptr under the exclusive lock, so
//   a reader sees the old object or the new one, never a mix, and the exclusive section is a
//   map update (no memcpy, no allocation of payload, no free of payload).
// - Readers take the shared lock only to copy shared_ptrs (snapshots); the payload copies run
//   outside the lock, and the snapshots keep the bytes alive while a concurrent upsert or
//   Remove replaces the map entry.
// - ReadRanges resolves every key of the batch under ONE shared lock, so the whole batch sees
//   one consistent state of the store, and validates every item before copying any byte.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store/keyed_map.h"
#include "store/object_store.h"
#include "transport/parallel_for.h"
#include "transport/pinned_pool.h"

namespace mooncake::sparse {
namespace {

/// Member payloads start on cache-line boundaries inside an object's single allocation.
constexpr std::uint64_t kMemberAlignment = 64;
/// A Put of at least this many payload bytes checks for conflicts and capacity before it copies.
constexpr std::uint64_t kEarlyCheckBytes = 64 << 10;
/// A PutEach of fewer items builds them on the caller's thread.
constexpr std::size_t kEachParallelItems = 64;

std::string Quote(std::string_view s) {
    constexpr std::size_t kMaxShown = 200;
    std::string out = "'";
    if (s.size() > kMaxShown) {
        out.append(s.substr(0, kMaxShown));
        out += "...";
    } else {
        out.append(s);
    }
    out += "'";
    return out;
}

/// LocateRangeRead's checks without its error text: false where LocateRangeRead fails.
bool LocateRangeReadQuietly(const RangeRead& r, const ObjectInfo& info, RangeSlice& out) {
    const MemberInfo* m = info.FindMember(r.member);
    if (m == nullptr) return false;
    const auto rows = static_cast<std::uint64_t>(m->shape.empty() ? 0 : m->shape[0]);
    if (r.row_start > r.row_end || r.row_end > rows) return false;
    const std::uint64_t row_bytes = m->RowBytes();
    const std::uint64_t bytes = (r.row_end - r.row_start) * row_bytes;
    if (r.dst.size() != bytes) return false;
    out = {static_cast<std::size_t>(m - info.members.data()), r.row_start * row_bytes, bytes};
    return true;
}

/// An immutable object: its table plus one allocation that holds every member's payload.
struct Object {
    ObjectInfo info;
    HostBuffer data;  ///< Pinned when it came from a PutFilled host pool with quota left.
    std::uint64_t charged_bytes = 0;  ///< What it counts against capacity: metadata + members.

    /// Where member `member_index` starts in `data`: the members in order, each on a
    /// kMemberAlignment boundary (computed, not kept: an object has a handful of members, and a
    /// vector of offsets would be one more allocation per object).
    std::uint64_t Offset(std::size_t member_index) const {
        std::uint64_t offset = 0;
        for (std::size_t i = 0; i < member_index; ++i) {
            offset = (offset + info.members[i].size_bytes + kMemberAlignment - 1) /
                     kMemberAlignment * kMemberAlignment;
        }
        return offset;
    }
    std::span<const std::byte> Bytes(std::size_t member_index) const {
        const MemberInfo& m = info.members[member_index];
        if (m.size_bytes == 0) return {};
        return {data.data() + Offset(member_index), static_cast<std::size_t>(m.size_bytes)};
    }
    std::span<std::byte> MutableBytes(std::size_t member_index) {
        const MemberInfo& m = info.members[member_index];
        if (m.size_bytes == 0) return {};
        return {data.data() + Offset(member_index), static_cast<std::size_t>(m.size_bytes)};
    }

    /// Index of a member in info.members, or -1.
    std::ptrdiff_t MemberIndex(std::string_view name) const {
        const MemberInfo* m = info.FindMember(name);
        return m ? m - info.members.data() : -1;
    }
};

using ObjectPtr = std::shared_ptr<const Object>;

void CopyBytes(std::span<std::byte> dst, std::span<const std::byte> src) {
    // memcpy with a null pointer is undefined even for zero bytes.
    if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size());
}

class EmbeddedStore final : public ObjectStore {
public:
    explicit EmbeddedStore(const EmbeddedStoreOptions& options) : options_(options) {}

    ~EmbeddedStore() override = default;
    EmbeddedStore(const EmbeddedStore&) = delete;
    EmbeddedStore& operator=(const EmbeddedStore&) = delete;

    Status Put(std::string_view key, std::string_view metadata,
               std::span<const MemberData> members, const PutOptions& options) override;
    /// Each object validated and built (its memory allocated and copied) in parallel, then the
    /// batch installed under one exclusive lock, item by item as Put installs one.
    std::vector<Status> PutEach(std::span<const EachPut> items, int num_threads) override;
    Result<ObjectInfo> Stat(std::string_view key) override;
    Result<std::shared_ptr<const ObjectInfo>> StatShared(std::string_view key) override;
    Result<std::shared_ptr<const ObjectInfo>> Find(std::string_view key) override;
    Status ReadMember(std::string_view key, std::string_view member,
                      std::span<std::byte> dst) override;
    Status ReadRanges(std::span<const RangeRead> reads) override {
        return ReadRangesParallel(reads, 1);
    }
    Status ReadRangesParallel(std::span<const RangeRead> reads, int num_threads) override;
    Status Remove(std::string_view key) override;
    Result<std::vector<std::pair<std::string, std::shared_ptr<const ObjectInfo>>>> ListInfos(
        std::string_view prefix) override;
    Result<std::vector<std::string>> List(std::string_view prefix) override;
    StoreCounters Counters() const override;
    Status PutFilled(std::span<const FilledPut> puts, const PutOptions& options,
                     const FillFn& fill, PinnedHostPool* host_pool) override;
    Status ViewObjects(std::span<const std::string_view> keys, const ViewFn& fn,
                       PinnedHostPool* host_pool = nullptr) override;
    bool ViewsInPlace() const override { return true; }
    bool FillsInPlace() const override { return true; }

private:
    /// What Validate learns about a request.
    struct Plan {
        std::vector<std::uint64_t> sizes;  ///< Per member.
        std::uint64_t member_bytes = 0;
        std::uint64_t charged = 0;       ///< Counted against capacity: metadata + members.
        std::uint64_t padded_total = 0;  ///< The allocation, members aligned.
    };

    /// Checks a Put request without looking at the store's contents.
    /// Errors: InvalidArgument; ResourceExhausted (larger than the whole capacity).
    Result<Plan> Validate(std::string_view key, std::string_view metadata,
                          std::span<const MemberData> members, const PutOptions& options) const;
    /// The same for a PutFilled item (no bytes yet).
    Result<Plan> ValidateSpecs(std::string_view key, std::string_view metadata,
                               std::span<const MemberSpec> members,
                               const PutOptions& options) const;
    /// The shared part: `size_of(i)` validates member i and returns its byte size.
    template <typename SizeOf>
    Result<Plan> ValidateImpl(std::string_view key, std::string_view metadata, std::size_t count,
                              const PutOptions& options, SizeOf&& size_of) const;

    /// Copies a validated request into a new, not yet versioned, object.
    /// Errors: ResourceExhausted (allocation failed).
    static Result<std::shared_ptr<Object>> Build(std::string_view key, std::string_view metadata,
                                                 std::span<const MemberData> members,
                                                 const PutOptions& options, const Plan& plan);
    /// A new, not yet versioned, object whose member bytes are not written yet; its memory comes
    /// from `pool` when given.
    /// Errors: ResourceExhausted.
    static Result<std::shared_ptr<Object>> Allocate(std::string_view key, std::string_view metadata,
                                                    std::span<const MemberSpec> members,
                                                    const PutOptions& options, const Plan& plan,
                                                    PinnedHostPool* pool);

    /// Whether `charged` more bytes fit once `released` bytes are given back. Needs mu_.
    bool Fits(std::uint64_t charged, std::uint64_t released) const {
        if (options_.capacity_bytes == 0) return true;
        const std::uint64_t after = used_bytes_ - released;
        return charged <= options_.capacity_bytes && after <= options_.capacity_bytes - charged;
    }

    Status CapacityError(std::string_view key, std::uint64_t charged,
                         std::uint64_t released) const {
        return ResourceExhausted("object " + Quote(key) + " needs " + std::to_string(charged) +
                                 " bytes; the store holds " + std::to_string(used_bytes_) +
                                 " of " + std::to_string(options_.capacity_bytes) +
                                 " (replacing frees " + std::to_string(released) + ")");
    }

    ObjectPtr Snapshot(std::string_view key) const {
        std::shared_lock lock(mu_);
        auto it = objects_.find(key);
        return it == objects_.end() ? nullptr : it->second;
    }

    const EmbeddedStoreOptions options_;

    mutable std::shared_mutex mu_;
    internal::KeyedMap<ObjectPtr> objects_;  // Guarded by mu_.
    std::uint64_t used_bytes_ = 0;                            // Guarded by mu_.
    /// The highest version any removed object had: a new key starts above it, so a key that is
    /// removed and written again never repeats a version (no per-key tombstones are kept).
    std::uint64_t removed_version_floor_ = 0;  // Guarded by mu_.

    std::atomic<std::uint64_t> puts_{0};
    std::atomic<std::uint64_t> bytes_put_{0};
    std::atomic<std::uint64_t> member_gets_{0};
    std::atomic<std::uint64_t> member_bytes_{0};
    std::atomic<std::uint64_t> range_reads_{0};
    std::atomic<std::uint64_t> range_bytes_{0};
    std::atomic<std::uint64_t> removes_{0};
};

std::vector<Status> EmbeddedStore::PutEach(std::span<const EachPut> items, int num_threads) {
    const std::size_t n = items.size();
    std::vector<Status> out(n);
    std::vector<std::uint64_t> charged(n, 0), member_bytes(n, 0);
    std::vector<std::shared_ptr<Object>> built(n);
    // A few objects per task: each is a small allocation and copy.
    internal::ParallelFor(
        n < kEachParallelItems ? 1 : num_threads, n,
        [&](std::size_t i) {
            const EachPut& item = items[i];
            Result<Plan> plan = Validate(item.key, item.metadata, item.members, item.options);
            if (!plan.ok()) {
                out[i] = plan.status();
                return;
            }
            Result<std::shared_ptr<Object>> object =
                Build(item.key, item.metadata, item.members, item.options, *plan);
            if (!object.ok()) {
                out[i] = object.status();
                return;
            }
            charged[i] = plan->charged;
            member_bytes[i] = plan->member_bytes;
            built[i] = std::move(object).value();
        },
        /*chunk=*/0);
    std::vector<ObjectPtr> released;  // Replaced or refused: freed after the lock.
    std::uint64_t puts = 0, bytes = 0;
    {
        std::unique_lock lock(mu_);
        for (std::size_t i = 0; i < n; ++i) {
            if (!built[i]) continue;
            const std::string_view key = items[i].key;
            auto it = objects_.find(key);
            const bool exists = it != objects_.end();
            if (exists && items[i].options.mode == PutMode::kCreate) {
                out[i] = Conflict("object " + Quote(key) + " already exists");
                released.push_back(std::move(built[i]));
                continue;
            }
            const std::uint64_t freed = exists ? it->second->charged_bytes : 0;
            if (!Fits(charged[i], freed)) {
                out[i] = CapacityError(key, charged[i], freed);
                released.push_back(std::move(built[i]));
                continue;
            }
            std::shared_ptr<Object>& object = built[i];
            object->info.version =
                exists ? it->second->info.version + 1 : removed_version_floor_ + 1;
            used_bytes_ = used_bytes_ - freed + charged[i];
            if (exists) {
                released.push_back(std::exchange(it->second, std::move(object)));
            } else {
                objects_.emplace(std::string(key), std::move(object));
            }
            ++puts;
            bytes += member_bytes[i];
        }
    }
    puts_.fetch_add(puts, std::memory_order_relaxed);
    bytes_put_.fetch_add(bytes, std::memory_order_relaxed);
    return out;
}

Result<EmbeddedStore::Plan> EmbeddedStore::Validate(std::string_view key,
                                                    std::string_view metadata,
                                                    std::span<const MemberData> members,
                                                    const PutOptions& options) const {
    auto plan = ValidateImpl(key, metadata, members.size(), options, [&](std::size_t i) {
        return internal::ValidateMemberData(members[i]);
    });
    if (!plan.ok()) return plan.status();
    std::vector<std::string_view> names;
    names.reserve(members.size());
    for (const MemberData& m : members) names.push_back(m.name);
    std::sort(names.begin(), names.end());
    if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end()) {
        return InvalidArgument("object " + Quote(key) + ": member name " + Quote(*dup) +
                               " appears more than once");
    }
    return plan;
}

Result<EmbeddedStore::Plan> EmbeddedStore::ValidateSpecs(std::string_view key,
                                                         std::string_view metadata,
                                                         std::span<const MemberSpec> members,
                                                         const PutOptions& options) const {
    auto plan = ValidateImpl(key, metadata, members.size(), options, [&](std::size_t i) {
        return internal::ValidateMemberSpec(members[i]);
    });
    if (!plan.ok()) return plan.status();
    std::vector<std::string_view> names;
    names.reserve(members.size());
    for (const MemberSpec& m : members) names.push_back(m.name);
    std::sort(names.begin(), names.end());
    if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end()) {
        return InvalidArgument("object " + Quote(key) + ": member name " + Quote(*dup) +
                               " appears more than once");
    }
    return plan;
}

template <typename SizeOf>
Result<EmbeddedStore::Plan> EmbeddedStore::ValidateImpl(std::string_view key,
                                                        std::string_view metadata,
                                                        std::size_t count,
                                                        const PutOptions& options,
                                                        SizeOf&& size_of) const {
    MCS_RETURN_IF_ERROR(internal::ValidateObjectKey(key));
    if (options.mode != PutMode::kCreate && options.mode != PutMode::kUpsert) {
        return InvalidArgument("unknown PutMode value " +
                               std::to_string(static_cast<int>(options.mode)));
    }
    Plan plan;
    plan.sizes.reserve(count);
    plan.charged = metadata.size();
    for (std::size_t i = 0; i < count; ++i) {
        MCS_ASSIGN_OR_RETURN(std::uint64_t size, size_of(i));
        std::uint64_t padded = 0;
        if (__builtin_add_overflow(plan.charged, size, &plan.charged) ||
            __builtin_add_overflow(plan.padded_total, size + (kMemberAlignment - 1), &padded)) {
            return InvalidArgument("object " + Quote(key) + ": total member size overflows");
        }
        plan.padded_total = padded / kMemberAlignment * kMemberAlignment;
        plan.member_bytes += size;
        plan.sizes.push_back(size);
    }
    if (options_.capacity_bytes != 0 && plan.charged > options_.capacity_bytes) {
        return ResourceExhausted("object " + Quote(key) + " needs " +
                                 std::to_string(plan.charged) +
                                 " bytes, more than the store capacity of " +
                                 std::to_string(options_.capacity_bytes));
    }
    return plan;
}

Result<std::shared_ptr<Object>> EmbeddedStore::Allocate(std::string_view key,
                                                        std::string_view metadata,
                                                        std::span<const MemberSpec> members,
                                                        const PutOptions& options,
                                                        const Plan& plan, PinnedHostPool* pool) {
    auto object = std::make_shared<Object>();
    object->charged_bytes = plan.charged;
    if (plan.padded_total > 0) {
        auto buffer = pool != nullptr ? pool->Allocate(plan.padded_total)
                                      : HostBuffer::Pageable(plan.padded_total);
        if (!buffer.ok()) return buffer.status().WithContext("object " + Quote(key));
        object->data = std::move(buffer).value();
    }
    ObjectInfo& info = object->info;
    info.key.assign(key);
    info.metadata.assign(metadata);
    info.hard_pinned = options.hard_pin;
    info.members.reserve(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) {
        const MemberSpec& m = members[i];
        MemberInfo& mi = info.members.emplace_back();
        mi.name = m.name;
        mi.dtype = m.dtype;
        mi.shape = m.shape;
        mi.size_bytes = plan.sizes[i];
        mi.checksum = m.checksum;
    }
    return object;
}

Result<std::shared_ptr<Object>> EmbeddedStore::Build(std::string_view key,
                                                     std::string_view metadata,
                                                     std::span<const MemberData> members,
                                                     const PutOptions& options,
                                                     const Plan& plan) {
    auto object = std::make_shared<Object>();
    object->charged_bytes = plan.charged;
    if (plan.padded_total > 0) {
        auto buffer = HostBuffer::Pageable(plan.padded_total);
        if (!buffer.ok()) {
            return ResourceExhausted("object " + Quote(key) + ": cannot allocate " +
                                     std::to_string(plan.padded_total) + " bytes");
        }
        object->data = std::move(buffer).value();
    }
    ObjectInfo& info = object->info;
    info.key.assign(key);
    info.metadata.assign(metadata);
    info.hard_pinned = options.hard_pin;
    info.members.reserve(members.size());
    std::uint64_t offset = 0;  // Object::Offset's layout
    for (std::size_t i = 0; i < members.size(); ++i) {
        const MemberData& m = members[i];
        const std::uint64_t size = plan.sizes[i];
        MemberInfo& mi = info.members.emplace_back();
        mi.name = m.name;
        mi.dtype = m.dtype;
        mi.shape = m.shape;
        mi.size_bytes = size;
        mi.checksum = m.checksum;
        if (size > 0) std::memcpy(object->data.data() + offset, m.bytes.data(), size);
        offset = (offset + size + kMemberAlignment - 1) / kMemberAlignment * kMemberAlignment;
    }
    return object;
}

Status EmbeddedStore::Put(std::string_view key, std::string_view metadata,
                          std::span<const MemberData> members, const PutOptions& options) {
    MCS_ASSIGN_OR_RETURN(const Plan plan, Validate(key, metadata, members, options));

    // Early rejection before a large payload is copied. Each answer is true of one consistent
    // state of the store; the decisive checks repeat under the exclusive lock below. (Not for a
    // small object, such as a manifest entry or a head: its copy costs less than the lookup.)
    if (plan.padded_total >= kEarlyCheckBytes) {
        std::shared_lock lock(mu_);
        auto it = objects_.find(key);
        const bool exists = it != objects_.end();
        if (exists && options.mode == PutMode::kCreate) {
            return Conflict("object " + Quote(key) + " already exists");
        }
        const std::uint64_t released = exists ? it->second->charged_bytes : 0;
        if (!Fits(plan.charged, released)) return CapacityError(key, plan.charged, released);
    }

    // The copy runs with no lock held.
    MCS_ASSIGN_OR_RETURN(std::shared_ptr<Object> object,
                         Build(key, metadata, members, options, plan));

    ObjectPtr replaced;  // Released after the lock, so a large free never runs under it.
    {
        std::unique_lock lock(mu_);
        auto it = objects_.find(key);
        const bool exists = it != objects_.end();
        if (exists && options.mode == PutMode::kCreate) {
            return Conflict("object " + Quote(key) + " already exists");
        }
        const std::uint64_t released = exists ? it->second->charged_bytes : 0;
        if (!Fits(plan.charged, released)) return CapacityError(key, plan.charged, released);

        // Not yet visible to anyone: setting the version here is not a data race.
        object->info.version = exists ? it->second->info.version + 1 : removed_version_floor_ + 1;
        used_bytes_ = used_bytes_ - released + plan.charged;
        if (exists) {
            replaced = std::exchange(it->second, std::move(object));
        } else {
            objects_.emplace(std::string(key), std::move(object));
        }
    }
    puts_.fetch_add(1, std::memory_order_relaxed);
    bytes_put_.fetch_add(plan.member_bytes, std::memory_order_relaxed);
    return Status::Ok();
}

Status EmbeddedStore::PutFilled(std::span<const FilledPut> puts, const PutOptions& options,
                                const FillFn& fill, PinnedHostPool* host_pool) {
    if (puts.empty()) return Status::Ok();
    // 1. Validate every item; keys distinct.
    std::vector<Plan> plans;
    plans.reserve(puts.size());
    std::uint64_t charged = 0;
    std::uint64_t member_bytes = 0;
    for (const FilledPut& p : puts) {
        MCS_ASSIGN_OR_RETURN(Plan plan, ValidateSpecs(p.key, p.metadata, p.members, options));
        if (__builtin_add_overflow(charged, plan.charged, &charged)) {
            return InvalidArgument("the batch's total size overflows");
        }
        member_bytes += plan.member_bytes;
        plans.push_back(std::move(plan));
    }
    {
        std::vector<std::string_view> keys;
        keys.reserve(puts.size());
        for (const FilledPut& p : puts) keys.push_back(p.key);
        std::sort(keys.begin(), keys.end());
        if (auto dup = std::adjacent_find(keys.begin(), keys.end()); dup != keys.end()) {
            return InvalidArgument("key " + Quote(*dup) + " appears more than once in one batch");
        }
    }
    // 2. Early rejection (conflicts, capacity) before any memory is allocated or filled.
    // `found` (when given) keeps each key's entry for the install.
    using Entry = decltype(objects_.end());
    auto check = [&](std::vector<Entry>* found) -> Status {
        std::uint64_t released = 0;
        for (std::size_t i = 0; i < puts.size(); ++i) {
            auto it = objects_.find(puts[i].key);
            if (found != nullptr) (*found)[i] = it;
            if (it == objects_.end()) continue;
            if (options.mode == PutMode::kCreate) {
                return Conflict("object " + Quote(puts[i].key) + " already exists");
            }
            released += it->second->charged_bytes;
        }
        if (!Fits(charged, released)) {
            const std::string label = puts.size() == 1 ? std::string(puts[0].key)
                                                       : "batch of " + std::to_string(puts.size());
            return CapacityError(label, charged, released);
        }
        return Status::Ok();
    };
    {
        std::shared_lock lock(mu_);
        MCS_RETURN_IF_ERROR(check(nullptr));
    }
    // 3. Allocate the objects' final memory and let the caller fill it, with no lock held.
    std::vector<std::shared_ptr<Object>> objects;
    std::size_t member_count = 0;
    for (const FilledPut& p : puts) member_count += p.members.size();
    std::vector<std::span<std::byte>> spans;  // Every item's members, in order.
    spans.reserve(member_count);
    std::vector<FillTarget> targets(puts.size());
    objects.reserve(puts.size());
    for (std::size_t i = 0; i < puts.size(); ++i) {
        MCS_ASSIGN_OR_RETURN(auto object, Allocate(puts[i].key, puts[i].metadata, puts[i].members,
                                                   options, plans[i], host_pool));
        const std::size_t first = spans.size();
        for (std::size_t m = 0; m < puts[i].members.size(); ++m) {
            spans.push_back(object->MutableBytes(m));
        }
        targets[i] = {i, std::span<const std::span<std::byte>>(spans).subspan(
                             first, puts[i].members.size()),
                      object->data.pinned()};
        objects.push_back(std::move(object));
    }
    MCS_RETURN_IF_ERROR(fill(targets));
    // 4. Install the whole batch under one exclusive lock: all or nothing.
    std::vector<ObjectPtr> replaced;  // Released after the lock.
    std::vector<Entry> found(puts.size());
    {
        std::unique_lock lock(mu_);
        MCS_RETURN_IF_ERROR(check(&found));
        for (std::size_t i = 0; i < puts.size(); ++i) {
            const auto it = found[i];
            const bool exists = it != objects_.end();
            const std::uint64_t released = exists ? it->second->charged_bytes : 0;
            objects[i]->info.version =
                exists ? it->second->info.version + 1 : removed_version_floor_ + 1;
            used_bytes_ = used_bytes_ - released + plans[i].charged;
            if (exists) {
                replaced.push_back(std::exchange(it->second, std::move(objects[i])));
            } else {
                objects_.emplace(std::string(puts[i].key), std::move(objects[i]));
            }
        }
    }
    puts_.fetch_add(puts.size(), std::memory_order_relaxed);
    bytes_put_.fetch_add(member_bytes, std::memory_order_relaxed);
    return Status::Ok();
}

Status EmbeddedStore::ViewObjects(std::span<const std::string_view> keys, const ViewFn& fn,
                                  PinnedHostPool* /*host_pool*/) {
    std::vector<ObjectPtr> snapshots(keys.size());
    {
        std::shared_lock lock(mu_);
        for (std::size_t i = 0; i < keys.size(); ++i) {
            auto it = objects_.find(keys[i]);
            if (it == objects_.end()) {
                return NotFound("object " + Quote(keys[i]) + " not found");
            }
            snapshots[i] = it->second;
        }
    }
    // The snapshots are immutable and kept alive until fn returns.
    std::vector<std::vector<std::span<const std::byte>>> spans(keys.size());
    std::vector<ObjectView> views(keys.size());
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
        const Object& o = *snapshots[i];
        spans[i].reserve(o.info.members.size());
        for (std::size_t m = 0; m < o.info.members.size(); ++m) {
            spans[i].push_back(o.Bytes(m));
            bytes += o.info.members[m].size_bytes;
        }
        views[i] = {&o.info, spans[i], o.data.pinned()};
    }
    MCS_RETURN_IF_ERROR(fn(views));
    member_gets_.fetch_add(keys.size(), std::memory_order_relaxed);
    member_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    return Status::Ok();
}

Result<ObjectInfo> EmbeddedStore::Stat(std::string_view key) {
    ObjectPtr object = Snapshot(key);
    if (!object) return NotFound("object " + Quote(key) + " not found");
    return object->info;
}

Result<std::shared_ptr<const ObjectInfo>> EmbeddedStore::StatShared(std::string_view key) {
    ObjectPtr object = Snapshot(key);
    if (!object) return NotFound("object " + Quote(key) + " not found");
    // An object version never changes: its info lives as long as the snapshot.
    return std::shared_ptr<const ObjectInfo>(object, &object->info);
}

Result<std::shared_ptr<const ObjectInfo>> EmbeddedStore::Find(std::string_view key) {
    ObjectPtr object = Snapshot(key);
    if (!object) return std::shared_ptr<const ObjectInfo>();
    return std::shared_ptr<const ObjectInfo>(object, &object->info);
}

Status EmbeddedStore::ReadMember(std::string_view key, std::string_view member,
                                 std::span<std::byte> dst) {
    ObjectPtr object = Snapshot(key);
    if (!object) return NotFound("object " + Quote(key) + " not found");
    const std::ptrdiff_t index = object->MemberIndex(member);
    if (index < 0) {
        return NotFound("object " + Quote(key) + " has no member " + Quote(member));
    }
    std::span<const std::byte> src = object->Bytes(static_cast<std::size_t>(index));
    if (dst.size() != src.size()) {
        return InvalidArgument("member " + Quote(member) + " of object " + Quote(key) + " is " +
                               std::to_string(src.size()) + " bytes, destination is " +
                               std::to_string(dst.size()));
    }
    CopyBytes(dst, src);
    member_gets_.fetch_add(1, std::memory_order_relaxed);
    member_bytes_.fetch_add(src.size(), std::memory_order_relaxed);
    return Status::Ok();
}

Status EmbeddedStore::ReadRangesParallel(std::span<const RangeRead> reads, int num_threads) {
    if (reads.empty()) return Status::Ok();

    // 1. One shared lock: every key of the batch resolves against the same state of the store.
    //    `holders` keeps each distinct snapshot alive; `objects` is per item.
    std::vector<const Object*> objects(reads.size(), nullptr);
    std::vector<ObjectPtr> holders;
    std::size_t missing = reads.size();
    {
        std::shared_lock lock(mu_);
        for (std::size_t i = 0; i < reads.size(); ++i) {
            if (i > 0 && reads[i].key == reads[i - 1].key) {
                objects[i] = objects[i - 1];
            } else {
                auto it = objects_.find(reads[i].key);
                if (it != objects_.end()) {
                    holders.push_back(it->second);
                    objects[i] = it->second.get();
                }
            }
            if (objects[i] == nullptr) {
                missing = i;
                break;
            }
        }
    }
    if (missing != reads.size()) {
        return NotFound("range read " + std::to_string(missing) + ": object " +
                        Quote(reads[missing].key) + " not found");
    }

    // 2. Validate every item before any destination is written.
    std::vector<std::span<const std::byte>> sources(reads.size());
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < reads.size(); ++i) {
        const RangeRead& r = reads[i];
        const Object& object = *objects[i];
        RangeSlice slice{};
        if (!LocateRangeReadQuietly(r, object.info, slice)) {
            // Only a read that fails builds the error text (a batch holds ~1e6 reads).
            MCS_ASSIGN_OR_RETURN(slice, LocateRangeRead(r, i, object.info));
        }
        sources[i] = object.Bytes(slice.member)
                         .subspan(static_cast<std::size_t>(slice.offset),
                                  static_cast<std::size_t>(slice.bytes));
        total += slice.bytes;
    }

    // 3. Copy, outside the lock: the snapshots are immutable and kept alive by `holders`.
    internal::CopyRangeReads(reads, sources, total, num_threads);
    range_reads_.fetch_add(reads.size(), std::memory_order_relaxed);
    range_bytes_.fetch_add(total, std::memory_order_relaxed);
    return Status::Ok();
}

Status EmbeddedStore::Remove(std::string_view key) {
    ObjectPtr removed;  // Released after the lock.
    {
        std::unique_lock lock(mu_);
        std::optional<ObjectPtr> entry = objects_.extract(key);
        if (!entry) return NotFound("object " + Quote(key) + " not found");
        removed = std::move(*entry);
        used_bytes_ -= removed->charged_bytes;
        removed_version_floor_ = std::max(removed_version_floor_, removed->info.version);
    }
    removes_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
}

Result<std::vector<std::pair<std::string, std::shared_ptr<const ObjectInfo>>>>
EmbeddedStore::ListInfos(std::string_view prefix) {
    std::vector<std::pair<std::string, std::shared_ptr<const ObjectInfo>>> out;
    std::shared_lock lock(mu_);
    for (auto it = objects_.lower_bound(prefix);
         it != objects_.end() && std::string_view(it->first).starts_with(prefix); ++it) {
        // An object version never changes: its info lives as long as the snapshot.
        out.emplace_back(it->first, std::shared_ptr<const ObjectInfo>(it->second, &it->second->info));
    }
    return out;
}

Result<std::vector<std::string>> EmbeddedStore::List(std::string_view prefix) {
    std::vector<std::string> keys;
    std::shared_lock lock(mu_);
    for (auto it = objects_.lower_bound(prefix);
         it != objects_.end() && std::string_view(it->first).starts_with(prefix); ++it) {
        keys.push_back(it->first);
    }
    return keys;
}

StoreCounters EmbeddedStore::Counters() const {
    StoreCounters c;
    c.puts = puts_.load(std::memory_order_relaxed);
    c.bytes_put = bytes_put_.load(std::memory_order_relaxed);
    c.member_gets = member_gets_.load(std::memory_order_relaxed);
    c.member_bytes = member_bytes_.load(std::memory_order_relaxed);
    c.range_reads = range_reads_.load(std::memory_order_relaxed);
    c.range_bytes = range_bytes_.load(std::memory_order_relaxed);
    c.removes = removes_.load(std::memory_order_relaxed);
    return c;
}

}  // namespace

std::unique_ptr<ObjectStore> MakeEmbeddedStore(const EmbeddedStoreOptions& options) {
    return std::make_unique<EmbeddedStore>(options);
}

}  // namespace mooncake::sparse
