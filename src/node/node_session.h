// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's per-connection state and request handlers (private to src/node): one
// Connection and one Session per client. The handlers are defined by conversation:
// node_server.cc (session, objects), node_session_sparse.cc (sparse objects and the steps of a
// run), node_session_tensor.cc (the tensor fast path).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "node/node_server.h"
#include "node/wire.h"
#include "store/shm_segment.h"
#include "transport/cuda_ipc.h"

namespace mooncake::sparse {
namespace node_internal {

inline constexpr std::string_view kDaemonVersion = "mooncake_sparse_node 0.1.0";
inline constexpr std::uint32_t kMaxReadThreads = 64;

/// `a * b * c` without overflow, or nullopt.
inline std::optional<std::uint64_t> Product(std::uint64_t a, std::uint64_t b, std::uint64_t c = 1) {
    std::uint64_t out = 0;
    if (__builtin_mul_overflow(a, b, &out) || __builtin_mul_overflow(out, c, &out)) {
        return std::nullopt;
    }
    return out;
}

/// Nanoseconds from `start` to `end`, and to now: the daemon's clocks count in them.
inline std::uint64_t NanosBetween(std::chrono::steady_clock::time_point start,
                                  std::chrono::steady_clock::time_point end) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
}
inline std::uint64_t NanosSince(std::chrono::steady_clock::time_point start) {
    return NanosBetween(start, std::chrono::steady_clock::now());
}

template <typename T>
std::span<const std::byte> AsBytes(const std::vector<T>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace node_internal

// ---------------------------------------------------------------------------------------------
// Connection and Session: one client's state and its request handlers.
// ---------------------------------------------------------------------------------------------
struct NodeServer::Connection {
    using Clock = std::chrono::steady_clock;

    std::uint64_t id = 0;
    UnixConnection conn;
    PeerCred peer;
    std::thread thread;
    std::atomic<bool> finished{false};
    // What the accept loop needs to pick a connection to evict at max_connections.
    std::atomic<bool> busy{false};      ///< From a frame's first packet to its reply.
    std::atomic<bool> stateful{false};  ///< Holds a client buffer or leases.
    std::atomic<bool> evicted{false};
    std::atomic<Clock::rep> idle_since{0};

    void MarkIdle(bool has_state) {
        stateful.store(has_state, std::memory_order_relaxed);
        idle_since.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
        busy.store(false, std::memory_order_release);
    }
};

class NodeServer::Session {
public:
    Session(NodeServer& server, Connection& connection)
        : server_(server), connection_(connection) {}

    /// Serves requests until the peer goes away, the framing breaks or the server stops.
    void Run();

private:
    struct Reply {
        wire::Message message;
        std::vector<int> fds;  ///< Owned elsewhere (the store's segments).
    };

    Result<Reply> Dispatch(const wire::Frame& frame, std::vector<UniqueFd>& fds);

    Result<Reply> Hello(const wire::HelloRequest& req);
    Result<Reply> RegisterBuffer(const wire::RegisterBufferRequest& req,
                                 std::vector<UniqueFd>& fds);
    Result<Reply> Put(const wire::PutRequest& req);
    Result<Reply> Stat(const wire::StatRequest& req);
    Result<Reply> ReadMember(const wire::ReadMemberRequest& req);
    Result<Reply> ReadRanges(const wire::ReadRangesRequest& req);
    Result<Reply> Remove(const wire::RemoveRequest& req);
    Result<Reply> List(const wire::ListRequest& req);
    Result<Reply> Lease(const wire::LeaseRequest& req);
    /// A keyless segment copy of tensor object `key` of options().tensor_objects, leased.
    /// Errors: NotFound; as ShmStore::Publish.
    Result<ObjectLease> LeaseFromTensorObjects(const std::string& key);
    Result<Reply> Release(const wire::ReleaseRequest& req);
    Result<Reply> SparseCommit(const wire::SparseCommitRequest& req);
    Result<Reply> SparseCommitBatch(const wire::SparseCommitBatchRequest& req);
    Result<Reply> SparseCommitDevice(wire::SparseCommitDeviceRequest&& req);
    /// One member of a SparseCommitDevice update, mapped.
    struct DevicePiece {
        DeviceMemory src;
        const CudaIpcMapping* mapping = nullptr;
        std::size_t slot = 0;  ///< 2 * update + member
    };
    /// The updates of `req` that options().device_index takes (mapped, canonical on the GPU):
    /// committed with their entries copied from the client's memory into the store's, each
    /// one's result set in `outcome`; the others are left unset.
    void CommitCheckedOnDevice(const wire::SparseCommitDeviceRequest& req,
                               const std::vector<PutSparseRequest>& requests,
                               const std::vector<std::array<DevicePiece, 2>>& mapped,
                               const std::vector<Status>& failed,
                               std::vector<std::optional<Result<CommitResult>>>& outcome);
    /// One group of CommitCheckedOnDevice's checked items (`first` on): the canonical ones'
    /// objects (`objects`, per item of the group) committed, their entries copied from `own`
    /// (per item: the daemon's copy of its members on `device`) into the store's memory.
    void CommitCheckedGroup(std::size_t first, std::vector<std::optional<SparseObject>> objects,
                            const std::vector<PutSparseRequest>& requests,
                            const std::vector<std::size_t>& item_of,
                            const std::vector<std::array<DeviceMemory, 2>>& own, int device,
                            std::vector<std::optional<Result<CommitResult>>>& outcome);
    Result<Reply> LeasesToDevice(const wire::LeasesToDeviceRequest& req);
    Result<Reply> LeaseRangesToDevice(const wire::LeaseRangesToDeviceRequest& req);
    /// Lease `lease_id` of this connection; InvalidArgument naming `what` when it holds none.
    Result<const ObjectLease*> HeldLease(std::uint64_t lease_id, std::string_view what) const;
    Result<Reply> SparseReadPlan(const wire::SparseReadPlanRequest& req);
    /// Bytes of segment memory for CopySegmentsToDevice.
    struct SegmentCopy {
        const std::byte* src;
        std::uint64_t offset;  ///< Into the destination.
        std::uint64_t bytes;
        std::uint32_t segment;
        /// The store says the bytes are page-locked (a planned range's PlannedRead::Range::
        /// pinned): the driver is not asked.
        bool pinned = false;
    };
    /// Copies `copies` (checked by the caller; in any order) into the client's CUDA memory
    /// `destination`: taken in destination order, runs of one segment the client placed as
    /// they lie there move as one copy, pageable bytes through pinned landing memory; returns
    /// once the copies are done.
    /// With `ready_event` (the client's CUDA IPC event handle), the copies may be left running
    /// with the event recorded after them.
    Status CopySegmentsToDevice(std::vector<SegmentCopy> copies,
                                const wire::TensorLocation& destination,
                                std::string_view ready_event = {});
    /// A commit's object, checked against the client's bytes and rebuilt in canonical form.
    Result<SparseObject> CheckedCommitObject(const wire::SparseCommitRequest& req);
    /// SparseCommitBatch of canonical objects whose entries are copied from the client's
    /// buffer straight into the store and checked there; nullopt (nothing committed) when the
    /// batch is not of that kind or any item differs from what the client described.
    std::optional<wire::SparseCommitBatchReply> CommitBatchInPlace(
        const wire::SparseCommitBatchRequest& req);
    Result<Reply> SparseAdmit(const wire::SparseAdmitRequest& req);
    Result<Reply> SparseAdmitBatch(const wire::SparseAdmitBatchRequest& req);
    Result<Reply> SparseManifest(const wire::SparseManifestRequest& req);
    Result<Reply> SparseCurrentGeneration(const wire::SparseCurrentGenerationRequest& req);
    Result<Reply> SparseRead(const wire::SparseReadRequest& req);
    Result<Reply> SparseReadStep(const wire::SparseReadStepRequest& req);
    /// A read's options in executor terms (threads bounded, the daemon's in-place setting).
    ReadOptions ReadOptionsOf(const wire::SparseReadOptions& options) const;
    /// A read's objects published into segment memory, leased to this connection: the reply.
    Result<Reply> PublishRead(std::vector<TargetObject> objects, int num_threads);
    Result<Reply> Metrics(const wire::MetricsRequest& req);
    Result<Reply> ClearCaches(const wire::ClearCachesRequest& req);
    Result<Reply> TensorPut(const wire::TensorPutRequest& req);
    Result<Reply> TensorGet(const wire::TensorGetRequest& req);
    Result<Reply> SparseStepManifest(const wire::SparseStepManifestRequest& req);
    Result<Reply> SparseSeal(const wire::SparseSealRequest& req);
    Result<Reply> SparseWait(const wire::SparseWaitRequest& req);
    Result<Reply> SparseLatest(const wire::SparseLatestRequest& req);
    Result<Reply> SparseRetention(const wire::SparseRetentionRequest& req);
    Result<Reply> SparseAnchor(const wire::SparseAnchorRequest& req);

    /// The tensors of a TensorPut / TensorGet as this process sees them: host tensors in the
    /// client buffer, CUDA tensors through this connection's IPC mappings (`holders` keeps them
    /// open for the request).
    Result<std::vector<TensorRef>> ResolveTensors(
        const std::vector<wire::TensorItem>& items, bool destination,
        std::vector<std::shared_ptr<const CudaIpcMapping>>& holders);

    /// The client's CUDA range `location` names, mapped through this connection's IPC cache
    /// (counted in the server's cuda_ipc_opens / hits); the holder keeps the mapping open.
    Result<std::pair<DeviceMemory, std::shared_ptr<const CudaIpcMapping>>> MapCuda(
        const wire::TensorLocation& location);

    /// The bytes `ref` names in the client's buffer, bounds-checked.
    /// Errors: FailedPrecondition (no buffer registered); OutOfRange; Unimplemented (CUDA IPC).
    Result<std::span<std::byte>> ClientBytes(const wire::BufferRef& ref, std::string_view what);
    Status AddLeases(std::vector<ObjectLease> leases, std::vector<std::uint64_t>& ids);

    NodeServer& server_;
    Connection& connection_;
    bool hello_done_ = false;
    /// The sparse store of this connection's namespace (set by Hello).
    SparseStore* sparse_ = nullptr;
    std::optional<ShmMapping> buffer_;
    std::unordered_map<std::uint64_t, ObjectLease> leases_;
    std::uint64_t next_lease_id_ = 1;
    /// CUDA allocations of this client, opened once and closed with the connection.
    CudaIpcCache ipc_cache_;
    /// The client's ready event (LeaseRangesToDeviceRequest::ready_event), opened once.
    struct ReadyEvent {
        std::string handle;
        int device = -1;
        std::shared_ptr<void> event;
    };
    ReadyEvent ready_event_;
    /// A planned read's targets kept for this connection (SparseReadPlanRequest::target_set).
    using KeptTargets = wire::KeptTargetSet;
    /// The targets of a planned read: those of `req`, kept under its target_set when it has
    /// one, or those kept under it. Errors: NotFound (none kept under the id).
    Result<std::span<const TargetDescriptor>> PlanTargets(const wire::SparseReadPlanRequest& req);
    std::vector<KeptTargets> kept_targets_;  ///< At most wire::kMaxKeptTargetSets.
    std::uint64_t kept_clock_ = 0;
};

}  // namespace mooncake::sparse
