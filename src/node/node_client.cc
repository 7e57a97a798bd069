// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The DummyClient of the node daemon (see node_client.h for the design): connection, lease
// releases, the ObjectStore and the tensor fast path. The sparse layer is node_client_sparse.cc.
#include "node/node_client.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "store/shm_segment.h"
#include "node/uds.h"
#include "transport/host_copy.h"

namespace mooncake::sparse {
namespace {

constexpr std::uint64_t kAlignment = 64;

std::uint64_t AlignUp(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

/// The peer hung up, or sent something nobody asked for (a late reply, an error before
/// closing): either way this connection cannot carry a new request/reply.
bool ConnectionIsStale(int fd) {
    pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
    const int n = ::poll(&p, 1, 0);
    if (n < 0) return errno != EINTR;
    return n > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace

/// One connection to the daemon and what came with it. Views of leased objects hold it, so
/// that a connection with live leases stays open (the daemon keeps those leases) and its
/// segment mappings stay mapped, even after the client moved on to a new connection.
struct NodeClient::Session {
    UnixConnection conn;
    wire::HelloReply hello;
    std::vector<ShmMapping> segments;  ///< Same order as hello.segments.
    std::optional<ShmSegment> buffer;  ///< The registered client buffer.
    std::uint64_t epoch = 0;

    const ShmMapping* Segment(std::uint32_t id) const {
        for (std::size_t i = 0; i < hello.segments.size(); ++i) {
            if (hello.segments[i].segment_id == id) return &segments[i];
        }
        return nullptr;
    }
};

/// What a view's keepalive owns: its lease (queued for release when the view goes) and the
/// session whose mappings the bytes lie in.
struct LeaseHandle {
    std::weak_ptr<NodeClient> client;
    std::shared_ptr<const NodeClient::Session> session;
    std::uint64_t lease_id = 0;

    ~LeaseHandle() {
        if (auto c = client.lock()) c->QueueRelease(session->epoch, lease_id);
    }
};

Result<std::shared_ptr<NodeClient>> NodeClient::Connect(const NodeClientOptions& options) {
    if (options.socket_path.empty()) return InvalidArgument("node daemon socket path is empty");
    std::shared_ptr<NodeClient> client(new NodeClient(options));
    {
        std::lock_guard lock(client->mu_);
        MCS_RETURN_IF_ERROR(client->EnsureConnected());
    }
    return client;
}

NodeClient::NodeClient(NodeClientOptions options) : options_(std::move(options)) {}

NodeClient::~NodeClient() {
    for (const DeviceArena& a : arenas_) {
        if (a.address != 0) (void)cuda::DeviceFree(a.address, a.device);
    }
}

void NodeClient::DropSessionLocked(std::string_view why) {
    if (!session_) return;
    (void)why;
    // Views of this session keep it (and its connection, hence its leases) alive.
    session_.reset();
    std::lock_guard lock(stats_mu_);
    ++stats_.disconnects;
}

Status NodeClient::EnsureConnected() {
    if (session_ && ConnectionIsStale(session_->conn.fd())) DropSessionLocked("stale");
    if (session_) return Status::Ok();

    const Deadline deadline = Deadline::After(options_.connect_timeout);
    MCS_ASSIGN_OR_RETURN(UnixConnection conn, UnixConnection::Connect(options_.socket_path, deadline));
    MCS_ASSIGN_OR_RETURN(PeerCred cred, conn.PeerCredentials());
    MCS_RETURN_IF_ERROR(RequireSameUser(cred).WithContext("node daemon at " + options_.socket_path));

    auto session = std::make_shared<Session>();
    session->conn = std::move(conn);
    wire::HelloRequest hello;
    hello.pid = static_cast<std::uint32_t>(::getpid());
    hello.client_name =
        options_.client_name.empty() ? "pid " + std::to_string(::getpid()) : options_.client_name;
    hello.name_space = options_.name_space;
    const std::uint64_t id = next_request_id_++;
    MCS_ASSIGN_OR_RETURN(auto request, wire::EncodeFrame(hello, id));
    const std::string where = "node daemon at " + options_.socket_path;
    if (Status s = session->conn.SendFrame(request, {}, deadline); !s.ok()) {
        return Unavailable(where + ": Hello: " + s.message());
    }
    std::vector<UniqueFd> fds;
    auto bytes = session->conn.RecvFrame(wire::kMaxFrameBytes, &fds, deadline, wire::kMaxSegments);
    if (!bytes.ok()) return Unavailable(where + ": Hello: " + bytes.status().message());
    MCS_ASSIGN_OR_RETURN(wire::Frame frame, wire::DecodeFrame(*bytes));
    MCS_ASSIGN_OR_RETURN(session->hello, wire::DecodeReplyAs<wire::HelloReply>(frame));
    if (fds.size() != session->hello.segments.size()) {
        return Internal(where + " sent " + std::to_string(fds.size()) + " fds for " +
                        std::to_string(session->hello.segments.size()) + " segments");
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
        auto mapping = ShmMapping::Map(fds[i].get(), session->hello.segments[i].size,
                                       /*writable=*/false);
        if (!mapping.ok()) return mapping.status().WithContext(where + " segment mapping");
        session->segments.push_back(std::move(mapping).value());
    }
    session->epoch = ++epoch_;
    session_ = std::move(session);
    {
        std::lock_guard lock(release_mu_);
        pending_releases_.clear();  // Leases of the old connection died with it.
        pending_epoch_ = epoch_;
    }
    {
        std::lock_guard lock(stats_mu_);
        ++stats_.connects;
        stats_.buffer_bytes = 0;
    }
    Status s = EnsureBuffer(options_.initial_buffer_bytes);
    if (!s.ok()) {
        DropSessionLocked("buffer");
        return s;
    }
    return Status::Ok();
}

bool NodeClient::SpinForReply(int fd, std::uint64_t bytes) const {
    using Clock = std::chrono::steady_clock;
    auto budget = std::chrono::duration_cast<Clock::duration>(options_.reply_spin);
    if (bytes > 0 && options_.spin_bytes_per_second > 0) {
        budget += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
            static_cast<double>(bytes) / options_.spin_bytes_per_second));
    }
    budget = std::min(budget, std::chrono::duration_cast<Clock::duration>(options_.reply_spin_max));
    if (budget <= Clock::duration::zero()) return false;
    const Clock::time_point end = Clock::now() + budget;
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) return true;  // A reply, or a hang-up RecvFrame reports.
        if (Clock::now() >= end) return false;
        ::sched_yield();  // Stays on the core unless another thread is waiting for it.
    }
}

