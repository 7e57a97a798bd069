// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's server: accept loop, one thread per connection, and the request handlers
// (see node_server.h for the design).
#include "node/node_server.h"

#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include "codec/codec.h"
#include "node/log.h"
#include "store/pinned_memory.h"
#include "store/shm_segment.h"
#include "node/wire.h"
#include "transport/cuda_ipc.h"
#include "transport/pitched_copy.h"

namespace mooncake::sparse {
namespace {

constexpr std::string_view kDaemonVersion = "mooncake_sparse_node 0.1.0";
constexpr std::uint32_t kMaxReadThreads = 64;

/// `a * b * c` without overflow, or nullopt.
std::optional<std::uint64_t> Product(std::uint64_t a, std::uint64_t b, std::uint64_t c = 1) {
    std::uint64_t out = 0;
    if (__builtin_mul_overflow(a, b, &out) || __builtin_mul_overflow(out, c, &out)) {
        return std::nullopt;
    }
    return out;
}

template <typename T>
std::span<const std::byte> AsBytes(const std::vector<T>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

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
    Result<Reply> Release(const wire::ReleaseRequest& req);
    Result<Reply> SparseCommit(const wire::SparseCommitRequest& req);
    Result<Reply> SparseAdmit(const wire::SparseAdmitRequest& req);
    Result<Reply> SparseManifest(const wire::SparseManifestRequest& req);
    Result<Reply> SparseCurrentGeneration(const wire::SparseCurrentGenerationRequest& req);
    Result<Reply> SparseRead(const wire::SparseReadRequest& req);
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
};

void NodeServer::Session::Run() {
    UnixConnection& conn = connection_.conn;
    const NodeServerOptions& o = server_.options_;
    const auto after = [](std::chrono::milliseconds t) {
        return t.count() > 0 ? Deadline::After(t) : Deadline::Never();
    };
    for (;;) {
        const bool has_state = buffer_.has_value() || !leases_.empty();
        connection_.MarkIdle(has_state);
        // A connection slot is not free for ever: a new peer must say Hello promptly, and one
        // that holds nothing must keep talking.
        const Deadline idle = !hello_done_ ? after(o.frame_timeout)
                              : has_state  ? Deadline::Never()
                                           : after(o.idle_timeout);
        if (Status ready = conn.WaitReadable(idle); !ready.ok()) {
            if (idle.Expired()) {
                server_.idle_closes_.fetch_add(1, std::memory_order_relaxed);
                MCS_LOG(kInfo) << "connection " << connection_.id << " (pid "
                               << connection_.peer.pid << "): closing, "
                               << (hello_done_ ? "idle without state" : "no Hello in time");
            }
            return;
        }
        connection_.busy.store(true, std::memory_order_release);
        std::vector<UniqueFd> fds;
        const Deadline frame_deadline = after(o.frame_timeout);
        auto bytes = conn.RecvFrame(wire::kMaxFrameBytes, &fds, frame_deadline, /*max_fds=*/1);
        if (!bytes.ok()) {
            if (bytes.status().code() == StatusCode::kUnavailable && frame_deadline.Expired()) {
                // Whatever part of the frame arrived is freed with this return.
                server_.frame_timeouts_.fetch_add(1, std::memory_order_relaxed);
                MCS_LOG(kWarning) << "connection " << connection_.id << " (pid "
                                  << connection_.peer.pid << "): closing, a frame was not "
                                  << "completed within frame_timeout: "
                                  << bytes.status().ToString();
            } else if (bytes.status().code() == StatusCode::kUnavailable) {
                MCS_LOG(kDebug) << "connection " << connection_.id << ": " << bytes.status().ToString();
            } else {
                // The framing is broken (bad header, oversized frame): nothing more can be
                // read reliably from this peer. Tell it why, then close.
                server_.protocol_errors_.fetch_add(1, std::memory_order_relaxed);
                MCS_LOG(kWarning) << "connection " << connection_.id << " (pid " << connection_.peer.pid
                             << "): closing after a malformed frame: "
                             << bytes.status().ToString();
                auto err = wire::EncodeFrame(wire::ErrorReply::FromStatus(bytes.status()), 0);
                if (err.ok()) {
                    (void)conn.SendFrame(*err, {}, Deadline::After(std::chrono::milliseconds(100)));
                }
            }
            return;
        }
        auto frame = wire::DecodeFrame(*bytes);
        if (!frame.ok()) {  // RecvFrame validated the header; this is a length mismatch.
            server_.protocol_errors_.fetch_add(1, std::memory_order_relaxed);
            MCS_LOG(kWarning) << "connection " << connection_.id
                         << ": closing after an undecodable frame: " << frame.status().ToString();
            return;
        }
        server_.requests_.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t request_id = frame->header.request_id;
        Result<Reply> reply = Dispatch(*frame, fds);
        fds.clear();  // Close any fd a handler did not take.
        // Before the reply goes out: once the client has it, it may count on this connection
        // being kept (never evicted for being stateless).
        connection_.stateful.store(buffer_.has_value() || !leases_.empty(),
                                   std::memory_order_relaxed);
        Result<std::vector<std::byte>> out = Internal("unset");
        if (reply.ok()) {
            out = wire::EncodeFrame(reply->message, request_id);
            if (!out.ok()) reply = out.status().WithContext("encoding the reply");
        }
        if (!reply.ok()) {
            server_.request_errors_.fetch_add(1, std::memory_order_relaxed);
            MCS_LOG(kDebug) << "connection " << connection_.id << " "
                    << wire::MessageTypeName(frame->header.type) << ": "
                    << reply.status().ToString();
            out = wire::EncodeFrame(wire::ErrorReply::FromStatus(reply.status()), request_id);
        }
        if (!out.ok()) {
            MCS_LOG(kError) << "connection " << connection_.id
                       << ": cannot encode a reply: " << out.status().ToString();
            return;
        }
        const std::span<const int> reply_fds =
            reply.ok() ? std::span<const int>(reply->fds) : std::span<const int>();
        Status sent = conn.SendFrame(*out, reply_fds, Deadline::After(server_.options_.send_timeout));
        if (!sent.ok()) {
            MCS_LOG(kDebug) << "connection " << connection_.id << ": " << sent.ToString();
            return;
        }
    }
}

Result<NodeServer::Session::Reply> NodeServer::Session::Dispatch(const wire::Frame& frame,
                                                                 std::vector<UniqueFd>& fds) {
    using wire::MessageType;
    const MessageType type = frame.header.type;
    if (!fds.empty() && type != MessageType::kRegisterBuffer) {
        return InvalidArgument(std::string(wire::MessageTypeName(type)) + " carries no fds");
    }
    if (!hello_done_ && type != MessageType::kHello) {
        return FailedPrecondition("the first request on a connection must be Hello, got " +
                                  std::string(wire::MessageTypeName(type)));
    }
    // Each case decodes the payload (bounds-checked, trailing bytes rejected) and handles it.
#define MCS_DISPATCH_(MsgType, Handler, ...)                                     \
    case MessageType::MsgType: {                                                 \
        auto req = wire::DecodePayloadAs<wire::Handler##Request>(frame.payload); \
        if (!req.ok()) return req.status();                                      \
        return Handler(*req __VA_OPT__(, ) __VA_ARGS__);                         \
    }
    switch (type) {
        MCS_DISPATCH_(kHello, Hello)
        MCS_DISPATCH_(kRegisterBuffer, RegisterBuffer, fds)
        MCS_DISPATCH_(kPut, Put)
        MCS_DISPATCH_(kStat, Stat)
        MCS_DISPATCH_(kReadMember, ReadMember)
        MCS_DISPATCH_(kReadRanges, ReadRanges)
        MCS_DISPATCH_(kRemove, Remove)
        MCS_DISPATCH_(kList, List)
        MCS_DISPATCH_(kLease, Lease)
        MCS_DISPATCH_(kRelease, Release)
        MCS_DISPATCH_(kSparseCommit, SparseCommit)
        MCS_DISPATCH_(kSparseAdmit, SparseAdmit)
        MCS_DISPATCH_(kSparseManifest, SparseManifest)
        MCS_DISPATCH_(kSparseCurrentGeneration, SparseCurrentGeneration)
        MCS_DISPATCH_(kSparseRead, SparseRead)
        MCS_DISPATCH_(kMetrics, Metrics)
        MCS_DISPATCH_(kClearCaches, ClearCaches)
        MCS_DISPATCH_(kTensorPut, TensorPut)
        MCS_DISPATCH_(kTensorGet, TensorGet)
        MCS_DISPATCH_(kSparseStepManifest, SparseStepManifest)
        MCS_DISPATCH_(kSparseSeal, SparseSeal)
        MCS_DISPATCH_(kSparseWait, SparseWait)
        MCS_DISPATCH_(kSparseLatest, SparseLatest)
        MCS_DISPATCH_(kSparseRetention, SparseRetention)
        MCS_DISPATCH_(kSparseAnchor, SparseAnchor)
        default:
            return InvalidArgument(std::string(wire::MessageTypeName(type)) +
                                   " is not a request a daemon serves");
    }
#undef MCS_DISPATCH_
}

Result<std::span<std::byte>> NodeServer::Session::ClientBytes(const wire::BufferRef& ref,
                                                              std::string_view what) {
    if (ref.kind != wire::BufferKind::kClientBuffer) {
        return Unimplemented(std::string(what) +
                             ": CUDA IPC buffers are not supported by this daemon build");
    }
    if (!buffer_) {
        return FailedPrecondition(std::string(what) + ": no client buffer is registered");
    }
    auto slice = buffer_->Slice(ref.offset, ref.size);
    if (!slice.ok()) return slice.status().WithContext(std::string(what) + " (client buffer)");
    return slice;
}

Status NodeServer::Session::AddLeases(std::vector<ObjectLease> leases,
                                      std::vector<std::uint64_t>& ids) {
    if (leases_.size() + leases.size() > server_.options_.max_leases_per_connection) {
        return ResourceExhausted("this connection holds " + std::to_string(leases_.size()) +
                                 " leases; the limit is " +
                                 std::to_string(server_.options_.max_leases_per_connection) +
                                 " (release some)");
    }
    for (ObjectLease& lease : leases) {
        const std::uint64_t id = next_lease_id_++;
        leases_.emplace(id, std::move(lease));
        ids.push_back(id);
    }
    return Status::Ok();
}

Result<NodeServer::Session::Reply> NodeServer::Session::Hello(const wire::HelloRequest& req) {
    if (req.protocol_version != wire::kProtocolVersion) {
        return FailedPrecondition("client speaks protocol " +
                                  std::to_string(req.protocol_version) + ", daemon speaks " +
                                  std::to_string(wire::kProtocolVersion));
    }
    if (hello_done_) return FailedPrecondition("Hello was already received");
    MCS_ASSIGN_OR_RETURN(sparse_, server_.SparseFor(req.name_space));
    hello_done_ = true;
    MCS_LOG(kInfo) << "connection " << connection_.id << ": client '" << req.client_name << "' pid "
              << connection_.peer.pid;
    wire::HelloReply reply;
    reply.daemon_version = std::string(kDaemonVersion);
    reply.node_id = server_.options_.node_id;
    reply.client_buffer_max = server_.options_.client_buffer_max_bytes;
    Reply out;
    for (const ShmSegmentDesc& s : server_.store_->Segments()) {
        reply.segments.push_back({s.id, s.size, /*read_only=*/true});
        out.fds.push_back(s.read_only_fd);
    }
    out.message = std::move(reply);
    return out;
}

Result<NodeServer::Session::Reply> NodeServer::Session::RegisterBuffer(
    const wire::RegisterBufferRequest& req, std::vector<UniqueFd>& fds) {
    if (fds.size() != 1) {
        return InvalidArgument("RegisterBuffer carries exactly one fd, got " +
                               std::to_string(fds.size()));
    }
    if (req.size == 0 || req.size > server_.options_.client_buffer_max_bytes) {
        return InvalidArgument("client buffer of " + std::to_string(req.size) +
                               " bytes; the daemon accepts 1 .. " +
                               std::to_string(server_.options_.client_buffer_max_bytes));
    }
    // Map writable: replies are copied into it. ShmMapping::Map refuses a file that is not a
    // memfd sealed against shrinking, so the client can never make our accesses fault.
    auto mapping = ShmMapping::Map(fds[0].get(), req.size, /*writable=*/true);
    if (!mapping.ok()) return mapping.status().WithContext("client buffer");
    buffer_ = std::move(mapping).value();
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::Put(const wire::PutRequest& req) {
    std::vector<MemberData> members;
    members.reserve(req.members.size());
    for (const wire::PutMember& m : req.members) {
        MCS_ASSIGN_OR_RETURN(auto bytes, ClientBytes(m.src, "member '" + m.name + "'"));
        members.push_back({m.name, m.dtype, m.shape, bytes, m.checksum});
    }
    MCS_RETURN_IF_ERROR(server_.store_->Put(req.key, req.metadata, members, {req.mode, req.hard_pin}));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::Stat(const wire::StatRequest& req) {
    MCS_ASSIGN_OR_RETURN(ObjectInfo info, server_.store_->Stat(req.key));
    return Reply{wire::StatReply{std::move(info)}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::ReadMember(
    const wire::ReadMemberRequest& req) {
    MCS_ASSIGN_OR_RETURN(auto dst, ClientBytes(req.dst, "destination"));
    MCS_RETURN_IF_ERROR(server_.store_->ReadMember(req.key, req.member, dst));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::ReadRanges(
    const wire::ReadRangesRequest& req) {
    std::vector<RangeRead> reads;
    reads.reserve(req.items.size());
    for (std::size_t i = 0; i < req.items.size(); ++i) {
        const wire::RangeItem& item = req.items[i];
        MCS_ASSIGN_OR_RETURN(auto dst,
                             ClientBytes(item.dst, "range " + std::to_string(i) + " destination"));
        reads.push_back({item.key, item.member, item.row_start, item.row_end, dst});
    }
    MCS_RETURN_IF_ERROR(server_.store_->ReadRanges(reads));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::Remove(const wire::RemoveRequest& req) {
    MCS_RETURN_IF_ERROR(server_.store_->Remove(req.key));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::List(const wire::ListRequest& req) {
    MCS_ASSIGN_OR_RETURN(auto keys, server_.store_->List(req.prefix));
    if (keys.size() > wire::kMaxListKeys) {
        return ResourceExhausted(std::to_string(keys.size()) + " keys match '" + req.prefix +
                                 "'; a reply holds at most " +
                                 std::to_string(wire::kMaxListKeys) + " (use a longer prefix)");
    }
    return Reply{wire::ListReply{std::move(keys)}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::Lease(const wire::LeaseRequest& req) {
    MCS_ASSIGN_OR_RETURN(ObjectLease lease, server_.store_->Lease(req.key));
    wire::LeaseReply reply;
    reply.info = lease.info();
    for (std::size_t i = 0; i < reply.info.members.size(); ++i) {
        reply.locations.push_back(
            {lease.segment_id(), lease.member_offset(i), reply.info.members[i].size_bytes});
    }
    std::vector<ObjectLease> one;
    one.push_back(std::move(lease));
    std::vector<std::uint64_t> ids;
    MCS_RETURN_IF_ERROR(AddLeases(std::move(one), ids));
    reply.lease_id = ids.front();
    return Reply{std::move(reply), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::Release(const wire::ReleaseRequest& req) {
    std::size_t unknown = 0;
    std::uint64_t first_unknown = 0;
    for (std::uint64_t id : req.lease_ids) {
        if (leases_.erase(id) == 0 && unknown++ == 0) first_unknown = id;
    }
    if (unknown > 0) {
        return NotFound(std::to_string(unknown) + " of " + std::to_string(req.lease_ids.size()) +
                        " lease ids are not held by this connection (first: " +
                        std::to_string(first_unknown) + "); the others were released");
    }
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseCommit(
    const wire::SparseCommitRequest& req) {
    const SourceDescriptor& d = req.desc;
    if (req.coordinate_space != "global") {
        return InvalidArgument("only global-coordinate objects are committed as sources, got '" +
                               req.coordinate_space + "'");
    }
    const std::uint64_t rank = d.rank();
    const auto index_bytes = Product(d.nnz, rank, DTypeSize(d.index_dtype));
    const auto value_bytes = Product(d.nnz, DTypeSize(d.value_dtype));
    const auto coord_bytes = Product(d.num_tiles, rank, sizeof(TileCoord));
    const auto ptr_bytes = Product(d.num_tiles + 1, sizeof(std::uint64_t));
    if (!index_bytes || !value_bytes || !coord_bytes || !ptr_bytes ||
        req.indices.src.size != *index_bytes || req.values.src.size != *value_bytes ||
        req.tile_coords.src.size != *coord_bytes || req.tile_ptr.src.size != *ptr_bytes) {
        return InvalidArgument("member sizes do not match the descriptor of " + d.tensor_id +
                               " (nnz " + std::to_string(d.nnz) + ", " +
                               std::to_string(d.num_tiles) + " tiles, rank " +
                               std::to_string(rank) + ")");
    }
    MCS_ASSIGN_OR_RETURN(auto indices, ClientBytes(req.indices.src, "indices"));
    MCS_ASSIGN_OR_RETURN(auto values, ClientBytes(req.values.src, "values"));
    MCS_ASSIGN_OR_RETURN(auto coords_bytes, ClientBytes(req.tile_coords.src, "tile_coords"));
    MCS_ASSIGN_OR_RETURN(auto ptr_bytes_span, ClientBytes(req.tile_ptr.src, "tile_ptr"));

    // Private copies first: the client may keep writing its buffer while we validate.
    std::vector<TileCoord> coords(d.num_tiles * rank);
    std::vector<std::uint64_t> ptr(d.num_tiles + 1);
    if (!coords.empty()) std::memcpy(coords.data(), coords_bytes.data(), coords_bytes.size());
    std::memcpy(ptr.data(), ptr_bytes_span.data(), ptr_bytes_span.size());
    if (Status s = ValidateTileIndex({rank, coords, ptr}, d); !s.ok()) {
        return s.WithContext("tile index of " + d.tensor_id);
    }
    // Rebuild from the entries: BuildSparseObject copies them out of the client buffer and
    // validates dtypes, coordinates (inside the source box), order and duplicates.
    SourceDescriptor desc = d;
    EncodeOptions encode;
    encode.tile_shape = d.tile_shape;
    encode.num_threads = 1;
    const HostArray index_array{d.index_dtype, {Index(d.nnz), Index(rank)}, indices};
    const HostArray value_array{d.value_dtype, {Index(d.nnz)}, values};
    auto built = BuildSparseObject(std::move(desc), index_array, value_array, encode);
    if (!built.ok()) return built.status().WithContext("validating " + d.tensor_id);
    SparseObject& object = *built;
    if (object.desc.index_dtype != d.index_dtype || object.desc.num_tiles != d.num_tiles ||
        object.tile_coords != coords || object.tile_ptr != ptr) {
        return InvalidArgument("the object sent for " + d.tensor_id +
                               " is not in canonical form (entries sorted by tile, narrowest "
                               "index dtype, matching tile index)");
    }
    if (object.checksum_indices != req.indices.checksum ||
        object.checksum_values != req.values.checksum ||
        object.checksum_tile_coords != req.tile_coords.checksum ||
        object.checksum_tile_ptr != req.tile_ptr.checksum) {
        return DataLoss("checksums of " + d.tensor_id +
                        " do not match the bytes in the client buffer");
    }
    MCS_ASSIGN_OR_RETURN(CommitResult c,
                         sparse_->CommitSparseObject(std::move(object), req.hard_pin));
    return Reply{wire::SparseCommitReply{c.source_ref, c.created, c.nnz, c.bytes}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseAdmit(
    const wire::SparseAdmitRequest& req) {
    MCS_ASSIGN_OR_RETURN(bool admitted,
                         sparse_->Admit(req.tensor_id, req.generation, req.policy,
                                                req.source_placement, req.writer_id));
    return Reply{wire::SparseAdmitReply{admitted}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseManifest(
    const wire::SparseManifestRequest& req) {
    MCS_ASSIGN_OR_RETURN(auto sources, sparse_->Manifest(req.generation));
    return Reply{wire::SparseManifestReply{std::move(sources)}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseCurrentGeneration(
    const wire::SparseCurrentGenerationRequest& req) {
    MCS_ASSIGN_OR_RETURN(auto generation, sparse_->CurrentGeneration(req.tensor_id));
    return Reply{wire::SparseCurrentGenerationReply{generation}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseRead(
    const wire::SparseReadRequest& req) {
    ReadOptions options;
    options.plan = req.options.plan;
    options.strategy = req.options.strategy == wire::ReadStrategy::kFullSourcePerTarget
                           ? ReadStrategy::kFullSourcePerTarget
                           : ReadStrategy::kSparseRanges;
    options.num_threads = static_cast<int>(
        req.options.num_threads == 0 ? server_.options_.read_threads
                                     : std::min(req.options.num_threads, kMaxReadThreads));
    std::vector<TargetObject> objects;
    if (req.step) {
        StepManifest step{*req.step, req.manifest, req.unchanged, true};
        std::sort(step.unchanged.begin(), step.unchanged.end());
        MCS_ASSIGN_OR_RETURN(objects, sparse_->ReadSparseObjects(step, req.targets, options));
    } else {
        MCS_ASSIGN_OR_RETURN(objects,
                             sparse_->ReadSparseObjects(req.manifest, req.targets, options));
    }

    // Publish each target-local object into segment memory, leased to this connection.
    wire::SparseReadReply reply;
    std::vector<ObjectLease> leases;
    leases.reserve(objects.size());
    for (const TargetObject& t : objects) {
        const SparseObject& o = t.object;
        const SourceDescriptor& d = o.desc;
        const Index nnz = Index(d.nnz), rank = Index(d.rank()), tiles = Index(d.num_tiles);
        const MemberData members[] = {
            {"indices", d.index_dtype, {nnz, rank}, o.indices, o.checksum_indices},
            {"values", d.value_dtype, {nnz}, o.values, o.checksum_values},
            {"tile_coords", DType::kUInt32, {tiles, rank}, AsBytes(o.tile_coords),
             o.checksum_tile_coords},
            {"tile_ptr", DType::kUInt64, {tiles + 1}, AsBytes(o.tile_ptr), o.checksum_tile_ptr},
        };
        MCS_ASSIGN_OR_RETURN(ObjectLease lease,
                             server_.store_->Publish("target/" + t.target_id, {}, members));
        auto slice = [&](std::size_t i) -> wire::SegmentMember {
            return {{lease.segment_id(), lease.member_offset(i), lease.info().members[i].size_bytes},
                    lease.info().members[i].checksum};
        };
        wire::TargetObjectLocation loc;
        loc.target_id = t.target_id;
        loc.node_id = t.node_id;
        loc.target_box = t.target_box;
        loc.desc = d;
        loc.coordinate_space = o.coordinate_space;
        loc.indices = slice(0);
        loc.values = slice(1);
        loc.tile_coords = slice(2);
        loc.tile_ptr = slice(3);
        reply.objects.push_back(std::move(loc));
        leases.push_back(std::move(lease));
    }
    std::vector<std::uint64_t> ids;
    MCS_RETURN_IF_ERROR(AddLeases(std::move(leases), ids));
    for (std::size_t i = 0; i < ids.size(); ++i) reply.objects[i].lease_id = ids[i];
    return Reply{std::move(reply), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::Metrics(const wire::MetricsRequest& req) {
    wire::MetricsReply reply;
    for (auto& [name, value] : server_.MetricItems()) reply.items.push_back({name, value});
    if (req.reset) sparse_->ResetMetrics();
    return Reply{std::move(reply), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::ClearCaches(
    const wire::ClearCachesRequest&) {
    sparse_->ClearCaches();
    return Reply{wire::OkReply{}, {}};
}

namespace {

wire::SparseStepManifestReply StepManifestReply(StepManifest m) {
    return {m.generation, std::move(m.sources), std::move(m.unchanged), m.sealed};
}

}  // namespace

Result<NodeServer::Session::Reply> NodeServer::Session::SparseStepManifest(
    const wire::SparseStepManifestRequest& req) {
    MCS_ASSIGN_OR_RETURN(StepManifest m, sparse_->GetManifest(req.generation));
    return Reply{StepManifestReply(std::move(m)), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseSeal(
    const wire::SparseSealRequest& req) {
    MCS_RETURN_IF_ERROR(sparse_->SealGeneration(req.generation, req.tensor_ids));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseWait(
    const wire::SparseWaitRequest& req) {
    // This connection's thread blocks; others are served meanwhile. A seal through the daemon
    // wakes it at once.
    MCS_ASSIGN_OR_RETURN(StepManifest m,
                         sparse_->WaitGeneration(req.generation, req.timeout_seconds));
    return Reply{StepManifestReply(std::move(m)), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseLatest(
    const wire::SparseLatestRequest& req) {
    MCS_ASSIGN_OR_RETURN(std::optional<Generation> g,
                         req.anchor ? sparse_->LatestAnchor() : sparse_->LatestGeneration());
    return Reply{wire::SparseLatestReply{g}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseRetention(
    const wire::SparseRetentionRequest& req) {
    if (req.set) MCS_RETURN_IF_ERROR(sparse_->SetRetention(req.keep_last));
    if (req.keep_anchors) MCS_RETURN_IF_ERROR(sparse_->SetKeepAnchors(*req.keep_anchors));
    MCS_ASSIGN_OR_RETURN(std::uint64_t keep, sparse_->Retention());
    return Reply{wire::SparseRetentionReply{keep}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseAnchor(
    const wire::SparseAnchorRequest& req) {
    MCS_RETURN_IF_ERROR(sparse_->RecordAnchor(req.generation, req.tensor_ids));
    return Reply{wire::OkReply{}, {}};
}

Result<std::vector<TensorRef>> NodeServer::Session::ResolveTensors(
    const std::vector<wire::TensorItem>& items, bool destination,
    std::vector<std::shared_ptr<const CudaIpcMapping>>& holders) {
    std::vector<TensorRef> refs;
    refs.reserve(items.size());
    const CudaIpcCacheStats before = ipc_cache_.Stats();
    for (std::size_t i = 0; i < items.size(); ++i) {
        const wire::TensorItem& item = items[i];
        const std::string what = std::string(destination ? "destination " : "") + "tensor " +
                                 std::to_string(i) + " '" + item.key.substr(0, 200) + "'";
        const wire::BufferRef& ref = item.location.ref;
        if (ref.kind == wire::BufferKind::kClientBuffer) {
            MCS_ASSIGN_OR_RETURN(std::span<std::byte> bytes, ClientBytes(ref, what));
            refs.push_back(TensorRef::Host(item.dtype, item.shape, bytes));
            continue;
        }
        // A view's strides come from the peer: the memory they reach must be exactly the range
        // it exported (and that range lies inside the allocation mapped below), so no stride
        // can make the copies write outside the mapping.
        ViewSpan span;
        if (!item.strides.empty()) {
            auto s = StridedViewSpan(item.shape, item.strides, DTypeSize(item.dtype));
            if (!s.ok()) return s.status().WithContext(what);
            if (s->bytes != ref.size) {
                return InvalidArgument(what + ": its strides span " + std::to_string(s->bytes) +
                                       " bytes, the exported range has " +
                                       std::to_string(ref.size));
            }
            span = *s;
        }
        CudaIpcExport e;
        std::memcpy(e.handle.data(), ref.cuda_ipc_handle.data(), e.handle.size());
        e.base = item.location.cuda_base;
        e.alloc_size = item.location.cuda_alloc_size;
        e.offset = ref.offset;
        e.bytes = ref.size;
        e.device = ref.device;
        e.pci_bus_id = item.location.pci_bus_id;
        auto mapped = ipc_cache_.Map(e);
        if (!mapped.ok()) return mapped.status().WithContext(what);
        holders.push_back(std::move(mapped->second));
        // Copies run on this thread's own stream: connections do not serialize on one stream.
        DeviceMemory memory = mapped->first;
        if (!item.strides.empty()) {
            memory.address += static_cast<std::uint64_t>(-span.first);  // element [0, ..., 0]
            memory.bytes = 0;
            if (auto full = MakeFullTensorHeader(item.dtype, item.shape); full.ok()) {
                memory.bytes = full->data_bytes;  // the elements' bytes, as TensorRef counts them
            }
        }
        TensorRef t = TensorRef::Cuda(item.dtype, item.shape, memory, kCudaPerThreadStream);
        t.strides = item.strides;
        refs.push_back(std::move(t));
    }
    const CudaIpcCacheStats after = ipc_cache_.Stats();
    server_.cuda_ipc_opens_.fetch_add(after.opens - before.opens, std::memory_order_relaxed);
    server_.cuda_ipc_hits_.fetch_add(after.hits - before.hits, std::memory_order_relaxed);
    return refs;
}

Result<NodeServer::Session::Reply> NodeServer::Session::TensorPut(
    const wire::TensorPutRequest& req) {
    std::vector<std::shared_ptr<const CudaIpcMapping>> holders;
    MCS_ASSIGN_OR_RETURN(std::vector<TensorRef> refs, ResolveTensors(req.items, false, holders));
    std::vector<std::string> keys;
    keys.reserve(req.items.size());
    for (const wire::TensorItem& item : req.items) keys.push_back(item.key);
    MCS_RETURN_IF_ERROR(server_.tensors_->Put(keys, refs, {req.mode, req.hard_pin}));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::TensorGet(
    const wire::TensorGetRequest& req) {
    std::vector<std::shared_ptr<const CudaIpcMapping>> holders;
    MCS_ASSIGN_OR_RETURN(std::vector<TensorRef> refs, ResolveTensors(req.items, true, holders));
    std::vector<std::string> keys;
    std::vector<Shape> box_origins;
    keys.reserve(req.items.size());
    bool boxes = false;
    for (const wire::TensorItem& item : req.items) {
        keys.push_back(item.key);
        box_origins.push_back(item.box_origin);
        boxes |= !item.box_origin.empty();
    }
    if (!boxes) box_origins.clear();
    MCS_RETURN_IF_ERROR(server_.tensors_->GetInto(keys, refs, box_origins));
    return Reply{wire::OkReply{}, {}};
}

// ---------------------------------------------------------------------------------------------
// NodeServer
// ---------------------------------------------------------------------------------------------
Result<std::unique_ptr<NodeServer>> NodeServer::Start(const NodeServerOptions& options) {
    if (options.socket_path.empty()) return InvalidArgument("socket_path is empty");
    if (options.disable_dumping && ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
        // A same-uid peer could write /proc/<pid>/mem (segments, leases, the object table).
        MCS_LOG(kWarning) << "prctl(PR_SET_DUMPABLE, 0): " << std::strerror(errno);
    }
    UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake.valid()) return Internal(std::string("eventfd: ") + std::strerror(errno));
    auto store = ShmStore::Create(options.store);
    if (!store.ok()) return store.status().WithContext("creating the shared-memory store");
    auto listener = UnixListener::Bind(options.socket_path, 0600);
    if (!listener.ok()) return listener.status().WithContext("binding " + options.socket_path);
    std::unique_ptr<NodeServer> server(
        new NodeServer(options, std::shared_ptr<ShmStore>(std::move(store).value()),
                       std::move(listener).value(), std::move(wake)));
    server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
    return server;
}

NodeServer::NodeServer(NodeServerOptions options, std::shared_ptr<ShmStore> store,
                       UnixListener listener, UniqueFd wake)
    : options_(std::move(options)),
      store_(std::move(store)),
      listener_(std::move(listener)),
      wake_(std::move(wake)) {
    SparseStoreOptions sparse_options;
    sparse_options.node_id = options_.node_id;
    sparse_options.index_cache_capacity_bytes = options_.cache_capacity_bytes;
    sparse_options.range_cache_capacity_bytes = options_.cache_capacity_bytes;
    sparse_ = std::make_unique<SparseStore>(
        options_.sparse_objects ? options_.sparse_objects : std::shared_ptr<ObjectStore>(store_),
        sparse_options);
    LocalTensorStoreOptions tensor_options;
    tensor_options.backend = "node";  // Segment memory: pinned by the store's own quota.
    tensors_ = MakeLocalTensorStore(store_, tensor_options);
}

NodeServer::~NodeServer() { Stop(); }

void NodeServer::AcceptLoop() {
    for (;;) {
        pollfd fds[2] = {{listener_.fd(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
        const int rc = ::poll(fds, 2, -1);
        {
            std::lock_guard lock(mu_);
            if (stopping_) return;
        }
        if (rc < 0) {
            if (errno == EINTR) continue;
            MCS_LOG(kWarning) << "poll: " << std::strerror(errno);
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        if (fds[1].revents & POLLIN) {
            std::uint64_t count = 0;
            // An eventfd read of 8 bytes either succeeds or finds it already drained.
            [[maybe_unused]] const ssize_t drained = ::read(wake_.get(), &count, sizeof count);
        }
        ReapFinished();  // Right when a connection ends, not on the next accept.
        if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        auto accepted = listener_.Accept(Deadline::After(std::chrono::milliseconds(0)));
        if (!accepted.ok()) {
            if (accepted.status().code() == StatusCode::kUnavailable) {
                if (fds[0].revents & (POLLHUP | POLLERR)) return;  // shut down
                continue;  // The peer gave up before we accepted.
            }
            MCS_LOG(kWarning) << "accept: " << accepted.status().ToString();
            std::this_thread::sleep_for(std::chrono::milliseconds(10));  // e.g. out of fds
            continue;
        }
        auto connection = std::make_shared<Connection>();
        connection->conn = std::move(accepted).value();
        auto cred = connection->conn.PeerCredentials();
        Status allowed = cred.ok() ? RequireSameUser(*cred) : cred.status();
        if (!allowed.ok()) {
            rejected_peers_.fetch_add(1, std::memory_order_relaxed);
            MCS_LOG(kWarning) << "rejecting a connection: " << allowed.ToString();
            continue;  // Closed by the destructor.
        }
        connection->peer = *cred;
        connection->MarkIdle(false);
        std::lock_guard lock(mu_);
        if (stopping_) return;
        const std::size_t live = static_cast<std::size_t>(
            std::count_if(connections_.begin(), connections_.end(), [](const auto& c) {
                return !c->finished.load(std::memory_order_acquire) &&
                       !c->evicted.load(std::memory_order_relaxed);
            }));
        if (live >= options_.max_connections && !EvictIdleLocked()) {
            rejected_peers_.fetch_add(1, std::memory_order_relaxed);
            MCS_LOG(kWarning) << "rejecting pid " << cred->pid << ": " << live
                              << " connections already (max_connections), each holding state";
            continue;
        }
        connection->id = next_connection_id_++;
        connections_total_.fetch_add(1, std::memory_order_relaxed);
        connection->thread = std::thread([this, connection] { Serve(connection); });
        connections_.push_back(std::move(connection));
    }
}

bool NodeServer::EvictIdleLocked() {
    Connection* victim = nullptr;
    Connection::Clock::rep oldest = 0;
    for (const auto& c : connections_) {
        if (c->finished.load(std::memory_order_acquire) ||
            c->evicted.load(std::memory_order_relaxed) ||
            c->busy.load(std::memory_order_acquire) ||
            c->stateful.load(std::memory_order_relaxed)) {
            continue;
        }
        const auto since = c->idle_since.load(std::memory_order_relaxed);
        if (victim == nullptr || since < oldest) {
            victim = c.get();
            oldest = since;
        }
    }
    if (victim == nullptr) return false;
    victim->evicted.store(true, std::memory_order_relaxed);
    victim->conn.Shutdown();  // Its thread sees EOF, ends and is reaped.
    connections_evicted_.fetch_add(1, std::memory_order_relaxed);
    MCS_LOG(kInfo) << "connection " << victim->id << " (pid " << victim->peer.pid
                   << "): evicted, idle without state at max_connections";
    return true;
}

void NodeServer::Serve(const std::shared_ptr<Connection>& connection) {
    {
        Session session(*this, *connection);
        session.Run();
        // The session's leases and buffer mapping are released here, before the thread ends.
    }
    connection->conn.Shutdown();
    MCS_LOG(kDebug) << "connection " << connection->id << " closed";
    connection->finished.store(true, std::memory_order_release);
    const std::uint64_t one = 1;
    // The accept loop joins this thread. An eventfd write only fails when the counter would
    // overflow, and then the loop is woken already.
    [[maybe_unused]] const ssize_t woke = ::write(wake_.get(), &one, sizeof one);
}

void NodeServer::ReapFinished() {
    std::vector<std::shared_ptr<Connection>> done;
    {
        std::lock_guard lock(mu_);
        auto it = std::partition(connections_.begin(), connections_.end(), [](const auto& c) {
            return !c->finished.load(std::memory_order_acquire);
        });
        done.assign(std::make_move_iterator(it), std::make_move_iterator(connections_.end()));
        connections_.erase(it, connections_.end());
    }
    for (auto& c : done) {
        if (c->thread.joinable()) c->thread.join();
    }
}

void NodeServer::Stop() {
    std::vector<std::shared_ptr<Connection>> connections;
    {
        std::lock_guard lock(mu_);
        if (stopping_) return;
        stopping_ = true;
        connections = connections_;
    }
    listener_.Shutdown();
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t woke = ::write(wake_.get(), &one, sizeof one);
    if (accept_thread_.joinable()) accept_thread_.join();
    for (auto& c : connections) c->conn.Shutdown();
    for (auto& c : connections) {
        if (c->thread.joinable()) c->thread.join();
    }
    {
        std::lock_guard lock(mu_);
        connections_.clear();
    }
    listener_ = UnixListener();  // Removes the socket file.
}

NodeServerStats NodeServer::Stats() const {
    NodeServerStats s;
    s.connections_total = connections_total_.load(std::memory_order_relaxed);
    {
        std::lock_guard lock(mu_);
        s.connection_threads = connections_.size();
        for (const auto& c : connections_) {
            if (!c->finished.load(std::memory_order_acquire)) ++s.connections_active;
        }
    }
    s.rejected_peers = rejected_peers_.load(std::memory_order_relaxed);
    s.requests = requests_.load(std::memory_order_relaxed);
    s.request_errors = request_errors_.load(std::memory_order_relaxed);
    s.protocol_errors = protocol_errors_.load(std::memory_order_relaxed);
    s.frame_timeouts = frame_timeouts_.load(std::memory_order_relaxed);
    s.idle_closes = idle_closes_.load(std::memory_order_relaxed);
    s.connections_evicted = connections_evicted_.load(std::memory_order_relaxed);
    return s;
}

Result<SparseStore*> NodeServer::SparseFor(const std::string& name_space) {
    if (name_space.empty()) return sparse_.get();
    MCS_RETURN_IF_ERROR(ValidateNamespace(name_space));
    std::lock_guard lock(namespaces_mu_);
    auto& store = namespaces_[name_space];
    if (!store) {
        SparseStoreOptions o = sparse_->options();
        o.name_space = name_space;
        store = std::make_unique<SparseStore>(
            options_.sparse_objects ? options_.sparse_objects : std::shared_ptr<ObjectStore>(store_),
            o);
    }
    return store.get();
}

std::vector<std::pair<std::string, double>> NodeServer::MetricItems() const {
    std::vector<std::pair<std::string, double>> items = sparse_->Metrics().Items();
    const ShmStoreStats shm = store_->Stats();
    const StoreCounters counters = store_->Counters();
    const NodeServerStats server = Stats();
    const PinningSupport& pinning = GetPinningSupport();
    const TensorStoreStats tensors = tensors_->Stats();
    const std::pair<const char*, double> extra[] = {
        {"store_puts", double(counters.puts)},
        {"store_bytes_put", double(counters.bytes_put)},
        {"store_member_gets", double(counters.member_gets)},
        {"store_member_bytes", double(counters.member_bytes)},
        {"store_range_reads", double(counters.range_reads)},
        {"store_range_bytes", double(counters.range_bytes)},
        {"store_removes", double(counters.removes)},
        {"shm_segments", double(shm.segments)},
        {"shm_capacity_bytes", double(shm.capacity_bytes)},
        {"shm_used_bytes", double(shm.used_bytes)},
        {"shm_largest_free_bytes", double(shm.largest_free_bytes)},
        {"shm_objects", double(shm.objects)},
        {"shm_metadata_bytes", double(shm.metadata_bytes)},
        {"shm_leases", double(shm.leases)},
        {"shm_evictions", double(shm.evictions)},
        {"shm_evicted_bytes", double(shm.evicted_bytes)},
        {"shm_in_place_upserts", double(shm.in_place_upserts)},
        {"shm_realloc_upserts", double(shm.realloc_upserts)},
        {"shm_published_objects", double(shm.published_objects)},
        {"pinned_quota_bytes", double(options_.store.pinned_quota_bytes)},
        {"pinned_bytes", double(shm.pinned_bytes)},
        {"pageable_bytes", double(shm.pageable_bytes)},
        // Background preparation of the segments (store/segment_preparer.h).
        {"pinned_target_bytes", double(shm.preparation.pinned_target_bytes)},
        {"pin_failures", double(shm.preparation.pin_failures)},
        {"prefault_target_bytes", double(shm.preparation.prefault_target_bytes)},
        {"prefaulted_bytes", double(shm.preparation.prefaulted_bytes)},
        {"prefault_failures", double(shm.preparation.prefault_failures)},
        {"pinning_complete", shm.preparation.complete ? 1.0 : 0.0},
        {"cuda_available", pinning.available ? 1.0 : 0.0},
        {"cuda_devices", double(pinning.device_count)},
        {"cuda_ipc_available", cuda::GetSupport().ipc_available ? 1.0 : 0.0},
        {"cuda_ipc_opens", double(cuda_ipc_opens_.load(std::memory_order_relaxed))},
        {"cuda_ipc_hits", double(cuda_ipc_hits_.load(std::memory_order_relaxed))},
        {"tensors_put", double(tensors.tensors_put)},
        {"tensor_bytes_put", double(tensors.bytes_put)},
        {"tensors_read", double(tensors.tensors_read)},
        {"tensor_bytes_read", double(tensors.bytes_read)},
        {"tensor_cuda_copies", double(tensors.cuda_copies)},
        {"tensor_pinned_copies", double(tensors.pinned_copies)},
        {"tensor_pageable_copies", double(tensors.pageable_copies)},
        {"tensor_pageable_chunks", double(tensors.pageable_chunks)},
        {"connections_active", double(server.connections_active)},
        {"connections_total", double(server.connections_total)},
        {"rejected_peers", double(server.rejected_peers)},
        {"requests", double(server.requests)},
        {"request_errors", double(server.request_errors)},
        {"protocol_errors", double(server.protocol_errors)},
        {"frame_timeouts", double(server.frame_timeouts)},
        {"idle_closes", double(server.idle_closes)},
        {"connections_evicted", double(server.connections_evicted)},
        {"connection_threads", double(server.connection_threads)},
    };
    // Traffic of the store the sparse layer reads (the segments, or a distributed store such as
    // upstream Mooncake, whose range bytes are then the bytes that crossed the network).
    const StoreCounters sparse_counters = sparse_->object_store().Counters();
    const std::pair<const char*, double> sparse_extra[] = {
        {"sparse_store_remote", options_.sparse_objects ? 1.0 : 0.0},
        {"sparse_store_member_gets", double(sparse_counters.member_gets)},
        {"sparse_store_member_bytes", double(sparse_counters.member_bytes)},
        {"sparse_store_range_reads", double(sparse_counters.range_reads)},
        {"sparse_store_range_bytes", double(sparse_counters.range_bytes)},
    };
    for (const auto& [name, value] : extra) items.emplace_back(name, value);
    for (const auto& [name, value] : sparse_extra) items.emplace_back(name, value);
    return items;
}

}  // namespace mooncake::sparse
