// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon in-process: a NodeServer thread and NodeClients in the same binary, over a
// real Unix socket. Object RPCs, leases and their release, the sparse layer (commit with
// re-validation, read with node-level dedup across concurrent clients), hostile input on a raw
// connection, reconnect after a restart, and timeouts against a silent daemon.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codec/codec.h"
#include "node/daemon_config.h"
#include "node/node_server.h"
#include "executor/sparse_store.h"
#include "node/node_client.h"
#include "store/shm_segment.h"
#include "node/uds.h"
#include "node/wire.h"
#include "node_test_util.h"
#include "../planned_host_build.h"

namespace mooncake::sparse {
namespace {

using namespace std::chrono_literals;

using testing::StatusIs;
using testing::StatusIsWithMessage;
using testing::TempDir;

NodeServerOptions SmallServer(const std::string& socket) {
    return testing::SmallServer(socket, "node_server_test", 64 << 20);
}

std::shared_ptr<NodeClient> Client(const std::string& socket,
                                   std::chrono::milliseconds timeout = 10s) {
    NodeClientOptions o;
    o.socket_path = socket;
    o.client_name = "node_server_test";
    o.call_timeout = timeout;
    o.connect_timeout = 2s;
    o.initial_buffer_bytes = 64 << 10;
    auto c = NodeClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : nullptr;
}

std::vector<std::byte> Pattern(std::size_t n, int seed) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131 + seed) & 0xff);
    return v;
}

/// A CUDA destination the daemon checks but whose handle opens nothing: `size` bytes at a made-up
/// base of device 0.
wire::TensorLocation UnopenableCudaDestination(std::uint64_t size) {
    wire::TensorLocation d;
    d.ref.kind = wire::BufferKind::kCudaIpc;
    d.ref.size = size;
    d.ref.cuda_ipc_handle.assign(wire::kCudaIpcHandleBytes, '\x22');
    d.ref.device = 0;
    d.cuda_base = std::uint64_t{1} << 40;
    d.cuda_alloc_size = size;
    return d;
}

/// Waits up to 5 s for `pred`.
template <typename Pred>
bool Eventually(Pred pred) {
    for (int i = 0; i < 500; ++i) {
        if (pred()) return true;
        std::this_thread::sleep_for(10ms);
    }
    return pred();
}

class NodeServerTest : public ::testing::Test {
protected:
    void SetUp() override {
        socket_ = dir_.Path("node.sock");
        auto s = NodeServer::Start(SmallServer(socket_));
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        server_ = std::move(s).value();
    }
    void TearDown() override {
        if (server_) server_->Stop();
    }

    TempDir dir_;
    std::string socket_;
    std::unique_ptr<NodeServer> server_;
};

// ---------------------------------------------------------------------------------------------
// Object RPCs and leases.
// ---------------------------------------------------------------------------------------------

TEST_F(NodeServerTest, ObjectRoundTripThroughSharedMemory) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const auto a = Pattern(3000, 1), b = Pattern(800, 2);
    std::vector<MemberData> members = {{"a", DType::kUInt16, {1500}, a, 11},
                                       {"b", DType::kUInt8, {100, 8}, b, 22}};
    ASSERT_OK(client->Put("k", "meta", members, {PutMode::kCreate, false}));
    EXPECT_THAT(client->Put("k", "meta", members, {PutMode::kCreate, false}),
                StatusIs(StatusCode::kConflict));
    auto info = client->Stat("k");
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->metadata, "meta");
    EXPECT_EQ(info->members[1].checksum, 22u);

    std::vector<std::byte> whole(3000);
    ASSERT_OK(client->ReadMember("k", "a", whole));
    EXPECT_EQ(whole, a);
    std::vector<std::byte> r1(20 * 2), r2(5 * 8);
    std::vector<RangeRead> reads = {{"k", "a", 10, 30, r1}, {"k", "b", 95, 100, r2}};
    ASSERT_OK(client->ReadRanges(reads));
    EXPECT_TRUE(std::equal(r1.begin(), r1.end(), a.begin() + 20));
    EXPECT_TRUE(std::equal(r2.begin(), r2.end(), b.begin() + 760));

    // Zero-copy: the lease views the daemon's segment through a read-only mapping.
    auto lease = client->Lease("k");
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    ASSERT_EQ(lease->members.size(), 2u);
    EXPECT_TRUE(std::equal(lease->members[0].begin(), lease->members[0].end(), a.begin(), a.end()));
    EXPECT_EQ(server_->store().Stats().leases, 1u);

    auto keys = client->List("");
    ASSERT_TRUE(keys.ok());
    EXPECT_THAT(*keys, ::testing::ElementsAre("k"));
    ASSERT_OK(client->Remove("k"));
    EXPECT_THAT(client->Stat("k"), StatusIs(StatusCode::kNotFound));
    // The removed object's bytes live on under the lease.
    EXPECT_TRUE(std::equal(lease->members[1].begin(), lease->members[1].end(), b.begin(), b.end()));

    // Dropping the view queues the release; the next call sends it.
    *lease = LeasedObject();
    ASSERT_OK(client->FlushReleases());
    EXPECT_EQ(server_->store().Stats().leases, 0u);
    EXPECT_EQ(server_->store().Stats().used_bytes, 0u);
}

TEST_F(NodeServerTest, LargePutsGrowTheClientBuffer) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const auto big = Pattern(3 << 20, 5);
    std::vector<MemberData> members = {{"x", DType::kUInt8, {Index(big.size())}, big, 0}};
    ASSERT_OK(client->Put("big", "", members, {}));
    EXPECT_GE(client->Stats().buffer_bytes, big.size());
    std::vector<std::byte> back(big.size());
    ASSERT_OK(client->ReadMember("big", "x", back));
    EXPECT_EQ(back, big);
    // Beyond the daemon's client_buffer_max: refused on the client side, nothing sent.
    std::vector<std::byte> huge(17 << 20);
    std::vector<MemberData> too_big = {{"x", DType::kUInt8, {Index(huge.size())}, huge, 0}};
    EXPECT_THAT(client->Put("huge", "", too_big, {}), StatusIs(StatusCode::kResourceExhausted));
    // Larger than a segment: the daemon says ResourceExhausted.
    std::vector<std::byte> seg(5 << 20);
    std::vector<MemberData> over = {{"x", DType::kUInt8, {Index(seg.size())}, seg, 0}};
    EXPECT_THAT(client->Put("over", "", over, {}), StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(client->Stat("over"), StatusIs(StatusCode::kNotFound));
}

TEST_F(NodeServerTest, UpsertWritesInPlaceUnlessAClientHoldsALease) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    auto put = [&](int seed) {
        const auto bytes = Pattern(4096, seed);
        std::vector<MemberData> m = {{"x", DType::kUInt8, {4096}, bytes, 0}};
        return client->Put("k", std::to_string(seed), m, {PutMode::kUpsert, false});
    };
    ASSERT_OK(put(1));
    ASSERT_OK(put(2));
    EXPECT_EQ(server_->store().Stats().in_place_upserts, 1u);
    auto lease = client->Lease("k");
    ASSERT_TRUE(lease.ok());
    ASSERT_OK(put(3));
    EXPECT_EQ(server_->store().Stats().realloc_upserts, 1u);
    const auto two = Pattern(4096, 2);
    EXPECT_TRUE(std::equal(lease->members[0].begin(), lease->members[0].end(), two.begin()));
    EXPECT_EQ(lease->info.metadata, "2");
}

TEST_F(NodeServerTest, DisconnectReleasesEveryLeaseOfTheConnection) {
    {
        auto client = Client(socket_);
        ASSERT_NE(client, nullptr);
        const auto bytes = Pattern(10000, 3);
        std::vector<MemberData> m = {{"x", DType::kUInt8, {10000}, bytes, 0}};
        ASSERT_OK(client->Put("k", "", m, {}));
        std::vector<LeasedObject> leases;
        for (int i = 0; i < 5; ++i) {
            auto l = client->Lease("k");
            ASSERT_TRUE(l.ok());
            leases.push_back(std::move(l).value());
        }
        EXPECT_EQ(server_->store().Stats().leases, 5u);
        // leases and client go out of scope without any release call
    }
    EXPECT_TRUE(Eventually([&] { return server_->store().Stats().leases == 0; }));
    EXPECT_TRUE(Eventually([&] { return server_->Stats().connections_active == 0; }));
}

