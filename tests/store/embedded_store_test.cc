// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Single-threaded behaviour of the embedded ObjectStore: round trips, validation, capacity,
// versions, List, Remove and counters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "store/object_store.h"
#include "store_test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::Create;
using ::mooncake::sparse::testing::EachBatch;
using ::mooncake::sparse::testing::ExpectPutEachIsPutInOrder;
using ::mooncake::sparse::testing::ExpectPutEachIsPutInOrderOnFreshStores;
using ::mooncake::sparse::testing::OwnedMember;
using ::mooncake::sparse::testing::PatternMember;
using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::StatusIsWithMessage;
using ::mooncake::sparse::testing::Upsert;
using ::mooncake::sparse::testing::Views;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::byte> Sentinel(std::size_t n) {
    return std::vector<std::byte>(n, std::byte{0xEE});
}

bool AllSentinel(const std::vector<std::byte>& v) {
    return std::all_of(v.begin(), v.end(), [](std::byte b) { return b == std::byte{0xEE}; });
}

// ---------------------------------------------------------------------------------------------
// MemberInfo / ObjectInfo helpers.
// ---------------------------------------------------------------------------------------------

TEST(ObjectInfoTest, RowBytesIsProductOfTrailingExtentsTimesDTypeSize) {
    MemberInfo m;
    m.dtype = DType::kBFloat16;
    m.shape = {7, 3, 5};
    EXPECT_EQ(m.RowBytes(), 3u * 5u * 2u);
    m.shape = {7};
    EXPECT_EQ(m.RowBytes(), 2u);
    m.dtype = DType::kUInt64;
    m.shape = {0, 4};
    EXPECT_EQ(m.RowBytes(), 32u);
}

TEST(ObjectInfoTest, FindMemberByName) {
    ObjectInfo info;
    info.members.resize(2);
    info.members[0].name = "indices";
    info.members[1].name = "values";
    ASSERT_NE(info.FindMember("values"), nullptr);
    EXPECT_EQ(info.FindMember("values"), &info.members[1]);
    EXPECT_EQ(info.FindMember("indices"), &info.members[0]);
    EXPECT_EQ(info.FindMember("tile_ptr"), nullptr);
    EXPECT_EQ(info.FindMember(""), nullptr);
}

// ---------------------------------------------------------------------------------------------
// Round trips.
// ---------------------------------------------------------------------------------------------

struct MemberCase {
    DType dtype;
    Shape shape;
};

class EmbeddedStoreRoundTripTest : public ::testing::TestWithParam<MemberCase> {};

