// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The sparse object conversation of the node daemon's protocol (src/executor/sparse_store.h run
// by the daemon, whose node-local caches then serve every process of the node):
//
//     SparseCommitRequest            -> SparseCommitReply
//     SparseCommitBatchRequest       -> SparseCommitBatchReply
//     SparseCommitDeviceRequest      -> SparseCommitBatchReply   (entries in client CUDA memory)
//     SparseAdmitRequest             -> SparseAdmitReply
//     SparseAdmitBatchRequest        -> SparseAdmitBatchReply
//     SparseManifestRequest          -> SparseManifestReply
//     SparseCurrentGenerationRequest -> SparseCurrentGenerationReply
//     SparseReadRequest              -> SparseReadReply (target objects in segments, leased)
//     SparseReadStepRequest          -> SparseReadReply (the same, a sealed step by its generation)
//     LeasesToDeviceRequest          -> OkReply   (leased members into client CUDA memory)
//     SparseReadPlanRequest          -> SparseReadPlanReply (a read's ranges, pieces; leased)
//     LeaseRangesToDeviceRequest     -> OkReply   (leased byte ranges into client CUDA memory)
//     MetricsRequest                 -> MetricsReply
//     ClearCachesRequest             -> OkReply        drops the daemon's node-local caches
//                                                      and its manifests of sealed steps
//
// and the steps of a training run (docs/design.md §9):
//
//     SparseStepManifestRequest      -> SparseStepManifestReply
//     SparseSealRequest              -> OkReply
//     SparseWaitRequest              -> SparseStepManifestReply   (blocks up to its timeout)
//     SparseLatestRequest            -> SparseLatestReply
//     SparseRetentionRequest         -> SparseRetentionReply
//     SparseAnchorRequest            -> OkReply
//
// Each message lists its fields once (wire_format.h); the list is the wire order.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "mooncake/sparse/planner.h"
#include "node/wire_common.h"
#include "node/wire_tensor.h"

namespace mooncake::sparse::wire {

/// A member the client wrote into its buffer, with its checksum (XXH3-64 of the bytes).
struct ClientMember {
    BufferRef src;
    std::uint64_t checksum = 0;

    static void Fields(auto& v, auto& m) {
        v("src", m.src);
        v("checksum", m.checksum);
    }
    friend bool operator==(const ClientMember&, const ClientMember&) = default;
};

/// SparseStore::CommitSparseObject of an object the client encoded (codec BuildSparseObject):
/// the descriptor plus its four members in the client's buffer.
struct SparseCommitRequest {
    static constexpr MessageType kType = MessageType::kSparseCommit;
    SourceDescriptor desc;
    std::string coordinate_space = "global";  ///< "global" or "local".
    ClientMember indices;      ///< [nnz, rank] of desc.index_dtype
    ClientMember values;       ///< [nnz] of desc.value_dtype
    ClientMember tile_coords;  ///< [num_tiles, rank] uint32
    ClientMember tile_ptr;     ///< [num_tiles + 1] uint64
    bool hard_pin = true;

    static void Fields(auto& v, auto& m) {
        v("desc", m.desc);
        v("coordinate_space", m.coordinate_space, kMaxNameBytes);
        v("indices", m.indices);
        v("values", m.values);
        v("tile_coords", m.tile_coords);
        v("tile_ptr", m.tile_ptr);
        v("hard_pin", m.hard_pin);
    }
    Status Validate() const { return CheckCoordinateSpace(coordinate_space); }
    friend bool operator==(const SparseCommitRequest&, const SparseCommitRequest&) = default;
};

/// SparseStore CommitResult.
struct SparseCommitReply {
    static constexpr MessageType kType = MessageType::kSparseCommitReply;
    std::string source_ref;
    bool created = false;
    std::uint64_t nnz = 0;
    std::uint64_t bytes = 0;

    static void Fields(auto& v, auto& m) {
        v("source_ref", m.source_ref, kMaxKeyBytes);
        v("created", m.created);
        v("nnz", m.nnz);
        v("bytes", m.bytes);
    }
    friend bool operator==(const SparseCommitReply&, const SparseCommitReply&) = default;
};

/// SparseStore::CommitSparseObjects of a batch the client encoded: each item as one
/// SparseCommitRequest (their members in the client's buffer), committed together.
struct SparseCommitBatchRequest {
    static constexpr MessageType kType = MessageType::kSparseCommitBatch;
    std::vector<SparseCommitRequest> items;

