// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/pitched_copy.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "transport/host_copy.h"

namespace mooncake::sparse {
namespace {

struct Dim {
    std::int64_t extent;
    std::int64_t dst;  // element strides
    std::int64_t src;
};

bool MulOverflows(std::int64_t a, std::int64_t b, std::int64_t& out) {
    return __builtin_mul_overflow(a, b, &out);
}

}  // namespace

namespace {

/// The byte offsets of every element of `shape` laid out by `strides` fit in 2^63.
bool ReachFits(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides,
               std::int64_t bytes) {
    std::int64_t lo = 0, hi = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        std::int64_t reach = 0;
        if (MulOverflows(strides[d], shape[d] - 1, reach) || MulOverflows(reach, bytes, reach) ||
            __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi)) {
            return false;
        }
    }
    return true;
}

std::vector<std::int64_t> CStrides(std::span<const std::int64_t> shape) {
    std::vector<std::int64_t> strides(shape.size());
    std::int64_t s = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
        strides[d] = s;
        s *= shape[d];
    }
    return strides;
}

}  // namespace

Result<PitchedCopyPlan> PlanPitchedCopies(std::span<const std::int64_t> shape,
                                          std::span<const std::int64_t> dst_strides,
                                          std::size_t item, std::size_t max_copies) {
    return PlanStridedCopies(shape, dst_strides, {}, item, max_copies);
}

Result<PitchedCopyPlan> PlanStridedCopies(std::span<const std::int64_t> shape,
                                          std::span<const std::int64_t> dst_strides,
                                          std::span<const std::int64_t> src_strides,
                                          std::size_t item, std::size_t max_copies) {
    PitchedCopyPlan plan;
    if (item == 0) return InvalidArgument("element size 0");
    if (!dst_strides.empty() && dst_strides.size() != shape.size()) {
        return InvalidArgument(std::to_string(dst_strides.size()) + " strides for rank " +
                               std::to_string(shape.size()));
    }
    if (!src_strides.empty() && src_strides.size() != shape.size()) {
        return InvalidArgument(std::to_string(src_strides.size()) + " source strides for rank " +
                               std::to_string(shape.size()));
    }
    std::int64_t elements = 1;
    for (std::int64_t e : shape) {
        if (e < 0) return InvalidArgument("negative extent");
        if (MulOverflows(elements, e, elements)) return InvalidArgument("element count overflows");
    }
    if (elements == 0) return plan;
    const auto bytes = static_cast<std::int64_t>(item);
    std::int64_t total_bytes = 0;
    if (MulOverflows(elements, bytes, total_bytes)) return InvalidArgument("byte size overflows");
    const bool dst_contiguous = IsCContiguous(shape, dst_strides);
    const bool src_contiguous = IsCContiguous(shape, src_strides);
    if (dst_contiguous && src_contiguous) {
        plan.copies.push_back({0, 0, std::uint64_t(total_bytes), 1, 0, 0});
        return plan;
    }
    // Byte offsets of every element must be representable before anything else looks at the
    // strides (they may come from another process).
    const std::vector<std::int64_t> c_strides = CStrides(shape);
    if (dst_strides.empty()) dst_strides = c_strides;
    if (src_strides.empty()) src_strides = c_strides;
    if (!ReachFits(shape, dst_strides, bytes)) {
        return InvalidArgument("strides reach beyond 2^63 bytes");
    }
    if (!ReachFits(shape, src_strides, bytes)) {
        return InvalidArgument("source strides reach beyond 2^63 bytes");
    }
    if (!IsNonOverlapping(shape, dst_strides)) {
        return InvalidArgument("the destination view has overlapping elements");
    }
    // Extent-1 dimensions dropped, negative destination strides flipped: element [0..0] moves
    // to the lowest address and the source is then walked backwards along that dimension
    // (which only a gather can do).
    std::vector<Dim> dims;
    std::int64_t dst_base = 0, src_base = 0;
    for (std::size_t d = shape.size(); d-- > 0;) {
        if (shape[d] != 1) {
            Dim dim{shape[d], dst_strides[d], src_strides[d]};
            if (dim.dst < 0) {
                dst_base += dim.dst * (dim.extent - 1);
                src_base += dim.src * (dim.extent - 1);
                dim.dst = -dim.dst;
                dim.src = -dim.src;
            }
            dims.push_back(dim);
        }
    }
    // Memory order of the destination, outermost first.
    std::stable_sort(dims.begin(), dims.end(),
                     [](const Dim& a, const Dim& b) { return a.dst > b.dst; });
    // The copies walk both sides in the destination's memory order: a source whose strides run
    // the other way (or backwards) is gathered first. So is one whose innermost run is shorter
    // than the destination's (a contiguous destination row would be copied element by element);
    // a box of a larger tensor (rows `stored_shape[-1]` elements apart) keeps its own rows.
    for (std::size_t i = 0; i < dims.size(); ++i) {
        if (dims[i].src <= 0 || (i > 0 && dims[i].src >= dims[i - 1].src)) plan.gather = true;
    }
    if (!dims.empty() && dims.back().dst == 1 && dims.back().src != 1) plan.gather = true;
    if (!plan.gather) {
        // No source element may lie between two it reads as one run or row (a box's strides
        // are those of its parent, so each stride spans the ones below it).
        for (std::size_t i = dims.size(); i-- > 1;) {
            if (dims[i - 1].src < dims[i].src * dims[i].extent) plan.gather = true;
        }
    }
    if (plan.gather) {
        for (const Dim& dim : dims) {
            plan.gather_shape.push_back(dim.extent);
            plan.gather_strides.push_back(dim.src);
        }
        plan.gather_src_offset = src_base * bytes;
        std::int64_t s = 1;
        for (std::size_t i = dims.size(); i-- > 0;) {
            dims[i].src = s;
            s *= dims[i].extent;
        }
    }
    // Merge neighbours contiguous on both sides: a slice of whole rows is one dimension.
    std::vector<Dim> merged;  // innermost first
    for (std::size_t i = dims.size(); i-- > 0;) {
        if (!merged.empty()) {
            Dim& inner = merged.back();
            if (dims[i].dst == inner.dst * inner.extent && dims[i].src == inner.src * inner.extent) {
                inner.extent *= dims[i].extent;
                continue;
            }
        }
        merged.push_back(dims[i]);
    }
    std::reverse(merged.begin(), merged.end());  // outermost first again
    std::uint64_t width = std::uint64_t(bytes);
    if (merged.back().dst == 1) {  // src is 1 too: the source is C-ordered by now
        width = std::uint64_t(merged.back().extent * bytes);
        merged.pop_back();
    }
    // The 2-D copy's rows: the dimension with the most of them whose pitches the copy engine
    // takes (ties: the innermost, for locality); none: every run is its own copy.
    std::size_t rows = merged.size();
    for (std::size_t i = 0; i < merged.size(); ++i) {
        const auto dp = std::uint64_t(merged[i].dst * bytes), sp = std::uint64_t(merged[i].src * bytes);
        if (dp > kMaxCopyPitch || sp > kMaxCopyPitch) continue;
        if (rows == merged.size() || merged[i].extent >= merged[rows].extent) rows = i;
    }
    PitchedCopy proto{dst_base * bytes, 0, width, 1, width, width};
    std::vector<Dim> outer;
    for (std::size_t i = 0; i < merged.size(); ++i) {
        if (i == rows) {
            proto.height = std::uint64_t(merged[i].extent);
            proto.dst_pitch = std::uint64_t(merged[i].dst * bytes);
            proto.src_pitch = std::uint64_t(merged[i].src * bytes);
        } else {
            outer.push_back(merged[i]);
        }
    }
    std::uint64_t count = 1;
    for (const Dim& dim : outer) {
        count *= std::uint64_t(dim.extent);
        if (count > max_copies) {
            return InvalidArgument("the destination view needs more than " +
                                   std::to_string(max_copies) +
                                   " 2-D copies; pass a contiguous tensor (or a view with "
                                   "fewer non-mergeable dimensions)");
        }
    }
    plan.copies.reserve(count);
    std::vector<std::int64_t> counter(outer.size(), 0);
    while (true) {
        PitchedCopy c = proto;
        for (std::size_t k = 0; k < outer.size(); ++k) {
            c.dst_offset += counter[k] * outer[k].dst * bytes;
            c.src_offset += std::uint64_t(counter[k] * outer[k].src * bytes);
        }
        plan.copies.push_back(c);
        std::size_t k = outer.size();
        while (k-- > 0) {
            if (++counter[k] < outer[k].extent) break;
            counter[k] = 0;
        }
        if (k == std::size_t(-1)) break;
    }
    return plan;
}

