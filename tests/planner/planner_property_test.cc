// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Randomised (deterministically seeded) properties of the planner against a brute-force scan:
// random shapes (1-D to 4-D), tile shapes, densities (empty, one entry, sparse, dense), source
// boxes and query boxes (single elements, edges, tile-aligned, whole). Failures print the seed
// and iteration so a case can be replayed.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mooncake/sparse/planner.h"
#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::Axes;
using ::mooncake::sparse::testing::BruteForceScan;
using ::mooncake::sparse::testing::BuildSource;
using ::mooncake::sparse::testing::BuiltSource;
using ::mooncake::sparse::testing::ExpectSamePlan;
using ::mooncake::sparse::testing::ExpectWellFormedRanges;
using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::LookupOf;
using ::mooncake::sparse::testing::MakeBox;
using ::mooncake::sparse::testing::MakeTarget;
using ::mooncake::sparse::testing::ManifestOf;
using ::mooncake::sparse::testing::Policy;
using ::mooncake::sparse::testing::RandomCoords;
using ::mooncake::sparse::testing::RegionsOf;
using ::mooncake::sparse::testing::SelectEntries;
using ::mooncake::sparse::testing::SourceSpec;
using ::mooncake::sparse::testing::ValueOrDie;

Index Uniform(std::mt19937_64& rng, Index lo, Index hi) {  // inclusive
    return std::uniform_int_distribution<Index>(lo, hi)(rng);
}

Shape RandomShape(std::mt19937_64& rng, std::size_t rank) {
    const Index max_extent = rank == 1 ? 400 : rank == 2 ? 72 : rank == 3 ? 18 : 7;
    Shape s(rank);
    for (Index& e : s) e = Uniform(rng, 1, max_extent);
    return s;
}

std::size_t RandomRank(std::mt19937_64& rng) {
    // Mostly 2-D (the row/column paths) and 3-D (fused experts), some 1-D and 4-D.
    static const std::size_t kRanks[] = {1, 2, 2, 2, 2, 3, 3, 3, 4};
    return kRanks[Uniform(rng, 0, 8)];
}

Shape RandomTile(std::mt19937_64& rng, const Shape& shape) {
    Shape t(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) {
        switch (Uniform(rng, 0, 5)) {
            case 0: t[d] = 1; break;
            case 1: t[d] = shape[d]; break;                        // one tile
            case 2: t[d] = std::max<Index>(1, shape[d] - Uniform(rng, 0, 2)); break;  // ~one tile
            default: t[d] = Uniform(rng, 1, std::max<Index>(1, shape[d] / 2)); break;
        }
    }
    return t;
}

/// A random box inside `outer`: general, a single element, touching an edge, tile-aligned, or
/// the whole of `outer`.
Box RandomBox(std::mt19937_64& rng, const Box& outer, const Shape& tile) {
    const std::size_t rank = outer.rank();
    Shape origin(rank), extent(rank);
    const int kind = static_cast<int>(Uniform(rng, 0, 9));
    for (std::size_t d = 0; d < rank; ++d) {
        Index lo = Uniform(rng, outer.begin(d), outer.end(d) - 1);
        Index hi = Uniform(rng, lo + 1, outer.end(d));
        switch (kind) {
            case 0: hi = lo + 1; break;                            // single element
            case 1: lo = outer.begin(d); break;                    // low edge
            case 2: hi = outer.end(d); break;                      // high edge
            case 3: lo = outer.begin(d); hi = outer.end(d); break; // whole
            case 4:                                                // whole in all dims but one
                if (d != 0) { lo = outer.begin(d); hi = outer.end(d); }
                break;
            case 5: {                                              // snapped to tiles
                const Index a = std::max(outer.begin(d), lo / tile[d] * tile[d]);
                const Index b = std::min(outer.end(d), (hi + tile[d] - 1) / tile[d] * tile[d]);
                lo = a;
                hi = std::max(b, a + 1);
                break;
            }
            default: break;
        }
        origin[d] = lo;
        extent[d] = hi - lo;
    }
    return MakeBox(origin, extent);
}

/// Entry count for a box of `n` elements: empty, one entry, or a density from sparse to full.
std::int64_t RandomCount(std::mt19937_64& rng, Index n) {
    static const double kDensities[] = {0.0, -1.0, 0.002, 0.02, 0.1, 0.3, 0.7, 1.0};
    const double density = kDensities[Uniform(rng, 0, 7)];
    if (density < 0) return 1;
    return static_cast<std::int64_t>(density * static_cast<double>(n));
}

/// A random sub-box of the tensor for a source (half the time the whole tensor).
Box RandomSourceBox(std::mt19937_64& rng, const Shape& shape) {
    const Box whole = ValueOrDie(Box::Whole(shape));
    if (Uniform(rng, 0, 1) == 0) return whole;
    Shape origin(shape.size()), extent(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) {
        const Index lo = Uniform(rng, 0, shape[d] - 1);
        origin[d] = lo;
        extent[d] = Uniform(rng, lo + 1, shape[d]) - lo;
    }
    return MakeBox(origin, extent);
}

