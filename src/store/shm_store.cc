// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The daemon-side ObjectStore over shared-memory segments (see shm_store.h for the design).
//
// Locks, in the only order they are ever nested:
//   ShmStore table lock (state.mu)  ->  allocator lock (state.alloc_mu)
//   extent lock (extent.mu)         ->  table lock                 (in-place upsert only)
// Readers never hold the table lock while they wait for an extent lock, so an in-place writer
// (extent -> table) cannot deadlock with them.
#include "store/shm_store.h"
#include "store/shm_state.h"
#include "transport/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "store/shm_segment.h"

namespace mooncake::sparse {

using shm_internal::CopyBytes;
using shm_internal::Quote;
using shm_internal::Touch;

// ---------------------------------------------------------------------------------------------
// ObjectLease
// ---------------------------------------------------------------------------------------------
ObjectLease::ObjectLease(std::shared_ptr<const ShmObject> object) : object_(std::move(object)) {}

ObjectLease::~ObjectLease() {
    if (object_ && object_->extent) {
        object_->extent->leases.fetch_sub(1, std::memory_order_acq_rel);
        object_->extent->state->leases.fetch_sub(1, std::memory_order_relaxed);
    }
}

ObjectLease::ObjectLease(ObjectLease&& other) noexcept : object_(std::move(other.object_)) {}

ObjectLease& ObjectLease::operator=(ObjectLease&& other) noexcept {
    if (this != &other) {
        ObjectLease old(std::move(*this));
        object_ = std::move(other.object_);
    }
    return *this;
}

const ObjectInfo& ObjectLease::info() const { return object_->info; }

std::uint32_t ObjectLease::segment_id() const {
    return object_->extent ? object_->extent->segment : 0;
}

std::uint64_t ObjectLease::member_offset(std::size_t i) const {
    return object_->extent ? object_->extent->offset + object_->offsets[i] : 0;
}

std::span<const std::byte> ObjectLease::Bytes(std::size_t i) const { return object_->Bytes(i); }

// ---------------------------------------------------------------------------------------------
// ShmStore
// ---------------------------------------------------------------------------------------------
struct ShmStore::Layout {
    std::vector<std::uint64_t> sizes;    ///< Per member.
    std::vector<std::uint64_t> offsets;  ///< Per member, within the extent.
    std::uint64_t member_bytes = 0;
    std::uint64_t extent_bytes = 0;  ///< Aligned total; 0 when no member has bytes.
    std::uint64_t metadata_charge = 0;
};

Result<std::unique_ptr<ShmStore>> ShmStore::Create(const ShmStoreOptions& options) {
    if (options.num_segments == 0) return InvalidArgument("num_segments must be at least 1");
    if (options.segment_size == 0 || options.segment_size % PageSize() != 0) {
        return InvalidArgument("segment_size " + std::to_string(options.segment_size) +
                               " must be a positive multiple of the page size " +
                               std::to_string(PageSize()));
    }
    std::vector<ShmSegment> segments;
    std::vector<std::uint64_t> sizes;
    for (std::uint32_t i = 0; i < options.num_segments; ++i) {
        ShmSegmentOptions segment_options;
        segment_options.huge_pages = options.huge_pages;
        auto seg = ShmSegment::Create(options.name + "-" + std::to_string(i), options.segment_size,
                                      segment_options);
        if (!seg.ok()) return seg.status().WithContext("segment " + std::to_string(i));
        segments.push_back(std::move(seg).value());
        sizes.push_back(options.segment_size);
    }
    auto state = std::make_shared<ShmState>(std::move(segments), sizes);
    // The quota goes to the first segments (first-fit allocation fills them first).
    std::uint64_t quota = options.pinned_quota_bytes / PageSize() * PageSize();
    std::vector<PrepareSegment> prepare;
    for (const ShmSegment& seg : state->segments) {
        const std::uint64_t pin = std::min(quota, seg.size());
        quota -= pin;
        prepare.push_back({seg.data(), seg.fd(), seg.size(), pin});
    }
    SegmentPreparerOptions prepare_options;
    prepare_options.prefault = options.prefault;
    prepare_options.threads = std::max<std::uint32_t>(1, options.prepare_threads);
    prepare_options.register_pinned = options.register_pinned;
    state->preparer = std::make_unique<SegmentPreparer>(std::move(prepare), prepare_options);
    auto store = std::unique_ptr<ShmStore>(new ShmStore(options, std::move(state)));
    if (!options.prepare_in_background) {
        store->WaitPrepared(std::chrono::milliseconds::max());
    }
    return store;
}

ShmStore::ShmStore(const ShmStoreOptions& options, std::shared_ptr<ShmState> state)
    : options_(options), state_(std::move(state)) {}

ShmStore::~ShmStore() {
    // Preparing memory nobody will use is wasted work; what is registered stays registered
    // until the state goes (leases may still be read).
    state_->preparer->Stop();
    // The table's objects hold extents, which hold the state that holds the table: break the
    // cycle. Leases (and snapshots in flight) keep what they use alive on their own.
    internal::KeyedMap<std::shared_ptr<const ShmObject>> objects;
    {
        std::unique_lock lock(state_->mu);
        objects.swap(state_->objects);
    }
}

Result<ShmStore::Layout> ShmStore::Validate(std::string_view key, std::string_view metadata,
                                            std::span<const MemberData> members) const {
    return ValidateImpl(key, metadata, members,
                        [](const MemberData& m) { return internal::ValidateMemberData(m); });
}

Result<ShmStore::Layout> ShmStore::ValidateSpecs(std::string_view key, std::string_view metadata,
                                                 std::span<const MemberSpec> members) const {
    return ValidateImpl(key, metadata, members,
                        [](const MemberSpec& m) { return internal::ValidateMemberSpec(m); });
}

template <typename Member, typename SizeOf>
Result<ShmStore::Layout> ShmStore::ValidateImpl(std::string_view key, std::string_view metadata,
                                                std::span<const Member> members,
                                                SizeOf&& size_of) const {
    Layout layout;
    layout.metadata_charge = internal::kObjectOverheadBytes + 2 * key.size() + metadata.size();
    std::vector<std::string_view> names;
    names.reserve(members.size());
    std::uint64_t offset = 0;
    for (const Member& m : members) {
        MCS_ASSIGN_OR_RETURN(const std::uint64_t size, size_of(m));
        if (size > options_.segment_size || offset > options_.segment_size - size) {
            return ResourceExhausted("object " + Quote(key) + ": its members need more than one " +
                                     "segment of " + std::to_string(options_.segment_size) +
                                     " bytes");
        }
        layout.sizes.push_back(size);
        layout.offsets.push_back(offset);
        layout.member_bytes += size;
        offset = internal::AlignUp(offset + size);
        layout.metadata_charge += internal::kMemberOverheadBytes + m.name.size() +
                                  8 * m.shape.size();
        names.push_back(m.name);
    }
    layout.extent_bytes = layout.member_bytes == 0 ? 0 : offset;
    std::sort(names.begin(), names.end());
    if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end()) {
        return InvalidArgument("object " + Quote(key) + ": member name " + Quote(*dup) +
                               " appears more than once");
    }
    return layout;
}

