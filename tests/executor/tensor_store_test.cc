// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// TensorStore over the embedded store (host tensors; CUDA paths run in
// tests/python/test_tensor_gpu.py on a GPU machine): round trips, upstream-format bytes,
// validation before any byte moves, atomic batches, and the ObjectStore base implementations of
// PutFilled / ViewObjects that stores without a direct path use.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../store/store_test_util.h"
#include "executor/tensor_store.h"
#include "store/object_store.h"
#include "store/tensor_object.h"
#include "transport/host_copy.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::StatusIsWithMessage;

/// `n` bytes of a recognizable pattern.
std::vector<std::byte> Pattern(std::size_t n, int seed) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 17) & 0xff);
    return v;
}

using ::mooncake::sparse::testing::ForwardingStore;

class TensorStoreTest : public ::testing::TestWithParam<bool> {
protected:
    void SetUp() override {
        if (GetParam()) {
            objects_ = std::make_shared<ForwardingStore>(MakeEmbeddedStore());
        } else {
            objects_ = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
        }
        LocalTensorStoreOptions options;
        options.pinned_quota_bytes = std::uint64_t{64} << 20;
        options.copy_threads = 2;
        store_ = MakeLocalTensorStore(objects_, options);
    }

    std::shared_ptr<ObjectStore> objects_;
    std::unique_ptr<TensorStore> store_;
};

INSTANTIATE_TEST_SUITE_P(Stores, TensorStoreTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Staged" : "Embedded"; });

TEST_P(TensorStoreTest, PutGetRoundTripEveryDType) {
    for (int i = 0; i < kNumDTypes; ++i) {
        const auto dtype = static_cast<DType>(i);
        const Shape shape{3, 5};
        auto bytes = Pattern(15 * DTypeSize(dtype), i);
        const std::string key = "t/" + std::string(DTypeName(dtype));
        MCS_ASSERT_OK(store_->Put(key, TensorRef::ConstHost(dtype, shape, bytes), {}));
        auto got = store_->Get(key);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_EQ(got->dtype, dtype);
        EXPECT_EQ(got->shape, shape);
        ASSERT_EQ(got->data.size(), bytes.size());
        EXPECT_EQ(std::memcmp(got->data.data(), bytes.data(), bytes.size()), 0);

        std::vector<std::byte> into(bytes.size());
        MCS_ASSERT_OK(store_->GetInto(key, TensorRef::Host(dtype, shape, into)));
        EXPECT_EQ(into, bytes);
    }
}

TEST_P(TensorStoreTest, ScalarRoundTrip) {
    auto bytes = Pattern(8, 3);
    MCS_ASSERT_OK(store_->Put("scalar", TensorRef::ConstHost(DType::kFloat64, {}, bytes), {}));
    std::vector<std::byte> into(8);
    MCS_ASSERT_OK(store_->GetInto("scalar", TensorRef::Host(DType::kFloat64, {}, into)));
    EXPECT_EQ(into, bytes);
}

TEST_P(TensorStoreTest, StoredBytesAreUpstreamsValue) {
    auto bytes = Pattern(2 * 3 * 2, 1);
    MCS_ASSERT_OK(store_->Put("k", TensorRef::ConstHost(DType::kBFloat16, {2, 3}, bytes), {}));
    auto info = objects_->Stat("k");
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info->members.size(), 1u);
    EXPECT_EQ(info->members[0].name, kTensorMemberName);
    EXPECT_EQ(info->members[0].size_bytes, kTensorHeaderBytes + bytes.size());
    std::vector<std::byte> blob(info->members[0].size_bytes);
    MCS_ASSERT_OK(objects_->ReadMember("k", kTensorMemberName, blob));
    auto header = DecodeTensorHeader(blob, blob.size());
    ASSERT_TRUE(header.ok());
    EXPECT_EQ(header->dtype, DType::kBFloat16);
    EXPECT_EQ(header->local_shape, (Shape{2, 3}));
    EXPECT_EQ(std::memcmp(blob.data() + kTensorHeaderBytes, bytes.data(), bytes.size()), 0);
}

