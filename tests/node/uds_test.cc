// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Unix-domain socket transport of the node daemon (src/store/uds.h): frames and fd passing over
// socket pairs, timeouts, peer death, peer credentials, and the listener's socket file.
#include "node/uds.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "node/wire.h"
#include "../store/store_test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::StatusIsWithMessage;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<std::byte> FrameOf(const wire::Message& m, std::uint64_t id = 1) {
    auto bytes = wire::EncodeFrame(m, id);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    return std::move(bytes).value();
}

/// A frame of about `bytes` bytes (a Put whose metadata is a byte pattern).
std::vector<std::byte> BigFrame(std::size_t bytes, std::uint64_t id) {
    wire::PutRequest p;
    p.key = "big";
    p.metadata.resize(bytes);
    for (std::size_t i = 0; i < bytes; ++i) {
        p.metadata[i] = static_cast<char>((i * 131 + id) & 0xff);
    }
    return FrameOf(p, id);
}

std::pair<UnixConnection, UnixConnection> MakePair() {
    auto pair = UnixConnection::Pair();
    EXPECT_TRUE(pair.ok()) << pair.status().ToString();
    return std::move(pair).value();
}

int CountOpenFds() {
    int n = 0;
    DIR* d = ::opendir("/proc/self/fd");
    if (d == nullptr) return -1;
    while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] != '.') ++n;
    }
    ::closedir(d);
    return n - 1;  // The DIR's own fd.
}

UniqueFd MemFd(const std::string& content) {
    UniqueFd fd(::memfd_create("mcs-uds-test", MFD_CLOEXEC));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(::write(fd.get(), content.data(), content.size()),
              static_cast<ssize_t>(content.size()));
    return fd;
}

std::string ReadAll(int fd) {
    std::string out(4096, '\0');
    const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
    out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return out;
}

/// A private directory under /tmp (short, so socket paths fit sockaddr_un).
class TempDir {
public:
    TempDir() {
        char tmpl[] = "/tmp/mcs-uds-XXXXXX";
        const char* d = ::mkdtemp(tmpl);
        EXPECT_NE(d, nullptr);
        path_ = d != nullptr ? d : "/tmp/mcs-uds-failed";
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    std::string Path(const std::string& name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

/// A socket file nobody listens on (what a crashed daemon leaves behind).
void MakeStaleSocketFile(const std::string& path) {
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ::close(fd);
    struct stat st{};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    ASSERT_TRUE(S_ISSOCK(st.st_mode));
}

// ---- Frames over a socket pair ---------------------------------------------------------------

TEST(UdsTest, SmallFrameRoundTrip) {
    auto [a, b] = MakePair();
    const auto frame = FrameOf(wire::HelloRequest{1, 77, "client", ""}, 9);
    MCS_ASSERT_OK(a.SendFrame(frame));
    auto got = b.RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::After(5s));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, frame);
    auto decoded = wire::DecodeFrame(*got);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(decoded->header.request_id, 9u);
    auto hello = wire::DecodeReplyAs<wire::HelloRequest>(*decoded);
    ASSERT_TRUE(hello.ok());
    EXPECT_EQ(hello->client_name, "client");

    // And back the other way.
    MCS_ASSERT_OK(b.SendFrame(FrameOf(wire::OkReply{}, 9)));
    auto reply = a.RecvFrame(1024, nullptr, Deadline::After(5s));
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->size(), wire::kFrameHeaderBytes);
}

TEST(UdsTest, LargeFramesSpanManyPacketsAndStayInSync) {
    auto [a, b] = MakePair();
    const std::vector<std::vector<std::byte>> frames = {
        BigFrame(5 << 20, 1), FrameOf(wire::OkReply{}, 2), BigFrame(kMaxPacketBytes, 3),
        // Exactly one full packet, and one byte more (a 1-byte second packet). A Put frame of
        // this shape is the header plus 17 bytes plus the metadata.
        BigFrame(kMaxPacketBytes - wire::kFrameHeaderBytes - 17, 4),
        BigFrame(kMaxPacketBytes - wire::kFrameHeaderBytes - 16, 5), BigFrame(12 << 20, 6)};
    std::thread sender([&, &a = a] {
        for (const auto& f : frames) MCS_EXPECT_OK(a.SendFrame(f, {}, Deadline::After(30s)));
    });
    EXPECT_EQ(frames[3].size(), kMaxPacketBytes);
    EXPECT_EQ(frames[4].size(), kMaxPacketBytes + 1);
    for (const auto& f : frames) {
        auto got = b.RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::After(30s));
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_EQ(got->size(), f.size());
        EXPECT_TRUE(*got == f);
    }
    sender.join();
}

