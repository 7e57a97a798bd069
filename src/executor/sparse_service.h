// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// SparseService: the operations of the sparse object layer (docs/design.md §2-4, §9) as one
// interface, in the executor types defined here (requests, results, read options, step
// manifests, read views). Two implement it: SparseStore (sparse_store.h), which runs them
// in this process over any ObjectStore, and the node daemon's client (node/node_client.h), which
// runs them in the daemon, where the node-local caches serve every process of the node.
//
// Why it is built this way:
// - One set of argument and result types whichever side does the work, so that a caller (the
//   Python binding, a tool) is written once and picks a backend at construction only.
// - Where the two differ in representation, the interface hides it: a read returns views
//   (TargetObjectView) whose bytes are owned by the view's keepalive — the SparseStore's own
//   TargetObject, or a lease on the daemon's read-only segment memory — never a type to cast to.
// - The tensor fast path over the same backend (TensorStore) is made by the service itself, so
//   no caller needs to know which kind of ObjectStore lies underneath.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codec/codec.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/planner.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"

namespace mooncake::sparse {

class TensorStore;               // executor/tensor_store.h
struct LocalTensorStoreOptions;  // executor/tensor_store.h

/// One put_sparse_object call.
struct PutSparseRequest {
    std::string tensor_id;
    Shape global_shape;
    std::optional<Shape> global_offset;  ///< Source box origin; default zeros.
    std::optional<Shape> local_shape;    ///< Source box extents; default global_shape.
    HostArray indices;                   ///< [nnz, rank] global coordinates, any integer dtype.
    HostArray values;                    ///< [nnz].
    NamedAxes source_placement;
    PlacementPolicy placement_policy;
    Generation generation;
    ApplyMode apply = ApplyMode::kOverwrite;
    EncodeOptions encode;
    bool hard_pin = true;  ///< Source objects are never evicted while referenced.
};

struct CommitResult {
    std::string source_ref;
    bool created = false;  ///< False when an identical commit already existed (idempotent).
    std::uint64_t nnz = 0;
    std::uint64_t bytes = 0;
};

/// One admission of SparseService::AdmitBatch (Admit's arguments).
struct AdmitRequest {
    std::string tensor_id;
    Generation generation;
    PlacementPolicy policy;
    NamedAxes source_placement;
    std::string writer_id;
};

/// Where the entries of one indexed object go in a PutIndexedObjects commit: its indices and
/// values members in their final memory in the store (no staging), not yet visible.
struct EntryTarget {
    std::size_t object = 0;        ///< Into the PutIndexedObjects batch.
    std::span<std::byte> indices;  ///< Exactly nnz * rank * index dtype size bytes.
    std::span<std::byte> values;   ///< Exactly nnz * value dtype size bytes.
    bool pinned = false;           ///< Page-locked: a device-to-host copy runs at full speed.
};

/// Writes the entries of every target (e.g. device-to-host copies that have completed when it
/// returns). An error abandons the whole commit: nothing of it stays in the store.
using EntryFill = std::function<Status(std::span<const EntryTarget> targets)>;

/// A target-local object: entries in the target's local coordinates (its own tile index over
/// [0, local_shape)), same apply mode as its sources.
struct TargetObject {
    std::string target_id;
    std::string node_id;
    Box target_box;  ///< Global box of the target (origin = what was subtracted).
    SparseObject object;  ///< coordinate_space == "local"; desc.global_shape == local shape.
};

enum class ReadStrategy : std::uint8_t {
    kSparseRanges = 0,   ///< The sparse path: planned range reads, deduped per node.
    kFullSourcePerTarget = 1,  ///< Baseline: every target GETs its complete sources (full_gets).
};

struct ReadOptions {
    PlanOptions plan;
    ReadStrategy strategy = ReadStrategy::kSparseRanges;
    int num_threads = 0;
    /// The manifest's index (ManifestIndex::Make(manifest)), when the caller keeps one: a
    /// manifest is fixed for a generation, so every read call of that generation can share it.
    /// nullptr builds one per call. It must have been built from the manifest passed.
    const ManifestIndex* manifest_index = nullptr;
    /// Owns the manifest's entries and keeps them unchanged, when the caller's manifest is
    /// shared (a store's kept manifest of a sealed step, a Python manifest's array): the tile
    /// indexes the node cache keeps of its sources then refer to their entries (keeping the
    /// array alive while any is cached) instead of each holding a copy. It must own the very
    /// entries the call is given (a read that derives another manifest from them passes null).
    /// Null copies.
    std::shared_ptr<const void> manifest_owner;
    /// With a store that views its objects in place (ObjectStore::ViewsInPlace: the embedded
    /// store, the node's shared-memory store), the planned ranges are materialized straight from
    /// the stored bytes, viewed under one snapshot of every source the plan reads, instead of
    /// being copied out into read buffers first: the same target objects without the copy. The
    /// node range cache is then neither used nor filled (range_cache_hits and
    /// single_flight_waits stay 0; range_gets and range_bytes_read count the ranges viewed), and
    /// a store that leases what it views (the shared-memory store) keeps those objects from
    /// being evicted or rewritten until the call returns. Ignored for other stores.
    bool view_in_place = false;
    /// ReadPlanned: whether the call returns the targets' objects (views described from their
    /// targets and the plan). False, for a caller that takes the targets from the plan alone
    /// (the node daemon planning a client's device read): no target descriptors are built and
    /// the call returns no views.
    bool describe_targets = true;
    /// ReadPlanned of a device read: a store whose ranges lie in another process (the node
    /// daemon's client) may have them copied into device memory of this process while it
    /// plans (PlannedRead::staged then says where), instead of the caller asking for the copies
    /// (PlannedRead::ranges_to_device) once the plan is back. `stream` as there; with
    /// `stream_waited`, the caller has waited for it since the store's allocations were last
    /// read there. Unset, or a store that does not, leaves `staged` empty.
    struct DeviceStaging {
        int device = -1;
        std::uintptr_t stream = 0;
        std::span<const std::byte> ready_event;  ///< As ranges_to_device's.
        bool stream_waited = false;
        /// Waits on the host until the copies the daemon queued before its last record of
        /// ready_event have run. With it, a read that fails after the daemon answered hands its
        /// allocation back to the read pool; without, the allocation is never reused.
        std::function<Status()> wait_ready;
    };
    std::optional<DeviceStaging> stage_on_device;
};

/// The manifest of one step, or of a fold of steps (docs/design.md §9). A step k is the
/// generation (k - 1, k). `generation` (j, k) with k > j + 1 is the fold of steps j+1..k: its
/// sources are those of every step in the range, step by step, and reading it gives, per target,
/// one object with the latest value per coordinate (overwrite) or the sum (scatter_add).
struct StepManifest {
    Generation generation;
    std::vector<SourceDescriptor> sources;
    /// Tensor ids the step's seal lists that have no source in the range (unchanged): their
    /// targets read as empty objects. Sorted.
    std::vector<std::string> unchanged;
    bool sealed = false;
};

/// A step manifest viewed where it lies (a StepManifest's arrays, or a caller's): what a read
/// of a step takes, so that a manifest handed to a read is never copied for it.
struct StepManifestView {
    Generation generation;
    std::span<const SourceDescriptor> sources;
    std::span<const std::string> unchanged;  ///< Sorted.

