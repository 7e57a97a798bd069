// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// EncodeUpdate: overwrite round trips bit for bit (NaNs, -0.0 vs +0.0), the output is born
// sorted by (tile, element) for every rank and tile shape, scatter_add within tolerance,
// thresholds, and the typed errors.

#include <algorithm>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec_test_util.h"

namespace mooncake::sparse {
namespace {

using codec_testing::ByteView;
using codec_testing::DecodeIndices;
using codec_testing::DecodeValues;
using codec_testing::MakeDesc;
using codec_testing::MutableView;
using codec_testing::ReferenceOrder;
using codec_testing::StatusIs;
using codec_testing::Unravel;
using codec_testing::View;
using ::testing::HasSubstr;

HostArray ViewOf(const std::vector<std::byte>& v, DType dtype, const Shape& shape) {
    return HostArray{dtype, shape, std::span<const std::byte>(v)};
}

/// old: random bits; new: old with about `fraction` of the elements changed. For 2-byte
/// elements the changes include NaNs with other payloads and +0.0 <-> -0.0 flips, and some
/// unchanged elements are NaN.
std::pair<std::vector<std::byte>, std::vector<std::byte>> RandomPair(std::mt19937_64& rng,
                                                                     std::int64_t count,
                                                                     std::size_t elem,
                                                                     double fraction) {
    std::vector<std::byte> old_v(static_cast<std::size_t>(count) * elem);
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : old_v) b = static_cast<std::byte>(byte(rng));
    std::vector<std::byte> new_v = old_v;
    std::uniform_real_distribution<double> u(0, 1);
    std::uniform_int_distribution<int> kind(0, 4);
    for (std::int64_t i = 0; i < count; ++i) {
        std::byte* n = new_v.data() + i * elem;
        std::byte* o = old_v.data() + i * elem;
        if (elem == 2 && u(rng) < 0.01) {  // an unchanged NaN
            const std::uint16_t nan = 0x7fc1;
            std::memcpy(o, &nan, 2);
            std::memcpy(n, &nan, 2);
            continue;
        }
        if (u(rng) >= fraction) continue;
        if (elem == 2) {
            std::uint16_t a = 0, b = 0;
            switch (kind(rng)) {
                case 0:
                    a = 0x0000;
                    b = 0x8000;
                    break;  // +0 -> -0
                case 1:
                    a = 0x8000;
                    b = 0x0000;
                    break;  // -0 -> +0
                case 2:
                    a = 0x7fc0;
                    b = 0x7fc1;
                    break;  // NaN payload change
                case 3:
                    a = 0x3f80;
                    b = 0xffc0;
                    break;  // 1.0 -> -NaN
                default:
                    std::memcpy(&a, o, 2);
                    b = static_cast<std::uint16_t>(a ^ (1u << (byte(rng) % 16)));
                    break;
            }
            std::memcpy(o, &a, 2);
            std::memcpy(n, &b, 2);
        } else {
            const std::size_t k = static_cast<std::size_t>(byte(rng)) % elem;
            n[k] = static_cast<std::byte>(static_cast<int>(n[k]) ^ (1 + byte(rng) % 255));
        }
    }
    return {new_v, old_v};
}

struct RoundTripCase {
    Shape shape;
    Shape tile_shape;  // empty: default
    DType dtype;
    double fraction;
    int threads;
};

class EncodeRoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(EncodeRoundTripTest, OverwriteIsSortedExactAndRoundTripsBitForBit) {
    const RoundTripCase& c = GetParam();
    const std::size_t elem = DTypeSize(c.dtype);
    const std::int64_t count = NumElements(c.shape);
    std::mt19937_64 rng(static_cast<std::uint64_t>(count) * 7 + elem);
    auto [new_v, old_v] = RandomPair(rng, count, elem, c.fraction);

