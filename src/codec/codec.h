// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The sparse codec (docs/design.md §2): validation of a global COO, sort by (tile, element), the
// compact tile index, index-dtype narrowing, member checksums, dense -> COO encoding of an
// update, boundary filtering + rebasing of entry ranges, and the CPU apply kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/status.h"
#include "transport/host_blocks.h"

namespace mooncake::sparse {

/// Where an allocator takes its memory from (transport/host_blocks.h).
enum class HostMemory : std::uint8_t {
    kBlocks,  ///< AllocateHostBlock: malloc, large blocks recycled by size class.
    kPooled,  ///< AllocatePooledBlock: small buffers carved from recycled chunks.
};

/// An allocator whose value-initialization leaves bytes as they are: a buffer sized for what is
/// written into it next is not zero-filled first (the zero fill of a read's target objects was a
/// tenth of the read). Large buffers come from the host block cache (transport/host_blocks.h):
/// the next step's objects reuse this step's memory instead of faulting in new pages; with
/// HostMemory::kPooled (a read's target objects) small ones do too.

template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
    template <typename U>
    struct rebind {
        using other = DefaultInitAllocator<U>;
    };
    // Allocators of different memory free each other's blocks wrongly: the memory travels with
    // the buffer.
    using is_always_equal = std::false_type;
    using propagate_on_container_move_assignment = std::true_type;
    using propagate_on_container_copy_assignment = std::true_type;
    using propagate_on_container_swap = std::true_type;

    DefaultInitAllocator() = default;
    explicit DefaultInitAllocator(HostMemory m) noexcept : memory(m) {}
    template <typename U>
    DefaultInitAllocator(const DefaultInitAllocator<U>& other) noexcept : memory(other.memory) {}
    T* allocate(std::size_t n) {
        static_assert(alignof(T) <= alignof(std::max_align_t));
        if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
        if (n == 0) return nullptr;
        void* p = memory == HostMemory::kPooled ? AllocatePooledBlock(n * sizeof(T))
                                                : AllocateHostBlock(n * sizeof(T));
        if (p == nullptr) throw std::bad_alloc();
        return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if (memory == HostMemory::kPooled) {
            FreePooledBlock(p, n * sizeof(T));
        } else {
            FreeHostBlock(p, n * sizeof(T));
        }
    }
    template <typename U>
    void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
        ::new (static_cast<void*>(p)) U;
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
        ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
    friend bool operator==(const DefaultInitAllocator& a, const DefaultInitAllocator& b) noexcept {
        return a.memory == b.memory;
    }

    HostMemory memory = HostMemory::kBlocks;
};

/// The bytes of an object member: a vector that grows without zero-filling.
using ByteBuffer = std::vector<std::byte, DefaultInitAllocator<std::byte>>;

/// A read-only host array: element type, shape and its bytes (C-contiguous).
struct HostArray {
    DType dtype = DType::kUInt8;
    Shape shape;
    std::span<const std::byte> data;

    std::size_t rows() const { return shape.empty() ? 0 : static_cast<std::size_t>(shape[0]); }
};

/// A writable host array: C-contiguous, or laid out by `strides` (a numpy / torch view written in
/// place: transposed, sliced, Fortran order).
struct MutableHostArray {
    DType dtype = DType::kUInt8;
    Shape shape;
    /// With `strides` empty, exactly the C-contiguous elements. Otherwise the bytes from the
    /// lowest-addressed element to the end of the highest-addressed one (negative strides put
    /// element [0, ..., 0] inside the span, not at its start).
    std::span<std::byte> data;
    /// Element strides, one per dimension; empty: C-contiguous.
    std::vector<std::int64_t> strides = {};
};

enum class DuplicatePolicy : std::uint8_t {
    kError = 0,  ///< Duplicate coordinates are rejected (InvalidArgument).
    kSum = 1,    ///< Coalesced by summing their values (scatter_add only).
    kLast = 2,   ///< The last in input order wins (overwrite only): a fold of steps.
};

struct EncodeOptions {
    std::optional<Shape> tile_shape;  ///< Default: DefaultTileShape(global_shape).
    DuplicatePolicy duplicates = DuplicatePolicy::kError;
    int num_threads = 0;  ///< 0: all hardware threads.
};