namespace {

/// The object a validated request describes, without placement (offsets, extent, version).
template <typename Member>
std::shared_ptr<ShmObject> Describe(std::string_view key, std::string_view metadata,
                                    std::span<const Member> members, bool hard_pin,
                                    std::span<const std::uint64_t> sizes,
                                    std::span<const std::uint64_t> offsets,
                                    std::uint64_t metadata_charge) {
    auto object = std::make_shared<ShmObject>();
    object->info.key.assign(key);
    object->info.metadata.assign(metadata);
    object->info.hard_pinned = hard_pin;
    object->info.members.reserve(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) {
        MemberInfo& mi = object->info.members.emplace_back();
        mi.name = members[i].name;
        mi.dtype = members[i].dtype;
        mi.shape = members[i].shape;
        mi.size_bytes = sizes[i];
        mi.checksum = members[i].checksum;
    }
    object->offsets.assign(offsets.begin(), offsets.end());
    object->charged_metadata = metadata_charge;
    return object;
}

void WriteMembers(std::byte* base, std::span<const MemberData> members,
                  std::span<const std::uint64_t> offsets) {
    for (std::size_t i = 0; i < members.size(); ++i) {
        if (!members[i].bytes.empty()) {
            std::memcpy(base + offsets[i], members[i].bytes.data(), members[i].bytes.size());
        }
    }
}

}  // namespace