TEST(UdsTest, FramesReceivedIntoOneBufferReuseItsMemory) {
    auto [a, b] = MakePair();
    // A large frame, then a small one, then a large one again, into the same buffer: each
    // arrives whole, the buffer holds exactly it, and the second large one needs no new memory.
    const std::vector<std::vector<std::byte>> frames = {
        BigFrame(3 << 20, 1), FrameOf(wire::OkReply{}, 2), BigFrame(2 << 20, 3)};
    std::thread sender([&, &a = a] {
        for (const auto& f : frames) MCS_EXPECT_OK(a.SendFrame(f, {}, Deadline::After(30s)));
    });
    std::vector<std::byte> buf;
    const std::byte* first = nullptr;
    for (std::size_t i = 0; i < frames.size(); ++i) {
        MCS_ASSERT_OK(b.RecvFrameInto(buf, wire::kMaxFrameBytes, nullptr, Deadline::After(30s)));
        EXPECT_TRUE(buf == frames[i]) << "frame " << i;
        if (i == 0) first = buf.data();
    }
    EXPECT_EQ(buf.data(), first);
    sender.join();

    // A failed receive leaves no partial frame behind.
    const auto frame = BigFrame(1 << 20, 4);
    ASSERT_EQ(::send(a.fd(), frame.data(), kMaxPacketBytes, MSG_NOSIGNAL),
              static_cast<ssize_t>(kMaxPacketBytes));
    EXPECT_THAT(b.RecvFrameInto(buf, wire::kMaxFrameBytes, nullptr, Deadline::After(100ms)),
                StatusIsWithMessage(StatusCode::kUnavailable, "in the middle of a"));
    EXPECT_TRUE(buf.empty());
}

TEST(UdsTest, SendFrameRejectsInvalidFrames) {
    auto [a, b] = MakePair();
    std::vector<std::byte> garbage(40, std::byte{0x55});
    EXPECT_THAT(a.SendFrame(garbage), StatusIsWithMessage(StatusCode::kInvalidArgument, "magic"));
    auto frame = FrameOf(wire::StatRequest{"key"});
    frame.push_back(std::byte{0});
    EXPECT_THAT(a.SendFrame(frame), StatusIsWithMessage(StatusCode::kInvalidArgument, "header says"));
    frame.pop_back();
    std::vector<int> too_many(wire::kMaxFdsPerFrame + 1, 0);
    EXPECT_THAT(a.SendFrame(frame, too_many), StatusIs(StatusCode::kInvalidArgument));
    std::vector<int> negative = {-1};
    EXPECT_THAT(a.SendFrame(frame, negative), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(a.SendFrame(std::span<const std::byte>()), StatusIs(StatusCode::kInvalidArgument));
}

// ---- File descriptors ------------------------------------------------------------------------

TEST(UdsTest, PassesMemfdsWithCloexec) {
    auto [a, b] = MakePair();
    UniqueFd m0 = MemFd("segment zero");
    UniqueFd m1 = MemFd("segment one");
    const int send_fds[] = {m0.get(), m1.get()};
    wire::HelloReply reply;
    reply.segments = {{0, 4096, true}, {1, 4096, false}};
    MCS_ASSERT_OK(a.SendFrame(FrameOf(reply), send_fds));
    m0.reset();
    m1.reset();  // The receiver's copies stay valid.

    std::vector<UniqueFd> fds;
    auto got = b.RecvFrame(wire::kMaxFrameBytes, &fds, Deadline::After(5s), 2);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(fds.size(), 2u);
    EXPECT_EQ(ReadAll(fds[0].get()), "segment zero");
    EXPECT_EQ(ReadAll(fds[1].get()), "segment one");
    for (const UniqueFd& fd : fds) {
        EXPECT_TRUE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC);
    }
    // The received fd maps the same memory.
    void* p = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fds[1].get(), 0);
    ASSERT_NE(p, MAP_FAILED);
    EXPECT_EQ(std::memcmp(p, "segment one", 11), 0);
    ::munmap(p, 4096);
}

