// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// A training run of SparseStore (docs/design.md §9): steps sealed with the model's tensor list,
// waits for a step, the newest sealed step, retention with readers' leases, and reads of a step
// manifest (unchanged tensors, folds of several steps merged per target).
//
// State lives in the object store, so that every process of a run (embedded, through the node
// daemon, or on mooncake:// across nodes) sees the same steps:
//   mcs/seal/steps/<b-d>        one per sealed step; members "tensor_ids" (the model's) and
//                               "sources" (the source objects sealed), newline-separated
//   mcs/seal/pending/<b-d>      a seal in progress, with its expiry
//   mcs/step/latest, floor      the newest sealed step; the oldest step not yet freed
//   mcs/step/retention          keep_last
// (with a namespace, "mcs/seal@NAME/...", and so on). Leases, retention and anchors are in
// sparse_retention.cc.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "codec/codec.h"
#include "executor/node_cache.h"
#include "transport/parallel_for.h"
#include "executor/sparse_store.h"
#include "executor/step_records.h"

namespace mooncake::sparse {
namespace {

using Json = nlohmann::json;
using namespace internal;  // step_records.h

/// An empty target-local object: a target of a tensor that a sealed step left unchanged.
/// It has no values, so it applies to a weight of any dtype (as a no-op).
Result<TargetObject> EmptyTarget(const TargetDescriptor& target, Generation generation) {
    Shape local(target.box.shape().begin(), target.box.shape().end());
    SourceDescriptor desc;
    desc.source_ref = "target/" + target.target_id + "/" + target.tensor_id;
    desc.tensor_id = target.tensor_id;
    desc.global_shape = local;
    MCS_ASSIGN_OR_RETURN(desc.box, Box::Whole(local));
    desc.generation = generation;
    desc.placement = target.placement;
    desc.apply = ApplyMode::kOverwrite;
    const DType index = NarrowestIndexDType(*std::max_element(local.begin(), local.end()));
    const HostArray idx{index, {0, Index(local.size())}, {}};
    const HostArray val{DType::kUInt8, {0}, {}};
    MCS_ASSIGN_OR_RETURN(SparseObject obj, BuildSparseObject(std::move(desc), idx, val));
    obj.coordinate_space = "local";
    return TargetObject{target.target_id, target.node_id, target.box, std::move(obj)};
}

std::uint64_t LoadUnsigned(const std::byte* p, std::size_t size) {
    switch (size) {
        case 1: return std::to_integer<std::uint64_t>(*p);
        case 2: { std::uint16_t v; std::memcpy(&v, p, 2); return v; }
        case 4: { std::uint32_t v; std::memcpy(&v, p, 4); return v; }
        default: { std::uint64_t v; std::memcpy(&v, p, 8); return v; }
    }
}

/// One object per target from the objects of the steps of a fold, in step order: per
/// coordinate the latest value (overwrite) or the sum (scatter_add). Every step object is
/// sorted by (tile, row-major coordinate) with the same tile shape, so the steps merge tile by
/// tile: within a tile their entries are merged by coordinate (stable: step order within one
/// coordinate), and the result comes out sorted, which BuildSparseObject takes without sorting.
Result<TargetObject> MergeSteps(std::vector<TargetObject>& parts, Generation generation) {
    TargetObject& first = parts.front();
    const SourceDescriptor& d0 = first.object.desc;
    const std::size_t rank = d0.rank();
    for (const TargetObject& p : parts) {
        const SourceDescriptor& d = p.object.desc;
        if (d.apply != d0.apply || d.value_dtype != d0.value_dtype ||
            d.index_dtype != d0.index_dtype || d.tile_shape != d0.tile_shape ||
            d.global_shape != d0.global_shape) {
            return InvalidArgument("target " + first.target_id + " of '" + d0.tensor_id +
                                   "': the steps of the fold differ in apply mode, dtypes or "
                                   "tile shape");
        }
    }
    const bool overwrite = d0.apply == ApplyMode::kOverwrite;
    const std::size_t isz = DTypeSize(d0.index_dtype);
    const std::size_t vsz = DTypeSize(d0.value_dtype);
    const std::size_t row = isz * rank;
    std::uint64_t total = 0;
    for (const TargetObject& p : parts) total += p.object.desc.nnz;
    ByteBuffer indices(total * row), values(total * vsz);
    std::uint64_t out = 0;  // entries written
    const auto emit = [&](const SparseObject& o, std::uint64_t r, std::uint64_t n) {
        std::memcpy(indices.data() + out * row, o.indices.data() + r * row, n * row);
        std::memcpy(values.data() + out * vsz, o.values.data() + r * vsz, n * vsz);
        out += n;
    };

    const auto tile_less = [&](const TileCoord* a, const TileCoord* b) {
        return std::lexicographical_compare(a, a + rank, b, b + rank);
    };
    // One part's entries of the current tile: rows [row, end) of parts[part].
    struct Run {
        std::uint32_t part;
        std::uint64_t row, end;
    };
    struct Entry {
        std::uint64_t coord;  ///< Position within the tile (row-major).
        std::uint32_t part;
        std::uint64_t row;
    };
    const Shape& tile_shape = d0.tile_shape;
    std::vector<std::size_t> cursor(parts.size(), 0);  // next tile of each part
    std::vector<Run> runs;
    std::vector<Entry> entries;
    std::vector<std::uint32_t> marks, chain;  // per tile, reused
    std::vector<std::uint64_t> stack, keys;
    std::vector<std::size_t> bounds;  // the runs' ends within `keys`
    // The merged object's tile index, built as its tiles are written (in order).
    std::vector<TileCoord> tile_coords;
    std::vector<std::uint64_t> tile_ptr{0};
    std::vector<TileCoord> written;  // the tile being written
    const auto close_tile = [&] {
        if (out == tile_ptr.back()) return;
        tile_coords.insert(tile_coords.end(), written.begin(), written.end());
        tile_ptr.push_back(out);
    };
    for (;;) {
        close_tile();
        // The smallest next tile among the parts.
        const TileCoord* next = nullptr;
        for (std::size_t p = 0; p < parts.size(); ++p) {
            const SparseObject& o = parts[p].object;
            if (cursor[p] >= o.desc.num_tiles) continue;
            const TileCoord* t = o.tile_coords.data() + cursor[p] * rank;
            if (next == nullptr || tile_less(t, next)) next = t;
        }
        if (next == nullptr) break;
        const std::vector<TileCoord> tile(next, next + rank);
        written = tile;
        runs.clear();
        std::uint64_t in_tile = 0;
        for (std::size_t p = 0; p < parts.size(); ++p) {
            const SparseObject& o = parts[p].object;
            if (cursor[p] >= o.desc.num_tiles) continue;
            const TileCoord* t = o.tile_coords.data() + cursor[p] * rank;
            if (!std::equal(t, t + rank, tile.data())) continue;
            const std::uint64_t r = o.tile_ptr[cursor[p]], end = o.tile_ptr[cursor[p] + 1];
            if (r < end) runs.push_back({static_cast<std::uint32_t>(p), r, end});
            in_tile += end - r;
            ++cursor[p];
        }
        if (runs.size() == 1) {  // one step wrote this tile: its entries as they are
            emit(parts[runs[0].part].object, runs[0].row, runs[0].end - runs[0].row);
            continue;
        }
        // The tile's extent (clipped at the shape's end) and row-major strides within it.
        std::array<std::uint64_t, kMaxRank> origin{}, tstride{};
        std::uint64_t tile_elems = 1;
        for (std::size_t d = rank; d-- > 0;) {
            origin[d] = std::uint64_t(tile[d]) * std::uint64_t(tile_shape[d]);
            const std::uint64_t extent = std::min<std::uint64_t>(
                std::uint64_t(tile_shape[d]), std::uint64_t(d0.global_shape[d]) - origin[d]);
            tstride[d] = tile_elems;
            tile_elems *= extent;
        }
        // Each entry of the tile by its position within it (the in-tile row-major order is the
        // entries' order), numbered in step order.
        const auto in_tile_at = [&](const SparseObject& o, std::uint64_t r) {
            const std::byte* e = o.indices.data() + r * row;
            std::uint64_t at = 0;
            for (std::size_t d = 0; d < rank; ++d) {
                at += (LoadUnsigned(e + d * isz, isz) - origin[d]) * tstride[d];
            }
            return at;
        };
        entries.clear();
        for (const Run& run : runs) {
            const SparseObject& o = parts[run.part].object;
            for (std::uint64_t r = run.row; r < run.end; ++r) {
                entries.push_back({in_tile_at(o, r), run.part, r});
            }
        }
        const auto emit_entry = [&](std::uint64_t i) {
            emit(parts[entries[i].part].object, entries[i].row, 1);
        };
        // Marks cost about a nanosecond per element of the tile, a sort about 25 per entry.
        if (tile_elems <= 24 * in_tile && tile_elems <= (std::uint64_t{1} << 26) &&
            entries.size() < 0xffffffffu) {
            // Dense enough: per element the chain of its entries (`marks`: 1 + the newest,
            // `chain`: 1 + the one before), taken in the tile's order. Overwrite writes the
            // newest; scatter_add every one, oldest first (summed later, in step order).
            marks.assign(tile_elems, 0);
            chain.resize(entries.size());
            for (std::uint64_t i = 0; i < entries.size(); ++i) {
                chain[i] = marks[entries[i].coord];
                marks[entries[i].coord] = static_cast<std::uint32_t>(i + 1);
            }
            for (const std::uint32_t m : marks) {
                if (m == 0) continue;
                if (overwrite) {
                    emit_entry(m - 1);
                    continue;
                }
                stack.clear();
                for (std::uint64_t i = m; i != 0; i = chain[i - 1]) stack.push_back(i - 1);
                for (auto it = stack.rbegin(); it != stack.rend(); ++it) emit_entry(*it);
            }
            continue;
        }
        // Sparse: order by (position, step order), packed in one word when they fit. Each
        // step's run is sorted by position already, so the runs merge pairwise (log2(runs)
        // linear passes), not a sort of all of them.
        if (tile_elems <= 0xffffffffu && entries.size() <= 0xffffffffu) {
            keys.resize(entries.size());
            for (std::uint64_t i = 0; i < entries.size(); ++i) keys[i] = entries[i].coord << 32 | i;
            bounds.assign(1, 0);
            for (const Run& run : runs) bounds.push_back(bounds.back() + (run.end - run.row));
            while (bounds.size() > 2) {
                std::size_t kept = 1;
                for (std::size_t b = 0; b + 2 < bounds.size(); b += 2) {
                    std::inplace_merge(keys.begin() + bounds[b], keys.begin() + bounds[b + 1],
                                       keys.begin() + bounds[b + 2]);
                    bounds[kept++] = bounds[b + 2];
                }
                if (bounds.size() % 2 == 0) bounds[kept++] = bounds.back();  // an odd run out
                bounds.resize(kept);
            }
            for (std::size_t k = 0; k < keys.size(); ++k) {
                if (overwrite && k + 1 < keys.size() && keys[k + 1] >> 32 == keys[k] >> 32) continue;
                emit_entry(keys[k] & 0xffffffffu);
            }
            continue;
        }
        std::stable_sort(entries.begin(), entries.end(),
                         [](const Entry& x, const Entry& y) { return x.coord < y.coord; });
        for (std::size_t i = 0; i < entries.size(); ++i) {
            const Entry& e = entries[i];
            if (overwrite && i + 1 < entries.size() && entries[i + 1].coord == e.coord) continue;
            emit(parts[e.part].object, e.row, 1);
        }
    }
    close_tile();
    indices.resize(out * row);
    values.resize(out * vsz);
    const std::uint64_t nnz = values.size() / vsz;
    SourceDescriptor desc = d0;
    desc.generation = generation;
    if (overwrite) {
        // One entry per coordinate, in (tile, element) order, with its tile index: the object
        // as it is, with only its checksums to compute.
        SparseObject obj;
        desc.nnz = nnz;
        desc.num_tiles = tile_ptr.size() - 1;
        obj.desc = std::move(desc);
        obj.coordinate_space = "local";
        obj.indices = std::move(indices);
        obj.values = std::move(values);
        obj.tile_coords = std::move(tile_coords);
        obj.tile_ptr = std::move(tile_ptr);
        UpdateChecksums(obj);
        return TargetObject{first.target_id, first.node_id, first.target_box, std::move(obj)};
    }
    EncodeOptions enc;
    enc.tile_shape = d0.tile_shape;
    enc.num_threads = 1;  // targets merge in parallel
    // Scatter_add: repeated coordinates, in step order, are summed.
    enc.duplicates = DuplicatePolicy::kSum;
    const HostArray idx{d0.index_dtype, {Index(nnz), Index(rank)}, indices};
    const HostArray val{d0.value_dtype, {Index(nnz)}, values};
    MCS_ASSIGN_OR_RETURN(SparseObject obj, BuildSparseObject(std::move(desc), idx, val, enc));
    obj.coordinate_space = "local";
    return TargetObject{first.target_id, first.node_id, first.target_box, std::move(obj)};
}


}  // namespace

Status ValidateNamespace(std::string_view ns) {
    if (ns.empty()) return Status::Ok();
    if (ns.size() > 64) return InvalidArgument("namespace longer than 64 characters");
    for (char c : ns) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
        if (!ok) {
            return InvalidArgument("namespace '" + std::string(ns) +
                                   "' may hold only letters, digits, '_', '.' and '-'");
        }
    }
    return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Small records.
// ---------------------------------------------------------------------------------------------

Result<std::optional<std::uint64_t>> SparseStore::ReadStepRecord(const std::string& key) {
    auto info = store_->Stat(key);
    if (!info.ok()) {
        if (info.status().code() == StatusCode::kNotFound) return std::optional<std::uint64_t>();
        return info.status();
    }
    Json j = Json::parse(info->metadata, nullptr, false);
    if (j.is_discarded() || !j.contains("value") || !j["value"].is_number_unsigned()) {
        return DataLoss("record " + key + " is corrupt");
    }
    return std::optional<std::uint64_t>(j["value"].get<std::uint64_t>());
}

Status SparseStore::WriteStepRecord(const std::string& key, std::uint64_t value) {
    return store_->Put(key, Json{{"value", value}}.dump(), {}, {PutMode::kUpsert, true});
}

Result<bool> SparseStore::IsSealed(Generation step) {
    auto info = store_->Stat(keys_.Seal() + GenerationTag(step));
    if (info.ok()) return true;
    if (info.status().code() == StatusCode::kNotFound) return false;
    return info.status();
}

Result<bool> SparseStore::PastRetention(Generation step) {
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> floor, ReadStepRecord(keys_.Floor()));
    if (!floor || step.delta >= *floor) return false;
    // Below the floor: freed, unless it is older than the first step sealed (sealed out of
    // order, it lowers the floor) and retention would still keep it.
    MCS_ASSIGN_OR_RETURN(const std::uint64_t keep, Retention());
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> latest, ReadStepRecord(keys_.Latest()));
    return keep > 0 && latest && step.delta + keep <= *latest;
}

