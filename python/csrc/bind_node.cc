// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Binding of the node daemon's client (store/node_client.h): `_NodeStore`, the backend of
// mcs.connect("unix:///PATH"). Same methods and answers as the embedded `_Store`; the work runs
// in the daemon, whose caches serve every process of the node. The trainer encodes once: a
// put_sparse_object builds the object here (BuildSparseObject) and the daemon validates it again
// before committing. read_sparse_objects returns SparseObjects that view the daemon's read-only
// segment memory in place and hold its lease until they are collected.
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <optional>

#include "arrays.h"
#include "bind_common.h"
#include "codec/codec.h"
#include "object_store_handle.h"
#include "executor/sparse_store.h"
#include "sparse_object.h"
#include "node/node_client.h"

namespace mooncake::sparse::py {
namespace {

template <typename T>
std::span<const std::byte> AsBytes(const std::vector<T>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

/// Runs `fn` without the GIL and returns its value or throws its error.
template <typename Fn>
auto NoGil(Fn&& fn) {
    using R = decltype(fn());
    std::optional<R> r;
    {
        pyb::gil_scoped_release nogil;
        r.emplace(fn());
    }
    if constexpr (std::is_same_v<R, Status>) {
        ThrowIfError(*r);
    } else {
        return ValueOrThrow(std::move(*r));
    }
}

/// Longest duration taken (about 31 years): its microseconds still fit int64.
constexpr double kMaxSeconds = 1e9;

void CheckSeconds(double seconds, const char* what, bool allow_zero) {
    const bool ok = std::isfinite(seconds) && (allow_zero ? seconds >= 0 : seconds > 0) &&
                    seconds <= kMaxSeconds;
    if (!ok) {
        throw StatusError(InvalidArgument(std::string(what) +
                                          " must be a finite number of seconds " +
                                          (allow_zero ? ">= 0" : "> 0") + " (at most 1e9), got " +
                                          std::to_string(seconds)));
    }
}

class PyNodeStore {
public:
    PyNodeStore(const std::string& socket_path, double connect_timeout_s, double call_timeout_s,
                const std::string& client_name, std::uint64_t initial_buffer_bytes,
                std::optional<double> reply_spin_max_s, const std::string& name_space) {
        ThrowIfError(ValidateNamespace(name_space));
        NodeClientOptions options;
        options.socket_path = socket_path;
        options.client_name = client_name;
        options.name_space = name_space;
        // A float -> int cast of inf, NaN or a value past int64 is undefined: check first.
        CheckSeconds(connect_timeout_s, "connect_timeout", /*allow_zero=*/false);
        CheckSeconds(call_timeout_s, "call_timeout", /*allow_zero=*/false);
        options.connect_timeout = std::chrono::milliseconds(
            static_cast<std::int64_t>(connect_timeout_s * 1000));
        options.call_timeout =
            std::chrono::milliseconds(static_cast<std::int64_t>(call_timeout_s * 1000));
        if (initial_buffer_bytes > 0) options.initial_buffer_bytes = initial_buffer_bytes;
        if (reply_spin_max_s) {
            CheckSeconds(*reply_spin_max_s, "reply_spin_max", /*allow_zero=*/true);
            options.reply_spin_max = std::chrono::microseconds(
                static_cast<std::int64_t>(*reply_spin_max_s * 1e6));
        }
        client_ = NoGil([&] { return NodeClient::Connect(options); });
    }

    pyb::dict PutSparseObject(const std::string& tensor_id, const pyb::object& global_shape,
                              const pyb::object& indices, const pyb::object& values,
                              const pyb::object& source_placement,
                              const std::optional<std::string>& placement_policy,
                              std::pair<std::uint64_t, std::uint64_t> generation,
                              const std::string& apply, const pyb::object& tile_shape,
                              const std::string& duplicates, const pyb::object& global_offset,
                              const pyb::object& local_shape, bool hard_pin, int num_threads) {
        ParsedPut put = ParsePut(tensor_id, global_shape, indices, values, source_placement,
                                 placement_policy, generation, apply, tile_shape, duplicates,
                                 global_offset, local_shape, hard_pin, num_threads);
        auto reply = NoGil([&]() -> Result<wire::SparseCommitReply> {
            // Encoded once, here; the daemon re-validates and commits.
            MCS_ASSIGN_OR_RETURN(SparseObject o, BuildSourceObject(put.request));
            EncodedMembers m{o.indices,
                             o.values,
                             AsBytes(o.tile_coords),
                             AsBytes(o.tile_ptr),
                             o.checksum_indices,
                             o.checksum_values,
                             o.checksum_tile_coords,
                             o.checksum_tile_ptr};
            return client_->CommitSparseObject(o.desc, o.coordinate_space, m, put.request.hard_pin);
        });
        return CommitDict(reply.source_ref, reply.created, reply.nnz, reply.bytes);
    }

    std::vector<SourceDescriptor> Manifest(std::pair<std::uint64_t, std::uint64_t> generation) {
        return NoGil([&] { return client_->Manifest({generation.first, generation.second}); });
    }

    pyb::tuple StepManifestOf(std::pair<std::uint64_t, std::uint64_t> generation) {
        return StepManifestTuple(
            NoGil([&] { return client_->GetManifest({generation.first, generation.second}); }));
    }

    pyb::tuple WaitGeneration(std::pair<std::uint64_t, std::uint64_t> generation, double timeout) {
        return StepManifestTuple(NoGil([&] {
            return client_->WaitGeneration({generation.first, generation.second}, timeout);
        }));
    }

    void SealGeneration(std::pair<std::uint64_t, std::uint64_t> generation,
                        const std::vector<std::string>& tensor_ids) {
        NoGil([&] {
            return client_->SealGeneration({generation.first, generation.second}, tensor_ids);
        });
    }

    pyb::object LatestGeneration() {
        return GenerationOrNone(NoGil([&] { return client_->LatestGeneration(); }));
    }

    void SetRetention(std::uint64_t keep_last) {
        NoGil([&] { return client_->SetRetention(keep_last); });
    }

    std::uint64_t Retention() {
        return NoGil([&] { return client_->Retention(); });
    }

    void RecordAnchor(std::pair<std::uint64_t, std::uint64_t> generation,
                      const std::vector<std::string>& tensor_ids) {
        NoGil([&] {
            return client_->RecordAnchor({generation.first, generation.second}, tensor_ids);
        });
    }

    pyb::object LatestAnchor() {
        return GenerationOrNone(NoGil([&] { return client_->LatestAnchor(); }));
    }

    void SetKeepAnchors(std::uint64_t keep) {
        NoGil([&] { return client_->SetKeepAnchors(keep); });
    }

    std::vector<std::shared_ptr<SparseObjectView>> Read(
        const std::vector<SourceDescriptor>& manifest, const pyb::iterable& targets,
        const std::string& strategy, std::int64_t read_coalesce_gap, int num_threads,
        const std::optional<std::pair<std::uint64_t, std::uint64_t>>& generation,
        const std::vector<std::string>& unchanged) {
        std::vector<TargetDescriptor> tds = TargetsFrom(targets);
        ReadOptions opts = ParseReadOptions(strategy, read_coalesce_gap, num_threads);
        wire::SparseReadOptions wopts;
        wopts.plan = opts.plan;
        wopts.strategy = opts.strategy == ReadStrategy::kFullSourcePerTarget
                             ? wire::ReadStrategy::kFullSourcePerTarget
                             : wire::ReadStrategy::kSparseRanges;
        wopts.num_threads = static_cast<std::uint32_t>(opts.num_threads);
        std::optional<StepManifest> step;
        if (generation) step = StepManifestFrom(manifest, *generation, unchanged);
        auto objects = NoGil([&] {
            return step ? client_->ReadSparseObjects(*step, tds, wopts)
                        : client_->ReadSparseObjects(manifest, tds, wopts);
        });
        std::vector<std::shared_ptr<SparseObjectView>> out;
        out.reserve(objects.size());
        for (LeasedTargetObject& t : objects) {
            auto v = std::make_shared<SparseObjectView>();
            v->target_id = std::move(t.target_id);
            v->node_id = std::move(t.node_id);
            v->target_box = std::move(t.target_box);
            v->desc = std::move(t.desc);
            v->coordinate_space = std::move(t.coordinate_space);
            v->indices = t.indices;
            v->values = t.values;
            v->tile_coords = t.tile_coords;
            v->tile_ptr = t.tile_ptr;
            v->keepalive = std::move(t.keepalive);
            out.push_back(std::move(v));
        }
        return out;
    }

    bool Admit(const std::string& tensor_id, std::pair<std::uint64_t, std::uint64_t> generation,
               const std::optional<std::string>& policy, const pyb::object& placement,
               const std::string& writer_id) {
        auto p = ValueOrThrow(PlacementPolicy::Parse(policy.value_or("")));
        auto axes = AxesFromDict(placement, "source_placement");
        auto g = ValueOrThrow(Generation::Make(generation.first, generation.second));
        return NoGil([&] { return client_->Admit(tensor_id, g, p, axes, writer_id); });
    }

    pyb::object CurrentGeneration(const std::string& tensor_id) {
        return GenerationOrNone(NoGil([&] { return client_->CurrentGeneration(tensor_id); }));
    }

    pyb::dict Metrics(bool reset) {
        return MetricsDict(NoGil([&] { return client_->Metrics(reset); }));
    }

    pyb::dict StoreCounters() {
        auto items = NoGil([&] { return client_->Metrics(false); });
        pyb::dict d;
        for (const auto& [k, v] : items) {
            if (k.starts_with("store_")) d[pyb::str(k.substr(6))] = static_cast<std::uint64_t>(v);
        }
        return d;
    }

    std::vector<std::string> ListKeys(const std::string& prefix) {
        return NoGil([&] { return client_->List(prefix); });
    }

    pyb::dict Hello() {
        wire::HelloReply h = NoGil([&] { return client_->Hello(); });
        pyb::dict d;
        d["node_id"] = h.node_id;
        d["daemon_version"] = h.daemon_version;
        d["protocol_version"] = h.protocol_version;
        d["client_buffer_max"] = h.client_buffer_max;
        pyb::list segments;
        for (const auto& s : h.segments) {
            pyb::dict sd;
            sd["segment_id"] = s.segment_id;
            sd["size"] = s.size;
            sd["read_only"] = s.read_only;
            segments.append(sd);
        }
        d["segments"] = segments;
        return d;
    }

    pyb::dict ClientStats() const {
        NodeClientStats s = client_->Stats();
        pyb::dict d;
        d["calls"] = s.calls;
        d["connects"] = s.connects;
        d["disconnects"] = s.disconnects;
        d["replies_spun"] = s.replies_spun;
        d["replies_slept"] = s.replies_slept;
        d["leases_released"] = s.leases_released;
        d["buffer_bytes"] = s.buffer_bytes;
        d["connected"] = client_->connected();
        return d;
    }

    /// A zero-copy view of one member of a leased object (read-only numpy, holds the lease).
    pyb::tuple LeaseObject(const std::string& key) {
        LeasedObject o = NoGil([&] { return client_->Lease(key); });
        auto holder = std::make_shared<LeasedObject>(std::move(o));
        pyb::dict members;
        for (std::size_t i = 0; i < holder->members.size(); ++i) {
            const MemberInfo& m = holder->info.members[i];
            members[pyb::str(m.name)] =
                ViewNumpy(holder->members[i], m.dtype, m.shape, std::shared_ptr<const void>(holder));
        }
        return pyb::make_tuple(pyb::bytes(holder->info.metadata), members);
    }

    void FlushReleases() { NoGil([&] { return client_->FlushReleases(); }); }
    void ClearCaches() { NoGil([&] { return client_->ClearCaches(); }); }
    void Disconnect() { client_->Disconnect(); }

    ObjectStore& object_store() { return *client_; }

private:
    std::shared_ptr<NodeClient> client_;
};

}  // namespace

void RegisterNode(pyb::module_& m) {
    pyb::class_<PyNodeStore>(m, "_NodeStore",
                             "A DummyClient of the node daemon (mooncake_sparse_node).")
        .def(pyb::init<const std::string&, double, double, const std::string&, std::uint64_t,
                       std::optional<double>, const std::string&>(),
             pyb::arg("socket_path"), pyb::arg("connect_timeout") = 5.0,
             pyb::arg("call_timeout") = 120.0, pyb::arg("client_name") = "",
             pyb::arg("initial_buffer_bytes") = 0, pyb::arg("reply_spin_max") = pyb::none(),
             pyb::arg("name_space") = "")
        .def("put_sparse_object", &PyNodeStore::PutSparseObject, pyb::arg("tensor_id"),
             pyb::arg("global_shape"), pyb::arg("indices"), pyb::arg("values"),
             pyb::arg("source_placement") = pyb::none(), pyb::arg("placement_policy") = pyb::none(),
             pyb::arg("generation"), pyb::arg("apply") = "overwrite",
             pyb::arg("tile_shape") = pyb::none(), pyb::arg("duplicates") = "error",
             pyb::arg("global_offset") = pyb::none(), pyb::arg("local_shape") = pyb::none(),
             pyb::arg("hard_pin") = true, pyb::arg("num_threads") = 0)
        .def("manifest", &PyNodeStore::Manifest, pyb::arg("generation"))
        .def("read_sparse_objects", &PyNodeStore::Read, pyb::arg("manifest"), pyb::arg("targets"),
             pyb::arg("strategy") = "sparse", pyb::arg("read_coalesce_gap") = -1,
             pyb::arg("num_threads") = 0, pyb::arg("generation") = pyb::none(),
             pyb::arg("unchanged") = std::vector<std::string>{})
        .def("step_manifest", &PyNodeStore::StepManifestOf, pyb::arg("generation"))
        .def("wait_generation", &PyNodeStore::WaitGeneration, pyb::arg("generation"),
             pyb::arg("timeout"))
        .def("seal_generation", &PyNodeStore::SealGeneration, pyb::arg("generation"),
             pyb::arg("tensor_ids"))
        .def("latest_generation", &PyNodeStore::LatestGeneration)
        .def("set_retention", &PyNodeStore::SetRetention, pyb::arg("keep_last"))
        .def("retention", &PyNodeStore::Retention)
        .def("record_anchor", &PyNodeStore::RecordAnchor, pyb::arg("generation"),
             pyb::arg("tensor_ids"))
        .def("latest_anchor", &PyNodeStore::LatestAnchor)
        .def("set_keep_anchors", &PyNodeStore::SetKeepAnchors, pyb::arg("keep_anchors"))
        .def("admit", &PyNodeStore::Admit, pyb::arg("tensor_id"), pyb::arg("generation"),
             pyb::arg("placement_policy"), pyb::arg("source_placement"), pyb::arg("writer_id"))
        .def("current_generation", &PyNodeStore::CurrentGeneration, pyb::arg("tensor_id"))
        .def("metrics", [](PyNodeStore& s) { return s.Metrics(false); })
        .def("reset_metrics", [](PyNodeStore& s) { s.Metrics(true); })
        .def("clear_caches", &PyNodeStore::ClearCaches)
        .def("store_counters", &PyNodeStore::StoreCounters)
        .def("list_keys", &PyNodeStore::ListKeys, pyb::arg("prefix") = "")
        .def("hello", &PyNodeStore::Hello)
        .def("client_stats", &PyNodeStore::ClientStats)
        .def("lease_object", &PyNodeStore::LeaseObject, pyb::arg("key"))
        .def("flush_releases", &PyNodeStore::FlushReleases)
        .def("disconnect", &PyNodeStore::Disconnect)
        .def("_object_store", [](PyNodeStore& s) { return ObjectStoreHandle(s.object_store()); },
             pyb::keep_alive<0, 1>());
}

}  // namespace mooncake::sparse::py