    EncodeUpdateOptions opts;
    if (!c.tile_shape.empty()) opts.tile_shape = c.tile_shape;
    opts.num_threads = c.threads;
    ASSERT_OK_AND_ASSIGN(EncodedUpdate enc, EncodeUpdate(ViewOf(new_v, c.dtype, c.shape),
                                                         ViewOf(old_v, c.dtype, c.shape), opts));
    const std::size_t rank = c.shape.size();
    const Shape ts = c.tile_shape.empty() ? DefaultTileShape(c.shape) : c.tile_shape;
    EXPECT_EQ(enc.rank, rank);
    EXPECT_EQ(enc.tile_shape, ts);
    EXPECT_EQ(enc.value_dtype, c.dtype);
    EXPECT_EQ(enc.index_dtype,
              NarrowestIndexDType(*std::max_element(c.shape.begin(), c.shape.end())));

    // Reference: every element whose bytes differ, in (tile, element) order.
    std::vector<std::int64_t> coords;
    std::vector<std::int64_t> linear;
    for (std::int64_t i = 0; i < count; ++i) {
        if (std::memcmp(new_v.data() + i * elem, old_v.data() + i * elem, elem) != 0) {
            auto p = Unravel(i, c.shape);
            coords.insert(coords.end(), p.begin(), p.end());
            linear.push_back(i);
        }
    }
    const auto order = ReferenceOrder(coords, ts);
    ASSERT_EQ(enc.nnz, linear.size());
    const auto got = DecodeIndices(enc.indices, enc.index_dtype);
    ASSERT_EQ(got.size(), linear.size() * rank);
    ASSERT_EQ(enc.values.size(), linear.size() * elem);
    for (std::size_t j = 0; j < order.size(); ++j) {
        for (std::size_t d = 0; d < rank; ++d) {
            ASSERT_EQ(got[j * rank + d], static_cast<std::uint64_t>(coords[order[j] * rank + d]))
                << "entry " << j << " dim " << d;
        }
        ASSERT_EQ(
            std::memcmp(enc.values.data() + j * elem, new_v.data() + linear[order[j]] * elem, elem),
            0);
    }

    // Applying to old gives new, bit for bit.
    std::vector<std::byte> weight = old_v;
    const Index nnz = static_cast<Index>(enc.nnz);
    ASSERT_OK(ApplySparse(MutableHostArray{c.dtype, c.shape, std::span<std::byte>(weight)},
                          ByteView(enc.indices, enc.index_dtype, {nnz, static_cast<Index>(rank)}),
                          ByteView(enc.values, c.dtype, {nnz}), ApplyMode::kOverwrite, c.threads));
    EXPECT_TRUE(weight == new_v);

