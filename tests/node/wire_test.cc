// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon message codec (src/store/wire.h): round trips of every message, clean
// failure on every truncation, limits, enum validation, and mutated/random input.
#include "node/wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "../store/store_test_util.h"

namespace mooncake::sparse::wire {
namespace {

using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::StatusIsWithMessage;

// ---- Sample values ---------------------------------------------------------------------------

NamedAxes Axes(std::vector<NamedAxes::Entry> e) { return NamedAxes::Make(std::move(e)).value(); }

SourceDescriptor SampleSource(std::string tensor_id, std::int64_t expert) {
    SourceDescriptor d;
    d.source_ref = "sparse/" + tensor_id + "/g0-1/e" + std::to_string(expert);
    d.tensor_id = std::move(tensor_id);
    d.global_shape = {2048, 7168};
    d.box = Box::Make({1024, 0}, {1024, 7168}).value();
    d.generation = {3, 4};
    d.placement = Axes({{"expert", expert}, {"tp", 0}});
    d.policy = PlacementPolicy::Owner("expert").value();
    d.tile_shape = {128, 256};
    d.nnz = 123456;
    d.num_tiles = 42;
    d.apply = ApplyMode::kScatterAdd;
    d.index_dtype = DType::kUInt16;
    d.value_dtype = DType::kBFloat16;
    return SourceDescriptor::Make(std::move(d)).value();
}

SourceDescriptor SampleSource3D() {
    SourceDescriptor d;
    d.source_ref = "sparse/fused/experts";
    d.tensor_id = "fused.experts.w1";
    d.global_shape = {8, 70000, 16};
    d.box = Box::Whole(d.global_shape).value();
    d.generation = {0, 1};
    d.policy = PlacementPolicy::Replicate("ep").value();
    d.tile_shape = {1, 1024, 16};
    d.nnz = 7;
    d.num_tiles = 3;
    d.apply = ApplyMode::kOverwrite;
    d.index_dtype = DType::kUInt32;
    d.value_dtype = DType::kFloat32;
    return SourceDescriptor::Make(std::move(d)).value();
}

TargetDescriptor SampleTarget(int rank) {
    return TargetDescriptor::Make("node0/rank" + std::to_string(rank), "node0", "layers.3.w1",
                                  Axes({{"expert", 3}, {"tp", rank}}), {0, 3584 * rank},
                                  {2048, 3584})
        .value();
}

BufferRef CudaRef(std::uint64_t offset, std::uint64_t size) {
    BufferRef b;
    b.kind = BufferKind::kCudaIpc;
    b.offset = offset;
    b.size = size;
    b.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x7f');
    b.cuda_ipc_handle[0] = '\0';  // Handles are binary: NULs included.
    b.device = 3;
    return b;
}

ObjectInfo SampleInfo() {
    ObjectInfo info;
    info.key = "tensor/layers.0.attn.q";
    info.metadata = std::string("{\"schema\":\"x\"}\0binary", 21);
    info.members.push_back(MemberInfo{"data", DType::kBFloat16, {4096, 7168}, 4096ull * 7168 * 2,
                                      0x1234567890abcdefull});
    info.members.push_back(MemberInfo{"scale", DType::kFloat32, {4096}, 4096 * 4, 7});
    info.version = 9;
    info.hard_pinned = true;
    return info;
}

ReadTargetLocation SampleLocation(int rank) {
    ReadTargetLocation o;
    o.generation = {3, 4};
    o.tile_shape = {128, 256};
    o.nnz = 1000;
    o.num_tiles = 12 + static_cast<std::uint64_t>(rank);
    o.apply = ApplyMode::kScatterAdd;
    o.index_dtype = DType::kUInt16;
    o.value_dtype = DType::kBFloat16;
    o.indices = {{1, 4096, 4000}, 11};
    o.values = {{1, 8192, 2000}, 12};
    o.tile_coords = {{2, 0, 96}, 13};
    o.tile_ptr = {{2, 128, 104}, 14};
    o.lease_id = 77 + static_cast<std::uint64_t>(rank);
    return o;
}

/// At least one message of every type, most with non-default values in every field.
std::vector<Message> SampleMessages() {
    std::vector<Message> out;
    out.push_back(HelloRequest{kProtocolVersion, 4242, "trainer-rank-0", ""});
    out.push_back(HelloRequest{kProtocolVersion, 4243, "rollout-1", "run-7"});
    out.push_back(HelloReply{kProtocolVersion,
                             "mooncake_sparse_node 0.1.0",
                             "node0",
                             {{0, 1ull << 30, true}, {7, 1ull << 20, false}},
                             256ull << 20});
    out.push_back(HelloReply{});
    out.push_back(ErrorReply{StatusCode::kNotFound, "no such key 'a'"});
    out.push_back(ErrorReply{StatusCode::kPermissionDenied, ""});
    out.push_back(OkReply{});
    out.push_back(RegisterBufferRequest{64ull << 20});
    {
        PutRequest p;
        p.key = "tensor/w";
        p.metadata = std::string("meta\0data", 9);
        p.members.push_back({"data", DType::kFloat8E5M2, {16, 32}, 99, BufferRef::Client(128, 512)});
        p.members.push_back({"scalar", DType::kInt64, {}, 0, CudaRef(1ull << 40, 8)});
        p.mode = PutMode::kUpsert;
        p.hard_pin = true;
        out.push_back(p);
    }
    out.push_back(PutRequest{});
    out.push_back(StatRequest{"tensor/w"});
    out.push_back(StatReply{SampleInfo()});
    out.push_back(StatReply{});
    out.push_back(ReadMemberRequest{"tensor/w", "data", BufferRef::Client(4096, 1024)});
    out.push_back(ReadMemberRequest{"k", "m", CudaRef(0, 1)});
    {
        ReadRangesRequest r;
        r.items.push_back({"obj/a", "indices", 10, 20, BufferRef::Client(0, 40)});
        r.items.push_back({"obj/a", "values", 10, 20, BufferRef::Client(64, 20)});
        r.items.push_back({"obj/b", "values", 0, 0, CudaRef(8, 0)});
        out.push_back(r);
    }
    out.push_back(ReadRangesRequest{});
    out.push_back(RemoveRequest{"tensor/w"});
    out.push_back(ListRequest{"sparse/"});
    out.push_back(ListRequest{""});
    out.push_back(ListReply{{"a", "b/c", std::string("\0\xff", 2)}});
    out.push_back(LeaseRequest{"tensor/w"});
    {
        LeaseReply l;
        l.lease_id = 0xfeedfacecafebeefull;
        l.info = SampleInfo();
        l.locations = {{0, 4096, 4096ull * 7168 * 2}, {0, 1ull << 29, 4096 * 4}};
        out.push_back(l);
    }
    out.push_back(ReleaseRequest{{1, 2, std::numeric_limits<std::uint64_t>::max()}});
    {
        SparseCommitRequest c;
        c.desc = SampleSource("layers.3.w1", 3);
        c.coordinate_space = "global";
        c.indices = {BufferRef::Client(0, 123456 * 4), 1};
        c.values = {BufferRef::Client(1 << 20, 123456 * 2), 2};
        c.tile_coords = {BufferRef::Client(2 << 20, 42 * 8), 3};
        c.tile_ptr = {CudaRef(64, 43 * 8), 4};
        c.hard_pin = false;
        out.push_back(c);
        SparseCommitRequest d = c;
        d.desc = SampleSource3D();
        d.hard_pin = true;
        out.push_back(SparseCommitBatchRequest{{c, d}});
        out.push_back(SparseCommitBatchRequest{});
    }
    out.push_back(SparseCommitReply{"sparse/layers.3.w1/g3-4/e3", true, 123456, 999999});
    out.push_back(SparseCommitBatchReply{
        {{0, "", {"mcs/src/a/g0-1/none/at0_0", true, 10, 400}},
         {int(StatusCode::kStaleGeneration), "tensor 'b' is at generation (1, 2)", {}}}});
    out.push_back(SparseAdmitRequest{"layers.3.w1", {3, 4}, PlacementPolicy::Owner("expert").value(),
                                     Axes({{"expert", 3}}), "trainer/7"});
    out.push_back(SparseAdmitRequest{"shared.w", {0, 1}, PlacementPolicy::None(), {}, "w"});
    out.push_back(SparseAdmitReply{true});
    out.push_back(SparseAdmitBatchRequest{
        {{"layers.3.w1", {3, 4}, PlacementPolicy::Owner("expert").value(), Axes({{"expert", 3}}),
          "trainer/7"},
         {"shared.w", {0, 1}, PlacementPolicy::None(), {}, "w"}}});
    out.push_back(SparseAdmitBatchRequest{});
    out.push_back(SparseAdmitBatchReply{
        {{0, "", true}, {0, "", false}, {int(StatusCode::kInvalidArgument), "bad generation", false}}});
    out.push_back(SparseManifestRequest{{3, 4}});
    out.push_back(SparseManifestReply{{SampleSource("a", 0), SampleSource("b", 1), SampleSource3D()}});
    out.push_back(SparseManifestReply{});
    out.push_back(SparseCurrentGenerationRequest{"layers.3.w1"});
    out.push_back(SparseCurrentGenerationReply{Generation{5, 6}});
    out.push_back(SparseCurrentGenerationReply{std::nullopt});
    {
        SparseReadRequest r;
        r.manifest = {SampleSource("layers.3.w1", 3), SampleSource3D()};
        r.targets = {SampleTarget(0), SampleTarget(1)};
        r.options.plan.limits.max_tiles_per_query = 1000;
        r.options.plan.limits.max_groups_per_query = 2000;
        r.options.plan.limits.max_regions = 3000;
        r.options.plan.read_coalesce_gap = 0;
        r.options.strategy = ReadStrategy::kFullSourcePerTarget;
        r.options.num_threads = 8;
        out.push_back(r);
    }
    out.push_back(SparseReadRequest{});
    {
        SparseReadRequest r;
        r.manifest = {SampleSource("layers.3.w1", 3)};
        r.targets = {SampleTarget(0)};
        r.step = Generation{2, 7};
        r.unchanged = {"norm.a", "norm.b"};
        out.push_back(r);
    }
    out.push_back(SparseReadReply{{SampleLocation(0), SampleLocation(1)}});
    out.push_back(SparseStepManifestRequest{{6, 7}});
    out.push_back(SparseStepManifestReply{{6, 7}, {SampleSource("a", 0)}, {"norm.a"}, true});
    out.push_back(SparseStepManifestReply{{0, 1}, {}, {}, false});
    out.push_back(SparseSealRequest{{6, 7}, {"a", "norm.a"}});
    out.push_back(SparseWaitRequest{{6, 7}, 2.5});
    out.push_back(SparseLatestRequest{});
    out.push_back(SparseLatestReply{Generation{6, 7}});
    out.push_back(SparseLatestReply{std::nullopt});
    out.push_back(SparseRetentionRequest{true, 3, std::nullopt});
    out.push_back(SparseRetentionRequest{false, 0, 2});
    out.push_back(SparseLatestRequest{true});
    out.push_back(SparseAnchorRequest{{9, 10}, {"a", "norm.a"}});
    out.push_back(SparseRetentionReply{3});
    out.push_back(MetricsRequest{true});
    out.push_back(ClearCachesRequest{});
    out.push_back(MetricsReply{{{"source_objects_put", 1},
                                {"range_gets", 2},
                                {"plan_seconds", 0.125},
                                {"nan", std::nan("")},
                                {"inf", -std::numeric_limits<double>::infinity()}}});
    {
        TensorPutRequest t;
        t.items.push_back({"w/0", DType::kBFloat16, {4096, 7168},
                           {BufferRef::Client(0, 4096ull * 7168 * 2), 0, 0, ""}, {}, {}});
        TensorLocation cuda{CudaRef(1 << 20, 4096), 0x7f0000000000ull, 20 << 20, "0000:3b:00.0"};
        t.items.push_back({"w/1", DType::kFloat32, {1024}, cuda, {}, {}});
        t.items.push_back(
            {"scalar", DType::kInt64, {}, {BufferRef::Client(64, 8), 0, 0, ""}, {}, {}});
        t.mode = PutMode::kUpsert;
        t.hard_pin = true;
        out.push_back(t);
        TensorGetRequest get{t.items};
        // w[:, 1024:2048] of a [16, 4096] bf16 parameter: the range covers the view's extent.
        TensorItem view{"w/2", DType::kBFloat16, {16, 1024},
                        {CudaRef(2048, (15 * 4096 + 1024) * 2), 0x7f0000000000ull, 20 << 20, ""},
                        {}, {}};
        view.strides = {4096, 1};
        get.items.push_back(view);
        out.push_back(get);
        // Dense box reads: rows [512, 1024) of a [1024, 1024] anchor into a client buffer, and
        // columns [256, 512) of it into a CUDA tensor.
        TensorGetRequest boxes;
        boxes.items.push_back({"anchor/w", DType::kFloat32, {512, 1024},
                               {BufferRef::Client(0, 512 * 1024 * 4), 0, 0, ""}, {}, {512, 0}});
        boxes.items.push_back({"anchor/w", DType::kFloat32, {1024, 256},
                               {CudaRef(0, 1024 * 256 * 4), 0x7f0000000000ull, 20 << 20, ""},
                               {}, {0, 256}});
        out.push_back(boxes);
    }
    {
        // A step's updates committed from the client's GPU: two updates in one exported
        // allocation (one of them a box of its tensor with its own tile shape).
        SparseCommitDeviceRequest d;
        DeviceUpdate a;
        a.tensor_id = "layers.3.mlp.experts.7.w1";
        a.global_shape = {2048, 7168};
        a.source_placement = Axes({{"ep", 3}});
        a.policy = PlacementPolicy::Owner("ep").value();
        a.generation = {3, 4};
        d.memory = {CudaRef(4096, 1024), 0x7f0000000000ull, 64 << 20, "0000:3b:00.0"};
        a.indices = {DType::kUInt16, {41, 2}, 0, 41 * 2 * 2};
        a.values = {DType::kBFloat16, {41}, 256, 41 * 2};
        DeviceUpdate b = a;
        b.tensor_id = "layers.3.self_attn.q_proj";
        b.global_offset = Shape{1024, 0};
        b.local_shape = Shape{1024, 7168};
        b.tile_shape = Shape{128, 896};
        b.apply = ApplyMode::kScatterAdd;
        b.duplicates = DuplicatePolicy::kSum;
        b.hard_pin = false;
        b.values.dtype = DType::kFloat32;
        b.indices.offset = 512;
        b.values = {DType::kFloat32, {41}, 768, 41 * 4};
        d.items = {a, b};
        out.push_back(d);
        SparseCommitDeviceRequest empty;
        empty.memory = {CudaRef(0, 0), 0x7f0000000000ull, 64 << 20, ""};
        out.push_back(empty);
    }
    {
        // A read's target objects into one device allocation of the client.
        LeasesToDeviceRequest l;
        l.items = {{3, "indices", 0}, {3, "values", 4096}, {0xfeedfacecafebeefull, "values", 1 << 20}};
        l.destination = {CudaRef(0, 64 << 20), 0x7f0000000000ull, 64 << 20, "0000:3b:00.0"};
        out.push_back(l);
    }
    {
        // A device read planned by the daemon: a step's sources, the targets of two ranks and
        // an unchanged tensor; the plan of two ranges of one leased source, one boundary piece.
        SparseReadPlanRequest p;
        p.step = {4, 5};
        p.manifest = {SampleSource("layers.3.w1", 3)};
        p.targets = {SampleTarget(0), SampleTarget(1)};
        p.unchanged = {"u"};
        p.options.plan.read_coalesce_gap = 2;
        p.options.num_threads = 4;
        out.push_back(p);
        SparseReadPlanReply r;
        r.sources = {{17, {2, 4096, 400}, {2, 4608, 200}, 0, 1, true}};
        r.ranges = {{0, 0, 0, 120, 0, 60}, {0, 0, 200, 80, 100, 40}};
        r.pieces = {{0, 0, 30, std::nullopt}, {1, 0, 20, Box::Make({40, 0}, {8, 16}).value()}};
        r.targets = {{2, 0}, {0, 0xffffffffu}};
        out.push_back(r);
        LeaseRangesToDeviceRequest c;
        c.items = {{17, 0, 0, 120, 0}, {17, 0, 200, 80, 208}, {17, 1, 0, 60, 512}};
        c.destination = {CudaRef(0, 64 << 20), 0x7f0000000000ull, 64 << 20, "0000:3b:00.0"};
        c.ready_event.assign(kCudaIpcHandleBytes, '\x5a');  // the client's CUDA IPC event
        out.push_back(c);
    }
    {
        // A read of a sealed step by its generation: the targets of two ranks.
        SparseReadStepRequest r;
        r.step = {4, 5};
        r.targets = {SampleTarget(0), SampleTarget(1)};
        r.options.num_threads = 4;
        out.push_back(r);
    }
    {
        // A device read planned by the daemon with its own manifest of a sealed step.
        SparseReadPlanRequest p;
        p.step = {4, 5};
        p.targets = {SampleTarget(1)};
        p.options.num_threads = 2;
        p.sealed_entries = 69608;
        p.target_set = 3;  // kept for the connection's later reads
        out.push_back(p);
    }
    {
        // The next step's read of the same targets, named by the id they are kept under, its
        // ranges copied to the client's device as the daemon plans them.
        SparseReadPlanRequest p;
        p.step = {5, 6};
        p.options.num_threads = 2;
        p.sealed_entries = 69608;
        p.target_set = 3;
        p.to_device = PlanToDevice{
            {CudaRef(0, 64 << 20), 0x7f0000000000ull, 64 << 20, "0000:3b:00.0"},
            std::string(kCudaIpcHandleBytes, '\x5a')};
        out.push_back(p);
        SparseReadPlanReply r;
        r.sources = {{18, {2, 4096, 400}, {2, 4608, 200}, 0, 1, true}};
        r.ranges = {{0, 0, 0, 120, 0, 60}, {0, 0, 200, 80, 100, 40}};
        r.pieces = {{0, 0, 30, std::nullopt}, {1, 0, 20, std::nullopt}};
        r.targets = {{2, 0}};
        r.staged_at = {0, 320, 200, 420};  // range by range: indices, values; as they lie
        out.push_back(r);
    }
    return out;
}

std::string NameOf(const Message& m) { return std::string(MessageTypeName(TypeOf(m))); }

std::vector<std::byte> Bytes(std::initializer_list<int> v) {
    std::vector<std::byte> out;
    for (int b : v) out.push_back(static_cast<std::byte>(b));
    return out;
}

/// Decodes `payload` as `type`, and when that succeeds checks the round-trip property: the
/// decoded message re-encodes, decodes to an equal message, and that encoding is canonical.
void DecodeAndCheckRoundTrip(MessageType type, std::span<const std::byte> payload) {
    auto m = DecodePayload(type, payload);
    if (!m.ok()) {
        EXPECT_THAT(m, StatusIs(StatusCode::kInvalidArgument));
        return;
    }
    auto again = EncodePayload(*m);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    auto m2 = DecodePayload(type, *again);
    ASSERT_TRUE(m2.ok()) << m2.status().ToString();
    EXPECT_TRUE(*m2 == *m);
    auto third = EncodePayload(*m2);
    ASSERT_TRUE(third.ok());
    EXPECT_EQ(*third, *again);
}

// ---- Round trips -----------------------------------------------------------------------------

TEST(WireTest, SamplesCoverEveryMessageType) {
    std::set<std::size_t> seen;
    for (const Message& m : SampleMessages()) seen.insert(m.index());
    EXPECT_EQ(seen.size(), std::variant_size_v<Message>);
}

TEST(WireTest, EveryMessageRoundTripsThroughAFrame) {
    std::uint64_t id = 1;
    for (const Message& m : SampleMessages()) {
        SCOPED_TRACE(NameOf(m));
        auto bytes = EncodeFrame(m, id);
        ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
        auto frame = DecodeFrame(*bytes);
        ASSERT_TRUE(frame.ok()) << frame.status().ToString();
        EXPECT_EQ(frame->header.type, TypeOf(m));
        EXPECT_EQ(frame->header.request_id, id);
        EXPECT_EQ(frame->header.version, kWireVersion);
        EXPECT_EQ(frame->header.flags, 0u);
        EXPECT_EQ(frame->header.payload_len, bytes->size() - kFrameHeaderBytes);
        auto decoded = DecodeMessage(*frame);
        ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
        EXPECT_TRUE(*decoded == m);

        auto payload = EncodePayload(m);
        ASSERT_TRUE(payload.ok());
        EXPECT_TRUE(std::equal(payload->begin(), payload->end(),
                               bytes->begin() + kFrameHeaderBytes, bytes->end()));
        id = id * 31 + 0x100000001ull;
    }
}

TEST(WireTest, FramesEncodedIntoOneBufferAreTheFramesEncodedAlone) {
    // Each message encoded into the buffer the previous one left (larger or smaller): the
    // bytes are exactly EncodeFrame's, with nothing of the previous frame left over.
    std::vector<std::byte> out;
    std::uint64_t id = 7;
    for (const Message& m : SampleMessages()) {
        SCOPED_TRACE(NameOf(m));
        auto alone = EncodeFrame(m, id);
        ASSERT_TRUE(alone.ok());
        MCS_ASSERT_OK(EncodeFrameInto(m, id, out));
        EXPECT_TRUE(out == *alone);
        ++id;
    }
    // A message that does not encode leaves no frame behind.
    PutRequest bad;
    bad.key.assign(kMaxKeyBytes + 1, 'k');
    EXPECT_THAT(EncodeFrameInto(bad, 1, out), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_TRUE(out.empty());
}

TEST(WireTest, TypedEncodeAndDecode) {
    PutRequest p;
    p.key = "k";
    p.members.push_back({"m", DType::kUInt8, {3}, 5, BufferRef::Client(0, 3)});
    auto bytes = EncodeFrame(p, 17);
    ASSERT_TRUE(bytes.ok());
    auto frame = DecodeFrame(*bytes);
    ASSERT_TRUE(frame.ok());
    auto typed = DecodePayloadAs<PutRequest>(frame->payload);
    ASSERT_TRUE(typed.ok());
    EXPECT_EQ(*typed, p);
    EXPECT_THAT(DecodePayloadAs<StatRequest>(frame->payload),
                StatusIs(StatusCode::kInvalidArgument));
}

TEST(WireTest, HeaderLayoutIsLittleEndian) {
    auto bytes = EncodeFrame(RemoveRequest{"ab"}, 0x0102030405060708ull);
    ASSERT_TRUE(bytes.ok());
    const std::vector<std::byte> expected = Bytes({
        'M', 'C', 'S', 'P',                              // magic
        0x01, 0x00,                                      // version 1
        0x0f, 0x00,                                      // type kRemove = 15
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // request_id
        0x06, 0x00, 0x00, 0x00,                          // payload_len
        0x00, 0x00, 0x00, 0x00,                          // flags
        0x02, 0x00, 0x00, 0x00, 'a', 'b',                // key
    });
    EXPECT_EQ(*bytes, expected);
}

TEST(WireTest, TensorLocationBoundsAreChecked) {
    // A CUDA range past its allocation, and CUDA fields on a client-buffer location, never
    // encode and never decode.
    TensorGetRequest bad;
    bad.items.push_back({"k", DType::kUInt8, {16}, {CudaRef(8, 16), 0x1000, 20, ""}, {}, {}});
    EXPECT_THAT(EncodeFrame(bad, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "allocation"));
    bad.items[0].location = {BufferRef::Client(0, 16), 0x1000, 0, ""};
    EXPECT_THAT(EncodeFrame(bad, 1), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(EncodeFrame(TensorPutRequest{}, 1), StatusIs(StatusCode::kInvalidArgument));

    TensorGetRequest good;
    good.items.push_back({"k", DType::kUInt8, {16}, {CudaRef(4, 16), 0x1000, 20, ""}, {}, {}});
    auto frame = EncodeFrame(good, 1);
    ASSERT_TRUE(frame.ok());
    // Grow the offset in place (the BufferRef offset follows key, dtype, shape and kind).
    std::vector<std::byte> bytes = *frame;
    const std::size_t offset_at = kFrameHeaderBytes + 4 + 4 + 1 + 1 + 4 + 8 + 1;
    ASSERT_EQ(std::to_integer<int>(bytes[offset_at]), 4);
    bytes[offset_at] = std::byte{5};
    auto decoded = DecodeFrame(bytes);
    ASSERT_TRUE(decoded.ok());
    EXPECT_THAT(DecodeMessage(*decoded), StatusIsWithMessage(StatusCode::kInvalidArgument, "allocation"));
}

TEST(WireTest, DeviceCommitMembersLieInTheRequestsMemory) {
    // Every member of a device commit is a range of the request's one CUDA memory: a member
    // past its end, an offset and size that overflow, or memory that is not CUDA memory never
    // encode and never decode.
    SparseCommitDeviceRequest req;
    req.memory = {CudaRef(0, 100), 0x7f0000000000ull, 1 << 20, ""};
    DeviceUpdate u;
    u.tensor_id = "w";
    u.global_shape = {8, 8};
    u.generation = {0, 1};
    u.indices = {DType::kUInt8, {10, 2}, 0, 20};
    u.values = {DType::kFloat32, {10}, 60, 40};  // ends at 100: inside
    req.items = {u};
    auto frame = EncodeFrame(req, 1);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    auto decoded = DecodeFrame(*frame);
    ASSERT_TRUE(decoded.ok());
    auto message = DecodeMessage(*decoded);
    ASSERT_TRUE(message.ok()) << message.status().ToString();
    EXPECT_EQ(std::get<SparseCommitDeviceRequest>(*message), req);

    SparseCommitDeviceRequest past = req;
    past.items[0].values.offset = 61;
    EXPECT_THAT(EncodeFrame(past, 1),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "outside the 100 bytes"));
    SparseCommitDeviceRequest wraps = req;
    wraps.items[0].indices.offset = ~std::uint64_t{0} - 3;
    EXPECT_THAT(EncodeFrame(wraps, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "overflow"));
    SparseCommitDeviceRequest host = req;
    host.memory = {BufferRef::Client(0, 100), 0, 0, ""};
    EXPECT_THAT(EncodeFrame(host, 1),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "not in CUDA memory"));

    // The same member grown past the memory on the wire is refused on decode. The request's
    // last field is the values member's size (u64, little-endian): 40 -> 41.
    std::vector<std::byte> bytes = *frame;
    ASSERT_EQ(std::to_integer<int>(bytes[bytes.size() - 8]), 40);
    bytes[bytes.size() - 8] = std::byte{41};
    auto grown = DecodeFrame(bytes);
    ASSERT_TRUE(grown.ok());
    EXPECT_THAT(DecodeMessage(*grown),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "outside the 100 bytes"));
}

TEST(WireTest, TensorBoxOriginRoundTripsAndIsChecked) {
    TensorGetRequest get;
    get.items.push_back({"k", DType::kFloat32, {4, 2}, {BufferRef::Client(0, 32), 0, 0, ""}, {},
                         {3, 6}});
    auto frame = EncodeFrame(get, 7);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    auto decoded = DecodeFrame(*frame);
    ASSERT_TRUE(decoded.ok());
    auto message = DecodeMessage(*decoded);
    ASSERT_TRUE(message.ok());
    EXPECT_EQ(std::get<TensorGetRequest>(*message), get);

    TensorGetRequest bad = get;
    bad.items[0].box_origin = {3};  // another rank
    EXPECT_THAT(EncodeFrame(bad, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "rank"));
    bad.items[0].box_origin = {-1, 0};
    EXPECT_THAT(EncodeFrame(bad, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "negative"));
    TensorPutRequest put;
    put.items = get.items;  // a put names no box
    EXPECT_THAT(EncodeFrame(put, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "box"));
}

TEST(WireTest, TensorStridesRoundTripAndAreChecked) {
    TensorGetRequest get;
    TensorItem view{"k", DType::kFloat32, {4, 2},
                    {CudaRef(0, (3 * 8 + 2) * 4), 0x1000, 4096, ""}, {}, {}};
    view.strides = {8, 1};
    get.items.push_back(view);
    auto frame = EncodeFrame(get, 7);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    auto decoded = DecodeFrame(*frame);
    ASSERT_TRUE(decoded.ok());
    auto message = DecodeMessage(*decoded);
    ASSERT_TRUE(message.ok());
    EXPECT_EQ(std::get<TensorGetRequest>(*message), get);
    // One stride per extent, and only on a CUDA location (host views are copied by the client).
    get.items[0].strides = {8};
    EXPECT_THAT(EncodeFrame(get, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "rank"));
    get.items[0].strides = {8, 1};
    get.items[0].location = {BufferRef::Client(0, 32), 0, 0, ""};
    EXPECT_THAT(EncodeFrame(get, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "CUDA"));
}

TEST(WireTest, MessageTypesAreStable) {
    // Both sides of the socket may be different builds: these numbers are the protocol.
    EXPECT_EQ(static_cast<int>(MessageType::kHello), 1);
    EXPECT_EQ(static_cast<int>(MessageType::kError), 3);
    EXPECT_EQ(static_cast<int>(MessageType::kPut), 10);
    EXPECT_EQ(static_cast<int>(MessageType::kSparseCommit), 30);
    EXPECT_EQ(static_cast<int>(MessageType::kMetricsReply), 41);
    EXPECT_EQ(static_cast<int>(MessageType::kTensorPut), 50);
    EXPECT_EQ(static_cast<int>(MessageType::kTensorGet), 51);
    for (const Message& m : SampleMessages()) {
        EXPECT_NE(MessageTypeName(TypeOf(m)), "Unknown");
        EXPECT_TRUE(IsKnownMessageType(static_cast<std::uint16_t>(TypeOf(m))));
    }
    EXPECT_FALSE(IsKnownMessageType(0));
    EXPECT_FALSE(IsKnownMessageType(6));
    EXPECT_FALSE(IsKnownMessageType(0xffff));
    EXPECT_TRUE(IsReplyType(MessageType::kError));
    EXPECT_TRUE(IsReplyType(MessageType::kSparseReadReply));
    EXPECT_FALSE(IsReplyType(MessageType::kSparseRead));
    EXPECT_FALSE(IsReplyType(MessageType::kHello));
}

TEST(WireTest, MinBytesAreTheShortestEncodings) {
    // A decoder trusts a count only when count * MinBytes of its element is present; a minimum
    // above the shortest encoding would reject valid messages.
    EXPECT_EQ(MinBytes<std::int64_t>(), 8u);
    EXPECT_EQ(MinBytes<std::string>(), 4u);
    EXPECT_EQ(MinBytes<BufferRef>(), 1u + 8 + 8);
    EXPECT_EQ(MinBytes<SegmentSlice>(), 4u + 8 + 8);
    EXPECT_EQ(MinBytes<SegmentInfo>(), 4u + 8 + 1);
    EXPECT_EQ(MinBytes<NamedAxes::Entry>(), 4u + 8);
    EXPECT_EQ(MinBytes<MemberInfo>(), 4u + 1 + 4 + 8 + 8);
    EXPECT_EQ(MinBytes<PutMember>(), 4u + 1 + 4 + 8 + 17);
    EXPECT_EQ(MinBytes<RangeItem>(), 2 * 4u + 16 + 17);
    EXPECT_EQ(MinBytes<Box>(), 4u + 4);
    EXPECT_EQ(MinBytes<SourceDescriptor>(), 2 * 4u + 4 + 8 + 16 + 4 + 1 + 4 + 4 + 16 + 3);
    EXPECT_EQ(MinBytes<TargetDescriptor>(), 3 * 4u + 4 + 8);
    EXPECT_EQ(MinBytes<ReadTargetLocation>(), 16u + 4 + 8 + 8 + 3 + 4 * 28 + 8);
    EXPECT_EQ(MinBytes<MetricItem>(), 4u + 8);
    // ... + strides count + box origin count
    EXPECT_EQ(MinBytes<TensorItem>(), 4u + 1 + 4 + 17 + 8 + 8 + 4 + 4 + 4);
    for (const Message& m : SampleMessages()) {
        auto payload = EncodePayload(m);
        ASSERT_TRUE(payload.ok());
        std::visit([&](const auto& msg) {
            EXPECT_GE(payload->size(), MinBytes<std::decay_t<decltype(msg)>>()) << NameOf(m);
        }, m);
    }
}

// ---- Truncation ------------------------------------------------------------------------------

TEST(WireTest, EveryTruncationOfEveryPayloadFailsCleanly) {
    for (const Message& m : SampleMessages()) {
        SCOPED_TRACE(NameOf(m));
        auto payload = EncodePayload(m);
        ASSERT_TRUE(payload.ok());
        for (std::size_t len = 0; len < payload->size(); ++len) {
            auto r = DecodePayload(TypeOf(m), std::span(*payload).first(len));
            ASSERT_THAT(r, StatusIsWithMessage(StatusCode::kInvalidArgument,
                                               "truncated message: need "))
                << "prefix of " << len << " bytes";
        }
    }
}

TEST(WireTest, EveryTruncationOfEveryFrameFailsCleanly) {
    for (const Message& m : SampleMessages()) {
        SCOPED_TRACE(NameOf(m));
        auto bytes = EncodeFrame(m, 5);
        ASSERT_TRUE(bytes.ok());
        for (std::size_t len = 0; len < bytes->size(); ++len) {
            ASSERT_THAT(DecodeFrame(std::span(*bytes).first(len)),
                        StatusIsWithMessage(StatusCode::kInvalidArgument, "truncated message"))
                << "prefix of " << len << " bytes";
        }
    }
}

TEST(WireTest, TruncationMessageNamesSizes) {
    const std::vector<std::byte> bytes = Bytes({1, 2, 3});
    WireReader r(bytes);
    EXPECT_TRUE(r.ReadU8().ok());
    EXPECT_THAT(r.ReadU64(), StatusIsWithMessage(StatusCode::kInvalidArgument,
                                                 "truncated message: need 8 bytes at offset 1, "
                                                 "have 2"));
    EXPECT_EQ(r.offset(), 1u);  // A failed read does not advance.
    EXPECT_EQ(*r.ReadU16(), 0x0302);
    EXPECT_TRUE(r.ExpectEnd().ok());
}

TEST(WireTest, TrailingBytesAreRejected) {
    for (const Message& m : SampleMessages()) {
        SCOPED_TRACE(NameOf(m));
        auto payload = EncodePayload(m);
        ASSERT_TRUE(payload.ok());
        payload->push_back(std::byte{0});
        EXPECT_THAT(DecodePayload(TypeOf(m), *payload),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "trailing"));
    }
    auto frame = EncodeFrame(OkReply{}, 1);
    ASSERT_TRUE(frame.ok());
    frame->push_back(std::byte{0});
    EXPECT_THAT(DecodeFrame(*frame), StatusIsWithMessage(StatusCode::kInvalidArgument,
                                                         "after its payload"));
}

