// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The read side of ShmStore: views of objects in place, Stat, whole-member and range reads, and
// leases (see shm_store.h for the design, shm_store.cc for the lock order).
#include "store/shm_state.h"

namespace mooncake::sparse {

using shm_internal::CopyBytes;
using shm_internal::Quote;
using shm_internal::Touch;

Status ShmStore::ViewObjects(std::span<const std::string_view> keys, const ViewFn& fn,
                             PinnedHostPool* /*host_pool*/) {
    ShmState& st = *state_;
    std::vector<ObjectPtr> objects(keys.size());
    for (;;) {
        {
            std::shared_lock lock(st.mu);
            for (std::size_t i = 0; i < keys.size(); ++i) {
                auto it = st.objects.find(keys[i]);
                if (it == st.objects.end()) {
                    return NotFound("object " + Quote(keys[i]) + " not found");
                }
                objects[i] = it->second;
            }
        }
        // Lease every distinct extent under its shared lock, after checking that no snapshot
        // was rewritten in place; a lease keeps in-place writers and eviction away.
        std::vector<const ShmExtent*> extents;
        for (const ObjectPtr& o : objects) {
            if (o->extent) extents.push_back(o->extent.get());
        }
        std::sort(extents.begin(), extents.end(), std::less<>());
        extents.erase(std::unique(extents.begin(), extents.end()), extents.end());
        std::vector<std::shared_lock<std::shared_mutex>> elocks;
        for (const ShmExtent* e : extents) elocks.emplace_back(e->mu);
        bool stale = false;
        for (const ObjectPtr& o : objects) {
            if (o->extent && o->extent->stamp != o->stamp) stale = true;
        }
        if (stale) continue;
        for (const ShmExtent* e : extents) e->leases.fetch_add(1, std::memory_order_acq_rel);
        elocks.clear();
        struct Release {
            std::vector<const ShmExtent*>& extents;
            ~Release() {
                for (const ShmExtent* e : extents) e->leases.fetch_sub(1, std::memory_order_acq_rel);
            }
        } release{extents};

        std::vector<std::vector<std::span<const std::byte>>> spans(keys.size());
        std::vector<ObjectView> views(keys.size());
        std::uint64_t bytes = 0;
        for (std::size_t i = 0; i < keys.size(); ++i) {
            const ShmObject& o = *objects[i];
            spans[i].reserve(o.info.members.size());
            for (std::size_t m = 0; m < o.info.members.size(); ++m) {
                spans[i].push_back(o.Bytes(m));
                bytes += o.info.members[m].size_bytes;
            }
            const bool pinned = o.extent && o.extent->offset + o.extent->size <=
                                                st.preparer->PinnedBytes(o.extent->segment);
            views[i] = {&o.info, spans[i], pinned, state_.get(), &objects[i]};
            Touch(o, st);
        }
        MCS_RETURN_IF_ERROR(fn(views));
        st.member_gets.fetch_add(keys.size(), std::memory_order_relaxed);
        st.member_bytes.fetch_add(bytes, std::memory_order_relaxed);
        return Status::Ok();
    }
}

Result<ObjectInfo> ShmStore::Stat(std::string_view key) {
    ObjectPtr object = Snapshot(key);
    if (!object) return NotFound("object " + Quote(key) + " not found");
    Touch(*object, *state_);
    return object->info;
}

Result<std::shared_ptr<const ObjectInfo>> ShmStore::StatShared(std::string_view key) {
    ObjectPtr object = Snapshot(key);
    if (!object) return NotFound("object " + Quote(key) + " not found");
    Touch(*object, *state_);
    // A snapshot's info never changes (a rewrite makes a new object): it lives as long as it.
    return std::shared_ptr<const ObjectInfo>(object, &object->info);
}

Status ShmStore::ReadMember(std::string_view key, std::string_view member,
                            std::span<std::byte> dst) {
    ShmState& st = *state_;
    for (;;) {
        ObjectPtr object = Snapshot(key);
        if (!object) return NotFound("object " + Quote(key) + " not found");
        const std::ptrdiff_t index = object->MemberIndex(member);
        if (index < 0) {
            return NotFound("object " + Quote(key) + " has no member " + Quote(member));
        }
        std::span<const std::byte> src = object->Bytes(static_cast<std::size_t>(index));
        if (dst.size() != src.size()) {
            return InvalidArgument("member " + Quote(member) + " of object " + Quote(key) +
                                   " is " + std::to_string(src.size()) +
                                   " bytes, destination is " + std::to_string(dst.size()));
        }
        if (object->extent) {
            std::shared_lock elock(object->extent->mu);
            if (object->extent->stamp != object->stamp) continue;  // Rewritten: take the new one.
            CopyBytes(dst, src);
        }
        Touch(*object, st);
        st.member_gets.fetch_add(1, std::memory_order_relaxed);
        st.member_bytes.fetch_add(src.size(), std::memory_order_relaxed);
        return Status::Ok();
    }
}

Status ShmStore::ReadRangesParallel(std::span<const RangeRead> reads, int num_threads) {
    if (reads.empty()) return Status::Ok();
    ShmState& st = *state_;
    for (;;) {
        // 1. One table lock: every key resolves against the same state of the store.
        std::vector<const ShmObject*> objects(reads.size(), nullptr);
        std::vector<ObjectPtr> holders;
        std::size_t missing = reads.size();
        {
            std::shared_lock lock(st.mu);
            for (std::size_t i = 0; i < reads.size(); ++i) {
                if (i > 0 && reads[i].key == reads[i - 1].key) {
                    objects[i] = objects[i - 1];
                } else {
                    auto it = st.objects.find(reads[i].key);
                    if (it != st.objects.end()) {
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
            const ShmObject& object = *objects[i];
            MCS_ASSIGN_OR_RETURN(const RangeSlice slice, LocateRangeRead(r, i, object.info));
            sources[i] = object.Bytes(slice.member)
                             .subspan(static_cast<std::size_t>(slice.offset),
                                      static_cast<std::size_t>(slice.bytes));
            total += slice.bytes;
        }

        // 3. Lock every extent shared (address order), check no snapshot was rewritten in
        //    place, copy. Writers never hold two extent locks, so any order would do; one
        //    order keeps it obviously so.
        std::vector<const ShmObject*> distinct;
        for (const ObjectPtr& h : holders) {
            if (h->extent) distinct.push_back(h.get());
        }
        std::sort(distinct.begin(), distinct.end(), [](const ShmObject* a, const ShmObject* b) {
            return std::less<>()(a->extent.get(), b->extent.get());
        });
        std::vector<std::shared_lock<std::shared_mutex>> elocks;
        bool stale = false;
        const ShmExtent* previous = nullptr;
        for (const ShmObject* o : distinct) {
            if (o->extent.get() != previous) {
                elocks.emplace_back(o->extent->mu);
                previous = o->extent.get();
            }
            if (o->extent->stamp != o->stamp) stale = true;
        }
        if (stale) continue;
        internal::CopyRangeReads(reads, sources, total, num_threads);
        elocks.clear();
        for (const ObjectPtr& h : holders) Touch(*h, st);
        st.range_reads.fetch_add(reads.size(), std::memory_order_relaxed);
        st.range_bytes.fetch_add(total, std::memory_order_relaxed);
        return Status::Ok();
    }
}

Status ShmStore::Remove(std::string_view key) {
    ShmState& st = *state_;
    ObjectPtr removed;
    {
        std::unique_lock lock(st.mu);
        std::optional<ObjectPtr> entry = st.objects.extract(key);
        if (!entry) return NotFound("object " + Quote(key) + " not found");
        removed = std::move(*entry);
        st.metadata_bytes -= removed->charged_metadata;
        st.removed_version_floor = std::max(st.removed_version_floor, removed->info.version);
    }
    st.removes.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
}

Result<std::vector<std::string>> ShmStore::List(std::string_view prefix) {
    std::vector<std::string> keys;
    std::shared_lock lock(state_->mu);
    for (auto it = state_->objects.lower_bound(prefix);
         it != state_->objects.end() && std::string_view(it->first).starts_with(prefix); ++it) {
        keys.push_back(it->first);
    }
    return keys;
}

StoreCounters ShmStore::Counters() const {
    const ShmState& st = *state_;
    StoreCounters c;
    c.puts = st.puts.load(std::memory_order_relaxed);
    c.bytes_put = st.bytes_put.load(std::memory_order_relaxed);
    c.member_gets = st.member_gets.load(std::memory_order_relaxed);
    c.member_bytes = st.member_bytes.load(std::memory_order_relaxed);
    c.range_reads = st.range_reads.load(std::memory_order_relaxed);
    c.range_bytes = st.range_bytes.load(std::memory_order_relaxed);
    c.removes = st.removes.load(std::memory_order_relaxed);
    return c;
}

Result<ObjectLease> ShmStore::LeaseViewed(const ObjectView& view) {
    if (view.store != state_.get() || view.handle == nullptr) {
        return InvalidArgument("the view is not one of this store's");
    }
    // ViewObjects holds a lease on the view's extent and checked it current under the
    // extent's lock: this one holds the same bytes, taken without that lock.
    const ObjectPtr& object = *static_cast<const ObjectPtr*>(view.handle);
    if (object->extent) {
        object->extent->leases.fetch_add(1, std::memory_order_acq_rel);
        state_->leases.fetch_add(1, std::memory_order_relaxed);
    }
    return ObjectLease(object);
}

Result<ObjectLease> ShmStore::Lease(std::string_view key) {
    ShmState& st = *state_;
    for (;;) {
        ObjectPtr object = Snapshot(key);
        if (!object) return NotFound("object " + Quote(key) + " not found");
        Touch(*object, st);
        if (!object->extent) return ObjectLease(std::move(object));
        std::shared_lock elock(object->extent->mu);
        if (object->extent->stamp != object->stamp) continue;  // Rewritten: take the new one.
        object->extent->leases.fetch_add(1, std::memory_order_acq_rel);
        st.leases.fetch_add(1, std::memory_order_relaxed);
        return ObjectLease(std::move(object));
    }
}

}  // namespace mooncake::sparse
