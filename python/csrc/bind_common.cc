// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "bind_common.h"

#include "tensor_args.h"
#include "torch_arrays.h"
#include "transport/host_copy.h"

#include <algorithm>
#include <iterator>

#include <pybind11/stl.h>

namespace mooncake::sparse::py {

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
    PyObject* const seq = obj.ptr();
    if (PyTuple_Check(seq) || PyList_Check(seq)) {
        // The usual forms, by index (a target's offset and shape, for every target of a batch).
        // The size is read again each time: an element's __index__ may change a list.
        s.reserve(static_cast<std::size_t>(PySequence_Fast_GET_SIZE(seq)));
        try {
            for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
                const auto e = pyb::reinterpret_borrow<pyb::object>(PySequence_Fast_GET_ITEM(seq, i));
                s.push_back(e.cast<Index>());
            }
        } catch (const pyb::cast_error&) {
            ThrowIfError(InvalidArgument(std::string(what) + " must be a sequence of ints"));
        }
        return s;
    }
    if (pyb::isinstance<pyb::str>(obj) || !pyb::hasattr(obj, "__iter__")) {
        ThrowIfError(InvalidArgument(std::string(what) + " must be a sequence of ints"));
    }
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
    // The field names, interned once (kept for the life of the process): the lookups of every
    // target of a batch then make no strings.
    enum Field { kTargetId, kNodeId, kTensorId, kPlacement, kGlobalOffset, kLocalShape };
    static constexpr const char* kNames[] = {"target_id", "node_id", "tensor_id", "placement",
                                             "global_offset", "local_shape"};
    static PyObject* const* const kKeys = [] {
        static PyObject* keys[std::size(kNames)];
        for (std::size_t i = 0; i < std::size(kNames); ++i) {
            keys[i] = PyUnicode_InternFromString(kNames[i]);
        }
        return keys;
    }();
    auto get = [&](Field f) -> pyb::object {
        // One lookup (hasattr and attr would make two per field of every target).
        PyObject* v = kKeys[f] != nullptr ? PyObject_GetAttr(obj.ptr(), kKeys[f])
                                          : PyObject_GetAttrString(obj.ptr(), kNames[f]);
        if (v == nullptr) {
            PyErr_Clear();
            ThrowIfError(InvalidArgument(std::string("target lacks attribute '") + kNames[f] +
                                         "'"));
        }
        return pyb::reinterpret_steal<pyb::object>(v);
    };
    // Exactly str: pyb::str() would turn None into the id "None".
    auto id = [&](Field f) -> std::string {
        pyb::object v = get(f);
        if (!pyb::isinstance<pyb::str>(v)) {
            ThrowIfError(InvalidArgument(std::string("target ") + kNames[f] + " must be a str, got " +
                                         std::string(pyb::repr(v))));
        }
        return v.cast<std::string>();
    };
    auto target = TargetDescriptor::Make(
        id(kTargetId), id(kNodeId), id(kTensorId),
        AxesFromDict(get(kPlacement), "target placement"),
        ShapeArg(get(kGlobalOffset), "global_offset"), ShapeArg(get(kLocalShape), "local_shape"));
    return ValueOrThrow(std::move(target));
}

std::vector<TargetDescriptor> TargetsFrom(const pyb::iterable& targets) {
    std::vector<TargetDescriptor> out;
    if (pyb::isinstance<pyb::list>(targets) || pyb::isinstance<pyb::tuple>(targets)) {
        out.reserve(pyb::len(targets));
    }
    for (auto t : targets) out.push_back(TargetFrom(t));
    return out;
}

TargetsArg TargetsArgFrom(const pyb::handle& targets) {
    TargetsArg out;
    if (pyb::isinstance<TargetBatch>(targets)) {
        out.batch = targets.cast<std::shared_ptr<TargetBatch>>();
        out.targets = out.batch->targets;
        return out;
    }
    if (!pyb::isinstance<pyb::iterable>(targets) || pyb::isinstance<pyb::str>(targets)) {
        ThrowIfError(InvalidArgument("targets must be an iterable of Target, got " +
                                     std::string(pyb::repr(targets))));
    }
    out.converted = TargetsFrom(pyb::reinterpret_borrow<pyb::iterable>(targets));
    out.targets = out.converted;
    return out;
}

