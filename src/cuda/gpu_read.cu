// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// A planned read on the device. The gather is one kernel whose blocks each copy up to 64 KiB of
// one range from page-locked host memory (read over PCIe by the SMs: one launch moves thousands
// of scattered ranges, where the copy engine would take one transfer, and its fixed cost, per
// range). Filter and rebase work on chunks of up to kChunkEntries entries of one piece, one block
// per chunk: pass 1 counts the kept entries of filtered chunks (an unfiltered chunk keeps all),
// a scan gives every chunk its place in its target, pass 2 writes the entries in order (warp
// ballots and a scan of the block's per-warp counts keep the entry order). A block's threads
// take a chunk's entries round by round, consecutive threads consecutive entries (coalesced).
#include "cuda/gpu_read.h"

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "cuda/cuda_util.cuh"

namespace mooncake::sparse::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::uint64_t kGatherUnitBytes = std::uint64_t{64} << 10;
constexpr int kEntriesPerThread = 8;
constexpr std::uint64_t kChunkEntries = std::uint64_t{kThreads} * kEntriesPerThread;

/// One block's share of a gather: `bytes` (<= kGatherUnitBytes) from src to dst.
struct GatherUnit {
    std::uintptr_t src;
    std::uintptr_t dst;
    std::uint64_t bytes;
};

__global__ void GatherKernel(const GatherUnit* __restrict__ units) {
    const GatherUnit u = units[blockIdx.x];
    const auto* src = reinterpret_cast<const unsigned char*>(u.src);
    auto* dst = reinterpret_cast<unsigned char*>(u.dst);
    // Bytes until the source is 16-byte aligned, then 16-byte words when the destination is
    // aligned alike (the caller lays the staging out so), then the tail.
    std::uint64_t head = (16 - (u.src & 15)) & 15;
    if (head > u.bytes) head = u.bytes;
    const bool words = ((u.src + head) & 15) == 0 && ((u.dst + head) & 15) == 0;
    if (!words) head = u.bytes;
    for (std::uint64_t i = threadIdx.x; i < head; i += blockDim.x) dst[i] = src[i];
    if (!words) return;
    const std::uint64_t n = (u.bytes - head) / 16;
    const auto* s4 = reinterpret_cast<const uint4*>(src + head);
    auto* d4 = reinterpret_cast<uint4*>(dst + head);
    // Four loads in flight per thread before their stores: PCIe reads are long.
    std::uint64_t i = threadIdx.x;
    for (; i + 3 * blockDim.x < n; i += 4 * blockDim.x) {
        const uint4 a = s4[i], b = s4[i + blockDim.x], c = s4[i + 2 * blockDim.x],
                    d = s4[i + 3 * blockDim.x];
        d4[i] = a;
        d4[i + blockDim.x] = b;
        d4[i + 2 * blockDim.x] = c;
        d4[i + 3 * blockDim.x] = d;
    }
    for (; i < n; i += blockDim.x) d4[i] = s4[i];
    const std::uint64_t done = head + n * 16;
    for (std::uint64_t k = done + threadIdx.x; k < u.bytes; k += blockDim.x) dst[k] = src[k];
}

/// One chunk of a piece: entries [first, first + count) of pieces[piece].
struct Chunk {
    std::uint64_t first;
    std::uint32_t piece;
    std::uint32_t count;
};

__device__ __forceinline__ std::uint64_t LoadUnsigned(const unsigned char* p, std::uint32_t size) {
    switch (size) {
        case 2: return *reinterpret_cast<const std::uint16_t*>(p);
        case 4: return *reinterpret_cast<const std::uint32_t*>(p);
        default: return *reinterpret_cast<const std::uint64_t*>(p);
    }
}

__device__ __forceinline__ void StoreUnsigned(unsigned char* p, std::uint32_t size, std::uint64_t v) {
    switch (size) {
        case 2: *reinterpret_cast<std::uint16_t*>(p) = static_cast<std::uint16_t>(v); break;
        case 4: *reinterpret_cast<std::uint32_t*>(p) = static_cast<std::uint32_t>(v); break;
        default: *reinterpret_cast<std::uint64_t*>(p) = v; break;
    }
}

