// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// SparseService (executor/sparse_service.h) from both sides: the same run — commit, admission,
// seal, wait, retention, reads of a manifest and of a step, anchors written through the
// service's tensor store, metrics, caches, counters, keys — through a SparseStore in this process
// and through the node daemon's client, with the same answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "executor/sparse_service.h"
#include "executor/sparse_store.h"
#include "executor/tensor_store.h"
#include "node/node_client.h"
#include "node/node_server.h"
#include "node_test_util.h"
#include "../planned_host_build.h"

namespace mooncake::sparse {
namespace {

using namespace std::chrono_literals;

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
        const float v = static_cast<float>(i) - 7.25f;
        std::memcpy(c.values.data() + i * 4, &v, 4);
    }
    return c;
}

constexpr Index kRows = 128;
constexpr Index kCols = 96;

PutSparseRequest Request(const Coo& coo) {
    PutSparseRequest r;
    r.tensor_id = "w";
    r.global_shape = {kRows, kCols};
    r.indices = {DType::kInt64, {Index(coo.nnz), 2}, coo.indices};
    r.values = {DType::kFloat32, {Index(coo.nnz)}, coo.values};
    r.placement_policy = *PlacementPolicy::Parse("replicate(ep)");
    r.generation = {0, 1};
    r.encode.num_threads = 1;
    return r;
}

TargetDescriptor Target(const std::string& tensor, int tp) {
    auto axes = NamedAxes::Make({{"ep", 0}, {"tp", tp}});
    return *TargetDescriptor::Make(tensor + "/rank" + std::to_string(tp), "node0", tensor, *axes,
                                   {Index(tp) * (kRows / 2), 0}, {kRows / 2, kCols});
}

/// What a read gave, per target, in plain values.
struct ReadAnswer {
    std::string target_id;
    std::string node_id;
    Box target_box;
    SourceDescriptor desc;  ///< Every field, as a read in this process gives it.
    std::string coordinate_space;
    std::uint64_t nnz = 0;
    std::vector<std::byte> indices;
    std::vector<std::byte> values;
    std::vector<std::byte> tile_ptr;
    std::uint64_t checksum_values = 0;
    bool operator==(const ReadAnswer&) const = default;
};

std::vector<ReadAnswer> Answers(const std::vector<TargetObjectView>& views) {
    std::vector<ReadAnswer> out;
    for (const TargetObjectView& v : views) {
        EXPECT_NE(v.keepalive, nullptr);
        EXPECT_EQ(v.nbytes(),
                  v.indices.size() + v.values.size() + v.tile_coords.size() + v.tile_ptr.size());
        out.push_back({v.target_id,
                       v.node_id,
                       v.target_box,
                       v.desc,
                       v.coordinate_space,
                       v.desc.nnz,
                       {v.indices.begin(), v.indices.end()},
                       {v.values.begin(), v.values.end()},
                       {v.tile_ptr.begin(), v.tile_ptr.end()},
                       v.checksum_values});
    }
    return out;
}

/// The value of `r`, or `fallback` (after a failure) when it failed.
template <typename T>
T Or(Result<T> r, T fallback) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : fallback;
}

double Metric(const MetricItems& items, const std::string& name) {
    for (const auto& [n, v] : items) {
        if (n == name) return v;
    }
    ADD_FAILURE() << "no metric " << name;
    return -1;
}

/// Everything the run answered that both backends must agree on.
struct RunAnswers {
    std::string source_ref;
    std::vector<ReadAnswer> manifest_read;
    std::vector<ReadAnswer> step_read;
    std::vector<std::string> source_keys;
};

