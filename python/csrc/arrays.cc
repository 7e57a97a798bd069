// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "arrays.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <bit>
#include <string>

#include "torch_arrays.h"
#include "transport/host_copy.h"

namespace mooncake::sparse::py {
std::shared_ptr<void> KeepObject(pyb::object obj) {
    return std::shared_ptr<void>(new pyb::object(std::move(obj)), [](void* p) {
        pyb::gil_scoped_acquire gil;
        delete static_cast<pyb::object*>(p);
    });
}

std::pair<DLManagedTensor*, std::shared_ptr<void>> ConsumeDLPack(PyObject* capsule) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    PyCapsule_SetName(capsule, "used_dltensor");  // Ours now: we call the deleter.
    std::shared_ptr<void> owner(managed, [](void* p) {
        auto* m = static_cast<DLManagedTensor*>(p);
        if (m->deleter) {
            pyb::gil_scoped_acquire gil;
            m->deleter(m);
        }
    });
    return {managed, std::move(owner)};
}

std::shared_ptr<void> KeepDLPack(std::shared_ptr<void> owner, const pyb::handle& producer,
                                 PyObject* capsule) {
    if (producer.ptr() == capsule) return owner;
    using Both = std::pair<std::shared_ptr<void>, std::shared_ptr<void>>;
    return std::make_shared<Both>(std::move(owner),
                                  KeepObject(pyb::reinterpret_borrow<pyb::object>(producer)));
}

namespace {

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

/// How an array is borrowed: to read (always native C-contiguous, copied if need be), as a view
/// with its strides (copied only when its byte order is not native), or to write in place.
enum class Access { kRead, kView, kWrite };

bool NativeByteOrder(const pyb::dtype& dt) {
    const char order = dt.byteorder();
    if (order == '=' || order == '|') return true;
    return (order == '<') == (std::endian::native == std::endian::little);
}

/// A native-order C-contiguous copy (np.array keeps a 0-d array 0-d; ascontiguousarray would not).
pyb::array NativeContiguousCopy(const pyb::array& arr) {
    pyb::module_ np = pyb::module_::import("numpy");
    pyb::object native = arr.dtype().attr("newbyteorder")("=");
    return np.attr("array")(arr, pyb::arg("dtype") = native, pyb::arg("order") = "C",
                            pyb::arg("copy") = true);
}

void Refuse(const char* what, const std::string& why) {
    ThrowIfError(InvalidArgument(std::string(what) + " " + why));
}

BorrowedArray BorrowNumpy(pyb::array arr, const char* what, Access access) {
    const DType dtype = ValueOrThrow(FromNumpy(arr.dtype()));
    const bool native = NativeByteOrder(arr.dtype());
    if (access == Access::kWrite) {
        if (!arr.writeable()) Refuse(what, "is read-only");
        if (!native) {
            Refuse(what, "has non-native byte order (dtype '" +
                             std::string(pyb::str(arr.dtype().attr("str"))) +
                             "'): it is written in place, in this machine's byte order; pass a "
                             "native array (x.astype(x.dtype.newbyteorder('='))) and copy back");
        }
    }
    const bool contiguous = (arr.flags() & pyb::array::c_style) != 0;
    if (!native || (access == Access::kRead && !contiguous)) arr = NativeContiguousCopy(arr);
    BorrowedArray out;
    out.dtype = dtype;
    for (pyb::ssize_t d = 0; d < arr.ndim(); ++d) out.shape.push_back(arr.shape(d));
    if ((arr.flags() & pyb::array::c_style) == 0) {
        const auto item = static_cast<pyb::ssize_t>(DTypeSize(dtype));
        for (pyb::ssize_t d = 0; d < arr.ndim(); ++d) {
            if (arr.strides(d) % item != 0) {
                Refuse(what, "has byte strides that are not a multiple of its item size");
            }
            out.strides.push_back(arr.strides(d) / item);
        }
    }
    out.data = static_cast<std::byte*>(const_cast<void*>(arr.data()));
    out.nbytes = static_cast<std::size_t>(arr.nbytes());
    out.writable = arr.writeable();
    out.keepalive = KeepObject(arr);
    return out;
}

/// Borrows a DLPack producer, or an unconsumed capsule (torch's C++ exporter).
BorrowedArray BorrowDLPack(const pyb::handle& obj, const char* what, Access access) {
    pyb::object capsule_obj = PyCapsule_CheckExact(obj.ptr())
                                  ? pyb::reinterpret_borrow<pyb::object>(obj)
                                  : obj.attr("__dlpack__")();
    PyObject* cap = capsule_obj.ptr();
    if (!PyCapsule_IsValid(cap, "dltensor")) {
        ThrowIfError(InvalidArgument(std::string(what) + ": __dlpack__ did not return a DLPack capsule"));
    }
    auto [managed, owner] = ConsumeDLPack(cap);
    const DLTensor& t = managed->dl_tensor;
    if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
        ThrowIfError(Unimplemented(std::string(what) + " lives on device type " +
                                   std::to_string(t.device.device_type) +
                                   "; this call takes host (CPU) memory"));
    }
    BorrowedArray out;
    out.dtype = ValueOrThrow(DTypeOfDLPack(t.dtype));
    out.from_dlpack = true;
    std::uint64_t elements = 1;
    for (int d = 0; d < t.ndim; ++d) {
        out.shape.push_back(t.shape[d]);
        elements *= static_cast<std::uint64_t>(std::max<std::int64_t>(t.shape[d], 0));
    }
    std::vector<std::int64_t> strides;
    if (t.strides != nullptr) strides.assign(t.strides, t.strides + t.ndim);
    auto* first = static_cast<std::byte*>(t.data) + t.byte_offset;
    out.nbytes = static_cast<std::size_t>(elements) * DTypeSize(out.dtype);
    out.writable = true;  // DLPack < 1.0 has no read-only flag
    if (IsCContiguous(out.shape, strides)) {
        out.data = first;
    } else if (access != Access::kRead) {
        out.data = first;
        out.strides = std::move(strides);
    } else {
        // Gathered into a C-contiguous copy: the data is read (and moved) anyway.
        auto copy = std::make_shared<std::vector<std::byte>>(out.nbytes);
        StridedCopy(copy->data(), {}, first, strides, out.shape, DTypeSize(out.dtype));
        out.data = copy->data();
        out.keepalive = copy;
        return out;
    }
    out.keepalive = KeepDLPack(std::move(owner), obj, cap);
    return out;
}

