// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Named placement axes, owner/replicate policies, target matching and the canonical source owner
// of replicated (non-EP) weights (placement.h).

#include "mooncake/sparse/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::Axes;
using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::Policy;
using ::mooncake::sparse::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Optional;
using ::testing::Pair;

TEST(NamedAxesTest, SortedByNameAndLookup) {
    NamedAxes a = Axes({{"tp", 1}, {"ep", 3}, {"expert", 37}});
    EXPECT_THAT(a.entries(), ElementsAre(Pair("ep", 3), Pair("expert", 37), Pair("tp", 1)));
    EXPECT_THAT(a.Get("ep"), Optional(3));
    EXPECT_THAT(a.Get("expert"), Optional(37));
    EXPECT_THAT(a.Get("tp"), Optional(1));
    EXPECT_EQ(a.Get("pp"), std::nullopt);
    EXPECT_EQ(a.Get("e"), std::nullopt);
    EXPECT_EQ(a.ToString(), "{ep: 3, expert: 37, tp: 1}");
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(NamedAxes().empty());
    EXPECT_EQ(NamedAxes().ToString(), "{}");
}

TEST(NamedAxesTest, EqualityIgnoresInputOrder) {
    EXPECT_EQ(Axes({{"ep", 1}, {"tp", 0}}), Axes({{"tp", 0}, {"ep", 1}}));
    EXPECT_NE(Axes({{"ep", 1}, {"tp", 0}}), Axes({{"ep", 1}, {"tp", 1}}));
    EXPECT_LT(Axes({{"ep", 0}}), Axes({{"ep", 1}}));
}

TEST(NamedAxesTest, RejectsBadAxisNames) {
    for (const char* bad : {"", "1ep", "e p", "ep-1", "ep.0", "é", "ep\n"}) {
        EXPECT_THAT(NamedAxes::Make({{bad, 0}}), StatusIs(StatusCode::kInvalidArgument)) << bad;
        EXPECT_FALSE(NamedAxes::IsValidAxisName(bad)) << bad;
    }
    EXPECT_THAT(NamedAxes::Make({{std::string(65, 'a'), 0}}),
                StatusIs(StatusCode::kInvalidArgument));
    for (const char* good : {"ep", "tp", "expert", "_x", "A1_b2", "e"}) {
        EXPECT_TRUE(NamedAxes::IsValidAxisName(good)) << good;
    }
    EXPECT_TRUE(NamedAxes::IsValidAxisName(std::string(64, 'a')));
}

