// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Rules of the pieces several conversations carry; see wire_common.h.
#include "node/wire_common.h"

#include <algorithm>
#include <string>
#include <utility>

namespace mooncake::sparse::wire {
namespace {

std::string Num(std::uint64_t v) { return std::to_string(v); }

Status CheckNoOverflow(std::uint64_t offset, std::uint64_t size, std::string_view what) {
    if (size > UINT64_MAX - offset) {
        return InvalidArgument(std::string(what) + " offset " + Num(offset) + " + size " +
                               Num(size) + " overflows");
    }
    return Status::Ok();
}

}  // namespace

Status BufferRef::Validate() const {
    MCS_RETURN_IF_ERROR(CheckNoOverflow(offset, size, "buffer"));
    if (kind == BufferKind::kCudaIpc) {
        if (cuda_ipc_handle.size() != kCudaIpcHandleBytes) {
            return InvalidArgument("cuda_ipc_handle must be " + Num(kCudaIpcHandleBytes) +
                                   " bytes, got " + Num(cuda_ipc_handle.size()));
        }
        // On the wire a u32: one above INT32_MAX decodes as a negative ordinal.
        if (device < 0) {
            return InvalidArgument("cuda device ordinal " +
                                   Num(static_cast<std::uint32_t>(device)) + " out of range");
        }
    } else if (!cuda_ipc_handle.empty() || device != -1) {
        return InvalidArgument("a client-buffer reference carries no CUDA handle/device");
    }
    return Status::Ok();
}

Status SegmentSlice::Validate() const { return CheckNoOverflow(offset, size, "segment slice"); }

Status CheckCoordinateSpace(const std::string& space) {
    if (space != "global" && space != "local") {
        return InvalidArgument("coordinate_space must be 'global' or 'local', got '" +
                               space.substr(0, 64) + "'");
    }
    return Status::Ok();
}

Result<PlacementPolicy> Schema<PlacementPolicy>::Make(Form f) {
    switch (f.kind) {
        case PlacementPolicy::Kind::kNone:
            if (!f.axis.empty()) return InvalidArgument("policy 'none' carries an axis");
            return PlacementPolicy::None();
        case PlacementPolicy::Kind::kOwner: return PlacementPolicy::Owner(std::move(f.axis));
        case PlacementPolicy::Kind::kReplicate:
            return PlacementPolicy::Replicate(std::move(f.axis));
    }
    return InvalidArgument("unknown placement policy kind");  // EnumTraits rejected it already.
}

Result<TargetDescriptor> Schema<TargetDescriptor>::Make(TargetDescriptor t) {
    const Box& box = t.box;
    return TargetDescriptor::Make(std::move(t.target_id), std::move(t.node_id),
                                  std::move(t.tensor_id), std::move(t.placement),
                                  Shape(box.origin().begin(), box.origin().end()),
                                  Shape(box.shape().begin(), box.shape().end()));
}

bool SameObjectInfo(const ObjectInfo& a, const ObjectInfo& b) {
    auto same_member = [](const MemberInfo& x, const MemberInfo& y) {
        return x.name == y.name && x.dtype == y.dtype && x.shape == y.shape &&
               x.size_bytes == y.size_bytes && x.checksum == y.checksum;
    };
    return a.key == b.key && a.metadata == b.metadata && a.version == b.version &&
           a.hard_pinned == b.hard_pinned &&
           std::equal(a.members.begin(), a.members.end(), b.members.begin(), b.members.end(),
                      same_member);
}

}  // namespace mooncake::sparse::wire
