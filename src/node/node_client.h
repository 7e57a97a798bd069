// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// NodeClient: a DummyClient of the node daemon (docs/design.md §5-6). It owns no segment: it maps the
// daemon's segments read-only, owns one memfd "client buffer" that it registers with the daemon,
// and speaks store/wire.h over the daemon's Unix socket. It is an ObjectStore (every call is an
// RPC) and a SparseService (executor/sparse_service.h) whose operations run inside the daemon,
// where the node-local caches serve every process of the node. The sparse side is
// node_client_sparse.cc: the wire conversions of the service, each made there once.
//
// Why it is built this way:
// - Payload never crosses the socket. A Put copies the members into the client buffer and the
//   daemon copies them once into a segment; a read that is not zero-copy is copied by the daemon
//   into the client buffer. Leased objects and read_sparse_objects results are read in place
//   from the read-only segment mapping (zero-copy): a view keeps its lease and its mapping alive.
// - Calls are serialized on one connection (request/reply). A call that cannot complete (the
//   daemon died, restarted, or did not answer within call_timeout) fails with Unavailable and
//   drops the connection; the next call dials again, so a restarted daemon is picked up without
//   any action by the caller. Nothing ever waits without a deadline.
// - Lease releases are batched: dropping a view queues its lease id, and the next call (or
//   FlushReleases) sends them. Leases of a dropped connection were already released by the
//   daemon; their ids are discarded.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"
#include "executor/sparse_service.h"
#include "executor/sparse_store.h"
#include "node/wire.h"
#include "transport/cuda_ipc.h"
#include "transport/cuda_runtime.h"

