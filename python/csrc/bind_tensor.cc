// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The tensor fast path (docs/design.md §5): `_TensorStore`, the TensorStore a backend's
// SparseService makes — over an in-process ObjectStore (executor LocalTensorStore) or in the node
// daemon (NodeTensorStore: CUDA tensors by IPC handle, host tensors through the client buffer /
// leased segments) — plus the header codec for interop tests.
//
// Tensors are taken without importing torch: CUDA tensors through DLPack (`__dlpack__(stream=)`,
// device type kDLCUDA) or `__cuda_array_interface__`, host tensors through arrays.h's Borrow
// (numpy, buffer protocol, CPU DLPack). A CUDA copy runs on the caller's stream (the Python layer
// passes torch's current stream), and every call returns with its copies complete.
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bind_common.h"
#include "executor/tensor_store.h"
#include "store.h"
#include "store/tensor_object.h"
#include "tensor_args.h"
#include "torch_arrays.h"

namespace mooncake::sparse::py {
namespace {

constexpr int kDLCudaDevice = 2;       // kDLCUDA
constexpr int kDLCudaHostDevice = 3;   // kDLCUDAHost
constexpr int kDLCudaManagedDevice = 13;

Result<DType> DTypeOfTypestr(const std::string& typestr) {
    if (typestr.size() < 3) return InvalidArgument("bad typestr '" + typestr + "'");
    const char kind = typestr[1];
    const int size = std::atoi(typestr.c_str() + 2);
    if (typestr[0] == '>' && size > 1) return InvalidArgument("big-endian arrays are not supported");
    switch (kind) {
        case 'b': if (size == 1) return DType::kBool; break;
        case 'i':
            if (size == 1) return DType::kInt8;
            if (size == 2) return DType::kInt16;
            if (size == 4) return DType::kInt32;
            if (size == 8) return DType::kInt64;
            break;
        case 'u':
            if (size == 1) return DType::kUInt8;
            if (size == 2) return DType::kUInt16;
            if (size == 4) return DType::kUInt32;
            if (size == 8) return DType::kUInt64;
            break;
        case 'f':
            if (size == 2) return DType::kFloat16;
            if (size == 4) return DType::kFloat32;
            if (size == 8) return DType::kFloat64;
            break;
        default: break;
    }
    return InvalidArgument("unsupported __cuda_array_interface__ typestr '" + typestr + "'");
}

const char* NumpyFormatOf(DType t) {
    switch (t) {
        case DType::kBool: return "?";
        case DType::kUInt8: return "u1";
        case DType::kInt8: return "i1";
        case DType::kUInt16: return "u2";
        case DType::kInt16: return "i2";
        case DType::kUInt32: return "u4";
        case DType::kInt32: return "i4";
        case DType::kUInt64: return "u8";
        case DType::kInt64: return "i8";
        case DType::kFloat16: return "f2";
        case DType::kBFloat16: return "u2";  // bit pattern; re-viewed in Python
        case DType::kFloat32: return "f4";
        case DType::kFloat64: return "f8";
        case DType::kFloat8E4M3:
        case DType::kFloat8E5M2: return "u1";
    }
    return "u1";
}

/// A caller tensor as the core sees it, plus what keeps its memory alive.

/// Tensors through DLPack. A CUDA tensor's copy runs on `stream` (a cudaStream_t value: torch's
/// current stream, which the Python layer passes), else on the legacy default stream — either
/// way after the producer's pending work there. The capsule is taken without a stream argument:
/// asking the producer to make our stream wait on its current one is a no-op when they are the
/// same stream, and costs a Python-level stream object and an event per tensor in torch.
ParsedTensor FromCapsule(const pyb::object& capsule, const std::string& what,
                         const pyb::object& stream, const pyb::handle& producer);

ParsedTensor FromDLPack(const pyb::handle& obj, const std::string& what, const pyb::object& stream) {
    return FromCapsule(obj.attr("__dlpack__")(), what, stream, obj);
}

/// A legacy DLPack capsule ("dltensor"), consumed here: from __dlpack__(), or handed over by the
/// Python layer (torch's _to_dlpack, which skips __dlpack__'s Python-level checks: a batch of
/// hundreds of tensors would otherwise spend a quarter of its time there).
ParsedTensor FromCapsule(const pyb::object& capsule, const std::string& what,
                         const pyb::object& stream, const pyb::handle& producer) {
    PyObject* cap = capsule.ptr();
    if (!PyCapsule_IsValid(cap, "dltensor")) {
        ThrowIfError(InvalidArgument(what + ": not an unconsumed DLPack capsule"));
    }
    auto [managed, owner] = ConsumeDLPack(cap);
    const DLTensor& t = managed->dl_tensor;
    const int type = t.device.device_type;
    const bool cuda = type == kDLCudaDevice || type == kDLCudaManagedDevice;
    if (!cuda && type != 1 && type != kDLCudaHostDevice) {
        ThrowIfError(Unimplemented(what + " lives on DLPack device type " + std::to_string(type) +
                                   "; tensors must be in host or CUDA memory"));
    }
    CudaStream copy_stream = kCudaLegacyStream;
    if (cuda && !stream.is_none()) copy_stream = stream.cast<std::uintptr_t>();
    ParsedTensor out;
    out.ref.memory = cuda ? TensorMemory::kCuda : TensorMemory::kHost;
    auto dtype = DTypeOfDLPack(t.dtype);
    if (!dtype.ok()) throw StatusError(dtype.status().WithContext(what));
    out.ref.dtype = *dtype;
    for (int d = 0; d < t.ndim; ++d) out.ref.shape.push_back(t.shape[d]);
    if (t.strides != nullptr) {
        for (int d = 0; d < t.ndim; ++d) out.ref.strides.push_back(t.strides[d]);
    }
    std::uint64_t elements = 1;
    for (int d = 0; d < t.ndim; ++d) elements *= static_cast<std::uint64_t>(std::max<std::int64_t>(t.shape[d], 0));
    const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(t.data) + t.byte_offset;
    const std::uint64_t bytes = elements * DTypeSize(out.ref.dtype);
    if (cuda) {
        out.ref.device = {address, bytes, t.device.device_id};
        out.ref.stream = copy_stream;
    } else {
        out.ref.host = reinterpret_cast<std::byte*>(address);
        out.ref.host_bytes = bytes;
        out.ref.writable = true;  // DLPack < 1.0 has no read-only flag
    }
    out.keepalive = KeepDLPack(std::move(owner), producer, cap);
    return out;
}

ParsedTensor FromCudaArrayInterface(const pyb::handle& obj, const std::string& what,
                                    const pyb::object& stream) {
    pyb::dict cai = obj.attr("__cuda_array_interface__");
    ParsedTensor out;
    out.ref.memory = TensorMemory::kCuda;
    out.ref.dtype = ValueOrThrow(DTypeOfTypestr(pyb::str(cai["typestr"])));
    for (auto e : pyb::tuple(cai["shape"])) out.ref.shape.push_back(e.cast<Index>());
    const std::size_t item = DTypeSize(out.ref.dtype);
    if (cai.contains("strides") && !cai["strides"].is_none()) {
        for (auto e : pyb::tuple(cai["strides"])) {
            const auto bytes = e.cast<std::int64_t>();
            if (bytes % static_cast<std::int64_t>(item) != 0) {
                ThrowIfError(InvalidArgument(what + " must be C-contiguous (odd byte strides)"));
            }
            out.ref.strides.push_back(bytes / static_cast<std::int64_t>(item));
        }
    }
    pyb::tuple data = cai["data"];
    const auto ptr = data[0].cast<std::uintptr_t>();
    std::uint64_t elements = 1;
    for (Index e : out.ref.shape) elements *= static_cast<std::uint64_t>(std::max<Index>(e, 0));
    int device = -1;
    if (ptr != 0) {
        auto info = cuda::DescribePointer(reinterpret_cast<const void*>(ptr));
        if (!info.ok()) throw StatusError(info.status().WithContext(what));
        device = info->device;
    }
    out.ref.device = {ptr, elements * item, device};
    if (!stream.is_none()) {
        out.ref.stream = stream.cast<std::uintptr_t>();
    } else if (cai.contains("stream") && !cai["stream"].is_none()) {
        out.ref.stream = cai["stream"].cast<std::uintptr_t>();  // 1 = legacy, 2 = per-thread
    }
    out.keepalive = KeepObject(pyb::reinterpret_borrow<pyb::object>(obj));
    return out;
}

/// Any supported tensor. Destinations must be real arrays (never a temporary copy).
ParsedTensor ParseTensor(const pyb::handle& obj, const std::string& what, bool destination,
                         const pyb::object& stream) {
    if (obj.is_none()) ThrowIfError(InvalidArgument(what + " is None"));
    if (PyCapsule_CheckExact(obj.ptr())) {
        return FromCapsule(pyb::reinterpret_borrow<pyb::object>(obj), what, stream, obj);
    }
    // torch: its C++ exporter, without __dlpack__'s Python-level checks (a CUDA source that is
    // not contiguous is made so on torch's stream first; a tensor with a lazy bit goes on below).
    if (pyb::object capsule = TorchCapsule(obj.ptr(), !destination)) {
        return FromCapsule(capsule, what, stream, obj);
    }
    if (pyb::isinstance<pyb::array>(obj)) {
        // numpy: the buffer path keeps its read-only flag (DLPack export refuses read-only).
    } else if (pyb::hasattr(obj, "__dlpack_device__")) {
        pyb::tuple dev = obj.attr("__dlpack_device__")();
        const int type = dev[0].cast<int>();
        if (type != 1 && type != kDLCudaHostDevice && type != kDLCudaDevice &&
            type != kDLCudaManagedDevice) {
            ThrowIfError(Unimplemented(what + " lives on DLPack device type " + std::to_string(type) +
                                       "; tensors must be in host or CUDA memory"));
        }
        return FromDLPack(ResolveLazyBits(obj, what, destination), what, stream);
    } else if (pyb::hasattr(obj, "__cuda_array_interface__")) {
        return FromCudaArrayInterface(obj, what, stream);
    }
    if (destination && !pyb::isinstance<pyb::array>(obj) && !pyb::hasattr(obj, "__dlpack__")) {
        ThrowIfError(InvalidArgument(what + " must be a numpy array or a tensor (got " +
                                     std::string(pyb::str(pyb::type::handle_of(obj))) + ")"));
    }
    // Host memory: numpy, buffer protocol. Borrowed with its strides, never copied (the store
    // copies from or into the strided layout itself); a big-endian source comes back swapped.
    BorrowedArray a = BorrowView(obj, what.c_str(), destination);
    ParsedTensor out;
    out.ref = TensorRef::Host(a.dtype, a.shape, {a.data, a.nbytes});
    out.ref.strides = a.strides;
    out.ref.writable = a.writable;
    out.keepalive = a.keepalive;
    return out;
}

std::vector<ParsedTensor> ParseTensors(const std::vector<std::string>& keys,
                                       const pyb::sequence& tensors, const pyb::sequence& streams,
                                       bool destination) {
    ThrowIfError(internal::CheckPerKey(keys.size(), pyb::len(tensors), "tensors"));
    ThrowIfError(internal::CheckPerKey(keys.size(), pyb::len(streams), "streams"));
    std::vector<ParsedTensor> out;
    out.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        std::string what = (destination ? "destination tensor " : "tensor ") +
                           (keys.size() > 1 ? std::to_string(i) + " " : std::string()) + "'" +
                           keys[i] + "'";
        out.push_back(ParseTensor(tensors[i], what, destination,
                                  pyb::reinterpret_borrow<pyb::object>(streams[i])));
    }
    return out;
}

pyb::array HostTensorToNumpy(HostTensor&& t) {
    std::vector<pyb::ssize_t> dims(t.shape.begin(), t.shape.end());
    pyb::dtype dt(NumpyFormatOf(t.dtype));
    if (t.data.data() == nullptr) return pyb::array(dt, dims, {});
    auto* holder = new HostBuffer(std::move(t.data));
    pyb::capsule base(holder, [](void* p) { delete static_cast<HostBuffer*>(p); });
    return pyb::array(dt, dims, {}, holder->data(), base);
}

pyb::dict HeaderDict(const TensorHeader& h) {
    pyb::dict d;
    d["dtype"] = std::string(DTypeName(h.dtype));
    d["upstream_dtype"] = ToUpstreamDType(h.dtype);
    d["shape"] = ShapeTuple(h.local_shape);
    d["global_shape"] = ShapeTuple(h.global_shape);
    d["layout"] = h.layout_kind == TensorLayoutKind::kFull ? "full" : "shard";
    d["data_offset"] = h.data_offset;
    d["nbytes"] = h.data_bytes;
    pyb::list axes;
    for (const TensorLayoutAxis& a : h.axes) {
        pyb::dict ad;
        ad["kind"] = a.kind;
        ad["axis_index"] = a.axis_index;
        ad["shard_rank"] = a.shard_rank;
        ad["shard_count"] = a.shard_count;
        ad["split_dim"] = a.split_dim;
        axes.append(ad);
    }
    d["axes"] = axes;
    return d;
}

PutMode ParseMode(const std::string& mode) {
    if (mode == "create") return PutMode::kCreate;
    if (mode == "upsert") return PutMode::kUpsert;
    ThrowIfError(InvalidArgument("mode must be 'create' or 'upsert', got '" + mode + "'"));
    return PutMode::kCreate;
}

class PyTensorStore {
public:
    /// The tensor store of `backend`'s service; it shares what it works on with the backend.
    PyTensorStore(PyStore& backend, std::uint64_t pinned_quota_bytes) {
        LocalTensorStoreOptions options;
        options.pinned_quota_bytes = pinned_quota_bytes;
        store_ = backend.service().MakeTensorStore(options);
    }