__device__ __forceinline__ void CopyValue(unsigned char* dst, const unsigned char* src,
                                          std::uint32_t size) {
    switch (size) {
        case 1: *dst = *src; break;
        case 2: *reinterpret_cast<std::uint16_t*>(dst) = *reinterpret_cast<const std::uint16_t*>(src); break;
        case 4: *reinterpret_cast<std::uint32_t*>(dst) = *reinterpret_cast<const std::uint32_t*>(src); break;
        default: *reinterpret_cast<std::uint64_t*>(dst) = *reinterpret_cast<const std::uint64_t*>(src); break;
    }
}

/// Whether entry e of a filtered piece lies inside its box.
__device__ __forceinline__ bool Inside(const unsigned char* idx, std::uint64_t e, std::uint32_t rank,
                                       std::uint32_t isz, const std::int64_t* __restrict__ lo,
                                       const std::int64_t* __restrict__ hi) {
    const unsigned char* at = idx + e * rank * isz;
    for (std::uint32_t d = 0; d < rank; ++d) {
        const auto v = static_cast<std::int64_t>(LoadUnsigned(at + d * isz, isz));
        if (v < lo[d] || v >= hi[d]) return false;
    }
    return true;
}

/// Entry k * kThreads + threadIdx.x of a chunk is thread threadIdx.x's k-th (k < kEntriesPerThread):
/// a warp's loads and stores of one round touch consecutive entries (coalesced).
/// Pass 1: per chunk, the entries it keeps.
__global__ void CountKernel(const Chunk* __restrict__ chunks, const RebasePiece* __restrict__ pieces,
                            const RebaseTarget* __restrict__ targets, const std::int64_t* __restrict__ bounds,
                            const unsigned char* __restrict__ staging, std::uint64_t* __restrict__ counts) {
    using Reduce = cub::BlockReduce<std::uint32_t, kThreads>;
    __shared__ typename Reduce::TempStorage temp;
    const Chunk c = chunks[blockIdx.x];
    const RebasePiece& p = pieces[c.piece];
    if (!p.filter) {
        if (threadIdx.x == 0) counts[blockIdx.x] = c.count;
        return;
    }
    const RebaseTarget& t = targets[p.target];
    const unsigned char* idx = staging + p.indices_offset;
    const std::int64_t* lo = bounds + p.box;
    const std::int64_t* hi = lo + t.rank;
    std::uint32_t mine = 0;
    for (std::uint32_t k = 0; k < kEntriesPerThread; ++k) {
        const std::uint32_t i = k * kThreads + threadIdx.x;
        if (i < c.count && Inside(idx, c.first + i, t.rank, p.index_size, lo, hi)) ++mine;
    }
    const std::uint32_t total = Reduce(temp).Sum(mine);
    if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

/// Per target: its kept entries (the scan's span over its chunks).
__global__ void KeptKernel(const std::uint64_t* __restrict__ target_chunks, std::uint64_t num_targets,
                           const std::uint64_t* __restrict__ positions, std::uint64_t* __restrict__ kept) {
    const std::uint64_t t = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= num_targets) return;
    kept[t] = positions[target_chunks[t + 1]] - positions[target_chunks[t]];
}

constexpr int kWarps = kThreads / 32;

