// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Host arrays from Python objects: numpy arrays and anything else with the buffer protocol,
// torch tensors (and others) through DLPack. The returned view keeps its producer alive. And
// numpy arrays over C++-owned buffers, zero-copy.
//
// Every layout numpy and torch produce is accepted (Fortran order, transposed, sliced and
// strided views, stride-0 empties and broadcasts, big-endian numpy dtypes, torch's lazy
// negation bit). What is read is borrowed in place when it already is native and C-contiguous,
// else gathered into a native C-contiguous copy — the data moves anyway. What is written in
// place (an apply's weight, a get_tensor_into destination) is never copied: it is borrowed
// with its strides, and refused where an in-place write could not be right (read-only,
// non-native byte order, torch's negation bit).
#pragma once

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "codec/codec.h"

namespace mooncake::sparse::py {

namespace pyb = pybind11;

/// A borrowed host array plus whatever keeps its memory alive.
struct BorrowedArray {
    DType dtype = DType::kUInt8;
    Shape shape;
    std::byte* data = nullptr;  ///< Element [0, ..., 0].
    std::size_t nbytes = 0;     ///< The elements' bytes (number of elements x item size).
    /// Element strides; empty: C-contiguous. Only BorrowView returns others.
    std::vector<std::int64_t> strides;
    bool writable = false;
    bool from_dlpack = false;
    std::shared_ptr<void> keepalive;

    /// Preconditions: `strides` is empty (a C-contiguous array).
    HostArray view() const { return {dtype, shape, {data, nbytes}}; }
    /// The array with its strides (MutableHostArray's convention: the span runs from the
    /// lowest-addressed element to the highest).
    MutableHostArray mutable_view() const;
};

/// Keeps a Python object alive from C++; its last reference may drop on a thread without the
/// GIL (after a released section).
std::shared_ptr<void> KeepObject(pyb::object obj);

/// Consumes a legacy DLPack capsule (renamed "used_dltensor"): its managed tensor, and the owner
/// that calls the tensor's deleter (with the GIL) when its last reference goes.
/// Precondition: PyCapsule_IsValid(capsule, "dltensor").
std::pair<DLManagedTensor*, std::shared_ptr<void>> ConsumeDLPack(PyObject* capsule);

/// What keeps an array taken from a consumed capsule alive: its managed tensor's `owner`, and
/// `producer` too unless that is the capsule itself, which once consumed holds nothing more (a
/// commit takes two arrays per update; each holder more is an allocation and a GIL round trip
/// as it is released).
std::shared_ptr<void> KeepDLPack(std::shared_ptr<void> owner, const pyb::handle& producer,
                                 PyObject* capsule);

/// Borrows a CPU array to read: zero-copy when it is native and C-contiguous, else a native
/// C-contiguous copy (non-contiguous views, big-endian dtypes, torch tensors with the negation
/// bit). `what` names the argument in error messages.
/// Throws StatusError: InvalidArgument (None, not an array, unsupported dtype); Unimplemented
/// (device memory).
BorrowedArray Borrow(const pyb::handle& obj, const char* what);

/// Borrows a CPU array in place with its strides (element strides in BorrowedArray::strides,
/// empty when C-contiguous), never copying it: a destination to write (`writable`), or a source
/// whose strided layout the caller copies from itself. A big-endian source is the exception:
/// it comes back as a native C-contiguous copy.
/// Throws StatusError(InvalidArgument): as Borrow; and for `writable`: read-only, non-native
/// byte order, torch's negation or conjugation bit; byte strides that are not a multiple of
/// the item size.
BorrowedArray BorrowView(const pyb::handle& obj, const char* what, bool writable);

/// Borrows a writable C-contiguous CPU array (a destination of raw bytes).
/// Throws StatusError(InvalidArgument): as BorrowView, and for a non-contiguous array.
BorrowedArray BorrowContiguousOut(const pyb::handle& obj, const char* what);

/// torch's lazy negation and conjugation bits are not part of DLPack: a tensor with one exports
/// its memory as if the bit were clear. Returns `obj` with the bits resolved (a copy) for a
/// source; refuses a destination (InvalidArgument), which would be written un-negated.
pyb::object ResolveLazyBits(const pyb::handle& obj, const std::string& what, bool destination);

/// A numpy array viewing `buffer` (kept alive by the array). bfloat16 and float8 come out as
/// their same-sized unsigned integer bit patterns; the Python layer re-views them.
pyb::array ToNumpy(std::shared_ptr<const std::vector<std::byte>> buffer, DType dtype, Shape shape);

/// A read-only numpy array over `bytes`, which `keepalive` keeps valid (e.g. a lease on the node
/// daemon's segment memory): zero-copy.
pyb::array ViewNumpy(std::span<const std::byte> bytes, DType dtype, Shape shape,
                     std::shared_ptr<const void> keepalive);

/// A numpy array that owns a moved-in vector.
pyb::array ToNumpy(std::vector<std::byte>&& buffer, DType dtype, Shape shape);

/// Exception carrying a Status; translated to the mcs.Error hierarchy.
struct StatusError : std::exception {
    explicit StatusError(Status s) : status(std::move(s)), text(status.ToString()) {}
    const char* what() const noexcept override { return text.c_str(); }
    Status status;
    std::string text;
};

inline void ThrowIfError(const Status& s) {
    if (!s.ok()) throw StatusError(s);
}
template <typename T>
T ValueOrThrow(Result<T>&& r) {
    if (!r.ok()) throw StatusError(r.status());
    return std::move(r).value();
}

/// This library's dtype of a DLPack dtype (one lane). Errors: InvalidArgument.
Result<DType> DTypeOfDLPack(DLDataType t);
/// The DLPack dtype of this library's dtype (the inverse). Errors: InvalidArgument.
Result<DLDataType> DLPackTypeOf(DType dtype);

void RegisterErrors(pyb::module_& m);

}  // namespace mooncake::sparse::py
