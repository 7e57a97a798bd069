// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The tensor fast path through the node daemon, in-process (a NodeServer thread and a NodeClient
// over a real Unix socket), with host tensors: TensorPut / TensorGet dispatch, validation in the
// daemon before any byte moves, atomic batches, and the direct paths of ShmStore (PutFilled into
// fresh extents, ViewObjects under leases). CUDA IPC runs in tests/python/test_tensor_gpu.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "node/node_server.h"
#include "node/node_tensor_store.h"
#include "executor/tensor_store.h"
#include "transport/host_copy.h"
#include "node/node_client.h"
#include "store/shm_store.h"
#include "store/tensor_object.h"
#include "node/wire.h"

namespace mooncake::sparse {
namespace {

using namespace std::chrono_literals;

MATCHER_P(StatusIs, code, "has status code " + std::string(StatusCodeName(code))) {
    const Status& s = ::mooncake::sparse::internal::AsStatus(arg);
    *result_listener << "status is " << s.ToString();
    return s.code() == code;
}
MATCHER_P2(StatusIsWithMessage, code, substr,
           "has status code " + std::string(StatusCodeName(code)) + " and a message with '" +
               std::string(substr) + "'") {
    const Status& s = ::mooncake::sparse::internal::AsStatus(arg);
    *result_listener << "status is " << s.ToString();
    return s.code() == code && s.message().find(substr) != std::string::npos;
}
#define ASSERT_OK(expr) ASSERT_THAT((expr), StatusIs(StatusCode::kOk))
#define EXPECT_OK(expr) EXPECT_THAT((expr), StatusIs(StatusCode::kOk))

std::vector<std::byte> Pattern(std::size_t n, int seed) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 7 + seed * 31) & 0xff);
    return v;
}

class TensorDaemonTest : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/mcs-tensor-test-XXXXXX";
        dir_ = ::mkdtemp(tmpl);
        NodeServerOptions o;
        o.socket_path = dir_ + "/node.sock";
        o.store.segment_size = 4 << 20;
        o.store.num_segments = 2;
        o.store.name = "tensor_daemon_test";
        o.client_buffer_max_bytes = 16 << 20;
        o.cache_capacity_bytes = 16 << 20;
        auto server = NodeServer::Start(o);
        ASSERT_TRUE(server.ok()) << server.status().ToString();
        server_ = std::move(server).value();
        NodeClientOptions c;
        c.socket_path = o.socket_path;
        c.call_timeout = 10s;
        c.initial_buffer_bytes = 64 << 10;
        auto client = NodeClient::Connect(c);
        ASSERT_TRUE(client.ok()) << client.status().ToString();
        client_ = std::move(client).value();
        tensors_ = MakeNodeTensorStore(client_);
    }
    void TearDown() override {
        tensors_.reset();
        client_.reset();
        if (server_) server_->Stop();
        std::filesystem::remove_all(dir_);
    }

    std::string dir_;
    std::unique_ptr<NodeServer> server_;
    std::shared_ptr<NodeClient> client_;
    std::unique_ptr<TensorStore> tensors_;
};