TEST_P(EmbeddedStoreRoundTripTest, PutStatReadMemberReadRanges) {
    const MemberCase& c = GetParam();
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> members = {
        PatternMember("data", c.dtype, c.shape, 7, 0x1234),
        PatternMember("side", DType::kUInt64, {3}, 99, 42),
    };
    const std::string metadata("meta\0bytes", 10);  // Opaque bytes, NUL included.
    MCS_ASSERT_OK(store->Put("obj", metadata, Views(members), {PutMode::kCreate, true}));

    auto info = store->Stat("obj");
    MCS_ASSERT_OK(info);
    EXPECT_EQ(info->key, "obj");
    EXPECT_EQ(info->metadata, metadata);
    EXPECT_EQ(info->version, 1u);
    EXPECT_TRUE(info->hard_pinned);
    ASSERT_EQ(info->members.size(), 2u);
    const MemberInfo* data = info->FindMember("data");
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(data->dtype, c.dtype);
    EXPECT_EQ(data->shape, c.shape);
    EXPECT_EQ(data->size_bytes, members[0].bytes.size());
    EXPECT_EQ(data->checksum, 0x1234u);
    EXPECT_EQ(info->members[1].name, "side");
    EXPECT_EQ(info->members[1].checksum, 42u);

    // Whole member.
    std::vector<std::byte> whole(members[0].bytes.size());
    MCS_ASSERT_OK(store->ReadMember("obj", "data", whole));
    EXPECT_EQ(whole, members[0].bytes);
    std::vector<std::byte> side(24);
    MCS_ASSERT_OK(store->ReadMember("obj", "side", side));
    EXPECT_EQ(side, members[1].bytes);

    // Every [start, end) range of rows, including zero-row reads, in one batch each.
    const auto rows = static_cast<std::uint64_t>(c.shape[0]);
    const std::uint64_t row_bytes = data->RowBytes();
    for (std::uint64_t start = 0; start <= rows; ++start) {
        for (std::uint64_t end = start; end <= rows; ++end) {
            std::vector<std::byte> dst((end - start) * row_bytes, std::byte{0xEE});
            std::vector<std::byte> side_dst(8);
            std::vector<RangeRead> reads = {
                {"obj", "data", start, end, dst},
                {"obj", "side", 1, 2, side_dst},
            };
            MCS_ASSERT_OK(store->ReadRanges(reads)) << start << ".." << end;
            ASSERT_TRUE(std::equal(dst.begin(), dst.end(),
                                   members[0].bytes.begin() +
                                       static_cast<std::ptrdiff_t>(start * row_bytes)))
                << start << ".." << end;
            ASSERT_TRUE(std::equal(side_dst.begin(), side_dst.end(), members[1].bytes.begin() + 8));
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    DTypesAndShapes, EmbeddedStoreRoundTripTest,
    ::testing::Values(MemberCase{DType::kUInt8, {17}}, MemberCase{DType::kBFloat16, {5, 3}},
                      MemberCase{DType::kFloat32, {4, 2, 3}}, MemberCase{DType::kUInt16, {9, 2}},
                      MemberCase{DType::kInt64, {6, 1}}, MemberCase{DType::kFloat64, {3}},
                      MemberCase{DType::kFloat8E4M3, {4, 3}},
                      MemberCase{DType::kUInt64, {0, 2}},  // An empty member (nnz = 0).
                      MemberCase{DType::kUInt32, {0}}));

TEST(EmbeddedStoreTest, ObjectWithNoMembersAndEmptyMetadata) {
    auto store = MakeEmbeddedStore();
    MCS_ASSERT_OK(store->Put("empty", "", {}, Create()));
    auto info = store->Stat("empty");
    MCS_ASSERT_OK(info);
    EXPECT_THAT(info->members, IsEmpty());
    EXPECT_EQ(info->metadata, "");
    EXPECT_THAT(store->ReadMember("empty", "x", {}), StatusIs(StatusCode::kNotFound));
}

TEST(EmbeddedStoreTest, StatSharedIsTheVersionItSawAfterAnUpsertOrRemove) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> members = {PatternMember("values", DType::kBFloat16, {40}, 1)};
    MCS_ASSERT_OK(store->Put("k", "first", Views(members), Create()));
    auto shared = store->StatShared("k");
    MCS_ASSERT_OK(shared);
    auto copied = store->Stat("k");
    MCS_ASSERT_OK(copied);
    EXPECT_EQ((*shared)->metadata, copied->metadata);
    EXPECT_EQ((*shared)->version, copied->version);
    ASSERT_EQ((*shared)->members.size(), 1u);
    EXPECT_EQ((*shared)->members[0].size_bytes, 80u);
    // A new version and a remove leave the shared info as it was (it holds its version).
    std::vector<OwnedMember> bigger = {PatternMember("values", DType::kBFloat16, {64}, 2)};
    MCS_ASSERT_OK(store->Put("k", "second", Views(bigger), Upsert()));
    MCS_ASSERT_OK(store->Remove("k"));
    EXPECT_EQ((*shared)->metadata, "first");
    EXPECT_EQ((*shared)->members[0].size_bytes, 80u);
    EXPECT_THAT(store->StatShared("k"), StatusIs(StatusCode::kNotFound));
}

TEST(EmbeddedStoreTest, FindIsStatSharedWithAMissAsNull) {
    auto store = MakeEmbeddedStore();
    auto missing = store->Find("k");
    MCS_ASSERT_OK(missing);
    EXPECT_EQ(*missing, nullptr);
    std::vector<OwnedMember> members = {PatternMember("values", DType::kBFloat16, {40}, 1)};
    MCS_ASSERT_OK(store->Put("k", "first", Views(members), Create()));
    auto found = store->Find("k");
    MCS_ASSERT_OK(found);
    ASSERT_NE(*found, nullptr);
    EXPECT_EQ((*found)->metadata, "first");
    EXPECT_EQ((*found)->version, (*store->StatShared("k"))->version);
    MCS_ASSERT_OK(store->Remove("k"));
    EXPECT_EQ((*found)->metadata, "first");  // the version it saw
    EXPECT_EQ(*store->Find("k"), nullptr);
}

TEST(EmbeddedStoreTest, EmptyMemberReadsWithEmptyDestination) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> members = {PatternMember("values", DType::kBFloat16, {0}, 1)};
    MCS_ASSERT_OK(store->Put("k", "m", Views(members), Create()));
    MCS_EXPECT_OK(store->ReadMember("k", "values", {}));
    RangeRead r{"k", "values", 0, 0, {}};
    MCS_EXPECT_OK(store->ReadRanges({&r, 1}));
    RangeRead past{"k", "values", 0, 1, {}};
    EXPECT_THAT(store->ReadRanges({&past, 1}), StatusIs(StatusCode::kOutOfRange));
}