bool IsCudaArray(const pyb::handle& obj) {
    if (PyCapsule_CheckExact(obj.ptr())) {
        // An unconsumed DLPack capsule (torch's C++ exporter, handed over by the Python layer).
        if (!PyCapsule_IsValid(obj.ptr(), "dltensor")) return false;
        const auto* m = static_cast<const DLManagedTensor*>(PyCapsule_GetPointer(obj.ptr(), "dltensor"));
        return m != nullptr && m->dl_tensor.device.device_type == kDLCUDA;
    }
    if (obj.is_none() || pyb::isinstance<pyb::array>(obj) || !pyb::hasattr(obj, "__dlpack_device__")) {
        return false;
    }
    try {
        const auto dev = obj.attr("__dlpack_device__")().cast<pyb::tuple>();
        return dev.size() >= 1 && dev[0].cast<int>() == static_cast<int>(kDLCUDA);
    } catch (const pyb::error_already_set&) {
        return false;
    }
}

namespace {

DeviceMember ParseDeviceMember(const pyb::handle& obj, const char* what) {
    ParsedTensor t = ParseTensorArg(obj, what, false, pyb::none());
    if (t.ref.memory != TensorMemory::kCuda) {
        ThrowIfError(InvalidArgument(std::string(what) + " is not a CUDA array"));
    }
    if (!IsCContiguous(t.ref.shape, t.ref.strides)) {
        ThrowIfError(InvalidArgument(std::string(what) + " on the GPU must be C-contiguous"));
    }
    return {t.ref.dtype, t.ref.shape, t.ref.device.address, t.ref.device.device, t.ref.device.bytes,
            std::move(t.keepalive)};
}

}  // namespace

ParsedPut ParsePut(const std::string& tensor_id, const pyb::object& global_shape,
                   const pyb::object& indices, const pyb::object& values,
                   const pyb::object& source_placement,
                   const std::optional<std::string>& placement_policy,
                   std::pair<std::uint64_t, std::uint64_t> generation, const std::string& apply,
                   const pyb::object& tile_shape, const std::string& duplicates,
                   const pyb::object& global_offset, const pyb::object& local_shape,
                   bool hard_pin, int num_threads) {
    ParsedPut p;
    PutSparseRequest& req = p.request;
    req.tensor_id = tensor_id;
    req.global_shape = ShapeArg(global_shape, "global_shape");
    req.global_offset = OptShape(global_offset, "global_offset");
    req.local_shape = OptShape(local_shape, "local_shape");
    // torch members as capsules of its C++ exporter (CUDA ones made contiguous on torch's
    // stream): told apart and parsed without Python-level calls.
    const auto member = [](const pyb::object& m) {
        pyb::object capsule = TorchCapsule(m.ptr(), true);
        return capsule ? capsule : m;
    };
    const pyb::object index_member = member(indices), value_member = member(values);
    if (IsCudaArray(index_member)) {
        p.device_indices = ParseDeviceMember(index_member, "indices");
    } else {
        p.indices = Borrow(index_member, "indices");
        req.indices = p.indices.view();
    }
    if (IsCudaArray(value_member)) {
        p.device_values = ParseDeviceMember(value_member, "values");
    } else {
        p.values = Borrow(value_member, "values");
        req.values = p.values.view();
    }
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
        ThrowIfError(
            InvalidArgument("duplicates must be 'error' or 'sum', got '" + duplicates + "'"));
    }
    req.encode.num_threads = num_threads;
    req.hard_pin = hard_pin;
    return p;
}

pyb::dict CommitDict(const std::string& source_ref, bool created, std::uint64_t nnz,
                     std::uint64_t bytes) {
    // A step commits tens of thousands of updates: the keys are made once.
    static PyObject* const* const keys = [] {
        static PyObject* k[4];
        const char* names[4] = {"source_ref", "created", "nnz", "bytes"};
        for (int i = 0; i < 4; ++i) {
            k[i] = PyUnicode_InternFromString(names[i]);
            if (k[i] == nullptr) throw pyb::error_already_set();
        }
        return k;
    }();
    pyb::dict out;
    const pyb::object values[4] = {pyb::str(source_ref), pyb::bool_(created), pyb::int_(nnz),
                                   pyb::int_(bytes)};
    for (int i = 0; i < 4; ++i) {
        if (PyDict_SetItem(out.ptr(), keys[i], values[i].ptr()) != 0) {
            throw pyb::error_already_set();
        }
    }
    return out;
}

