// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Bindings of the sparse object layer on the embedded store: the store handle (commit, manifest,
// read), manifest entries (SourceInfo), encode_update and apply. Heavy work runs with the GIL
// released. The node daemon's handle is bind_node.cc; SparseObject is sparse_object.cc.
#include <pybind11/stl.h>

#include <optional>

#include "arrays.h"
#include "bind_common.h"
#include "executor/sparse_store.h"
#include "object_store_handle.h"
#include "python_object_store.h"
#include "sparse_object.h"

namespace mooncake::sparse::py {
namespace {

/// The Python-visible store: a SparseStore over an ObjectStore.
class PyStore {
public:
    /// Over the embedded store, or over `object_store` (a Python implementation of the
    /// ObjectStore contract, e.g. the upstream Mooncake adapter) when it is not None.
    PyStore(std::string node_id, std::uint64_t capacity_bytes, const pyb::object& object_store,
            const std::string& name_space) {
        ThrowIfError(ValidateNamespace(name_space));
        SparseStoreOptions opts;
        opts.node_id = std::move(node_id);
        opts.name_space = name_space;
        std::shared_ptr<ObjectStore> objects =
            object_store.is_none() ? std::shared_ptr<ObjectStore>(MakeEmbeddedStore({capacity_bytes}))
                                   : MakePythonObjectStore(object_store);
        store_ = std::make_shared<SparseStore>(std::move(objects), opts);
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
        Result<CommitResult> r = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            r = store_->PutSparseObject(put.request);
        }
        CommitResult c = ValueOrThrow(std::move(r));
        return CommitDict(c.source_ref, c.created, c.nnz, c.bytes);
    }

    std::vector<SourceDescriptor> Manifest(std::pair<std::uint64_t, std::uint64_t> generation) {
        pyb::gil_scoped_release nogil;
        return ValueOrThrow(store_->Manifest({generation.first, generation.second}));
    }

    /// (sources, unchanged tensor ids, sealed) of a step or a fold.
    pyb::tuple StepManifestOf(std::pair<std::uint64_t, std::uint64_t> generation) {
        Result<StepManifest> m = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            m = store_->GetManifest({generation.first, generation.second});
        }
        return StepManifestTuple(ValueOrThrow(std::move(m)));
    }