BorrowedArray BorrowAny(const pyb::handle& obj, const char* what, Access access) {
    if (obj.is_none()) ThrowIfError(InvalidArgument(std::string(what) + " is None"));
    if (pyb::isinstance<pyb::array>(obj)) {
        return BorrowNumpy(pyb::reinterpret_borrow<pyb::array>(obj), what, access);
    }
    // torch through its C++ exporter (a tensor with a lazy bit takes the generic path below).
    if (pyb::object capsule = TorchCapsule(obj.ptr(), false)) {
        return BorrowDLPack(capsule, what, access);
    }
    if (PyCapsule_CheckExact(obj.ptr())) return BorrowDLPack(obj, what, access);
    if (pyb::hasattr(obj, "__dlpack__")) {
        pyb::object resolved = ResolveLazyBits(obj, what, access == Access::kWrite);
        return BorrowDLPack(resolved, what, access);
    }
    if (access == Access::kWrite && !PyObject_CheckBuffer(obj.ptr())) {
        // A sequence would become a temporary array: the writes would be lost.
        Refuse(what, "must be a numpy array, a tensor or a writable buffer (got " +
                         std::string(pyb::str(pyb::type::handle_of(obj))) + ")");
    }
    // Lists, tuples, memoryviews: through numpy (a copy for sequences, a view of a buffer).
    pyb::array arr = pyb::array::ensure(obj);
    if (!arr) ThrowIfError(InvalidArgument(std::string(what) + " is not an array"));
    return BorrowNumpy(arr, what, access);
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


MutableHostArray BorrowedArray::mutable_view() const {
    if (strides.empty()) return {dtype, shape, {data, nbytes}};
    if (nbytes == 0) return {dtype, shape, {data, 0}, strides};
    const auto [lo, hi] = StridedExtent(shape, strides);
    const auto item = static_cast<std::int64_t>(DTypeSize(dtype));
    return {dtype, shape,
            {data + lo * item, static_cast<std::size_t>((hi - lo + 1) * item)}, strides};
}

pyb::object ResolveLazyBits(const pyb::handle& obj, const std::string& what, bool destination) {
    auto bit = [&](const char* name) {
        return pyb::hasattr(obj, name) && obj.attr(name)().cast<bool>();
    };
    const bool neg = bit("is_neg"), conj = bit("is_conj");
    pyb::object out = pyb::reinterpret_borrow<pyb::object>(obj);
    if (!neg && !conj) return out;
    if (destination) {
        ThrowIfError(InvalidArgument(
            what + " has torch's lazy " + (neg ? "negation" : "conjugation") +
            " bit set (a view such as torch._neg_view(x) or x.conj()); it would be written "
            "without it: pass a tensor without the bit (x.resolve_neg(), x.resolve_conj())"));
    }
    if (neg) out = out.attr("resolve_neg")();
    if (conj) out = out.attr("resolve_conj")();
    return out;
}

BorrowedArray Borrow(const pyb::handle& obj, const char* what) {
    return BorrowAny(obj, what, Access::kRead);
}

BorrowedArray BorrowView(const pyb::handle& obj, const char* what, bool writable) {
    return BorrowAny(obj, what, writable ? Access::kWrite : Access::kView);
}

BorrowedArray BorrowContiguousOut(const pyb::handle& obj, const char* what) {
    BorrowedArray out = BorrowAny(obj, what, Access::kWrite);
    if (!out.strides.empty()) Refuse(what, "must be C-contiguous");
    return out;
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
