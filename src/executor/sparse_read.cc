// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The read side of SparseStore: read_sparse_objects (docs/design.md §4) as a sequence of named
// steps, each a function below, and the check of every manifest entry against the stored
// object's metadata before anything is sized from it.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <thread>

#include "codec/object_metadata.h"
#include "executor/node_cache.h"
#include "transport/parallel_for.h"
#include "executor/sparse_store.h"

namespace mooncake::sparse {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
    return std::chrono::duration<double>(Clock::now() - since).count();
}


/// The first descriptor field in which a requester's manifest entry differs from the stored
/// object's metadata, or nullptr when they agree.
const char* FirstDifference(const SourceDescriptor& claimed, const SourceDescriptor& stored) {
    if (claimed.tensor_id != stored.tensor_id) return "tensor_id";
    if (claimed.global_shape != stored.global_shape) return "global_shape";
    if (!(claimed.box == stored.box)) return "global_offset/local_shape";
    if (!(claimed.generation == stored.generation)) return "generation";
    if (!(claimed.placement == stored.placement)) return "source_placement";
    if (!(claimed.policy == stored.policy)) return "placement_policy";
    if (claimed.tile_shape != stored.tile_shape) return "tile_shape";
    if (claimed.nnz != stored.nnz) return "nnz";
    if (claimed.num_tiles != stored.num_tiles) return "num_tiles";
    if (claimed.apply != stored.apply) return "apply";
    if (claimed.index_dtype != stored.index_dtype) return "index_dtype";
    if (claimed.value_dtype != stored.value_dtype) return "value_dtype";
    return nullptr;
}

/// Errors: InvalidArgument when the manifest entry does not describe the stored object.
Status CheckClaim(const SourceDescriptor& claimed, const SourceDescriptor& stored) {
    if (const char* field = FirstDifference(claimed, stored)) {
        return InvalidArgument("manifest entry of " + claimed.source_ref + " does not describe " +
                               "the stored object: its " + field + " differs (a manifest of " +
                               "another store or generation?)");
    }
    return Status::Ok();
}

/// Reads whole `indices`/`values` members of a source (the baseline and the fallback).
Status ReadFullSource(ObjectStore& store, const SourceDescriptor& src, ReadData& out) {
    const std::uint64_t ib = src.nnz * src.rank() * DTypeSize(src.index_dtype);
    const std::uint64_t vb = src.nnz * DTypeSize(src.value_dtype);
    std::shared_ptr<ReadSlab> slab = ReadSlab::Allocate(ib + vb);
    if (!slab) return ResourceExhausted("cannot allocate " + std::to_string(ib + vb) + " bytes");
    const std::span<std::byte> idx(slab->data(), ib), val(slab->data() + ib, vb);
    MCS_RETURN_IF_ERROR(store.ReadMember(src.source_ref, "indices", idx));
    MCS_RETURN_IF_ERROR(store.ReadMember(src.source_ref, "values", val));
    out = {std::move(slab), idx, val, 0};
    return Status::Ok();
}

constexpr std::uint64_t AlignUp64(std::uint64_t n) { return (n + 63) / 64 * 64; }

struct Piece {
    std::size_t source_index;
    EntryRange range;  ///< Entry offsets into the source.
    Box overlap;
    const ReadData* data;
};

/// A piece's entries in the range read that holds them, with the source's entry sizes; nullopt
/// when the read does not hold the planned range.
struct PieceEntries {
    std::span<const std::byte> indices;
    std::span<const std::byte> values;
    std::uint64_t count;
    std::size_t index_bytes;  ///< Bytes of one entry's coordinates.
    std::size_t value_bytes;
};

std::optional<PieceEntries> EntriesOf(const SourceDescriptor& s, const Piece& p) {
    const std::size_t isz = DTypeSize(s.index_dtype) * s.rank();
    const std::size_t vsz = DTypeSize(s.value_dtype);
    const std::uint64_t row = p.range.start - p.data->base;
    const std::uint64_t count = p.range.size();
    if (p.range.start < p.data->base || (row + count) * isz > p.data->indices.size() ||
        (row + count) * vsz > p.data->values.size()) {
        return std::nullopt;
    }
    return PieceEntries{p.data->indices.subspan(row * isz, count * isz),
                        p.data->values.subspan(row * vsz, count * vsz), count, isz, vsz};
}

/// Filters and rebases a target's pieces and builds its tile index from its sources' tile
/// indexes, with no pass over the entries of its own: when the target's origin lies on the
/// sources' tile grid (and its tile shape is theirs, clamped to its extents), every source tile
/// inside the box is one target tile, its entries in the same order, so the target's tiles are
/// the pieces' tiles, rebased, each with the entries it keeps. Writes the kept entries at the
/// start of `indices` / `values` and fills obj's tile index; returns the number kept, or nullopt
/// (and the caller builds the object from its entries) when the pieces do not allow it: a source
/// without a tile index here, another tile shape, an origin off the grid, a piece that does not
/// start and end on tile bounds, or pieces whose tiles are not in the target's row-major order
/// (several sources whose tiles interleave).
std::optional<std::uint64_t> RebaseWithTileIndex(std::span<const SourceDescriptor> manifest,
                                                 std::span<const TileIndex* const> indexes,
                                                 const TargetDescriptor& target,
                                                 std::span<const Piece> pieces,
                                                 const Shape& target_tile, DType out_index,
                                                 std::span<std::byte> indices,
                                                 std::span<std::byte> values, SparseObject& obj) {
    if (indexes.size() != manifest.size() || pieces.empty()) return std::nullopt;
    const SourceDescriptor& first = manifest[pieces.front().source_index];
    const std::size_t rank = first.rank();
    const std::span<const Index> origin = target.box.origin();
    const std::span<const Index> local = target.box.shape();
    if (rank == 0 || rank > kMaxRank || origin.size() != rank) return std::nullopt;
    std::array<std::uint64_t, kMaxRank> origin_tile{}, grid{};
    for (std::size_t d = 0; d < rank; ++d) {
        const Index ts = first.tile_shape[d];
        if (ts <= 0 || origin[d] % ts != 0) return std::nullopt;
        origin_tile[d] = static_cast<std::uint64_t>(origin[d] / ts);
        grid[d] = static_cast<std::uint64_t>((local[d] + target_tile[d] - 1) / target_tile[d]);
    }
    const std::size_t osz = DTypeSize(out_index) * rank;
    const std::size_t vsz = DTypeSize(first.value_dtype);
    std::vector<TileCoord>& coords = obj.tile_coords;
    std::vector<std::uint64_t>& ptr = obj.tile_ptr;
    // Sized once for the tiles the pieces span (an upper bound: a boundary tile may keep
    // nothing), not grown tile by tile.
    std::size_t max_tiles = 0;
    for (const Piece& p : pieces) {
        const TileIndex* index = indexes[p.source_index];
        if (index == nullptr) return std::nullopt;
        const std::span<const std::uint64_t> tp = index->view().tile_ptr;
        if (tp.size() < 2) return std::nullopt;
        max_tiles += static_cast<std::size_t>(
            std::lower_bound(tp.begin(), tp.end() - 1, p.range.end) -
            std::lower_bound(tp.begin(), tp.end() - 1, p.range.start));
    }
    coords.clear();
    coords.reserve(max_tiles * rank);
    ptr.clear();
    ptr.reserve(max_tiles + 1);
    ptr.push_back(0);
    std::uint64_t nnz = 0;
    std::uint64_t last_key = 0;
    bool any = false;
    for (const Piece& p : pieces) {
        const SourceDescriptor& s = manifest[p.source_index];
        const TileIndex* index = indexes[p.source_index];
        if (index == nullptr || s.rank() != rank || s.tile_shape != first.tile_shape ||
            s.value_dtype != first.value_dtype) {
            return std::nullopt;
        }
        const TileIndexView view = index->view();
        const std::span<const std::uint64_t> tp = view.tile_ptr;
        if (tp.size() < 2) return std::nullopt;
        // The piece's first tile: the one that starts at its first entry.
        auto it = std::lower_bound(tp.begin(), tp.end() - 1, p.range.start);
        if (it == tp.end() - 1 || *it != p.range.start) return std::nullopt;
        const std::optional<PieceEntries> e = EntriesOf(s, p);
        if (!e) return std::nullopt;
        const std::size_t isz = e->index_bytes;
        const std::uint64_t nnz_before = nnz;
        for (auto t = static_cast<std::size_t>(it - tp.begin());
             t + 1 < tp.size() && tp[t] < p.range.end; ++t) {
            if (tp[t + 1] > p.range.end) return std::nullopt;  // not on a tile bound
            std::uint64_t key = 0;
            std::array<TileCoord, kMaxRank> tile{};
            for (std::size_t d = 0; d < rank; ++d) {
                const std::uint64_t c = view.tile_coords[t * rank + d];
                if (c < origin_tile[d] || c - origin_tile[d] >= grid[d]) return std::nullopt;
                tile[d] = static_cast<TileCoord>(c - origin_tile[d]);
                key = key * grid[d] + tile[d];
            }
            if (any && key <= last_key) return std::nullopt;
            std::uint64_t kept = tp[t + 1] - tp[t];
            if (p.range.exact_coordinate_filter) {
                // A boundary tile keeps what lies in the overlap, filtered on its own so that
                // its kept count is known.
                const std::uint64_t r = tp[t] - p.range.start;
                kept = FilterRebaseInto(e->indices.subspan(r * isz, kept * isz),
                                        e->values.subspan(r * vsz, kept * vsz), kept, rank,
                                        s.index_dtype, vsz, p.overlap, true, origin, out_index,
                                        indices.subspan(nnz * osz), values.subspan(nnz * vsz));
                if (kept == 0) continue;
            }
            coords.insert(coords.end(), tile.begin(), tile.begin() + rank);
            nnz += kept;
            ptr.push_back(nnz);
            last_key = key;
            any = true;
        }
        if (!p.range.exact_coordinate_filter) {
            // Every entry of an interior piece is kept: one rebase of the whole piece.
            const std::uint64_t count = e->count;
            if (nnz - nnz_before != count) return std::nullopt;
            FilterRebaseInto(e->indices, e->values, count, rank, s.index_dtype, vsz, p.overlap,
                             false, origin, out_index, indices.subspan(nnz_before * osz),
                             values.subspan(nnz_before * vsz));
        }
    }
    return nnz;
}