/// The run, through the interface only.
RunAnswers RunThrough(SparseService& s) {
    RunAnswers out;
    const Coo coo = RandomCoo(kRows, kCols, 700, 11);
    auto commit = s.PutSparseObject(Request(coo));
    EXPECT_TRUE(commit.ok()) << commit.status().ToString();
    if (!commit.ok()) return out;
    EXPECT_TRUE(commit->created);
    EXPECT_EQ(commit->nnz, 700u);
    out.source_ref = commit->source_ref;
    auto again = s.PutSparseObject(Request(coo));
    EXPECT_TRUE(again.ok() && !again->created && again->source_ref == commit->source_ref);

    // Admission of the next step: one writer wins, a retry of the winner wins again.
    const auto owner = *PlacementPolicy::Parse("owner(ep)");
    const auto ep0 = *NamedAxes::Make({{"ep", 0}});
    EXPECT_TRUE(Or(s.Admit("w", {1, 2}, owner, ep0, "writer-a"), false));
    EXPECT_FALSE(Or(s.Admit("w", {1, 2}, owner, ep0, "writer-b"), true));
    EXPECT_TRUE(Or(s.Admit("w", {1, 2}, owner, ep0, "writer-a"), false));
    EXPECT_EQ(s.Admit("w", {2, 1}, owner, ep0, "writer-a").status().code(),
              StatusCode::kInvalidArgument);

    auto head = s.CurrentGeneration("w");
    EXPECT_TRUE(head.ok() && *head == std::optional<Generation>(Generation{0, 1}));
    auto none = s.CurrentGeneration("u");
    EXPECT_TRUE(none.ok() && !none->has_value());

    auto manifest = s.Manifest({0, 1});
    EXPECT_TRUE(manifest.ok() && manifest->size() == 1);
    if (!manifest.ok()) return out;

    // The steps of a run.
    EXPECT_TRUE(s.LatestGeneration().ok() && !s.LatestGeneration()->has_value());
    const std::vector<std::string> ids = {"u", "w"};
    EXPECT_TRUE(s.SealGeneration({0, 1}, ids).ok());
    EXPECT_EQ(s.SealGeneration({0, 1}, ids).code(), StatusCode::kFailedPrecondition);
    auto step = s.GetManifest({0, 1});
    EXPECT_TRUE(step.ok() && step->sealed && step->sources.size() == 1 &&
                step->unchanged == std::vector<std::string>{"u"});
    auto waited = s.WaitGeneration({0, 1}, 1.0);
    EXPECT_TRUE(waited.ok() && waited->sealed);
    EXPECT_EQ(s.WaitGeneration({1, 2}, 0.05).status().code(), StatusCode::kDeadlineExceeded);
    auto latest = s.LatestGeneration();
    EXPECT_TRUE(latest.ok() && *latest == std::optional<Generation>(Generation{0, 1}));
    EXPECT_TRUE(s.SetRetention(3).ok());
    EXPECT_EQ(Or(s.Retention(), std::uint64_t{0}), 3u);

    // Reads, of the manifest and of the step (whose unchanged tensor reads as empty objects).
    EXPECT_TRUE(s.Metrics(/*reset=*/true).ok());
    const std::vector<TargetDescriptor> targets = {Target("w", 0), Target("w", 1)};
    auto views = s.ReadViews(*manifest, targets, ReadOptions{});
    EXPECT_TRUE(views.ok()) << views.status().ToString();
    if (views.ok()) out.manifest_read = Answers(*views);
    const std::vector<TargetDescriptor> step_targets = {Target("w", 1), Target("u", 0)};
    auto step_views = s.ReadViews(*step, step_targets, ReadOptions{});
    EXPECT_TRUE(step_views.ok()) << step_views.status().ToString();
    if (step_views.ok()) {
        out.step_read = Answers(*step_views);
        EXPECT_EQ(out.step_read.size(), 2u);
        if (out.step_read.size() == 2) {
            EXPECT_EQ(out.step_read[1].nnz, 0u);
        }
    }

    // Metrics: taken and reset in one call; caches dropped.
    auto metrics = s.Metrics(/*reset=*/true);
    EXPECT_TRUE(metrics.ok());
    if (metrics.ok()) {
        // Two of the manifest, one of the step's changed tensor (the unchanged one reads as
        // an empty object without the read path).
        EXPECT_EQ(Metric(*metrics, "target_objects_published"), 3);
        EXPECT_EQ(Metric(*metrics, "full_gets"), 0);
    }
    auto after = s.Metrics(/*reset=*/false);
    EXPECT_TRUE(after.ok() && Metric(*after, "target_objects_published") == 0);
    EXPECT_TRUE(s.ClearCaches().ok());

    auto counters = s.ObjectCounters();
    EXPECT_TRUE(counters.ok() && counters->puts > 0 && counters->bytes_put > 0);
    auto keys = s.ListKeys("mcs/src/");
    EXPECT_TRUE(keys.ok() && keys->size() == 1);
    if (keys.ok()) out.source_keys = *keys;

    // Anchors: full weights written through the service's tensor store, then recorded.
    std::unique_ptr<TensorStore> tensors = s.MakeTensorStore({});
    EXPECT_NE(tensors, nullptr);
    if (tensors == nullptr) return out;
    std::vector<float> full(static_cast<std::size_t>(kRows * kCols), 0.5f);
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(full.data()),
                                           full.size() * sizeof(float));
    for (const std::string& id : ids) {
        const TensorRef ref = TensorRef::ConstHost(DType::kFloat32, {kRows, kCols}, bytes);
        EXPECT_TRUE(tensors->Put(AnchorTensorKey("", {0, 1}, id), ref, {}).ok());
    }
    auto stat = tensors->Stat(AnchorTensorKey("", {0, 1}, "w"));
    EXPECT_TRUE(stat.ok() && stat->header.local_shape == (Shape{kRows, kCols}));
    EXPECT_TRUE(s.LatestAnchor().ok() && !s.LatestAnchor()->has_value());
    EXPECT_TRUE(s.RecordAnchor({0, 1}, ids).ok());
    auto anchor = s.LatestAnchor();
    EXPECT_TRUE(anchor.ok() && *anchor == std::optional<Generation>(Generation{0, 1}));
    EXPECT_TRUE(s.SetKeepAnchors(2).ok());
    EXPECT_EQ(s.SetKeepAnchors(0).code(), StatusCode::kInvalidArgument);

    EXPECT_EQ(&s.object_store(), &s.object_store());
    return out;
}

