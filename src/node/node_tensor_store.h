// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The tensor fast path of a DummyClient (docs/design.md §5): a TensorStore whose work runs in the
// node daemon. A CUDA tensor is exported as the CUDA IPC handle of its allocation base plus its
// offset (transport/cuda_ipc.h); the daemon opens the allocation (cached) and copies between it
// and its (pinned) segment with the copy engine — no payload on the socket, no client staging.
// Host tensors go through the client buffer (put) or are read in place from a leased, read-only
// segment mapping (get_tensor).
//
// Ordering: before a request leaves, the streams of its CUDA tensors are synchronized, so the
// daemon's copies start after the caller's pending work on them; when the reply arrives, the
// daemon's copies have completed.
#pragma once

#include <memory>

#include "executor/tensor_store.h"
#include "node/node_client.h"

namespace mooncake::sparse {

/// Errors of every call: as TensorStore, plus Unavailable (the daemon is gone).
std::unique_ptr<TensorStore> MakeNodeTensorStore(std::shared_ptr<NodeClient> client);

}  // namespace mooncake::sparse