// ---------------------------------------------------------------------------------------------
// The sparse layer.
// ---------------------------------------------------------------------------------------------

/// A random global COO of `nnz` unique coordinates in `shape`, float32 values.
struct Coo {
    std::vector<std::byte> indices;  // int64 [nnz, 2]
    std::vector<std::byte> values;   // float32 [nnz]
    std::uint64_t nnz = 0;
};

Coo RandomCoo(Index rows, Index cols, std::uint64_t nnz, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::int64_t> flat(static_cast<std::size_t>(rows * cols));
    for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<std::int64_t>(i);
    std::shuffle(flat.begin(), flat.end(), rng);
    flat.resize(nnz);
    Coo c;
    c.nnz = nnz;
    c.indices.resize(nnz * 16);
    c.values.resize(nnz * 4);
    for (std::uint64_t i = 0; i < nnz; ++i) {
        const std::int64_t r = flat[i] / cols, col = flat[i] % cols;
        std::memcpy(c.indices.data() + i * 16, &r, 8);
        std::memcpy(c.indices.data() + i * 16 + 8, &col, 8);
        const float v = static_cast<float>(i) * 0.5f + 1.0f;
        std::memcpy(c.values.data() + i * 4, &v, 4);
    }
    return c;
}

PutSparseRequest Request(const std::string& tensor, const Coo& coo, Index rows, Index cols) {
    PutSparseRequest r;
    r.tensor_id = tensor;
    r.global_shape = {rows, cols};
    r.indices = {DType::kInt64, {Index(coo.nnz), 2}, coo.indices};
    r.values = {DType::kFloat32, {Index(coo.nnz)}, coo.values};
    r.placement_policy = *PlacementPolicy::Parse("replicate(ep)");
    r.generation = {0, 1};
    r.encode.num_threads = 1;
    return r;
}

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

EncodedMembers Members(const SparseObject& o) {
    return {o.indices,          o.values,          Bytes(o.tile_coords), Bytes(o.tile_ptr),
            o.checksum_indices, o.checksum_values, o.checksum_tile_coords, o.checksum_tile_ptr};
}

std::vector<TargetDescriptor> EpTpTargets(const std::string& tensor, Index rows, Index cols,
                                          int ep, int tp) {
    std::vector<TargetDescriptor> out;
    for (int e = 0; e < ep; ++e) {
        for (int t = 0; t < tp; ++t) {
            auto axes = NamedAxes::Make({{"ep", e}, {"tp", t}});
            auto target = TargetDescriptor::Make(
                "rank" + std::to_string(e * tp + t), "node0", tensor, *axes,
                {Index(t) * (rows / tp), 0}, {rows / tp, cols});
            out.push_back(*target);
        }
    }
    return out;
}

TEST_F(NodeServerTest, SparseCommitManifestAndReadMatchTheEmbeddedStore) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const Coo coo = RandomCoo(256, 512, 3000, 7);
    auto object = BuildSourceObject(Request("w", coo, 256, 512));
    ASSERT_TRUE(object.ok()) << object.status().ToString();
    auto commit = client->CommitSparseObject(object->desc, "global", Members(*object), true);
    ASSERT_TRUE(commit.ok()) << commit.status().ToString();
    EXPECT_TRUE(commit->created);
    EXPECT_EQ(commit->nnz, 3000u);
    // Idempotent retry.
    auto again = client->CommitSparseObject(object->desc, "global", Members(*object), true);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->created);
    EXPECT_EQ(again->source_ref, commit->source_ref);
    auto head = client->CurrentGeneration("w");
    ASSERT_TRUE(head.ok() && head->has_value());
    EXPECT_EQ(**head, (Generation{0, 1}));

    auto manifest = client->Manifest({0, 1});
    ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
    ASSERT_EQ(manifest->size(), 1u);
    const auto targets = EpTpTargets("w", 256, 512, 2, 2);
    auto objects = client->ReadSparseObjects(*manifest, targets, {});
    ASSERT_TRUE(objects.ok()) << objects.status().ToString();
    ASSERT_EQ(objects->size(), 4u);

    // The same on an embedded store.
    SparseStore embedded(MakeEmbeddedStore());
    ASSERT_TRUE(embedded.PutSparseObject(Request("w", coo, 256, 512)).ok());
    auto em = embedded.Manifest({0, 1});
    auto expected = embedded.ReadSparseObjects(*em, targets);
    ASSERT_TRUE(expected.ok());
    for (std::size_t i = 0; i < 4; ++i) {
        const LeasedTargetObject& got = (*objects)[i];
        const TargetObject& want = (*expected)[i];
        EXPECT_EQ(got.target_id, want.target_id);
        EXPECT_EQ(got.desc.nnz, want.object.desc.nnz);
        EXPECT_EQ(got.coordinate_space, "local");
        EXPECT_TRUE(std::equal(got.indices.begin(), got.indices.end(),
                               want.object.indices.begin(), want.object.indices.end()));
        EXPECT_TRUE(std::equal(got.values.begin(), got.values.end(), want.object.values.begin(),
                               want.object.values.end()));
        EXPECT_EQ(got.checksum_values, want.object.checksum_values);
    }
    EXPECT_EQ(server_->store().Stats().leases, 4u);
    objects->clear();
    ASSERT_OK(client->FlushReleases());
    EXPECT_EQ(server_->store().Stats().leases, 0u);

    auto metrics = client->Metrics();
    ASSERT_TRUE(metrics.ok());
    std::map<std::string, double> m(metrics->begin(), metrics->end());
    EXPECT_EQ(m["source_objects_put"], 1);
    EXPECT_EQ(m["full_gets"], 0);
    EXPECT_EQ(m["target_objects_published"], 4);
    EXPECT_EQ(m["range_gets"], 2);  // two TP boxes, each read once for both EP replicas
    EXPECT_EQ(m["cuda_ipc_available"], 0);
    EXPECT_GT(m["shm_capacity_bytes"], 0);
    // Every request type served is counted and timed; the one in flight (Metrics) is not yet.
    EXPECT_EQ(m["requests_sparse_read"], 1);
    EXPECT_GT(m["request_sparse_read_seconds"], 0);
    EXPECT_EQ(m["requests_hello"], 1);
    EXPECT_EQ(m.count("requests_metrics"), 0u);
    EXPECT_EQ(m.count("requests_sparse_read_plan"), 0u);  // none served: not listed
    EXPECT_GT(m["reply_seconds"], 0);
    double types = 0;
    for (const auto& [name, value] : m) {
        if (name.starts_with("requests_")) types += value;
    }
    EXPECT_EQ(types, m["requests"] - 1);  // all but the Metrics call in flight
    // The client's time in its calls holds the daemon's time in them.
    const NodeClientStats stats = client->Stats();
    EXPECT_GT(stats.call_seconds, m["request_sparse_read_seconds"]);
    EXPECT_EQ(stats.device_commit_gather_seconds, 0);

    // A second read is served by the daemon's caches; after ClearCaches it reads again.
    ASSERT_TRUE(client->Metrics(/*reset=*/true).ok());
    ASSERT_TRUE(client->ReadSparseObjects(*manifest, targets, {}).ok());
    auto cached = client->Metrics();
    std::map<std::string, double> c(cached->begin(), cached->end());
    EXPECT_EQ(c["range_gets"], 0);
    EXPECT_EQ(c["index_gets"], 0);
    ASSERT_OK(client->ClearCaches());
    ASSERT_TRUE(client->Metrics(/*reset=*/true).ok());
    ASSERT_TRUE(client->ReadSparseObjects(*manifest, targets, {}).ok());
    auto cleared = client->Metrics();
    std::map<std::string, double> d(cleared->begin(), cleared->end());
    EXPECT_EQ(d["range_gets"], 2);
    EXPECT_EQ(d["index_gets"], 1);
}