/// Pass 2: each chunk's kept entries, rebased, at its place in its target. Entry order is kept:
/// a round's kept entries follow every earlier round's, within a round a warp's follow the
/// warps before it (the block's per-round, per-warp counts, scanned in that order).
__global__ void WriteKernel(const Chunk* __restrict__ chunks, const RebasePiece* __restrict__ pieces,
                            const RebaseTarget* __restrict__ targets, const std::int64_t* __restrict__ bounds,
                            const std::uint64_t* __restrict__ target_chunks,
                            const std::uint64_t* __restrict__ positions,
                            const unsigned char* __restrict__ staging, unsigned char* __restrict__ out) {
    __shared__ std::uint32_t before[kEntriesPerThread * kWarps];
    const Chunk c = chunks[blockIdx.x];
    const RebasePiece& p = pieces[c.piece];
    const RebaseTarget& t = targets[p.target];
    const unsigned char* idx = staging + p.indices_offset;
    const unsigned char* val = staging + p.values_offset;
    const std::uint32_t rank = t.rank, isz = p.index_size, osz = t.index_size, vsz = t.value_size;
    const std::int64_t* lo = p.filter ? bounds + p.box : nullptr;
    const std::int64_t* hi = p.filter ? lo + rank : nullptr;
    const std::int64_t* origin = bounds + t.origin;
    const std::uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    std::uint32_t ballots[kEntriesPerThread];
    for (std::uint32_t k = 0; k < kEntriesPerThread; ++k) {
        const std::uint32_t i = k * kThreads + threadIdx.x;
        const bool keep = i < c.count && (!p.filter || Inside(idx, c.first + i, rank, isz, lo, hi));
        ballots[k] = __ballot_sync(0xffffffffu, keep);
        if (lane == 0) before[k * kWarps + warp] = static_cast<std::uint32_t>(__popc(ballots[k]));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        std::uint32_t run = 0;
        for (int j = 0; j < kEntriesPerThread * kWarps; ++j) {
            const std::uint32_t n = before[j];
            before[j] = run;
            run += n;
        }
    }
    __syncthreads();
    // The chunk's first entry within its target: its position past the target's first chunk.
    const std::uint64_t first = positions[blockIdx.x] - positions[target_chunks[p.target]];
    unsigned char* out_idx = out + t.indices_offset;
    unsigned char* out_val = out + t.values_offset;
    const std::uint32_t lower = (1u << lane) - 1u;
    for (std::uint32_t k = 0; k < kEntriesPerThread; ++k) {
        if ((ballots[k] & (1u << lane)) == 0) continue;
        const std::uint64_t e = c.first + k * kThreads + threadIdx.x;
        const std::uint64_t at =
            first + before[k * kWarps + warp] + static_cast<std::uint32_t>(__popc(ballots[k] & lower));
        const unsigned char* from = idx + e * rank * isz;
        unsigned char* to = out_idx + at * rank * osz;
        for (std::uint32_t d = 0; d < rank; ++d) {
            const auto v = static_cast<std::int64_t>(LoadUnsigned(from + d * isz, isz));
            StoreUnsigned(to + d * osz, osz, static_cast<std::uint64_t>(v - origin[d]));
        }
        CopyValue(out_val + at * vsz, val + e * vsz, vsz);
    }
}

bool IndexSize(std::uint32_t s) { return s == 2 || s == 4 || s == 8; }
bool ValueSize(std::uint32_t s) { return s == 1 || s == 2 || s == 4 || s == 8; }

}  // namespace

bool HostPointersAreDeviceAddresses(int device) {
    // Asked once per device: the answer is the hardware's.
    static std::mutex mu;
    static std::map<int, bool> known;
    std::lock_guard lock(mu);
    auto it = known.find(device);
    if (it != known.end()) return it->second;
    int can = 0;
    if (cudaDeviceGetAttribute(&can, cudaDevAttrCanUseHostPointerForRegisteredMem, device) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        can = 0;
    }
    known.emplace(device, can != 0);
    return can != 0;
}

std::optional<std::uintptr_t> DeviceAddressOfHost(const void* host, int device) {
    if (host == nullptr) return std::nullopt;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
        (void)cudaGetLastError();
        return std::nullopt;
    }
    if (attr.type != cudaMemoryTypeHost || attr.devicePointer == nullptr) return std::nullopt;
    // Registered memory is portable (every device maps it); with unified addressing its device
    // address is the same on each of them.
    int unified = 0;
    if (cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device) != cudaSuccess ||
        unified == 0) {
        (void)cudaGetLastError();
        return std::nullopt;
    }
    return reinterpret_cast<std::uintptr_t>(attr.devicePointer);
}