void NodeClient::TrimFrameBuffer(std::vector<std::byte>& buffer) {
    constexpr std::size_t kKeepBytes = std::size_t{16} << 20;
    if (buffer.capacity() > kKeepBytes) std::vector<std::byte>().swap(buffer);
}

Result<wire::Frame> NodeClient::RoundTrip(wire::MessageRef request, std::span<const int> fds,
                                          std::vector<std::byte>& storage,
                                          std::uint64_t spin_bytes) {
    // Never dials: a request may name bytes of this session's client buffer, or lease ids of
    // this session, so it must go out on the connection the caller prepared it for.
    if (!session_) {
        return Unavailable("the connection to the node daemon at " + options_.socket_path +
                           " was dropped during the call");
    }
    struct Clock {  // the call's time, however it ends
        NodeClient& client;
        std::chrono::steady_clock::time_point start;
        ~Clock() {
            const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
            std::lock_guard lock(client.stats_mu_);
            client.stats_.call_seconds += spent.count();
        }
    } clock{*this, std::chrono::steady_clock::now()};
    const std::uint64_t id = next_request_id_++;
    MCS_RETURN_IF_ERROR(wire::EncodeFrameInto(request, id, send_frame_));
    const std::vector<std::byte>& frame_bytes = send_frame_;
    {
        std::lock_guard lock(stats_mu_);
        ++stats_.calls;
    }
    const std::string where = "node daemon at " + options_.socket_path;
    const Deadline deadline = Deadline::After(options_.call_timeout);
    if (Status s = session_->conn.SendFrame(frame_bytes, fds, deadline); !s.ok()) {
        DropSessionLocked("send");
        return Unavailable(where + ": " + s.message());
    }
    TrimFrameBuffer(send_frame_);
    const bool spun = SpinForReply(session_->conn.fd(), spin_bytes);
    {
        std::lock_guard lock(stats_mu_);
        ++(spun ? stats_.replies_spun : stats_.replies_slept);
    }
    if (Status r = session_->conn.RecvFrameInto(storage, wire::kMaxFrameBytes, nullptr, deadline);
        !r.ok()) {
        DropSessionLocked("receive");
        return Unavailable(where + ": " + r.message() +
                           " (the connection was dropped; the call may or may not have taken "
                           "effect, and the next call reconnects)");
    }
    auto frame = wire::DecodeFrame(storage);
    if (!frame.ok()) {
        DropSessionLocked("decode");
        return Unavailable(where + " sent a malformed reply: " + frame.status().message());
    }
    if (frame->header.request_id != id) {
        DropSessionLocked("request id");
        if (frame->header.type == wire::MessageType::kError) {
            auto err = wire::DecodePayloadAs<wire::ErrorReply>(frame->payload);
            if (err.ok()) return err->ToStatus().WithContext(where + " closed the connection");
        }
        return Unavailable(where + " answered request " + std::to_string(id) + " with id " +
                           std::to_string(frame->header.request_id));
    }
    return frame;
}

