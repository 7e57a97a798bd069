// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Encode walks each tensor as "chunks": one chunk is one row of one tile. Chunks are numbered in
// output order (tile, then row within the tile), so an exclusive scan of per-chunk counts gives
// every chunk its output offset and the entries come out sorted by (tile, element) without a
// sort. Two passes: the first reads (new, old) once with 16-byte loads, counts each chunk's kept
// elements and writes a bitmask of them (one bit per element); the second reads only the mask
// and, at its set bits, the values, and writes the entries in order (warp scans for in-order
// compaction). Each warp takes a few consecutive chunks of one tensor. A batch numbers the
// chunks of all its tensors in one sequence, so one scan and one launch per pass (per dtype
// group) cover every tensor; a warp finds its tensor by a binary search of the group's warp
// prefix.
#include "cuda/gpu_codec.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "cuda/cuda_util.cuh"
#include "transport/host_copy.h"

namespace mooncake::sparse::cuda {
namespace {

/// A run of chunks within one tile: chunk k and those after it in the same tile, which are the
/// tile's next rows: (i0, i1), then i1 + 1, wrapping to i1_first (and i0 + 1) at i1_end.
struct ChunkRun {
    std::uint32_t i0, i1;
    std::uint32_t i1_first, i1_end;
    std::uint32_t col0, len;
    std::uint64_t left;  ///< Chunks from k to the tile's last, both included.

    __device__ __forceinline__ void NextRow() {
        if (++i1 == i1_end) {
            i1 = i1_first;
            ++i0;
        }
    }
};

/// A tensor of rank 1 to 3 seen as [a, b, c] (rank 1: a = b = 1; rank 2: a = 1), tiled by
/// [ta, tb, tc]. Chunk k in output order: tile (t0, t1, t2) in row-major order, then row (i0, i1)
/// within the tile; a chunk spans min(tc, c - t2 * tc) elements of one row.
struct ChunkGeometry {
    std::uint32_t a, b, c;
    std::uint32_t ta, tb, tc;
    std::uint32_t tiles_a, tiles_b, tiles_c;

    __host__ __device__ std::uint64_t NumChunks() const { return std::uint64_t(a) * b * tiles_c; }
    __host__ __device__ std::uint64_t NumTiles() const {
        return std::uint64_t(tiles_a) * tiles_b * tiles_c;
    }

    /// Chunk k's row, columns and the rest of its tile.
    __device__ ChunkRun Locate(std::uint64_t k) const {
        const std::uint64_t slab = std::uint64_t(ta) * b * tiles_c;  // chunks of a full t0 slab
        const std::uint32_t t0 = std::uint32_t(k / slab);
        std::uint64_t rem = k - std::uint64_t(t0) * slab;
        const std::uint32_t h0 = min(ta, a - t0 * ta);
        const std::uint64_t band = std::uint64_t(tb) * h0 * tiles_c;  // chunks of a full t1 band
        const std::uint32_t t1 = std::uint32_t(rem / band);
        rem -= std::uint64_t(t1) * band;
        const std::uint32_t h1 = min(tb, b - t1 * tb);
        const std::uint64_t per_tile = std::uint64_t(h0) * h1;
        const std::uint32_t t2 = std::uint32_t(rem / per_tile);
        const std::uint64_t r = rem - std::uint64_t(t2) * per_tile;
        ChunkRun run;
        run.i0 = t0 * ta + std::uint32_t(r / h1);
        run.i1_first = t1 * tb;
        run.i1_end = run.i1_first + h1;
        run.i1 = run.i1_first + std::uint32_t(r % h1);
        run.col0 = t2 * tc;
        run.len = min(tc, c - run.col0);
        run.left = per_tile - r;
        return run;
    }

    /// Element index of row (i0, i1), column col.
    __device__ __forceinline__ std::uint64_t Element(std::uint32_t i0, std::uint32_t i1,
                                                     std::uint32_t col) const {
        return (std::uint64_t(i0) * b + i1) * c + col;
    }

