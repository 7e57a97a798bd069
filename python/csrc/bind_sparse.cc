// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Bindings of the sparse object layer beside its store: manifest entries (SourceInfo),
// encode_update, apply and key helpers. Heavy work runs with the GIL released. The store handle
// of every backend (`_Store`) is bind_store.cc; SparseObject is sparse_object.cc.
#include <pybind11/stl.h>

#include <optional>

#include "arrays.h"
#include "bind_common.h"
#include "executor/sparse_store.h"
#include "sparse_object.h"
#include "transport/host_blocks.h"

namespace mooncake::sparse::py {

void RegisterSparse(pyb::module_& m) {
    pyb::class_<TargetBatch, std::shared_ptr<TargetBatch>>(
        m, "_TargetBatch", "Targets converted once, for many reads (mooncake.sparse.TargetBatch).")
        .def(pyb::init([](const pyb::iterable& targets) {
                 return std::make_shared<TargetBatch>(TargetBatch{TargetsFrom(targets)});
             }),
             pyb::arg("targets"))
        .def("__len__", [](const TargetBatch& b) { return b.targets.size(); });
    // Held by shared_ptr: the SourceInfo of a manifest view one array (SourcesList), which a read
    // then takes as it lies.
    pyb::class_<SourceDescriptor, std::shared_ptr<SourceDescriptor>>(m, "SourceInfo", "One committed source object of a manifest.")
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

    m.def("host_memory", [] {
        const HostBlockCacheStats b = GetHostBlockCacheStats();
        const PooledBlockStats p = GetPooledBlockStats();
        pyb::dict d;
        d["cache_limit_bytes"] = b.limit_bytes;
        d["cache_free_bytes"] = b.free_bytes;
        d["cache_free_blocks"] = b.free_blocks;
        d["cache_allocations"] = b.allocations;
        d["cache_reuses"] = b.reuses;
        d["pooled_chunks"] = p.chunks;
        d["pooled_bytes"] = p.chunks * std::uint64_t{kPoolChunkBytes};
        d["pooled_free_chunks"] = p.free_chunks;
        d["pooled_allocations"] = p.allocations;
        d["pooled_chunk_reuses"] = p.chunk_reuses;
        return d;
    }, "The host memory this process keeps from step to step: the block cache and the pooled "
       "chunks of target objects (counters since start).");
    m.def("trim_host_memory", [] { TrimHostBlockCache(); },
          "Returns every free cached block and free pooled chunk to the system.");
}

}  // namespace mooncake::sparse::py
