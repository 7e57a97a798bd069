// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Unix-domain socket transport for the node daemon; see uds.h.
#include "node/uds.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

namespace mooncake::sparse {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

/// sockaddr_un for `path`.
/// Errors: InvalidArgument (empty, too long, or containing NUL).
Result<sockaddr_un> MakeAddress(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.empty()) return InvalidArgument("unix socket path is empty");
    if (path.find('\0') != std::string::npos) {
        return InvalidArgument("unix socket path contains a NUL byte");
    }
    if (path.size() >= sizeof(addr.sun_path)) {
        return InvalidArgument("unix socket path '" + path + "' is " +
                               std::to_string(path.size()) + " bytes; the limit is " +
                               std::to_string(sizeof(addr.sun_path) - 1));
    }
    std::memcpy(addr.sun_path, path.data(), path.size());
    return addr;
}

Result<UniqueFd> NewSocket() {
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        const int err = errno;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
            return ResourceExhausted("socket(AF_UNIX): " + ErrnoText(err));
        }
        return Internal("socket(AF_UNIX, SOCK_SEQPACKET): " + ErrnoText(err));
    }
    return UniqueFd(fd);
}

/// Best effort: a larger send buffer lets more packets of a big frame be in flight.
void GrowSendBuffer(int fd) {
    int bytes = 1 << 20;
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

/// Waits until `fd` reports one of `events` (or an error/hang-up condition), handling EINTR.
/// Returns the revents. Errors: Unavailable on timeout (message names `what`).
Result<short> WaitFor(int fd, short events, Deadline deadline, const std::string& what) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int rc = ::poll(&p, 1, deadline.PollTimeoutMs());
        if (rc > 0) return p.revents;
        if (rc == 0) return Unavailable("timed out " + what);
        if (errno == EINTR) continue;
        return Internal("poll: " + ErrnoText(errno));
    }
}

bool IsPeerGone(int err) {
    return err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ECONNREFUSED ||
           err == ESHUTDOWN;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// UniqueFd, Deadline, credentials.
// ---------------------------------------------------------------------------------------------

void UniqueFd::reset(int fd) {
    if (fd_ >= 0 && fd_ != fd) {
        // Linux releases the fd even when close() reports EINTR; retrying could close an fd
        // another thread just opened.
        (void)::close(fd_);
    }
    fd_ = fd;
}

int Deadline::PollTimeoutMs() const {
    if (!at_) return -1;
    const auto left = *at_ - Clock::now();
    if (left <= Clock::duration::zero()) return 0;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return static_cast<int>(std::min<std::int64_t>(ms, 1 << 30));
}

Status RequireSameUser(const PeerCred& peer) {
    const uid_t self = ::geteuid();
    if (peer.uid != self) {
        return PermissionDenied("peer pid " + std::to_string(peer.pid) + " runs as uid " +
                                std::to_string(peer.uid) + ", this process as uid " +
                                std::to_string(self) + "; only the same user may connect");
    }
    return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// UnixConnection.
// ---------------------------------------------------------------------------------------------

Result<UnixConnection> UnixConnection::Connect(const std::string& path, Deadline deadline) {
    MCS_ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddress(path));
    MCS_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket());
    const std::string who = "node daemon at " + path;
    auto delay = std::chrono::microseconds(200);
    for (;;) {
        if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
            break;
        }
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN) {
            // A non-blocking connect to a unix socket whose accept backlog is full: the daemon
            // is alive but busy. Back off until the deadline.
            if (deadline.Expired()) {
                return Unavailable(who + " is not accepting connections (backlog full) before "
                                         "the deadline");
            }
            std::this_thread::sleep_for(delay);
            delay = std::min<std::chrono::microseconds>(delay * 2, std::chrono::milliseconds(20));
            continue;
        }
        if (err == ENOENT || err == ECONNREFUSED || err == ENOTDIR) {
            return Unavailable(who + " is not running: connect: " + ErrnoText(err) +
                               " (start mooncake_sparse_node --socket_path=" + path + ")");
        }
        if (err == EACCES || err == EPERM) {
            return PermissionDenied("cannot connect to " + who + ": " + ErrnoText(err));
        }
        if (err == EPROTOTYPE) {
            return Unavailable(path + " is not a node daemon socket (not SOCK_SEQPACKET): " +
                               ErrnoText(err));
        }
        return Unavailable("cannot connect to " + who + ": " + ErrnoText(err));
    }
    GrowSendBuffer(fd.get());
    return UnixConnection(std::move(fd), who);
}