Status NodeClient::EnsureBuffer(std::uint64_t bytes) {
    if (!session_) return Unavailable("no connection to the node daemon");
    Session& s = *session_;
    if (s.buffer && s.buffer->size() >= bytes) return Status::Ok();
    const std::uint64_t limit = s.hello.client_buffer_max;
    if (bytes > limit) {
        return ResourceExhausted("a request needs " + std::to_string(bytes) +
                                 " bytes of client buffer; the node daemon allows at most " +
                                 std::to_string(limit) + " (client_buffer_max_bytes)");
    }
    const std::uint64_t page = PageSize();
    std::uint64_t size = std::max<std::uint64_t>(bytes, s.buffer ? 2 * s.buffer->size() : 0);
    size = std::max<std::uint64_t>(size, page);
    size = std::min(AlignUp(size, page), limit / page * page);
    if (size < bytes) size = AlignUp(bytes, page);  // limit is not a page multiple
    MCS_ASSIGN_OR_RETURN(ShmSegment buffer,
                         ShmSegment::Create("mooncake_sparse_client", size,
                                            {.seal_future_write = false}));
    std::vector<std::byte> storage;
    const int fd = buffer.fd();
    MCS_ASSIGN_OR_RETURN(wire::Frame frame,
                         RoundTrip(wire::RegisterBufferRequest{size}, std::span<const int>(&fd, 1),
                                   storage));
    MCS_RETURN_IF_ERROR(wire::DecodeReplyAs<wire::OkReply>(frame));
    if (!session_) return Unavailable("node daemon connection dropped while registering a buffer");
    session_->buffer = std::move(buffer);
    std::lock_guard lock(stats_mu_);
    stats_.buffer_bytes = size;
    return Status::Ok();
}

Result<std::vector<std::uint64_t>> NodeClient::StageInBuffer(
    std::span<const std::span<const std::byte>> parts, std::uint64_t& total) {
    std::vector<std::uint64_t> offsets;
    offsets.reserve(parts.size());
    total = 0;
    for (std::span<const std::byte> part : parts) {
        offsets.push_back(total);
        total = AlignUp(total + part.size(), kAlignment);
    }
    MCS_RETURN_IF_ERROR(EnsureBuffer(total));
    std::byte* base = session_->buffer->data();
    // A step's batch is hundreds of MB: copied on the host copy threads (ParallelCopies keeps
    // small batches on this thread).
    std::vector<HostCopy> copies;
    copies.reserve(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) {
        if (!parts[i].empty()) copies.push_back({base + offsets[i], parts[i].data(), parts[i].size()});
    }
    ParallelCopies(copies, DefaultCopyThreads());
    return offsets;
}