    void Put(const std::vector<std::string>& keys, const pyb::sequence& tensors,
             const pyb::sequence& streams, const std::string& mode, bool hard_pin) {
        const TensorPutOptions options{ParseMode(mode), hard_pin};
        std::vector<ParsedTensor> parsed = ParseTensors(keys, tensors, streams, false);
        std::vector<TensorRef> refs;
        refs.reserve(parsed.size());
        for (const ParsedTensor& p : parsed) refs.push_back(p.ref);
        Status s;
        {
            pyb::gil_scoped_release nogil;
            s = store_->Put(keys, refs, options);
        }
        ThrowIfError(s);
    }

    void GetInto(const std::vector<std::string>& keys, const pyb::sequence& tensors,
                 const pyb::sequence& streams, const std::vector<Shape>& box_origins) {
        std::vector<ParsedTensor> parsed = ParseTensors(keys, tensors, streams, true);
        std::vector<TensorRef> refs;
        refs.reserve(parsed.size());
        for (const ParsedTensor& p : parsed) refs.push_back(p.ref);
        Status s;
        {
            pyb::gil_scoped_release nogil;
            s = store_->GetInto(keys, refs, box_origins);
        }
        ThrowIfError(s);
    }

    pyb::tuple Get(const std::string& key) {
        Result<HostTensor> r = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            r = store_->Get(key);
        }
        HostTensor t = ValueOrThrow(std::move(r));
        const std::string dtype(DTypeName(t.dtype));
        return pyb::make_tuple(dtype, HostTensorToNumpy(std::move(t)));
    }

