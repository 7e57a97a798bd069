// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// `_Store`: the one core store class of every backend (bind_store.cc). It holds the backend's
// SparseService (executor/sparse_service.h) — a SparseStore in this process (the embedded store,
// or a Python ObjectStore such as the upstream Mooncake adapter), or the node daemon's client —
// and answers alike whichever it is: the methods, their arguments and their results are written
// once, against the interface. The tensor binding (bind_tensor.cc) makes its TensorStore from
// the same service.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "executor/sparse_service.h"

namespace mooncake::sparse {
class NodeClient;
}

namespace mooncake::sparse::py {

class PyStore {
public:
    /// A SparseStore over the embedded store (of `capacity_bytes`, 0: unlimited), or over
    /// `object_store` (a Python implementation of the ObjectStore contract) when it is not None.
    /// `pinned_quota_bytes`: host bytes of its source objects that may be page-locked
    /// (SparseStoreOptions::pinned_quota_bytes).
    static std::unique_ptr<PyStore> Embedded(std::string node_id, std::uint64_t capacity_bytes,
                                             const pybind11::object& object_store,
                                             const std::string& name_space,
                                             std::uint64_t pinned_quota_bytes);
    /// A client of the node daemon at `socket_path` (dials once; later calls redial as needed).
    static std::unique_ptr<PyStore> Connect(const std::string& socket_path,
                                            double connect_timeout_s, double call_timeout_s,
                                            const std::string& client_name,
                                            std::uint64_t initial_buffer_bytes,
                                            std::optional<double> reply_spin_max_s,
                                            std::optional<double> reply_spin_s,
                                            const std::string& name_space,
                                            std::uint64_t planned_read_targets);

    SparseService& service() { return *service_; }
    /// The daemon's client when the work runs in a node daemon, else null: what only a
    /// connection has (its Hello, its counters, leases of raw objects, disconnecting).
    NodeClient* node() { return node_.get(); }

    /// Notes a sealed step's manifest this store got from its node daemon (`array`: what its
    /// SourceInfo view). The last few are kept, weakly.
    void RememberSealedManifest(Generation step,
                                const std::shared_ptr<const std::vector<SourceDescriptor>>& array);
    /// Whether `sources` is exactly the manifest of the sealed step `step` that this store
    /// got from its daemon: the same array, whole (the daemon holds the same manifest, which
    /// never changes, so a read may name the step instead of sending the sources).
    bool IsSealedManifest(Generation step, std::span<const SourceDescriptor> sources);

private:
    PyStore(std::shared_ptr<SparseService> service, std::shared_ptr<NodeClient> node)
        : service_(std::move(service)), node_(std::move(node)) {}

    std::shared_ptr<SparseService> service_;
    std::shared_ptr<NodeClient> node_;  ///< service_'s object, as a connection; null embedded.
    struct SealedManifest {
        Generation step;
        std::weak_ptr<const std::vector<SourceDescriptor>> array;
    };
    std::mutex sealed_mu_;
    std::deque<SealedManifest> sealed_;  ///< The last kSealedManifests remembered.
    static constexpr std::size_t kSealedManifests = 8;
};

}  // namespace mooncake::sparse::py
