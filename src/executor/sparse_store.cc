// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// SparseStore's construction, metrics and caches, and its read side (docs/design.md §4); the
// commit side is in sparse_commit.cc.
#include "executor/sparse_store.h"

#include "executor/node_cache.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

namespace mooncake::sparse {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
    return std::chrono::duration<double>(Clock::now() - since).count();
}

/// Runs fn(i) for i in [0, n) on up to `threads` threads (contiguous chunks).
template <typename Fn>
void ParallelFor(std::size_t n, int threads, Fn&& fn) {
    std::size_t t = threads > 0 ? std::size_t(threads) : std::max(1u, std::thread::hardware_concurrency());
    t = std::min(t, n);
    if (t <= 1) {
        for (std::size_t i = 0; i < n; ++i) fn(i);
        return;
    }
    std::vector<std::thread> pool;
    const std::size_t chunk = (n + t - 1) / t;
    for (std::size_t k = 0; k < t; ++k) {
        const std::size_t lo = k * chunk, hi = std::min(n, lo + chunk);
        if (lo >= hi) break;
        pool.emplace_back([&, lo, hi] {
            for (std::size_t i = lo; i < hi; ++i) fn(i);
        });
    }
    for (auto& th : pool) th.join();
}

}  // namespace

std::vector<std::pair<std::string, double>> SparseMetrics::Items() const {
    return {
        {"source_objects_put", double(source_objects_put)},
        {"source_bytes_put", double(source_bytes_put)},
        {"index_gets", double(index_gets)},
        {"range_gets", double(range_gets)},
        {"range_bytes_read", double(range_bytes_read)},
        {"full_gets", double(full_gets)},
        {"dense_fallbacks", double(dense_fallbacks)},
        {"nd_fallbacks", double(nd_fallbacks)},
        {"cache_hits", double(cache_hits)},
        {"fanout_bytes", double(fanout_bytes)},
        {"target_objects_published", double(target_objects_published)},
        {"target_bytes", double(target_bytes)},
        {"idempotent_commits", double(idempotent_commits)},
        {"index_cache_hits", double(index_cache_hits)},
        {"range_cache_hits", double(range_cache_hits)},
        {"single_flight_waits", double(single_flight_waits)},
        {"index_single_flight_waits", double(index_single_flight_waits)},
        {"planned_ranges", double(planned_ranges)},
        {"unique_ranges", double(unique_ranges)},
        {"full_bytes_read", double(full_bytes_read)},
        {"plan_seconds", plan_seconds},
        {"read_seconds", read_seconds},
        {"materialize_seconds", materialize_seconds},
    };
}

SparseStore::SparseStore(std::shared_ptr<ObjectStore> store, SparseStoreOptions options)
    : store_(std::move(store)),
      options_(std::move(options)),
      cache_(std::make_unique<NodeCache>(options_.index_cache_capacity_bytes,
                                         options_.range_cache_capacity_bytes)) {}

SparseStore::~SparseStore() = default;

SparseMetrics SparseStore::Metrics() const {
    std::lock_guard lock(metrics_mu_);
    return metrics_;
}

void SparseStore::ResetMetrics() {
    std::lock_guard lock(metrics_mu_);
    metrics_ = {};
}

void SparseStore::ClearCaches() { cache_->Clear(); }

// ---------------------------------------------------------------------------------------------
// Read side.
// ---------------------------------------------------------------------------------------------
namespace {

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

}  // namespace

Result<SourceDescriptor> SparseStore::StoredDescriptor(const SourceDescriptor& claimed) {
    MCS_RETURN_IF_ERROR(internal::ValidateId("source_ref", claimed.source_ref));
    MCS_ASSIGN_OR_RETURN(ObjectInfo info, store_->Stat(claimed.source_ref));
    MCS_ASSIGN_OR_RETURN(SourceDescriptor stored,
                         DecodeObjectMetadata(claimed.source_ref, info.metadata));
    MCS_RETURN_IF_ERROR(CheckClaim(claimed, stored));
    // The members must hold what the metadata says: every later allocation is sized from it.
    const struct {
        const char* name;
        std::uint64_t bytes;
    } expected[] = {
        {"indices", stored.nnz * stored.rank() * DTypeSize(stored.index_dtype)},
        {"values", stored.nnz * DTypeSize(stored.value_dtype)},
        {"tile_coords", stored.num_tiles * stored.rank() * sizeof(TileCoord)},
        {"tile_ptr", (stored.num_tiles + 1) * sizeof(std::uint64_t)},
    };
    for (const auto& e : expected) {
        const MemberInfo* m = info.FindMember(e.name);
        if (m == nullptr || m->size_bytes != e.bytes) {
            return DataLoss("stored object " + claimed.source_ref + " member " + e.name +
                            (m == nullptr ? " is missing"
                                          : " holds " + std::to_string(m->size_bytes) +
                                                " bytes, its metadata says " +
                                                std::to_string(e.bytes)));
        }
    }
    return stored;
}