TEST(NamedAxesTest, RejectsDuplicateAxisAndNegativeOrdinal) {
    EXPECT_THAT(NamedAxes::Make({{"ep", 0}, {"tp", 1}, {"ep", 2}}),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(NamedAxes::Make({{"ep", 0}, {"ep", 0}}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(NamedAxes::Make({{"ep", -1}}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(NamedAxes::Make({}), IsOk());
}

TEST(PlacementPolicyTest, ParsesPolicyStrings) {
    ASSERT_OK_AND_ASSIGN(PlacementPolicy owner, PlacementPolicy::Parse("owner(expert)"));
    EXPECT_EQ(owner.kind(), PlacementPolicy::Kind::kOwner);
    EXPECT_EQ(owner.axis(), "expert");
    EXPECT_EQ(owner.ToString(), "owner(expert)");

    ASSERT_OK_AND_ASSIGN(PlacementPolicy rep, PlacementPolicy::Parse("replicate(ep)"));
    EXPECT_EQ(rep.kind(), PlacementPolicy::Kind::kReplicate);
    EXPECT_EQ(rep.axis(), "ep");
    EXPECT_EQ(rep.ToString(), "replicate(ep)");

    for (const char* none : {"", "none", "  none  ", "\t"}) {
        ASSERT_OK_AND_ASSIGN(PlacementPolicy p, PlacementPolicy::Parse(none));
        EXPECT_EQ(p.kind(), PlacementPolicy::Kind::kNone) << none;
        EXPECT_EQ(p, PlacementPolicy::None());
        EXPECT_EQ(p.ToString(), "none");
    }

    // Surrounding and inner whitespace is tolerated.
    ASSERT_OK_AND_ASSIGN(PlacementPolicy spaced, PlacementPolicy::Parse("  owner( ep )  "));
    EXPECT_EQ(spaced, testing::ValueOrDie(PlacementPolicy::Owner("ep")));
}

TEST(PlacementPolicyTest, ParseRejectsMalformedPolicies) {
    for (const char* bad : {"owner", "owner()", "owner(ep", "ownerep)", "owner(ep)x", "OWNER(ep)",
                            "replicate(1ep)", "replicate(ep))", "shard(ep)", "owner(e p)",
                            "None", "owner(ep,tp)"}) {
        EXPECT_THAT(PlacementPolicy::Parse(bad), StatusIs(StatusCode::kInvalidArgument)) << bad;
    }
    EXPECT_THAT(PlacementPolicy::Owner(""), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(PlacementPolicy::Replicate("9"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(PlacementPolicyTest, ToStringRoundTrips) {
    for (const char* text : {"owner(expert)", "replicate(ep)", "none", "owner(_a1)"}) {
        PlacementPolicy p = Policy(text);
        EXPECT_EQ(Policy(p.ToString()), p) << text;
    }
}

TEST(PlacementPolicyTest, OwnerByExpertIdMatchesOnlyThatExpert) {
    // owner(expert): the ordinal is the expert id, not an EP rank, so a training EP size of 16
    // (expert 37 on training rank 9) and an inference EP size of 8 (expert 37 on rank 4) agree.
    PlacementPolicy owner = Policy("owner(expert)");
    NamedAxes source = Axes({{"expert", 37}, {"ep", 9}});
    EXPECT_TRUE(owner.Matches(source, Axes({{"expert", 37}, {"ep", 4}, {"tp", 0}})));
    EXPECT_TRUE(owner.Matches(source, Axes({{"expert", 37}, {"ep", 4}, {"tp", 1}})));
    EXPECT_TRUE(owner.Matches(source, Axes({{"expert", 37}})));
    EXPECT_FALSE(owner.Matches(source, Axes({{"expert", 36}, {"ep", 4}})));
    EXPECT_FALSE(owner.Matches(source, Axes({{"expert", 38}, {"ep", 9}})));
    // A target that names no expert is not the owner's reader.
    EXPECT_FALSE(owner.Matches(source, Axes({{"ep", 9}})));
    EXPECT_FALSE(owner.Matches(source, NamedAxes()));
    // owner(ep) compares EP-rank ordinals: only valid when both sides share one EP size.
    EXPECT_FALSE(Policy("owner(ep)").Matches(source, Axes({{"expert", 37}, {"ep", 4}})));
    EXPECT_TRUE(Policy("owner(ep)").Matches(source, Axes({{"ep", 9}})));
}

TEST(PlacementPolicyTest, ReplicateAndNoneMatchEveryTarget) {
    NamedAxes source = Axes({{"ep", 3}});
    const std::vector<NamedAxes> targets = {
        Axes({{"ep", 0}, {"tp", 0}}), Axes({{"ep", 1}, {"tp", 1}}), Axes({{"expert", 5}}),
        NamedAxes()};
    for (const NamedAxes& t : targets) {
        EXPECT_TRUE(Policy("replicate(ep)").Matches(source, t)) << t.ToString();
        EXPECT_TRUE(Policy("none").Matches(source, t)) << t.ToString();
        EXPECT_TRUE(Policy("replicate(ep)").Matches(NamedAxes(), t)) << t.ToString();
    }
}

TEST(PlacementPolicyTest, ValidateSourceNeedsOwnerAxis) {
    EXPECT_THAT(Policy("owner(expert)").ValidateSource(Axes({{"expert", 37}})), IsOk());
    EXPECT_THAT(Policy("owner(expert)").ValidateSource(Axes({{"ep", 3}})),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(Policy("owner(expert)").ValidateSource(NamedAxes()),
                StatusIs(StatusCode::kInvalidArgument));
    // Replicate and none need no particular axis.
    EXPECT_THAT(Policy("replicate(ep)").ValidateSource(NamedAxes()), IsOk());
    EXPECT_THAT(Policy("none").ValidateSource(NamedAxes()), IsOk());
}

TEST(CanonicalOwnerTest, StableHashIsFnv1a) {
    // Fixed values: the owner choice must agree across ranks, builds and languages.
    static_assert(StableHash("") == 0xcbf29ce484222325ull);
    static_assert(StableHash("a") == 0xaf63dc4c8601ec8cull);
    EXPECT_NE(StableHash("layers.0.w"), StableHash("layers.1.w"));
}

std::vector<NamedAxes> EpParticipants(int ep_size) {
    std::vector<NamedAxes> out;
    for (int e = 0; e < ep_size; ++e) out.push_back(Axes({{"ep", e}, {"tp", 0}}));
    return out;
}

TEST(CanonicalOwnerTest, DeterministicRegardlessOfParticipantOrder) {
    std::mt19937_64 rng(7);
    for (int tensor = 0; tensor < 32; ++tensor) {
        const std::string id = "layers." + std::to_string(tensor) + ".self_attn.q_proj.weight";
        std::vector<NamedAxes> participants = EpParticipants(6);
        ASSERT_OK_AND_ASSIGN(std::size_t first, CanonicalOwner(id, participants));
        const NamedAxes chosen = participants[first];
        for (int shuffle = 0; shuffle < 8; ++shuffle) {
            std::shuffle(participants.begin(), participants.end(), rng);
            ASSERT_OK_AND_ASSIGN(std::size_t again, CanonicalOwner(id, participants));
            ASSERT_LT(again, participants.size());
            EXPECT_EQ(participants[again], chosen) << id;
        }
    }
}

TEST(CanonicalOwnerTest, ExactlyOneOwnerAmongParticipants) {
    std::mt19937_64 rng(11);
    for (int tensor = 0; tensor < 32; ++tensor) {
        const std::string id = "model.layers." + std::to_string(tensor) + ".mlp.gate.weight";
        std::vector<NamedAxes> participants = EpParticipants(1 + tensor % 8);
        std::shuffle(participants.begin(), participants.end(), rng);
        int owners = 0;
        for (const NamedAxes& self : participants) {
            ASSERT_OK_AND_ASSIGN(bool is_owner, IsCanonicalOwner(id, self, participants));
            owners += is_owner ? 1 : 0;
        }
        EXPECT_EQ(owners, 1) << id;
        // A rank outside the participant set is never the owner.
        ASSERT_OK_AND_ASSIGN(bool outsider,
                             IsCanonicalOwner(id, Axes({{"ep", 99}, {"tp", 0}}), participants));
        EXPECT_FALSE(outsider);
    }
}

TEST(CanonicalOwnerTest, SpreadAcrossTensorIds) {
    const std::vector<NamedAxes> participants = EpParticipants(4);
    std::map<std::size_t, int> per_owner;
    const int tensors = 256;
    for (int tensor = 0; tensor < tensors; ++tensor) {
        const std::string id = "model.layers." + std::to_string(tensor) + ".input_layernorm.weight";
        ASSERT_OK_AND_ASSIGN(std::size_t owner, CanonicalOwner(id, participants));
        ++per_owner[owner];
    }
    // Every rank encodes some shared weights; none encodes more than half of them.
    ASSERT_EQ(per_owner.size(), participants.size());
    for (const auto& [owner, count] : per_owner) {
        EXPECT_GE(count, tensors / 8) << "owner " << owner;
        EXPECT_LE(count, tensors / 2) << "owner " << owner;
    }
}

TEST(CanonicalOwnerTest, SingleParticipantOwns) {
    const std::vector<NamedAxes> one = {Axes({{"ep", 5}})};
    ASSERT_OK_AND_ASSIGN(std::size_t owner, CanonicalOwner("w", one));
    EXPECT_EQ(owner, 0u);
}

TEST(CanonicalOwnerTest, EmptyOrDuplicateParticipantsAreErrors) {
    EXPECT_THAT(CanonicalOwner("w", std::vector<NamedAxes>{}),
                StatusIs(StatusCode::kInvalidArgument));
    const std::vector<NamedAxes> dup = {Axes({{"ep", 0}}), Axes({{"ep", 1}}), Axes({{"ep", 0}})};
    EXPECT_THAT(CanonicalOwner("w", dup), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(IsCanonicalOwner("w", dup[0], dup), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(IsCanonicalOwner("w", dup[0], std::vector<NamedAxes>{}),
                StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace mooncake::sparse
