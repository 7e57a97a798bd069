// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The address-free sparse planner (docs/design.md §4 steps 1, 2, 4 and 5): placement filtering and
// box intersection from the manifest alone, entry-range planning on a source's compact tile
// index, and batch planning of a whole target set with dedup per node. It reads no payload and
// never scans nnz: a query costs O(log R + groups * log C + K) on the 2-D path.
//
// Planning a whole node. A node's batch is ~10^5 targets over ~10^5 sources and can produce
// ~10^6 regions and reads (a row-parallel TP part is one region per tile row). What costs is
// memory, not arithmetic: every descriptor and tile index is touched once, cold, and every
// byte of output is a first-touched page. So the outputs are flat arrays of small records
// (SourceMatch 8 bytes, Region 16, UniqueRead 16) with offsets instead of per-target vectors;
// the manifest is looked up through a reusable ManifestIndex; PlanBatch works source by source,
// fetching a few sources ahead, and dedups each source's requests while they are still in cache.
// A first-touched page costs more than the arithmetic of the records on it (a VM takes ~1.6 us
// to fault in and zero 4 KiB), so the output arrays are sized once, from the region bound that
// SelectSources derives from geometry alone, and never outgrown; and a TileIndex keeps what a
// query reads in its first cache lines (3 of them for a 2-D index), so that tens of thousands
// of cold indexes cost 3 misses each, not 9.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/internal/compiler.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/status.h"
#include "mooncake/sparse/tile_index.h"

namespace mooncake::sparse {

struct PlanOptions {
    PlanningLimits limits;
    /// Physical reads of one source on one node whose gap is at most this many entries are
    /// merged into one read. -1 merges only overlapping requests (so no entry is read twice
    /// and adjacent TP ranges stay separate reads); 0 also merges adjacent ones.
    std::int64_t read_coalesce_gap = -1;
};

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

/// Steps 1-2: which sources each target reads, from the manifest alone. Flat: the matches of
/// all targets in one array, target by target, with per-target offsets (no per-target
/// allocation).
struct SourceSelection {
    /// Grouped by target in target order; within a target, in manifest order.
    std::vector<SourceMatch> matches;
    /// Targets + 1 offsets into `matches` (empty for an empty target set).
    std::vector<std::uint32_t> target_begin;
    std::vector<std::uint32_t> needed_sources;  ///< Sorted, unique: whose tile index to fetch.
    /// At most this many regions come out of planning `matches` (internal::RunBound summed
    /// over them), known from the boxes and tile shapes alone; 0: not known. PlanBatch sizes
    /// its region and read arrays with it once instead of growing them: a node's plan writes
    /// tens of MB of fresh pages, and every abandoned smaller buffer is pages touched (and
    /// copied) for nothing. Only a hint: ranges of 2^32 entries or more are split into more
    /// regions, and a selection made by hand may leave it 0.
    std::uint64_t region_bound = 0;

