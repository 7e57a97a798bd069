// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon against peers that hold on to it: a frame started but never finished, a
// connection that never says Hello or sits idle without state, idle sockets filling
// max_connections, finished connections waiting to be joined, a dumpable daemon; and a daemon
// that serves before its pinned memory is registered.
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "node/daemon_config.h"
#include "node/node_server.h"
#include "node/node_client.h"
#include "store/pinned_memory.h"
#include "node/uds.h"
#include "node/wire.h"
#include "node_test_util.h"

namespace mooncake::sparse {
namespace {

using namespace std::chrono_literals;

using testing::TempDir;

NodeServerOptions SmallServer(const std::string& socket) {
    return testing::SmallServer(socket, "hardening_test", 16 << 20);
}

std::shared_ptr<NodeClient> Client(const std::string& socket) {
    NodeClientOptions o;
    o.socket_path = socket;
    o.client_name = "hardening_test";
    o.call_timeout = 10s;
    o.connect_timeout = 2s;
    o.initial_buffer_bytes = 64 << 10;
    auto c = NodeClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : nullptr;
}

template <typename Pred>
bool Eventually(Pred pred, std::chrono::milliseconds limit = 5s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
        if (pred()) return true;
        std::this_thread::sleep_for(5ms);
    }
    return pred();
}

/// A raw peer: a connected socket that sends exactly what a test tells it to.
UnixConnection RawPeer(const std::string& socket) {
    auto conn = UnixConnection::Connect(socket);
    EXPECT_TRUE(conn.ok()) << conn.status().ToString();
    return conn.ok() ? std::move(conn).value() : UnixConnection();
}

/// Says Hello on `conn` and reads the reply (closing the segment fds it carries).
void SayHello(UnixConnection& conn) {
    wire::HelloRequest hello;
    hello.pid = static_cast<std::uint32_t>(::getpid());
    hello.client_name = "raw";
    auto frame = wire::EncodeFrame(hello, 1);
    ASSERT_TRUE(frame.ok());
    ASSERT_TRUE(conn.SendFrame(*frame).ok());
    std::vector<UniqueFd> fds;
    auto reply = conn.RecvFrame(wire::kMaxFrameBytes, &fds, Deadline::After(5s), 64);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
}

/// True when the daemon closed `conn` within `limit` (EOF or reset on read).
bool ClosedWithin(const UnixConnection& conn, std::chrono::milliseconds limit) {
    pollfd p{conn.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return false;
    char byte[1 << 16];
    const ssize_t n = ::recv(conn.fd(), byte, sizeof byte, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN);
}

double Metric(NodeServer& server, const std::string& name) {
    for (const auto& [key, value] : server.MetricItems()) {
        if (key == name) return value;
    }
    ADD_FAILURE() << "no metric " << name;
    return -1;
}

TEST(NodeServerHardeningTest, StartMakesTheProcessNonDumpable) {
    // Not dumpable: /proc/<pid>/mem is root's, so a same-uid peer cannot write daemon memory.
    TempDir dir;
    auto server = NodeServer::Start(SmallServer(dir.Path("node.sock")));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    EXPECT_EQ(::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 0);
}

TEST(NodeServerHardeningTest, APartialFrameIsDroppedAfterFrameTimeout) {
    TempDir dir;
    NodeServerOptions o = SmallServer(dir.Path("node.sock"));
    o.frame_timeout = 300ms;
    auto server = NodeServer::Start(o);
    ASSERT_TRUE(server.ok());
    UnixConnection peer = RawPeer(o.socket_path);
    SayHello(peer);
    // A header that announces 32 MiB, then one packet of it, then nothing.
    std::vector<std::byte> packet(kMaxPacketBytes);
    wire::FrameHeader header;
    header.type = wire::MessageType::kPut;
    header.request_id = 2;
    header.payload_len = 32 << 20;
    wire::EncodeFrameHeader(header, std::span<std::byte, wire::kFrameHeaderBytes>(
                                        packet.data(), wire::kFrameHeaderBytes));
    ASSERT_EQ(::send(peer.fd(), packet.data(), packet.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(packet.size()));
    EXPECT_TRUE(ClosedWithin(peer, 5s));
    EXPECT_TRUE(Eventually([&] { return (*server)->Stats().frame_timeouts == 1; }));
    // The daemon still serves.
    auto client = Client(o.socket_path);
    ASSERT_NE(client, nullptr);
    EXPECT_TRUE(client->List("").ok());
}

TEST(NodeServerHardeningTest, NoHelloInTimeAndIdleWithoutStateAreClosed) {
    TempDir dir;
    NodeServerOptions o = SmallServer(dir.Path("node.sock"));
    o.frame_timeout = 300ms;
    o.idle_timeout = 500ms;
    auto server = NodeServer::Start(o);
    ASSERT_TRUE(server.ok());
    UnixConnection silent = RawPeer(o.socket_path);
    UnixConnection idle = RawPeer(o.socket_path);
    SayHello(idle);
    auto client = Client(o.socket_path);  // Registers its buffer: it holds state.
    ASSERT_NE(client, nullptr);
    EXPECT_TRUE(ClosedWithin(silent, 5s));
    EXPECT_TRUE(ClosedWithin(idle, 5s));
    EXPECT_TRUE(Eventually([&] { return (*server)->Stats().idle_closes == 2; }));
    std::this_thread::sleep_for(1s);  // Twice the idle timeout.
    EXPECT_TRUE(client->List("").ok());
    EXPECT_EQ(client->Stats().connects, 1u);  // Never dropped.
    EXPECT_EQ((*server)->Stats().idle_closes, 2u);
}

TEST(NodeServerHardeningTest, AtMaxConnectionsTheLongestIdleStatelessConnectionMakesRoom) {
    TempDir dir;
    NodeServerOptions o = SmallServer(dir.Path("node.sock"));
    o.max_connections = 3;
    auto server = NodeServer::Start(o);
    ASSERT_TRUE(server.ok());
    std::vector<UnixConnection> idle;
    for (int i = 0; i < 3; ++i) {
        idle.push_back(RawPeer(o.socket_path));
        SayHello(idle.back());
        std::this_thread::sleep_for(20ms);  // A distinct idle order.
    }
    auto first = Client(o.socket_path);  // Full: evicts idle[0], the longest idle.
    ASSERT_NE(first, nullptr);
    EXPECT_TRUE(first->List("").ok());
    EXPECT_TRUE(ClosedWithin(idle[0], 5s));
    EXPECT_FALSE(ClosedWithin(idle[1], 50ms));
    auto second = Client(o.socket_path);
    auto third = Client(o.socket_path);
    ASSERT_NE(second, nullptr);
    ASSERT_NE(third, nullptr);
    EXPECT_TRUE(ClosedWithin(idle[1], 5s));
    EXPECT_TRUE(ClosedWithin(idle[2], 5s));
    EXPECT_EQ((*server)->Stats().connections_evicted, 3u);
    // Every connection holds state now: a newcomer is refused, nobody is evicted.
    UnixConnection late = RawPeer(o.socket_path);
    EXPECT_TRUE(ClosedWithin(late, 5s));
    EXPECT_EQ((*server)->Stats().connections_evicted, 3u);
    EXPECT_TRUE(first->List("").ok());
    EXPECT_EQ(first->Stats().connects, 1u);
}

TEST(NodeServerHardeningTest, FinishedConnectionsAreReapedWithoutAnotherAccept) {
    TempDir dir;
    auto server = NodeServer::Start(SmallServer(dir.Path("node.sock")));
    ASSERT_TRUE(server.ok());
    {
        auto client = Client(dir.Path("node.sock"));
        ASSERT_NE(client, nullptr);
        EXPECT_TRUE(client->List("").ok());
        EXPECT_EQ((*server)->Stats().connection_threads, 1u);
    }
    EXPECT_TRUE(Eventually([&] { return (*server)->Stats().connection_threads == 0; }));
}

/// Blocks every registration until Open(): pinning that never ends while the test runs.
class Gate {
public:
    RegisterPinnedFn Fn() {
        return [this](std::byte* data, std::uint64_t size) -> Result<PinnedRegion> {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return open_; });
            return PinnedRegion::Adopt(data, size, [](void*) {});
        };
    }
    void Open() {
        std::lock_guard lock(mu_);
        open_ = true;
        cv_.notify_all();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool open_ = false;
};

TEST(NodeServerHardeningTest, ServesBeforePinningCompletesAndReportsProgress) {
    TempDir dir;
    Gate gate;
    NodeServerOptions o = SmallServer(dir.Path("node.sock"));
    o.store.pinned_quota_bytes = 6 << 20;
    o.store.register_pinned = gate.Fn();
    auto server = NodeServer::Start(o);
    struct OpenOnExit {  // Stopping joins the blocked registrations: open first.
        Gate& gate;
        ~OpenOnExit() { gate.Open(); }
    } open_on_exit{gate};
    ASSERT_TRUE(server.ok());
    {
        auto client = Client(o.socket_path);
        ASSERT_NE(client, nullptr);
        const std::vector<std::byte> bytes(1 << 20, std::byte{5});
        const MemberData member{"a", DType::kUInt8, {1 << 20}, bytes};
        ASSERT_TRUE(client->Put("k", "", std::span<const MemberData>(&member, 1), {}).ok());
        auto metrics = client->Metrics();
        ASSERT_TRUE(metrics.ok());
        std::map<std::string, double> m(metrics->begin(), metrics->end());
        EXPECT_EQ(m["pinning_complete"], 0);
        EXPECT_EQ(m["pinned_bytes"], 0);
        EXPECT_EQ(m["pinned_target_bytes"], 6 << 20);
        EXPECT_EQ(m["pinned_quota_bytes"], 6 << 20);
    }
    gate.Open();
    EXPECT_TRUE(Eventually([&] { return Metric(**server, "pinning_complete") == 1; }));
    EXPECT_EQ(Metric(**server, "pinned_bytes"), 6 << 20);
    EXPECT_EQ(Metric(**server, "prefaulted_bytes"), 8 << 20);
}

TEST(DaemonConfigTest, TimeoutsAndPreparationKeys) {
    EXPECT_EQ(*ParseDuration("10s"), 10s);
    EXPECT_EQ(*ParseDuration("250ms"), 250ms);
    EXPECT_EQ(*ParseDuration("2m"), 120s);
    EXPECT_EQ(*ParseDuration("1h"), 3600s);
    EXPECT_EQ(*ParseDuration(" 30 "), 30s);  // Plain numbers are seconds.
    EXPECT_EQ(*ParseDuration("0"), 0ms);
    EXPECT_FALSE(ParseDuration("").ok());
    EXPECT_FALSE(ParseDuration("5 parsecs").ok());
    EXPECT_FALSE(ParseDuration("-1s").ok());
    EXPECT_FALSE(ParseDuration("99999999999999999h").ok());

    NodeDaemonConfig c;
    c.socket_path = "/tmp/x.sock";
    ASSERT_TRUE(ApplyYamlConfig("frame_timeout: 2s\nidle_timeout: 0\nprefault_segments: false\n"
                                "prepare_threads: 8\n",
                                c)
                    .ok());
    auto o = ToServerOptions(c);
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->frame_timeout, 2s);
    EXPECT_EQ(o->idle_timeout, 0ms);
    EXPECT_FALSE(o->store.prefault);
    EXPECT_EQ(o->store.prepare_threads, 8u);
    EXPECT_TRUE(o->store.prepare_in_background);
    EXPECT_FALSE(o->read_in_place);
    EXPECT_EQ(o->commit_staging_pinned_bytes, std::uint64_t{1} << 30);
    ASSERT_TRUE(ApplyYamlConfig("read_in_place: on\ncommit_staging_pinned_bytes: 64MiB\n", c).ok());
    o = ToServerOptions(c);
    ASSERT_TRUE(o.ok());
    EXPECT_TRUE(o->read_in_place);
    EXPECT_EQ(o->commit_staging_pinned_bytes, std::uint64_t{64} << 20);
    EXPECT_NE(ConfigToJson(c).find("\"read_in_place\":true"), std::string::npos);
    EXPECT_FALSE(SetConfigKey(c, "read_in_place", "perhaps").ok());
    EXPECT_TRUE(c.gpu_commit_check);
    ASSERT_TRUE(ApplyYamlConfig("gpu_commit_check: off\n", c).ok());
    EXPECT_FALSE(c.gpu_commit_check);
    EXPECT_NE(ConfigToJson(c).find("\"gpu_commit_check\":false"), std::string::npos);
    EXPECT_FALSE(c.segment_huge_pages);
    EXPECT_FALSE(ToServerOptions(c)->store.huge_pages);
    ASSERT_TRUE(ApplyYamlConfig("segment_huge_pages: on\n", c).ok());
    EXPECT_TRUE(c.segment_huge_pages);
    EXPECT_TRUE(ToServerOptions(c)->store.huge_pages);
    EXPECT_NE(ConfigToJson(c).find("\"segment_huge_pages\":true"), std::string::npos);
    EXPECT_FALSE(SetConfigKey(c, "segment_huge_pages", "maybe").ok());
    EXPECT_EQ(c.device_gather_engine_bytes, std::uint64_t{256} << 10);
    ASSERT_TRUE(ApplyYamlConfig("device_gather_engine_bytes: 1MiB\n", c).ok());
    EXPECT_EQ(c.device_gather_engine_bytes, std::uint64_t{1} << 20);
    ASSERT_TRUE(SetConfigKey(c, "device_gather_engine_bytes", "0").ok());
    EXPECT_EQ(c.device_gather_engine_bytes, 0u);
    EXPECT_NE(ConfigToJson(c).find("\"device_gather_engine_bytes\":0"), std::string::npos);
    EXPECT_FALSE(SetConfigKey(c, "device_gather_engine_bytes", "big").ok());
    EXPECT_EQ(c.device_commit_group_bytes, 0u);
    ASSERT_TRUE(ApplyYamlConfig("device_commit_group_bytes: 4MiB\n", c).ok());
    EXPECT_EQ(c.device_commit_group_bytes, std::uint64_t{4} << 20);
    ASSERT_TRUE(SetConfigKey(c, "device_commit_group_bytes", "0").ok());
    EXPECT_EQ(c.device_commit_group_bytes, 0u);
    EXPECT_NE(ConfigToJson(c).find("\"device_commit_group_bytes\":0"), std::string::npos);
    EXPECT_FALSE(SetConfigKey(c, "device_commit_group_bytes", "big").ok());
    ASSERT_TRUE(SetConfigKey(c, "device_commit_group_bytes", "1MiB").ok());
    EXPECT_EQ(ToServerOptions(c)->device_commit_group_bytes, std::uint64_t{1} << 20);
    EXPECT_FALSE(SetConfigKey(c, "commit_staging_pinned_bytes", "lots").ok());
    EXPECT_FALSE(SetConfigKey(c, "prefault_segments", "maybe").ok());
    EXPECT_FALSE(SetConfigKey(c, "prepare_threads", "0").ok());
    EXPECT_FALSE(SetConfigKey(c, "frame_timeout", "soon").ok());
}

}  // namespace
}  // namespace mooncake::sparse