Result<std::shared_ptr<const SparseStore::SealRecord>> SparseStore::ReadSeal(Generation step) {
    {
        std::lock_guard lock(seal_cache_mu_);
        if (auto it = seal_cache_.find(step.delta); it != seal_cache_.end()) return it->second;
    }
    const std::string key = keys_.Seal() + GenerationTag(step);
    auto info = store_->Stat(key);
    if (!info.ok()) {
        if (info.status().code() == StatusCode::kNotFound) {
            return NotFound("step " + step.ToString() + " is not sealed");
        }
        return info.status();
    }
    auto record = std::make_shared<SealRecord>();
    MCS_ASSIGN_OR_RETURN(record->tensor_ids, ReadIdList(*store_, key, *info));
    MCS_ASSIGN_OR_RETURN(record->sources, ReadListMember(*store_, key, *info, kSourcesMember));
    std::lock_guard lock(seal_cache_mu_);
    seal_cache_[step.delta] = record;
    if (seal_cache_.size() > 64) seal_cache_.erase(seal_cache_.begin());
    return std::shared_ptr<const SealRecord>(record);
}

namespace {

/// The ids of `tensor_ids` (sorted) that no entry of `sources` is of, sorted.
std::vector<std::string> UnchangedOf(std::span<const std::string> tensor_ids,
                                     std::span<const SourceDescriptor> sources) {
    std::vector<std::string_view> changed;
    changed.reserve(sources.size());
    for (const SourceDescriptor& s : sources) changed.emplace_back(s.tensor_id);
    std::sort(changed.begin(), changed.end());
    std::vector<std::string> out;
    for (const std::string& id : tensor_ids) {
        if (!std::binary_search(changed.begin(), changed.end(), std::string_view(id))) {
            out.push_back(id);
        }
    }
    return out;
}

}  // namespace

