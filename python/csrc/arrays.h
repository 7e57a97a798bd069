// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Host arrays from Python objects without copies: numpy arrays and anything else with the
// buffer protocol, torch tensors (and others) through DLPack. The returned view keeps its
// producer alive. And numpy arrays over C++-owned buffers, zero-copy.
#pragma once

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <span>
#include <vector>

#include "codec/codec.h"

namespace mooncake::sparse::py {

namespace pyb = pybind11;

/// A borrowed host array plus whatever keeps its memory alive.
struct BorrowedArray {
    DType dtype = DType::kUInt8;
    Shape shape;
    std::byte* data = nullptr;
    std::size_t nbytes = 0;
    bool writable = false;
    bool from_dlpack = false;
    std::shared_ptr<void> keepalive;

    HostArray view() const { return {dtype, shape, {data, nbytes}}; }
    MutableHostArray mutable_view() const { return {dtype, shape, {data, nbytes}}; }
};

/// Borrows a C-contiguous CPU array. `what` names the argument in error messages.
/// Throws StatusError(InvalidArgument) for non-contiguous, non-CPU or unsupported dtypes.
BorrowedArray Borrow(const pyb::handle& obj, const char* what, bool need_writable = false);

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