/// Filters, rebases and builds one target-local object from its pieces.
Result<TargetObject> MaterializeTarget(std::span<const SourceDescriptor> manifest,
                                       std::span<const TileIndex* const> indexes,
                                       const TargetDescriptor& target,
                                       std::span<const SourceMatch> matches,
                                       std::span<const Piece> pieces, std::uint64_t& fanout_bytes) {
    if (matches.empty()) return Internal("target " + target.target_id + " has no source");
    const SourceDescriptor& first = manifest[matches.front().source_index];
    for (const SourceMatch& m : matches) {
        const SourceDescriptor& s = manifest[m.source_index];
        if (s.apply != first.apply || s.value_dtype != first.value_dtype) {
            return InvalidArgument("target " + target.target_id +
                                   " reads sources with different apply modes or value dtypes");
        }
    }
    const std::span<const Index> local = target.box.shape();
    const DType out_index = NarrowestIndexDType(*std::max_element(local.begin(), local.end()));
    const std::size_t osz = DTypeSize(out_index) * local.size();
    const std::size_t out_vsz = DTypeSize(first.value_dtype);
    // The output is sized once for every piece's entries (an upper bound: a filtered piece may
    // keep fewer) and each piece is filtered straight into it.
    std::uint64_t bound = 0;
    for (const Piece& p : pieces) bound += p.range.size();
    // Pooled: a step's target objects are many small buffers that die together, and the next
    // step's take the same memory again instead of faulting in fresh pages.
    const DefaultInitAllocator<std::byte> pooled(HostMemory::kPooled);
    ByteBuffer indices(bound * osz, pooled), values(bound * out_vsz, pooled);
    for (const Piece& p : pieces) {
        const std::optional<PieceEntries> e = EntriesOf(manifest[p.source_index], p);
        if (!e) return Internal("range read does not hold the planned region");
        fanout_bytes += e->count * (e->index_bytes + e->value_bytes);
    }
    Shape tile(first.tile_shape);
    for (std::size_t d = 0; d < tile.size(); ++d) tile[d] = std::min(tile[d], local[d]);
    // A pooled buffer's memory goes back with its chunk only, so a shorter copy of it would
    // free nothing; a large one (a host block) is copied when that frees much.
    const auto shrink = [&](std::uint64_t nnz) {
        if (nnz < bound) {
            indices.resize(nnz * osz);
            values.resize(nnz * out_vsz);
            if (indices.capacity() > kMaxPooledBlockBytes && nnz < bound - bound / 8) {
                indices.shrink_to_fit();
                values.shrink_to_fit();
            }
        }
    };

    // The usual case: the tile index follows from the sources' (no pass over the entries).
    SparseObject direct;
    if (const std::optional<std::uint64_t> nnz = RebaseWithTileIndex(
            manifest, indexes, target, pieces, tile, out_index, indices, values, direct)) {
        shrink(*nnz);
        MCS_ASSIGN_OR_RETURN(direct.desc,
                             TargetObjectDescriptor(target, {first.generation, first.apply,
                                                             out_index, first.value_dtype,
                                                             std::move(tile), *nnz,
                                                             direct.tile_ptr.size() - 1}));
        direct.coordinate_space = "local";
        direct.indices = std::move(indices);
        direct.values = std::move(values);
        UpdateChecksums(direct);
        return TargetObject{target.target_id, target.node_id, target.box, std::move(direct)};
    }

    std::uint64_t nnz = 0;
    for (const Piece& p : pieces) {
        const SourceDescriptor& s = manifest[p.source_index];
        const PieceEntries e = *EntriesOf(s, p);  // bounds checked above
        nnz += FilterRebaseInto(e.indices, e.values, e.count, s.rank(), s.index_dtype,
                                e.value_bytes, p.overlap,
                                p.range.exact_coordinate_filter, target.box.origin(), out_index,
                                std::span(indices).subspan(nnz * osz),
                                std::span(values).subspan(nnz * out_vsz));
    }
    shrink(nnz);
    MCS_ASSIGN_OR_RETURN(SourceDescriptor desc,
                         TargetObjectDescriptor(target, {first.generation, first.apply, out_index,
                                                         first.value_dtype, tile, 0, 0}));
    EncodeOptions enc;
    enc.tile_shape = std::move(tile);
    enc.num_threads = 1;
    // Rebased ranges of a sorted source usually are sorted for the target's tiles too: then the
    // arrays become the object's members as they are.
    auto built = BuildSparseObject(
        std::move(desc), OwnedCoo{out_index, first.value_dtype, nnz, std::move(indices), std::move(values)},
        enc);
    if (!built.ok()) return built.status().WithContext("materializing " + target.target_id);
    TargetObject out{target.target_id, target.node_id, target.box, std::move(built).value()};
    out.object.coordinate_space = "local";
    return out;
}

}  // namespace

/// One ReadSparseObjects call: its inputs, what each step leaves for the next, and its own
/// metrics (added to the store's when it succeeds). Its address names the call's reads in
/// progress in the node cache.
struct SparseStore::ReadCall {
    ReadCall(std::span<const SourceDescriptor> manifest_in,
             std::span<const TargetDescriptor> targets_in, const ReadOptions& options_in)
        : manifest(manifest_in),
          targets(targets_in),
          options(options_in),
          start(Clock::now()),
          pieces(targets_in.size()) {}

    /// Starts the materialize clock, which also covers the full reads of the baseline and of
    /// the budget fallback, and sizes the per-target results.
    void StartMaterializing() {
        materialize_start = Clock::now();
        results.assign(targets.size(), Result<TargetObject>(Internal("unset")));
        fanout.assign(targets.size(), 0);
    }