    pyb::dict Stat(const std::string& key) {
        Result<TensorInfo> r = Internal("unset");
        {
            pyb::gil_scoped_release nogil;
            r = store_->Stat(key);
        }
        TensorInfo info = ValueOrThrow(std::move(r));
        pyb::dict d = HeaderDict(info.header);
        d["version"] = info.version;
        d["hard_pinned"] = info.hard_pinned;
        return d;
    }

    pyb::dict Capabilities() const {
        const TensorCapabilities c = store_->Capabilities();
        pyb::dict d;
        d["tensor_backend"] = c.backend;
        d["cuda_available"] = c.cuda_available;
        d["cuda_ipc_available"] = c.cuda_ipc_available;
        d["cuda_devices"] = c.cuda_devices;
        d["cuda_detail"] = c.cuda_detail;
        d["pinned_quota_bytes"] = c.host.pinned_quota_bytes;
        d["pinned_bytes"] = c.host.pinned_bytes;
        d["pinned_cached_bytes"] = c.host.pinned_cached_bytes;
        d["pageable_bytes"] = c.host.pageable_bytes;
        d["pin_failures"] = c.host.pin_failures;
        return d;
    }

    pyb::dict Stats() const {
        const TensorStoreStats s = store_->Stats();
        pyb::dict d;
        d["tensors_put"] = s.tensors_put;
        d["bytes_put"] = s.bytes_put;
        d["tensors_read"] = s.tensors_read;
        d["bytes_read"] = s.bytes_read;
        d["cuda_copies"] = s.cuda_copies;
        d["pinned_copies"] = s.pinned_copies;
        d["pageable_copies"] = s.pageable_copies;
        d["pageable_chunks"] = s.pageable_chunks;
        return d;
    }

private:
    std::unique_ptr<TensorStore> store_;
};

}  // namespace