    /// Tile t (row-major): its coordinates, first chunk and number of chunks.
    __device__ void Tile(std::uint64_t t, std::uint32_t& t0, std::uint32_t& t1, std::uint32_t& t2,
                         std::uint64_t& first, std::uint64_t& count) const {
        t2 = std::uint32_t(t % tiles_c);
        const std::uint64_t q = t / tiles_c;
        t1 = std::uint32_t(q % tiles_b);
        t0 = std::uint32_t(q / tiles_b);
        const std::uint64_t h0 = min(ta, a - t0 * ta), h1 = min(tb, b - t1 * tb);
        first = std::uint64_t(t0) * ta * b * tiles_c + std::uint64_t(t1) * tb * h0 * tiles_c +
                std::uint64_t(t2) * h0 * h1;
        count = h0 * h1;
    }
};

/// The segment of x when x >= sorted[j0]: a few steps forward from j0 (a block's threads
/// mostly share the segment of the block's first element), else a binary search of the rest.
__device__ __forceinline__ std::uint32_t SegmentFrom(const std::uint64_t* __restrict__ sorted,
                                                     std::uint32_t n, std::uint32_t j0,
                                                     std::uint64_t x) {
    std::uint32_t j = j0;
#pragma unroll
    for (int step = 0; step < 4; ++step) {
        if (j + 1 >= n || sorted[j + 1] > x) return j;
        ++j;
    }
    return j + FindSegment(sorted + j, n - j, x);
}

/// The segment of the calling block's first element e0, found once by thread 0 (every thread
/// calls it).
__device__ __forceinline__ std::uint32_t BlockSegment(const std::uint64_t* __restrict__ sorted,
                                                      std::uint32_t n, std::uint64_t e0) {
    __shared__ std::uint32_t first;
    if (threadIdx.x == 0) first = FindSegment(sorted, n, e0);
    __syncthreads();
    return first;
}

template <typename T>
struct Bits;
template <>
struct Bits<__nv_bfloat16> {
    using U = std::uint16_t;
    static constexpr U kMagnitude = 0x7fffu;  ///< every bit but the sign
    static __device__ float ToFloat(U u) { return __bfloat162float(__ushort_as_bfloat16(u)); }
    static __device__ U FromFloat(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
template <>
struct Bits<__half> {
    using U = std::uint16_t;
    static constexpr U kMagnitude = 0x7fffu;  ///< every bit but the sign
    static __device__ float ToFloat(U u) { return __half2float(__ushort_as_half(u)); }
    static __device__ U FromFloat(float f) { return __half_as_ushort(__float2half_rn(f)); }
};
template <>
struct Bits<float> {
    using U = std::uint32_t;
    static constexpr U kMagnitude = 0x7fffffffu;  ///< every bit but the sign
    static __device__ float ToFloat(U u) { return __uint_as_float(u); }
    static __device__ U FromFloat(float f) { return __float_as_uint(f); }
};

/// The value a kept element stores: new (overwrite) or new - old rounded to the dtype
/// (scatter_add).
template <typename T, bool kOverwrite>
__device__ __forceinline__ typename Bits<T>::U Stored(typename Bits<T>::U n, typename Bits<T>::U o) {
    if constexpr (kOverwrite) {
        return n;
    } else {
        return Bits<T>::FromFloat(Bits<T>::ToFloat(n) - Bits<T>::ToFloat(o));
    }
}

/// Whether element (n, o) is kept: overwrite where the bits differ; scatter_add where the bits
/// differ, |new - old| is not at most the threshold (a NaN difference is kept, as on the host)
/// and the stored difference (Stored) is not zero. With threshold 0 that is a test of bits:
/// two different values of the dtype differ by at least its smallest subnormal, which the
/// float difference and its rounding back keep, so only +0 against -0 is dropped (the
/// arithmetic would cost the mask pass half again its time).
template <typename T, bool kOverwrite>
__device__ __forceinline__ bool Keep(typename Bits<T>::U n, typename Bits<T>::U o, float threshold) {
    if constexpr (kOverwrite) {
        return n != o;
    } else {
        if (threshold == 0.0f) return n != o && ((n | o) & Bits<T>::kMagnitude) != 0;
        if (n == o) return false;
        const float d = Bits<T>::ToFloat(n) - Bits<T>::ToFloat(o);
        return !(fabsf(d) <= threshold) && Bits<T>::ToFloat(Bits<T>::FromFloat(d)) != 0.0f;
    }
}

/// 32-bit words that hold eight elements of U.
template <typename U>
constexpr int kWords8 = 2 * int(sizeof(U));

/// Eight consecutive elements at p as words (element e in word e / 2, low half first, for 16-bit
/// types): one or two 16-byte loads when `vec` (p 16-byte aligned, all eight in range), else the
/// first `count` one by one and zeros after them.
template <typename U>
__device__ __forceinline__ void Load8(const U* p, bool vec, std::uint32_t count,
                                      std::uint32_t (&w)[kWords8<U>]) {
    if (vec) {
#pragma unroll
        for (int h = 0; h < kWords8<U> / 4; ++h) {
            const uint4 x = __ldg(reinterpret_cast<const uint4*>(p) + h);
            w[4 * h] = x.x;
            w[4 * h + 1] = x.y;
            w[4 * h + 2] = x.z;
            w[4 * h + 3] = x.w;
        }
    } else {
        U v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = std::uint32_t(e) < count ? p[e] : U(0);
#pragma unroll
        for (int i = 0; i < kWords8<U>; ++i) {
            if constexpr (sizeof(U) == 2) {
                w[i] = std::uint32_t(v[2 * i]) | (std::uint32_t(v[2 * i + 1]) << 16);
            } else {
                w[i] = v[i];
            }
        }
    }
}

/// Element e of eight loaded by Load8 (little endian: the lower address is the low half).
template <typename U>
__device__ __forceinline__ U Element8(const std::uint32_t (&w)[kWords8<U>], int e) {
    if constexpr (sizeof(U) == 2) {
        return U(e % 2 == 0 ? w[e / 2] & 0xffffu : w[e / 2] >> 16);
    } else {
        return U(w[e]);
    }
}

/// The sum of v over the warp (all 32 lanes call it).
__device__ __forceinline__ std::uint32_t WarpSum(std::uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_add_sync(0xffffffffu, v);
#else
#pragma unroll
    for (int dd = 16; dd > 0; dd >>= 1) v += __shfl_xor_sync(0xffffffffu, v, dd);
    return v;
#endif
}

constexpr int kWarpsPerBlock = 8;
/// Elements of one warp step in the mask pass: 8 consecutive ones per lane, so a step covers
/// 256 elements in order and its mask is 32 consecutive bytes, one per lane.
constexpr std::uint32_t kStep = 256;
/// Blocks of either encode pass that share an SM: their registers (at most 80 per thread) are
/// what holds a warp's loads in flight.
constexpr int kEncodeBlocksPerSm = 3;
/// Steps whose loads a warp of the mask pass has in flight together: 96 bytes per lane for
/// 16-bit types, 128 for float32.
template <typename U>
constexpr int kUnits = sizeof(U) == 2 ? 3 : 2;

/// One tensor of an encode batch, as the kernels see it.
struct EncodeDesc {
    const void* nw;
    const void* od;
    void* out_idx;               ///< Set after the count pass.
    void* out_val;
    std::uint32_t* out_coords;
    std::uint64_t* out_ptr;
    std::uint8_t* mask;          ///< Chunk k's kept elements: mask + k * mask_stride, in the workspace.
    ChunkGeometry g;
    std::uint64_t chunk_begin;   ///< Into the batch's chunk sequence.
    std::uint64_t tile_begin;    ///< Into the batch's tile sequence.
    std::uint32_t rank;
    std::uint32_t mask_stride;   ///< Bytes per chunk: ceil(tc / 8) rounded up to 4.
    std::uint32_t per_warp;      ///< Consecutive chunks per warp (the last warp takes the rest).
};

/// Pass 1: per chunk, the number of kept elements (counts[chunk]) and their mask: byte b of a
/// chunk's mask holds elements 8 b to 8 b + 7 of the chunk (bit e: element 8 b + e), and every
/// byte up to its last 4-byte word is written (zero past the chunk's end), so pass 2 reads it in
/// words. One warp takes `per_warp` consecutive chunks of one tensor of one dtype group: `items`
/// are the group's tensors, `prefix` their warp prefix within the group. The warp walks its
/// chunks as a sequence of steps (256 elements of one chunk) and loads kUnits steps before it
/// tests any; lane l writes byte l of a step's 32 mask bytes, so the mask writes coalesce.
template <typename T, bool kOverwrite>
__global__ void __launch_bounds__(32 * kWarpsPerBlock, kEncodeBlocksPerSm)
MaskKernel(const EncodeDesc* __restrict__ descs, const std::uint32_t* __restrict__ items,
           const std::uint64_t* __restrict__ prefix, std::uint32_t num_items, std::uint64_t num_warps,
           float threshold, std::uint64_t* __restrict__ counts) {
    using U = typename Bits<T>::U;
    const std::uint32_t lane = threadIdx.x & 31;
    const std::uint64_t gwarp = std::uint64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (gwarp >= num_warps) return;
    const std::uint32_t j = FindSegment(prefix, num_items, gwarp);
    const EncodeDesc& d = descs[items[j]];
    const ChunkGeometry g = d.g;
    const auto* nw = static_cast<const U*>(d.nw);
    const auto* od = static_cast<const U*>(d.od);
    const bool vec_ok =
        ((reinterpret_cast<std::uintptr_t>(nw) | reinterpret_cast<std::uintptr_t>(od)) % 16) == 0;
    std::uint8_t* const mask = d.mask;
    const std::uint32_t stride = d.mask_stride;
    std::uint64_t* const item_counts = counts + d.chunk_begin;
    std::uint64_t k = (gwarp - prefix[j]) * d.per_warp;
    // Chunks of this warp from k on (the last warp of a tensor takes fewer).
    auto remaining = std::uint32_t(min(std::uint64_t(d.per_warp), g.NumChunks() - k));
    std::uint32_t acc = 0;  // this lane's kept elements of the current chunk so far
    while (remaining > 0) {
        ChunkRun run = g.Locate(k);
        const auto n = std::uint32_t(min(std::uint64_t(remaining), run.left));
        const std::uint32_t len = run.len;
        std::uint8_t* const run_mask = mask + k * stride;
        // Two cursors over the run's steps: (q, s) is the next step to load, elements [s, s + 256)
        // of chunk k + q (row run.i0, run.i1); (tq, ts) the next to test, kUnits steps behind
        // after the loads. Every condition below is the same on all lanes, so the warp stays
        // converged.
        std::uint32_t q = 0, s = 0, tq = 0, ts = 0;
        while (q < n) {
            constexpr int kU = kUnits<U>;
            std::uint32_t nv[kU][kWords8<U>], ov[kU][kWords8<U>];
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                if (q >= n) break;
                const std::uint32_t rem = min(len - s, kStep);  // elements of this step
                const std::uint64_t row = g.Element(run.i0, run.i1, run.col0);
                const bool aligned = vec_ok && (row * sizeof(U)) % 16 == 0;
                const std::uint32_t mine = lane * 8 < rem ? rem - lane * 8 : 0;
                const std::uint64_t at = row + s + lane * 8;
                Load8(nw + at, aligned && mine >= 8, mine, nv[u]);
                Load8(od + at, aligned && mine >= 8, mine, ov[u]);
                if (len - s <= kStep) {  // the chunk's last step
                    s = 0;
                    ++q;
                    run.NextRow();
                } else {
                    s += kStep;
                }
            }
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                if (tq >= n) break;
                const std::uint32_t rem = min(len - ts, kStep);
                std::uint32_t bits = 0;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    if (lane * 8 + e < rem &&
                        Keep<T, kOverwrite>(Element8<U>(nv[u], e), Element8<U>(ov[u], e), threshold)) {
                        bits |= 1u << e;
                    }
                }
                if (lane < (rem + 31) / 32 * 4) {
                    run_mask[std::uint64_t(tq) * stride + ts / 8 + lane] = std::uint8_t(bits);
                }
                acc += __popc(bits);
                if (len - ts <= kStep) {
                    const std::uint32_t total = WarpSum(acc);
                    if (lane == 0) item_counts[k + tq] = total;
                    acc = 0;
                    ts = 0;
                    ++tq;
                } else {
                    ts += kStep;
                }
            }
        }
        k += n;
        remaining -= n;
    }
}

/// Mask words a lane of pass 2 reads at once: a warp reads 256 words (8192 elements) of a run's
/// masks per step, all its loads in flight together.
constexpr int kWordsPerLane = 8;
/// Entries a lane of pass 2 gathers at once: their values' loads are in flight together.
constexpr int kGather = 4;

/// Pass 2: the entries of each chunk, found in its mask and written at the chunk's offset within
/// its tensor; the warps take the chunks pass 1 gave them. The chunks of a run (rows of one
/// tile) are consecutive in the output, so their entries are one range and the run's masks one
/// sequence of words: slot word w of chunk k + q is word q * slot_words + w of the run (bit i:
/// element 32 w + i of the chunk). A step reads 8 consecutive words per lane, skips the step if
/// none has a set bit, and a warp scan of the words' set bits places each lane's entries, in
/// element order; the run ends once all its entries are written.
template <typename T, bool kOverwrite, typename I>
__global__ void __launch_bounds__(32 * kWarpsPerBlock, kEncodeBlocksPerSm)
WriteKernel(const EncodeDesc* __restrict__ descs, const std::uint32_t* __restrict__ items,
            const std::uint64_t* __restrict__ prefix, std::uint32_t num_items, std::uint64_t num_warps,
            const std::uint64_t* __restrict__ offsets) {
    using U = typename Bits<T>::U;
    const std::uint32_t lane = threadIdx.x & 31;
    const std::uint64_t gwarp = std::uint64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (gwarp >= num_warps) return;
    const std::uint32_t j = FindSegment(prefix, num_items, gwarp);
    const EncodeDesc& d = descs[items[j]];
    const ChunkGeometry g = d.g;
    const auto* nw = static_cast<const U*>(d.nw);
    const auto* od = static_cast<const U*>(d.od);
    I* const out_idx = static_cast<I*>(d.out_idx);
    U* const out_val = static_cast<U*>(d.out_val);
    const std::uint32_t rank = d.rank;
    const std::uint8_t* const mask = d.mask;
    const std::uint32_t stride = d.mask_stride;
    const std::uint32_t slot_words = stride / 4;
    const std::uint64_t* const item_offsets = offsets + d.chunk_begin;
    const std::uint64_t item_first = item_offsets[0];
    std::uint64_t k = (gwarp - prefix[j]) * d.per_warp;
    auto chunks_left = std::uint32_t(min(std::uint64_t(d.per_warp), g.NumChunks() - k));
    while (chunks_left > 0) {
        const ChunkRun run = g.Locate(k);
        const auto n = std::uint32_t(min(std::uint64_t(chunks_left), run.left));
        const std::uint32_t len = run.len;
        const std::uint64_t run_first = item_offsets[k];
        // The run's entries not yet written, and its mask words (both below 2^32: ChunksPerWarp).
        auto remaining = std::uint32_t(item_offsets[k + n] - run_first);
        const std::uint32_t total = n * slot_words;
        std::uint64_t cursor = run_first - item_first;
        const auto* words = reinterpret_cast<const std::uint32_t*>(mask + k * stride);
        // Words of a chunk with elements; an edge tile's chunks leave the slot's last ones
        // unwritten, and those are not read.
        const std::uint32_t len_words = len / 32 + (len % 32 != 0 ? 1u : 0u);
        const bool gaps = len_words < slot_words;
        const bool vec = !gaps && reinterpret_cast<std::uintptr_t>(words) % 16 == 0;
        const std::uint32_t h1 = run.i1_end - run.i1_first;
        const std::uint32_t r0 = run.i1 - run.i1_first;  // the run's first row within its band
        for (std::uint32_t b = 0; remaining > 0 && b < total; b += 32 * kWordsPerLane) {
            const std::uint32_t f0 = b + lane * kWordsPerLane;
            std::uint32_t m[kWordsPerLane];
            if (vec && f0 + kWordsPerLane <= total) {
#pragma unroll
                for (int h = 0; h < kWordsPerLane / 4; ++h) {
                    const uint4 x = __ldg(reinterpret_cast<const uint4*>(words + f0) + h);
                    m[4 * h] = x.x;
                    m[4 * h + 1] = x.y;
                    m[4 * h + 2] = x.z;
                    m[4 * h + 3] = x.w;
                }
            } else {
#pragma unroll
                for (int r = 0; r < kWordsPerLane; ++r) {
                    const std::uint32_t f = f0 + r;
                    const bool in = f < total && (!gaps || f % slot_words < len_words);
                    m[r] = in ? words[f] : 0u;
                }
            }
            std::uint32_t mine = 0;
#pragma unroll
            for (int r = 0; r < kWordsPerLane; ++r) mine += __popc(m[r]);
            if (!__any_sync(0xffffffffu, mine != 0)) continue;
            // Inclusive warp scan of per-lane counts keeps the output in element order.
            std::uint32_t incl = mine;
#pragma unroll
            for (std::uint32_t dd = 1; dd < 32; dd <<= 1) {
                const std::uint32_t v = __shfl_up_sync(0xffffffffu, incl, dd);
                if (lane >= dd) incl += v;
            }
            const std::uint32_t step_total = __shfl_sync(0xffffffffu, incl, 31);
            std::uint64_t pos = cursor + (incl - mine);
            // The lane's words in order: m[0] is word f, and the others move down one place as
            // it is taken (register moves, where indexing m by a variable would not stay in
            // registers).
            std::uint32_t f = f0;
            for (std::uint32_t left = mine; left > 0; ++f) {
                std::uint32_t bits = m[0];
#pragma unroll
                for (int r = 0; r + 1 < kWordsPerLane; ++r) m[r] = m[r + 1];
                if (bits == 0) continue;
                left -= std::uint32_t(__popc(bits));
                // The word's chunk k + q, its row, and the word's first element.
                const std::uint32_t q = f / slot_words;
                const std::uint32_t e0 = 32 * (f - q * slot_words);
                const std::uint32_t i0 = run.i0 + (r0 + q) / h1;
                const std::uint32_t i1 = run.i1_first + (r0 + q) % h1;
                const std::uint64_t row = g.Element(i0, i1, run.col0);
                while (bits != 0) {
                    std::uint32_t e[kGather];
                    int cnt = 0;
#pragma unroll
                    for (int t = 0; t < kGather; ++t) {
                        if (bits != 0) {
                            e[t] = e0 + std::uint32_t(__ffs(int(bits)) - 1);
                            bits &= bits - 1u;
                            cnt = t + 1;
                        }
                    }
                    U nv[kGather], ov[kGather];
#pragma unroll
                    for (int t = 0; t < kGather; ++t) {
                        if (t < cnt) {
                            nv[t] = nw[row + e[t]];
                            if constexpr (!kOverwrite) ov[t] = od[row + e[t]];
                        }
                    }
#pragma unroll
                    for (int t = 0; t < kGather; ++t) {
                        if (t < cnt) {
                            const std::uint32_t col = run.col0 + e[t];
                            I* at = out_idx + (pos + t) * rank;
                            if (rank == 3) {
                                at[0] = I(i0); at[1] = I(i1); at[2] = I(col);
                            } else if (rank == 2) {
                                at[0] = I(i1); at[1] = I(col);
                            } else {
                                at[0] = I(col);
                            }
                            if constexpr (kOverwrite) {
                                out_val[pos + t] = nv[t];
                            } else {
                                out_val[pos + t] = Stored<T, false>(nv[t], ov[t]);
                            }
                        }
                    }
                    pos += std::uint32_t(cnt);
                }
            }
            cursor += step_total;
            remaining -= step_total;
        }
        k += n;
        chunks_left -= n;
    }
}

/// Per tile of the batch: the offset of its first entry (batch numbering) and whether it has any.
__global__ void TileRangeKernel(const EncodeDesc* __restrict__ descs, const std::uint64_t* __restrict__ tile_begin,
                                std::uint32_t num_items, std::uint64_t num_tiles,
                                const std::uint64_t* __restrict__ offsets, std::uint64_t* __restrict__ tile_start,
                                std::uint32_t* __restrict__ flags) {
    const std::uint64_t t = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= num_tiles) return;
    const EncodeDesc& d = descs[FindSegment(tile_begin, num_items, t)];
    std::uint32_t t0, t1, t2;
    std::uint64_t first, count;
    d.g.Tile(t - d.tile_begin, t0, t1, t2, first, count);
    const std::uint64_t start = offsets[d.chunk_begin + first];
    tile_start[t] = start;
    flags[t] = offsets[d.chunk_begin + first + count] > start ? 1u : 0u;
}