    // BuildSparseObject takes the output as already sorted and keeps it as is.
    EncodeOptions build;
    build.tile_shape = enc.tile_shape;
    ASSERT_OK_AND_ASSIGN(
        SparseObject obj,
        BuildSparseObject(MakeDesc(c.shape),
                          ByteView(enc.indices, enc.index_dtype, {nnz, static_cast<Index>(rank)}),
                          ByteView(enc.values, c.dtype, {nnz}), build));
    EXPECT_TRUE(std::ranges::equal(obj.indices, enc.indices));
    EXPECT_TRUE(std::ranges::equal(obj.values, enc.values));
    EXPECT_OK(ValidateTileIndex(TileIndexView{rank, obj.tile_coords, obj.tile_ptr}, obj.desc));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EncodeRoundTripTest,
    ::testing::Values(
        RoundTripCase{{257, 1030}, {}, DType::kBFloat16, 0.01, 1},
        RoundTripCase{{257, 1030}, {7, 100}, DType::kBFloat16, 0.05, 1},
        RoundTripCase{{257, 1030}, {16, 64}, DType::kFloat16, 0.2, 2},
        RoundTripCase{{512, 1200}, {64, 256}, DType::kBFloat16, 0.01, 3},  // > 1 MiB: threaded
        RoundTripCase{{512, 1200}, {100, 1200}, DType::kBFloat16, 0.003, 4},
        RoundTripCase{{1, 5000}, {}, DType::kBFloat16, 0.1, 1},
        RoundTripCase{{5000, 1}, {}, DType::kFloat32, 0.1, 1},
        RoundTripCase{{10007}, {}, DType::kBFloat16, 0.05, 1},
        RoundTripCase{{10007}, {1000}, DType::kFloat64, 0.05, 1},
        RoundTripCase{{700000}, {65536}, DType::kBFloat16, 0.01, 3},  // 1-D threaded
        RoundTripCase{{5, 33, 70}, {2, 8, 16}, DType::kFloat32, 0.05, 1},
        RoundTripCase{{5, 33, 70}, {}, DType::kUInt8, 0.3, 1},
        RoundTripCase{{3, 4, 5, 6}, {2, 3, 2, 4}, DType::kInt8, 0.5, 1},
        RoundTripCase{{40, 50, 300}, {8, 16, 64}, DType::kBFloat16, 0.02, 4},  // threaded 3-D
        RoundTripCase{{3, 70000}, {}, DType::kBFloat16, 0.001, 2},             // uint32 indices
        RoundTripCase{{64, 64}, {}, DType::kFloat8E4M3, 0.1, 1}));

TEST(EncodeUpdateTest, ThreadCountDoesNotChangeTheResult) {
    std::mt19937_64 rng(1);
    const Shape shape{1024, 1100};
    auto [new_v, old_v] = RandomPair(rng, NumElements(shape), 2, 0.01);
    EncodedUpdate out[2];
    for (int k = 0; k < 2; ++k) {
        EncodeUpdateOptions opts;
        opts.num_threads = k == 0 ? 1 : 3;
        ASSERT_OK_AND_ASSIGN(out[k], EncodeUpdate(ViewOf(new_v, DType::kBFloat16, shape),
                                                  ViewOf(old_v, DType::kBFloat16, shape), opts));
    }
    EXPECT_EQ(out[0].nnz, out[1].nnz);
    EXPECT_EQ(out[0].indices, out[1].indices);
    EXPECT_EQ(out[0].values, out[1].values);
}

TEST(EncodeUpdateTest, IdenticalTensorsGiveAnEmptyUpdate) {
    std::vector<float> a(1000, 1.5f);
    ASSERT_OK_AND_ASSIGN(EncodedUpdate enc, EncodeUpdate(View(a, {10, 100}), View(a, {10, 100})));
    EXPECT_EQ(enc.nnz, 0u);
    EXPECT_TRUE(enc.indices.empty());
    EXPECT_TRUE(enc.values.empty());
}

TEST(EncodeUpdateTest, ScatterAddBFloat16WithinTolerance) {
    std::mt19937_64 rng(9);
    const Shape shape{300, 700};
    const std::size_t n = 300 * 700;
    std::normal_distribution<float> w(0.0f, 1.0f), step(0.0f, 0.01f);
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<std::uint16_t> old_v(n), new_v(n);
    for (std::size_t i = 0; i < n; ++i) {
        old_v[i] = FloatToBFloat16(w(rng));
        new_v[i] =
            u(rng) < 0.05 ? FloatToBFloat16(BFloat16ToFloat(old_v[i]) + step(rng)) : old_v[i];
    }
    EncodeUpdateOptions opts;
    opts.apply = ApplyMode::kScatterAdd;
    ASSERT_OK_AND_ASSIGN(EncodedUpdate enc,
                         EncodeUpdate(View(new_v, shape, DType::kBFloat16),
                                      View(old_v, shape, DType::kBFloat16), opts));
    std::size_t changed = 0;
    for (std::size_t i = 0; i < n; ++i) changed += new_v[i] != old_v[i];
    EXPECT_EQ(enc.nnz, changed);  // every changed bf16 gives a non-zero bf16 delta

    std::vector<std::uint16_t> weight = old_v;
    const Index nnz = static_cast<Index>(enc.nnz);
    ASSERT_OK(ApplySparse(MutableView(weight, shape, DType::kBFloat16),
                          ByteView(enc.indices, enc.index_dtype, {nnz, 2}),
                          ByteView(enc.values, DType::kBFloat16, {nnz}), ApplyMode::kScatterAdd));
    for (std::size_t i = 0; i < n; ++i) {
        const float got = BFloat16ToFloat(weight[i]), want = BFloat16ToFloat(new_v[i]);
        const float step_size = std::fabs(want - BFloat16ToFloat(old_v[i]));
        // Two bf16 roundings (the delta, then the sum): each within 2^-9 relative.
        ASSERT_NEAR(got, want, (std::fabs(want) + step_size) * 0x1p-8f + 1e-30f) << i;
    }
}

TEST(EncodeUpdateTest, ScatterAddFloat32IsExactForSmallSteps) {
    std::vector<float> old_v(4096), new_v(4096);
    for (std::size_t i = 0; i < old_v.size(); ++i) {
        old_v[i] = static_cast<float>(i) * 0.25f;
        new_v[i] = i % 3 == 0 ? old_v[i] + 0.5f : old_v[i];
    }
    EncodeUpdateOptions opts;
    opts.apply = ApplyMode::kScatterAdd;
    ASSERT_OK_AND_ASSIGN(EncodedUpdate enc,
                         EncodeUpdate(View(new_v, {64, 64}), View(old_v, {64, 64}), opts));
    EXPECT_EQ(enc.nnz, (4096u + 2) / 3);
    for (float d : DecodeValues<float>(enc.values)) EXPECT_EQ(d, 0.5f);
    std::vector<float> weight = old_v;
    const Index nnz = static_cast<Index>(enc.nnz);
    ASSERT_OK(ApplySparse(MutableView(weight, {64, 64}),
                          ByteView(enc.indices, enc.index_dtype, {nnz, 2}),
                          ByteView(enc.values, DType::kFloat32, {nnz}), ApplyMode::kScatterAdd));
    EXPECT_EQ(weight, new_v);
}

TEST(EncodeUpdateTest, ThresholdKeepsOnlyLargerDeltas) {
    std::vector<float> old_v(10, 0.0f);
    std::vector<float> new_v = {0.5f, 1.5f, -2.0f, 0.1f, -0.1f, -0.5f, 0.0f, 0.50001f, -0.0f, NAN};
    EncodeUpdateOptions opts;
    opts.apply = ApplyMode::kScatterAdd;
    opts.threshold = 0.5;
    ASSERT_OK_AND_ASSIGN(EncodedUpdate enc,
                         EncodeUpdate(View(new_v, {10}), View(old_v, {10}), opts));
    // Strictly greater than the threshold; a NaN delta is kept (the weight did change).
    EXPECT_EQ(DecodeIndices(enc.indices, enc.index_dtype),
              (std::vector<std::uint64_t>{1, 2, 7, 9}));
    const auto vals = DecodeValues<float>(enc.values);
    ASSERT_EQ(vals.size(), 4u);
    EXPECT_EQ(vals[0], 1.5f);
    EXPECT_EQ(vals[1], -2.0f);
    EXPECT_EQ(vals[2], 0.50001f);
    EXPECT_TRUE(std::isnan(vals[3]));

    opts.threshold = 0.0;  // any non-zero delta; -0.0 vs +0.0 is no delta
    ASSERT_OK_AND_ASSIGN(enc, EncodeUpdate(View(new_v, {10}), View(old_v, {10}), opts));
    EXPECT_EQ(DecodeIndices(enc.indices, enc.index_dtype),
              (std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 7, 9}));
}

