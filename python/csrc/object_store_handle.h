// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// `_ObjectStore`: the raw ObjectStore of a backend (put/get/stat/remove/list of structured
// objects), for tests and benchmarks. A non-owning handle: the binding keeps its store alive.
#pragma once

#include "arrays.h"
#include "store/object_store.h"

namespace mooncake::sparse::py {

struct ObjectStoreHandle {
    ObjectStore* store = nullptr;
    explicit ObjectStoreHandle(ObjectStore& s) : store(&s) {}
};

void RegisterObjectStore(pyb::module_& m);

}  // namespace mooncake::sparse::py
