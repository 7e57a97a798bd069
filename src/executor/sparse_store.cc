// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// SparseStore's construction, metrics and node caches. The commit side is in sparse_commit.cc,
// the read path in sparse_read.cc, the caches in node_cache.cc, the rest of its SparseService
// side in sparse_service.cc.
#include "executor/sparse_store.h"

#include "executor/node_cache.h"

#include <random>

namespace mooncake::sparse {

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
        {"commit_index_seconds", commit_index_seconds},
        {"commit_write_seconds", commit_write_seconds},
        {"commit_put_seconds", commit_put_seconds},
        {"commit_publish_seconds", commit_publish_seconds},
    };
}

SparseStore::SparseStore(std::shared_ptr<ObjectStore> store, SparseStoreOptions options)
    : store_(std::move(store)),
      options_(std::move(options)),
      cache_(std::make_unique<NodeCache>(options_.index_cache_capacity_bytes,
                                         options_.range_cache_capacity_bytes)) {
    keys_.tag = options_.name_space.empty() ? "" : "@" + options_.name_space;
    source_prefix_ = keys_.Source();
    manifest_prefix_ = keys_.Manifest();
    head_prefix_ = keys_.Head();
    if (options_.pinned_quota_bytes > 0 && store_->FillsInPlace()) {
        host_pool_ = PinnedHostPool::Make(options_.pinned_quota_bytes);
    }
    std::random_device rd;
    lease_holder_ = (std::uint64_t{rd()} << 32) ^ rd();
}

SparseStore::~SparseStore() = default;

SparseMetrics SparseStore::Metrics() const {
    std::lock_guard lock(metrics_mu_);
    return metrics_;
}

void SparseStore::ResetMetrics() {
    std::lock_guard lock(metrics_mu_);
    metrics_ = {};
}

Result<MetricItems> SparseStore::Metrics(bool reset) {
    std::lock_guard lock(metrics_mu_);
    MetricItems items = metrics_.Items();
    if (reset) metrics_ = {};
    return items;
}

Status SparseStore::ClearCaches() {
    cache_->Clear();
    std::lock_guard lock(seal_cache_mu_);
    manifest_cache_.clear();
    return Status::Ok();
}

}  // namespace mooncake::sparse