    static void Fields(auto& v, auto& m) { v("items", m.items, kMaxBatchItems); }
    Status Validate() const {
        for (const SparseCommitRequest& item : items) MCS_RETURN_IF_ERROR(item.Validate());
        return Status::Ok();
    }
    friend bool operator==(const SparseCommitBatchRequest&,
                           const SparseCommitBatchRequest&) = default;
};

/// One item's outcome: its CommitResult, or its error (code != 0, `message`).
struct SparseCommitOutcome {
    std::int32_t code = 0;
    std::string message;
    SparseCommitReply result;

    static void Fields(auto& v, auto& m) {
        v("code", m.code);
        v("message", m.message, kMaxMessageBytes);
        v("result", m.result);
    }
    friend bool operator==(const SparseCommitOutcome&, const SparseCommitOutcome&) = default;
};

/// Per item of a SparseCommitBatchRequest, in order.
struct SparseCommitBatchReply {
    static constexpr MessageType kType = MessageType::kSparseCommitBatchReply;
    std::vector<SparseCommitOutcome> items;

    static void Fields(auto& v, auto& m) { v("items", m.items, kMaxBatchItems); }
    friend bool operator==(const SparseCommitBatchReply&,
                           const SparseCommitBatchReply&) = default;
};

template <>
struct EnumTraits<DuplicatePolicy>
    : EnumRange<std::uint8_t, 0, static_cast<std::uint8_t>(DuplicatePolicy::kLast)> {
    static constexpr std::string_view kUnknown = "unknown duplicate policy";
};

/// One array of an update in the client's CUDA memory (C-contiguous): `size` bytes at `offset`
/// of the request's `memory`, which holds every member of the request (one allocation exported
/// once, so that an update carries no handle of its own).
struct DeviceMember {
    DType dtype = DType::kUInt8;
    Shape shape;
    std::uint64_t offset = 0;  ///< From the start of SparseCommitDeviceRequest::memory.
    std::uint64_t size = 0;    ///< The array's bytes; offset + size never overflows (checked).

    static void Fields(auto& v, auto& m) {
        v("dtype", m.dtype);
        v("member shape", m.shape, kMaxRank);
        v("member offset", m.offset);
        v("member size", m.size);
    }
    Status Validate() const;
    friend bool operator==(const DeviceMember&, const DeviceMember&) = default;
};

/// One put_sparse_object update as the caller gave it (executor PutSparseRequest), its entries
/// in the client's CUDA memory: the daemon copies them from the device and encodes them itself.
struct DeviceUpdate {
    std::string tensor_id;
    Shape global_shape;
    std::optional<Shape> global_offset;
    std::optional<Shape> local_shape;
    NamedAxes source_placement;
    PlacementPolicy policy;
    Generation generation;
    ApplyMode apply = ApplyMode::kOverwrite;
    std::optional<Shape> tile_shape;
    DuplicatePolicy duplicates = DuplicatePolicy::kError;
    bool hard_pin = true;
    DeviceMember indices;  ///< [nnz, rank], any integer dtype.
    DeviceMember values;   ///< [nnz].

    static void Fields(auto& v, auto& m) {
        v("tensor_id", m.tensor_id, kMaxNameBytes);
        v("global_shape", m.global_shape, kMaxRank);
        v("global_offset", m.global_offset, kMaxRank);
        v("local_shape", m.local_shape, kMaxRank);
        v("source_placement", m.source_placement);
        v("policy", m.policy);
        v("generation", m.generation);
        v("apply", m.apply);
        v("tile_shape", m.tile_shape, kMaxRank);
        v("duplicates", m.duplicates);
        v("hard_pin", m.hard_pin);
        v("indices", m.indices);
        v("values", m.values);
    }
    friend bool operator==(const DeviceUpdate&, const DeviceUpdate&) = default;
};

/// SparseStore::PutSparseObjects of updates whose entries are in the client's CUDA memory
/// (e.g. a batch encoded on the GPU): the daemon copies them from the device into its own
/// (pinned) memory by CUDA IPC, in a few large copies, then validates, encodes and commits them
/// as an in-process batch commit does. Each update fails alone. Replied by
/// SparseCommitBatchReply, per item in order.
struct SparseCommitDeviceRequest {
    static constexpr MessageType kType = MessageType::kSparseCommitDevice;
    /// kCudaIpc: the client's memory that holds every member (ref.size: the span the members'
    /// offsets and sizes lie in).
    TensorLocation memory;
    std::vector<DeviceUpdate> items;