ObjectPtr ShmStore::Snapshot(std::string_view key) const {
    std::shared_lock lock(state_->mu);
    auto it = state_->objects.find(key);
    return it == state_->objects.end() ? nullptr : it->second;
}

Result<std::shared_ptr<ShmExtent>> ShmStore::AllocateExtent(std::string_view key,
                                                            std::uint64_t size) {
    ShmState& st = *state_;
    const auto try_allocate = [&]() -> std::shared_ptr<ShmExtent> {
        std::uint32_t segment = 0;
        std::uint64_t offset = 0;
        {
            std::lock_guard lock(st.alloc_mu);
            if (!st.allocator.Allocate(size, segment, offset)) return nullptr;
        }
        return std::make_shared<ShmExtent>(state_, segment, offset, size);
    };
    if (auto extent = try_allocate()) return extent;

    // Eviction: unpinned entries that nobody leases, least recently used first.
    std::unique_lock lock(st.mu);
    if (auto extent = try_allocate()) return extent;  // Something was freed meanwhile.
    std::vector<std::pair<std::uint64_t, decltype(st.objects)::iterator>> candidates;
    std::uint64_t evictable = 0;
    for (auto it = st.objects.begin(); it != st.objects.end(); ++it) {
        if (it->second->Evictable()) {
            candidates.emplace_back(it->second->last_access.load(std::memory_order_relaxed), it);
            evictable += it->second->extent->size;
        }
    }
    std::uint64_t used = 0;
    std::uint64_t capacity = 0;
    {
        std::lock_guard alock(st.alloc_mu);
        used = st.allocator.used();
        capacity = st.allocator.capacity();
    }
    if (capacity - used + evictable < size) {
        return ResourceExhausted("object " + Quote(key) + " needs " + std::to_string(size) +
                                 " bytes of segment memory; " + std::to_string(capacity - used) +
                                 " of " + std::to_string(capacity) + " are free and " +
                                 std::to_string(evictable) + " could be evicted");
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [tick, it] : candidates) {
        const std::uint64_t bytes = it->second->extent->size;
        {
            // The extent returns to the allocator as the victim goes, unless a reader still
            // holds a snapshot of it (the allocator lock nests inside the table lock).
            ObjectPtr victim = std::move(it->second);
            st.metadata_bytes -= victim->charged_metadata;
            st.removed_version_floor = std::max(st.removed_version_floor, victim->info.version);
            st.objects.erase(it);
        }
        st.evictions.fetch_add(1, std::memory_order_relaxed);
        st.evicted_bytes.fetch_add(bytes, std::memory_order_relaxed);
        if (auto extent = try_allocate()) return extent;
    }
    return ResourceExhausted("object " + Quote(key) + " needs " + std::to_string(size) +
                             " contiguous bytes of segment memory; none are left after "
                             "evicting every unpinned, unleased entry (fragmentation or "
                             "readers still holding evicted entries)");
}

Result<bool> ShmStore::TryInPlace(std::string_view key, std::string_view metadata,
                                  std::span<const MemberData> members, const PutOptions& options,
                                  const Layout& layout) {
    ShmState& st = *state_;
    ObjectPtr old = Snapshot(key);
    if (!old || !old->extent || old->extent->size != layout.extent_bytes ||
        old->extent->leases.load(std::memory_order_acquire) != 0) {
        return false;
    }
    ShmExtent& extent = *old->extent;
    // From here to the install, no reader copies from the extent and no lease is taken on it.
    std::unique_lock elock(extent.mu);
    if (extent.leases.load(std::memory_order_acquire) != 0 || extent.stamp != old->stamp) {
        return false;
    }
    {
        std::shared_lock lock(st.mu);
        auto it = st.objects.find(key);
        if (it == st.objects.end() || it->second != old) return false;
        const std::uint64_t after = st.metadata_bytes - old->charged_metadata;
        if (after + layout.metadata_charge > options_.metadata_capacity_bytes) {
            return ResourceExhausted("object " + Quote(key) + ": the metadata bound of " +
                                     std::to_string(options_.metadata_capacity_bytes) +
                                     " bytes is reached");
        }
    }
    WriteMembers(extent.base, members, layout.offsets);
    ++extent.stamp;
    std::shared_ptr<ShmObject> object = Describe(key, metadata, members, options.hard_pin,
                                                 layout.sizes, layout.offsets,
                                                 layout.metadata_charge);
    object->extent = old->extent;
    object->stamp = extent.stamp;
    Touch(*object, st);
    ObjectPtr replaced;
    {
        // Whatever the entry is now (a concurrent upsert or remove may have won meanwhile),
        // this upsert is the later one: install it.
        std::unique_lock lock(st.mu);
        auto it = st.objects.find(key);
        if (it != st.objects.end()) {
            object->info.version = it->second->info.version + 1;
            st.metadata_bytes = st.metadata_bytes - it->second->charged_metadata +
                                object->charged_metadata;
            replaced = std::exchange(it->second, std::move(object));
        } else {
            object->info.version = st.removed_version_floor + 1;
            st.metadata_bytes += object->charged_metadata;
            st.objects.emplace(std::string(key), std::move(object));
        }
    }
    elock.unlock();
    st.in_place_upserts.fetch_add(1, std::memory_order_relaxed);
    st.puts.fetch_add(1, std::memory_order_relaxed);
    st.bytes_put.fetch_add(layout.member_bytes, std::memory_order_relaxed);
    return true;
}

