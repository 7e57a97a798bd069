// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// NodeServer: the node daemon's core (docs/design.md §5-6, "one node: the node daemon + DummyClients").
// It owns the node's shared-memory store (ShmStore) and ONE SparseStore over it, so the
// node-local tile-index and range caches, and the single-flight table of range reads, serve
// every process of the node. Clients talk to it over a Unix SOCK_SEQPACKET socket with the
// messages of store/wire.h.
//
// Why it is built this way:
// - One thread per connection. A node has a few dozen processes at most; a blocking thread per
//   client keeps each conversation a plain loop, and a slow or stuck client only stalls itself.
// - A connection's state (its registered buffer mapping and its leases) lives in that thread
//   and dies with the connection: a client that crashes, or is SIGKILLed between writing its
//   buffer and the commit, leaves nothing behind — an object becomes visible only by the
//   store's atomic install at the very end of a request.
// - Nothing a client sends is trusted: frames are decoded by the bounds-checked wire codec,
//   every offset/size is checked against the client's buffer, a malformed payload gets an
//   ErrorReply, and a frame that breaks the framing closes that connection only.
// - Sparse commits are re-validated: the daemon rebuilds the object from the client's indices
//   and values (BuildSparseObject validates coordinates, order and dtypes), checks the tile
//   index the client sent (ValidateTileIndex) and requires every checksum to match the
//   rebuilt object's, then commits its own private copy (the client cannot change it after).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "executor/sparse_store.h"
#include "executor/tensor_store.h"
#include "mooncake/sparse/status.h"
#include "store/shm_store.h"
#include "transport/cuda_runtime.h"  // CudaStream
#include "transport/pinned_pool.h"
#include "node/uds.h"