    const std::span<const SourceDescriptor> manifest;
    const std::span<const TargetDescriptor> targets;
    const ReadOptions& options;
    const Clock::time_point start;
    Clock::time_point materialize_start;
    SparseMetrics metrics;
    std::unique_ptr<PlanScratch> scratch;
    std::optional<ManifestIndex> own_index;  ///< When the caller passed none.
    SourceSelection selection;
    /// Per manifest entry: its tile index, when the selection needs it.
    std::vector<std::shared_ptr<const TileIndex>> indexes;
    std::vector<const TileIndex*> lookup;
    std::optional<BatchPlan> plan;   ///< Unset when over the planning budget.
    std::vector<ReadData> reads;     ///< Per unique read of the plan.
    /// The unique reads ReadUniqueRanges reads next (MaterializeTargets reads the plan's in
    /// chunks, each just before the targets that need it are built).
    std::vector<std::size_t> pending_reads;
    /// Per unique read: its node cache key and source (built once per call).
    std::vector<NodeCache::RangeKey> range_keys;
    std::vector<std::uint32_t> read_source;
    /// The first error of a chunk's range reads (MaterializeTargets stops there).
    Status read_status;
    /// Range reads done after StartMaterializing, not part of materialize_seconds.
    double interleaved_read_seconds = 0;
    std::vector<ReadData> full;      ///< Per manifest entry: the budget fallback's full reads.
    std::vector<std::vector<Piece>> pieces;  ///< Per target.
    std::vector<Result<TargetObject>> results;
    std::vector<std::uint64_t> fanout;
};

Result<std::vector<TargetObject>> SparseStore::ReadSparseObjects(
    std::span<const SourceDescriptor> manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options) {
    ReadCall call(manifest, targets, options);
    call.scratch = TakeScratch();
    MCS_RETURN_IF_ERROR(SelectTargetSources(call));
    if (options.strategy == ReadStrategy::kFullSourcePerTarget) {
        call.StartMaterializing();
        MCS_RETURN_IF_ERROR(ReadAndMaterializePerTarget(call));
    } else {
        MCS_RETURN_IF_ERROR(LoadIndexes(call));
        MCS_ASSIGN_OR_RETURN(const bool planned, PlanReads(call));
        if (planned) {
            call.reads.resize(call.plan->reads.size());
            CollectPlannedPieces(call);
        }
        call.StartMaterializing();
        if (!planned) MCS_RETURN_IF_ERROR(ReadFullSources(call));
        // With a plan, the range reads happen here too, chunk by chunk.
        MaterializeTargets(call);
        MCS_RETURN_IF_ERROR(call.read_status);
        if (planned) call.scratch->plan = std::move(*call.plan);  // its storage serves the next read
    }
    MCS_ASSIGN_OR_RETURN(std::vector<TargetObject> out, PublishTargets(call));
    AddReadMetrics(call.metrics);
    if (call.own_index) call.scratch->index = std::move(*call.own_index);
    ReturnScratch(std::move(call.scratch));
    return out;
}

Status SparseStore::SelectTargetSources(ReadCall& call) {
    if (call.options.manifest_index == nullptr) {
        MCS_ASSIGN_OR_RETURN(call.own_index,
                             ManifestIndex::Make(call.manifest, &call.scratch->index));
    }
    const ManifestIndex& manifest_index =
        call.options.manifest_index != nullptr ? *call.options.manifest_index : *call.own_index;
    MCS_ASSIGN_OR_RETURN(call.selection, SelectSources(call.manifest, manifest_index, call.targets,
                                                       &call.scratch->plan.selection));
    return Status::Ok();
}

Status SparseStore::LoadIndexes(ReadCall& call) {
    call.indexes.resize(call.manifest.size());
    call.lookup.assign(call.manifest.size(), nullptr);
    // Every source's index claimed from the node cache under one lock; those no other request
    // has or is reading load side by side (a step's thousands of sources), then join the cache
    // under one lock. The cache holds each index with the stored descriptor it was built from;
    // a requester's entry must match it, so a wrong manifest entry fails its own read and never
    // poisons the node's cache for others. The first error in source order is the call's.
    const std::vector<std::uint32_t>& needed = call.selection.needed_sources;
    std::vector<const std::string*> refs(needed.size());
    for (std::size_t k = 0; k < needed.size(); ++k) refs[k] = &call.manifest[needed[k]].source_ref;
    NodeCache::IndexClaims claims = cache_->ClaimIndexes(refs);
    std::vector<NodeCache::IndexResult> loaded(claims.missing.size(), Internal("unset"));
    // In batches of kSourcesPerBatch, side by side.
    constexpr std::size_t kSourcesPerBatch = 64;
    const std::size_t batches = (claims.missing.size() + kSourcesPerBatch - 1) / kSourcesPerBatch;
    std::vector<const SourceDescriptor*> missing(claims.missing.size());
    for (std::size_t j = 0; j < missing.size(); ++j) {
        missing[j] = &call.manifest[needed[claims.missing[j]]];
    }
    const EntryTexts texts =
        missing.empty() ? EntryTexts{} : EntryTextsOf(call.options.manifest_owner);
    internal::ParallelFor(batches < 2 ? 1 : call.options.num_threads, batches,
                          [&](std::size_t b) {
                              const std::size_t lo = b * kSourcesPerBatch;
                              const std::size_t n =
                                  std::min(kSourcesPerBatch, missing.size() - lo);
                              ReadIndexes(std::span(missing).subspan(lo, n),
                                          call.options.manifest_owner, texts,
                                          std::span(loaded).subspan(lo, n));
                          });
    cache_->FinishIndexes(refs, claims, loaded);

    std::vector<Status> errors(needed.size());
    const auto take = [&](std::size_t k, const NodeCache::IndexResult& r, bool check) {
        if (!r.ok()) {
            errors[k] = r.status();
            return;
        }
        const SourceDescriptor& src = call.manifest[needed[k]];
        if (check) {
            if (Status s = CheckClaim(src, *(*r)->source); !s.ok()) {
                errors[k] = s;
                return;
            }
        }
        call.indexes[needed[k]] = std::shared_ptr<const TileIndex>(*r, &(*r)->index);
        call.lookup[needed[k]] = call.indexes[needed[k]].get();
    };
    std::uint64_t hits = 0, gets = 0;
    for (std::size_t k = 0; k < needed.size(); ++k) {
        if (claims.hits[k]) {
            take(k, claims.hits[k], true);
            ++hits;
        }
    }
    // Read for this entry: ReadIndex checked the stored object against it.
    for (std::size_t j = 0; j < claims.missing.size(); ++j) {
        take(claims.missing[j], loaded[j], false);
        gets += loaded[j].ok();
    }
    for (const auto& [k, j] : claims.repeats) take(k, loaded[j], true);
    for (const NodeCache::IndexWait& w : claims.waits) take(w.ref, (*w.batch.get())[w.slot], true);
    {
        std::lock_guard mlock(metrics_mu_);
        metrics_.cache_hits += hits;
        metrics_.index_cache_hits += hits;
        metrics_.index_single_flight_waits += claims.waits.size();
        metrics_.index_gets += gets;
    }
    for (const Status& s : errors) MCS_RETURN_IF_ERROR(s);
    return Status::Ok();
}

Result<bool> SparseStore::PlanReads(ReadCall& call) {
    // The selection is copied into the plan: the budget fallback still needs it when planning
    // fails.
    auto plan = PlanBatch(call.manifest, call.targets, call.selection, call.lookup,
                          call.options.plan, &call.scratch->plan);
    if (!plan.ok() && plan.status().code() != StatusCode::kResourceExhausted) return plan.status();
    SparseMetrics& m = call.metrics;
    m.plan_seconds = Seconds(call.start);
    if (!plan.ok()) return false;
    m.nd_fallbacks = plan->stats.query.nd_path;
    m.planned_ranges = plan->stats.regions;
    m.unique_ranges = plan->reads.size();
    call.plan = std::move(plan).value();
    return true;
}

