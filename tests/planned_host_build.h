// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// A PlannedReadFn that builds a planned read's targets on the host (codec FilterRebaseInto over
// the pieces), the reference the tests hold planned reads to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/codec.h"
#include "executor/sparse_service.h"

namespace mooncake::sparse::testing {

/// A PlannedReadFn that builds every target on the host, as the device read does on the GPU:
/// each piece filtered and rebased into the target's buffers, in piece order.
struct HostBuild {
    /// Each target's entries, after the call.
    std::vector<std::vector<std::byte>> indices, values;
    int calls = 0;

    Status operator()(PlannedRead& read) {
        ++calls;
        indices.assign(read.targets.size(), {});
        values.assign(read.targets.size(), {});
        for (std::size_t t = 0; t < read.targets.size(); ++t) {
            const PlannedRead::Target& pt = read.per_target[t];
            const TargetDescriptor& target = read.targets[t];
            const std::size_t rank = target.box.rank();
            const std::size_t osz = DTypeSize(pt.index_dtype) * rank;
            const std::size_t vsz = DTypeSize(pt.value_dtype);
            std::vector<std::byte>& idx = indices[t];
            std::vector<std::byte>& val = values[t];
            idx.resize(pt.capacity * osz);
            val.resize(pt.capacity * vsz);
            std::uint64_t kept = 0;
            for (std::size_t k = pt.first_piece; k < pt.end_piece; ++k) {
                const PlannedRead::Piece& p = read.pieces[k];
                const PlannedRead::Range& r = read.ranges[p.range];
                const SourceDescriptor& s = read.manifest[r.source];
                const std::size_t isz = DTypeSize(s.index_dtype) * rank;
                kept += FilterRebaseInto(r.indices.subspan(p.begin * isz, p.count * isz),
                                         r.values.subspan(p.begin * vsz, p.count * vsz), p.count,
                                         rank, s.index_dtype, vsz, p.overlap, p.filter,
                                         target.box.origin(), pt.index_dtype,
                                         std::span(idx).subspan(kept * osz),
                                         std::span(val).subspan(kept * vsz));
            }
            idx.resize(kept * osz);
            val.resize(kept * vsz);
            read.kept[t] = kept;
        }
        return Status::Ok();
    }
};

}  // namespace mooncake::sparse::testing