/// Per tensor: nnz and number of non-empty tiles (read by the host to size the outputs).
__global__ void CountsKernel(const std::uint64_t* __restrict__ chunk_begin, const std::uint64_t* __restrict__ tile_begin,
                             std::uint32_t num_items, const std::uint64_t* __restrict__ offsets,
                             const std::uint64_t* __restrict__ tile_scan, std::uint64_t* __restrict__ out) {
    const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_items) return;
    out[2 * i] = offsets[chunk_begin[i + 1]] - offsets[chunk_begin[i]];
    out[2 * i + 1] = tile_scan[tile_begin[i + 1]] - tile_scan[tile_begin[i]];
}

/// Every non-empty tile's coordinates and entry offset (within its tensor) in its tensor's
/// tile index.
__global__ void TileIndexKernel(const EncodeDesc* __restrict__ descs, const std::uint64_t* __restrict__ tile_begin,
                                std::uint32_t num_items, std::uint64_t num_tiles,
                                const std::uint64_t* __restrict__ offsets, const std::uint64_t* __restrict__ tile_start,
                                const std::uint32_t* __restrict__ flags, const std::uint64_t* __restrict__ tile_scan) {
    const std::uint64_t t = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= num_tiles || flags[t] == 0) return;
    const EncodeDesc& d = descs[FindSegment(tile_begin, num_items, t)];
    std::uint32_t t0, t1, t2;
    std::uint64_t first, count;
    d.g.Tile(t - d.tile_begin, t0, t1, t2, first, count);
    const std::uint64_t sel = tile_scan[t] - tile_scan[d.tile_begin];
    std::uint32_t* at = d.out_coords + sel * d.rank;
    if (d.rank == 3) {
        at[0] = t0; at[1] = t1; at[2] = t2;
    } else if (d.rank == 2) {
        at[0] = t1; at[1] = t2;
    } else {
        at[0] = t2;
    }
    d.out_ptr[sel] = tile_start[t] - offsets[d.chunk_begin];
}

/// Per tensor: the closing entry of its tile_ptr (= nnz).
__global__ void TilePtrEndKernel(const EncodeDesc* __restrict__ descs, std::uint32_t num_items,
                                 const std::uint64_t* __restrict__ counts_out) {
    const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_items) return;
    descs[i].out_ptr[counts_out[2 * i + 1]] = counts_out[2 * i];
}

/// One object of an apply batch, as the kernels see it.
struct ApplyDesc {
    void* w;  ///< Element [0, ..., 0] of the weight view.
    const void* idx;
    const void* val;
    std::int64_t strides[3];
    std::uint32_t shape[3];
    std::uint32_t rank;
    std::uint32_t overwrite;
    std::uint32_t item;  ///< Its position in the caller's batch.
};

/// Entries each thread of the apply check takes (a block's 256 threads stride over 2048): a
/// check is a few instructions per entry, and blocks of one entry per thread spent their time
/// being scheduled and finding their object.
constexpr unsigned kCheckPerThread = 8;

