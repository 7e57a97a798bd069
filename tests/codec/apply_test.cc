// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// ApplySparse: overwrite is bit-exact, scatter_add rounds like the reference, a bad coordinate
// anywhere leaves the weight untouched, repeated coordinates give the single-threaded result
// whatever the thread count, dtype/rank errors are typed, and strided weights (views) are
// written in place through their strides.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec_test_util.h"

namespace mooncake::sparse {
namespace {

using codec_testing::MutableView;
using codec_testing::StatusIs;
using codec_testing::View;
using ::testing::HasSubstr;

TEST(ApplySparseTest, OverwriteIsBitExactForBFloat16) {
    std::vector<std::uint16_t> w(6 * 8, 0x3f80);
    const std::vector<std::uint16_t> idx = {0, 0, 5, 7, 2, 3, 1, 1};
    const std::vector<std::uint16_t> val = {0xffc1, 0x8000, 0x7f81,
                                            0x0001};  // -NaN, -0, sNaN, denormal
    ASSERT_OK(ApplySparse(MutableView(w, {6, 8}, DType::kBFloat16), View(idx, {4, 2}),
                          View(val, {4}, DType::kBFloat16), ApplyMode::kOverwrite));
    EXPECT_EQ(w[0], 0xffc1);
    EXPECT_EQ(w[5 * 8 + 7], 0x8000);
    EXPECT_EQ(w[2 * 8 + 3], 0x7f81);
    EXPECT_EQ(w[1 * 8 + 1], 0x0001);
    EXPECT_EQ(w[1], 0x3f80);
}

TEST(ApplySparseTest, ScatterAddRoundsToNearestEvenThroughFloat32) {
    std::mt19937_64 rng(2);
    std::uniform_int_distribution<int> bits(0, 0xffff);
    const std::size_t n = 4096;
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
        std::vector<std::uint16_t> w(n), v(n), want(n);
        std::vector<std::uint32_t> idx(n);
        for (std::size_t i = 0; i < n; ++i) {
            w[i] = static_cast<std::uint16_t>(bits(rng));
            v[i] = static_cast<std::uint16_t>(bits(rng));
            idx[i] = static_cast<std::uint32_t>(i);
            want[i] = dtype == DType::kBFloat16
                          ? FloatToBFloat16(BFloat16ToFloat(w[i]) + BFloat16ToFloat(v[i]))
                          : FloatToFloat16(Float16ToFloat(w[i]) + Float16ToFloat(v[i]));
        }
        ASSERT_OK(ApplySparse(MutableView(w, {static_cast<Index>(n)}, dtype),
                              View(idx, {static_cast<Index>(n), 1}),
                              View(v, {static_cast<Index>(n)}, dtype), ApplyMode::kScatterAdd));
        EXPECT_EQ(w, want) << DTypeName(dtype);
    }
}

TEST(ApplySparseTest, ScatterAddNativeTypes) {
    std::vector<float> wf = {1.0f, 2.0f, 3.0f};
    ASSERT_OK(ApplySparse(MutableView(wf, {3}), View(std::vector<std::uint16_t>{2, 0}, {2, 1}),
                          View(std::vector<float>{0.5f, -1.0f}, {2}), ApplyMode::kScatterAdd));
    EXPECT_EQ(wf, (std::vector<float>{0.0f, 2.0f, 3.5f}));
    std::vector<double> wd = {1.0, 2.0};
    ASSERT_OK(ApplySparse(MutableView(wd, {2}), View(std::vector<std::uint64_t>{1}, {1, 1}),
                          View(std::vector<double>{0.25}, {1}), ApplyMode::kScatterAdd));
    EXPECT_EQ(wd, (std::vector<double>{1.0, 2.25}));
    std::vector<std::int32_t> wi = {std::numeric_limits<std::int32_t>::max(), 5};
    ASSERT_OK(ApplySparse(MutableView(wi, {2}), View(std::vector<std::uint16_t>{0, 1}, {2}),
                          View(std::vector<std::int32_t>{1, -7}, {2}), ApplyMode::kScatterAdd));
    EXPECT_EQ(wi, (std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), -2}));
}