TEST_F(TensorDaemonTest, RoundTripsThroughTheDaemon) {
    auto a = Pattern(3 * 1000 * 2, 1);
    ASSERT_OK(tensors_->Put("w", TensorRef::ConstHost(DType::kBFloat16, {3, 1000}, a), {}));
    std::vector<std::byte> out(a.size());
    ASSERT_OK(tensors_->GetInto("w", TensorRef::Host(DType::kBFloat16, {3, 1000}, out)));
    EXPECT_EQ(out, a);
    auto got = tensors_->Get("w");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->shape, (Shape{3, 1000}));
    EXPECT_EQ(std::memcmp(got->data.data(), a.data(), a.size()), 0);
    auto info = tensors_->Stat("w");
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->header.dtype, DType::kBFloat16);

    // The daemon stores upstream's format in its segments.
    auto stored = server_->store().Stat("w");
    ASSERT_TRUE(stored.ok());
    ASSERT_EQ(stored->members.size(), 1u);
    EXPECT_EQ(stored->members[0].size_bytes, kTensorHeaderBytes + a.size());

    // Batches, upserts.
    const std::vector<std::string> keys = {"b0", "b1", "w"};
    auto b0 = Pattern(64, 2), b1 = Pattern(128, 3), w2 = Pattern(a.size(), 4);
    ASSERT_OK(tensors_->Put(keys,
                            std::vector<TensorRef>{
                                TensorRef::ConstHost(DType::kUInt8, {64}, b0),
                                TensorRef::ConstHost(DType::kInt64, {16}, b1),
                                TensorRef::ConstHost(DType::kBFloat16, {3, 1000}, w2)},
                            {PutMode::kUpsert, true}));
    std::vector<std::byte> o0(64), o1(128);
    ASSERT_OK(tensors_->GetInto(keys, std::vector<TensorRef>{
                                          TensorRef::Host(DType::kUInt8, {64}, o0),
                                          TensorRef::Host(DType::kInt64, {16}, o1),
                                          TensorRef::Host(DType::kBFloat16, {3, 1000}, out)}));
    EXPECT_EQ(o0, b0);
    EXPECT_EQ(o1, b1);
    EXPECT_EQ(out, w2);
    const auto metrics = client_->Metrics();
    ASSERT_TRUE(metrics.ok());
    double put = 0;
    for (const auto& [k, v] : *metrics) {
        if (k == "tensors_put") put = v;
    }
    EXPECT_EQ(put, 4);
}