TEST(UdsTest, FdsRideWithTheFirstPacketOfALargeFrame) {
    auto [a, b] = MakePair();
    UniqueFd m = MemFd("with a big frame");
    const int send_fds[] = {m.get()};
    const auto frame = BigFrame(1 << 20, 7);
    std::thread sender([&, &a = a] { MCS_EXPECT_OK(a.SendFrame(frame, send_fds)); });
    std::vector<UniqueFd> fds;
    auto got = b.RecvFrame(wire::kMaxFrameBytes, &fds, Deadline::After(10s));
    sender.join();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(*got == frame);
    ASSERT_EQ(fds.size(), 1u);
    EXPECT_EQ(ReadAll(fds[0].get()), "with a big frame");
}

TEST(UdsTest, UnexpectedFdsAreClosedAndReported) {
    auto [a, b] = MakePair();
    const int before = CountOpenFds();
    {
        UniqueFd m0 = MemFd("0"), m1 = MemFd("1"), m2 = MemFd("2");
        const int send_fds[] = {m0.get(), m1.get(), m2.get()};
        MCS_ASSERT_OK(a.SendFrame(FrameOf(wire::OkReply{}, 1), send_fds));
        MCS_ASSERT_OK(a.SendFrame(FrameOf(wire::OkReply{}, 2), send_fds));
        MCS_ASSERT_OK(a.SendFrame(FrameOf(wire::OkReply{}, 3)));
    }
    std::vector<UniqueFd> fds;
    EXPECT_THAT(b.RecvFrame(4096, &fds, Deadline::After(5s), 1),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "sent 3 fds"));
    EXPECT_TRUE(fds.empty());
    EXPECT_THAT(b.RecvFrame(4096, nullptr, Deadline::After(5s)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "at most 0 expected"));
    // The stream is still in sync: the next frame arrives whole.
    auto next = b.RecvFrame(4096, &fds, Deadline::After(5s));
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(wire::DecodeFrame(*next)->header.request_id, 3u);
    EXPECT_EQ(CountOpenFds(), before);
}

TEST(UdsTest, MoreFdsThanTheControlBufferAreClosed) {
    auto [a, b] = MakePair();
    const int before = CountOpenFds();
    {
        // Bypass SendFrame's limit: a hostile peer sends 200 fds with one packet.
        UniqueFd m = MemFd("x");
        std::vector<int> fds(200, m.get());
        const auto frame = FrameOf(wire::OkReply{});
        std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
        iovec iov{const_cast<std::byte*>(frame.data()), frame.size()};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.data();
        msg.msg_controllen = control.size();
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
        ASSERT_EQ(::sendmsg(a.fd(), &msg, MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
    }
    std::vector<UniqueFd> fds;
    EXPECT_THAT(b.RecvFrame(4096, &fds, Deadline::After(5s)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "more fds"));
    EXPECT_TRUE(fds.empty());
    EXPECT_EQ(CountOpenFds(), before);
}

// ---- Malformed packets -----------------------------------------------------------------------

TEST(UdsTest, OversizedPacketsAreTruncationErrors) {
    {
        auto [a, b] = MakePair();
        const auto frame = BigFrame(200, 1);
        ASSERT_EQ(::send(a.fd(), frame.data(), frame.size(), MSG_NOSIGNAL),
                  static_cast<ssize_t>(frame.size()));
        EXPECT_THAT(b.RecvFrame(100, nullptr, Deadline::After(5s)),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "larger than the 100 bytes"));
    }
    {
        // One packet larger than kMaxPacketBytes (a peer ignoring the packet size).
        auto [a, b] = MakePair();
        const auto frame = BigFrame(kMaxPacketBytes + 1000, 1);
        ASSERT_EQ(::send(a.fd(), frame.data(), frame.size(), MSG_NOSIGNAL),
                  static_cast<ssize_t>(frame.size()));
        EXPECT_THAT(b.RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::After(5s)),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "larger than"));
    }
    {
        // A frame within the packet size but beyond the caller's limit.
        auto [a, b] = MakePair();
        MCS_ASSERT_OK(a.SendFrame(BigFrame(10 << 10, 1)));
        EXPECT_THAT(b.RecvFrame(8 << 10, nullptr, Deadline::After(5s)),
                    StatusIs(StatusCode::kInvalidArgument));
    }
    {
        // A frame beyond the caller's limit whose header arrives alone: rejected from the
        // header, before its payload is read.
        auto [a, b] = MakePair();
        std::thread sender([&, &a = a] { (void)a.SendFrame(BigFrame(1 << 20, 1), {}, Deadline::After(2s)); });
        EXPECT_THAT(b.RecvFrame(256 << 10, nullptr, Deadline::After(5s)),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "the limit is"));
        b.Close();
        sender.join();
    }
}