TEST(ApplySparseTest, OutOfRangeCoordinateLeavesTheWeightUnchanged) {
    std::mt19937_64 rng(4);
    for (std::size_t n : {std::size_t{10}, std::size_t{200000}}) {  // single and multi-threaded
        std::vector<float> w(512 * 512);
        for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
        const std::vector<float> before = w;
        std::vector<std::uint16_t> idx(n * 2);
        std::uniform_int_distribution<int> c(0, 511);
        for (auto& x : idx) x = static_cast<std::uint16_t>(c(rng));
        idx[(n - 1) * 2 + 1] = 512;  // the very last entry is out of range
        const std::vector<float> val(n, 1.0f);
        for (ApplyMode mode : {ApplyMode::kOverwrite, ApplyMode::kScatterAdd}) {
            Status s =
                ApplySparse(MutableView(w, {512, 512}), View(idx, {static_cast<Index>(n), 2}),
                            View(val, {static_cast<Index>(n)}), mode, 4);
            EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
            EXPECT_THAT(s.message(), HasSubstr("entry " + std::to_string(n - 1) +
                                               " coordinate 512 in dim 1 is outside the weight "
                                               "shape [512, 512]"));
            EXPECT_TRUE(w == before);
        }
    }
}

TEST(ApplySparseTest, RepeatedCoordinatesMatchSingleThreadedInAnyThreadCount) {
    // Many repeats per element, entries in random order: scatter_add sums them in entry order
    // (float32, so order matters bit-wise) and overwrite keeps the last.
    std::mt19937_64 rng(8);
    const Index rows = 300, cols = 257;
    const std::size_t n = 400000;
    std::uniform_int_distribution<int> r(0, rows - 1), c(0, cols - 1);
    std::normal_distribution<float> v(0.0f, 1.0f);
    std::vector<std::uint16_t> idx(n * 2);
    std::vector<float> val(n);
    for (std::size_t i = 0; i < n; ++i) {
        idx[2 * i] = static_cast<std::uint16_t>(r(rng));
        idx[2 * i + 1] = static_cast<std::uint16_t>(c(rng));
        val[i] = v(rng);
    }
    for (ApplyMode mode : {ApplyMode::kOverwrite, ApplyMode::kScatterAdd}) {
        std::vector<float> reference(static_cast<std::size_t>(rows * cols), 1.0f);
        for (std::size_t i = 0; i < n; ++i) {
            float& x = reference[idx[2 * i] * static_cast<std::size_t>(cols) + idx[2 * i + 1]];
            x = mode == ApplyMode::kOverwrite ? val[i] : x + val[i];
        }
        for (int threads : {1, 2, 3, 7}) {
            std::vector<float> w(static_cast<std::size_t>(rows * cols), 1.0f);
            ASSERT_OK(ApplySparse(MutableView(w, {rows, cols}),
                                  View(idx, {static_cast<Index>(n), 2}),
                                  View(val, {static_cast<Index>(n)}), mode, threads));
            EXPECT_TRUE(w == reference) << ApplyModeName(mode) << " threads " << threads;
        }
    }
}

TEST(ApplySparseTest, ThreeDimensionalAndOneDimensional) {
    std::vector<std::int16_t> w3(2 * 3 * 4, 0);
    const std::vector<std::uint32_t> idx3 = {1, 2, 3, 0, 1, 2};
    ASSERT_OK(ApplySparse(MutableView(w3, {2, 3, 4}), View(idx3, {2, 3}),
                          View(std::vector<std::int16_t>{7, 9}, {2}), ApplyMode::kOverwrite));
    EXPECT_EQ(w3[1 * 12 + 2 * 4 + 3], 7);
    EXPECT_EQ(w3[0 * 12 + 1 * 4 + 2], 9);
    std::vector<std::uint8_t> w1(5, 1);
    ASSERT_OK(ApplySparse(MutableView(w1, {5}), View(std::vector<std::uint16_t>{4, 4}, {2}),
                          View(std::vector<std::uint8_t>{200, 100}, {2}), ApplyMode::kScatterAdd));
    EXPECT_EQ(w1, (std::vector<std::uint8_t>{1, 1, 1, 1, 45}));  // 1 + 200 + 100 wraps
}

TEST(ApplySparseTest, EmptyUpdateIsANoOp) {
    std::vector<float> w(4, 2.0f);
    EXPECT_OK(ApplySparse(MutableView(w, {2, 2}), View(std::vector<std::uint16_t>{}, {0, 2}),
                          View(std::vector<float>{}, {0}), ApplyMode::kScatterAdd));
    EXPECT_EQ(w, std::vector<float>(4, 2.0f));
}

