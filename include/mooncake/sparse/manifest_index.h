// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The sources of each tensor of a manifest, found by tensor_id in O(1) and laid out for the
// target-by-target matching of SelectSources (docs/design.md §4 step 1).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/internal/compiler.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// The sources of each tensor of one manifest, found by tensor_id in O(1): an open-addressing
/// table over a hash of tensor_id, pointing at each tensor's sources in manifest order, with
/// a compact copy of what matching a target needs (rank, shape, box, policy, owner ordinal;
/// the tile shape and tile count, which bound its regions) so that SelectSources reads a few
/// sequential bytes per source instead of its descriptor.
/// A manifest is fixed for a generation, so a caller that plans several batches against one
/// manifest (an executor serving many read calls of one generation) builds this once and
/// passes it to every SelectSources; the two-argument SelectSources builds a fresh one
/// (O(sources)). Use it only with the manifest it was built from: SelectSources checks the
/// size and each found tensor_id, not the rest.
class ManifestIndex {
public:
    /// What SelectSources needs of one source, stored next to its tensor's other sources.
    struct Candidate {
        std::uint32_t source = 0;  ///< Manifest position.
        /// Where global_shape, box begin, box end and tile_shape are stored.
        std::uint32_t coords = 0;
        std::int64_t owner = 0;    ///< owner(AXIS) ordinal; -1 when the source has none.
        std::uint16_t axis = 0;    ///< owner(AXIS): the axis, as an index into axes().
        std::uint8_t rank = 0;
        PlacementPolicy::Kind kind = PlacementPolicy::Kind::kNone;
        std::uint32_t tiles = 0;   ///< The descriptor's num_tiles, at most 2^32 - 1.
    };

    ManifestIndex() = default;