    pyb::tuple WaitGeneration(std::pair<std::uint64_t, std::uint64_t> generation, double timeout) {
        Result<StepManifest> m = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            m = store_->WaitGeneration({generation.first, generation.second}, timeout);
        }
        return StepManifestTuple(ValueOrThrow(std::move(m)));
    }

    void SealGeneration(std::pair<std::uint64_t, std::uint64_t> generation,
                        const std::vector<std::string>& tensor_ids) {
        pyb::gil_scoped_release nogil;
        ThrowIfError(store_->SealGeneration({generation.first, generation.second}, tensor_ids));
    }

    pyb::object LatestGeneration() {
        Result<std::optional<Generation>> g = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            g = store_->LatestGeneration();
        }
        return GenerationOrNone(ValueOrThrow(std::move(g)));
    }

    void SetRetention(std::uint64_t keep_last) {
        pyb::gil_scoped_release nogil;
        ThrowIfError(store_->SetRetention(keep_last));
    }

    std::uint64_t Retention() {
        pyb::gil_scoped_release nogil;
        return ValueOrThrow(store_->Retention());
    }

    void RecordAnchor(std::pair<std::uint64_t, std::uint64_t> generation,
                      const std::vector<std::string>& tensor_ids) {
        pyb::gil_scoped_release nogil;
        ThrowIfError(store_->RecordAnchor({generation.first, generation.second}, tensor_ids));
    }

    pyb::object LatestAnchor() {
        Result<std::optional<Generation>> g = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            g = store_->LatestAnchor();
        }
        return GenerationOrNone(ValueOrThrow(std::move(g)));
    }

    void SetKeepAnchors(std::uint64_t keep) {
        pyb::gil_scoped_release nogil;
        ThrowIfError(store_->SetKeepAnchors(keep));
    }

    std::vector<std::shared_ptr<SparseObjectView>> Read(
        const std::vector<SourceDescriptor>& manifest, const pyb::iterable& targets,
        const std::string& strategy, std::int64_t read_coalesce_gap, int num_threads,
        const std::optional<std::pair<std::uint64_t, std::uint64_t>>& generation,
        const std::vector<std::string>& unchanged) {
        std::vector<TargetDescriptor> tds = TargetsFrom(targets);
        ReadOptions opts = ParseReadOptions(strategy, read_coalesce_gap, num_threads);
        Result<std::vector<TargetObject>> r = Internal("unset");
        if (generation) {
            StepManifest step = StepManifestFrom(manifest, *generation, unchanged);
            pyb::gil_scoped_release nogil;
            r = store_->ReadSparseObjects(step, tds, opts);
        } else {
            pyb::gil_scoped_release nogil;
            r = store_->ReadSparseObjects(manifest, tds, opts);
        }
        auto objs = ValueOrThrow(std::move(r));
        std::vector<std::shared_ptr<SparseObjectView>> out;
        out.reserve(objs.size());
        for (auto& o : objs) out.push_back(ViewOf(std::move(o)));
        return out;
    }

    bool Admit(const std::string& tensor_id, std::pair<std::uint64_t, std::uint64_t> generation,
               const std::optional<std::string>& policy, const pyb::object& placement,
               const std::string& writer_id) {
        auto p = ValueOrThrow(PlacementPolicy::Parse(policy.value_or("")));
        auto axes = AxesFromDict(placement, "source_placement");
        pyb::gil_scoped_release nogil;
        return ValueOrThrow(store_->Admit(tensor_id, {generation.first, generation.second}, p, axes, writer_id));
    }

    pyb::object CurrentGeneration(const std::string& tensor_id) {
        Result<std::optional<Generation>> g = Internal("unset");
        {
            pyb::gil_scoped_release nogil;  // The object store may be written in Python.
            g = store_->CurrentGeneration(tensor_id);
        }
        return GenerationOrNone(ValueOrThrow(std::move(g)));
    }

    pyb::dict Metrics() const { return MetricsDict(store_->Metrics().Items()); }

    pyb::dict StoreCounters() const {
        sparse::StoreCounters c;
        {
            pyb::gil_scoped_release nogil;
            c = store_->object_store().Counters();
        }
        pyb::dict d;
        d["puts"] = c.puts;
        d["bytes_put"] = c.bytes_put;
        d["member_gets"] = c.member_gets;
        d["member_bytes"] = c.member_bytes;
        d["range_reads"] = c.range_reads;
        d["range_bytes"] = c.range_bytes;
        d["removes"] = c.removes;
        return d;
    }

    std::vector<std::string> ListKeys(const std::string& prefix) {
        Result<std::vector<std::string>> keys = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            keys = store_->object_store().List(prefix);
        }
        return ValueOrThrow(std::move(keys));
    }

    SparseStore& store() { return *store_; }

private:
    std::shared_ptr<SparseStore> store_;
};

}  // namespace

