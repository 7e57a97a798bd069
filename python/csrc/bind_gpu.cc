// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The GPU codec (src/cuda) from Python: encode_update of CUDA tensors on the device, apply of a
// target-local object to a CUDA weight in place, and target objects uploaded to device memory.
// Device results are `_DeviceArray`s: they own their memory and export it through DLPack
// (torch.from_dlpack / cupy.from_dlpack take them without a copy, bfloat16 included).
// Built only when the extension is compiled with the CUDA codec (HAS_GPU_CODEC); the module
// loads everywhere (static cudart), and gpu_available() says whether a device is usable.
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "bind_common.h"
#include "sparse_object.h"
#include "tensor_args.h"

#if MCS_PY_WITH_GPU_CODEC
#include "cuda/gpu_codec.h"
#endif

namespace mooncake::sparse::py {

#if MCS_PY_WITH_GPU_CODEC
namespace {

/// Device memory owned by Python: one member of an encoded update or an uploaded object.
struct DeviceArray {
    DType dtype = DType::kUInt8;
    Shape shape;
    cuda::DevicePtr ptr;
    std::uint64_t bytes = 0;
    std::shared_ptr<void> owner;  ///< Keeps the allocation (shared by sibling arrays).

    cuda::DeviceArray view() const { return {dtype, shape, ptr, bytes, {}}; }
};

/// The DLPack export of a DeviceArray: the capsule's DLManagedTensor holds a reference.
struct Export {
    DLManagedTensor managed{};
    std::vector<std::int64_t> shape;
    std::shared_ptr<void> owner;
};

pyb::capsule ToCapsule(const DeviceArray& a) {
    auto* e = new Export;
    e->shape.assign(a.shape.begin(), a.shape.end());
    e->owner = a.owner;
    DLTensor& t = e->managed.dl_tensor;
    t.data = reinterpret_cast<void*>(a.ptr.address);
    t.device = {kDLCUDA, a.ptr.device};
    t.ndim = static_cast<std::int32_t>(e->shape.size());
    t.dtype = ValueOrThrow(DLPackTypeOf(a.dtype));
    t.shape = e->shape.data();
    t.strides = nullptr;  // C-contiguous
    t.byte_offset = 0;
    e->managed.manager_ctx = e;
    e->managed.deleter = [](DLManagedTensor* m) { delete static_cast<Export*>(m->manager_ctx); };
    // A capsule that nobody consumed frees its tensor; a consumed one ("used_dltensor") is the
    // consumer's to free.
    return pyb::capsule(&e->managed, "dltensor", [](PyObject* cap) {
        if (PyCapsule_IsValid(cap, "dltensor")) {
            auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
            m->deleter(m);
        }
    });
}

DeviceArray Wrap(cuda::DeviceBuffer&& buffer, DType dtype, Shape shape) {
    DeviceArray a;
    a.dtype = dtype;
    a.shape = std::move(shape);
    a.ptr = buffer.ptr();
    a.bytes = buffer.bytes();
    a.owner = std::make_shared<cuda::DeviceBuffer>(std::move(buffer));
    return a;
}

cuda::DeviceArray CudaArg(const ParsedTensor& p, const std::string& what) {
    if (p.ref.memory != TensorMemory::kCuda) {
        ThrowIfError(InvalidArgument(what + " is not a CUDA tensor"));
    }
    // Strides travel as they are: apply writes a strided weight view in place (a TP slice of
    // a fused parameter), and the codec refuses them where it reads flat memory.
    return {p.ref.dtype, p.ref.shape, {p.ref.device.address, p.ref.device.device},
            p.ref.device.bytes, p.ref.strides};
}

/// Uploads a host member to `device` as a new DeviceArray.
DeviceArray Upload(std::span<const std::byte> bytes, DType dtype, Shape shape, int device,
                   std::uintptr_t stream) {
    auto buf = cuda::DeviceBuffer::Allocate(bytes.size(), device, stream);
    if (!buf.ok()) throw StatusError(buf.status());
    ThrowIfError(cuda::CopyToDevice(bytes, buf->ptr(), stream));
    return Wrap(std::move(buf).value(), dtype, std::move(shape));
}

}  // namespace

void RegisterGpu(pyb::module_& m) {
    pyb::class_<DeviceArray>(m, "_DeviceArray", "A C-contiguous array in CUDA memory (DLPack).")
        .def_property_readonly("dtype", [](const DeviceArray& a) { return std::string(DTypeName(a.dtype)); })
        .def_property_readonly("shape", [](const DeviceArray& a) { return ShapeTuple(a.shape); })
        .def_property_readonly("nbytes", [](const DeviceArray& a) { return a.bytes; })
        .def_property_readonly("device", [](const DeviceArray& a) { return a.ptr.device; })
        .def_property_readonly("data_ptr", [](const DeviceArray& a) { return a.ptr.address; })
        .def("__dlpack__",
             [](const DeviceArray& a, const pyb::object& /*stream*/, const pyb::kwargs&) {
                 // Written on the producing call's stream and synchronized before it returned.
                 return ToCapsule(a);
             },
             pyb::arg("stream") = pyb::none())
        .def("__dlpack_device__",
             [](const DeviceArray& a) { return pyb::make_tuple(int(kDLCUDA), a.ptr.device); })
        .def("to_host",
             [](const DeviceArray& a) {
                 std::vector<std::byte> host(a.bytes);
                 {
                     pyb::gil_scoped_release nogil;
                     ThrowIfError(cuda::CopyToHost(a.ptr, host, 0));
                 }
                 return ToNumpy(std::move(host), a.dtype, a.shape);
             },
             "A numpy copy (bfloat16 as uint16 bits).");

    m.def("gpu_available", [] { return cuda::Available(); },
          "True when a CUDA device is usable by the GPU codec.");

    m.def(
        "_gpu_encode_update",
        [](const pyb::object& new_values, const pyb::object& old_values, const std::string& apply,
           double threshold, const pyb::object& tile_shape, const pyb::object& stream) {
            ParsedTensor nw = ParseTensorArg(new_values, "new", false, stream);
            ParsedTensor od = ParseTensorArg(old_values, "old", false, stream);
            cuda::GpuEncodeOptions opt;
            opt.apply = ValueOrThrow(ParseApplyMode(apply));
            opt.threshold = threshold;
            opt.tile_shape = OptShape(tile_shape, "tile_shape");
            opt.stream = nw.ref.stream;
            const cuda::DeviceArray n = CudaArg(nw, "new");
            const cuda::DeviceArray o = CudaArg(od, "old");
            Result<cuda::GpuEncoded> r = Internal("unset");
            {
                pyb::gil_scoped_release nogil;
                r = cuda::EncodeUpdate(n, o, opt);
            }
            cuda::GpuEncoded e = ValueOrThrow(std::move(r));
            const Index nnz = Index(e.nnz), rank = Index(e.rank);
            DeviceArray idx = Wrap(std::move(e.indices), e.index_dtype, {nnz, rank});
            DeviceArray val = Wrap(std::move(e.values), e.value_dtype, {nnz});
            DeviceArray coords = Wrap(std::move(e.tile_coords), DType::kUInt32, {Index(e.num_tiles), rank});
            DeviceArray ptr = Wrap(std::move(e.tile_ptr), DType::kUInt64, {Index(e.num_tiles + 1)});
            return pyb::make_tuple(idx, val, coords, ptr, ShapeTuple(e.tile_shape));
        },
        pyb::arg("new"), pyb::arg("old"), pyb::arg("apply"), pyb::arg("threshold"),
        pyb::arg("tile_shape"), pyb::arg("stream"),
        "GPU encode: (indices, values, tile_coords, tile_ptr, tile_shape), device arrays.");

    m.def(
        "_gpu_upload",
        [](const std::shared_ptr<SparseObjectView>& obj, int device, std::uintptr_t stream) {
            const auto& d = obj->desc;
            const Index nnz = Index(d.nnz), rank = Index(d.rank());
            DeviceArray idx, val;
            {
                pyb::gil_scoped_release nogil;
                idx = Upload(obj->indices, d.index_dtype, {nnz, rank}, device, stream);
                val = Upload(obj->values, d.value_dtype, {nnz}, device, stream);
            }
            return pyb::make_tuple(idx, val);
        },
        pyb::arg("obj"), pyb::arg("device"), pyb::arg("stream"),
        "A target object's indices and values copied into device memory.");

    m.def(
        "_gpu_apply",
        [](const pyb::object& weight, const pyb::object& indices, const pyb::object& values,
           const std::string& apply, const pyb::object& stream) {
            ParsedTensor w = ParseTensorArg(weight, "weight", true, stream);
            const cuda::DeviceArray wd = CudaArg(w, "weight");
            const ApplyMode mode = ValueOrThrow(ParseApplyMode(apply));
            // Device members (_DeviceArray) apply directly; host members are uploaded first.
            auto device_of = [&](const pyb::object& o, const char* what) -> DeviceArray {
                if (pyb::isinstance<DeviceArray>(o)) return o.cast<DeviceArray>();
                BorrowedArray h = Borrow(o, what);
                DeviceArray a;
                pyb::gil_scoped_release nogil;
                a = Upload({h.data, h.nbytes}, h.dtype, h.shape, wd.ptr.device, w.ref.stream);
                return a;
            };
            DeviceArray idx = device_of(indices, "indices");
            DeviceArray val = device_of(values, "values");
            pyb::gil_scoped_release nogil;
            ThrowIfError(cuda::ApplySparse(wd, idx.view(), val.view(), mode, w.ref.stream));
        },
        pyb::arg("weight"), pyb::arg("indices"), pyb::arg("values"), pyb::arg("apply"),
        pyb::arg("stream"),
        "Applies local (indices, values) to a 2-D CUDA weight (which may be a strided view) in "
        "place, on `stream`.");
    m.attr("HAS_GPU_CODEC") = true;
}

#else

void RegisterGpu(pyb::module_& m) {
    m.def("gpu_available", [] { return false; },
          "False: this build has no GPU codec (built without a CUDA compiler).");
    m.attr("HAS_GPU_CODEC") = false;
}

#endif

}  // namespace mooncake::sparse::py