TEST(PlannerPropertyTest, QueryMatchesBruteForce) {
    constexpr std::uint64_t kSeed = 0x5eed0001;
    std::mt19937_64 rng(kSeed);
    std::map<std::string, int> paths;
    int nonempty_queries = 0;
    for (int iter = 0; iter < 300; ++iter) {
        SCOPED_TRACE("seed " + std::to_string(kSeed) + " iteration " + std::to_string(iter));
        SourceSpec spec;
        spec.global_shape = RandomShape(rng, RandomRank(rng));
        spec.tile_shape = RandomTile(rng, spec.global_shape);
        const Box src_box = RandomSourceBox(rng, spec.global_shape);
        spec.box_origin.assign(src_box.origin().begin(), src_box.origin().end());
        spec.box_shape.assign(src_box.shape().begin(), src_box.shape().end());
        const auto coords = RandomCoords(rng, src_box, RandomCount(rng, src_box.NumElements()));
        auto built = BuildSource(spec, coords);
        ASSERT_THAT(built, IsOk());
        const BuiltSource& src = *built;
        const std::size_t rank = spec.global_shape.size();
        SCOPED_TRACE("shape " + MakeBox(Shape(rank, 0), spec.global_shape).ToString() +
                     " tile " + MakeBox(Shape(rank, 0), spec.tile_shape).ToString() +
                     " source " + src_box.ToString() + " nnz " + std::to_string(src.nnz()));

        for (int q = 0; q < 12; ++q) {
            const Box box = q == 0 ? src_box : RandomBox(rng, src_box, spec.tile_shape);
            SCOPED_TRACE("box " + box.ToString());
            std::vector<EntryRange> ranges;
            QueryStats stats;
            ASSERT_THAT(src.index->Query(box, {}, ranges, stats), IsOk());
            EXPECT_EQ(stats.queries, 1u);
            const std::uint64_t paths_taken =
                stats.whole_source + stats.row_path + stats.column_path + stats.nd_path;
            EXPECT_EQ(paths_taken, src.nnz() == 0 ? 0u : 1u);
            if (src.nnz() != 0) {
                // The O(1) path is taken exactly when the query covers the whole source box.
                EXPECT_EQ(stats.whole_source == 1, box == src_box);
                if (stats.whole_source) {
                    EXPECT_TRUE(Contains(box, src_box));
                    EXPECT_EQ(ranges, (std::vector<EntryRange>{{0, src.nnz(), false}}));
                } else if (src.rank() == 2) {
                    EXPECT_EQ(stats.nd_path, 0u);
                } else {
                    EXPECT_EQ(stats.nd_path, 1u);
                }
                paths[stats.whole_source ? "whole"
                      : stats.row_path   ? "row"
                      : stats.column_path ? "column"
                                          : "nd"]++;
            }
            ExpectWellFormedRanges(src, ranges, box);
            const auto selected = SelectEntries(src, ranges, box);
            const auto expected = BruteForceScan(src, box);
            ASSERT_EQ(selected, expected);
            nonempty_queries += expected.empty() ? 0 : 1;
            // The work done is bounded by the tiles planned, never by nnz.
            std::uint64_t planned = 0;
            for (const EntryRange& r : ranges) planned += r.size();
            EXPECT_GE(planned, expected.size());
        }
    }
    // The generator reached every path, and the checks were not vacuous.
    EXPECT_GT(paths["whole"], 0);
    EXPECT_GT(paths["row"], 0);
    EXPECT_GT(paths["column"], 0);
    EXPECT_GT(paths["nd"], 0);
    EXPECT_GT(nonempty_queries, 1000);
}

TEST(PlannerPropertyTest, QueryUnderTightLimitsFailsClosedOrMatches) {
    // With random small budgets a query either succeeds exactly or reports ResourceExhausted and
    // leaves the output untouched; it never returns a partial plan.
    constexpr std::uint64_t kSeed = 0x5eed0002;
    std::mt19937_64 rng(kSeed);
    int exhausted = 0, succeeded = 0;
    for (int iter = 0; iter < 100; ++iter) {
        SCOPED_TRACE("seed " + std::to_string(kSeed) + " iteration " + std::to_string(iter));
        SourceSpec spec;
        spec.global_shape = RandomShape(rng, RandomRank(rng));
        spec.tile_shape = RandomTile(rng, spec.global_shape);
        const Box whole = ValueOrDie(Box::Whole(spec.global_shape));
        const BuiltSource src = ValueOrDie(
            BuildSource(spec, RandomCoords(rng, whole, RandomCount(rng, whole.NumElements()))));
        const Box box = RandomBox(rng, whole, spec.tile_shape);
        PlanningLimits limits;
        limits.max_groups_per_query = static_cast<std::uint64_t>(Uniform(rng, 0, 6));
        limits.max_tiles_per_query = static_cast<std::uint64_t>(Uniform(rng, 0, 12));
        std::vector<EntryRange> out = {{7, 8, false}};
        QueryStats stats;
        Status s = src.index->Query(box, limits, out, stats);
        if (s.ok()) {
            ++succeeded;
            std::vector<EntryRange> ranges(out.begin() + 1, out.end());
            EXPECT_EQ(SelectEntries(src, ranges, box), BruteForceScan(src, box));
        } else {
            ++exhausted;
            EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
            EXPECT_EQ(out, (std::vector<EntryRange>{{7, 8, false}}));
        }
    }
    EXPECT_GT(exhausted, 0);
    EXPECT_GT(succeeded, 0);
}