    std::size_t num_targets() const { return target_begin.empty() ? 0 : target_begin.size() - 1; }
    /// Empties it, keeping the arrays' capacity.
    void Clear() {
        matches.clear();
        target_begin.clear();
        needed_sources.clear();
        region_bound = 0;
    }
    /// Target t's matches; t < num_targets().
    std::span<const SourceMatch> matches_of(std::size_t t) const {
        return std::span<const SourceMatch>(matches).subspan(
            target_begin[t], target_begin[t + 1] - target_begin[t]);
    }
};

namespace internal {

/// The tile coordinate of element coordinate x >= 0 for tile extent t >= 1 (a shift for the
/// usual power-of-two tiles: SelectSources calls this per match).
inline Index TileCoordOf(Index x, Index t) {
    return (t & (t - 1)) == 0 ? x >> std::countr_zero(static_cast<std::uint64_t>(t)) : x / t;
}

/// An upper bound, from geometry alone, on the runs TileIndex::QueryTiles returns for the
/// overlap [lo[d], hi[d]) of a source box [begin[d], end[d]) tiled by `tile` with `tiles`
/// tiles present. Every query path emits at most one run per combination of tile coordinates
/// in the dims before the longest suffix of dims whose tile grid the overlap spans (see
/// QueryState::full_from; the 2-D row and column paths: at most one per tile row), and every
/// run holds a tile of its own. A tile extent < 1 (a malformed descriptor) gives `tiles`.
inline std::uint64_t RunBound(std::size_t rank, const Index* lo, const Index* hi,
                              std::span<const Index> begin, std::span<const Index> end,
                              std::span<const Index> tile, std::uint64_t tiles) {
    for (std::size_t d = 0; d < rank; ++d) {
        if (tile[d] < 1) return tiles;
    }
    // k: the first dim of the longest fully spanned suffix.
    std::size_t k = rank;
    while (k > 0) {
        const std::size_t d = k - 1;
        const bool full = (lo[d] == begin[d] && hi[d] == end[d]) ||
                          (TileCoordOf(lo[d], tile[d]) == TileCoordOf(begin[d], tile[d]) &&
                           TileCoordOf(hi[d] - 1, tile[d]) == TileCoordOf(end[d] - 1, tile[d]));
        if (!full) break;
        --k;
    }
    // Runs are emitted at depth k - 1 (one per prefix of dims < k - 1), or once when k == 0.
    std::uint64_t bound = 1;
    for (std::size_t d = 0; d + 1 < k && bound < tiles; ++d) {
        const auto extent = static_cast<std::uint64_t>(TileCoordOf(hi[d] - 1, tile[d]) -
                                                       TileCoordOf(lo[d], tile[d]) + 1);
        bound = extent > tiles / bound ? tiles : bound * extent;
    }
    return std::min(bound, tiles);
}

}  // namespace internal

/// Placement filtering and box intersection for a batch of targets, with the manifest's
/// prebuilt index. Every target must be covered exactly by the boxes of the sources it matches:
/// a gap is an error, never a silent hole in the weights. Targets are looked up in a software
/// pipeline: each one's descriptor, ids, hash slot and candidate records are fetched a few
/// targets before it is matched. Also sums the selection's region_bound.
/// `recycle`: a selection this caller is done with (e.g. the previous step's plan's); its
/// arrays are reused and `*recycle` is left empty (see ManifestIndex::Make).
/// Errors: InvalidArgument (index built for another manifest, shape mismatch, target outside
/// the tensor, overlapping sources, 2^32 matches or more); NotFound (no source for the tensor,
/// or a target box not fully covered).
inline Result<SourceSelection> SelectSources(std::span<const SourceDescriptor> manifest,
                                             const ManifestIndex& index,
                                             std::span<const TargetDescriptor> targets,
                                             SourceSelection* recycle = nullptr) {
    using Candidate = ManifestIndex::Candidate;
    if (index.size() != manifest.size()) {
        return InvalidArgument("manifest index was built for a manifest of " +
                               std::to_string(index.size()) + " sources, not " +
                               std::to_string(manifest.size()));
    }
    constexpr std::size_t kMaxMatches = std::numeric_limits<std::uint32_t>::max();
    if (targets.size() >= kMaxMatches) return InvalidArgument("2^32 - 1 targets or more");
    SourceSelection sel;
    if (recycle != nullptr) {
        sel = std::move(*recycle);
        *recycle = SourceSelection();
        sel.Clear();
    }
    sel.target_begin.resize(targets.size() + 1);
    sel.matches.reserve(targets.size() + targets.size() / 8);
    std::vector<std::uint8_t> needed(manifest.size(), 0);
    std::vector<const Candidate*> matched;  // this target's matched sources

    // The boxes of two candidates intersect.
    auto boxes_meet = [&](const Candidate& a, const Candidate& b) {
        if (a.rank != b.rank) return false;
        const auto ab = index.box_begin(a), ae = index.box_end(a);
        const auto bb = index.box_begin(b), be = index.box_end(b);
        for (std::size_t d = 0; d < a.rank; ++d) {
            if (std::min(ae[d], be[d]) <= std::max(ab[d], bb[d])) return false;
        }
        return true;
    };

    // A software pipeline over the targets, so that the misses of the next targets overlap the
    // work on this one: each stage reads what an earlier stage requested a few targets before.
    // Target t + kDescriptor: fetch its descriptor; t + kStrings: its tensor_id and placement;
    // t + kHash: hash tensor_id, fetch the hash slot; t + kGroup: fetch the tensor's group;
    // t + kCoords: its first candidate's coordinates; t: match.
    constexpr std::ptrdiff_t kDescriptor = 16, kStrings = 12, kHash = 8, kGroup = 4, kCoords = 2;
    constexpr std::size_t kRing = 16;  // hashes of targets t .. t + kHash, by index mod kRing
    static_assert(kRing > kHash);
    std::array<std::uint64_t, kRing> hashes{};
    const auto num_targets = static_cast<std::ptrdiff_t>(targets.size());
    auto ahead = [&](std::ptrdiff_t t) {  // the stages of the targets after t
        if (const std::ptrdiff_t u = t + kDescriptor; u >= 0 && u < num_targets) {
            const char* p = reinterpret_cast<const char*>(&targets[u]);
            for (std::size_t off = 0; off < sizeof(TargetDescriptor); off += 64) {
                internal::Prefetch(p + off);
            }
            internal::Prefetch(p + sizeof(TargetDescriptor) - 1);
        }
        if (const std::ptrdiff_t u = t + kStrings; u >= 0 && u < num_targets) {
            internal::Prefetch(targets[u].tensor_id.data());
            internal::Prefetch(targets[u].placement.entries().data());
        }
        if (const std::ptrdiff_t u = t + kHash; u >= 0 && u < num_targets) {
            const std::uint64_t h = ManifestIndex::HashId(targets[u].tensor_id);
            hashes[std::size_t(u) % kRing] = h;
            index.PrefetchSlot(h);
        }
        if (const std::ptrdiff_t u = t + kGroup; u >= 0 && u < num_targets) {
            index.PrefetchGroup(hashes[std::size_t(u) % kRing]);
        }
        if (const std::ptrdiff_t u = t + kCoords; u >= 0 && u < num_targets) {
            index.PrefetchCoords(hashes[std::size_t(u) % kRing]);
        }
    };
    for (std::ptrdiff_t t = -kDescriptor; t < 0; ++t) ahead(t);
    for (std::size_t t = 0; t < targets.size(); ++t) {
        ahead(static_cast<std::ptrdiff_t>(t));
        const TargetDescriptor& tgt = targets[t];
        sel.target_begin[t] = static_cast<std::uint32_t>(sel.matches.size());
        const std::uint32_t group = index.Lookup(hashes[t % kRing], tgt.tensor_id);
        if (group == ManifestIndex::kNone) {
            return NotFound("target " + tgt.target_id + ": tensor '" + tgt.tensor_id +
                            "' has no source object in the manifest");
        }
        const std::size_t rank = tgt.box.rank();
        matched.clear();
        Index covered = 0;
        // owner(AXIS) ordinals of this target, looked up once per axis.
        std::uint32_t cached_axis = ManifestIndex::kNone;
        std::optional<std::int64_t> cached_ordinal;
        for (const Candidate& c : index.candidates(group)) {
            const auto shape = index.global_shape(c);
            bool inside = rank == c.rank;
            for (std::size_t d = 0; inside && d < rank; ++d) inside = tgt.box.end(d) <= shape[d];
            if (!inside) {
                return InvalidArgument("target " + tgt.target_id + " box " +
                                       tgt.box.ToString() + " is not inside tensor '" +
                                       tgt.tensor_id + "' of shape " +
                                       internal::JoinIndices(shape));
            }
            if (c.kind == PlacementPolicy::Kind::kOwner) {
                if (cached_axis != c.axis) {
                    cached_axis = c.axis;
                    cached_ordinal = tgt.placement.Get(index.axes()[c.axis]);
                }
                if (c.owner < 0 || !cached_ordinal || *cached_ordinal != c.owner) continue;
            }
            const auto lo = index.box_begin(c), hi = index.box_end(c);
            std::array<Index, kMaxRank> overlap_lo, overlap_hi;
            Index volume = 1;
            for (std::size_t d = 0; d < rank && volume > 0; ++d) {
                const Index a = std::max(lo[d], tgt.box.begin(d));
                const Index b = std::min(hi[d], tgt.box.end(d));
                overlap_lo[d] = a;
                overlap_hi[d] = b;
                volume = b > a ? volume * (b - a) : 0;  // <= the target's volume
            }
            if (volume == 0) continue;
            for (const Candidate* other : matched) {
                if (boxes_meet(*other, c)) {
                    return InvalidArgument("target " + tgt.target_id +
                                           " matches overlapping sources " +
                                           manifest[other->source].source_ref + " and " +
                                           manifest[c.source].source_ref);
                }
            }
            if (sel.matches.size() >= kMaxMatches) {
                return InvalidArgument("2^32 - 1 matches or more");
            }
            matched.push_back(&c);
            covered += volume;
            sel.region_bound +=
                internal::RunBound(rank, overlap_lo.data(), overlap_hi.data(), lo, hi,
                                   index.tile_shape(c), c.tiles);
            sel.matches.push_back({c.source, static_cast<std::uint32_t>(t)});
            needed[c.source] = 1;
        }
        if (covered != tgt.box.NumElements()) {
            return NotFound("target " + tgt.target_id + " box " + tgt.box.ToString() +
                            " of '" + tgt.tensor_id + "' is covered by sources for " +
                            std::to_string(covered) + " of " +
                            std::to_string(tgt.box.NumElements()) + " elements");
        }
    }
    sel.target_begin[targets.size()] = static_cast<std::uint32_t>(sel.matches.size());
    for (std::size_t i = 0; i < needed.size(); ++i) {
        if (needed[i]) sel.needed_sources.push_back(static_cast<std::uint32_t>(i));
    }
    return sel;
}

/// SelectSources with a ManifestIndex built for this call.
/// Errors: as above.
inline Result<SourceSelection> SelectSources(std::span<const SourceDescriptor> manifest,
                                             std::span<const TargetDescriptor> targets) {
    MCS_ASSIGN_OR_RETURN(ManifestIndex index, ManifestIndex::Make(manifest));
    return SelectSources(manifest, index, targets);
}

/// Batch planning totals.
struct PlanStats {
    QueryStats query;
    std::uint64_t sources_matched = 0;
    std::uint64_t regions = 0;
    std::uint64_t requested_entries = 0;  ///< Sum over regions: what per-target reads would move.
    std::uint64_t planned_entries = 0;    ///< Sum over unique reads: what the node moves.
    std::uint64_t planned_bytes = 0;      ///< planned_entries * entry bytes, per source.
    std::uint64_t unique_ranges = 0;      ///< == reads.size().
};

/// A region with what it indexes resolved: the contract of a region (source_ref,
/// generation, target, [start, end), exact_coordinate_filter, apply) plus its overlap box.
struct RegionInfo {
    std::uint32_t source_index = 0;
    std::uint32_t target_index = 0;
    std::uint32_t read_index = 0;
    std::string_view source_ref;
    std::string_view target_id;
    Generation generation;
    ApplyMode apply = ApplyMode::kOverwrite;
    EntryRange range;
    Box overlap;  ///< source box ∩ target box, global coordinates.
};

/// The regions of one match: [begin, end) into BatchPlan::regions.
struct RegionSpan {
    std::uint32_t begin = 0;
    std::uint32_t end = 0;
    std::uint32_t size() const { return end - begin; }
};

/// A whole batch, in flat arrays. Regions are stored source by source (the order the planner
/// makes them in, so that each source's tile index is read once while hot and its reads are
/// formed right away); each match (one target's use of one source) owns one contiguous span of
/// them, sorted by start. A target's regions are its matches' spans, in match order. Reads are
/// sorted by (source, node, start); each (source, node) is one ReadGroup. Sources and targets
/// are named by position in the spans that were planned; the accessors that resolve them take
/// those spans again.
struct BatchPlan {
    SourceSelection selection;  ///< Steps 1-2, as planned (moved in by PlanBatch).
    /// Per match (as in selection.matches), its regions.
    std::vector<RegionSpan> match_regions;
    /// Grouped by source (manifest order), then by match; each match's sorted by start.
    std::vector<Region> regions;
    std::vector<UniqueRead> reads;        ///< Sorted by (source, node, start).
    std::vector<ReadGroup> read_groups;   ///< Sorted by (source, node); cover `reads` in order.
    std::vector<std::string> nodes;       ///< Node ids, indexed by ReadGroup::node.
    PlanStats stats;