    StepManifestView(Generation g, std::span<const SourceDescriptor> s,
                     std::span<const std::string> u)
        : generation(g), sources(s), unchanged(u) {}
    // NOLINTNEXTLINE(google-explicit-constructor): a StepManifest is read as it is.
    StepManifestView(const StepManifest& m)
        : generation(m.generation), sources(m.sources), unchanged(m.unchanged) {}
};

/// (name, value) pairs in a stable order: the §4 counters (SparseMetrics::Items), and from the
/// node daemon its gauges too.
using MetricItems = std::vector<std::pair<std::string, double>>;

/// One target-local object of a read, viewed in place: the members stay valid, unchanged, for
/// as long as `keepalive` (shared by every copy of the view) lives.
struct TargetObjectView {
    std::string target_id;
    std::string node_id;
    Box target_box;         ///< Global box of the target (origin = what was subtracted).
    SourceDescriptor desc;  ///< desc.global_shape is the target's local shape.
    std::string coordinate_space;
    std::span<const std::byte> indices;      ///< [nnz, rank] of desc.index_dtype
    std::span<const std::byte> values;       ///< [nnz] of desc.value_dtype
    std::span<const std::byte> tile_coords;  ///< [num_tiles, rank] uint32
    std::span<const std::byte> tile_ptr;     ///< [num_tiles + 1] uint64
    std::uint64_t checksum_indices = 0;
    std::uint64_t checksum_values = 0;
    std::uint64_t checksum_tile_coords = 0;
    std::uint64_t checksum_tile_ptr = 0;
    /// Owns (or leases) the bytes the members view.
    std::shared_ptr<const void> keepalive;
    /// A node daemon's read: the lease of the members and the connection that holds it (an
    /// address the keepalive keeps alive, compared, never dereferenced). 0 / null otherwise.
    std::uint64_t lease_id = 0;
    const void* lease_scope = nullptr;