/// Splits the tensor into `pieces` slabs along `dim` (as many as the extent allows).
std::vector<Box> Slabs(const Shape& shape, std::size_t dim, Index pieces) {
    pieces = std::min(pieces, shape[dim]);
    std::vector<Index> cuts = {0};
    for (Index p = 1; p < pieces; ++p) cuts.push_back(shape[dim] * p / pieces);
    cuts.push_back(shape[dim]);
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<Box> out;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
        Shape origin(shape.size(), 0), extent = shape;
        origin[dim] = cuts[i];
        extent[dim] = cuts[i + 1] - cuts[i];
        out.push_back(MakeBox(origin, extent));
    }
    return out;
}

TEST(PlannerPropertyTest, BatchPlanMatchesBruteForce) {
    constexpr std::uint64_t kSeed = 0x5eed0003;
    std::mt19937_64 rng(kSeed);
    std::uint64_t shared_reads = 0;
    for (int iter = 0; iter < 150; ++iter) {
        SCOPED_TRACE("seed " + std::to_string(kSeed) + " iteration " + std::to_string(iter));
        const std::size_t rank = Uniform(rng, 0, 2) == 0 ? 3 : 2;
        const Shape shape = RandomShape(rng, rank);
        const Shape tile = RandomTile(rng, shape);
        const std::string tensor = "w" + std::to_string(iter);

        // Sources: one complete object, or disjoint slabs that together cover the tensor.
        const auto boxes = Slabs(shape, static_cast<std::size_t>(Uniform(rng, 0, Index(rank) - 1)),
                                 Uniform(rng, 1, 3));
        std::vector<BuiltSource> sources;
        for (std::size_t i = 0; i < boxes.size(); ++i) {
            SourceSpec spec;
            spec.source_ref = tensor + "/src" + std::to_string(i);
            spec.tensor_id = tensor;
            spec.global_shape = shape;
            spec.box_origin.assign(boxes[i].origin().begin(), boxes[i].origin().end());
            spec.box_shape.assign(boxes[i].shape().begin(), boxes[i].shape().end());
            spec.tile_shape = tile;
            const auto base = static_cast<std::uint64_t>(iter);
            spec.generation = {base, base + 1};
            spec.placement = Axes({{"ep", static_cast<std::int64_t>(i)}});
            spec.policy = Policy(Uniform(rng, 0, 1) ? "replicate(ep)" : "none");
            spec.apply = Uniform(rng, 0, 1) ? ApplyMode::kOverwrite : ApplyMode::kScatterAdd;
            sources.push_back(ValueOrDie(BuildSource(
                spec, RandomCoords(rng, boxes[i], RandomCount(rng, boxes[i].NumElements())))));
        }
        // A second tensor's object in the manifest that no target asks for.
        {
            SourceSpec other;
            other.source_ref = tensor + "/other";
            other.tensor_id = tensor + ".other";
            other.global_shape = shape;
            other.tile_shape = tile;
            const Box whole = ValueOrDie(Box::Whole(shape));
            sources.push_back(ValueOrDie(BuildSource(other, RandomCoords(rng, whole, 5))));
        }
        const auto manifest = ManifestOf(sources);

        // Targets: random boxes on a few nodes, some of them repeated (EP replicas of one TP box).
        const Box whole = ValueOrDie(Box::Whole(shape));
        const int num_nodes = static_cast<int>(Uniform(rng, 1, 3));
        std::vector<TargetDescriptor> targets;
        const int num_targets = static_cast<int>(Uniform(rng, 1, 6));
        for (int t = 0; t < num_targets; ++t) {
            const Box box = (t > 0 && Uniform(rng, 0, 2) == 0) ? targets[Uniform(rng, 0, t - 1)].box
                                                               : RandomBox(rng, whole, tile);
            const std::string node = "node" + std::to_string(Uniform(rng, 0, num_nodes - 1));
            targets.push_back(MakeTarget(node + "/rank" + std::to_string(t), node, tensor,
                                         Axes({{"ep", t}, {"tp", 0}}),
                                         Shape(box.origin().begin(), box.origin().end()),
                                         Shape(box.shape().begin(), box.shape().end())));
        }

        PlanOptions options;
        // Mostly -1 (overlaps only) and 0 (adjacent too), sometimes a wider gap.
        options.read_coalesce_gap =
            Uniform(rng, -1, 3) == 3 ? Uniform(rng, 1, 50) : Uniform(rng, -1, 0);
        ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, targets));
        ASSERT_OK_AND_ASSIGN(BatchPlan plan,
                             PlanBatch(manifest, targets, sel, LookupOf(sources), options));

        // The selection bounds the regions from geometry alone (no source here reaches 2^32
        // entries), and PlanBatch only sizes its arrays with it: any value plans the same.
        EXPECT_LE(plan.regions.size(), sel.region_bound);
        for (const std::uint64_t hint :
             {std::uint64_t{0}, std::uint64_t{1}, 3 * sel.region_bound + 7}) {
            SourceSelection hinted = sel;
            hinted.region_bound = hint;
            ASSERT_OK_AND_ASSIGN(BatchPlan again,
                                 PlanBatch(manifest, targets, hinted, LookupOf(sources), options));
            ExpectSamePlan(plan, again);
        }

        // Plan-level bookkeeping.
        ASSERT_EQ(plan.num_targets(), targets.size());
        EXPECT_EQ(plan.stats.sources_matched, sel.needed_sources.size());
        EXPECT_EQ(plan.stats.unique_ranges, plan.reads.size());
        const std::vector<std::uint32_t> consumers = plan.ReadConsumers();
        std::uint64_t planned = 0, requested = 0, regions = 0, total_consumers = 0;
        // Read groups tile the reads in (source, node) order.
        std::vector<std::pair<std::uint32_t, std::uint32_t>> read_key(plan.reads.size());
        std::uint32_t covered_reads = 0;
        for (std::size_t g = 0; g < plan.read_groups.size(); ++g) {
            const ReadGroup& group = plan.read_groups[g];
            EXPECT_EQ(group.begin, covered_reads);
            EXPECT_LT(group.begin, group.end);
            EXPECT_LT(group.node, plan.nodes.size());
            if (g > 0) {
                const ReadGroup& prev = plan.read_groups[g - 1];
                EXPECT_LT(std::tie(prev.source_index, prev.node),
                          std::tie(group.source_index, group.node));
            }
            for (std::uint32_t r = group.begin; r < group.end; ++r) {
                read_key[r] = {group.source_index, group.node};
                EXPECT_EQ(&plan.group_of_read(r), &group);
            }
            covered_reads = group.end;
        }
        EXPECT_EQ(covered_reads, plan.reads.size());
        for (std::size_t i = 0; i < plan.reads.size(); ++i) {
            const UniqueRead& r = plan.reads[i];
            planned += r.size();
            total_consumers += consumers[i];
            EXPECT_LT(r.start, r.end);
            EXPECT_LE(r.end, sources[read_key[i].first].nnz());
            shared_reads += consumers[i] > 1 ? 1 : 0;
        }
        EXPECT_EQ(plan.stats.planned_entries, planned);

        // Reads: sorted by (source, node, start); disjoint per (source, node), and farther apart
        // than the coalescing gap.
        for (std::size_t i = 1; i < plan.reads.size(); ++i) {
            const UniqueRead& a = plan.reads[i - 1];
            const UniqueRead& b = plan.reads[i];
            ASSERT_LE(std::tie(read_key[i - 1].first, read_key[i - 1].second, a.start),
                      std::tie(read_key[i].first, read_key[i].second, b.start));
            if (read_key[i - 1] == read_key[i]) {
                EXPECT_GE(b.start, a.end) << "an entry is read twice on a node";
                if (options.read_coalesce_gap >= 0) {
                    const auto gap = static_cast<std::uint64_t>(options.read_coalesce_gap);
                    EXPECT_GT(b.start, a.end + gap);
                }
            }
        }

        // Each read is exactly the union hull of the regions it serves.
        std::vector<std::uint64_t> lo(plan.reads.size(), UINT64_MAX), hi(plan.reads.size(), 0);
        std::vector<std::uint32_t> served(plan.reads.size(), 0);
        for (std::size_t t = 0; t < targets.size(); ++t) {
            SCOPED_TRACE("target " + targets[t].target_id + " " + targets[t].box.ToString());
            const auto regs = RegionsOf(plan, t, manifest, targets);
            regions += regs.size();
            std::map<std::size_t, std::vector<EntryRange>> by_source;
            for (std::size_t k = 0; k < regs.size(); ++k) {
                const Region& r = regs[k].region;
                const RegionInfo& info = regs[k].info;
                requested += r.size();
                EXPECT_EQ(info.target_index, t);
                ASSERT_LT(r.read_index(), plan.reads.size());
                const UniqueRead& read = plan.reads[r.read_index()];
                EXPECT_EQ(read_key[r.read_index()].first, info.source_index);
                EXPECT_EQ(plan.nodes[read_key[r.read_index()].second], targets[t].node_id);
                EXPECT_LE(read.start, r.start);
                EXPECT_GE(read.end, r.end());
                lo[r.read_index()] = std::min(lo[r.read_index()], r.start);
                hi[r.read_index()] = std::max(hi[r.read_index()], r.end());
                ++served[r.read_index()];
                const SourceDescriptor& src = manifest[info.source_index];
                EXPECT_EQ(src.tensor_id, targets[t].tensor_id);
                EXPECT_EQ(info.source_ref, src.source_ref);
                EXPECT_EQ(info.generation, src.generation);
                EXPECT_EQ(info.apply, src.apply);
                auto overlap = Intersect(src.box, targets[t].box);
                ASSERT_TRUE(overlap.has_value());
                EXPECT_EQ(info.overlap, *overlap);
                if (k > 0) {
                    ASSERT_LE(std::pair(regs[k - 1].info.source_index, regs[k - 1].region.start),
                              std::pair(info.source_index, r.start));
                }
                by_source[info.source_index].push_back(r.range());
            }
            // Filtered regions select exactly the target's entries, source by source.
            for (std::size_t s = 0; s + 1 < sources.size(); ++s) {
                auto overlap = Intersect(sources[s].desc.box, targets[t].box);
                const auto expected =
                    overlap ? BruteForceScan(sources[s], *overlap) : std::vector<std::uint64_t>{};
                const auto& ranges = by_source[s];
                if (overlap) ExpectWellFormedRanges(sources[s], ranges, *overlap);
                const auto selected = overlap ? SelectEntries(sources[s], ranges, *overlap)
                                              : std::vector<std::uint64_t>{};
                EXPECT_EQ(selected, expected) << "source " << s;
                if (!overlap) {
                    EXPECT_TRUE(ranges.empty());
                }
            }
            EXPECT_TRUE(by_source.find(sources.size() - 1) == by_source.end())
                << "the other tensor's object was planned";
        }
        EXPECT_EQ(plan.stats.requested_entries, requested);
        EXPECT_EQ(plan.stats.regions, regions);
        EXPECT_EQ(plan.regions.size(), regions);
        EXPECT_EQ(total_consumers, regions);
        for (std::size_t i = 0; i < plan.reads.size(); ++i) {
            EXPECT_EQ(served[i], consumers[i]) << "read " << i;
            EXPECT_EQ(lo[i], plan.reads[i].start) << "read " << i;
            EXPECT_EQ(hi[i], plan.reads[i].end) << "read " << i;
        }
    }
    EXPECT_GT(shared_reads, 0u);  // dedup across targets was exercised
}