TEST(EncodeUpdateTest, OverwriteKeepsSignedZeroChanges) {
    std::vector<float> old_v = {0.0f, 1.0f, -0.0f};
    std::vector<float> new_v = {-0.0f, 1.0f, -0.0f};
    ASSERT_OK_AND_ASSIGN(EncodedUpdate enc, EncodeUpdate(View(new_v, {3}), View(old_v, {3})));
    EXPECT_EQ(DecodeIndices(enc.indices, enc.index_dtype), (std::vector<std::uint64_t>{0}));
}

TEST(EncodeUpdateTest, ScatterAddIntegersWrapAndUseTheTrueMagnitude) {
    std::vector<std::int8_t> old_v = {120, -120, 0, 0, 5};
    std::vector<std::int8_t> new_v = {-120, 120, 3, 2, 5};
    EncodeUpdateOptions opts;
    opts.apply = ApplyMode::kScatterAdd;
    opts.threshold = 2.5;
    ASSERT_OK_AND_ASSIGN(EncodedUpdate enc, EncodeUpdate(View(new_v, {5}), View(old_v, {5}), opts));
    EXPECT_EQ(DecodeIndices(enc.indices, enc.index_dtype), (std::vector<std::uint64_t>{0, 1, 2}));
    std::vector<std::int8_t> weight = old_v;
    const Index nnz = static_cast<Index>(enc.nnz);
    ASSERT_OK(ApplySparse(MutableView(weight, {5}),
                          ByteView(enc.indices, enc.index_dtype, {nnz, 1}),
                          ByteView(enc.values, DType::kInt8, {nnz}), ApplyMode::kScatterAdd));
    EXPECT_EQ(weight, (std::vector<std::int8_t>{-120, 120, 3, 0, 5}));

    std::vector<std::uint64_t> o64 = {0, ~0ull}, n64 = {~0ull, 0};
    opts.threshold = 0;
    ASSERT_OK_AND_ASSIGN(enc, EncodeUpdate(View(n64, {2}), View(o64, {2}), opts));
    std::vector<std::uint64_t> w64 = o64;
    ASSERT_OK(ApplySparse(MutableView(w64, {2}), ByteView(enc.indices, enc.index_dtype, {2, 1}),
                          ByteView(enc.values, DType::kUInt64, {2}), ApplyMode::kScatterAdd));
    EXPECT_EQ(w64, n64);
}

