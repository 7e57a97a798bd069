// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Encode walks the tensor as "chunks": one chunk is one row of one tile. Chunks are numbered in
// output order (tile row, tile column, row within the tile), so an exclusive scan of per-chunk
// counts gives every chunk its output offset and the entries come out sorted by (tile, element)
// without a sort. Two passes over (new, old): count, then write; one warp per chunk, 16-byte
// loads, warp ballots for in-order compaction.
#include "cuda/gpu_codec.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <cmath>
#include <string>

#include "codec/codec.h"
#include "transport/host_copy.h"

namespace mooncake::sparse::cuda {
namespace {

Status CudaError(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::Ok();
    std::string msg = std::string(what) + ": " + cudaGetErrorString(e);
    if (e == cudaErrorMemoryAllocation) return ResourceExhausted(msg);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return Unavailable(msg);
    return Internal(msg);
}

#define MCS_CUDA(expr) MCS_RETURN_IF_ERROR(CudaError((expr), #expr))

cudaStream_t AsStream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

struct ChunkGeometry {
    std::uint32_t rows, cols;       // tensor
    std::uint32_t tr, tc;           // tile shape
    std::uint32_t tiles_c;          // tiles per row of tiles
    // chunk k (output order) -> (row, first column, length)
    __device__ void Locate(std::uint64_t k, std::uint32_t& row, std::uint32_t& col0,
                           std::uint32_t& len) const {
        const std::uint64_t per_tile_row = std::uint64_t(tr) * tiles_c;
        const std::uint32_t tile_row = std::uint32_t(k / per_tile_row);
        const std::uint64_t rem = k - tile_row * per_tile_row;
        const std::uint32_t height = min(tr, rows - tile_row * tr);
        const std::uint32_t tile_col = std::uint32_t(rem / height);
        const std::uint32_t r = std::uint32_t(rem - std::uint64_t(tile_col) * height);
        row = tile_row * tr + r;
        col0 = tile_col * tc;
        len = min(tc, cols - col0);
    }
};

template <typename T>
struct Bits;
template <>
struct Bits<__nv_bfloat16> {
    using U = std::uint16_t;
    static __device__ float ToFloat(U u) { return __bfloat162float(__ushort_as_bfloat16(u)); }
    static __device__ U FromFloat(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
template <>
struct Bits<__half> {
    using U = std::uint16_t;
    static __device__ float ToFloat(U u) { return __half2float(__ushort_as_half(u)); }
    static __device__ U FromFloat(float f) { return __half_as_ushort(__float2half_rn(f)); }
};
template <>
struct Bits<float> {
    using U = std::uint32_t;
    static __device__ float ToFloat(U u) { return __uint_as_float(u); }
    static __device__ U FromFloat(float f) { return __float_as_uint(f); }
};

/// Whether element (n, o) is kept, and its output value bits.
template <typename T, bool kOverwrite>
__device__ __forceinline__ bool Keep(typename Bits<T>::U n, typename Bits<T>::U o, float threshold,
                                     typename Bits<T>::U& out) {
    if constexpr (kOverwrite) {
        out = n;
        return n != o;
    } else {
        const float d = Bits<T>::ToFloat(n) - Bits<T>::ToFloat(o);
        out = Bits<T>::FromFloat(d);
        const float back = Bits<T>::ToFloat(out);
        return fabsf(d) > threshold && back != 0.0f;
    }
}

constexpr int kWarpsPerBlock = 8;

/// Pass 1 (kWrite = false): per-chunk counts. Pass 2 (kWrite = true): write entries at
/// offsets[chunk]. One warp per chunk; each lane takes 8 consecutive elements per step so one
/// step covers 256 elements in order.
template <typename T, bool kOverwrite, bool kWrite, typename I>
__global__ void ChunkKernel(const typename Bits<T>::U* __restrict__ nw,
                            const typename Bits<T>::U* __restrict__ od, ChunkGeometry g,
                            std::uint64_t num_chunks, float threshold,
                            std::uint32_t* __restrict__ counts,
                            const std::uint64_t* __restrict__ offsets, I* __restrict__ out_idx,
                            typename Bits<T>::U* __restrict__ out_val) {
    using U = typename Bits<T>::U;
    const int lane = threadIdx.x & 31;
    const std::uint64_t chunk = std::uint64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (chunk >= num_chunks) return;
    std::uint32_t row, col0, len;
    g.Locate(chunk, row, col0, len);
    const std::uint64_t base = std::uint64_t(row) * g.cols + col0;
    std::uint64_t cursor = kWrite ? offsets[chunk] : 0;
    std::uint32_t total = 0;
    constexpr int kPer = 8;
    for (std::uint32_t step = 0; step < len; step += 32 * kPer) {
        const std::uint32_t first = step + lane * kPer;
        U nv[kPer], ov[kPer];
        const bool full = first + kPer <= len;
        const bool aligned = ((base + first) * sizeof(U)) % 16 == 0;
        if (full && aligned && sizeof(U) * kPer == 16) {
            *reinterpret_cast<uint4*>(nv) = __ldg(reinterpret_cast<const uint4*>(nw + base + first));
            *reinterpret_cast<uint4*>(ov) = __ldg(reinterpret_cast<const uint4*>(od + base + first));
        } else {
#pragma unroll
            for (int k = 0; k < kPer; ++k) {
                const bool in = first + k < len;
                nv[k] = in ? nw[base + first + k] : U(0);
                ov[k] = in ? od[base + first + k] : U(0);
            }
        }
        std::uint32_t mask = 0;
        U keep_val[kPer];
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            if (first + k < len && Keep<T, kOverwrite>(nv[k], ov[k], threshold, keep_val[k])) {
                mask |= 1u << k;
            }
        }
        const std::uint32_t mine = __popc(mask);
        // Inclusive warp scan of per-lane counts keeps the output in element order.
        std::uint32_t incl = mine;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const std::uint32_t v = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += v;
        }
        const std::uint32_t step_total = __shfl_sync(0xffffffffu, incl, 31);
        if constexpr (kWrite) {
            std::uint64_t pos = cursor + (incl - mine);
#pragma unroll
            for (int k = 0; k < kPer; ++k) {
                if (mask & (1u << k)) {
                    out_idx[2 * pos] = I(row);
                    out_idx[2 * pos + 1] = I(col0 + first + k);
                    out_val[pos] = keep_val[k];
                    ++pos;
                }
            }
            cursor += step_total;
        }
        total += step_total;
    }
    if constexpr (!kWrite) {
        if (lane == 0) counts[chunk] = total;
    }
}

/// Per tile: [start, end) of its entries, from the chunk offsets; flags non-empty tiles.
__global__ void TileRangeKernel(const std::uint64_t* __restrict__ offsets, ChunkGeometry g,
                                std::uint32_t tiles_r, std::uint64_t num_chunks,
                                std::uint64_t* __restrict__ tile_start, std::uint8_t* __restrict__ flags) {
    const std::uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tiles_r * g.tiles_c) return;
    const std::uint32_t tile_row = t / g.tiles_c, tile_col = t % g.tiles_c;
    const std::uint32_t height = min(g.tr, g.rows - tile_row * g.tr);
    const std::uint64_t first = std::uint64_t(tile_row) * g.tr * g.tiles_c + std::uint64_t(tile_col) * height;
    const std::uint64_t last = first + height;  // one past the tile's last chunk
    const std::uint64_t start = offsets[first];
    const std::uint64_t end = last < num_chunks + 1 ? offsets[last] : offsets[num_chunks];
    tile_start[t] = start;
    flags[t] = end > start;
}

__global__ void TileIndexKernel(const std::uint32_t* __restrict__ selected,
                                const std::uint64_t* __restrict__ num_selected,
                                const std::uint64_t* __restrict__ tile_start, std::uint32_t tiles_c,
                                std::uint64_t nnz, std::uint32_t* __restrict__ coords,
                                std::uint64_t* __restrict__ ptr) {
    const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::uint64_t n = *num_selected;
    if (i > n) return;
    if (i == n) {
        ptr[n] = nnz;
        return;
    }
    const std::uint32_t t = selected[i];
    coords[2 * i] = t / tiles_c;
    coords[2 * i + 1] = t % tiles_c;
    ptr[i] = tile_start[t];
}

template <typename T, bool kOverwrite, typename I>
__global__ void CheckKernel(const I* __restrict__ idx, std::uint64_t nnz, std::uint32_t rows,
                            std::uint32_t cols, unsigned int* __restrict__ bad) {
    const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= nnz) return;
    if (std::uint32_t(idx[2 * i]) >= rows || std::uint32_t(idx[2 * i + 1]) >= cols) atomicAdd(bad, 1u);
}