TEST_P(TensorStoreTest, ReadsAnUpstreamWrittenObject) {
    // Upstream's value for a key, with its data after a padded data_offset, written raw.
    auto h = MakeFullTensorHeader(DType::kInt16, {4});
    ASSERT_TRUE(h.ok());
    h->data_offset = kTensorHeaderBytes + 16;
    std::vector<std::byte> blob(h->data_offset + 8);
    EncodeTensorHeader(*h, std::span<std::byte, kTensorHeaderBytes>(blob.data(), kTensorHeaderBytes));
    auto data = Pattern(8, 9);
    std::copy(data.begin(), data.end(), blob.begin() + static_cast<std::ptrdiff_t>(h->data_offset));
    const MemberData m{std::string(kTensorMemberName), DType::kUInt8,
                       {static_cast<Index>(blob.size())}, blob, 0};
    MCS_ASSERT_OK(objects_->Put("raw", {}, {&m, 1}, {}));
    std::vector<std::byte> into(8);
    MCS_ASSERT_OK(store_->GetInto("raw", TensorRef::Host(DType::kInt16, {4}, into)));
    EXPECT_EQ(into, data);
}

TEST_P(TensorStoreTest, CreateConflictsUpsertReplaces) {
    auto a = Pattern(16, 1);
    auto b = Pattern(16, 2);
    MCS_ASSERT_OK(store_->Put("k", TensorRef::ConstHost(DType::kFloat32, {4}, a), {}));
    EXPECT_THAT(store_->Put("k", TensorRef::ConstHost(DType::kFloat32, {4}, b), {}),
                StatusIs(StatusCode::kConflict));
    std::vector<std::byte> into(16);
    MCS_ASSERT_OK(store_->GetInto("k", TensorRef::Host(DType::kFloat32, {4}, into)));
    EXPECT_EQ(into, a);
    MCS_ASSERT_OK(store_->Put("k", TensorRef::ConstHost(DType::kFloat32, {4}, b),
                              {PutMode::kUpsert, false}));
    MCS_ASSERT_OK(store_->GetInto("k", TensorRef::Host(DType::kFloat32, {4}, into)));
    EXPECT_EQ(into, b);
    // An upsert may change dtype and shape.
    auto c = Pattern(6, 3);
    MCS_ASSERT_OK(store_->Put("k", TensorRef::ConstHost(DType::kUInt8, {2, 3}, c),
                              {PutMode::kUpsert, true}));
    auto info = store_->Stat("k");
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->header.dtype, DType::kUInt8);
    EXPECT_EQ(info->header.local_shape, (Shape{2, 3}));
    EXPECT_EQ(info->version, 3u);
    EXPECT_TRUE(info->hard_pinned);
}

TEST_P(TensorStoreTest, BatchPutAndBatchGetInto) {
    std::vector<std::string> keys;
    std::vector<std::vector<std::byte>> data;
    std::vector<TensorRef> refs;
    for (int i = 0; i < 40; ++i) {
        keys.push_back("b/" + std::to_string(i));
        data.push_back(Pattern(std::size_t(1 + i) * 1024 * 4, i));
    }
    for (int i = 0; i < 40; ++i) {
        refs.push_back(TensorRef::ConstHost(DType::kInt32, {1 + i, 1024}, data[i]));
    }
    MCS_ASSERT_OK(store_->Put(keys, refs, {}));
    std::vector<std::vector<std::byte>> out(40);
    std::vector<TensorRef> dsts;
    for (int i = 0; i < 40; ++i) {
        out[i].resize(data[i].size());
        dsts.push_back(TensorRef::Host(DType::kInt32, {1 + i, 1024}, out[i]));
    }
    MCS_ASSERT_OK(store_->GetInto(keys, dsts));
    EXPECT_EQ(out, data);
}