TEST(EncodeUpdateTest, Float16ScatterAdd) {
    std::vector<std::uint16_t> old_v = {FloatToFloat16(1.0f), FloatToFloat16(2.0f),
                                        FloatToFloat16(0x1p-24f)};
    std::vector<std::uint16_t> new_v = {FloatToFloat16(1.5f), FloatToFloat16(2.0f), 0};
    EncodeUpdateOptions opts;
    opts.apply = ApplyMode::kScatterAdd;
    ASSERT_OK_AND_ASSIGN(EncodedUpdate enc, EncodeUpdate(View(new_v, {3}, DType::kFloat16),
                                                         View(old_v, {3}, DType::kFloat16), opts));
    const auto vals = DecodeValues<std::uint16_t>(enc.values);
    ASSERT_EQ(vals.size(), 2u);
    EXPECT_EQ(Float16ToFloat(vals[0]), 0.5f);
    EXPECT_EQ(Float16ToFloat(vals[1]), -0x1p-24f);  // subnormal delta survives
}

TEST(EncodeUpdateTest, BadInputGetsInvalidArgument) {
    std::vector<float> a(100), b(100);
    std::vector<double> c(100);
    std::vector<std::uint8_t> bools(100), f8(100);
    EncodeUpdateOptions overwrite_thr;
    overwrite_thr.threshold = 0.1;
    EncodeUpdateOptions negative;
    negative.apply = ApplyMode::kScatterAdd;
    negative.threshold = -1;
    EncodeUpdateOptions nan_thr;
    nan_thr.apply = ApplyMode::kScatterAdd;
    nan_thr.threshold = NAN;
    EncodeUpdateOptions add;
    add.apply = ApplyMode::kScatterAdd;
    EncodeUpdateOptions bad_tile;
    bad_tile.tile_shape = Shape{10};
    EncodeUpdateOptions bad_threads;
    bad_threads.num_threads = -2;
    HostArray short_b = View(b, {10, 10});
    short_b.data = short_b.data.first(396);
    struct Case {
        const char* name;
        Result<EncodedUpdate> r;
        const char* message;
    } cases[] = {
        {"dtype", EncodeUpdate(View(a, {10, 10}), View(c, {10, 10})), "!= old dtype"},
        {"shape", EncodeUpdate(View(a, {10, 10}), View(b, {20, 5})), "!= old shape"},
        {"bool", EncodeUpdate(View(bools, {100}, DType::kBool), View(bools, {100}, DType::kBool)),
         "not numeric"},
        {"overwrite_threshold", EncodeUpdate(View(a, {100}), View(b, {100}), overwrite_thr),
         "threshold applies to scatter_add only"},
        {"negative_threshold", EncodeUpdate(View(a, {100}), View(b, {100}), negative),
         "non-negative"},
        {"nan_threshold", EncodeUpdate(View(a, {100}), View(b, {100}), nan_thr), "non-negative"},
        {"float8_add",
         EncodeUpdate(View(f8, {100}, DType::kFloat8E5M2), View(f8, {100}, DType::kFloat8E5M2),
                      add),
         "not supported for float8_e5m2"},
        {"bytes", EncodeUpdate(View(a, {10, 10}), short_b), "old holds 396 bytes"},
        {"rank0", EncodeUpdate(View(a, {}), View(b, {})), "rank 0"},
        {"tile", EncodeUpdate(View(a, {10, 10}), View(b, {10, 10}), bad_tile), "tile_shape rank"},
        {"threads", EncodeUpdate(View(a, {10, 10}), View(b, {10, 10}), bad_threads), "num_threads"},
    };
    for (const Case& k : cases) {
        SCOPED_TRACE(k.name);
        EXPECT_THAT(k.r, StatusIs(StatusCode::kInvalidArgument));
        EXPECT_THAT(k.r.status().message(), HasSubstr(k.message));
    }
}