TEST(ApplySparseTest, BadInputGetsInvalidArgument) {
    std::vector<float> w(16);
    std::vector<std::uint8_t> f8(16);
    const std::vector<std::uint16_t> idx = {1, 1};
    const std::vector<std::int32_t> sidx = {1, 1};
    const std::vector<float> val = {1.0f};
    struct Case {
        const char* name;
        Status s;
        const char* message;
    } cases[] = {
        {"value_dtype",
         ApplySparse(MutableView(w, {4, 4}), View(idx, {1, 2}), View(std::vector<double>{1}, {1}),
                     ApplyMode::kOverwrite),
         "values dtype float64 != weight dtype float32"},
        {"signed_index",
         ApplySparse(MutableView(w, {4, 4}), View(sidx, {1, 2}), View(val, {1}),
                     ApplyMode::kOverwrite),
         "indices dtype int32 is not uint16, uint32 or uint64"},
        {"rank",
         ApplySparse(MutableView(w, {16}), View(idx, {1, 2}), View(val, {1}),
                     ApplyMode::kOverwrite),
         "is not [nnz, 1]"},
        {"length",
         ApplySparse(MutableView(w, {4, 4}), View(idx, {1, 2}), View(std::vector<float>{1, 2}, {2}),
                     ApplyMode::kOverwrite),
         "values shape [2] is not [1]"},
        {"weight_bytes",
         ApplySparse(MutableView(w, {4, 5}), View(idx, {1, 2}), View(val, {1}),
                     ApplyMode::kOverwrite),
         "weight holds 64 bytes"},
        {"float8_add",
         ApplySparse(
             MutableView(f8, {16}, DType::kFloat8E4M3), View(std::vector<std::uint16_t>{1}, {1, 1}),
             View(std::vector<std::uint8_t>{1}, {1}, DType::kFloat8E4M3), ApplyMode::kScatterAdd),
         "scatter_add is not supported for float8_e4m3fn"},
        {"threads",
         ApplySparse(MutableView(w, {4, 4}), View(idx, {1, 2}), View(val, {1}),
                     ApplyMode::kOverwrite, -1),
         "num_threads"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        EXPECT_THAT(c.s, StatusIs(StatusCode::kInvalidArgument));
        EXPECT_THAT(c.s.message(), HasSubstr(c.message));
    }
    // float8 overwrite copies bytes.
    ASSERT_OK(ApplySparse(
        MutableView(f8, {16}, DType::kFloat8E4M3), View(std::vector<std::uint16_t>{3}, {1, 1}),
        View(std::vector<std::uint8_t>{0x7f}, {1}, DType::kFloat8E4M3), ApplyMode::kOverwrite));
    EXPECT_EQ(f8[3], 0x7f);
}

/// A view over `buffer` (float): shape, element strides and the offset of element [0, 0].
struct StridedCase {
    const char* name;
    Shape shape;
    std::vector<std::int64_t> strides;
    std::int64_t origin;  // element offset of [0, 0] in the buffer
};

TEST(ApplySparseTest, StridedWeightsAreWrittenInPlaceThroughTheirStrides) {
    constexpr std::int64_t kRows = 300, kCols = 260;  // buffer: kRows x kCols floats
    const std::vector<StridedCase> cases = {
        {"transposed", {kCols, kRows}, {1, kCols}, 0},
        {"every_other_column", {kRows, kCols / 2}, {kCols, 2}, 1},
        {"row_slice_of_columns", {kRows - 10, 100}, {kCols, 1}, 5 * kCols + 7},
        {"rows_reversed", {kRows, kCols}, {-kCols, 1}, (kRows - 1) * kCols},
        {"both_reversed_transposed", {kCols, kRows}, {-1, -kCols}, kRows * kCols - 1},
    };
    std::mt19937_64 rng(7);
    for (const StridedCase& c : cases) {
        for (ApplyMode mode : {ApplyMode::kOverwrite, ApplyMode::kScatterAdd}) {
            for (int threads : {1, 4}) {
                SCOPED_TRACE(std::string(c.name) + " " + std::string(ApplyModeName(mode)) +
                             " threads=" + std::to_string(threads));
                std::vector<float> buffer(kRows * kCols);
                for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = float(i) * 0.5f;
                std::vector<float> want = buffer;
                // Enough entries for the threaded paths, repeated coordinates included.
                const std::size_t n = 70000;
                std::vector<std::uint16_t> idx(2 * n);
                std::vector<float> val(n);
                std::uniform_int_distribution<std::int64_t> r0(0, c.shape[0] - 1),
                    r1(0, c.shape[1] - 1);
                for (std::size_t i = 0; i < n; ++i) {
                    const std::int64_t a = r0(rng), b = r1(rng);
                    idx[2 * i] = static_cast<std::uint16_t>(a);
                    idx[2 * i + 1] = static_cast<std::uint16_t>(b);
                    val[i] = float(i % 977) - 300.0f;
                    float& e = want[c.origin + a * c.strides[0] + b * c.strides[1]];
                    e = mode == ApplyMode::kOverwrite ? val[i] : e + val[i];
                }
                // The span from the lowest- to the highest-addressed element of the view.
                std::int64_t lo = 0, hi = 0;
                for (int d = 0; d < 2; ++d) {
                    const std::int64_t reach = c.strides[d] * (c.shape[d] - 1);
                    (reach < 0 ? lo : hi) += reach;
                }
                auto bytes = std::as_writable_bytes(std::span(buffer));
                const MutableHostArray w{
                    DType::kFloat32, c.shape,
                    bytes.subspan((c.origin + lo) * 4, (hi - lo + 1) * 4), c.strides};
                ASSERT_OK(ApplySparse(w, View(idx, {static_cast<Index>(n), 2}),
                                      View(val, {static_cast<Index>(n)}), mode, threads));
                EXPECT_EQ(buffer, want);  // bit for bit, and nothing outside the view moved
            }
        }
    }
}

TEST(ApplySparseTest, StridedWeightErrorsLeaveItUntouched) {
    std::vector<float> buffer(16, 1.0f);
    const std::vector<float> before = buffer;
    auto bytes = std::as_writable_bytes(std::span(buffer));
    const std::vector<std::uint16_t> idx = {0, 1, 3, 3};
    const std::vector<float> val = {5, 6};
    // A broadcast row: every row is the same memory.
    EXPECT_THAT(ApplySparse(MutableHostArray{DType::kFloat32, {4, 4}, bytes.first(16), {0, 1}},
                            View(idx, {2, 2}), View(val, {2}), ApplyMode::kOverwrite),
                StatusIs(StatusCode::kInvalidArgument));
    // A span that does not match the strides.
    EXPECT_THAT(ApplySparse(MutableHostArray{DType::kFloat32, {4, 2}, bytes, {4, 2}},
                            View(idx, {2, 2}), View(val, {2}), ApplyMode::kOverwrite),
                StatusIs(StatusCode::kInvalidArgument));
    // Strides of the wrong rank.
    EXPECT_THAT(ApplySparse(MutableHostArray{DType::kFloat32, {4, 4}, bytes, {1}},
                            View(idx, {2, 2}), View(val, {2}), ApplyMode::kOverwrite),
                StatusIs(StatusCode::kInvalidArgument));
    // A coordinate outside a transposed view: nothing written.
    const std::vector<std::uint16_t> bad = {0, 1, 4, 0};
    EXPECT_THAT(ApplySparse(MutableHostArray{DType::kFloat32, {4, 4}, bytes, {1, 4}},
                            View(bad, {2, 2}), View(val, {2}), ApplyMode::kOverwrite),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_EQ(buffer, before);
    // C-contiguous strides take the plain path.
    ASSERT_OK(ApplySparse(MutableHostArray{DType::kFloat32, {4, 4}, bytes, {4, 1}},
                          View(idx, {2, 2}), View(val, {2}), ApplyMode::kOverwrite));
    EXPECT_EQ(buffer[1], 5.0f);
    EXPECT_EQ(buffer[15], 6.0f);
}

TEST(ApplySparseBatchTest, EqualsApplyingEachInTurn) {
    // 3,000 small items of 600 weights, one large item, items into overlapping views of one
    // weight (the later write wins), and a bad item that fails alone.
    std::mt19937_64 rng(5);
    constexpr std::size_t kWeights = 600, kSmall = 3000;
    const Shape shape{32, 48};
    std::vector<std::vector<float>> batch_w(kWeights, std::vector<float>(32 * 48, 0.0f));
    std::vector<std::vector<float>> loop_w = batch_w;
    std::vector<std::vector<std::uint32_t>> idx;
    std::vector<std::vector<float>> val;
    std::vector<std::size_t> which;  // the weight of each item
    std::vector<ApplyMode> modes;
    for (std::size_t i = 0; i < kSmall; ++i) {
        std::vector<std::uint32_t> ix;
        std::vector<float> vx;
        const std::size_t n = rng() % 40;
        for (std::size_t e = 0; e < n; ++e) {
            ix.push_back(std::uint32_t(rng() % 32));
            ix.push_back(std::uint32_t(rng() % 48));
            vx.push_back(float(rng() % 1000));
        }
        idx.push_back(std::move(ix));
        val.push_back(std::move(vx));
        which.push_back(rng() % kWeights);  // several items per weight: applied in order
        modes.push_back(i % 3 == 0 ? ApplyMode::kScatterAdd : ApplyMode::kOverwrite);
    }
    // A large one (past the parallel threshold) into weight 0.
    std::vector<float> big_w(512 * 512, 1.0f), big_loop = big_w;
    std::vector<std::uint32_t> big_idx;
    std::vector<float> big_val;
    for (std::uint32_t e = 0; e < 200'000; ++e) {
        big_idx.push_back(std::uint32_t(rng() % 512));
        big_idx.push_back(std::uint32_t(rng() % 512));
        big_val.push_back(float(e));
    }
    std::vector<ApplyItem> items;
    for (std::size_t i = 0; i < kSmall; ++i) {
        items.push_back({MutableView(batch_w[which[i]], shape),
                         View(idx[i], {Index(val[i].size()), 2}), View(val[i], {Index(val[i].size())}),
                         modes[i]});
    }
    items.push_back({MutableView(big_w, {512, 512}), View(big_idx, {200'000, 2}),
                     View(big_val, {200'000}), ApplyMode::kOverwrite});
    const std::vector<double> wrong = {1.0};
    const std::vector<std::uint32_t> one = {0, 0};
    items.push_back({MutableView(batch_w[1], shape), View(one, {1, 2}), View(wrong, {1}),
                     ApplyMode::kOverwrite});  // float64 values into a float32 weight
    for (int threads : {0, 1, 3}) {
        for (auto& w : batch_w) std::fill(w.begin(), w.end(), 0.0f);
        std::fill(big_w.begin(), big_w.end(), 1.0f);
        const std::vector<Status> got = ApplySparseBatch(items, threads);
        ASSERT_EQ(got.size(), items.size());
        for (std::size_t i = 0; i + 1 < items.size(); ++i) ASSERT_OK(got[i]) << i;
        EXPECT_THAT(got.back(), StatusIs(StatusCode::kInvalidArgument));
        if (threads == 0) {
            for (std::size_t i = 0; i < kSmall; ++i) {
                ASSERT_OK(ApplySparse(MutableView(loop_w[which[i]], shape),
                                      View(idx[i], {Index(val[i].size()), 2}),
                                      View(val[i], {Index(val[i].size())}), modes[i], 1));
            }
            ASSERT_OK(ApplySparse(MutableView(big_loop, {512, 512}), View(big_idx, {200'000, 2}),
                                  View(big_val, {200'000}), ApplyMode::kOverwrite, 1));
        }
        EXPECT_EQ(batch_w, loop_w) << threads << " threads";
        EXPECT_EQ(big_w, big_loop);
    }
    // Items into overlapping views of one weight (rows 0-31 and rows 16-47 of [48, 48]) keep
    // batch order: the second item's write of row 20 wins, as in a loop.
    std::vector<float> tall(48 * 48, 0.0f);
    const std::vector<std::uint32_t> at_a = {20, 3}, at_b = {4, 3};  // the same element
    const std::vector<float> va = {1.0f}, vb = {2.0f};
    MutableHostArray top{DType::kFloat32, {32, 48},
                         std::as_writable_bytes(std::span(tall)).first(32 * 48 * 4)};
    MutableHostArray low{DType::kFloat32, {32, 48},
                         std::as_writable_bytes(std::span(tall)).subspan(16 * 48 * 4)};
    const std::vector<ApplyItem> overlapping = {
        {top, View(at_a, {1, 2}), View(va, {1}), ApplyMode::kOverwrite},
        {low, View(at_b, {1, 2}), View(vb, {1}), ApplyMode::kOverwrite}};
    for (const Status& s : ApplySparseBatch(overlapping, 4)) ASSERT_OK(s);
    EXPECT_EQ(tall[20 * 48 + 3], 2.0f);
}

}  // namespace
}  // namespace mooncake::sparse
