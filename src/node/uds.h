// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Unix-domain socket transport between the node daemon and the DummyClients of its node
// (docs/design.md §5-6): RAII fds, a listener that owns its socket file, and connections that move
// whole wire frames (store/wire.h) plus SCM_RIGHTS file descriptors.
//
// Why it is built this way:
// - SOCK_SEQPACKET keeps message boundaries and reports peer death as EOF, so no byte-stream
//   reassembly and no half-frame ambiguity. A packet cannot exceed the socket send buffer
//   (~200 KiB by default), while a frame may be up to wire::kMaxFrameBytes, so a frame travels
//   as one or more packets of at most kMaxPacketBytes; the first carries the header (which
//   says how many bytes follow) and the fds.
// - Every fd is non-blocking and every wait is a poll() against a Deadline, so a dead or hung
//   daemon turns into Unavailable instead of a hang, and EINTR never leaks to callers.
// - MSG_NOSIGNAL (no SIGPIPE when the peer is gone), SOCK_CLOEXEC / MSG_CMSG_CLOEXEC (no fd
//   leaks into children), and fds a peer sends beyond what the caller accepts are closed.
//
// Thread safety: a connection may have one thread sending and another receiving at the same
// time; concurrent SendFrame (or RecvFrame) calls on one connection must be serialized by the
// caller (a frame's packets would interleave). After any error from SendFrame or RecvFrame the
// connection's framing is undefined: close it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mooncake/sparse/status.h"
#include "node/wire.h"

namespace mooncake::sparse {

/// Largest packet a frame is split into (both sides use the same constant).
inline constexpr std::size_t kMaxPacketBytes = 64 << 10;
inline constexpr std::chrono::milliseconds kDefaultConnectTimeout{5000};

/// A move-only owned file descriptor; closes it on destruction (EINTR is not retried: on Linux
/// the fd is released either way).
class UniqueFd {
public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    ~UniqueFd() { reset(); }
    UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
    UniqueFd& operator=(UniqueFd&& other) noexcept {
        if (this != &other) reset(other.release());
        return *this;
    }
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    explicit operator bool() const { return valid(); }
    /// Gives up ownership.
    int release() { return std::exchange(fd_, -1); }
    /// Closes the current fd (if any) and owns `fd`.
    void reset(int fd = -1);

private:
    int fd_ = -1;
};

/// A point in time after which a blocking operation gives up (steady clock), or never.
class Deadline {
public:
    using Clock = std::chrono::steady_clock;

    static Deadline Never() { return Deadline(std::nullopt); }
    static Deadline After(std::chrono::milliseconds timeout) {
        return Deadline(Clock::now() + timeout);
    }
    static Deadline At(Clock::time_point at) { return Deadline(at); }

    bool is_never() const { return !at_.has_value(); }
    bool Expired() const { return at_ && Clock::now() >= *at_; }
    /// For poll(): -1 when never, else the milliseconds left rounded up (0 once expired).
    int PollTimeoutMs() const;

private:
    explicit Deadline(std::optional<Clock::time_point> at) : at_(at) {}
    std::optional<Clock::time_point> at_;
};

/// SO_PEERCRED of a connected peer (as of connect()/socketpair()).
struct PeerCred {
    pid_t pid = 0;
    uid_t uid = 0;
    gid_t gid = 0;
};

/// OK when the peer runs as this process's effective uid.
/// Errors: PermissionDenied.
Status RequireSameUser(const PeerCred& peer);

/// One connected SOCK_SEQPACKET socket (non-blocking, close-on-exec).
class UnixConnection {
public:
    UnixConnection() = default;
    UnixConnection(UnixConnection&&) noexcept = default;
    UnixConnection& operator=(UnixConnection&&) noexcept = default;

    /// Connects to the node daemon listening at `path`; waits (until `deadline`) only while
    /// the daemon's accept backlog is full.
    /// Errors: Unavailable ("node daemon at PATH is not running: ..." when nothing listens, or
    /// on timeout); PermissionDenied (no access to the socket file); InvalidArgument (path
    /// too long for sockaddr_un).
    static Result<UnixConnection> Connect(const std::string& path,
                                          Deadline deadline = Deadline::After(
                                              kDefaultConnectTimeout));

    /// A connected pair (socketpair), e.g. for tests or an in-process daemon.
    /// Errors: ResourceExhausted (out of fds); Internal.
    static Result<std::pair<UnixConnection, UnixConnection>> Pair();

    /// Sends one whole frame (a valid wire header whose payload_len matches `frame`) and
    /// passes `fds` (duplicated into the peer; still owned by the caller) with it.
    /// Errors: InvalidArgument (not a valid frame, more than wire::kMaxFdsPerFrame fds);
    /// Unavailable (peer gone, or `deadline` passed while the peer does not read).
    Status SendFrame(std::span<const std::byte> frame, std::span<const int> fds = {},
                     Deadline deadline = Deadline::Never());