TEST(EmbeddedStoreTest, PutCopiesTheCallersBytes) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> members = {PatternMember("a", DType::kUInt8, {8}, 3)};
    const std::vector<std::byte> original = members[0].bytes;
    MCS_ASSERT_OK(store->Put("k", "", Views(members), Create()));
    std::fill(members[0].bytes.begin(), members[0].bytes.end(), std::byte{0});
    std::vector<std::byte> out(8);
    MCS_ASSERT_OK(store->ReadMember("k", "a", out));
    EXPECT_EQ(out, original);
}

TEST(EmbeddedStoreTest, ParallelRangeReadsReadWhatRangeReadsRead) {
    auto store = MakeEmbeddedStore();
    testing::ExpectParallelRangeReadsMatch(*store);
}

TEST(EmbeddedStoreTest, EmptyBatchOfRangeReadsIsOk) {
    auto store = MakeEmbeddedStore();
    MCS_EXPECT_OK(store->ReadRanges({}));
    EXPECT_EQ(store->Counters().range_reads, 0u);
}

TEST(EmbeddedStoreTest, BatchAcrossSeveralObjects) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> a = {PatternMember("v", DType::kUInt32, {10}, 1)};
    std::vector<OwnedMember> b = {PatternMember("v", DType::kUInt32, {10}, 2)};
    MCS_ASSERT_OK(store->Put("a", "", Views(a), Create()));
    MCS_ASSERT_OK(store->Put("b", "", Views(b), Create()));
    std::vector<std::byte> d0(8), d1(12), d2(4);
    std::vector<RangeRead> reads = {
        {"a", "v", 0, 2, d0}, {"b", "v", 3, 6, d1}, {"a", "v", 9, 10, d2}};
    MCS_ASSERT_OK(store->ReadRanges(reads));
    EXPECT_TRUE(std::equal(d0.begin(), d0.end(), a[0].bytes.begin()));
    EXPECT_TRUE(std::equal(d1.begin(), d1.end(), b[0].bytes.begin() + 12));
    EXPECT_TRUE(std::equal(d2.begin(), d2.end(), a[0].bytes.begin() + 36));
}

// ---------------------------------------------------------------------------------------------
// Put modes and versions.
// ---------------------------------------------------------------------------------------------

TEST(EmbeddedStoreTest, CreateOnExistingKeyIsConflictAndLeavesObject) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> first = {PatternMember("a", DType::kUInt8, {4}, 1)};
    std::vector<OwnedMember> second = {PatternMember("a", DType::kUInt8, {4}, 2)};
    MCS_ASSERT_OK(store->Put("k", "first", Views(first), Create()));
    EXPECT_THAT(store->Put("k", "second", Views(second), Create()),
                StatusIsWithMessage(StatusCode::kConflict, "'k'"));
    auto info = store->Stat("k");
    MCS_ASSERT_OK(info);
    EXPECT_EQ(info->metadata, "first");
    EXPECT_EQ(info->version, 1u);
    std::vector<std::byte> out(4);
    MCS_ASSERT_OK(store->ReadMember("k", "a", out));
    EXPECT_EQ(out, first[0].bytes);
}