/// The options of this suite's daemon clients.
NodeClientOptions ClientOptions(const std::string& socket) {
    NodeClientOptions o;
    o.socket_path = socket;
    o.client_name = "sparse_service_test";
    o.call_timeout = 10s;
    o.connect_timeout = 2s;
    return o;
}

TEST(SparseServiceTest, ARunGivesTheSameAnswersInProcessAndThroughTheDaemon) {
    auto local = std::make_shared<SparseStore>(MakeEmbeddedStore());
    const RunAnswers in_process = RunThrough(*local);

    testing::TempDir dir;
    const std::string socket = dir.Path("node.sock");
    auto server = NodeServer::Start(testing::SmallServer(socket, "sparse_service_test", 16 << 20));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    auto client = NodeClient::Connect(ClientOptions(socket));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    std::shared_ptr<SparseService> remote = *client;
    const RunAnswers daemon = RunThrough(*remote);

    EXPECT_FALSE(in_process.source_ref.empty());
    EXPECT_EQ(daemon.source_ref, in_process.source_ref);
    EXPECT_EQ(daemon.source_keys, in_process.source_keys);
    ASSERT_EQ(in_process.manifest_read.size(), 2u);
    EXPECT_EQ(daemon.manifest_read, in_process.manifest_read);
    EXPECT_EQ(daemon.step_read, in_process.step_read);
    // The client's object store is the client (every call an RPC).
    EXPECT_EQ(&remote->object_store(), static_cast<ObjectStore*>(client->get()));
    remote.reset();
    client->reset();
    (*server)->Stop();
}

/// A batch of commits with bad items among good ones, as each service answers it.
std::vector<std::string> CommitBatchThrough(SparseService& service) {
    std::vector<Coo> coos;
    for (unsigned i = 0; i < 300; ++i) coos.push_back(RandomCoo(kRows, kCols, 1 + i % 50, 100 + i));
    std::vector<PutSparseRequest> reqs;
    for (unsigned i = 0; i < 300; ++i) {
        reqs.push_back(Request(coos[i]));
        reqs.back().tensor_id = "t" + std::to_string(i);
    }
    const std::vector<std::byte> outside = [] {
        std::vector<std::byte> b(16);
        const std::int64_t rc[2] = {kRows, 0};
        std::memcpy(b.data(), rc, 16);
        return b;
    }();
    reqs[7].indices = {DType::kInt64, {1, 2}, outside};  // row kRows: outside the tensor
    reqs[7].values = {DType::kFloat32, {1}, std::span(coos[7].values).first(4)};
    reqs[9].generation = {3, 2};                          // not a generation
    std::vector<std::string> out;
    for (const Result<CommitResult>& r : service.PutSparseObjects(reqs)) {
        out.push_back(r.ok() ? r->source_ref + (r->created ? " created " : " again ") +
                                   std::to_string(r->nnz) + " " + std::to_string(r->bytes)
                             : std::string(StatusCodeName(r.status().code())));
    }
    // The same batch again: idempotent for the good items.
    for (const Result<CommitResult>& r : service.PutSparseObjects(reqs)) {
        out.push_back(r.ok() ? (r->created ? "created" : "again")
                             : std::string(StatusCodeName(r.status().code())));
    }
    auto manifest = service.Manifest({0, 1});
    out.push_back(manifest.ok() ? std::to_string(manifest->size()) : manifest.status().ToString());
    return out;
}

