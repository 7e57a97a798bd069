// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The Python SparseObject of both backends: a target-local object's descriptor and member bytes,
// plus what keeps the bytes alive — the owned TargetObject of the embedded store, or a lease on
// the node daemon's read-only segment memory (zero-copy, released when the object is collected).
#pragma once

#include "arrays.h"
#include "executor/sparse_service.h"
#include "mooncake/sparse/contracts.h"

namespace mooncake::sparse::py {

/// A read result as Python holds it: one shape for both backends (the keepalive owns the bytes
/// or holds the daemon's lease).
using SparseObjectView = TargetObjectView;

/// Registers the SparseObject class (read-only properties; members as zero-copy numpy arrays).
void RegisterSparseObject(pyb::module_& m);

}  // namespace mooncake::sparse::py