template <typename I>
__global__ void CheckKernel(const ApplyDesc* __restrict__ descs, const std::uint64_t* __restrict__ prefix,
                            std::uint32_t num_items, std::uint64_t num_entries,
                            unsigned int* __restrict__ bad) {
    const std::uint64_t e0 = std::uint64_t(blockIdx.x) * blockDim.x * kCheckPerThread;
    const std::uint32_t j0 = BlockSegment(prefix, num_items, e0);
    std::uint32_t j = j0;
#pragma unroll
    for (unsigned q = 0; q < kCheckPerThread; ++q) {
        const std::uint64_t e = e0 + std::uint64_t(q) * blockDim.x + threadIdx.x;
        if (e >= num_entries) return;
        j = SegmentFrom(prefix, num_items, j, e);
        const ApplyDesc& d = descs[j];
        const I* at = static_cast<const I*>(d.idx) + (e - prefix[j]) * d.rank;
        bool out = false;
        for (std::uint32_t k = 0; k < d.rank; ++k) out |= std::uint32_t(at[k]) >= d.shape[k];
        if (out) {
            atomicAdd(&bad[0], 1u);
            atomicMin(&bad[1], d.item);
        }
    }
}

template <typename T, typename I>
__global__ void ApplyKernel(const ApplyDesc* __restrict__ descs, const std::uint64_t* __restrict__ prefix,
                            std::uint32_t num_items, std::uint64_t num_entries) {
    using U = typename Bits<T>::U;
    const std::uint64_t e0 = std::uint64_t(blockIdx.x) * blockDim.x;
    const std::uint32_t j0 = BlockSegment(prefix, num_items, e0);
    const std::uint64_t e = e0 + threadIdx.x;
    if (e >= num_entries) return;
    const std::uint32_t j = SegmentFrom(prefix, num_items, j0, e);
    const ApplyDesc& d = descs[j];
    const std::uint64_t n = e - prefix[j];
    const I* at = static_cast<const I*>(d.idx) + n * d.rank;
    std::int64_t off = 0;
    for (std::uint32_t k = 0; k < d.rank; ++k) off += std::int64_t(at[k]) * d.strides[k];
    U* w = static_cast<U*>(d.w) + off;
    const U v = static_cast<const U*>(d.val)[n];
    if (d.overwrite) {
        *w = v;
    } else {
        *w = Bits<T>::FromFloat(Bits<T>::ToFloat(*w) + Bits<T>::ToFloat(v));
    }
}

std::string ItemPrefix(std::size_t n, std::size_t i) {
    return n == 1 ? std::string() : "item " + std::to_string(i) + ": ";
}

/// An array of a batch's item, named in an error only (a batch's checks run per item, and
/// spelling every item's name would cost more than its checks): "item i: name".
struct Where {
    std::size_t n = 1;  ///< Items of the batch (one: no item prefix).
    std::size_t i = 0;
    const char* name = "";
    std::string str() const { return ItemPrefix(n, i) + name; }
};

Status CheckDevice(const DeviceArray& a, const Where& what) {
    if (a.shape.empty()) return InvalidArgument(what.str() + " has no shape");
    Index n = 1;
    for (Index e : a.shape) n *= e;
    if (std::uint64_t(n) * DTypeSize(a.dtype) != a.bytes) {
        return InvalidArgument(what.str() + " byte size does not match shape x dtype");
    }
    if (a.ptr.address == 0 && n > 0) return InvalidArgument(what.str() + " is null");
    if (!a.strides.empty() && a.strides.size() != a.shape.size()) {
        return InvalidArgument(what.str() + " has " + std::to_string(a.strides.size()) +
                               " strides for rank " + std::to_string(a.shape.size()));
    }
    return Status::Ok();
}

/// Arrays the kernels read as flat memory (encode inputs, indices, values) must be
/// C-contiguous: callers make them so (their bytes move anyway).
Status CheckContiguous(const DeviceArray& a, const Where& what) {
    if (IsCContiguous(a.shape, a.strides)) return Status::Ok();
    return InvalidArgument(what.str() + " must be C-contiguous");
}

/// Element-size class of a dtype group: 0 bfloat16, 1 float16, 2 float32.
int ValueClass(DType t) {
    switch (t) {
        case DType::kBFloat16: return 0;
        case DType::kFloat16: return 1;
        case DType::kFloat32: return 2;
        default: return -1;
    }
}

/// Device-side copy of a host array (pageable; the copy has consumed `host` when it returns).
template <typename V>
Status Upload(const std::vector<V>& host, void* dst, cudaStream_t stream) {
    if (host.empty()) return Status::Ok();
    MCS_CUDA(cudaMemcpyAsync(dst, host.data(), host.size() * sizeof(V), cudaMemcpyHostToDevice, stream));
    return Status::Ok();
}

/// One prepared tensor of an encode batch.
struct EncodePlan {
    ChunkGeometry g{};
    Shape tile;
    std::uint32_t rank = 2;
    int value_class = 0;
    bool wide = false;
};

constexpr std::uint64_t kMaxChunksPerPass = std::uint64_t(1) << 24;

/// Chunks per warp of a tensor whose chunks are tc elements long: about kWarpElements elements,
/// so that a warp's work before its first load (finding its tensor and chunk) is paid once per
/// several steps, but at most kMaxChunksPerWarp chunks. A warp's chunks then hold fewer than
/// 2^32 elements and mask words (one chunk, or at most kWarpElements elements), which pass 2
/// counts in 32 bits. (H200, the 296 tensors of a layer step, 8.75 GB: the encode took 8.6 ms
/// with 8192 elements per warp, 8.5 with 16384, 8.2 with 32768.)
constexpr std::uint32_t kWarpElements = 32768;
constexpr std::uint32_t kMaxChunksPerWarp = 128;

std::uint32_t ChunksPerWarp(std::uint32_t tc) {
    return std::clamp<std::uint32_t>(kWarpElements / std::max<std::uint32_t>(tc, 1), 1, kMaxChunksPerWarp);
}

/// Calls f.template operator()<T, kOverwrite>() for a group's value class and the apply mode.
template <typename F>
void ForGroup(int value_class, bool overwrite, F&& f) {
    auto by_mode = [&]<typename T>() {
        if (overwrite) {
            f.template operator()<T, true>();
        } else {
            f.template operator()<T, false>();
        }
    };
    if (value_class == 0) by_mode.template operator()<__nv_bfloat16>();
    else if (value_class == 1) by_mode.template operator()<__half>();
    else by_mode.template operator()<float>();
}