Status ShmStore::Put(std::string_view key, std::string_view metadata,
                     std::span<const MemberData> members, const PutOptions& options) {
    ShmState& st = *state_;
    MCS_RETURN_IF_ERROR(internal::ValidateObjectKey(key));
    if (options.mode != PutMode::kCreate && options.mode != PutMode::kUpsert) {
        return InvalidArgument("unknown PutMode value " +
                               std::to_string(static_cast<int>(options.mode)));
    }
    MCS_ASSIGN_OR_RETURN(const Layout layout, Validate(key, metadata, members));
    if (layout.metadata_charge > options_.metadata_capacity_bytes) {
        return ResourceExhausted("object " + Quote(key) + ": its metadata alone exceeds the " +
                                 "bound of " + std::to_string(options_.metadata_capacity_bytes) +
                                 " bytes");
    }

    // Early answers from one consistent state; the decisive checks repeat at install. (Not for
    // an object of metadata alone, such as a manifest entry or a head: nothing is copied before
    // the install, which answers the same.)
    bool exists = false;
    if (layout.extent_bytes > 0) {
        std::shared_lock lock(st.mu);
        auto it = st.objects.find(key);
        exists = it != st.objects.end();
        if (exists && options.mode == PutMode::kCreate) {
            return Conflict("object " + Quote(key) + " already exists");
        }
        const std::uint64_t released = exists ? it->second->charged_metadata : 0;
        if (st.metadata_bytes - released + layout.metadata_charge >
            options_.metadata_capacity_bytes) {
            return ResourceExhausted("object " + Quote(key) + ": the metadata bound of " +
                                     std::to_string(options_.metadata_capacity_bytes) +
                                     " bytes is reached");
        }
    }
    if (exists && layout.extent_bytes > 0) {
        MCS_ASSIGN_OR_RETURN(const bool done, TryInPlace(key, metadata, members, options, layout));
        if (done) return Status::Ok();
    }

    std::shared_ptr<ShmObject> object = Describe(key, metadata, members, options.hard_pin,
                                                 layout.sizes, layout.offsets,
                                                 layout.metadata_charge);
    if (layout.extent_bytes > 0) {
        MCS_ASSIGN_OR_RETURN(object->extent, AllocateExtent(key, layout.extent_bytes));
        // Not visible to anyone yet: the copy needs no lock.
        WriteMembers(object->extent->base, members, layout.offsets);
    }
    Touch(*object, st);
    ObjectPtr replaced;  // Released after the lock.
    {
        std::unique_lock lock(st.mu);
        auto it = st.objects.find(key);
        const bool now_exists = it != st.objects.end();
        if (now_exists && options.mode == PutMode::kCreate) {
            return Conflict("object " + Quote(key) + " already exists");
        }
        const std::uint64_t released = now_exists ? it->second->charged_metadata : 0;
        if (st.metadata_bytes - released + layout.metadata_charge >
            options_.metadata_capacity_bytes) {
            return ResourceExhausted("object " + Quote(key) + ": the metadata bound of " +
                                     std::to_string(options_.metadata_capacity_bytes) +
                                     " bytes is reached");
        }
        st.metadata_bytes = st.metadata_bytes - released + layout.metadata_charge;
        if (now_exists) {
            object->info.version = it->second->info.version + 1;
            replaced = std::exchange(it->second, std::move(object));
        } else {
            object->info.version = st.removed_version_floor + 1;
            st.objects.emplace(std::string(key), std::move(object));
        }
    }
    if (replaced && layout.extent_bytes > 0) {
        st.realloc_upserts.fetch_add(1, std::memory_order_relaxed);
    }
    st.puts.fetch_add(1, std::memory_order_relaxed);
    st.bytes_put.fetch_add(layout.member_bytes, std::memory_order_relaxed);
    return Status::Ok();
}