Status SparseStore::ReadUniqueRanges(ReadCall& call) {
    const BatchPlan& plan = *call.plan;
    SparseMetrics& m = call.metrics;
    const auto start = Clock::now();
    if (call.range_keys.size() != plan.reads.size()) {
        // The source of each read, from its (source, node) group.
        call.read_source.assign(plan.reads.size(), 0);
        call.range_keys.assign(plan.reads.size(), {});
        for (const ReadGroup& g : plan.read_groups) {
            const std::string* ref = &call.manifest[g.source_index].source_ref;
            for (std::size_t r = g.begin; r < g.end; ++r) {
                call.read_source[r] = g.source_index;
                call.range_keys[r] = {ref, plan.reads[r].start, plan.reads[r].end};
            }
        }
    }
    const std::vector<std::size_t>& which = call.pending_reads;
    std::vector<NodeCache::RangeKey> keys(which.size());
    std::vector<ReadData> reads(which.size());
    for (std::size_t k = 0; k < which.size(); ++k) keys[k] = call.range_keys[which[k]];
    // Each unique range is a cache hit, a wait on a concurrent request's read of it, or a read
    // of our own that concurrent requests may wait on (single flight).
    NodeCache::RangeClaims claims = cache_->ClaimRanges(keys, &call, reads);
    m.cache_hits += claims.hits;
    m.range_cache_hits += claims.hits;
    // The ranges of this chunk that are ours to read all land in one slab from the node's pool
    // (memory an earlier chunk or call used, when one is free), each member 64-byte aligned.
    std::vector<std::uint64_t> offsets;
    offsets.reserve(claims.missing.size());
    std::uint64_t slab_bytes = 0;
    for (std::size_t k : claims.missing) {
        const std::size_t r = which[k];
        // Sized from a manifest entry that LoadIndex checked against the stored object.
        const SourceDescriptor& s = call.manifest[call.read_source[r]];
        offsets.push_back(slab_bytes);
        slab_bytes += AlignUp64(plan.reads[r].size() * s.rank() * DTypeSize(s.index_dtype)) +
                      AlignUp64(plan.reads[r].size() * DTypeSize(s.value_dtype));
    }
    Status read_status = Status::Ok();
    if (!claims.missing.empty()) {
        auto slab = cache_->slabs().Acquire(slab_bytes);
        if (!slab.ok()) {
            read_status = slab.status();
        } else {
            std::vector<RangeRead> batch;
            batch.reserve(2 * claims.missing.size());
            for (std::size_t j = 0; j < claims.missing.size(); ++j) {
                const std::size_t k = claims.missing[j];
                const UniqueRead& u = plan.reads[which[k]];
                const SourceDescriptor& s = call.manifest[call.read_source[which[k]]];
                const std::uint64_t ib = u.size() * s.rank() * DTypeSize(s.index_dtype);
                const std::uint64_t vb = u.size() * DTypeSize(s.value_dtype);
                const std::span<std::byte> idx((*slab)->data() + offsets[j], ib);
                const std::span<std::byte> val((*slab)->data() + offsets[j] + AlignUp64(ib), vb);
                batch.push_back({s.source_ref, "indices", u.start, u.end, idx});
                batch.push_back({s.source_ref, "values", u.start, u.end, val});
                m.range_bytes_read += ib + vb;
                reads[k] = {*slab, idx, val, u.start};
            }
            read_status = store_->ReadRangesParallel(batch, call.options.num_threads);
            if (!read_status.ok()) {
                for (std::size_t k : claims.missing) reads[k] = {};
            }
        }
    }
    // Our flights complete before we wait for anyone else's, so waits never form a cycle.
    cache_->FinishRanges(keys, &call, read_status, reads, claims);
    if (!read_status.ok()) return read_status.WithContext("range reads");
    m.range_gets += claims.missing.size();
    for (const NodeCache::RangeWait& w : claims.waits) {
        const NodeCache::RangeBatchResult& got = w.batch.get();
        if (!got.ok()) return got.status().WithContext("a concurrent request's range read");
        if (*got == nullptr || w.slot >= (*got)->size()) {
            return Internal("a concurrent request's range read did not keep its data");
        }
        reads[w.read] = (**got)[w.slot];
        ++m.single_flight_waits;
    }
    for (std::size_t k = 0; k < which.size(); ++k) call.reads[which[k]] = std::move(reads[k]);
    m.read_seconds += Seconds(start);
    return Status::Ok();
}

void SparseStore::CollectPlannedPieces(ReadCall& call) {
    const BatchPlan& plan = *call.plan;
    for (std::size_t t = 0; t < call.targets.size(); ++t) {
        const auto [first, last] = plan.match_range(t);
        for (std::size_t k = first; k < last; ++k) {
            const SourceMatch& match = plan.matches()[k];
            const Box overlap = match.Overlap(call.manifest, call.targets);
            for (const Region& r : plan.regions_of_match(k)) {
                call.pieces[t].push_back(
                    {match.source_index, r.range(), overlap, &call.reads[r.read_index()]});
            }
        }
    }
}

Status SparseStore::ReadFullSources(ReadCall& call) {
    const auto start = Clock::now();
    SparseMetrics& m = call.metrics;
    call.full.resize(call.manifest.size());
    for (std::size_t si : call.selection.needed_sources) {
        MCS_RETURN_IF_ERROR(VerifySource(call.manifest[si]));
        MCS_RETURN_IF_ERROR(ReadFullSource(*store_, call.manifest[si], call.full[si]));
        ++m.full_gets;
        ++m.dense_fallbacks;
        m.full_bytes_read += call.full[si].indices.size() + call.full[si].values.size();
    }
    for (std::size_t t = 0; t < call.targets.size(); ++t) {
        for (const SourceMatch& match : call.selection.matches_of(t)) {
            const SourceDescriptor& s = call.manifest[match.source_index];
            if (s.nnz > 0) {
                call.pieces[t].push_back({match.source_index, {0, s.nnz, true},
                                          match.Overlap(call.manifest, call.targets),
                                          &call.full[match.source_index]});
            }
        }
    }
    m.read_seconds = Seconds(start);
    return Status::Ok();
}

Status SparseStore::ReadAndMaterializePerTarget(ReadCall& call) {
    SparseMetrics& m = call.metrics;
    for (std::size_t t = 0; t < call.targets.size(); ++t) {
        const std::span<const SourceMatch> matches = call.selection.matches_of(t);
        std::vector<ReadData> own(matches.size());
        for (std::size_t k = 0; k < own.size(); ++k) {
            const SourceMatch& match = matches[k];
            const SourceDescriptor& s = call.manifest[match.source_index];
            MCS_RETURN_IF_ERROR(VerifySource(s));
            MCS_RETURN_IF_ERROR(ReadFullSource(*store_, s, own[k]));
            ++m.full_gets;
            m.full_bytes_read += own[k].indices.size() + own[k].values.size();
            if (s.nnz > 0) {
                call.pieces[t].push_back({match.source_index, {0, s.nnz, true},
                                          match.Overlap(call.manifest, call.targets), &own[k]});
            }
        }
        call.results[t] = MaterializeTarget(call.manifest, call.lookup, call.targets[t], matches,
                                            call.pieces[t], call.fanout[t]);
    }
    m.read_seconds = Seconds(call.materialize_start);
    return Status::Ok();
}

