// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// KeyedMap: lookups by key through its hash index agree with the sorted tree through every
// insert, erase, swap and move; listing by prefix walks the keys in order. The index's probing
// and erasing are also driven through heavy collisions (a hash of a few values) and wrap-around.
#include "store/keyed_map.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace mooncake::sparse::internal {
namespace {

/// Every key of `ref` is found with its value, a few absent keys are not, and the walk from
/// the first key is `ref`'s order.
template <typename Map>
void ExpectSame(const Map& m, const std::map<std::string, int>& ref) {
    ASSERT_EQ(m.size(), ref.size());
    for (const auto& [k, v] : ref) {
        auto it = m.find(k);
        ASSERT_NE(it, m.end()) << k;
        EXPECT_EQ(it->first, k);
        EXPECT_EQ(it->second, v);
    }
    for (const char* absent : {"", "zz", "key/", "key/-1"}) EXPECT_EQ(m.find(absent), m.end());
    auto it = m.lower_bound("");
    for (const auto& [k, v] : ref) {
        ASSERT_NE(it, m.end());
        EXPECT_EQ(it->first, k);
        ++it;
    }
    EXPECT_EQ(it, m.end());
}

TEST(KeyedMapTest, FindAgreesWithTheTreeThroughInsertsAndErases) {
    KeyedMap<int> m;
    std::map<std::string, int> ref;
    std::mt19937 rng(7);
    for (int round = 0; round < 4000; ++round) {
        const std::string key = "key/" + std::to_string(rng() % 500);
        if (rng() % 3 != 0) {
            const auto [it, inserted] = m.emplace(key, round);
            const bool fresh = ref.emplace(key, round).second;
            EXPECT_EQ(inserted, fresh);
            EXPECT_EQ(it->second, ref.at(key));
        } else if (auto it = m.find(key); it != m.end()) {
            m.erase(it);
            ref.erase(key);
        } else {
            EXPECT_EQ(ref.count(key), 0u);
        }
    }
    ExpectSame(m, ref);
}

TEST(KeyedMapTest, ExtractTakesTheValueOutAndErasesTheKey) {
    KeyedMap<std::string> m;
    std::map<std::string, int> ref;
    KeyedMap<int> shadow;  // the same keys, to compare with ExpectSame
    std::mt19937 rng(11);
    for (int round = 0; round < 4000; ++round) {
        const std::string key = "key/" + std::to_string(rng() % 300);
        if (rng() % 2 == 0) {
            const bool fresh = m.emplace(key, "value of " + key).second;
            EXPECT_EQ(fresh, ref.emplace(key, 0).second);
            shadow.emplace(key, 0);
            continue;
        }
        std::optional<std::string> value = m.extract(key);
        ASSERT_EQ(value.has_value(), ref.erase(key) == 1) << key;
        if (value) {
            EXPECT_EQ(*value, "value of " + key);
            shadow.erase(shadow.find(key));
        }
        EXPECT_EQ(m.find(key), m.end());
    }
    ExpectSame(shadow, ref);
    ASSERT_EQ(m.size(), ref.size());
    for (const auto& [k, v] : ref) EXPECT_NE(m.find(k), m.end()) << k;
}

TEST(KeyedMapTest, ListsAPrefixInOrderFromLowerBound) {
    KeyedMap<int> m;
    for (const char* k : {"b/2", "a/1", "b/10", "c", "b/1"}) m.emplace(k, 0);
    std::vector<std::string> listed;
    for (auto it = m.lower_bound("b/"); it != m.end() && it->first.starts_with("b/"); ++it) {
        listed.push_back(it->first);
    }
    EXPECT_EQ(listed, (std::vector<std::string>{"b/1", "b/10", "b/2"}));
}

TEST(KeyedMapTest, SwapAndMoveKeepEachIndexWithItsTree) {
    KeyedMap<int> a, b;
    std::map<std::string, int> ra, rb;
    for (int i = 0; i < 100; ++i) {
        a.emplace("a" + std::to_string(i), i);
        ra.emplace("a" + std::to_string(i), i);
    }
    b.emplace("b", 1);
    rb.emplace("b", 1);
    a.swap(b);
    ExpectSame(a, rb);
    ExpectSame(b, ra);
    KeyedMap<int> c(std::move(b));
    ExpectSame(c, ra);
    c.erase(c.find("a5"));
    ra.erase("a5");
    ExpectSame(c, ra);
    a = std::move(c);
    ExpectSame(a, ra);
}

/// Four hash values only: long probe runs, every erase shifting keys of other homes.
struct FewHashes {
    std::size_t operator()(std::string_view key) const {
        return std::hash<std::string_view>{}(key) % 4 * 0x9e3779b97f4a7c15ull;
    }
};
/// Every key's home is the table's last slot: every probe run wraps around to slot 0.
struct LastSlot {
    std::size_t operator()(std::string_view) const { return ~std::size_t{0}; }
};

template <typename Map>
void ChurnAgainstReference(unsigned seed, int keys, int rounds) {
    Map m;
    std::map<std::string, int> ref;
    std::mt19937 rng(seed);
    for (int round = 0; round < rounds; ++round) {
        const std::string key = "ns/source/" + std::to_string(rng() % static_cast<unsigned>(keys));
        const unsigned op = rng() % 5;
        if (op < 3) {
            EXPECT_EQ(m.emplace(key, round).second, ref.emplace(key, round).second);
        } else if (op == 3) {
            const std::optional<int> v = m.extract(key);
            auto r = ref.find(key);
            ASSERT_EQ(v.has_value(), r != ref.end()) << key;
            if (v) {
                EXPECT_EQ(*v, r->second);
                ref.erase(r);
            }
        } else if (auto it = m.find(key); it != m.end()) {
            m.erase(it);
            ref.erase(key);
        }
        if (round % 997 == 0) ExpectSame(m, ref);
    }
    ExpectSame(m, ref);
    // Emptied and filled again.
    for (const auto& [k, v] : ref) ASSERT_TRUE(m.extract(k).has_value()) << k;
    ref.clear();
    ExpectSame(m, ref);
    for (int i = 0; i < keys; ++i) {
        m.emplace("again/" + std::to_string(i), i);
        ref.emplace("again/" + std::to_string(i), i);
    }
    ExpectSame(m, ref);
}

TEST(KeyedMapTest, ManyKeysWithChurnAgreeWithTheTree) {
    ChurnAgainstReference<KeyedMap<int>>(3, 20000, 120000);
}

TEST(KeyedMapTest, CollidingHashesAgreeWithTheTree) {
    ChurnAgainstReference<KeyedMap<int, FewHashes>>(5, 300, 20000);
}

TEST(KeyedMapTest, ProbeRunsThatWrapAroundAgreeWithTheTree) {
    ChurnAgainstReference<KeyedMap<int, LastSlot>>(9, 100, 8000);
}

TEST(KeyedMapTest, AMovedFromIndexIsEmpty) {
    KeyIndex<int> a;
    const std::string k1 = "k1", k2 = "k2";
    a.insert(k1, 1);
    a.insert(k2, 2);
    KeyIndex<int> b(std::move(a));
    EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): the state a move leaves
    EXPECT_EQ(a.find(k1), nullptr);
    ASSERT_NE(b.find(k2), nullptr);
    EXPECT_EQ(*b.find(k2), 2);
    a = std::move(b);
    EXPECT_EQ(*a.find(k1), 1);
    EXPECT_FALSE(a.erase("k3"));
    EXPECT_TRUE(a.erase(k1));
    EXPECT_EQ(a.find(k1), nullptr);
    EXPECT_EQ(a.size(), 1u);
}

}  // namespace
}  // namespace mooncake::sparse::internal