void SparseStore::KeepSealedManifestLocked(Generation step,
                                           std::shared_ptr<const SealedStepManifest> m) {
    manifest_cache_[step.delta] = std::move(m);
    if (manifest_cache_.size() > kCachedManifests) manifest_cache_.erase(manifest_cache_.begin());
}

Result<std::shared_ptr<const SparseStore::SealedStepManifest>> SparseStore::SealedManifest(
    Generation step) {
    {
        std::lock_guard lock(seal_cache_mu_);
        if (auto it = manifest_cache_.find(step.delta); it != manifest_cache_.end()) {
            return it->second;
        }
    }
    std::vector<std::shared_ptr<const ObjectInfo>> entries;
    MCS_ASSIGN_OR_RETURN(std::vector<SourceDescriptor> sources,
                         ManifestWithEntries(step, store_->ViewsInPlace() ? &entries : nullptr));
    MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SealRecord> seal, ReadSeal(step));
    const std::size_t prefix = keys_.Source().size();
    std::size_t kept = 0;
    for (std::size_t i = 0; i < sources.size(); ++i) {
        if (!std::binary_search(seal->sources.begin(), seal->sources.end(),
                                std::string_view(sources[i].source_ref).substr(prefix))) {
            continue;
        }
        if (kept != i) {
            sources[kept] = std::move(sources[i]);
            if (!entries.empty()) entries[kept] = std::move(entries[i]);
        }
        ++kept;
    }
    sources.resize(kept);
    if (!entries.empty()) entries.resize(kept);
    if (sources.size() != seal->sources.size()) {
        return DataLoss("step " + step.ToString() + ": its seal holds " +
                        std::to_string(seal->sources.size()) + " source objects, " +
                        std::to_string(sources.size()) + " of them are in its manifest");
    }
    std::vector<std::string> unchanged = UnchangedOf(seal->tensor_ids, sources);
    auto manifest = std::make_shared<const SealedStepManifest>(
        SealedStepManifest{std::move(sources), std::move(unchanged), std::move(entries)});
    std::lock_guard lock(seal_cache_mu_);
    KeepSealedManifestLocked(step, manifest);
    return manifest;
}