namespace mooncake::sparse {

struct NodeClientOptions {
    std::string socket_path;
    std::string client_name;  ///< Shown in the daemon's log; default "pid <N>".
    std::chrono::milliseconds connect_timeout{5000};
    /// Bound on one RPC (send + daemon work + reply). read_sparse_objects of a large batch
    /// runs inside it, so it is generous.
    std::chrono::milliseconds call_timeout{120000};
    /// First size of the client buffer; it grows (re-registered) as puts need.
    std::uint64_t initial_buffer_bytes = std::uint64_t{4} << 20;
    /// How a call waits for its reply: the calling thread first polls the socket (yielding the
    /// core whenever another thread is runnable) for `reply_spin`, then sleeps in poll(). A
    /// thread that sleeps through a long copy pays the core's wake-up latency (deep C-states:
    /// 50-150 us on server parts), which is what a CUDA stream synchronization under the default
    /// schedule avoids by spinning. Tensor calls spin longer, for as long as their bytes take at
    /// `spin_bytes_per_second`, up to `reply_spin_max`. Zero `reply_spin_max` never spins.
    std::chrono::microseconds reply_spin{200};
    std::chrono::microseconds reply_spin_max{20000};
    double spin_bytes_per_second = 8e9;
    /// The run's namespace of this client's sparse calls (docs/design.md §9); "" the default.
    std::string name_space;
    /// Targets per SparseReadPlan request of a device read: a larger read is planned in
    /// requests of about this many targets (a tensor's targets in one request), so that every
    /// reply stays well inside the protocol's frame and item limits at a node's scale.
    std::size_t planned_read_targets = 16384;
};

/// Keeps a zero-copy view valid: the lease (released when the last holder goes) and the
/// read-only mapping of the daemon segment the bytes lie in.
using LeaseKeepalive = std::shared_ptr<const void>;

/// An object leased from the daemon, viewed in place.
struct LeasedObject {
    ObjectInfo info;
    std::vector<std::span<const std::byte>> members;  ///< Same order as info.members.
    LeaseKeepalive keepalive;
};

/// One target-local object of read_sparse_objects, viewed in place in a daemon segment: its
/// keepalive is a LeaseKeepalive.
using LeasedTargetObject = TargetObjectView;

/// The four members of an encoded sparse object (codec SparseObject), as bytes plus checksums.
struct EncodedMembers {
    std::span<const std::byte> indices;
    std::span<const std::byte> values;
    std::span<const std::byte> tile_coords;
    std::span<const std::byte> tile_ptr;
    std::uint64_t checksum_indices = 0;
    std::uint64_t checksum_values = 0;
    std::uint64_t checksum_tile_coords = 0;
    std::uint64_t checksum_tile_ptr = 0;
};

/// One tensor of NodeClient::PutTensors / GetTensorsInto (node/node_tensor_store.h builds
/// them after validating the caller's tensors).
struct NodeTensor {
    std::string_view key;
    DType dtype = DType::kFloat32;
    Shape shape;
    /// Host tensors (no `cuda`): their bytes, copied through the client buffer — from them for
    /// a put, into them for a get. With `host_strides`, `host` starts at element [0, ..., 0]
    /// and its size counts the elements' bytes, not the memory they spread over.
    std::span<std::byte> host;
    /// Element strides of a host view (copied through them, in place); empty: C-contiguous.
    std::vector<std::int64_t> host_strides;
    /// CUDA tensors: where the daemon finds them (a kCudaIpc location).
    std::optional<wire::TensorLocation> cuda;
    /// Element strides of a CUDA view (a get_tensor_into destination); empty: C-contiguous.
    /// `cuda->ref` then covers the view's extent (transport/pitched_copy.h StridedViewSpan).
    std::vector<std::int64_t> cuda_strides;
    /// A get's box of the stored tensor at this origin (`shape` its extents); empty: whole.
    Shape box_origin;
};

struct NodeClientStats {
    std::uint64_t calls = 0;
    std::uint64_t connects = 0;      ///< Successful dials (1 + reconnects).
    std::uint64_t disconnects = 0;   ///< Connections dropped after a failed call.
    std::uint64_t leases_released = 0;
    std::uint64_t buffer_bytes = 0;  ///< Current client buffer size.
    std::uint64_t replies_spun = 0;  ///< Replies that arrived while the caller polled.
    std::uint64_t replies_slept = 0; ///< Replies the caller slept for (spin budget ran out).
    /// Time in calls: encoding the request, sending it, waiting for the reply and decoding its
    /// frame (against the daemon's request_<type>_seconds, the rest is the transport).
    double call_seconds = 0;
    /// Device commits: copying the members into the commit arena the daemon reads, and waiting
    /// for those copies (before the request goes out).
    double device_commit_gather_seconds = 0;
};

class NodeClient final : public ObjectStore,
                         public SparseService,
                         public std::enable_shared_from_this<NodeClient> {
public:
    /// Dials the daemon once (Hello, segment mappings, client buffer).
    /// Errors: Unavailable ("node daemon at PATH is not running ..."); PermissionDenied (the
    /// socket belongs to another user); FailedPrecondition (protocol mismatch).
    static Result<std::shared_ptr<NodeClient>> Connect(const NodeClientOptions& options);

    ~NodeClient() override;
    NodeClient(const NodeClient&) = delete;
    NodeClient& operator=(const NodeClient&) = delete;

    // ObjectStore: every call is one RPC; errors as ObjectStore documents, plus Unavailable.
    Status Put(std::string_view key, std::string_view metadata,
               std::span<const MemberData> members, const PutOptions& options) override;
    Result<ObjectInfo> Stat(std::string_view key) override;
    Status ReadMember(std::string_view key, std::string_view member,
                      std::span<std::byte> dst) override;
    Status ReadRanges(std::span<const RangeRead> reads) override;
    Status Remove(std::string_view key) override;
    Result<std::vector<std::string>> List(std::string_view prefix) override;
    /// What this client sent and received (the daemon's own counters are in Metrics()).
    StoreCounters Counters() const override;

    /// Zero-copy: the current version of `key`, read in place until the view is dropped.
    /// Errors: NotFound; Unavailable; DataLoss (a location outside the mapped segment).
    Result<LeasedObject> Lease(std::string_view key);

    // ---- SparseService: run by the daemon (SparseStore semantics and errors, plus
    // Unavailable), in node_client_sparse.cc. -------------------------------------------------
    /// Encodes the source object here (BuildSourceObject) and commits it in the daemon, which
    /// validates it again.
    Result<CommitResult> PutSparseObject(const PutSparseRequest& request) override;
    /// Encodes the batch here, then commits it in few requests (SparseCommitBatch).
    std::vector<Result<CommitResult>> PutSparseObjects(std::span<const PutSparseRequest> requests,
                                                       int num_threads = 0) override;
    Result<bool> Admit(std::string_view tensor_id, Generation generation,
                       const PlacementPolicy& policy, const NamedAxes& source_placement,
                       std::string_view writer_id) override;
    /// Every admission in one request (SparseAdmitBatch); a failed exchange is every item's
    /// error.
    std::vector<Result<bool>> AdmitBatch(std::span<const AdmitRequest> items) override;
    Result<std::vector<SourceDescriptor>> Manifest(Generation generation) override;
    Result<std::optional<Generation>> CurrentGeneration(std::string_view tensor_id) override;
    // The steps of a training run (docs/design.md §9).
    Result<StepManifest> GetManifest(Generation generation) override;
    Status SealGeneration(Generation generation, std::span<const std::string> tensor_ids) override;
    /// Waits in the daemon (woken by the seal); a long or endless wait is a sequence of bounded
    /// waits on a second connection of this client, so that the connection of its other calls
    /// stays free.
    Result<StepManifest> WaitGeneration(Generation generation, double timeout_seconds) override;
    Result<std::optional<Generation>> LatestGeneration() override;
    Status SetRetention(std::uint64_t keep_last) override;
    Result<std::uint64_t> Retention() override;
    Status RecordAnchor(Generation step, std::span<const std::string> tensor_ids) override;
    Result<std::optional<Generation>> LatestAnchor() override;
    Status SetKeepAnchors(std::uint64_t keep_anchors) override;
    /// ReadSparseObjects with the options in executor terms; each view holds its lease.
    Result<std::vector<TargetObjectView>> ReadViews(std::span<const SourceDescriptor> manifest,
                                                    std::span<const TargetDescriptor> targets,
                                                    const ReadOptions& options) override;
    Result<std::vector<TargetObjectView>> ReadViews(const StepManifestView& manifest,
                                                    std::span<const TargetDescriptor> targets,
                                                    const ReadOptions& options) override;
    /// ReadViews of the sealed step `step` against the daemon's own manifest of it
    /// (SparseReadStep): for a caller that holds that manifest as this daemon returned it (a
    /// sealed step's never changes), without sending its sources back.
    /// Errors: NotFound (the step was freed); FailedPrecondition (not sealed); as ReadViews.
    Result<std::vector<TargetObjectView>> ReadSealedStepViews(
        Generation step, std::span<const TargetDescriptor> targets, const ReadOptions& options);
    /// A device read through the daemon (SparseReadPlan): the daemon plans the read and leases
    /// the sources it takes ranges of; `build` gets the ranges viewed in this process's
    /// read-only mapping of the segments and, where CUDA IPC with the daemon works,
    /// PlannedRead::ranges_to_device, through which the daemon copies the ranges straight
    /// into device memory of this process (LeaseRangesToDevice). The leases go when the call
    /// returns. Errors: Unimplemented (a fold of several steps, a full-source strategy, sparse
    /// objects the daemon keeps outside its segments: read with ReadViews); DataLoss (a reply
    /// that does not describe a read of these targets); as ReadViews; whatever `build` returns.
    Result<std::vector<TargetObjectView>> ReadPlanned(const StepManifestView& manifest,
                                                      std::span<const TargetDescriptor> targets,
                                                      const ReadOptions& options,
                                                      const PlannedReadFn& build) override;
    /// ReadPlanned of a sealed step whose manifest is exactly this connection's copy of the
    /// daemon's (GetManifest of it, whole and in its order; the caller checked): the requests
    /// name the step, the daemon plans with its own manifest, none is sent.
    /// Errors: FailedPrecondition (not sealed, or the daemon's manifest of it has another
    /// size); NotFound (freed); as ReadPlanned.
    Result<std::vector<TargetObjectView>> ReadPlannedSealedStep(
        const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
        const ReadOptions& options, const PlannedReadFn& build);
    /// The daemon's metrics (the §4 counters and its gauges); `reset` zeroes the §4 counters.
    Result<MetricItems> Metrics(bool reset = false) override;
    /// Drops the daemon's node-local caches (tile indexes, range reads) for every process.
    Status ClearCaches() override;
    /// The counters of the daemon's store (Counters() has this client's traffic).
    Result<StoreCounters> ObjectCounters() override;
    Result<std::vector<std::string>> ListKeys(std::string_view prefix) override;
    ObjectStore& object_store() override { return *this; }
    /// The NodeTensorStore of this client (node/node_tensor_store.h); `options` are the
    /// daemon's to choose.
    std::unique_ptr<TensorStore> MakeTensorStore(const LocalTensorStoreOptions& options) override;

    /// A member of a commit in this process's CUDA memory (C-contiguous).
    struct DeviceMember {
        DType dtype = DType::kUInt8;
        Shape shape;
        DeviceMemory memory;
    };
    /// Whether PutSparseObjectsFromDevice and CopyViewsToDevice can run here: CUDA IPC in this
    /// process and in the daemon, and a daemon that speaks SparseCommitDevice and
    /// LeasesToDevice (protocol 6). Asked once per client.
    bool CanCommitFromDevice();
    /// The indices and values of `views` in one device allocation: where each view's members
    /// start (`offsets[2 * i]`, `offsets[2 * i + 1]`, from `base`), and what keeps it.
    struct DeviceCopy {
        std::shared_ptr<const void> owner;
        std::uintptr_t base = 0;
        std::vector<std::uint64_t> offsets;
    };
    /// read_sparse_objects(..., device=...) through the daemon: the daemon copies the members
    /// of `views` (target objects this client read on its current connection, still leased)
    /// from its segments straight into device memory of this client (LeasesToDevice), into an
    /// allocation this client keeps in a pool per device, exported once, so the daemon maps it
    /// once. An allocation is reused once nothing views it; `stream` is waited for first, so
    /// work queued there on the previous views is done before the daemon writes.
    /// Errors: FailedPrecondition (a view of another connection or not leased: read again, or
    /// copy through the host); Unimplemented (no CUDA IPC); Unavailable; as LeasesToDevice.
    Result<DeviceCopy> CopyViewsToDevice(std::span<const TargetObjectView* const> views,
                                         int device, CudaStream stream);
    /// PutSparseObjects of updates whose indices and values are in this process's CUDA memory
    /// (indices[i], values[i] for requests[i]; the requests' own host arrays are ignored): the
    /// members are gathered by device-to-device copies into an allocation this client keeps
    /// per device and exports once, and the daemon copies them by CUDA IPC into its own pinned
    /// memory, then validates, encodes and commits them (SparseCommitDevice). Nothing passes
    /// through host memory of this process. `stream`: the members' producing stream, waited for
    /// first. Same results as PutSparseObjects; each update fails alone. The requests' fields
    /// but their tensor_id are moved into the call's request: the caller reads them no more.
    std::vector<Result<CommitResult>> PutSparseObjectsFromDevice(
        std::span<PutSparseRequest> requests, std::span<const DeviceMember> indices,
        std::span<const DeviceMember> values, CudaStream stream);

    // ---- The sparse layer at the level of the protocol. -----------------------------------
    /// Commits an object encoded by the caller (codec BuildSparseObject).
    /// One SparseCommitBatch request of objects[chunk[k]]; their outcomes into out[chunk[k]].
    /// Errors (then for every item of the chunk): the call's.
    Status CommitChunk(std::span<const PutSparseRequest> requests,
                       std::vector<std::optional<SparseObject>>& objects,
                       std::span<const std::size_t> chunk, std::vector<Result<CommitResult>>& out);
    Result<wire::SparseCommitReply> CommitSparseObject(const SourceDescriptor& desc,
                                                       std::string_view coordinate_space,
                                                       const EncodedMembers& members,
                                                       bool hard_pin);
    Result<std::vector<LeasedTargetObject>> ReadSparseObjects(
        std::span<const SourceDescriptor> manifest, std::span<const TargetDescriptor> targets,
        const wire::SparseReadOptions& options);
    /// ReadSparseObjects of a step manifest (unchanged tensors, folds), run by the daemon.
    Result<std::vector<LeasedTargetObject>> ReadSparseObjects(
        const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
        const wire::SparseReadOptions& options);
    /// One bounded wait on this client's own connection.
    Result<StepManifest> WaitOnce(Generation generation, double timeout_seconds);

    // ---- The tensor fast path (docs/design.md §5), run by the daemon. ----------------------
    /// TensorPut: host tensors are copied once into the client buffer, CUDA tensors travel as
    /// IPC handles (the daemon copies them straight into its segments). The caller has
    /// synchronized the tensors' streams.
    /// Errors: as TensorStore::Put; ResourceExhausted (host bytes beyond the client buffer
    /// limit); Unavailable.
    Status PutTensors(std::span<const NodeTensor> tensors, PutMode mode, bool hard_pin);
    /// TensorGet: the daemon validates every item against the stored headers, then writes CUDA
    /// destinations through their IPC handles and host ones into the client buffer (copied out
    /// here after the reply).
    /// Errors: as TensorStore::GetInto; ResourceExhausted; Unavailable.
    Status GetTensorsInto(std::span<const NodeTensor> tensors);

    /// Sends the queued lease releases now.
    /// Errors: Unavailable.
    Status FlushReleases();
    /// Drops the connection (the daemon releases this client's leases); the next call dials.
    void Disconnect();

    bool connected() const;
    /// The daemon's HelloReply of the current connection (node_id, segments, limits).
    Result<wire::HelloReply> Hello();
    NodeClientStats Stats() const;
    const NodeClientOptions& options() const { return options_; }

private:
    struct Session;
    friend struct LeaseHandle;

    explicit NodeClient(NodeClientOptions options);

    /// Dials if there is no connection. Needs mu_.
    Status EnsureConnected();
    /// One request/reply round trip on the current connection; on a transport failure the
    /// connection is dropped. Needs mu_.
    /// `spin_bytes`: the bytes the daemon moves for this call (extends the reply spin).
    /// Device memory this client gathers device commits into (one per device, grown on
    /// demand, exported by CUDA IPC once per allocation so the daemon maps it once).
    struct DeviceArena {
        std::uintptr_t address = 0;
        std::uint64_t bytes = 0;
        int device = -1;
        CudaIpcExport exported;
    };
    /// The arena of `device`, at least `bytes`. Needs mu_.
    Result<const DeviceArena*> ArenaLocked(int device, std::uint64_t bytes);
    /// A free allocation of the read pool on `device` of at least `bytes`, or a new one
    /// (exported). Needs mu_.
    Result<std::shared_ptr<DeviceArena>> ReadArenaLocked(int device, std::uint64_t bytes);
    /// The largest free allocation of the read pool on `device`, or null. Needs mu_.
    std::shared_ptr<DeviceArena> FreeReadArenaLocked(int device);
    /// One SparseCommitDevice request of the updates `chunk` (all on one device).
    Status CommitDeviceChunk(std::span<PutSparseRequest> requests,
                             std::span<const DeviceMember> indices,
                             std::span<const DeviceMember> values,
                             std::span<const std::size_t> chunk,
                             std::vector<Result<CommitResult>>& out);
    /// Frees a frame buffer that one large call grew past what calls usually need.
    static void TrimFrameBuffer(std::vector<std::byte>& buffer);
    Result<wire::Frame> RoundTrip(wire::MessageRef request, std::span<const int> fds,
                                  std::vector<std::byte>& storage, std::uint64_t spin_bytes = 0);
    template <typename Reply>
    Result<Reply> Call(wire::MessageRef request, std::uint64_t spin_bytes = 0);
    /// A SparseRead or SparseReadStep request of `targets`, and its objects from the reply
    /// (each described from its target and what the daemon's read decided of it).
    Result<std::vector<TargetObjectView>> ReadPlannedAs(const StepManifestView& manifest,
                                                        std::span<const TargetDescriptor> targets,
                                                        const ReadOptions& options,
                                                        const PlannedReadFn& build, bool by_step);
    template <typename Request>
    Result<std::vector<LeasedTargetObject>> CallRead(const Request& request,
                                                     std::span<const TargetDescriptor> targets);
    /// Polls the connection until a reply is readable or the spin budget of a call moving
    /// `bytes` runs out. True when the reply came while polling.
    bool SpinForReply(int fd, std::uint64_t bytes) const;
    /// Grows the client buffer to at least `bytes`. Needs mu_.
    Status EnsureBuffer(std::uint64_t bytes);
    /// Copies `parts` into the client buffer (grown as needed), each at a 64-byte aligned
    /// offset, and returns the offsets; `total` is the bytes they span. Needs mu_.
    Result<std::vector<std::uint64_t>> StageInBuffer(
        std::span<const std::span<const std::byte>> parts, std::uint64_t& total);
    Status FlushReleasesLocked();
    /// A view's keepalive for lease `lease_id` of the current session.
    LeaseKeepalive MakeKeepalive(std::uint64_t lease_id, std::uint32_t segment_id);
    /// `slice` within its mapped segment.
    Result<std::span<const std::byte>> View(const wire::SegmentSlice& slice) const;
    void QueueRelease(std::uint64_t session_epoch, std::uint64_t lease_id);
    void DropSessionLocked(std::string_view why);

    const NodeClientOptions options_;
    mutable std::mutex mu_;  ///< Serializes calls (one connection, request/reply).
    /// A second connection of this client for WaitGeneration, made on the first wait: a wait
    /// blocks its connection, and the same handle must still seal, commit and read meanwhile.
    std::mutex waiter_mu_;
    std::shared_ptr<NodeClient> waiter_;  // Guarded by waiter_mu_.
    std::shared_ptr<Session> session_;  // Guarded by mu_.
    std::uint64_t next_request_id_ = 1;  // Guarded by mu_.
    /// The frames of the calls, encoded and received into the same memory call after call
    /// (a step's read is megabytes each way: fresh buffers would fault in every page).
    std::vector<std::byte> send_frame_;  // Guarded by mu_.
    std::vector<std::byte> recv_frame_;  // Guarded by mu_.
    std::vector<DeviceArena> arenas_;    // Guarded by mu_.
    /// Allocations that reads are copied into (CopyViewsToDevice); one is free to reuse when
    /// the pool holds its only reference.
    std::vector<std::shared_ptr<DeviceArena>> read_arenas_;  // Guarded by mu_.
    /// Read allocations the daemon may still have been copying into when a planned read
    /// failed (ReadPlannedAs): never handed out again, freed with the client.
    std::vector<std::shared_ptr<DeviceArena>> held_read_arenas_;  // Guarded by mu_.
    /// CanCommitFromDevice: -1 not asked yet, else 0 / 1.
    std::atomic<int> device_commit_{-1};
    std::uint64_t epoch_ = 0;            // Guarded by mu_.
    /// The targets of planned reads that the daemon keeps for the current connection
    /// (SparseReadPlanRequest::target_set): a reader's next reads name them by id.
    using KeptTargets = wire::KeptTargetSet;
    std::vector<KeptTargets> kept_targets_;  // Guarded by mu_; of session epoch kept_epoch_.
    std::uint64_t kept_epoch_ = 0;           // Guarded by mu_.
    std::uint64_t kept_clock_ = 0;           // Guarded by mu_.
    std::uint64_t next_target_set_ = 1;      // Guarded by mu_.

    mutable std::mutex release_mu_;  ///< Only guards the queue (taken by view destructors).
    std::vector<std::uint64_t> pending_releases_;  // Guarded by release_mu_.
    std::uint64_t pending_epoch_ = 0;              // Guarded by release_mu_.

    mutable std::mutex stats_mu_;
    NodeClientStats stats_;      // Guarded by stats_mu_.
    StoreCounters counters_;     // Guarded by stats_mu_.
};

template <typename Reply>
Result<Reply> NodeClient::Call(wire::MessageRef request, std::uint64_t spin_bytes) {
    MCS_RETURN_IF_ERROR(FlushReleasesLocked());
    MCS_ASSIGN_OR_RETURN(wire::Frame frame, RoundTrip(request, {}, recv_frame_, spin_bytes));
    Result<Reply> reply = wire::DecodeReplyAs<Reply>(frame);
    TrimFrameBuffer(recv_frame_);
    return reply;
}

}  // namespace mooncake::sparse
