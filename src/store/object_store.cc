// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Out-of-line helpers of the ObjectStore value types.
#include "store/object_store.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mooncake::sparse {

namespace {

std::string Quote(std::string_view s) {
    constexpr std::size_t kMaxShown = 200;
    std::string out = "'";
    if (s.size() > kMaxShown) {
        out.append(s.substr(0, kMaxShown));
        out += "...";
    } else {
        out.append(s);
    }
    out += "'";
    return out;
}

std::string JoinShape(const Shape& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    s += "]";
    return s;
}

}  // namespace

namespace internal {

Status ValidateObjectKey(std::string_view key) {
    if (key.empty()) return InvalidArgument("object key is empty");
    if (key.size() > kMaxKeyBytes) {
        return InvalidArgument("object key is " + std::to_string(key.size()) +
                               " bytes, longer than the limit of " +
                               std::to_string(kMaxKeyBytes));
    }
    if (key.find('\0') != std::string_view::npos) {
        return InvalidArgument("object key contains a NUL byte");
    }
    return Status::Ok();
}

Result<std::uint64_t> ValidateMemberData(const MemberData& m) {
    if (m.name.empty()) return InvalidArgument("member name is empty");
    if (m.name.size() > kMaxMemberNameBytes) {
        return InvalidArgument("member name is " + std::to_string(m.name.size()) +
                               " bytes, longer than the limit of " +
                               std::to_string(kMaxMemberNameBytes));
    }
    if (m.name.find('\0') != std::string::npos) {
        return InvalidArgument("member name contains a NUL byte");
    }
    const std::string where = "member " + Quote(m.name);
    const auto dtype_value = static_cast<int>(m.dtype);
    if (dtype_value < 0 || dtype_value >= kNumDTypes || DTypeSize(m.dtype) == 0) {
        return InvalidArgument(where + ": unknown dtype value " + std::to_string(dtype_value));
    }
    if (m.shape.empty()) return InvalidArgument(where + ": shape has rank 0 (need rank >= 1)");
    std::uint64_t size = DTypeSize(m.dtype);
    for (std::size_t axis = 0; axis < m.shape.size(); ++axis) {
        const Index extent = m.shape[axis];
        if (extent < 0 || (axis > 0 && extent == 0)) {
            return InvalidArgument(where + ": shape " + JoinShape(m.shape) + " has extent " +
                                   std::to_string(extent) + " on axis " + std::to_string(axis) +
                                   " (axis 0 must be >= 0, other axes >= 1)");
        }
        if (__builtin_mul_overflow(size, static_cast<std::uint64_t>(extent), &size)) {
            return InvalidArgument(where + ": shape " + JoinShape(m.shape) +
                                   " overflows the byte size");
        }
    }
    if (m.bytes.size() != size) {
        return InvalidArgument(where + ": " + std::to_string(m.bytes.size()) +
                               " bytes given, shape " + JoinShape(m.shape) + " of " +
                               std::string(DTypeName(m.dtype)) + " needs " +
                               std::to_string(size));
    }
    return size;
}

}  // namespace internal

std::uint64_t MemberInfo::RowBytes() const {
    std::uint64_t row = DTypeSize(dtype);
    for (std::size_t axis = 1; axis < shape.size(); ++axis) {
        // Extents are validated non-negative by every store before a MemberInfo exists.
        row *= static_cast<std::uint64_t>(shape[axis]);
    }
    return row;
}

const MemberInfo* ObjectInfo::FindMember(std::string_view name) const {
    for (const MemberInfo& m : members) {
        if (m.name == name) return &m;
    }
    return nullptr;
}

}  // namespace mooncake::sparse
