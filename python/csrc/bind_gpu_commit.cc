// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// CommitDeviceBatch (bind_common.h): put_sparse_objects of a batch encoded on the GPU, on the
// embedded store, with one copy of the entries. The staging path (StageDeviceMembers, then
// PutSparseObjects) copies every member to pinned staging, checks and indexes and checksums the
// entries on the host, then copies them again into the store. Here the GPU does the checks, the
// tile index and the checksums (cuda::IndexCanonicalBatch), and the commit's fill copies the
// entries from the device straight into the store's memory of each object.
//
// Results are those of the staging path, update by update: an update the GPU takes makes the
// object the host's sorted fast path makes (PlanIndexedSource + FinishCanonicalEntries); any
// other update goes through the host's encode (BuildSourceObject) on staged copies of its
// members, errors included, and joins the same commit, so that fencing and idempotence see the
// batch in one piece as PutSparseObjects does.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bind_common.h"
#include "executor/sparse_store.h"
#include "transport/cuda_runtime.h"  // kCudaPerThreadStream
#include "transport/host_copy.h"
#include "transport/parallel_for.h"

#if MCS_PY_WITH_GPU_CODEC
#include "cuda/gpu_codec.h"
#include "cuda/gpu_index.h"
#include "cuda/gpu_read.h"
#endif