TEST(SparseServiceTest, ABatchCommitGivesTheSameAnswersInProcessAndThroughTheDaemon) {
    SparseStore local(MakeEmbeddedStore());
    const std::vector<std::string> in_process = CommitBatchThrough(local);
    testing::TempDir dir;
    const std::string socket = dir.Path("node.sock");
    auto server = NodeServer::Start(testing::SmallServer(socket, "sparse_service_test", 16 << 20));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    auto client = NodeClient::Connect(ClientOptions(socket));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const std::vector<std::string> daemon = CommitBatchThrough(**client);
    ASSERT_EQ(in_process.size(), 601u);
    EXPECT_EQ(in_process[7], "InvalidArgument");
    EXPECT_EQ(in_process[9], "InvalidArgument");
    EXPECT_EQ(in_process[300 + 8], "again");
    EXPECT_EQ(in_process.back(), "298");
    EXPECT_EQ(daemon, in_process);
    // One request per batch, not one per update.
    EXPECT_LE((*client)->Stats().calls, 8u);
    client->reset();
    (*server)->Stop();
}

/// A read large enough that the range reads and the daemon's publishing of target objects run
/// on several threads (over 8 MiB each way) answers what the in-process read answers, byte for
/// byte, for tile-aligned and unaligned targets.
std::vector<ReadAnswer> LargeReadThrough(SparseService& service) {
    constexpr Index rows = 2048, cols = 1024;
    std::mt19937_64 rng(5);
    std::vector<std::int32_t> idx;
    std::vector<float> val;
    for (Index r = 0; r < rows; ++r) {
        for (Index c = 0; c < cols; ++c) {
            if (rng() % 16 < 9) {  // about 56 %: 1.2e6 entries, 9.4 MB
                idx.push_back(std::int32_t(r));
                idx.push_back(std::int32_t(c));
                val.push_back(float(r) * 0.5f - float(c));
            }
        }
    }
    PutSparseRequest req;
    req.tensor_id = "big";
    req.global_shape = {rows, cols};
    req.indices = {DType::kInt32, {Index(val.size()), 2}, std::as_bytes(std::span(idx))};
    req.values = {DType::kFloat32, {Index(val.size())}, std::as_bytes(std::span(val))};
    req.placement_policy = *PlacementPolicy::Parse("replicate(ep)");
    req.generation = {0, 1};
    const std::vector<PutSparseRequest> reqs = {req};
    const std::vector<Result<CommitResult>> put = service.PutSparseObjects(reqs);
    EXPECT_TRUE(put[0].ok()) << put[0].status().ToString();
    auto manifest = service.Manifest({0, 1});
    EXPECT_TRUE(manifest.ok());
    if (!manifest.ok()) return {};
    std::vector<TargetDescriptor> targets;
    for (int tp = 0; tp < 4; ++tp) {
        targets.push_back(*TargetDescriptor::Make("big/rank" + std::to_string(tp), "node0", "big",
                                                  *NamedAxes::Make({{"ep", 0}, {"tp", tp}}),
                                                  {Index(tp) * (rows / 4), 0}, {rows / 4, cols}));
    }
    targets.push_back(*TargetDescriptor::Make("big/odd", "node0", "big",
                                              *NamedAxes::Make({{"ep", 0}, {"tp", 0}}), {3, 5},
                                              {1500, 1000}));
    ReadOptions options;
    options.num_threads = 2;
    auto views = service.ReadViews(*manifest, targets, options);
    EXPECT_TRUE(views.ok()) << views.status().ToString();
    return views.ok() ? Answers(*views) : std::vector<ReadAnswer>{};
}

