// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "executor/step_records.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "codec/codec.h"

namespace mooncake::sparse::internal {

using Json = nlohmann::json;

/// A seal's or an anchor's tensor list: validated, sorted, no id twice.
Result<std::vector<std::string>> SortedUniqueIds(std::span<const std::string> tensor_ids,
                                                 std::string_view what) {
    std::vector<std::string> ids(tensor_ids.begin(), tensor_ids.end());
    for (const std::string& id : ids) {
        MCS_RETURN_IF_ERROR(internal::ValidateId("tensor_id", id));
        if (id.find('\n') != std::string::npos) {
            return InvalidArgument("tensor_id '" + id + "' contains a newline");
        }
    }
    std::sort(ids.begin(), ids.end());
    if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end()) {
        return InvalidArgument(std::string(what) + ": tensor id '" + *dup + "' is listed twice");
    }
    return ids;
}


/// Creates the record of `step` at `key` with one member per list (one line per entry; no entry
/// holds a newline). Errors: as ObjectStore::Put (Conflict when it exists).
Status PutListRecord(ObjectStore& store, const std::string& key, Generation step,
                     std::span<const ListMember> lists, std::size_t tensors, bool listed) {
    std::vector<std::string> joined(lists.size());
    std::vector<MemberData> members;
    members.reserve(lists.size());
    for (std::size_t m = 0; m < lists.size(); ++m) {
        for (std::size_t i = 0; i < lists[m].lines.size(); ++i) {
            if (i) joined[m] += '\n';
            joined[m] += lists[m].lines[i];
        }
        const auto bytes = std::span<const std::byte>(
            reinterpret_cast<const std::byte*>(joined[m].data()), joined[m].size());
        members.push_back({std::string(lists[m].name), DType::kUInt8,
                           {Index(joined[m].size())}, bytes, Checksum(bytes)});
    }
    const Json meta = {{"base", step.base}, {"delta", step.delta}, {"tensors", tensors}};
    return store.Put(key, meta.dump(), members, {PutMode::kCreate, true, listed});
}

/// Creates the record of `step` at `key` holding `ids` (member kTensorIdsMember).
Status PutIdList(ObjectStore& store, const std::string& key, Generation step,
                 std::span<const std::string> ids, bool listed) {
    const ListMember list{kTensorIdsMember, ids};
    return PutListRecord(store, key, step, {&list, 1}, ids.size(), listed);
}

/// The lines of member `name` of the record at `key` (`info`: its Stat), checksum-checked.
/// Errors: DataLoss; as ObjectStore::ReadMember.
Result<std::vector<std::string>> ReadListMember(ObjectStore& store, const std::string& key,
                                                const ObjectInfo& info, std::string_view name) {
    const MemberInfo* m = info.FindMember(name);
    if (m == nullptr) return DataLoss(key + " has no member " + std::string(name));
    std::string bytes(m->size_bytes, '\0');
    MCS_RETURN_IF_ERROR(store.ReadMember(
        key, name, {reinterpret_cast<std::byte*>(bytes.data()), bytes.size()}));
    if (Checksum({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}) !=
        m->checksum) {
        return DataLoss(key + ": " + std::string(name) + " checksum mismatch");
    }
    std::vector<std::string> lines;
    for (std::size_t pos = 0; pos < bytes.size();) {
        const std::size_t end = std::min(bytes.find('\n', pos), bytes.size());
        lines.emplace_back(bytes.substr(pos, end - pos));
        pos = end + 1;
    }
    return lines;
}

Result<std::vector<std::string>> ReadIdList(ObjectStore& store, const std::string& key,
                                            const ObjectInfo& info) {
    return ReadListMember(store, key, info, kTensorIdsMember);
}

std::int64_t NowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

Status RequireStep(Generation g, std::string_view what) {
    MCS_RETURN_IF_ERROR(Generation::Make(g.base, g.delta));
    if (g.delta != g.base + 1) {
        return InvalidArgument(std::string(what) + " " + g.ToString() +
                               " is not a step: step k is the generation (k - 1, k)");
    }
    return Status::Ok();
}

Status IgnoreNotFound(Status s) {
    return s.code() == StatusCode::kNotFound ? Status::Ok() : s;
}


/// The expiry (ms since the epoch) of a lease or a pending seal, from its metadata; 0 when it
/// has none (treated as expired).
std::int64_t ExpiryOf(const ObjectInfo& info) {
    Json j = Json::parse(info.metadata, nullptr, false);
    if (j.is_discarded() || !j.contains("expires_ms") || !j["expires_ms"].is_number_integer()) {
        return 0;
    }
    return j["expires_ms"].get<std::int64_t>();
}

}  // namespace mooncake::sparse::internal