TEST(PlannerPropertyTest, IntersectingQueryAndRunBound) {
    // QueryTilesIntersecting(box) is QueryTiles(source box ∩ box), counters included, and
    // internal::RunBound (SelectSources' region_bound, from geometry alone) bounds the runs of
    // every query, exactly for a dense index.
    constexpr std::uint64_t kSeed = 0x5eed0004;
    std::mt19937_64 rng(kSeed);
    int disjoint_boxes = 0, dense_queries = 0, sparse_queries = 0;
    for (int iter = 0; iter < 300; ++iter) {
        SCOPED_TRACE("seed " + std::to_string(kSeed) + " iteration " + std::to_string(iter));
        SourceSpec spec;
        spec.global_shape = RandomShape(rng, RandomRank(rng));
        spec.tile_shape = RandomTile(rng, spec.global_shape);
        const Box src_box = RandomSourceBox(rng, spec.global_shape);
        spec.box_origin.assign(src_box.origin().begin(), src_box.origin().end());
        spec.box_shape.assign(src_box.shape().begin(), src_box.shape().end());
        const auto coords = RandomCoords(rng, src_box, RandomCount(rng, src_box.NumElements()));
        const BuiltSource src = ValueOrDie(BuildSource(spec, coords));
        const std::size_t rank = src.rank();
        const Box whole = ValueOrDie(Box::Whole(spec.global_shape));
        for (int q = 0; q < 12; ++q) {
            // Anywhere in the tensor: inside, across or outside the source box.
            const Box box = RandomBox(rng, whole, spec.tile_shape);
            SCOPED_TRACE("source " + src_box.ToString() + " box " + box.ToString());
            std::vector<TileRange> via = {{5, 6, true}};
            QueryStats via_stats;
            bool disjoint = false;
            ASSERT_OK(src.index->QueryTilesIntersecting(box, {}, via, via_stats, disjoint));
            const std::optional<Box> overlap = Intersect(src_box, box);
            EXPECT_EQ(disjoint, !overlap.has_value());
            if (!overlap) {
                ++disjoint_boxes;
                EXPECT_EQ(via.size(), 1u);  // untouched
                EXPECT_EQ(via_stats.queries, 0u);
                continue;
            }
            std::vector<TileRange> direct = {{5, 6, true}};
            QueryStats direct_stats;
            ASSERT_OK(src.index->QueryTiles(*overlap, {}, direct, direct_stats));
            ASSERT_EQ(via.size(), direct.size());
            for (std::size_t i = 0; i < via.size(); ++i) {
                EXPECT_EQ(std::tuple(via[i].first, via[i].last, via[i].exact_coordinate_filter),
                          std::tuple(direct[i].first, direct[i].last,
                                     direct[i].exact_coordinate_filter));
            }
            EXPECT_EQ(std::tuple(via_stats.queries, via_stats.whole_source, via_stats.row_path,
                                 via_stats.column_path, via_stats.nd_path,
                                 via_stats.groups_visited, via_stats.tiles_visited),
                      std::tuple(direct_stats.queries, direct_stats.whole_source,
                                 direct_stats.row_path, direct_stats.column_path,
                                 direct_stats.nd_path, direct_stats.groups_visited,
                                 direct_stats.tiles_visited));

            std::vector<Index> lo(rank), hi(rank);
            for (std::size_t d = 0; d < rank; ++d) {
                lo[d] = overlap->begin(d);
                hi[d] = overlap->end(d);
            }
            std::vector<Index> begin(rank), end(rank);
            for (std::size_t d = 0; d < rank; ++d) {
                begin[d] = src_box.begin(d);
                end[d] = src_box.end(d);
            }
            const std::uint64_t bound = internal::RunBound(
                rank, lo.data(), hi.data(), begin, end, spec.tile_shape, src.desc.num_tiles);
            const std::size_t runs = direct.size() - 1;
            EXPECT_LE(runs, bound);
            if (src.index->dense()) {
                EXPECT_EQ(runs, bound);
                ++dense_queries;
            } else {
                ++sparse_queries;
            }
        }
    }
    EXPECT_GT(disjoint_boxes, 0);
    EXPECT_GT(dense_queries, 100);
    EXPECT_GT(sparse_queries, 100);
}