void SparseStore::MaterializeTargets(ReadCall& call) {
    // Threads only pay off for large batches: starting them costs far more than filtering a
    // few thousand entries.
    std::uint64_t entries = 0;
    for (const auto& p : call.pieces) {
        for (const Piece& piece : p) entries += piece.range.size();
    }
    // Work in entries, a target's fixed cost (its views, its pieces, its object) counted as
    // about a thousand: many small targets are worth the threads as much as many entries are.
    constexpr std::uint64_t kEntriesPerThread = std::uint64_t{1} << 18;
    constexpr std::uint64_t kEntriesPerTarget = 1024;
    const std::uint64_t work = entries + kEntriesPerTarget * call.targets.size();
    const int threads = work < 2 * kEntriesPerThread ? 1 : call.options.num_threads;
    const auto build = [&](std::size_t t) {
        call.results[t] = MaterializeTarget(call.manifest, call.lookup, call.targets[t],
                                            call.selection.matches_of(t), call.pieces[t],
                                            call.fanout[t]);
    };
    if (!call.plan) {  // The budget fallback: every source is read already.
        internal::ParallelFor(threads, call.targets.size(), build);
        return;
    }
    if (call.options.view_in_place && store_->ViewsInPlace()) {
        call.read_status = MaterializeInPlace(call, threads);
        return;
    }
    // The plan's unique reads are read in chunks of about kChunkBytes, each just before the
    // targets that need it are built, and each is dropped once the last target that needs it
    // is built (the node cache keeps what it caches). Targets are built in the order of the
    // first read they need, so that the targets sharing a read are built one after another.
    // The call so holds a chunk of range reads at a time, not every read next to every target
    // object, and the memory of one chunk's reads serves the next.
    constexpr std::uint64_t kChunkBytes = std::uint64_t{64} << 20;
    const BatchPlan& plan = *call.plan;
    const std::size_t num_reads = call.reads.size();
    const ReadData* reads_begin = call.reads.data();
    const auto read_of = [&](const Piece& p) {
        return static_cast<std::size_t>(p.data - reads_begin);
    };
    std::vector<std::uint32_t> uses(num_reads, 0);
    std::vector<std::pair<std::size_t, std::uint32_t>> order(call.targets.size());
    for (std::size_t t = 0; t < call.targets.size(); ++t) {
        std::size_t first = num_reads;
        for (const Piece& p : call.pieces[t]) {
            ++uses[read_of(p)];
            first = std::min(first, read_of(p));
        }
        order[t] = {first, static_cast<std::uint32_t>(t)};
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<bool> scheduled(num_reads, false);
    std::vector<std::atomic<std::uint32_t>> left(num_reads);
    for (std::size_t r = 0; r < num_reads; ++r) left[r].store(uses[r], std::memory_order_relaxed);
    call.read_source.assign(num_reads, 0);
    for (const ReadGroup& g : plan.read_groups) {
        for (std::size_t r = g.begin; r < g.end; ++r) call.read_source[r] = g.source_index;
    }
    const auto entry_bytes = [&](std::size_t r) {
        return call.manifest[call.read_source[r]].EntryBytes();
    };
    std::size_t begin = 0;
    while (begin < order.size()) {
        // The next chunk: targets from `begin` until their new reads reach kChunkBytes.
        call.pending_reads.clear();
        std::uint64_t bytes = 0;
        std::size_t end = begin;
        while (end < order.size() && (bytes < kChunkBytes || end == begin)) {
            for (const Piece& p : call.pieces[order[end].second]) {
                const std::size_t r = read_of(p);
                if (scheduled[r]) continue;
                scheduled[r] = true;
                call.pending_reads.push_back(r);
                bytes += plan.reads[r].size() * entry_bytes(r);
            }
            ++end;
        }
        if (!call.pending_reads.empty()) {
            // In plan order each source's reads are adjacent (the plan groups them by source):
            // the node cache and the store then resolve a source once for all of its reads.
            std::sort(call.pending_reads.begin(), call.pending_reads.end());
            const auto read_start = Clock::now();
            call.read_status = ReadUniqueRanges(call);
            call.interleaved_read_seconds += Seconds(read_start);
            if (!call.read_status.ok()) return;
        }
        internal::ParallelFor(threads, end - begin, [&](std::size_t i) {
            const std::size_t t = order[begin + i].second;
            build(t);
            for (const Piece& p : call.pieces[t]) {
                const std::size_t r = read_of(p);
                if (left[r].fetch_sub(1, std::memory_order_acq_rel) == 1) call.reads[r] = {};
            }
        });
        begin = end;
    }
}

namespace {

/// Every source the plan reads, once (a source has one group of reads per node): their keys,
/// and per manifest entry its place among them (kUnsetView when the plan reads none of it).
constexpr std::uint32_t kUnsetView = ~std::uint32_t{0};

std::vector<std::string_view> PlannedSourceKeys(const BatchPlan& plan,
                                                std::span<const SourceDescriptor> manifest,
                                                std::vector<std::uint32_t>& view_of) {
    view_of.assign(manifest.size(), kUnsetView);
    std::vector<std::string_view> keys;
    for (const ReadGroup& g : plan.read_groups) {
        if (view_of[g.source_index] != kUnsetView) continue;
        view_of[g.source_index] = static_cast<std::uint32_t>(keys.size());
        keys.push_back(manifest[g.source_index].source_ref);
    }
    return keys;
}

}  // namespace

Status SparseStore::BindInPlaceReads(ReadCall& call, std::span<const ObjectView> views,
                                     std::span<const std::uint32_t> view_of) {
    const BatchPlan& plan = *call.plan;
    SparseMetrics& m = call.metrics;
    // Each unique read's rows where the store holds them, checked as ReadRanges checks a read:
    // against the object as it is now (LoadIndex checked the descriptor earlier).
    for (const ReadGroup& g : plan.read_groups) {
        const SourceDescriptor& s = call.manifest[g.source_index];
        const ObjectView& view = views[view_of[g.source_index]];
        const MemberInfo* mi = view.info->FindMember("indices");
        const MemberInfo* mv = view.info->FindMember("values");
        const std::uint64_t isz = s.rank() * DTypeSize(s.index_dtype);
        const std::uint64_t vsz = DTypeSize(s.value_dtype);
        if (mi == nullptr || mv == nullptr || mi->RowBytes() != isz || mv->RowBytes() != vsz) {
            return DataLoss("stored object " + s.source_ref +
                            " has no indices and values members of its descriptor's dtypes");
        }
        const std::span<const std::byte> indices =
            view.members[static_cast<std::size_t>(mi - view.info->members.data())];
        const std::span<const std::byte> values =
            view.members[static_cast<std::size_t>(mv - view.info->members.data())];
        for (std::size_t r = g.begin; r < g.end; ++r) {
            const UniqueRead& u = plan.reads[r];
            if (u.start > u.end || u.end > indices.size() / isz || u.end > values.size() / vsz) {
                return OutOfRange("stored object " + s.source_ref + " holds no entries [" +
                                  std::to_string(u.start) + ", " + std::to_string(u.end) + ")");
            }
            call.reads[r] = {nullptr, indices.subspan(u.start * isz, u.size() * isz),
                             values.subspan(u.start * vsz, u.size() * vsz), u.start};
            m.range_bytes_read += u.size() * (isz + vsz);
        }
    }
    m.range_gets += plan.reads.size();
    return Status::Ok();
}

Status SparseStore::MaterializeInPlace(ReadCall& call, int threads) {
    SparseMetrics& m = call.metrics;
    const auto read_start = Clock::now();
    std::vector<std::uint32_t> view_of;
    const std::vector<std::string_view> keys =
        PlannedSourceKeys(*call.plan, call.manifest, view_of);
    const auto materialize = [&](std::span<const ObjectView> views) -> Status {
        MCS_RETURN_IF_ERROR(BindInPlaceReads(call, views, view_of));
        const double read_seconds = Seconds(read_start);
        m.read_seconds += read_seconds;
        call.interleaved_read_seconds += read_seconds;
        internal::ParallelFor(threads, call.targets.size(), [&](std::size_t t) {
            call.results[t] = MaterializeTarget(call.manifest, call.lookup, call.targets[t],
                                                call.selection.matches_of(t), call.pieces[t],
                                                call.fanout[t]);
        });
        // The views end with this call: no target keeps a piece of them.
        for (auto& pieces : call.pieces) pieces.clear();
        call.reads.clear();
        return Status::Ok();
    };
    if (keys.empty()) return materialize({});
    MCS_RETURN_IF_ERROR(store_->ViewObjects(keys, materialize).WithContext("viewing sources"));
    return Status::Ok();
}

Result<std::vector<TargetObject>> SparseStore::PublishTargets(ReadCall& call) {
    SparseMetrics& m = call.metrics;
    std::vector<TargetObject> out;
    out.reserve(call.targets.size());
    for (std::size_t t = 0; t < call.targets.size(); ++t) {
        if (!call.results[t].ok()) return call.results[t].status();
        m.fanout_bytes += call.fanout[t];
        m.target_bytes += call.results[t]->object.PayloadBytes();
        ++m.target_objects_published;
        out.push_back(std::move(call.results[t]).value());
    }
    m.materialize_seconds = Seconds(call.materialize_start) - call.interleaved_read_seconds;
    return out;
}

Result<SourceDescriptor> TargetObjectDescriptor(const TargetDescriptor& target,
                                                TargetObjectFacts facts) {
    const std::span<const Index> local = target.box.shape();
    SourceDescriptor d;
    d.source_ref.reserve(7 + target.target_id.size() + 1 + target.tensor_id.size());
    d.source_ref.append("target/").append(target.target_id).append("/").append(target.tensor_id);
    d.tensor_id = target.tensor_id;
    d.global_shape.assign(local.begin(), local.end());
    MCS_ASSIGN_OR_RETURN(d.box, Box::Whole(d.global_shape));
    d.generation = facts.generation;
    d.placement = target.placement;
    d.tile_shape = std::move(facts.tile_shape);
    d.nnz = facts.nnz;
    d.num_tiles = facts.num_tiles;
    d.apply = facts.apply;
    d.index_dtype = facts.index_dtype;
    d.value_dtype = facts.value_dtype;
    MCS_RETURN_IF_ERROR(SourceDescriptor::Validate(d));
    return d;
}

namespace {

/// The index dtype of a planned read's target object: the narrowest for its box's extents.
DType PlannedIndexDType(const TargetDescriptor& target) {
    const std::span<const Index> local = target.box.shape();
    return local.empty() ? DType::kUInt16
                         : NarrowestIndexDType(*std::max_element(local.begin(), local.end()));
}

/// Its value dtype: its first source's (an empty object of an unchanged tensor: uint8).
DType PlannedValueDType(const SourceDescriptor* first) {
    return first != nullptr ? first->value_dtype : DType::kUInt8;
}

}  // namespace

StagingLayout LayOutStaging(std::span<const PlannedRead::Range> ranges) {
    const std::size_t nr = ranges.size();
    StagingLayout out;
    out.at.assign(2 * nr, 0);
    out.follows.assign(2 * nr, false);
    // Member m: range m / 2's indices (m even) or values (m odd), by address.
    const auto bytes_of = [&](std::size_t m) {
        const PlannedRead::Range& range = ranges[m / 2];
        return m % 2 == 0 ? range.indices : range.values;
    };
    const auto address_of = [&](std::size_t m) {
        return reinterpret_cast<std::uintptr_t>(bytes_of(m).data());
    };
    std::vector<std::uint32_t> order;
    order.reserve(2 * nr);
    for (std::size_t m = 0; m < 2 * nr; ++m) {
        if (!bytes_of(m).empty()) order.push_back(static_cast<std::uint32_t>(m));
    }
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
        const std::uintptr_t pa = address_of(a), pb = address_of(b);
        return pa < pb || (pa == pb && a < b);
    });
    // Runs, in address order: a member that starts inside the run so far, or at most kMaxGap
    // bytes past its end, keeps its distance from the run's first byte.
    std::uintptr_t run_at = 0, run_end = 0;
    std::uint64_t run_offset = 0;
    std::uint32_t run = 0;  // 0: none yet
    std::vector<std::uint32_t> run_of(2 * nr, 0);
    for (std::uint32_t m : order) {
        const std::uintptr_t p = address_of(m);
        const std::uint64_t size = bytes_of(m).size();
        if (run == 0 || (p > run_end && p - run_end > static_cast<std::uintptr_t>(
                                                          StagingLayout::kMaxGap))) {
            run_offset = (out.total + 15) / 16 * 16 + (p & 15);
            run_at = run_end = p;
            ++run;
        }
        out.at[m] = run_offset + (p - run_at);
        run_of[m] = run;
        run_end = std::max<std::uintptr_t>(run_end, p + size);
        out.total = std::max<std::uint64_t>(out.total, out.at[m] + size);
    }
    // Range r's member follows range r - 1's: same source, same run, at or past its end (for a
    // caller that knows only each member of one object to be one allocation).
    for (std::size_t m = 2; m < 2 * nr; ++m) {
        const std::size_t prev = m - 2;
        out.follows[m] = run_of[m] != 0 && run_of[m] == run_of[prev] &&
                         ranges[m / 2].source == ranges[prev / 2].source &&
                         address_of(m) >= address_of(prev) + bytes_of(prev).size();
    }
    return out;
}