void RegisterSparse(pyb::module_& m) {
    pyb::class_<SourceDescriptor>(m, "SourceInfo", "One committed source object of a manifest.")
        .def_property_readonly("source_ref", [](const SourceDescriptor& d) { return d.source_ref; })
        .def_property_readonly("tensor_id", [](const SourceDescriptor& d) { return d.tensor_id; })
        .def_property_readonly("global_shape", [](const SourceDescriptor& d) { return ShapeTuple(d.global_shape); })
        .def_property_readonly("global_offset", [](const SourceDescriptor& d) { return ShapeTuple(d.box.origin()); })
        .def_property_readonly("local_shape", [](const SourceDescriptor& d) { return ShapeTuple(d.box.shape()); })
        .def_property_readonly("generation", [](const SourceDescriptor& d) {
            return pyb::make_tuple(d.generation.base, d.generation.delta);
        })
        .def_property_readonly("source_placement", [](const SourceDescriptor& d) { return AxesToDict(d.placement); })
        .def_property_readonly("placement_policy", [](const SourceDescriptor& d) { return d.policy.ToString(); })
        .def_property_readonly("tile_shape", [](const SourceDescriptor& d) { return ShapeTuple(d.tile_shape); })
        .def_property_readonly("nnz", [](const SourceDescriptor& d) { return d.nnz; })
        .def_property_readonly("num_tiles", [](const SourceDescriptor& d) { return d.num_tiles; })
        .def_property_readonly("apply", [](const SourceDescriptor& d) { return std::string(ApplyModeName(d.apply)); })
        .def_property_readonly("index_dtype", [](const SourceDescriptor& d) { return std::string(DTypeName(d.index_dtype)); })
        .def_property_readonly("value_dtype", [](const SourceDescriptor& d) { return std::string(DTypeName(d.value_dtype)); })
        .def_property_readonly("entry_bytes", &SourceDescriptor::EntryBytes)
        .def("__repr__", [](const SourceDescriptor& d) {
            return "<SourceInfo " + d.source_ref + " nnz=" + std::to_string(d.nnz) + ">";
        });

    RegisterSparseObject(m);

    pyb::class_<PyStore>(m, "_Store")
        .def(pyb::init<std::string, std::uint64_t, const pyb::object&, const std::string&>(),
             pyb::arg("node_id") = "node0", pyb::arg("capacity_bytes") = 0,
             pyb::arg("object_store") = pyb::none(), pyb::arg("name_space") = "")
        .def("put_sparse_object", &PyStore::PutSparseObject, pyb::arg("tensor_id"),
             pyb::arg("global_shape"), pyb::arg("indices"), pyb::arg("values"),
             pyb::arg("source_placement") = pyb::none(), pyb::arg("placement_policy") = pyb::none(),
             pyb::arg("generation"), pyb::arg("apply") = "overwrite",
             pyb::arg("tile_shape") = pyb::none(), pyb::arg("duplicates") = "error",
             pyb::arg("global_offset") = pyb::none(), pyb::arg("local_shape") = pyb::none(),
             pyb::arg("hard_pin") = true, pyb::arg("num_threads") = 0)
        .def("manifest", &PyStore::Manifest, pyb::arg("generation"))
        .def("read_sparse_objects", &PyStore::Read, pyb::arg("manifest"), pyb::arg("targets"),
             pyb::arg("strategy") = "sparse", pyb::arg("read_coalesce_gap") = -1,
             pyb::arg("num_threads") = 0, pyb::arg("generation") = pyb::none(),
             pyb::arg("unchanged") = std::vector<std::string>{})
        .def("step_manifest", &PyStore::StepManifestOf, pyb::arg("generation"))
        .def("wait_generation", &PyStore::WaitGeneration, pyb::arg("generation"),
             pyb::arg("timeout"))
        .def("seal_generation", &PyStore::SealGeneration, pyb::arg("generation"),
             pyb::arg("tensor_ids"))
        .def("latest_generation", &PyStore::LatestGeneration)
        .def("set_retention", &PyStore::SetRetention, pyb::arg("keep_last"))
        .def("retention", &PyStore::Retention)
        .def("record_anchor", &PyStore::RecordAnchor, pyb::arg("generation"),
             pyb::arg("tensor_ids"))
        .def("latest_anchor", &PyStore::LatestAnchor)
        .def("set_keep_anchors", &PyStore::SetKeepAnchors, pyb::arg("keep_anchors"))
        .def("admit", &PyStore::Admit, pyb::arg("tensor_id"), pyb::arg("generation"),
             pyb::arg("placement_policy"), pyb::arg("source_placement"), pyb::arg("writer_id"))
        .def("current_generation", &PyStore::CurrentGeneration, pyb::arg("tensor_id"))
        .def("metrics", &PyStore::Metrics)
        .def("reset_metrics", [](PyStore& s) { s.store().ResetMetrics(); },
             pyb::call_guard<pyb::gil_scoped_release>())
        .def("clear_caches", [](PyStore& s) { ThrowIfError(s.store().ClearCaches()); },
             pyb::call_guard<pyb::gil_scoped_release>())
        .def("store_counters", &PyStore::StoreCounters)
        .def("list_keys", &PyStore::ListKeys, pyb::arg("prefix") = "")
        .def("_object_store",
             [](PyStore& s) { return ObjectStoreHandle(s.store().object_store()); },
             pyb::keep_alive<0, 1>());

    m.def(
        "apply_sparse_object",
        [](const pyb::object& weight, const std::shared_ptr<SparseObjectView>& obj, int num_threads) {
            // Written in place through its strides: a view of a larger weight is never copied.
            BorrowedArray w = BorrowView(weight, "weight", /*writable=*/true);
            const auto& d = obj->desc;
            if (w.shape != d.global_shape) {
                ThrowIfError(InvalidArgument("weight shape " + internal::JoinIndices(w.shape) +
                                             " != object local shape " +
                                             internal::JoinIndices(d.global_shape)));
            }
            HostArray idx{d.index_dtype, {Index(d.nnz), Index(d.rank())}, obj->indices};
            HostArray val{d.value_dtype, {Index(d.nnz)}, obj->values};
            Status s;
            {
                pyb::gil_scoped_release nogil;
                s = ApplySparse(w.mutable_view(), idx, val, d.apply, num_threads);
            }
            ThrowIfError(s);
        },
        pyb::arg("weight"), pyb::arg("obj"), pyb::arg("num_threads") = 0);

    m.def(
        "apply_coo",
        [](const pyb::object& weight, const pyb::object& indices, const pyb::object& values,
           const std::string& apply, int num_threads) {
            BorrowedArray w = BorrowView(weight, "weight", /*writable=*/true);
            BorrowedArray i = Borrow(indices, "indices");
            BorrowedArray v = Borrow(values, "values");
            ApplyMode mode = ValueOrThrow(ParseApplyMode(apply));
            Status s;
            {
                pyb::gil_scoped_release nogil;
                s = ApplySparse(w.mutable_view(), i.view(), v.view(), mode, num_threads);
            }
            ThrowIfError(s);
        },
        pyb::arg("weight"), pyb::arg("indices"), pyb::arg("values"), pyb::arg("apply") = "overwrite",
        pyb::arg("num_threads") = 0);

    m.def(
        "encode_update",
        [](const pyb::object& new_w, const pyb::object& old_w, const std::string& apply,
           double threshold, const pyb::object& tile_shape, int num_threads) {
            BorrowedArray n = Borrow(new_w, "new");
            BorrowedArray o = Borrow(old_w, "old");
            EncodeUpdateOptions opts;
            opts.apply = ValueOrThrow(ParseApplyMode(apply));
            opts.threshold = threshold;
            opts.tile_shape = OptShape(tile_shape, "tile_shape");
            opts.num_threads = num_threads;
            Result<EncodedUpdate> r = Internal("unset");
            {
                pyb::gil_scoped_release nogil;
                r = EncodeUpdate(n.view(), o.view(), opts);
            }
            EncodedUpdate e = ValueOrThrow(std::move(r));
            const Index nnz = Index(e.nnz), rank = Index(e.rank);
            const DType it = e.index_dtype, vt = e.value_dtype;
            return pyb::make_tuple(ToNumpy(std::move(e.indices), it, {nnz, rank}),
                                   ToNumpy(std::move(e.values), vt, {nnz}),
                                   std::string(DTypeName(vt)));
        },
        pyb::arg("new"), pyb::arg("old"), pyb::arg("apply") = "overwrite", pyb::arg("threshold") = 0.0,
        pyb::arg("tile_shape") = pyb::none(), pyb::arg("num_threads") = 0);

    m.def("anchor_key", [](const std::string& name_space,
                           std::pair<std::uint64_t, std::uint64_t> generation,
                           const std::string& tensor_id) {
        return AnchorTensorKey(name_space, {generation.first, generation.second}, tensor_id);
    }, pyb::arg("name_space"), pyb::arg("generation"), pyb::arg("tensor_id"));

    m.def("default_tile_shape", [](const pyb::object& shape) {
        Shape s = ShapeArg(shape, "shape");
        ThrowIfError(ValidateShape(s));
        return ShapeTuple(DefaultTileShape(s));
    });
}

}  // namespace mooncake::sparse::py
