// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// ApplySparse: W[idx] = v or W[idx] += v on a host weight, in place.
//
// Two passes. The first validates every coordinate (so a bad object leaves the weight
// untouched) and turns it into a linear element offset, noting per block of entries the lowest
// and highest offset. The second writes. With several threads, thread t owns the element range
// [t * N / T, (t + 1) * N / T) of the weight and applies, in entry order, exactly the entries that
// land there: blocks whose offsets all fall in its range are applied without a test, blocks that
// miss it are skipped, the rest are tested per entry. So no two threads ever write one element,
// and repeated coordinates are applied in entry order whatever the thread count (scatter_add sums
// them, overwrite keeps the last) — the result is the same as a single-threaded apply.
//
// A strided weight (a view) is written in place: its element strides turn coordinates into
// offsets from its lowest-addressed element, and the threads split that address span instead
// of [0, N). The weight is never copied; a non-overlapping layout keeps "one element, one
// owner thread".

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/codec_internal.h"
#include "transport/host_copy.h"

namespace mooncake::sparse {
namespace {

using namespace codec_internal;  // NOLINT(google-build-using-namespace): internal helpers only.

constexpr std::uint64_t kBlock = 4096;  // entries per min/max block
constexpr std::uint64_t kMinParallelEntries = 1 << 16;
constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();

struct BlockRange {
    std::uint64_t min = kNone;
    std::uint64_t max = 0;
};

/// Validates entries [begin, end) and writes their linear offsets. Returns the first bad entry
/// or kNone. kRank 0: runtime rank.
template <typename IdxT, std::size_t kRank>
std::uint64_t ComputeOffsets(const std::byte* idx, std::size_t rank_rt,
                             const std::array<std::uint64_t, kMaxRank>& shape,
                             const std::array<std::uint64_t, kMaxRank>& stride, std::uint64_t base,
                             std::uint64_t begin, std::uint64_t end, std::uint64_t* offsets,
                             BlockRange* blocks) {
    const std::size_t rank = kRank ? kRank : rank_rt;
    for (std::uint64_t b0 = begin; b0 < end; b0 += kBlock) {
        const std::uint64_t b1 = std::min(end, b0 + kBlock);
        std::uint64_t lo = kNone, hi = 0;
        for (std::uint64_t i = b0; i < b1; ++i) {
            IdxT c[kRank ? kRank : kMaxRank];
            std::memcpy(c, idx + i * rank * sizeof(IdxT), rank * sizeof(IdxT));
            bool bad = false;
            // Negative strides wrap in uint64 arithmetic; base brings the sum back to >= 0.
            std::uint64_t off = base;
            for (std::size_t d = 0; d < rank; ++d) {
                bad |= c[d] >= shape[d];
                off += c[d] * stride[d];
            }
            if (bad) return i;
            offsets[i] = off;
            lo = std::min(lo, off);
            hi = std::max(hi, off);
        }
        blocks[b0 / kBlock] = {lo, hi};
    }
    return kNone;
}

template <typename IdxT>
std::string BadEntryMessage(const std::byte* idx, std::size_t rank, std::uint64_t i,
                            std::span<const Index> shape) {
    for (std::size_t d = 0; d < rank; ++d) {
        const IdxT c = LoadAs<IdxT>(idx + (i * rank + d) * sizeof(IdxT));
        if (static_cast<std::uint64_t>(c) >= static_cast<std::uint64_t>(shape[d])) {
            return "entry " + std::to_string(i) + " coordinate " + std::to_string(c) + " in dim " +
                   std::to_string(d) + " is outside the weight shape " + ShapeString(shape) +
                   " (nothing was written)";
        }
    }
    return "entry " + std::to_string(i) + " is outside the weight";
}

// Element ops: op(pointer to the weight element, pointer to the value).
template <std::size_t kE>
struct CopyOp {
    void operator()(std::byte* w, const std::byte* v) const { std::memcpy(w, v, kE); }
};
template <bool kBf16>
struct AddHalfOp {
    void operator()(std::byte* w, const std::byte* v) const {
        const auto a = LoadAs<std::uint16_t>(w), b = LoadAs<std::uint16_t>(v);
        const float s = kBf16 ? Bf16ToF32(a) + Bf16ToF32(b) : F16ToF32(a) + F16ToF32(b);
        StoreAs<std::uint16_t>(w, kBf16 ? F32ToBf16(s) : F32ToF16(s));
    }
};
template <typename F>
struct AddFloatOp {
    void operator()(std::byte* w, const std::byte* v) const {
        StoreAs<F>(w, LoadAs<F>(w) + LoadAs<F>(v));
    }
};
/// Integers wrap (two's complement), matching EncodeUpdate's wrapped deltas.
template <typename U>
struct AddIntOp {
    void operator()(std::byte* w, const std::byte* v) const {
        StoreAs<U>(w, static_cast<U>(LoadAs<U>(w) + LoadAs<U>(v)));
    }
};

template <std::size_t kE, typename Op>
void ApplyWith(std::byte* weight, const std::byte* values, const std::uint64_t* offsets,
               const BlockRange* blocks, std::uint64_t nnz, std::uint64_t num_elements, int threads,
               const Op& op) {
    if (threads <= 1) {
        for (std::uint64_t i = 0; i < nnz; ++i) op(weight + offsets[i] * kE, values + i * kE);
        return;
    }
    const Split owner{num_elements, static_cast<std::uint64_t>(threads)};
    const std::uint64_t num_blocks = (nnz + kBlock - 1) / kBlock;
    ParallelFor(threads, static_cast<std::size_t>(threads), [&](std::size_t t) {
        const std::uint64_t lo = owner.Begin(t), hi = owner.Begin(t + 1);
        for (std::uint64_t b = 0; b < num_blocks; ++b) {
            const BlockRange& r = blocks[b];
            if (r.max < lo || r.min >= hi) continue;
            const std::uint64_t i0 = b * kBlock, i1 = std::min(nnz, i0 + kBlock);
            if (r.min >= lo && r.max < hi) {
                for (std::uint64_t i = i0; i < i1; ++i)
                    op(weight + offsets[i] * kE, values + i * kE);
            } else {
                for (std::uint64_t i = i0; i < i1; ++i) {
                    const std::uint64_t off = offsets[i];
                    if (off >= lo && off < hi) op(weight + off * kE, values + i * kE);
                }
            }
        }
    });
}

Status CheckBytes(const char* what, DType dtype, std::span<const Index> shape, std::size_t size) {
    std::uint64_t expected = 0;
    if (!CheckedProduct(shape, DTypeSize(dtype), &expected) || expected != size) {
        return InvalidArgument(std::string(what) + " holds " + std::to_string(size) +
                               " bytes, but its shape " + ShapeString(shape) + " of " +
                               std::string(DTypeName(dtype)) + " needs " +
                               (expected ? std::to_string(expected) : std::string("more")));
    }
    return Status::Ok();
}

}  // namespace

Status ApplySparse(const MutableHostArray& weight, const HostArray& indices,
                   const HostArray& values, ApplyMode apply, int num_threads) {
    if (Status s = ValidateShape(weight.shape); !s.ok()) return s.WithContext("weight");
    const std::size_t rank = weight.shape.size();
    const DType dtype = weight.dtype;
    if (!IsNumericDType(dtype)) {
        return InvalidArgument("weight dtype " + std::string(DTypeName(dtype)) + " is not numeric");
    }
    const bool strided = !IsCContiguous(weight.shape, weight.strides);
    std::int64_t lowest = 0;  // element offset of the lowest-addressed element (<= 0)
    if (!strided) {
        MCS_RETURN_IF_ERROR(CheckBytes("weight", dtype, weight.shape, weight.data.size()));
    } else {
        if (weight.strides.size() != rank) {
            return InvalidArgument("weight has " + std::to_string(weight.strides.size()) +
                                   " strides for rank " + std::to_string(rank));
        }
        if (!IsNonOverlapping(weight.shape, weight.strides)) {
            return InvalidArgument("weight elements overlap (a broadcast or expanded view): "
                                   "apply would write one element through several coordinates");
        }
        const auto [lo, hi] = StridedExtent(weight.shape, weight.strides);
        const auto span = static_cast<std::uint64_t>(hi - lo + 1) * DTypeSize(dtype);
        if (weight.data.size() != span) {
            return InvalidArgument("strided weight holds " + std::to_string(weight.data.size()) +
                                   " bytes, its shape " + ShapeString(weight.shape) +
                                   " and strides span " + std::to_string(span));
        }
        lowest = lo;
    }
    // An update with no entries (a tensor a sealed step left unchanged) applies to a weight of
    // any dtype: there is nothing to convert.
    const bool no_entries = values.shape.size() == 1 && values.shape[0] == 0;
    if (values.dtype != dtype && !no_entries) {
        return InvalidArgument("values dtype " + std::string(DTypeName(values.dtype)) +
                               " != weight dtype " + std::string(DTypeName(dtype)));
    }
    if (!IsUnsignedIndexDType(indices.dtype)) {
        return InvalidArgument("indices dtype " + std::string(DTypeName(indices.dtype)) +
                               " is not uint16, uint32 or uint64");
    }
    const bool flat_1d = indices.shape.size() == 1 && rank == 1;
    if (!flat_1d && (indices.shape.size() != 2 || indices.shape[1] != static_cast<Index>(rank))) {
        return InvalidArgument("indices shape " + ShapeString(indices.shape) + " is not [nnz, " +
                               std::to_string(rank) + "] for a rank-" + std::to_string(rank) +
                               " weight");
    }
    if (indices.shape[0] < 0) return InvalidArgument("indices shape has a negative extent");
    MCS_RETURN_IF_ERROR(CheckBytes("indices", indices.dtype, indices.shape, indices.data.size()));
    const auto nnz = static_cast<std::uint64_t>(indices.shape[0]);
    if (values.shape.size() != 1 || values.shape[0] != static_cast<Index>(nnz)) {
        return InvalidArgument("values shape " + ShapeString(values.shape) + " is not [" +
                               std::to_string(nnz) + "]");
    }
    MCS_RETURN_IF_ERROR(CheckBytes("values", values.dtype, values.shape, values.data.size()));
    if (apply == ApplyMode::kScatterAdd && !SupportsAdd(dtype)) {
        return InvalidArgument("scatter_add is not supported for " + std::string(DTypeName(dtype)) +
                               " weights");
    }
    if (num_threads < 0) {
        return InvalidArgument("num_threads " + std::to_string(num_threads) +
                               " is negative (0 means all hardware threads)");
    }
    if (nnz == 0) return Status::Ok();

    std::array<std::uint64_t, kMaxRank> shape{}, stride{};
    for (std::size_t d = 0; d < rank; ++d) shape[d] = static_cast<std::uint64_t>(weight.shape[d]);
    std::uint64_t s = 1;
    for (std::size_t d = rank; d-- > 0;) {
        stride[d] = strided ? static_cast<std::uint64_t>(weight.strides[d]) : s;
        s *= shape[d];
    }
    const std::uint64_t base = static_cast<std::uint64_t>(-lowest);
    // Offsets, and the range the threads split, run over the weight's address span.
    const std::uint64_t num_elements = strided ? weight.data.size() / DTypeSize(dtype) : s;

    // Pass 1: validate + offsets, in parallel over contiguous groups of blocks.
    const int threads = nnz >= kMinParallelEntries
                            ? static_cast<int>(std::min<std::uint64_t>(
                                  static_cast<std::uint64_t>(ResolveThreads(num_threads)),
                                  nnz / (kMinParallelEntries / 4)))
                            : 1;
    const std::uint64_t num_blocks = (nnz + kBlock - 1) / kBlock;
    std::vector<std::uint64_t> offsets(nnz);
    std::vector<BlockRange> blocks(num_blocks);
    const Split split{num_blocks, static_cast<std::uint64_t>(threads)};
    std::vector<std::uint64_t> first_bad(static_cast<std::size_t>(threads), kNone);
    bool dispatched = VisitUnsignedIndexDType(indices.dtype, [&](auto tag) {
        using IdxT = decltype(tag);
        ParallelFor(threads, static_cast<std::size_t>(threads), [&](std::size_t t) {
            const std::uint64_t b = split.Begin(t) * kBlock;
            const std::uint64_t e = std::min(nnz, split.Begin(t + 1) * kBlock);
            first_bad[t] = rank == 2
                               ? ComputeOffsets<IdxT, 2>(indices.data.data(), rank, shape, stride,
                                                         base, b, e, offsets.data(),
                                                         blocks.data())
                               : ComputeOffsets<IdxT, 0>(indices.data.data(), rank, shape, stride,
                                                         base, b, e, offsets.data(),
                                                         blocks.data());
        });
        for (std::uint64_t bad : first_bad) {
            if (bad != kNone) {
                first_bad[0] = bad;
                break;
            }
        }
    });
    if (!dispatched) return Internal("unhandled index dtype");
    if (first_bad[0] != kNone) {
        std::string msg;
        VisitUnsignedIndexDType(indices.dtype, [&](auto tag) {
            msg = BadEntryMessage<decltype(tag)>(indices.data.data(), rank, first_bad[0],
                                                 weight.shape);
        });
        return InvalidArgument(msg);
    }

    // Pass 2: write.
    std::byte* w = weight.data.data();
    const std::byte* v = values.data.data();
    const std::uint64_t* off = offsets.data();
    const BlockRange* blk = blocks.data();
    if (apply == ApplyMode::kOverwrite) {
        VisitElementSize(DTypeSize(dtype), [&](auto size_tag) {
            constexpr std::size_t kE = decltype(size_tag)::value;
            ApplyWith<kE>(w, v, off, blk, nnz, num_elements, threads, CopyOp<kE>{});
        });
        return Status::Ok();
    }
    switch (dtype) {
        case DType::kBFloat16:
            ApplyWith<2>(w, v, off, blk, nnz, num_elements, threads, AddHalfOp<true>{});
            break;
        case DType::kFloat16:
            ApplyWith<2>(w, v, off, blk, nnz, num_elements, threads, AddHalfOp<false>{});
            break;
        case DType::kFloat32:
            ApplyWith<4>(w, v, off, blk, nnz, num_elements, threads, AddFloatOp<float>{});
            break;
        case DType::kFloat64:
            ApplyWith<8>(w, v, off, blk, nnz, num_elements, threads, AddFloatOp<double>{});
            break;
        default:
            VisitElementSize(DTypeSize(dtype), [&](auto size_tag) {
                constexpr std::size_t kE = decltype(size_tag)::value;
                ApplyWith<kE>(w, v, off, blk, nnz, num_elements, threads,
                              AddIntOp<UIntOfSize<kE>>{});
            });
            break;
    }
    return Status::Ok();
}

std::vector<Status> ApplySparseBatch(std::span<const ApplyItem> items, int num_threads) {
    std::vector<Status> out(items.size());
    if (num_threads < 0) {
        out.assign(items.size(), InvalidArgument("num_threads " + std::to_string(num_threads) +
                                                 " is negative (0 means all hardware threads)"));
        return out;
    }
    // Items whose weight spans overlap another's go one after another, in batch order.
    std::vector<std::size_t> by_address(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) by_address[i] = i;
    const auto lo = [&](std::size_t i) { return items[i].weight.data.data(); };
    const auto hi = [&](std::size_t i) { return lo(i) + items[i].weight.data.size(); };
    std::sort(by_address.begin(), by_address.end(),
              [&](std::size_t a, std::size_t b) { return lo(a) < lo(b); });
    std::vector<bool> shared(items.size(), false);
    const std::byte* reach = nullptr;  // the highest end so far
    std::size_t reach_item = 0;
    for (std::size_t k = 0; k < by_address.size(); ++k) {
        const std::size_t i = by_address[k];
        if (items[i].weight.data.empty()) continue;
        if (reach != nullptr && lo(i) < reach) shared[i] = shared[reach_item] = true;
        if (reach == nullptr || hi(i) > reach) {
            reach = hi(i);
            reach_item = i;
        }
    }
    std::vector<std::size_t> small, one_by_one;
    for (std::size_t i = 0; i < items.size(); ++i) {
        const std::uint64_t nnz = items[i].values.shape.empty() ? 0 : items[i].values.shape[0];
        (shared[i] || nnz >= kMinParallelEntries ? one_by_one : small).push_back(i);
    }
    ParallelFor(num_threads, small.size(), [&](std::size_t k) {
        const ApplyItem& it = items[small[k]];
        out[small[k]] = ApplySparse(it.weight, it.indices, it.values, it.apply, 1);
    }, 0);
    for (std::size_t i : one_by_one) {
        const ApplyItem& it = items[i];
        out[i] = ApplySparse(it.weight, it.indices, it.values, it.apply, num_threads);
    }
    return out;
}

}  // namespace mooncake::sparse
