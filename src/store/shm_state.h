// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The shared state of ShmStore (private to src/store): the extent allocator, the object table
// and its objects, and the small helpers both of its files use (shm_store.cc: writes, removal,
// leases; shm_store_read.cc: views, stats and range reads). Lock order: see shm_store.cc.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>

#include "store/keyed_map.h"
#include "store/shm_segment.h"
#include "store/shm_store.h"

namespace mooncake::sparse {
namespace internal {

/// Extents and member offsets are multiples of this: a cache line, and the alignment numpy
/// and the apply kernels like.
inline constexpr std::uint64_t kAlignment = 64;
/// Heap bytes charged per object on top of its key, metadata and member names.
inline constexpr std::uint64_t kObjectOverheadBytes = 256;
inline constexpr std::uint64_t kMemberOverheadBytes = 64;

inline std::uint64_t AlignUp(std::uint64_t v) {
    return (v + kAlignment - 1) / kAlignment * kAlignment;
}

/// First-fit free lists (offset -> size), one per segment, coalesced on free.
class ExtentAllocator {
public:
    explicit ExtentAllocator(const std::vector<std::uint64_t>& segment_sizes) {
        free_.resize(segment_sizes.size());
        for (std::size_t s = 0; s < segment_sizes.size(); ++s) {
            free_[s].emplace(0, segment_sizes[s]);
            capacity_ += segment_sizes[s];
        }
    }

    /// (segment, offset) of a block of `size` bytes (a multiple of kAlignment), or false.
    bool Allocate(std::uint64_t size, std::uint32_t& segment, std::uint64_t& offset) {
        for (std::size_t s = 0; s < free_.size(); ++s) {
            auto& blocks = free_[s];
            for (auto it = blocks.begin(); it != blocks.end(); ++it) {
                if (it->second < size) continue;
                segment = static_cast<std::uint32_t>(s);
                offset = it->first;
                const std::uint64_t rest = it->second - size;
                blocks.erase(it);
                if (rest > 0) blocks.emplace(offset + size, rest);
                used_ += size;
                return true;
            }
        }
        return false;
    }

    void Free(std::uint32_t segment, std::uint64_t offset, std::uint64_t size) {
        auto& blocks = free_[segment];
        auto next = blocks.lower_bound(offset);
        std::uint64_t start = offset;
        std::uint64_t length = size;
        if (next != blocks.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == offset) {
                start = prev->first;
                length += prev->second;
                blocks.erase(prev);
            }
        }
        if (next != blocks.end() && offset + size == next->first) {
            length += next->second;
            blocks.erase(next);
        }
        blocks.emplace(start, length);
        used_ -= size;
    }

    std::uint64_t LargestFree() const {
        std::uint64_t best = 0;
        for (const auto& blocks : free_) {
            for (const auto& [offset, size] : blocks) best = std::max(best, size);
        }
        return best;
    }
    std::uint64_t used() const { return used_; }
    std::uint64_t capacity() const { return capacity_; }

private:
    std::vector<std::map<std::uint64_t, std::uint64_t>> free_;
    std::uint64_t used_ = 0;
    std::uint64_t capacity_ = 0;
};

/// Everything that must outlive the last extent or lease: the mapped segments, their pinned
/// registrations and the allocator. Extents and leases hold it by shared_ptr.
struct ShmState {
    std::vector<ShmSegment> segments;
    /// Pre-faults and pins the segments; owns the registrations. Destroyed (threads joined,
    /// registrations released) before the segments are unmapped: declared after them.
    std::unique_ptr<SegmentPreparer> preparer;

    std::mutex alloc_mu;
    ExtentAllocator allocator;  // Guarded by alloc_mu.

    /// The object table and what is accounted with it.
    mutable std::shared_mutex mu;
    internal::KeyedMap<std::shared_ptr<const ShmObject>> objects;  // mu
    std::uint64_t metadata_bytes = 0;                                               // mu
    std::uint64_t removed_version_floor = 0;                                        // mu

