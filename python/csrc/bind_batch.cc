// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The batch calls of a step on the host (docs/design.md §9): encode_updates (codec
// EncodeUpdates) and apply_sparse_objects (codec ApplySparseBatch). Arguments are borrowed with
// the GIL held, then the whole batch runs without it.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "arrays.h"
#include "bind_common.h"
#include "codec/codec.h"
#include "sparse_object.h"

namespace mooncake::sparse::py {
namespace {

/// Every weight gets its object's entries; raises the first failure (after the rest applied).
void ApplySparseObjects(const pyb::list& weights, const pyb::list& objs, int num_threads) {
    if (weights.size() != objs.size()) {
        ThrowIfError(InvalidArgument(std::to_string(weights.size()) + " weights but " +
                                     std::to_string(objs.size()) + " objects"));
    }
    const std::size_t n = weights.size();
    std::vector<BorrowedArray> borrowed;
    std::vector<std::shared_ptr<SparseObjectView>> held;
    std::vector<ApplyItem> items;
    borrowed.reserve(n);
    held.reserve(n);
    items.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        const std::string what = "weights[" + std::to_string(i) + "]";
        if (!pyb::isinstance<SparseObjectView>(objs[i])) {
            ThrowIfError(InvalidArgument("objs[" + std::to_string(i) +
                                         "] is not a SparseObject (from read_sparse_objects)"));
        }
        held.push_back(objs[i].cast<std::shared_ptr<SparseObjectView>>());
        const SparseObjectView& o = *held.back();
        borrowed.push_back(BorrowView(weights[i], what.c_str(), /*writable=*/true));
        const BorrowedArray& w = borrowed.back();
        if (w.shape != o.desc.global_shape) {
            ThrowIfError(InvalidArgument(what + " shape " + internal::JoinIndices(w.shape) +
                                         " != object local shape " +
                                         internal::JoinIndices(o.desc.global_shape)));
        }
        const SourceDescriptor& d = o.desc;
        items.push_back({w.mutable_view(),
                         HostArray{d.index_dtype, {Index(d.nnz), Index(d.rank())}, o.indices},
                         HostArray{d.value_dtype, {Index(d.nnz)}, o.values}, d.apply});
    }
    std::vector<Status> results;
    {
        pyb::gil_scoped_release nogil;
        results = ApplySparseBatch(items, num_threads);
    }
    for (std::size_t i = 0; i < n; ++i) {
        if (!results[i].ok()) {
            ThrowIfError(results[i].WithContext("weights[" + std::to_string(i) + "]"));
        }
    }
}

/// (indices, values, value dtype name) per pair, or raises the first failure.
pyb::list EncodeUpdatesBound(const pyb::list& news, const pyb::list& olds, const std::string& apply,
                             double threshold, const pyb::object& tile_shape, int num_threads) {
    if (news.size() != olds.size()) {
        ThrowIfError(InvalidArgument(std::to_string(news.size()) + " new tensors but " +
                                     std::to_string(olds.size()) + " old ones"));
    }
    const std::size_t n = news.size();
    std::vector<BorrowedArray> borrowed;
    borrowed.reserve(2 * n);
    std::vector<EncodePair> pairs;
    pairs.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        const std::string a = "new[" + std::to_string(i) + "]", b = "old[" + std::to_string(i) + "]";
        borrowed.push_back(Borrow(news[i], a.c_str()));
        borrowed.push_back(Borrow(olds[i], b.c_str()));
        pairs.push_back({borrowed[2 * i].view(), borrowed[2 * i + 1].view()});
    }
    EncodeUpdateOptions opts;
    opts.apply = ValueOrThrow(ParseApplyMode(apply));
    opts.threshold = threshold;
    opts.tile_shape = OptShape(tile_shape, "tile_shape");
    opts.num_threads = num_threads;
    std::vector<Result<EncodedUpdate>> results;
    {
        pyb::gil_scoped_release nogil;
        results = EncodeUpdates(pairs, opts);
    }
    pyb::list out;
    for (std::size_t i = 0; i < n; ++i) {
        if (!results[i].ok()) {
            ThrowIfError(results[i].status().WithContext("pair " + std::to_string(i)));
        }
        EncodedUpdate& e = *results[i];
        const Index nnz = Index(e.nnz), rank = Index(e.rank);
        const DType it = e.index_dtype, vt = e.value_dtype;
        out.append(pyb::make_tuple(ToNumpy(std::move(e.indices), it, {nnz, rank}),
                                   ToNumpy(std::move(e.values), vt, {nnz}),
                                   std::string(DTypeName(vt))));
    }
    return out;
}

}  // namespace

void RegisterBatch(pyb::module_& m) {
    m.def("apply_sparse_objects", &ApplySparseObjects, pyb::arg("weights"), pyb::arg("objs"),
          pyb::arg("num_threads") = 0);
    m.def("encode_updates", &EncodeUpdatesBound, pyb::arg("news"), pyb::arg("olds"),
          pyb::arg("apply") = "overwrite", pyb::arg("threshold") = 0.0,
          pyb::arg("tile_shape") = pyb::none(), pyb::arg("num_threads") = 0);
}

}  // namespace mooncake::sparse::py