/// Encodes items [lo, hi) of a prepared batch (one sub-batch: one workspace, one host sync,
/// one output allocation).
Status EncodeRange(std::span<const DeviceArray> news, std::span<const DeviceArray> olds,
                   std::span<const EncodePlan> plans, std::size_t lo, std::size_t hi,
                   const GpuEncodeOptions& opt, int device, std::vector<GpuEncoded>& out) {
    cudaStream_t stream = AsStream(opt.stream);
    const auto s = opt.stream;
    const float th = float(opt.threshold);
    const bool overwrite = opt.apply == ApplyMode::kOverwrite;
    const auto n = std::uint32_t(hi - lo);
    // Host tables: descriptors, chunk/tile prefixes, each item's mask offset, and per group its
    // items and warp prefix.
    std::vector<EncodeDesc> descs(n);
    std::vector<std::uint64_t> chunk_begin(n + 1, 0), tile_begin(n + 1, 0), mask_at(n, 0);
    std::uint64_t mask_bytes = 0;
    constexpr int kGroups = 6;  // (value class, wide)
    std::vector<std::uint32_t> group_items[kGroups];
    std::vector<std::uint64_t> group_prefix[kGroups];
    for (auto& p : group_prefix) p.push_back(0);
    for (std::uint32_t i = 0; i < n; ++i) {
        const EncodePlan& p = plans[lo + i];
        EncodeDesc& d = descs[i];
        d.nw = reinterpret_cast<const void*>(news[lo + i].ptr.address);
        d.od = reinterpret_cast<const void*>(olds[lo + i].ptr.address);
        d.g = p.g;
        d.rank = p.rank;
        d.chunk_begin = chunk_begin[i];
        d.tile_begin = tile_begin[i];
        d.per_warp = ChunksPerWarp(p.g.tc);
        d.mask_stride = std::uint32_t(AlignUp((std::uint64_t(p.g.tc) + 7) / 8, 4));
        const std::uint64_t chunks = p.g.NumChunks();
        const std::uint64_t tiles = p.g.NumTiles();
        chunk_begin[i + 1] = chunk_begin[i] + chunks;
        tile_begin[i + 1] = tile_begin[i] + tiles;
        mask_at[i] = mask_bytes;
        mask_bytes = AlignUp(mask_bytes + chunks * d.mask_stride, 16);  // 16-byte loads in pass 2
        if (chunks > 0) {
            const int g = p.value_class * 2 + (p.wide ? 1 : 0);
            group_items[g].push_back(i);
            group_prefix[g].push_back(group_prefix[g].back() + (chunks + d.per_warp - 1) / d.per_warp);
        }
    }
    const std::uint64_t num_chunks = chunk_begin[n], num_tiles = tile_begin[n];
    std::vector<std::uint32_t> all_items;
    std::vector<std::uint64_t> all_prefix;
    std::uint64_t group_at[kGroups], group_prefix_at[kGroups];
    for (int g = 0; g < kGroups; ++g) {
        group_at[g] = all_items.size();
        group_prefix_at[g] = all_prefix.size();
        all_items.insert(all_items.end(), group_items[g].begin(), group_items[g].end());
        all_prefix.insert(all_prefix.end(), group_prefix[g].begin(), group_prefix[g].end());
    }
    // Scratch sizes of the two scans.
    std::size_t scan_chunks = 0, scan_tiles = 0;
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan_chunks, static_cast<std::uint64_t*>(nullptr),
                                           static_cast<std::uint64_t*>(nullptr), num_chunks + 1, stream));
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan_tiles, static_cast<std::uint32_t*>(nullptr),
                                           static_cast<std::uint64_t*>(nullptr), num_tiles + 1, stream));
    Carve c;
    const std::uint64_t o_descs = c.Add(n * sizeof(EncodeDesc));
    const std::uint64_t o_chunk_begin = c.Add((n + 1) * 8);
    const std::uint64_t o_tile_begin = c.Add((n + 1) * 8);
    const std::uint64_t o_items = c.Add(all_items.size() * 4);
    const std::uint64_t o_prefix = c.Add(all_prefix.size() * 8);
    const std::uint64_t o_counts = c.Add((num_chunks + 1) * 8);
    const std::uint64_t o_offsets = c.Add((num_chunks + 1) * 8);
    const std::uint64_t o_tile_start = c.Add(num_tiles * 8);
    const std::uint64_t o_flags = c.Add((num_tiles + 1) * 4);
    const std::uint64_t o_tile_scan = c.Add((num_tiles + 1) * 8);
    const std::uint64_t o_sizes = c.Add(std::uint64_t(n) * 16);
    const std::uint64_t o_scan_temp = c.Add(std::max(scan_chunks, scan_tiles));
    const std::uint64_t o_mask = c.Add(mask_bytes);
    MCS_ASSIGN_OR_RETURN(DeviceBuffer ws, DeviceBuffer::Allocate(c.size(), device, s));
    auto* d_descs = At<EncodeDesc>(ws, o_descs);
    auto* d_chunk_begin = At<std::uint64_t>(ws, o_chunk_begin);
    auto* d_tile_begin = At<std::uint64_t>(ws, o_tile_begin);
    auto* d_items = At<std::uint32_t>(ws, o_items);
    auto* d_prefix = At<std::uint64_t>(ws, o_prefix);
    auto* d_counts = At<std::uint64_t>(ws, o_counts);
    auto* d_offsets = At<std::uint64_t>(ws, o_offsets);
    auto* d_tile_start = At<std::uint64_t>(ws, o_tile_start);
    auto* d_flags = At<std::uint32_t>(ws, o_flags);
    auto* d_tile_scan = At<std::uint64_t>(ws, o_tile_scan);
    auto* d_sizes = At<std::uint64_t>(ws, o_sizes);
    void* d_scan_temp = At<void>(ws, o_scan_temp);
    for (std::uint32_t i = 0; i < n; ++i) descs[i].mask = At<std::uint8_t>(ws, o_mask + mask_at[i]);
    MCS_RETURN_IF_ERROR(Upload(descs, d_descs, stream));
    MCS_RETURN_IF_ERROR(Upload(chunk_begin, d_chunk_begin, stream));
    MCS_RETURN_IF_ERROR(Upload(tile_begin, d_tile_begin, stream));
    MCS_RETURN_IF_ERROR(Upload(all_items, d_items, stream));
    MCS_RETURN_IF_ERROR(Upload(all_prefix, d_prefix, stream));
    // Pass 1: counts and masks, one launch per group.
    MCS_CUDA(cudaMemsetAsync(d_counts + num_chunks, 0, 8, stream));
    for (int g = 0; g < kGroups; ++g) {
        const std::uint64_t warps = group_prefix[g].back();
        if (warps == 0) continue;
        const auto blocks = unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
        const auto items = std::uint32_t(group_items[g].size());
        ForGroup(g / 2, overwrite, [&]<typename T, bool kOverwrite>() {
            MaskKernel<T, kOverwrite><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
                d_descs, d_items + group_at[g], d_prefix + group_prefix_at[g], items, warps, th, d_counts);
        });
        MCS_CUDA(cudaGetLastError());
    }
    std::size_t temp = scan_chunks;
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(d_scan_temp, temp, d_counts, d_offsets, num_chunks + 1, stream));
    if (num_tiles > 0) {
        TileRangeKernel<<<unsigned((num_tiles + 255) / 256), 256, 0, stream>>>(
            d_descs, d_tile_begin, n, num_tiles, d_offsets, d_tile_start, d_flags);
        MCS_CUDA(cudaGetLastError());
    }
    MCS_CUDA(cudaMemsetAsync(d_flags + num_tiles, 0, 4, stream));
    temp = scan_tiles;
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(d_scan_temp, temp, d_flags, d_tile_scan, num_tiles + 1, stream));
    CountsKernel<<<(n + 255) / 256, 256, 0, stream>>>(d_chunk_begin, d_tile_begin, n, d_offsets,
                                                      d_tile_scan, d_sizes);
    MCS_CUDA(cudaGetLastError());
    // The one host sync: every tensor's nnz and number of tiles.
    std::vector<std::uint64_t> sizes(std::size_t(n) * 2);
    MCS_CUDA(cudaMemcpyAsync(sizes.data(), d_sizes, sizes.size() * 8, cudaMemcpyDeviceToHost, stream));
    MCS_CUDA(cudaStreamSynchronize(stream));
    // One output allocation: sections by element size keep members aligned and back to back.
    std::uint64_t sec[6] = {0, 0, 0, 0, 0, 0};  // idx16, idx32, val2, val4, coords, ptr
    for (std::uint32_t i = 0; i < n; ++i) {
        const EncodePlan& p = plans[lo + i];
        const std::uint64_t nnz = sizes[2 * i], tiles = sizes[2 * i + 1];
        sec[p.wide ? 1 : 0] += nnz * p.rank * (p.wide ? 4 : 2);
        sec[p.value_class == 2 ? 3 : 2] += nnz * (p.value_class == 2 ? 4 : 2);
        sec[4] += tiles * p.rank * 4;
        sec[5] += (tiles + 1) * 8;
    }
    Carve oc;
    std::uint64_t sec_at[6];
    for (int k = 0; k < 6; ++k) sec_at[k] = oc.Add(sec[k]);
    MCS_ASSIGN_OR_RETURN(DeviceBuffer outbuf, DeviceBuffer::Allocate(oc.size(), device, s));
    auto keep = std::make_shared<DeviceBuffer>(std::move(outbuf));
    const std::uintptr_t base = keep->ptr().address;
    std::uint64_t cur[6];
    for (int k = 0; k < 6; ++k) cur[k] = base + sec_at[k];
    for (std::uint32_t i = 0; i < n; ++i) {
        const EncodePlan& p = plans[lo + i];
        GpuEncoded e;
        e.index_dtype = p.wide ? DType::kUInt32 : DType::kUInt16;
        e.value_dtype = news[lo + i].dtype;
        e.rank = p.rank;
        e.nnz = sizes[2 * i];
        e.num_tiles = sizes[2 * i + 1];
        e.tile_shape = p.tile;
        e.keepalive = keep;
        auto take = [&](int k, std::uint64_t bytes) {
            const DevicePtr at{cur[k], device};
            cur[k] += bytes;
            return at;
        };
        e.indices = take(p.wide ? 1 : 0, e.indices_bytes());
        e.values = take(p.value_class == 2 ? 3 : 2, e.values_bytes());
        e.tile_coords = take(4, e.num_tiles * e.rank * 4);
        e.tile_ptr = take(5, (e.num_tiles + 1) * 8);
        EncodeDesc& d = descs[i];
        d.out_idx = reinterpret_cast<void*>(e.indices.address);
        d.out_val = reinterpret_cast<void*>(e.values.address);
        d.out_coords = reinterpret_cast<std::uint32_t*>(e.tile_coords.address);
        d.out_ptr = reinterpret_cast<std::uint64_t*>(e.tile_ptr.address);
        out.push_back(std::move(e));
    }
    MCS_RETURN_IF_ERROR(Upload(descs, d_descs, stream));
    // Pass 2: entries from the masks, one launch per group; then the tile indexes.
    for (int g = 0; g < kGroups; ++g) {
        const std::uint64_t warps = group_prefix[g].back();
        if (warps == 0) continue;
        const auto blocks = unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
        const auto items = std::uint32_t(group_items[g].size());
        const bool wide = g % 2 == 1;
        ForGroup(g / 2, overwrite, [&]<typename T, bool kOverwrite>() {
            const EncodeDesc* dd = d_descs;
            const std::uint32_t* di = d_items + group_at[g];
            const std::uint64_t* dp = d_prefix + group_prefix_at[g];
            if (wide) {
                WriteKernel<T, kOverwrite, std::uint32_t><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
                    dd, di, dp, items, warps, d_offsets);
            } else {
                WriteKernel<T, kOverwrite, std::uint16_t><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
                    dd, di, dp, items, warps, d_offsets);
            }
        });
        MCS_CUDA(cudaGetLastError());
    }
    if (num_tiles > 0) {
        TileIndexKernel<<<unsigned((num_tiles + 255) / 256), 256, 0, stream>>>(
            d_descs, d_tile_begin, n, num_tiles, d_offsets, d_tile_start, d_flags, d_tile_scan);
        MCS_CUDA(cudaGetLastError());
    }
    TilePtrEndKernel<<<(n + 255) / 256, 256, 0, stream>>>(d_descs, n, d_sizes);
    MCS_CUDA(cudaGetLastError());
    return Status::Ok();  // ws is freed stream-ordered, after the kernels that read it
}