    std::atomic<std::uint64_t> access_clock{0};
    std::atomic<std::uint64_t> leases{0};
    std::atomic<std::uint64_t> evictions{0};
    std::atomic<std::uint64_t> evicted_bytes{0};
    std::atomic<std::uint64_t> in_place_upserts{0};
    std::atomic<std::uint64_t> realloc_upserts{0};
    std::atomic<std::uint64_t> published{0};
    std::atomic<std::uint64_t> puts{0};
    std::atomic<std::uint64_t> bytes_put{0};
    std::atomic<std::uint64_t> member_gets{0};
    std::atomic<std::uint64_t> member_bytes{0};
    std::atomic<std::uint64_t> range_reads{0};
    std::atomic<std::uint64_t> range_bytes{0};
    std::atomic<std::uint64_t> removes{0};

    ShmState(std::vector<ShmSegment> segs, const std::vector<std::uint64_t>& sizes)
        : segments(std::move(segs)), allocator(sizes) {}
};

/// One allocated block of a segment; returned to the allocator by the destructor.
struct ShmExtent {
    std::shared_ptr<ShmState> state;
    std::uint32_t segment = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
    std::byte* base = nullptr;

    /// Readers hold it shared while they copy; an in-place rewrite holds it exclusively.
    mutable std::shared_mutex mu;
    std::uint64_t stamp = 0;  // Guarded by mu: bumped by every in-place rewrite.
    mutable std::atomic<std::uint32_t> leases{0};

    ShmExtent(std::shared_ptr<ShmState> s, std::uint32_t seg, std::uint64_t off, std::uint64_t sz)
        : state(std::move(s)), segment(seg), offset(off), size(sz),
          base(state->segments[seg].data() + off) {}
    ~ShmExtent() {
        std::lock_guard lock(state->alloc_mu);
        state->allocator.Free(segment, offset, size);
    }
    ShmExtent(const ShmExtent&) = delete;
    ShmExtent& operator=(const ShmExtent&) = delete;
};

/// An immutable object version: its table, and where its bytes are.
struct ShmObject {
    ObjectInfo info;
    std::vector<std::uint64_t> offsets;  ///< Per member, relative to the extent.
    std::shared_ptr<ShmExtent> extent;   ///< Null when no member has bytes.
    std::uint64_t stamp = 0;             ///< The extent stamp these bytes belong to.
    std::uint64_t charged_metadata = 0;
    mutable std::atomic<std::uint64_t> last_access{0};

    std::span<const std::byte> Bytes(std::size_t i) const {
        const std::uint64_t size = info.members[i].size_bytes;
        if (size == 0) return {};
        return {extent->base + offsets[i], static_cast<std::size_t>(size)};
    }
    std::ptrdiff_t MemberIndex(std::string_view name) const {
        const MemberInfo* m = info.FindMember(name);
        return m ? m - info.members.data() : -1;
    }
    bool Evictable() const {
        return !info.hard_pinned && extent && extent->leases.load(std::memory_order_acquire) == 0;
    }
};

}  // namespace internal

using internal::ShmExtent;
using internal::ShmObject;
using internal::ShmState;
using ObjectPtr = std::shared_ptr<const ShmObject>;


namespace shm_internal {

inline std::string Quote(std::string_view s) {
    constexpr std::size_t kMaxShown = 200;
    std::string out = "'";
    out.append(s.substr(0, kMaxShown));
    if (s.size() > kMaxShown) out += "...";
    out += "'";
    return out;
}

inline void Touch(const ShmObject& object, ShmState& state) {
    object.last_access.store(state.access_clock.fetch_add(1, std::memory_order_relaxed) + 1,
                             std::memory_order_relaxed);
}

inline void CopyBytes(std::span<std::byte> dst, std::span<const std::byte> src) {
    if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size());
}

}  // namespace shm_internal

}  // namespace mooncake::sparse