TEST_F(NodeServerTest, SparseCommitIsValidatedAgainByTheDaemon) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const Coo coo = RandomCoo(64, 64, 200, 3);
    auto object = BuildSourceObject(Request("v", coo, 64, 64));
    ASSERT_TRUE(object.ok());

    EncodedMembers bad_sum = Members(*object);
    bad_sum.checksum_values ^= 1;
    EXPECT_THAT(client->CommitSparseObject(object->desc, "global", bad_sum, true),
                StatusIs(StatusCode::kDataLoss));

    // Entries out of order: the rebuilt tile index differs from the one sent.
    SparseObject shuffled = *object;
    const std::size_t entry = DTypeSize(shuffled.desc.index_dtype) * 2;
    std::swap_ranges(shuffled.indices.begin(), shuffled.indices.begin() + entry,
                     shuffled.indices.end() - entry);
    UpdateChecksums(shuffled);
    auto s = client->CommitSparseObject(shuffled.desc, "global", Members(shuffled), true);
    EXPECT_FALSE(s.ok());

    // A coordinate outside the tensor.
    SparseObject outside = *object;
    std::uint16_t big = 999;
    std::memcpy(outside.indices.data() + outside.indices.size() - 2, &big, 2);
    UpdateChecksums(outside);
    EXPECT_THAT(client->CommitSparseObject(outside.desc, "global", Members(outside), true),
                StatusIs(StatusCode::kInvalidArgument));

    // Sizes that do not match the descriptor.
    EncodedMembers short_values = Members(*object);
    short_values.values = short_values.values.subspan(4);
    EXPECT_THAT(client->CommitSparseObject(object->desc, "global", short_values, true),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(client->CommitSparseObject(object->desc, "local", Members(*object), true),
                StatusIs(StatusCode::kInvalidArgument));

    // Nothing of the above is visible.
    auto keys = client->List("");
    ASSERT_TRUE(keys.ok());
    EXPECT_TRUE(keys->empty());
    ASSERT_TRUE(client->CommitSparseObject(object->desc, "global", Members(*object), true).ok());
}

/// The daemon's metric `name` (0 when absent).
double DaemonMetric(NodeClient& client, std::string_view name) {
    auto items = client.Metrics();
    EXPECT_TRUE(items.ok()) << items.status().ToString();
    if (!items.ok()) return 0;
    for (const auto& [key, value] : *items) {
        if (key == name) return value;
    }
    return 0;
}

/// A batch of canonical objects is copied from the client's buffer straight into the store and
/// checked there; a batch with one object that differs from what its client says goes through
/// the checked path instead, where that object fails alone and the others commit.
TEST_F(NodeServerTest, BatchCommitsLandInPlaceAndABadObjectFailsAlone) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    std::vector<Coo> coos;
    std::vector<PutSparseRequest> requests;
    std::vector<std::optional<SparseObject>> objects;
    for (int i = 0; i < 3; ++i) coos.push_back(RandomCoo(64, 64, 200 + 10 * i, 10 + i));
    for (int i = 0; i < 3; ++i) {
        requests.push_back(Request("t" + std::to_string(i), coos[i], 64, 64));
        auto built = BuildSourceObject(requests.back());
        ASSERT_TRUE(built.ok()) << built.status().ToString();
        objects.emplace_back(std::move(built).value());
    }
    const std::size_t chunk[] = {0, 1, 2};
    const double before = DaemonMetric(*client, "sparse_commit_in_place_items");

    // Object 1's values do not match its checksum (as if its client wrote them mid-commit),
    // object 2's entries are out of order (their tile index is not the one sent).
    std::vector<std::optional<SparseObject>> bad = objects;
    bad[1]->values[0] ^= std::byte{1};
    const std::size_t entry = DTypeSize(bad[2]->desc.index_dtype) * 2;
    std::swap_ranges(bad[2]->indices.begin(), bad[2]->indices.begin() + entry,
                     bad[2]->indices.end() - entry);
    UpdateChecksums(*bad[2]);
    std::vector<Result<CommitResult>> out(3, Internal("unset"));
    ASSERT_OK(client->CommitChunk(requests, bad, chunk, out));
    EXPECT_TRUE(out[0].ok()) << out[0].status().ToString();
    EXPECT_THAT(out[1], StatusIs(StatusCode::kDataLoss));
    EXPECT_FALSE(out[2].ok());
    EXPECT_EQ(DaemonMetric(*client, "sparse_commit_in_place_items"), before);
    auto first = client->Manifest({0, 1});
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_EQ(first->size(), 1u);  // nothing of the failed objects is visible
    EXPECT_EQ((*first)[0].tensor_id, "t0");

    // A good batch (three more tensors) lands in place, and reads back exactly.
    for (int i = 0; i < 3; ++i) requests[i] = Request("u" + std::to_string(i), coos[i], 64, 64);
    for (int i = 0; i < 3; ++i) {
        auto built = BuildSourceObject(requests[i]);
        ASSERT_TRUE(built.ok());
        objects[i] = std::move(built).value();
    }
    out.assign(3, Internal("unset"));
    ASSERT_OK(client->CommitChunk(requests, objects, chunk, out));
    for (const auto& r : out) EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(DaemonMetric(*client, "sparse_commit_in_place_items"), before + 3);
    auto manifest = client->Manifest({0, 1});
    ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
    ASSERT_EQ(manifest->size(), 4u);
    for (int i = 0; i < 3; ++i) {
        const auto targets = EpTpTargets("u" + std::to_string(i), 64, 64, 1, 1);
        auto read = client->ReadSparseObjects(*manifest, targets, {});
        ASSERT_TRUE(read.ok()) << read.status().ToString();
        ASSERT_EQ(read->size(), 1u);
        const LeasedTargetObject& got = (*read)[0];
        EXPECT_EQ(got.desc.nnz, objects[i]->desc.nnz);
        EXPECT_TRUE(std::equal(got.values.begin(), got.values.end(), objects[i]->values.begin(),
                               objects[i]->values.end()));
        EXPECT_TRUE(std::equal(got.indices.begin(), got.indices.end(),
                               objects[i]->indices.begin(), objects[i]->indices.end()));
    }
}

TEST_F(NodeServerTest, ConcurrentClientsReadEachUniqueRangeOnceForTheNode) {
    // 8 clients, one target each (EP2 x TP4 of one non-EP weight), all at once: the daemon's
    // single-flight table and range cache make each unique range one physical read.
    constexpr int kClients = 8;
    const Coo coo = RandomCoo(512, 256, 20000, 11);
    {
        auto writer = Client(socket_);
        ASSERT_NE(writer, nullptr);
        auto object = BuildSourceObject(Request("shared", coo, 512, 256));
        ASSERT_TRUE(object.ok());
        ASSERT_TRUE(writer->CommitSparseObject(object->desc, "global", Members(*object), true).ok());
        // The commit cached the tile index; the readers race for it as for the ranges.
        ASSERT_OK(writer->ClearCaches());
        ASSERT_TRUE(writer->Metrics(/*reset=*/true).ok());
    }
    const auto targets = EpTpTargets("shared", 512, 256, 2, 4);
    std::vector<std::shared_ptr<NodeClient>> clients;
    for (int i = 0; i < kClients; ++i) clients.push_back(Client(socket_));
    std::latch start(kClients);
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i) {
        threads.emplace_back([&, i] {
            auto manifest = clients[i]->Manifest({0, 1});
            start.arrive_and_wait();
            if (!manifest.ok()) return;
            auto objs = clients[i]->ReadSparseObjects(*manifest, std::span(&targets[i], 1), {});
            if (objs.ok() && objs->size() == 1) ok.fetch_add(1);
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), kClients);
    auto metrics = clients[0]->Metrics();
    ASSERT_TRUE(metrics.ok());
    std::map<std::string, double> m(metrics->begin(), metrics->end());
    EXPECT_EQ(m["index_gets"], 1);
    EXPECT_EQ(m["range_gets"], 4);  // one per TP box
    EXPECT_EQ(m["range_bytes_read"], double(coo.nnz) * (2 * 2 + 4));  // every entry once
    EXPECT_EQ(m["range_gets"] + m["range_cache_hits"] + m["single_flight_waits"], kClients);
    EXPECT_EQ(m["target_objects_published"], kClients);
}