Status CopyRanges(std::span<const RangeCopy> copies, int device, std::uintptr_t stream) {
    std::vector<GatherUnit> units;
    for (const RangeCopy& c : copies) {
        if (c.src + c.bytes < c.src || c.dst + c.bytes < c.dst) {
            return InvalidArgument("copy range wraps around the address space");
        }
        // Units end on 16-byte bounds of the source, so that every unit but a copy's first
        // starts aligned.
        std::uint64_t done = 0;
        while (done < c.bytes) {
            const std::uintptr_t src = c.src + done;
            const std::uint64_t to_bound = kGatherUnitBytes - (src & 15);
            const std::uint64_t n = std::min<std::uint64_t>(c.bytes - done, to_bound);
            units.push_back({src, c.dst + done, n});
            done += n;
        }
    }
    if (units.empty()) return Status::Ok();
    MCS_RETURN_IF_ERROR(UseDevice(device));
    cudaStream_t s = AsStream(stream);
    MCS_ASSIGN_OR_RETURN(DeviceBuffer table,
                         DeviceBuffer::Allocate(units.size() * sizeof(GatherUnit), device, stream));
    MCS_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(table.ptr().address), units.data(),
                             units.size() * sizeof(GatherUnit), cudaMemcpyHostToDevice, s));
    // Grids of at most 2^31 - 1 blocks: 128 TiB per launch.
    GatherKernel<<<static_cast<unsigned>(units.size()), kThreads, 0, s>>>(
        reinterpret_cast<const GatherUnit*>(table.ptr().address));
    MCS_CUDA(cudaGetLastError());
    return Status::Ok();  // the table is freed stream-ordered, after the kernel
}

Status CopyRangesToDevice(std::span<const RangeCopy> copies, int device, std::uintptr_t stream,
                          std::uint64_t engine_min_bytes) {
    if (engine_min_bytes == 0) return CopyRanges(copies, device, stream);
    // Runs of ranges that follow each other in both source and destination.
    std::vector<RangeCopy> runs;
    runs.reserve(copies.size());
    for (const RangeCopy& c : copies) {
        if (c.src + c.bytes < c.src || c.dst + c.bytes < c.dst) {
            return InvalidArgument("copy range wraps around the address space");
        }
        if (c.bytes == 0) continue;
        if (!runs.empty() && runs.back().src + runs.back().bytes == c.src &&
            runs.back().dst + runs.back().bytes == c.dst) {
            runs.back().bytes += c.bytes;
        } else {
            runs.push_back(c);
        }
    }
    std::vector<RangeCopy> kernel;
    std::vector<HostDeviceCopy> engine;
    for (const RangeCopy& r : runs) {
        if (r.bytes >= engine_min_bytes) {
            engine.push_back({{r.dst, device},
                              {reinterpret_cast<std::byte*>(r.src), static_cast<std::size_t>(r.bytes)}});
        } else {
            kernel.push_back(r);
        }
    }
    if (engine.empty()) return CopyRanges(kernel, device, stream);
    const std::function<Status()> launch = [&]() -> Status {
        return kernel.empty() ? Status::Ok() : CopyRanges(kernel, device, stream);
    };
    return EnqueueCopiesToDeviceAlongside(engine, stream, launch);
}

Result<const IpcReadyEvent*> IpcReadyEvent::Of(int device) {
    thread_local std::map<int, const IpcReadyEvent*> events;  // one event per device and thread
    if (auto it = events.find(device); it != events.end()) return it->second;
    MCS_RETURN_IF_ERROR(UseDevice(device));
    cudaEvent_t e = nullptr;
    MCS_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcEventHandle_t h;
    if (const cudaError_t err = cudaIpcGetEventHandle(&h, e); err != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaEventDestroy(e);
        return CudaError(err, "cudaIpcGetEventHandle");
    }
    static_assert(sizeof(h) == 64);
    auto* ev = new IpcReadyEvent;  // never destroyed (see the class)
    ev->event_ = e;
    std::memcpy(ev->handle_.data(), &h, sizeof(h));
    events[device] = ev;
    return ev;
}

Status IpcReadyEvent::WaitOn(std::uintptr_t stream) const {
    MCS_CUDA(cudaStreamWaitEvent(AsStream(stream), static_cast<cudaEvent_t>(event_), 0));
    return Status::Ok();
}

Status IpcReadyEvent::Synchronize() const {
    MCS_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
    return Status::Ok();
}