    /// Receives one whole frame of at most `max_bytes` (capped at wire::kMaxFrameBytes) and the
    /// fds sent with it, appended to `*fds` as owned UniqueFds (close-on-exec). `fds == nullptr`
    /// accepts none. The header is validated (wire::DecodeFrameHeader); the payload is not.
    /// The buffer grows with the bytes that actually arrive (geometrically, never beyond the
    /// announced size), so a header that claims a large payload costs nothing until it comes.
    /// Errors: Unavailable (peer closed or died, before or in the middle of a frame; or
    /// `deadline` passed); InvalidArgument (bad header, frame or packet larger than allowed
    /// (MSG_TRUNC), more fds than `max_fds` or than the control buffer holds (MSG_CTRUNC) —
    /// every such fd is closed).
    Result<std::vector<std::byte>> RecvFrame(std::size_t max_bytes, std::vector<UniqueFd>* fds,
                                             Deadline deadline = Deadline::Never(),
                                             std::size_t max_fds = wire::kMaxFdsPerFrame);
    /// RecvFrame into `buf` (replaced; its capacity is reused, so a connection receives every
    /// frame into the same memory). On an error `buf` holds no frame.
    /// Errors: as RecvFrame.
    Status RecvFrameInto(std::vector<std::byte>& buf, std::size_t max_bytes,
                         std::vector<UniqueFd>* fds, Deadline deadline = Deadline::Never(),
                         std::size_t max_fds = wire::kMaxFdsPerFrame);

    /// Waits until something can be read: a frame, or EOF or an error (which RecvFrame then
    /// reports). A server waits here with its idle deadline, then gives RecvFrame the deadline
    /// of one frame.
    /// Errors: Unavailable (`deadline` passed); FailedPrecondition (closed).
    Status WaitReadable(Deadline deadline) const;

    /// The peer's pid/uid/gid (SO_PEERCRED).
    /// Errors: FailedPrecondition (not connected); Internal.
    Result<PeerCred> PeerCredentials() const;

    /// shutdown(SHUT_RDWR): both sides see EOF; a RecvFrame blocked in another thread returns
    /// Unavailable promptly. The fd stays open until Close() or destruction.
    void Shutdown();
    void Close() { fd_.reset(); }

    bool valid() const { return fd_.valid(); }
    int fd() const { return fd_.get(); }
    /// What error messages call the peer ("node daemon at PATH", "client").
    const std::string& peer_name() const { return peer_name_; }

private:
    UnixConnection(UniqueFd fd, std::string peer_name)
        : fd_(std::move(fd)), peer_name_(std::move(peer_name)) {}
    friend class UnixListener;

    Status SendPacket(std::span<const std::byte> bytes, std::span<const int> fds,
                      Deadline deadline, std::size_t* chunk);
    Result<std::size_t> RecvPacket(std::span<std::byte> buf, std::vector<UniqueFd>& fds,
                                   Deadline deadline);

    UniqueFd fd_;
    std::string peer_name_;
    std::size_t send_chunk_ = kMaxPacketBytes;  ///< Shrinks if the kernel reports EMSGSIZE.
};

/// A listening SOCK_SEQPACKET socket bound to a filesystem path, which it owns: the socket
/// file is removed on destruction (only if it is still the one this listener created).
class UnixListener {
public:
    UnixListener() = default;
    UnixListener(UnixListener&& other) noexcept;
    UnixListener& operator=(UnixListener&& other) noexcept;
    ~UnixListener();

    /// Creates the socket file at `path` with permissions `mode` (set before listen(), so
    /// nobody connects through wider permissions). An existing file at `path` is removed only
    /// when it is a socket that nothing listens on (a stale file of a dead daemon: a probe
    /// connect is refused).
    /// Errors: FailedPrecondition (a live listener is at `path`, or `path` is not a socket);
    /// InvalidArgument (path too long or empty); PermissionDenied; Internal.
    static Result<UnixListener> Bind(const std::string& path, mode_t mode = 0600,
                                     int backlog = 128);

    /// Waits for and accepts one connection (non-blocking, close-on-exec).
    /// Errors: Unavailable (`deadline` passed, or the listener was shut down);
    /// ResourceExhausted (out of fds); Internal.
    Result<UnixConnection> Accept(Deadline deadline = Deadline::Never());

    /// Wakes an Accept blocked in another thread (it returns Unavailable); later Accepts fail.
    void Shutdown();

    const std::string& path() const { return path_; }
    int fd() const { return fd_.get(); }
    bool valid() const { return fd_.valid(); }

private:
    void RemoveSocketFile();

    UniqueFd fd_;
    std::string path_;
    dev_t dev_ = 0;  ///< Identity of the socket file this listener created.
    ino_t ino_ = 0;
};

}  // namespace mooncake::sparse