/// A source whose tile index is drawn directly (no entries exist, as in the planning
/// benchmark): each tile of the box's tile grid is present with probability `fill` and holds
/// 1..1000 entries, or with `huge`, sometimes billions, so that ranges of 2^32 entries or more
/// (split into several regions) occur.
struct DrawnSource {
    SourceDescriptor desc;
    std::shared_ptr<TileIndex> index;
};

DrawnSource DrawSource(std::mt19937_64& rng, std::string ref, std::string tensor,
                       const Shape& shape, const Shape& tile, const Box& box, double fill,
                       bool huge, NamedAxes placement, PlacementPolicy policy) {
    SourceDescriptor d;
    d.source_ref = std::move(ref);
    d.tensor_id = std::move(tensor);
    d.global_shape = shape;
    d.box = box;
    d.generation = {0, 1};
    d.placement = std::move(placement);
    d.policy = std::move(policy);
    d.tile_shape = tile;
    d.index_dtype = NarrowestIndexDType(*std::max_element(shape.begin(), shape.end()));
    const std::size_t rank = shape.size();
    const Box grid = TileBounds(box, tile);
    std::vector<TileCoord> coords;
    std::vector<std::uint64_t> ptr = {0};
    std::vector<Index> pos(grid.origin().begin(), grid.origin().end());
    std::bernoulli_distribution present(fill);
    for (bool done = false; !done;) {
        if (present(rng)) {
            for (Index c : pos) coords.push_back(static_cast<TileCoord>(c));
            const auto count = huge && Uniform(rng, 0, 3) == 0
                                   ? Uniform(rng, Index{1} << 31, Index{3} << 31)
                                   : Uniform(rng, 1, 1000);
            ptr.push_back(ptr.back() + static_cast<std::uint64_t>(count));
        }
        done = true;
        for (std::size_t k = rank; k-- > 0;) {  // next tile, row-major
            if (++pos[k] < grid.end(k)) {
                done = false;
                break;
            }
            pos[k] = grid.begin(k);
        }
    }
    d.nnz = ptr.back();
    d.num_tiles = ptr.size() - 1;
    DrawnSource out;
    out.desc = ValueOrDie(SourceDescriptor::Make(std::move(d)));
    out.index = std::make_shared<TileIndex>(
        ValueOrDie(TileIndex::Make(out.desc, std::move(coords), std::move(ptr))));
    return out;
}