    static void Fields(auto& v, auto& m) {
        v("memory", m.memory);
        v("items", m.items, kMaxBatchItems);
    }
    Status Validate() const;
    friend bool operator==(const SparseCommitDeviceRequest&,
                           const SparseCommitDeviceRequest&) = default;
};

/// One member of an object this connection leases, copied to `offset` of the destination.
struct LeaseMemberCopy {
    std::uint64_t lease_id = 0;
    std::string member;  ///< "indices", "values", ...
    std::uint64_t offset = 0;

    static void Fields(auto& v, auto& m) {
        v("lease_id", m.lease_id);
        v("member", m.member, kMaxNameBytes);
        v("offset", m.offset);
    }
    friend bool operator==(const LeaseMemberCopy&, const LeaseMemberCopy&) = default;
};

/// Members of objects the connection leases (the target objects of its SparseReads) copied by
/// the daemon from its segments straight into a CUDA allocation of the client, by CUDA IPC:
/// read_sparse_objects(..., device="cuda") with no staging in the client. Every item is
/// checked (a lease of this connection, a member it has, inside the destination) before any
/// byte is written.
struct LeasesToDeviceRequest {
    static constexpr MessageType kType = MessageType::kLeasesToDevice;
    std::vector<LeaseMemberCopy> items;
    TensorLocation destination;  ///< kCudaIpc; ref covers the bytes the items may write.

    static void Fields(auto& v, auto& m) {
        v("items", m.items, kMaxBatchItems);
        v("destination", m.destination);
    }
    Status Validate() const;
    friend bool operator==(const LeasesToDeviceRequest&, const LeasesToDeviceRequest&) = default;
};

/// SparseStore::Admit.
struct SparseAdmitRequest {
    static constexpr MessageType kType = MessageType::kSparseAdmit;
    std::string tensor_id;
    Generation generation;
    PlacementPolicy policy;
    NamedAxes source_placement;
    std::string writer_id;

    static void Fields(auto& v, auto& m) {
        v("tensor_id", m.tensor_id, kMaxNameBytes);
        v("generation", m.generation);
        v("policy", m.policy);
        v("source_placement", m.source_placement);
        v("writer_id", m.writer_id, kMaxNameBytes);
    }
    friend bool operator==(const SparseAdmitRequest&, const SparseAdmitRequest&) = default;
};

struct SparseAdmitReply {
    static constexpr MessageType kType = MessageType::kSparseAdmitReply;
    bool admitted = false;

    static void Fields(auto& v, auto& m) { v("admitted", m.admitted); }
    friend bool operator==(const SparseAdmitReply&, const SparseAdmitReply&) = default;
};

/// SparseStore::Admit of every item, in order (a trainer's boxes of a step).
struct SparseAdmitBatchRequest {
    static constexpr MessageType kType = MessageType::kSparseAdmitBatch;
    std::vector<SparseAdmitRequest> items;

    static void Fields(auto& v, auto& m) { v("items", m.items, kMaxBatchItems); }
    friend bool operator==(const SparseAdmitBatchRequest&,
                           const SparseAdmitBatchRequest&) = default;
};

/// One item's outcome: admitted or not, or its error (code != 0, `message`).
struct SparseAdmitOutcome {
    std::int32_t code = 0;
    std::string message;
    bool admitted = false;

    static void Fields(auto& v, auto& m) {
        v("code", m.code);
        v("message", m.message, kMaxMessageBytes);
        v("admitted", m.admitted);
    }
    friend bool operator==(const SparseAdmitOutcome&, const SparseAdmitOutcome&) = default;
};

/// Per item of a SparseAdmitBatchRequest, in order.
struct SparseAdmitBatchReply {
    static constexpr MessageType kType = MessageType::kSparseAdmitBatchReply;
    std::vector<SparseAdmitOutcome> items;

    static void Fields(auto& v, auto& m) { v("items", m.items, kMaxBatchItems); }
    friend bool operator==(const SparseAdmitBatchReply&, const SparseAdmitBatchReply&) = default;
};

/// SparseStore::Manifest.
struct SparseManifestRequest {
    static constexpr MessageType kType = MessageType::kSparseManifest;
    Generation generation;

    static void Fields(auto& v, auto& m) { v("generation", m.generation); }
    friend bool operator==(const SparseManifestRequest&, const SparseManifestRequest&) = default;
};

struct SparseManifestReply {
    static constexpr MessageType kType = MessageType::kSparseManifestReply;
    std::vector<SourceDescriptor> sources;

