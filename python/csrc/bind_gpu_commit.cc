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
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bind_common.h"
#include "executor/sparse_store.h"
#include "transport/host_copy.h"
#include "transport/parallel_for.h"

#if MCS_PY_WITH_GPU_CODEC
#include "cuda/gpu_codec.h"
#include "cuda/gpu_index.h"
#endif

namespace mooncake::sparse::py {

namespace {

/// What CommitDeviceBatch committed in this process (its direct path only): for tests and
/// benchmarks to tell it from the staging path, whose results are the same.
struct DeviceCommitCounters {
    std::atomic<std::uint64_t> batches{0};  ///< Commits of batches that took the direct path.
    std::atomic<std::uint64_t> objects{0};  ///< Updates indexed on the GPU and committed so.
    std::atomic<std::uint64_t> bytes{0};    ///< Entry bytes copied from the device by a fill.
};

DeviceCommitCounters& DirectCounters() {
    static DeviceCommitCounters* c = new DeviceCommitCounters;  // never destroyed
    return *c;
}

}  // namespace

void RegisterGpuCommit(pyb::module_& m) {
    m.def(
        "_device_commit_counters",
        [] {
            pyb::dict d;
            d["batches"] = DirectCounters().batches.load();
            d["objects"] = DirectCounters().objects.load();
            d["bytes"] = DirectCounters().bytes.load();
            return d;
        },
        "What put_sparse_objects committed in this process by indexing on the GPU and copying "
        "entries straight into the embedded store (monotonic): batches, objects, bytes.");
}

#if MCS_PY_WITH_GPU_CODEC
namespace {

std::uint64_t AlignUp(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

/// The device members of the objects of a commit (null for objects built on the host), and
/// where pageable targets are staged.
struct DeviceEntries {
    std::vector<const DeviceMember*> indices;
    std::vector<const DeviceMember*> values;
    std::uintptr_t stream = 0;
    /// Pinned staging for targets in pageable memory, held across the commit (taken before it,
    /// as the staging path takes it, so that two commits never wait on each other), or null:
    /// pageable targets are then copied to directly (the driver stages them).
    std::byte* staging = nullptr;
    std::uint64_t staging_bytes = 0;
};

/// The commit's fill: every target's entries from the device, straight into page-locked store
/// memory; into pageable store memory through the pinned staging (at the copy engine's rate,
/// then host copies on several threads) when there is one.
Status FillFromDevice(std::span<const EntryTarget> targets, const DeviceEntries& from) {
    struct Copy {
        const DeviceMember* member;
        std::span<std::byte> dst;
    };
    std::vector<cuda::HostDeviceCopy> direct;
    std::vector<Copy> staged;
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
        if (t.pinned || from.staging == nullptr) {
            direct.push_back({{idx->address, idx->device}, t.indices});
            direct.push_back({{val->address, val->device}, t.values});
        } else {
            staged.push_back({idx, t.indices});
            staged.push_back({val, t.values});
        }
    }
    for (const EntryTarget& t : targets) {
        DirectCounters().bytes.fetch_add(t.indices.size() + t.values.size(),
                                         std::memory_order_relaxed);
    }
    if (!direct.empty()) MCS_RETURN_IF_ERROR(cuda::CopyBatchToHost(direct, from.stream));
    if (staged.empty()) return Status::Ok();
    // Members back to back on the device stay back to back in the staging, so their copies
    // merge (a batch encode leaves them so).
    std::sort(staged.begin(), staged.end(), [](const Copy& x, const Copy& y) {
        return x.member->address < y.member->address;
    });
    std::vector<cuda::HostDeviceCopy> up;
    std::vector<HostCopy> out;
    up.reserve(staged.size());
    out.reserve(staged.size());
    std::uint64_t total = 0;
    for (std::size_t k = 0; k < staged.size(); ++k) {
        const DeviceMember* m = staged[k].member;
        const DeviceMember* prev = k == 0 ? nullptr : staged[k - 1].member;
        const bool adjacent = prev != nullptr && prev->address + prev->bytes == m->address;
        const std::uint64_t at = adjacent ? total : AlignUp(total, 64);
        total = at + m->bytes;
        if (total > from.staging_bytes) return Internal("the commit's staging is too small");
        up.push_back({{m->address, m->device},
                      {from.staging + at, static_cast<std::size_t>(m->bytes)}});
        out.push_back({staged[k].dst.data(), from.staging + at, m->bytes});
    }
    MCS_RETURN_IF_ERROR(cuda::CopyBatchToHost(up, from.stream));
    ParallelCopies(out, DefaultCopyThreads());
    return Status::Ok();
}

/// The staging room CommitDeviceBatch's fill may need: every device object's entries, each
/// start 64-byte aligned.
std::uint64_t StagingBytes(const DeviceEntries& e) {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < e.indices.size(); ++i) {
        if (e.indices[i] == nullptr) continue;
        total = AlignUp(total, 64) + e.indices[i]->bytes;
        total = AlignUp(total, 64) + e.values[i]->bytes;
    }
    return total;
}

}  // namespace