    std::uint64_t nbytes() const {
        return indices.size() + values.size() + tile_coords.size() + tile_ptr.size();
    }

    /// A view that owns `object` (a SparseStore read result).
    static TargetObjectView Owning(TargetObject&& object);
};

/// A read planned by the store and handed, with its unique entry ranges viewed where the store
/// holds them, to a caller that builds the target objects itself (the device read gathers,
/// filters and rebases on the GPU). Everything here is valid only during the PlannedReadFn call.
struct PlannedRead {
    /// One unique entry range of a source: read once for every target that needs it.
    struct Range {
        std::span<const std::byte> indices;  ///< [count, rank] of the source's index dtype
        std::span<const std::byte> values;   ///< [count] of the source's value dtype
        std::uint32_t source = 0;            ///< Into `manifest`.
        bool pinned = false;                 ///< Page-locked host memory.
        /// The store's view of the source the range lies in (null where the ranges are not
        /// viewed in place): a store-specific call takes it instead of the source's key.
        const ObjectView* view = nullptr;
    };
    /// Entries [begin, begin + count) of one range that a target takes: all of them, or with
    /// `filter` those inside `overlap` (a boundary tile's), rebased by the target's origin.
    struct Piece {
        std::uint32_t range = 0;
        std::uint64_t begin = 0;
        std::uint64_t count = 0;
        bool filter = false;
        Box overlap;  ///< Global coordinates.
    };
    /// A target's pieces are pieces[first_piece, end_piece): their kept entries, concatenated in
    /// this order, are the target's entries, in the sources' (tile, element) order (the order
    /// of the target's own tiles when its origin lies on the sources' tile grid).
    struct Target {
        std::size_t first_piece = 0;
        std::size_t end_piece = 0;
        DType index_dtype = DType::kUInt16;  ///< Of its local coordinates (narrowest for its box).
        DType value_dtype = DType::kUInt8;
        std::uint64_t capacity = 0;          ///< Sum of its pieces' counts: a bound on its nnz.
        /// The source (into `manifest`) whose descriptor gives the target's generation, apply
        /// mode, value dtype and tile shape (PlannedTargetDescriptor); kNoSource for a target
        /// of a tensor the step leaves unchanged.
        std::uint32_t first_source = kNoSource;
    };
    static constexpr std::uint32_t kNoSource = 0xffffffffu;

    /// Where a store whose ranges lie in another process (the node daemon's client) has them
    /// copied into device memory of this process: every range's indices at `at[2 * r]` and
    /// values at `at[2 * r + 1]` bytes into an allocation of at least `total` bytes on
    /// `device`, written once work queued on `stream` before the call has run (with
    /// `stream_waited`, the caller has waited for `stream` itself since any allocation the
    /// store could hand out was last read there: a read in several parts waits once, before
    /// its first part, and its parts' copies then overlap). Returns the allocation's address
    /// and what keeps it; the caller keeps that until its kernels that read the ranges have
    /// finished. With `ready_event` (a CUDA IPC event handle of the caller's, 64 bytes) the
    /// store may answer before the copies are done (`copied` false): it has then recorded that
    /// event after them, and the caller's work that reads the ranges must wait on it. Unset:
    /// the caller reads the ranges at their addresses.
    struct DeviceRanges {
        std::uintptr_t address = 0;
        std::shared_ptr<const void> owner;
        bool copied = true;
    };
    std::function<Result<DeviceRanges>(std::span<const std::uint64_t> at, std::uint64_t total,
                                       int device, std::uintptr_t stream,
                                       std::span<const std::byte> ready_event,
                                       bool stream_waited)>
        ranges_to_device;
    /// Set when the store copied the ranges while planning (ReadOptions::stage_on_device):
    /// range r's indices at `staged_at[2 * r]` and values at `staged_at[2 * r + 1]` bytes past
    /// `staged->address`, `staged->copied` as ranges_to_device's. ranges_to_device is then
    /// not needed.
    std::optional<DeviceRanges> staged;
    std::vector<std::uint64_t> staged_at;