/// Launches of one apply group: check or apply, by (value class, index width).
void LaunchCheck(bool wide, const ApplyDesc* descs, const std::uint64_t* prefix, std::uint32_t n,
                 std::uint64_t entries, unsigned int* bad, cudaStream_t s) {
    const auto blocks = unsigned((entries + 256 * kCheckPerThread - 1) / (256 * kCheckPerThread));
    if (wide) {
        CheckKernel<std::uint32_t><<<blocks, 256, 0, s>>>(descs, prefix, n, entries, bad);
    } else {
        CheckKernel<std::uint16_t><<<blocks, 256, 0, s>>>(descs, prefix, n, entries, bad);
    }
}

void LaunchApply(int value_class, bool wide, const ApplyDesc* descs, const std::uint64_t* prefix,
                 std::uint32_t n, std::uint64_t entries, cudaStream_t s) {
    const auto blocks = unsigned((entries + 255) / 256);
    auto go = [&]<typename T>() {
        if (wide) {
            ApplyKernel<T, std::uint32_t><<<blocks, 256, 0, s>>>(descs, prefix, n, entries);
        } else {
            ApplyKernel<T, std::uint16_t><<<blocks, 256, 0, s>>>(descs, prefix, n, entries);
        }
    };
    if (value_class == 0) go.template operator()<__nv_bfloat16>();
    else if (value_class == 1) go.template operator()<__half>();
    else go.template operator()<float>();
}

Status CheckApplyItem(const ApplyItem& it, std::size_t n, std::size_t i) {
    const auto at = [&] { return ItemPrefix(n, i); };
    const DeviceArray& w = it.weight;
    MCS_RETURN_IF_ERROR(CheckDevice(w, {n, i, "weight"}));
    MCS_RETURN_IF_ERROR(CheckDevice(it.indices, {n, i, "indices"}));
    MCS_RETURN_IF_ERROR(CheckDevice(it.values, {n, i, "values"}));
    const std::size_t rank = w.shape.size();
    if (rank < 1 || rank > 3 || it.indices.shape.size() != 2 || Index(rank) != it.indices.shape[1] ||
        it.values.shape.size() != 1 || it.indices.shape[0] != it.values.shape[0]) {
        return InvalidArgument(at() +
                               "GPU apply takes a weight of rank 1 to 3, indices [nnz, rank] and "
                               "values [nnz]");
    }
    // An object without entries (a tensor a sealed step left unchanged) applies as a no-op to a
    // weight of any dtype, as on the host.
    if (it.values.dtype != w.dtype && it.values.shape[0] > 0) {
        return InvalidArgument(at() + "values dtype differs from the weight's");
    }
    if (ValueClass(w.dtype) < 0) {
        return InvalidArgument(at() + "GPU apply supports bfloat16, float16 and float32, not " +
                               std::string(DTypeName(w.dtype)));
    }
    if (it.indices.dtype != DType::kUInt16 && it.indices.dtype != DType::kUInt32) {
        return InvalidArgument(at() + "indices must be uint16 or uint32");
    }
    for (Index e : w.shape) {
        if (e > Index(std::numeric_limits<std::uint32_t>::max())) {
            return InvalidArgument(at() + "GPU apply supports extents below 2^32");
        }
    }
    MCS_RETURN_IF_ERROR(CheckContiguous(it.indices, {n, i, "indices"}));
    MCS_RETURN_IF_ERROR(CheckContiguous(it.values, {n, i, "values"}));
    // Unique coordinates write distinct elements only if the view gives every coordinate its
    // own element: a broadcast (stride 0) or expanded view would make writes race.
    if (!IsNonOverlapping(w.shape, w.strides)) {
        return InvalidArgument(at() +
                               "weight view has overlapping elements (a broadcast or expanded "
                               "view); apply needs one element per coordinate");
    }
    if (w.ptr.device != it.indices.ptr.device || w.ptr.device != it.values.ptr.device) {
        return InvalidArgument(at() + "weight, indices and values are on different devices");
    }
    return Status::Ok();
}

/// Whether [lo, hi) meets an interval of `wave` (disjoint intervals, begin -> end).
bool Overlaps(const std::map<std::uintptr_t, std::uintptr_t>& wave, std::uintptr_t lo, std::uintptr_t hi) {
    auto it = wave.upper_bound(lo);
    if (it != wave.begin() && std::prev(it)->second > lo) return true;
    return it != wave.end() && it->first < hi;
}

}  // namespace

bool Available() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

DeviceBuffer::~DeviceBuffer() {
    if (address_ != 0) {
        cudaFreeAsync(reinterpret_cast<void*>(address_), AsStream(stream_));
    }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : address_(o.address_), bytes_(o.bytes_), device_(o.device_), stream_(o.stream_) {
    o.address_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
        if (address_ != 0) cudaFreeAsync(reinterpret_cast<void*>(address_), AsStream(stream_));
        address_ = o.address_;
        bytes_ = o.bytes_;
        device_ = o.device_;
        stream_ = o.stream_;
        o.address_ = 0;
    }
    return *this;
}

namespace {

/// Bytes the device's default memory pool (cudaMallocAsync) keeps for reuse across syncs. Its
/// default, 0, hands every freed block back to the driver at the next sync, so each step would
/// map its buffers anew (tens of milliseconds per few hundred MB).
constexpr std::uint64_t kPoolKeepBytes = std::uint64_t(4) << 30;

void KeepPoolMemory(int device) {
    static std::mutex mu;
    static std::vector<bool> done;
    std::lock_guard lock(mu);
    if (device < 0) return;
    if (done.size() <= std::size_t(device)) done.resize(std::size_t(device) + 1, false);
    if (done[device]) return;
    done[device] = true;
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    std::uint64_t keep = kPoolKeepBytes;
    if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
        (void)cudaGetLastError();  // the pool then releases as before; nothing else changes
    }
}

}  // namespace

Result<DeviceBuffer> DeviceBuffer::Allocate(std::uint64_t bytes, int device, std::uintptr_t stream) {
    DeviceBuffer b;
    b.bytes_ = bytes;
    b.device_ = device;
    b.stream_ = stream;
    if (bytes == 0) return std::move(b);
    int current = 0;
    MCS_CUDA(cudaGetDevice(&current));
    if (current != device) MCS_CUDA(cudaSetDevice(device));
    KeepPoolMemory(device);
    void* p = nullptr;
    MCS_CUDA(cudaMallocAsync(&p, bytes, AsStream(stream)));
    b.address_ = reinterpret_cast<std::uintptr_t>(p);
    return std::move(b);
}

Result<std::vector<GpuEncoded>> EncodeUpdates(std::span<const DeviceArray> news,
                                              std::span<const DeviceArray> olds,
                                              const GpuEncodeOptions& opt) {
    if (news.size() != olds.size()) {
        return InvalidArgument(std::to_string(news.size()) + " new tensors but " +
                               std::to_string(olds.size()) + " old ones");
    }
    std::vector<GpuEncoded> out;
    if (news.empty()) return out;
    if (opt.apply == ApplyMode::kOverwrite && opt.threshold != 0.0) {
        return InvalidArgument("overwrite takes no threshold");
    }
    const int device = news[0].ptr.device;
    std::vector<EncodePlan> plans(news.size());
    for (std::size_t i = 0; i < news.size(); ++i) {
        const DeviceArray& nw = news[i];
        const DeviceArray& od = olds[i];
        const auto at = [&] { return ItemPrefix(news.size(), i); };
        MCS_RETURN_IF_ERROR(CheckDevice(nw, {news.size(), i, "new"}));
        MCS_RETURN_IF_ERROR(CheckDevice(od, {news.size(), i, "old"}));
        if (nw.dtype != od.dtype || nw.shape != od.shape) {
            return InvalidArgument(at() + "new and old differ in dtype or shape");
        }
        if (nw.ptr.device != od.ptr.device || nw.ptr.device != device) {
            return InvalidArgument(at() + "new and old must be on the batch's one device");
        }
        MCS_RETURN_IF_ERROR(CheckContiguous(nw, {news.size(), i, "new"}));
        MCS_RETURN_IF_ERROR(CheckContiguous(od, {news.size(), i, "old"}));
        const std::size_t rank = nw.shape.size();
        if (rank < 1 || rank > 3) {
            return InvalidArgument(at() + "GPU encode takes tensors of rank 1 to 3, not " +
                                   std::to_string(rank));
        }
        EncodePlan& p = plans[i];
        p.value_class = ValueClass(nw.dtype);
        if (p.value_class < 0) {
            return InvalidArgument(at() +
                                   "GPU encode supports bfloat16, float16 and float32, not " +
                                   std::string(DTypeName(nw.dtype)));
        }
        Index elements = 1;
        for (Index e : nw.shape) {
            if (e > Index(std::numeric_limits<std::uint32_t>::max())) {
                return InvalidArgument(at() + "GPU encode supports extents below 2^32");
            }
            elements *= e;
        }
        p.rank = std::uint32_t(rank);
        p.tile = opt.tile_shape ? ClampTileShape(*opt.tile_shape, nw.shape) : DefaultTileShape(nw.shape);
        p.wide = *std::max_element(nw.shape.begin(), nw.shape.end()) > 65536;
        if (elements == 0) {
            // As the host codec: a source tensor has at least one element per dimension.
            return InvalidArgument(at() + "shape has a non-positive extent");
        }
        MCS_RETURN_IF_ERROR(ValidateTileShape(p.tile, nw.shape));
        // [a, b, c] and its tile [ta, tb, tc], leading ones for ranks below 3.
        std::uint32_t ext[3] = {1, 1, 1}, tile[3] = {1, 1, 1};
        for (std::size_t d = 0; d < rank; ++d) {
            ext[3 - rank + d] = std::uint32_t(nw.shape[d]);
            tile[3 - rank + d] = std::uint32_t(p.tile[d]);
        }
        ChunkGeometry& g = p.g;
        g.a = ext[0]; g.b = ext[1]; g.c = ext[2];
        g.ta = tile[0]; g.tb = tile[1]; g.tc = tile[2];
        g.tiles_a = (g.a + g.ta - 1) / g.ta;
        g.tiles_b = (g.b + g.tb - 1) / g.tb;
        g.tiles_c = (g.c + g.tc - 1) / g.tc;
    }
    MCS_RETURN_IF_ERROR(UseDevice(device));
    out.reserve(news.size());
    // Sub-batches bound the workspace's per-chunk tables (16 bytes per chunk: 256 MiB at most);
    // the mask adds an eighth of a byte per element (each chunk's rounded up to 4 bytes), 1/32 of
    // the bytes of a bfloat16 pair.
    std::size_t lo = 0;
    while (lo < news.size()) {
        std::size_t hi = lo;
        std::uint64_t chunks = 0;
        while (hi < news.size()) {
            const std::uint64_t c = plans[hi].g.NumChunks();
            if (hi > lo && chunks + c > kMaxChunksPerPass) break;
            chunks += c;
            ++hi;
        }
        MCS_RETURN_IF_ERROR(EncodeRange(news, olds, plans, lo, hi, opt, device, out));
        lo = hi;
    }
    return out;
}