std::vector<Status> ShmStore::PutEach(std::span<const EachPut> items, int num_threads) {
    ShmState& st = *state_;
    const std::size_t n = items.size();
    for (const EachPut& item : items) {
        if (item.options.mode != PutMode::kUpsert) continue;
        for (const MemberData& m : item.members) {
            if (!m.bytes.empty()) return ObjectStore::PutEach(items, num_threads);
        }
    }
    std::vector<Status> out(n);
    std::vector<std::shared_ptr<ShmObject>> built(n);
    std::vector<std::uint64_t> member_bytes(n, 0);
    // A few objects per task: each is a small placement and copy.
    constexpr std::size_t kEachParallelItems = 64;
    internal::ParallelFor(
        n < kEachParallelItems ? 1 : num_threads, n,
        [&](std::size_t i) {
            const EachPut& item = items[i];
            out[i] = [&]() -> Status {
                MCS_RETURN_IF_ERROR(internal::ValidateObjectKey(item.key));
                if (item.options.mode != PutMode::kCreate && item.options.mode != PutMode::kUpsert) {
                    return InvalidArgument("unknown PutMode value " +
                                           std::to_string(static_cast<int>(item.options.mode)));
                }
                MCS_ASSIGN_OR_RETURN(const Layout layout,
                                     Validate(item.key, item.metadata, item.members));
                if (layout.metadata_charge > options_.metadata_capacity_bytes) {
                    return ResourceExhausted("object " + Quote(item.key) +
                                             ": its metadata alone exceeds the bound of " +
                                             std::to_string(options_.metadata_capacity_bytes) +
                                             " bytes");
                }
                std::shared_ptr<ShmObject> object =
                    Describe(item.key, item.metadata, item.members, item.options.hard_pin,
                             layout.sizes, layout.offsets, layout.metadata_charge);
                if (layout.extent_bytes > 0) {
                    MCS_ASSIGN_OR_RETURN(object->extent,
                                         AllocateExtent(item.key, layout.extent_bytes));
                    // Not visible to anyone yet: the copy needs no lock.
                    WriteMembers(object->extent->base, item.members, layout.offsets);
                }
                Touch(*object, st);
                member_bytes[i] = layout.member_bytes;
                built[i] = std::move(object);
                return Status::Ok();
            }();
        },
        /*chunk=*/0);
    std::vector<ObjectPtr> released;  // Replaced or refused: freed after the lock.
    std::uint64_t puts = 0, bytes = 0;
    {
        std::unique_lock lock(st.mu);
        for (std::size_t i = 0; i < n; ++i) {
            if (!built[i]) continue;
            const std::string_view key = items[i].key;
            std::shared_ptr<ShmObject>& object = built[i];
            auto it = st.objects.find(key);
            const bool exists = it != st.objects.end();
            if (exists && items[i].options.mode == PutMode::kCreate) {
                out[i] = Conflict("object " + Quote(key) + " already exists");
                released.push_back(std::move(object));
                continue;
            }
            const std::uint64_t freed = exists ? it->second->charged_metadata : 0;
            if (st.metadata_bytes - freed + object->charged_metadata >
                options_.metadata_capacity_bytes) {
                out[i] = ResourceExhausted("object " + Quote(key) + ": the metadata bound of " +
                                           std::to_string(options_.metadata_capacity_bytes) +
                                           " bytes is reached");
                released.push_back(std::move(object));
                continue;
            }
            st.metadata_bytes = st.metadata_bytes - freed + object->charged_metadata;
            if (exists) {
                object->info.version = it->second->info.version + 1;
                released.push_back(std::exchange(it->second, std::move(object)));
            } else {
                object->info.version = st.removed_version_floor + 1;
                st.objects.emplace(std::string(key), std::move(object));
            }
            ++puts;
            bytes += member_bytes[i];
        }
    }
    st.puts.fetch_add(puts, std::memory_order_relaxed);
    st.bytes_put.fetch_add(bytes, std::memory_order_relaxed);
    return out;
}