    static void Fields(auto& v, auto& m) { v("sources", m.sources, kMaxBatchItems); }
    friend bool operator==(const SparseManifestReply&, const SparseManifestReply&) = default;
};

/// SparseStore::CurrentGeneration.
struct SparseCurrentGenerationRequest {
    static constexpr MessageType kType = MessageType::kSparseCurrentGeneration;
    std::string tensor_id;

    static void Fields(auto& v, auto& m) { v("tensor_id", m.tensor_id, kMaxNameBytes); }
    friend bool operator==(const SparseCurrentGenerationRequest&,
                           const SparseCurrentGenerationRequest&) = default;
};

struct SparseCurrentGenerationReply {
    static constexpr MessageType kType = MessageType::kSparseCurrentGenerationReply;
    std::optional<Generation> generation;

    static void Fields(auto& v, auto& m) { v("generation", m.generation); }
    friend bool operator==(const SparseCurrentGenerationReply&,
                           const SparseCurrentGenerationReply&) = default;
};

/// Mirrors executor ReadStrategy (same values); the store layer cannot include the executor.
enum class ReadStrategy : std::uint8_t {
    kSparseRanges = 0,
    kFullSourcePerTarget = 1,
};
template <>
struct EnumTraits<ReadStrategy>
    : EnumRange<std::uint8_t, 0, static_cast<std::uint8_t>(ReadStrategy::kFullSourcePerTarget)> {
    static constexpr std::string_view kUnknown = "unknown read strategy";
};

/// Mirrors executor ReadOptions.
struct SparseReadOptions {
    PlanOptions plan;  ///< read_coalesce_gap >= -1 (checked).
    ReadStrategy strategy = ReadStrategy::kSparseRanges;
    std::uint32_t num_threads = 0;  ///< 0: the daemon's default.

    static void Fields(auto& v, auto& m) {
        v("max_tiles_per_query", m.plan.limits.max_tiles_per_query);
        v("max_groups_per_query", m.plan.limits.max_groups_per_query);
        v("max_regions", m.plan.limits.max_regions);
        v("read_coalesce_gap", m.plan.read_coalesce_gap);
        v("read strategy", m.strategy);
        v("num_threads", m.num_threads);
    }
    Status Validate() const;
    friend bool operator==(const SparseReadOptions& a, const SparseReadOptions& b) {
        return a.plan.limits.max_tiles_per_query == b.plan.limits.max_tiles_per_query &&
               a.plan.limits.max_groups_per_query == b.plan.limits.max_groups_per_query &&
               a.plan.limits.max_regions == b.plan.limits.max_regions &&
               a.plan.read_coalesce_gap == b.plan.read_coalesce_gap &&
               a.strategy == b.strategy && a.num_threads == b.num_threads;
    }
};

/// SparseStore::ReadSparseObjects (docs/design.md §4) run by the daemon: its node-local caches
/// serve every process of the node.
struct SparseReadRequest {
    static constexpr MessageType kType = MessageType::kSparseRead;
    std::vector<SourceDescriptor> manifest;
    std::vector<TargetDescriptor> targets;
    SparseReadOptions options;
    /// Set for a step manifest (executor StepManifest): its generation, and the tensors it
    /// leaves unchanged (their targets read as empty objects).
    std::optional<Generation> step;
    std::vector<std::string> unchanged;

    static void Fields(auto& v, auto& m) {
        v("manifest", m.manifest, kMaxBatchItems);
        v("targets", m.targets, kMaxBatchItems);
        v("options", m.options);
        v("step", m.step);
        v("unchanged", m.unchanged, kMaxBatchItems, kMaxNameBytes);
    }
    friend bool operator==(const SparseReadRequest&, const SparseReadRequest&) = default;
};

/// A read of a sealed step against the daemon's own manifest of it, which the client got from
/// this daemon and passes unchanged: the step instead of its sources (a step of a large model
/// lists tens of thousands). Replied by SparseReadReply.
struct SparseReadStepRequest {
    static constexpr MessageType kType = MessageType::kSparseReadStep;
    Generation step;
    std::vector<TargetDescriptor> targets;
    SparseReadOptions options;

    static void Fields(auto& v, auto& m) {
        v("step", m.step);
        v("targets", m.targets, kMaxBatchItems);
        v("options", m.options);
    }
    friend bool operator==(const SparseReadStepRequest&, const SparseReadStepRequest&) = default;
};

/// A member the daemon published into a segment.
struct SegmentMember {
    SegmentSlice slice;
    std::uint64_t checksum = 0;