void NodeClient::QueueRelease(std::uint64_t session_epoch, std::uint64_t lease_id) {
    std::lock_guard lock(release_mu_);
    // Leases of an older connection were released by the daemon when that connection closed.
    if (session_epoch == pending_epoch_) pending_releases_.push_back(lease_id);
}

Status NodeClient::FlushReleasesLocked() {
    std::vector<std::uint64_t> ids;
    {
        std::lock_guard lock(release_mu_);
        if (!session_ || pending_epoch_ != session_->epoch) {
            pending_releases_.clear();  // Those leases died with their connection.
            return Status::Ok();
        }
        ids.swap(pending_releases_);
    }
    for (std::size_t start = 0; start < ids.size(); start += wire::kMaxBatchItems) {
        const std::size_t end = std::min(ids.size(), start + wire::kMaxBatchItems);
        wire::ReleaseRequest request;
        request.lease_ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(start),
                                 ids.begin() + static_cast<std::ptrdiff_t>(end));
        std::vector<std::byte> storage;
        MCS_ASSIGN_OR_RETURN(wire::Frame frame, RoundTrip(request, {}, storage));
        auto ok = wire::DecodeReplyAs<wire::OkReply>(frame);
        // NotFound: a lease the daemon no longer holds; nothing is left to release.
        if (!ok.ok() && ok.status().code() != StatusCode::kNotFound) return ok.status();
        std::lock_guard lock(stats_mu_);
        stats_.leases_released += end - start;
    }
    return Status::Ok();
}

Status NodeClient::FlushReleases() {
    std::lock_guard lock(mu_);
    if (session_ && ConnectionIsStale(session_->conn.fd())) DropSessionLocked("stale");
    return FlushReleasesLocked();
}

void NodeClient::Disconnect() {
    {
        std::lock_guard lock(waiter_mu_);
        if (waiter_) waiter_->Disconnect();
    }
    std::lock_guard lock(mu_);
    DropSessionLocked("requested");
}

bool NodeClient::connected() const {
    std::lock_guard lock(mu_);
    return session_ != nullptr;
}

Result<wire::HelloReply> NodeClient::Hello() {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    return session_->hello;
}

NodeClientStats NodeClient::Stats() const {
    std::lock_guard lock(stats_mu_);
    return stats_;
}

LeaseKeepalive NodeClient::MakeKeepalive(std::uint64_t lease_id, std::uint32_t /*segment_id*/) {
    auto handle = std::make_shared<LeaseHandle>();
    handle->client = weak_from_this();
    handle->session = session_;
    handle->lease_id = lease_id;
    return handle;
}

Result<std::span<const std::byte>> NodeClient::View(const wire::SegmentSlice& slice) const {
    const ShmMapping* segment = session_ ? session_->Segment(slice.segment_id) : nullptr;
    if (segment == nullptr) {
        return DataLoss("the node daemon named unknown segment " +
                        std::to_string(slice.segment_id));
    }
    if (slice.size == 0) return std::span<const std::byte>();
    if (!RangeWithin(slice.offset, slice.size, segment->size())) {
        return DataLoss("the node daemon named bytes [" + std::to_string(slice.offset) + ", +" +
                        std::to_string(slice.size) + ") outside segment " +
                        std::to_string(slice.segment_id));
    }
    return std::span<const std::byte>(segment->data() + slice.offset,
                                      static_cast<std::size_t>(slice.size));
}

