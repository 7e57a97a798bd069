// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// IndexCanonicalBatch: the sorted fast path of a commit (codec/build.cc, SortedTileIndex2D and
// IndexCanonicalEntries) on the device, for a batch of rank-2 COOs in one go.
//
// Entries. The batch's entries are cut into blocks of 1024, each block within one item (an
// item's last block is partial). What the host path checks entry by entry in one sequential
// pass is a property of each pair of consecutive entries: both in the box, and the second after
// the first in (tile row-major, element row-major) order — strictly, so no coordinate repeats.
// Each thread checks the pairs of four consecutive entries and flags the item when one fails. An entry opens a tile
// when it is the item's first or its tile differs from its predecessor's; the number of
// openings per block, scanned over the batch, gives every opening its place in its item's tile
// index (within the item: the scan at the opening minus the scan at the item's first block),
// and a second pass over the blocks writes (tile coordinates, entry offset) there. Each item's
// tile index has room for min(nnz, tiles of the grid) tiles, which bounds a canonical item's;
// a non-canonical item may open more, which are not written (it is flagged anyway).
//
// Checksums: XXH3-64 of every item's indices and values bytes (codec/xxh3.h explains the
// split). One warp per full 1 KiB block of every member computes the block's eight lane sums;
// then one warp per member chains them (lanes 0-7, one lane each), adds the partial block and
// the last stripe, and merges; members of at most 240 bytes are hashed by one lane.
#include "cuda/gpu_index.h"

#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <limits>
#include <string>

#include "codec/xxh3.h"
#include "cuda/cuda_util.cuh"