    static void Fields(auto& v, auto& m) {
        v("slice", m.slice);
        v("checksum", m.checksum);
    }
    friend bool operator==(const SegmentMember&, const SegmentMember&) = default;
};

/// One target-local object (executor TargetObject) published into the daemon's segments: what
/// the read decided about it (executor TargetObjectFacts). Its ids, box and the rest of its
/// descriptor follow from the request's target (executor TargetObjectDescriptor), so they do not
/// travel back. The client reads the members from its read-only mapping, then releases
/// `lease_id`.
struct ReadTargetLocation {
    Generation generation;
    Shape tile_shape;
    std::uint64_t nnz = 0;
    std::uint64_t num_tiles = 0;
    ApplyMode apply = ApplyMode::kOverwrite;
    DType index_dtype = DType::kUInt16;
    DType value_dtype = DType::kBFloat16;
    SegmentMember indices;
    SegmentMember values;
    SegmentMember tile_coords;
    SegmentMember tile_ptr;
    std::uint64_t lease_id = 0;

    static void Fields(auto& v, auto& m) {
        v("generation", m.generation);
        v("tile_shape", m.tile_shape, kMaxRank);
        v("nnz", m.nnz);
        v("num_tiles", m.num_tiles);
        v("apply", m.apply);
        v("index_dtype", m.index_dtype);
        v("value_dtype", m.value_dtype);
        v("indices", m.indices);
        v("values", m.values);
        v("tile_coords", m.tile_coords);
        v("tile_ptr", m.tile_ptr);
        v("lease_id", m.lease_id);
    }
    friend bool operator==(const ReadTargetLocation&, const ReadTargetLocation&) = default;
};

/// One object per target, in request order.
struct SparseReadReply {
    static constexpr MessageType kType = MessageType::kSparseReadReply;
    std::vector<ReadTargetLocation> objects;

    static void Fields(auto& v, auto& m) { v("objects", m.objects, kMaxBatchItems); }
    friend bool operator==(const SparseReadReply&, const SparseReadReply&) = default;
};

/// A source object that a planned read takes ranges of: leased to the connection until the
/// client releases `lease_id`, its indices and values where they lie in the segments.
struct PlannedSource {
    std::uint64_t lease_id = 0;
    SegmentSlice indices;
    SegmentSlice values;
    std::uint32_t indices_member = 0;  ///< Their places in the object's member table.
    std::uint32_t values_member = 0;
    bool pinned = false;  ///< The members are in page-locked segment memory.

    static void Fields(auto& v, auto& m) {
        v("lease_id", m.lease_id);
        v("indices", m.indices);
        v("values", m.values);
        v("indices_member", m.indices_member);
        v("values_member", m.values_member);
        v("pinned", m.pinned);
    }
    friend bool operator==(const PlannedSource&, const PlannedSource&) = default;
};

/// A unique entry range of a planned read (executor PlannedRead::Range): bytes of one planned
/// source's members.
struct PlannedRange {
    std::uint32_t source = 0;          ///< Into SparseReadPlanReply::sources.
    std::uint32_t manifest_index = 0;  ///< The source's place in the request's manifest.
    std::uint64_t indices_offset = 0;  ///< Bytes into the source's indices member.
    std::uint64_t indices_bytes = 0;
    std::uint64_t values_offset = 0;   ///< Bytes into the source's values member.
    std::uint64_t values_bytes = 0;

    static void Fields(auto& v, auto& m) {
        v("source", m.source);
        v("manifest_index", m.manifest_index);
        v("indices_offset", m.indices_offset);
        v("indices_bytes", m.indices_bytes);
        v("values_offset", m.values_offset);
        v("values_bytes", m.values_bytes);
    }
    friend bool operator==(const PlannedRange&, const PlannedRange&) = default;
};

/// Entries of one range that a target takes (executor PlannedRead::Piece).
struct PlannedPiece {
    std::uint32_t range = 0;
    std::uint64_t begin = 0;
    std::uint64_t count = 0;
    /// Set for a boundary tile's piece: only its entries inside this box (global
    /// coordinates) are kept.
    std::optional<Box> overlap;

    static void Fields(auto& v, auto& m) {
        v("range", m.range);
        v("begin", m.begin);
        v("count", m.count);
        v("overlap", m.overlap);
    }
    friend bool operator==(const PlannedPiece&, const PlannedPiece&) = default;
};

/// A target of a planned read: its pieces follow those of the targets before it.
struct PlannedTarget {
    std::uint64_t pieces = 0;
    /// Into the request's manifest (executor PlannedRead::Target::first_source); 0xffffffff for
    /// a tensor the step leaves unchanged.
    std::uint32_t first_source = 0xffffffffu;