TEST_F(NodeServerTest, ReadsInPlaceBuildTheSameTargetsFromTheSegments) {
    // --read_in_place: each read views its ranges in the segments instead of copying them into
    // the range cache; the targets are those of the copying read, byte for byte.
    NodeServerOptions options = SmallServer(dir_.Path("in_place.sock"));
    options.read_in_place = true;
    auto in_place_server = NodeServer::Start(options);
    ASSERT_TRUE(in_place_server.ok()) << in_place_server.status().ToString();
    const Coo coo = RandomCoo(512, 256, 20000, 12);
    const auto targets = EpTpTargets("w", 512, 256, 2, 4);
    std::vector<std::vector<LeasedTargetObject>> reads;
    std::vector<std::map<std::string, double>> metrics;
    for (const std::string& socket : {socket_, options.socket_path}) {
        auto client = Client(socket);
        ASSERT_NE(client, nullptr);
        auto object = BuildSourceObject(Request("w", coo, 512, 256));
        ASSERT_TRUE(object.ok());
        ASSERT_TRUE(client->CommitSparseObject(object->desc, "global", Members(*object), true).ok());
        auto manifest = client->Manifest({0, 1});
        ASSERT_TRUE(manifest.ok());
        ASSERT_TRUE(client->Metrics(/*reset=*/true).ok());
        for (int pass = 0; pass < 2; ++pass) {  // the second pass: cached, or viewed again
            auto objs = client->ReadSparseObjects(*manifest, targets, {});
            ASSERT_TRUE(objs.ok()) << objs.status().ToString();
            ASSERT_EQ(objs->size(), targets.size());
            if (pass == 0) reads.push_back(std::move(objs).value());
        }
        auto m = client->Metrics();
        ASSERT_TRUE(m.ok());
        metrics.emplace_back(m->begin(), m->end());
    }
    for (std::size_t i = 0; i < targets.size(); ++i) {
        const LeasedTargetObject& copied = reads[0][i];
        const LeasedTargetObject& viewed = reads[1][i];
        EXPECT_EQ(viewed.desc.nnz, copied.desc.nnz);
        EXPECT_TRUE(std::equal(viewed.indices.begin(), viewed.indices.end(),
                               copied.indices.begin(), copied.indices.end()));
        EXPECT_TRUE(std::equal(viewed.values.begin(), viewed.values.end(),
                               copied.values.begin(), copied.values.end()));
        EXPECT_EQ(viewed.checksum_values, copied.checksum_values);
    }
    // Copying: 4 TP boxes read once, then served by the cache. In place: viewed in both passes.
    EXPECT_EQ(metrics[0]["range_gets"], 4);
    EXPECT_EQ(metrics[0]["range_cache_hits"], 4);
    EXPECT_EQ(metrics[1]["range_gets"], 8);
    EXPECT_EQ(metrics[1]["range_cache_hits"], 0);
    EXPECT_EQ(metrics[1]["full_gets"], 0);
    EXPECT_EQ(metrics[1]["target_objects_published"], 2 * targets.size());
    (*in_place_server)->Stop();
}

// ---------------------------------------------------------------------------------------------
// Hostile input on a raw connection.
// ---------------------------------------------------------------------------------------------

class RawPeer {
public:
    explicit RawPeer(const std::string& socket) {
        auto c = UnixConnection::Connect(socket);
        EXPECT_TRUE(c.ok()) << c.status().ToString();
        if (c.ok()) conn_ = std::move(c).value();
    }
    Status Send(std::span<const std::byte> frame, std::span<const int> fds = {}) {
        return conn_.SendFrame(frame, fds, Deadline::After(2s));
    }
    Result<wire::Frame> Receive(std::vector<UniqueFd>* fds = nullptr) {
        auto bytes = conn_.RecvFrame(wire::kMaxFrameBytes, fds, Deadline::After(5s),
                                     wire::kMaxSegments);
        if (!bytes.ok()) return bytes.status();
        storage_ = std::move(bytes).value();
        return wire::DecodeFrame(storage_);
    }
    template <typename M>
    Status Request(const M& message, std::span<const int> fds = {},
                   std::vector<UniqueFd>* rfds = nullptr) {
        auto frame = wire::EncodeFrame(message, ++id_);
        if (!frame.ok()) return frame.status();
        MCS_RETURN_IF_ERROR(Send(*frame, fds));
        std::vector<UniqueFd> received;  // Hello's segment fds, unless the caller wants them.
        MCS_ASSIGN_OR_RETURN(wire::Frame reply, Receive(rfds ? rfds : &received));
        if (reply.header.type == wire::MessageType::kError) {
            auto err = wire::DecodePayloadAs<wire::ErrorReply>(reply.payload);
            return err.ok() ? err->ToStatus() : err.status();
        }
        return Status::Ok();
    }
    /// A request and its typed reply.
    template <typename Reply, typename M>
    Result<Reply> Call(const M& message) {
        auto frame = wire::EncodeFrame(message, ++id_);
        if (!frame.ok()) return frame.status();
        MCS_RETURN_IF_ERROR(Send(*frame));
        MCS_ASSIGN_OR_RETURN(wire::Frame reply, Receive());
        return wire::DecodeReplyAs<Reply>(reply);
    }
    UnixConnection& conn() { return conn_; }

private:
    UnixConnection conn_;
    std::vector<std::byte> storage_;
    std::uint64_t id_ = 0;
};

TEST_F(NodeServerTest, RequestsBeforeHelloAreRefused) {
    RawPeer peer(socket_);
    EXPECT_THAT(peer.Request(wire::StatRequest{"k"}), StatusIs(StatusCode::kFailedPrecondition));
    std::vector<UniqueFd> fds;
    EXPECT_OK(peer.Request(wire::HelloRequest{}, {}, &fds));
    EXPECT_EQ(fds.size(), 2u);  // one read-only fd per segment
    EXPECT_THAT(peer.Request(wire::StatRequest{"k"}), StatusIs(StatusCode::kNotFound));
    // Segment fds are read-only: no writable mapping of daemon memory.
    EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0),
              MAP_FAILED);
}

/// A read by a step's generation takes the daemon's own manifest of a sealed step only: a step
/// that is not sealed, a fold, or an unknown step is a typed error, and the connection serves
/// on.
TEST_F(NodeServerTest, ReadsByStepNeedASealedStep) {
    RawPeer peer(socket_);
    ASSERT_OK(peer.Request(wire::HelloRequest{}));
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const std::vector<std::int64_t> idx = {1, 2, 3, 4};
    const std::vector<float> val = {1.0f, 2.0f};
    PutSparseRequest req;
    req.tensor_id = "w";
    req.global_shape = {8, 8};
    req.generation = {0, 1};
    req.indices = {DType::kInt64, {2, 2}, std::as_bytes(std::span(idx))};
    req.values = {DType::kFloat32, {2}, std::as_bytes(std::span(val))};
    ASSERT_OK(client->PutSparseObject(req).status());
    const TargetDescriptor target =
        *TargetDescriptor::Make("r0", "node0", "w", *NamedAxes::Make({}), {0, 0}, {8, 8});
    wire::SparseReadStepRequest read;
    read.step = {0, 1};
    read.targets = {target};
    EXPECT_THAT(peer.Request(read), StatusIs(StatusCode::kFailedPrecondition));  // not sealed
    read.step = {0, 2};
    EXPECT_THAT(peer.Request(read), StatusIs(StatusCode::kInvalidArgument));  // a fold
    read.step = {5, 6};
    EXPECT_FALSE(peer.Request(read).ok());  // never committed: not sealed either
    ASSERT_OK(client->SealGeneration({0, 1}, std::vector<std::string>{"w"}));
    read.step = {0, 1};
    auto reply = peer.Call<wire::SparseReadReply>(read);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_EQ(reply->objects.size(), 1u);
    EXPECT_EQ(reply->objects[0].nnz, 2u);
    // The same objects as a read of the manifest the daemon returns for it.
    const ReadOptions options;
    auto by_step = client->ReadSealedStepViews({0, 1}, std::span(&target, 1), options);
    ASSERT_TRUE(by_step.ok()) << by_step.status().ToString();
    auto manifest = client->GetManifest({0, 1});
    ASSERT_TRUE(manifest.ok());
    auto sent = client->ReadViews(StepManifestView(*manifest), std::span(&target, 1), options);
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
    ASSERT_EQ(by_step->size(), 1u);
    ASSERT_EQ(sent->size(), 1u);
    EXPECT_EQ((*by_step)[0].desc.nnz, (*sent)[0].desc.nnz);
    EXPECT_TRUE(std::equal((*by_step)[0].indices.begin(), (*by_step)[0].indices.end(),
                           (*sent)[0].indices.begin(), (*sent)[0].indices.end()));
}