TEST_P(TensorStoreTest, BatchPutIsAllOrNothing) {
    auto a = Pattern(16, 1);
    MCS_ASSERT_OK(store_->Put("exists", TensorRef::ConstHost(DType::kFloat32, {4}, a), {}));
    const std::vector<std::string> keys = {"new1", "exists", "new2"};
    const std::vector<TensorRef> refs(3, TensorRef::ConstHost(DType::kFloat32, {4}, a));
    EXPECT_THAT(store_->Put(keys, refs, {}), StatusIs(StatusCode::kConflict));
    EXPECT_THAT(store_->Stat("new1"), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(store_->Stat("new2"), StatusIs(StatusCode::kNotFound));

    // One invalid tensor: nothing is written.
    std::vector<TensorRef> bad = refs;
    bad[2].host_bytes = 15;
    EXPECT_THAT(store_->Put(std::vector<std::string>{"x1", "x2", "x3"}, bad, {}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "tensor 2 'x3'"));
    EXPECT_THAT(store_->Stat("x1"), StatusIs(StatusCode::kNotFound));

    EXPECT_THAT(store_->Put(std::vector<std::string>{"d", "d"},
                            std::vector<TensorRef>(2, refs[0]), {PutMode::kUpsert, false}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "more than once"));
    EXPECT_THAT(store_->Put(std::vector<std::string>{"a", "b"},
                            std::vector<TensorRef>(1, refs[0]), {}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Put("", refs[0], {}), StatusIs(StatusCode::kInvalidArgument));
}

TEST_P(TensorStoreTest, ValidationLeavesDestinationsUntouched) {
    auto a = Pattern(24, 1);
    MCS_ASSERT_OK(store_->Put("k", TensorRef::ConstHost(DType::kFloat32, {2, 3}, a), {}));
    const std::vector<std::byte> sentinel(24, std::byte{0x5a});
    std::vector<std::byte> dst = sentinel;

    EXPECT_THAT(store_->GetInto("k", TensorRef::Host(DType::kInt32, {2, 3}, dst)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "float32 [2, 3]"));
    EXPECT_THAT(store_->GetInto("k", TensorRef::Host(DType::kFloat32, {3, 2}, dst)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "destination is float32 [3, 2]"));
    EXPECT_THAT(store_->GetInto("k", TensorRef::Host(DType::kFloat32, {6}, dst)),
                StatusIs(StatusCode::kInvalidArgument));
    std::vector<std::byte> small(20, std::byte{0x5a});
    EXPECT_THAT(store_->GetInto("k", TensorRef::Host(DType::kFloat32, {2, 3}, small)),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "20 bytes given"));
    TensorRef overlapping = TensorRef::Host(DType::kFloat32, {2, 3}, dst);
    overlapping.strides = {0, 1};  // one row seen twice
    EXPECT_THAT(store_->GetInto("k", overlapping),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "overlapping"));
    TensorRef read_only = TensorRef::ConstHost(DType::kFloat32, {2, 3}, dst);
    EXPECT_THAT(store_->GetInto("k", read_only),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "read-only"));
    EXPECT_THAT(store_->GetInto("missing", TensorRef::Host(DType::kFloat32, {2, 3}, dst)),
                StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(dst, sentinel);

    // A batch whose last item fails writes none of the others.
    std::vector<std::byte> first = sentinel;
    EXPECT_THAT(store_->GetInto(std::vector<std::string>{"k", "missing"},
                                std::vector<TensorRef>{
                                    TensorRef::Host(DType::kFloat32, {2, 3}, first),
                                    TensorRef::Host(DType::kFloat32, {2, 3}, dst)}),
                StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(store_->GetInto(std::vector<std::string>{"k", "k"},
                                std::vector<TensorRef>{
                                    TensorRef::Host(DType::kFloat32, {2, 3}, first),
                                    TensorRef::Host(DType::kInt32, {2, 3}, dst)}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_EQ(first, sentinel);
    EXPECT_EQ(dst, sentinel);

    // Strides that are C-contiguous (extent-1 dims may have any stride) are fine; the shape
    // must still match the stored one.
    TensorRef ok = TensorRef::Host(DType::kFloat32, {2, 3}, dst);
    ok.strides = {3, 1};
    MCS_EXPECT_OK(store_->GetInto("k", ok));
    EXPECT_EQ(dst, a);
    TensorRef unit = TensorRef::Host(DType::kFloat32, {2, 1, 3}, dst);
    unit.strides = {3, 99, 1};
    EXPECT_THAT(store_->GetInto("k", unit), StatusIsWithMessage(StatusCode::kInvalidArgument, "[2, 1, 3]"));
}

TEST_P(TensorStoreTest, HostViewsAreCopiedThroughTheirStrides) {
    // a is [2, 3] row-major; its Fortran-order copy holds element [i, j] at j * 2 + i.
    const std::vector<float> a = {1, 2, 3, 4, 5, 6};
    const std::vector<float> fortran = {1, 4, 2, 5, 3, 6};
    TensorRef src =
        TensorRef::ConstHost(DType::kFloat32, {2, 3}, std::as_bytes(std::span(fortran)));
    src.strides = {1, 2};
    MCS_ASSERT_OK(store_->Put("f", src, {}));
    std::vector<float> out(6, 0);
    MCS_ASSERT_OK(store_->GetInto(
        "f", TensorRef::Host(DType::kFloat32, {2, 3}, std::as_writable_bytes(std::span(out)))));
    EXPECT_EQ(out, a);
    // Into every other element of a larger buffer, in place; the gaps stay untouched.
    std::vector<float> gaps(12, -1);
    TensorRef dst = TensorRef::Host(DType::kFloat32, {2, 3},
                                    std::as_writable_bytes(std::span(gaps)).first(24));
    dst.strides = {6, 2};
    MCS_ASSERT_OK(store_->GetInto("f", dst));
    EXPECT_EQ(gaps, (std::vector<float>{1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1}));
}

/// The box [origin, origin + box) of a C-contiguous tensor of `full` (`item`-byte elements),
/// C-contiguous: what a box read must produce.
std::vector<std::byte> BoxOf(const std::vector<std::byte>& data, const Shape& full,
                             const Shape& origin, const Shape& box, std::size_t item) {
    std::vector<std::int64_t> strides(full.size());
    std::int64_t s = 1;
    for (std::size_t d = full.size(); d-- > 0;) {
        strides[d] = s;
        s *= full[d];
    }
    std::int64_t at = 0, n = 1;
    for (std::size_t d = 0; d < full.size(); ++d) {
        at += origin[d] * strides[d];
        n *= box[d];
    }
    std::vector<std::byte> out(static_cast<std::size_t>(n) * item);
    StridedCopy(out.data(), {}, data.data() + at * std::int64_t(item), strides, box, item);
    return out;
}

TEST_P(TensorStoreTest, BoxReadsOfOneToFourDimensions) {
    struct Case {
        Shape full, origin, box;
    };
    const std::vector<Case> cases = {
        {{1000}, {0}, {1000}},
        {{1000}, {250}, {500}},
        {{64, 48}, {32, 0}, {32, 48}},    // rows: one contiguous run
        {{64, 48}, {0, 16}, {64, 16}},    // columns: rows 48 elements apart
        {{64, 48}, {10, 7}, {5, 3}},
        {{8, 16, 32}, {2, 0, 0}, {3, 16, 32}},
        {{8, 16, 32}, {0, 4, 0}, {8, 8, 32}},   // the last dimension whole: rows merge
        {{8, 16, 32}, {1, 2, 3}, {4, 5, 6}},
        {{4, 6, 8, 10}, {1, 2, 3, 4}, {2, 3, 4, 5}},
        {{4, 6, 8, 10}, {0, 0, 0, 5}, {4, 6, 8, 5}},
        {{4, 6, 8, 10}, {3, 5, 7, 9}, {1, 1, 1, 1}},
    };
    int seed = 0;
    for (const Case& c : cases) {
        SCOPED_TRACE(ShapeString(c.full) + " at " + ShapeString(c.origin) + " box " +
                     ShapeString(c.box));
        std::int64_t n = 1;
        for (Index e : c.full) n *= e;
        auto data = Pattern(static_cast<std::size_t>(n) * 4, ++seed);
        const std::string key = "box/" + std::to_string(seed);
        MCS_ASSERT_OK(store_->Put(key, TensorRef::ConstHost(DType::kFloat32, c.full, data), {}));
        const auto expect = BoxOf(data, c.full, c.origin, c.box, 4);
        std::vector<std::byte> out(expect.size(), std::byte{0x5a});
        MCS_ASSERT_OK(store_->GetInto(key, TensorRef::Host(DType::kFloat32, c.box, out), c.origin));
        EXPECT_EQ(out, expect);
    }
}

TEST_P(TensorStoreTest, ABoxReadMovesOnlyTheBoxFromAStoreThatCopiesWholeObjects) {
    // [512, 256] float32: 512 KiB. Rows [128, 192) are one run, columns [64, 96) 512 runs.
    const Shape full{512, 256};
    auto data = Pattern(512 * 256 * 4, 9);
    MCS_ASSERT_OK(store_->Put("anchor", TensorRef::ConstHost(DType::kFloat32, full, data), {}));
    struct Case {
        Shape origin, box;
    };
    for (const Case& c : {Case{{128, 0}, {64, 256}}, Case{{0, 64}, {512, 32}}}) {
        const StoreCounters before = objects_->Counters();
        const auto expect = BoxOf(data, full, c.origin, c.box, 4);
        std::vector<std::byte> out(expect.size());
        MCS_ASSERT_OK(
            store_->GetInto("anchor", TensorRef::Host(DType::kFloat32, c.box, out), c.origin));
        EXPECT_EQ(out, expect);
        const StoreCounters after = objects_->Counters();
        if (GetParam()) {
            // The box and its header twice (checked, then confirmed with the box): no whole read.
            EXPECT_EQ(after.member_bytes, before.member_bytes);
            EXPECT_EQ(after.range_bytes - before.range_bytes,
                      expect.size() + 2 * kTensorHeaderBytes);
        }
    }
}

TEST_P(TensorStoreTest, BoxReadsIntoStridedDestinations) {
    // Columns [256, 512) of a [1024, 1024] tensor into columns [100, 356) of a [1024, 400]
    // buffer, the rest of which stays untouched; and into a transposed (Fortran-order) shard.
    const Shape full{1024, 1024};
    auto data = Pattern(1024 * 1024 * 2, 7);
    MCS_ASSERT_OK(store_->Put("w", TensorRef::ConstHost(DType::kBFloat16, full, data), {}));
    const auto expect = BoxOf(data, full, {0, 256}, {1024, 256}, 2);
    std::vector<std::byte> parent(1024 * 400 * 2, std::byte{0x5a});
    const std::size_t first = 100 * 2;
    const std::size_t span = (1023 * 400 + 255) * 2 + 2;
    TensorRef view = TensorRef::Host(DType::kBFloat16, {1024, 256},
                                     std::span(parent).subspan(first, span));
    view.host_bytes = 1024 * 256 * 2;
    view.strides = {400, 1};
    MCS_ASSERT_OK(store_->GetInto("w", view, Shape{0, 256}));
    std::vector<std::byte> got(expect.size());
    StridedCopy(got.data(), {}, parent.data() + first, std::vector<std::int64_t>{400, 1},
                Shape{1024, 256}, 2);
    EXPECT_EQ(got, expect);
    for (std::size_t r = 0; r < 1024; ++r) {
        for (std::size_t c = 0; c < 400; ++c) {
            if (c >= 100 && c < 356) continue;
            ASSERT_EQ(parent[(r * 400 + c) * 2], std::byte{0x5a}) << r << ", " << c;
        }
    }
    std::vector<std::byte> fortran(expect.size());
    TensorRef transposed = TensorRef::Host(DType::kBFloat16, {1024, 256}, fortran);
    transposed.strides = {1, 1024};
    MCS_ASSERT_OK(store_->GetInto("w", transposed, Shape{0, 256}));
    StridedCopy(got.data(), {}, fortran.data(), std::vector<std::int64_t>{1, 1024},
                Shape{1024, 256}, 2);
    EXPECT_EQ(got, expect);
}

TEST_P(TensorStoreTest, BatchBoxReadsMixWithWholeReads) {
    const Shape full{1024, 1024};
    auto data = Pattern(1024 * 1024 * 4, 3);
    auto small = Pattern(64, 4);
    MCS_ASSERT_OK(store_->Put("w", TensorRef::ConstHost(DType::kFloat32, full, data), {}));
    MCS_ASSERT_OK(store_->Put("b", TensorRef::ConstHost(DType::kUInt8, {64}, small), {}));
    std::vector<std::byte> rows(512 * 1024 * 4), cols(1024 * 256 * 4), whole(64);
    MCS_ASSERT_OK(store_->GetInto(
        std::vector<std::string>{"w", "w", "b"},
        std::vector<TensorRef>{TensorRef::Host(DType::kFloat32, {512, 1024}, rows),
                               TensorRef::Host(DType::kFloat32, {1024, 256}, cols),
                               TensorRef::Host(DType::kUInt8, {64}, whole)},
        std::vector<Shape>{{512, 0}, {0, 256}, {}}));
    EXPECT_EQ(rows, BoxOf(data, full, {512, 0}, {512, 1024}, 4));
    EXPECT_EQ(cols, BoxOf(data, full, {0, 256}, {1024, 256}, 4));
    EXPECT_EQ(whole, small);
    const TensorStoreStats stats = store_->Stats();
    EXPECT_GE(stats.bytes_read, rows.size() + cols.size() + whole.size());
}

TEST_P(TensorStoreTest, BadBoxesLeaveDestinationsUntouched) {
    auto a = Pattern(4 * 6 * 4, 1);
    MCS_ASSERT_OK(store_->Put("k", TensorRef::ConstHost(DType::kFloat32, {4, 6}, a), {}));
    const std::vector<std::byte> sentinel(2 * 3 * 4, std::byte{0x5a});
    std::vector<std::byte> dst = sentinel;
    const TensorRef box = TensorRef::Host(DType::kFloat32, {2, 3}, dst);
    EXPECT_THAT(store_->GetInto("k", box, Shape{3, 0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(store_->GetInto("k", box, Shape{0, 4}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "dimension 1"));
    EXPECT_THAT(store_->GetInto("k", box, Shape{-1, 0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "negative"));
    EXPECT_THAT(store_->GetInto("k", box, Shape{0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "rank"));
    EXPECT_THAT(store_->GetInto("k", TensorRef::Host(DType::kInt32, {2, 3}, dst), Shape{0, 0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "float32 [4, 6]"));
    EXPECT_THAT(store_->GetInto("k", TensorRef::Host(DType::kFloat32, {6}, dst), Shape{0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "stored rank"));
    std::vector<std::byte> big(5 * 6 * 4, std::byte{0x5a});
    EXPECT_THAT(store_->GetInto("k", TensorRef::Host(DType::kFloat32, {5, 6}, big), Shape{0, 0}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(store_->GetInto("missing", box, Shape{0, 0}), StatusIs(StatusCode::kNotFound));
    // A batch whose second box is bad writes neither; a box list of another length fails.
    std::vector<std::byte> first = sentinel;
    EXPECT_THAT(store_->GetInto(std::vector<std::string>{"k", "k"},
                                std::vector<TensorRef>{
                                    TensorRef::Host(DType::kFloat32, {2, 3}, first), box},
                                std::vector<Shape>{{0, 0}, {3, 3}}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->GetInto(std::vector<std::string>{"k"}, std::vector<TensorRef>{box},
                                std::vector<Shape>{{0, 0}, {0, 0}}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "box origins"));
    EXPECT_EQ(first, sentinel);
    EXPECT_EQ(dst, sentinel);
    // The last box that fits.
    MCS_ASSERT_OK(store_->GetInto("k", box, Shape{2, 3}));
    EXPECT_EQ(dst, BoxOf(a, {4, 6}, {2, 3}, {2, 3}, 4));
}

TEST_P(TensorStoreTest, PutValidation) {
    auto a = Pattern(24, 1);
    TensorRef strided = TensorRef::ConstHost(DType::kFloat32, {2, 3}, a);
    strided.strides = {1};
    EXPECT_THAT(store_->Put("k", strided, {}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "1 strides"));
    EXPECT_THAT(store_->Put("k", TensorRef::ConstHost(DType::kFloat32, {2, 0}, {}), {}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "extent < 1"));
    EXPECT_THAT(store_->Put("k", TensorRef::ConstHost(DType::kFloat32, {5}, a), {}),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "24 bytes given"));
    TensorRef bad_dtype = TensorRef::ConstHost(DType::kFloat32, {6}, a);
    bad_dtype.dtype = static_cast<DType>(77);
    EXPECT_THAT(store_->Put("k", bad_dtype, {}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Stat("k"), StatusIs(StatusCode::kNotFound));
}

TEST_P(TensorStoreTest, NonTensorObjectsAreRejected) {
    auto bytes = Pattern(8, 1);
    const MemberData members[] = {{"indices", DType::kUInt8, {8}, bytes, 0},
                                  {"values", DType::kUInt8, {8}, bytes, 0}};
    MCS_ASSERT_OK(objects_->Put("sparse", "meta", members, {}));
    EXPECT_THAT(store_->Get("sparse"), StatusIsWithMessage(StatusCode::kInvalidArgument, "not a tensor object"));
    const MemberData junk{std::string(kTensorMemberName), DType::kUInt8, {8}, bytes, 0};
    MCS_ASSERT_OK(objects_->Put("junk", {}, {&junk, 1}, {}));
    EXPECT_THAT(store_->Stat("junk"), StatusIs(StatusCode::kInvalidArgument));
}

TEST_P(TensorStoreTest, CudaTensorsWithoutCudaAreUnimplemented) {
    if (cuda::GetSupport().available) GTEST_SKIP() << "CUDA present: covered by the GPU tests";
    const TensorRef t = TensorRef::Cuda(DType::kFloat32, {4}, {0x1000, 16, 0});
    EXPECT_THAT(store_->Put("c", t, {}), StatusIs(StatusCode::kUnimplemented));
    EXPECT_THAT(store_->GetInto("c", t), StatusIs(StatusCode::kUnimplemented));
}

TEST_P(TensorStoreTest, CapabilitiesReportTheHostPool) {
    auto a = Pattern(1 << 20, 1);
    MCS_ASSERT_OK(store_->Put("k", TensorRef::ConstHost(DType::kUInt8, {1 << 20}, a), {}));
    const TensorCapabilities c = store_->Capabilities();
    EXPECT_EQ(c.backend, "embedded");
    EXPECT_EQ(c.host.pinned_quota_bytes, std::uint64_t{64} << 20);
    if (!c.cuda_available && !GetParam()) {
        EXPECT_EQ(c.host.pinned_bytes, 0u);
        EXPECT_GE(c.host.pageable_bytes, std::uint64_t{1} << 20);
    }
    const TensorStoreStats s = store_->Stats();
    EXPECT_EQ(s.tensors_put, 1u);
    EXPECT_EQ(s.bytes_put, std::uint64_t{1} << 20);
}

TEST_P(TensorStoreTest, SparseLayerKeysAreReserved) {
    auto a = Pattern(16, 1);
    const TensorRef t = TensorRef::ConstHost(DType::kFloat32, {4}, a);
    for (const char* key : {"mcs/head/w", "mcs/src/w/x", "mcs/"}) {
        EXPECT_THAT(store_->Put(key, t, {}), StatusIsWithMessage(StatusCode::kInvalidArgument,
                                                                 "reserves"));
        EXPECT_THAT(store_->Put(key, t, {PutMode::kUpsert, true}),
                    StatusIs(StatusCode::kInvalidArgument));
        EXPECT_THAT(store_->Get(key), StatusIs(StatusCode::kInvalidArgument));
        EXPECT_THAT(store_->Stat(key), StatusIs(StatusCode::kInvalidArgument));
    }
    const std::string keys[] = {"ok", "mcs/head/w"};
    const TensorRef both[] = {t, t};
    EXPECT_THAT(store_->Put(keys, both, {}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Stat("ok"), StatusIs(StatusCode::kNotFound));  // all or nothing
    EXPECT_THAT(store_->Put("", t, {}), StatusIs(StatusCode::kInvalidArgument));
    // Only the prefix is reserved.
    MCS_EXPECT_OK(store_->Put("mcsx/w", t, {}));
    MCS_EXPECT_OK(store_->Put("a/mcs/w", t, {}));
}

TEST_P(TensorStoreTest, PutsAreHardPinnedByDefault) {
    auto a = Pattern(16, 1);
    const TensorRef t = TensorRef::ConstHost(DType::kFloat32, {4}, a);
    MCS_ASSERT_OK(store_->Put("pinned", t, {}));
    MCS_ASSERT_OK(store_->Put("evictable", t, {PutMode::kCreate, /*hard_pin=*/false}));
    EXPECT_TRUE(store_->Stat("pinned")->hard_pinned);
    EXPECT_FALSE(store_->Stat("evictable")->hard_pinned);
}

TEST(TensorStoreParallelMemcpyTest, CopiesEveryByte) {
    for (std::uint64_t n : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{40} << 20}) {
        auto src = Pattern(n, 5);
        std::vector<std::byte> dst(n);
        ParallelMemcpy(dst.data(), src.data(), n, 4);
        EXPECT_EQ(dst, src);
    }
}

}  // namespace
}  // namespace mooncake::sparse