TEST(EmbeddedStoreTest, UpsertReplacesWholeObjectAndIncrementsVersion) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> v1 = {PatternMember("a", DType::kUInt8, {4}, 1),
                                   PatternMember("b", DType::kUInt8, {2}, 1)};
    std::vector<OwnedMember> v2 = {PatternMember("c", DType::kFloat32, {3, 2}, 2)};
    MCS_ASSERT_OK(store->Put("k", "v1", Views(v1), Upsert()));  // Upsert creates.
    EXPECT_EQ(store->Stat("k")->version, 1u);
    MCS_ASSERT_OK(store->Put("k", "v2", Views(v2), Upsert()));
    auto info = store->Stat("k");
    MCS_ASSERT_OK(info);
    EXPECT_EQ(info->version, 2u);
    EXPECT_EQ(info->metadata, "v2");
    ASSERT_EQ(info->members.size(), 1u);
    EXPECT_EQ(info->members[0].name, "c");
    std::vector<std::byte> out(4);
    EXPECT_THAT(store->ReadMember("k", "a", out), StatusIs(StatusCode::kNotFound));
    MCS_ASSERT_OK(store->Put("k", "v3", Views(v1), Upsert()));
    EXPECT_EQ(store->Stat("k")->version, 3u);
    // Another key has its own count.
    MCS_ASSERT_OK(store->Put("other", "", Views(v1), Create()));
    EXPECT_EQ(store->Stat("other")->version, 1u);
}

TEST(EmbeddedStoreTest, VersionNeverRepeatsAfterRemoveAndRecreate) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> m = {PatternMember("a", DType::kUInt8, {4}, 1)};
    MCS_ASSERT_OK(store->Put("k", "", Views(m), Create()));
    MCS_ASSERT_OK(store->Put("k", "", Views(m), Upsert()));
    MCS_ASSERT_OK(store->Put("k", "", Views(m), Upsert()));
    EXPECT_EQ(store->Stat("k")->version, 3u);
    MCS_ASSERT_OK(store->Remove("k"));
    MCS_ASSERT_OK(store->Put("k", "", Views(m), Create()));
    EXPECT_GT(store->Stat("k")->version, 3u);
}

TEST(EmbeddedStoreTest, ReadersHoldingOldSnapshotAreUnaffectedByUpsert) {
    // Stat returns a copy: a later upsert does not change what the caller holds.
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> v1 = {PatternMember("a", DType::kUInt8, {4}, 1)};
    std::vector<OwnedMember> v2 = {PatternMember("a", DType::kUInt8, {8}, 2)};
    MCS_ASSERT_OK(store->Put("k", "v1", Views(v1), Create()));
    auto before = store->Stat("k");
    MCS_ASSERT_OK(store->Put("k", "v2", Views(v2), Upsert()));
    EXPECT_EQ(before->metadata, "v1");
    EXPECT_EQ(before->members[0].size_bytes, 4u);
    // A read sized for the old version now fails cleanly.
    std::vector<std::byte> old_size(4);
    EXPECT_THAT(store->ReadMember("k", "a", old_size), StatusIs(StatusCode::kInvalidArgument));
}

// ---------------------------------------------------------------------------------------------
// Validation: every bad input gets a typed error and changes nothing.
// ---------------------------------------------------------------------------------------------

class EmbeddedStoreValidationTest : public ::testing::Test {
protected:
    void SetUp() override {
        store_ = MakeEmbeddedStore();
        good_ = {PatternMember("a", DType::kUInt16, {3, 2}, 1)};
        MCS_ASSERT_OK(store_->Put("existing", "m", Views(good_), Create()));
        baseline_ = store_->Counters();
    }

    void ExpectUnchanged() {
        auto keys = store_->List("");
        MCS_ASSERT_OK(keys);
        EXPECT_THAT(*keys, ElementsAre("existing"));
        auto info = store_->Stat("existing");
        MCS_ASSERT_OK(info);
        EXPECT_EQ(info->version, 1u);
        EXPECT_EQ(store_->Counters().puts, baseline_.puts);
        EXPECT_EQ(store_->Counters().bytes_put, baseline_.bytes_put);
    }

    Status PutOne(std::string_view key, MemberData m, PutMode mode = PutMode::kUpsert) {
        return store_->Put(key, "", {&m, 1}, {mode, false});
    }

    std::unique_ptr<ObjectStore> store_;
    std::vector<OwnedMember> good_;
    StoreCounters baseline_;
};