Result<SourceDescriptor> SparseStore::VerifySource(const SourceDescriptor& claimed) {
    if (auto hit = cache_->FindIndex(claimed.source_ref)) {
        MCS_RETURN_IF_ERROR(CheckClaim(claimed, hit->source));
        return hit->source;
    }
    return StoredDescriptor(claimed);
}

Result<std::shared_ptr<const TileIndex>> SparseStore::LoadIndex(const SourceDescriptor& src) {
    using IndexResult = NodeCache::IndexResult;
    // The cache holds the index together with the stored descriptor it was built from; a
    // requester's entry must match that descriptor, so a wrong manifest entry fails its own
    // read and never poisons the node's cache for others.
    const auto checked = [&](const IndexResult& r) -> Result<std::shared_ptr<const TileIndex>> {
        if (!r.ok()) return r.status();
        MCS_RETURN_IF_ERROR(CheckClaim(src, (*r)->source));
        return std::shared_ptr<const TileIndex>(*r, &(*r)->index);
    };
    NodeCache::IndexClaim claim = cache_->ClaimIndex(src.source_ref);
    if (claim.hit) {
        std::lock_guard mlock(metrics_mu_);
        ++metrics_.cache_hits;
        ++metrics_.index_cache_hits;
        return checked(claim.hit);
    }
    if (claim.in_flight.valid()) {
        {
            std::lock_guard mlock(metrics_mu_);
            ++metrics_.index_single_flight_waits;
        }
        return checked(claim.in_flight.get());
    }
    IndexResult result = [&]() -> IndexResult {
        // Sized from the stored metadata only (checked against the members), never from the
        // requester's numbers.
        MCS_ASSIGN_OR_RETURN(SourceDescriptor stored, StoredDescriptor(src));
        std::vector<TileCoord> coords(stored.num_tiles * stored.rank());
        std::vector<std::uint64_t> ptr(stored.num_tiles + 1);
        MCS_RETURN_IF_ERROR(store_->ReadMember(
            stored.source_ref, "tile_coords",
            {reinterpret_cast<std::byte*>(coords.data()), coords.size() * sizeof(TileCoord)}));
        MCS_RETURN_IF_ERROR(store_->ReadMember(
            stored.source_ref, "tile_ptr",
            {reinterpret_cast<std::byte*>(ptr.data()), ptr.size() * sizeof(std::uint64_t)}));
        {
            std::lock_guard mlock(metrics_mu_);
            ++metrics_.index_gets;
        }
        MCS_ASSIGN_OR_RETURN(TileIndex index,
                             TileIndex::Make(stored, std::move(coords), std::move(ptr)));
        return std::make_shared<const SourceIndex>(
            SourceIndex{std::move(stored), std::move(index)});
    }();
    cache_->FinishIndex(src.source_ref, claim, result);
    return checked(result);
}