/// The four members of a sparse object plus its descriptor. For a source object
/// `coordinate_space` is "global"; for a target-local object it is "local" and `desc.box` is
/// the target box (its origin is what was subtracted).
struct SparseObject {
    SourceDescriptor desc;
    std::string coordinate_space = "global";
    ByteBuffer indices;                  ///< [nnz, rank] of desc.index_dtype
    ByteBuffer values;                   ///< [nnz] of desc.value_dtype
    std::vector<TileCoord> tile_coords;  ///< [num_tiles, rank]
    std::vector<std::uint64_t> tile_ptr; ///< [num_tiles + 1]
    std::uint64_t checksum_indices = 0;  ///< XXH3-64 of each member's bytes
    std::uint64_t checksum_values = 0;
    std::uint64_t checksum_tile_coords = 0;
    std::uint64_t checksum_tile_ptr = 0;

    std::uint64_t PayloadBytes() const {
        return indices.size() + values.size() + tile_coords.size() * sizeof(TileCoord) +
               tile_ptr.size() * sizeof(std::uint64_t);
    }
};

/// XXH3-64 of a byte span.
std::uint64_t Checksum(std::span<const std::byte> bytes);

/// Builds a source object from a global COO. `desc` supplies tensor_id, global_shape, box,
/// generation, placement, policy and apply (its nnz, tile_shape, num_tiles and dtypes are
/// filled in here). `indices` is [nnz, rank] of any integer dtype (signed values must be >= 0;
/// for rank 1, [nnz] is accepted too), `values` is [nnz] of a numeric dtype. Every coordinate
/// must lie in desc.box (a default-constructed, rank-0 box means the whole tensor). Entries are
/// sorted by (tile, element) — skipped when the input already is — duplicates are rejected or
/// summed (in input order; floats accumulate in float32 for 16-bit types and float64 for
/// float32/float64, integers wrap), and indices are narrowed to NarrowestIndexDType(max extent).
/// desc.source_ref may be empty (the store assigns it at commit); every other descriptor field
/// is validated with SourceDescriptor::Make.
/// Errors: InvalidArgument (shapes, dtypes, out-of-box coordinates with the first offender,
/// duplicates, duplicates="sum" with overwrite or float8 values, bad tile shape, bad
/// descriptor, negative num_threads).
Result<SparseObject> BuildSparseObject(SourceDescriptor desc, const HostArray& indices,
                                       const HostArray& values, const EncodeOptions& options = {});

/// A COO whose arrays BuildSparseObject may take over (no copy when they already are what the
/// object holds): `indices` [nnz, rank] of `index_dtype`, `values` [nnz] of `value_dtype`.
struct OwnedCoo {
    DType index_dtype = DType::kUInt16;
    DType value_dtype = DType::kBFloat16;
    std::uint64_t nnz = 0;
    ByteBuffer indices;
    ByteBuffer values;
};

/// BuildSparseObject on arrays it takes ownership of. The result, and every error, is exactly
/// that of BuildSparseObject on views of the same bytes. When the entries are already sorted by
/// (tile, element) without duplicates, of rank 2 and of the narrowest index dtype (what a
/// filtered, rebased range of a sorted object is), the arrays become the object's members as
/// they are: one pass checks the order and bounds and builds the tile index, with no key array,
/// sort or gather.
/// Errors: as BuildSparseObject.
Result<SparseObject> BuildSparseObject(SourceDescriptor desc, OwnedCoo coo,
                                       const EncodeOptions& options = {});

/// BuildSparseObject on views, trying the sorted fast path first: entries already sorted by
/// (tile, element), rank 2, of the narrowest index dtype (what encode_update returns, on the
/// host or the GPU) are copied as they are after one pass that checks them and builds the tile
/// index; anything else goes to BuildSparseObject. Same results and errors.
Result<SparseObject> BuildSparseObjectSortedFirst(SourceDescriptor desc, const HostArray& indices,
                                                  const HostArray& values,
                                                  const EncodeOptions& options);

/// The sorted fast path without the copy: for entries BuildSparseObjectSortedFirst would take
/// as they are, the object's descriptor, tile index and checksums, with its indices and values
/// left empty (they are exactly `indices` and `values`, which the caller keeps). nullopt when
/// they are not canonical (BuildSparseObject then decides, errors included).
std::optional<SparseObject> IndexCanonicalEntries(SourceDescriptor desc, const HostArray& indices,
                                                  const HostArray& values,
                                                  const EncodeOptions& options);