/// PlanBatch as documented, built the obvious way (no pipeline, no in-place writes, no merge
/// of sorted runs): sources in manifest order; a source's matches in target order, then
/// stably by node, node ids numbered by first appearance in that order; each match's Query()
/// ranges are its regions (split at Region::kMaxLength); per (source, node), the regions
/// sorted by (start, length) and swept into reads, a region joining the open read when it
/// starts before its end, or with gap >= 0, at most gap entries after it.
BatchPlan ReferencePlan(std::span<const SourceDescriptor> manifest,
                        std::span<const TargetDescriptor> targets, const SourceSelection& sel,
                        std::span<const TileIndex* const> indexes, const PlanOptions& options) {
    BatchPlan plan;
    plan.selection = sel;
    plan.match_regions.resize(sel.matches.size());
    std::map<std::string, std::uint32_t> node_ids;
    auto node_of = [&](std::uint32_t m) {
        const std::string& id = targets[sel.matches[m].target_index].node_id;
        const auto [it, inserted] =
            node_ids.try_emplace(id, static_cast<std::uint32_t>(plan.nodes.size()));
        if (inserted) plan.nodes.push_back(id);
        return it->second;
    };
    for (std::uint32_t s = 0; s < manifest.size(); ++s) {
        std::vector<std::uint32_t> group;
        for (std::uint32_t m = 0; m < sel.matches.size(); ++m) {
            if (sel.matches[m].source_index == s) group.push_back(m);
        }
        if (group.empty()) continue;
        ++plan.stats.sources_matched;
        std::vector<std::uint32_t> node(group.size());
        for (std::size_t k = 0; k < group.size(); ++k) node[k] = node_of(group[k]);
        std::vector<std::size_t> order(group.size());
        std::iota(order.begin(), order.end(), std::size_t{0});
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t b) { return node[a] < node[b]; });
        const SourceDescriptor& src = manifest[s];
        for (std::size_t k : order) {
            const std::uint32_t m = group[k];
            const auto overlap = Intersect(src.box, targets[sel.matches[m].target_index].box);
            std::vector<EntryRange> ranges;
            if (!overlap || !indexes[s]->Query(*overlap, options.limits, ranges,
                                               plan.stats.query).ok()) {
                ADD_FAILURE() << "reference query failed";
                return plan;
            }
            plan.match_regions[m].begin = static_cast<std::uint32_t>(plan.regions.size());
            for (const EntryRange& r : ranges) {
                plan.stats.requested_entries += r.size();
                for (std::uint64_t at = r.start; at < r.end; at += Region::kMaxLength) {
                    Region region;
                    region.start = at;
                    region.length =
                        static_cast<std::uint32_t>(std::min(r.end - at, Region::kMaxLength));
                    region.set_exact_coordinate_filter(r.exact_coordinate_filter);
                    plan.regions.push_back(region);
                }
            }
            plan.match_regions[m].end = static_cast<std::uint32_t>(plan.regions.size());
        }
        std::uint64_t entries = 0;
        for (std::size_t x = 0; x < order.size();) {
            std::size_t y = x;
            std::vector<std::uint32_t> requests;
            for (; y < order.size() && node[order[y]] == node[order[x]]; ++y) {
                const RegionSpan span = plan.match_regions[group[order[y]]];
                for (std::uint32_t q = span.begin; q < span.end; ++q) requests.push_back(q);
            }
            std::stable_sort(requests.begin(), requests.end(),
                             [&](std::uint32_t a, std::uint32_t b) {
                                 return std::pair(plan.regions[a].start, plan.regions[a].length) <
                                        std::pair(plan.regions[b].start, plan.regions[b].length);
                             });
            const auto first_read = static_cast<std::uint32_t>(plan.reads.size());
            for (std::uint32_t q : requests) {
                Region& r = plan.regions[q];
                const bool joins =
                    plan.reads.size() > first_read &&
                    (r.start < plan.reads.back().end ||
                     (options.read_coalesce_gap >= 0 &&
                      r.start - plan.reads.back().end <=
                          static_cast<std::uint64_t>(options.read_coalesce_gap)));
                if (joins) {
                    plan.reads.back().end = std::max(plan.reads.back().end, r.end());
                } else {
                    plan.reads.push_back({r.start, r.end()});
                }
                r.set_read_index(static_cast<std::uint32_t>(plan.reads.size() - 1));
            }
            const auto last_read = static_cast<std::uint32_t>(plan.reads.size());
            if (last_read != first_read) {
                plan.read_groups.push_back({s, node[order[x]], first_read, last_read});
            }
            for (std::uint32_t r = first_read; r < last_read; ++r) entries += plan.reads[r].size();
            x = y;
        }
        plan.stats.planned_entries += entries;
        plan.stats.planned_bytes += entries * src.EntryBytes();
    }
    plan.stats.regions = plan.regions.size();
    plan.stats.unique_ranges = plan.reads.size();
    return plan;
}