/// A planned read's targets, kept per connection under the id the request names: sent once,
/// then named; unknown ids (never sent, another connection's, dropped as the least recently
/// used) are NotFound, and a client sends its targets again when told so.
/// Step (0, 1) of one 8x8 tensor "w" (entries at rows 1, 3 and 6), sealed; its targets: the
/// two 4-row halves.
std::vector<TargetDescriptor> PutAndSealTwoHalves(NodeClient& client) {
    const std::vector<std::int64_t> idx = {1, 2, 3, 4, 6, 7};
    const std::vector<float> val = {1.0f, 2.0f, 3.0f};
    PutSparseRequest put;
    put.tensor_id = "w";
    put.global_shape = {8, 8};
    put.generation = {0, 1};
    put.indices = {DType::kInt64, {3, 2}, std::as_bytes(std::span(idx))};
    put.values = {DType::kFloat32, {3}, std::as_bytes(std::span(val))};
    EXPECT_OK(client.PutSparseObject(put).status());
    EXPECT_OK(client.SealGeneration({0, 1}, std::vector<std::string>{"w"}));
    return {*TargetDescriptor::Make("r0", "node0", "w", *NamedAxes::Make({}), {0, 0}, {4, 8}),
            *TargetDescriptor::Make("r1", "node0", "w", *NamedAxes::Make({}), {4, 0}, {4, 8})};
}

TEST_F(NodeServerTest, APlannedReadsTargetsAreKeptPerConnection) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const std::vector<TargetDescriptor> targets = PutAndSealTwoHalves(*client);

    RawPeer peer(socket_);
    ASSERT_OK(peer.Request(wire::HelloRequest{}));
    wire::SparseReadPlanRequest plan;
    plan.step = {0, 1};
    plan.sealed_entries = 1;
    plan.target_set = 5;
    EXPECT_THAT(peer.Request(plan),
                StatusIsWithMessage(StatusCode::kNotFound, "keeps no targets under id 5"));
    plan.targets = targets;
    auto sent = peer.Call<wire::SparseReadPlanReply>(plan);
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
    ASSERT_EQ(sent->targets.size(), 2u);
    EXPECT_EQ(sent->targets[0].pieces + sent->targets[1].pieces, 2u);
    plan.targets.clear();
    auto named = peer.Call<wire::SparseReadPlanReply>(plan);
    ASSERT_TRUE(named.ok()) << named.status().ToString();
    EXPECT_EQ(named->ranges, sent->ranges);
    EXPECT_EQ(named->pieces, sent->pieces);
    EXPECT_EQ(named->targets, sent->targets);
    auto metrics = client->Metrics(false);
    ASSERT_TRUE(metrics.ok());
    const auto kept = [&](const MetricItems& m) {
        for (const auto& [name, value] : m) {
            if (name == "planned_reads_kept_targets") return value;
        }
        ADD_FAILURE() << "no planned_reads_kept_targets metric";
        return -1.0;
    };
    EXPECT_EQ(kept(*metrics), 1);

    // Another connection keeps its own.
    RawPeer other(socket_);
    ASSERT_OK(other.Request(wire::HelloRequest{}));
    EXPECT_THAT(other.Request(plan), StatusIs(StatusCode::kNotFound));
    // Sets beyond what a connection keeps push out the least recently used.
    plan.targets = {targets[0]};
    for (std::uint64_t id = 100; id < 100 + wire::kMaxKeptTargetSets; ++id) {
        plan.target_set = id;
        ASSERT_OK(peer.Request(plan));
    }
    plan.targets.clear();
    plan.target_set = 100 + wire::kMaxKeptTargetSets - 1;
    EXPECT_OK(peer.Request(plan));
    plan.target_set = 5;
    EXPECT_THAT(peer.Request(plan), StatusIs(StatusCode::kNotFound));

    // A client sends its targets on its first read and names them on the next ones; more sets
    // than the daemon keeps, read in turns, are sent again as needed and read the same.
    testing::HostBuild build;
    auto manifest = client->GetManifest({0, 1});
    ASSERT_TRUE(manifest.ok());
    std::vector<std::uint64_t> nnz;
    for (int read = 0; read < 3; ++read) {
        auto got = client->ReadPlannedSealedStep(*manifest, targets, {}, std::ref(build));
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        ASSERT_EQ(got->size(), 2u);
        nnz.push_back((*got)[0].desc.nnz + 10 * (*got)[1].desc.nnz);
    }
    EXPECT_EQ(nnz, (std::vector<std::uint64_t>(3, 2 + 10 * 1)));  // rows 1 and 3; row 6
    metrics = client->Metrics(false);
    ASSERT_TRUE(metrics.ok());
    EXPECT_EQ(kept(*metrics), 4);  // the raw peer's two, the client's second and third reads
    for (int round = 0; round < 2; ++round) {
        for (std::size_t k = 0; k < wire::kMaxKeptTargetSets + 3; ++k) {
            const std::vector<TargetDescriptor> one = {*TargetDescriptor::Make(
                "k" + std::to_string(k), "node0", "w", *NamedAxes::Make({}), {0, 0}, {8, 8})};
            auto got = client->ReadPlannedSealedStep(*manifest, one, {}, std::ref(build));
            ASSERT_TRUE(got.ok()) << got.status().ToString();
            ASSERT_EQ(got->size(), 1u);
            EXPECT_EQ((*got)[0].desc.nnz, 3u);
        }
    }
}

