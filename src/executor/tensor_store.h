// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// TensorStore: the tensor fast path of docs/design.md §5 — put_tensor, batch_put_tensor,
// upsert_tensor, batch_upsert_tensor, get_tensor, get_tensor_into, batch_get_tensor_into — for
// host and CUDA tensors, over an ObjectStore. Tensor objects use upstream Mooncake's format
// (store/tensor_object.h), one object per key.
//
// Why it is built this way:
// - Validation first: every tensor of a call is checked (dtype, shape, byte size, contiguity,
//   memory kind, and for reads the stored header against the destination) before any byte
//   moves; a failed call leaves destinations and the store untouched.
// - No staging: a put fills the object's final memory (ObjectStore::PutFilled) — memcpy for
//   host tensors, one device-to-host copy for CUDA tensors — and a get copies straight from the
//   store's immutable snapshot (ObjectStore::ViewObjects) into the destination. A whole batch
//   becomes visible at once.
// - CUDA copies run on the caller's stream (TensorRef::stream, e.g. torch's current stream), so
//   they are ordered after the caller's pending work, and each call synchronizes its streams
//   before it returns: when it returns the data is in place. Host memory of tensor objects
//   comes from a pinned pool under a byte quota (pageable beyond it), so that H2D/D2H copies
//   run at the PCIe limit.
// - Caller tensors must stay alive and unresized until the call returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"
#include "store/tensor_object.h"
#include "transport/cuda_runtime.h"
#include "transport/pinned_pool.h"

namespace mooncake::sparse {

enum class TensorMemory : std::uint8_t {
    kHost = 0,
    kCuda = 1,
};

/// A caller's tensor: dtype, shape, optional strides, and where its bytes are.
struct TensorRef {
    DType dtype = DType::kFloat32;
    Shape shape;
    /// Strides in elements; empty means C-contiguous. A host tensor may have any strides (a
    /// view: transposed, sliced, Fortran order; a destination's elements must not overlap): it
    /// is copied from or into in place, `host` pointing at element [0, ..., 0] and `host_bytes`
    /// counting its elements' bytes. A CUDA destination may be such a view too (`device`
    /// pointing at element [0, ..., 0], its `bytes` counting the elements' bytes): it is written
    /// in place by 2-D copies (transport/pitched_copy.h). A CUDA source's strides must describe
    /// a C-contiguous layout (extent-1 dimensions may have any stride) or the call fails.
    std::vector<std::int64_t> strides;
    TensorMemory memory = TensorMemory::kHost;
    std::byte* host = nullptr;      ///< kHost: the first byte.
    std::uint64_t host_bytes = 0;   ///< kHost: bytes the caller provides.
    bool writable = true;           ///< kHost destinations must be writable.
    DeviceMemory device;            ///< kCuda: the range and its device.
    CudaStream stream = kCudaLegacyStream;  ///< kCuda: copies are ordered on this stream.

    /// A host tensor over `bytes`.
    static TensorRef Host(DType dtype, Shape shape, std::span<std::byte> bytes);
    /// A read-only host tensor (a put source).
    static TensorRef ConstHost(DType dtype, Shape shape, std::span<const std::byte> bytes);
    /// A CUDA tensor.
    static TensorRef Cuda(DType dtype, Shape shape, DeviceMemory memory,
                          CudaStream stream = kCudaLegacyStream);
};

struct TensorPutOptions {
    PutMode mode = PutMode::kCreate;  ///< put_tensor: kCreate; upsert_tensor: kUpsert.
    /// A stored weight stays readable until it is removed or replaced; false lets the store
    /// evict it under memory pressure (a cache entry the caller can recompute).
    bool hard_pin = true;
};

/// get_tensor's result: a new host tensor.
struct HostTensor {
    DType dtype = DType::kFloat32;
    Shape shape;
    HostBuffer data;  ///< Exactly the tensor's bytes.
};

struct TensorInfo {
    TensorHeader header;
    std::uint64_t version = 0;
    bool hard_pinned = false;
};

struct TensorStoreStats {
    std::uint64_t tensors_put = 0;
    std::uint64_t bytes_put = 0;
    std::uint64_t tensors_read = 0;
    std::uint64_t bytes_read = 0;
    std::uint64_t cuda_copies = 0;     ///< H2D + D2H copies issued.
    std::uint64_t pinned_copies = 0;   ///< ... of which to/from pinned store memory.
    std::uint64_t pageable_copies = 0; ///< ... of which to/from pageable store memory.
    /// Pinned chunks the pageable copies of batches of two chunks or more moved through.
    std::uint64_t pageable_chunks = 0;
};

struct TensorCapabilities {
    std::string backend;        ///< "embedded", "node", ...
    bool cuda_available = false;
    bool cuda_ipc_available = false;
    int cuda_devices = 0;
    std::string cuda_detail;
    HostMemoryStats host;       ///< The pinned pool of tensor objects (quota and use).
};

class TensorStore {
public:
    virtual ~TensorStore() = default;

    /// put_tensor / upsert_tensor of a batch (one item for the single calls): every tensor
    /// validated first, then the whole batch written and made visible at once.
    /// Errors: InvalidArgument (a tensor, a key, duplicate keys, mismatched lengths); Conflict
    /// (kCreate on an existing key); ResourceExhausted; Unimplemented (a CUDA tensor without
    /// CUDA); Internal (a CUDA copy failed: nothing became visible).
    virtual Status Put(std::span<const std::string> keys, std::span<const TensorRef> tensors,
                       const TensorPutOptions& options) = 0;

