// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The object store conversation of the node daemon's protocol (ObjectStore over the socket):
//
//     RegisterBufferRequest (+1 fd) -> OkReply        the client's own buffer (memfd)
//     PutRequest                    -> OkReply
//     StatRequest                   -> StatReply
//     ReadMemberRequest             -> OkReply        daemon copies into dst
//     ReadRangesRequest             -> OkReply
//     RemoveRequest                 -> OkReply
//     ListRequest                   -> ListReply
//     LeaseRequest                  -> LeaseReply     object pinned in place until released
//     ReleaseRequest                -> OkReply
//
// Each message lists its fields once (wire_format.h); the list is the wire order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "node/wire_common.h"

namespace mooncake::sparse::wire {

/// Sent with one SCM_RIGHTS fd (a memfd of `size` bytes) that replaces the connection's client
/// buffer; BufferKind::kClientBuffer offsets address it.
struct RegisterBufferRequest {
    static constexpr MessageType kType = MessageType::kRegisterBuffer;
    std::uint64_t size = 0;

    static void Fields(auto& v, auto& m) { v("size", m.size); }
    friend bool operator==(const RegisterBufferRequest&, const RegisterBufferRequest&) = default;
};

struct PutMember {
    std::string name;
    DType dtype = DType::kUInt8;
    Shape shape;  ///< At most kMaxRank extents (values are the store's to validate).
    std::uint64_t checksum = 0;
    BufferRef src;  ///< src.size is the member's byte size.

    static void Fields(auto& v, auto& m) {
        v("member name", m.name, kMaxNameBytes);
        v("dtype", m.dtype);
        v("member shape", m.shape, kMaxRank);
        v("checksum", m.checksum);
        v("src", m.src);
    }
    friend bool operator==(const PutMember&, const PutMember&) = default;
};

/// ObjectStore::Put with the member bytes in the client's buffer (or CUDA allocations).
struct PutRequest {
    static constexpr MessageType kType = MessageType::kPut;
    std::string key;
    std::string metadata;
    std::vector<PutMember> members;
    PutMode mode = PutMode::kCreate;
    bool hard_pin = false;

    static void Fields(auto& v, auto& m) {
        v("key", m.key, kMaxKeyBytes);
        v("metadata", m.metadata, kMaxMetadataBytes);
        v("members", m.members, kMaxMembers);
        v("put mode", m.mode);
        v("hard_pin", m.hard_pin);
    }
    friend bool operator==(const PutRequest&, const PutRequest&) = default;
};

struct StatRequest {
    static constexpr MessageType kType = MessageType::kStat;
    std::string key;

    static void Fields(auto& v, auto& m) { v("key", m.key, kMaxKeyBytes); }
    friend bool operator==(const StatRequest&, const StatRequest&) = default;
};

struct StatReply {
    static constexpr MessageType kType = MessageType::kStatReply;
    ObjectInfo info;

    static void Fields(auto& v, auto& m) { v("info", m.info); }
    friend bool operator==(const StatReply& a, const StatReply& b) {
        return SameObjectInfo(a.info, b.info);
    }
};

/// ObjectStore::ReadMember into `dst` (dst.size must equal the member's size).
struct ReadMemberRequest {
    static constexpr MessageType kType = MessageType::kReadMember;
    std::string key;
    std::string member;
    BufferRef dst;

    static void Fields(auto& v, auto& m) {
        v("key", m.key, kMaxKeyBytes);
        v("member", m.member, kMaxNameBytes);
        v("dst", m.dst);
    }
    friend bool operator==(const ReadMemberRequest&, const ReadMemberRequest&) = default;
};

struct RangeItem {
    std::string key;
    std::string member;
    std::uint64_t row_start = 0;
    std::uint64_t row_end = 0;  ///< Exclusive; the store checks the range.
    BufferRef dst;

    static void Fields(auto& v, auto& m) {
        v("key", m.key, kMaxKeyBytes);
        v("member", m.member, kMaxNameBytes);
        v("row_start", m.row_start);
        v("row_end", m.row_end);
        v("dst", m.dst);
    }
    friend bool operator==(const RangeItem&, const RangeItem&) = default;
};

/// ObjectStore::ReadRanges (all-or-nothing, one snapshot).
struct ReadRangesRequest {
    static constexpr MessageType kType = MessageType::kReadRanges;
    std::vector<RangeItem> items;

    static void Fields(auto& v, auto& m) { v("range items", m.items, kMaxBatchItems); }
    friend bool operator==(const ReadRangesRequest&, const ReadRangesRequest&) = default;
};

struct RemoveRequest {
    static constexpr MessageType kType = MessageType::kRemove;
    std::string key;

    static void Fields(auto& v, auto& m) { v("key", m.key, kMaxKeyBytes); }
    friend bool operator==(const RemoveRequest&, const RemoveRequest&) = default;
};

struct ListRequest {
    static constexpr MessageType kType = MessageType::kList;
    std::string prefix;

    static void Fields(auto& v, auto& m) { v("prefix", m.prefix, kMaxKeyBytes); }
    friend bool operator==(const ListRequest&, const ListRequest&) = default;
};

struct ListReply {
    static constexpr MessageType kType = MessageType::kListReply;
    std::vector<std::string> keys;

    static void Fields(auto& v, auto& m) { v("keys", m.keys, kMaxListKeys, kMaxKeyBytes); }
    friend bool operator==(const ListReply&, const ListReply&) = default;
};

/// Zero-copy read: pins the object where it lies and returns its members' locations, valid
/// until ReleaseRequest (or until the connection closes).
struct LeaseRequest {
    static constexpr MessageType kType = MessageType::kLease;
    std::string key;

    static void Fields(auto& v, auto& m) { v("key", m.key, kMaxKeyBytes); }
    friend bool operator==(const LeaseRequest&, const LeaseRequest&) = default;
};

struct LeaseReply {
    static constexpr MessageType kType = MessageType::kLeaseReply;
    std::uint64_t lease_id = 0;
    ObjectInfo info;
    std::vector<SegmentSlice> locations;  ///< One per info.members, same order (checked).

    static void Fields(auto& v, auto& m) {
        v("lease_id", m.lease_id);
        v("info", m.info);
        v("locations", m.locations, kMaxMembers);
    }
    Status Validate() const;
    friend bool operator==(const LeaseReply& a, const LeaseReply& b) {
        return a.lease_id == b.lease_id && SameObjectInfo(a.info, b.info) &&
               a.locations == b.locations;
    }
};

/// Ends leases (LeaseReply, SparseReadReply objects); releasing an unknown id is NotFound.
struct ReleaseRequest {
    static constexpr MessageType kType = MessageType::kRelease;
    std::vector<std::uint64_t> lease_ids;  ///< 1 .. kMaxBatchItems.

    static void Fields(auto& v, auto& m) { v("lease_ids", m.lease_ids, kMaxBatchItems); }
    Status Validate() const;
    friend bool operator==(const ReleaseRequest&, const ReleaseRequest&) = default;
};

}  // namespace mooncake::sparse::wire