    static void Fields(auto& v, auto& m) {
        v("pieces", m.pieces);
        v("first_source", m.first_source);
    }
    friend bool operator==(const PlannedTarget&, const PlannedTarget&) = default;
};

/// Where a planned read's ranges may go as the daemon plans them (SparseReadPlanRequest::
/// to_device): a CUDA allocation of the client, nothing of it in use until the reply (the
/// client has waited for its earlier readers), and the client's CUDA IPC event, as in
/// LeaseRangesToDeviceRequest.
struct PlanToDevice {
    TensorLocation destination;  ///< kCudaIpc; ref covers the bytes the copies may write.
    std::string ready_event;

    static void Fields(auto& v, auto& m) {
        v("destination", m.destination);
        v("ready_event", m.ready_event, kCudaIpcHandleBytes);
    }
    Status Validate() const;
    friend bool operator==(const PlanToDevice&, const PlanToDevice&) = default;
};

/// SparseService::ReadPlanned run by the daemon for a client that builds the targets itself
/// (a device read): the daemon plans the read of a step manifest, leases every source it reads
/// ranges of to the connection, and replies with the ranges, the pieces each target takes and
/// the leases. The client then has the ranges copied into its device memory
/// (LeaseRangesToDevice), filters and rebases them there, and releases the leases.
/// With `sealed_entries` set, the request names a sealed step (k - 1, k) instead of sending its
/// manifest (and unchanged ids, both then empty): the daemon plans with its own manifest of the
/// step, the one it gave the client, whose `sealed_entries` entries the reply's indices refer
/// to (a manifest of another size is FailedPrecondition).
/// With `target_set`, the targets are kept for this connection under that id: sent, the daemon
/// keeps them (replacing what it kept under the id) and plans them; not sent (`targets`
/// empty), it plans the targets it keeps under the id, NotFound when it keeps none (the client
/// then sends them). A reader whose layout never changes sends its targets once per connection.
/// The daemon keeps at most kMaxKeptTargetSets sets and kMaxKeptTargets targets per
/// connection, dropping the least recently used.
/// With `to_device`, the daemon may also copy the ranges it plans into that CUDA allocation of
/// the client, as LeaseRangesToDevice would, laid out by itself (its reply's `staged_at` then
/// says where): the copies start before the reply is even encoded, and the client sends no
/// copy request. It does when the layout fits the destination and its copies can be queued;
/// else the reply has no `staged_at` and the client asks for the copies as before.
struct SparseReadPlanRequest {
    static constexpr MessageType kType = MessageType::kSparseReadPlan;
    Generation step;
    std::vector<SourceDescriptor> manifest;
    std::vector<TargetDescriptor> targets;
    std::vector<std::string> unchanged;
    SparseReadOptions options;
    std::optional<std::uint64_t> sealed_entries;
    std::optional<std::uint64_t> target_set;
    std::optional<PlanToDevice> to_device;

    static void Fields(auto& v, auto& m) {
        v("step", m.step);
        v("manifest", m.manifest, kMaxBatchItems);
        v("targets", m.targets, kMaxBatchItems);
        v("unchanged", m.unchanged, kMaxBatchItems, kMaxNameBytes);
        v("options", m.options);
        v("sealed_entries", m.sealed_entries);
        v("target_set", m.target_set);
        v("to_device", m.to_device);
    }
    friend bool operator==(const SparseReadPlanRequest&, const SparseReadPlanRequest&) = default;
};

struct SparseReadPlanReply {
    static constexpr MessageType kType = MessageType::kSparseReadPlanReply;
    std::vector<PlannedSource> sources;
    std::vector<PlannedRange> ranges;
    std::vector<PlannedPiece> pieces;
    std::vector<PlannedTarget> targets;  ///< One per requested target, in order.
    /// Set when the daemon copied the ranges to the request's `to_device`: range r's indices
    /// at staged_at[2 * r], its values at staged_at[2 * r + 1] bytes into the destination.
    /// Empty: nothing was copied.
    std::vector<std::uint64_t> staged_at;