TEST(UdsTest, MalformedPacketsAreInvalidArgument) {
    auto [a, b] = MakePair();
    const char junk[40] = "definitely not a frame header at all";
    ASSERT_EQ(::send(a.fd(), junk, sizeof junk, MSG_NOSIGNAL), 40);
    EXPECT_THAT(b.RecvFrame(4096, nullptr, Deadline::After(5s)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "magic"));
    ASSERT_EQ(::send(a.fd(), junk, 10, MSG_NOSIGNAL), 10);
    EXPECT_THAT(b.RecvFrame(4096, nullptr, Deadline::After(5s)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "shorter than a frame header"));
    // A packet that runs past the end its header declares.
    auto frame = FrameOf(wire::StatRequest{"k"});
    frame.push_back(std::byte{1});
    ASSERT_EQ(::send(a.fd(), frame.data(), frame.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(frame.size()));
    EXPECT_THAT(b.RecvFrame(4096, nullptr, Deadline::After(5s)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "longer than its frame"));
    EXPECT_THAT(b.RecvFrame(10, nullptr, Deadline::After(5s)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "smaller than a frame header"));
}

// ---- Timeouts and peer death -----------------------------------------------------------------

TEST(UdsTest, RecvTimesOutWhenPeerIsSilent) {
    auto [a, b] = MakePair();
    const auto t0 = Clock::now();
    EXPECT_THAT(b.RecvFrame(4096, nullptr, Deadline::After(150ms)),
                StatusIsWithMessage(StatusCode::kUnavailable, "timed out"));
    const auto elapsed = Clock::now() - t0;
    EXPECT_GE(elapsed, 140ms);
    EXPECT_LT(elapsed, 3s);
    // An already expired deadline still takes a frame that is there.
    MCS_ASSERT_OK(a.SendFrame(FrameOf(wire::OkReply{})));
    EXPECT_TRUE(b.RecvFrame(4096, nullptr, Deadline::After(0ms)).ok());
}

TEST(UdsTest, RecvTimesOutInTheMiddleOfAFrame) {
    auto [a, b] = MakePair();
    // Only the first packet of a 1 MiB frame arrives.
    const auto frame = BigFrame(1 << 20, 1);
    ASSERT_EQ(::send(a.fd(), frame.data(), kMaxPacketBytes, MSG_NOSIGNAL),
              static_cast<ssize_t>(kMaxPacketBytes));
    EXPECT_THAT(b.RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::After(100ms)),
                StatusIsWithMessage(StatusCode::kUnavailable, "in the middle of a"));
}

TEST(UdsTest, PeerCloseIsUnavailable) {
    auto [a, b] = MakePair();
    a.Close();
    EXPECT_THAT(b.RecvFrame(4096, nullptr, Deadline::Never()),
                StatusIsWithMessage(StatusCode::kUnavailable, "closed the connection"));
    // No SIGPIPE: the process survives and gets Unavailable.
    EXPECT_THAT(b.SendFrame(FrameOf(wire::OkReply{})), StatusIs(StatusCode::kUnavailable));
}

