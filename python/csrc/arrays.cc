// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "arrays.h"

#include <dlpack/dlpack.h>

#include <string>

namespace mooncake::sparse::py {
namespace {

std::shared_ptr<void> KeepObject(pyb::object obj) {
    // The last reference may drop on a thread without the GIL (after a released section).
    return std::shared_ptr<void>(new pyb::object(std::move(obj)), [](void* p) {
        pyb::gil_scoped_acquire gil;
        delete static_cast<pyb::object*>(p);
    });
}

Result<DType> FromNumpy(const pyb::dtype& dt) {
    const char kind = dt.kind();
    const auto size = dt.itemsize();
    switch (kind) {
        case 'b': return DType::kBool;
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
    return InvalidArgument("unsupported numpy dtype '" + std::string(pyb::str(dt)) + "'");
}

const char* NumpyFormat(DType t) {
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

BorrowedArray BorrowNumpy(const pyb::array& arr, const char* what, bool need_writable) {
    if (!(arr.flags() & pyb::array::c_style)) {
        ThrowIfError(InvalidArgument(std::string(what) + " must be C-contiguous"));
    }
    if (need_writable && !arr.writeable()) {
        ThrowIfError(InvalidArgument(std::string(what) + " is read-only"));
    }
    BorrowedArray out;
    out.dtype = ValueOrThrow(FromNumpy(arr.dtype()));
    for (pyb::ssize_t d = 0; d < arr.ndim(); ++d) out.shape.push_back(arr.shape(d));
    out.data = static_cast<std::byte*>(const_cast<void*>(arr.data()));
    out.nbytes = static_cast<std::size_t>(arr.nbytes());
    out.writable = arr.writeable();
    out.keepalive = KeepObject(arr);
    return out;
}

BorrowedArray BorrowDLPack(const pyb::handle& obj, const char* what) {
    pyb::object capsule_obj = obj.attr("__dlpack__")();
    PyObject* cap = capsule_obj.ptr();
    if (!PyCapsule_IsValid(cap, "dltensor")) {
        ThrowIfError(InvalidArgument(std::string(what) + ": __dlpack__ did not return a DLPack capsule"));
    }
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    // We own it now: mark the capsule consumed and call the deleter when done.
    PyCapsule_SetName(cap, "used_dltensor");
    std::shared_ptr<void> owner(managed, [](void* p) {
        auto* m = static_cast<DLManagedTensor*>(p);
        if (m->deleter) {
            pyb::gil_scoped_acquire gil;
            m->deleter(m);
        }
    });
    const DLTensor& t = managed->dl_tensor;
    if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
        ThrowIfError(Unimplemented(std::string(what) + " lives on device type " +
                                   std::to_string(t.device.device_type) +
                                   "; this call takes host (CPU) memory"));
    }
    BorrowedArray out;
    out.dtype = ValueOrThrow(DTypeOfDLPack(t.dtype));
    out.from_dlpack = true;
    Index expected = 1;
    bool contiguous = true;
    for (int d = t.ndim - 1; d >= 0; --d) {
        if (t.strides && t.shape[d] != 1 && t.strides[d] != expected) contiguous = false;
        expected *= t.shape[d];
    }
    if (!contiguous) ThrowIfError(InvalidArgument(std::string(what) + " must be C-contiguous"));
    for (int d = 0; d < t.ndim; ++d) out.shape.push_back(t.shape[d]);
    out.data = static_cast<std::byte*>(t.data) + t.byte_offset;
    out.nbytes = static_cast<std::size_t>(expected) * DTypeSize(out.dtype);
    out.writable = true;
    out.keepalive = std::shared_ptr<void>(
        new std::pair<std::shared_ptr<void>, std::shared_ptr<void>>(owner, KeepObject(pyb::reinterpret_borrow<pyb::object>(obj))),
        [](void* p) { delete static_cast<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>*>(p); });
    return out;
}

}  // namespace

namespace {

/// The one DLPack <-> DType mapping, both directions. Codes past kDLBfloat are spelled as
/// numbers: older dlpack.h headers lack their names (kDLBool = 6, kDLFloat8_e4m3fn = 10,
/// kDLFloat8_e5m2 = 12, DLPack >= 1.1).
struct DLPackType {
    std::uint8_t code;
    std::uint8_t bits;
    DType dtype;
};
constexpr DLPackType kDLPackTypes[] = {
    {kDLInt, 8, DType::kInt8},        {kDLInt, 16, DType::kInt16},
    {kDLInt, 32, DType::kInt32},      {kDLInt, 64, DType::kInt64},
    {kDLUInt, 8, DType::kUInt8},      {kDLUInt, 16, DType::kUInt16},
    {kDLUInt, 32, DType::kUInt32},    {kDLUInt, 64, DType::kUInt64},
    {kDLFloat, 16, DType::kFloat16},  {kDLFloat, 32, DType::kFloat32},
    {kDLFloat, 64, DType::kFloat64},  {kDLBfloat, 16, DType::kBFloat16},
    {6, 8, DType::kBool},             {10, 8, DType::kFloat8E4M3},
    {12, 8, DType::kFloat8E5M2},
};

}  // namespace

Result<DType> DTypeOfDLPack(DLDataType t) {
    if (t.lanes != 1) return InvalidArgument("vector DLPack dtypes are not supported");
    for (const DLPackType& e : kDLPackTypes) {
        if (e.code == t.code && e.bits == t.bits) return e.dtype;
    }
    return InvalidArgument("unsupported DLPack dtype (code " + std::to_string(t.code) + ", bits " +
                           std::to_string(t.bits) + ")");
}

Result<DLDataType> DLPackTypeOf(DType dtype) {
    for (const DLPackType& e : kDLPackTypes) {
        if (e.dtype == dtype) return DLDataType{e.code, e.bits, 1};
    }
    return InvalidArgument("no DLPack type for " + std::string(DTypeName(dtype)));
}


BorrowedArray Borrow(const pyb::handle& obj, const char* what, bool need_writable) {
    if (obj.is_none()) ThrowIfError(InvalidArgument(std::string(what) + " is None"));
    if (pyb::isinstance<pyb::array>(obj)) {
        return BorrowNumpy(pyb::reinterpret_borrow<pyb::array>(obj), what, need_writable);
    }
    if (pyb::hasattr(obj, "__dlpack__")) return BorrowDLPack(obj, what);
    // Lists, tuples, memoryviews: through numpy (a copy for sequences).
    pyb::array arr = pyb::array::ensure(obj, pyb::array::c_style);
    if (!arr) ThrowIfError(InvalidArgument(std::string(what) + " is not an array"));
    return BorrowNumpy(arr, what, need_writable);
}

pyb::array ToNumpy(std::shared_ptr<const std::vector<std::byte>> buffer, DType dtype, Shape shape) {
    auto* holder = new std::shared_ptr<const std::vector<std::byte>>(std::move(buffer));
    pyb::capsule base(holder, [](void* p) {
        delete static_cast<std::shared_ptr<const std::vector<std::byte>>*>(p);
    });
    std::vector<pyb::ssize_t> dims(shape.begin(), shape.end());
    pyb::dtype dt(NumpyFormat(dtype));
    auto arr = pyb::array(dt, dims, {}, (*holder)->data(), base);
    // Views of store-owned buffers are read-only: writes would corrupt shared cache entries.
    arr.attr("setflags")(pyb::arg("write") = false);
    return arr;
}

pyb::array ViewNumpy(std::span<const std::byte> bytes, DType dtype, Shape shape,
                     std::shared_ptr<const void> keepalive) {
    std::vector<pyb::ssize_t> dims(shape.begin(), shape.end());
    pyb::dtype dt(NumpyFormat(dtype));
    if (bytes.empty()) return pyb::array(dt, dims, {});  // nothing to view (nnz = 0)
    auto* holder = new std::shared_ptr<const void>(std::move(keepalive));
    pyb::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); });
    auto arr = pyb::array(dt, dims, {}, bytes.data(), base);
    arr.attr("setflags")(pyb::arg("write") = false);
    return arr;
}

pyb::array ToNumpy(std::vector<std::byte>&& buffer, DType dtype, Shape shape) {
    auto* holder = new std::vector<std::byte>(std::move(buffer));
    pyb::capsule base(holder, [](void* p) { delete static_cast<std::vector<std::byte>*>(p); });
    std::vector<pyb::ssize_t> dims(shape.begin(), shape.end());
    return pyb::array(pyb::dtype(NumpyFormat(dtype)), dims, {}, holder->data(), base);
}

void RegisterErrors(pyb::module_& m) {
    pyb::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const StatusError& e) {
            pyb::module_ errors = pyb::module_::import("mooncake.sparse._errors");
            pyb::object cls = errors.attr("error_class")(static_cast<int>(e.status.code()));
            PyErr_SetObject(cls.ptr(), pyb::str(e.status.message()).ptr());
        }
    });
    pyb::dict codes;
    for (int c = 0; c <= static_cast<int>(kLastStatusCode); ++c) {
        codes[pyb::str(std::string(StatusCodeName(static_cast<StatusCode>(c))))] = c;
    }
    m.attr("STATUS_CODES") = codes;
}

}  // namespace mooncake::sparse::py