    static void Fields(auto& v, auto& m) {
        v("sources", m.sources, kMaxBatchItems);
        v("ranges", m.ranges, kMaxBatchItems);
        v("pieces", m.pieces, kMaxBatchItems);
        v("targets", m.targets, kMaxBatchItems);
        v("staged_at", m.staged_at, 2 * kMaxBatchItems);
    }
    friend bool operator==(const SparseReadPlanReply&, const SparseReadPlanReply&) = default;
};

/// A target set a connection keeps (SparseReadPlanRequest::target_set): the daemon's, and the
/// client's mirror of what the daemon keeps.
struct KeptTargetSet {
    std::uint64_t id = 0;
    std::vector<TargetDescriptor> targets;
    std::uint64_t last_use = 0;  ///< A clock of the connection's uses.
};
/// Drops the least recently used sets of `kept` until `incoming` more targets fit the limits
/// (kMaxKeptTargetSets sets, kMaxKeptTargets targets): the one rule both sides follow.
void MakeRoomForKeptTargets(std::vector<KeptTargetSet>& kept, std::size_t incoming);

/// Bytes of a member of an object the connection leases, to be copied to `dst_offset`.
struct LeaseRangeCopy {
    std::uint64_t lease_id = 0;
    std::uint32_t member = 0;  ///< Into the leased object's member table.
    std::uint64_t offset = 0;  ///< Bytes into the member.
    std::uint64_t bytes = 0;
    std::uint64_t dst_offset = 0;

    static void Fields(auto& v, auto& m) {
        v("lease_id", m.lease_id);
        v("member", m.member);
        v("offset", m.offset);
        v("bytes", m.bytes);
        v("dst_offset", m.dst_offset);
    }
    friend bool operator==(const LeaseRangeCopy&, const LeaseRangeCopy&) = default;
};

/// Byte ranges of leased members (a planned read's ranges) copied by the daemon from its
/// segments straight into a CUDA allocation of the client, by CUDA IPC. Every item is checked
/// (a lease of this connection, a member it has, bytes inside the member and inside the
/// destination) before any byte is written.
struct LeaseRangesToDeviceRequest {
    static constexpr MessageType kType = MessageType::kLeaseRangesToDevice;
    std::vector<LeaseRangeCopy> items;
    TensorLocation destination;  ///< kCudaIpc; ref covers the bytes the items may write.
    /// Empty: the reply comes once the copies are done. Else a CUDA IPC event handle of the
    /// client (kCudaIpcHandleBytes) that the daemon may record after queuing the copies, then
    /// answer at once; the client's work on the bytes waits on the event either way (a daemon
    /// that copied before answering left it as it was).
    std::string ready_event;

    static void Fields(auto& v, auto& m) {
        v("items", m.items, kMaxBatchItems);
        v("destination", m.destination);
        v("ready_event", m.ready_event, kCudaIpcHandleBytes);
    }
    Status Validate() const;
    friend bool operator==(const LeaseRangesToDeviceRequest&,
                           const LeaseRangesToDeviceRequest&) = default;
};

struct MetricsRequest {
    static constexpr MessageType kType = MessageType::kMetrics;
    bool reset = false;  ///< Reset the daemon's sparse metrics after reading them.

    static void Fields(auto& v, auto& m) { v("reset", m.reset); }
    friend bool operator==(const MetricsRequest&, const MetricsRequest&) = default;
};

struct MetricItem {
    std::string name;
    double value = 0;

    static void Fields(auto& v, auto& m) {
        v("metric name", m.name, kMaxNameBytes);
        v("metric value", m.value);
    }
    /// Bitwise on `value`, so NaN round-trips compare equal.
    friend bool operator==(const MetricItem& a, const MetricItem& b) {
        return a.name == b.name &&
               std::bit_cast<std::uint64_t>(a.value) == std::bit_cast<std::uint64_t>(b.value);
    }
};

/// SparseMetrics::Items() of the daemon (the §4 counters and more), plus any daemon gauges
/// (store counters, pinned quota/use, capabilities) as further named values.
struct MetricsReply {
    static constexpr MessageType kType = MessageType::kMetricsReply;
    std::vector<MetricItem> items;

    static void Fields(auto& v, auto& m) { v("metrics", m.items, kMaxMetrics); }
    friend bool operator==(const MetricsReply&, const MetricsReply&) = default;
};

/// SparseStore::ClearCaches of the daemon: drops the node-local tile-index and range caches
/// (every process of the node shares them). No payload.
struct ClearCachesRequest {
    static constexpr MessageType kType = MessageType::kClearCaches;

    static void Fields(auto&, auto&) {}
    friend bool operator==(const ClearCachesRequest&, const ClearCachesRequest&) = default;
};

/// SparseStore::GetManifest: a step's manifest, or a fold's.
struct SparseStepManifestRequest {
    static constexpr MessageType kType = MessageType::kSparseStepManifest;
    Generation generation;

