// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Out-of-line helpers of the ObjectStore value types.
#include "store/object_store.h"

#include "transport/host_copy.h"
#include "transport/parallel_for.h"
#include "transport/pinned_pool.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

namespace {

/// ValidateMemberSpec of a member's fields (a MemberSpec or a MemberData). The error text is
/// made only for an error: every object of a commit passes here.
Result<std::uint64_t> ValidateMember(const std::string& name, DType dtype, const Shape& shape) {
    if (name.empty()) return InvalidArgument("member name is empty");
    if (name.size() > kMaxMemberNameBytes) {
        return InvalidArgument("member name is " + std::to_string(name.size()) +
                               " bytes, longer than the limit of " +
                               std::to_string(kMaxMemberNameBytes));
    }
    if (name.find('\0') != std::string::npos) {
        return InvalidArgument("member name contains a NUL byte");
    }
    const auto where = [&] { return "member " + Quote(name); };
    const auto dtype_value = static_cast<int>(dtype);
    if (dtype_value < 0 || dtype_value >= kNumDTypes || DTypeSize(dtype) == 0) {
        return InvalidArgument(where() + ": unknown dtype value " + std::to_string(dtype_value));
    }
    if (shape.empty()) return InvalidArgument(where() + ": shape has rank 0 (need rank >= 1)");
    std::uint64_t size = DTypeSize(dtype);
    for (std::size_t axis = 0; axis < shape.size(); ++axis) {
        const Index extent = shape[axis];
        if (extent < 0 || (axis > 0 && extent == 0)) {
            return InvalidArgument(where() + ": shape " + JoinShape(shape) + " has extent " +
                                   std::to_string(extent) + " on axis " + std::to_string(axis) +
                                   " (axis 0 must be >= 0, other axes >= 1)");
        }
        if (__builtin_mul_overflow(size, static_cast<std::uint64_t>(extent), &size)) {
            return InvalidArgument(where() + ": shape " + JoinShape(shape) +
                                   " overflows the byte size");
        }
    }
    return size;
}

}  // namespace

Result<std::uint64_t> ValidateMemberSpec(const MemberSpec& m) {
    return ValidateMember(m.name, m.dtype, m.shape);
}

Result<std::uint64_t> ValidateMemberData(const MemberData& m) {
    MCS_ASSIGN_OR_RETURN(const std::uint64_t size, ValidateMember(m.name, m.dtype, m.shape));
    if (m.bytes.size() != size) {
        return InvalidArgument("member " + Quote(m.name) + ": " + std::to_string(m.bytes.size()) +
                               " bytes given, shape " + JoinShape(m.shape) + " of " +
                               std::string(DTypeName(m.dtype)) + " needs " +
                               std::to_string(size));
    }
    return size;
}

void CopyRangeReads(std::span<const RangeRead> reads,
                    std::span<const std::span<const std::byte>> sources, std::uint64_t total,
                    int num_threads) {
    const unsigned threads =
        total < kParallelCopyBytes ? 1u : static_cast<unsigned>(ResolveThreads(num_threads));
    std::vector<HostCopy> copies;
    copies.reserve(reads.size());
    for (std::size_t i = 0; i < reads.size(); ++i) {
        if (!sources[i].empty()) {
            copies.push_back({reads[i].dst.data(), sources[i].data(), sources[i].size()});
        }
    }
    ParallelCopies(copies, threads);
}

}  // namespace internal

Result<RangeSlice> LocateRangeRead(const RangeRead& r, std::size_t index,
                                   const ObjectInfo& info) {
    const std::string where = "range read " + std::to_string(index) + " (object " +
                              Quote(r.key) + ", member " + Quote(r.member) + ")";
    const MemberInfo* m = info.FindMember(r.member);
    if (m == nullptr) return NotFound(where + ": no such member");
    const auto rows = static_cast<std::uint64_t>(m->shape.empty() ? 0 : m->shape[0]);
    if (r.row_start > r.row_end || r.row_end > rows) {
        return OutOfRange(where + ": rows [" + std::to_string(r.row_start) + ", " +
                          std::to_string(r.row_end) + ") are not within [0, " +
                          std::to_string(rows) + ")");
    }
    const std::uint64_t row_bytes = m->RowBytes();
    const std::uint64_t bytes = (r.row_end - r.row_start) * row_bytes;  // <= size_bytes
    if (r.dst.size() != bytes) {
        return InvalidArgument(where + ": rows [" + std::to_string(r.row_start) + ", " +
                               std::to_string(r.row_end) + ") are " + std::to_string(bytes) +
                               " bytes, destination is " + std::to_string(r.dst.size()));
    }
    return RangeSlice{static_cast<std::size_t>(m - info.members.data()), r.row_start * row_bytes,
                      bytes};
}

