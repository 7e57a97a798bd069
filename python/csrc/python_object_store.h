// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// PythonObjectStore: an ObjectStore whose operations a Python object implements. It is how a
// backend that only has a Python API (upstream Mooncake Store, mooncake/sparse/_upstream.py)
// sits under the native sparse layer and the node daemon: SparseStore, its caches and its
// single-flight table, and the tensor path run on it unchanged.
//
// The Python object provides
//     put(key, metadata: bytes, members: [(name, dtype, shape, address, nbytes, checksum)],
//         mode: "create" | "upsert", hard_pin: bool)
//     stat(key) -> (metadata: bytes, [(name, dtype, shape, size, checksum)], version, hard_pinned)
//     read_ranges([(key, member, row_start | None, row_end | None, address, nbytes)])
//     remove(key);  list(prefix) -> [str];  counters() -> {name: int}
// addresses being raw host pointers valid for the call. An implementation that says
// `tensor_batches` also provides the tensor path's batches (one network batch each):
//     register_region(address, nbytes) / unregister_region(address)   memory batches move in
//     check_absent(keys)                        Conflict when one exists (create batches)
//     put_tensors(keys, addresses, sizes, mode, hard_pin)   tensor values, from a region
//     locate_tensors(keys) -> [(size, address)]  the chosen replica: its address when it is in
//                                                this process (viewed in place), else 0
//     read_tensors(keys, addresses, sizes)      other nodes' replicas into a region
// Errors are mooncake.sparse exceptions
// (mapped back to their StatusCode); anything else becomes Internal. Every call takes the GIL,
// so callers of the native layer must release it (the bindings do).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "store/object_store.h"

namespace mooncake::sparse::py {

/// Wraps `impl`; the store keeps a reference to it.
std::shared_ptr<ObjectStore> MakePythonObjectStore(pybind11::object impl);

}  // namespace mooncake::sparse::py