ParsedTensor ParseTensorArg(const pyb::handle& obj, const std::string& what, bool destination,
                            const pyb::object& stream) {
    return ParseTensor(obj, what, destination, stream);
}

void RegisterTensor(pyb::module_& m) {
    pyb::class_<PyTensorStore>(m, "_TensorStore",
                               "The tensor fast path over a backend's object store.")
        .def(pyb::init<PyStore&, std::uint64_t>(), pyb::arg("backend"),
             pyb::arg("pinned_quota_bytes") = 0)
        .def("put", &PyTensorStore::Put, pyb::arg("keys"), pyb::arg("tensors"),
             pyb::arg("streams"), pyb::arg("mode") = "create", pyb::arg("hard_pin") = true)
        .def("get_into", &PyTensorStore::GetInto, pyb::arg("keys"), pyb::arg("tensors"),
             pyb::arg("streams"), pyb::arg("box_origins") = std::vector<Shape>{})
        .def("get", &PyTensorStore::Get, pyb::arg("key"))
        .def("stat", &PyTensorStore::Stat, pyb::arg("key"))
        .def("capabilities", &PyTensorStore::Capabilities)
        .def("stats", &PyTensorStore::Stats);

    m.def(
        "encode_tensor_header",
        [](const std::string& dtype, const pyb::object& shape) {
            const DType t = ValueOrThrow(ParseDType(dtype));
            TensorHeader h = ValueOrThrow(MakeFullTensorHeader(t, ShapeArg(shape, "shape")));
            std::string out(kTensorHeaderBytes, '\0');
            EncodeTensorHeader(h, std::span<std::byte, kTensorHeaderBytes>(
                                      reinterpret_cast<std::byte*>(out.data()), kTensorHeaderBytes));
            return pyb::bytes(out);
        },
        pyb::arg("dtype"), pyb::arg("shape"),
        "The 304-byte header upstream Mooncake's put_tensor writes for a whole tensor.");
    m.def(
        "decode_tensor_header",
        [](const pyb::bytes& data, std::optional<std::uint64_t> object_bytes) {
            const std::string s = data;
            const auto span = std::span<const std::byte>(
                reinterpret_cast<const std::byte*>(s.data()), s.size());
            return HeaderDict(ValueOrThrow(DecodeTensorHeader(span, object_bytes.value_or(s.size()))));
        },
        pyb::arg("data"), pyb::arg("object_bytes") = pyb::none(),
        "Parses a tensor object's header (`data` holds at least its first 304 bytes; "
        "object_bytes is the whole object's size, default len(data)).");
    m.def("upstream_dtype_code", [](const std::string& dtype) {
        return ToUpstreamDType(ValueOrThrow(ParseDType(dtype)));
    });
    m.def("dtype_of_upstream_code", [](std::int32_t code) {
        return std::string(DTypeName(ValueOrThrow(FromUpstreamDType(code))));
    });
    m.attr("TENSOR_HEADER_BYTES") = kTensorHeaderBytes;
}

}  // namespace mooncake::sparse::py