Status SparseStore::CheckCommitsNotMissed(Generation step, std::span<const std::string_view> refs,
                                          std::vector<bool>& missed) {
    // A seal creates its pending record before it reads the manifest, and gives up unless it
    // writes the seal before the record expires. So commits that, after listing themselves,
    // find neither the seal nor a live pending record are in the manifest that any later seal
    // reads; commits that find the seal ask it whether it holds them.
    missed.assign(refs.size(), false);
    const std::string tag = GenerationTag(step);
    auto poll = std::chrono::duration<double>(0.001);
    for (;;) {
        auto pending = store_->Stat(keys_.Sealing() + tag);
        if (!pending.ok() && pending.status().code() != StatusCode::kNotFound) {
            return pending.status();
        }
        MCS_ASSIGN_OR_RETURN(const bool sealed, IsSealed(step));
        if (sealed) {
            MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SealRecord> seal, ReadSeal(step));
            const std::size_t prefix = keys_.Source().size();
            for (std::size_t i = 0; i < refs.size(); ++i) {
                missed[i] = !std::binary_search(seal->sources.begin(), seal->sources.end(),
                                                refs[i].substr(prefix));
            }
            return Status::Ok();
        }
        if (!pending.ok() || ExpiryOf(*pending) <= NowMs()) return Status::Ok();
        std::this_thread::sleep_for(poll);
        poll = std::min(poll * 2, std::chrono::duration<double>(options_.wait_poll_max_seconds));
    }
}