TEST(SparseServiceTest, ALargeReadGivesTheSameAnswersInProcessAndThroughTheDaemon) {
    SparseStore local(MakeEmbeddedStore());
    const std::vector<ReadAnswer> in_process = LargeReadThrough(local);
    ASSERT_EQ(in_process.size(), 5u);
    std::uint64_t nnz = 0;
    for (int tp = 0; tp < 4; ++tp) nnz += in_process[tp].nnz;
    EXPECT_GT(nnz, 1'100'000u);
    testing::TempDir dir;
    const std::string socket = dir.Path("node.sock");
    NodeServerOptions options = testing::SmallServer(socket, "sparse_service_large", 16 << 20);
    options.store.segment_size = 32 << 20;
    options.client_buffer_max_bytes = 64 << 20;
    auto server = NodeServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    auto client = NodeClient::Connect(ClientOptions(socket));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const std::vector<ReadAnswer> daemon = LargeReadThrough(**client);
    EXPECT_EQ(daemon, in_process);
    client->reset();
    (*server)->Stop();
}

/// A planned read's targets built on the host, per target: the descriptor's fields and the
/// entries (coordinates then value bytes), sorted.
struct PlannedAnswer {
    std::string target_id;
    std::uint64_t nnz = 0;
    DType index_dtype = DType::kUInt8;
    DType value_dtype = DType::kUInt8;
    Shape tile_shape;
    Generation generation;
    std::vector<std::vector<std::byte>> entries;
    bool operator==(const PlannedAnswer&) const = default;
};

std::vector<std::vector<std::byte>> SortedEntries(std::span<const std::byte> idx,
                                                  std::span<const std::byte> val, std::size_t isz,
                                                  std::size_t vsz) {
    std::vector<std::vector<std::byte>> out;
    for (std::size_t e = 0; (e + 1) * vsz <= val.size(); ++e) {
        std::vector<std::byte> one(idx.begin() + e * isz, idx.begin() + (e + 1) * isz);
        one.insert(one.end(), val.begin() + e * vsz, val.begin() + (e + 1) * vsz);
        out.push_back(std::move(one));
    }
    std::sort(out.begin(), out.end());
    return out;
}

/// A step of two changed tensors and an unchanged one, read planned (built on the host) and
/// read as usual: the same targets. `by_step` (a node daemon's client): the planned read names
/// the sealed step (its manifest is the daemon's, as GetManifest gave it).
std::vector<PlannedAnswer> PlannedReadThrough(SparseService& s, bool by_step = false) {
    const Coo w = RandomCoo(kRows, kCols, 900, 3), v = RandomCoo(kRows, kCols, 2000, 4);
    std::vector<PutSparseRequest> reqs = {Request(w), Request(v)};
    reqs[1].tensor_id = "v";
    for (const auto& r : s.PutSparseObjects(reqs)) EXPECT_TRUE(r.ok()) << r.status().ToString();
    const std::vector<std::string> ids = {"u", "v", "w"};
    EXPECT_TRUE(s.SealGeneration({0, 1}, ids).ok());
    auto step = s.GetManifest({0, 1});
    EXPECT_TRUE(step.ok());
    if (!step.ok()) return {};
    std::vector<TargetDescriptor> targets = {Target("w", 0), Target("w", 1), Target("u", 0),
                                             Target("v", 1)};
    // Off the tile grid: boundary tiles filtered.
    targets.push_back(*TargetDescriptor::Make("v/odd", "node0", "v",
                                              *NamedAxes::Make({{"ep", 0}, {"tp", 0}}), {7, 13},
                                              {90, 61}));
    ReadOptions options;
    options.num_threads = 2;
    auto want = s.ReadViews(*step, targets, options);
    EXPECT_TRUE(want.ok()) << want.status().ToString();
    if (!want.ok()) return {};
    testing::HostBuild build;
    auto* node = dynamic_cast<NodeClient*>(&s);
    EXPECT_TRUE(!by_step || node != nullptr);
    if (by_step && node == nullptr) return {};
    auto got = by_step ? node->ReadPlannedSealedStep(*step, targets, options, std::ref(build))
                       : s.ReadPlanned(*step, targets, options, std::ref(build));
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok()) return {};
    EXPECT_EQ(build.calls, 1);
    std::vector<PlannedAnswer> out;
    EXPECT_EQ(got->size(), targets.size());
    for (std::size_t t = 0; t < got->size() && t < want->size(); ++t) {
        const TargetObjectView& v = (*got)[t];
        const TargetObjectView& w = (*want)[t];
        SCOPED_TRACE(v.target_id);
        EXPECT_EQ(v.target_id, targets[t].target_id);
        EXPECT_EQ(v.target_box, targets[t].box);
        EXPECT_EQ(v.coordinate_space, "local");
        EXPECT_EQ(v.desc.nnz, w.desc.nnz);
        EXPECT_EQ(v.desc.index_dtype, w.desc.index_dtype);
        EXPECT_EQ(v.desc.value_dtype, w.desc.value_dtype);
        EXPECT_EQ(v.desc.tile_shape, w.desc.tile_shape);
        EXPECT_EQ(v.desc.generation, w.desc.generation);
        EXPECT_EQ(v.desc.apply, w.desc.apply);
        const std::size_t isz = DTypeSize(v.desc.index_dtype) * v.desc.rank();
        const std::size_t vsz = DTypeSize(v.desc.value_dtype);
        auto entries = SortedEntries(build.indices[t], build.values[t], isz, vsz);
        EXPECT_EQ(entries, SortedEntries(w.indices, w.values, isz, vsz));
        out.push_back({v.target_id, v.desc.nnz, v.desc.index_dtype, v.desc.value_dtype,
                       v.desc.tile_shape, v.desc.generation, std::move(entries)});
    }
    // A full-source read is not planned.
    ReadOptions full = options;
    full.strategy = ReadStrategy::kFullSourcePerTarget;
    EXPECT_EQ(s.ReadPlanned(*step, targets, full, std::ref(build)).status().code(),
              StatusCode::kUnimplemented);
    // The builder's error is the read's.
    const auto fail = [](PlannedRead&) { return ResourceExhausted("no room for the targets"); };
    EXPECT_EQ(s.ReadPlanned(*step, targets, options, fail).status().code(),
              StatusCode::kResourceExhausted);
    return out;
}

