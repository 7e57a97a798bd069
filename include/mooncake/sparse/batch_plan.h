// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Batch planning of a whole target set (docs/design.md §4 steps 4 and 5): every (target, source)
// match's entry ranges, deduplicated into unique physical reads per node.
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
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/internal/compiler.h"
#include "mooncake/sparse/manifest_index.h"
#include "mooncake/sparse/source_selection.h"
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
