// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Helpers shared by the store tests.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace mooncake::sparse::testing
