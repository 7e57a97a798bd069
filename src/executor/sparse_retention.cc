// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The life of a run's steps in SparseStore (docs/design.md §9): readers' leases on steps,
// retention (keep_last) freeing what it no longer keeps, and anchors (full weights of a step as
// tensor objects) with their own retention (keep_anchors).
//
//   mcs/lease/<b-d>/<holder>    a reader's lease on a step, with its expiry
//   mcs/anchor/steps/<b-d>      one per anchor; member "tensor_ids"
//   mcs-anchor/<b-d>/<id>       the anchor's tensor objects
// (with a namespace, "mcs/lease@NAME/...", "mcs-anchor@NAME/...", and so on).
#include <algorithm>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/node_cache.h"
#include "executor/sparse_store.h"
#include "executor/step_records.h"

namespace mooncake::sparse {

using Json = nlohmann::json;
using namespace internal;  // step_records.h

std::string AnchorTensorKey(std::string_view ns, Generation step, std::string_view tensor_id) {
    std::string key = "mcs-anchor";
    if (!ns.empty()) key += "@" + std::string(ns);
    return key + "/" + GenerationTag(step) + "/" + std::string(tensor_id);
}

// ---------------------------------------------------------------------------------------------
// Leases and retention.
// ---------------------------------------------------------------------------------------------

Result<bool> SparseStore::IsLeased(Generation step) {
    const std::string prefix = keys_.Lease() + GenerationTag(step) + "/";
    MCS_ASSIGN_OR_RETURN(std::vector<std::string> leases, store_->List(prefix));
    const std::int64_t now = NowMs();
    bool leased = false;
    for (const std::string& key : leases) {
        auto info = store_->Stat(key);
        if (!info.ok()) continue;  // ended meanwhile
        if (ExpiryOf(*info) > now) {
            leased = true;
        } else {
            (void)store_->Remove(key);  // a crashed reader's expired lease
        }
    }
    return leased;
}

Status SparseStore::FreeStep(Generation step) {
    const std::string tag = GenerationTag(step);
    const std::string manifest_prefix = keys_.Manifest() + tag + "/";
    MCS_ASSIGN_OR_RETURN(std::vector<std::string> entries, store_->List(manifest_prefix));
    std::vector<std::string> refs;
    refs.reserve(entries.size());
    for (const std::string& e : entries) {
        refs.push_back(keys_.Source() + e.substr(manifest_prefix.size()));
        MCS_RETURN_IF_ERROR(IgnoreNotFound(store_->Remove(refs.back())));
        MCS_RETURN_IF_ERROR(IgnoreNotFound(store_->Remove(e)));
    }
    cache_->Forget(refs);
    MCS_ASSIGN_OR_RETURN(std::vector<std::string> admits,
                         store_->List(keys_.Admit() + tag + "/"));
    for (const std::string& a : admits) MCS_RETURN_IF_ERROR(IgnoreNotFound(store_->Remove(a)));
    MCS_ASSIGN_OR_RETURN(std::vector<std::string> leases,
                         store_->List(keys_.Lease() + tag + "/"));
    for (const std::string& l : leases) MCS_RETURN_IF_ERROR(IgnoreNotFound(store_->Remove(l)));
    MCS_RETURN_IF_ERROR(IgnoreNotFound(store_->Remove(keys_.Seal() + tag)));
    MCS_RETURN_IF_ERROR(IgnoreNotFound(store_->Remove(keys_.Sealing() + tag)));
    // The step's directories are empty for good: a store's listing state of them can go.
    for (const std::string& dir : {manifest_prefix, keys_.Admit() + tag + "/",
                                   keys_.Lease() + tag + "/"}) {
        MCS_RETURN_IF_ERROR(store_->ForgetDirectory(dir));
    }
    std::lock_guard lock(seal_cache_mu_);
    seal_cache_.erase(step.delta);
    manifest_cache_.erase(step.delta);
    return Status::Ok();
}

namespace {

/// A retention pass tries every step number from the floor up to this many; past it (a step
/// sealed far ahead of the steps before it, say by a client that skipped numbers), it frees
/// the steps that left records, found by listing, and not 2^64 numbers one by one.
constexpr std::uint64_t kMaxStepWalk = 4096;

}  // namespace

Result<std::vector<std::uint64_t>> SparseStore::StepsWithRecords(std::uint64_t first,
                                                                 std::uint64_t last) {
    std::set<std::uint64_t> steps;
    for (const std::string& prefix : {keys_.Seal(), keys_.Sealing(), keys_.Manifest(),
                                      keys_.Admit(), keys_.Lease()}) {
        MCS_ASSIGN_OR_RETURN(std::vector<std::string> keys, store_->List(prefix));
        for (const std::string& key : keys) {
            const std::string_view rest = std::string_view(key).substr(prefix.size());
            const std::optional<Generation> g = ParseGenerationTag(rest.substr(0, rest.find('/')));
            if (g && g->delta == g->base + 1 && g->delta >= first && g->delta <= last) {
                steps.insert(g->delta);
            }
        }
    }
    return std::vector<std::uint64_t>(steps.begin(), steps.end());
}

Status SparseStore::CollectSteps(std::uint64_t keep_last, bool strict) {
    if (keep_last == 0) return Status::Ok();
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> latest, ReadStepRecord(keys_.Latest()));
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> floor, ReadStepRecord(keys_.Floor()));
    // Nothing to free unless latest >= floor + keep_last (no sum: keep_last may be near 2^64).
    if (!latest || !floor || *latest < *floor || *latest - *floor < keep_last) {
        return Status::Ok();
    }
    const std::uint64_t last_freed = *latest - keep_last;  // steps floor..last_freed go
    // The step numbers to free: every one of a short span, else those that left records.
    std::vector<std::uint64_t> span;
    if (last_freed - *floor < kMaxStepWalk) {
        for (std::uint64_t k = *floor; k <= last_freed; ++k) span.push_back(k);
    } else {
        MCS_ASSIGN_OR_RETURN(span, StepsWithRecords(*floor, last_freed));
    }
    if (strict) {
        for (const std::uint64_t k : span) {
            MCS_ASSIGN_OR_RETURN(const bool leased, IsLeased({k - 1, k}));
            if (leased) {
                return FailedPrecondition("retention keep_last=" + std::to_string(keep_last) +
                                          " would free step " + std::to_string(k) +
                                          ", which a reader holds a lease on");
            }
        }
    }
    // The new floor: the first step not freed (leased, or failed), else past last_freed.
    std::uint64_t next = last_freed + 1;
    Status status;
    for (const std::uint64_t k : span) {
        const Generation step{k - 1, k};
        auto leased = IsLeased(step);
        if (!leased.ok()) {
            status = leased.status();
            next = k;
            break;
        }
        if (*leased) {  // kept until its reader is done; a later pass frees it
            next = k;
            break;
        }
        status = FreeStep(step);
        if (!status.ok()) {
            next = k;
            break;
        }
    }
    if (next != *floor) MCS_RETURN_IF_ERROR(WriteStepRecord(keys_.Floor(), next));
    return status;
}