/// The dtypes, shapes and byte sizes of a COO whose bytes are not in host memory (device
/// memory): what IndexCanonicalEntries checks before it reads an entry.
struct CooLayout {
    DType index_dtype = DType::kUInt16;
    Shape index_shape;  ///< [nnz, rank]
    std::uint64_t index_bytes = 0;
    DType value_dtype = DType::kBFloat16;
    Shape value_shape;  ///< [nnz]
    std::uint64_t value_bytes = 0;
};

/// IndexCanonicalEntries in two halves, for entries that are checked, indexed and checksummed
/// where they lie (on a GPU). PlanCanonicalEntries makes every check that reads no entry and
/// returns the descriptor the object will have (box, tile_shape, index and value dtypes and nnz
/// set; num_tiles 0), or nullopt where IndexCanonicalEntries returns nullopt whatever the
/// entries hold (rank other than 2, no entries, an index dtype other than the narrowest,
/// duplicates to coalesce, ...). The entries then are canonical when every coordinate lies in
/// the planned box and they strictly increase in (tile row-major, element row-major) order for
/// the planned tile shape; otherwise IndexCanonicalEntries returns nullopt for them too.
std::optional<SourceDescriptor> PlanCanonicalEntries(SourceDescriptor desc, const CooLayout& coo,
                                                     const EncodeOptions& options);

/// The second half: the object IndexCanonicalEntries returns for canonical entries of a plan,
/// from their tile index (`tile_coords` [num_tiles, 2], `tile_ptr` [num_tiles + 1], as the
/// sorted fast path builds it) and the XXH3-64 checksums of their indices and values bytes (the
/// tile index's own are computed here). nullopt when the tile index does not fit the plan or
/// the final descriptor does not validate.
std::optional<SparseObject> FinishCanonicalEntries(SourceDescriptor planned,
                                                   std::vector<TileCoord> tile_coords,
                                                   std::vector<std::uint64_t> tile_ptr,
                                                   std::uint64_t checksum_indices,
                                                   std::uint64_t checksum_values);

/// The result of EncodeUpdate: a global COO already sorted by (tile, element) for
/// `tile_shape`, so BuildSparseObject takes it without sorting.
struct EncodedUpdate {
    DType index_dtype = DType::kUInt16;
    DType value_dtype = DType::kBFloat16;
    std::size_t rank = 0;
    std::uint64_t nnz = 0;
    Shape tile_shape;
    std::vector<std::byte> indices;  ///< [nnz, rank] of index_dtype (narrowest)
    std::vector<std::byte> values;   ///< [nnz] of value_dtype
};

struct EncodeUpdateOptions {
    ApplyMode apply = ApplyMode::kOverwrite;
    /// scatter_add only: keep |new - old| > threshold (0: every non-zero difference).
    double threshold = 0.0;
    std::optional<Shape> tile_shape;
    int num_threads = 0;
};

/// Dense (new, old) -> global COO. Overwrite keeps coordinates whose bits differ, with the new
/// values (bit-exact, NaN-safe); scatter_add keeps `new - old` where |new - old| > threshold,
/// computed in float32 for 16-bit floats and rounded back to the value dtype (a delta that
/// rounds to zero is dropped; a NaN delta is kept, so a weight turning NaN is not hidden;
/// integer deltas wrap, so the wrapping apply restores `new` exactly, while the threshold
/// compares the true |new - old|). Walks the tensor tile row by tile row and orders each tile
/// row by tile, so the output is born sorted; multi-threaded over tile rows.
/// Errors: InvalidArgument (shape/dtype mismatch, non-numeric dtype, overwrite with a
/// threshold, a negative or NaN threshold, scatter_add of float8, negative num_threads).
Result<EncodedUpdate> EncodeUpdate(const HostArray& new_values, const HostArray& old_values,
                                   const EncodeUpdateOptions& options = {});

/// One (new, old) pair of EncodeUpdates.
struct EncodePair {
    HostArray new_values;
    HostArray old_values;
};

/// EncodeUpdate for a batch (a step's tensors): one result per pair, each as EncodeUpdate
/// returns it. Small tensors encode side by side on up to options.num_threads threads, large
/// ones one after another, each on all of them.
std::vector<Result<EncodedUpdate>> EncodeUpdates(std::span<const EncodePair> pairs,
                                                 const EncodeUpdateOptions& options = {});