TEST(PlannerPropertyTest, BatchPlanEqualsReferencePlanner) {
    // PlanBatch's pipeline, in-place region writes and merged dedup produce exactly the plan of
    // the straightforward reference above: the same regions in the same order with the same
    // read indexes, reads, read groups, node ids and counters. Cases mix tensors, nodes
    // (interleaved), EP replicas of one box, many targets per source (every merge strategy),
    // dense and sparse indexes, ranges that split, and every coalescing gap.
    constexpr std::uint64_t kSeed = 0x5eed0005;
    std::mt19937_64 rng(kSeed);
    std::uint64_t split_regions = 0, many_spans = 0, multi_node = 0;
    // A planning loop beside: every iteration also plans into the storage of the one before
    // (another manifest, other sizes, growing and shrinking).
    ManifestIndex last_index;
    BatchPlan last_plan;
    for (int iter = 0; iter < 200; ++iter) {
        SCOPED_TRACE("seed " + std::to_string(kSeed) + " iteration " + std::to_string(iter));
        std::vector<DrawnSource> sources;
        std::vector<std::pair<std::string, Shape>> tensors;
        const int num_tensors = static_cast<int>(Uniform(rng, 1, 3));
        bool any_huge = false, all_dense = true;
        for (int w = 0; w < num_tensors; ++w) {
            const std::string tensor = "w" + std::to_string(w);
            const Shape shape = RandomShape(rng, Uniform(rng, 1, 3));
            const Shape tile = RandomTile(rng, shape);
            const auto boxes =
                Slabs(shape, static_cast<std::size_t>(Uniform(rng, 0, Index(shape.size()) - 1)),
                      Uniform(rng, 1, 3));
            for (std::size_t i = 0; i < boxes.size(); ++i) {
                static const double kFill[] = {1.0, 1.0, 0.6, 0.2};
                const double fill = kFill[Uniform(rng, 0, 3)];
                const bool huge = Uniform(rng, 0, 9) == 0;
                any_huge |= huge;
                all_dense &= fill == 1.0;
                sources.push_back(DrawSource(
                    rng, tensor + "/src" + std::to_string(i), tensor, shape, tile, boxes[i],
                    fill, huge, Axes({{"ep", static_cast<std::int64_t>(i)}}),
                    Policy(Uniform(rng, 0, 1) ? "replicate(ep)" : "none")));
            }
            tensors.push_back({tensor, shape});
        }
        {  // An object in the manifest that no target asks for.
            const Shape shape = {10, 10};
            sources.push_back(DrawSource(rng, "other", "other", shape, {4, 4},
                                         ValueOrDie(Box::Whole(shape)), 1.0, false, NamedAxes(),
                                         PlacementPolicy::None()));
        }
        std::vector<SourceDescriptor> manifest;
        std::vector<const TileIndex*> lookup;
        for (const DrawnSource& s : sources) {
            manifest.push_back(s.desc);
            lookup.push_back(s.index.get());
        }

        // Targets of all tensors interleaved, on a few nodes (interleaved too), some repeating
        // an earlier box of their tensor (EP replicas); sometimes more than 16 per source.
        const int num_nodes = static_cast<int>(Uniform(rng, 1, 3));
        const int num_targets = static_cast<int>(Uniform(rng, 0, 3) == 0 ? Uniform(rng, 17, 40)
                                                                         : Uniform(rng, 1, 8));
        std::vector<TargetDescriptor> targets;
        for (int t = 0; t < num_targets; ++t) {
            const auto& [tensor, shape] = tensors[Uniform(rng, 0, num_tensors - 1)];
            const Box whole = ValueOrDie(Box::Whole(shape));
            std::vector<Box> earlier;
            for (const TargetDescriptor& other : targets) {
                if (other.tensor_id == tensor) earlier.push_back(other.box);
            }
            const Box box = !earlier.empty() && Uniform(rng, 0, 2) == 0
                                ? earlier[Uniform(rng, 0, Index(earlier.size()) - 1)]
                                : RandomBox(rng, whole, Shape(shape.size(), 1));
            const std::string node = "node" + std::to_string(Uniform(rng, 0, num_nodes - 1));
            targets.push_back(MakeTarget(node + "/t" + std::to_string(t), node, tensor,
                                         Axes({{"ep", t}, {"tp", 0}}),
                                         Shape(box.origin().begin(), box.origin().end()),
                                         Shape(box.shape().begin(), box.shape().end())));
        }
        PlanOptions options;
        options.read_coalesce_gap =
            Uniform(rng, -1, 3) == 3 ? Uniform(rng, 1, 2000) : Uniform(rng, -1, 0);

        ASSERT_OK_AND_ASSIGN(SourceSelection sel, SelectSources(manifest, targets));
        const BatchPlan expected = ReferencePlan(manifest, targets, sel, lookup, options);
        ASSERT_OK_AND_ASSIGN(BatchPlan plan, PlanBatch(manifest, targets, sel, lookup, options));
        ExpectSamePlan(plan, expected);
        {
            ASSERT_OK_AND_ASSIGN(ManifestIndex index, ManifestIndex::Make(manifest, &last_index));
            ASSERT_OK_AND_ASSIGN(SourceSelection recycled_sel,
                                 SelectSources(manifest, index, targets, &last_plan.selection));
            EXPECT_EQ(recycled_sel.target_begin, sel.target_begin);
            EXPECT_EQ(recycled_sel.needed_sources, sel.needed_sources);
            EXPECT_EQ(recycled_sel.region_bound, sel.region_bound);
            ASSERT_EQ(recycled_sel.matches.size(), sel.matches.size());
            for (std::size_t m = 0; m < sel.matches.size(); ++m) {
                EXPECT_EQ(std::pair(recycled_sel.matches[m].source_index,
                                    recycled_sel.matches[m].target_index),
                          std::pair(sel.matches[m].source_index, sel.matches[m].target_index));
            }
            ASSERT_OK_AND_ASSIGN(BatchPlan recycled,
                                 PlanBatch(manifest, targets, std::move(recycled_sel), lookup,
                                           options, &last_plan));
            ExpectSamePlan(recycled, expected);
            EXPECT_TRUE(last_plan.regions.empty() && last_plan.reads.empty() &&
                        last_plan.match_regions.empty() && last_plan.nodes.empty());
            EXPECT_EQ(last_index.size(), 0u);
            last_index = std::move(index);
            last_plan = std::move(recycled);
        }
        if (!any_huge) {
            EXPECT_LE(plan.regions.size(), sel.region_bound);
            if (all_dense) {
                EXPECT_EQ(plan.regions.size(), sel.region_bound);
            }
        }
        for (const std::uint64_t hint :
             {std::uint64_t{0}, std::uint64_t{1}, 2 * sel.region_bound + 3}) {
            SourceSelection hinted = sel;
            hinted.region_bound = hint;
            ASSERT_OK_AND_ASSIGN(BatchPlan again,
                                 PlanBatch(manifest, targets, hinted, lookup, options));
            ExpectSamePlan(again, expected);
        }

        for (const Region& r : plan.regions) split_regions += r.length == Region::kMaxLength;
        std::map<std::uint32_t, std::uint32_t> per_source;
        for (const SourceMatch& m : sel.matches) ++per_source[m.source_index];
        for (const auto& [source, count] : per_source) many_spans += count > 16 ? 1 : 0;
        multi_node += plan.nodes.size() > 1 ? 1 : 0;
    }
    EXPECT_GT(split_regions, 0u);
    EXPECT_GT(many_spans, 0u);
    EXPECT_GT(multi_node, 0u);
}

}  // namespace
}  // namespace mooncake::sparse