// ---------------------------------------------------------------------------------------------
// Seal, wait, latest.
// ---------------------------------------------------------------------------------------------

Result<std::int64_t> SparseStore::BeginSeal(Generation step) {
    const std::string key = keys_.Sealing() + GenerationTag(step);
    const std::int64_t expiry = NowMs() + static_cast<std::int64_t>(options_.seal_seconds * 1000);
    const std::string meta = Json{{"expires_ms", expiry}}.dump();
    for (int attempt = 0;; ++attempt) {
        Status s = store_->Put(key, meta, {}, {PutMode::kCreate, true, false});
        if (s.ok()) return expiry;
        if (s.code() != StatusCode::kConflict) return s;
        auto other = store_->Stat(key);
        if (attempt == 0 && other.ok() && ExpiryOf(*other) <= NowMs()) {
            (void)store_->Remove(key);  // a crashed sealer's
            continue;
        }
        if (attempt == 0 && !other.ok() && other.status().code() == StatusCode::kNotFound) {
            continue;  // it ended meanwhile
        }
        return FailedPrecondition("seal_generation " + step.ToString() +
                                  ": another seal of the step is in progress");
    }
}

Status SparseStore::SealGeneration(Generation step, std::span<const std::string> tensor_ids) {
    MCS_RETURN_IF_ERROR(RequireStep(step, "seal_generation: generation"));
    MCS_ASSIGN_OR_RETURN(std::vector<std::string> ids,
                         SortedUniqueIds(tensor_ids, "seal_generation"));
    const std::string tag = GenerationTag(step);
    std::lock_guard lock(seal_mu_);
    // No commit through this store lands between the checks below and the seal: it is in the
    // step's manifest before them, or it finds the step sealed (Conflict).
    std::unique_lock commits(commit_mu_);
    MCS_ASSIGN_OR_RETURN(const bool sealed, IsSealed(step));
    if (sealed) return FailedPrecondition("step " + step.ToString() + " is sealed already");
    MCS_ASSIGN_OR_RETURN(const bool freed, PastRetention(step));
    if (freed) {
        return FailedPrecondition("step " + step.ToString() + " is past retention (freed)");
    }
    // Commits by other processes (a shared store) see the pending record from here on and
    // wait for the seal, so none joins the manifest unseen after it is read below.
    MCS_ASSIGN_OR_RETURN(const std::int64_t pending_expiry, BeginSeal(step));
    struct EndSeal {
        SparseStore* self;
        std::string key;
        ~EndSeal() { (void)self->store_->Remove(key); }
    } end_seal{this, keys_.Sealing() + tag};

    // Every committed tensor is listed, and every admitted writer has committed.
    std::vector<std::shared_ptr<const ObjectInfo>> entries;
    MCS_ASSIGN_OR_RETURN(std::vector<SourceDescriptor> sources,
                         ManifestWithEntries(step, store_->ViewsInPlace() ? &entries : nullptr));
    for (const SourceDescriptor& s : sources) {
        if (!std::binary_search(ids.begin(), ids.end(), s.tensor_id)) {
            return InvalidArgument("seal_generation " + step.ToString() + ": tensor '" +
                                   s.tensor_id + "' was committed but is not in the list");
        }
    }
    const std::string admit_prefix = keys_.Admit() + tag + "/";
    MCS_ASSIGN_OR_RETURN(std::vector<std::string> admits, store_->List(admit_prefix));
    std::vector<std::string> committed;  // logical keys + "/at..." of the step's sources
    committed.reserve(sources.size());
    for (const SourceDescriptor& d : sources) {
        committed.push_back(d.source_ref.substr(keys_.Source().size()));
    }
    std::sort(committed.begin(), committed.end());
    for (const std::string& a : admits) {
        const std::string logical = a.substr(admit_prefix.size()) + "/at";
        auto it = std::lower_bound(committed.begin(), committed.end(), logical);
        if (it == committed.end() || !it->starts_with(logical)) {
            return FailedPrecondition("seal_generation " + step.ToString() + ": the writer " +
                                      "admitted for " + a.substr(admit_prefix.size()) +
                                      " has not committed");
        }
    }

    if (NowMs() >= pending_expiry) {
        return Unavailable("seal_generation " + step.ToString() + " took longer than " +
                           std::to_string(options_.seal_seconds) + " s; nothing was sealed");
    }
    const std::array<ListMember, 2> lists = {ListMember{kTensorIdsMember, ids},
                                             ListMember{kSourcesMember, committed}};
    Status put = PutListRecord(*store_, keys_.Seal() + tag, step, lists, ids.size(),
                               /*listed=*/false);
    commits.unlock();
    if (put.code() == StatusCode::kConflict) {
        return FailedPrecondition("step " + step.ToString() + " is sealed already");
    }
    MCS_RETURN_IF_ERROR(put);
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> latest, ReadStepRecord(keys_.Latest()));
    if (!latest || *latest < step.delta) {
        MCS_RETURN_IF_ERROR(WriteStepRecord(keys_.Latest(), step.delta));
    }
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> floor, ReadStepRecord(keys_.Floor()));
    if (!floor || step.delta < *floor) {
        MCS_RETURN_IF_ERROR(WriteStepRecord(keys_.Floor(), step.delta));
    }
    {
        // The manifest just checked is the sealed step's (every source it lists is in the
        // seal): its readers through this store (a node daemon's ranks) need not decode it.
        std::vector<std::string> unchanged = UnchangedOf(ids, sources);
        auto manifest = std::make_shared<const SealedStepManifest>(
            SealedStepManifest{std::move(sources), std::move(unchanged), std::move(entries)});
        std::lock_guard cache(seal_cache_mu_);
        seal_cache_[step.delta] =
            std::make_shared<SealRecord>(SealRecord{std::move(ids), std::move(committed)});
        if (seal_cache_.size() > 64) seal_cache_.erase(seal_cache_.begin());
        KeepSealedManifestLocked(step, std::move(manifest));
    }
    ++seals_;
    sealed_cv_.notify_all();
    MCS_ASSIGN_OR_RETURN(const std::uint64_t keep, Retention());
    return CollectSteps(keep, /*strict=*/false);
}