Result<std::pair<UnixConnection, UnixConnection>> UnixConnection::Pair() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) {
        const int err = errno;
        if (err == EMFILE || err == ENFILE) return ResourceExhausted("socketpair: " + ErrnoText(err));
        return Internal("socketpair: " + ErrnoText(err));
    }
    GrowSendBuffer(sv[0]);
    GrowSendBuffer(sv[1]);
    return std::pair<UnixConnection, UnixConnection>(
        UnixConnection(UniqueFd(sv[0]), "socketpair peer"),
        UnixConnection(UniqueFd(sv[1]), "socketpair peer"));
}

Status UnixConnection::SendPacket(std::span<const std::byte> bytes, std::span<const int> fds,
                                  Deadline deadline, std::size_t* chunk) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * wire::kMaxFdsPerFrame)];
    for (;;) {
        const std::size_t len = std::min(bytes.size(), *chunk);
        iovec iov{const_cast<std::byte*>(bytes.data()), len};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (!fds.empty()) {
            std::memset(control, 0, sizeof control);
            msg.msg_control = control;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
            cmsghdr* c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
            std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
        }
        const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            if (static_cast<std::size_t>(n) != len) {
                return Internal("short SOCK_SEQPACKET send: " + std::to_string(n) + " of " +
                                std::to_string(len) + " bytes");
            }
            return Status::Ok();
        }
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS) {
            MCS_ASSIGN_OR_RETURN(short revents,
                                 WaitFor(fd_.get(), POLLOUT, deadline,
                                         "sending to " + peer_name_ + " (peer not reading)"));
            (void)revents;  // POLLHUP/POLLERR: the next sendmsg reports why.
            continue;
        }
        if (err == EMSGSIZE && *chunk > 4096) {
            *chunk /= 2;  // The kernel's send buffer is smaller than our packet size.
            continue;
        }
        if (IsPeerGone(err)) {
            return Unavailable(peer_name_ + " closed the connection: " + ErrnoText(err));
        }
        if (err == EBADF || err == ENOTSOCK) {
            return FailedPrecondition("send on a closed connection");
        }
        return Unavailable("sending to " + peer_name_ + ": " + ErrnoText(err));
    }
}

Status UnixConnection::SendFrame(std::span<const std::byte> frame, std::span<const int> fds,
                                 Deadline deadline) {
    if (!fd_.valid()) return FailedPrecondition("send on a closed connection");
    MCS_ASSIGN_OR_RETURN(wire::FrameHeader header, wire::DecodeFrameHeader(frame));
    if (frame.size() != wire::kFrameHeaderBytes + header.payload_len) {
        return InvalidArgument("frame is " + std::to_string(frame.size()) +
                               " bytes but its header says " +
                               std::to_string(wire::kFrameHeaderBytes + header.payload_len));
    }
    if (fds.size() > wire::kMaxFdsPerFrame) {
        return InvalidArgument("cannot pass " + std::to_string(fds.size()) +
                               " fds in one frame (limit " +
                               std::to_string(wire::kMaxFdsPerFrame) + ")");
    }
    for (int fd : fds) {
        if (fd < 0) return InvalidArgument("cannot pass invalid fd " + std::to_string(fd));
    }
    std::size_t sent = 0;
    bool first = true;
    while (first || sent < frame.size()) {
        std::size_t chunk = send_chunk_;
        MCS_RETURN_IF_ERROR(SendPacket(frame.subspan(sent), first ? fds : std::span<const int>{},
                                       deadline, &chunk));
        send_chunk_ = chunk;
        sent += std::min(frame.size() - sent, chunk);
        first = false;
    }
    return Status::Ok();
}