Result<SourceDescriptor> PlannedTargetDescriptor(const TargetDescriptor& target,
                                                 const SourceDescriptor* first, Generation step) {
    const std::span<const Index> local = target.box.shape();
    Shape tile = first != nullptr ? first->tile_shape : DefaultTileShape(local);
    for (std::size_t k = 0; k < tile.size() && k < local.size(); ++k) {
        tile[k] = std::min(tile[k], local[k]);
    }
    return TargetObjectDescriptor(
        target, {first != nullptr ? first->generation : step,
                 first != nullptr ? first->apply : ApplyMode::kOverwrite,
                 PlannedIndexDType(target), PlannedValueDType(first), std::move(tile), 0, 0});
}

Result<std::vector<TargetObjectView>> PlannedTargetViews(const PlannedRead& read,
                                                         std::vector<SourceDescriptor> descs) {
    const std::span<const TargetDescriptor> targets = read.targets;
    if (read.kept.size() != targets.size() || descs.size() != targets.size()) {
        return Internal("planned read: kept counts");
    }
    std::vector<TargetObjectView> out(targets.size());
    for (std::size_t t = 0; t < targets.size(); ++t) {
        if (read.kept[t] > read.per_target[t].capacity) {
            return Internal("planned read: target " + targets[t].target_id +
                            " kept more entries than its pieces hold");
        }
        SourceDescriptor& d = descs[t];
        // PlannedTargetDescriptor validated the rest; no tiles fit any count of entries.
        d.nnz = read.kept[t];
        d.num_tiles = 0;
        TargetObjectView& v = out[t];
        v.desc = std::move(d);
        v.target_id = targets[t].target_id;
        v.node_id = targets[t].node_id;
        v.target_box = targets[t].box;
        v.coordinate_space = "local";
    }
    return out;
}