TEST_F(EmbeddedStoreValidationTest, BadKeys) {
    auto views = Views(good_);
    EXPECT_THAT(store_->Put("", "", views, Upsert()), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Put(std::string(4097, 'k'), "", views, Upsert()),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Put(std::string_view("a\0b", 3), "", views, Upsert()),
                StatusIs(StatusCode::kInvalidArgument));
    // A bad key on an existing-key path is still InvalidArgument, not Conflict.
    EXPECT_THAT(store_->Put(std::string_view("existing\0", 9), "", views, Create()),
                StatusIs(StatusCode::kInvalidArgument));
    ExpectUnchanged();
    MCS_EXPECT_OK(store_->Put(std::string(4096, 'k'), "", views, Create()));
}

TEST_F(EmbeddedStoreValidationTest, BadMemberNames) {
    std::vector<OwnedMember> dup = {PatternMember("x", DType::kUInt8, {2}, 1),
                                    PatternMember("y", DType::kUInt8, {2}, 1),
                                    PatternMember("x", DType::kUInt8, {3}, 1)};
    EXPECT_THAT(store_->Put("new", "", Views(dup), Upsert()),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "'x'"));
    EXPECT_THAT(store_->Put("existing", "", Views(dup), Upsert()),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(PutOne("new", PatternMember("", DType::kUInt8, {2}, 1).View()),
                StatusIs(StatusCode::kInvalidArgument));
    OwnedMember nul = PatternMember(std::string("a\0b", 3), DType::kUInt8, {2}, 1);
    EXPECT_THAT(PutOne("new", nul.View()), StatusIs(StatusCode::kInvalidArgument));
    ExpectUnchanged();
}

TEST_F(EmbeddedStoreValidationTest, SizeMustMatchShapeTimesDType) {
    OwnedMember m = PatternMember("a", DType::kFloat32, {3, 2}, 1);
    m.bytes.pop_back();
    EXPECT_THAT(PutOne("new", m.View()), StatusIsWithMessage(StatusCode::kInvalidArgument, "'a'"));
    m.bytes.resize(25);
    EXPECT_THAT(PutOne("new", m.View()), StatusIs(StatusCode::kInvalidArgument));
    m.bytes.resize(24);
    m.dtype = DType::kFloat64;  // 48 bytes needed.
    EXPECT_THAT(PutOne("new", m.View()), StatusIs(StatusCode::kInvalidArgument));
    ExpectUnchanged();
}

TEST_F(EmbeddedStoreValidationTest, BadShapesAndDTypes) {
    OwnedMember scalar = PatternMember("s", DType::kUInt8, {1}, 1);
    scalar.shape = {};  // Rank 0.
    EXPECT_THAT(PutOne("new", scalar.View()), StatusIs(StatusCode::kInvalidArgument));

    OwnedMember negative{"n", DType::kUInt8, {-1}, {}, 0};
    EXPECT_THAT(PutOne("new", negative.View()), StatusIs(StatusCode::kInvalidArgument));

    OwnedMember zero_inner{"z", DType::kUInt8, {2, 0}, {}, 0};  // Only axis 0 may be empty.
    EXPECT_THAT(PutOne("new", zero_inner.View()), StatusIs(StatusCode::kInvalidArgument));

    OwnedMember overflow{"o", DType::kUInt64, {Index{1} << 40, Index{1} << 30}, {}, 0};
    EXPECT_THAT(PutOne("new", overflow.View()), StatusIs(StatusCode::kInvalidArgument));

    OwnedMember bad_dtype = PatternMember("d", DType::kUInt8, {4}, 1);
    bad_dtype.dtype = static_cast<DType>(200);
    EXPECT_THAT(PutOne("new", bad_dtype.View()), StatusIs(StatusCode::kInvalidArgument));

    OwnedMember ok_then_bad[] = {PatternMember("good", DType::kUInt8, {4}, 1), negative};
    std::vector<MemberData> views = {ok_then_bad[0].View(), ok_then_bad[1].View()};
    EXPECT_THAT(store_->Put("existing", "", views, Upsert()),
                StatusIs(StatusCode::kInvalidArgument));
    ExpectUnchanged();
}