namespace {

/// Reads whole `indices`/`values` members of a source (the baseline and the fallback).
Status ReadFullSource(ObjectStore& store, const SourceDescriptor& src, ReadData& out) {
    auto idx = std::make_shared<std::vector<std::byte>>(src.nnz * src.rank() * DTypeSize(src.index_dtype));
    auto val = std::make_shared<std::vector<std::byte>>(src.nnz * DTypeSize(src.value_dtype));
    MCS_RETURN_IF_ERROR(store.ReadMember(src.source_ref, "indices", *idx));
    MCS_RETURN_IF_ERROR(store.ReadMember(src.source_ref, "values", *val));
    out = {std::move(idx), std::move(val), 0};
    return Status::Ok();
}

struct Piece {
    std::size_t source_index;
    EntryRange range;  ///< Entry offsets into the source.
    Box overlap;
    const ReadData* data;
};

/// Filters, rebases and builds one target-local object from its pieces.
Result<TargetObject> Materialize(std::span<const SourceDescriptor> manifest,
                                 const TargetDescriptor& target,
                                 std::span<const SourceMatch> matches, std::span<const Piece> pieces,
                                 std::uint64_t& fanout_bytes) {
    if (matches.empty()) return Internal("target " + target.target_id + " has no source");
    const SourceDescriptor& first = manifest[matches.front().source_index];
    for (const SourceMatch& m : matches) {
        const SourceDescriptor& s = manifest[m.source_index];
        if (s.apply != first.apply || s.value_dtype != first.value_dtype) {
            return InvalidArgument("target " + target.target_id +
                                   " reads sources with different apply modes or value dtypes");
        }
    }
    Shape local(target.box.shape().begin(), target.box.shape().end());
    const DType out_index = NarrowestIndexDType(*std::max_element(local.begin(), local.end()));
    std::vector<std::byte> indices, values;
    for (const Piece& p : pieces) {
        const SourceDescriptor& s = manifest[p.source_index];
        const std::size_t isz = DTypeSize(s.index_dtype) * s.rank();
        const std::size_t vsz = DTypeSize(s.value_dtype);
        const std::uint64_t row = p.range.start - p.data->base;
        const std::uint64_t count = p.range.size();
        if ((row + count) * isz > p.data->indices->size() || (row + count) * vsz > p.data->values->size()) {
            return Internal("range read does not hold the planned region");
        }
        std::span<const std::byte> in_idx(p.data->indices->data() + row * isz, count * isz);
        std::span<const std::byte> in_val(p.data->values->data() + row * vsz, count * vsz);
        FilterRebase(in_idx, in_val, count, s.rank(), s.index_dtype, vsz, p.overlap,
                     p.range.exact_coordinate_filter, target.box.origin(), out_index, indices, values);
        fanout_bytes += count * (isz + vsz);
    }
    SourceDescriptor desc;
    desc.source_ref = "target/" + target.target_id + "/" + target.tensor_id;
    desc.tensor_id = target.tensor_id;
    desc.global_shape = local;
    MCS_ASSIGN_OR_RETURN(desc.box, Box::Whole(local));
    desc.generation = first.generation;
    desc.placement = target.placement;
    desc.apply = first.apply;
    const std::uint64_t nnz = values.size() / DTypeSize(first.value_dtype);
    HostArray idx_arr{out_index, {Index(nnz), Index(local.size())}, indices};
    HostArray val_arr{first.value_dtype, {Index(nnz)}, values};
    EncodeOptions enc;
    Shape tile(first.tile_shape);
    for (std::size_t d = 0; d < tile.size(); ++d) tile[d] = std::min(tile[d], local[d]);
    enc.tile_shape = tile;
    enc.num_threads = 1;
    auto built = BuildSparseObject(std::move(desc), idx_arr, val_arr, enc);
    if (!built.ok()) return built.status().WithContext("materializing " + target.target_id);
    TargetObject out{target.target_id, target.node_id, target.box, std::move(built).value()};
    out.object.coordinate_space = "local";
    return out;
}

}  // namespace

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