Result<std::vector<TargetObjectView>> SparseStore::ReadPlannedStep(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options, const PlannedReadFn& build) {
    // Targets of unchanged tensors are empty objects; the others are planned.
    const auto unchanged = [&](const std::string& id) {
        return std::binary_search(manifest.unchanged.begin(), manifest.unchanged.end(), id);
    };
    std::vector<std::size_t> planned;  // into targets
    planned.reserve(targets.size());
    for (std::size_t t = 0; t < targets.size(); ++t) {
        if (!unchanged(targets[t].tensor_id)) planned.push_back(t);
    }
    std::vector<TargetDescriptor> subset;
    if (planned.size() != targets.size()) {
        subset.reserve(planned.size());
        for (std::size_t t : planned) subset.push_back(targets[t]);
    }
    const std::span<const TargetDescriptor> plan_targets =
        planned.size() == targets.size() ? targets : std::span<const TargetDescriptor>(subset);

    ReadCall call(manifest.sources, plan_targets, options);
    call.scratch = TakeScratch();
    PlannedRead read;
    read.manifest = manifest.sources;
    read.targets = targets;
    read.per_target.resize(targets.size());
    read.kept.assign(targets.size(), 0);
    std::vector<SourceDescriptor> descs(options.describe_targets ? targets.size() : 0);
    const auto describe = [&](std::size_t t, const SourceDescriptor* first) -> Status {
        if (!options.describe_targets) {
            read.per_target[t].index_dtype = PlannedIndexDType(targets[t]);
            read.per_target[t].value_dtype = PlannedValueDType(first);
            return Status::Ok();
        }
        MCS_ASSIGN_OR_RETURN(descs[t], PlannedTargetDescriptor(targets[t], first,
                                                               manifest.generation));
        read.per_target[t].index_dtype = descs[t].index_dtype;
        read.per_target[t].value_dtype = descs[t].value_dtype;
        return Status::Ok();
    };
    if (!plan_targets.empty()) {
        MCS_RETURN_IF_ERROR(SelectTargetSources(call));
        MCS_RETURN_IF_ERROR(LoadIndexes(call));
        MCS_ASSIGN_OR_RETURN(const bool within_budget, PlanReads(call));
        if (!within_budget) return Unimplemented("the read is over the planning budget");
        call.reads.resize(call.plan->reads.size());
        CollectPlannedPieces(call);
    }
    std::vector<bool> is_planned(targets.size(), false);
    for (std::size_t k = 0; k < planned.size(); ++k) {
        const std::size_t t = planned[k];
        is_planned[t] = true;
        const std::span<const SourceMatch> matches = call.selection.matches_of(k);
        if (matches.empty()) return Internal("target " + targets[t].target_id + " has no source");
        const SourceDescriptor& first = call.manifest[matches.front().source_index];
        for (const SourceMatch& m : matches) {
            const SourceDescriptor& s = call.manifest[m.source_index];
            if (s.apply != first.apply || s.value_dtype != first.value_dtype) {
                return InvalidArgument("target " + targets[t].target_id +
                                       " reads sources with different apply modes or value "
                                       "dtypes");
            }
        }
        MCS_RETURN_IF_ERROR(describe(t, &first));
        read.per_target[t].first_source = matches.front().source_index;
    }
    for (std::size_t t = 0; t < targets.size(); ++t) {
        if (!is_planned[t]) MCS_RETURN_IF_ERROR(describe(t, nullptr));
    }

    const auto start = Clock::now();
    std::vector<std::uint32_t> view_of;
    const std::vector<std::string_view> keys =
        call.plan ? PlannedSourceKeys(*call.plan, call.manifest, view_of)
                  : std::vector<std::string_view>{};
    SparseMetrics& m = call.metrics;
    const auto hand_over = [&](std::span<const ObjectView> views) -> Status {
        if (call.plan) {
            MCS_RETURN_IF_ERROR(BindInPlaceReads(call, views, view_of));
            read.ranges.resize(call.reads.size());
            for (const ReadGroup& g : call.plan->read_groups) {
                const ObjectView& view = views[view_of[g.source_index]];
                for (std::size_t r = g.begin; r < g.end; ++r) {
                    read.ranges[r] = {call.reads[r].indices, call.reads[r].values,
                                      static_cast<std::uint32_t>(g.source_index), view.pinned,
                                      &view};
                }
            }
        }
        const ReadData* reads = call.reads.data();
        for (std::size_t t = 0, k = 0; t < targets.size(); ++t) {
            PlannedRead::Target& pt = read.per_target[t];
            pt.first_piece = read.pieces.size();
            if (is_planned[t]) {
                for (const Piece& p : call.pieces[k]) {
                    const ReadData& data = *p.data;
                    const SourceDescriptor& s = call.manifest[p.source_index];
                    if (p.range.start < data.base) return Internal("piece before its read");
                    read.pieces.push_back({static_cast<std::uint32_t>(p.data - reads),
                                           p.range.start - data.base, p.range.size(),
                                           p.range.exact_coordinate_filter, p.overlap});
                    pt.capacity += p.range.size();
                    m.fanout_bytes += p.range.size() * s.EntryBytes();
                }
                ++k;
            }
            pt.end_piece = read.pieces.size();
        }
        m.read_seconds += Seconds(start);
        return build(read);
    };
    if (keys.empty()) {
        MCS_RETURN_IF_ERROR(hand_over({}));
    } else {
        MCS_RETURN_IF_ERROR(
            store_->ViewObjects(keys, hand_over).WithContext("viewing sources"));
    }
    std::vector<TargetObjectView> out;
    if (options.describe_targets) {
        MCS_ASSIGN_OR_RETURN(out, PlannedTargetViews(read, std::move(descs)));
        for (const TargetObjectView& v : out) m.target_bytes += v.desc.nnz * v.desc.EntryBytes();
    } else {
        for (std::size_t t = 0; t < targets.size(); ++t) {
            const PlannedRead::Target& pt = read.per_target[t];
            if (read.kept[t] > pt.capacity) {
                return Internal("planned read: target " + targets[t].target_id +
                                " kept more entries than its pieces hold");
            }
            m.target_bytes += read.kept[t] * (targets[t].box.rank() * DTypeSize(pt.index_dtype) +
                                              DTypeSize(pt.value_dtype));
        }
    }
    m.target_objects_published += targets.size();
    m.materialize_seconds += Seconds(start);
    AddReadMetrics(m);
    if (call.plan) call.scratch->plan = std::move(*call.plan);
    if (call.own_index) call.scratch->index = std::move(*call.own_index);
    ReturnScratch(std::move(call.scratch));
    return out;
}

void SparseStore::AddReadMetrics(const SparseMetrics& m) {
    std::lock_guard lock(metrics_mu_);
    metrics_.index_gets += m.index_gets;
    metrics_.range_gets += m.range_gets;
    metrics_.range_bytes_read += m.range_bytes_read;
    metrics_.full_gets += m.full_gets;
    metrics_.full_bytes_read += m.full_bytes_read;
    metrics_.dense_fallbacks += m.dense_fallbacks;
    metrics_.nd_fallbacks += m.nd_fallbacks;
    metrics_.cache_hits += m.cache_hits;
    metrics_.range_cache_hits += m.range_cache_hits;
    metrics_.single_flight_waits += m.single_flight_waits;
    metrics_.fanout_bytes += m.fanout_bytes;
    metrics_.target_objects_published += m.target_objects_published;
    metrics_.target_bytes += m.target_bytes;
    metrics_.planned_ranges += m.planned_ranges;
    metrics_.unique_ranges += m.unique_ranges;
    metrics_.plan_seconds += m.plan_seconds;
    metrics_.read_seconds += m.read_seconds;
    metrics_.materialize_seconds += m.materialize_seconds;
}