/// A device commit whose members the daemon cannot reach: each update fails alone with its
/// typed error (its sizes first, then the CUDA mapping of the request's memory), nothing is
/// committed, and the connection and the daemon go on serving.
TEST_F(NodeServerTest, DeviceCommitsThatCannotBeMappedFailEachUpdateAlone) {
    RawPeer peer(socket_);
    ASSERT_OK(peer.Request(wire::HelloRequest{}));
    const auto member = [](DType dtype, Shape shape, std::uint64_t offset, std::uint64_t bytes) {
        return wire::DeviceMember{dtype, std::move(shape), offset, bytes};
    };
    wire::DeviceUpdate good;
    good.tensor_id = "w";
    good.global_shape = {64, 64};
    good.generation = {0, 1};
    good.indices = member(DType::kUInt8, {10, 2}, 0, 20);
    good.values = member(DType::kFloat32, {10}, 64, 40);
    wire::DeviceUpdate sized = good;
    sized.tensor_id = "v";
    sized.values = member(DType::kFloat32, {10}, 128, 44);  // shape says 40 bytes
    wire::SparseCommitDeviceRequest req;
    req.memory.ref.kind = wire::BufferKind::kCudaIpc;
    req.memory.ref.offset = 0;
    req.memory.ref.size = 256;
    req.memory.ref.cuda_ipc_handle.assign(wire::kCudaIpcHandleBytes, '\x11');
    req.memory.ref.device = 0;
    req.memory.cuda_base = std::uint64_t{1} << 40;
    req.memory.cuda_alloc_size = 64 << 20;
    req.items = {good, sized};
    auto reply = peer.Call<wire::SparseCommitBatchReply>(req);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_EQ(reply->items.size(), 2u);
    // No CUDA here: Unimplemented; with CUDA, a handle that opens nothing is InvalidArgument.
    EXPECT_TRUE(reply->items[0].code == int(StatusCode::kUnimplemented) ||
                reply->items[0].code == int(StatusCode::kInvalidArgument))
        << reply->items[0].message;
    EXPECT_EQ(reply->items[1].code, int(StatusCode::kInvalidArgument)) << reply->items[1].message;
    EXPECT_NE(reply->items[1].message.find("sent as 44 bytes"), std::string::npos)
        << reply->items[1].message;
    // A request whose member lies outside its memory (the last item's values grown on the
    // wire to 200 bytes at offset 128 of 256) is refused whole, typed; the connection goes on
    // serving.
    {
        auto frame = wire::EncodeFrame(req, 99);
        ASSERT_TRUE(frame.ok()) << frame.status().ToString();
        std::vector<std::byte> bytes = std::move(frame).value();
        ASSERT_EQ(std::to_integer<int>(bytes[bytes.size() - 8]), 44);
        bytes[bytes.size() - 8] = std::byte{200};
        ASSERT_OK(peer.Send(bytes));
        auto answer = peer.Receive();
        ASSERT_TRUE(answer.ok()) << answer.status().ToString();
        EXPECT_THAT(wire::DecodeReplyAs<wire::SparseCommitBatchReply>(*answer),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "outside the 256 bytes"));
    }
    // Nothing committed; the connection still serves.
    auto manifest = peer.Call<wire::SparseManifestReply>(wire::SparseManifestRequest{{0, 1}});
    ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
    EXPECT_TRUE(manifest->sources.empty());
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    EXPECT_FALSE(client->CanCommitFromDevice() && !cuda::GetSupport().ipc_available);
    // The client side refuses the same way when it cannot reach CUDA: typed, per update.
    if (!cuda::GetSupport().available) {
        EXPECT_FALSE(client->CanCommitFromDevice());
        std::vector<PutSparseRequest> requests(2);
        requests[0].tensor_id = "w";
        requests[0].global_shape = {64, 64};
        requests[1] = requests[0];
        const std::vector<NodeClient::DeviceMember> idx(2, {DType::kUInt8, {10, 2}, {4096, 20, 0}});
        const std::vector<NodeClient::DeviceMember> val(2, {DType::kFloat32, {10}, {8192, 40, 0}});
        const auto out = client->PutSparseObjectsFromDevice(requests, idx, val, 0);
        ASSERT_EQ(out.size(), 2u);
        for (const auto& r : out) EXPECT_THAT(r, StatusIs(StatusCode::kUnimplemented));
    }
}

/// Leased members copied into a client's CUDA memory: each item is checked (a lease of this
/// connection, a member of its object, inside the destination) before the destination is
/// mapped, and a refused request writes nothing and leaves the connection serving.
TEST_F(NodeServerTest, LeasesToDeviceChecksEveryItemFirst) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const auto a = Pattern(3000, 1);
    std::vector<MemberData> members = {{"indices", DType::kUInt16, {1500}, a, 11}};
    ASSERT_OK(client->Put("k", "meta", members, {PutMode::kCreate, false}));
    RawPeer peer(socket_);
    ASSERT_OK(peer.Request(wire::HelloRequest{}));
    auto lease = peer.Call<wire::LeaseReply>(wire::LeaseRequest{"k"});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    wire::LeasesToDeviceRequest req;
    req.destination = UnopenableCudaDestination(4096);
    const auto ask = [&](wire::LeaseMemberCopy item) {
        req.items = {item};
        return peer.Request(req);
    };
    EXPECT_THAT(ask({lease->lease_id + 1000, "indices", 0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "not held by this connection"));
    EXPECT_THAT(ask({lease->lease_id, "values", 0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "no member 'values'"));
    EXPECT_THAT(ask({lease->lease_id, "indices", 2000}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "run past the destination"));
    // A well-formed copy reaches the mapping: no CUDA here; with CUDA, a handle that opens
    // nothing.
    const Status mapped = ask({lease->lease_id, "indices", 1000});
    EXPECT_TRUE(mapped.code() == StatusCode::kUnimplemented ||
                mapped.code() == StatusCode::kInvalidArgument)
        << mapped.ToString();
    // A destination outside CUDA memory does not decode.
    req.destination = {wire::BufferRef::Client(0, 4096), 0, 0, ""};
    req.items = {{lease->lease_id, "indices", 0}};
    EXPECT_THAT(peer.Request(req), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_OK(peer.Request(wire::StatRequest{"k"}));
    // The client refuses reads it cannot copy this way, typed.
    if (!cuda::GetSupport().ipc_available) {
        TargetObjectView v;
        v.target_id = "t";
        const TargetObjectView* views[] = {&v};
        EXPECT_THAT(client->CopyViewsToDevice(views, 0, 0), StatusIs(StatusCode::kUnimplemented));
    }
}

/// A planned read may ask for its ranges to be copied to the client's device as they are
/// planned (to_device). A daemon that cannot (no CUDA here; with CUDA, a handle that opens
/// nothing), or whose layout would not fit the destination, plans the read all the same and
/// says it copied nothing (no staged_at): the client then asks for the copies. A malformed
/// destination does not decode.
TEST_F(NodeServerTest, APlannedReadThatCannotStageItsRangesIsPlannedAllTheSame) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const std::vector<TargetDescriptor> targets = PutAndSealTwoHalves(*client);
    RawPeer peer(socket_);
    ASSERT_OK(peer.Request(wire::HelloRequest{}));
    wire::SparseReadPlanRequest plan;
    plan.step = {0, 1};
    plan.sealed_entries = 1;
    plan.targets = targets;
    auto plain = peer.Call<wire::SparseReadPlanReply>(plan);
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    EXPECT_TRUE(plain->staged_at.empty());
    ASSERT_EQ(plain->ranges.size(), 2u);  // a range per half

    wire::PlanToDevice& to = plan.to_device.emplace();
    to.destination = UnopenableCudaDestination(4096);
    to.ready_event.assign(wire::kCudaIpcHandleBytes, '\x33');
    for (const std::uint64_t room : {std::uint64_t{4096}, std::uint64_t{1}}) {
        to.destination.ref.size = room;  // 1: the layout does not fit
        auto staged = peer.Call<wire::SparseReadPlanReply>(plan);
        ASSERT_TRUE(staged.ok()) << staged.status().ToString();
        EXPECT_TRUE(staged->staged_at.empty());
        EXPECT_EQ(staged->ranges, plain->ranges);
        EXPECT_EQ(staged->pieces, plain->pieces);
        EXPECT_EQ(staged->targets, plain->targets);
        // Its leases are the connection's like any planned read's.
        wire::ReleaseRequest release;
        for (const wire::PlannedSource& ps : staged->sources) release.lease_ids.push_back(ps.lease_id);
        EXPECT_OK(peer.Request(release));
    }
    EXPECT_EQ(DaemonMetric(*client, "planned_reads_staged"), 0);
    EXPECT_EQ(DaemonMetric(*client, "planned_reads"), 3);

    to.ready_event.assign(10, '\x33');
    EXPECT_THAT(peer.Request(plan), StatusIsWithMessage(StatusCode::kInvalidArgument, "ready event"));
    to.ready_event.clear();
    to.destination = {wire::BufferRef::Client(0, 4096), 0, 0, ""};
    EXPECT_THAT(peer.Request(plan),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "not in CUDA memory"));
    EXPECT_EQ(DaemonMetric(*client, "planned_reads"), 3);
}