std::uint64_t MemberInfo::RowBytes() const {
    std::uint64_t row = DTypeSize(dtype);
    for (std::size_t axis = 1; axis < shape.size(); ++axis) {
        // Extents are validated non-negative by every store before a MemberInfo exists.
        row *= static_cast<std::uint64_t>(shape[axis]);
    }
    return row;
}

Status ObjectStore::PutFilled(std::span<const FilledPut> puts, const PutOptions& options,
                              const FillFn& fill, PinnedHostPool* host_pool) {
    // Staged: validate, allocate temporary buffers (pinned from `host_pool` when given, so a
    // device-to-host fill runs at the copy engine's speed), fill them, then Put each object.
    std::vector<std::vector<HostBuffer>> staged(puts.size());
    std::vector<std::vector<std::span<std::byte>>> spans(puts.size());
    std::vector<FillTarget> targets(puts.size());
    for (std::size_t i = 0; i < puts.size(); ++i) {
        MCS_RETURN_IF_ERROR(internal::ValidateObjectKey(puts[i].key));
        for (std::size_t j = 0; j < i; ++j) {
            if (puts[j].key == puts[i].key) {
                return InvalidArgument("key " + Quote(puts[i].key) + " appears more than once in one batch");
            }
        }
        bool pinned = true;
        for (const MemberSpec& m : puts[i].members) {
            MCS_ASSIGN_OR_RETURN(const std::uint64_t size, internal::ValidateMemberSpec(m));
            MCS_ASSIGN_OR_RETURN(HostBuffer buf, host_pool ? host_pool->Allocate(size)
                                                           : HostBuffer::Pageable(size));
            pinned &= buf.pinned() || size == 0;
            staged[i].push_back(std::move(buf));
        }
        for (auto& b : staged[i]) spans[i].emplace_back(b.data(), b.size());
        targets[i] = {i, spans[i], pinned && !staged[i].empty()};
    }
    if (options.mode == PutMode::kCreate) {
        for (const FilledPut& p : puts) {
            if (Stat(p.key).ok()) return Conflict("object " + Quote(p.key) + " already exists");
        }
    }
    MCS_RETURN_IF_ERROR(fill(targets));
    for (std::size_t i = 0; i < puts.size(); ++i) {
        std::vector<MemberData> members;
        for (std::size_t m = 0; m < puts[i].members.size(); ++m) {
            const MemberSpec& spec = puts[i].members[m];
            members.push_back({spec.name, spec.dtype, spec.shape,
                               {staged[i][m].data(), staged[i][m].size()}, spec.checksum});
        }
        MCS_RETURN_IF_ERROR(Put(puts[i].key, puts[i].metadata, members, options));
    }
    return Status::Ok();
}

Status ObjectStore::ViewObjects(std::span<const std::string_view> keys, const ViewFn& fn,
                                PinnedHostPool* host_pool) {
    std::vector<ObjectInfo> infos(keys.size());
    std::vector<std::vector<HostBuffer>> copies(keys.size());
    std::vector<std::vector<std::span<const std::byte>>> spans(keys.size());
    std::vector<ObjectView> views(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        MCS_ASSIGN_OR_RETURN(infos[i], Stat(keys[i]));
        bool pinned = true;
        for (const MemberInfo& m : infos[i].members) {
            MCS_ASSIGN_OR_RETURN(HostBuffer buf, host_pool ? host_pool->Allocate(m.size_bytes)
                                                           : HostBuffer::Pageable(m.size_bytes));
            MCS_RETURN_IF_ERROR(ReadMember(keys[i], m.name, {buf.data(), buf.size()}));
            pinned &= buf.pinned() || m.size_bytes == 0;
            copies[i].push_back(std::move(buf));
        }
        for (const auto& b : copies[i]) spans[i].emplace_back(b.data(), b.size());
        views[i] = {&infos[i], spans[i], pinned && !copies[i].empty()};
    }
    return fn(views);
}

const MemberInfo* ObjectInfo::FindMember(std::string_view name) const {
    for (const MemberInfo& m : members) {
        if (m.name == name) return &m;
    }
    return nullptr;
}

}  // namespace mooncake::sparse