    /// `recycle`: an index this caller is done with (the previous step's); its arrays are
    /// emptied and written again, so a step's index lands in memory already paged in, and
    /// `*recycle` is left empty. Errors: InvalidArgument when the manifest holds 2^32 - 1
    /// sources (or 2^16 owner axes) or more.
    static Result<ManifestIndex> Make(std::span<const SourceDescriptor> manifest,
                                      ManifestIndex* recycle = nullptr) {
        const std::size_t n = manifest.size();
        if (n >= kEmpty) return InvalidArgument("manifest has 2^32 - 1 sources or more");
        ManifestIndex ix;
        if (recycle != nullptr) {
            ix = std::move(*recycle);
            *recycle = ManifestIndex();
            ix.slots_.clear();
            ix.ids_.clear();
            ix.id_begin_.clear();
            ix.group_begin_.clear();
            ix.sources_.clear();
            ix.candidates_.clear();
            ix.coords_.clear();
            ix.axes_.clear();
        }
        ix.size_ = n;
        std::size_t capacity = 16;
        while (capacity < n + n / 2 + 1) capacity *= 2;  // load factor <= 2/3
        ix.mask_ = capacity - 1;
        ix.slots_.assign(capacity, Slot{0, kEmpty});
        // Every array is sized once up front (at most, not touched beyond what is used): on a
        // cold plan an outgrown buffer is pages faulted in and copied for nothing. ids_ gets
        // the first sources' mean id length (+1/4) per source, up to 64 MiB (then it grows).
        ix.coords_.reserve(8 * n);
        ix.id_begin_.reserve(n + 1);
        {
            const std::size_t k = std::min<std::size_t>(n, 64);
            std::size_t sample = 0;
            for (std::size_t i = 0; i < k; ++i) sample += manifest[i].tensor_id.size();
            const double estimate = k == 0 ? 0.0 : 1.25 * double(sample) / double(k) * double(n);
            ix.ids_.reserve(static_cast<std::size_t>(std::min(estimate, double(1 << 26))));
        }
        ix.id_begin_.push_back(0);  // groups + 1 offsets at every step, so IdOf works throughout
        // One pass over the descriptors (they are large and cold): group by tensor_id and
        // take each source's candidate record, in manifest order; then reorder by group,
        // unless (as usual) each tensor's sources are consecutive already.
        std::vector<std::uint32_t> group_of(n);
        ix.candidates_.resize(n);
        bool grouped = true;
        constexpr std::size_t kAhead = 8;
        for (std::size_t i = 0; i < n; ++i) {
            if (i + kAhead < n) {
                const SourceDescriptor& ahead = manifest[i + kAhead];
                internal::Prefetch(ahead.tensor_id.data());
                internal::Prefetch(ahead.global_shape.data());
                internal::Prefetch(ahead.tile_shape.data());
                internal::Prefetch(ahead.placement.entries().data());
            }
            const SourceDescriptor& src = manifest[i];
            const std::string_view id = src.tensor_id;
            const std::uint64_t h = HashId(id);
            const auto tag = static_cast<std::uint32_t>(h >> 32);
            for (std::size_t p = h & ix.mask_;; p = (p + 1) & ix.mask_) {
                Slot& slot = ix.slots_[p];
                if (slot.group == kEmpty) {
                    if (ix.ids_.size() + id.size() >= kEmpty) {
                        return InvalidArgument("manifest tensor ids exceed 4 GiB");
                    }
                    slot = {tag, static_cast<std::uint32_t>(ix.id_begin_.size() - 1)};
                    ix.ids_.append(id);
                    ix.id_begin_.push_back(static_cast<std::uint32_t>(ix.ids_.size()));
                    group_of[i] = slot.group;
                    break;
                }
                if (slot.tag == tag && ix.IdOf(slot.group) == id) {
                    group_of[i] = slot.group;
                    break;
                }
            }
            grouped = grouped && (i == 0 || group_of[i] >= group_of[i - 1]);
            Candidate& c = ix.candidates_[i];
            c.source = static_cast<std::uint32_t>(i);
            c.coords = static_cast<std::uint32_t>(ix.coords_.size());
            c.rank = static_cast<std::uint8_t>(src.rank());
            c.kind = src.policy.kind();
            if (c.kind == PlacementPolicy::Kind::kOwner) {
                const std::string& axis = src.policy.axis();
                auto it = std::find(ix.axes_.begin(), ix.axes_.end(), axis);
                if (it == ix.axes_.end()) {
                    if (ix.axes_.size() >= 0xffff) return InvalidArgument("2^16 owner axes or more");
                    it = ix.axes_.insert(ix.axes_.end(), axis);
                }
                c.axis = static_cast<std::uint16_t>(it - ix.axes_.begin());
                c.owner = src.placement.Get(axis).value_or(-1);  // ordinals are >= 0
            }
            if (src.box.rank() != src.rank() || ix.coords_.size() + 4 * src.rank() >= kEmpty) {
                return InvalidArgument("source " + src.source_ref + " box rank " +
                                       std::to_string(src.box.rank()) + " != tensor rank " +
                                       std::to_string(src.rank()));
            }
            c.tiles = static_cast<std::uint32_t>(
                std::min<std::uint64_t>(src.num_tiles, std::numeric_limits<std::uint32_t>::max()));
            ix.coords_.insert(ix.coords_.end(), src.global_shape.begin(), src.global_shape.end());
            for (std::size_t d = 0; d < src.rank(); ++d) ix.coords_.push_back(src.box.begin(d));
            for (std::size_t d = 0; d < src.rank(); ++d) ix.coords_.push_back(src.box.end(d));
            // The tile shape only bounds the regions a match plans (SourceSelection::
            // region_bound); 0 where a descriptor's tile_shape does not fit its rank.
            const bool tiled = src.tile_shape.size() == src.rank();
            for (std::size_t d = 0; d < src.rank(); ++d) {
                ix.coords_.push_back(tiled ? src.tile_shape[d] : 0);
            }
        }
        const std::size_t groups = ix.id_begin_.size() - 1;
        // Each group's sources, in manifest order (a counting sort by group).
        ix.group_begin_.assign(groups + 1, 0);
        for (std::uint32_t g : group_of) ++ix.group_begin_[g + 1];
        for (std::size_t g = 0; g < groups; ++g) ix.group_begin_[g + 1] += ix.group_begin_[g];
        ix.sources_.resize(n);
        if (grouped) {  // groups are numbered in order of first appearance: nothing moves
            for (std::size_t i = 0; i < n; ++i) ix.sources_[i] = static_cast<std::uint32_t>(i);
            return ix;
        }
        const std::vector<Candidate> by_source = std::move(ix.candidates_);
        ix.candidates_.resize(n);
        std::vector<std::uint32_t> cursor(ix.group_begin_.begin(), ix.group_begin_.end() - 1);
        for (std::size_t i = 0; i < n; ++i) {
            const std::uint32_t at = cursor[group_of[i]]++;
            ix.sources_[at] = static_cast<std::uint32_t>(i);
            ix.candidates_[at] = by_source[i];
        }
        return ix;
    }

    /// Sources in the manifest it was built from.
    std::size_t size() const { return size_; }

    /// The sources of `tensor_id` in manifest order; empty when the manifest has none.
    std::span<const std::uint32_t> Find(std::string_view tensor_id) const {
        const std::uint32_t g = Lookup(HashId(tensor_id), tensor_id);
        if (g == kEmpty) return {};
        return std::span<const std::uint32_t>(sources_).subspan(
            group_begin_[g], group_begin_[g + 1] - group_begin_[g]);
    }

