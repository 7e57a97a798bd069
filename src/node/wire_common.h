// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Pieces that more than one conversation of the node daemon's protocol carries: references to
// client bytes and daemon segments, and the encodings of planner and store types (their own
// validating factories run on decode). See wire_format.h for the encoding.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"
#include "node/wire_format.h"

namespace mooncake::sparse::wire {

// ---- Enums of other layers -------------------------------------------------------------------

template <>
struct EnumTraits<DType> : EnumRange<std::uint8_t, 0, kNumDTypes - 1> {
    static constexpr std::string_view kUnknown = "unknown dtype";
};
template <>
struct EnumTraits<ApplyMode>
    : EnumRange<std::uint8_t, 0, static_cast<std::uint8_t>(ApplyMode::kScatterAdd)> {
    static constexpr std::string_view kUnknown = "unknown apply mode";
};
template <>
struct EnumTraits<PutMode>
    : EnumRange<std::uint8_t, 0, static_cast<std::uint8_t>(PutMode::kUpsert)> {
    static constexpr std::string_view kUnknown = "unknown put mode";
};
template <>
struct EnumTraits<PlacementPolicy::Kind>
    : EnumRange<std::uint8_t, 0, static_cast<std::uint8_t>(PlacementPolicy::Kind::kReplicate)> {
    static constexpr std::string_view kUnknown = "unknown placement policy kind";
};
/// Never kOk: an ErrorReply always carries a failure.
template <>
struct EnumTraits<StatusCode>
    : EnumRange<std::uint32_t, 1, static_cast<std::uint32_t>(kLastStatusCode)> {
    static constexpr std::string_view kUnknown = "invalid status code";
};

// ---- Client bytes and daemon segments --------------------------------------------------------

/// Where the daemon finds (Put, SparseCommit) or writes (ReadMember, ReadRanges) client bytes.
enum class BufferKind : std::uint8_t {
    kClientBuffer = 0,  ///< The connection's registered buffer (RegisterBufferRequest).
    kCudaIpc = 1,       ///< A CUDA allocation exported by the client (docs/design.md §5).
};
template <>
struct EnumTraits<BufferKind>
    : EnumRange<std::uint8_t, 0, static_cast<std::uint8_t>(BufferKind::kCudaIpc)> {
    static constexpr std::string_view kUnknown = "unknown buffer kind";
};

struct BufferRef {
    BufferKind kind = BufferKind::kClientBuffer;
    /// Byte offset into the client buffer, or into the CUDA allocation whose base the handle
    /// names (the handle is of the allocation base; the offset is carried separately).
    std::uint64_t offset = 0;
    std::uint64_t size = 0;  ///< offset + size never overflows (checked).
    std::string cuda_ipc_handle;  ///< kCudaIpc: exactly kCudaIpcHandleBytes; else empty.
    std::int32_t device = -1;     ///< kCudaIpc: the CUDA device ordinal (>= 0); else -1.

    static void Fields(auto& v, auto& m) {
        v("buffer kind", m.kind);
        v("offset", m.offset);
        v("size", m.size);
        if (m.kind == BufferKind::kCudaIpc) {
            v("cuda_ipc_handle", m.cuda_ipc_handle, kCudaIpcHandleBytes);
            v("cuda device", m.device);  // u32 on the wire; Validate keeps it <= INT32_MAX.
        }
    }
    Status Validate() const;

    static BufferRef Client(std::uint64_t offset, std::uint64_t size) {
        return {BufferKind::kClientBuffer, offset, size, {}, -1};
    }
    friend bool operator==(const BufferRef&, const BufferRef&) = default;
};

/// A byte range of one daemon segment (mapped by the client from HelloReply's fds).
struct SegmentSlice {
    std::uint32_t segment_id = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;  ///< offset + size never overflows (checked).

    static void Fields(auto& v, auto& m) {
        v("segment_id", m.segment_id);
        v("offset", m.offset);
        v("size", m.size);
    }
    Status Validate() const;
    friend bool operator==(const SegmentSlice&, const SegmentSlice&) = default;
};

struct SegmentInfo {
    std::uint32_t segment_id = 0;
    std::uint64_t size = 0;
    bool read_only = true;  ///< The client maps it PROT_READ.