Status SparseStore::SetRetention(std::uint64_t keep_last) {
    std::lock_guard lock(seal_mu_);
    MCS_RETURN_IF_ERROR(CollectSteps(keep_last, /*strict=*/true));
    return WriteStepRecord(keys_.RetentionKey(), keep_last);
}

Result<std::uint64_t> SparseStore::Retention() {
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> keep, ReadStepRecord(keys_.RetentionKey()));
    return keep.value_or(0);
}

// ---------------------------------------------------------------------------------------------
// Anchors.
// ---------------------------------------------------------------------------------------------

Status SparseStore::RecordAnchor(Generation step, std::span<const std::string> tensor_ids) {
    MCS_RETURN_IF_ERROR(RequireStep(step, "anchor: generation"));
    if (tensor_ids.empty()) return InvalidArgument("an anchor holds at least one tensor");
    MCS_ASSIGN_OR_RETURN(std::vector<std::string> ids, SortedUniqueIds(tensor_ids, "anchor"));
    std::lock_guard lock(seal_mu_);
    MCS_ASSIGN_OR_RETURN(const bool sealed, IsSealed(step));
    if (!sealed) {
        return NotFound("anchor: step " + step.ToString() + " is not sealed (anchor a sealed "
                        "step: its weights are the trainer's after that step)");
    }
    const std::string ns = options_.name_space;
    for (const std::string& id : ids) {
        auto info = store_->Stat(AnchorTensorKey(ns, step, id));
        if (!info.ok()) {
            return info.status().WithContext("anchor of step " + step.ToString() + ": tensor '" +
                                             id + "'");
        }
    }
    Status put = PutIdList(*store_, keys_.Anchor() + GenerationTag(step), step, ids,
                           /*listed=*/true);
    if (put.code() == StatusCode::kConflict) {
        return FailedPrecondition("step " + step.ToString() + " has an anchor already");
    }
    MCS_RETURN_IF_ERROR(put);
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> latest,
                         ReadStepRecord(keys_.LatestAnchorKey()));
    if (!latest || *latest < step.delta) {
        MCS_RETURN_IF_ERROR(WriteStepRecord(keys_.LatestAnchorKey(), step.delta));
    }
    return CollectAnchors();
}

