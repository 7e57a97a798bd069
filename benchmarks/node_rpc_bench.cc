// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// node_rpc_bench: metadata RPC latency of the node daemon (docs/design.md §5-6), JSON lines on
// stdout. A NodeServer runs on a thread of this process (the same code as mooncake_sparse_node)
// and a NodeClient calls it over a real Unix socket:
//   what="node_stat_rtt_cpp"   Stat round trip (encode, send, dispatch, store lookup, reply)
//   what="node_lease_rtt_cpp"  Lease + release round trip (zero-copy hand-off of an object)
// Ceiling, measured in the same run: the same request and reply frames echoed by a thread over
// a SOCK_SEQPACKET socket pair (framing and socket cost, no daemon work).
//
// Usage: node_rpc_bench [iterations]   (default 20000)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "node/node_server.h"
#include "node/node_client.h"
#include "node/uds.h"
#include "node/wire.h"

namespace mcs = mooncake::sparse;
using Clock = std::chrono::steady_clock;

namespace {

struct Stats {
    double p50 = 0, p99 = 0, mean = 0;
};

Stats Summarize(std::vector<double> us) {
    std::sort(us.begin(), us.end());
    Stats s;
    s.p50 = us[us.size() / 2];
    s.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
    double sum = 0;
    for (double v : us) sum += v;
    s.mean = sum / static_cast<double>(us.size());
    return s;
}

double LoadAvg() {
    double l[1] = {0};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

template <typename Fn>
std::vector<double> Time(int iterations, Fn&& fn) {
    std::vector<double> us;
    us.reserve(iterations);
    for (int i = 0; i < iterations / 10; ++i) fn();  // warm-up
    for (int i = 0; i < iterations; ++i) {
        const auto t0 = Clock::now();
        fn();
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return us;
}

/// Round trips of `request` answered with `reply` by an echo thread over a socket pair.
std::vector<double> EchoCeiling(int iterations, const std::vector<std::byte>& request,
                                const std::vector<std::byte>& reply) {
    auto pair = mcs::UnixConnection::Pair();
    if (!pair.ok()) {
        std::fprintf(stderr, "socketpair: %s\n", pair.status().ToString().c_str());
        std::exit(1);
    }
    auto& [client, server] = *pair;
    std::thread echo([&server, &reply] {
        for (;;) {
            auto got = server.RecvFrame(mcs::wire::kMaxFrameBytes, nullptr);
            if (!got.ok()) return;
            if (!server.SendFrame(reply).ok()) return;
        }
    });
    auto us = Time(iterations, [&] {
        (void)client.SendFrame(request);
        (void)client.RecvFrame(mcs::wire::kMaxFrameBytes, nullptr);
    });
    client.Shutdown();
    echo.join();
    return us;
}

void Emit(const char* what, int iterations, const Stats& s, const Stats& c) {
    std::printf(
        "{\"what\": \"%s\", \"iterations\": %d, \"p50_us\": %.2f, \"p99_us\": %.2f, "
        "\"mean_us\": %.2f, \"ceiling\": \"same frames echoed over a SOCK_SEQPACKET socket pair "
        "by a thread\", \"ceiling_p50_us\": %.2f, \"ceiling_p99_us\": %.2f, \"loadavg_1m\": "
        "%.2f}\n",
        what, iterations, s.p50, s.p99, s.mean, c.p50, c.p99, LoadAvg());
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const int iterations = argc > 1 ? std::max(100, std::atoi(argv[1])) : 20000;
    // The in-process server logs warnings and errors to stderr (daemon/log.h); its
    // per-connection INFO lines stay off and do not interleave with the JSON lines.
    char tmpl[] = "/tmp/mcs-rpc-bench-XXXXXX";
    const std::string dir = ::mkdtemp(tmpl);
    mcs::NodeServerOptions options;
    options.socket_path = dir + "/node.sock";
    options.store.segment_size = 16 << 20;
    options.store.num_segments = 1;
    auto server = mcs::NodeServer::Start(options);
    if (!server.ok()) {
        std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
        return 1;
    }
    mcs::NodeClientOptions copts;
    copts.socket_path = options.socket_path;
    auto client = mcs::NodeClient::Connect(copts);
    if (!client.ok()) {
        std::fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
        return 1;
    }
    std::vector<std::byte> payload(4096, std::byte{1});
    std::vector<mcs::MemberData> members = {
        {"indices", mcs::DType::kUInt16, {1024, 2}, payload, 1}};
    if (!(*client)->Put("bench/obj", R"({"schema":"bench"})", members, {}).ok()) return 1;

    // Stat.
    auto stat = Time(iterations, [&] { (void)(*client)->Stat("bench/obj"); });
    auto info = (*client)->Stat("bench/obj");
    const auto stat_request = *mcs::wire::EncodeFrame(mcs::wire::StatRequest{"bench/obj"}, 1);
    const auto stat_reply = *mcs::wire::EncodeFrame(mcs::wire::StatReply{*info}, 1);
    Emit("node_stat_rtt_cpp", iterations, Summarize(stat),
         Summarize(EchoCeiling(iterations, stat_request, stat_reply)));

    // Lease, then release (the release rides on the next call's round trip, so every
    // iteration after the first is release + lease: two round trips, and the ceiling too).
    auto lease = Time(iterations, [&] {
        auto l = (*client)->Lease("bench/obj");
        (void)l;
    });
    mcs::wire::LeaseReply lr;
    lr.lease_id = 7;
    lr.info = *info;
    lr.locations = {{0, 0, 4096}};
    const auto lease_request = *mcs::wire::EncodeFrame(mcs::wire::LeaseRequest{"bench/obj"}, 1);
    const auto lease_reply = *mcs::wire::EncodeFrame(lr, 1);
    auto ceiling = EchoCeiling(iterations, lease_request, lease_reply);
    for (double& v : ceiling) v *= 2;  // release + lease
    Emit("node_lease_rtt_cpp", iterations, Summarize(lease), Summarize(ceiling));

    client->reset();
    (*server)->Stop();
    std::filesystem::remove_all(dir);
    return 0;
}
