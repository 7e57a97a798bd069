// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Bindings of the sparse object layer: the store handle (commit, manifest, read), target-local
// objects, encode_update and apply. Heavy work runs with the GIL released.
#include <pybind11/stl.h>

#include <optional>

#include "arrays.h"
#include "executor/sparse_store.h"

namespace mooncake::sparse::py {
namespace {

NamedAxes AxesFromDict(const pyb::handle& obj, const char* what) {
    std::vector<NamedAxes::Entry> entries;
    if (!obj.is_none()) {
        if (!pyb::isinstance<pyb::dict>(obj)) {
            ThrowIfError(InvalidArgument(std::string(what) + " must be a dict of axis -> ordinal"));
        }
        for (auto [k, v] : pyb::reinterpret_borrow<pyb::dict>(obj)) {
            if (!pyb::isinstance<pyb::str>(k) || !pyb::isinstance<pyb::int_>(v)) {
                ThrowIfError(InvalidArgument(std::string(what) + " must map str -> int"));
            }
            entries.emplace_back(k.cast<std::string>(), v.cast<std::int64_t>());
        }
    }
    auto axes = NamedAxes::Make(std::move(entries));
    if (!axes.ok()) throw StatusError(axes.status().WithContext(what));
    return std::move(axes).value();
}

pyb::dict AxesToDict(const NamedAxes& axes) {
    pyb::dict d;
    for (const auto& [k, v] : axes.entries()) d[pyb::str(k)] = v;
    return d;
}

Shape ShapeArg(const pyb::handle& obj, const char* what) {
    Shape s;
    try {
        for (auto e : obj) s.push_back(e.cast<Index>());
    } catch (const pyb::cast_error&) {
        ThrowIfError(InvalidArgument(std::string(what) + " must be a sequence of ints"));
    }
    return s;
}

std::optional<Shape> OptShape(const pyb::handle& obj, const char* what) {
    if (obj.is_none()) return std::nullopt;
    return ShapeArg(obj, what);
}

pyb::tuple ShapeTuple(std::span<const Index> s) {
    pyb::tuple t(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) t[i] = s[i];
    return t;
}

TargetDescriptor TargetFrom(const pyb::handle& obj) {
    auto get = [&](const char* name) -> pyb::object {
        if (!pyb::hasattr(obj, name)) {
            ThrowIfError(InvalidArgument(std::string("target lacks attribute '") + name + "'"));
        }
        return obj.attr(name);
    };
    auto target = TargetDescriptor::Make(
        pyb::str(get("target_id")), pyb::str(get("node_id")), pyb::str(get("tensor_id")),
        AxesFromDict(get("placement"), "target placement"), ShapeArg(get("global_offset"), "global_offset"),
        ShapeArg(get("local_shape"), "local_shape"));
    return ValueOrThrow(std::move(target));
}

/// The Python-visible store: a SparseStore over an ObjectStore.
class PyStore {
public:
    PyStore(std::string node_id, std::uint64_t capacity_bytes) {
        SparseStoreOptions opts;
        opts.node_id = std::move(node_id);
        store_ = std::make_shared<SparseStore>(MakeEmbeddedStore({capacity_bytes}), opts);
    }

    pyb::dict PutSparseObject(const std::string& tensor_id, const pyb::object& global_shape,
                              const pyb::object& indices, const pyb::object& values,
                              const pyb::object& source_placement,
                              const std::optional<std::string>& placement_policy,
                              std::pair<std::uint64_t, std::uint64_t> generation,
                              const std::string& apply, const pyb::object& tile_shape,
                              const std::string& duplicates, const pyb::object& global_offset,
                              const pyb::object& local_shape, bool hard_pin, int num_threads) {
        PutSparseRequest req;
        req.tensor_id = tensor_id;
        req.global_shape = ShapeArg(global_shape, "global_shape");
        req.global_offset = OptShape(global_offset, "global_offset");
        req.local_shape = OptShape(local_shape, "local_shape");
        BorrowedArray idx = Borrow(indices, "indices");
        BorrowedArray val = Borrow(values, "values");
        req.indices = idx.view();
        req.values = val.view();
        req.source_placement = AxesFromDict(source_placement, "source_placement");
        req.placement_policy = ValueOrThrow(PlacementPolicy::Parse(placement_policy.value_or("")));
        req.generation = {generation.first, generation.second};
        req.apply = ValueOrThrow(ParseApplyMode(apply));
        req.encode.tile_shape = OptShape(tile_shape, "tile_shape");
        if (duplicates == "error") {
            req.encode.duplicates = DuplicatePolicy::kError;
        } else if (duplicates == "sum") {
            req.encode.duplicates = DuplicatePolicy::kSum;
        } else {
            ThrowIfError(InvalidArgument("duplicates must be 'error' or 'sum', got '" + duplicates + "'"));
        }
        req.encode.num_threads = num_threads;
        req.hard_pin = hard_pin;
        Result<CommitResult> r = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            r = store_->PutSparseObject(req);
        }
        CommitResult c = ValueOrThrow(std::move(r));
        pyb::dict out;
        out["source_ref"] = c.source_ref;
        out["created"] = c.created;
        out["nnz"] = c.nnz;
        out["bytes"] = c.bytes;
        return out;
    }