Result<std::optional<Generation>> SparseStore::LatestGeneration() {
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> latest, ReadStepRecord(keys_.Latest()));
    if (!latest) return std::optional<Generation>();
    return std::optional<Generation>(Generation{*latest - 1, *latest});
}

Result<StepManifest> SparseStore::WaitGeneration(Generation generation, double timeout_seconds) {
    MCS_ASSIGN_OR_RETURN(SharedStepManifest m, WaitGenerationShared(generation, timeout_seconds));
    return StepManifest{m.generation, *m.sources, *m.unchanged, m.sealed};
}

Result<SparseStore::SharedStepManifest> SparseStore::WaitGenerationShared(
    Generation generation, double timeout_seconds) {
    MCS_RETURN_IF_ERROR(Generation::Make(generation.base, generation.delta));
    const Generation last{generation.delta - 1, generation.delta};
    using Clock = std::chrono::steady_clock;
    if (std::isnan(timeout_seconds)) return InvalidArgument("wait_generation: timeout is NaN");
    // Past about 30 years (and infinity) is for ever: a steady_clock time point cannot hold
    // much more.
    const bool forever = timeout_seconds < 0 || timeout_seconds > 1e9;
    const auto deadline =
        forever ? Clock::time_point::max()
                : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_seconds));
    auto poll = std::chrono::duration<double>(0.001);
    const auto poll_max = std::chrono::duration<double>(options_.wait_poll_max_seconds);
    for (;;) {
        std::uint64_t seen;
        {
            std::lock_guard lock(seal_mu_);
            seen = seals_;
        }
        MCS_ASSIGN_OR_RETURN(const bool sealed, IsSealed(last));
        if (sealed) return GetManifestShared(generation);
        MCS_ASSIGN_OR_RETURN(const bool freed, PastRetention(last));
        if (freed) {
            return NotFound("wait_generation: step " + last.ToString() +
                            " was freed by retention");
        }
        const auto now = Clock::now();
        if (now >= deadline) {
            return DeadlineExceeded("wait_generation: step " + last.ToString() +
                                    " is not sealed after " + std::to_string(timeout_seconds) +
                                    " s");
        }
        // Woken at once by a seal through this store; a seal by another process is seen at
        // the next check.
        std::unique_lock lock(seal_mu_);
        const auto until = std::min(deadline, now + std::chrono::duration_cast<Clock::duration>(poll));
        sealed_cv_.wait_until(lock, until, [&] { return seals_ != seen; });
        poll = std::min(poll * 2, poll_max);
    }
}

// ---------------------------------------------------------------------------------------------
// Manifests of steps and folds.
// ---------------------------------------------------------------------------------------------

