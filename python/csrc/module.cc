// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// mooncake.sparse._core: one registration function per concept.
#include "arrays.h"

namespace mooncake::sparse::py {
void RegisterObjectStore(pyb::module_& m);  // bind_object_store.cc
void RegisterSparse(pyb::module_& m);       // bind_sparse.cc
void RegisterStore(pyb::module_& m);        // bind_store.cc
void RegisterTensor(pyb::module_& m);       // bind_tensor.cc
void RegisterNodeServer(pyb::module_& m);   // bind_node_server.cc
void RegisterGpu(pyb::module_& m);          // bind_gpu.cc
void RegisterGpuCommit(pyb::module_& m);    // bind_gpu_commit.cc
void RegisterBatch(pyb::module_& m);        // bind_batch.cc
void RegisterTorchArrays(pyb::module_& m);  // torch_arrays.cc
}  // namespace mooncake::sparse::py

PYBIND11_MODULE(_core, m) {
    m.doc() = "mooncake-sparse native core (see mooncake.sparse for the public API)";
    mooncake::sparse::py::RegisterErrors(m);
    mooncake::sparse::py::RegisterObjectStore(m);
    mooncake::sparse::py::RegisterSparse(m);
    mooncake::sparse::py::RegisterStore(m);
    mooncake::sparse::py::RegisterTensor(m);
    mooncake::sparse::py::RegisterNodeServer(m);
    mooncake::sparse::py::RegisterGpu(m);
    mooncake::sparse::py::RegisterGpuCommit(m);
    mooncake::sparse::py::RegisterBatch(m);
    mooncake::sparse::py::RegisterTorchArrays(m);
}
