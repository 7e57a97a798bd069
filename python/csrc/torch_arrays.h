// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// torch tensors taken without Python-level calls per tensor. A step hands the core hundreds of
// thousands of tensors (encode's pairs, commit's members, apply's weights); through Python each
// costs a few µs of attribute lookups and torch's Python-level DLPack checks. Here a tensor is
// exported by torch's C++ DLPack exporter (torch._C._to_dlpack) after one check the exporter
// skips: a tensor with a lazy negation or conjugation bit would be exported as if the bit were
// clear, so such tensors are left to the generic path (ResolveLazyBits resolves or refuses them).
//
// torch is never imported here: the helpers see torch only when the caller's process has it.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <utility>

namespace mooncake::sparse::py {

/// Whether `obj` is a torch tensor (an instance of torch._C.TensorBase: torch.Tensor and its
/// subclasses such as nn.Parameter). False when torch is not imported.
bool IsTorchTensor(PyObject* obj);

/// A DLPack capsule ("dltensor", unconsumed) of torch tensor `obj` from torch's C++ exporter, or
/// a null object when the tensor has a lazy negation or conjugation bit (the caller takes its
/// generic path). With `contiguous`, a CUDA tensor that is not C-contiguous is first made
/// contiguous by torch, on torch's current stream of its device (its data moves anyway; the
/// capsule keeps the copy alive).
pybind11::object TorchCapsule(PyObject* obj, bool contiguous);

/// torch's current CUDA stream on `device` (a cudaStream_t value); 0 (the legacy default stream)
/// when torch is not imported.
std::uintptr_t TorchCurrentStream(int device);

/// The DLPack device (type, id) of an unconsumed capsule; {0, 0} when it is not one.
std::pair<int, int> CapsuleDevice(PyObject* capsule);

/// Registers _torch_prepare (the Python layer's _prepare_all, in one call).
void RegisterTorchArrays(pybind11::module_& m);

}  // namespace mooncake::sparse::py
