// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Rules of the object store messages; see wire_objects.h.
#include "node/wire_objects.h"

#include <string>

namespace mooncake::sparse::wire {

Status LeaseReply::Validate() const {
    if (locations.size() != info.members.size()) {
        return InvalidArgument("lease reply has " + std::to_string(locations.size()) +
                               " locations for " + std::to_string(info.members.size()) +
                               " members");
    }
    return Status::Ok();
}

Status ReleaseRequest::Validate() const {
    if (lease_ids.empty()) return InvalidArgument("release of no lease ids");
    return Status::Ok();
}

}  // namespace mooncake::sparse::wire