Result<std::optional<Generation>> SparseStore::LatestAnchor() {
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> latest,
                         ReadStepRecord(keys_.LatestAnchorKey()));
    if (!latest) return std::optional<Generation>();
    return std::optional<Generation>(Generation{*latest - 1, *latest});
}

Status SparseStore::SetKeepAnchors(std::uint64_t keep_anchors) {
    if (keep_anchors == 0) return InvalidArgument("keep_anchors must be at least 1");
    std::lock_guard lock(seal_mu_);
    MCS_RETURN_IF_ERROR(WriteStepRecord(keys_.KeepAnchorsKey(), keep_anchors));
    return CollectAnchors();
}

Status SparseStore::CollectAnchors() {
    MCS_ASSIGN_OR_RETURN(std::optional<std::uint64_t> keep, ReadStepRecord(keys_.KeepAnchorsKey()));
    MCS_ASSIGN_OR_RETURN(std::vector<std::string> records, store_->List(keys_.Anchor()));
    std::vector<Generation> anchored;
    for (const std::string& key : records) {
        auto info = store_->Stat(key);
        if (!info.ok()) continue;
        Json j = Json::parse(info->metadata, nullptr, false);
        if (j.is_discarded() || !j.contains("base") || !j.contains("delta")) continue;
        anchored.push_back({j["base"].get<std::uint64_t>(), j["delta"].get<std::uint64_t>()});
    }
    std::sort(anchored.begin(), anchored.end(),
              [](const Generation& a, const Generation& b) { return a.delta < b.delta; });
    const std::uint64_t kept = std::max<std::uint64_t>(1, keep.value_or(1));
    if (anchored.size() <= kept) return Status::Ok();
    const std::string ns = options_.name_space;
    for (std::size_t i = 0; i + kept < anchored.size(); ++i) {
        const Generation& step = anchored[i];
        const std::string record = keys_.Anchor() + GenerationTag(step);
        auto info = store_->Stat(record);
        if (!info.ok()) continue;
        MCS_ASSIGN_OR_RETURN(std::vector<std::string> ids, ReadIdList(*store_, record, *info));
        for (const std::string& id : ids) {
            MCS_RETURN_IF_ERROR(IgnoreNotFound(store_->Remove(AnchorTensorKey(ns, step, id))));
        }
        MCS_RETURN_IF_ERROR(IgnoreNotFound(store_->Remove(record)));
    }
    return Status::Ok();
}

}  // namespace mooncake::sparse