Status ShmStore::PutFilled(std::span<const FilledPut> puts, const PutOptions& options,
                           const FillFn& fill, PinnedHostPool* /*host_pool*/) {
    ShmState& st = *state_;
    if (puts.empty()) return Status::Ok();
    if (options.mode != PutMode::kCreate && options.mode != PutMode::kUpsert) {
        return InvalidArgument("unknown PutMode value " +
                               std::to_string(static_cast<int>(options.mode)));
    }
    // 1. Validate every item; keys distinct.
    std::vector<Layout> layouts;
    layouts.reserve(puts.size());
    std::uint64_t metadata_charge = 0;
    std::uint64_t member_bytes = 0;
    for (const FilledPut& p : puts) {
        MCS_RETURN_IF_ERROR(internal::ValidateObjectKey(p.key));
        MCS_ASSIGN_OR_RETURN(Layout layout, ValidateSpecs(p.key, p.metadata, p.members));
        metadata_charge += layout.metadata_charge;
        member_bytes += layout.member_bytes;
        layouts.push_back(std::move(layout));
    }
    {
        std::vector<std::string_view> keys;
        for (const FilledPut& p : puts) keys.push_back(p.key);
        std::sort(keys.begin(), keys.end());
        if (auto dup = std::adjacent_find(keys.begin(), keys.end()); dup != keys.end()) {
            return InvalidArgument("key " + Quote(*dup) + " appears more than once in one batch");
        }
    }
    // 2. Conflicts and the metadata bound, against one state (repeated at install).
    auto check = [&]() -> Status {
        std::uint64_t released = 0;
        for (const FilledPut& p : puts) {
            auto it = st.objects.find(p.key);
            if (it == st.objects.end()) continue;
            if (options.mode == PutMode::kCreate) {
                return Conflict("object " + Quote(p.key) + " already exists");
            }
            released += it->second->charged_metadata;
        }
        if (st.metadata_bytes - released + metadata_charge > options_.metadata_capacity_bytes) {
            return ResourceExhausted("the metadata bound of " +
                                     std::to_string(options_.metadata_capacity_bytes) +
                                     " bytes is reached");
        }
        return Status::Ok();
    };
    {
        std::shared_lock lock(st.mu);
        MCS_RETURN_IF_ERROR(check());
    }
    // 3. Fresh extents, filled in place while nobody can see them.
    std::vector<std::shared_ptr<ShmObject>> objects;
    std::vector<std::vector<std::span<std::byte>>> spans(puts.size());
    std::vector<FillTarget> targets(puts.size());
    for (std::size_t i = 0; i < puts.size(); ++i) {
        const Layout& layout = layouts[i];
        std::shared_ptr<ShmObject> object =
            Describe(puts[i].key, puts[i].metadata, puts[i].members, options.hard_pin,
                     layout.sizes, layout.offsets, layout.metadata_charge);
        bool pinned = false;
        if (layout.extent_bytes > 0) {
            MCS_ASSIGN_OR_RETURN(object->extent, AllocateExtent(puts[i].key, layout.extent_bytes));
            const ShmExtent& e = *object->extent;
            pinned = e.offset + e.size <= st.preparer->PinnedBytes(e.segment);
            // A CUDA copy into pages never touched runs at the page-fault rate: make them
            // resident first unless the background already has.
            if (!pinned) st.preparer->PrefaultRange(e.segment, e.offset, e.size);
        }
        for (std::size_t m = 0; m < layout.sizes.size(); ++m) {
            spans[i].emplace_back(
                layout.sizes[m] == 0 ? nullptr : object->extent->base + layout.offsets[m],
                static_cast<std::size_t>(layout.sizes[m]));
        }
        targets[i] = {i, spans[i], pinned};
        objects.push_back(std::move(object));
    }
    MCS_RETURN_IF_ERROR(fill(targets));
    // 4. Install the whole batch at once.
    std::vector<ObjectPtr> replaced;  // Released after the lock.
    std::uint64_t reallocated = 0;
    {
        std::unique_lock lock(st.mu);
        MCS_RETURN_IF_ERROR(check());
        for (std::size_t i = 0; i < puts.size(); ++i) {
            std::shared_ptr<ShmObject>& object = objects[i];
            Touch(*object, st);
            auto it = st.objects.find(puts[i].key);
            if (it != st.objects.end()) {
                object->info.version = it->second->info.version + 1;
                st.metadata_bytes = st.metadata_bytes - it->second->charged_metadata +
                                    object->charged_metadata;
                replaced.push_back(std::exchange(it->second, std::move(object)));
                if (layouts[i].extent_bytes > 0) ++reallocated;
            } else {
                object->info.version = st.removed_version_floor + 1;
                st.metadata_bytes += object->charged_metadata;
                st.objects.emplace(std::string(puts[i].key), std::move(object));
            }
        }
    }
    st.realloc_upserts.fetch_add(reallocated, std::memory_order_relaxed);
    st.puts.fetch_add(puts.size(), std::memory_order_relaxed);
    st.bytes_put.fetch_add(member_bytes, std::memory_order_relaxed);
    return Status::Ok();
}