// ---- Header validation -----------------------------------------------------------------------

std::vector<std::byte> Header(std::uint32_t magic, std::uint16_t version, std::uint16_t type,
                              std::uint32_t payload_len, std::uint32_t flags) {
    WireWriter w;
    w.WriteU32(magic);
    w.WriteU16(version);
    w.WriteU16(type);
    w.WriteU64(1);
    w.WriteU32(payload_len);
    w.WriteU32(flags);
    return std::move(w).Take();
}

TEST(WireTest, HeaderValidation) {
    const auto ok = static_cast<std::uint16_t>(MessageType::kOk);
    EXPECT_TRUE(DecodeFrame(Header(kWireMagic, 1, ok, 0, 0)).ok());
    EXPECT_THAT(DecodeFrameHeader(Header(0x50534340, 1, ok, 0, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "magic"));
    EXPECT_THAT(DecodeFrameHeader(Header(kWireMagic, 2, ok, 0, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "version"));
    EXPECT_THAT(DecodeFrameHeader(Header(kWireMagic, 0, ok, 0, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "version"));
    for (std::uint16_t t : {0, 6, 9, 43, 999, 0xffff}) {
        EXPECT_THAT(DecodeFrameHeader(Header(kWireMagic, 1, t, 0, 0)),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "unknown message type"));
    }
    EXPECT_THAT(DecodeFrameHeader(Header(kWireMagic, 1, ok, 0, 1)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "flags"));
    EXPECT_THAT(DecodeFrameHeader(Header(kWireMagic, 1, ok, kMaxPayloadBytes + 1, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "exceeds the limit"));
    EXPECT_THAT(DecodeFrameHeader(Header(kWireMagic, 1, ok, 0xffffffffu, 0)),
                StatusIs(StatusCode::kInvalidArgument));
    // The header alone is fine; the frame then lacks its payload.
    EXPECT_TRUE(DecodeFrameHeader(Header(kWireMagic, 1, ok, kMaxPayloadBytes, 0)).ok());
    EXPECT_THAT(DecodeFrame(Header(kWireMagic, 1, ok, kMaxPayloadBytes, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "truncated"));
    // A non-empty OkReply payload.
    auto h = Header(kWireMagic, 1, ok, 1, 0);
    h.push_back(std::byte{0});
    auto frame = DecodeFrame(h);
    ASSERT_TRUE(frame.ok());
    EXPECT_THAT(DecodeMessage(*frame), StatusIsWithMessage(StatusCode::kInvalidArgument, "trailing"));
}

// ---- Limits ----------------------------------------------------------------------------------

TEST(WireTest, OversizedStringLengthsAreRejected) {
    for (std::uint32_t len : {std::uint32_t(kMaxKeyBytes + 1), 0x7fffffffu, 0xffffffffu}) {
        WireWriter w;
        w.WriteU32(len);
        w.WriteString("abc", 3, "x");
        EXPECT_THAT(DecodePayload(MessageType::kStat, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "exceeds the limit"));
    }
    // Within the limit but past the end: truncated, and nothing of that size is allocated.
    WireWriter w;
    w.WriteU32(kMaxKeyBytes);
    EXPECT_THAT(DecodePayload(MessageType::kStat, w.bytes()),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "truncated message: need 16384"));
}

TEST(WireTest, OversizedCountsAreRejected) {
    {
        WireWriter w;
        w.WriteU32(kMaxBatchItems + 1);
        EXPECT_THAT(DecodePayload(MessageType::kReadRanges, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "exceeds the limit"));
    }
    {
        // A count within the limit whose elements cannot fit in the bytes left.
        WireWriter w;
        w.WriteU32(kMaxBatchItems);
        for (int i = 0; i < 100; ++i) w.WriteU8(0);
        EXPECT_THAT(DecodePayload(MessageType::kReadRanges, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "truncated message"));
    }
    {
        WireWriter w;
        w.WriteU32(kMaxListKeys);
        EXPECT_THAT(DecodePayload(MessageType::kListReply, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "truncated message"));
    }
    {
        // Shapes are capped at kMaxRank.
        WireWriter w;
        w.WriteString("k", 10, "k");
        w.WriteString("", 10, "m");
        w.WriteU32(1);
        w.WriteString("n", 10, "n");
        w.WriteU8(0);
        w.WriteU32(kMaxRank + 1);
        for (std::size_t i = 0; i <= kMaxRank; ++i) w.WriteI64(1);
        EXPECT_THAT(DecodePayload(MessageType::kPut, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "member shape count 9"));
    }
    {
        WireWriter w;
        w.WriteU32(kMaxSegments + 1);
        EXPECT_THAT(DecodePayload(MessageType::kRelease, w.bytes()),
                    StatusIs(StatusCode::kInvalidArgument));
    }
}

TEST(WireTest, EncodeEnforcesTheSameLimits) {
    EXPECT_THAT(EncodeFrame(StatRequest{std::string(kMaxKeyBytes + 1, 'k')}, 1),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "key"));
    EXPECT_TRUE(EncodeFrame(StatRequest{std::string(kMaxKeyBytes, 'k')}, 1).ok());
    EXPECT_THAT(EncodeFrame(ErrorReply{StatusCode::kOk, "x"}, 1),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(EncodeFrame(ErrorReply{static_cast<StatusCode>(99), "x"}, 1),
                StatusIs(StatusCode::kInvalidArgument));
    BufferRef bad = CudaRef(0, 1);
    bad.cuda_ipc_handle.pop_back();
    EXPECT_THAT(EncodeFrame(ReadMemberRequest{"k", "m", bad}, 1),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "cuda_ipc_handle"));
    BufferRef client_with_device = BufferRef::Client(0, 1);
    client_with_device.device = 0;
    EXPECT_THAT(EncodeFrame(ReadMemberRequest{"k", "m", client_with_device}, 1),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(EncodeFrame(ReadMemberRequest{"k", "m", BufferRef::Client(~0ull, 2)}, 1),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "overflows"));
    EXPECT_THAT(EncodeFrame(ReleaseRequest{}, 1), StatusIs(StatusCode::kInvalidArgument));
    HelloReply dup;
    dup.segments = {{1, 10, true}, {1, 20, true}};
    EXPECT_THAT(EncodeFrame(dup, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "repeated"));
    LeaseReply lease;
    lease.info = SampleInfo();
    EXPECT_THAT(EncodeFrame(lease, 1), StatusIsWithMessage(StatusCode::kInvalidArgument, "locations"));
    SparseCommitRequest commit;
    commit.desc = SampleSource("t", 1);
    commit.coordinate_space = "sideways";
    EXPECT_THAT(EncodeFrame(commit, 1),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "coordinate_space"));
    SparseManifestRequest gen;  // {0, 0}: delta must exceed base.
    EXPECT_THAT(EncodeFrame(gen, 1), StatusIs(StatusCode::kInvalidArgument));
}

TEST(WireTest, FramesBeyondTheSizeLimitAreResourceExhausted) {
    ListReply big;
    const std::string key(kMaxKeyBytes, 'k');
    big.keys.assign(kMaxFrameBytes / kMaxKeyBytes + 1, key);
    EXPECT_THAT(EncodeFrame(big, 1), StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(EncodePayload(big), StatusIs(StatusCode::kResourceExhausted));
}

// ---- Enum and value validation ---------------------------------------------------------------

/// A payload of one PutRequest member with the given dtype byte and put mode byte.
std::vector<std::byte> PutPayload(std::uint8_t dtype, std::uint8_t mode, std::uint8_t hard_pin,
                                  std::uint8_t buffer_kind) {
    WireWriter w;
    w.WriteString("key", 100, "key");
    w.WriteString("", 100, "metadata");
    w.WriteU32(1);
    w.WriteString("m", 100, "name");
    w.WriteU8(dtype);
    w.WriteI64Vector(std::vector<std::int64_t>{2}, 8, "shape");
    w.WriteU64(0);
    w.WriteU8(buffer_kind);
    w.WriteU64(0);
    w.WriteU64(2);
    w.WriteU8(mode);
    w.WriteU8(hard_pin);
    return std::move(w).Take();
}

TEST(WireTest, EnumsAreValidated) {
    EXPECT_TRUE(DecodePayload(MessageType::kPut, PutPayload(0, 0, 0, 0)).ok());
    EXPECT_TRUE(DecodePayload(MessageType::kPut, PutPayload(kNumDTypes - 1, 1, 1, 0)).ok());
    EXPECT_THAT(DecodePayload(MessageType::kPut, PutPayload(kNumDTypes, 0, 0, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "unknown dtype 15"));
    EXPECT_THAT(DecodePayload(MessageType::kPut, PutPayload(255, 0, 0, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "unknown dtype"));
    EXPECT_THAT(DecodePayload(MessageType::kPut, PutPayload(0, 2, 0, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "unknown put mode"));
    EXPECT_THAT(DecodePayload(MessageType::kPut, PutPayload(0, 0, 2, 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "invalid bool"));
    EXPECT_THAT(DecodePayload(MessageType::kPut, PutPayload(0, 0, 0, 2)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "unknown buffer kind"));

    for (std::uint32_t code : {0u, static_cast<std::uint32_t>(kLastStatusCode) + 1, 0xffffffffu}) {
        WireWriter w;
        w.WriteU32(code);
        w.WriteString("m", 10, "m");
        EXPECT_THAT(DecodePayload(MessageType::kError, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "invalid status code"));
    }
    for (std::uint32_t code = 1; code <= static_cast<std::uint32_t>(kLastStatusCode); ++code) {
        WireWriter w;
        w.WriteU32(code);
        w.WriteString("m", 10, "m");
        auto e = DecodePayloadAs<ErrorReply>(w.bytes());
        ASSERT_TRUE(e.ok());
        EXPECT_EQ(static_cast<std::uint32_t>(e->code), code);
    }
    {
        WireWriter w;
        w.WriteU8(2);
        EXPECT_THAT(DecodePayload(MessageType::kMetrics, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "invalid bool"));
    }
}

/// The payload of a SparseAdmitRequest with a raw policy kind and axis.
std::vector<std::byte> AdmitPayload(std::uint64_t base, std::uint64_t delta, std::uint8_t kind,
                                    std::string axis, std::string placement_axis,
                                    std::int64_t ordinal) {
    WireWriter w;
    w.WriteString("t", 10, "t");
    w.WriteU64(base);
    w.WriteU64(delta);
    w.WriteU8(kind);
    w.WriteString(axis, 100, "axis");
    w.WriteU32(1);
    w.WriteString(placement_axis, 100, "axis");
    w.WriteI64(ordinal);
    w.WriteString("writer", 10, "w");
    return std::move(w).Take();
}

TEST(WireTest, PlannerValuesAreValidatedOnDecode) {
    EXPECT_TRUE(DecodePayload(MessageType::kSparseAdmit, AdmitPayload(0, 1, 1, "ep", "ep", 0)).ok());
    EXPECT_THAT(DecodePayload(MessageType::kSparseAdmit, AdmitPayload(1, 1, 1, "ep", "ep", 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "delta generation"));
    EXPECT_THAT(DecodePayload(MessageType::kSparseAdmit, AdmitPayload(0, 1, 3, "ep", "ep", 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "unknown placement policy kind"));
    EXPECT_THAT(DecodePayload(MessageType::kSparseAdmit, AdmitPayload(0, 1, 0, "ep", "ep", 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "'none' carries an axis"));
    EXPECT_THAT(DecodePayload(MessageType::kSparseAdmit, AdmitPayload(0, 1, 1, "9x", "ep", 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "policy axis"));
    EXPECT_THAT(DecodePayload(MessageType::kSparseAdmit, AdmitPayload(0, 1, 2, "ep", "e p", 0)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "axis name"));
    EXPECT_THAT(DecodePayload(MessageType::kSparseAdmit, AdmitPayload(0, 1, 2, "ep", "ep", -1)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "negative ordinal"));

    // A SourceDescriptor that fails SourceDescriptor::Make (box outside the tensor).
    SourceDescriptor d = SampleSource("t", 0);
    d.box = Box::Make({1024, 0}, {2048, 7168}).value();
    WireWriter w;
    w.WriteU32(1);
    Encode(w, d);
    EXPECT_THAT(DecodePayload(MessageType::kSparseManifestReply, w.bytes()),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "not inside global_shape"));

    // SparseReadOptions: read_coalesce_gap < -1 and an unknown strategy.
    for (auto [gap, strategy, what] :
         {std::tuple<std::int64_t, std::uint8_t, const char*>{-2, 0, "read_coalesce_gap"},
          {0, 2, "unknown read strategy"}}) {
        WireWriter o;
        o.WriteU32(0);
        o.WriteU32(0);
        o.WriteU64(1);
        o.WriteU64(1);
        o.WriteU64(1);
        o.WriteI64(gap);
        o.WriteU8(strategy);
        o.WriteU32(0);
        EXPECT_THAT(DecodePayload(MessageType::kSparseRead, o.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, what));
    }
}

TEST(WireTest, StructuralChecksOnDecode) {
    {
        WireWriter w;  // HelloReply with a repeated segment id.
        w.WriteU32(1);
        w.WriteString("", 1, "v");
        w.WriteString("", 1, "n");
        w.WriteU32(2);
        Encode(w, SegmentInfo{4, 1, true});
        Encode(w, SegmentInfo{4, 2, false});
        w.WriteU64(0);
        EXPECT_THAT(DecodePayload(MessageType::kHelloReply, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "repeated"));
    }
    {
        WireWriter w;  // Segment slice whose end overflows.
        w.WriteU32(1);
        w.WriteU32(0);
        Encode(w, SegmentSlice{0, ~0ull, 1});
        EXPECT_FALSE(w.status().ok());
    }
    {
        WireWriter w;  // Release of no ids.
        w.WriteU32(0);
        EXPECT_THAT(DecodePayload(MessageType::kRelease, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "no lease ids"));
    }
    {
        WireWriter w;  // A CUDA reference whose handle is short.
        w.WriteString("k", 10, "k");
        w.WriteString("m", 10, "m");
        w.WriteU8(1);
        w.WriteU64(0);
        w.WriteU64(1);
        w.WriteString("short", 64, "h");
        w.WriteU32(0);
        EXPECT_THAT(DecodePayload(MessageType::kReadMember, w.bytes()),
                    StatusIsWithMessage(StatusCode::kInvalidArgument, "cuda_ipc_handle must be"));
    }
}

// ---- Replies ---------------------------------------------------------------------------------

TEST(WireTest, DecodeReplyAsMapsErrorsToStatus) {
    auto err = EncodeFrame(ErrorReply::FromStatus(NotFound("no such key 'x'")), 3);
    ASSERT_TRUE(err.ok());
    auto f = DecodeFrame(*err);
    ASSERT_TRUE(f.ok());
    auto r = DecodeReplyAs<StatReply>(*f);
    EXPECT_THAT(r, StatusIsWithMessage(StatusCode::kNotFound, "no such key 'x'"));

    auto ok = EncodeFrame(OkReply{}, 4);
    ASSERT_TRUE(ok.ok());
    auto f2 = DecodeFrame(*ok);
    ASSERT_TRUE(f2.ok());
    EXPECT_TRUE(DecodeReplyAs<OkReply>(*f2).ok());
    EXPECT_THAT(DecodeReplyAs<StatReply>(*f2),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "expected a StatReply"));
}

TEST(WireTest, ErrorReplyFromStatus) {
    EXPECT_EQ(ErrorReply::FromStatus(Status::Ok()).code, StatusCode::kInternal);
    ErrorReply long_message = ErrorReply::FromStatus(Internal(std::string(kMaxMessageBytes * 2, 'x')));
    EXPECT_EQ(long_message.message.size(), kMaxMessageBytes);
    EXPECT_TRUE(EncodeFrame(long_message, 1).ok());
    EXPECT_EQ(ErrorReply::FromStatus(Status(static_cast<StatusCode>(77), "?")).code,
              StatusCode::kInternal);
    const Status s = PermissionDenied("nope");
    EXPECT_EQ(ErrorReply::FromStatus(s).ToStatus(), s);
}

// ---- Hostile input ---------------------------------------------------------------------------

TEST(WireTest, MutatedEncodingsNeverCrashAndRoundTripWhenAccepted) {
    for (const Message& m : SampleMessages()) {
        SCOPED_TRACE(NameOf(m));
        auto payload = EncodePayload(m);
        ASSERT_TRUE(payload.ok());
        for (std::size_t i = 0; i < payload->size(); ++i) {
            for (std::uint8_t x : {0x01, 0x80, 0xff}) {
                std::vector<std::byte> mutated = *payload;
                mutated[i] ^= static_cast<std::byte>(x);
                DecodeAndCheckRoundTrip(TypeOf(m), mutated);
                if (HasFatalFailure()) return;
            }
        }
    }
}

TEST(WireTest, RandomBytesNeverCrash) {
    std::mt19937_64 rng(12345);
    std::vector<std::uint16_t> types;
    for (const Message& m : SampleMessages()) types.push_back(static_cast<std::uint16_t>(TypeOf(m)));
    for (int iter = 0; iter < 20000; ++iter) {
        std::vector<std::byte> bytes(rng() % 300);
        for (auto& b : bytes) b = static_cast<std::byte>(rng() % 4 == 0 ? 0 : rng());
        const auto type = static_cast<MessageType>(types[rng() % types.size()]);
        DecodeAndCheckRoundTrip(type, bytes);
        if (HasFatalFailure()) return;
        (void)DecodeFrame(bytes);
    }
}

// ---- Fuzz corpus -----------------------------------------------------------------------------

/// fuzz/corpus/wire of the source tree: found beside this file, or above the test binary (a
/// compiler cache may make __FILE__ relative to the build directory).
std::filesystem::path CommittedCorpusDir() {
    const std::filesystem::path rel = std::filesystem::path("fuzz") / "corpus" / "wire";
    const auto beside =
        std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / rel;
    if (std::filesystem::is_directory(beside)) return beside;
    std::error_code ec;
    for (auto dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
         !ec && !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
        if (std::filesystem::is_directory(dir / rel)) return dir / rel;
    }
    return beside;
}

std::vector<std::byte> ReadFile(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::byte> bytes(chars.size());
    std::memcpy(bytes.data(), chars.data(), chars.size());
    return bytes;
}

std::string CorpusFileName(std::size_t i, const Message& m) {
    char name[64];
    std::snprintf(name, sizeof name, "%02zu_%s.bin", i, NameOf(m).c_str());
    return name;
}

/// MCS_WIRE_CORPUS_DIR=DIR store_test --gtest_filter=WireTest.WriteFuzzCorpus writes one
/// frame per sample message into DIR (the seed corpus of fuzz/wire_fuzzer.cc).
TEST(WireTest, WriteFuzzCorpus) {
    const char* dir = std::getenv("MCS_WIRE_CORPUS_DIR");
    if (dir == nullptr) GTEST_SKIP() << "set MCS_WIRE_CORPUS_DIR to write the seed corpus";
    std::filesystem::create_directories(dir);
    const std::vector<Message> samples = SampleMessages();
    for (std::size_t i = 0; i < samples.size(); ++i) {
        auto bytes = EncodeFrame(samples[i], static_cast<std::uint64_t>(i) + 1);
        ASSERT_TRUE(bytes.ok());
        std::ofstream out(std::filesystem::path(dir) / CorpusFileName(i, samples[i]),
                          std::ios::binary);
        out.write(reinterpret_cast<const char*>(bytes->data()),
                  static_cast<std::streamsize>(bytes->size()));
        ASSERT_TRUE(out.good());
    }
}

TEST(WireTest, CommittedFuzzCorpusStillDecodes) {
    const auto dir = CommittedCorpusDir();
    if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " not found";
    std::set<MessageType> types;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const std::vector<std::byte> bytes = ReadFile(entry.path());
        auto frame = DecodeFrame(bytes);
        ASSERT_TRUE(frame.ok()) << entry.path() << ": " << frame.status().ToString();
        EXPECT_TRUE(DecodeMessage(*frame).ok()) << entry.path();
        types.insert(frame->header.type);
    }
    EXPECT_EQ(types.size(), std::variant_size_v<Message>) << "a message type has no seed";
}

// The committed corpus was written by the codec of an earlier build: peers of that build must
// keep understanding this one, so the byte format may not change, not even canonically.
TEST(WireTest, CommittedFuzzCorpusReencodesByteForByte) {
    const auto dir = CommittedCorpusDir();
    if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " not found";
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        SCOPED_TRACE(entry.path().string());
        const std::vector<std::byte> bytes = ReadFile(entry.path());
        auto frame = DecodeFrame(bytes);
        ASSERT_TRUE(frame.ok()) << frame.status().ToString();
        auto m = DecodeMessage(*frame);
        ASSERT_TRUE(m.ok()) << m.status().ToString();
        auto again = EncodeFrame(*m, frame->header.request_id);
        ASSERT_TRUE(again.ok()) << again.status().ToString();
        EXPECT_EQ(*again, bytes);
    }
}

TEST(WireTest, SampleMessagesEncodeToTheCommittedCorpus) {
    const auto dir = CommittedCorpusDir();
    if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " not found";
    const std::vector<Message> samples = SampleMessages();
    for (std::size_t i = 0; i < samples.size(); ++i) {
        const auto path = dir / CorpusFileName(i, samples[i]);
        SCOPED_TRACE(path.string());
        ASSERT_TRUE(std::filesystem::exists(path)) << "regenerate with WriteFuzzCorpus";
        auto bytes = EncodeFrame(samples[i], static_cast<std::uint64_t>(i) + 1);
        ASSERT_TRUE(bytes.ok());
        EXPECT_EQ(*bytes, ReadFile(path));
    }
}

}  // namespace
}  // namespace mooncake::sparse::wire