namespace mooncake::sparse {

/// One update of a device commit put to the GPU check: its members in device memory (mapped
/// into the daemon) and the plan of its object (PlanIndexedSource).
struct DeviceIndexItem {
    std::uintptr_t indices = 0;
    std::uintptr_t values = 0;
    int device = 0;
    const SourceDescriptor* plan = nullptr;
};

/// What the GPU check found (as cuda::IndexResult): canonical entries, their tile index and the
/// XXH3-64 sums of both members; not canonical says nothing more.
struct DeviceIndexResult {
    bool canonical = false;
    std::vector<TileCoord> tile_coords;
    std::vector<std::uint64_t> tile_ptr;
    std::uint64_t checksum_indices = 0;
    std::uint64_t checksum_values = 0;
};

/// Checks a batch on its device, ordered on `stream`; returns once the results are on the host.
using DeviceIndexFn = std::function<Result<std::vector<DeviceIndexResult>>(
    std::span<const DeviceIndexItem>, CudaStream stream)>;

/// One range of a DeviceGatherFn: `bytes` bytes from page-locked host memory at `src` (its host
/// address) to device address `dst`.
struct DeviceRangeCopy {
    const std::byte* src = nullptr;
    std::uintptr_t dst = 0;
    std::uint64_t bytes = 0;
};

/// Copies every range into memory of `device` with one kernel launch (and, for large runs, the
/// copy engine beside it), ordered on `stream` (not waited for). Unimplemented: the device cannot read page-locked host memory by its host
/// address (the caller copies range by range).
using DeviceGatherFn =
    std::function<Status(std::span<const DeviceRangeCopy>, int device, CudaStream stream)>;

/// One copy of a DeviceCopyToHostFn: `bytes` bytes from device address `src` (in this process)
/// to host memory at `dst`.
struct DeviceToHostCopy {
    std::uintptr_t src = 0;
    std::byte* dst = nullptr;
    std::uint64_t bytes = 0;
};

/// Copies device memory of `device` into host memory, after the work queued on `stream`;
/// complete when it returns.
using DeviceCopyToHostFn =
    std::function<Status(std::span<const DeviceToHostCopy>, int device, CudaStream stream)>;

struct NodeServerOptions {
    std::string socket_path;
    std::string node_id = "node0";
    ShmStoreOptions store;
    /// Capacity of each node-local cache of the SparseStore (tile indexes, range reads).
    std::uint64_t cache_capacity_bytes = std::uint64_t{1} << 30;
    /// Largest client buffer a client may register.
    std::uint64_t client_buffer_max_bytes = std::uint64_t{1} << 30;
    std::uint32_t max_connections = 1024;
    std::uint32_t max_leases_per_connection = 1 << 20;
    /// Where sparse source objects, manifests and generation heads live. Null: the node's
    /// shared-memory store. A distributed store (e.g. upstream Mooncake Store) here makes the
    /// daemon's caches and single-flight table serve the node's processes across nodes: each
    /// unique range a node needs crosses the network once. Tensors stay in the segments.
    std::shared_ptr<ObjectStore> sparse_objects;
    /// Where tensor objects (put_tensor ...) live. Null: the node's segments (the same-node fast
    /// path only). A distributed store (upstream Mooncake Store) here publishes every tensor
    /// there, so a daemon of another node on the same master reads it: a tensor whose chosen
    /// replica is this daemon's own is copied in place, one of another node arrives by one
    /// network transfer per batch into this daemon's (pinned) memory, and either way goes to
    /// the client's tensor by CUDA IPC or through its client buffer.
    std::shared_ptr<ObjectStore> tensor_objects;
    /// Host bytes the tensor path may pin for tensor_objects (landing and sending memory); 0:
    /// none.
    std::uint64_t tensor_pinned_quota_bytes = 0;
    /// Host bytes the daemon may pin for the commits it copies from clients' CUDA memory
    /// (SparseCommitDevice); beyond it they land in pageable memory (slower device copies).
    std::uint64_t commit_staging_pinned_bytes = std::uint64_t{1} << 30;
    /// The GPU check of commits from clients' CUDA memory (SparseCommitDevice): the daemon
    /// binary sets cuda::IndexCanonicalBatch (src/cuda/gpu_index.h) here when it is built with
    /// the GPU codec and a GPU is usable. Canonical updates are then copied into this daemon's
    /// own memory on the client's GPU (one device-to-device copy per run of the client's
    /// arena, into a buffer the daemon keeps per device: as large as the largest such commit,
    /// at most a commit request's 256 MiB of members or one larger update), checked, indexed
    /// and checksummed there, and copied from there into the store's memory: the bytes that
    /// land are the bytes checked, whatever the client does with its memory meanwhile. Null
    /// (or an update the GPU does not take, one of less than 64 KiB of entries, or no device
    /// memory for the daemon's copy): the update is copied into staging memory, then checked
    /// and indexed on the host.
    DeviceIndexFn device_index;
    /// The device-to-host copies of the commits device_index checked: the daemon binary sets
    /// cuda::CopyBatchToHost here with it, so a commit's copies go in a few batched driver
    /// calls (a layer step's 592 members, 262 MB, took 6.4 ms in separate copies on an H100
    /// host, 5.0 batched). Null: one copy per member.
    DeviceCopyToHostFn device_copy_to_host;
    /// Entry bytes of the first group of a commit checked by device_index: the groups after it
    /// are checked on a worker thread while the one before each is copied into the store, each
    /// three times the bytes of the one before (DeviceCommitGroups). 0 (the default until it is
    /// measured on a GPU): the whole commit is checked before any of it is copied.
    std::uint64_t device_commit_group_bytes = 0;
    /// The copies of device reads from the segments into clients' GPU memory (LeasesToDevice,
    /// LeaseRangesToDevice): the daemon binary sets cuda::CopyRanges (src/cuda/gpu_read.h) here
    /// when it is built with the GPU codec. A read's ranges then cross PCIe in one kernel that
    /// reads the pinned segments, where the copy engine takes one transfer per range (a step's
    /// read holds thousands). Null: one copy-engine transfer per range.
    DeviceGatherFn device_gather;
    /// A client's CUDA IPC event (LeaseRangesToDeviceRequest::ready_event) opened on `device`
    /// (kept per connection, destroyed with the last reference), and its record on a stream.
    /// The daemon binary sets cuda::OpenIpcEvent / RecordIpcEvent here with device_gather: a
    /// planned read's copies are then queued and the event recorded after them, and the reply
    /// goes at once. Null: the reply goes once the copies are done.
    std::function<Result<std::shared_ptr<void>>(std::span<const std::byte> handle, int device)>
        open_ipc_event;
    std::function<Status(void* event, CudaStream stream)> record_ipc_event;
    /// Materialization threads of one read_sparse_objects call when the client asks for 0.
    std::uint32_t read_threads = 2;
    /// Reads build their targets straight from the stored bytes (ReadOptions::view_in_place)
    /// when the sparse objects are the node's own shared memory: no copy of the planned ranges,
    /// and no node range cache (range_gets then counts each call's ranges viewed). Off: ranges
    /// are copied into the range cache, each read once for the node.
    bool read_in_place = false;
    /// A reply that the client does not read within this time closes the connection.
    std::chrono::milliseconds send_timeout{30000};
    /// A frame whose first packet has arrived must be complete within this time, or the
    /// connection is closed and its partial frame freed (a peer cannot park up to a max-size
    /// frame of daemon memory). Also the time a new connection has to send its Hello. Zero: no
    /// limit.
    std::chrono::milliseconds frame_timeout{10000};
    /// A connection that holds nothing (no registered client buffer, no lease) and sends
    /// nothing for this long is closed. Connections with state are never closed for idling: a
    /// trainer may sit between steps for long, and its leases back zero-copy views. Zero: never.
    std::chrono::milliseconds idle_timeout{60000};
    /// Mark the process non-dumpable (prctl PR_SET_DUMPABLE 0) at Start: a same-uid peer can
    /// then neither write /proc/<pid>/mem nor ptrace the daemon (at the cost of core dumps).
    bool disable_dumping = true;
};

struct NodeServerStats {
    std::uint64_t connections_total = 0;
    std::uint64_t connections_active = 0;
    std::uint64_t rejected_peers = 0;  ///< SO_PEERCRED uid mismatch or over max_connections.
    std::uint64_t requests = 0;
    std::uint64_t request_errors = 0;   ///< ErrorReply sent.
    std::uint64_t protocol_errors = 0;  ///< Connections closed for broken framing.
    std::uint64_t frame_timeouts = 0;   ///< Closed: a frame not completed within frame_timeout.
    std::uint64_t idle_closes = 0;      ///< Closed: no Hello in time, or idle without state.
    std::uint64_t connections_evicted = 0;  ///< Closed to make room at max_connections.
    std::uint64_t connection_threads = 0;   ///< Connection threads not yet joined.
};

class NodeServer {
public:
    /// Creates the store and binds the socket (mode 0600; a stale socket file of a dead daemon
    /// is replaced), then accepts connections on a background thread. The segments are
    /// pre-faulted and pinned in the background meanwhile (ShmStoreOptions), so the daemon
    /// serves at once.
    ///
    /// Connection policy: at max_connections a new connection evicts the longest-idle
    /// connection that holds nothing (no client buffer, no lease) and is not in a request; when
    /// every connection holds state the new one is refused. Clients re-dial on their next call.
    /// Errors: as ShmStore::Create and UnixListener::Bind.
    static Result<std::unique_ptr<NodeServer>> Start(const NodeServerOptions& options);