    std::vector<SourceDescriptor> Manifest(std::pair<std::uint64_t, std::uint64_t> generation) {
        pyb::gil_scoped_release nogil;
        return ValueOrThrow(store_->Manifest({generation.first, generation.second}));
    }

    std::vector<std::shared_ptr<TargetObject>> Read(const std::vector<SourceDescriptor>& manifest,
                                                    const pyb::iterable& targets,
                                                    const std::string& strategy,
                                                    std::int64_t read_coalesce_gap, int num_threads) {
        std::vector<TargetDescriptor> tds;
        for (auto t : targets) tds.push_back(TargetFrom(t));
        ReadOptions opts;
        if (strategy == "sparse") {
            opts.strategy = ReadStrategy::kSparseRanges;
        } else if (strategy == "full_source") {
            opts.strategy = ReadStrategy::kFullSourcePerTarget;
        } else {
            ThrowIfError(InvalidArgument("strategy must be 'sparse' or 'full_source'"));
        }
        opts.plan.read_coalesce_gap = read_coalesce_gap;
        opts.num_threads = num_threads;
        Result<std::vector<TargetObject>> r = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            r = store_->ReadSparseObjects(manifest, tds, opts);
        }
        auto objs = ValueOrThrow(std::move(r));
        std::vector<std::shared_ptr<TargetObject>> out;
        out.reserve(objs.size());
        for (auto& o : objs) out.push_back(std::make_shared<TargetObject>(std::move(o)));
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
        auto g = ValueOrThrow(store_->CurrentGeneration(tensor_id));
        if (!g) return pyb::none();
        return pyb::make_tuple(g->base, g->delta);
    }

    pyb::dict Metrics() const {
        pyb::dict d;
        for (const auto& [k, v] : store_->Metrics().Items()) {
            if (k.ends_with("_seconds")) d[pyb::str(k)] = v;
            else d[pyb::str(k)] = static_cast<std::uint64_t>(v);
        }
        return d;
    }

    pyb::dict StoreCounters() const {
        sparse::StoreCounters c = store_->object_store().Counters();
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
        return ValueOrThrow(store_->object_store().List(prefix));
    }

    SparseStore& store() { return *store_; }

private:
    std::shared_ptr<SparseStore> store_;
};

