// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The small pieces of the codec: default tile shapes, checksums, the tile index of an already
// sorted object, boundary filtering + rebasing of range reads, and the 16-bit float conversions.
// BuildSparseObject is in build.cc, EncodeUpdate in encode.cc, ApplySparse in apply.cc.

#include "codec/codec.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cstring>
#include <limits>
#include <string>

#include "codec/codec_internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mooncake::sparse {

using codec_internal::LoadAs;
using codec_internal::StoreAs;

#if defined(MOONCAKE_SPARSE_CHECKSUM_AVX2)
namespace codec_internal {
std::uint64_t ChecksumAvx2(const void* data, std::size_t size);  // checksum_avx2.cc
}  // namespace codec_internal
#endif

std::uint64_t Checksum(std::span<const std::byte> bytes) {
#if defined(MOONCAKE_SPARSE_CHECKSUM_AVX2)
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return codec_internal::ChecksumAvx2(bytes.data(), bytes.size());
#endif
    return XXH3_64bits(bytes.data(), bytes.size());
}

void UpdateChecksums(SparseObject& object) {
    object.checksum_indices = Checksum(object.indices);
    object.checksum_values = Checksum(object.values);
    object.checksum_tile_coords = Checksum(std::as_bytes(std::span(object.tile_coords)));
    object.checksum_tile_ptr = Checksum(std::as_bytes(std::span(object.tile_ptr)));
}

float BFloat16ToFloat(std::uint16_t v) { return codec_internal::Bf16ToF32(v); }
std::uint16_t FloatToBFloat16(float v) { return codec_internal::F32ToBf16(v); }
float Float16ToFloat(std::uint16_t v) { return codec_internal::F16ToF32(v); }
std::uint16_t FloatToFloat16(float v) { return codec_internal::F32ToF16(v); }

// ---------------------------------------------------------------------------------------------
// BuildTileIndex
// ---------------------------------------------------------------------------------------------
namespace {

template <typename IdxT>
Status BuildTileIndexTyped(SparseObject& object) {
    const SourceDescriptor& desc = object.desc;
    const std::size_t rank = desc.rank();
    const std::uint64_t nnz = desc.nnz;
    const auto* idx = reinterpret_cast<const std::byte*>(object.indices.data());

    std::array<std::uint64_t, kMaxRank> ts{};
    std::array<int, kMaxRank> shift{};  // >= 0: tile extent is 1 << shift.
    for (std::size_t d = 0; d < rank; ++d) {
        ts[d] = static_cast<std::uint64_t>(desc.tile_shape[d]);
        shift[d] = std::has_single_bit(ts[d]) ? std::countr_zero(ts[d]) : -1;
    }
    std::vector<TileCoord> coords;
    std::vector<std::uint64_t> ptr;
    ptr.push_back(0);
    std::array<std::uint64_t, kMaxRank> prev_tile{}, tile{}, prev{}, cur{};
    for (std::uint64_t i = 0; i < nnz; ++i) {
        const std::byte* e = idx + i * rank * sizeof(IdxT);
        for (std::size_t d = 0; d < rank; ++d) {
            cur[d] = LoadAs<IdxT>(e + d * sizeof(IdxT));
            tile[d] = shift[d] >= 0 ? cur[d] >> shift[d] : cur[d] / ts[d];
        }
        bool new_tile = i == 0;
        if (i > 0) {
            int cmp = 0;
            for (std::size_t d = 0; d < rank && cmp == 0; ++d) {
                if (tile[d] != prev_tile[d]) cmp = tile[d] < prev_tile[d] ? -1 : 1;
            }
            if (cmp == 0) {
                for (std::size_t d = 0; d < rank && cmp == 0; ++d) {
                    if (cur[d] != prev[d]) cmp = cur[d] < prev[d] ? -1 : 1;
                }
                if (cmp <= 0) {
                    return InvalidArgument(
                        "entries are not sorted by (tile, element): entry " + std::to_string(i) +
                        (cmp == 0 ? " repeats the coordinate of entry " + std::to_string(i - 1)
                                  : " precedes entry " + std::to_string(i - 1)));
                }
            } else if (cmp < 0) {
                return InvalidArgument(
                    "entries are not sorted by (tile, element): the tile of "
                    "entry " +
                    std::to_string(i) + " precedes that of entry " + std::to_string(i - 1));
            } else {
                new_tile = true;
            }
        }
        if (new_tile) {
            if (i > 0) ptr.push_back(i);
            for (std::size_t d = 0; d < rank; ++d) {
                if (tile[d] > std::numeric_limits<TileCoord>::max()) {
                    return InvalidArgument("entry " + std::to_string(i) + " lies in tile " +
                                           std::to_string(tile[d]) + " of dim " +
                                           std::to_string(d) + ", beyond 2^32-1");
                }
                coords.push_back(static_cast<TileCoord>(tile[d]));
            }
            prev_tile = tile;
        }
        prev = cur;
    }
    if (nnz > 0) ptr.push_back(nnz);
    object.tile_coords = std::move(coords);
    object.tile_ptr = std::move(ptr);
    object.desc.num_tiles = object.tile_ptr.size() - 1;
    return Status::Ok();
}

}  // namespace