    ~NodeServer();
    NodeServer(const NodeServer&) = delete;
    NodeServer& operator=(const NodeServer&) = delete;

    /// Stops accepting, closes every connection (their leases are released), joins all threads
    /// and removes the socket file. Idempotent.
    void Stop();

    ShmStore& store() { return *store_; }
    SparseStore& sparse() { return *sparse_; }
    /// The sparse store of a namespace ("" the default one), made on first use.
    /// Errors: InvalidArgument (not a namespace name).
    Result<SparseStore*> SparseFor(const std::string& name_space);
    /// The tensor fast path over the segments (TensorPut / TensorGet requests).
    TensorStore& tensors() { return *tensors_; }
    NodeServerStats Stats() const;
    const NodeServerOptions& options() const { return options_; }
    /// The §4 metrics plus the daemon's gauges (store, segments, pinning, connections), as
    /// MetricsReply carries them.
    std::vector<std::pair<std::string, double>> MetricItems() const;

private:
    struct Connection;
    class Session;

    NodeServer(NodeServerOptions options, std::shared_ptr<ShmStore> store, UnixListener listener,
               UniqueFd wake);
    void AcceptLoop();
    void Serve(const std::shared_ptr<Connection>& connection);
    void ReapFinished();
    /// Makes room for one more connection (see Start). Needs mu_. False: none to evict.
    bool EvictIdleLocked();

    const NodeServerOptions options_;
    std::shared_ptr<ShmStore> store_;
    std::unique_ptr<SparseStore> sparse_;
    std::mutex namespaces_mu_;
    std::map<std::string, std::unique_ptr<SparseStore>> namespaces_;  // Guarded by namespaces_mu_.
    std::unique_ptr<TensorStore> tensors_;
    /// Landing memory of SparseCommitDevice (pinned up to commit_staging_pinned_bytes).
    std::shared_ptr<PinnedHostPool> commit_staging_;
    UnixListener listener_;
    /// eventfd: a finished connection wakes the accept loop, which joins its thread at once.
    UniqueFd wake_;
    std::thread accept_thread_;

    mutable std::mutex mu_;
    std::vector<std::shared_ptr<Connection>> connections_;  // Guarded by mu_.
    bool stopping_ = false;                                  // Guarded by mu_.
    std::uint64_t next_connection_id_ = 1;                   // Guarded by mu_.

