// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "torch_arrays.h"

#include <dlpack/dlpack.h>

#include <vector>

namespace mooncake::sparse::py {
namespace {

namespace pyb = pybind11;

/// What is looked up once torch is imported (strong references, kept for the process: torch is
/// never unloaded). Called with the GIL held.
struct Torch {
    PyTypeObject* tensor_base = nullptr;  ///< torch._C.TensorBase
    PyObject* to_dlpack = nullptr;        ///< torch._C._to_dlpack
    PyObject* raw_stream = nullptr;       ///< torch._C._cuda_getCurrentRawStream, if built with CUDA
    PyObject* is_neg = nullptr;           ///< interned method names
    PyObject* is_conj = nullptr;
    PyObject* contiguous = nullptr;
};

/// torch's entry points, or null while torch is not imported (looked up again on the next call).
const Torch* TorchOrNull() {
    static Torch torch;
    static bool ready = false;
    if (ready) return &torch;
    PyObject* module = PyImport_GetModule(pyb::str("torch._C").ptr());  // new reference or null
    if (module == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    pyb::object c = pyb::reinterpret_steal<pyb::object>(module);
    pyb::object base = pyb::getattr(c, "TensorBase", pyb::none());
    pyb::object export_fn = pyb::getattr(c, "_to_dlpack", pyb::none());
    if (base.is_none() || !PyType_Check(base.ptr()) || export_fn.is_none()) {
        return nullptr;  // a torch without them: every tensor takes the generic path
    }
    pyb::object raw = pyb::getattr(c, "_cuda_getCurrentRawStream", pyb::none());
    torch.tensor_base = reinterpret_cast<PyTypeObject*>(base.release().ptr());
    torch.to_dlpack = export_fn.release().ptr();
    torch.raw_stream = raw.is_none() ? nullptr : raw.release().ptr();
    torch.is_neg = PyUnicode_InternFromString("is_neg");
    torch.is_conj = PyUnicode_InternFromString("is_conj");
    torch.contiguous = PyUnicode_InternFromString("contiguous");
    if (torch.is_neg == nullptr || torch.is_conj == nullptr || torch.contiguous == nullptr) {
        throw pyb::error_already_set();
    }
    ready = true;
    return &torch;
}

/// obj.name() as a bool. Throws error_already_set.
bool CallFlag(PyObject* obj, PyObject* name) {
    pyb::object r = pyb::reinterpret_steal<pyb::object>(PyObject_CallMethodNoArgs(obj, name));
    if (!r) throw pyb::error_already_set();
    const int truth = PyObject_IsTrue(r.ptr());
    if (truth < 0) throw pyb::error_already_set();
    return truth != 0;
}

/// The capsule torch's exporter makes of `obj`. Throws error_already_set.
pyb::object Export(const Torch& torch, PyObject* obj) {
    pyb::object cap = pyb::reinterpret_steal<pyb::object>(PyObject_CallOneArg(torch.to_dlpack, obj));
    if (!cap) throw pyb::error_already_set();
    return cap;
}

const DLTensor* TensorOf(PyObject* capsule) {
    if (!PyCapsule_IsValid(capsule, "dltensor")) return nullptr;
    const auto* m = static_cast<const DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    return m == nullptr ? nullptr : &m->dl_tensor;
}

bool CContiguous(const DLTensor& t) {
    if (t.strides == nullptr) return true;
    std::int64_t expected = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
        if (t.shape[d] == 0) return true;  // empty: nothing to lay out
        if (t.shape[d] != 1 && t.strides[d] != expected) return false;
        expected *= t.shape[d];
    }
    return true;
}

}  // namespace

bool IsTorchTensor(PyObject* obj) {
    const Torch* torch = TorchOrNull();
    return torch != nullptr && PyObject_TypeCheck(obj, torch->tensor_base);
}

pyb::object TorchCapsule(PyObject* obj, bool contiguous) {
    const Torch* torch = TorchOrNull();
    if (torch == nullptr || !PyObject_TypeCheck(obj, torch->tensor_base)) return {};
    if (CallFlag(obj, torch->is_neg)) return {};
    pyb::object cap = Export(*torch, obj);
    const DLTensor* t = TensorOf(cap.ptr());
    if (t == nullptr) return {};
    if (t->dtype.code == kDLComplex && CallFlag(obj, torch->is_conj)) return {};
    const bool cuda = t->device.device_type == kDLCUDA || t->device.device_type == kDLCUDAManaged;
    if (contiguous && cuda && !CContiguous(*t)) {
        pyb::object dense =
            pyb::reinterpret_steal<pyb::object>(PyObject_CallMethodNoArgs(obj, torch->contiguous));
        if (!dense) throw pyb::error_already_set();
        cap = Export(*torch, dense.ptr());  // the old capsule's deleter runs as it is dropped
    }
    return cap;
}

std::uintptr_t TorchCurrentStream(int device) {
    const Torch* torch = TorchOrNull();
    if (torch == nullptr) return 0;
    if (torch->raw_stream != nullptr) {
        pyb::object index = pyb::int_(device);
        pyb::object s = pyb::reinterpret_steal<pyb::object>(
            PyObject_CallOneArg(torch->raw_stream, index.ptr()));
        if (!s) throw pyb::error_already_set();
        return s.cast<std::uintptr_t>();
    }
    pyb::object stream = pyb::module_::import("torch.cuda").attr("current_stream")(device);
    return stream.attr("cuda_stream").cast<std::uintptr_t>();
}

std::pair<int, int> CapsuleDevice(PyObject* capsule) {
    const DLTensor* t = TensorOf(capsule);
    if (t == nullptr) return {0, 0};
    return {static_cast<int>(t->device.device_type), t->device.device_id};
}

void RegisterTorchArrays(pyb::module_& m) {
    m.def(
        "_torch_prepare",
        [](const pyb::list& xs, bool destination) {
            // Per tensor: the object the core borrows (a capsule of torch's exporter; the tensor
            // itself where it has a lazy bit, or is no torch tensor), torch's current stream of
            // its CUDA device (None on the host), and the one CUDA device of them all (-1: none,
            // several, or one not on a GPU).
            const Py_ssize_t n = PyList_GET_SIZE(xs.ptr());
            pyb::list objects(n), streams(n);
            int common = -2;  // none seen yet
            std::vector<std::pair<int, pyb::object>> stream_of;  // per device, within the call
            const auto stream_for = [&](int device) -> pyb::object {
                for (const auto& [d, s] : stream_of) {
                    if (d == device) return s;
                }
                pyb::object s = pyb::int_(TorchCurrentStream(device));
                stream_of.emplace_back(device, s);
                return s;
            };
            for (Py_ssize_t i = 0; i < n; ++i) {
                PyObject* x = PyList_GET_ITEM(xs.ptr(), i);
                pyb::object object = TorchCapsule(x, !destination);
                int device = -1;
                if (object) {
                    const auto [type, id] = CapsuleDevice(object.ptr());
                    if (type == kDLCUDA || type == kDLCUDAManaged) device = id;
                } else {
                    object = pyb::reinterpret_borrow<pyb::object>(x);
                    if (IsTorchTensor(x) && pyb::cast<bool>(object.attr("is_cuda"))) {
                        device = object.attr("device").attr("index").cast<int>();
                    }
                }
                streams[i] = device >= 0 ? stream_for(device) : pyb::none();
                objects[i] = std::move(object);
                common = common == -2 || common == device ? device : -1;
            }
            return pyb::make_tuple(objects, streams, common < 0 ? -1 : common);
        },
        pyb::arg("tensors"), pyb::arg("destination") = false,
        "_prepare_all in one call: (objects the core borrows, per tensor torch's current stream "
        "of its CUDA device or None, the one CUDA device of them all or -1).");
}

}  // namespace mooncake::sparse::py
