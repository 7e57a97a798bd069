// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The GPU codec (src/cuda) from Python: encode_update of CUDA tensors on the device, apply of a
// target-local object to a CUDA weight in place, and target objects uploaded to device memory.
// Device results are `_DeviceArray`s: they own their memory and export it through DLPack
// (torch.from_dlpack / cupy.from_dlpack take them without a copy, bfloat16 included).
// Built only when the extension is compiled with the CUDA codec (HAS_GPU_CODEC); the module
// loads everywhere (static cudart), and gpu_available() says whether a device is usable.
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "arrays.h"
#include "transport/host_copy.h"
#include "bind_common.h"
#include "node/node_client.h"
#include "sparse_object.h"
#include "store.h"
#include "tensor_args.h"

#if MCS_PY_WITH_GPU_CODEC
#include "cuda/gpu_codec.h"
#include "cuda/gpu_read.h"
#endif

namespace mooncake::sparse::py {

#if MCS_PY_WITH_GPU_CODEC
namespace {

/// Device memory owned by Python: one member of an encoded update or an uploaded object.
struct DeviceArray {
    DType dtype = DType::kUInt8;
    Shape shape;
    cuda::DevicePtr ptr;
    std::uint64_t bytes = 0;
    std::shared_ptr<void> owner;  ///< Keeps the allocation (shared by sibling arrays).

