// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's server: accept loop, one thread per connection, and the request handlers
// (see node_server.h for the design).
#include "node/node_server.h"
#include "node/node_session.h"

#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
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

using node_internal::kDaemonVersion;
using node_internal::Product;

using node_internal::NanosBetween;

namespace {

/// "SparseCommitDevice" -> "sparse_commit_device".
std::string SnakeCase(std::string_view camel) {
    std::string out;
    out.reserve(camel.size() + 4);
    for (const char c : camel) {
        if (std::isupper(static_cast<unsigned char>(c))) {
            if (!out.empty()) out.push_back('_');
            out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
        } else {
            out.push_back(c);
        }
    }
    return out;
}

}  // namespace

void NodeServer::Session::Run() {
    UnixConnection& conn = connection_.conn;
    const NodeServerOptions& o = server_.options_;
    // Copies into the client's memory left running (a deferred LeaseRangesToDevice) finish
    // before the connection's mappings of that memory are closed.
    struct DrainDeferred {
        Session& s;
        ~DrainDeferred() {
            if (s.ready_event_.event != nullptr) {
                (void)cuda::StreamSynchronize(kCudaPerThreadStream, s.ready_event_.device);
            }
        }
    } drain{*this};
    const auto after = [](std::chrono::milliseconds t) {
        return t.count() > 0 ? Deadline::After(t) : Deadline::Never();
    };
    // Every frame of the connection is received into `in` and encoded into `out`: a step's
    // read is megabytes each way, and fresh buffers would fault in every page of them.
    std::vector<std::byte> in, out;
    const auto trim = [](std::vector<std::byte>& b) {
        if (b.capacity() > (std::size_t{16} << 20)) std::vector<std::byte>().swap(b);
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
        Status received =
            conn.RecvFrameInto(in, wire::kMaxFrameBytes, &fds, frame_deadline, /*max_fds=*/1);
        if (!received.ok()) {
            if (received.code() == StatusCode::kUnavailable && frame_deadline.Expired()) {
                // Whatever part of the frame arrived is freed with this return.
                server_.frame_timeouts_.fetch_add(1, std::memory_order_relaxed);
                MCS_LOG(kWarning) << "connection " << connection_.id << " (pid "
                                  << connection_.peer.pid << "): closing, a frame was not "
                                  << "completed within frame_timeout: "
                                  << received.ToString();
            } else if (received.code() == StatusCode::kUnavailable) {
                MCS_LOG(kDebug) << "connection " << connection_.id << ": " << received.ToString();
            } else {
                // The framing is broken (bad header, oversized frame): nothing more can be
                // read reliably from this peer. Tell it why, then close.
                server_.protocol_errors_.fetch_add(1, std::memory_order_relaxed);
                MCS_LOG(kWarning) << "connection " << connection_.id << " (pid " << connection_.peer.pid
                             << "): closing after a malformed frame: "
                             << received.ToString();
                auto err = wire::EncodeFrame(wire::ErrorReply::FromStatus(received), 0);
                if (err.ok()) {
                    (void)conn.SendFrame(*err, {}, Deadline::After(std::chrono::milliseconds(100)));
                }
            }
            return;
        }
        auto frame = wire::DecodeFrame(in);
        if (!frame.ok()) {  // RecvFrame validated the header; this is a length mismatch.
            server_.protocol_errors_.fetch_add(1, std::memory_order_relaxed);
            MCS_LOG(kWarning) << "connection " << connection_.id
                         << ": closing after an undecodable frame: " << frame.status().ToString();
            return;
        }
        server_.requests_.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t request_id = frame->header.request_id;
        const auto dispatched = std::chrono::steady_clock::now();
        Result<Reply> reply = Dispatch(*frame, fds);
        const auto handled = std::chrono::steady_clock::now();
        if (const auto t = static_cast<std::size_t>(frame->header.type); t < kRequestTypes) {
            RequestClock& clock = server_.request_clocks_[t];
            clock.count.fetch_add(1, std::memory_order_relaxed);
            clock.nanos.fetch_add(NanosBetween(dispatched, handled), std::memory_order_relaxed);
        }
        fds.clear();  // Close any fd a handler did not take.
        // Before the reply goes out: once the client has it, it may count on this connection
        // being kept (never evicted for being stateless).
        connection_.stateful.store(buffer_.has_value() || !leases_.empty(),
                                   std::memory_order_relaxed);
        const wire::MessageType request_type = frame->header.type;
        trim(in);  // `frame` views `in`: not used below.
        if (reply.ok()) {
            Status encoded = wire::EncodeFrameInto(reply->message, request_id, out);
            if (!encoded.ok()) reply = encoded.WithContext("encoding the reply");
        }
        if (!reply.ok()) {
            server_.request_errors_.fetch_add(1, std::memory_order_relaxed);
            MCS_LOG(kDebug) << "connection " << connection_.id << " "
                    << wire::MessageTypeName(request_type) << ": "
                    << reply.status().ToString();
            Status encoded = wire::EncodeFrameInto(
                wire::ErrorReply::FromStatus(reply.status()), request_id, out);
            if (!encoded.ok()) {
                MCS_LOG(kError) << "connection " << connection_.id
                                << ": cannot encode a reply: " << encoded.ToString();
                return;
            }
        }
        const std::span<const int> reply_fds =
            reply.ok() ? std::span<const int>(reply->fds) : std::span<const int>();
        Status sent = conn.SendFrame(out, reply_fds, Deadline::After(server_.options_.send_timeout));
        server_.reply_nanos_.fetch_add(NanosBetween(handled, std::chrono::steady_clock::now()),
                                       std::memory_order_relaxed);
        trim(out);
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
        return Handler(std::move(*req) __VA_OPT__(, ) __VA_ARGS__);              \
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
        MCS_DISPATCH_(kSparseCommitBatch, SparseCommitBatch)
        MCS_DISPATCH_(kSparseCommitDevice, SparseCommitDevice)
        MCS_DISPATCH_(kLeasesToDevice, LeasesToDevice)
        MCS_DISPATCH_(kLeaseRangesToDevice, LeaseRangesToDevice)
        MCS_DISPATCH_(kSparseReadPlan, SparseReadPlan)
        MCS_DISPATCH_(kSparseAdmit, SparseAdmit)
        MCS_DISPATCH_(kSparseAdmitBatch, SparseAdmitBatch)
        MCS_DISPATCH_(kSparseManifest, SparseManifest)
        MCS_DISPATCH_(kSparseCurrentGeneration, SparseCurrentGeneration)
        MCS_DISPATCH_(kSparseRead, SparseRead)
        MCS_DISPATCH_(kSparseReadStep, SparseReadStep)
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
    auto leased = server_.store_->Lease(req.key);
    if (!leased.ok() && leased.status().code() == StatusCode::kNotFound &&
        server_.options_.tensor_objects && !req.key.starts_with(kReservedKeyPrefix)) {
        // Tensors live in the distributed store: the client's zero-copy view (get_tensor) is a
        // keyless copy of the current version in the segments, freed with the lease.
        leased = LeaseFromTensorObjects(req.key);
    }
    if (!leased.ok()) return leased.status();
    ObjectLease lease = std::move(leased).value();
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

Result<ObjectLease> NodeServer::Session::LeaseFromTensorObjects(const std::string& key) {
    Result<ObjectLease> out = NotFound("no object '" + key.substr(0, 200) + "'");
    const std::string_view keys[] = {key};
    MCS_RETURN_IF_ERROR(server_.options_.tensor_objects->ViewObjects(
        keys,
        [&](std::span<const ObjectView> views) -> Status {
            const ObjectInfo& info = *views[0].info;
            std::vector<MemberData> members;
            for (std::size_t i = 0; i < info.members.size(); ++i) {
                const MemberInfo& m = info.members[i];
                members.push_back({m.name, m.dtype, m.shape, views[0].members[i], m.checksum});
            }
            out = server_.store_->Publish(key, info.metadata, members);
            return out.status();
        }));
    return out;
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
    if (options_.tensor_objects) {
        tensor_options.backend = "node+mooncake";
        tensor_options.pinned_quota_bytes = options_.tensor_pinned_quota_bytes;
        tensors_ = MakeLocalTensorStore(options_.tensor_objects, tensor_options);
    } else {
        tensor_options.backend = "node";  // Segment memory: pinned by the store's own quota.
        tensors_ = MakeLocalTensorStore(store_, tensor_options);
    }
    commit_staging_ = PinnedHostPool::Make(options_.commit_staging_pinned_bytes);
}

NodeServer::~NodeServer() {
    Stop();
    // No commit holds a scratch once the connections are joined.
    for (auto& [device, scratch] : device_scratch_) {
        if (scratch->address != 0) (void)cuda::DeviceFree(scratch->address, device);
    }
}

Result<std::uintptr_t> NodeServer::DeviceScratchOf(int device, std::uint64_t bytes,
                                                   std::unique_lock<std::mutex>& hold) {
    DeviceScratch* scratch = nullptr;
    {
        std::lock_guard lock(device_scratch_mu_);
        std::unique_ptr<DeviceScratch>& slot = device_scratch_[device];
        if (!slot) slot = std::make_unique<DeviceScratch>();
        scratch = slot.get();
    }
    hold = std::unique_lock(scratch->mu);
    if (scratch->bytes < bytes) {
        // Grown in steps of 64 MiB, so that steps of slightly different sizes keep one buffer.
        constexpr std::uint64_t kGrain = std::uint64_t{64} << 20;
        if (scratch->address != 0) {
            // The last holder waited for its copies out of it before it let go.
            MCS_RETURN_IF_ERROR(cuda::DeviceFree(scratch->address, device));
            device_scratch_bytes_.fetch_sub(scratch->bytes, std::memory_order_relaxed);
            scratch->address = 0;
            scratch->bytes = 0;
        }
        const std::uint64_t want = (bytes + kGrain - 1) / kGrain * kGrain;
        MCS_ASSIGN_OR_RETURN(scratch->address, cuda::DeviceAlloc(want, device));
        scratch->bytes = want;
        device_scratch_bytes_.fetch_add(want, std::memory_order_relaxed);
    }
    return scratch->address;
}

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
        {"sparse_commit_in_place_items",
         double(commit_in_place_items_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_items", double(device_commit_items_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_bytes", double(device_commit_bytes_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_copies",
         double(device_commit_copies_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_gpu_items",
         double(device_commit_gpu_items_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_check_groups",
         double(device_commit_check_groups_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_check_seconds",
         1e-9 * double(device_commit_check_nanos_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_fill_seconds",
         1e-9 * double(device_commit_fill_nanos_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_landed_seconds",
         1e-9 * double(device_commit_landed_nanos_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_private_copies",
         double(device_commit_private_copies_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_private_bytes",
         double(device_scratch_bytes_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_pageable_bytes",
         double(device_commit_pageable_bytes_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_copy_seconds",
         1e-9 * double(device_commit_copy_nanos_.load(std::memory_order_relaxed))},
        {"sparse_device_commit_seconds",
         1e-9 * double(device_commit_nanos_.load(std::memory_order_relaxed))},
        {"leases_to_device_bytes", double(leases_to_device_bytes_.load(std::memory_order_relaxed))},
        {"leases_to_device_copies",
         double(leases_to_device_copies_.load(std::memory_order_relaxed))},
        {"leases_to_device_runs", double(leases_to_device_runs_.load(std::memory_order_relaxed))},
        {"leases_to_device_deferred",
         double(leases_to_device_deferred_.load(std::memory_order_relaxed))},
        {"leases_to_device_seconds",
         1e-9 * double(leases_to_device_nanos_.load(std::memory_order_relaxed))},
        {"planned_reads", double(planned_reads_.load(std::memory_order_relaxed))},
        {"planned_reads_kept_targets",
         double(planned_reads_kept_targets_.load(std::memory_order_relaxed))},
        {"planned_reads_staged", double(planned_reads_staged_.load(std::memory_order_relaxed))},
        {"step_reads", double(step_reads_.load(std::memory_order_relaxed))},
        {"planned_read_seconds", 1e-9 * double(planned_read_nanos_.load(std::memory_order_relaxed))},
        {"planned_read_plan_seconds",
         1e-9 * double(planned_read_plan_nanos_.load(std::memory_order_relaxed))},
        {"planned_read_queued_seconds",
         1e-9 * double(planned_read_queued_nanos_.load(std::memory_order_relaxed))},
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
    // Per request type served so far: requests_<type> and request_<type>_seconds (its name in
    // snake case: requests_sparse_commit_device), and the replies' time.
    for (std::size_t t = 0; t < kRequestTypes; ++t) {
        const std::uint64_t count = request_clocks_[t].count.load(std::memory_order_relaxed);
        if (count == 0) continue;
        const std::string name =
            SnakeCase(wire::MessageTypeName(static_cast<wire::MessageType>(t)));
        items.emplace_back("requests_" + name, double(count));
        items.emplace_back("request_" + name + "_seconds",
                           1e-9 * double(request_clocks_[t].nanos.load(std::memory_order_relaxed)));
    }
    items.emplace_back("reply_seconds", 1e-9 * double(reply_nanos_.load(std::memory_order_relaxed)));
    if (options_.tensor_objects) {
        // The tensor path on a distributed store: where each read's chosen replica was, and the
        // network transfers that moved them (one per batch).
        const StoreCounters t = options_.tensor_objects->Counters();
        const std::pair<const char*, double> tensor_extra[] = {
            {"tensor_store_remote", 1.0},
            {"tensor_store_local_views", double(t.local_views)},
            {"tensor_store_remote_views", double(t.remote_views)},
            {"tensor_store_remote_bytes", double(t.remote_view_bytes)},
            {"tensor_store_batch_transfers", double(t.batch_transfers)},
        };
        for (const auto& [name, value] : tensor_extra) items.emplace_back(name, value);
    }
    return items;
}

}  // namespace mooncake::sparse