template <typename T, bool kOverwrite, typename I>
__global__ void ApplyKernel(typename Bits<T>::U* __restrict__ w, const I* __restrict__ idx,
                            const typename Bits<T>::U* __restrict__ val, std::uint64_t nnz,
                            std::uint32_t cols) {
    const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= nnz) return;
    const std::uint64_t at = std::uint64_t(idx[2 * i]) * cols + idx[2 * i + 1];
    if constexpr (kOverwrite) {
        w[at] = val[i];
    } else {
        w[at] = Bits<T>::FromFloat(Bits<T>::ToFloat(w[at]) + Bits<T>::ToFloat(val[i]));
    }
}

/// ApplyKernel for a strided weight view: element (i, j) at i * s0 + j * s1 (elements, signed:
/// `w` points at element [0, 0]). A separate kernel keeps the contiguous one unchanged.
template <typename T, bool kOverwrite, typename I>
__global__ void StridedApplyKernel(typename Bits<T>::U* __restrict__ w, const I* __restrict__ idx,
                                   const typename Bits<T>::U* __restrict__ val, std::uint64_t nnz,
                                   std::int64_t s0, std::int64_t s1) {
    const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= nnz) return;
    const std::int64_t at = std::int64_t(idx[2 * i]) * s0 + std::int64_t(idx[2 * i + 1]) * s1;
    if constexpr (kOverwrite) {
        w[at] = val[i];
    } else {
        w[at] = Bits<T>::FromFloat(Bits<T>::ToFloat(w[at]) + Bits<T>::ToFloat(val[i]));
    }
}