Result<std::size_t> UnixConnection::RecvPacket(std::span<std::byte> buf,
                                               std::vector<UniqueFd>& fds, Deadline deadline) {
    // Room for more fds than a frame may carry, so that a peer exceeding the limit by a little
    // is reported as "too many fds" (and those fds are closed) rather than MSG_CTRUNC.
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (wire::kMaxFdsPerFrame + 8))];
    for (;;) {
        iovec iov{buf.data(), buf.size()};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        const ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0) {
            const int err = errno;
            if (err == EINTR) continue;
            if (err == EAGAIN || err == EWOULDBLOCK) {
                MCS_ASSIGN_OR_RETURN(short revents,
                                     WaitFor(fd_.get(), POLLIN, deadline,
                                             "waiting for " + peer_name_));
                (void)revents;  // POLLHUP/POLLERR: the next recvmsg reports EOF or the error.
                continue;
            }
            if (IsPeerGone(err)) {
                return Unavailable(peer_name_ + " closed the connection: " + ErrnoText(err));
            }
            if (err == EBADF || err == ENOTSOCK) {
                return FailedPrecondition("receive on a closed connection");
            }
            return Unavailable("receiving from " + peer_name_ + ": " + ErrnoText(err));
        }
        // Take ownership of every fd first, so that each one is closed on any error below.
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            const unsigned char* data = CMSG_DATA(c);
            for (std::size_t i = 0; i < count; ++i) {
                int fd;
                std::memcpy(&fd, data + i * sizeof(int), sizeof(int));
                fds.emplace_back(fd);
            }
        }
        if (msg.msg_flags & MSG_CTRUNC) {
            return InvalidArgument(peer_name_ + " sent more fds than fit in one frame (limit " +
                                   std::to_string(wire::kMaxFdsPerFrame) + ")");
        }
        if (msg.msg_flags & MSG_TRUNC) {
            return InvalidArgument(peer_name_ + " sent a packet larger than the " +
                                   std::to_string(buf.size()) + " bytes expected");
        }
        if (n == 0) {
            return Unavailable(peer_name_ + " closed the connection");
        }
        return static_cast<std::size_t>(n);
    }
}

Result<std::vector<std::byte>> UnixConnection::RecvFrame(std::size_t max_bytes,
                                                         std::vector<UniqueFd>* fds,
                                                         Deadline deadline, std::size_t max_fds) {
    std::vector<std::byte> buf;
    MCS_RETURN_IF_ERROR(RecvFrameInto(buf, max_bytes, fds, deadline, max_fds));
    return buf;
}