    std::size_t num_targets() const { return selection.num_targets(); }
    std::span<const SourceMatch> matches() const { return selection.matches; }
    /// Empties it, keeping the arrays' capacity (the selection's too).
    void Clear() {
        selection.Clear();
        match_regions.clear();
        regions.clear();
        reads.clear();
        read_groups.clear();
        nodes.clear();
        stats = {};
    }
    /// Target t's matches (indexes into matches()): [first, last).
    std::pair<std::size_t, std::size_t> match_range(std::size_t t) const {
        return {selection.target_begin[t], selection.target_begin[t + 1]};
    }
    /// Match m's regions (one target, one source), sorted by start.
    std::span<const Region> regions_of_match(std::size_t m) const {
        const RegionSpan span = match_regions[m];
        return std::span<const Region>(regions).subspan(span.begin, span.size());
    }
    /// Target t's regions, match by match (a copy: for inspection and tests; readers iterate
    /// match_range(t) and regions_of_match).
    std::vector<Region> CollectRegions(std::size_t t) const {
        std::vector<Region> out;
        const auto [first, last] = match_range(t);
        for (std::size_t m = first; m < last; ++m) {
            const auto span = regions_of_match(m);
            out.insert(out.end(), span.begin(), span.end());
        }
        return out;
    }
    /// The group (source, node) of read r. O(log groups).
    const ReadGroup& group_of_read(std::size_t r) const {
        auto it = std::upper_bound(read_groups.begin(), read_groups.end(), r,
                                   [](std::size_t v, const ReadGroup& g) { return v < g.end; });
        return *it;
    }