Status CheckDevice(const DeviceArray& a, const char* what) {
    if (a.shape.empty()) return InvalidArgument(std::string(what) + " has no shape");
    Index n = 1;
    for (Index e : a.shape) n *= e;
    if (std::uint64_t(n) * DTypeSize(a.dtype) != a.bytes) {
        return InvalidArgument(std::string(what) + " byte size does not match shape x dtype");
    }
    if (a.ptr.address == 0 && n > 0) return InvalidArgument(std::string(what) + " is null");
    if (!a.strides.empty() && a.strides.size() != a.shape.size()) {
        return InvalidArgument(std::string(what) + " has " + std::to_string(a.strides.size()) +
                               " strides for rank " + std::to_string(a.shape.size()));
    }
    return Status::Ok();
}

/// Arrays the kernels read as flat memory (encode inputs, indices, values) must be
/// C-contiguous: callers make them so (their bytes move anyway).
Status CheckContiguous(const DeviceArray& a, const char* what) {
    if (IsCContiguous(a.shape, a.strides)) return Status::Ok();
    return InvalidArgument(std::string(what) + " must be C-contiguous");
}

template <typename T, bool kOverwrite, typename I>
Status EncodeTyped(const DeviceArray& nw, const DeviceArray& od, const ChunkGeometry& g,
                   std::uint32_t tiles_r, float threshold, cudaStream_t stream, GpuEncoded& out) {
    using U = typename Bits<T>::U;
    const std::uint64_t num_chunks = std::uint64_t(g.rows) * g.tiles_c;
    const std::uint32_t num_tiles_full = tiles_r * g.tiles_c;
    const int device = nw.ptr.device;
    const auto s = reinterpret_cast<std::uintptr_t>(stream);
    // Workspace: counts (u32, scanned into u64 offsets with one extra slot for the total).
    MCS_ASSIGN_OR_RETURN(DeviceBuffer counts, DeviceBuffer::Allocate(num_chunks * 4 + 4, device, s));
    MCS_ASSIGN_OR_RETURN(DeviceBuffer offsets, DeviceBuffer::Allocate((num_chunks + 1) * 8, device, s));
    auto* cnt = reinterpret_cast<std::uint32_t*>(counts.ptr().address);
    auto* off = reinterpret_cast<std::uint64_t*>(offsets.ptr().address);
    const auto* n = reinterpret_cast<const U*>(nw.ptr.address);
    const auto* o = reinterpret_cast<const U*>(od.ptr.address);
    const unsigned blocks = unsigned((num_chunks + kWarpsPerBlock - 1) / kWarpsPerBlock);
    ChunkKernel<T, kOverwrite, false, I><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
        n, o, g, num_chunks, threshold, cnt, nullptr, nullptr, nullptr);
    MCS_CUDA(cudaGetLastError());
    MCS_CUDA(cudaMemsetAsync(cnt + num_chunks, 0, 4, stream));
    // Exclusive scan over num_chunks + 1 counts (the last is 0): off[num_chunks] = nnz.
    std::size_t temp_bytes = 0;
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, cnt, off, num_chunks + 1, stream));
    MCS_ASSIGN_OR_RETURN(DeviceBuffer temp, DeviceBuffer::Allocate(temp_bytes, device, s));
    MCS_CUDA(cub::DeviceScan::ExclusiveSum(reinterpret_cast<void*>(temp.ptr().address), temp_bytes,
                                           cnt, off, num_chunks + 1, stream));
    // Tile ranges and the selection of non-empty tiles run before the one host sync.
    MCS_ASSIGN_OR_RETURN(DeviceBuffer tile_start, DeviceBuffer::Allocate(std::uint64_t(num_tiles_full) * 8, device, s));
    MCS_ASSIGN_OR_RETURN(DeviceBuffer flags, DeviceBuffer::Allocate(num_tiles_full, device, s));
    MCS_ASSIGN_OR_RETURN(DeviceBuffer selected, DeviceBuffer::Allocate(std::uint64_t(num_tiles_full) * 4, device, s));
    MCS_ASSIGN_OR_RETURN(DeviceBuffer num_sel, DeviceBuffer::Allocate(8, device, s));
    auto* ts = reinterpret_cast<std::uint64_t*>(tile_start.ptr().address);
    auto* fl = reinterpret_cast<std::uint8_t*>(flags.ptr().address);
    auto* sel = reinterpret_cast<std::uint32_t*>(selected.ptr().address);
    auto* nsel = reinterpret_cast<std::uint64_t*>(num_sel.ptr().address);
    TileRangeKernel<<<(num_tiles_full + 255) / 256, 256, 0, stream>>>(off, g, tiles_r, num_chunks, ts, fl);
    MCS_CUDA(cudaGetLastError());
    std::size_t sel_bytes = 0;
    thrust::counting_iterator<std::uint32_t> ids(0);
    MCS_CUDA(cub::DeviceSelect::Flagged(nullptr, sel_bytes, ids, fl, sel, nsel, num_tiles_full, stream));
    MCS_ASSIGN_OR_RETURN(DeviceBuffer sel_temp, DeviceBuffer::Allocate(sel_bytes, device, s));
    MCS_CUDA(cub::DeviceSelect::Flagged(reinterpret_cast<void*>(sel_temp.ptr().address), sel_bytes, ids,
                                        fl, sel, nsel, num_tiles_full, stream));
    std::uint64_t host[2] = {0, 0};
    MCS_CUDA(cudaMemcpyAsync(&host[0], off + num_chunks, 8, cudaMemcpyDeviceToHost, stream));
    MCS_CUDA(cudaMemcpyAsync(&host[1], nsel, 8, cudaMemcpyDeviceToHost, stream));
    MCS_CUDA(cudaStreamSynchronize(stream));
    out.nnz = host[0];
    out.num_tiles = host[1];
    MCS_ASSIGN_OR_RETURN(out.indices, DeviceBuffer::Allocate(out.nnz * 2 * sizeof(I), device, s));
    MCS_ASSIGN_OR_RETURN(out.values, DeviceBuffer::Allocate(out.nnz * sizeof(U), device, s));
    MCS_ASSIGN_OR_RETURN(out.tile_coords, DeviceBuffer::Allocate(out.num_tiles * 2 * 4, device, s));
    MCS_ASSIGN_OR_RETURN(out.tile_ptr, DeviceBuffer::Allocate((out.num_tiles + 1) * 8, device, s));
    if (out.nnz > 0) {
        ChunkKernel<T, kOverwrite, true, I><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
            n, o, g, num_chunks, threshold, nullptr, off, reinterpret_cast<I*>(out.indices.ptr().address),
            reinterpret_cast<U*>(out.values.ptr().address));
        MCS_CUDA(cudaGetLastError());
    }
    TileIndexKernel<<<unsigned((out.num_tiles + 1 + 255) / 256), 256, 0, stream>>>(
        sel, nsel, ts, g.tiles_c, out.nnz, reinterpret_cast<std::uint32_t*>(out.tile_coords.ptr().address),
        reinterpret_cast<std::uint64_t*>(out.tile_ptr.ptr().address));
    MCS_CUDA(cudaGetLastError());
    return Status::Ok();
}