    cuda::DeviceArray view() const { return {dtype, shape, ptr, bytes, {}}; }
};

/// Target objects in device memory, from one device read or upload: each one's host object and
/// its indices and values (views of one device allocation). Python's DeviceSparseObject is
/// (batch, i): a read of hundreds of thousands of targets makes one Python object per target,
/// and the batch apply takes the members from here without converting any.
struct DeviceObjects {
    std::vector<std::shared_ptr<SparseObjectView>> hosts;
    std::vector<std::pair<DeviceArray, DeviceArray>> members;
};

/// The DLPack export of a DeviceArray: the capsule's DLManagedTensor holds a reference.
struct Export {
    DLManagedTensor managed{};
    std::vector<std::int64_t> shape;
    std::shared_ptr<void> owner;
};

pyb::capsule ToCapsule(const DeviceArray& a) {
    auto* e = new Export;
    e->shape.assign(a.shape.begin(), a.shape.end());
    e->owner = a.owner;
    DLTensor& t = e->managed.dl_tensor;
    t.data = reinterpret_cast<void*>(a.ptr.address);
    t.device = {kDLCUDA, a.ptr.device};
    t.ndim = static_cast<std::int32_t>(e->shape.size());
    t.dtype = ValueOrThrow(DLPackTypeOf(a.dtype));
    t.shape = e->shape.data();
    t.strides = nullptr;  // C-contiguous
    t.byte_offset = 0;
    e->managed.manager_ctx = e;
    e->managed.deleter = [](DLManagedTensor* m) { delete static_cast<Export*>(m->manager_ctx); };
    // A capsule that nobody consumed frees its tensor; a consumed one ("used_dltensor") is the
    // consumer's to free.
    return pyb::capsule(&e->managed, "dltensor", [](PyObject* cap) {
        if (PyCapsule_IsValid(cap, "dltensor")) {
            auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
            m->deleter(m);
        }
    });
}

DeviceArray View(cuda::DevicePtr ptr, std::uint64_t bytes, DType dtype, Shape shape,
                 std::shared_ptr<void> owner) {
    DeviceArray a;
    a.dtype = dtype;
    a.shape = std::move(shape);
    a.ptr = ptr;
    a.bytes = bytes;
    a.owner = std::move(owner);
    return a;
}

/// An encoded update's members as Python: (indices, values, tile_coords, tile_ptr, tile_shape).
pyb::tuple EncodedTuple(const cuda::GpuEncoded& e) {
    auto owner = std::const_pointer_cast<void>(e.keepalive);
    const Index nnz = Index(e.nnz), rank = Index(e.rank), tiles = Index(e.num_tiles);
    return pyb::make_tuple(
        View(e.indices, e.indices_bytes(), e.index_dtype, {nnz, rank}, owner),
        View(e.values, e.values_bytes(), e.value_dtype, {nnz}, owner),
        View(e.tile_coords, std::uint64_t(tiles) * rank * 4, DType::kUInt32, {tiles, rank}, owner),
        View(e.tile_ptr, std::uint64_t(tiles + 1) * 8, DType::kUInt64, {tiles + 1}, owner),
        ShapeTuple(e.tile_shape));
}

/// The i-th of n CUDA tensors of a batch argument `list` (kept alive in `keep`), as the codec
/// takes it: its shape and strides move into the array. Its name ("list[i] name"; "name" in a
/// batch of one) is spelled only for an error, as a step's batches hold hundreds of thousands.
cuda::DeviceArray CudaItem(const pyb::handle& obj, const char* list, std::size_t n,
                           std::size_t i, const char* name, bool destination,
                           const pyb::object& stream, std::vector<ParsedTensor>& keep) {
    const auto named = [&](const Status& st) {
        return n == 1 ? st
                      : Status(st.code(), std::string(list) + "[" + std::to_string(i) + "] " +
                                              st.message());
    };
    try {
        keep.push_back(ParseTensorArg(obj, name, destination, stream));
    } catch (const StatusError& e) {
        throw StatusError(named(e.status));
    }
    ParsedTensor& p = keep.back();
    if (p.ref.memory != TensorMemory::kCuda) {
        ThrowIfError(named(InvalidArgument(std::string(name) + " is not a CUDA tensor")));
    }
    // Strides travel as they are: apply writes a strided weight view in place (a TP slice of
    // a fused parameter), and the codec refuses them where it reads flat memory.
    return {p.ref.dtype, std::move(p.ref.shape), {p.ref.device.address, p.ref.device.device},
            p.ref.device.bytes, std::move(p.ref.strides)};
}

std::uint64_t AlignUp(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

/// The host threads that gather uploads into pinned staging, kept for the process's life
/// (starting threads per chunk would cost more than the chunk's copy).
HostCopyPool& GatherPool() {
    static HostCopyPool* pool = new HostCopyPool(DefaultCopyThreads());  // never destroyed
    return *pool;
}

/// Target objects' indices and values in one device allocation: gathered into pinned staging
/// by host copies across threads, chunk by chunk, each chunk's host-to-device copy running
/// while the next chunk is gathered.
std::vector<std::pair<DeviceArray, DeviceArray>> UploadBatch(
    const std::vector<std::shared_ptr<SparseObjectView>>& objs, int device, std::uintptr_t stream) {
    std::vector<std::uint64_t> at(objs.size() * 2);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < objs.size(); ++i) {
        at[2 * i] = total;
        total = AlignUp(total + objs[i]->indices.size(), 16);
        at[2 * i + 1] = total;
        total = AlignUp(total + objs[i]->values.size(), 16);
    }
    auto buf = cuda::DeviceBuffer::Allocate(std::max<std::uint64_t>(total, 16), device, stream);
    if (!buf.ok()) throw StatusError(buf.status());
    auto owner = std::make_shared<cuda::DeviceBuffer>(std::move(buf).value());
    if (total > 0) {
        auto lease = cuda::PinnedStaging::Acquire(total);
        if (!lease.ok()) throw StatusError(lease.status());
        std::byte* host = lease->bytes().data();
        // Chunks of whole objects of about kChunkBytes: small enough that the last chunk's
        // copy (the one nothing hides) is short, large enough that each keeps the threads busy.
        constexpr std::uint64_t kChunkBytes = std::uint64_t{32} << 20;
        std::vector<HostCopy> copies;
        Status issued = Status::Ok();
        std::size_t i = 0;
        while (i < objs.size() && issued.ok()) {
            const std::uint64_t begin = at[2 * i];
            copies.clear();
            for (; i < objs.size() && (copies.empty() || at[2 * i] - begin < kChunkBytes); ++i) {
                copies.push_back({host + at[2 * i], objs[i]->indices.data(), objs[i]->indices.size()});
                copies.push_back({host + at[2 * i + 1], objs[i]->values.data(), objs[i]->values.size()});
            }
            const std::uint64_t end = i < objs.size() ? at[2 * i] : total;
            GatherPool().Run(copies);
            const cuda::HostDeviceCopy up{{owner->ptr().address + begin, device},
                                          {host + begin, static_cast<std::size_t>(end - begin)}};
            issued = cuda::EnqueueCopiesToDevice({&up, 1}, stream);
        }
        // Every enqueued copy has finished before the staging lease is given back.
        const Status waited = cuda::Synchronize(stream);
        ThrowIfError(issued);
        ThrowIfError(waited);
    }
    std::vector<std::pair<DeviceArray, DeviceArray>> out;
    out.reserve(objs.size());
    const std::uintptr_t base = owner->ptr().address;
    for (std::size_t i = 0; i < objs.size(); ++i) {
        const auto& d = objs[i]->desc;
        const Index nnz = Index(d.nnz), rank = Index(d.rank());
        out.emplace_back(
            View({base + at[2 * i], device}, objs[i]->indices.size(), d.index_dtype, {nnz, rank}, owner),
            View({base + at[2 * i + 1], device}, objs[i]->values.size(), d.value_dtype, {nnz}, owner));
    }
    return out;
}

/// UploadBatch through the node daemon: the daemon copies the objects' members from its
/// segments straight into this process's device memory (CUDA IPC). nullopt where it cannot
/// (no CUDA IPC, objects of another connection): the caller uploads through the host.
std::optional<std::vector<std::pair<DeviceArray, DeviceArray>>> UploadThroughDaemon(
    NodeClient& node, const std::vector<std::shared_ptr<SparseObjectView>>& objs, int device,
    std::uintptr_t stream) {
    std::vector<const TargetObjectView*> views;
    views.reserve(objs.size());
    for (const auto& o : objs) views.push_back(o.get());
    Result<NodeClient::DeviceCopy> copied = node.CopyViewsToDevice(views, device, stream);
    if (!copied.ok()) {
        const StatusCode code = copied.status().code();
        if (code == StatusCode::kUnimplemented || code == StatusCode::kFailedPrecondition) {
            return std::nullopt;
        }
        throw StatusError(copied.status());
    }
    auto owner = std::const_pointer_cast<void>(copied->owner);
    std::vector<std::pair<DeviceArray, DeviceArray>> out;
    out.reserve(objs.size());
    for (std::size_t i = 0; i < objs.size(); ++i) {
        const auto& d = objs[i]->desc;
        const Index nnz = Index(d.nnz), rank = Index(d.rank());
        out.emplace_back(View({copied->base + copied->offsets[2 * i], device}, objs[i]->indices.size(),
                              d.index_dtype, {nnz, rank}, owner),
                         View({copied->base + copied->offsets[2 * i + 1], device},
                              objs[i]->values.size(), d.value_dtype, {nnz}, owner));
    }
    return out;
}

/// A device read on a store that plans reads for its caller (the embedded store): the read's
/// unique ranges gathered into device memory once (by a kernel reading the store's page-locked
/// memory, or through pinned staging when the store's memory is pageable), then every target
/// filtered and rebased on the device into one allocation. nullopt when the store does not
/// plan reads this way (the node daemon's client, a fold of several steps): the caller then
/// reads on the host and uploads.
struct DeviceRead {
    std::vector<TargetObjectView> views;
    std::vector<std::pair<DeviceArray, DeviceArray>> members;
};

/// Where the device reads of this process spent their time (ns, summed over reads built on
/// the device): the whole call, the store's planning until the build began, the ranges'
/// copies into device memory (the node daemon's copies; on the embedded store, issuing the
/// gather and copying the pageable ranges, while the gather runs), the filter/rebase (on the
/// embedded store with the wait for the gather).
struct DeviceReadCounters {
    std::atomic<std::uint64_t> reads{0};
    std::atomic<std::uint64_t> total_ns{0};
    std::atomic<std::uint64_t> plan_ns{0};
    std::atomic<std::uint64_t> ranges_ns{0};
    std::atomic<std::uint64_t> filter_ns{0};
};

DeviceReadCounters& ReadCounters() {
    static DeviceReadCounters* c = new DeviceReadCounters;  // never destroyed
    return *c;
}

/// Groups of whole tensors that a device read plans one after another
/// (ReadOnDevice); 1: the whole read at once; 0: automatic (embedded: up to kAutoReadGroups,
/// each of at least kMinAutoGroupTargets targets; through the node daemon: one per plan
/// request, NodeClientOptions::planned_read_targets each). _set_device_read_groups sets it for
/// the process.
std::atomic<int>& DeviceReadGroups() {
    static std::atomic<int> groups{0};
    return groups;
}

/// Runs of a device read's pinned ranges of at least this many bytes go to the copy engine,
/// the rest to the gather kernel (cuda::CopyRangesToDevice); 0: all by the kernel.
/// _set_device_gather_engine_bytes sets it for the process.
std::atomic<std::uint64_t>& DeviceGatherEngineBytes() {
    static std::atomic<std::uint64_t> bytes{std::uint64_t{256} << 10};
    return bytes;
}

/// Whether a device read through the node daemon has its ranges copied as the daemon plans
/// them (ReadOptions::stage_on_device); _set_device_read_staging sets it for the process.
std::atomic<bool>& DeviceReadStaging() {
    static std::atomic<bool> on{true};
    return on;
}

/// Four groups read the H100 layer step (640 targets) in 10.9-11.1 ms, one in 11.5-12.2
/// (benchmarks/results/2026-12-06-h100-device-read); a group pays a planned read's fixed cost
/// and a wait, so small reads stay whole.
constexpr std::size_t kAutoReadGroups = 4;
constexpr std::size_t kMinAutoGroupTargets = 128;

std::optional<DeviceRead> ReadOnDevice(PyStore& s, const StepManifestView& manifest,
                                       std::span<const TargetDescriptor> targets,
                                       const ReadOptions& options, int device,
                                       std::uintptr_t stream) {
    const auto start = std::chrono::steady_clock::now();
    DeviceReadCounters& counters = ReadCounters();
    // One group's build: its targets (into `targets`), its output allocation and where each
    // target's members lie in it, its kept counts (on the device, then here) and its objects.
    struct Group {
        std::vector<std::size_t> of;             // into targets
        std::vector<TargetDescriptor> owned;     // its targets, when they are not a subspan
        std::span<const TargetDescriptor> targets;
        std::shared_ptr<cuda::DeviceBuffer> arena;
        std::vector<std::uint64_t> out_at;       // per target: indices offset, values offset
        std::size_t kept_at = 0;                 // its first count in kept_on_device / kept
        std::span<const std::uint64_t> kept;
        std::shared_ptr<const void> ranges_owner;  // the node daemon's copies of the ranges
        std::vector<TargetObjectView> views;
    };
    // Targets of different tensors read no range in common: groups of whole tensors (in the
    // order of their first targets) keep every unique range read once. Group k + 1 is planned
    // while group k's ranges cross PCIe. Through the node daemon (which answers a copy request
    // once the copies are queued, its event recorded after them) a group's plan is a request
    // of its own that costs more than the copy it overlaps: one group unless set (the H100
    // layer step's read: 12.3-14.1 ms in one group, 14.2-15.7 in four), or as many as the
    // requests the daemon's plan takes anyway (a node's read: 142,144 targets at Kimi-K2
    // scale), so that each is planned in one request and has its ranges copied as it is
    // planned (a read planned in several requests has them copied by a request of its own).
    std::vector<Group> groups;
    const bool node = s.node() != nullptr;
    const int setting = DeviceReadGroups().load(std::memory_order_relaxed);
    const std::size_t per_request =
        node ? std::max<std::size_t>(1, s.node()->options().planned_read_targets) : 0;
    const bool by_request = node && setting <= 0;  // groups of at most per_request targets
    const std::size_t wanted =
        setting > 0 ? std::size_t(setting)
        : node      ? (targets.size() + per_request - 1) / per_request
                    : std::min(kAutoReadGroups,
                               std::max<std::size_t>(1, targets.size() / kMinAutoGroupTargets));
    if (wanted <= 1 || targets.size() < 2) {
        groups.resize(1);
        groups[0].targets = targets;
        groups[0].of.resize(targets.size());
        std::iota(groups[0].of.begin(), groups[0].of.end(), std::size_t{0});
    } else {
        std::unordered_map<std::string_view, std::size_t> tensor_rank;
        std::vector<std::size_t> rank_of(targets.size());
        for (std::size_t t = 0; t < targets.size(); ++t) {
            rank_of[t] = tensor_rank.try_emplace(targets[t].tensor_id, tensor_rank.size()).first->second;
        }
        const std::size_t tensors = tensor_rank.size();
        // Each tensor's group: as many tensors in each of `wanted` groups, or (by_request)
        // tensors in order, a group closed before the one that would take it past per_request
        // targets.
        std::vector<std::size_t> group_of(tensors);
        std::size_t n = std::min(wanted, tensors);
        if (by_request) {
            std::vector<std::size_t> count(tensors, 0);
            for (std::size_t t = 0; t < targets.size(); ++t) ++count[rank_of[t]];
            std::size_t k = 0, in_group = 0;
            for (std::size_t r = 0; r < tensors; ++r) {
                if (in_group > 0 && in_group + count[r] > per_request) {
                    ++k;
                    in_group = 0;
                }
                group_of[r] = k;
                in_group += count[r];
            }
            n = k + 1;
        } else {
            for (std::size_t r = 0; r < tensors; ++r) group_of[r] = r * n / tensors;
        }
        groups.resize(n);
        // Targets listed tensor by tensor (as a layout lists them) make each group a subspan;
        // otherwise its targets are copied into it.
        bool contiguous = true;
        for (std::size_t t = 0; t < targets.size(); ++t) {
            const std::size_t k = group_of[rank_of[t]];
            if (t > 0 && k < group_of[rank_of[t - 1]]) contiguous = false;
            groups[k].of.push_back(t);
        }
        for (Group& g : groups) {
            if (g.of.empty()) continue;
            if (contiguous) {
                g.targets = targets.subspan(g.of.front(), g.of.size());
            } else {
                g.owned.reserve(g.of.size());
                for (const std::size_t t : g.of) g.owned.push_back(targets[t]);
                g.targets = g.owned;
            }
        }
    }
    // Every group's kept counts in one device allocation, copied back with one wait.
    std::size_t kept_total = 0;
    for (Group& g : groups) {
        g.kept_at = kept_total;
        kept_total += g.targets.size();
    }
    std::vector<std::uint64_t> kept(kept_total, 0);
    std::optional<cuda::DeviceBuffer> kept_on_device;
    std::uint64_t ranges_ns = 0, filter_ns = 0;
    bool stream_waited = false;  // a store that copies the ranges itself: see enqueue
    // Through the node daemon, the ranges may be copied as the daemon plans them, into an
    // allocation it last read on `stream`: waited for once here, before the first request.
    ReadOptions read_options = options;
    if (node && DeviceReadStaging().load(std::memory_order_relaxed)) {
        if (Result<const cuda::IpcReadyEvent*> r = cuda::IpcReadyEvent::Of(device); r.ok()) {
            if (Status st = cuda::Synchronize(stream); !st.ok()) throw StatusError(st);
            stream_waited = true;
            const cuda::IpcReadyEvent* event = *r;
            read_options.stage_on_device = ReadOptions::DeviceStaging{
                device, stream, event->handle(), /*stream_waited=*/true,
                [event] { return event->Synchronize(); }};
        }
    }
    // Queues a group's ranges' copies into device memory and its filter/rebase on `stream`.
    const auto enqueue = [&](PlannedRead& read, Group& g) -> Status {
        const auto ranges_start = std::chrono::steady_clock::now();
        const std::size_t nr = read.ranges.size();
        // Staging: every range's indices, then every range's values (LayOutStaging), or where
        // the store put them as it planned.
        StagingLayout layout;
        if (read.staged) {
            if (read.staged_at.size() != 2 * nr) {
                return Internal("device read: one staged offset per range member");
            }
            layout.at = read.staged_at;
        } else {
            layout = LayOutStaging(read.ranges);
        }
        const std::vector<std::uint64_t>& at = layout.at;
        const std::vector<bool>& follows = layout.follows;
        const std::uint64_t total = layout.total;
        constexpr std::ptrdiff_t kMaxGap = StagingLayout::kMaxGap;
        cuda::DevicePtr staging_at{0, device};
        std::optional<cuda::DeviceBuffer> staging;
        // A store whose ranges another process holds (the node daemon) copies them itself, and
        // answers once they are copied: its request runs on a helper thread while this one
        // builds the filter tables below.
        // With this process's ready event, the daemon may answer once the copies are queued
        // (the filter then waits on the event on the device, not here).
        std::future<Result<PlannedRead::DeviceRanges>> node_copy;
        const cuda::IpcReadyEvent* ready = nullptr;
        if (read.staged) {
            staging_at.address = read.staged->address;
            g.ranges_owner = read.staged->owner;
            if (!read.staged->copied) {
                MCS_ASSIGN_OR_RETURN(ready, cuda::IpcReadyEvent::Of(device));
                MCS_RETURN_IF_ERROR(ready->WaitOn(stream));
            }
        } else if (read.ranges_to_device) {
            if (Result<const cuda::IpcReadyEvent*> r = cuda::IpcReadyEvent::Of(device); r.ok()) {
                ready = *r;
            }
            const std::span<const std::byte> handle =
                ready != nullptr ? ready->handle() : std::span<const std::byte>();
            // The store's allocations may have been read by work queued on the stream before
            // this read: waited for once, before the first group's copies, so that a group's
            // copies are not held behind the group before's (whose filter waits for them).
            if (!stream_waited) {
                MCS_RETURN_IF_ERROR(cuda::Synchronize(stream));
                stream_waited = true;
            }
            node_copy = std::async(std::launch::async, [&read, &at, total, device, stream, handle] {
                return read.ranges_to_device(at, total, device, stream, handle,
                                             /*stream_waited=*/true);
            });
        } else {
            // Where kernels read each range: at its host address when the device allows it
            // (the store says the memory is page-locked), else per source one driver query per
            // member. Ranges in pageable memory (a pinned pool past its quota, or none) are
            // copied by host threads into pinned staging laid out as the device staging, then
            // copied up, before the gather.
            std::vector<cuda::RangeCopy> copies;
            copies.reserve(2 * nr);
            std::vector<std::size_t> pageable;
            const bool host_addresses = cuda::HostPointersAreDeviceAddresses(device);
            std::vector<std::array<std::pair<const std::byte*, std::uintptr_t>, 2>> bases;
            if (!host_addresses) {
                bases.assign(read.manifest.size(), {std::pair<const std::byte*, std::uintptr_t>{},
                                                    std::pair<const std::byte*, std::uintptr_t>{}});
            }
            // The device address of one member's range, or nullopt.
            const auto address = [&](const PlannedRead::Range& range, int k,
                                     std::span<const std::byte> m) -> std::optional<std::uintptr_t> {
                if (host_addresses || m.empty()) return reinterpret_cast<std::uintptr_t>(m.data());
                auto& [host, dev] = bases[range.source][k];
                if (host == nullptr) {
                    const std::optional<std::uintptr_t> d = cuda::DeviceAddressOfHost(m.data(), device);
                    if (!d) return std::nullopt;
                    host = m.data();
                    dev = *d;
                }
                // One object's member is one registration: device addresses are linear in it.
                return static_cast<std::uintptr_t>(static_cast<std::intptr_t>(dev) + (m.data() - host));
            };
            MCS_ASSIGN_OR_RETURN(staging, cuda::DeviceBuffer::Allocate(
                                              std::max<std::uint64_t>(total, 16), device, stream));
            staging_at = staging->ptr();
            // Every range's indices, then every range's values; a member's range placed at its
            // distance from the one before (`follows`) extends that one's copy, gap included,
            // so that the runs of a box's ranges move as one copy.
            std::vector<std::array<std::uintptr_t, 2>> src(nr);
            for (std::size_t r = 0; r < nr; ++r) {
                const PlannedRead::Range& range = read.ranges[r];
                std::optional<std::uintptr_t> idx, val;
                if (range.pinned) {
                    idx = address(range, 0, range.indices);
                    val = address(range, 1, range.values);
                }
                if (!idx || !val) {
                    pageable.push_back(r);
                    src[r] = {0, 0};
                    continue;
                }
                src[r] = {*idx, *val};
            }
            const std::uintptr_t dst = staging_at.address;
            for (int k = 0; k < 2; ++k) {
                std::size_t last = nr;  // the range of the last copy of this member
                for (std::size_t r = 0; r < nr; ++r) {
                    const PlannedRead::Range& range = read.ranges[r];
                    const std::uint64_t bytes = (k == 0 ? range.indices : range.values).size();
                    if (src[r][k] == 0 || bytes == 0) continue;
                    const std::uintptr_t to = dst + at[2 * r + k];
                    if (follows[2 * r + k] && last + 1 == r && !copies.empty() &&
                        to - copies.back().dst == src[r][k] - copies.back().src) {
                        copies.back().bytes = to + bytes - copies.back().dst;
                    } else {
                        copies.push_back({src[r][k], to, bytes});
                    }
                    last = r;
                }
            }
            std::optional<cuda::PinnedStaging::Lease> lease;
            std::optional<cuda::StreamPoint> copied;
            if (!pageable.empty() && total > 0) {
                MCS_ASSIGN_OR_RETURN(lease, cuda::PinnedStaging::Acquire(total));
                std::byte* host = lease->bytes().data();
                std::vector<HostCopy> host_copies;
                host_copies.reserve(2 * pageable.size());
                // Members that lie next to each other in the staging move up as one copy (the
                // bytes between them are padding).
                std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // offset, end
                spans.reserve(2 * pageable.size());
                for (const std::size_t r : pageable) {
                    const PlannedRead::Range& range = read.ranges[r];
                    host_copies.push_back({host + at[2 * r], range.indices.data(), range.indices.size()});
                    host_copies.push_back({host + at[2 * r + 1], range.values.data(), range.values.size()});
                    spans.emplace_back(at[2 * r], at[2 * r] + range.indices.size());
                    spans.emplace_back(at[2 * r + 1], at[2 * r + 1] + range.values.size());
                }
                std::sort(spans.begin(), spans.end());
                std::vector<cuda::HostDeviceCopy> up;
                std::uint64_t begin = 0, end = 0;
                const auto flush = [&] {
                    if (end > begin) {
                        up.push_back({{staging_at.address + begin, device},
                                      {host + begin, static_cast<std::size_t>(end - begin)}});
                    }
                };
                for (const auto& [b, e] : spans) {
                    if (e == b) continue;
                    if (end > begin && b <= end + static_cast<std::uint64_t>(kMaxGap)) {
                        end = std::max(end, e);
                        continue;
                    }
                    flush();
                    begin = b;
                    end = e;
                }
                flush();
                GatherPool().Run(host_copies);
                Status up_status = cuda::EnqueueCopiesToDevice(up, stream);
                Result<cuda::StreamPoint> point = up_status.ok()
                                                      ? cuda::StreamPoint::Record(stream)
                                                      : Result<cuda::StreamPoint>(up_status);
                if (!point.ok()) {
                    (void)cuda::Synchronize(stream);  // what was enqueued is done with the lease
                    return point.status();
                }
                copied.emplace(std::move(point).value());
            }
            if (!copies.empty()) {
                const std::uint64_t engine_min =
                    host_addresses ? DeviceGatherEngineBytes().load(std::memory_order_relaxed) : 0;
                if (Status st = cuda::CopyRangesToDevice(copies, device, stream, engine_min); !st.ok()) {
                    (void)cuda::Synchronize(stream);
                    return st;
                }
            }
            // The lease is given back once its copies have run (the pinned staging is one per
            // process, and the next group leases it too); the gather runs on meanwhile.
            if (copied) {
                if (Status st = copied->Wait(); !st.ok()) {
                    (void)cuda::Synchronize(stream);
                    return st;
                }
            }
        }
        ranges_ns += NanosSince(ranges_start);
        const auto filter_start = std::chrono::steady_clock::now();
        // Targets: each one's entries in the arena, room for every entry of its pieces.
        const std::size_t nt = read.targets.size();
        std::vector<cuda::RebaseTarget> rts(nt);
        std::vector<cuda::RebasePiece> rps(read.pieces.size());
        std::vector<std::int64_t> bounds;
        g.out_at.assign(2 * nt, 0);
        std::uint64_t out_total = 0;
        for (std::size_t t = 0; t < nt; ++t) {
            const PlannedRead::Target& pt = read.per_target[t];
            const TargetDescriptor& td = read.targets[t];
            cuda::RebaseTarget& rt = rts[t];
            rt.rank = static_cast<std::uint32_t>(td.box.rank());
            rt.index_size = static_cast<std::uint32_t>(DTypeSize(pt.index_dtype));
            rt.value_size = static_cast<std::uint32_t>(DTypeSize(pt.value_dtype));
            rt.capacity = pt.capacity;
            rt.first_piece = pt.first_piece;
            rt.end_piece = pt.end_piece;
            rt.origin = bounds.size();
            bounds.insert(bounds.end(), td.box.origin().begin(), td.box.origin().end());
            out_total = AlignUp(out_total, 16);
            rt.indices_offset = g.out_at[2 * t] = out_total;
            out_total = AlignUp(out_total + pt.capacity * rt.rank * rt.index_size, 16);
            rt.values_offset = g.out_at[2 * t + 1] = out_total;
            out_total += pt.capacity * rt.value_size;
            for (std::size_t k = pt.first_piece; k < pt.end_piece; ++k) {
                const PlannedRead::Piece& p = read.pieces[k];
                const SourceDescriptor& src = read.manifest[read.ranges[p.range].source];
                cuda::RebasePiece& rp = rps[k];
                rp.index_size = static_cast<std::uint32_t>(DTypeSize(src.index_dtype));
                rp.indices_offset = at[2 * p.range] + p.begin * rt.rank * rp.index_size;
                rp.values_offset = at[2 * p.range + 1] + p.begin * DTypeSize(src.value_dtype);
                rp.count = p.count;
                rp.target = static_cast<std::uint32_t>(t);
                rp.filter = p.filter;
                if (p.filter) {
                    rp.box = bounds.size();
                    for (std::size_t d = 0; d < rt.rank; ++d) bounds.push_back(p.overlap.origin()[d]);
                    for (std::size_t d = 0; d < rt.rank; ++d) {
                        bounds.push_back(p.overlap.origin()[d] + p.overlap.shape()[d]);
                    }
                }
            }
        }
        MCS_ASSIGN_OR_RETURN(cuda::DeviceBuffer out,
                             cuda::DeviceBuffer::Allocate(std::max<std::uint64_t>(out_total, 16),
                                                          device, stream));
        g.arena = std::make_shared<cuda::DeviceBuffer>(std::move(out));
        if (!kept_on_device) {
            MCS_ASSIGN_OR_RETURN(kept_on_device,
                                 cuda::DeviceBuffer::Allocate(std::max<std::size_t>(kept_total, 1) * 8,
                                                              device, stream));
        }
        const cuda::DevicePtr kept_at{kept_on_device->ptr().address + g.kept_at * 8, device};
        if (node_copy.valid()) {
            const auto wait_start = std::chrono::steady_clock::now();
            Result<PlannedRead::DeviceRanges> ranges = node_copy.get();
            ranges_ns += NanosSince(wait_start);
            if (!ranges.ok()) return ranges.status();
            staging_at.address = ranges->address;
            g.ranges_owner = std::move(ranges->owner);
            if (!ranges->copied) MCS_RETURN_IF_ERROR(ready->WaitOn(stream));
        }
        MCS_RETURN_IF_ERROR(cuda::EnqueueFilterRebase(rps, rts, bounds, staging_at, g.arena->ptr(),
                                                      kept_at, stream));
        filter_ns += NanosSince(filter_start);
        return Status::Ok();  // staging is freed stream-ordered, after the kernels that read it
    };
    // Every group's kept counts, after the one wait for all of the read's device work.
    const auto finish = [&]() -> Status {
        const auto wait_start = std::chrono::steady_clock::now();
        if (kept_on_device && !kept.empty()) {
            MCS_RETURN_IF_ERROR(cuda::CopyToHost(
                kept_on_device->ptr(), std::as_writable_bytes(std::span<std::uint64_t>(kept)), stream));
        }
        for (Group& g : groups) g.kept = std::span<const std::uint64_t>(kept).subspan(g.kept_at, g.targets.size());
        filter_ns += NanosSince(wait_start);
        return Status::Ok();
    };
    // Group k's read. Its build queues its device work, then runs group k + 1's read (so that
    // this group's source objects stay viewed until the device has read them) or, last, waits
    // for all of it.
    bool entered = false;
    std::function<Status(std::size_t)> run = [&](std::size_t k) -> Status {
        Group& g = groups[k];
        const PlannedReadFn build = [&, k](PlannedRead& read) -> Status {
            if (!entered) counters.plan_ns.fetch_add(NanosSince(start), std::memory_order_relaxed);
            entered = true;
            Status st = enqueue(read, g);
            if (st.ok()) st = k + 1 < groups.size() ? run(k + 1) : finish();
            if (!st.ok()) {
                (void)cuda::Synchronize(stream);  // nothing reads the views once this returns
                return st;
            }
            read.kept.assign(g.kept.begin(), g.kept.end());
            return Status::Ok();
        };
        // A sealed step's manifest exactly as the node daemon gave it: the daemon plans with
        // its own, none is sent (nor decoded there) per read.
        Result<std::vector<TargetObjectView>> views =
            node && s.IsSealedManifest(manifest.generation, manifest.sources)
                ? s.node()->ReadPlannedSealedStep(manifest, g.targets, read_options, build)
                : s.service().ReadPlanned(manifest, g.targets, read_options, build);
        if (!views.ok()) return views.status();
        g.views = std::move(views).value();
        return Status::Ok();
    };
    if (Status st = run(0); !st.ok()) {
        // Planned elsewhere or not at all (a fold of several steps, a read over the planning
        // budget): the caller reads on the host.
        if (st.code() == StatusCode::kUnimplemented) return std::nullopt;
        throw StatusError(st);
    }
    counters.ranges_ns.fetch_add(ranges_ns, std::memory_order_relaxed);
    counters.filter_ns.fetch_add(filter_ns, std::memory_order_relaxed);
    counters.reads.fetch_add(1, std::memory_order_relaxed);
    DeviceRead out;
    out.views.resize(targets.size());
    out.members.resize(targets.size());
    for (Group& g : groups) {
        if (g.views.size() != g.of.size()) throw StatusError(Internal("device read: object count"));
        const std::uintptr_t base = g.arena->ptr().address;
        for (std::size_t t = 0; t < g.of.size(); ++t) {
            const SourceDescriptor& d = g.views[t].desc;
            const Index nnz = Index(d.nnz), rank = Index(d.rank());
            out.members[g.of[t]] = {
                View({base + g.out_at[2 * t], device}, d.nnz * d.rank() * DTypeSize(d.index_dtype),
                     d.index_dtype, {nnz, rank}, g.arena),
                View({base + g.out_at[2 * t + 1], device}, d.nnz * DTypeSize(d.value_dtype),
                     d.value_dtype, {nnz}, g.arena)};
            out.views[g.of[t]] = std::move(g.views[t]);
        }
    }
    counters.total_ns.fetch_add(NanosSince(start), std::memory_order_relaxed);
    return out;
}

/// encode_updates of CUDA (new, old) pairs on the device, on the first pair's stream. With
/// `synchronize`, the call returns once the results are complete (for consumers on any stream);
/// without, once they are sized, their last kernels still running on that stream (torch's
/// current stream, which the results' torch consumers are ordered on, as after any torch op).
std::vector<cuda::GpuEncoded> EncodeBatch(const pyb::list& news, const pyb::list& olds,
                                          const std::string& apply, double threshold,
                                          const pyb::object& tile_shape, const pyb::object& stream,
                                          bool synchronize) {
    if (olds.size() != news.size()) {
        ThrowIfError(InvalidArgument(std::to_string(news.size()) + " new tensors but " +
                                     std::to_string(olds.size()) + " old ones"));
    }
    std::vector<ParsedTensor> keep;
    std::vector<cuda::DeviceArray> n, o;
    keep.reserve(news.size() * 2);
    n.reserve(news.size());
    o.reserve(news.size());
    for (std::size_t i = 0; i < news.size(); ++i) {
        n.push_back(CudaItem(news[i], "pairs", news.size(), i, "new", false, stream, keep));
        o.push_back(CudaItem(olds[i], "pairs", news.size(), i, "old", false, stream, keep));
    }
    cuda::GpuEncodeOptions opt;
    opt.apply = ValueOrThrow(ParseApplyMode(apply));
    opt.threshold = threshold;
    opt.tile_shape = OptShape(tile_shape, "tile_shape");
    opt.stream = keep.empty() ? 0 : keep[0].ref.stream;
    Result<std::vector<cuda::GpuEncoded>> r = Internal("unset");
    {
        pyb::gil_scoped_release nogil;
        r = cuda::EncodeUpdates(n, o, opt);
        if (r.ok() && synchronize) ThrowIfError(cuda::Synchronize(opt.stream));
    }
    return ValueOrThrow(std::move(r));
}

/// The indices (or values) of encoded items as runs: maximal sequences of items, in item order
/// within one dtype (and rank), whose members lie back to back in the batch's allocation (the
/// encode writes each section's members so). A list of (array of the run, entries per item,
/// items): one DLPack import and one split per run instead of one import per member.
pyb::list Runs(const std::vector<cuda::GpuEncoded>& encoded, bool indices) {
    struct Run {
        DType dtype;
        std::uint32_t rank;
        std::uint64_t address, bytes, entries;
        pyb::list sizes, items;
        const cuda::GpuEncoded* first;
    };
    std::vector<Run> runs;  // few: one per member dtype (and rank) and sub-batch
    for (std::size_t i = 0; i < encoded.size(); ++i) {
        const cuda::GpuEncoded& e = encoded[i];
        const DType dtype = indices ? e.index_dtype : e.value_dtype;
        const std::uint32_t rank = indices ? e.rank : 1;
        const std::uint64_t address = (indices ? e.indices : e.values).address;
        const std::uint64_t bytes = indices ? e.indices_bytes() : e.values_bytes();
        Run* run = nullptr;
        for (Run& r : runs) {
            if (r.dtype == dtype && r.rank == rank && r.address + r.bytes == address &&
                r.first->keepalive == e.keepalive) {
                run = &r;
                break;
            }
        }
        if (run == nullptr) {
            runs.push_back({dtype, rank, address, 0, 0, pyb::list(), pyb::list(), &e});
            run = &runs.back();
        }
        run->bytes += bytes;
        run->entries += e.nnz;
        run->sizes.append(e.nnz);
        run->items.append(i);
    }
    pyb::list out;
    for (Run& r : runs) {
        Shape shape = indices ? Shape{Index(r.entries), Index(r.rank)} : Shape{Index(r.entries)};
        auto owner = std::const_pointer_cast<void>(r.first->keepalive);
        out.append(pyb::make_tuple(View({r.address, (indices ? r.first->indices : r.first->values).device},
                                        r.bytes, r.dtype, std::move(shape), owner),
                                   std::move(r.sizes), std::move(r.items)));
    }
    return out;
}

DeviceArray DeviceOf(const pyb::handle& o, const char* what, int device, std::uintptr_t stream) {
    if (pyb::isinstance<DeviceArray>(o)) return o.cast<DeviceArray>();
    if (IsCudaArray(o)) {
        ParsedTensor t = ParseTensorArg(o, what, false, pyb::none());
        DeviceArray a = View({t.ref.device.address, t.ref.device.device}, t.ref.device.bytes, t.ref.dtype,
                             t.ref.shape, t.keepalive);
        if (!IsCContiguous(t.ref.shape, t.ref.strides)) {
            ThrowIfError(InvalidArgument(std::string(what) + " must be C-contiguous"));
        }
        return a;
    }
    BorrowedArray h = Borrow(o, what);
    auto buf = cuda::DeviceBuffer::Allocate(h.nbytes, device, stream);
    if (!buf.ok()) throw StatusError(buf.status());
    auto owner = std::make_shared<cuda::DeviceBuffer>(std::move(buf).value());
    {
        pyb::gil_scoped_release nogil;
        ThrowIfError(cuda::CopyToDevice({h.data, h.nbytes}, owner->ptr(), stream));
    }
    return View(owner->ptr(), h.nbytes, h.dtype, h.shape, owner);
}

}  // namespace

void RegisterGpu(pyb::module_& m) {
    pyb::class_<DeviceArray>(m, "_DeviceArray", "A C-contiguous array in CUDA memory (DLPack).")
        .def_property_readonly("dtype", [](const DeviceArray& a) { return std::string(DTypeName(a.dtype)); })
        .def_property_readonly("shape", [](const DeviceArray& a) { return ShapeTuple(a.shape); })
        .def_property_readonly("nbytes", [](const DeviceArray& a) { return a.bytes; })
        .def_property_readonly("device", [](const DeviceArray& a) { return a.ptr.device; })
        .def_property_readonly("data_ptr", [](const DeviceArray& a) { return a.ptr.address; })
        .def("__dlpack__",
             [](const DeviceArray& a, const pyb::object& /*stream*/, const pyb::kwargs&) {
                 // Written on the producing call's stream and synchronized before it returned.
                 return ToCapsule(a);
             },
             pyb::arg("stream") = pyb::none())
        .def("__dlpack_device__",
             [](const DeviceArray& a) { return pyb::make_tuple(int(kDLCUDA), a.ptr.device); })
        .def("to_host",
             [](const DeviceArray& a) {
                 std::vector<std::byte> host(a.bytes);
                 {
                     pyb::gil_scoped_release nogil;
                     ThrowIfError(cuda::CopyToHost(a.ptr, host, 0));
                 }
                 return ToNumpy(std::move(host), a.dtype, a.shape);
             },
             "A numpy copy (bfloat16 as uint16 bits).");

    pyb::class_<DeviceObjects>(m, "_DeviceObjects",
                               "Target objects in device memory (a device read or an upload).")
        .def("__len__", [](const DeviceObjects& b) { return b.hosts.size(); })
        .def("host",
             [](const DeviceObjects& b, std::size_t i) {
                 if (i >= b.hosts.size()) throw pyb::index_error(std::to_string(i));
                 return b.hosts[i];
             })
        .def("indices",
             [](const DeviceObjects& b, std::size_t i) {
                 if (i >= b.members.size()) throw pyb::index_error(std::to_string(i));
                 return b.members[i].first;
             })
        .def("values", [](const DeviceObjects& b, std::size_t i) {
            if (i >= b.members.size()) throw pyb::index_error(std::to_string(i));
            return b.members[i].second;
        });

    m.def(
        "_device_read_counters",
        [] {
            const DeviceReadCounters& c = ReadCounters();
            pyb::dict d;
            d["reads"] = c.reads.load();
            d["total_seconds"] = double(c.total_ns.load()) * 1e-9;
            d["plan_seconds"] = double(c.plan_ns.load()) * 1e-9;
            d["ranges_seconds"] = double(c.ranges_ns.load()) * 1e-9;
            d["filter_seconds"] = double(c.filter_ns.load()) * 1e-9;
            return d;
        },
        "What read_sparse_objects(device=...) built on the device in this process (monotonic): "
        "reads, and the seconds of those reads: total_seconds (the calls, up to the objects), "
        "plan_seconds (the store's planning, through the node daemon its reply), "
        "ranges_seconds (the ranges' copies into device memory: through the node daemon its "
        "copies, on the embedded store issuing the gather and copying its pageable ranges), "
        "filter_seconds (filter and rebase on the device, with its one sync, which on the "
        "embedded store waits for the gather too).");
    m.def(
        "_set_device_read_groups",
        [](int groups) {
            if (groups < 0) ThrowIfError(InvalidArgument("device read groups must be >= 0"));
            return DeviceReadGroups().exchange(groups);
        },
        pyb::arg("groups"),
        "Groups of whole tensors a device read plans one after another "
        "(group k + 1 planned while group k's ranges are copied; 0: automatic, up to 4 of at "
        "least 128 targets each on the embedded store, one through the node daemon); returns "
        "the previous value.");
    m.def(
        "_set_device_read_staging",
        [](bool on) { return DeviceReadStaging().exchange(on); },
        pyb::arg("on"),
        "Whether a device read through the node daemon has the daemon copy its ranges into "
        "this process's device memory as it plans the read (default), rather than on a copy "
        "request once the plan is back; returns the previous value.");
    m.def(
        "_set_device_gather_engine_bytes",
        [](std::uint64_t bytes) { return DeviceGatherEngineBytes().exchange(bytes); },
        pyb::arg("bytes"),
        "Runs of pinned ranges of at least this many bytes that a device read on the embedded "
        "store hands to the copy engine, beside the gather kernel for the rest (0: all by the "
        "kernel); returns the previous value.");
    m.def("gpu_available", [] { return cuda::Available(); },
          "True when a CUDA device is usable by the GPU codec.");

    m.def(
        "_gpu_encode_updates",
        [](const pyb::list& news, const pyb::list& olds, const std::string& apply, double threshold,
           const pyb::object& tile_shape, const pyb::object& stream) {
            pyb::list out;
            for (const cuda::GpuEncoded& e : EncodeBatch(news, olds, apply, threshold, tile_shape, stream, true)) {
                out.append(EncodedTuple(e));
            }
            return out;
        },
        pyb::arg("news"), pyb::arg("olds"), pyb::arg("apply"), pyb::arg("threshold"),
        pyb::arg("tile_shape"), pyb::arg("stream"),
        "GPU batch encode: per pair (indices, values, tile_coords, tile_ptr, tile_shape), device "
        "arrays in one allocation.");

    m.def(
        "_gpu_encode_runs",
        [](const pyb::list& news, const pyb::list& olds, const std::string& apply, double threshold,
           const pyb::object& tile_shape, const pyb::object& stream) {
            const std::vector<cuda::GpuEncoded> encoded =
                EncodeBatch(news, olds, apply, threshold, tile_shape, stream, false);
            return pyb::make_tuple(Runs(encoded, true), Runs(encoded, false));
        },
        pyb::arg("news"), pyb::arg("olds"), pyb::arg("apply"), pyb::arg("threshold"),
        pyb::arg("tile_shape"), pyb::arg("stream"),
        "GPU batch encode, the members as runs: (index runs, value runs), each run (array, "
        "entries per item, items): the run's items' members back to back in one device array "
        "([entries, rank] indices or [entries] values, one dtype), in item order. Returns with "
        "the last kernels still running on `stream` (for torch consumers on that stream).");

    m.def(
        "_gpu_upload_batch",
        [](const std::vector<std::shared_ptr<SparseObjectView>>& objs, int device, std::uintptr_t stream,
           const pyb::object& store) {
            NodeClient* node =
                pyb::isinstance<PyStore>(store) ? store.cast<PyStore&>().node() : nullptr;
            DeviceObjects out;
            {
                pyb::gil_scoped_release nogil;
                std::optional<std::vector<std::pair<DeviceArray, DeviceArray>>> direct;
                if (node != nullptr && !objs.empty()) direct = UploadThroughDaemon(*node, objs, device, stream);
                out.members = direct ? std::move(*direct) : UploadBatch(objs, device, stream);
            }
            out.hosts = objs;
            return out;
        },
        pyb::arg("objs"), pyb::arg("device"), pyb::arg("stream"), pyb::arg("store") = pyb::none(),
        "Target objects with their indices and values in one device allocation (a few large "
        "copies), as a _DeviceObjects; with the node daemon's `store`, copied there by the "
        "daemon itself (CUDA IPC).");

    m.def(
        "_gpu_read_sparse_objects",
        [](PyStore& s, const pyb::list& manifest_list, const pyb::object& targets,
           const std::string& strategy, std::int64_t read_coalesce_gap, int num_threads,
           const std::optional<std::pair<std::uint64_t, std::uint64_t>>& generation,
           const std::vector<std::string>& unchanged, int device,
           std::uintptr_t stream) -> pyb::object {
            const ManifestArg manifest = ManifestFrom(manifest_list);
            const TargetsArg targets_arg = TargetsArgFrom(targets);
            const std::span<const TargetDescriptor> tds = targets_arg.targets;
            ReadOptions options = ParseReadOptions(strategy, read_coalesce_gap, num_threads);
            options.view_in_place = true;
            std::vector<std::string> sorted = unchanged;
            std::sort(sorted.begin(), sorted.end());
            const Generation g =
                generation ? ValueOrThrow(Generation::Make(generation->first, generation->second))
                : manifest.sources.empty() ? Generation{0, 1}
                                           : manifest.sources.front().generation;
            const StepManifestView step(g, manifest.sources, sorted);
            std::optional<DeviceRead> r;
            {
                pyb::gil_scoped_release nogil;
                r = ReadOnDevice(s, step, tds, options, device, stream);
            }
            if (!r) return pyb::none();
            DeviceObjects out;
            out.hosts.reserve(r->views.size());
            for (TargetObjectView& v : r->views) {
                out.hosts.push_back(std::make_shared<SparseObjectView>(std::move(v)));
            }
            out.members = std::move(r->members);
            return pyb::cast(std::move(out));
        },
        pyb::arg("store"), pyb::arg("manifest"), pyb::arg("targets"), pyb::arg("strategy"),
        pyb::arg("read_coalesce_gap"), pyb::arg("num_threads"), pyb::arg("generation"),
        pyb::arg("unchanged"), pyb::arg("device"), pyb::arg("stream"),
        "read_sparse_objects into device memory, planned on the store and built on the device: "
        "a _DeviceObjects, or None where the store does not plan reads for its caller (the "
        "caller then reads on the host and uploads).");

    m.def(
        "_gpu_apply_batch",
        [](const pyb::list& weights, const pyb::list& indices, const pyb::list& values,
           const std::vector<std::string>& applies, const pyb::object& stream) {
            const std::size_t n = weights.size();
            if (indices.size() != n || values.size() != n || applies.size() != n) {
                ThrowIfError(InvalidArgument("weights, indices, values and apply modes differ in length"));
            }
            std::vector<ParsedTensor> keep_w;
            std::vector<DeviceArray> keep_m;
            std::vector<cuda::ApplyItem> items(n);
            keep_w.reserve(n);
            keep_m.reserve(2 * n);
            std::uintptr_t s = 0;
            for (std::size_t i = 0; i < n; ++i) {
                items[i].weight =
                    CudaItem(weights[i], "weights", n, i, "weight", true, stream, keep_w);
                if (i == 0) s = keep_w.back().ref.stream;
                const int dev = items[i].weight.ptr.device;
                keep_m.push_back(DeviceOf(indices[i], "indices", dev, s));
                items[i].indices = keep_m.back().view();
                keep_m.push_back(DeviceOf(values[i], "values", dev, s));
                items[i].values = keep_m.back().view();
                items[i].apply = ValueOrThrow(ParseApplyMode(applies[i]));
            }
            pyb::gil_scoped_release nogil;
            ThrowIfError(cuda::ApplySparseBatch(items, s));
        },
        pyb::arg("weights"), pyb::arg("indices"), pyb::arg("values"), pyb::arg("applies"),
        pyb::arg("stream"),
        "Applies local (indices, values) to CUDA weights (rank 1-3, strided views allowed) in "
        "place, in a few launches on `stream`; all coordinates are checked before any write.");
    m.def(
        "_gpu_apply_objects",
        [](const pyb::list& weights, const pyb::list& objs, const pyb::object& stream) -> bool {
            // DeviceSparseObject's attributes (mooncake/sparse/_gpu.py), interned once.
            static PyObject* const k_host = PyUnicode_InternFromString("_host");
            static PyObject* const k_indices = PyUnicode_InternFromString("_indices_dev");
            static PyObject* const k_values = PyUnicode_InternFromString("_values_dev");
            static PyObject* const k_batch = PyUnicode_InternFromString("_batch");
            static PyObject* const k_index = PyUnicode_InternFromString("_i");
            const std::size_t n = weights.size();
            if (objs.size() != n) {
                ThrowIfError(InvalidArgument(std::to_string(n) + " weights but " +
                                             std::to_string(objs.size()) + " objects"));
            }
            // A borrowed attribute of a device object, or null (not a device object).
            const auto member = [](pyb::handle o, PyObject* key) -> pyb::object {
                PyObject* v = PyObject_GetAttr(o.ptr(), key);
                if (v == nullptr) PyErr_Clear();
                return pyb::reinterpret_steal<pyb::object>(v);
            };
            const auto text = [](auto shape) {  // as Python prints a shape tuple
                std::string t = "(";
                for (std::size_t d = 0; d < shape.size(); ++d) {
                    if (d > 0) t += ", ";
                    t += std::to_string(shape[d]);
                }
                return t + (shape.size() == 1 ? ",)" : ")");
            };
            std::vector<ParsedTensor> keep_w;
            std::vector<pyb::object> keep_o;  // the objects' members stay referenced
            std::vector<cuda::ApplyItem> items(n);
            keep_w.reserve(n);
            keep_o.reserve(3 * n);
            std::uintptr_t s = 0;
            // The batch of the previous item: a read's objects share one, cast once.
            PyObject* last_batch = nullptr;
            const DeviceObjects* last = nullptr;
            for (std::size_t i = 0; i < n; ++i) {
                // A DeviceSparseObject of a batch (a device read, an upload): its members are
                // the batch's, taken without converting them to Python objects.
                const SparseObjectView* view_of = nullptr;
                const DeviceArray* idx_of = nullptr;
                const DeviceArray* val_of = nullptr;
                pyb::object batch = member(objs[i], k_batch);
                if (batch && batch.ptr() != last_batch && pyb::isinstance<DeviceObjects>(batch)) {
                    last = &batch.cast<const DeviceObjects&>();
                    last_batch = batch.ptr();
                    keep_o.push_back(batch);
                }
                if (batch && batch.ptr() == last_batch) {
                    pyb::object k = member(objs[i], k_index);
                    const DeviceObjects& b = *last;
                    const Py_ssize_t at = k && PyLong_Check(k.ptr()) ? PyLong_AsSsize_t(k.ptr()) : -1;
                    if (at == -1) PyErr_Clear();
                    if (at < 0 || std::size_t(at) >= b.hosts.size() ||
                        std::size_t(at) >= b.members.size()) {
                        return false;
                    }
                    view_of = b.hosts[at].get();
                    idx_of = &b.members[at].first;
                    val_of = &b.members[at].second;
                } else {
                    pyb::object host = member(objs[i], k_host);
                    pyb::object idx = member(objs[i], k_indices);
                    pyb::object val = member(objs[i], k_values);
                    if (!host || !idx || !val || !pyb::isinstance<SparseObjectView>(host) ||
                        !pyb::isinstance<DeviceArray>(idx) || !pyb::isinstance<DeviceArray>(val)) {
                        return false;  // not all device objects: the caller's general path
                    }
                    view_of = &host.cast<const SparseObjectView&>();
                    idx_of = &idx.cast<const DeviceArray&>();
                    val_of = &val.cast<const DeviceArray&>();
                    keep_o.push_back(std::move(host));
                    keep_o.push_back(std::move(idx));
                    keep_o.push_back(std::move(val));
                }
                items[i].weight =
                    CudaItem(weights[i], "weights", n, i, "weight", true, stream, keep_w);
                if (i == 0) s = keep_w.back().ref.stream;
                if (items[i].weight.ptr.device != items[0].weight.ptr.device) return false;
                const SparseObjectView& view = *view_of;
                const auto local = view.target_box.shape();
                if (!std::equal(local.begin(), local.end(), items[i].weight.shape.begin(),
                                items[i].weight.shape.end())) {
                    ThrowIfError(InvalidArgument("weights[" + std::to_string(i) + "] shape " +
                                                 text(std::span<const Index>(items[i].weight.shape)) +
                                                 " != object local shape " + text(local)));
                }
                items[i].indices = idx_of->view();
                items[i].values = val_of->view();
                items[i].apply = view.desc.apply;
            }
            pyb::gil_scoped_release nogil;
            ThrowIfError(cuda::ApplySparseBatch(items, s));
            return true;
        },
        pyb::arg("weights"), pyb::arg("objs"), pyb::arg("stream"),
        "apply_sparse_objects of device objects (read_sparse_objects(..., device=...)) to CUDA "
        "weights of one device, in a few launches on `stream`, every shape and coordinate checked "
        "before any write; False (nothing done) when an object is not a device object or the "
        "weights span devices.");
    m.attr("HAS_GPU_CODEC") = true;
}

std::shared_ptr<void> StageDeviceMembers(std::span<ParsedPut* const> puts, std::uintptr_t stream) {
    struct Slot {
        const DeviceMember* member;
        HostArray* dst;
        std::uint64_t offset;
    };
    std::vector<Slot> slots;
    for (ParsedPut* p : puts) {
        if (p->device_indices) slots.push_back({&*p->device_indices, &p->request.indices, 0});
        if (p->device_values) slots.push_back({&*p->device_values, &p->request.values, 0});
    }
    if (slots.empty()) return nullptr;
    std::sort(slots.begin(), slots.end(), [](const Slot& x, const Slot& y) {
        return x.member->device != y.member->device ? x.member->device < y.member->device
                                                    : x.member->address < y.member->address;
    });
    // Members back to back on the device stay back to back in the staging buffer, so their
    // copies merge; others start 64-byte aligned.
    std::uint64_t total = 0;
    for (std::size_t k = 0; k < slots.size(); ++k) {
        const DeviceMember* m = slots[k].member;
        const DeviceMember* prev = k == 0 ? nullptr : slots[k - 1].member;
        const bool adjacent = prev != nullptr && prev->device == m->device &&
                              prev->address + prev->bytes == m->address;
        slots[k].offset = adjacent ? total : AlignUp(total, 64);
        total = slots[k].offset + m->bytes;
    }
    // Waits for the staging buffer without the GIL: its holder may need the GIL to finish.
    Result<cuda::PinnedStaging::Lease> lease = Internal("unset");
    {
        pyb::gil_scoped_release nogil;
        lease = cuda::PinnedStaging::Acquire(total);
    }
    if (!lease.ok()) throw StatusError(lease.status());
    auto held = std::make_shared<cuda::PinnedStaging::Lease>(std::move(lease).value());
    std::byte* host = held->bytes().data();
    std::vector<cuda::HostDeviceCopy> copies;
    copies.reserve(slots.size());
    for (const Slot& sl : slots) {
        copies.push_back({{sl.member->address, sl.member->device},
                          {host + sl.offset, static_cast<std::size_t>(sl.member->bytes)}});
    }
    {
        pyb::gil_scoped_release nogil;
        ThrowIfError(cuda::CopyBatchToHost(copies, stream));
    }
    for (const Slot& sl : slots) {
        *sl.dst = HostArray{sl.member->dtype, sl.member->shape,
                            {host + sl.offset, static_cast<std::size_t>(sl.member->bytes)}};
    }
    return held;
}

#else

std::shared_ptr<void> StageDeviceMembers(std::span<ParsedPut* const> puts, std::uintptr_t) {
    if (puts.empty()) return nullptr;
    throw StatusError(Unimplemented(
        "this build of mooncake.sparse has no GPU codec: commit host arrays (e.g. .cpu())"));
}

void RegisterGpu(pyb::module_& m) {
    m.def(
        "_device_read_counters",
        [] {
            pyb::dict d;
            d["reads"] = 0;
            for (const char* k : {"total_seconds", "plan_seconds", "ranges_seconds", "filter_seconds"}) {
                d[k] = 0.0;
            }
            return d;
        },
        "No device reads without the GPU codec: every counter 0.");
    m.def("gpu_available", [] { return false; },
          "False: this build has no GPU codec (built without a CUDA compiler).");
    m.attr("HAS_GPU_CODEC") = false;
}

#endif

}  // namespace mooncake::sparse::py