TEST(UdsTest, PeerCloseMidFrameIsUnavailable) {
    auto [a, b] = MakePair();
    const auto frame = BigFrame(1 << 20, 1);
    ASSERT_EQ(::send(a.fd(), frame.data(), kMaxPacketBytes, MSG_NOSIGNAL),
              static_cast<ssize_t>(kMaxPacketBytes));
    a.Close();
    EXPECT_THAT(b.RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::Never()),
                StatusIsWithMessage(StatusCode::kUnavailable, "in the middle of a"));
}

TEST(UdsTest, SendTimesOutWhenPeerDoesNotRead) {
    auto [a, b] = MakePair();
    const auto frame = BigFrame(1 << 20, 1);
    Status s;
    const auto t0 = Clock::now();
    for (int i = 0; i < 1000 && s.ok(); ++i) s = a.SendFrame(frame, {}, Deadline::After(100ms));
    EXPECT_THAT(s, StatusIsWithMessage(StatusCode::kUnavailable, "peer not reading"));
    EXPECT_LT(Clock::now() - t0, 10s);
}

TEST(UdsTest, ShutdownWakesABlockedReceiver) {
    auto [a, b] = MakePair();
    std::atomic<bool> done{false};
    Status result;
    std::thread receiver([&, &b = b] {
        result = b.RecvFrame(4096, nullptr, Deadline::Never()).status();
        done = true;
    });
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(done.load());
    b.Shutdown();
    receiver.join();
    EXPECT_THAT(result, StatusIs(StatusCode::kUnavailable));
    EXPECT_THAT(a.RecvFrame(4096, nullptr, Deadline::After(1s)), StatusIs(StatusCode::kUnavailable));
}

void NoopSignalHandler(int) {}

TEST(UdsTest, SignalsDoNotInterruptARecv) {
    struct sigaction sa{};
    sa.sa_handler = NoopSignalHandler;  // No SA_RESTART: poll() returns EINTR.
    sigemptyset(&sa.sa_mask);
    struct sigaction old{};
    ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);

    auto [a, b] = MakePair();
    std::atomic<bool> started{false};
    Result<std::vector<std::byte>> got = Unavailable("not run");
    std::thread receiver([&, &b = b] {
        started = true;
        got = b.RecvFrame(4096, nullptr, Deadline::After(10s));
    });
    while (!started) std::this_thread::yield();
    for (int i = 0; i < 20; ++i) {
        std::this_thread::sleep_for(5ms);
        ::pthread_kill(receiver.native_handle(), SIGUSR1);
    }
    const auto frame = FrameOf(wire::OkReply{}, 42);
    MCS_ASSERT_OK(a.SendFrame(frame));
    receiver.join();
    ::sigaction(SIGUSR1, &old, nullptr);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, frame);
}

// ---- Peer credentials ------------------------------------------------------------------------

TEST(UdsTest, PeerCredentialsOfAPair) {
    auto [a, b] = MakePair();
    auto cred = b.PeerCredentials();
    ASSERT_TRUE(cred.ok()) << cred.status().ToString();
    EXPECT_EQ(cred->pid, ::getpid());
    EXPECT_EQ(cred->uid, ::geteuid());
    EXPECT_EQ(cred->gid, ::getegid());
    MCS_EXPECT_OK(RequireSameUser(*cred));
    PeerCred other = *cred;
    other.uid = ::geteuid() + 1;
    EXPECT_THAT(RequireSameUser(other),
                StatusIsWithMessage(StatusCode::kPermissionDenied, "only the same user"));
    UnixConnection closed;
    EXPECT_THAT(closed.PeerCredentials(), StatusIs(StatusCode::kFailedPrecondition));
}

// ---- Listener and its socket file ------------------------------------------------------------

