// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The mooncake.sparse_object v1 metadata: what EncodeObjectMetadata writes decodes to the
// descriptor it was written from, and anything else is a typed error.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
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

TEST(ObjectMetadataTest, IsMetadataOfHoldsExactlyForTheDescriptorDecodedFromIt) {
    SourceDescriptor d = MakeDesc({40, 50, 60}, ApplyMode::kScatterAdd);
    d.source_ref = "mcs/src/fused";
    d.generation = {2, 3};
    d.box = Box::Make({8, 0, 0}, {32, 50, 60}).value();
    d.placement = NamedAxes::Make({{"expert", 3}, {"tp", 1}}).value();
    d.policy = PlacementPolicy::Owner("expert").value();
    const std::vector<std::int64_t> idx = {8, 1, 2, 39, 49, 59};
    const std::vector<float> val = {1.0f, 2.0f};
    ASSERT_OK_AND_ASSIGN(SparseObject obj, BuildSparseObject(d, View(idx, {2, 3}), View(val, {2})));
    const std::string text = EncodeObjectMetadata(obj);
    const MemberChecksums sums{obj.checksum_indices, obj.checksum_values,
                               obj.checksum_tile_coords, obj.checksum_tile_ptr};
    ASSERT_OK_AND_ASSIGN(SourceDescriptor decoded, DecodeObjectMetadata(d.source_ref, text));
    // A manifest entry decoded from the text describes it, without decoding it again.
    EXPECT_TRUE(IsMetadataOf(text, decoded, "global", sums));
    EXPECT_TRUE(IsMetadataOf(text, obj.desc, "global", sums));
    // Any field, checksum or byte that differs does not.
    const auto differs = [&](auto change) {
        SourceDescriptor other = decoded;
        change(other);
        return !IsMetadataOf(text, other, "global", sums);
    };
    EXPECT_TRUE(differs([](SourceDescriptor& o) { o.nnz += 1; }));
    EXPECT_TRUE(differs([](SourceDescriptor& o) { o.generation = {3, 4}; }));
    EXPECT_TRUE(differs([](SourceDescriptor& o) { o.tensor_id += "x"; }));
    EXPECT_TRUE(differs([](SourceDescriptor& o) { o.box = Box::Make({0, 0, 0}, {32, 50, 60}).value(); }));
    EXPECT_TRUE(differs([](SourceDescriptor& o) { o.apply = ApplyMode::kOverwrite; }));
    EXPECT_TRUE(differs([](SourceDescriptor& o) { o.value_dtype = DType::kFloat16; }));
    EXPECT_TRUE(differs([](SourceDescriptor& o) {
        o.placement = NamedAxes::Make({{"expert", 4}, {"tp", 1}}).value();
    }));
    EXPECT_TRUE(differs([](SourceDescriptor& o) { o.tile_shape[0] += 1; }));
    EXPECT_FALSE(IsMetadataOf(text, decoded, "local", sums));
    MemberChecksums other_sums = sums;
    other_sums.values ^= 1;
    EXPECT_FALSE(IsMetadataOf(text, decoded, "global", other_sums));
    EXPECT_FALSE(IsMetadataOf(text + " ", decoded, "global", sums));
    EXPECT_FALSE(IsMetadataOf(text.substr(0, text.size() - 1), decoded, "global", sums));
    EXPECT_FALSE(IsMetadataOf("", decoded, "global", sums));
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

TEST(ObjectMetadataTest, WrittenAsCompactSortedJsonForEveryShapeOfDescriptor) {
    // Metadata is written with plain copies unless a string needs escaping: the text must be
    // what a JSON library writes for the same document (compact, keys sorted), for any rank,
    // placement, policy, dtype and checksum, and names with UTF-8 in them.
    struct Case {
        Shape shape;
        std::vector<std::pair<std::string, std::int64_t>> placement;
        PlacementPolicy policy;
        std::string tensor_id;
    };
    const std::vector<Case> cases = {
        {{7}, {}, PlacementPolicy::None(), "w"},
        {{16, 16}, {{"ep", 0}}, PlacementPolicy::Replicate("ep").value(), "layers.0.mlp/w1"},
        {{4, 6, 8}, {{"expert", 3}, {"tp", 1}}, PlacementPolicy::Owner("expert").value(),
         "experts.\u00e9\u4e2d"},
        {{2, 3, 4, 5}, {{"pp", 12345678901}}, PlacementPolicy::None(), std::string(300, 'x')},
    };
    for (const Case& c : cases) {
        SourceDescriptor d = MakeDesc(c.shape, ApplyMode::kOverwrite);
        d.tensor_id = c.tensor_id;
        d.placement = NamedAxes::Make(c.placement).value();
        d.policy = c.policy;
        d.generation = {18446744073709551614ull, 18446744073709551615ull};
        std::vector<std::int64_t> idx(c.shape.size(), 1);
        ASSERT_OK_AND_ASSIGN(SparseObject obj,
                             BuildSparseObject(d, View(idx, {1, Index(c.shape.size())}),
                                               View(std::vector<float>{2.0f}, {1})));
        obj.checksum_values = 18446744073709551615ull;
        const std::string json = EncodeObjectMetadata(obj);
        SCOPED_TRACE(json);
        EXPECT_EQ(nlohmann::json::parse(json).dump(), json);
        ASSERT_OK_AND_ASSIGN(SourceDescriptor back, DecodeObjectMetadata("mcs/src/w", json));
        EXPECT_TRUE(IsMetadataOf(json, back, "global",
                                 {obj.checksum_indices, obj.checksum_values,
                                  obj.checksum_tile_coords, obj.checksum_tile_ptr}));
        EXPECT_FALSE(IsMetadataOf(json + " ", back, "global",
                                  {obj.checksum_indices, obj.checksum_values,
                                   obj.checksum_tile_coords, obj.checksum_tile_ptr}));
    }
}

TEST(ObjectMetadataTest, EveryFieldIsCheckedAndStringsRoundTrip) {
    SourceDescriptor d = MakeDesc({16, 16});
    d.tensor_id = "layers.0/\"quoted\"\\back\u00e9";
    ASSERT_OK_AND_ASSIGN(
        SparseObject obj,
        BuildSparseObject(d, View(std::vector<std::int64_t>{1, 2}, {1, 2}),
                          View(std::vector<float>{1.0f}, {1})));
    obj.desc.source_ref = "mcs/src/w";
    const std::string json = EncodeObjectMetadata(obj);
    ASSERT_OK_AND_ASSIGN(SourceDescriptor back, DecodeObjectMetadata("mcs/src/w", json));
    EXPECT_EQ(back, obj.desc);
    // Any JSON reader sees the same fields (written in sorted order).
    const nlohmann::json j = nlohmann::json::parse(json);
    EXPECT_EQ(j["tensor_id"].get<std::string>(), d.tensor_id);
    EXPECT_EQ(j["members"]["values"]["checksum"].get<std::uint64_t>(), obj.checksum_values);
    EXPECT_EQ(j.dump(), json);

    EXPECT_THAT(DecodeObjectMetadata("x", json + " x"), StatusIs(StatusCode::kInvalidArgument));
    // The text is parsed from a NUL-terminated copy: a NUL in it is an error, never the end of
    // the document (whatever follows it would be ignored), and a text longer than the parser's
    // own buffer parses the same.
    EXPECT_THAT(DecodeObjectMetadata("x", json + std::string(1, '\0') + " x"),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(DecodeObjectMetadata("x", std::string(1, '\0') + json),
                StatusIs(StatusCode::kInvalidArgument));
    ASSERT_OK_AND_ASSIGN(SourceDescriptor padded,
                         DecodeObjectMetadata("mcs/src/w", json + std::string(5000, ' ')));
    EXPECT_EQ(padded, obj.desc);
    EXPECT_THAT(DecodeObjectMetadata("x", std::string(5000, ' ') + "{"),
                StatusIs(StatusCode::kInvalidArgument));
    for (const char* field : {"schema", "version", "tensor_id", "global_shape", "global_offset",
                              "local_shape", "base_generation", "delta_generation",
                              "source_placement", "placement_policy", "tile_shape", "nnz",
                              "num_tiles", "apply", "index_dtype", "value_dtype"}) {
        SCOPED_TRACE(field);
        nlohmann::json missing = j;
        missing.erase(field);
        const auto r = DecodeObjectMetadata("x", missing.dump());
        EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
        EXPECT_THAT(r.status().message(), HasSubstr(field));
        nlohmann::json mistyped = j;
        mistyped[field] = nlohmann::json::array({"?"});
        EXPECT_THAT(DecodeObjectMetadata("x", mistyped.dump()),
                    StatusIs(StatusCode::kInvalidArgument));
    }
    nlohmann::json negative = j;
    negative["nnz"] = -1;
    EXPECT_THAT(DecodeObjectMetadata("x", negative.dump()), StatusIs(StatusCode::kInvalidArgument));
    nlohmann::json fractional = j;
    fractional["global_shape"] = {16.5, 16};
    EXPECT_THAT(DecodeObjectMetadata("x", fractional.dump()),
                StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace mooncake::sparse