Result<StepManifest> SparseStore::GetManifest(Generation generation) {
    MCS_RETURN_IF_ERROR(Generation::Make(generation.base, generation.delta));
    StepManifest out;
    out.generation = generation;
    if (generation.delta == generation.base + 1) {
        MCS_ASSIGN_OR_RETURN(out.sealed, IsSealed(generation));
        if (out.sealed) {
            MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SealedStepManifest> kept,
                                 SealedManifest(generation));
            out.sources = kept->sources;
            out.unchanged = kept->unchanged;
            return out;
        } else {
            MCS_ASSIGN_OR_RETURN(out.sources, Manifest(generation));
        }
        if (!out.sealed) {
            MCS_ASSIGN_OR_RETURN(const bool freed, PastRetention(generation));
            if (freed) {
                return NotFound("step " + generation.ToString() + " was freed by retention");
            }
        }
    } else {
        // A fold: a single commit of (j, k) itself, or the sealed steps j+1..k.
        MCS_ASSIGN_OR_RETURN(out.sources, Manifest(generation));
        if (!out.sources.empty()) return out;
        MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> floor, ReadStepRecord(keys_.Floor()));
        if (floor && generation.base + 1 < *floor) {
            MCS_ASSIGN_OR_RETURN(std::optional<Generation> anchor, LatestAnchor());
            const bool usable = anchor && anchor->delta + 1 >= *floor &&
                                anchor->delta <= generation.delta;
            return NotFound("fold " + generation.ToString() + " reaches past retention: step " +
                            std::to_string(generation.base + 1) + " is freed (the oldest " +
                            "step kept is " + std::to_string(*floor) + ")" +
                            (usable ? "; read the anchor of step " + anchor->ToString() +
                                          " (read_anchor), then the fold (" +
                                          std::to_string(anchor->delta) + ", " +
                                          std::to_string(generation.delta) + ")"
                                    : ""));
        }
        for (std::uint64_t k = generation.base + 1; k <= generation.delta; ++k) {
            const Generation step{k - 1, k};
            MCS_ASSIGN_OR_RETURN(const bool sealed, IsSealed(step));
            if (!sealed) {
                return NotFound("fold " + generation.ToString() + ": step " + step.ToString() +
                                " is not sealed (or was freed by retention)");
            }
            MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SealedStepManifest> kept,
                                 SealedManifest(step));
            out.sources.insert(out.sources.end(), kept->sources.begin(), kept->sources.end());
        }
        out.sealed = true;
    }
    if (out.sealed) {
        const Generation last{generation.delta - 1, generation.delta};
        MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SealRecord> seal, ReadSeal(last));
        out.unchanged = UnchangedOf(seal->tensor_ids, out.sources);
    }
    return out;
}

Result<SparseStore::SharedStepManifest> SparseStore::GetManifestShared(Generation generation) {
    MCS_RETURN_IF_ERROR(Generation::Make(generation.base, generation.delta));
    if (generation.delta == generation.base + 1) {
        MCS_ASSIGN_OR_RETURN(const bool sealed, IsSealed(generation));
        if (sealed) {
            MCS_ASSIGN_OR_RETURN(std::shared_ptr<const SealedStepManifest> kept,
                                 SealedManifest(generation));
            return SharedStepManifest{
                generation, std::shared_ptr<const std::vector<SourceDescriptor>>(kept, &kept->sources),
                std::shared_ptr<const std::vector<std::string>>(kept, &kept->unchanged), true};
        }
    }
    MCS_ASSIGN_OR_RETURN(StepManifest m, GetManifest(generation));
    return SharedStepManifest{
        m.generation, std::make_shared<const std::vector<SourceDescriptor>>(std::move(m.sources)),
        std::make_shared<const std::vector<std::string>>(std::move(m.unchanged)), m.sealed};
}

// A reader's lease on the steps it reads: its keys go when the read ends (retention checks
// them, sparse_retention.cc).
class SparseStore::StepLease {
public:
    StepLease(ObjectStore& store, std::vector<std::string> keys)
        : store_(store), keys_(std::move(keys)) {}
    ~StepLease() {
        for (const std::string& k : keys_) (void)store_.Remove(k);
    }

private:
    ObjectStore& store_;
    std::vector<std::string> keys_;
};

Result<std::unique_ptr<SparseStore::StepLease>> SparseStore::LeaseSteps(
    std::span<const Generation> steps) {
    const std::string holder = options_.node_id + "-" + std::to_string(::getpid()) + "-" +
                               std::to_string(lease_holder_) + "-" +
                               std::to_string(lease_ids_.fetch_add(1));
    const auto expires = NowMs() + static_cast<std::int64_t>(options_.lease_seconds * 1000);
    const std::string meta = Json{{"expires_ms", expires}}.dump();
    std::vector<std::string> keys;
    for (const Generation& g : steps) {
        std::string key = keys_.Lease() + GenerationTag(g) + "/" + holder;
        Status s = store_->Put(key, meta, {}, {PutMode::kUpsert, true});
        if (!s.ok()) {
            for (const std::string& k : keys) (void)store_->Remove(k);
            return s.WithContext("leasing step " + g.ToString());
        }
        keys.push_back(std::move(key));
    }
    return std::make_unique<StepLease>(*store_, std::move(keys));
}