Result<ViewSpan> StridedViewSpan(std::span<const std::int64_t> shape,
                                 std::span<const std::int64_t> strides, std::size_t item) {
    if (!strides.empty() && strides.size() != shape.size()) {
        return InvalidArgument(std::to_string(strides.size()) + " strides for rank " +
                               std::to_string(shape.size()));
    }
    const auto bytes = static_cast<std::int64_t>(item);
    std::int64_t elements = 1;
    for (std::int64_t e : shape) {
        if (e < 0) return InvalidArgument("negative extent");
        if (MulOverflows(elements, e, elements)) return InvalidArgument("element count overflows");
    }
    if (elements == 0) return ViewSpan{};
    std::int64_t total = 0;
    if (strides.empty()) {
        if (MulOverflows(elements, bytes, total)) return InvalidArgument("byte size overflows");
        return ViewSpan{0, std::uint64_t(total)};
    }
    std::int64_t lo = 0, hi = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        std::int64_t reach = 0;
        if (MulOverflows(strides[d], shape[d] - 1, reach) || MulOverflows(reach, bytes, reach) ||
            __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi)) {
            return InvalidArgument("strides reach beyond 2^63 bytes");
        }
    }
    std::int64_t span = 0;
    if (__builtin_sub_overflow(hi, lo, &span) || __builtin_add_overflow(span, bytes, &span)) {
        return InvalidArgument("strides reach beyond 2^63 bytes");
    }
    return ViewSpan{lo, std::uint64_t(span)};
}

void RunPitchedCopiesOnHost(const PitchedCopyPlan& plan, std::byte* dst, const std::byte* src) {
    for (const PitchedCopy& c : plan.copies) {
        for (std::uint64_t r = 0; r < c.height; ++r) {
            std::memcpy(dst + c.dst_offset + std::int64_t(r * c.dst_pitch),
                        src + c.src_offset + r * c.src_pitch, c.width);
        }
    }
}

}  // namespace mooncake::sparse