    /// A 64-bit hash of an id, 8 bytes per step (in-process only: not stable across builds).
    static std::uint64_t HashId(std::string_view s) {
        constexpr std::uint64_t kMul = 0x9e3779b97f4a7c15ull;
        std::uint64_t h = static_cast<std::uint64_t>(s.size()) * kMul;
        std::size_t i = 0;
        for (; i + 8 <= s.size(); i += 8) {
            std::uint64_t w;
            std::memcpy(&w, s.data() + i, 8);
            h = (h ^ w) * kMul;
            h ^= h >> 29;
        }
        if (i < s.size()) {
            std::uint64_t w = 0;
            std::memcpy(&w, s.data() + i, s.size() - i);
            h = (h ^ w) * kMul;
            h ^= h >> 29;
        }
        h ^= h >> 32;
        h *= 0xd6e8feb86659fd93ull;
        return h ^ (h >> 32);
    }

    // Lookup in stages, for batches that overlap their misses (SelectSources): fetch the home
    // slot, then the group it points at (its id and candidates), then the coordinates of its
    // first candidate, then look up.
    static constexpr std::uint32_t kNone = 0xffffffffu;
    void PrefetchSlot(std::uint64_t hash) const {
        if (!slots_.empty()) internal::Prefetch(&slots_[hash & mask_]);
    }
    void PrefetchGroup(std::uint64_t hash) const {
        if (slots_.empty()) return;
        const Slot& slot = slots_[hash & mask_];
        if (slot.group == kEmpty) return;
        internal::Prefetch(ids_.data() + id_begin_[slot.group]);
        internal::Prefetch(&candidates_[group_begin_[slot.group]]);
    }
    void PrefetchCoords(std::uint64_t hash) const {
        if (slots_.empty()) return;
        const Slot& slot = slots_[hash & mask_];
        if (slot.group == kEmpty) return;
        internal::Prefetch(coords_.data() + candidates_[group_begin_[slot.group]].coords);
    }
    /// The group (tensor) of `tensor_id`, kNone when absent; `hash` is HashId(tensor_id).
    std::uint32_t Lookup(std::uint64_t hash, std::string_view tensor_id) const {
        if (slots_.empty()) return kNone;
        const auto tag = static_cast<std::uint32_t>(hash >> 32);
        for (std::size_t p = hash & mask_;; p = (p + 1) & mask_) {
            const Slot& slot = slots_[p];
            if (slot.group == kEmpty) return kNone;
            if (slot.tag == tag && IdOf(slot.group) == tensor_id) return slot.group;
        }
    }
    std::span<const Candidate> candidates(std::uint32_t group) const {
        return std::span<const Candidate>(candidates_).subspan(
            group_begin_[group], group_begin_[group + 1] - group_begin_[group]);
    }
    std::span<const Index> global_shape(const Candidate& c) const {
        return {coords_.data() + c.coords, c.rank};
    }
    std::span<const Index> box_begin(const Candidate& c) const {
        return {coords_.data() + c.coords + c.rank, c.rank};
    }
    std::span<const Index> box_end(const Candidate& c) const {
        return {coords_.data() + c.coords + 2 * std::size_t{c.rank}, c.rank};
    }
    /// The descriptor's tile_shape (zeros where it does not have the source's rank).
    std::span<const Index> tile_shape(const Candidate& c) const {
        return {coords_.data() + c.coords + 3 * std::size_t{c.rank}, c.rank};
    }
    const std::vector<std::string>& axes() const { return axes_; }

private:
    static constexpr std::uint32_t kEmpty = kNone;
    struct Slot {
        std::uint32_t tag;    ///< High 32 bits of the hash.
        std::uint32_t group;  ///< kEmpty when the slot is free.
    };
    std::string_view IdOf(std::uint32_t group) const {
        return std::string_view(ids_).substr(id_begin_[group], id_begin_[group + 1] - id_begin_[group]);
    }

    std::size_t size_ = 0;
    std::size_t mask_ = 0;
    std::vector<Slot> slots_;
    std::string ids_;                         ///< Each group's tensor_id, back to back.
    std::vector<std::uint32_t> id_begin_;     ///< Groups + 1 offsets into ids_.
    std::vector<std::uint32_t> group_begin_;  ///< Groups + 1 offsets into sources_/candidates_.
    std::vector<std::uint32_t> sources_;      ///< Source indexes, grouped by tensor.
    std::vector<Candidate> candidates_;       ///< Same order as sources_.
    std::vector<Index> coords_;
    std::vector<std::string> axes_;           ///< Owner axes, interned.
};

}  // namespace mooncake::sparse