// ---------------------------------------------------------------------------------------------
// Reads of a step manifest.
// ---------------------------------------------------------------------------------------------

Result<std::vector<TargetObject>> SparseStore::ReadSparseObjects(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options) {
    // The steps the manifest's sources belong to, oldest first (a step's manifest has one: its
    // sources are read where they lie, a fold's are grouped per step).
    std::vector<Generation> steps;  // the first source's generation of each step (delta)
    for (const SourceDescriptor& s : manifest.sources) {
        if (!steps.empty() && steps.back().delta == s.generation.delta) continue;
        if (std::none_of(steps.begin(), steps.end(), [&](const Generation& g) {
                return g.delta == s.generation.delta;
            })) {
            steps.push_back(s.generation);
        }
    }
    std::sort(steps.begin(), steps.end(),
              [](const Generation& a, const Generation& b) { return a.delta < b.delta; });
    MCS_ASSIGN_OR_RETURN(std::unique_ptr<StepLease> lease, LeaseSteps(steps));

    const auto unchanged = [&](const std::string& id) {
        return std::binary_search(manifest.unchanged.begin(), manifest.unchanged.end(), id);
    };
    const bool any_unchanged =
        std::any_of(targets.begin(), targets.end(),
                    [&](const TargetDescriptor& t) { return unchanged(t.tensor_id); });
    if (steps.size() <= 1 && !any_unchanged) {
        return ReadSparseObjects(std::span<const SourceDescriptor>(manifest.sources), targets,
                                 options);
    }
    std::map<std::uint64_t, std::vector<SourceDescriptor>> by_step;
    for (const SourceDescriptor& s : manifest.sources) by_step[s.generation.delta].push_back(s);
    ReadOptions step_options = options;
    step_options.manifest_index = nullptr;  // built for the whole manifest, not for one step
    step_options.manifest_owner = nullptr;  // owns the caller's entries, not these copies
    std::vector<std::vector<TargetObject>> parts(targets.size());
    for (auto& [delta, sources] : by_step) {
        std::vector<std::string> ids;
        for (const SourceDescriptor& s : sources) ids.push_back(s.tensor_id);
        std::sort(ids.begin(), ids.end());
        std::vector<TargetDescriptor> step_targets;
        std::vector<std::size_t> which;
        for (std::size_t t = 0; t < targets.size(); ++t) {
            if (std::binary_search(ids.begin(), ids.end(), targets[t].tensor_id)) {
                step_targets.push_back(targets[t]);
                which.push_back(t);
            }
        }
        if (step_targets.empty()) continue;
        MCS_ASSIGN_OR_RETURN(std::vector<TargetObject> objs,
                             ReadSparseObjects(std::span<const SourceDescriptor>(sources),
                                               step_targets, step_options));
        for (std::size_t i = 0; i < objs.size(); ++i) parts[which[i]].push_back(std::move(objs[i]));
    }
    for (std::size_t t = 0; t < targets.size(); ++t) {
        if (parts[t].empty() && !unchanged(targets[t].tensor_id)) {
            return NotFound("target " + targets[t].target_id + ": tensor '" +
                            targets[t].tensor_id + "' has no source object in the manifest");
        }
    }
    std::vector<Result<TargetObject>> results(targets.size(), Internal("unset"));
    internal::ParallelFor(options.num_threads, targets.size(), [&](std::size_t t) {
        if (parts[t].empty()) {
            results[t] = EmptyTarget(targets[t], manifest.generation);
        } else if (parts[t].size() == 1) {
            results[t] = std::move(parts[t].front());
        } else {
            results[t] = MergeSteps(parts[t], manifest.generation);
        }
    });
    std::vector<TargetObject> out;
    out.reserve(targets.size());
    for (Result<TargetObject>& r : results) {
        if (!r.ok()) return r.status();
        out.push_back(std::move(r).value());
    }
    return out;
}

Result<std::vector<TargetObjectView>> SparseStore::ReadPlanned(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options, const PlannedReadFn& build) {
    if (!store_->ViewsInPlace()) {
        return Unimplemented("this store does not view its objects in place");
    }
    if (options.strategy != ReadStrategy::kSparseRanges) {
        return Unimplemented("only the sparse strategy is planned for a caller");
    }
    // One step: a fold's targets merge their steps' objects, which ReadViews does.
    for (const SourceDescriptor& s : manifest.sources) {
        if (s.generation.delta != manifest.sources.front().generation.delta) {
            return Unimplemented("a fold of several steps is read with ReadViews");
        }
    }
    std::vector<Generation> steps;
    if (!manifest.sources.empty()) steps.push_back(manifest.sources.front().generation);
    MCS_ASSIGN_OR_RETURN(std::unique_ptr<StepLease> lease, LeaseSteps(steps));
    return ReadPlannedStep(manifest, targets, options, build);
}

}  // namespace mooncake::sparse