    /// get_tensor: the stored tensor as a new host tensor.
    /// Errors: NotFound; InvalidArgument (the object is not a tensor object); ResourceExhausted.
    virtual Result<HostTensor> Get(std::string_view key) = 0;

    /// get_tensor_into of a batch: every stored header is checked against its destination
    /// (dtype, shape, size) and every destination is checked (layout, writability) before
    /// any byte is copied; all items are read from one state of the store.
    ///
    /// `box_origins` is empty (every destination receives its whole stored tensor) or has one
    /// entry per destination. An empty entry reads the whole tensor; an entry of the
    /// destination's rank makes a dense box read: the destination receives the box
    /// [origin, origin + destination.shape) of the stored tensor (the same rank and dtype, the
    /// box inside the stored shape), and only the box's bytes are read (a TP rank reading its
    /// shard of a full weight).
    /// Errors: NotFound (a missing key); InvalidArgument (a mismatch, an origin of another rank,
    /// a negative origin, a box outside the stored shape); Unimplemented; Internal.
    virtual Status GetInto(std::span<const std::string> keys,
                           std::span<const TensorRef> destinations,
                           std::span<const Shape> box_origins) = 0;

    /// The stored header of `key`.
    /// Errors: NotFound; InvalidArgument (not a tensor object).
    virtual Result<TensorInfo> Stat(std::string_view key) = 0;

    virtual TensorCapabilities Capabilities() const = 0;
    virtual TensorStoreStats Stats() const = 0;

    // Single-item conveniences.
    Status Put(std::string_view key, const TensorRef& tensor, const TensorPutOptions& options);
    Status GetInto(std::string_view key, const TensorRef& destination);
    /// The box of `key` at `box_origin` into `destination`.
    Status GetInto(std::string_view key, const TensorRef& destination, const Shape& box_origin);
    /// Whole tensors.
    Status GetInto(std::span<const std::string> keys, std::span<const TensorRef> destinations);
};

struct LocalTensorStoreOptions {
    std::string backend = "embedded";  ///< Reported by Capabilities().
    /// Host bytes of tensor objects that may be pinned (cudaHostAlloc, reused); 0: none.
    std::uint64_t pinned_quota_bytes = 0;
    /// Threads for large host-to-host copies (0: up to 8, by hardware concurrency).
    unsigned copy_threads = 0;
};

/// A TensorStore whose CUDA tensors are in this process (the embedded store, or the node
/// daemon over its segments with CUDA IPC mappings).
std::unique_ptr<TensorStore> MakeLocalTensorStore(std::shared_ptr<ObjectStore> store,
                                                  const LocalTensorStoreOptions& options = {});

/// Keys under this prefix belong to the sparse object layer (source objects, manifests,
/// generation heads, admission records): the tensor API neither writes nor reads them, so a
/// tensor can never overwrite a tensor's generation chain.
inline constexpr std::string_view kReservedKeyPrefix = "mcs/";

namespace internal {

/// A tensor key: a valid id (non-empty, <= 1024 bytes, no control characters) outside the
/// sparse layer's reserved prefix. `what` names it in errors.
/// Errors: InvalidArgument.
Status ValidateTensorKey(std::string_view key, std::string_view what);

/// A batch's per-key list (`what`: "tensors", "box origins", ...) has one entry per key; an
/// empty optional list (`optional`) stands for none.
/// Errors: InvalidArgument ("N keys but M <what>").
Status CheckPerKey(std::size_t keys, std::size_t items, std::string_view what,
                   bool optional = false);

/// Checks a caller tensor and returns the FULL header it is stored (or expected) with:
/// dtype, rank <= 8, extents >= 1, byte size, C-contiguity of a CUDA source, non-overlapping
/// strides of a destination, memory kind, writability of a destination, CUDA presence. `what`
/// names it in errors ("tensor 3 ('key')").
/// Errors: InvalidArgument; Unimplemented (a CUDA tensor without CUDA).
Result<TensorHeader> ValidateTensorRef(const TensorRef& tensor, bool destination,
                                       std::string_view what);

/// The header of a stored tensor object, checked to be one (a single kTensorMemberName member
/// holding a valid header).
/// Errors: InvalidArgument.
Result<TensorHeader> ReadTensorObjectHeader(const ObjectView& view, std::string_view key);

/// That a stored header matches a destination's expected header (dtype and shape).
/// Errors: InvalidArgument naming both.
Status CheckTensorMatch(const TensorHeader& stored, const TensorHeader& expected,
                        std::string_view key);

/// That a box origin can be read into a destination of `shape`: an origin of the same rank
/// with no negative coordinate (checked before the stored header is known). `what` names it.
/// Errors: InvalidArgument.
Status ValidateBoxOrigin(const Shape& origin, const Shape& shape, std::string_view what);

/// That the box [origin, origin + expected.local_shape) lies inside the stored tensor, whose
/// dtype and rank must equal the destination's.
/// Errors: InvalidArgument naming both.
Status CheckTensorBox(const TensorHeader& stored, const TensorHeader& expected,
                      const Shape& origin, std::string_view key);

}  // namespace internal
}  // namespace mooncake::sparse