/// Applies a COO in local coordinates to a weight in place: W[idx] = v (overwrite, bit-exact)
/// or W[idx] += v (scatter_add; 16-bit floats accumulate in float32 and round to nearest even;
/// integers wrap). `indices` is [nnz, rank] of an unsigned dtype ([nnz] for rank 1), `values`
/// [nnz] of the weight's dtype. Repeated coordinates are applied in entry order (scatter_add
/// sums them, overwrite keeps the last) for any `num_threads`: threads split the weight, not
/// the entries, so the result is always that of a sequential apply.
/// A strided weight is written in place, through its strides.
/// Errors: InvalidArgument (dtype or rank mismatch, a coordinate outside the weight — checked
/// for every entry before any write, so a bad object leaves the weight unchanged — scatter_add
/// of float8, negative num_threads, a strided weight whose elements overlap or whose span does
/// not match its strides).
Status ApplySparse(const MutableHostArray& weight, const HostArray& indices,
                   const HostArray& values, ApplyMode apply, int num_threads = 0);

/// One weight and the COO to apply to it (ApplySparseBatch).
struct ApplyItem {
    MutableHostArray weight;
    HostArray indices;
    HostArray values;
    ApplyMode apply = ApplyMode::kOverwrite;
};

/// ApplySparse for a batch (a step's target objects into their weights): one Status per item,
/// each as ApplySparse returns it (a bad item leaves its weight unchanged; the others apply).
/// Small items run side by side on up to `num_threads` threads (0: the hardware's), large ones
/// one after another, each on all of them. Items whose weights share memory (views of one
/// tensor) apply one after another, in batch order, so the result is that of a sequential loop.
std::vector<Status> ApplySparseBatch(std::span<const ApplyItem> items, int num_threads = 0);

/// Appends to `out_indices`/`out_values` the entries `[0, count)` of a range read (indices of
/// `in_index_dtype`, rank `rank`, values of `value_bytes` each) that lie in `overlap` (only
/// tested when `filter`), rebased by `origin`, with indices written as `out_index_dtype`.
/// Returns the number of entries kept. Preconditions: both dtypes unsigned (uint16/32/64),
/// `origin` <= every kept coordinate, and rebased coordinates fit `out_index_dtype`; `count`
/// is clamped to what the input spans hold. Rank 2 with 2-byte values has its own fast path.
std::uint64_t FilterRebase(std::span<const std::byte> in_indices,
                           std::span<const std::byte> in_values, std::uint64_t count,
                           std::size_t rank, DType in_index_dtype, std::size_t value_bytes,
                           const Box& overlap, bool filter, std::span<const Index> origin,
                           DType out_index_dtype, std::vector<std::byte>& out_indices,
                           std::vector<std::byte>& out_values);

/// FilterRebase into caller memory: writes the kept entries at the start of `out_indices` /
/// `out_values`, which must hold `count` entries each (of `out_index_dtype`, `value_bytes`), and
/// returns how many it kept. Same preconditions as FilterRebase; returns 0 when an output span
/// is too small.
std::uint64_t FilterRebaseInto(std::span<const std::byte> in_indices,
                               std::span<const std::byte> in_values, std::uint64_t count,
                               std::size_t rank, DType in_index_dtype, std::size_t value_bytes,
                               const Box& overlap, bool filter, std::span<const Index> origin,
                               DType out_index_dtype, std::span<std::byte> out_indices,
                               std::span<std::byte> out_values);

/// Builds the tile index of an object whose indices are already sorted by (tile, element) for
/// `tile_shape` (relative to coordinate 0 of its coordinate space); fills tile_coords/tile_ptr.
/// Errors: InvalidArgument when the entries are not sorted.
Status BuildTileIndex(SparseObject& object);

/// Recomputes the four member checksums.
void UpdateChecksums(SparseObject& object);

/// Converts between 16-bit floats and float32 (round to nearest even).
float BFloat16ToFloat(std::uint16_t v);
std::uint16_t FloatToBFloat16(float v);
float Float16ToFloat(std::uint16_t v);
std::uint16_t FloatToFloat16(float v);

}  // namespace mooncake::sparse