/// Byte ranges of leased members (a planned read's ranges) copied into a client's CUDA memory:
/// each item is checked (a lease of this connection, a member of its object, bytes inside the
/// member and inside the destination) before the destination is mapped.
TEST_F(NodeServerTest, LeaseRangesToDeviceChecksEveryItemFirst) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    const auto a = Pattern(3000, 1);
    std::vector<MemberData> members = {{"indices", DType::kUInt16, {1500}, a, 11}};
    ASSERT_OK(client->Put("k", "meta", members, {PutMode::kCreate, false}));
    RawPeer peer(socket_);
    ASSERT_OK(peer.Request(wire::HelloRequest{}));
    auto lease = peer.Call<wire::LeaseReply>(wire::LeaseRequest{"k"});
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    wire::LeaseRangesToDeviceRequest req;
    req.destination = UnopenableCudaDestination(4096);
    const auto ask = [&](std::vector<wire::LeaseRangeCopy> items) {
        req.items = std::move(items);
        return peer.Request(req);
    };
    const std::uint64_t id = lease->lease_id;
    EXPECT_THAT(ask({{id + 1000, 0, 0, 16, 0}}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "not held by this connection"));
    EXPECT_THAT(ask({{id, 1, 0, 16, 0}}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "no member 1"));
    EXPECT_THAT(ask({{id, 0, 2990, 16, 0}}),
                StatusIsWithMessage(StatusCode::kOutOfRange, "run past the member"));
    EXPECT_THAT(ask({{id, 0, ~std::uint64_t{0}, 16, 0}}),
                StatusIsWithMessage(StatusCode::kOutOfRange, "run past the member"));
    EXPECT_THAT(ask({{id, 0, 0, 3000, 2000}}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "run past the destination"));
    // The first bad item fails the request, even after good ones.
    EXPECT_THAT(ask({{id, 0, 0, 100, 0}, {id, 0, 100, 3000, 200}}),
                StatusIsWithMessage(StatusCode::kOutOfRange, "item 1"));
    // A well-formed copy reaches the mapping: no CUDA here; with CUDA, a handle that opens
    // nothing.
    const Status mapped = ask({{id, 0, 16, 1000, 64}, {id, 0, 2000, 1000, 2064}});
    EXPECT_TRUE(mapped.code() == StatusCode::kUnimplemented ||
                mapped.code() == StatusCode::kInvalidArgument)
        << mapped.ToString();
    // A ready event handle of the wrong size does not decode; one of the right size that opens
    // nothing is checked no earlier than the copies (it only lets the reply go before them).
    req.ready_event.assign(10, '\x33');
    EXPECT_THAT(ask({{id, 0, 16, 1000, 64}}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "ready event"));
    req.ready_event.assign(wire::kCudaIpcHandleBytes, '\x33');
    const Status with_event = ask({{id, 0, 16, 1000, 64}});
    EXPECT_TRUE(with_event.code() == StatusCode::kUnimplemented ||
                with_event.code() == StatusCode::kInvalidArgument)
        << with_event.ToString();
    req.ready_event.clear();
    // A destination outside CUDA memory does not decode.
    req.destination = {wire::BufferRef::Client(0, 4096), 0, 0, ""};
    req.items = {{id, 0, 0, 16, 0}};
    EXPECT_THAT(peer.Request(req), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_OK(peer.Request(wire::StatRequest{"k"}));
}