TEST(SparseServiceTest, APlannedReadGivesTheSameTargetsInProcessAndThroughTheDaemon) {
    SparseStore local(MakeEmbeddedStore());
    const std::vector<PlannedAnswer> in_process = PlannedReadThrough(local);
    ASSERT_EQ(in_process.size(), 5u);
    EXPECT_EQ(in_process[2].nnz, 0u);  // the unchanged tensor
    EXPECT_GT(in_process[4].nnz, 0u);
    testing::TempDir dir;
    const std::string socket = dir.Path("node.sock");
    auto server = NodeServer::Start(testing::SmallServer(socket, "sparse_service_planned", 16 << 20));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    auto client = NodeClient::Connect(ClientOptions(socket));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    EXPECT_EQ(PlannedReadThrough(**client), in_process);
    // The sources the reads leased are released: nothing stays leased once the reads' views
    // are gone.
    ASSERT_TRUE((*client)->FlushReleases().ok());
    auto metrics = (*client)->Metrics(false);
    ASSERT_TRUE(metrics.ok());
    EXPECT_EQ(Metric(*metrics, "shm_leases"), 0);
    // The read and the one whose builder failed (a full-source read is refused by the client).
    EXPECT_EQ(Metric(*metrics, "planned_reads"), 2);
    // The second read named the targets the first one sent.
    EXPECT_EQ(Metric(*metrics, "planned_reads_kept_targets"), 1);
    // The handler's clocks: until its plan was made, within the whole; no copies were asked
    // for (the reads are to the host), so none were queued.
    EXPECT_GT(Metric(*metrics, "planned_read_plan_seconds"), 0.0);
    EXPECT_LE(Metric(*metrics, "planned_read_plan_seconds"),
              Metric(*metrics, "planned_read_seconds"));
    EXPECT_EQ(Metric(*metrics, "planned_read_queued_seconds"), 0.0);
    client->reset();
    (*server)->Stop();

    // The same read naming the sealed step (the daemon plans with its own manifest of it): the
    // same targets, in one request and in requests of two targets. A manifest that is not the
    // daemon's whole one, or a step that is not sealed, is refused.
    for (std::size_t per_request : {std::size_t{16384}, std::size_t{2}}) {
        SCOPED_TRACE(per_request);
        testing::TempDir step_dir;
        const std::string step_socket = step_dir.Path("node.sock");
        auto step_server =
            NodeServer::Start(testing::SmallServer(step_socket, "sparse_service_by_step", 16 << 20));
        ASSERT_TRUE(step_server.ok()) << step_server.status().ToString();
        NodeClientOptions o = ClientOptions(step_socket);
        o.planned_read_targets = per_request;
        auto by_step = NodeClient::Connect(o);
        ASSERT_TRUE(by_step.ok()) << by_step.status().ToString();
        EXPECT_EQ(PlannedReadThrough(**by_step, /*by_step=*/true), in_process);
        auto step_metrics = (*by_step)->Metrics(false);
        ASSERT_TRUE(step_metrics.ok());
        EXPECT_GE(Metric(*step_metrics, "step_reads"), 1);
        auto step = (*by_step)->GetManifest({0, 1});
        ASSERT_TRUE(step.ok());
        const std::vector<TargetDescriptor> one = {Target("w", 0)};
        testing::HostBuild build;
        const StepManifestView part({0, 1}, std::span(step->sources).first(1), step->unchanged);
        EXPECT_EQ((*by_step)->ReadPlannedSealedStep(part, one, {}, std::ref(build)).status().code(),
                  StatusCode::kFailedPrecondition);
        const StepManifestView open({1, 2}, step->sources, step->unchanged);
        EXPECT_EQ((*by_step)->ReadPlannedSealedStep(open, one, {}, std::ref(build)).status().code(),
                  StatusCode::kFailedPrecondition);
        const StepManifestView fold({0, 2}, step->sources, step->unchanged);
        EXPECT_EQ((*by_step)->ReadPlannedSealedStep(fold, one, {}, std::ref(build)).status().code(),
                  StatusCode::kInvalidArgument);
        by_step->reset();
        (*step_server)->Stop();
    }

    // A read planned in requests of two targets (a tensor's targets together, its sources
    // only): the same targets.
    testing::TempDir dir2;
    const std::string socket2 = dir2.Path("node.sock");
    auto server2 = NodeServer::Start(testing::SmallServer(socket2, "sparse_service_chunks", 16 << 20));
    ASSERT_TRUE(server2.ok()) << server2.status().ToString();
    NodeClientOptions small = ClientOptions(socket2);
    small.planned_read_targets = 2;
    auto chunked = NodeClient::Connect(small);
    ASSERT_TRUE(chunked.ok()) << chunked.status().ToString();
    EXPECT_EQ(PlannedReadThrough(**chunked), in_process);
    auto chunked_metrics = (*chunked)->Metrics(false);
    ASSERT_TRUE(chunked_metrics.ok());
    // Each read in two requests: u and v's two targets (a tensor is not split), w's two.
    EXPECT_EQ(Metric(*chunked_metrics, "planned_reads"), 4);
    EXPECT_EQ(Metric(*chunked_metrics, "planned_reads_kept_targets"), 2);
    chunked->reset();
    (*server2)->Stop();
}