Result<GpuEncoded> EncodeUpdate(const DeviceArray& nw, const DeviceArray& od, const GpuEncodeOptions& opt) {
    MCS_ASSIGN_OR_RETURN(std::vector<GpuEncoded> r, EncodeUpdates({&nw, 1}, {&od, 1}, opt));
    return std::move(r[0]);
}

Status ApplySparseBatch(std::span<const ApplyItem> items, std::uintptr_t stream_handle) {
    if (items.empty()) return Status::Ok();
    const int device = items[0].weight.ptr.device;
    // Validate everything first; order the items into waves so that weights whose memory
    // overlaps apply in list order, and group each wave by (value class, index width).
    struct Member {
        std::uint32_t item;
        std::uint64_t nnz;
        int wave;
        int group;
    };
    std::vector<Member> members;
    std::vector<std::map<std::uintptr_t, std::uintptr_t>> waves;
    for (std::size_t i = 0; i < items.size(); ++i) {
        const ApplyItem& it = items[i];
        MCS_RETURN_IF_ERROR(CheckApplyItem(it, items.size(), i));
        if (it.weight.ptr.device != device) {
            return InvalidArgument(ItemPrefix(items.size(), i) + "items are on different devices");
        }
        const std::uint64_t nnz = std::uint64_t(it.values.shape[0]);
        if (nnz == 0) continue;
        const auto [lo_off, hi_off] = StridedExtent(it.weight.shape, it.weight.strides);
        const std::size_t esz = DTypeSize(it.weight.dtype);
        const std::uintptr_t lo = it.weight.ptr.address + std::intptr_t(lo_off * std::int64_t(esz));
        const std::uintptr_t hi = it.weight.ptr.address + std::intptr_t(hi_off * std::int64_t(esz)) + esz;
        int wave = 0;
        for (int k = int(waves.size()) - 1; k >= 0; --k) {
            if (Overlaps(waves[k], lo, hi)) {
                wave = k + 1;
                break;
            }
        }
        if (wave == int(waves.size())) waves.emplace_back();
        waves[wave][lo] = hi;
        const int group = ValueClass(it.weight.dtype) * 2 + (it.indices.dtype == DType::kUInt32 ? 1 : 0);
        members.push_back({std::uint32_t(i), nnz, wave, group});
    }
    if (members.empty()) return Status::Ok();
    std::stable_sort(members.begin(), members.end(), [](const Member& x, const Member& y) {
        return x.wave != y.wave ? x.wave < y.wave : x.group < y.group;
    });
    // Descriptors in that order; each (wave, group) run is one launch with its entry prefix.
    const auto n = std::uint32_t(members.size());
    std::vector<ApplyDesc> descs(n);
    std::vector<std::uint64_t> prefix;  // per run: its items' entry prefix (run size + 1)
    struct Run {
        std::uint32_t first, count;
        std::uint64_t prefix_at, entries;
        int group;
    };
    std::vector<Run> runs;
    for (std::uint32_t k = 0; k < n; ++k) {
        const Member& m = members[k];
        const ApplyItem& it = items[m.item];
        ApplyDesc& d = descs[k];
        d.w = reinterpret_cast<void*>(it.weight.ptr.address);
        d.idx = reinterpret_cast<const void*>(it.indices.ptr.address);
        d.val = reinterpret_cast<const void*>(it.values.ptr.address);
        d.rank = std::uint32_t(it.weight.shape.size());
        std::int64_t stride = 1;
        for (int dd = int(d.rank) - 1; dd >= 0; --dd) {
            d.shape[dd] = std::uint32_t(it.weight.shape[dd]);
            d.strides[dd] = it.weight.strides.empty() ? stride : it.weight.strides[dd];
            stride *= it.weight.shape[dd];
        }
        d.overwrite = it.apply == ApplyMode::kOverwrite ? 1u : 0u;
        d.item = m.item;
        if (runs.empty() || members[runs.back().first].wave != m.wave ||
            members[runs.back().first].group != m.group) {
            runs.push_back({k, 0, prefix.size(), 0, m.group});
            prefix.push_back(0);
        }
        Run& r = runs.back();
        ++r.count;
        r.entries += m.nnz;
        prefix.push_back(r.entries);
    }
    cudaStream_t stream = AsStream(stream_handle);
    MCS_RETURN_IF_ERROR(UseDevice(device));
    Carve c;
    const std::uint64_t o_descs = c.Add(n * sizeof(ApplyDesc));
    const std::uint64_t o_prefix = c.Add(prefix.size() * 8);
    const std::uint64_t o_bad = c.Add(8);
    MCS_ASSIGN_OR_RETURN(DeviceBuffer ws, DeviceBuffer::Allocate(c.size(), device, stream_handle));
    auto* d_descs = At<ApplyDesc>(ws, o_descs);
    auto* d_prefix = At<std::uint64_t>(ws, o_prefix);
    auto* d_bad = At<unsigned int>(ws, o_bad);
    MCS_RETURN_IF_ERROR(Upload(descs, d_descs, stream));
    MCS_RETURN_IF_ERROR(Upload(prefix, d_prefix, stream));
    const unsigned int init[2] = {0u, 0xffffffffu};
    MCS_CUDA(cudaMemcpyAsync(d_bad, init, 8, cudaMemcpyHostToDevice, stream));
    for (const Run& r : runs) {
        LaunchCheck(r.group % 2 == 1, d_descs + r.first, d_prefix + r.prefix_at, r.count, r.entries, d_bad, stream);
        MCS_CUDA(cudaGetLastError());
    }
    unsigned int bad[2] = {0, 0};
    MCS_CUDA(cudaMemcpyAsync(bad, d_bad, 8, cudaMemcpyDeviceToHost, stream));
    MCS_CUDA(cudaStreamSynchronize(stream));
    if (bad[0] != 0) {
        const ApplyItem& it = items[bad[1]];
        std::string shape;
        for (Index e : it.weight.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(e);
        return InvalidArgument(ItemPrefix(items.size(), bad[1]) + std::to_string(bad[0]) +
                               " coordinates lie outside the weight [" + shape +
                               "]; no weight changed");
    }
    for (const Run& r : runs) {
        LaunchApply(r.group / 2, r.group % 2 == 1, d_descs + r.first, d_prefix + r.prefix_at, r.count,
                    r.entries, stream);
        MCS_CUDA(cudaGetLastError());
    }
    return Status::Ok();
}

Status ApplySparse(const DeviceArray& w, const DeviceArray& idx, const DeviceArray& val, ApplyMode apply,
                   std::uintptr_t stream) {
    const ApplyItem item{w, idx, val, apply};
    return ApplySparseBatch({&item, 1}, stream);
}

namespace {

/// Transfers from which a batch goes to the driver as one cudaMemcpyBatchAsync: the engine
/// moves them with less time between them than as many cudaMemcpyAsync calls (H200, the 588
/// device-to-host transfers of a layer step's commit, 262 MB: 5.8 ms against 6.4).
constexpr std::size_t kBatchMinCopies = 8;
/// A batch of more transfers goes to the driver in calls of kBatchMinCopies, then each
/// kBatchGrowth times the one before: one call of the 592 transfers of a layer step's commit
/// held the host 0.7 ms before the engine moved its first byte (H100: the commit's fill took
/// 5.0-5.1 ms so, 5.5-5.8 in one call).
constexpr std::size_t kBatchGrowth = 4;

/// A device's side stream for batched copies (cudaMemcpyBatchAsync refuses the legacy default
/// stream) and the events that order it after and before the caller's stream; created once and
/// kept for the process's life. Held under `mu` while a batch is issued: a stream waits on an
/// event as it was recorded at the call, so the next batch may record it again afterwards.
struct SideStream {
    std::mutex mu;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr;
    cudaEvent_t done = nullptr;
};

/// Device `device`'s side stream, returned with its mutex held by `lock`.
Result<SideStream*> SideStreamOf(int device, std::unique_lock<std::mutex>& lock) {
    static std::mutex table_mu;
    static auto* table = new std::map<int, SideStream>;  // never destroyed (streams outlive exit)
    SideStream* s = nullptr;
    {
        std::lock_guard g(table_mu);
        s = &(*table)[device];
    }
    lock = std::unique_lock(s->mu);
    if (s->stream == nullptr) {
        MCS_CUDA(cudaEventCreateWithFlags(&s->start, cudaEventDisableTiming));
        MCS_CUDA(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
        MCS_CUDA(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    }
    return s;
}

/// Merges copies adjacent on both sides (after sorting by device address) and issues them,
/// ordered after the work on `stream` and before what is queued on it next. A batch of many
/// transfers goes as one cudaMemcpyBatchAsync on a side stream joined to `stream` by events;
/// with `alongside`, always on the side stream, and alongside() queues its own work on `stream`
/// meanwhile (the two run at the same time; the copies are joined after it).
Status CopyBatch(std::span<const HostDeviceCopy> copies, std::uintptr_t stream_handle, bool to_host,
                 bool wait = true, const std::function<Status()>* alongside = nullptr) {
    std::vector<HostDeviceCopy> sorted;
    sorted.reserve(copies.size());
    for (const HostDeviceCopy& c : copies) {
        if (!c.host.empty()) sorted.push_back(c);
    }
    cudaStream_t stream = AsStream(stream_handle);
    if (sorted.empty()) {
        if (alongside != nullptr) MCS_RETURN_IF_ERROR((*alongside)());
        if (wait && alongside != nullptr) MCS_CUDA(cudaStreamSynchronize(stream));
        return Status::Ok();
    }
    std::sort(sorted.begin(), sorted.end(), [](const HostDeviceCopy& x, const HostDeviceCopy& y) {
        return x.device.address < y.device.address;
    });
    const int device = sorted[0].device.device;
    MCS_RETURN_IF_ERROR(UseDevice(device));
    // The merged transfers as the batch call takes them.
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<std::size_t> sizes;
    dsts.reserve(sorted.size());
    srcs.reserve(sorted.size());
    sizes.reserve(sorted.size());
    std::uintptr_t dev = sorted[0].device.address;
    std::byte* host = sorted[0].host.data();
    std::size_t bytes = sorted[0].host.size();
    const auto add = [&] {
        void* d = reinterpret_cast<void*>(dev);
        dsts.push_back(to_host ? static_cast<void*>(host) : d);
        srcs.push_back(to_host ? static_cast<const void*>(d) : static_cast<const void*>(host));
        sizes.push_back(bytes);
    };
    for (std::size_t i = 1; i < sorted.size(); ++i) {
        const HostDeviceCopy& c = sorted[i];
        if (c.device.device == device && c.device.address == dev + bytes &&
            c.host.data() == host + bytes) {
            bytes += c.host.size();
            continue;
        }
        add();
        dev = c.device.address;
        host = c.host.data();
        bytes = c.host.size();
    }
    add();
    const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    const bool batch = sizes.size() >= kBatchMinCopies;
    if (!batch && alongside == nullptr) {
        for (std::size_t i = 0; i < sizes.size(); ++i) {
            MCS_CUDA(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], kind, stream));
        }
        if (wait) MCS_CUDA(cudaStreamSynchronize(stream));
        return Status::Ok();
    }
    std::unique_lock<std::mutex> lock;
    MCS_ASSIGN_OR_RETURN(SideStream * side, SideStreamOf(device, lock));
    MCS_CUDA(cudaEventRecord(side->start, stream));
    MCS_CUDA(cudaStreamWaitEvent(side->stream, side->start, 0));
    Status issued = Status::Ok();
    bool batch_failed = false;
    std::size_t batched = 0;  // transfers queued by batch calls
    if (batch) {
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        std::size_t attr_index = 0;
        // In calls of growing size, so that the engine starts on the first transfers while
        // the driver takes in the rest (a call's host time grows with its transfers).
        for (std::size_t piece = kBatchMinCopies; batched < sizes.size(); piece *= kBatchGrowth) {
            const std::size_t count = std::min(piece, sizes.size() - batched);
            const cudaError_t e = cudaMemcpyBatchAsync(dsts.data() + batched, srcs.data() + batched,
                                                       sizes.data() + batched, count, &attr,
                                                       &attr_index, 1, side->stream);
            if (e != cudaSuccess) {
                // A driver without batched copies: one transfer at a time below.
                (void)cudaGetLastError();
                batch_failed = true;
                break;
            }
            batched += count;
        }
    }
    if (!batch || batch_failed) {
        for (std::size_t i = batched; i < sizes.size() && issued.ok(); ++i) {
            issued = CudaError(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], kind, side->stream),
                               "cudaMemcpyAsync");
        }
    }
    // Whatever happened, what was queued on the side stream is joined (and waited for below)
    // before the caller may reuse the memory.
    MCS_CUDA(cudaEventRecord(side->done, side->stream));
    const Status beside = issued.ok() && alongside != nullptr ? (*alongside)() : Status::Ok();
    MCS_CUDA(cudaStreamWaitEvent(stream, side->done, 0));
    lock.unlock();
    if (wait || !issued.ok() || !beside.ok()) MCS_CUDA(cudaStreamSynchronize(stream));
    MCS_RETURN_IF_ERROR(issued);
    return beside;
}

