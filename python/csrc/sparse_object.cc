// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Binding of SparseObject (a target-local object of read_sparse_objects), for both backends.
#include "sparse_object.h"

#include "bind_common.h"

namespace mooncake::sparse::py {
namespace {

pyb::array Member(const std::shared_ptr<SparseObjectView>& o, std::span<const std::byte> bytes,
                  DType dtype, Shape shape) {
    std::uint64_t expected = DTypeSize(dtype);
    for (Index e : shape) expected *= static_cast<std::uint64_t>(e);
    if (bytes.size() != expected) {
        // A device read's object: its members live in GPU memory only.
        throw StatusError(FailedPrecondition(
            "this object's members are not in host memory (an object of a device read: its "
            "indices and values are device arrays, and it has no tile index)"));
    }
    // The array keeps the whole view alive: its keepalive owns (or leases) the bytes.
    return ViewNumpy(bytes, dtype, std::move(shape), std::shared_ptr<const void>(o));
}

}  // namespace

void RegisterSparseObject(pyb::module_& m) {
    using View = SparseObjectView;
    using Ptr = std::shared_ptr<View>;
    pyb::class_<View, Ptr>(m, "SparseObject",
                           "A target-local sparse object (read-only; its arrays view the store's "
                           "memory without a copy).")
        .def_property_readonly("target_id", [](const View& o) { return o.target_id; })
        .def_property_readonly("node_id", [](const View& o) { return o.node_id; })
        .def_property_readonly("tensor_id", [](const View& o) { return o.desc.tensor_id; })
        .def_property_readonly("coordinate_space", [](const View& o) { return o.coordinate_space; })
        .def_property_readonly("global_offset",
                               [](const View& o) { return ShapeTuple(o.target_box.origin()); })
        .def_property_readonly("local_shape",
                               [](const View& o) { return ShapeTuple(o.target_box.shape()); })
        .def_property_readonly("generation",
                               [](const View& o) {
                                   return pyb::make_tuple(o.desc.generation.base,
                                                          o.desc.generation.delta);
                               })
        .def_property_readonly("apply",
                               [](const View& o) { return std::string(ApplyModeName(o.desc.apply)); })
        .def_property_readonly("nnz", [](const View& o) { return o.desc.nnz; })
        .def_property_readonly("tile_shape", [](const View& o) { return ShapeTuple(o.desc.tile_shape); })
        .def_property_readonly("index_dtype",
                               [](const View& o) { return std::string(DTypeName(o.desc.index_dtype)); })
        .def_property_readonly("value_dtype",
                               [](const View& o) { return std::string(DTypeName(o.desc.value_dtype)); })
        .def_property_readonly("nbytes", &View::nbytes)
        .def_property_readonly("indices",
                               [](const Ptr& o) {
                                   const auto& d = o->desc;
                                   return Member(o, o->indices, d.index_dtype,
                                                 {Index(d.nnz), Index(d.rank())});
                               })
        .def_property_readonly("_values_raw",
                               [](const Ptr& o) {
                                   const auto& d = o->desc;
                                   return Member(o, o->values, d.value_dtype, {Index(d.nnz)});
                               })
        .def_property_readonly("tile_coords",
                               [](const Ptr& o) {
                                   const auto& d = o->desc;
                                   return Member(o, o->tile_coords, DType::kUInt32,
                                                 {Index(d.num_tiles), Index(d.rank())});
                               })
        .def_property_readonly("tile_ptr",
                               [](const Ptr& o) {
                                   return Member(o, o->tile_ptr, DType::kUInt64,
                                                 {Index(o->desc.num_tiles + 1)});
                               })
        .def("__repr__", [](const View& o) {
            return "<SparseObject " + o.target_id + " " + o.desc.tensor_id + " " +
                   o.target_box.ToString() + " nnz=" + std::to_string(o.desc.nnz) + " " +
                   std::string(ApplyModeName(o.desc.apply)) + ">";
        });
}

}  // namespace mooncake::sparse::py