TEST(SparseServiceTest, AnOwningViewKeepsItsObjectAfterTheStoreIsGone) {
    std::vector<TargetObjectView> views;
    {
        SparseStore store(MakeEmbeddedStore());
        const Coo coo = RandomCoo(kRows, kCols, 300, 5);
        ASSERT_TRUE(store.PutSparseObject(Request(coo)).ok());
        auto manifest = store.Manifest({0, 1});
        ASSERT_TRUE(manifest.ok());
        const std::vector<TargetDescriptor> targets = {Target("w", 0)};
        auto read = store.ReadViews(*manifest, targets, ReadOptions{});
        ASSERT_TRUE(read.ok()) << read.status().ToString();
        views = std::move(read).value();
        auto owned = store.ReadSparseObjects(*manifest, targets);
        ASSERT_TRUE(owned.ok());
        ASSERT_EQ(views.size(), 1u);
        EXPECT_EQ(views[0].desc.nnz, (*owned)[0].object.desc.nnz);
        EXPECT_EQ(views[0].checksum_indices, (*owned)[0].object.checksum_indices);
    }
    // The store is gone; the view's keepalive still owns the bytes.
    ASSERT_EQ(views.size(), 1u);
    const TargetObjectView copy = views[0];
    views.clear();
    EXPECT_EQ(copy.indices.size(), copy.desc.nnz * 2 * DTypeSize(copy.desc.index_dtype));
    EXPECT_EQ(Checksum(copy.indices), copy.checksum_indices);
    EXPECT_EQ(Checksum(copy.values), copy.checksum_values);
}

}  // namespace
}  // namespace mooncake::sparse