pyb::array MemberArray(const std::shared_ptr<TargetObject>& self, const std::vector<std::byte>& bytes,
                       DType dtype, Shape shape) {
    auto alias = std::shared_ptr<const std::vector<std::byte>>(self, &bytes);
    return ToNumpy(std::move(alias), dtype, std::move(shape));
}

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

    pyb::class_<TargetObject, std::shared_ptr<TargetObject>>(m, "SparseObject",
                                                             "A target-local sparse object.")
        .def_property_readonly("target_id", [](const TargetObject& o) { return o.target_id; })
        .def_property_readonly("node_id", [](const TargetObject& o) { return o.node_id; })
        .def_property_readonly("tensor_id", [](const TargetObject& o) { return o.object.desc.tensor_id; })
        .def_property_readonly("coordinate_space", [](const TargetObject& o) { return o.object.coordinate_space; })
        .def_property_readonly("global_offset", [](const TargetObject& o) { return ShapeTuple(o.target_box.origin()); })
        .def_property_readonly("local_shape", [](const TargetObject& o) { return ShapeTuple(o.target_box.shape()); })
        .def_property_readonly("generation", [](const TargetObject& o) {
            return pyb::make_tuple(o.object.desc.generation.base, o.object.desc.generation.delta);
        })
        .def_property_readonly("apply", [](const TargetObject& o) { return std::string(ApplyModeName(o.object.desc.apply)); })
        .def_property_readonly("nnz", [](const TargetObject& o) { return o.object.desc.nnz; })
        .def_property_readonly("tile_shape", [](const TargetObject& o) { return ShapeTuple(o.object.desc.tile_shape); })
        .def_property_readonly("index_dtype", [](const TargetObject& o) { return std::string(DTypeName(o.object.desc.index_dtype)); })
        .def_property_readonly("value_dtype", [](const TargetObject& o) { return std::string(DTypeName(o.object.desc.value_dtype)); })
        .def_property_readonly("nbytes", [](const TargetObject& o) { return o.object.PayloadBytes(); })
        .def_property_readonly("indices", [](const std::shared_ptr<TargetObject>& o) {
            const auto& d = o->object.desc;
            return MemberArray(o, o->object.indices, d.index_dtype, {Index(d.nnz), Index(d.rank())});
        })
        .def_property_readonly("_values_raw", [](const std::shared_ptr<TargetObject>& o) {
            const auto& d = o->object.desc;
            return MemberArray(o, o->object.values, d.value_dtype, {Index(d.nnz)});
        })
        .def_property_readonly("tile_coords", [](const std::shared_ptr<TargetObject>& o) {
            const auto& d = o->object.desc;
            std::span<const TileCoord> v = o->object.tile_coords;
            pyb::array_t<TileCoord> arr({pyb::ssize_t(d.num_tiles), pyb::ssize_t(d.rank())});
            std::copy(v.begin(), v.end(), arr.mutable_data());
            return arr;
        })
        .def_property_readonly("tile_ptr", [](const std::shared_ptr<TargetObject>& o) {
            pyb::array_t<std::uint64_t> arr(pyb::ssize_t(o->object.tile_ptr.size()));
            std::copy(o->object.tile_ptr.begin(), o->object.tile_ptr.end(), arr.mutable_data());
            return arr;
        })
        .def("__repr__", [](const TargetObject& o) {
            return "<SparseObject " + o.target_id + " " + o.object.desc.tensor_id + " " +
                   o.target_box.ToString() + " nnz=" + std::to_string(o.object.desc.nnz) + " " +
                   std::string(ApplyModeName(o.object.desc.apply)) + ">";
        });

    pyb::class_<PyStore>(m, "_Store")
        .def(pyb::init<std::string, std::uint64_t>(), pyb::arg("node_id") = "node0",
             pyb::arg("capacity_bytes") = 0)
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
             pyb::arg("num_threads") = 0)
        .def("admit", &PyStore::Admit, pyb::arg("tensor_id"), pyb::arg("generation"),
             pyb::arg("placement_policy"), pyb::arg("source_placement"), pyb::arg("writer_id"))
        .def("current_generation", &PyStore::CurrentGeneration, pyb::arg("tensor_id"))
        .def("metrics", &PyStore::Metrics)
        .def("reset_metrics", [](PyStore& s) { s.store().ResetMetrics(); })
        .def("clear_caches", [](PyStore& s) { s.store().ClearCaches(); })
        .def("store_counters", &PyStore::StoreCounters)
        .def("list_keys", &PyStore::ListKeys, pyb::arg("prefix") = "");

    m.def(
        "apply_sparse_object",
        [](const pyb::object& weight, const std::shared_ptr<TargetObject>& obj, int num_threads) {
            BorrowedArray w = Borrow(weight, "weight", /*need_writable=*/true);
            const auto& d = obj->object.desc;
            if (w.shape != d.global_shape) {
                ThrowIfError(InvalidArgument("weight shape " + internal::JoinIndices(w.shape) +
                                             " != object local shape " +
                                             internal::JoinIndices(d.global_shape)));
            }
            HostArray idx{d.index_dtype, {Index(d.nnz), Index(d.rank())}, obj->object.indices};
            HostArray val{d.value_dtype, {Index(d.nnz)}, obj->object.values};
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
            BorrowedArray w = Borrow(weight, "weight", true);
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

    m.def("default_tile_shape", [](const pyb::object& shape) {
        Shape s = ShapeArg(shape, "shape");
        ThrowIfError(ValidateShape(s));
        return ShapeTuple(DefaultTileShape(s));
    });
}

}  // namespace mooncake::sparse::py