std::optional<std::vector<Result<CommitResult>>> CommitDeviceBatch(
    SparseService& service, std::span<ParsedPut* const> puts, int num_threads,
    std::uintptr_t stream) {
    const std::size_t n = puts.size();
    if (n == 0 || !service.object_store().FillsInPlace()) return std::nullopt;
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
    std::vector<std::optional<SourceDescriptor>> plans(n);
    std::vector<cuda::IndexItem> items;
    std::vector<std::size_t> item_of;
    for (std::size_t k = 0; k < n; ++k) {
        const DeviceMember& di = *puts[k]->device_indices;
        const DeviceMember& dv = *puts[k]->device_values;
        const CooLayout layout{di.dtype, di.shape, di.bytes, dv.dtype, dv.shape, dv.bytes};
        plans[k] = PlanIndexedSource(puts[k]->request, layout);
        if (!plans[k]) continue;
        const SourceDescriptor& d = *plans[k];
        cuda::IndexItem it;
        it.indices = {di.address, di.device};
        it.values = {dv.address, dv.device};
        it.index_dtype = d.index_dtype;
        it.value_dtype = d.value_dtype;
        it.nnz = d.nnz;
        it.global_shape = d.global_shape;
        it.box_origin.assign(d.box.origin().begin(), d.box.origin().end());
        it.box_shape.assign(d.box.shape().begin(), d.box.shape().end());
        it.tile_shape = d.tile_shape;
        items.push_back(std::move(it));
        item_of.push_back(k);
    }
    if (items.empty()) return std::nullopt;
    Result<std::vector<cuda::IndexResult>> indexed = Internal("unset");
    {
        pyb::gil_scoped_release nogil;
        indexed = cuda::IndexCanonicalBatch(items, stream);
    }
    if (!indexed.ok()) return std::nullopt;  // the staging path reports what is wrong, if anything
    std::vector<std::optional<SparseObject>> objects(n);
    std::vector<bool> on_device(n, false);
    for (std::size_t t = 0; t < items.size(); ++t) {
        cuda::IndexResult& r = (*indexed)[t];
        if (!r.canonical) continue;
        const std::size_t k = item_of[t];
        objects[k] = FinishCanonicalEntries(std::move(*plans[k]), std::move(r.tile_coords),
                                            std::move(r.tile_ptr), r.checksum_indices,
                                            r.checksum_values);
        on_device[k] = objects[k].has_value();
    }
    if (std::find(on_device.begin(), on_device.end(), true) == on_device.end()) {
        return std::nullopt;
    }
    // The others through the host's encode, on staged copies of their members.
    std::vector<Status> errors(n);
    std::vector<ParsedPut*> rest;
    for (std::size_t k = 0; k < n; ++k) {
        if (!on_device[k]) rest.push_back(puts[k]);
    }
    if (!rest.empty()) {
        std::shared_ptr<void> staged = StageDeviceMembers(rest, stream);
        pyb::gil_scoped_release nogil;
        internal::ParallelFor(num_threads, n, [&](std::size_t k) {
            if (on_device[k]) return;
            Result<SparseObject> built = BuildSourceObject(puts[k]->request);
            if (built.ok()) {
                objects[k] = std::move(built).value();
            } else {
                errors[k] = built.status();
            }
        });
        staged.reset();  // the objects own their entries now
    }
    // One commit of every object; the device objects' entries land in the store from the GPU.
    std::vector<SparseObject> batch;
    std::vector<bool> hard_pin;
    std::vector<std::size_t> batch_of;
    DeviceEntries entries;
    entries.stream = stream;
    for (std::size_t k = 0; k < n; ++k) {
        if (!objects[k]) continue;
        batch_of.push_back(k);
        hard_pin.push_back(puts[k]->request.hard_pin);
        batch.push_back(std::move(*objects[k]));
        entries.indices.push_back(on_device[k] ? &*puts[k]->device_indices : nullptr);
        entries.values.push_back(on_device[k] ? &*puts[k]->device_values : nullptr);
    }
    Result<std::vector<Result<CommitResult>>> committed = Internal("unset");
    {
        pyb::gil_scoped_release nogil;
        // A store without page-locked memory for its objects takes the entries through pinned
        // staging, leased before the commit as the staging path leases it.
        std::optional<cuda::PinnedStaging::Lease> lease;
        const auto* store = dynamic_cast<const SparseStore*>(&service);
        if (store != nullptr && store->options().pinned_quota_bytes == 0) {
            const std::uint64_t bytes = StagingBytes(entries);
            Result<cuda::PinnedStaging::Lease> l = cuda::PinnedStaging::Acquire(bytes);
            if (l.ok()) {
                lease.emplace(std::move(l).value());
                entries.staging = lease->bytes().data();
                entries.staging_bytes = bytes;
            }
        }
        const EntryFill fill = [&entries](std::span<const EntryTarget> targets) {
            return FillFromDevice(targets, entries);
        };
        committed = service.PutIndexedObjects(std::move(batch), hard_pin, fill, num_threads);
    }
    if (!committed.ok()) return std::nullopt;  // nothing was committed
    DirectCounters().batches.fetch_add(1, std::memory_order_relaxed);
    DirectCounters().objects.fetch_add(
        std::uint64_t(std::count(on_device.begin(), on_device.end(), true)),
        std::memory_order_relaxed);
    std::vector<Result<CommitResult>> results(n, Internal("unset"));
    for (std::size_t b = 0; b < batch_of.size(); ++b) {
        results[batch_of[b]] = std::move((*committed)[b]);
    }
    for (std::size_t k = 0; k < n; ++k) {
        if (!errors[k].ok()) results[k] = errors[k];
        if (!results[k].ok()) {
            // As PutSparseObjects names a failed update.
            results[k] = results[k].status().WithContext("update " + std::to_string(k) + " ('" +
                                                         puts[k]->request.tensor_id + "')");
        }
    }
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