Status BuildTileIndex(SparseObject& object) {
    const SourceDescriptor& desc = object.desc;
    const std::size_t rank = desc.rank();
    if (rank == 0 || rank > kMaxRank) {
        return InvalidArgument("object rank " + std::to_string(rank) + " is outside [1, 8]");
    }
    if (desc.tile_shape.size() != rank ||
        std::any_of(desc.tile_shape.begin(), desc.tile_shape.end(),
                    [](Index t) { return t < 1; })) {
        return InvalidArgument("object tile_shape " + codec_internal::ShapeString(desc.tile_shape) +
                               " does not fit rank " + std::to_string(rank));
    }
    if (!IsUnsignedIndexDType(desc.index_dtype)) {
        return InvalidArgument("object index_dtype " + std::string(DTypeName(desc.index_dtype)) +
                               " is not unsigned");
    }
    const std::uint64_t entry_bytes = rank * DTypeSize(desc.index_dtype);
    if (desc.nnz > object.indices.size() / entry_bytes ||
        desc.nnz * entry_bytes != object.indices.size()) {
        return InvalidArgument("object indices hold " + std::to_string(object.indices.size()) +
                               " bytes, expected nnz " + std::to_string(desc.nnz) + " x " +
                               std::to_string(entry_bytes));
    }
    Status status;
    codec_internal::VisitUnsignedIndexDType(
        desc.index_dtype, [&](auto tag) { status = BuildTileIndexTyped<decltype(tag)>(object); });
    return status;
}