Result<std::shared_ptr<void>> OpenIpcEvent(std::span<const std::byte> handle, int device) {
    cudaIpcEventHandle_t h;
    if (handle.size() != sizeof(h)) {
        return InvalidArgument("a CUDA IPC event handle has " + std::to_string(sizeof(h)) +
                               " bytes, not " + std::to_string(handle.size()));
    }
    std::memcpy(&h, handle.data(), sizeof(h));
    MCS_RETURN_IF_ERROR(UseDevice(device));
    cudaEvent_t e = nullptr;
    if (const cudaError_t err = cudaIpcOpenEventHandle(&e, h); err != cudaSuccess) {
        (void)cudaGetLastError();
        return InvalidArgument("cudaIpcOpenEventHandle: " + std::string(cudaGetErrorString(err)));
    }
    return std::shared_ptr<void>(e, [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
}

Status RecordIpcEvent(void* event, std::uintptr_t stream) {
    MCS_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event), AsStream(stream)));
    return Status::Ok();
}

Result<StreamPoint> StreamPoint::Record(std::uintptr_t stream) {
    cudaEvent_t e = nullptr;
    MCS_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    StreamPoint p;
    p.event_ = e;
    MCS_CUDA(cudaEventRecord(e, AsStream(stream)));
    return Result<StreamPoint>(std::move(p));
}

Status StreamPoint::Wait() const {
    if (event_ == nullptr) return Status::Ok();
    MCS_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
    return Status::Ok();
}