TEST(UdsTest, ListenerAcceptsAndExchangesFrames) {
    TempDir dir;
    const std::string path = dir.Path("node.sock");
    auto listener = UnixListener::Bind(path);
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    struct stat st{};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);

    auto client = UnixConnection::Connect(path);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto server = listener->Accept(Deadline::After(5s));
    ASSERT_TRUE(server.ok()) << server.status().ToString();

    auto cred = server->PeerCredentials();
    ASSERT_TRUE(cred.ok());
    EXPECT_EQ(cred->pid, ::getpid());
    MCS_EXPECT_OK(RequireSameUser(*cred));

    MCS_ASSERT_OK(client->SendFrame(FrameOf(wire::StatRequest{"k"}, 5)));
    auto req = server->RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::After(5s));
    ASSERT_TRUE(req.ok());
    MCS_ASSERT_OK(server->SendFrame(
        FrameOf(wire::ErrorReply::FromStatus(NotFound("no such key 'k'")), 5)));
    auto reply = client->RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::After(5s));
    ASSERT_TRUE(reply.ok());
    auto frame = wire::DecodeFrame(*reply);
    ASSERT_TRUE(frame.ok());
    EXPECT_THAT(wire::DecodeReplyAs<wire::StatReply>(*frame),
                StatusIsWithMessage(StatusCode::kNotFound, "no such key"));
}

TEST(UdsTest, ListenerAppliesTheRequestedMode) {
    TempDir dir;
    const std::string path = dir.Path("shared.sock");
    auto listener = UnixListener::Bind(path, 0660);
    ASSERT_TRUE(listener.ok());
    struct stat st{};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0660u);
}

TEST(UdsTest, ConnectWithoutADaemonIsUnavailable) {
    TempDir dir;
    const std::string path = dir.Path("none.sock");
    EXPECT_THAT(UnixConnection::Connect(path),
                StatusIsWithMessage(StatusCode::kUnavailable,
                                    "node daemon at " + path + " is not running"));
    MakeStaleSocketFile(path);
    EXPECT_THAT(UnixConnection::Connect(path),
                StatusIsWithMessage(StatusCode::kUnavailable, "is not running"));
}

TEST(UdsTest, StaleSocketFileIsReplaced) {
    TempDir dir;
    const std::string path = dir.Path("stale.sock");
    MakeStaleSocketFile(path);
    auto listener = UnixListener::Bind(path);
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    auto client = UnixConnection::Connect(path);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    EXPECT_TRUE(listener->Accept(Deadline::After(5s)).ok());
}

TEST(UdsTest, LiveListenerIsNeverReplaced) {
    TempDir dir;
    const std::string path = dir.Path("live.sock");
    auto first = UnixListener::Bind(path);
    ASSERT_TRUE(first.ok());
    EXPECT_THAT(UnixListener::Bind(path),
                StatusIsWithMessage(StatusCode::kFailedPrecondition, "already running"));
    // The first daemon still serves.
    auto client = UnixConnection::Connect(path);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    EXPECT_TRUE(first->Accept(Deadline::After(5s)).ok());
}

TEST(UdsTest, NonSocketFilesAreNeverRemoved) {
    TempDir dir;
    const std::string path = dir.Path("precious.txt");
    std::ofstream(path) << "keep me";
    EXPECT_THAT(UnixListener::Bind(path),
                StatusIsWithMessage(StatusCode::kFailedPrecondition, "is not a socket"));
    std::ifstream in(path);
    std::string content;
    std::getline(in, content);
    EXPECT_EQ(content, "keep me");

    const std::string subdir = dir.Path("a-directory");
    ASSERT_EQ(::mkdir(subdir.c_str(), 0700), 0);
    EXPECT_THAT(UnixListener::Bind(subdir), StatusIs(StatusCode::kFailedPrecondition));
}

TEST(UdsTest, LiveSocketOfAnotherTypeIsNotRemoved) {
    TempDir dir;
    const std::string path = dir.Path("stream.sock");
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    UniqueFd owner(fd);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(fd, 4), 0);
    EXPECT_THAT(UnixListener::Bind(path), StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_THAT(UnixConnection::Connect(path),
                StatusIsWithMessage(StatusCode::kUnavailable, "not a node daemon socket"));
    struct stat st{};
    EXPECT_EQ(::lstat(path.c_str(), &st), 0);
}