// ---------------------------------------------------------------------------------------------
// FilterRebase
// ---------------------------------------------------------------------------------------------
namespace {

/// kRank 0: any rank (runtime `rank`); kValueBytes 0: any value size (runtime `value_bytes`).
template <typename InT, typename OutT, std::size_t kRank, std::size_t kValueBytes>
std::uint64_t FilterRebaseTyped(const std::byte* in_idx, const std::byte* in_val,
                                std::uint64_t count, std::size_t rank_rt,
                                std::size_t value_bytes_rt, const Box& overlap, bool filter,
                                std::span<const Index> origin, std::byte* out_idx,
                                std::byte* out_val) {
    const std::size_t rank = kRank ? kRank : rank_rt;
    const std::size_t vb = kValueBytes ? kValueBytes : value_bytes_rt;
    std::array<std::uint64_t, kMaxRank> lo{}, ext{}, org{};
    for (std::size_t d = 0; d < rank; ++d) {
        lo[d] = static_cast<std::uint64_t>(overlap.begin(d));
        ext[d] = static_cast<std::uint64_t>(overlap.shape()[d]);
        org[d] = static_cast<std::uint64_t>(origin[d]);
    }
    if (!filter) {
        // Every entry is kept: values move as one block, and the rebase is a loop without a
        // data-dependent store position, which the compiler vectorizes.
        std::memcpy(out_val, in_val, count * vb);
        if constexpr (kRank != 0) {
            // Every kept coordinate is >= the origin and its difference fits OutT, so the
            // subtraction is exact in OutT arithmetic: lanes as narrow as the output vectorize
            // best.
            std::array<OutT, kRank> o{};
            for (std::size_t d = 0; d < kRank; ++d) o[d] = static_cast<OutT>(org[d]);
            bool zero = true;
            for (std::size_t d = 0; d < kRank; ++d) zero &= org[d] == 0;
            if (zero && sizeof(InT) == sizeof(OutT)) {
                std::memcpy(out_idx, in_idx, count * kRank * sizeof(InT));
                return count;
            }
            // Blocks of kBlock entries through local arrays, against the origin repeated per
            // entry: fixed-size loops the compiler turns into vector subtractions (an
            // entry-by-entry loop stays scalar, one entry per iteration).
            constexpr std::size_t kBlock = 64;
            constexpr std::size_t kLanes = kBlock * kRank;
            std::array<OutT, kLanes> pattern{};
            for (std::size_t j = 0; j < kLanes; ++j) pattern[j] = o[j % kRank];
            std::uint64_t i = 0;
            for (; i + kBlock <= count; i += kBlock) {
                InT c[kLanes];
                OutT r[kLanes];
                std::memcpy(c, in_idx + i * kRank * sizeof(InT), sizeof(c));
                for (std::size_t j = 0; j < kLanes; ++j) {
                    r[j] = static_cast<OutT>(static_cast<OutT>(c[j]) - pattern[j]);
                }
                std::memcpy(out_idx + i * kRank * sizeof(OutT), r, sizeof(r));
            }
            for (; i < count; ++i) {
                InT c[kRank];
                OutT r[kRank];
                std::memcpy(c, in_idx + i * kRank * sizeof(InT), sizeof(c));
                for (std::size_t d = 0; d < kRank; ++d) {
                    r[d] = static_cast<OutT>(static_cast<OutT>(c[d]) - o[d]);
                }
                std::memcpy(out_idx + i * kRank * sizeof(OutT), r, sizeof(r));
            }
            return count;
        }
    }
    std::uint64_t kept = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
        InT c[kRank ? kRank : kMaxRank];
        std::memcpy(c, in_idx + i * rank * sizeof(InT), rank * sizeof(InT));
        bool keep = true;
        if (filter) {
            // Unsigned wrap-around turns lo <= c < lo + ext into one compare per dim.
            for (std::size_t d = 0; d < rank; ++d) keep &= (std::uint64_t{c[d]} - lo[d]) < ext[d];
        }
        // Branch-free: always write at `kept`, advance only when the entry is kept.
        OutT o[kRank ? kRank : kMaxRank];
        for (std::size_t d = 0; d < rank; ++d)
            o[d] = static_cast<OutT>(std::uint64_t{c[d]} - org[d]);
        std::memcpy(out_idx + kept * rank * sizeof(OutT), o, rank * sizeof(OutT));
        std::memcpy(out_val + kept * vb, in_val + i * vb, vb);
        kept += keep ? 1 : 0;
    }
    return kept;
}

/// The entries FilterRebase* may read: `count`, bounded by what the inputs hold; 0 for
/// arguments no caller should pass (asserted in debug builds).
std::uint64_t ReadableEntries(std::span<const std::byte> in_indices,
                              std::span<const std::byte> in_values, std::uint64_t count,
                              std::size_t rank, DType in_index_dtype, std::size_t value_bytes,
                              const Box& overlap, bool filter, std::span<const Index> origin,
                              DType out_index_dtype) {
    const bool valid = rank >= 1 && rank <= kMaxRank && value_bytes >= 1 &&
                       IsUnsignedIndexDType(in_index_dtype) &&
                       IsUnsignedIndexDType(out_index_dtype) && origin.size() >= rank &&
                       (!filter || overlap.rank() == rank);
    assert(valid && "FilterRebase: bad rank, dtype, origin or overlap");
    if (!valid || count == 0) return 0;
    // Never read past what the caller handed in.
    return std::min<std::uint64_t>({count, in_indices.size() / (rank * DTypeSize(in_index_dtype)),
                                    in_values.size() / value_bytes});
}

}  // namespace

