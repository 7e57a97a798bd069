// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// A caller's tensor argument (numpy / buffer protocol, DLPack capsule or producer, or
// __cuda_array_interface__) as a TensorRef plus what keeps its memory alive. Shared by the tensor
// path (bind_tensor.cc) and the GPU codec bindings (bind_gpu.cc).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "executor/tensor_store.h"

namespace mooncake::sparse::py {

struct ParsedTensor {
    TensorRef ref;
    std::shared_ptr<void> keepalive;
};

/// Parses `obj`; `stream` (an int or None) is the CUDA stream copies are ordered on.
/// Throws StatusError (InvalidArgument, Unimplemented).
ParsedTensor ParseTensorArg(const pybind11::handle& obj, const std::string& what,
                            bool destination, const pybind11::object& stream);

}  // namespace mooncake::sparse::py