TEST(UdsTest, ListenerRemovesOnlyItsOwnSocketFile) {
    TempDir dir;
    const std::string path = dir.Path("own.sock");
    struct stat st{};
    {
        auto listener = UnixListener::Bind(path);
        ASSERT_TRUE(listener.ok());
        UnixListener moved = std::move(listener).value();  // Moving keeps one owner.
        EXPECT_EQ(moved.path(), path);
    }
    EXPECT_NE(::lstat(path.c_str(), &st), 0) << "socket file left behind";

    auto old_listener = UnixListener::Bind(path);
    ASSERT_TRUE(old_listener.ok());
    ASSERT_EQ(::unlink(path.c_str()), 0);  // Someone removed it and a new daemon took the path.
    auto new_listener = UnixListener::Bind(path);
    ASSERT_TRUE(new_listener.ok());
    *old_listener = UnixListener();  // The old one must not remove the new one's file.
    EXPECT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(UnixConnection::Connect(path).ok());
}

TEST(UdsTest, BadPathsAreInvalidArgument) {
    const std::string long_path = "/tmp/" + std::string(200, 'x');
    EXPECT_THAT(UnixListener::Bind(long_path),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "the limit is"));
    EXPECT_THAT(UnixConnection::Connect(long_path), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(UnixListener::Bind(""), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(UnixListener::Bind("/tmp/no-such-dir-mcs-uds/x.sock"),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "directory does not exist"));
}

TEST(UdsTest, AcceptTimesOutAndShutdownWakesIt) {
    TempDir dir;
    auto listener = UnixListener::Bind(dir.Path("accept.sock"));
    ASSERT_TRUE(listener.ok());
    const auto t0 = Clock::now();
    EXPECT_THAT(listener->Accept(Deadline::After(100ms)),
                StatusIsWithMessage(StatusCode::kUnavailable, "timed out"));
    EXPECT_GE(Clock::now() - t0, 90ms);

    Status result;
    std::thread acceptor([&] { result = listener->Accept(Deadline::Never()).status(); });
    std::this_thread::sleep_for(50ms);
    listener->Shutdown();
    acceptor.join();
    EXPECT_THAT(result, StatusIsWithMessage(StatusCode::kUnavailable, "shut down"));
}

// A daemon process that dies without replying: the client gets Unavailable, never a hang.
TEST(UdsTest, DaemonDeathIsUnavailableForTheClient) {
    TempDir dir;
    const std::string path = dir.Path("dying.sock");
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        auto listener = UnixListener::Bind(path);
        if (!listener.ok()) ::_exit(2);
        auto conn = listener->Accept(Deadline::After(10s));
        if (!conn.ok()) ::_exit(3);
        // Read the request, then die (SIGKILL: no destructors, no goodbye).
        (void)conn->RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::After(10s));
        ::kill(::getpid(), SIGKILL);
        ::_exit(4);
    }
    Result<UnixConnection> client = Unavailable("not yet");
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until) {
        client = UnixConnection::Connect(path);
        if (client.ok()) break;
        std::this_thread::sleep_for(5ms);
    }
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto cred = client->PeerCredentials();
    ASSERT_TRUE(cred.ok());
    EXPECT_EQ(cred->pid, child);

    MCS_ASSERT_OK(client->SendFrame(FrameOf(wire::HelloRequest{1, 1, "c", ""})));
    const auto t0 = Clock::now();
    EXPECT_THAT(client->RecvFrame(wire::kMaxFrameBytes, nullptr, Deadline::After(20s)),
                StatusIsWithMessage(StatusCode::kUnavailable, "node daemon at " + path));
    EXPECT_LT(Clock::now() - t0, 15s);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
    EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << wstatus;
    // Its socket file is stale now; a new daemon takes the path.
    EXPECT_TRUE(UnixListener::Bind(path).ok());
}

}  // namespace
}  // namespace mooncake::sparse