std::uint64_t FilterRebaseInto(std::span<const std::byte> in_indices,
                               std::span<const std::byte> in_values, std::uint64_t count,
                               std::size_t rank, DType in_index_dtype, std::size_t value_bytes,
                               const Box& overlap, bool filter, std::span<const Index> origin,
                               DType out_index_dtype, std::span<std::byte> out_indices,
                               std::span<std::byte> out_values) {
    const std::size_t out_size = DTypeSize(out_index_dtype);
    count = ReadableEntries(in_indices, in_values, count, rank, in_index_dtype, value_bytes,
                            overlap, filter, origin, out_index_dtype);
    if (count == 0) return 0;
    if (out_indices.size() < count * rank * out_size || out_values.size() < count * value_bytes) {
        return 0;
    }
    std::byte* out_idx = out_indices.data();
    std::byte* out_val = out_values.data();

    std::uint64_t kept = 0;
    auto run = [&](auto in_tag, auto out_tag) {
        using InT = decltype(in_tag);
        using OutT = decltype(out_tag);
        if (rank == 2 && value_bytes == 2) {
            kept = FilterRebaseTyped<InT, OutT, 2, 2>(in_indices.data(), in_values.data(), count,
                                                      rank, value_bytes, overlap, filter, origin,
                                                      out_idx, out_val);
        } else if (rank == 2) {
            kept = FilterRebaseTyped<InT, OutT, 2, 0>(in_indices.data(), in_values.data(), count,
                                                      rank, value_bytes, overlap, filter, origin,
                                                      out_idx, out_val);
        } else {
            kept = FilterRebaseTyped<InT, OutT, 0, 0>(in_indices.data(), in_values.data(), count,
                                                      rank, value_bytes, overlap, filter, origin,
                                                      out_idx, out_val);
        }
    };
    codec_internal::VisitUnsignedIndexDType(in_index_dtype, [&](auto in_tag) {
        codec_internal::VisitUnsignedIndexDType(out_index_dtype,
                                                [&](auto out_tag) { run(in_tag, out_tag); });
    });
    return kept;
}

std::uint64_t FilterRebase(std::span<const std::byte> in_indices,
                           std::span<const std::byte> in_values, std::uint64_t count,
                           std::size_t rank, DType in_index_dtype, std::size_t value_bytes,
                           const Box& overlap, bool filter, std::span<const Index> origin,
                           DType out_index_dtype, std::vector<std::byte>& out_indices,
                           std::vector<std::byte>& out_values) {
    const std::size_t out_size = DTypeSize(out_index_dtype);
    count = ReadableEntries(in_indices, in_values, count, rank, in_index_dtype, value_bytes,
                            overlap, filter, origin, out_index_dtype);
    if (count == 0) return 0;

    const std::size_t idx_base = out_indices.size();
    const std::size_t val_base = out_values.size();
    out_indices.resize(idx_base + count * rank * out_size);
    out_values.resize(val_base + count * value_bytes);
    const std::uint64_t kept = FilterRebaseInto(
        in_indices, in_values, count, rank, in_index_dtype, value_bytes, overlap, filter, origin,
        out_index_dtype, std::span(out_indices).subspan(idx_base),
        std::span(out_values).subspan(val_base));
    out_indices.resize(idx_base + kept * rank * out_size);
    out_values.resize(val_base + kept * value_bytes);
    return kept;
}

}  // namespace mooncake::sparse
