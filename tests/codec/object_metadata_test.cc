// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The mooncake.sparse_object v1 metadata: what EncodeObjectMetadata writes decodes to the
// descriptor it was written from, and anything else is a typed error.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/object_metadata.h"
#include "codec_test_util.h"

namespace mooncake::sparse {
namespace {

using codec_testing::MakeDesc;
using codec_testing::StatusIs;
using codec_testing::View;
using ::testing::HasSubstr;

TEST(ObjectMetadataTest, DecodesToTheDescriptorItWasEncodedFrom) {
    SourceDescriptor d = MakeDesc({40, 50, 60}, ApplyMode::kScatterAdd);
    d.source_ref = "mcs/src/fused";
    d.generation = {2, 3};
    d.box = Box::Make({8, 0, 0}, {32, 50, 60}).value();
    d.placement = NamedAxes::Make({{"expert", 3}}).value();
    d.policy = PlacementPolicy::Owner("expert").value();
    const std::vector<std::int64_t> idx = {8, 1, 2, 39, 49, 59};
    const std::vector<float> val = {1.0f, 2.0f};
    ASSERT_OK_AND_ASSIGN(SparseObject obj, BuildSparseObject(d, View(idx, {2, 3}), View(val, {2})));
    ASSERT_OK_AND_ASSIGN(SourceDescriptor decoded,
                         DecodeObjectMetadata(obj.desc.source_ref, EncodeObjectMetadata(obj)));
    EXPECT_EQ(decoded, obj.desc);
}

TEST(ObjectMetadataTest, RejectsWhatIsNotASparseObjectV1) {
    EXPECT_THAT(DecodeObjectMetadata("x", "{"), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(DecodeObjectMetadata("x", "[]"), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(DecodeObjectMetadata("x", "{\"schema\":\"other\"}"),
                StatusIs(StatusCode::kInvalidArgument));
    ASSERT_OK_AND_ASSIGN(
        SparseObject obj,
        BuildSparseObject(MakeDesc({16, 16}), View(std::vector<std::int64_t>{1, 2}, {1, 2}),
                          View(std::vector<float>{1.0f}, {1})));
    obj.desc.source_ref = "mcs/src/w";
    std::string json = EncodeObjectMetadata(obj);
    const std::string version = "\"version\":1";
    ASSERT_NE(json.find(version), std::string::npos);
    json.replace(json.find(version), version.size(), "\"version\":2");
    const auto decoded = DecodeObjectMetadata("x", json);
    EXPECT_THAT(decoded, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(decoded.status().message(), HasSubstr("not a mooncake.sparse_object v1"));
}

}  // namespace
}  // namespace mooncake::sparse