// ---------------------------------------------------------------------------------------------
// ObjectStore
// ---------------------------------------------------------------------------------------------
Status NodeClient::Put(std::string_view key, std::string_view metadata,
                       std::span<const MemberData> members, const PutOptions& options) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    std::vector<std::span<const std::byte>> parts;
    parts.reserve(members.size());
    for (const MemberData& m : members) parts.push_back(m.bytes);
    std::uint64_t total = 0;
    MCS_ASSIGN_OR_RETURN(std::vector<std::uint64_t> offsets, StageInBuffer(parts, total));
    wire::PutRequest request;
    request.key.assign(key);
    request.metadata.assign(metadata);
    request.mode = options.mode;
    request.hard_pin = options.hard_pin;
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < members.size(); ++i) {
        const MemberData& m = members[i];
        request.members.push_back({m.name, m.dtype, m.shape, m.checksum,
                                   wire::BufferRef::Client(offsets[i], m.bytes.size())});
        bytes += m.bytes.size();
    }
    MCS_RETURN_IF_ERROR(Call<wire::OkReply>(request));
    std::lock_guard slock(stats_mu_);
    ++counters_.puts;
    counters_.bytes_put += bytes;
    return Status::Ok();
}

Result<ObjectInfo> NodeClient::Stat(std::string_view key) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::StatReply>(wire::StatRequest{std::string(key)}));
    return std::move(reply.info);
}

Status NodeClient::ReadMember(std::string_view key, std::string_view member,
                              std::span<std::byte> dst) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_RETURN_IF_ERROR(EnsureBuffer(dst.size()));
    wire::ReadMemberRequest request{std::string(key), std::string(member),
                                    wire::BufferRef::Client(0, dst.size())};
    MCS_RETURN_IF_ERROR(Call<wire::OkReply>(request));
    if (!dst.empty()) std::memcpy(dst.data(), session_->buffer->data(), dst.size());
    std::lock_guard slock(stats_mu_);
    ++counters_.member_gets;
    counters_.member_bytes += dst.size();
    return Status::Ok();
}

Status NodeClient::ReadRanges(std::span<const RangeRead> reads) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    wire::ReadRangesRequest request;
    std::vector<std::uint64_t> offsets;
    std::uint64_t total = 0;
    for (const RangeRead& r : reads) {
        offsets.push_back(total);
        request.items.push_back({std::string(r.key), std::string(r.member), r.row_start,
                                 r.row_end, wire::BufferRef::Client(total, r.dst.size())});
        total = AlignUp(total + r.dst.size(), kAlignment);
    }
    MCS_RETURN_IF_ERROR(EnsureBuffer(total));
    MCS_RETURN_IF_ERROR(Call<wire::OkReply>(request));
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < reads.size(); ++i) {
        if (!reads[i].dst.empty()) {
            std::memcpy(reads[i].dst.data(), session_->buffer->data() + offsets[i],
                        reads[i].dst.size());
        }
        bytes += reads[i].dst.size();
    }
    std::lock_guard slock(stats_mu_);
    counters_.range_reads += reads.size();
    counters_.range_bytes += bytes;
    return Status::Ok();
}

Status NodeClient::Remove(std::string_view key) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_RETURN_IF_ERROR(Call<wire::OkReply>(wire::RemoveRequest{std::string(key)}));
    std::lock_guard slock(stats_mu_);
    ++counters_.removes;
    return Status::Ok();
}

Result<std::vector<std::string>> NodeClient::List(std::string_view prefix) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::ListReply>(wire::ListRequest{std::string(prefix)}));
    return std::move(reply.keys);
}

StoreCounters NodeClient::Counters() const {
    std::lock_guard lock(stats_mu_);
    return counters_;
}

Result<LeasedObject> NodeClient::Lease(std::string_view key) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::LeaseReply>(wire::LeaseRequest{std::string(key)}));
    LeasedObject out;
    out.keepalive = MakeKeepalive(reply.lease_id, 0);  // Released even if checks below fail.
    if (reply.locations.size() != reply.info.members.size()) {
        return DataLoss("the node daemon sent " + std::to_string(reply.locations.size()) +
                        " locations for " + std::to_string(reply.info.members.size()) +
                        " members");
    }
    for (std::size_t i = 0; i < reply.locations.size(); ++i) {
        if (reply.locations[i].size != reply.info.members[i].size_bytes) {
            return DataLoss("the node daemon sent a location of the wrong size");
        }
        MCS_ASSIGN_OR_RETURN(auto view, View(reply.locations[i]));
        out.members.push_back(view);
    }
    out.info = std::move(reply.info);
    return out;
}