    /// Resolves region `r` of match `m` against the spans it was planned from.
    RegionInfo Describe(std::size_t m, const Region& r, std::span<const SourceDescriptor> manifest,
                        std::span<const TargetDescriptor> targets) const {
        const SourceMatch& match = selection.matches[m];
        const SourceDescriptor& src = manifest[match.source_index];
        const TargetDescriptor& tgt = targets[match.target_index];
        return {match.source_index, match.target_index, r.read_index(), src.source_ref,
                tgt.target_id,      src.generation,     src.apply,      r.range(),
                match.Overlap(manifest, targets)};
    }

    /// Per read, the regions it serves (its fan-out). O(regions); not kept in the plan, which
    /// no reader needs on its hot path.
    std::vector<std::uint32_t> ReadConsumers() const {
        std::vector<std::uint32_t> consumers(reads.size(), 0);
        for (const Region& r : regions) ++consumers[r.read_index()];
        return consumers;
    }
};

/// The tile index of each manifest source, by manifest position (nullptr: not loaded). Only
/// the sources a selection needs must be loaded; a span shorter than the manifest leaves the
/// rest unloaded.
using TileIndexLookup = std::span<const TileIndex* const>;

namespace internal {

/// Step 5 for one (source, node): dedups the regions of `spans` (one run per match, each
/// sorted by start) into reads appended to `reads`, and sets each region's read index.
/// Requests are visited in (start, end) order; overlapping ones (and, with gap >= 0, ones at
/// most `gap` entries apart) share one read. One run is walked, two are merged with two
/// pointers, a few by picking the smallest head, many are sorted.
inline void MergeIntoReads(std::vector<Region>& regions, std::span<const RegionSpan> spans,
                           std::int64_t gap, std::vector<UniqueRead>& reads,
                           std::vector<RegionSpan>& heads, std::vector<std::uint32_t>& order) {
    Region* const rg = regions.data();
    const bool use_gap = gap >= 0;
    const auto ugap = static_cast<std::uint64_t>(use_gap ? gap : 0);
    // At most one read per region: size `reads` for that (within its capacity, which the
    // planner keeps >= regions), write in place, and trim at the end.
    std::size_t total = 0;
    for (const RegionSpan& s : spans) total += s.size();
    const std::size_t base = reads.size();
    reads.resize(base + total);
    UniqueRead* const out = reads.data() + base;
    std::size_t n = 0;  // reads closed so far
    std::uint64_t cur_start = 0, cur_end = 0;
    bool open = false;
    auto add = [&](Region& r) MCS_PLANNER_INLINE {
        const std::uint64_t rs = r.start, re = r.end();
        if (open && (rs < cur_end || (use_gap && rs - cur_end <= ugap))) {
            if (re > cur_end) cur_end = re;
        } else {
            if (open) out[n++] = {cur_start, cur_end};
            cur_start = rs;
            cur_end = re;
            open = true;
        }
        r.set_read_index(static_cast<std::uint32_t>(base + n));
    };
    auto less = [&](std::uint32_t p, std::uint32_t q) MCS_PLANNER_INLINE {
        return rg[p].start != rg[q].start ? rg[p].start < rg[q].start : rg[p].length < rg[q].length;
    };
    if (spans.size() == 1) {
        for (std::uint32_t q = spans[0].begin; q < spans[0].end; ++q) add(rg[q]);
    } else if (spans.size() == 2) {  // e.g. the two TP parts of one EP replica
        std::uint32_t a = spans[0].begin, b = spans[1].begin;
        const std::uint32_t ae = spans[0].end, be = spans[1].end;
        while (a < ae && b < be) add(rg[less(b, a) ? b++ : a++]);
        while (a < ae) add(rg[a++]);
        while (b < be) add(rg[b++]);
    } else if (spans.size() <= 16) {
        heads.clear();
        for (const RegionSpan& s : spans) {
            if (s.begin < s.end) heads.push_back(s);
        }
        while (!heads.empty()) {
            std::size_t best = 0;
            for (std::size_t h = 1; h < heads.size(); ++h) {
                if (less(heads[h].begin, heads[best].begin)) best = h;
            }
            add(rg[heads[best].begin]);
            if (++heads[best].begin == heads[best].end) {
                heads[best] = heads.back();
                heads.pop_back();
            }
        }
    } else {
        order.clear();
        for (const RegionSpan& s : spans) {
            for (std::uint32_t q = s.begin; q < s.end; ++q) order.push_back(q);
        }
        std::sort(order.begin(), order.end(), less);
        for (std::uint32_t q : order) add(rg[q]);
    }
    if (open) out[n++] = {cur_start, cur_end};
    reads.resize(base + n);
}

}  // namespace internal

/// Steps 4-5: plans entry ranges for every (target, source) match and dedups them into unique
/// physical reads per node. Takes the selection by value (pass std::move(selection) unless you
/// need it afterwards) and keeps it in the plan.
///
/// It works source by source: all matches of one source are queried back to back (its tile
/// index and tile_ptr lines are read once, while hot), and that source's reads are formed right
/// away from its matches' runs, which are already sorted (one per target), so they are merged,
/// never sorted. Sources are pipelined: a few sources ahead of the one being planned, their tile
/// index, target boxes and the tile_ptr lines their queries will read are already being fetched.
/// Regions and reads go to flat arrays sized once from the selection's region_bound (exact for
/// dense indexes; without one, the capacity follows the regions per match seen so far: one or
/// two reallocations, not a doubling series whose abandoned buffers would each be paged in);
/// a source's regions are written in place, run j of the source being region base + j.
/// O(matches + regions) beyond the queries.
/// Node ids are numbered in order of first appearance in this (source-major) order.
///
/// `recycle`: a plan this caller is done with, typically the previous step's. Its region,
/// read and match arrays are emptied and written again, so the plan lands in memory that is
/// already paged in (a fresh node plan of half a million regions pays thousands of page
/// faults, a fifth of its time), and `*recycle` is left empty. Its selection's arrays are
/// reused by SelectSources, not here: a step is
///     auto index = ManifestIndex::Make(manifest, &last_index);
///     auto sel = SelectSources(manifest, *index, targets, &last_plan.selection);
///     auto plan = PlanBatch(manifest, targets, std::move(*sel), lookup, options, &last_plan);
/// Errors: NotFound (a needed tile index missing); InvalidArgument (a selection for other
/// targets or another manifest, a tile index that does not match its descriptor);
/// ResourceExhausted (PlanningLimits).
inline Result<BatchPlan> PlanBatch(std::span<const SourceDescriptor> manifest,
                                   std::span<const TargetDescriptor> targets,
                                   SourceSelection selection, TileIndexLookup indexes,
                                   const PlanOptions& options = {},
                                   BatchPlan* recycle = nullptr) {
    if (selection.num_targets() != targets.size()) {
        return InvalidArgument("selection was made for a different target set");
    }
    if (!targets.empty() && (selection.target_begin.front() != 0 ||
                             selection.target_begin.back() != selection.matches.size())) {
        return InvalidArgument("selection target offsets do not span its matches");
    }
    BatchPlan plan;
    if (recycle != nullptr) {
        plan = std::move(*recycle);
        *recycle = BatchPlan();
        plan.Clear();
    }
    plan.selection = std::move(selection);
    const std::vector<SourceMatch>& matches = plan.selection.matches;
    const std::vector<std::uint32_t>& target_begin = plan.selection.target_begin;
    const std::size_t num_matches = matches.size();
    for (std::size_t t = 0; t < targets.size(); ++t) {
        if (target_begin[t] > target_begin[t + 1]) {
            return InvalidArgument("selection target offsets are not monotonic");
        }
        for (std::size_t m = target_begin[t]; m < target_begin[t + 1]; ++m) {
            if (matches[m].target_index != t || matches[m].source_index >= manifest.size()) {
                return InvalidArgument("selection was made for a different manifest or targets");
            }
        }
    }

    // Node ids in order of first appearance, found when a target's first match is planned
    // (its descriptor is being read then anyway; targets usually share a node).
    constexpr std::uint32_t kNoNode = 0xffffffffu;
    std::vector<std::uint32_t> target_node(targets.size(), kNoNode);
    std::unordered_map<std::string_view, std::uint32_t> node_ids;
    std::uint32_t last_node = kNoNode;
    auto node_of_target = [&](std::size_t t) {
        if (target_node[t] != kNoNode) return target_node[t];
        const std::string_view node = targets[t].node_id;
        if (last_node == kNoNode || node != plan.nodes[last_node]) {
            auto [it, inserted] =
                node_ids.try_emplace(node, static_cast<std::uint32_t>(plan.nodes.size()));
            if (inserted) plan.nodes.push_back(targets[t].node_id);
            last_node = it->second;
        }
        return target_node[t] = last_node;
    };
    auto node_of = [&](std::uint32_t m) { return target_node[matches[m].target_index]; };

    // The matches of each source (a counting sort; within a source, in target order). Counted
    // one slot up and placed with source_begin[s + 1] as the cursor, which leaves
    // source_begin[s] at the first match of s: no cursor array.
    std::vector<std::uint32_t> source_begin(manifest.size() + 2, 0);
    for (const SourceMatch& mt : matches) ++source_begin[mt.source_index + 2];
    for (std::size_t s = 0; s < manifest.size(); ++s) source_begin[s + 2] += source_begin[s + 1];
    std::vector<std::uint32_t> by_source(num_matches);
    for (std::size_t m = 0; m < num_matches; ++m) {
        by_source[source_begin[matches[m].source_index + 1]++] = static_cast<std::uint32_t>(m);
    }

    const std::uint64_t max_regions =
        std::min<std::uint64_t>(options.limits.max_regions, Region::kMaxReadIndex);
    std::vector<Region>& regions = plan.regions;
    std::vector<UniqueRead>& reads = plan.reads;
    plan.match_regions.resize(num_matches);
    // One region per match is the common case (whole sources, row bands); the capacity then
    // follows what was seen. Reads never outnumber regions.
    auto reserve = [&](std::uint64_t want) {
        want = std::min(want, max_regions + 1);
        regions.reserve(want);
        reads.reserve(want);
    };
    // A selection's region_bound is exact for dense indexes (any update that changes more
    // than a few entries per tile); without one, start at one region per match (whole sources,
    // row bands) and let the capacity follow what is seen.
    const std::uint64_t bound = plan.selection.region_bound;
    reserve(bound != 0 ? bound : num_matches + num_matches / 8 + 16);
    // Before `need` regions are stored: when they do not fit, extrapolate the regions per match
    // so far (+1/8) to the matches left.
    auto grow = [&](std::uint64_t need, std::uint64_t matches_done) {
        if (need <= regions.capacity()) return;
        const std::uint64_t left = num_matches - matches_done;
        const std::uint64_t want = need + need / 8 + need * left / matches_done;
        reserve(std::max<std::uint64_t>(
            need, std::max<std::uint64_t>(want, regions.capacity() + regions.capacity() / 2)));
    };

    // The sources to plan, in manifest order, as a three-stage pipeline so that the misses of
    // one source overlap the work on others: kFar sources ahead, fetch the tile index object,
    // the descriptor and the target boxes; kNear ahead, validate, query in tile space and fetch
    // the tile_ptr lines of every run; then make regions and reads.
    std::vector<std::uint32_t> with_regions;
    with_regions.reserve(plan.selection.needed_sources.size());
    for (std::size_t s = 0; s < manifest.size(); ++s) {
        if (source_begin[s] != source_begin[s + 1]) with_regions.push_back(static_cast<std::uint32_t>(s));
    }
    plan.read_groups.reserve(with_regions.size());
    constexpr std::size_t kFar = 12, kNear = 4;
    struct Pending {
        std::vector<TileRange> runs;         ///< All matches' runs, match after match.
        std::vector<std::uint32_t> run_end;  ///< Per match (in group order): end into runs.
    };
    std::array<Pending, kNear + 1> pending;
    auto index_of = [&](std::uint32_t s) -> const TileIndex* {
        return s < indexes.size() ? indexes[s] : nullptr;
    };
    auto prefetch_object = [](const void* p, std::size_t bytes) {
        const char* c = static_cast<const char*>(p);
        for (std::size_t off = 0; off < bytes; off += 64) internal::Prefetch(c + off);
    };
    auto fetch_far = [&](std::uint32_t s) {
        if (const TileIndex* index = index_of(s)) index->PrefetchSelf();
        // What is read of a descriptor: its rank, box, nnz, num_tiles and dtypes (not its ids,
        // placement or tile shape).
        const SourceDescriptor& src = manifest[s];
        prefetch_object(&src.global_shape, sizeof(src.global_shape));
        prefetch_object(&src.box, sizeof(Box));
        internal::Prefetch(&src.nnz);
        internal::Prefetch(&src.value_dtype);
        for (std::uint32_t k = source_begin[s]; k < source_begin[s + 1]; ++k) {
            const TargetDescriptor& tgt = targets[matches[by_source[k]].target_index];
            prefetch_object(&tgt.node_id, sizeof(tgt.node_id));
            prefetch_object(&tgt.box, sizeof(Box));
        }
    };
    // Stage kNear: checks, node grouping and tile-space queries of source s into `p`.
    auto query = [&](std::uint32_t s, Pending& p) -> Status {
        const SourceDescriptor& src = manifest[s];
        const TileIndex* index = index_of(s);
        if (index == nullptr) {
            return NotFound("tile index of source " + src.source_ref + " is not loaded");
        }
        if (!index->Describes(src)) {
            return InvalidArgument("tile index of " + src.source_ref +
                                   " does not match its descriptor");
        }
        // This source's matches grouped by node (stable: they usually share one node).
        const auto group = std::span<std::uint32_t>(by_source).subspan(
            source_begin[s], source_begin[s + 1] - source_begin[s]);
        for (std::uint32_t m : group) node_of_target(matches[m].target_index);
        if (!std::all_of(group.begin(), group.end(),
                         [&](std::uint32_t m) { return node_of(m) == node_of(group[0]); })) {
            std::stable_sort(group.begin(), group.end(), [&](std::uint32_t x, std::uint32_t y) {
                return node_of(x) < node_of(y);
            });
        }
        p.runs.clear();
        p.run_end.clear();
        for (std::uint32_t m : group) {
            bool disjoint = false;
            MCS_RETURN_IF_ERROR(index->QueryTilesIntersecting(targets[matches[m].target_index].box,
                                                              options.limits, p.runs,
                                                              plan.stats.query, disjoint));
            if (disjoint) return InvalidArgument("selection matches a disjoint source and target");
            p.run_end.push_back(static_cast<std::uint32_t>(p.runs.size()));
        }
        for (const TileRange& t : p.runs) index->PrefetchEntries(t);
        return Status::Ok();
    };

    std::vector<RegionSpan> spans, heads;
    std::vector<std::uint32_t> order;
    std::size_t matches_done = 0;
    for (std::size_t i = 0; i < std::min(kFar, with_regions.size()); ++i) fetch_far(with_regions[i]);
    for (std::size_t i = 0; i < std::min(kNear, with_regions.size()); ++i) {
        MCS_RETURN_IF_ERROR(query(with_regions[i], pending[i % pending.size()]));
    }
    for (std::size_t i = 0; i < with_regions.size(); ++i) {
        if (i + kFar < with_regions.size()) fetch_far(with_regions[i + kFar]);
        if (i + kNear < with_regions.size()) {
            MCS_RETURN_IF_ERROR(query(with_regions[i + kNear], pending[(i + kNear) % pending.size()]));
        }
        const std::uint32_t s = with_regions[i];
        const TileIndex& index = *index_of(s);
        const Pending& p = pending[i % pending.size()];
        const auto group = std::span<const std::uint32_t>(by_source).subspan(
            source_begin[s], source_begin[s + 1] - source_begin[s]);
        ++plan.stats.sources_matched;

        // Step 4: each match's runs become its regions. In a source of fewer than 2^32 entries
        // (any but a giant one) no range needs splitting, so run j of the source is region
        // base + j: the regions are sized at once and written in place. In a giant source a
        // longer range becomes consecutive regions.
        matches_done += group.size();
        const std::size_t base = regions.size();
        const std::size_t num_runs = p.runs.size();
        std::uint64_t requested = 0;
        if (index.nnz() <= Region::kMaxLength) {
            if (base + num_runs > max_regions) {
                return ResourceExhausted("batch plan exceeds " + std::to_string(max_regions) +
                                         " regions");
            }
            grow(base + num_runs, matches_done);
            regions.resize(base + num_runs);
            Region* const out = regions.data() + base;
            const TileRange* const run = p.runs.data();
            for (std::size_t j = 0; j < num_runs; ++j) {
                const EntryRange r = index.Entries(run[j]);
                requested += r.size();
                out[j].start = r.start;
                out[j].length = static_cast<std::uint32_t>(r.size());
                out[j].set_exact_coordinate_filter(r.exact_coordinate_filter);
            }
            std::uint32_t begin = 0;
            for (std::size_t k = 0; k < group.size(); ++k) {
                plan.match_regions[group[k]] = {static_cast<std::uint32_t>(base + begin),
                                                static_cast<std::uint32_t>(base + p.run_end[k])};
                begin = p.run_end[k];
            }
        } else {
            grow(base + num_runs, matches_done);
            std::uint32_t run = 0;
            for (std::size_t k = 0; k < group.size(); ++k) {
                const std::uint32_t m = group[k];
                plan.match_regions[m].begin = static_cast<std::uint32_t>(regions.size());
                const std::uint32_t run_end = p.run_end[k];
                for (; run < run_end; ++run) {
                    const EntryRange r = index.Entries(p.runs[run]);
                    requested += r.size();
                    Region region;
                    region.set_exact_coordinate_filter(r.exact_coordinate_filter);
                    for (std::uint64_t at = r.start; at < r.end; at += region.length) {
                        region.start = at;
                        region.length =
                            static_cast<std::uint32_t>(std::min(r.end - at, Region::kMaxLength));
                        regions.push_back(region);
                    }
                }
                plan.match_regions[m].end = static_cast<std::uint32_t>(regions.size());
                if (regions.size() > max_regions) {
                    return ResourceExhausted("batch plan exceeds " + std::to_string(max_regions) +
                                             " regions");
                }
            }
        }

        plan.stats.requested_entries += requested;

        // Step 5: per node, this source's runs (one per match) merged into reads.
        std::uint64_t entries = 0;
        for (std::size_t x = 0; x < group.size();) {
            const std::uint32_t node = node_of(group[x]);
            std::size_t y = x + 1;
            while (y < group.size() && node_of(group[y]) == node) ++y;
            spans.clear();
            for (std::size_t k = x; k < y; ++k) spans.push_back(plan.match_regions[group[k]]);
            const auto first_read = static_cast<std::uint32_t>(reads.size());
            internal::MergeIntoReads(regions, spans, options.read_coalesce_gap, reads, heads, order);
            const auto last_read = static_cast<std::uint32_t>(reads.size());
            if (last_read != first_read) {
                plan.read_groups.push_back({s, node, first_read, last_read});
            }
            for (std::uint32_t r = first_read; r < last_read; ++r) entries += reads[r].size();
            x = y;
        }
        plan.stats.planned_entries += entries;
        plan.stats.planned_bytes += entries * manifest[s].EntryBytes();
    }
    plan.stats.regions = regions.size();
    plan.stats.unique_ranges = reads.size();
    return plan;
}

/// Steps 1-5 in one call when every tile index is at hand.
/// Errors: as SelectSources and PlanBatch.
inline Result<BatchPlan> Plan(std::span<const SourceDescriptor> manifest,
                              const ManifestIndex& manifest_index,
                              std::span<const TargetDescriptor> targets, TileIndexLookup indexes,
                              const PlanOptions& options = {}) {
    MCS_ASSIGN_OR_RETURN(SourceSelection selection,
                         SelectSources(manifest, manifest_index, targets));
    return PlanBatch(manifest, targets, std::move(selection), indexes, options);
}

inline Result<BatchPlan> Plan(std::span<const SourceDescriptor> manifest,
                              std::span<const TargetDescriptor> targets, TileIndexLookup indexes,
                              const PlanOptions& options = {}) {
    MCS_ASSIGN_OR_RETURN(SourceSelection selection, SelectSources(manifest, targets));
    return PlanBatch(manifest, targets, std::move(selection), indexes, options);
}

}  // namespace mooncake::sparse