StreamPoint::~StreamPoint() {
    if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

StreamPoint& StreamPoint::operator=(StreamPoint&& other) noexcept {
    if (this != &other) {
        if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
        event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
}

Status GatherToDevice(std::span<const GatherCopy> copies, DevicePtr dst, std::uintptr_t stream) {
    std::vector<RangeCopy> ranges;
    ranges.reserve(copies.size());
    for (const GatherCopy& c : copies) {
        if (dst.address + c.dst_offset < dst.address) {
            return InvalidArgument("gather range wraps around the address space");
        }
        ranges.push_back({c.src, dst.address + c.dst_offset, c.bytes});
    }
    return CopyRanges(ranges, dst.device, stream);
}

Status EnqueueFilterRebase(std::span<const RebasePiece> pieces, std::span<const RebaseTarget> targets,
                           std::span<const std::int64_t> bounds, DevicePtr staging, DevicePtr out,
                           DevicePtr kept, std::uintptr_t stream) {
    // Chunks in target order, each target's in piece order.
    std::vector<Chunk> chunks;
    std::vector<std::uint64_t> target_chunks(targets.size() + 1, 0);
    for (std::size_t t = 0; t < targets.size(); ++t) {
        const RebaseTarget& rt = targets[t];
        if (rt.rank == 0 || rt.rank > kMaxRank || !IndexSize(rt.index_size) ||
            !ValueSize(rt.value_size) || rt.first_piece > rt.end_piece ||
            rt.end_piece > pieces.size() || rt.origin + rt.rank > bounds.size()) {
            return InvalidArgument("device rebase: target " + std::to_string(t) + " is malformed");
        }
        std::uint64_t entries = 0;
        for (std::size_t p = rt.first_piece; p < rt.end_piece; ++p) {
            const RebasePiece& rp = pieces[p];
            if (rp.target != t || !IndexSize(rp.index_size) ||
                (rp.filter && rp.box + 2 * std::uint64_t(rt.rank) > bounds.size())) {
                return InvalidArgument("device rebase: piece " + std::to_string(p) +
                                       " is malformed");
            }
            entries += rp.count;
            for (std::uint64_t first = 0; first < rp.count; first += kChunkEntries) {
                chunks.push_back({first, static_cast<std::uint32_t>(p),
                                  static_cast<std::uint32_t>(std::min(kChunkEntries, rp.count - first))});
            }
        }
        if (entries > rt.capacity) {
            return InvalidArgument("device rebase: target " + std::to_string(t) +
                                   " has more entries than its capacity");
        }
        target_chunks[t + 1] = chunks.size();
    }
    if (targets.empty()) return Status::Ok();
    if (kept.address == 0) return InvalidArgument("device rebase: no memory for the kept counts");
    cudaStream_t s = AsStream(stream);
    const std::uint64_t num_chunks = chunks.size();
    std::size_t scan_bytes = 0;
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<std::uint64_t*>(nullptr),
                                           static_cast<std::uint64_t*>(nullptr), num_chunks + 1, s));
    // One workspace: tables, counts, positions, scan scratch.
    std::uint64_t size = 0;
    const auto add = [&](std::uint64_t bytes) {
        const std::uint64_t at = size;
        size = AlignUp(size + bytes, 256);
        return at;
    };
    const std::uint64_t o_chunks = add(num_chunks * sizeof(Chunk));
    const std::uint64_t o_pieces = add(pieces.size() * sizeof(RebasePiece));
    const std::uint64_t o_targets = add(targets.size() * sizeof(RebaseTarget));
    const std::uint64_t o_bounds = add(bounds.size() * sizeof(std::int64_t));
    const std::uint64_t o_target_chunks = add(target_chunks.size() * 8);
    const std::uint64_t o_counts = add((num_chunks + 1) * 8);
    const std::uint64_t o_positions = add((num_chunks + 1) * 8);
    const std::uint64_t o_scan = add(scan_bytes);
    MCS_ASSIGN_OR_RETURN(DeviceBuffer ws, DeviceBuffer::Allocate(size, staging.device, stream));
    const std::uintptr_t base = ws.ptr().address;
    const auto put = [&](std::uint64_t at, const void* host, std::uint64_t bytes) -> Status {
        if (bytes == 0) return Status::Ok();
        MCS_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(base + at), host, bytes,
                                 cudaMemcpyHostToDevice, s));
        return Status::Ok();
    };
    MCS_RETURN_IF_ERROR(put(o_chunks, chunks.data(), num_chunks * sizeof(Chunk)));
    MCS_RETURN_IF_ERROR(put(o_pieces, pieces.data(), pieces.size() * sizeof(RebasePiece)));
    MCS_RETURN_IF_ERROR(put(o_targets, targets.data(), targets.size() * sizeof(RebaseTarget)));
    MCS_RETURN_IF_ERROR(put(o_bounds, bounds.data(), bounds.size() * sizeof(std::int64_t)));
    MCS_RETURN_IF_ERROR(put(o_target_chunks, target_chunks.data(), target_chunks.size() * 8));
    auto* d_chunks = reinterpret_cast<const Chunk*>(base + o_chunks);
    auto* d_pieces = reinterpret_cast<const RebasePiece*>(base + o_pieces);
    auto* d_targets = reinterpret_cast<const RebaseTarget*>(base + o_targets);
    auto* d_bounds = reinterpret_cast<const std::int64_t*>(base + o_bounds);
    auto* d_target_chunks = reinterpret_cast<const std::uint64_t*>(base + o_target_chunks);
    auto* d_counts = reinterpret_cast<std::uint64_t*>(base + o_counts);
    auto* d_positions = reinterpret_cast<std::uint64_t*>(base + o_positions);
    auto* d_kept = reinterpret_cast<std::uint64_t*>(kept.address);
    const auto* d_staging = reinterpret_cast<const unsigned char*>(staging.address);
    auto* d_out = reinterpret_cast<unsigned char*>(out.address);
    MCS_CUDA(cudaMemsetAsync(d_counts + num_chunks, 0, 8, s));
    if (num_chunks > 0) {
        CountKernel<<<static_cast<unsigned>(num_chunks), kThreads, 0, s>>>(
            d_chunks, d_pieces, d_targets, d_bounds, d_staging, d_counts);
        MCS_CUDA(cudaGetLastError());
    }
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(reinterpret_cast<void*>(base + o_scan), scan_bytes,
                                           d_counts, d_positions, num_chunks + 1, s));
    KeptKernel<<<static_cast<unsigned>((targets.size() + kThreads - 1) / kThreads), kThreads, 0, s>>>(
        d_target_chunks, targets.size(), d_positions, d_kept);
    MCS_CUDA(cudaGetLastError());
    if (num_chunks > 0) {
        WriteKernel<<<static_cast<unsigned>(num_chunks), kThreads, 0, s>>>(
            d_chunks, d_pieces, d_targets, d_bounds, d_target_chunks, d_positions, d_staging, d_out);
        MCS_CUDA(cudaGetLastError());
    }
    return Status::Ok();  // the workspace is freed stream-ordered, after the kernels
}

}  // namespace mooncake::sparse::cuda