TEST_F(EmbeddedStoreValidationTest, BadPutMode) {
    auto views = Views(good_);
    EXPECT_THAT(store_->Put("new", "", views, {static_cast<PutMode>(9), false}),
                StatusIs(StatusCode::kInvalidArgument));
    ExpectUnchanged();
}

TEST_F(EmbeddedStoreValidationTest, ReadMemberErrors) {
    std::vector<std::byte> dst(12);
    EXPECT_THAT(store_->ReadMember("missing", "a", dst),
                StatusIsWithMessage(StatusCode::kNotFound, "'missing'"));
    EXPECT_THAT(store_->ReadMember("existing", "nope", dst),
                StatusIsWithMessage(StatusCode::kNotFound, "'nope'"));
    std::vector<std::byte> small = Sentinel(11), large = Sentinel(13);
    EXPECT_THAT(store_->ReadMember("existing", "a", small),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->ReadMember("existing", "a", large),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_TRUE(AllSentinel(small));
    EXPECT_TRUE(AllSentinel(large));
    EXPECT_EQ(store_->Counters().member_gets, 0u);
}

TEST_F(EmbeddedStoreValidationTest, ReadRangesValidatesEveryItemBeforeCopying) {
    // Shape [3, 2] of uint16: 3 rows of 4 bytes.
    std::vector<std::byte> first = Sentinel(4);
    auto expect_rejected = [&](RangeRead bad, StatusCode code, std::string_view needle) {
        std::vector<RangeRead> reads = {{"existing", "a", 0, 1, first}, bad};
        EXPECT_THAT(store_->ReadRanges(reads), StatusIsWithMessage(code, std::string(needle)));
        EXPECT_TRUE(AllSentinel(first)) << "item 0 was written before item 1 was validated";
    };
    std::vector<std::byte> four = Sentinel(4), eight = Sentinel(8), twelve = Sentinel(12),
                           sixteen = Sentinel(16);
    expect_rejected({"missing", "a", 0, 1, four}, StatusCode::kNotFound, "'missing'");
    expect_rejected({"existing", "nope", 0, 1, four}, StatusCode::kNotFound, "'nope'");
    expect_rejected({"existing", "a", 0, 4, sixteen}, StatusCode::kOutOfRange, "range read 1");
    expect_rejected({"existing", "a", 3, 4, four}, StatusCode::kOutOfRange, "[3, 4)");
    expect_rejected({"existing", "a", 2, 1, four}, StatusCode::kOutOfRange, "range read 1");
    expect_rejected({"existing", "a", 0, 2, twelve}, StatusCode::kInvalidArgument, "range read 1");
    expect_rejected({"existing", "a", 0, 3, eight}, StatusCode::kInvalidArgument, "range read 1");
    expect_rejected({"existing", "a", 1, 1, four}, StatusCode::kInvalidArgument, "range read 1");
    EXPECT_TRUE(AllSentinel(four));
    EXPECT_EQ(store_->Counters().range_reads, 0u);
    EXPECT_EQ(store_->Counters().range_bytes, 0u);
}

TEST_F(EmbeddedStoreValidationTest, StatAndRemoveOfMissingKey) {
    EXPECT_THAT(store_->Stat("missing"), StatusIsWithMessage(StatusCode::kNotFound, "'missing'"));
    EXPECT_THAT(store_->Remove("missing"), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(store_->Stat(""), StatusIs(StatusCode::kNotFound));
    ExpectUnchanged();
}

// ---------------------------------------------------------------------------------------------
// Capacity.
// ---------------------------------------------------------------------------------------------

TEST(EmbeddedStoreCapacityTest, PutOverCapacityLeavesStoreUnchanged) {
    // Capacity counts member bytes plus metadata bytes.
    auto store = MakeEmbeddedStore({.capacity_bytes = 1000});
    std::vector<OwnedMember> m600 = {PatternMember("a", DType::kUInt8, {590}, 1)};
    MCS_ASSERT_OK(store->Put("a", "0123456789", Views(m600), Create()));  // 600 bytes.
    const StoreCounters before = store->Counters();

    std::vector<OwnedMember> m500 = {PatternMember("b", DType::kFloat32, {125}, 2)};
    EXPECT_THAT(store->Put("b", "", Views(m500), Create()),
                StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(store->Put("b", "", Views(m500), Upsert()),
                StatusIs(StatusCode::kResourceExhausted));
    EXPECT_THAT(store->Stat("b"), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(*store->List(""), ElementsAre("a"));
    EXPECT_EQ(store->Counters().puts, before.puts);
    EXPECT_EQ(store->Counters().bytes_put, before.bytes_put);

    // An object larger than the whole capacity.
    std::vector<OwnedMember> huge = {PatternMember("h", DType::kUInt8, {1001}, 3)};
    EXPECT_THAT(store->Put("h", "", Views(huge), Upsert()),
                StatusIs(StatusCode::kResourceExhausted));

    // Metadata counts: 400 member bytes + 1 metadata byte does not fit beside 600.
    std::vector<OwnedMember> m400 = {PatternMember("c", DType::kUInt8, {400}, 4)};
    EXPECT_THAT(store->Put("c", "x", Views(m400), Create()),
                StatusIs(StatusCode::kResourceExhausted));
    MCS_ASSERT_OK(store->Put("c", "", Views(m400), Create()));  // Exactly 1000.
    EXPECT_THAT(*store->List(""), ElementsAre("a", "c"));
}

TEST(EmbeddedStoreCapacityTest, UpsertIsChargedAsNewSizeMinusReplaced) {
    auto store = MakeEmbeddedStore({.capacity_bytes = 1000});
    std::vector<OwnedMember> m600 = {PatternMember("a", DType::kUInt8, {600}, 1)};
    std::vector<OwnedMember> m900 = {PatternMember("a", DType::kUInt8, {900}, 2)};
    std::vector<OwnedMember> m100 = {PatternMember("a", DType::kUInt8, {100}, 3)};
    std::vector<OwnedMember> m200 = {PatternMember("a", DType::kUInt8, {200}, 4)};
    MCS_ASSERT_OK(store->Put("k", "", Views(m600), Create()));
    // 900 replaces 600: fits although 600 + 900 > 1000.
    MCS_ASSERT_OK(store->Put("k", "", Views(m900), Upsert()));
    MCS_ASSERT_OK(store->Put("j", "", Views(m100), Create()));  // 1000 in use.
    EXPECT_THAT(store->Put("j", "", Views(m200), Upsert()),
                StatusIs(StatusCode::kResourceExhausted));
    auto j = store->Stat("j");
    MCS_ASSERT_OK(j);
    EXPECT_EQ(j->version, 1u);
    EXPECT_EQ(j->members[0].size_bytes, 100u);
    std::vector<std::byte> out(100);
    MCS_ASSERT_OK(store->ReadMember("j", "a", out));
    EXPECT_EQ(out, m100[0].bytes);
    // Shrinking k frees room; Remove frees room.
    MCS_ASSERT_OK(store->Put("k", "", Views(m600), Upsert()));
    MCS_ASSERT_OK(store->Put("j", "", Views(m200), Upsert()));
    MCS_ASSERT_OK(store->Remove("k"));
    MCS_ASSERT_OK(store->Put("k", "", Views(m600), Create()));
    EXPECT_THAT(store->Put("x", "", Views(m600), Create()),
                StatusIs(StatusCode::kResourceExhausted));
}

// ---------------------------------------------------------------------------------------------
// List, Remove, counters.
// ---------------------------------------------------------------------------------------------

TEST(EmbeddedStoreTest, ListByPrefixIsSorted) {
    auto store = MakeEmbeddedStore();
    for (const char* key : {"w/2/b", "w/10/a", "w/1/a", "x", "w/", "w", "wx", "w/1/b"}) {
        MCS_ASSERT_OK(store->Put(key, "", {}, Create()));
    }
    EXPECT_THAT(*store->List("w/"), ElementsAre("w/", "w/1/a", "w/1/b", "w/10/a", "w/2/b"));
    EXPECT_THAT(*store->List("w/1"), ElementsAre("w/1/a", "w/1/b", "w/10/a"));
    EXPECT_THAT(*store->List("w/1/"), ElementsAre("w/1/a", "w/1/b"));
    EXPECT_THAT(*store->List(""),
                ElementsAre("w", "w/", "w/1/a", "w/1/b", "w/10/a", "w/2/b", "wx", "x"));
    EXPECT_THAT(*store->List("y"), IsEmpty());
    EXPECT_THAT(*store->List("x/"), IsEmpty());
}

TEST(EmbeddedStoreTest, RemoveThenStatIsNotFound) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> m = {PatternMember("a", DType::kUInt8, {4}, 1)};
    MCS_ASSERT_OK(store->Put("k", "", Views(m), Create()));
    MCS_ASSERT_OK(store->Remove("k"));
    EXPECT_THAT(store->Stat("k"), StatusIs(StatusCode::kNotFound));
    std::vector<std::byte> out(4);
    EXPECT_THAT(store->ReadMember("k", "a", out), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(store->Remove("k"), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(*store->List(""), IsEmpty());
    // kCreate works again after Remove.
    MCS_EXPECT_OK(store->Put("k", "", Views(m), Create()));
}

TEST(EmbeddedStoreTest, CountersTrackSuccessfulTraffic) {
    auto store = MakeEmbeddedStore();
    std::vector<OwnedMember> m = {PatternMember("a", DType::kUInt32, {10, 2}, 1),
                                  PatternMember("b", DType::kUInt8, {5}, 1)};
    MCS_ASSERT_OK(store->Put("k", "metadata", Views(m), Create()));
    MCS_ASSERT_OK(store->Put("k", "", Views(m), Upsert()));
    EXPECT_THAT(store->Put("k", "", Views(m), Create()), StatusIs(StatusCode::kConflict));

    std::vector<std::byte> whole(80), b(5);
    MCS_ASSERT_OK(store->ReadMember("k", "a", whole));
    MCS_ASSERT_OK(store->ReadMember("k", "b", b));
    EXPECT_THAT(store->ReadMember("k", "a", b), StatusIs(StatusCode::kInvalidArgument));

    std::vector<std::byte> r0(16), r1(0), r2(3);
    std::vector<RangeRead> reads = {
        {"k", "a", 2, 4, r0}, {"k", "a", 7, 7, r1}, {"k", "b", 1, 4, r2}};
    MCS_ASSERT_OK(store->ReadRanges(reads));
    MCS_ASSERT_OK(store->Remove("k"));
    EXPECT_THAT(store->Remove("k"), StatusIs(StatusCode::kNotFound));

    const StoreCounters c = store->Counters();
    EXPECT_EQ(c.puts, 2u);
    EXPECT_EQ(c.bytes_put, 2u * 85u);
    EXPECT_EQ(c.member_gets, 2u);
    EXPECT_EQ(c.member_bytes, 85u);
    EXPECT_EQ(c.range_reads, 3u);
    EXPECT_EQ(c.range_bytes, 19u);
    EXPECT_EQ(c.removes, 1u);
}

TEST(EmbeddedStoreTest, PutEachIsPutOfEachItemInOrder) {
    ExpectPutEachIsPutInOrderOnFreshStores([] { return MakeEmbeddedStore(); },
                                           [](ObjectStore& each, ObjectStore& serial) {
                                               EXPECT_EQ(each.Counters().bytes_put,
                                                         serial.Counters().bytes_put);
                                           });
}

TEST(EmbeddedStoreCapacityTest, PutEachRefusesWhatNoLongerFitsAsPutInOrderWould) {
    // Room for some of the batch's objects only: the ones installed first fit, the rest are
    // ResourceExhausted, as Puts in order would be; nothing is charged for a refused one.
    std::vector<std::string> keys;
    std::vector<std::vector<MemberData>> members;
    std::vector<OwnedMember> owned;
    const std::vector<EachPut> items = EachBatch(200, keys, members, owned);
    EmbeddedStoreOptions options;
    options.capacity_bytes = 2000;
    auto each = MakeEmbeddedStore(options);
    auto serial = MakeEmbeddedStore(options);
    for (ObjectStore* s : {each.get(), serial.get()}) {
        MCS_ASSERT_OK(s->Put("held", "before", {}, Create()));
    }
    ExpectPutEachIsPutInOrder(*each, *serial, items, 4);
    const std::vector<Status> again = each->PutEach(items, 4);
    EXPECT_TRUE(std::any_of(again.begin(), again.end(), [](const Status& s) {
        return s.code() == StatusCode::kResourceExhausted;
    }));
}

}  // namespace
}  // namespace mooncake::sparse
