// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Rules of the sparse object messages; see wire_sparse.h.
#include "node/wire_sparse.h"

#include <algorithm>
#include <string>

namespace mooncake::sparse::wire {

Status SparseReadOptions::Validate() const {
    if (plan.read_coalesce_gap < -1) {
        return InvalidArgument("read_coalesce_gap " + std::to_string(plan.read_coalesce_gap) +
                               " < -1");
    }
    return Status::Ok();
}

Status DeviceMember::Validate() const {
    std::uint64_t end = 0;
    if (__builtin_add_overflow(offset, size, &end)) {
        return InvalidArgument("a device member's offset " + std::to_string(offset) +
                               " and size " + std::to_string(size) + " overflow");
    }
    return Status::Ok();
}

Status SparseCommitDeviceRequest::Validate() const {
    if (memory.ref.kind != BufferKind::kCudaIpc) {
        return InvalidArgument("a device commit's members are not in CUDA memory");
    }
    MCS_RETURN_IF_ERROR(memory.Validate());
    for (std::size_t i = 0; i < items.size(); ++i) {
        for (const DeviceMember* m : {&items[i].indices, &items[i].values}) {
            if (m->offset + m->size > memory.ref.size) {
                return InvalidArgument("item " + std::to_string(i) + ": a device member of " +
                                       std::to_string(m->size) + " bytes at offset " +
                                       std::to_string(m->offset) + " lies outside the " +
                                       std::to_string(memory.ref.size) +
                                       " bytes of the request's memory");
            }
        }
    }
    return Status::Ok();
}

Status LeasesToDeviceRequest::Validate() const {
    if (destination.ref.kind != BufferKind::kCudaIpc) {
        return InvalidArgument("a LeasesToDevice destination is not in CUDA memory");
    }
    return destination.Validate();
}

namespace {

/// A destination the daemon copies into by CUDA IPC, and the optional IPC event it records after
/// the copies; `what` names it in the error.
Status ValidateDeviceCopyTarget(const TensorLocation& destination, const std::string& ready_event,
                                const std::string& what) {
    if (destination.ref.kind != BufferKind::kCudaIpc) {
        return InvalidArgument(what + " destination is not in CUDA memory");
    }
    if (!ready_event.empty() && ready_event.size() != kCudaIpcHandleBytes) {
        return InvalidArgument(what + " ready event handle has " +
                               std::to_string(ready_event.size()) + " bytes, not " +
                               std::to_string(kCudaIpcHandleBytes));
    }
    return destination.Validate();
}

}  // namespace

Status LeaseRangesToDeviceRequest::Validate() const {
    return ValidateDeviceCopyTarget(destination, ready_event, "a LeaseRangesToDevice");
}

void MakeRoomForKeptTargets(std::vector<KeptTargetSet>& kept, std::size_t incoming) {
    std::size_t total = 0;
    for (const KeptTargetSet& k : kept) total += k.targets.size();
    while (!kept.empty() &&
           (kept.size() >= kMaxKeptTargetSets || total + incoming > kMaxKeptTargets)) {
        const auto oldest = std::min_element(
            kept.begin(), kept.end(),
            [](const KeptTargetSet& a, const KeptTargetSet& b) { return a.last_use < b.last_use; });
        total -= oldest->targets.size();
        kept.erase(oldest);
    }
}

Status PlanToDevice::Validate() const {
    return ValidateDeviceCopyTarget(destination, ready_event, "a planned read's device");
}

Status SparseWaitRequest::Validate() const {
    if (!(timeout_seconds >= 0 && timeout_seconds <= kMaxWaitSeconds)) {
        return InvalidArgument("wait timeout " + std::to_string(timeout_seconds) +
                               " s is not in [0, " + std::to_string(kMaxWaitSeconds) + "]");
    }
    return Status::Ok();
}

}  // namespace mooncake::sparse::wire