Result<ObjectLease> ShmStore::Publish(std::string_view key_label, std::string_view metadata,
                                      std::span<const MemberData> members) {
    ShmState& st = *state_;
    MCS_ASSIGN_OR_RETURN(const Layout layout, Validate(key_label, metadata, members));
    std::shared_ptr<ShmObject> object = Describe(key_label, metadata, members, false,
                                                 layout.sizes, layout.offsets,
                                                 /*metadata_charge=*/0);
    if (layout.extent_bytes > 0) {
        MCS_ASSIGN_OR_RETURN(object->extent, AllocateExtent(key_label, layout.extent_bytes));
        WriteMembers(object->extent->base, members, layout.offsets);
        object->extent->leases.store(1, std::memory_order_release);
        st.leases.fetch_add(1, std::memory_order_relaxed);
    }
    st.published.fetch_add(1, std::memory_order_relaxed);
    return ObjectLease(std::move(object));
}

std::vector<ShmSegmentDesc> ShmStore::Segments() const {
    std::vector<ShmSegmentDesc> out;
    for (std::size_t i = 0; i < state_->segments.size(); ++i) {
        const ShmSegment& s = state_->segments[i];
        out.push_back({static_cast<std::uint32_t>(i), s.size(),
                       state_->preparer->PinnedBytes(static_cast<std::uint32_t>(i)),
                       s.read_only_fd()});
    }
    return out;
}

std::uint64_t ShmStore::SegmentHugePageBytes() const {
    std::uint64_t total = 0;
    for (const ShmSegment& seg : state_->segments) {
        if (Result<std::uint64_t> b = seg.HugePageBytes(); b.ok()) total += *b;
    }
    return total;
}

ShmStoreStats ShmStore::Stats() const {
    const ShmState& st = *state_;
    ShmStoreStats s;
    s.segments = static_cast<std::uint32_t>(st.segments.size());
    {
        std::lock_guard lock(state_->alloc_mu);
        s.capacity_bytes = st.allocator.capacity();
        s.used_bytes = st.allocator.used();
        s.largest_free_bytes = st.allocator.LargestFree();
    }
    {
        std::shared_lock lock(st.mu);
        s.objects = st.objects.size();
        s.metadata_bytes = st.metadata_bytes;
    }
    s.leases = st.leases.load(std::memory_order_relaxed);
    s.evictions = st.evictions.load(std::memory_order_relaxed);
    s.evicted_bytes = st.evicted_bytes.load(std::memory_order_relaxed);
    s.in_place_upserts = st.in_place_upserts.load(std::memory_order_relaxed);
    s.realloc_upserts = st.realloc_upserts.load(std::memory_order_relaxed);
    s.published_objects = st.published.load(std::memory_order_relaxed);
    s.preparation = st.preparer->Progress();
    s.pinned_bytes = s.preparation.pinned_bytes;
    s.pageable_bytes = s.capacity_bytes - s.pinned_bytes;
    return s;
}

bool ShmStore::WaitPrepared(std::chrono::milliseconds timeout) const {
    return state_->preparer->Wait(timeout);
}

}  // namespace mooncake::sparse