    std::span<const SourceDescriptor> manifest;
    std::span<const TargetDescriptor> targets;
    std::vector<Range> ranges;
    std::vector<Piece> pieces;
    std::vector<Target> per_target;  ///< Same order as `targets`.
    /// Set by the callback: the entries each target kept (same order as `targets`).
    std::vector<std::uint64_t> kept;
};

/// Builds a planned read's target objects; its error is the read's.
using PlannedReadFn = std::function<Status(PlannedRead& read)>;

/// Where a device read places a planned read's ranges in one staging allocation. The range
/// members (indices and values) are laid out in host address order, in runs: a member that
/// starts inside the run so far, or at most kMaxGap bytes past its end, keeps its distance from
/// the run's first byte, so that one copy moves the run, gaps included (an object's indices
/// and values, and objects stored next to each other); a run starts at the offset of its host
/// address modulo 16 (a gather then moves 16-byte words). `at[2 * r]`, `at[2 * r + 1]`: range
/// r's indices and values; `follows[m]`: member m (2 * r + k) lies in the run of range r - 1's
/// same member, of the same source, at or past its end (one copy may extend the other for a
/// caller that knows only each member of one object to be one allocation); `total`: the bytes
/// the layout spans.
struct StagingLayout {
    static constexpr std::ptrdiff_t kMaxGap = 4096;
    std::vector<std::uint64_t> at;
    std::vector<bool> follows;
    std::uint64_t total = 0;
};
StagingLayout LayOutStaging(std::span<const PlannedRead::Range> ranges);

/// The descriptor of a planned read's target but its nnz (and tile count): local coordinates
/// of its box in the narrowest index dtype, and the generation, apply mode, value dtype and tile
/// shape (clipped to the box) of `first` (PlannedRead::Target::first_source), or of an empty
/// object of step `step` when null.
/// Errors: InvalidArgument (a box that is not a valid shape).
Result<SourceDescriptor> PlannedTargetDescriptor(const TargetDescriptor& target,
                                                 const SourceDescriptor* first, Generation step);

/// What a read decides about one target-local object. The rest of its descriptor follows from
/// its target, the same for every read (TargetObjectDescriptor).
struct TargetObjectFacts {
    Generation generation;
    ApplyMode apply = ApplyMode::kOverwrite;
    DType index_dtype = DType::kUInt16;
    DType value_dtype = DType::kBFloat16;
    Shape tile_shape;
    std::uint64_t nnz = 0;
    std::uint64_t num_tiles = 0;
};

/// The descriptor of `target`'s object: source_ref "target/<target_id>/<tensor_id>", the
/// target's tensor_id and placement, its box's shape as the global shape and the whole of it as
/// the box (local coordinates), and `facts`. What a store's read gives every target object, so
/// that a reply across a process boundary need only carry the facts.
/// Errors: InvalidArgument (as SourceDescriptor::Make).
Result<SourceDescriptor> TargetObjectDescriptor(const TargetDescriptor& target,
                                                TargetObjectFacts facts);

/// The target objects of a planned read once its build set `read.kept`: `descs[t]` (from
/// PlannedTargetDescriptor) completed with target t's kept entries, members left for the
/// builder to set.
/// Errors: Internal (a kept count missing, or above the target's capacity).
Result<std::vector<TargetObjectView>> PlannedTargetViews(const PlannedRead& read,
                                                         std::vector<SourceDescriptor> descs);

class SparseService {
public:
    virtual ~SparseService() = default;

    // ---- Commit side (SparseStore documents the semantics and errors of each). -------------
    /// Validates, encodes and commits one source object (idempotent by logical key).
    virtual Result<CommitResult> PutSparseObject(const PutSparseRequest& request) = 0;
    /// A batch of commits (a step's updates): one result per request, in order; a bad request
    /// fails alone and leaves nothing of itself behind. The default commits them one by one.
    virtual std::vector<Result<CommitResult>> PutSparseObjects(
        std::span<const PutSparseRequest> requests, int num_threads = 0);
    /// A batch of objects built already (descriptor, tile index and checksums), some of them
    /// indexed without their entries, which `fill` writes straight into the store's memory
    /// (a commit from GPU memory): one result per object, in order, as CommitSparseObjects
    /// gives them. The default: Unimplemented (the caller commits through PutSparseObjects).
    virtual Result<std::vector<Result<CommitResult>>> PutIndexedObjects(
        std::vector<SparseObject> objects, const std::vector<bool>& hard_pin,
        const EntryFill& fill, int num_threads = 0) {
        (void)objects, (void)hard_pin, (void)fill, (void)num_threads;
        return Unimplemented("this store does not commit indexed objects");
    }
    /// Single-owner admission among writers racing for one logical key.
    virtual Result<bool> Admit(std::string_view tensor_id, Generation generation,
                               const PlacementPolicy& policy, const NamedAxes& source_placement,
                               std::string_view writer_id) = 0;
    /// Admit of every item, in order, each with its own outcome (a trainer's boxes of a step
    /// in one call; through the node daemon, one request). The default: Admit per item.
    virtual std::vector<Result<bool>> AdmitBatch(std::span<const AdmitRequest> items) {
        std::vector<Result<bool>> out;
        out.reserve(items.size());
        for (const AdmitRequest& r : items) {
            out.push_back(Admit(r.tensor_id, r.generation, r.policy, r.source_placement,
                                r.writer_id));
        }
        return out;
    }
    /// The tensor's current generation (the last committed delta), if any.
    virtual Result<std::optional<Generation>> CurrentGeneration(std::string_view tensor_id) = 0;