    std::atomic<std::uint64_t> connections_total_{0};
    std::atomic<std::uint64_t> rejected_peers_{0};
    std::atomic<std::uint64_t> requests_{0};
    /// Per request type (indexed by its wire value): requests served, and the time from their
    /// frame's arrival to their handler's return (decoding included); every reply's encoding
    /// and sending apart. Against a client's time in the call, what remains is the transport.
    struct RequestClock {
        std::atomic<std::uint64_t> count{0};
        std::atomic<std::uint64_t> nanos{0};
    };
    static constexpr std::size_t kRequestTypes = 128;
    std::array<RequestClock, kRequestTypes> request_clocks_{};
    std::atomic<std::uint64_t> reply_nanos_{0};
    std::atomic<std::uint64_t> request_errors_{0};
    std::atomic<std::uint64_t> protocol_errors_{0};
    std::atomic<std::uint64_t> frame_timeouts_{0};
    std::atomic<std::uint64_t> idle_closes_{0};
    std::atomic<std::uint64_t> connections_evicted_{0};
    std::atomic<std::uint64_t> cuda_ipc_opens_{0};  ///< Mappings opened (all connections).
    std::atomic<std::uint64_t> cuda_ipc_hits_{0};   ///< Mapping cache hits.
    std::atomic<std::uint64_t> commit_in_place_items_{0};  ///< Host commits filled in place.
    std::atomic<std::uint64_t> device_commit_items_{0};  ///< SparseCommitDevice updates.
    std::atomic<std::uint64_t> device_commit_bytes_{0};  ///< ... and their entries' bytes.
    std::atomic<std::uint64_t> device_commit_copies_{0};  ///< ... in this many D2H copies.
    std::atomic<std::uint64_t> device_commit_gpu_items_{0};  ///< ... checked on the GPU.
    /// ... the daemon's own copy of them and the GPU check, as far as the handler waited for
    /// it (a group checked while the one before it is copied into the store is not counted),
    std::atomic<std::uint64_t> device_commit_check_nanos_{0};
    std::atomic<std::uint64_t> device_commit_check_groups_{0};  ///< ... in this many groups,
    std::atomic<std::uint64_t> device_commit_private_copies_{0};  ///< ... that copy's spans,
    std::atomic<std::uint64_t> device_commit_fill_nanos_{0};  ///< ... copies into the store,
    /// ... of which until the device-to-host copies had landed (the rest: host copies of the
    /// small objects out of pinned staging),
    std::atomic<std::uint64_t> device_commit_landed_nanos_{0};
    std::atomic<std::uint64_t> device_commit_pageable_bytes_{0};  ///< ... into pageable memory.
    std::atomic<std::uint64_t> device_commit_copy_nanos_{0};  ///< ... mapping and copying,
    std::atomic<std::uint64_t> device_commit_nanos_{0};       ///< ... the whole of the handler.
    /// The daemon's own device memory, per device, into which a commit checked on the GPU
    /// copies the client's members first (CommitCheckedOnDevice); one commit at a time holds
    /// a device's. Freed when the server is destroyed.
    struct DeviceScratch {
        std::mutex mu;
        std::uintptr_t address = 0;  // Guarded by mu.
        std::uint64_t bytes = 0;     // Guarded by mu.
    };
    /// The device's scratch of at least `bytes` (grown when smaller), held through `hold`.
    /// Errors: those of cuda::DeviceAlloc (ResourceExhausted: the device is full).
    Result<std::uintptr_t> DeviceScratchOf(int device, std::uint64_t bytes,
                                           std::unique_lock<std::mutex>& hold);
    std::mutex device_scratch_mu_;
    /// Guarded by device_scratch_mu_ (the map; each scratch by its own mu).
    std::map<int, std::unique_ptr<DeviceScratch>> device_scratch_;
    std::atomic<std::uint64_t> device_scratch_bytes_{0};  ///< Held, all devices.
    std::atomic<std::uint64_t> leases_to_device_bytes_{0};   ///< LeasesToDevice members' bytes.
    std::atomic<std::uint64_t> leases_to_device_copies_{0};  ///< ... in this many H2D copies
    /// (a gather kernel's launch counted once) of this many spans of segment memory.
    std::atomic<std::uint64_t> leases_to_device_runs_{0};
    /// ... of which requests answered before their copies were done (the client's ready event
    /// recorded after them).
    std::atomic<std::uint64_t> leases_to_device_deferred_{0};
    std::atomic<std::uint64_t> leases_to_device_nanos_{0};   ///< ... taking this long.
    std::atomic<std::uint64_t> planned_reads_{0};            ///< SparseReadPlan requests served.
    /// SparseReadPlan requests whose targets the connection kept from an earlier one.
    std::atomic<std::uint64_t> planned_reads_kept_targets_{0};
    /// SparseReadPlan requests whose ranges were copied to the client's device as planned.
    std::atomic<std::uint64_t> planned_reads_staged_{0};
    std::atomic<std::uint64_t> step_reads_{0};  ///< SparseReadStep requests served.
    std::atomic<std::uint64_t> planned_read_nanos_{0};       ///< ... taking this long,
    std::atomic<std::uint64_t> planned_read_plan_nanos_{0};  ///< ... until the plan was made,
    std::atomic<std::uint64_t> planned_read_queued_nanos_{0};  ///< ... its copies queued.
};

}  // namespace mooncake::sparse