namespace mooncake::sparse::py {

namespace {

/// What CommitDeviceBatch committed in this process (its direct path only): for tests and
/// benchmarks to tell it from the staging path, whose results are the same.
struct DeviceCommitCounters {
    std::atomic<std::uint64_t> batches{0};  ///< Commits of batches that took the direct path.
    std::atomic<std::uint64_t> objects{0};  ///< Updates indexed on the GPU and committed so.
    std::atomic<std::uint64_t> groups{0};   ///< Groups of their checks (DeviceCommitGroups).
    std::atomic<std::uint64_t> bytes{0};    ///< Entry bytes copied from the device by a fill.
    // Where the direct path's time goes (ns, summed over batches): the whole call, the GPU's
    // check/index/checksum pass with its planning, the commit (PutIndexedObjects), and the fill
    // inside it (the copies from the device).
    std::atomic<std::uint64_t> total_ns{0};
    std::atomic<std::uint64_t> index_ns{0};
    std::atomic<std::uint64_t> commit_ns{0};
    std::atomic<std::uint64_t> fill_ns{0};
    // Inside the commit: from its start to the first fill (checks, metadata, allocation), and
    // from the last fill's end to its end (manifest entries, heads, results).
    std::atomic<std::uint64_t> prepare_ns{0};
    std::atomic<std::uint64_t> publish_ns{0};
};

DeviceCommitCounters& DirectCounters() {
    static DeviceCommitCounters* c = new DeviceCommitCounters;  // never destroyed
    return *c;
}

/// Entry bytes of the first group of a commit checked on the GPU (DeviceCommitGroups: each next
/// group three times the one before, checked while the one before it is copied into the
/// store); 0 (the default until it is measured on a GPU): one group.
/// _set_device_commit_group_bytes sets it for the process.
std::atomic<std::uint64_t>& DeviceCommitGroupBytes() {
    static std::atomic<std::uint64_t> bytes{0};
    return bytes;
}

}  // namespace

void RegisterGpuCommit(pyb::module_& m) {
    m.def(
        "_device_commit_counters",
        [] {
            pyb::dict d;
            d["batches"] = DirectCounters().batches.load();
            d["objects"] = DirectCounters().objects.load();
            d["groups"] = DirectCounters().groups.load();
            d["bytes"] = DirectCounters().bytes.load();
            d["total_seconds"] = double(DirectCounters().total_ns.load()) * 1e-9;
            d["index_seconds"] = double(DirectCounters().index_ns.load()) * 1e-9;
            d["commit_seconds"] = double(DirectCounters().commit_ns.load()) * 1e-9;
            d["fill_seconds"] = double(DirectCounters().fill_ns.load()) * 1e-9;
            d["prepare_seconds"] = double(DirectCounters().prepare_ns.load()) * 1e-9;
            d["publish_seconds"] = double(DirectCounters().publish_ns.load()) * 1e-9;
            return d;
        },
        "What put_sparse_objects committed in this process by indexing on the GPU and copying "
        "entries straight into the embedded store (monotonic): batches, objects, groups (of "
        "their GPU checks, each after the first checked while the one before it is copied), "
        "bytes, and the "
        "seconds of those batches: total_seconds (the calls), index_seconds (planning and the "
        "GPU's checks, tile index and checksums), commit_seconds (the store's commit), "
        "fill_seconds (the copies from the device, inside the commit), prepare_seconds (the "
        "commit before its first fill: checks, metadata, allocation) and publish_seconds (after "
        "its last fill: manifest entries, heads, results).");
    m.def(
        "_set_device_commit_group_bytes",
        [](std::uint64_t bytes) { return DeviceCommitGroupBytes().exchange(bytes); },
        pyb::arg("bytes"),
        "Entry bytes of the first group of a commit from CUDA memory checked on the GPU in this "
        "process (each next group three times the one before, checked while the one before it "
        "is copied into the store; 0: the whole commit checked before any of it is copied); "
        "returns the previous value.");
}

#if MCS_PY_WITH_GPU_CODEC
namespace {

std::uint64_t AlignUp(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

/// Members under this size are copied from the device by one kernel for the whole commit
/// (cuda::CopyRanges), the larger ones by the copy engine: a transfer's fixed cost (a few µs)
/// is small beside 256 KiB's 5 µs at the PCIe rate, and large for the entries of a small
/// tensor. (With members of 256 KiB-1 MiB written by the kernel, the H200 layer step's commit
/// took 17.6-18.8 ms; with the engine 13.2-16.7 ms. The kernel's stores into host memory are
/// slower than the engine's copies and share the link with them: the fill of that step took
/// 5.8 ms with every large member on the engine, 6.4 with a third of their bytes written by the
/// kernel at the same time, 6.5 with half, 8.1 with all.)
constexpr std::uint64_t kEngineMinBytes = std::uint64_t{256} << 10;

/// The device members of the objects of a commit (null for objects built on the host), and
/// where the entries bound for pageable store memory are staged.
struct DeviceEntries {
    std::vector<const DeviceMember*> indices;
    std::vector<const DeviceMember*> values;
    int device = 0;
    std::uintptr_t stream = 0;
    /// Pinned staging, held across the commit (taken before it, as the staging path takes it,
    /// so that two commits never wait on each other), or null: entries bound for pageable
    /// memory are then copied there directly (the driver stages them).
    std::byte* staging = nullptr;
    std::uint64_t staging_bytes = 0;
    /// Whether the staging takes large members too (a store without page-locked memory for its
    /// objects: host threads copy out of the staging faster than the driver stages).
    bool stage_large = false;
};

/// Whether `bytes` of a member are staged or written by the kernel rather than the engine.
bool Small(std::uint64_t bytes) { return bytes < kEngineMinBytes; }

/// The commit's fill: every target's entries from the device, in one kernel launch for the small
/// members (into page-locked store memory directly, into pageable store memory through the
/// pinned staging, then host copies on several threads) and copy-engine transfers for the large
/// ones, then one host sync.
Status FillFromDevice(std::span<const EntryTarget> targets, const DeviceEntries& from) {
    const auto t0 = std::chrono::steady_clock::now();
    struct Clock {
        std::chrono::steady_clock::time_point t0;
        ~Clock() { DirectCounters().fill_ns.fetch_add(NanosSince(t0), std::memory_order_relaxed); }
    } clock{t0};
    const bool host_addresses = cuda::HostPointersAreDeviceAddresses(from.device);
    std::optional<std::uintptr_t> staging_address;
    if (from.staging != nullptr) {
        staging_address = host_addresses ? std::optional(reinterpret_cast<std::uintptr_t>(from.staging))
                                         : cuda::DeviceAddressOfHost(from.staging, from.device);
    }
    std::vector<cuda::RangeCopy> kernel;
    std::vector<cuda::HostDeviceCopy> engine;
    std::vector<HostCopy> out;  // staging -> pageable store memory, after the sync
    std::uint64_t staged = 0;
    const auto route = [&](const DeviceMember& m, std::span<std::byte> dst, bool pinned) {
        if (m.bytes == 0) return;
        const bool small = Small(m.bytes);
        if (pinned) {
            if (small && host_addresses) {
                kernel.push_back({m.address, reinterpret_cast<std::uintptr_t>(dst.data()), m.bytes});
            } else {
                engine.push_back({{m.address, m.device}, dst});
            }
            return;
        }
        // Pageable: through the staging when it has room (the same 16-byte phase as the
        // member, so the kernel writes whole words), else straight (the driver stages).
        const std::uint64_t at = AlignUp(staged, 64) + (m.address & 15);
        if (staging_address && (small || from.stage_large) && at + m.bytes <= from.staging_bytes) {
            staged = at + m.bytes;
            if (small) {
                kernel.push_back({m.address, *staging_address + at, m.bytes});
            } else {
                engine.push_back({{m.address, m.device},
                                  {from.staging + at, static_cast<std::size_t>(m.bytes)}});
            }
            out.push_back({dst.data(), from.staging + at, m.bytes});
            return;
        }
        engine.push_back({{m.address, m.device}, dst});
    };
    std::uint64_t bytes = 0;
    for (const EntryTarget& t : targets) {
        if (t.object >= from.indices.size() || from.indices[t.object] == nullptr ||
            from.values[t.object] == nullptr) {
            return Internal("the commit asked for the entries of an object not on the device");
        }
        const DeviceMember* idx = from.indices[t.object];
        const DeviceMember* val = from.values[t.object];
        if (t.indices.size() != idx->bytes || t.values.size() != val->bytes) {
            return Internal("the commit's entry sizes differ from the device members'");
        }
        route(*idx, t.indices, t.pinned);
        route(*val, t.values, t.pinned);
        bytes += t.indices.size() + t.values.size();
    }
    DirectCounters().bytes.fetch_add(bytes, std::memory_order_relaxed);
    // The engine's copies and the kernel at the same time; both complete on return.
    const std::function<Status()> launch = [&]() -> Status {
        return kernel.empty() ? Status::Ok() : cuda::CopyRanges(kernel, from.device, from.stream);
    };
    if (!engine.empty()) {
        MCS_RETURN_IF_ERROR(cuda::CopyBatchToHostAlongside(engine, from.stream, launch));
    } else if (!kernel.empty()) {
        MCS_RETURN_IF_ERROR(launch());
        MCS_RETURN_IF_ERROR(cuda::Synchronize(from.stream));
    }
    if (!out.empty()) ParallelCopies(out, DefaultCopyThreads());
    return Status::Ok();
}

/// The staging room CommitDeviceBatch's fill may need: every staged member, each start 64-byte
/// aligned plus its 16-byte phase.
std::uint64_t StagingBytes(const DeviceEntries& e) {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < e.indices.size(); ++i) {
        if (e.indices[i] == nullptr) continue;
        for (const DeviceMember* m : {e.indices[i], e.values[i]}) {
            if (m->bytes == 0 || (!Small(m->bytes) && !e.stage_large)) continue;
            total = AlignUp(total, 64) + (m->address & 15) + m->bytes;
        }
    }
    return total;
}

}  // namespace

std::optional<std::vector<Result<CommitResult>>> CommitDeviceBatch(
    SparseService& service, std::span<ParsedPut* const> puts, int num_threads,
    std::uintptr_t stream) {
    const std::size_t n = puts.size();
    if (n == 0 || !service.object_store().FillsInPlace()) return std::nullopt;
    const auto t_start = std::chrono::steady_clock::now();
    // Every member on one GPU, and no tensor twice with two generations (its second step
    // commits after the first one's head moved: the staging path orders them).
    int device = -1;
    std::map<std::string_view, Generation, std::less<>> generation_of;
    for (ParsedPut* p : puts) {
        if (!p->device_indices || !p->device_values) return std::nullopt;
        if (device < 0) device = p->device_indices->device;
        if (p->device_indices->device != device || p->device_values->device != device) {
            return std::nullopt;
        }
        const PutSparseRequest& r = p->request;
        auto [it, fresh] = generation_of.try_emplace(r.tensor_id, r.generation);
        if (!fresh && it->second != r.generation) return std::nullopt;
    }
    // What the GPU may take: what the host's sorted fast path would, as far as it can tell
    // without the entries.
    const auto t_index = std::chrono::steady_clock::now();
    std::vector<std::optional<SourceDescriptor>> plans(n);
    std::vector<cuda::IndexItem> items;
    std::vector<std::size_t> item_of;
    for (std::size_t k = 0; k < n; ++k) {
        const DeviceMember& di = *puts[k]->device_indices;
        const DeviceMember& dv = *puts[k]->device_values;
        const CooLayout layout{di.dtype, di.shape, di.bytes, dv.dtype, dv.shape, dv.bytes};
        plans[k] = PlanIndexedSource(puts[k]->request, layout);
        if (!plans[k]) continue;
        items.push_back(cuda::IndexItemOf(*plans[k], {di.address, di.device},
                                          {dv.address, dv.device}));
        item_of.push_back(k);
    }
    if (items.empty()) return std::nullopt;
    // The check in groups of items (DeviceCommitGroups): the first on the caller's stream, then
    // each next one on a worker thread's stream while the one before it is copied into the
    // store (the check takes the GPU's SMs, the copies the copy engine and PCIe).
    std::vector<std::uint64_t> item_bytes(items.size());
    for (std::size_t t = 0; t < items.size(); ++t) {
        const ParsedPut& p = *puts[item_of[t]];
        item_bytes[t] = p.device_indices->bytes + p.device_values->bytes;
    }
    const std::vector<std::size_t> bounds =
        DeviceCommitGroups(item_bytes, DeviceCommitGroupBytes().load(std::memory_order_relaxed));
    const std::size_t groups = bounds.size() - 1;
    std::vector<std::optional<SparseObject>> objects(n);
    // Group g's check and objects (each from its tile index, its tile checksums and its
    // descriptor's checks, in parallel: a layer's large tensors have thousands of tiles each);
    // false when the GPU pass failed (its items take the staging path).
    const auto check = [&](std::size_t g, std::uintptr_t on) -> bool {
        const std::size_t lo = bounds[g], hi = bounds[g + 1];
        Result<std::vector<cuda::IndexResult>> indexed =
            cuda::IndexCanonicalBatch(std::span<const cuda::IndexItem>(items).subspan(lo, hi - lo), on);
        if (!indexed.ok()) return false;
        internal::ParallelFor(
            num_threads, hi - lo,
            [&](std::size_t j) {
                cuda::IndexResult& r = (*indexed)[j];
                if (!r.canonical) return;
                const std::size_t k = item_of[lo + j];
                objects[k] = FinishCanonicalEntries(std::move(*plans[k]), std::move(r.tile_coords),
                                                    std::move(r.tile_ptr), r.checksum_indices,
                                                    r.checksum_values);
            },
            /*chunk=*/0);
        return true;
    };
    bool first_checked = false;
    {
        pyb::gil_scoped_release nogil;
        first_checked = check(0, stream);
    }
    if (!first_checked) return std::nullopt;  // the staging path reports what is wrong, if anything
    std::uint64_t index_ns = NanosSince(t_index);
    std::vector<std::promise<bool>> promised(groups);
    std::vector<std::future<bool>> checked(groups);
    for (std::size_t g = 0; g < groups; ++g) checked[g] = promised[g].get_future();
    promised[0].set_value(true);
    std::jthread worker;
    if (groups > 1) {
        // The first check synchronized the caller's stream: the work queued there before this
        // call (the members' encode) is complete, and the worker's stream may read them.
        worker = std::jthread([&] {
            for (std::size_t g = 1; g < groups; ++g) {
                promised[g].set_value(check(g, kCudaPerThreadStream));
            }
        });
    }
    std::vector<Result<CommitResult>> results(n, Internal("unset"));
    std::vector<bool> done(n, false);
    // Entries bound for pageable store memory go through pinned staging, leased before each
    // commit as the staging path leases it: the small members of every device object (the
    // store keeps small objects out of its pinned pool), and every member when the store has no
    // page-locked memory for its objects.
    const auto* sparse_store = dynamic_cast<const SparseStore*>(&service);
    const bool stage_large = sparse_store == nullptr ||
                             sparse_store->options().pinned_quota_bytes == 0;
    std::size_t committed_batches = 0;
    // One commit of the objects `ks` (updates), the device ones' entries landing in the store
    // from the GPU; false when it failed whole (nothing of it committed). Without the GIL.
    const auto commit = [&](const std::vector<std::size_t>& ks, const std::vector<bool>& on_device)
        -> Result<bool> {
        std::vector<SparseObject> batch;
        std::vector<bool> hard_pin;
        std::vector<std::size_t> batch_of;
        DeviceEntries entries;
        entries.device = device;
        entries.stream = stream;
        entries.stage_large = stage_large;
        for (std::size_t k : ks) {
            if (!objects[k]) continue;
            batch_of.push_back(k);
            hard_pin.push_back(puts[k]->request.hard_pin);
            batch.push_back(std::move(*objects[k]));
            objects[k].reset();
            entries.indices.push_back(on_device[k] ? &*puts[k]->device_indices : nullptr);
            entries.values.push_back(on_device[k] ? &*puts[k]->device_values : nullptr);
        }
        if (batch.empty()) return true;
        std::optional<cuda::PinnedStaging::Lease> lease;
        const std::uint64_t bytes = StagingBytes(entries);
        if (bytes > 0) {
            Result<cuda::PinnedStaging::Lease> l = cuda::PinnedStaging::Acquire(bytes);
            if (l.ok()) {
                lease.emplace(std::move(l).value());
                entries.staging = lease->bytes().data();
                entries.staging_bytes = bytes;
            }
        }
        std::optional<std::chrono::steady_clock::time_point> first_fill, last_fill;
        const EntryFill fill = [&](std::span<const EntryTarget> targets) {
            if (!first_fill) first_fill = std::chrono::steady_clock::now();
            Status filled = FillFromDevice(targets, entries);
            last_fill = std::chrono::steady_clock::now();
            return filled;
        };
        const auto t_commit = std::chrono::steady_clock::now();
        Result<std::vector<Result<CommitResult>>> committed =
            service.PutIndexedObjects(std::move(batch), hard_pin, fill, num_threads);
        const auto t_end = std::chrono::steady_clock::now();
        DirectCounters().commit_ns.fetch_add(Nanos(t_end - t_commit), std::memory_order_relaxed);
        if (first_fill && last_fill) {
            DirectCounters().prepare_ns.fetch_add(Nanos(*first_fill - t_commit),
                                                  std::memory_order_relaxed);
            DirectCounters().publish_ns.fetch_add(Nanos(t_end - *last_fill),
                                                  std::memory_order_relaxed);
        }
        if (!committed.ok()) return committed.status();
        ++committed_batches;
        for (std::size_t b = 0; b < batch_of.size(); ++b) {
            results[batch_of[b]] = std::move((*committed)[b]);
            done[batch_of[b]] = true;
        }
        return true;
    };
    std::vector<bool> on_device(n, false);
    std::uint64_t device_objects = 0;
    // Groups after the first: each committed alone, once checked (a group whose check or
    // commit failed whole takes the staging path with the rest). The first group, and the
    // updates the GPU does not take, are committed together at the end as one batch (the whole
    // commit when there is one group).
    std::vector<std::size_t> first_ks;
    for (std::size_t t = bounds[0]; t < bounds[1]; ++t) first_ks.push_back(item_of[t]);
    for (std::size_t k : first_ks) on_device[k] = objects[k].has_value();
    {
        pyb::gil_scoped_release nogil;
        for (std::size_t g = 0; g < groups; ++g) {
            std::vector<std::size_t> ks;
            if (g == 0) {
                if (groups == 1) break;
                // The first group alone, so that its copies overlap the next group's check.
                ks = first_ks;
            } else {
                const auto waited = std::chrono::steady_clock::now();
                const bool ok = checked[g].get();
                index_ns += NanosSince(waited);
                if (!ok) continue;
                for (std::size_t t = bounds[g]; t < bounds[g + 1]; ++t) ks.push_back(item_of[t]);
                for (std::size_t k : ks) on_device[k] = objects[k].has_value();
            }
            Result<bool> c = commit(ks, on_device);
            if (!c.ok()) {
                // Its updates take the staging path (their objects are gone with the batch).
                for (std::size_t k : ks) on_device[k] = false;
                continue;
            }
            for (std::size_t k : ks) device_objects += on_device[k] && done[k];
        }
    }
    if (worker.joinable()) worker.join();
    if (groups == 1 && std::find(on_device.begin(), on_device.end(), true) == on_device.end()) {
        return std::nullopt;
    }
    // The others through the host's encode, on staged copies of their members (with the first
    // group's objects when there is one group).
    std::vector<Status> errors(n);
    std::vector<ParsedPut*> rest;
    std::vector<std::size_t> rest_ks, last_ks;
    for (std::size_t k = 0; k < n; ++k) {
        if (done[k]) continue;
        last_ks.push_back(k);
        if (!objects[k]) {
            on_device[k] = false;
            rest.push_back(puts[k]);
            rest_ks.push_back(k);
        }
    }
    if (!rest.empty()) {
        std::shared_ptr<void> staged = StageDeviceMembers(rest, stream);
        pyb::gil_scoped_release nogil;
        internal::ParallelFor(num_threads, rest.size(), [&](std::size_t r) {
            const std::size_t k = rest_ks[r];
            Result<SparseObject> built = BuildSourceObject(puts[k]->request);
            if (built.ok()) {
                objects[k] = std::move(built).value();
            } else {
                errors[k] = built.status();
            }
        });
        staged.reset();  // the objects own their entries now
    }
    Result<bool> last = true;
    {
        pyb::gil_scoped_release nogil;
        last = commit(last_ks, on_device);
    }
    if (!last.ok()) {
        if (committed_batches == 0) return std::nullopt;  // nothing was committed
        for (std::size_t k : last_ks) {
            if (errors[k].ok()) errors[k] = last.status();
        }
    }
    for (std::size_t k : last_ks) device_objects += on_device[k] && done[k];
    DirectCounters().batches.fetch_add(1, std::memory_order_relaxed);
    DirectCounters().groups.fetch_add(groups, std::memory_order_relaxed);
    DirectCounters().index_ns.fetch_add(index_ns, std::memory_order_relaxed);
    DirectCounters().objects.fetch_add(device_objects, std::memory_order_relaxed);
    for (std::size_t k = 0; k < n; ++k) {
        if (!errors[k].ok()) results[k] = errors[k];
        if (!results[k].ok()) {
            // As PutSparseObjects names a failed update.
            results[k] = results[k].status().WithContext("update " + std::to_string(k) + " ('" +
                                                         puts[k]->request.tensor_id + "')");
        }
    }
    DirectCounters().total_ns.fetch_add(NanosSince(t_start), std::memory_order_relaxed);
    return results;
}

#else

std::optional<std::vector<Result<CommitResult>>> CommitDeviceBatch(SparseService&,
                                                                   std::span<ParsedPut* const>,
                                                                   int, std::uintptr_t) {
    return std::nullopt;
}

#endif

}  // namespace mooncake::sparse::py