    static void Fields(auto& v, auto& m) {
        v("segment_id", m.segment_id);
        v("size", m.size);
        v("read_only", m.read_only);
    }
    friend bool operator==(const SegmentInfo&, const SegmentInfo&) = default;
};

/// "global" or "local": the coordinates of a sparse object's indices.
/// Errors: InvalidArgument.
Status CheckCoordinateSpace(const std::string& space);

// ---- Planner types ---------------------------------------------------------------------------

template <>
struct Schema<Generation> {
    static void Fields(auto& v, auto& g) {
        v("base", g.base);
        v("delta", g.delta);
    }
    static Status Validate(const Generation& g) {
        return Generation::Make(g.base, g.delta).status();
    }
};

template <>
struct Schema<Box> {
    struct Form {
        Shape origin;
        Shape shape;
    };
    struct View {
        std::span<const Index> origin;
        std::span<const Index> shape;
    };
    static View ViewOf(const Box& b) { return {b.origin(), b.shape()}; }
    static void Fields(auto& v, auto& b) {
        v("box origin", b.origin, kMaxRank);
        v("box shape", b.shape, kMaxRank);
    }
    static Result<Box> Make(Form f) { return Box::Make(f.origin, f.shape); }
};

template <>
struct Schema<NamedAxes::Entry> {
    static void Fields(auto& v, auto& e) {
        v("axis name", e.first, kMaxNameBytes);
        v("axis ordinal", e.second);
    }
};

template <>
struct Schema<NamedAxes> {
    struct Form {
        std::vector<NamedAxes::Entry> entries;
    };
    struct View {
        const std::vector<NamedAxes::Entry>& entries;
    };
    static View ViewOf(const NamedAxes& a) { return {a.entries()}; }
    static void Fields(auto& v, auto& a) { v("placement axes", a.entries, kMaxAxes); }
    static Result<NamedAxes> Make(Form f) { return NamedAxes::Make(std::move(f.entries)); }
};

template <>
struct Schema<PlacementPolicy> {
    struct Form {
        PlacementPolicy::Kind kind = PlacementPolicy::Kind::kNone;
        std::string axis;
    };
    struct View {
        PlacementPolicy::Kind kind;
        const std::string& axis;
    };
    static View ViewOf(const PlacementPolicy& p) { return {p.kind(), p.axis()}; }
    static void Fields(auto& v, auto& p) {
        v("policy kind", p.kind);
        v("policy axis", p.axis, kMaxNameBytes);
    }
    static Result<PlacementPolicy> Make(Form f);
};

template <>
struct Schema<SourceDescriptor> {
    using Form = SourceDescriptor;
    static void Fields(auto& v, auto& d) {
        v("source_ref", d.source_ref, kMaxKeyBytes);
        v("tensor_id", d.tensor_id, kMaxNameBytes);
        v("global_shape", d.global_shape, kMaxRank);
        v("box", d.box);
        v("generation", d.generation);
        v("placement", d.placement);
        v("policy", d.policy);
        v("tile_shape", d.tile_shape, kMaxRank);
        v("nnz", d.nnz);
        v("num_tiles", d.num_tiles);
        v("apply", d.apply);
        v("index_dtype", d.index_dtype);
        v("value_dtype", d.value_dtype);
    }
    static Result<SourceDescriptor> Make(SourceDescriptor d) {
        return SourceDescriptor::Make(std::move(d));
    }
};

template <>
struct Schema<TargetDescriptor> {
    using Form = TargetDescriptor;
    static void Fields(auto& v, auto& t) {
        v("target_id", t.target_id, kMaxNameBytes);
        v("node_id", t.node_id, kMaxNameBytes);
        v("tensor_id", t.tensor_id, kMaxNameBytes);
        v("placement", t.placement);
        v("box", t.box);
    }
    static Result<TargetDescriptor> Make(TargetDescriptor t);
};

// ---- Store types -----------------------------------------------------------------------------

template <>
struct Schema<MemberInfo> {
    static void Fields(auto& v, auto& m) {
        v("member name", m.name, kMaxNameBytes);
        v("dtype", m.dtype);
        v("member shape", m.shape, kMaxRank);
        v("size_bytes", m.size_bytes);
        v("checksum", m.checksum);
    }
};

template <>
struct Schema<ObjectInfo> {
    static void Fields(auto& v, auto& info) {
        v("key", info.key, kMaxKeyBytes);
        v("metadata", info.metadata, kMaxMetadataBytes);
        v("members", info.members, kMaxMembers);
        v("version", info.version);
        v("hard_pinned", info.hard_pinned);
    }
};

/// Field-wise equality (ObjectInfo has no operator==).
bool SameObjectInfo(const ObjectInfo& a, const ObjectInfo& b);

}  // namespace mooncake::sparse::wire
