// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Helpers shared by the store tests.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"
#include "../status_matchers.h"

namespace mooncake::sparse::testing {

/// Owns the bytes of one member and hands out a MemberData view of them.
struct OwnedMember {
    std::string name;
    DType dtype = DType::kUInt8;
    Shape shape;
    std::vector<std::byte> bytes;
    std::uint64_t checksum = 0;

    MemberData View() const {
        return {name, dtype, shape, std::span<const std::byte>(bytes), checksum};
    }
};

inline std::uint64_t ElementCount(const Shape& shape) {
    std::uint64_t n = 1;
    for (Index e : shape) n *= static_cast<std::uint64_t>(e);
    return n;
}

/// A member whose byte i is (seed + i * 131) mod 256: distinct per position and per seed.
inline OwnedMember PatternMember(std::string name, DType dtype, Shape shape, std::uint8_t seed,
                                 std::uint64_t checksum = 0) {
    OwnedMember m{std::move(name), dtype, std::move(shape), {}, checksum};
    m.bytes.resize(ElementCount(m.shape) * DTypeSize(dtype));
    for (std::size_t i = 0; i < m.bytes.size(); ++i) {
        m.bytes[i] = static_cast<std::byte>((seed + i * 131) & 0xff);
    }
    return m;
}

inline std::vector<MemberData> Views(const std::vector<OwnedMember>& members) {
    std::vector<MemberData> out;
    out.reserve(members.size());
    for (const OwnedMember& m : members) out.push_back(m.View());
    return out;
}

inline PutOptions Create() { return {PutMode::kCreate, false}; }
inline PutOptions Upsert() { return {PutMode::kUpsert, false}; }

/// Forwards the pure ObjectStore calls to `inner` only, so PutFilled / ViewObjects take the base
/// class's staged implementations; tests override a call to watch or hook it.
class ForwardingStore : public ObjectStore {
public:
    explicit ForwardingStore(std::shared_ptr<ObjectStore> inner) : inner_(std::move(inner)) {}
    Status Put(std::string_view key, std::string_view metadata,
               std::span<const MemberData> members, const PutOptions& options) override {
        return inner_->Put(key, metadata, members, options);
    }
    Result<ObjectInfo> Stat(std::string_view key) override { return inner_->Stat(key); }
    Status ReadMember(std::string_view key, std::string_view member,
                      std::span<std::byte> dst) override {
        return inner_->ReadMember(key, member, dst);
    }
    Status ReadRanges(std::span<const RangeRead> reads) override {
        return inner_->ReadRanges(reads);
    }
    Status Remove(std::string_view key) override { return inner_->Remove(key); }
    Result<std::vector<std::string>> List(std::string_view prefix) override {
        return inner_->List(prefix);
    }
    StoreCounters Counters() const override { return inner_->Counters(); }

private:
    std::shared_ptr<ObjectStore> inner_;
};


/// ReadRangesParallel on `store`: a batch over the parallel-copy threshold (four objects of
/// 3 MiB, 600 ranges) reads the bytes ReadRanges reads, for 1, 2, 4 and all threads; a batch
/// with one bad item fails as ReadRanges does and writes no destination.
inline void ExpectParallelRangeReadsMatch(ObjectStore& store) {
    std::vector<std::vector<OwnedMember>> objects;
    for (std::uint8_t o = 0; o < 4; ++o) {
        objects.push_back({PatternMember("indices", DType::kUInt16, {786432, 2}, o),
                           PatternMember("values", DType::kUInt32, {786432}, std::uint8_t(o + 9))});
        MCS_ASSERT_OK(store.Put("par/" + std::to_string(o), "", Views(objects.back()), Create()));
    }
    std::vector<std::string> keys = {"par/0", "par/1", "par/2", "par/3"};
    struct Item {
        std::size_t object;
        bool values;
        std::uint64_t start, end;
    };
    std::vector<Item> items;
    std::uint64_t state = 12345;
    const auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull; };
    for (int i = 0; i < 600; ++i) {
        const std::uint64_t a = (next() >> 33) % 786432, n = (next() >> 33) % 12000;
        items.push_back({std::size_t(next() >> 62), (next() >> 63) != 0, a, std::min<std::uint64_t>(786432, a + n)});
    }
    const auto run = [&](int threads, bool bad, std::vector<std::vector<std::byte>>& out) {
        std::vector<RangeRead> reads;
        out.assign(items.size() + (bad ? 1 : 0), {});
        for (std::size_t i = 0; i < items.size(); ++i) {
            const Item& it = items[i];
            out[i].assign((it.end - it.start) * 4, std::byte{0xEE});
            reads.push_back({keys[it.object], it.values ? "values" : "indices", it.start, it.end, out[i]});
        }
        if (bad) {
            out.back().assign(4, std::byte{0xEE});
            reads.push_back({keys[0], "values", 786432, 786433, out.back()});
        }
        return threads < 0 ? store.ReadRanges(reads) : store.ReadRangesParallel(reads, threads);
    };
    std::vector<std::vector<std::byte>> expected, got;
    MCS_ASSERT_OK(run(-1, false, expected));
    for (std::size_t i = 0; i < items.size(); ++i) {
        const Item& it = items[i];
        const OwnedMember& m = objects[it.object][it.values ? 1 : 0];
        ASSERT_TRUE(std::equal(expected[i].begin(), expected[i].end(), m.bytes.begin() + it.start * 4)) << i;
    }
    for (int threads : {1, 2, 4, 0}) {
        MCS_ASSERT_OK(run(threads, false, got));
        EXPECT_EQ(got, expected) << threads << " threads";
        EXPECT_THAT(run(threads, true, got), StatusIs(StatusCode::kOutOfRange));
        for (const auto& dst : got) {
            ASSERT_TRUE(std::all_of(dst.begin(), dst.end(), [](std::byte b) { return b == std::byte{0xEE}; }))
                << "a failed batch wrote a destination (" << threads << " threads)";
        }
    }
}