Status UnixConnection::RecvFrameInto(std::vector<std::byte>& buf, std::size_t max_bytes,
                                     std::vector<UniqueFd>* fds, Deadline deadline,
                                     std::size_t max_fds) {
    buf.clear();
    if (!fd_.valid()) return FailedPrecondition("receive on a closed connection");
    max_bytes = std::min(max_bytes, wire::kMaxFrameBytes);
    if (max_bytes < wire::kFrameHeaderBytes) {
        return InvalidArgument("RecvFrame max_bytes " + std::to_string(max_bytes) +
                               " is smaller than a frame header");
    }
    if (fds == nullptr) max_fds = 0;
    std::vector<UniqueFd> got;  // Closed on every error return.

    // First packet: the header (and maybe the whole frame). Every error below leaves `buf`
    // empty (the guard), so no caller mistakes a partial frame for one.
    struct ClearOnError {
        std::vector<std::byte>& b;
        bool done = false;
        ~ClearOnError() {
            if (!done) b.clear();
        }
    } guard{buf};
    buf.resize(std::min(max_bytes, kMaxPacketBytes));
    MCS_ASSIGN_OR_RETURN(std::size_t n, RecvPacket(buf, got, deadline));
    if (n < wire::kFrameHeaderBytes) {
        return InvalidArgument(peer_name_ + " sent a " + std::to_string(n) +
                               "-byte packet, shorter than a frame header");
    }
    auto header = wire::DecodeFrameHeader(buf);
    if (!header.ok()) return header.status().WithContext("frame from " + peer_name_);
    const std::size_t total = wire::kFrameHeaderBytes + header->payload_len;
    if (total > max_bytes) {
        return InvalidArgument(peer_name_ + " sent a frame of " + std::to_string(total) +
                               " bytes; the limit is " + std::to_string(max_bytes));
    }
    if (n > total) {
        return InvalidArgument(peer_name_ + " sent a packet longer than its frame (" +
                               std::to_string(n) + " > " + std::to_string(total) + " bytes)");
    }
    buf.resize(n);

    // Continuation packets. The buffer grows with what actually arrives, so a header that
    // claims a large payload costs nothing until the bytes come.
    while (buf.size() < total) {
        const std::size_t have = buf.size();
        const std::size_t want = std::min(kMaxPacketBytes, total - have);
        if (have + want > buf.capacity()) {
            // Doubling keeps the copies amortized; the cap keeps a peer that stops half way
            // from holding more than twice what it sent.
            buf.reserve(std::min(total, std::max(have + want, 2 * buf.capacity())));
        }
        buf.resize(have + want);
        auto m = RecvPacket(std::span<std::byte>(buf).subspan(have, want), got, deadline);
        if (!m.ok()) {
            if (m.status().code() == StatusCode::kUnavailable) {
                return m.status().WithContext("in the middle of a " + std::to_string(total) +
                                              "-byte frame");
            }
            return m.status();
        }
        buf.resize(have + *m);
    }

    if (got.size() > max_fds) {
        // The frame was read whole, so the stream stays in sync; the fds are closed here.
        const std::size_t count = got.size();
        got.clear();
        return InvalidArgument(peer_name_ + " sent " + std::to_string(count) +
                               " fds with a " +
                               std::string(wire::MessageTypeName(header->type)) +
                               " frame; at most " + std::to_string(max_fds) + " expected");
    }
    if (fds != nullptr) {
        for (UniqueFd& fd : got) fds->push_back(std::move(fd));
    }
    guard.done = true;
    return Status::Ok();
}

Status UnixConnection::WaitReadable(Deadline deadline) const {
    if (!fd_.valid()) return FailedPrecondition("wait on a closed connection");
    MCS_ASSIGN_OR_RETURN(short revents,
                         WaitFor(fd_.get(), POLLIN, deadline, "waiting for " + peer_name_));
    (void)revents;  // POLLHUP/POLLERR: the next RecvFrame reports EOF or the error.
    return Status::Ok();
}

Result<PeerCred> UnixConnection::PeerCredentials() const {
    if (!fd_.valid()) return FailedPrecondition("peer credentials of a closed connection");
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd_.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        const int err = errno;
        if (err == ENOTCONN) return FailedPrecondition("peer credentials: not connected");
        return Internal("getsockopt(SO_PEERCRED): " + ErrnoText(err));
    }
    return PeerCred{cred.pid, cred.uid, cred.gid};
}

void UnixConnection::Shutdown() {
    if (fd_.valid()) (void)::shutdown(fd_.get(), SHUT_RDWR);
}

// ---------------------------------------------------------------------------------------------
// UnixListener.
// ---------------------------------------------------------------------------------------------

UnixListener::UnixListener(UnixListener&& other) noexcept
    : fd_(std::move(other.fd_)),
      path_(std::exchange(other.path_, {})),
      dev_(other.dev_),
      ino_(other.ino_) {}

UnixListener& UnixListener::operator=(UnixListener&& other) noexcept {
    if (this != &other) {
        RemoveSocketFile();
        fd_ = std::move(other.fd_);
        path_ = std::exchange(other.path_, {});
        dev_ = other.dev_;
        ino_ = other.ino_;
    }
    return *this;
}

UnixListener::~UnixListener() { RemoveSocketFile(); }

void UnixListener::RemoveSocketFile() {
    if (!path_.empty()) {
        // Only our own file: a newer daemon may have replaced a socket we think is ours.
        struct stat st{};
        if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev_ &&
            st.st_ino == ino_) {
            if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
                std::fprintf(stderr, "mooncake_sparse: cannot remove socket file %s: %s\n",
                             path_.c_str(), std::strerror(errno));
            }
        }
        path_.clear();
    }
    fd_.reset();
}