TEST_F(NodeServerTest, MalformedAndTruncatedPayloadsGetErrorsAndTheDaemonStaysUp) {
    RawPeer peer(socket_);
    ASSERT_OK(peer.Request(wire::HelloRequest{}));
    // A Put whose payload is cut short: a valid header, a truncated body.
    wire::PutRequest put;
    put.key = "k";
    put.members.push_back({"x", DType::kUInt8, {16}, 0, wire::BufferRef::Client(0, 16)});
    auto frame = wire::EncodeFrame(put, 7);
    ASSERT_TRUE(frame.ok());
    std::vector<std::byte> cut(frame->begin(), frame->end() - 5);
    wire::FrameHeader header;
    header.type = wire::MessageType::kPut;
    header.request_id = 7;
    header.payload_len = static_cast<std::uint32_t>(cut.size() - wire::kFrameHeaderBytes);
    wire::EncodeFrameHeader(header, std::span<std::byte, wire::kFrameHeaderBytes>(cut.data(),
                                                                                  wire::kFrameHeaderBytes));
    ASSERT_OK(peer.Send(cut));
    auto reply = peer.Receive();
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->header.type, wire::MessageType::kError);
    EXPECT_EQ(reply->header.request_id, 7u);
    // Garbage bytes after the header of a known type.
    std::vector<std::byte> junk(wire::kFrameHeaderBytes + 64, std::byte{0xff});
    header.type = wire::MessageType::kSparseRead;
    header.request_id = 8;
    header.payload_len = 64;
    wire::EncodeFrameHeader(header, std::span<std::byte, wire::kFrameHeaderBytes>(junk.data(),
                                                                                  wire::kFrameHeaderBytes));
    ASSERT_OK(peer.Send(junk));
    reply = peer.Receive();
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->header.type, wire::MessageType::kError);
    // A reply type sent as a request, and a put with no buffer registered.
    EXPECT_THAT(peer.Request(wire::OkReply{}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(peer.Request(put), StatusIs(StatusCode::kFailedPrecondition));
    // The connection still works.
    EXPECT_THAT(peer.Request(wire::StatRequest{"k"}), StatusIs(StatusCode::kNotFound));

    // A broken frame header (raw bytes: SendFrame would refuse them) closes this connection
    // only: the daemon answers with an error and hangs up.
    std::vector<std::byte> bad_magic(wire::kFrameHeaderBytes, std::byte{0x42});
    ASSERT_EQ(::send(peer.conn().fd(), bad_magic.data(), bad_magic.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bad_magic.size()));
    auto last = peer.Receive();
    if (last.ok()) {
        EXPECT_EQ(last->header.type, wire::MessageType::kError);
        EXPECT_THAT(peer.Receive(), StatusIs(StatusCode::kUnavailable));
    } else {
        EXPECT_THAT(last, StatusIs(StatusCode::kUnavailable));
    }
    EXPECT_EQ(server_->Stats().protocol_errors, 1u);
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    EXPECT_THAT(client->Stat("k"), StatusIs(StatusCode::kNotFound));
}

TEST_F(NodeServerTest, ClientBuffersAreCheckedAndBoundsEnforced) {
    RawPeer peer(socket_);
    ASSERT_OK(peer.Request(wire::HelloRequest{}));
    // An unsealed memfd could shrink under the daemon: refused.
    const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
    ASSERT_EQ(::ftruncate(unsealed, 4096), 0);
    EXPECT_THAT(peer.Request(wire::RegisterBufferRequest{4096}, std::span(&unsealed, 1)),
                StatusIs(StatusCode::kInvalidArgument));
    ::close(unsealed);
    auto buffer = ShmSegment::Create("raw_client", 4096, {.seal_future_write = false});
    ASSERT_TRUE(buffer.ok());
    const int fd = buffer->fd();
    // Larger than the file / than the daemon allows.
    EXPECT_THAT(peer.Request(wire::RegisterBufferRequest{8192}, std::span(&fd, 1)),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(peer.Request(wire::RegisterBufferRequest{64 << 20}, std::span(&fd, 1)),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(peer.Request(wire::RegisterBufferRequest{4096}),
                StatusIs(StatusCode::kInvalidArgument));  // no fd
    ASSERT_OK(peer.Request(wire::RegisterBufferRequest{4096}, std::span(&fd, 1)));

    wire::PutRequest put;
    put.key = "k";
    put.members.push_back({"x", DType::kUInt8, {16}, 0, wire::BufferRef::Client(4090, 16)});
    EXPECT_THAT(peer.Request(put), StatusIs(StatusCode::kOutOfRange));
    wire::ReadMemberRequest read{"k", "x", wire::BufferRef::Client(4096, 1)};
    EXPECT_THAT(peer.Request(read), StatusIs(StatusCode::kOutOfRange));
    put.members[0].src = wire::BufferRef::Client(0, 16);
    EXPECT_OK(peer.Request(put));
    // Shape and bytes disagree: the store refuses, nothing visible.
    put.key = "k2";
    put.members[0].shape = {17};
    EXPECT_THAT(peer.Request(put), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(peer.Request(wire::StatRequest{"k2"}), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(peer.Request(wire::ReleaseRequest{{12345}}), StatusIs(StatusCode::kNotFound));
}

// ---------------------------------------------------------------------------------------------
// Availability: restart, daemon gone, silent daemon.
// ---------------------------------------------------------------------------------------------

TEST_F(NodeServerTest, ClientReconnectsAfterADaemonRestart) {
    auto client = Client(socket_);
    ASSERT_NE(client, nullptr);
    ASSERT_OK(client->Put("a", "", {}, {}));
    server_->Stop();
    server_.reset();
    auto gone = client->Stat("a");
    EXPECT_THAT(gone, StatusIs(StatusCode::kUnavailable));
    EXPECT_THAT(client->Stat("a"), StatusIs(StatusCode::kUnavailable));  // still gone

    auto s = NodeServer::Start(SmallServer(socket_));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    // A fresh daemon: the next call dials again and sees its (empty) store.
    EXPECT_THAT(client->Stat("a"), StatusIs(StatusCode::kNotFound));
    ASSERT_OK(client->Put("b", "", {}, {}));
    EXPECT_EQ(client->Stats().connects, 2u);
}

TEST(NodeClientTest, NoDaemonIsAClearUnavailable) {
    TempDir dir;
    NodeClientOptions o;
    o.socket_path = dir.Path("nobody.sock");
    auto c = NodeClient::Connect(o);
    ASSERT_THAT(c, StatusIs(StatusCode::kUnavailable));
    EXPECT_THAT(c.status().message(), ::testing::HasSubstr("not running"));
}

TEST(NodeClientTest, ASilentDaemonTimesOutInsteadOfHanging) {
    // A fake daemon: answers Hello and RegisterBuffer, then never replies again.
    TempDir dir;
    const std::string path = dir.Path("silent.sock");
    auto listener = UnixListener::Bind(path);
    ASSERT_TRUE(listener.ok());
    std::atomic<bool> done{false};
    std::thread fake([&] {
        auto conn = listener->Accept(Deadline::After(5s));
        if (!conn.ok()) return;
        for (int i = 0; !done.load(); ++i) {
            std::vector<UniqueFd> fds;
            auto bytes = conn->RecvFrame(wire::kMaxFrameBytes, &fds, Deadline::After(100ms));
            if (!bytes.ok()) {
                if (bytes.status().code() == StatusCode::kUnavailable && !done.load()) continue;
                return;
            }
            auto frame = wire::DecodeFrame(*bytes);
            if (!frame.ok()) return;
            std::vector<std::byte> reply;
            if (frame->header.type == wire::MessageType::kHello) {
                wire::HelloReply h;
                h.node_id = "fake";
                h.client_buffer_max = 1 << 20;
                reply = *wire::EncodeFrame(h, frame->header.request_id);
            } else if (frame->header.type == wire::MessageType::kRegisterBuffer) {
                reply = *wire::EncodeFrame(wire::OkReply{}, frame->header.request_id);
            } else {
                continue;  // silence
            }
            (void)conn->SendFrame(reply, {}, Deadline::After(1s));
        }
    });
    NodeClientOptions o;
    o.socket_path = path;
    o.call_timeout = 300ms;
    o.initial_buffer_bytes = 4096;
    auto client = NodeClient::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*client)->Stat("k");
    const auto elapsed = std::chrono::steady_clock::now() - t0;
    EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable));
    EXPECT_LT(elapsed, 3s);
    EXPECT_GE(elapsed, 250ms);
    EXPECT_FALSE((*client)->connected());
    done = true;
    fake.join();
}

// ---------------------------------------------------------------------------------------------
// Configuration.
// ---------------------------------------------------------------------------------------------

TEST(DaemonConfigTest, ByteSizes) {
    EXPECT_EQ(*ParseByteSize("4096"), 4096u);
    EXPECT_EQ(*ParseByteSize("64k"), 64u << 10);
    EXPECT_EQ(*ParseByteSize("256MiB"), 256u << 20);
    EXPECT_EQ(*ParseByteSize("1G"), 1u << 30);
    EXPECT_EQ(*ParseByteSize("2GB"), 2000000000u);
    EXPECT_EQ(*ParseByteSize(" 3 mib "), 3u << 20);
    EXPECT_THAT(ParseByteSize(""), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ParseByteSize("12XB"), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ParseByteSize("-1"), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ParseByteSize("99999999999T"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(DaemonConfigTest, YamlKeysAndCapacity) {
    NodeDaemonConfig c;
    ASSERT_OK(ApplyYamlConfig("socket_path: /tmp/x.sock\nsegment_size: 64MiB\n"
                              "capacity: 200MiB\npinned_quota_bytes: 1GiB\nlog_level: warning\n",
                              c));
    auto o = ToServerOptions(c);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    EXPECT_EQ(o->socket_path, "/tmp/x.sock");
    EXPECT_EQ(o->store.segment_size, 64u << 20);
    EXPECT_EQ(o->store.num_segments, 4u);  // ceil(200 / 64)
    EXPECT_EQ(o->store.pinned_quota_bytes, 1u << 30);
    EXPECT_THAT(ApplyYamlConfig("nope: 1\n", c), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ApplyYamlConfig("- a\n- b\n", c), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ApplyYamlConfig("segment_size: [1]\n", c), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ApplyYamlConfig("log_level: loud\n", c), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ApplyYamlConfig("a: [unclosed\n", c), StatusIs(StatusCode::kInvalidArgument));
    c.num_segments = 2;
    EXPECT_THAT(ToServerOptions(c), StatusIs(StatusCode::kInvalidArgument));  // both given
    NodeDaemonConfig small;
    small.socket_path = "/tmp/y.sock";
    small.capacity = 1 << 20;
    auto so = ToServerOptions(small);
    ASSERT_TRUE(so.ok());
    EXPECT_EQ(so->store.num_segments, 1u);
    EXPECT_EQ(so->store.segment_size, 1u << 20);
    NodeDaemonConfig defaults;  // no socket_path given: the default one
    EXPECT_EQ(defaults.socket_path, DefaultSocketPath());
    ASSERT_TRUE(ToServerOptions(defaults).ok());
    NodeDaemonConfig none;
    none.socket_path.clear();
    EXPECT_THAT(ToServerOptions(none), StatusIs(StatusCode::kInvalidArgument));
}

TEST(DaemonConfigTest, DefaultSocketPathAndItsDirectory) {
    const char* saved = std::getenv("XDG_RUNTIME_DIR");
    const std::string saved_value = saved ? saved : "";
    char tmpl[] = "/tmp/mcs-cfg-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string runtime = tmpl;
    setenv("XDG_RUNTIME_DIR", runtime.c_str(), 1);
    EXPECT_EQ(DefaultSocketPath(), runtime + "/mooncake-sparse/node.sock");
    ASSERT_TRUE(EnsureSocketDirectory(DefaultSocketPath()).ok());
    struct stat st {};
    ASSERT_EQ(::stat((runtime + "/mooncake-sparse").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_TRUE(EnsureSocketDirectory(DefaultSocketPath()).ok());  // exists: fine
    // The default directory must be private.
    ASSERT_EQ(::chmod((runtime + "/mooncake-sparse").c_str(), 0777), 0);
    EXPECT_THAT(EnsureSocketDirectory(DefaultSocketPath()),
                StatusIs(StatusCode::kFailedPrecondition));
    // A missing parent is reported, not created.
    EXPECT_THAT(EnsureSocketDirectory(runtime + "/no/such/node.sock"),
                StatusIs(StatusCode::kInvalidArgument));
    // Without XDG_RUNTIME_DIR: under /tmp, per user.
    unsetenv("XDG_RUNTIME_DIR");
    EXPECT_EQ(DefaultSocketPath(),
              "/tmp/mooncake-sparse-" + std::to_string(::geteuid()) + "/node.sock");
    if (saved) setenv("XDG_RUNTIME_DIR", saved_value.c_str(), 1);
    ::rmdir((runtime + "/mooncake-sparse").c_str());
    ::rmdir(runtime.c_str());
}

}  // namespace
}  // namespace mooncake::sparse