/// A batch of PutEach items over `members` (one owned member set per item, kept alive by the
/// caller): `count` fresh objects with members, then the cases a step's commit meets and a bad
/// caller sends (a create of a key the store holds, a key given twice, metadata-only upserts,
/// an invalid key, a member whose bytes do not match its shape).
inline std::vector<EachPut> EachBatch(std::size_t count, std::vector<std::string>& keys,
                                      std::vector<std::vector<MemberData>>& members,
                                      std::vector<OwnedMember>& owned) {
    owned.clear();
    for (std::size_t i = 0; i < count; ++i) {
        owned.push_back(PatternMember("indices", DType::kUInt16, {Index(1 + i % 7), 2},
                                      static_cast<std::uint8_t>(i)));
    }
    keys.clear();
    members.clear();
    std::vector<EachPut> items;
    for (std::size_t i = 0; i < count; ++i) {
        keys.push_back("src/t" + std::to_string(i));
        members.push_back({owned[i].View()});
    }
    keys.push_back("held");          // created before the batch
    keys.push_back("twice");         // created, then created again: a conflict
    keys.push_back("head/t");        // upserted twice: the second wins
    keys.push_back("bad key\n");     // invalid
    keys.push_back("mismatched");    // 3 bytes for a uint16 member of 2 elements
    members.push_back({});
    static const std::byte three[3] = {};
    members.push_back({MemberData{"m", DType::kUInt16, {2}, std::span<const std::byte>(three), 0}});
    for (std::size_t i = 0; i < count; ++i) {
        items.push_back({keys[i], i % 3 == 0 ? "" : "meta", members[i],
                         {PutMode::kCreate, i % 2 == 0}});
    }
    const std::span<const MemberData> none;
    items.push_back({keys[count], "again", none, {PutMode::kCreate, false}});
    items.push_back({keys[count + 1], "first", members[0], {PutMode::kCreate, false}});
    items.push_back({keys[count + 1], "second", none, {PutMode::kCreate, false}});
    items.push_back({keys[count + 2], "gen 1", none, {PutMode::kUpsert, true}});
    items.push_back({keys[count + 2], "gen 2", none, {PutMode::kUpsert, true}});
    items.push_back({keys[count + 3], "x", none, {PutMode::kCreate, false}});
    items.push_back({keys[count + 4], "x", members[count + 1], {PutMode::kCreate, false}});
    return items;
}

/// PutEach of `items` into `each` does what a Put of each item in order into `serial` does:
/// the same status codes, then the same objects (metadata, members' bytes, versions).
inline void ExpectPutEachIsPutInOrder(ObjectStore& each, ObjectStore& serial,
                                      std::span<const EachPut> items, int num_threads) {
    std::vector<Status> expected;
    for (const EachPut& item : items) {
        expected.push_back(serial.Put(item.key, item.metadata, item.members, item.options));
    }
    const std::vector<Status> got = each.PutEach(items, num_threads);
    ASSERT_EQ(got.size(), items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
        EXPECT_EQ(got[i].code(), expected[i].code())
            << "item " << i << " (" << items[i].key << "): " << got[i].ToString() << " vs "
            << expected[i].ToString();
    }
    for (const EachPut& item : items) {
        auto a = serial.Stat(item.key);
        auto b = each.Stat(item.key);
        ASSERT_EQ(a.ok(), b.ok()) << item.key;
        if (!a.ok()) continue;
        EXPECT_EQ(b->metadata, a->metadata) << item.key;
        EXPECT_EQ(b->version, a->version) << item.key;
        EXPECT_EQ(b->hard_pinned, a->hard_pinned) << item.key;
        ASSERT_EQ(b->members.size(), a->members.size()) << item.key;
        for (const MemberInfo& m : a->members) {
            std::vector<std::byte> x(m.size_bytes), y(m.size_bytes);
            MCS_ASSERT_OK(serial.ReadMember(item.key, m.name, x));
            MCS_ASSERT_OK(each.ReadMember(item.key, m.name, y));
            EXPECT_EQ(x, y) << item.key;
        }
    }
}

/// ExpectPutEachIsPutInOrder on pairs of fresh stores from `make` (each holding "held" first),
/// for a small and a large EachBatch on one and four threads; `also(each, serial)` checks what
/// else the two stores must agree on.
template <typename Make, typename Also>
void ExpectPutEachIsPutInOrderOnFreshStores(Make make, Also also) {
    for (const std::size_t count : {std::size_t{3}, std::size_t{300}}) {
        for (const int threads : {1, 4}) {
            SCOPED_TRACE(std::to_string(count) + " objects on " + std::to_string(threads) +
                         " threads");
            auto each = make();
            auto serial = make();
            ASSERT_NE(each, nullptr);
            ASSERT_NE(serial, nullptr);
            for (ObjectStore* s : {static_cast<ObjectStore*>(each.get()),
                                   static_cast<ObjectStore*>(serial.get())}) {
                MCS_ASSERT_OK(s->Put("held", "before", {}, Create()));
            }
            std::vector<std::string> keys;
            std::vector<std::vector<MemberData>> members;
            std::vector<OwnedMember> owned;
            const std::vector<EachPut> items = EachBatch(count, keys, members, owned);
            ExpectPutEachIsPutInOrder(*each, *serial, items, threads);
            EXPECT_EQ(each->Counters().puts, serial->Counters().puts);
            also(*each, *serial);
        }
    }
}

}  // namespace mooncake::sparse::testing