    // ---- Manifests and the steps of a run (docs/design.md §9). -----------------------------
    virtual Result<std::vector<SourceDescriptor>> Manifest(Generation generation) = 0;
    /// The manifest of a step, or the fold of the sealed steps j+1..k.
    virtual Result<StepManifest> GetManifest(Generation generation) = 0;
    virtual Status SealGeneration(Generation generation,
                                  std::span<const std::string> tensor_ids) = 0;
    /// Blocks until `generation` is sealed (a negative timeout waits for ever).
    virtual Result<StepManifest> WaitGeneration(Generation generation,
                                                double timeout_seconds) = 0;
    virtual Result<std::optional<Generation>> LatestGeneration() = 0;
    virtual Status SetRetention(std::uint64_t keep_last) = 0;
    virtual Result<std::uint64_t> Retention() = 0;
    virtual Status RecordAnchor(Generation step, std::span<const std::string> tensor_ids) = 0;
    virtual Result<std::optional<Generation>> LatestAnchor() = 0;
    virtual Status SetKeepAnchors(std::uint64_t keep_anchors) = 0;

    // ---- Read side: SparseStore::ReadSparseObjects, its results as views. --------------------
    /// One target-local object per target, same order. `options.manifest_index` is a hint only
    /// an in-process store uses.
    virtual Result<std::vector<TargetObjectView>> ReadViews(
        std::span<const SourceDescriptor> manifest, std::span<const TargetDescriptor> targets,
        const ReadOptions& options) = 0;
    /// The same on a step manifest (unchanged tensors read as empty objects; folds merged).
    virtual Result<std::vector<TargetObjectView>> ReadViews(
        const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
        const ReadOptions& options) = 0;
    /// A read whose target objects `build` makes from the planned ranges, viewed in place
    /// (PlannedRead). Returns one view per target, same order, holding the target's descriptor
    /// (nnz = what `build` kept, no tile index: num_tiles 0) and no member bytes: the members are
    /// wherever `build` put them. A fold of several steps is not planned this way.
    /// Errors: Unimplemented (this service or store cannot view its ranges in place, or the
    /// manifest is a fold: read with ReadViews); as ReadViews; whatever `build` returns.
    virtual Result<std::vector<TargetObjectView>> ReadPlanned(
        const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
        const ReadOptions& options, const PlannedReadFn& build) {
        (void)manifest, (void)targets, (void)options, (void)build;
        return Unimplemented("this store does not hand out planned reads");
    }

    // ---- Observability and upkeep. --------------------------------------------------------
    /// The metrics of the layer; `reset` zeroes the §4 counters once they are taken.
    virtual Result<MetricItems> Metrics(bool reset) = 0;
    /// Drops the node-local index and range caches.
    virtual Status ClearCaches() = 0;
    /// The counters of the ObjectStore the layer works on (the daemon's own store, for its
    /// client: not the RPCs this process sent).
    virtual Result<StoreCounters> ObjectCounters() = 0;
    /// The keys of the ObjectStore under `prefix`, sorted.
    virtual Result<std::vector<std::string>> ListKeys(std::string_view prefix) = 0;
    /// The ObjectStore this process reaches the layer's objects through (for a daemon's client,
    /// the client itself: every call an RPC).
    virtual ObjectStore& object_store() = 0;

    /// The tensor fast path (docs/design.md §5) over the same backend. `options` apply to an
    /// in-process store; the node daemon's own configuration decides for its clients.
    virtual std::unique_ptr<TensorStore> MakeTensorStore(
        const LocalTensorStoreOptions& options) = 0;
};

}  // namespace mooncake::sparse