TEST_F(TensorDaemonTest, BoxReadsThroughTheDaemon) {
    // A TP rank's rows and columns of a [256, 128] anchor: only the box crosses the client
    // buffer; a bad box fails in the daemon (or before the request) and writes nothing.
    const Shape full{256, 128};
    auto a = Pattern(256 * 128 * 4, 5);
    ASSERT_OK(tensors_->Put("anchor", TensorRef::ConstHost(DType::kFloat32, full, a), {}));
    auto expect = [&](const Shape& origin, const Shape& box) {
        std::vector<std::byte> out(std::size_t(box[0] * box[1] * 4));
        StridedCopy(out.data(), {}, a.data() + (origin[0] * 128 + origin[1]) * 4,
                    std::vector<std::int64_t>{128, 1}, box, 4);
        return out;
    };
    std::vector<std::byte> rows(128 * 128 * 4), cols(256 * 32 * 4);
    ASSERT_OK(tensors_->GetInto(std::vector<std::string>{"anchor", "anchor"},
                                std::vector<TensorRef>{
                                    TensorRef::Host(DType::kFloat32, {128, 128}, rows),
                                    TensorRef::Host(DType::kFloat32, {256, 32}, cols)},
                                std::vector<Shape>{{128, 0}, {0, 64}}));
    EXPECT_EQ(rows, expect({128, 0}, {128, 128}));
    EXPECT_EQ(cols, expect({0, 64}, {256, 32}));
    // Into a host view (every other column of a wider buffer).
    std::vector<std::byte> wide(256 * 64 * 4, std::byte{0x5a});
    TensorRef view = TensorRef::Host(DType::kFloat32, {256, 32}, wide);
    view.host_bytes = 256 * 32 * 4;
    view.strides = {64, 2};
    ASSERT_OK(tensors_->GetInto("anchor", view, Shape{0, 64}));
    std::vector<std::byte> got(256 * 32 * 4);
    StridedCopy(got.data(), {}, wide.data(), std::vector<std::int64_t>{64, 2}, Shape{256, 32}, 4);
    EXPECT_EQ(got, expect({0, 64}, {256, 32}));

    const std::vector<std::byte> sentinel(cols.size(), std::byte{0x5a});
    cols = sentinel;
    EXPECT_THAT(tensors_->GetInto("anchor", TensorRef::Host(DType::kFloat32, {256, 32}, cols),
                                  Shape{0, 100}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(tensors_->GetInto("anchor", TensorRef::Host(DType::kFloat32, {256, 32}, cols),
                                  Shape{0, -1}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "negative"));
    EXPECT_EQ(cols, sentinel);
    // A hand-written request with a bad origin is refused by the daemon too.
    NodeTensor raw{"anchor", DType::kFloat32, {256, 32}, {cols.data(), cols.size()}, {},
                   std::nullopt, {}, {1, 0}};
    EXPECT_THAT(client_->GetTensorsInto({&raw, 1}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "outside"));
    EXPECT_EQ(cols, sentinel);
}

TEST_F(TensorDaemonTest, ValidationInTheDaemonLeavesDestinationsUntouched) {
    auto a = Pattern(16, 1);
    ASSERT_OK(tensors_->Put("k", TensorRef::ConstHost(DType::kFloat32, {4}, a), {}));
    const std::vector<std::byte> sentinel(16, std::byte{0x5a});
    std::vector<std::byte> dst = sentinel, other = sentinel;
    EXPECT_THAT(tensors_->GetInto("k", TensorRef::Host(DType::kInt32, {4}, dst)),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(tensors_->GetInto("k", TensorRef::Host(DType::kFloat32, {2, 2}, dst)),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(tensors_->GetInto(std::vector<std::string>{"k", "nope"},
                                  std::vector<TensorRef>{
                                      TensorRef::Host(DType::kFloat32, {4}, dst),
                                      TensorRef::Host(DType::kFloat32, {4}, other)}),
                StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(dst, sentinel);
    EXPECT_EQ(other, sentinel);
    EXPECT_THAT(tensors_->Put("k", TensorRef::ConstHost(DType::kFloat32, {4}, a), {}),
                StatusIs(StatusCode::kConflict));
    EXPECT_THAT(tensors_->Put(std::vector<std::string>{"n1", "k"},
                              std::vector<TensorRef>(2, TensorRef::ConstHost(DType::kFloat32, {4}, a)),
                              {}),
                StatusIs(StatusCode::kConflict));
    EXPECT_THAT(tensors_->Stat("n1"), StatusIs(StatusCode::kNotFound));
    // Larger than a segment: ResourceExhausted from the daemon, nothing stored.
    auto big = Pattern(5 << 20, 2);
    EXPECT_THAT(tensors_->Put("big", TensorRef::ConstHost(DType::kUInt8, {5 << 20}, big), {}),
                StatusIs(StatusCode::kResourceExhausted));
}

TEST_F(TensorDaemonTest, HostileTensorRequestsAreRejected) {
    // A CUDA item whose handle cannot be opened (or no CUDA in the daemon): an error reply, the
    // connection stays usable.
    wire::TensorGetRequest req;
    wire::TensorItem item{"k", DType::kFloat32, {4}, {}, {}, {}};
    item.location.ref.kind = wire::BufferKind::kCudaIpc;
    item.location.ref.offset = 0;
    item.location.ref.size = 16;
    item.location.ref.cuda_ipc_handle.assign(wire::kCudaIpcHandleBytes, '\x01');
    item.location.ref.device = 0;
    item.location.cuda_base = 0x1000;
    item.location.cuda_alloc_size = 16;
    std::vector<std::byte> out(16);
    NodeTensor t{"k", DType::kFloat32, {4}, {}, {}, item.location, {}, {}};
    const Status s = client_->GetTensorsInto({&t, 1});
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), StatusCode::kUnavailable) << s.ToString();
    // A missing key through the client-buffer path.
    NodeTensor host{"k", DType::kFloat32, {4}, {out.data(), out.size()}, {}, std::nullopt, {}, {}};
    EXPECT_THAT(client_->GetTensorsInto({&host, 1}), StatusIs(StatusCode::kNotFound));
    auto a = Pattern(16, 1);
    ASSERT_OK(tensors_->Put("k", TensorRef::ConstHost(DType::kFloat32, {4}, a), {}));
    ASSERT_OK(tensors_->GetInto("k", TensorRef::Host(DType::kFloat32, {4}, out)));
    EXPECT_EQ(out, a);
}

TEST_F(TensorDaemonTest, StridesReachingPastTheExportedRangeAreRejectedBeforeMapping) {
    // A view's strides must span exactly the exported range: strides that reach further (or
    // overflow) would make the daemon's copies write outside the mapping. Checked before the
    // handle is opened, so the answer is InvalidArgument with or without CUDA here.
    wire::TensorLocation loc;
    loc.ref.kind = wire::BufferKind::kCudaIpc;
    loc.ref.offset = 0;
    loc.ref.size = (3 * 8 + 2) * 4;  // a [4, 2] float32 view with rows 8 apart
    loc.ref.cuda_ipc_handle.assign(wire::kCudaIpcHandleBytes, '\x01');
    loc.ref.device = 0;
    loc.cuda_base = 0x1000;
    loc.cuda_alloc_size = 1 << 20;
    for (const std::vector<std::int64_t>& strides :
         {std::vector<std::int64_t>{64, 1}, std::vector<std::int64_t>{8, 1000},
          std::vector<std::int64_t>{std::int64_t{1} << 62, 1},
          std::vector<std::int64_t>{8, 2}}) {
        NodeTensor t{"k", DType::kFloat32, {4, 2}, {}, {}, loc, strides, {}};
        const Status s = client_->GetTensorsInto({&t, 1});
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    }
    // The connection stays usable.
    auto a = Pattern(16, 1);
    ASSERT_OK(tensors_->Put("k", TensorRef::ConstHost(DType::kFloat32, {4}, a), {}));
}

TEST(ShmTensorStoreTest, DirectPathsOverSegments) {
    ShmStoreOptions o;
    o.segment_size = 1 << 20;
    o.num_segments = 2;
    o.name = "shm_tensor_test";
    auto created = ShmStore::Create(o);
    ASSERT_TRUE(created.ok());
    std::shared_ptr<ShmStore> shm = std::move(created).value();
    auto tensors = MakeLocalTensorStore(shm, {"node", 0, 2});
    auto a = Pattern(300 << 10, 1);
    ASSERT_OK(tensors->Put("a", TensorRef::ConstHost(DType::kUInt8, {300 << 10}, a), {}));
    // A lease (a client reading in place) pins the extent: an upsert takes a fresh extent and
    // the leased bytes stay what they were.
    auto b = Pattern(300 << 10, 2);
    {
        auto lease = shm->Lease("a");
        ASSERT_TRUE(lease.ok());
        ASSERT_OK(tensors->Put("a", TensorRef::ConstHost(DType::kUInt8, {300 << 10}, b),
                               {PutMode::kUpsert, false}));
        EXPECT_EQ(std::memcmp(lease->Bytes(0).data() + kTensorHeaderBytes, a.data(), a.size()), 0);
    }
    std::vector<std::byte> out(b.size());
    ASSERT_OK(tensors->GetInto("a", TensorRef::Host(DType::kUInt8, {300 << 10}, out)));
    EXPECT_EQ(out, b);
    EXPECT_EQ(shm->Stats().realloc_upserts, 1u);
    // A batch that cannot fit fails and installs nothing (evictable entries may be evicted on
    // the way, as for any put).
    auto big = Pattern(700 << 10, 3);
    const std::vector<std::string> keys = {"x", "y", "z"};
    EXPECT_THAT(tensors->Put(keys, std::vector<TensorRef>(3, TensorRef::ConstHost(
                                                               DType::kUInt8, {700 << 10}, big)),
                             {}),
                StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(shm->Stat("x"), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(shm->Stat("y"), StatusIs(StatusCode::kNotFound));
}

}  // namespace
}  // namespace mooncake::sparse