namespace mooncake::sparse::cuda {
namespace {

constexpr unsigned kThreads = 256;     ///< Threads per block of every kernel.
constexpr unsigned kWarps = kThreads / 32;
/// Consecutive entries per thread of the entry kernels: a warp reads 512 bytes of narrow
/// indices in one 16-byte load per lane, and finds its block's item once per 1024 entries.
constexpr unsigned kPerThread = 4;
constexpr std::uint64_t kEntriesPerBlock = kThreads * kPerThread;
/// Above this many bytes of tile index room, the tile indexes come back after the sync, each
/// exactly as large as it turned out.
constexpr std::uint64_t kEagerTileBytes = std::uint64_t{64} << 20;

/// One item as the entry kernels see it.
struct ItemDesc {
    const void* indices;
    std::uint64_t nnz;
    std::uint64_t lo0, lo1;    ///< Box origin.
    std::uint64_t ext0, ext1;  ///< Box extents.
    std::uint64_t ts0, ts1;    ///< Tile extents.
    std::uint64_t grid1;       ///< Tiles per row of the grid.
    std::uint64_t tile_base;   ///< Its tile index's first slot in the batch's tile outputs.
    std::uint64_t tile_cap;    ///< Its tile index's room: min(nnz, tiles of the grid).
    std::uint32_t wide;        ///< uint32 indices (else uint16).
};

/// One member (an item's indices or values bytes) as the hash kernels see it.
struct MemberDesc {
    const std::uint8_t* data;
    std::uint64_t len;
    std::uint64_t block_begin;  ///< Its first full block in the batch's block sums.
};

/// Per item: what the host reads back.
struct ItemOut {
    unsigned long long bad;    ///< Nonzero: not canonical.
    unsigned long long tiles;  ///< Tile openings (its num_tiles when canonical).
    unsigned long long checksum_indices;
    unsigned long long checksum_values;
};

__device__ __forceinline__ void LoadEntry(const ItemDesc& d, std::uint64_t i, std::uint64_t& r,
                                          std::uint64_t& c) {
    if (d.wide) {
        const auto* p = static_cast<const std::uint32_t*>(d.indices) + 2 * i;
        r = p[0];
        c = p[1];
    } else {
        const auto* p = static_cast<const std::uint16_t*>(d.indices) + 2 * i;
        r = p[0];
        c = p[1];
    }
}

/// The tile coordinate of coordinate u (< 2^32) along a dimension tiled by ts: a 32-bit division
/// (a tile of 2^32 elements holds every coordinate).
__device__ __forceinline__ std::uint64_t TileCoordOf(std::uint64_t u, std::uint64_t ts) {
    return ts > 0xffffffffULL ? 0 : std::uint32_t(u) / std::uint32_t(ts);
}

/// An entry's tile coordinates and row-major tile number.
struct EntryTile {
    std::uint64_t tr, tc, t;
};

__device__ __forceinline__ EntryTile TileOf(const ItemDesc& d, std::uint64_t r, std::uint64_t c) {
    EntryTile e;
    e.tr = TileCoordOf(r, d.ts0);
    e.tc = TileCoordOf(c, d.ts1);
    e.t = e.tr * d.grid1 + e.tc;
    return e;
}

/// Where the entry kernels' thread works: its item and its first entry within the item.
struct EntrySlot {
    std::uint32_t item;
    std::uint64_t entry;
};

__device__ __forceinline__ EntrySlot SlotOf(const std::uint64_t* __restrict__ block_prefix,
                                            std::uint32_t n) {
    const std::uint32_t j = FindSegment(block_prefix, n, blockIdx.x);
    return {j, (blockIdx.x - block_prefix[j]) * kEntriesPerBlock + kPerThread * threadIdx.x};
}

/// A thread's entries: entries [first, first + count) of the item (count <= kPerThread), in
/// one or two 16-byte loads when they are whole and aligned; the rest zero.
struct Entries {
    std::uint64_t r[kPerThread];
    std::uint64_t c[kPerThread];
    std::uint32_t count;
};

__device__ __forceinline__ Entries LoadEntries(const ItemDesc& d, std::uint64_t first) {
    Entries e{};
    e.count = first < d.nnz ? std::uint32_t(min(std::uint64_t(kPerThread), d.nnz - first)) : 0u;
    if (d.wide) {
        const auto* p = static_cast<const std::uint32_t*>(d.indices) + 2 * first;
        if (e.count == kPerThread && reinterpret_cast<std::uintptr_t>(p) % 16 == 0) {
            const uint4 a = reinterpret_cast<const uint4*>(p)[0];
            const uint4 b = reinterpret_cast<const uint4*>(p)[1];
            e.r[0] = a.x; e.c[0] = a.y; e.r[1] = a.z; e.c[1] = a.w;
            e.r[2] = b.x; e.c[2] = b.y; e.r[3] = b.z; e.c[3] = b.w;
            return e;
        }
    } else {
        const auto* p = static_cast<const std::uint16_t*>(d.indices) + 2 * first;
        if (e.count == kPerThread && reinterpret_cast<std::uintptr_t>(p) % 16 == 0) {
            const uint4 a = *reinterpret_cast<const uint4*>(p);
            const std::uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (unsigned k = 0; k < kPerThread; ++k) {
                e.r[k] = w[k] & 0xffffu;
                e.c[k] = w[k] >> 16;
            }
            return e;
        }
    }
    for (unsigned k = 0; k < e.count; ++k) LoadEntry(d, first + k, e.r[k], e.c[k]);
    return e;
}

/// The entry before a thread's first one: the previous lane's last (its entries are whole
/// when this thread has any), else read. All lanes call it.
__device__ __forceinline__ void Predecessor(const ItemDesc& d, std::uint64_t first,
                                            const Entries& e, std::uint64_t& pr,
                                            std::uint64_t& pc) {
    pr = __shfl_up_sync(0xffffffffu, e.r[kPerThread - 1], 1);
    pc = __shfl_up_sync(0xffffffffu, e.c[kPerThread - 1], 1);
    if ((threadIdx.x & 31) == 0 && first > 0 && e.count > 0) LoadEntry(d, first - 1, pr, pc);
}

/// The sum of v over the block (every thread calls it; the result is thread 0's).
__device__ __forceinline__ unsigned BlockSum(unsigned v, unsigned* warp_sums) {
    for (int dd = 16; dd > 0; dd >>= 1) v += __shfl_xor_sync(0xffffffffu, v, dd);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned total = 0;
    if (threadIdx.x == 0) {
        for (unsigned w = 0; w < kWarps; ++w) total += warp_sums[w];
    }
    return total;
}

/// Pass 1: every entry against the box and its predecessor (the item is flagged when one
/// fails); per block, the number of entries that open a tile.
__global__ void CheckKernel(const ItemDesc* __restrict__ items,
                            const std::uint64_t* __restrict__ block_prefix, std::uint32_t n,
                            std::uint32_t* __restrict__ block_opens, ItemOut* __restrict__ out) {
    __shared__ unsigned warp_sums[kWarps];
    const EntrySlot s = SlotOf(block_prefix, n);
    const ItemDesc& d = items[s.item];
    const Entries e = LoadEntries(d, s.entry);
    std::uint64_t pr = 0, pc = 0;
    Predecessor(d, s.entry, e, pr, pc);
    unsigned opens = 0;
    bool bad = false;
    EntryTile p = TileOf(d, pr, pc);
    for (unsigned k = 0; k < e.count; ++k) {
        const std::uint64_t r = e.r[k], c = e.c[k];
        bad |= (r - d.lo0) >= d.ext0 || (c - d.lo1) >= d.ext1;
        const EntryTile t = TileOf(d, r, c);
        if (s.entry + k == 0) {
            ++opens;
        } else if (t.t == p.t) {
            bad |= !(r > pr || (r == pr && c > pc));  // row-major within the tile
        } else {
            bad |= t.t < p.t;
            ++opens;
        }
        p = t;
        pr = r;
        pc = c;
    }
    if (bad) atomicOr(&out[s.item].bad, 1ULL);
    const unsigned total = BlockSum(opens, warp_sums);
    if (threadIdx.x == 0) block_opens[blockIdx.x] = total;
}

/// Pass 2: every opening's tile coordinates and entry offset at its place in its item's tile
/// index (`offsets`: the exclusive scan of pass 1's counts).
__global__ void TileKernel(const ItemDesc* __restrict__ items,
                           const std::uint64_t* __restrict__ block_prefix, std::uint32_t n,
                           const std::uint64_t* __restrict__ offsets,
                           std::uint32_t* __restrict__ tile_coords,
                           std::uint64_t* __restrict__ tile_ptr) {
    __shared__ unsigned warp_opens[kWarps];
    const EntrySlot s = SlotOf(block_prefix, n);
    const ItemDesc& d = items[s.item];
    const Entries e = LoadEntries(d, s.entry);
    std::uint64_t pr = 0, pc = 0;
    Predecessor(d, s.entry, e, pr, pc);
    EntryTile tiles[kPerThread];
    unsigned open = 0;  // bit k: entry k opens a tile
    EntryTile p = TileOf(d, pr, pc);
#pragma unroll
    for (unsigned k = 0; k < kPerThread; ++k) {
        tiles[k] = TileOf(d, e.r[k], e.c[k]);
        if (k < e.count && (s.entry + k == 0 || tiles[k].t != p.t)) open |= 1u << k;
        p = tiles[k];
    }
    // The thread's openings before its own: a warp scan, then the warps before it.
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned mine = unsigned(__popc(open));
    unsigned incl = mine;
#pragma unroll
    for (unsigned dd = 1; dd < 32; dd <<= 1) {
        const unsigned v = __shfl_up_sync(0xffffffffu, incl, dd);
        if (lane >= dd) incl += v;
    }
    if (lane == 31) warp_opens[warp] = incl;
    __syncthreads();
    std::uint64_t before = incl - mine;
    for (unsigned w = 0; w < warp; ++w) before += warp_opens[w];
    if (open == 0) return;
    const std::uint64_t base = offsets[blockIdx.x] - offsets[block_prefix[s.item]];
    for (unsigned k = 0; k < kPerThread; ++k) {
        if ((open >> k & 1u) == 0) continue;
        const std::uint64_t at = base + before++;
        if (at >= d.tile_cap) return;  // a non-canonical item's surplus (flagged by pass 1)
        const std::uint64_t slot = d.tile_base + at;
        tile_coords[2 * slot] = std::uint32_t(tiles[k].tr);
        tile_coords[2 * slot + 1] = std::uint32_t(tiles[k].tc);
        tile_ptr[slot] = s.entry + k;
    }
}

/// An 8-byte little-endian word at any address, in the widest loads its alignment allows.
__device__ __forceinline__ std::uint64_t LoadWord(const std::uint8_t* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if ((a & 7) == 0) return *reinterpret_cast<const std::uint64_t*>(p);
    if ((a & 3) == 0) {
        const auto* q = reinterpret_cast<const std::uint32_t*>(p);
        return std::uint64_t{q[0]} | std::uint64_t{q[1]} << 32;
    }
    if ((a & 1) == 0) {
        const auto* q = reinterpret_cast<const std::uint16_t*>(p);
        return std::uint64_t{q[0]} | std::uint64_t{q[1]} << 16 | std::uint64_t{q[2]} << 32 |
               std::uint64_t{q[3]} << 48;
    }
    return xxh3::Read64(p);
}

/// The block sums: one warp per full 1 KiB block of the batch's members. Thread t takes the
/// words t, t + 32, t + 64 and t + 96 of the block (lane t % 8 of stripes t / 8 + 4k), sums
/// what they give their own lane and their pair lane, and the warp adds up each lane's share.
__global__ void HashBlocksKernel(const MemberDesc* __restrict__ members,
                                 const std::uint64_t* __restrict__ hash_prefix, std::uint32_t m,
                                 std::uint64_t num_blocks, std::uint64_t* __restrict__ sums) {
    __shared__ std::uint64_t secret_words[xxh3::kSecretSize / 8];
    if (threadIdx.x < xxh3::kSecretSize / 8) {
        const xxh3::Secret secret = xxh3::DefaultSecret();
        secret_words[threadIdx.x] = xxh3::Read64(secret.bytes + 8 * threadIdx.x);
    }
    __syncthreads();
    const unsigned lane = threadIdx.x & 31;
    const std::uint64_t g = std::uint64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (g >= num_blocks) return;
    const std::uint32_t k = FindSegment(hash_prefix, m, g);
    const std::uint8_t* block = members[k].data + (g - hash_prefix[k]) * xxh3::kBlockLen;
    const unsigned own = lane & 7;
    std::uint64_t mine = 0, pair = 0;
#pragma unroll
    for (unsigned q = 0; q < 4; ++q) {
        const unsigned stripe = (lane >> 3) + 4 * q;
        const std::uint64_t word = LoadWord(block + xxh3::kStripeLen * stripe + 8 * own);
        const xxh3::WordGain gain = xxh3::StripeWord(word, secret_words[stripe + own]);
        mine += gain.mine;
        pair += gain.pair;
    }
    // Threads of the same lane: t, t ^ 8, t ^ 16, t ^ 24.
    mine += __shfl_xor_sync(0xffffffffu, mine, 8);
    mine += __shfl_xor_sync(0xffffffffu, mine, 16);
    pair += __shfl_xor_sync(0xffffffffu, pair, 8);
    pair += __shfl_xor_sync(0xffffffffu, pair, 16);
    // Lane j gains its own products and the words of lane j ^ 1.
    const std::uint64_t total = mine + __shfl_xor_sync(0xffffffffu, pair, 1);
    if (lane < xxh3::kLanes) sums[g * xxh3::kLanes + lane] = total;
}

/// Per member, one warp: the hash (short members by lane 0; long ones by lanes 0-7 chaining
/// the block sums, then the merge). Also per item its number of tile openings.
__global__ void HashTailKernel(const MemberDesc* __restrict__ members, std::uint32_t m,
                               const std::uint64_t* __restrict__ sums,
                               const std::uint64_t* __restrict__ block_prefix,
                               const std::uint64_t* __restrict__ offsets,
                               ItemOut* __restrict__ out) {
    __shared__ std::uint8_t secret[xxh3::kSecretSize];
    if (threadIdx.x < xxh3::kSecretSize) {
        const xxh3::Secret s = xxh3::DefaultSecret();
        secret[threadIdx.x] = s.bytes[threadIdx.x];
    }
    __syncthreads();
    const unsigned lane = threadIdx.x & 31;
    const std::uint64_t w = std::uint64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (w >= m) return;
    const MemberDesc mem = members[w];
    std::uint64_t h = 0;
    if (mem.len <= xxh3::kMidSizeMax) {
        if (lane == 0) h = xxh3::HashShort(mem.data, mem.len, secret);
    } else {
        std::uint64_t acc = 0;
        if (lane < xxh3::kLanes) {
            const std::uint64_t key = xxh3::ScrambleKey(secret, lane);
            const std::uint64_t* s = sums + mem.block_begin * xxh3::kLanes + lane;
            const std::uint64_t blocks = xxh3::FullBlocks(mem.len);
            acc = xxh3::InitAcc(lane);
#pragma unroll 8
            for (std::uint64_t b = 0; b < blocks; ++b) {
                acc = xxh3::ScrambleWithKey(acc + s[b * xxh3::kLanes], key);
            }
            acc = xxh3::FinishLane(acc, mem.data, mem.len, secret, lane);
        }
        std::uint64_t accs[xxh3::kLanes];
#pragma unroll
        for (unsigned l = 0; l < xxh3::kLanes; ++l) accs[l] = __shfl_sync(0xffffffffu, acc, l);
        h = xxh3::MergeAccs(accs, mem.len, secret);
    }
    if (lane != 0) return;
    const std::uint64_t item = w / 2;
    if (w % 2 == 0) {
        out[item].checksum_indices = h;
        out[item].tiles = offsets[block_prefix[item + 1]] - offsets[block_prefix[item]];
    } else {
        out[item].checksum_values = h;
    }
}

/// Whether the device takes an item: what the host path checks before it reads an entry
/// (PlanCanonicalEntries made these checks too; they are repeated so that a kernel never
/// reads outside an array or divides by zero, whatever the caller passes).
bool Launchable(const IndexItem& it) {
    const auto two = [](const Shape& s) { return s.size() == 2; };
    if (!two(it.global_shape) || !two(it.box_origin) || !two(it.box_shape) ||
        !two(it.tile_shape) || it.nnz == 0 || DTypeSize(it.value_dtype) == 0) {
        return false;
    }
    const Index max_extent = std::max(it.global_shape[0], it.global_shape[1]);
    if (it.index_dtype != NarrowestIndexDType(max_extent) ||
        (it.index_dtype != DType::kUInt16 && it.index_dtype != DType::kUInt32)) {
        return false;
    }
    for (std::size_t d = 0; d < 2; ++d) {
        const Index g = it.global_shape[d];
        if (g < 1 || it.box_origin[d] < 0 || it.box_shape[d] < 1 ||
            it.box_origin[d] > g - it.box_shape[d] || it.tile_shape[d] < 1 ||
            it.tile_shape[d] > g) {
            return false;
        }
    }
    const std::uint64_t isz = DTypeSize(it.index_dtype);
    if (it.indices.address == 0 || it.values.address == 0 || it.indices.address % isz != 0 ||
        it.nnz > (std::numeric_limits<std::uint64_t>::max() >> 4) / DTypeSize(it.value_dtype)) {
        return false;
    }
    return it.indices.device == it.values.device;
}

/// Tiles of the item's grid, saturating.
std::uint64_t GridTiles(const IndexItem& it) {
    std::uint64_t tiles = 1;
    for (std::size_t d = 0; d < 2; ++d) {
        const auto g = std::uint64_t(it.global_shape[d]), t = std::uint64_t(it.tile_shape[d]);
        const std::uint64_t n = g / t + (g % t != 0);
        if (__builtin_mul_overflow(tiles, n, &tiles)) {
            return std::numeric_limits<std::uint64_t>::max();
        }
    }
    return tiles;
}

unsigned Blocks(std::uint64_t units, std::uint64_t per_block) {
    return unsigned((units + per_block - 1) / per_block);
}

}  // namespace

Result<std::vector<IndexResult>> IndexCanonicalBatch(std::span<const IndexItem> items,
                                                     std::uintptr_t stream_handle) {
    std::vector<IndexResult> results(items.size());
    std::vector<std::size_t> live;
    int device = -1;
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (!Launchable(items[i])) continue;
        if (device < 0) device = items[i].indices.device;
        if (items[i].indices.device != device) {
            return InvalidArgument("item " + std::to_string(i) +
                                   ": the batch's arrays are on different devices");
        }
        live.push_back(i);
    }
    if (live.empty()) return results;
    const auto n = std::uint32_t(live.size());
    const std::uint32_t m = 2 * n;
    // Host tables: item and member descriptors, block prefixes, tile index room.
    std::vector<ItemDesc> descs(n);
    std::vector<MemberDesc> members(m);
    std::vector<std::uint64_t> block_prefix(n + 1, 0), hash_prefix(m + 1, 0);
    std::uint64_t tile_room = 0;
    for (std::uint32_t k = 0; k < n; ++k) {
        const IndexItem& it = items[live[k]];
        ItemDesc& d = descs[k];
        d.indices = reinterpret_cast<const void*>(it.indices.address);
        d.nnz = it.nnz;
        d.lo0 = std::uint64_t(it.box_origin[0]);
        d.lo1 = std::uint64_t(it.box_origin[1]);
        d.ext0 = std::uint64_t(it.box_shape[0]);
        d.ext1 = std::uint64_t(it.box_shape[1]);
        d.ts0 = std::uint64_t(it.tile_shape[0]);
        d.ts1 = std::uint64_t(it.tile_shape[1]);
        const auto g1 = std::uint64_t(it.global_shape[1]);
        d.grid1 = g1 / d.ts1 + (g1 % d.ts1 != 0);
        d.tile_base = tile_room;
        d.tile_cap = std::min(it.nnz, GridTiles(it));
        d.wide = it.index_dtype == DType::kUInt32 ? 1u : 0u;
        tile_room += d.tile_cap;
        block_prefix[k + 1] = block_prefix[k] + (it.nnz + kEntriesPerBlock - 1) / kEntriesPerBlock;
        const std::uint64_t lens[2] = {it.nnz * 2 * DTypeSize(it.index_dtype),
                                       it.nnz * DTypeSize(it.value_dtype)};
        const std::uintptr_t data[2] = {it.indices.address, it.values.address};
        for (std::uint32_t h = 0; h < 2; ++h) {
            MemberDesc& md = members[2 * k + h];
            md.data = reinterpret_cast<const std::uint8_t*>(data[h]);
            md.len = lens[h];
            md.block_begin = hash_prefix[2 * k + h];
            const std::uint64_t blocks =
                md.len > xxh3::kMidSizeMax ? xxh3::FullBlocks(md.len) : 0;
            hash_prefix[2 * k + h + 1] = md.block_begin + blocks;
        }
    }
    const std::uint64_t entry_blocks = block_prefix[n];
    const std::uint64_t hash_blocks = hash_prefix[m];
    constexpr std::uint64_t kMaxGrid = std::numeric_limits<std::int32_t>::max();
    if (entry_blocks > kMaxGrid || Blocks(hash_blocks, kWarps) > kMaxGrid) {
        return InvalidArgument("the batch is too large for one index pass");
    }
    cudaStream_t stream = AsStream(stream_handle);
    int current = 0;
    MCS_CUDA(cudaGetDevice(&current));
    if (current != device) MCS_CUDA(cudaSetDevice(device));
    std::size_t scan_bytes = 0;
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes,
                                                 static_cast<std::uint32_t*>(nullptr),
                                                 static_cast<std::uint64_t*>(nullptr),
                                                 entry_blocks + 1, stream));
    Carve c;
    const std::uint64_t o_descs = c.Add(n * sizeof(ItemDesc));
    const std::uint64_t o_members = c.Add(m * sizeof(MemberDesc));
    const std::uint64_t o_block_prefix = c.Add((n + 1) * 8);
    const std::uint64_t o_hash_prefix = c.Add((m + 1) * 8);
    const std::uint64_t o_opens = c.Add((entry_blocks + 1) * 4);
    const std::uint64_t o_offsets = c.Add((entry_blocks + 1) * 8);
    const std::uint64_t o_scan = c.Add(scan_bytes);
    const std::uint64_t o_coords = c.Add(tile_room * 8);
    const std::uint64_t o_ptr = c.Add(tile_room * 8);
    const std::uint64_t o_sums = c.Add(hash_blocks * xxh3::kLanes * 8);
    const std::uint64_t o_out = c.Add(n * sizeof(ItemOut));
    MCS_ASSIGN_OR_RETURN(DeviceBuffer ws, DeviceBuffer::Allocate(c.size(), device, stream_handle));
    auto* d_descs = At<ItemDesc>(ws, o_descs);
    auto* d_members = At<MemberDesc>(ws, o_members);
    auto* d_block_prefix = At<std::uint64_t>(ws, o_block_prefix);
    auto* d_hash_prefix = At<std::uint64_t>(ws, o_hash_prefix);
    auto* d_opens = At<std::uint32_t>(ws, o_opens);
    auto* d_offsets = At<std::uint64_t>(ws, o_offsets);
    void* d_scan = At<void>(ws, o_scan);
    auto* d_coords = At<std::uint32_t>(ws, o_coords);
    auto* d_ptr = At<std::uint64_t>(ws, o_ptr);
    auto* d_sums = At<std::uint64_t>(ws, o_sums);
    auto* d_out = At<ItemOut>(ws, o_out);
    const auto upload = [&](const void* host, void* dev, std::size_t bytes) -> Status {
        MCS_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
        return Status::Ok();
    };
    MCS_RETURN_IF_ERROR(upload(descs.data(), d_descs, n * sizeof(ItemDesc)));
    MCS_RETURN_IF_ERROR(upload(members.data(), d_members, m * sizeof(MemberDesc)));
    MCS_RETURN_IF_ERROR(upload(block_prefix.data(), d_block_prefix, (n + 1) * 8));
    MCS_RETURN_IF_ERROR(upload(hash_prefix.data(), d_hash_prefix, (m + 1) * 8));
    MCS_CUDA(cudaMemsetAsync(d_out, 0, n * sizeof(ItemOut), stream));
    MCS_CUDA(cudaMemsetAsync(d_opens + entry_blocks, 0, 4, stream));

    CheckKernel<<<unsigned(entry_blocks), kThreads, 0, stream>>>(d_descs, d_block_prefix, n,
                                                                 d_opens, d_out);
    MCS_CUDA(cudaGetLastError());
    std::size_t temp = scan_bytes;
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(d_scan, temp, d_opens, d_offsets,
                                                 entry_blocks + 1, stream));
    TileKernel<<<unsigned(entry_blocks), kThreads, 0, stream>>>(d_descs, d_block_prefix, n,
                                                                d_offsets, d_coords, d_ptr);
    MCS_CUDA(cudaGetLastError());
    if (hash_blocks > 0) {
        HashBlocksKernel<<<Blocks(hash_blocks, kWarps), kThreads, 0, stream>>>(
            d_members, d_hash_prefix, m, hash_blocks, d_sums);
        MCS_CUDA(cudaGetLastError());
    }
    HashTailKernel<<<Blocks(m, kWarps), kThreads, 0, stream>>>(d_members, m, d_sums,
                                                              d_block_prefix, d_offsets, d_out);
    MCS_CUDA(cudaGetLastError());

    // The one host sync: every item's verdict and checksums, and (when small) the tile indexes.
    std::vector<ItemOut> out(n);
    std::vector<std::uint32_t> coords;
    std::vector<std::uint64_t> ptr;
    const bool eager = tile_room * 16 <= kEagerTileBytes;
    MCS_CUDA(cudaMemcpyAsync(out.data(), d_out, n * sizeof(ItemOut), cudaMemcpyDeviceToHost,
                                   stream));
    if (eager && tile_room > 0) {
        coords.resize(tile_room * 2);
        ptr.resize(tile_room);
        MCS_CUDA(cudaMemcpyAsync(coords.data(), d_coords, tile_room * 8,
                                       cudaMemcpyDeviceToHost, stream));
        MCS_CUDA(cudaMemcpyAsync(ptr.data(), d_ptr, tile_room * 8, cudaMemcpyDeviceToHost,
                                       stream));
    }
    MCS_CUDA(cudaStreamSynchronize(stream));
    const auto canonical = [&](std::uint32_t k) {
        return out[k].bad == 0 && out[k].tiles >= 1 && out[k].tiles <= descs[k].tile_cap;
    };
    if (!eager) {
        // Large tile index room: each canonical item's tile index alone, as large as it is.
        std::vector<std::uint64_t> at(n, 0);
        std::uint64_t total = 0;
        for (std::uint32_t k = 0; k < n; ++k) {
            at[k] = total;
            if (canonical(k)) total += out[k].tiles;
        }
        coords.resize(total * 2);
        ptr.resize(total);
        for (std::uint32_t k = 0; k < n; ++k) {
            if (!canonical(k)) continue;
            const std::uint64_t tiles = out[k].tiles, base = descs[k].tile_base;
            MCS_CUDA(cudaMemcpyAsync(coords.data() + 2 * at[k], d_coords + 2 * base,
                                           tiles * 8, cudaMemcpyDeviceToHost, stream));
            MCS_CUDA(cudaMemcpyAsync(ptr.data() + at[k], d_ptr + base, tiles * 8,
                                           cudaMemcpyDeviceToHost, stream));
            descs[k].tile_base = at[k];  // where it now lies in `coords` / `ptr`
        }
        MCS_CUDA(cudaStreamSynchronize(stream));
    }
    for (std::uint32_t k = 0; k < n; ++k) {
        if (!canonical(k)) continue;
        IndexResult& r = results[live[k]];
        const std::uint64_t tiles = out[k].tiles, base = descs[k].tile_base;
        r.tile_coords.assign(coords.begin() + std::ptrdiff_t(2 * base),
                             coords.begin() + std::ptrdiff_t(2 * (base + tiles)));
        r.tile_ptr.assign(ptr.begin() + std::ptrdiff_t(base),
                          ptr.begin() + std::ptrdiff_t(base + tiles));
        r.tile_ptr.push_back(descs[k].nnz);
        r.checksum_indices = out[k].checksum_indices;
        r.checksum_values = out[k].checksum_values;
        r.canonical = r.tile_ptr.front() == 0;
    }
    return results;  // ws is freed stream-ordered, after the kernels that read it
}

}  // namespace mooncake::sparse::cuda