Result<UnixListener> UnixListener::Bind(const std::string& path, mode_t mode, int backlog) {
    MCS_ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddress(path));

    // An existing file: remove it only if it is a socket nobody listens on.
    struct stat st{};
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            return FailedPrecondition(path + " exists and is not a socket; not removing it");
        }
        MCS_ASSIGN_OR_RETURN(UniqueFd probe, NewSocket());
        int rc;
        do {
            rc = ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
        } while (rc != 0 && errno == EINTR);
        const int err = rc == 0 ? 0 : errno;
        if (rc == 0 || err == EAGAIN) {
            return FailedPrecondition("another process is listening on " + path +
                                      " (is a node daemon already running?)");
        }
        if (err == EPROTOTYPE) {
            return FailedPrecondition(path + " is a live socket of another type; not removing it");
        }
        if (err == EACCES || err == EPERM) {
            return PermissionDenied("cannot probe existing socket " + path + ": " +
                                    ErrnoText(err));
        }
        if (err != ECONNREFUSED && err != ENOENT) {
            return FailedPrecondition("cannot tell whether " + path + " is in use: " +
                                      ErrnoText(err));
        }
        if (err == ECONNREFUSED && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
            const int uerr = errno;
            if (uerr == EACCES || uerr == EPERM) {
                return PermissionDenied("cannot remove stale socket " + path + ": " +
                                        ErrnoText(uerr));
            }
            return Internal("cannot remove stale socket " + path + ": " + ErrnoText(uerr));
        }
    }

    MCS_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket());
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
        const int err = errno;
        if (err == EADDRINUSE) {
            return FailedPrecondition(path + " is in use (another daemon started meanwhile?)");
        }
        if (err == EACCES || err == EPERM || err == EROFS) {
            return PermissionDenied("cannot create socket " + path + ": " + ErrnoText(err));
        }
        if (err == ENOENT || err == ENOTDIR) {
            return InvalidArgument("cannot create socket " + path +
                                   ": its directory does not exist");
        }
        return Internal("bind(" + path + "): " + ErrnoText(err));
    }
    UnixListener listener;
    listener.fd_ = std::move(fd);
    if (::lstat(path.c_str(), &st) != 0) {
        return Internal("stat(" + path + ") after bind: " + ErrnoText(errno));
    }
    listener.path_ = path;  // From here on the destructor removes the file.
    listener.dev_ = st.st_dev;
    listener.ino_ = st.st_ino;
    // Permissions before listen(): until then every connect is refused, so no peer ever gets
    // through wider default permissions.
    if (::chmod(path.c_str(), mode) != 0) {
        return Internal("chmod(" + path + "): " + ErrnoText(errno));
    }
    if (::listen(listener.fd_.get(), backlog) != 0) {
        return Internal("listen(" + path + "): " + ErrnoText(errno));
    }
    return listener;
}

Result<UnixConnection> UnixListener::Accept(Deadline deadline) {
    if (!fd_.valid()) return FailedPrecondition("accept on a closed listener");
    for (;;) {
        const int fd = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            GrowSendBuffer(fd);
            return UnixConnection(UniqueFd(fd), "client of " + path_);
        }
        const int err = errno;
        if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) {
            MCS_ASSIGN_OR_RETURN(short revents, WaitFor(fd_.get(), POLLIN, deadline,
                                                        "waiting for a connection on " + path_));
            // After shutdown() a listening AF_UNIX socket polls POLLIN|POLLHUP while accept4
            // keeps failing with EAGAIN: HUP alone must end the wait, or this loop spins.
            if (revents & (POLLHUP | POLLERR | POLLNVAL)) {
                return Unavailable("listener on " + path_ + " was shut down");
            }
            continue;
        }
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
            return ResourceExhausted("accept on " + path_ + ": " + ErrnoText(err));
        }
        if (err == EINVAL) return Unavailable("listener on " + path_ + " was shut down");
        return Internal("accept on " + path_ + ": " + ErrnoText(err));
    }
}

void UnixListener::Shutdown() {
    if (fd_.valid()) (void)::shutdown(fd_.get(), SHUT_RDWR);
}

}  // namespace mooncake::sparse