ReadOptions ParseReadOptions(const std::string& strategy, std::int64_t read_coalesce_gap,
                             int num_threads) {
    ReadOptions opts;
    if (strategy == "sparse") {
        opts.strategy = ReadStrategy::kSparseRanges;
    } else if (strategy == "full_source") {
        opts.strategy = ReadStrategy::kFullSourcePerTarget;
    } else {
        ThrowIfError(InvalidArgument("strategy must be 'sparse' or 'full_source'"));
    }
    if (read_coalesce_gap < -1) ThrowIfError(InvalidArgument("read_coalesce_gap must be >= -1"));
    if (num_threads < 0) ThrowIfError(InvalidArgument("num_threads must be >= 0"));
    opts.plan.read_coalesce_gap = read_coalesce_gap;
    opts.num_threads = num_threads;
    return opts;
}

pyb::dict MetricsDict(const std::vector<std::pair<std::string, double>>& items) {
    pyb::dict d;
    for (const auto& [k, v] : items) {
        if (k.ends_with("_seconds")) {
            d[pyb::str(k)] = v;
        } else {
            d[pyb::str(k)] = static_cast<std::uint64_t>(v);
        }
    }
    return d;
}

pyb::tuple StepManifestTuple(StepManifest m,
                             std::shared_ptr<const std::vector<SourceDescriptor>>* array) {
    return pyb::make_tuple(SourcesList(std::move(m.sources), array),
                           pyb::cast(std::move(m.unchanged)), m.sealed);
}

pyb::list SourcesList(std::shared_ptr<const std::vector<SourceDescriptor>> all) {
    // Each SourceInfo shares the ownership of the array (an aliasing holder), so the array
    // lives while any of them does. SourceInfo is read-only: the array is never written.
    auto writable = std::const_pointer_cast<std::vector<SourceDescriptor>>(all);
    pyb::list out(all->size());
    for (std::size_t i = 0; i < all->size(); ++i) {
        out[i] = pyb::cast(std::shared_ptr<SourceDescriptor>(writable, &(*writable)[i]));
    }
    return out;
}

pyb::list SourcesList(std::vector<SourceDescriptor> sources,
                      std::shared_ptr<const std::vector<SourceDescriptor>>* array) {
    auto all = std::make_shared<const std::vector<SourceDescriptor>>(std::move(sources));
    if (array != nullptr) *array = all;
    return SourcesList(std::move(all));
}

ManifestArg ManifestFrom(const pyb::list& sources) {
    ManifestArg out;
    const std::size_t n = sources.size();
    // The list holds its entries while this runs (under the GIL); the first entry's holder
    // keeps a viewed array alive after it.
    std::vector<const SourceDescriptor*> entries(n);
    std::shared_ptr<SourceDescriptor> first;
    bool viewed = n > 0;
    for (std::size_t i = 0; i < n; ++i) {
        pyb::handle item = sources[i];
        if (!pyb::isinstance<SourceDescriptor>(item)) {
            ThrowIfError(InvalidArgument("manifest entries must be SourceInfo, got " +
                                         std::string(pyb::repr(item))));
        }
        auto held = item.cast<std::shared_ptr<SourceDescriptor>>();
        entries[i] = held.get();
        if (i == 0) {
            first = std::move(held);
            continue;
        }
        // One array, in its order: every entry lies right after the one before and shares the
        // first one's owner.
        viewed = viewed && entries[i] == entries[i - 1] + 1 && !first.owner_before(held) &&
                 !held.owner_before(first);
    }
    if (viewed) {
        out.sources = {first.get(), n};
        out.owner = std::move(first);
        return out;
    }
    out.copied.reserve(n);
    for (const SourceDescriptor* d : entries) out.copied.push_back(*d);
    out.sources = out.copied;
    return out;
}

pyb::object GenerationOrNone(const std::optional<Generation>& g) {
    if (!g) return pyb::none();
    return pyb::make_tuple(g->base, g->delta);
}

}  // namespace mooncake::sparse::py