// ---------------------------------------------------------------------------------------------
// Tensor fast path
// ---------------------------------------------------------------------------------------------
namespace {

/// The request items of `tensors`, host ones placed in the client buffer at `offsets`.
std::vector<wire::TensorItem> TensorItems(std::span<const NodeTensor> tensors,
                                          std::vector<std::uint64_t>& offsets,
                                          std::uint64_t& host_total) {
    std::vector<wire::TensorItem> items;
    items.reserve(tensors.size());
    host_total = 0;
    offsets.assign(tensors.size(), 0);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const NodeTensor& t = tensors[i];
        wire::TensorItem item;
        item.key = std::string(t.key);
        item.dtype = t.dtype;
        item.shape = t.shape;
        item.box_origin = t.box_origin;
        if (t.cuda) {
            item.location = *t.cuda;
            item.strides = t.cuda_strides;
        } else {
            offsets[i] = host_total;
            item.location.ref = wire::BufferRef::Client(host_total, t.host.size());
            host_total = AlignUp(host_total + t.host.size(), kAlignment);
        }
        items.push_back(std::move(item));
    }
    return items;
}

}  // namespace

Status NodeClient::PutTensors(std::span<const NodeTensor> tensors, PutMode mode, bool hard_pin) {
    if (tensors.empty()) return Status::Ok();
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    std::vector<std::uint64_t> offsets;
    std::uint64_t host_total = 0;
    wire::TensorPutRequest request;
    request.items = TensorItems(tensors, offsets, host_total);
    request.mode = mode;
    request.hard_pin = hard_pin;
    if (host_total > 0) {
        MCS_RETURN_IF_ERROR(EnsureBuffer(host_total));
        std::vector<HostCopy> copies;
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            const NodeTensor& t = tensors[i];
            if (t.cuda || t.host.empty()) continue;
            if (!t.host_strides.empty()) {
                // A view is gathered straight into the client buffer.
                StridedCopy(session_->buffer->data() + offsets[i], {}, t.host.data(),
                            t.host_strides, t.shape, DTypeSize(t.dtype));
            } else {
                copies.push_back({session_->buffer->data() + offsets[i], t.host.data(), t.host.size()});
            }
        }
        ParallelCopies(copies, DefaultCopyThreads());
    }
    std::uint64_t bytes = 0;
    for (const NodeTensor& t : tensors) bytes += t.cuda ? t.cuda->ref.size : t.host.size();
    MCS_RETURN_IF_ERROR(Call<wire::OkReply>(request, bytes));
    std::lock_guard slock(stats_mu_);
    counters_.puts += tensors.size();
    counters_.bytes_put += bytes;
    return Status::Ok();
}

Status NodeClient::GetTensorsInto(std::span<const NodeTensor> tensors) {
    if (tensors.empty()) return Status::Ok();
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    std::vector<std::uint64_t> offsets;
    std::uint64_t host_total = 0;
    wire::TensorGetRequest request;
    request.items = TensorItems(tensors, offsets, host_total);
    if (host_total > 0) MCS_RETURN_IF_ERROR(EnsureBuffer(host_total));
    std::uint64_t bytes = 0;
    for (const NodeTensor& t : tensors) bytes += t.cuda ? t.cuda->ref.size : t.host.size();
    MCS_RETURN_IF_ERROR(Call<wire::OkReply>(request, bytes));
    std::vector<HostCopy> copies;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const NodeTensor& t = tensors[i];
        if (t.cuda || t.host.empty()) continue;
        if (!t.host_strides.empty()) {
            // Scattered from the shared client buffer into the view, in place.
            StridedCopy(t.host.data(), t.host_strides, session_->buffer->data() + offsets[i], {},
                        t.shape, DTypeSize(t.dtype));
        } else {
            copies.push_back({t.host.data(), session_->buffer->data() + offsets[i], t.host.size()});
        }
    }
    ParallelCopies(copies, DefaultCopyThreads());
    std::lock_guard slock(stats_mu_);
    counters_.member_gets += tensors.size();
    counters_.member_bytes += bytes;
    return Status::Ok();
}

}  // namespace mooncake::sparse