Result<std::vector<TargetObject>> SparseStore::ReadSparseObjects(
    std::span<const SourceDescriptor> manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options) {
    const auto t0 = Clock::now();
    std::unique_ptr<PlanScratch> scratch = TakeScratch();
    std::optional<ManifestIndex> own_index;
    if (options.manifest_index == nullptr) {
        MCS_ASSIGN_OR_RETURN(own_index, ManifestIndex::Make(manifest, &scratch->index));
    }
    const ManifestIndex& manifest_index =
        options.manifest_index != nullptr ? *options.manifest_index : *own_index;
    MCS_ASSIGN_OR_RETURN(SourceSelection selection,
                         SelectSources(manifest, manifest_index, targets, &scratch->plan.selection));
    SparseMetrics m;  // this call's contribution

    std::vector<std::vector<Piece>> pieces(targets.size());
    std::vector<ReadData> reads;            // sparse path: one per unique read
    std::vector<ReadData> full(manifest.size());  // baseline / fallback: per source
    bool fallback = false;

    if (options.strategy == ReadStrategy::kSparseRanges) {
        // Step 3: index-only GETs, cached per node.
        std::vector<std::shared_ptr<const TileIndex>> indexes(manifest.size());
        std::vector<const TileIndex*> lookup(manifest.size(), nullptr);
        for (std::size_t si : selection.needed_sources) {
            MCS_ASSIGN_OR_RETURN(indexes[si], LoadIndex(manifest[si]));
            lookup[si] = indexes[si].get();
        }
        // Steps 4-5: plan and dedup. The selection is copied into the plan: the budget
        // fallback below still needs it when planning fails.
        auto plan = PlanBatch(manifest, targets, selection, lookup, options.plan, &scratch->plan);
        if (!plan.ok() && plan.status().code() != StatusCode::kResourceExhausted) return plan.status();
        m.plan_seconds = Seconds(t0);
        if (plan.ok()) {
            m.nd_fallbacks = plan->stats.query.nd_path;
            m.planned_ranges = plan->stats.regions;
            m.unique_ranges = plan->reads.size();
            // Step 6: one physical read per unique range (or a node-cache hit).
            const auto t1 = Clock::now();
            reads.resize(plan->reads.size());
            // The source of each read, from its (source, node) group.
            std::vector<std::uint32_t> read_source(plan->reads.size());
            std::vector<NodeCache::RangeKey> keys(plan->reads.size());
            for (const ReadGroup& g : plan->read_groups) {
                const std::string* ref = &manifest[g.source_index].source_ref;
                for (std::size_t r = g.begin; r < g.end; ++r) {
                    read_source[r] = g.source_index;
                    keys[r] = {ref, plan->reads[r].start, plan->reads[r].end};
                }
            }
            // Each unique range is a cache hit, a wait on a concurrent request's read of it, or
            // a read of our own that concurrent requests may wait on (single flight).
            NodeCache::RangeClaims claims = cache_->ClaimRanges(keys, &m, reads);
            m.cache_hits += claims.hits;
            m.range_cache_hits += claims.hits;
            std::vector<RangeRead> batch;
            std::vector<std::shared_ptr<std::vector<std::byte>>> idx_bufs, val_bufs;
            for (std::size_t r : claims.missing) {
                const UniqueRead& u = plan->reads[r];
                const SourceDescriptor& s = manifest[read_source[r]];
                auto ib = std::make_shared<std::vector<std::byte>>(u.size() * s.rank() * DTypeSize(s.index_dtype));
                auto vb = std::make_shared<std::vector<std::byte>>(u.size() * DTypeSize(s.value_dtype));
                batch.push_back({s.source_ref, "indices", u.start, u.end, *ib});
                batch.push_back({s.source_ref, "values", u.start, u.end, *vb});
                m.range_bytes_read += ib->size() + vb->size();
                idx_bufs.push_back(ib);
                val_bufs.push_back(vb);
            }
            const Status read_status = batch.empty() ? Status::Ok() : store_->ReadRanges(batch);
            if (read_status.ok()) {
                for (std::size_t k = 0; k < claims.missing.size(); ++k) {
                    const std::size_t r = claims.missing[k];
                    reads[r] = {idx_bufs[k], val_bufs[k], plan->reads[r].start};
                }
            }
            // Our flights complete before we wait for anyone else's, so waits never form a cycle.
            cache_->FinishRanges(keys, &m, read_status, reads, claims);
            if (!read_status.ok()) return read_status.WithContext("range reads");
            m.range_gets += claims.missing.size();
            for (auto& [r, flight] : claims.waits) {
                const NodeCache::RangeResult& got = flight.get();
                if (!got.ok()) return got.status().WithContext("a concurrent request's range read");
                reads[r] = *got;
                ++m.single_flight_waits;
            }
            m.read_seconds = Seconds(t1);
            for (std::size_t t = 0; t < targets.size(); ++t) {
                const auto [first, last] = plan->match_range(t);
                for (std::size_t k = first; k < last; ++k) {
                    const SourceMatch& match = plan->matches()[k];
                    const Box overlap = match.Overlap(manifest, targets);
                    for (const Region& r : plan->regions_of_match(k)) {
                        pieces[t].push_back(
                            {match.source_index, r.range(), overlap, &reads[r.read_index()]});
                    }
                }
            }
            scratch->plan = std::move(plan).value();  // its storage serves the next read
        } else {
            fallback = true;  // over the planning budget: explicit, counted fallback below
        }
    }

    const auto t2 = Clock::now();
    std::vector<Result<TargetObject>> results(targets.size(), Result<TargetObject>(Internal("unset")));
    std::vector<std::uint64_t> fanout(targets.size(), 0);
    if (options.strategy == ReadStrategy::kFullSourcePerTarget) {
        // Baseline for comparison: every target GETs each source it matches in full, no dedup.
        for (std::size_t t = 0; t < targets.size(); ++t) {
            const std::span<const SourceMatch> matches = selection.matches_of(t);
            std::vector<ReadData> own(matches.size());
            for (std::size_t k = 0; k < own.size(); ++k) {
                const SourceMatch& match = matches[k];
                const SourceDescriptor& s = manifest[match.source_index];
                MCS_RETURN_IF_ERROR(VerifySource(s));
                MCS_RETURN_IF_ERROR(ReadFullSource(*store_, s, own[k]));
                ++m.full_gets;
                m.full_bytes_read += own[k].indices->size() + own[k].values->size();
                if (s.nnz > 0) {
                    pieces[t].push_back({match.source_index, {0, s.nnz, true},
                                         match.Overlap(manifest, targets), &own[k]});
                }
            }
            results[t] = Materialize(manifest, targets[t], matches, pieces[t], fanout[t]);
        }
        m.read_seconds = Seconds(t2);
    } else {
        if (fallback) {
            // Over the planning budget: an explicit, counted fallback that reads each source in
            // full once for the node and filters every entry.
            const auto t1 = Clock::now();
            for (std::size_t si : selection.needed_sources) {
                MCS_RETURN_IF_ERROR(VerifySource(manifest[si]));
                MCS_RETURN_IF_ERROR(ReadFullSource(*store_, manifest[si], full[si]));
                ++m.full_gets;
                ++m.dense_fallbacks;
                m.full_bytes_read += full[si].indices->size() + full[si].values->size();
            }
            for (std::size_t t = 0; t < targets.size(); ++t) {
                for (const SourceMatch& match : selection.matches_of(t)) {
                    const SourceDescriptor& s = manifest[match.source_index];
                    if (s.nnz > 0) {
                        pieces[t].push_back({match.source_index, {0, s.nnz, true},
                                             match.Overlap(manifest, targets),
                                             &full[match.source_index]});
                    }
                }
            }
            m.read_seconds = Seconds(t1);
        }
        // Steps 7-8: filter, rebase, publish target-local objects. Threads only pay off for
        // large batches: starting them costs far more than filtering a few thousand entries.
        std::uint64_t entries = 0;
        for (const auto& p : pieces) {
            for (const Piece& piece : p) entries += piece.range.size();
        }
        constexpr std::uint64_t kEntriesPerThread = std::uint64_t{1} << 18;
        const int threads = entries < 2 * kEntriesPerThread ? 1 : options.num_threads;
        ParallelFor(targets.size(), threads, [&](std::size_t t) {
            results[t] = Materialize(manifest, targets[t], selection.matches_of(t), pieces[t],
                                     fanout[t]);
        });
    }
    std::vector<TargetObject> out;
    out.reserve(targets.size());
    for (std::size_t t = 0; t < targets.size(); ++t) {
        if (!results[t].ok()) return results[t].status();
        m.fanout_bytes += fanout[t];
        m.target_bytes += results[t]->object.PayloadBytes();
        ++m.target_objects_published;
        out.push_back(std::move(results[t]).value());
    }
    m.materialize_seconds = Seconds(t2);

    std::lock_guard mlock(metrics_mu_);
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
    if (own_index) scratch->index = std::move(*own_index);
    ReturnScratch(std::move(scratch));
    return out;
}

}  // namespace mooncake::sparse
