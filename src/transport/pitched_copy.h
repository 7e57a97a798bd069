// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Copies from a C-contiguous host tensor into a strided view of device memory (get_tensor_into
// a TP slice of a fused parameter, a transposed or row-strided view) as a short list of
// cudaMemcpy2D-shaped copies, planned on the host as a pure function so that the layout logic
// is testable without a GPU.
//
// Why it is built this way:
// - In place, no device temporary: the copy engine writes the view where it lies. A view that
//   collapses to rows of one contiguous run with a pitch (`w[:, a:b]`, `w[::2]`, an expert
//   range of a fused [experts, out, in] tensor) is ONE 2-D copy and runs at the PCIe limit like
//   a flat copy.
// - Views whose memory order differs from the source's element order (transposed, Fortran
//   order, negative strides) have no run that is contiguous on both sides; element-wide 2-D
//   rows would crawl. Their source is first gathered on the host, in the view's memory order
//   (StridedCopy into a staging buffer of the view's size, never of its parent), after which the
//   copies have the view's innermost run as their width again. The alternative — H2D into a
//   device temporary plus a strided device kernel — would need a kernel in this layer, which
//   loads the CUDA runtime at run time and compiles without nvcc.
// - A view that still leaves many 2-D copies (several non-mergeable outer dimensions, or an
//   innermost stride > 1 under a large outer extent) is bounded by a copy budget that fails
//   closed: the caller gets InvalidArgument and can pass a contiguous tensor instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// One cudaMemcpy2D: `height` rows of `width` bytes; row r reads the source at
/// src_offset + r * src_pitch and writes the destination at dst_offset + r * dst_pitch. Source
/// offsets are bytes into the (possibly gathered) contiguous source; destination offsets are
/// bytes relative to the view's element [0, ..., 0] and may be negative (negative strides).
struct PitchedCopy {
    std::int64_t dst_offset = 0;
    std::uint64_t src_offset = 0;
    std::uint64_t width = 0;
    std::uint64_t height = 1;
    std::uint64_t dst_pitch = 0;
    std::uint64_t src_pitch = 0;

    friend bool operator==(const PitchedCopy&, const PitchedCopy&) = default;
};

struct PitchedCopyPlan {
    /// When true the source must first be gathered on the host:
    /// StridedCopy(staging, {}, source + gather_src_offset, gather_strides, gather_shape, item)
    /// into a staging buffer of the tensor's size — the copies then read the staging buffer.
    bool gather = false;
    std::vector<std::int64_t> gather_shape;
    std::vector<std::int64_t> gather_strides;  ///< Elements of the source, per gathered dim.
    std::int64_t gather_src_offset = 0;        ///< Bytes: where the gather starts in the source.
    std::vector<PitchedCopy> copies;
};

/// The most 2-D copies one destination may take (each is one runtime call, a few microseconds).
inline constexpr std::size_t kMaxPitchedCopies = 16384;
/// cudaMemcpy2D's pitch limit (cudaDevAttrMaxPitch on current GPUs).
inline constexpr std::uint64_t kMaxCopyPitch = (std::uint64_t{1} << 31) - 1;

/// Plans the copy of a C-contiguous tensor of `shape` (`item` bytes per element) into a view
/// with element strides `dst_strides` (empty: C-contiguous, one flat copy). The view must not
/// overlap itself. A tensor with no elements plans no copy.
/// Errors: InvalidArgument (rank mismatch, overlapping view, strides whose byte offsets
/// overflow, more than `max_copies` copies).
Result<PitchedCopyPlan> PlanPitchedCopies(std::span<const std::int64_t> shape,
                                          std::span<const std::int64_t> dst_strides,
                                          std::size_t item,
                                          std::size_t max_copies = kMaxPitchedCopies);

/// Plans the copy of a tensor of `shape` whose source elements lie at element strides
/// `src_strides` (empty: C-contiguous) into a view with `dst_strides` (empty: C-contiguous):
/// a box of a larger C-contiguous tensor (its strides those of the parent, so rows of the box
/// are `parent_shape[-1]` elements apart) into a contiguous or strided destination. Trailing
/// dimensions that the box spans fully merge into one run; a box whose rows are whole runs is
/// one 2-D copy. A source that the copies cannot walk in the destination's memory order with
/// runs as wide as the destination's (negative or reordered strides, a contiguous destination
/// row under a strided source row) is gathered first: plan.gather, as for PlanPitchedCopies,
/// with `gather_strides` in the source's strides. Source offsets of the copies are bytes from
/// the source's element [0, ..., 0] (never negative).
/// Errors: as PlanPitchedCopies; InvalidArgument (source strides of another rank, or whose byte
/// offsets overflow).
Result<PitchedCopyPlan> PlanStridedCopies(std::span<const std::int64_t> shape,
                                          std::span<const std::int64_t> dst_strides,
                                          std::span<const std::int64_t> src_strides,
                                          std::size_t item,
                                          std::size_t max_copies = kMaxPitchedCopies);

/// The memory a strided view spreads over: `bytes` from its lowest element, which lies `first`
/// bytes from element [0, ..., 0] (first <= 0; negative strides put elements below it), to the
/// end of its highest. What a CUDA IPC exporter exports for a view and what the importer checks
/// against the allocation it mapped, so that a view's strides cannot reach outside it.
struct ViewSpan {
    std::int64_t first = 0;
    std::uint64_t bytes = 0;
};

/// Errors: InvalidArgument (rank mismatch, negative extent, byte offsets beyond 2^63).
Result<ViewSpan> StridedViewSpan(std::span<const std::int64_t> shape,
                                 std::span<const std::int64_t> strides, std::size_t item);

/// Runs a plan on host memory: what the copy engine does with it, for tests and for host
/// destinations. `dst` is element [0, ..., 0] of the view; `src` the contiguous source (or its
/// gathered staging when plan.gather).
void RunPitchedCopiesOnHost(const PitchedCopyPlan& plan, std::byte* dst, const std::byte* src);

}  // namespace mooncake::sparse