    static void Fields(auto& v, auto& m) { v("generation", m.generation); }
    friend bool operator==(const SparseStepManifestRequest&,
                           const SparseStepManifestRequest&) = default;
};

/// Executor StepManifest.
struct SparseStepManifestReply {
    static constexpr MessageType kType = MessageType::kSparseStepManifestReply;
    Generation generation;
    std::vector<SourceDescriptor> sources;
    std::vector<std::string> unchanged;
    bool sealed = false;

    static void Fields(auto& v, auto& m) {
        v("generation", m.generation);
        v("sources", m.sources, kMaxBatchItems);
        v("unchanged", m.unchanged, kMaxBatchItems, kMaxNameBytes);
        v("sealed", m.sealed);
    }
    friend bool operator==(const SparseStepManifestReply&,
                           const SparseStepManifestReply&) = default;
};

/// SparseStore::SealGeneration.
struct SparseSealRequest {
    static constexpr MessageType kType = MessageType::kSparseSeal;
    Generation generation;
    std::vector<std::string> tensor_ids;

    static void Fields(auto& v, auto& m) {
        v("generation", m.generation);
        v("tensor_ids", m.tensor_ids, kMaxBatchItems, kMaxNameBytes);
    }
    friend bool operator==(const SparseSealRequest&, const SparseSealRequest&) = default;
};

/// SparseStore::WaitGeneration: the daemon answers when the step is sealed (woken by the seal,
/// no polling) or at the timeout (DeadlineExceeded). A client waiting for ever sends a sequence
/// of bounded waits.
struct SparseWaitRequest {
    static constexpr MessageType kType = MessageType::kSparseWait;
    Generation generation;
    double timeout_seconds = 0;  ///< In [0, kMaxWaitSeconds].

    static void Fields(auto& v, auto& m) {
        v("generation", m.generation);
        v("timeout_seconds", m.timeout_seconds);
    }
    Status Validate() const;
    /// Bitwise on the timeout, so NaN round-trips compare equal.
    friend bool operator==(const SparseWaitRequest& a, const SparseWaitRequest& b) {
        return a.generation == b.generation && std::bit_cast<std::uint64_t>(a.timeout_seconds) ==
                                                   std::bit_cast<std::uint64_t>(b.timeout_seconds);
    }
};
inline constexpr double kMaxWaitSeconds = 3600;

/// SparseStore::LatestGeneration, or LatestAnchor when `anchor`.
struct SparseLatestRequest {
    static constexpr MessageType kType = MessageType::kSparseLatest;
    bool anchor = false;

    static void Fields(auto& v, auto& m) { v("anchor", m.anchor); }
    friend bool operator==(const SparseLatestRequest&, const SparseLatestRequest&) = default;
};

struct SparseLatestReply {
    static constexpr MessageType kType = MessageType::kSparseLatestReply;
    std::optional<Generation> generation;

    static void Fields(auto& v, auto& m) { v("generation", m.generation); }
    friend bool operator==(const SparseLatestReply&, const SparseLatestReply&) = default;
};

/// SparseStore::SetRetention when `set`, SetKeepAnchors when `keep_anchors` is given; then
/// Retention.
struct SparseRetentionRequest {
    static constexpr MessageType kType = MessageType::kSparseRetention;
    bool set = false;
    std::uint64_t keep_last = 0;
    std::optional<std::uint64_t> keep_anchors;

    static void Fields(auto& v, auto& m) {
        v("set", m.set);
        v("keep_last", m.keep_last);
        v("keep_anchors", m.keep_anchors);
    }
    friend bool operator==(const SparseRetentionRequest&, const SparseRetentionRequest&) = default;
};

struct SparseRetentionReply {
    static constexpr MessageType kType = MessageType::kSparseRetentionReply;
    std::uint64_t keep_last = 0;

    static void Fields(auto& v, auto& m) { v("keep_last", m.keep_last); }
    friend bool operator==(const SparseRetentionReply&, const SparseRetentionReply&) = default;
};

/// SparseStore::RecordAnchor (the tensors were put through TensorPut first).
struct SparseAnchorRequest {
    static constexpr MessageType kType = MessageType::kSparseAnchor;
    Generation generation;
    std::vector<std::string> tensor_ids;

    static void Fields(auto& v, auto& m) {
        v("generation", m.generation);
        v("tensor_ids", m.tensor_ids, kMaxBatchItems, kMaxNameBytes);
    }
    friend bool operator==(const SparseAnchorRequest&, const SparseAnchorRequest&) = default;
};

}  // namespace mooncake::sparse::wire