struct Staging {
    std::mutex mu;
    std::byte* data = nullptr;
    std::uint64_t size = 0;
};

Staging& TheStaging() {
    static Staging* s = new Staging;  // never destroyed: leases may outlive static destruction
    return *s;
}

}  // namespace

Status CopyBatchToHost(std::span<const HostDeviceCopy> copies, std::uintptr_t stream) {
    return CopyBatch(copies, stream, true);
}

Status CopyBatchToHostAlongside(std::span<const HostDeviceCopy> copies, std::uintptr_t stream,
                                const std::function<Status()>& alongside) {
    return CopyBatch(copies, stream, true, true, &alongside);
}

Status CopyBatchToDevice(std::span<const HostDeviceCopy> copies, std::uintptr_t stream) {
    return CopyBatch(copies, stream, false);
}

Status EnqueueCopiesToDevice(std::span<const HostDeviceCopy> copies, std::uintptr_t stream) {
    return CopyBatch(copies, stream, false, false);
}

Status EnqueueCopiesToDeviceAlongside(std::span<const HostDeviceCopy> copies, std::uintptr_t stream,
                                      const std::function<Status()>& alongside) {
    return CopyBatch(copies, stream, false, false, &alongside);
}

PinnedStaging::Lease::Lease(Lease&& o) noexcept : owner_(o.owner_), bytes_(o.bytes_) { o.owner_ = nullptr; }

PinnedStaging::Lease& PinnedStaging::Lease::operator=(Lease&& o) noexcept {
    if (this != &o) {
        if (owner_ != nullptr) static_cast<Staging*>(owner_)->mu.unlock();
        owner_ = o.owner_;
        bytes_ = o.bytes_;
        o.owner_ = nullptr;
    }
    return *this;
}

PinnedStaging::Lease::~Lease() {
    if (owner_ != nullptr) static_cast<Staging*>(owner_)->mu.unlock();
}

Result<PinnedStaging::Lease> PinnedStaging::Acquire(std::uint64_t bytes) {
    Staging& s = TheStaging();
    s.mu.lock();
    if (s.size < bytes) {
        if (s.data != nullptr) cudaFreeHost(s.data);
        s.data = nullptr;
        s.size = 0;
        const std::uint64_t want = AlignUp(std::max<std::uint64_t>(bytes, 1), std::uint64_t(64) << 20);
        void* p = nullptr;
        const cudaError_t e = cudaHostAlloc(&p, want, cudaHostAllocPortable);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            s.mu.unlock();
            return CudaError(e, "cudaHostAlloc (staging)");
        }
        s.data = static_cast<std::byte*>(p);
        s.size = want;
    }
    return Lease(&s, {s.data, static_cast<std::size_t>(bytes)});
}


Status Synchronize(std::uintptr_t stream) {
    MCS_CUDA(cudaStreamSynchronize(AsStream(stream)));
    return Status::Ok();
}

Status CopyToDevice(std::span<const std::byte> src, DevicePtr dst, std::uintptr_t stream) {
    if (src.empty()) return Status::Ok();
    int current = 0;
    MCS_CUDA(cudaGetDevice(&current));
    if (current != dst.device) MCS_CUDA(cudaSetDevice(dst.device));
    MCS_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(dst.address), src.data(), src.size(),
                             cudaMemcpyHostToDevice, AsStream(stream)));
    MCS_CUDA(cudaStreamSynchronize(AsStream(stream)));
    return Status::Ok();
}

Status CopyToHost(DevicePtr src, std::span<std::byte> dst, std::uintptr_t stream) {
    if (dst.empty()) return Status::Ok();
    int current = 0;
    MCS_CUDA(cudaGetDevice(&current));
    if (current != src.device) MCS_CUDA(cudaSetDevice(src.device));
    MCS_CUDA(cudaMemcpyAsync(dst.data(), reinterpret_cast<const void*>(src.address), dst.size(),
                             cudaMemcpyDeviceToHost, AsStream(stream)));
    MCS_CUDA(cudaStreamSynchronize(AsStream(stream)));
    return Status::Ok();
}

}  // namespace mooncake::sparse::cuda