TEST(EncodeUpdatesTest, EqualsEncodingEachAndABadPairFailsAlone) {
    std::mt19937_64 rng(9);
    std::vector<std::vector<float>> news, olds;
    std::vector<Shape> shapes;
    for (int i = 0; i < 400; ++i) {
        // Mostly small tensors and one past the large threshold (2^20 elements).
        const Shape shape = i == 7 ? Shape{1024, 1100} : Shape{Index(1 + rng() % 64), Index(1 + rng() % 96)};
        const std::size_t n = std::size_t(shape[0] * shape[1]);
        std::vector<float> old(n), nw(n);
        for (std::size_t e = 0; e < n; ++e) old[e] = nw[e] = float(rng() % 100);
        for (std::size_t e = 0; e < n / 50 + 1; ++e) nw[rng() % n] += 1.0f;
        shapes.push_back(shape);
        news.push_back(std::move(nw));
        olds.push_back(std::move(old));
    }
    std::vector<EncodePair> pairs;
    for (std::size_t i = 0; i < news.size(); ++i) {
        pairs.push_back({View(news[i], shapes[i]), View(olds[i], shapes[i])});
    }
    pairs[3].old_values.shape = {1, Index(olds[3].size())};  // shapes differ
    for (const ApplyMode mode : {ApplyMode::kOverwrite, ApplyMode::kScatterAdd}) {
        EncodeUpdateOptions opts;
        opts.apply = mode;
        const auto got = EncodeUpdates(pairs, opts);
        ASSERT_EQ(got.size(), pairs.size());
        EXPECT_THAT(got[3].status(), StatusIs(StatusCode::kInvalidArgument));
        for (std::size_t i = 0; i < pairs.size(); ++i) {
            if (i == 3) continue;
            ASSERT_OK_AND_ASSIGN(EncodedUpdate one,
                                 EncodeUpdate(pairs[i].new_values, pairs[i].old_values, opts));
            ASSERT_TRUE(got[i].ok()) << i;
            EXPECT_EQ(got[i]->nnz, one.nnz) << i;
            EXPECT_EQ(got[i]->indices, one.indices) << i;
            EXPECT_EQ(got[i]->values, one.values) << i;
        }
    }
}

}  // namespace
}  // namespace mooncake::sparse