template <typename T>
Status EncodeDispatch(const DeviceArray& nw, const DeviceArray& od, const ChunkGeometry& g,
                      std::uint32_t tiles_r, const GpuEncodeOptions& opt, bool wide, GpuEncoded& out) {
    cudaStream_t s = AsStream(opt.stream);
    const float th = float(opt.threshold);
    if (opt.apply == ApplyMode::kOverwrite) {
        return wide ? EncodeTyped<T, true, std::uint32_t>(nw, od, g, tiles_r, th, s, out)
                    : EncodeTyped<T, true, std::uint16_t>(nw, od, g, tiles_r, th, s, out);
    }
    return wide ? EncodeTyped<T, false, std::uint32_t>(nw, od, g, tiles_r, th, s, out)
                : EncodeTyped<T, false, std::uint16_t>(nw, od, g, tiles_r, th, s, out);
}

template <typename T, typename I>
Status ApplyTyped(const DeviceArray& w, const DeviceArray& idx, const DeviceArray& val, ApplyMode apply,
                  cudaStream_t stream) {
    using U = typename Bits<T>::U;
    const std::uint64_t nnz = std::uint64_t(val.shape[0]);
    if (nnz == 0) return Status::Ok();
    const auto rows = std::uint32_t(w.shape[0]), cols = std::uint32_t(w.shape[1]);
    const auto* ip = reinterpret_cast<const I*>(idx.ptr.address);
    MCS_ASSIGN_OR_RETURN(DeviceBuffer bad, DeviceBuffer::Allocate(4, w.ptr.device, reinterpret_cast<std::uintptr_t>(stream)));
    auto* badp = reinterpret_cast<unsigned int*>(bad.ptr().address);
    MCS_CUDA(cudaMemsetAsync(badp, 0, 4, stream));
    const unsigned blocks = unsigned((nnz + 255) / 256);
    CheckKernel<T, true, I><<<blocks, 256, 0, stream>>>(ip, nnz, rows, cols, badp);
    unsigned int host_bad = 0;
    MCS_CUDA(cudaMemcpyAsync(&host_bad, badp, 4, cudaMemcpyDeviceToHost, stream));
    MCS_CUDA(cudaStreamSynchronize(stream));
    if (host_bad != 0) {
        return InvalidArgument(std::to_string(host_bad) + " coordinates lie outside the weight [" +
                               std::to_string(rows) + ", " + std::to_string(cols) + "]; weight unchanged");
    }
    auto* wp = reinterpret_cast<U*>(w.ptr.address);
    const auto* vp = reinterpret_cast<const U*>(val.ptr.address);
    if (IsCContiguous(w.shape, w.strides)) {
        if (apply == ApplyMode::kOverwrite) {
            ApplyKernel<T, true, I><<<blocks, 256, 0, stream>>>(wp, ip, vp, nnz, cols);
        } else {
            ApplyKernel<T, false, I><<<blocks, 256, 0, stream>>>(wp, ip, vp, nnz, cols);
        }
    } else {
        const std::int64_t s0 = w.strides[0], s1 = w.strides[1];
        if (apply == ApplyMode::kOverwrite) {
            StridedApplyKernel<T, true, I><<<blocks, 256, 0, stream>>>(wp, ip, vp, nnz, s0, s1);
        } else {
            StridedApplyKernel<T, false, I><<<blocks, 256, 0, stream>>>(wp, ip, vp, nnz, s0, s1);
        }
    }
    MCS_CUDA(cudaGetLastError());
    return Status::Ok();
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

Result<DeviceBuffer> DeviceBuffer::Allocate(std::uint64_t bytes, int device, std::uintptr_t stream) {
    DeviceBuffer b;
    b.bytes_ = bytes;
    b.device_ = device;
    b.stream_ = stream;
    if (bytes == 0) return std::move(b);
    int current = 0;
    MCS_CUDA(cudaGetDevice(&current));
    if (current != device) MCS_CUDA(cudaSetDevice(device));
    void* p = nullptr;
    MCS_CUDA(cudaMallocAsync(&p, bytes, AsStream(stream)));
    b.address_ = reinterpret_cast<std::uintptr_t>(p);
    return std::move(b);
}

Result<GpuEncoded> EncodeUpdate(const DeviceArray& nw, const DeviceArray& od, const GpuEncodeOptions& opt) {
    MCS_RETURN_IF_ERROR(CheckDevice(nw, "new"));
    MCS_RETURN_IF_ERROR(CheckDevice(od, "old"));
    if (nw.dtype != od.dtype || nw.shape != od.shape) {
        return InvalidArgument("new and old differ in dtype or shape");
    }
    if (nw.ptr.device != od.ptr.device) return InvalidArgument("new and old are on different devices");
    MCS_RETURN_IF_ERROR(CheckContiguous(nw, "new"));
    MCS_RETURN_IF_ERROR(CheckContiguous(od, "old"));
    if (nw.shape.size() != 2) return InvalidArgument("GPU encode takes 2-D tensors (fused 3-D: encode per expert)");
    if (opt.apply == ApplyMode::kOverwrite && opt.threshold != 0.0) {
        return InvalidArgument("overwrite takes no threshold");
    }
    if (nw.shape[0] > std::numeric_limits<std::uint32_t>::max() || nw.shape[1] > std::numeric_limits<std::uint32_t>::max()) {
        return InvalidArgument("GPU encode supports extents below 2^32");
    }
    Shape tile = opt.tile_shape ? ClampTileShape(*opt.tile_shape, nw.shape)
                                : DefaultTileShape(nw.shape);
    MCS_RETURN_IF_ERROR(ValidateTileShape(tile, nw.shape));
    ChunkGeometry g{};
    g.rows = std::uint32_t(nw.shape[0]);
    g.cols = std::uint32_t(nw.shape[1]);
    g.tr = std::uint32_t(std::min<Index>(tile[0], nw.shape[0]));
    g.tc = std::uint32_t(std::min<Index>(tile[1], nw.shape[1]));
    g.tiles_c = (g.cols + g.tc - 1) / g.tc;
    const std::uint32_t tiles_r = (g.rows + g.tr - 1) / g.tr;
    int current = 0;
    MCS_CUDA(cudaGetDevice(&current));
    if (current != nw.ptr.device) MCS_CUDA(cudaSetDevice(nw.ptr.device));
    GpuEncoded out;
    out.value_dtype = nw.dtype;
    out.tile_shape = tile;
    const bool wide = std::max(nw.shape[0], nw.shape[1]) > 65536;
    out.index_dtype = wide ? DType::kUInt32 : DType::kUInt16;
    auto run = [&]() -> Status {
        switch (nw.dtype) {
            case DType::kBFloat16: return EncodeDispatch<__nv_bfloat16>(nw, od, g, tiles_r, opt, wide, out);
            case DType::kFloat16: return EncodeDispatch<__half>(nw, od, g, tiles_r, opt, wide, out);
            case DType::kFloat32: return EncodeDispatch<float>(nw, od, g, tiles_r, opt, wide, out);
            default:
                return InvalidArgument("GPU encode supports bfloat16, float16 and float32, not " +
                                       std::string(DTypeName(nw.dtype)));
        }
    };
    MCS_RETURN_IF_ERROR(run());
    return std::move(out);
}

Status ApplySparse(const DeviceArray& w, const DeviceArray& idx, const DeviceArray& val, ApplyMode apply,
                   std::uintptr_t stream) {
    MCS_RETURN_IF_ERROR(CheckDevice(w, "weight"));
    MCS_RETURN_IF_ERROR(CheckDevice(idx, "indices"));
    MCS_RETURN_IF_ERROR(CheckDevice(val, "values"));
    if (w.shape.size() != 2 || idx.shape.size() != 2 || idx.shape[1] != 2 || val.shape.size() != 1 ||
        idx.shape[0] != val.shape[0]) {
        return InvalidArgument("GPU apply takes a 2-D weight, indices [nnz, 2] and values [nnz]");
    }
    if (val.dtype != w.dtype) return InvalidArgument("values dtype differs from the weight's");
    MCS_RETURN_IF_ERROR(CheckContiguous(idx, "indices"));
    MCS_RETURN_IF_ERROR(CheckContiguous(val, "values"));
    // Unique coordinates write distinct elements only if the view gives every coordinate its
    // own element: a broadcast (stride 0) or expanded view would make writes race.
    if (!IsNonOverlapping(w.shape, w.strides)) {
        return InvalidArgument("weight view has overlapping elements (a broadcast or expanded "
                               "view); apply needs one element per coordinate");
    }
    if (w.ptr.device != idx.ptr.device || w.ptr.device != val.ptr.device) {
        return InvalidArgument("weight, indices and values are on different devices");
    }
    cudaStream_t s = AsStream(stream);
    const bool wide = idx.dtype == DType::kUInt32;
    if (!wide && idx.dtype != DType::kUInt16) return InvalidArgument("indices must be uint16 or uint32");
    switch (w.dtype) {
        case DType::kBFloat16:
            return wide ? ApplyTyped<__nv_bfloat16, std::uint32_t>(w, idx, val, apply, s)
                        : ApplyTyped<__nv_bfloat16, std::uint16_t>(w, idx, val, apply, s);
        case DType::kFloat16:
            return wide ? ApplyTyped<__half, std::uint32_t>(w, idx, val, apply, s)
                        : ApplyTyped<__half, std::uint16_t>(w, idx, val, apply, s);
        case DType::kFloat32:
            return wide ? ApplyTyped<float, std::uint32_t>(w, idx, val, apply, s)
                        : ApplyTyped<float, std::uint16_t>(w, idx, val, apply, s);
        default:
            return InvalidArgument("GPU apply supports bfloat16, float16 and float32");
    }
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
