// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Which sources each target reads, from the manifest alone (docs/design.md §4 steps 1 and 2):
// placement filtering, box intersection and the check that a target's sources cover it.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/internal/compiler.h"
#include "mooncake/sparse/internal/run_bound.h"
#include "mooncake/sparse/manifest_index.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

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

}  // namespace mooncake::sparse
