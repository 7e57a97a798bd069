// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The small records of a training run's steps (sparse_steps.cc, sparse_retention.cc): lists of
// tensor ids and source keys as store objects, and expiries of leases and pending seals.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"

namespace mooncake::sparse::internal {

/// A seal's and an anchor's member listing the model's tensor ids.
inline constexpr std::string_view kTensorIdsMember = "tensor_ids";
/// A seal's member listing the source objects it sealed (keys below mcs/src/), sorted.
inline constexpr std::string_view kSourcesMember = "sources";

/// A seal's or an anchor's tensor list: validated, sorted, no id twice.
/// Errors: InvalidArgument.
Result<std::vector<std::string>> SortedUniqueIds(std::span<const std::string> tensor_ids,
                                                 std::string_view what);

/// One newline-separated list member of a record.
struct ListMember {
    std::string_view name;
    std::span<const std::string> lines;
};

/// Creates the record of `step` at `key` with one member per list (one line per entry; no entry
/// holds a newline). Errors: as ObjectStore::Put (Conflict when it exists).
Status PutListRecord(ObjectStore& store, const std::string& key, Generation step,
                     std::span<const ListMember> lists, std::size_t tensors, bool listed);

/// Creates the record of `step` at `key` holding `ids` (member kTensorIdsMember).
Status PutIdList(ObjectStore& store, const std::string& key, Generation step,
                 std::span<const std::string> ids, bool listed);

/// The lines of member `name` of the record at `key` (`info`: its Stat), checksum-checked.
/// Errors: DataLoss; as ObjectStore::ReadMember.
Result<std::vector<std::string>> ReadListMember(ObjectStore& store, const std::string& key,
                                                const ObjectInfo& info, std::string_view name);

/// ReadListMember of kTensorIdsMember.
Result<std::vector<std::string>> ReadIdList(ObjectStore& store, const std::string& key,
                                            const ObjectInfo& info);

/// Wall-clock milliseconds since the epoch (the clock of leases' and pending seals' expiries).
std::int64_t NowMs();

/// Errors: InvalidArgument unless `g` is a step (k - 1, k).
Status RequireStep(Generation g, std::string_view what);

/// OK for NotFound (a removal of what is gone already), else `s`.
Status IgnoreNotFound(Status s);

/// The expiry (NowMs() time) of a lease or a pending seal, from its metadata; 0 when it has
/// none (treated as expired).
std::int64_t ExpiryOf(const ObjectInfo& info);

}  // namespace mooncake::sparse::internal