// ---------------------------------------------------------------------------------------------
// Sources: what the store holds, checked against what a manifest entry claims.
// ---------------------------------------------------------------------------------------------
namespace {

constexpr std::array<const char*, 4> kSourceMembers = {"indices", "values", "tile_coords",
                                                       "tile_ptr"};
constexpr std::size_t kTileCoordsMember = 2;
constexpr std::size_t kTilePtrMember = 3;

/// The stored descriptor of `info` (the object `claimed` names), checked against `claimed` and
/// against the sizes of its members; `members` receives the members in kSourceMembers order.
/// When the metadata is exactly `claimed`'s and `owner` owns `claimed` (ReadOptions::
/// manifest_owner), the result is `claimed` itself, shared with its owner; else a copy.
Result<std::shared_ptr<const SourceDescriptor>> DescriptorOfStored(
    const SourceDescriptor& claimed, const std::shared_ptr<const void>& owner,
    const ObjectInfo& info, std::array<const MemberInfo*, kSourceMembers.size()>& members,
    const std::string* entry_text = nullptr) {
    // A manifest entry of this store names the object with exactly its metadata: written
    // again from the entry and compared, several times cheaper than decoding it. Anything else
    // (another writer's formatting, another object) is decoded and compared field by field.
    for (std::size_t i = 0; i < kSourceMembers.size(); ++i) {
        members[i] = info.FindMember(kSourceMembers[i]);
    }
    const auto checksum = [&](std::size_t i) {
        return members[i] == nullptr ? std::uint64_t{0} : members[i]->checksum;
    };
    std::shared_ptr<const SourceDescriptor> held;
    // The text `claimed` was decoded from (a kept manifest's entry), when known: the same text
    // decodes to the same descriptor.
    if ((entry_text != nullptr && *entry_text == info.metadata) ||
        IsMetadataOf(info.metadata, claimed, "global",
                     {checksum(0), checksum(1), checksum(2), checksum(3)})) {
        held = owner ? std::shared_ptr<const SourceDescriptor>(owner, &claimed)
                     : std::make_shared<const SourceDescriptor>(claimed);
    } else {
        MCS_ASSIGN_OR_RETURN(SourceDescriptor decoded,
                             DecodeObjectMetadata(claimed.source_ref, info.metadata));
        MCS_RETURN_IF_ERROR(CheckClaim(claimed, decoded));
        held = std::make_shared<const SourceDescriptor>(std::move(decoded));
    }
    const SourceDescriptor& stored = *held;
    // The members must hold what the metadata says: every later allocation is sized from it.
    const std::array<std::uint64_t, kSourceMembers.size()> expected = {
        stored.nnz * stored.rank() * DTypeSize(stored.index_dtype),
        stored.nnz * DTypeSize(stored.value_dtype),
        stored.num_tiles * stored.rank() * sizeof(TileCoord),
        (stored.num_tiles + 1) * sizeof(std::uint64_t),
    };
    for (std::size_t i = 0; i < kSourceMembers.size(); ++i) {
        const MemberInfo* m = members[i];
        if (m == nullptr || m->size_bytes != expected[i]) {
            return DataLoss("stored object " + claimed.source_ref + " member " + kSourceMembers[i] +
                            (m == nullptr ? " is missing"
                                          : " holds " + std::to_string(m->size_bytes) +
                                                " bytes, its metadata says " +
                                                std::to_string(expected[i])));
        }
    }
    return held;
}

/// A source's tile index from its stored descriptor and tile members.
NodeCache::IndexResult IndexOf(std::shared_ptr<const SourceDescriptor> stored,
                               std::vector<TileCoord> coords, std::vector<std::uint64_t> ptr) {
    MCS_ASSIGN_OR_RETURN(TileIndex index,
                         TileIndex::Make(*stored, std::move(coords), std::move(ptr)));
    return std::make_shared<const SourceIndex>(SourceIndex{std::move(stored), std::move(index)});
}

/// The tile index of a viewed source object (the object `claimed` names).
NodeCache::IndexResult IndexOfView(const SourceDescriptor& claimed,
                                   const std::shared_ptr<const void>& owner,
                                   const std::string* entry_text, const ObjectView& view) {
    std::array<const MemberInfo*, kSourceMembers.size()> members{};
    MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SourceDescriptor> stored,
                         DescriptorOfStored(claimed, owner, *view.info, members, entry_text));
    const auto bytes = [&](std::size_t i) {
        return view.members[static_cast<std::size_t>(members[i] - view.info->members.data())];
    };
    const std::span<const std::byte> coords_bytes = bytes(kTileCoordsMember);
    const std::span<const std::byte> ptr_bytes = bytes(kTilePtrMember);
    std::vector<TileCoord> coords(coords_bytes.size() / sizeof(TileCoord));
    std::vector<std::uint64_t> ptr(ptr_bytes.size() / sizeof(std::uint64_t));
    if (!coords_bytes.empty()) std::memcpy(coords.data(), coords_bytes.data(), coords_bytes.size());
    if (!ptr_bytes.empty()) std::memcpy(ptr.data(), ptr_bytes.data(), ptr_bytes.size());
    return IndexOf(std::move(stored), std::move(coords), std::move(ptr));
}

}  // namespace

Result<SourceDescriptor> SparseStore::StoredDescriptor(const SourceDescriptor& claimed) {
    MCS_RETURN_IF_ERROR(internal::ValidateId("source_ref", claimed.source_ref));
    MCS_ASSIGN_OR_RETURN(std::shared_ptr<const ObjectInfo> stat,
                         store_->StatShared(claimed.source_ref));
    std::array<const MemberInfo*, kSourceMembers.size()> members{};
    MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SourceDescriptor> stored,
                         DescriptorOfStored(claimed, nullptr, *stat, members));
    return *stored;
}

const std::string* SparseStore::EntryTexts::Of(const SourceDescriptor& claimed) const {
    if (kept == nullptr || kept->entries.size() != kept->sources.size()) return nullptr;
    const SourceDescriptor* first = kept->sources.data();
    const SourceDescriptor* end = first + kept->sources.size();
    if (std::less<>{}(&claimed, first) || !std::less<>{}(&claimed, end)) return nullptr;
    const std::shared_ptr<const ObjectInfo>& entry =
        kept->entries[static_cast<std::size_t>(&claimed - first)];
    return entry == nullptr ? nullptr : &entry->metadata;
}

SparseStore::EntryTexts SparseStore::EntryTextsOf(const std::shared_ptr<const void>& owner) {
    if (owner == nullptr) return {};
    std::lock_guard lock(seal_cache_mu_);
    // The owner shares the kept manifest's ownership (an aliasing pointer to its array or to
    // its first entry); the entries' addresses are checked against its array in Of.
    for (const auto& [delta, kept] : manifest_cache_) {
        if (!owner.owner_before(kept) && !kept.owner_before(owner)) return {kept};
    }
    return {};
}

void SparseStore::ReadIndexes(std::span<const SourceDescriptor* const> sources,
                              const std::shared_ptr<const void>& owner, const EntryTexts& texts,
                              std::span<NodeCache::IndexResult> out) {
    // One view of all of them (one lookup and one lock for the batch, the members read where
    // they lie) where the store views in place; a source that fails its checks fails alone.
    // A batch with a missing or invalid key is read source by source, for each source's error.
    bool viewed = false;
    if (store_->ViewsInPlace()) {
        std::vector<std::string_view> keys(sources.size());
        bool valid = true;
        for (std::size_t i = 0; i < sources.size() && valid; ++i) {
            valid = internal::ValidateId("source_ref", sources[i]->source_ref).ok();
            keys[i] = sources[i]->source_ref;
        }
        viewed = valid && store_->ViewObjects(keys, [&](std::span<const ObjectView> views) {
                              for (std::size_t i = 0; i < views.size(); ++i) {
                                  out[i] = IndexOfView(*sources[i], owner,
                                                       texts.Of(*sources[i]), views[i]);
                              }
                              return Status::Ok();
                          }).ok();
    }
    if (!viewed) {
        for (std::size_t i = 0; i < sources.size(); ++i) {
            out[i] = ReadIndex(*sources[i], owner, texts);
        }
    }
}

Result<SourceDescriptor> SparseStore::VerifySource(const SourceDescriptor& claimed) {
    if (auto hit = cache_->FindIndex(claimed.source_ref)) {
        MCS_RETURN_IF_ERROR(CheckClaim(claimed, *hit->source));
        return *hit->source;
    }
    return StoredDescriptor(claimed);
}

Result<std::shared_ptr<const SourceIndex>> SparseStore::ReadIndex(
    const SourceDescriptor& src, const std::shared_ptr<const void>& owner,
    const EntryTexts& texts) {
    // Sized from the stored metadata only (checked against the members), never from the
    // requester's numbers.
    MCS_RETURN_IF_ERROR(internal::ValidateId("source_ref", src.source_ref));
    MCS_ASSIGN_OR_RETURN(std::shared_ptr<const ObjectInfo> stat, store_->StatShared(src.source_ref));
    std::array<const MemberInfo*, kSourceMembers.size()> members{};
    MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SourceDescriptor> held,
                         DescriptorOfStored(src, owner, *stat, members, texts.Of(src)));
    const SourceDescriptor& stored = *held;
    std::vector<TileCoord> coords(stored.num_tiles * stored.rank());
    std::vector<std::uint64_t> ptr(stored.num_tiles + 1);
    MCS_RETURN_IF_ERROR(store_->ReadMember(
        stored.source_ref, "tile_coords",
        {reinterpret_cast<std::byte*>(coords.data()), coords.size() * sizeof(TileCoord)}));
    MCS_RETURN_IF_ERROR(store_->ReadMember(
        stored.source_ref, "tile_ptr",
        {reinterpret_cast<std::byte*>(ptr.data()), ptr.size() * sizeof(std::uint64_t)}));
    return IndexOf(std::move(held), std::move(coords), std::move(ptr));
}

std::unique_ptr<SparseStore::PlanScratch> SparseStore::TakeScratch() {
    {
        std::lock_guard lock(scratch_mu_);
        if (scratch_) return std::move(scratch_);
    }
    return std::make_unique<PlanScratch>();
}

void SparseStore::ReturnScratch(std::unique_ptr<PlanScratch> scratch) {
    std::lock_guard lock(scratch_mu_);
    if (!scratch_) scratch_ = std::move(scratch);
}

}  // namespace mooncake::sparse
