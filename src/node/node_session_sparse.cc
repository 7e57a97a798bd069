// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's handlers of the sparse object conversation and of the steps of a run
// (src/node/wire_sparse.h): commits, admission, manifests, reads published into segments,
// seals, waits, retention, anchors.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "codec/codec.h"
#include "node/node_session.h"
#include "transport/parallel_for.h"
#include "node/log.h"
#include "node/wire.h"
#include "transport/cuda_runtime.h"
#include "transport/host_copy.h"

namespace mooncake::sparse {

using node_internal::AsBytes;
using node_internal::kMaxReadThreads;
using node_internal::Product;

using node_internal::NanosSince;

namespace {

/// The byte sizes a commit's members must have by its descriptor (rank taken from it).
struct MemberSizes {
    std::uint64_t indices, values, tile_coords, tile_ptr;
};

/// MemberSizes of `req`, when they fit in 64 bits and the request's members have them.
std::optional<MemberSizes> SizesOf(const wire::SparseCommitRequest& req) {
    const SourceDescriptor& d = req.desc;
    const std::uint64_t rank = d.rank();
    const auto index_bytes = Product(d.nnz, rank, DTypeSize(d.index_dtype));
    const auto value_bytes = Product(d.nnz, DTypeSize(d.value_dtype));
    const auto coord_bytes = Product(d.num_tiles, rank, sizeof(TileCoord));
    const auto ptr_bytes = Product(d.num_tiles + 1, sizeof(std::uint64_t));
    if (!index_bytes || !value_bytes || !coord_bytes || !ptr_bytes ||
        req.indices.src.size != *index_bytes || req.values.src.size != *value_bytes ||
        req.tile_coords.src.size != *coord_bytes || req.tile_ptr.src.size != *ptr_bytes) {
        return std::nullopt;
    }
    return MemberSizes{*index_bytes, *value_bytes, *coord_bytes, *ptr_bytes};
}

/// One commit's outcome as the batch reply carries it.
wire::SparseCommitOutcome OutcomeOf(const Result<CommitResult>& c) {
    wire::SparseCommitOutcome out;
    if (!c.ok()) {
        out.code = static_cast<std::int32_t>(c.status().code());
        out.message = c.status().message();
    } else {
        out.result = {c->source_ref, c->created, c->nnz, c->bytes};
    }
    return out;
}

}  // namespace

Result<SparseObject> NodeServer::Session::CheckedCommitObject(
    const wire::SparseCommitRequest& req) {
    const SourceDescriptor& d = req.desc;
    if (req.coordinate_space != "global") {
        return InvalidArgument("only global-coordinate objects are committed as sources, got '" +
                               req.coordinate_space + "'");
    }
    const std::uint64_t rank = d.rank();
    if (!SizesOf(req)) {
        return InvalidArgument("member sizes do not match the descriptor of " + d.tensor_id +
                               " (nnz " + std::to_string(d.nnz) + ", " +
                               std::to_string(d.num_tiles) + " tiles, rank " +
                               std::to_string(rank) + ")");
    }
    MCS_ASSIGN_OR_RETURN(auto indices, ClientBytes(req.indices.src, "indices"));
    MCS_ASSIGN_OR_RETURN(auto values, ClientBytes(req.values.src, "values"));
    MCS_ASSIGN_OR_RETURN(auto coords_bytes, ClientBytes(req.tile_coords.src, "tile_coords"));
    MCS_ASSIGN_OR_RETURN(auto ptr_bytes_span, ClientBytes(req.tile_ptr.src, "tile_ptr"));

    // Private copies first: the client may keep writing its buffer while we validate.
    std::vector<TileCoord> coords(d.num_tiles * rank);
    std::vector<std::uint64_t> ptr(d.num_tiles + 1);
    if (!coords.empty()) std::memcpy(coords.data(), coords_bytes.data(), coords_bytes.size());
    std::memcpy(ptr.data(), ptr_bytes_span.data(), ptr_bytes_span.size());
    if (Status s = ValidateTileIndex({rank, coords, ptr}, d); !s.ok()) {
        return s.WithContext("tile index of " + d.tensor_id);
    }
    // Rebuild from private copies of the entries (the client may still be writing them):
    // BuildSparseObject validates dtypes, coordinates (inside the source box), order and
    // duplicates; entries in canonical order take one pass and become the object's members.
    SourceDescriptor desc = d;
    EncodeOptions encode;
    encode.tile_shape = d.tile_shape;
    encode.num_threads = 1;
    OwnedCoo coo;
    coo.index_dtype = d.index_dtype;
    coo.value_dtype = d.value_dtype;
    coo.nnz = d.nnz;
    coo.indices.assign(indices.begin(), indices.end());
    coo.values.assign(values.begin(), values.end());
    auto built = BuildSparseObject(std::move(desc), std::move(coo), encode);
    if (!built.ok()) return built.status().WithContext("validating " + d.tensor_id);
    SparseObject& object = *built;
    if (object.desc.index_dtype != d.index_dtype || object.desc.num_tiles != d.num_tiles ||
        object.tile_coords != coords || object.tile_ptr != ptr) {
        return InvalidArgument("the object sent for " + d.tensor_id +
                               " is not in canonical form (entries sorted by tile, narrowest "
                               "index dtype, matching tile index)");
    }
    if (object.checksum_indices != req.indices.checksum ||
        object.checksum_values != req.values.checksum ||
        object.checksum_tile_coords != req.tile_coords.checksum ||
        object.checksum_tile_ptr != req.tile_ptr.checksum) {
        return DataLoss("checksums of " + d.tensor_id +
                        " do not match the bytes in the client buffer");
    }
    return std::move(object);
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseCommit(
    const wire::SparseCommitRequest& req) {
    MCS_ASSIGN_OR_RETURN(SparseObject object, CheckedCommitObject(req));
    MCS_ASSIGN_OR_RETURN(CommitResult c,
                         sparse_->CommitSparseObject(std::move(object), req.hard_pin));
    return Reply{wire::SparseCommitReply{c.source_ref, c.created, c.nnz, c.bytes}, {}};
}

std::optional<wire::SparseCommitBatchReply> NodeServer::Session::CommitBatchInPlace(
    const wire::SparseCommitBatchRequest& req) {
    const std::size_t n = req.items.size();
    if (n == 0) return std::nullopt;
    // What the client says each object is: its descriptor, its tile index (private copies,
    // validated) and its checksums, planned as the host's sorted fast path plans canonical
    // entries. Anything else (rank other than 2, sizes that do not fit, a tile index that does
    // not validate, one tensor with two generations) takes the checked path below.
    struct Item {
        std::span<const std::byte> indices, values;  ///< The client's bytes.
        std::vector<TileCoord> coords;               ///< What the entries must index to.
        std::vector<std::uint64_t> ptr;
    };
    std::vector<Item> items(n);
    std::vector<SparseObject> batch;
    std::vector<bool> hard_pin;
    batch.reserve(n);
    hard_pin.reserve(n);
    std::map<std::string_view, Generation, std::less<>> generation_of;
    EncodeOptions encode;
    encode.num_threads = 1;
    for (std::size_t i = 0; i < n; ++i) {
        const wire::SparseCommitRequest& r = req.items[i];
        const SourceDescriptor& d = r.desc;
        auto [it, fresh] = generation_of.try_emplace(d.tensor_id, d.generation);
        if (!fresh && it->second != d.generation) return std::nullopt;
        if (r.coordinate_space != "global" || d.rank() != 2) return std::nullopt;
        const std::optional<MemberSizes> sizes = SizesOf(r);
        if (!sizes) return std::nullopt;
        Result<std::span<std::byte>> members[4] = {
            ClientBytes(r.indices.src, "indices"), ClientBytes(r.values.src, "values"),
            ClientBytes(r.tile_coords.src, "tile_coords"), ClientBytes(r.tile_ptr.src, "tile_ptr")};
        for (const auto& m : members) {
            if (!m.ok()) return std::nullopt;
        }
        Item& item = items[i];
        item.indices = *members[0];
        item.values = *members[1];
        item.coords.resize(d.num_tiles * 2);
        item.ptr.resize(d.num_tiles + 1);
        if (!item.coords.empty()) {
            std::memcpy(item.coords.data(), members[2]->data(), sizes->tile_coords);
        }
        std::memcpy(item.ptr.data(), members[3]->data(), sizes->tile_ptr);
        if (!ValidateTileIndex({2, item.coords, item.ptr}, d).ok()) return std::nullopt;
        encode.tile_shape = d.tile_shape;
        const CooLayout layout{d.index_dtype, {Index(d.nnz), 2}, sizes->indices,
                               d.value_dtype, {Index(d.nnz)},    sizes->values};
        std::optional<SourceDescriptor> plan = PlanCanonicalEntries(d, layout, encode);
        if (!plan) return std::nullopt;
        std::optional<SparseObject> object = FinishCanonicalEntries(
            std::move(*plan), item.coords, item.ptr, r.indices.checksum, r.values.checksum);
        if (!object || object->desc.index_dtype != d.index_dtype ||
            object->desc.num_tiles != d.num_tiles ||
            object->checksum_tile_coords != r.tile_coords.checksum ||
            object->checksum_tile_ptr != r.tile_ptr.checksum) {
            return std::nullopt;
        }
        batch.push_back(std::move(*object));
        hard_pin.push_back(r.hard_pin);
    }
    // The entries go from the client's buffer straight into the store's memory, where the
    // client cannot write; there they are checked, indexed and summed, and must be exactly the
    // object the client described. Any difference abandons the whole commit (nothing of it
    // stays), and the checked path then says which item is wrong and why.
    const EntryFill fill = [&](std::span<const EntryTarget> targets) -> Status {
        std::atomic<bool> same{true};
        internal::ParallelFor(0, targets.size(), [&](std::size_t x) {
            const EntryTarget& t = targets[x];
            const Item& item = items[t.object];
            const SourceDescriptor& d = req.items[t.object].desc;
            if (t.indices.size() != item.indices.size() || t.values.size() != item.values.size()) {
                same.store(false, std::memory_order_relaxed);
                return;
            }
            if (!t.indices.empty()) std::memcpy(t.indices.data(), item.indices.data(), t.indices.size());
            if (!t.values.empty()) std::memcpy(t.values.data(), item.values.data(), t.values.size());
            EncodeOptions options;
            options.num_threads = 1;
            options.tile_shape = d.tile_shape;
            const HostArray indices{d.index_dtype, {Index(d.nnz), 2}, t.indices};
            const HostArray values{d.value_dtype, {Index(d.nnz)}, t.values};
            std::optional<SparseObject> landed = IndexCanonicalEntries(d, indices, values, options);
            const wire::SparseCommitRequest& r = req.items[t.object];
            if (!landed || landed->tile_coords != item.coords || landed->tile_ptr != item.ptr ||
                landed->checksum_indices != r.indices.checksum ||
                landed->checksum_values != r.values.checksum) {
                same.store(false, std::memory_order_relaxed);
            }
        });
        if (!same.load()) return DataLoss("the entries differ from the object the client sent");
        return Status::Ok();
    };
    Result<std::vector<Result<CommitResult>>> committed =
        sparse_->PutIndexedObjects(std::move(batch), hard_pin, fill, 0);
    if (!committed.ok()) return std::nullopt;  // nothing of it stays: the checked path decides
    wire::SparseCommitBatchReply reply;
    reply.items.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        reply.items[i] = i < committed->size()
                             ? OutcomeOf((*committed)[i])
                             : OutcomeOf(Internal("the store answered for fewer objects"));
    }
    server_.commit_in_place_items_.fetch_add(n, std::memory_order_relaxed);
    return reply;
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseCommitBatch(
    const wire::SparseCommitBatchRequest& req) {
    // The common case, a batch of canonical objects, without a private copy of its entries.
    if (std::optional<wire::SparseCommitBatchReply> reply = CommitBatchInPlace(req)) {
        return Reply{std::move(*reply), {}};
    }
    // Each item checked as a single commit is (a bad one fails alone), then the batch commits
    // under one lock of the store.
    const std::size_t n = req.items.size();
    std::vector<Result<SparseObject>> checked(n, Internal("unset"));
    internal::ParallelFor(0, n, [&](std::size_t i) { checked[i] = CheckedCommitObject(req.items[i]); });
    std::vector<SparseObject> objects;
    std::vector<bool> hard_pin;
    std::vector<std::size_t> of;
    objects.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        if (!checked[i].ok()) continue;
        objects.push_back(std::move(checked[i]).value());
        hard_pin.push_back(req.items[i].hard_pin);
        of.push_back(i);
    }
    std::vector<Result<CommitResult>> results =
        sparse_->CommitSparseObjects(std::move(objects), hard_pin);
    wire::SparseCommitBatchReply reply;
    reply.items.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        if (!checked[i].ok()) reply.items[i] = OutcomeOf(checked[i].status());
    }
    for (std::size_t k = 0; k < results.size(); ++k) reply.items[of[k]] = OutcomeOf(results[k]);
    return Reply{std::move(reply), {}};
}

namespace {

/// A device member's bytes from its dtype and shape, checked against the size the client gave.
Result<std::uint64_t> DeviceMemberBytes(const wire::DeviceMember& m, std::string_view what) {
    std::uint64_t bytes = DTypeSize(m.dtype);
    for (const Index e : m.shape) {
        if (e < 0 || __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(e), &bytes)) {
            return InvalidArgument(std::string(what) + ": an extent of " + std::to_string(e) +
                                   " is negative or too large");
        }
    }
    if (bytes != m.size) {
        return InvalidArgument(std::string(what) + " of " + std::to_string(bytes) +
                               " bytes (dtype and shape) is sent as " + std::to_string(m.size) +
                               " bytes");
    }
    return bytes;
}

/// The executor's request of a device update, its fields moved out of it (the members stay).
PutSparseRequest RequestOf(wire::DeviceUpdate& u) {
    PutSparseRequest r;
    r.tensor_id = std::move(u.tensor_id);
    r.global_shape = std::move(u.global_shape);
    r.global_offset = std::move(u.global_offset);
    r.local_shape = std::move(u.local_shape);
    r.source_placement = std::move(u.source_placement);
    r.placement_policy = std::move(u.policy);
    r.generation = u.generation;
    r.apply = u.apply;
    r.encode.tile_shape = std::move(u.tile_shape);
    r.encode.duplicates = u.duplicates;
    r.encode.num_threads = 1;  // The batch runs its updates side by side.
    r.hard_pin = u.hard_pin;
    return r;
}

}  // namespace

Result<NodeServer::Session::Reply> NodeServer::Session::SparseCommitDevice(
    wire::SparseCommitDeviceRequest&& req) {
    const auto start = std::chrono::steady_clock::now();
    // 1. The client's memory that holds every member, mapped once (CUDA IPC, cached per
    //    allocation); an update whose members do not fit their dtypes and shapes fails alone,
    //    as every update does when the memory cannot be mapped.
    const std::size_t n = req.items.size();
    std::vector<Status> failed(n);
    std::vector<PutSparseRequest> requests(n);
    std::vector<std::array<DevicePiece, 2>> mapped(n);
    // Sizes first: a malformed update is refused without touching the GPU.
    bool any = false;
    for (std::size_t i = 0; i < n; ++i) {
        wire::DeviceUpdate& u = req.items[i];
        requests[i] = RequestOf(u);
        Status s = DeviceMemberBytes(u.indices, "indices").status();
        if (s.ok()) s = DeviceMemberBytes(u.values, "values").status();
        any = any || s.ok();
        failed[i] = std::move(s);
    }
    std::shared_ptr<const CudaIpcMapping> holder;
    if (any) {
        auto m = MapCuda(req.memory);
        for (std::size_t i = 0; i < n; ++i) {
            if (!failed[i].ok()) continue;
            if (!m.ok()) {
                failed[i] = m.status().WithContext("the members");
                continue;
            }
            const wire::DeviceMember* members[2] = {&req.items[i].indices, &req.items[i].values};
            for (int k = 0; k < 2; ++k) {
                // The request's Validate kept offset + size inside the memory.
                mapped[i][k] = {{m->first.address + members[k]->offset, members[k]->size,
                                 m->first.device},
                                m->second.get(),
                                2 * i + k};
            }
        }
        if (m.ok()) holder = std::move(m->second);
    }

    // 2. Updates the GPU takes: checked and indexed there, copied once into the store.
    std::vector<std::optional<Result<CommitResult>>> outcome(n);
    if (server_.options_.device_index) {
        CommitCheckedOnDevice(req, requests, mapped, failed, outcome);
    }

    const auto staging = std::chrono::steady_clock::now();
    // 3. The others: device-to-host copies into staging memory. Members of one mapping that
    //    lie close together (the client's arena holds a batch densely) move as one copy of
    //    their span, so a batch of thousands of updates takes a few copies, not two per update.
    std::vector<DevicePiece> pieces;
    for (std::size_t i = 0; i < n; ++i) {
        if (!failed[i].ok() || outcome[i]) continue;
        pieces.push_back(mapped[i][0]);
        pieces.push_back(mapped[i][1]);
    }
    constexpr std::uint64_t kMaxGap = 4096;
    std::sort(pieces.begin(), pieces.end(), [](const DevicePiece& a, const DevicePiece& b) {
        return a.mapping != b.mapping ? a.mapping < b.mapping : a.src.address < b.src.address;
    });
    struct Run {
        DeviceMemory src;  ///< The span copied.
        std::uint64_t at;  ///< Its place in the landing buffer.
    };
    std::vector<Run> runs;
    std::vector<std::uint64_t> landing_at(2 * n);
    std::uint64_t total = 0;
    for (std::size_t k = 0; k < pieces.size();) {
        const DevicePiece& first = pieces[k];
        std::uintptr_t end = first.src.address + first.src.bytes;
        std::size_t last = k + 1;
        while (last < pieces.size() && pieces[last].mapping == first.mapping &&
               pieces[last].src.address <= end + kMaxGap) {
            end = std::max<std::uintptr_t>(end, pieces[last].src.address + pieces[last].src.bytes);
            ++last;
        }
        total = (total + 63) / 64 * 64;
        runs.push_back({{first.src.address, end - first.src.address, first.src.device}, total});
        for (std::size_t x = k; x < last; ++x) {
            landing_at[pieces[x].slot] = total + (pieces[x].src.address - first.src.address);
        }
        total += end - first.src.address;
        k = last;
    }
    HostBuffer landing;
    if (total > 0) {
        MCS_ASSIGN_OR_RETURN(landing, server_.commit_staging_->Allocate(total));
        std::vector<int> devices;
        for (const Run& r : runs) {
            MCS_RETURN_IF_ERROR(cuda::MemcpyAsync(landing.data() + r.at,
                                                  reinterpret_cast<const void*>(r.src.address),
                                                  r.src.bytes, cuda::CopyKind::kDeviceToHost,
                                                  kCudaPerThreadStream, r.src.device));
            if (std::find(devices.begin(), devices.end(), r.src.device) == devices.end()) {
                devices.push_back(r.src.device);
            }
        }
        for (int device : devices) {
            MCS_RETURN_IF_ERROR(cuda::StreamSynchronize(kCudaPerThreadStream, device));
        }
    }
    holder.reset();
    server_.device_commit_copies_.fetch_add(runs.size(), std::memory_order_relaxed);
    server_.device_commit_copy_nanos_.fetch_add(NanosSince(staging), std::memory_order_relaxed);

    // 4. Those updates as an in-process batch commit takes them (validated, encoded, committed
    //    together; each fails alone).
    std::vector<PutSparseRequest> valid;
    std::vector<std::size_t> of;
    valid.reserve(n);
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < n; ++i) {
        wire::DeviceUpdate& u = req.items[i];
        if (failed[i].ok() && outcome[i]) bytes += u.indices.size + u.values.size;
        if (!failed[i].ok() || outcome[i]) continue;
        PutSparseRequest& r = requests[i];
        r.indices = {u.indices.dtype, std::move(u.indices.shape),
                     {landing.data() + landing_at[2 * i], static_cast<std::size_t>(u.indices.size)}};
        r.values = {u.values.dtype, std::move(u.values.shape),
                    {landing.data() + landing_at[2 * i + 1], static_cast<std::size_t>(u.values.size)}};
        bytes += u.indices.size + u.values.size;
        valid.push_back(std::move(r));
        of.push_back(i);
    }
    std::vector<Result<CommitResult>> results;
    if (!valid.empty()) results = sparse_->PutSparseObjects(valid, 0);
    for (std::size_t k = 0; k < results.size(); ++k) {
        // PutSparseObjects names a failed update by its place among `valid`; the client names
        // it by its place in the caller's batch.
        if (!results[k].ok()) {
            const std::string named =
                "update " + std::to_string(k) + " ('" + valid[k].tensor_id + "'): ";
            const std::string& message = results[k].status().message();
            if (message.starts_with(named)) {
                results[k] = Status(results[k].status().code(), message.substr(named.size()));
            }
        }
        outcome[of[k]] = std::move(results[k]);
    }
    server_.device_commit_items_.fetch_add(n - std::count_if(failed.begin(), failed.end(),
                                                             [](const Status& s) { return !s.ok(); }),
                                           std::memory_order_relaxed);
    server_.device_commit_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    wire::SparseCommitBatchReply reply;
    reply.items.resize(n);
    const auto fail = [](wire::SparseCommitOutcome& out, const Status& s) {
        out.code = static_cast<std::int32_t>(s.code());
        out.message = s.message();
    };
    for (std::size_t i = 0; i < n; ++i) {
        wire::SparseCommitOutcome& out = reply.items[i];
        if (!failed[i].ok()) {
            fail(out, failed[i]);
        } else if (!outcome[i] || !outcome[i]->ok()) {
            fail(out, outcome[i] ? outcome[i]->status() : Internal("update not committed"));
        } else {
            const CommitResult& c = **outcome[i];
            out.result = {c.source_ref, c.created, c.nnz, c.bytes};
        }
    }
    server_.device_commit_nanos_.fetch_add(NanosSince(start), std::memory_order_relaxed);
    return Reply{std::move(reply), {}};
}

/// Entry bytes from which an update of a device commit is checked on the GPU.
constexpr std::uint64_t kGpuCheckMinBytes = std::uint64_t{64} << 10;

void NodeServer::Session::CommitCheckedOnDevice(
    const wire::SparseCommitDeviceRequest& req, const std::vector<PutSparseRequest>& requests,
    const std::vector<std::array<DevicePiece, 2>>& mapped, const std::vector<Status>& failed,
    std::vector<std::optional<Result<CommitResult>>>& outcome) {
    const std::size_t n = req.items.size();
    // What the GPU may take: what the host's sorted fast path would, as far as the plan tells
    // without the entries; all on one device, no tensor with two generations (its second step
    // commits after the first one's head moved: the host path orders them).
    std::vector<std::optional<SourceDescriptor>> plans(n);
    std::vector<DeviceIndexItem> items;
    std::vector<std::size_t> item_of;
    std::map<std::string_view, Generation, std::less<>> generation_of;
    int device = -1;
    for (std::size_t i = 0; i < n; ++i) {
        if (!failed[i].ok()) continue;
        const wire::DeviceUpdate& u = req.items[i];
        auto [it, fresh] = generation_of.try_emplace(requests[i].tensor_id, u.generation);
        if (!fresh && it->second != u.generation) return;
        const DeviceMemory& di = mapped[i][0].src;
        const DeviceMemory& dv = mapped[i][1].src;
        if (device < 0) device = di.device;
        if (di.device != device || dv.device != device) return;
        // A small update costs the host little to check, and its fixed costs on the GPU path
        // (a tile index of its own to send back, an object built from it) more than its bytes.
        if (di.bytes + dv.bytes < kGpuCheckMinBytes) continue;
        const CooLayout layout{u.indices.dtype, u.indices.shape, di.bytes,
                               u.values.dtype,  u.values.shape,  dv.bytes};
        plans[i] = PlanIndexedSource(requests[i], layout);
        if (!plans[i]) continue;
        items.push_back({di.address, dv.address, device, &*plans[i]});
        item_of.push_back(i);
    }
    if (items.empty()) return;
    const auto start = std::chrono::steady_clock::now();
    // 1. The members into the daemon's own device memory, where the GPU checks them and from
    //    where they are copied into the store: the bytes that land are the bytes checked,
    //    whatever the client does with its memory meanwhile. Members that lie close together in
    //    one mapping (the client's arena holds a batch densely) move as one copy of their span.
    //    `own[t]`: item t's members there.
    std::vector<std::array<DeviceMemory, 2>> own(items.size());
    std::unique_lock<std::mutex> scratch_hold;
    {
        struct Member {
            const DevicePiece* piece;
            std::size_t item;
            int k;
        };
        std::vector<Member> members;
        members.reserve(2 * items.size());
        for (std::size_t t = 0; t < items.size(); ++t) {
            for (int k = 0; k < 2; ++k) {
                const DevicePiece& p = mapped[item_of[t]][k];
                if (p.src.bytes > 0) members.push_back({&p, t, k});
                own[t][k] = {0, 0, device};
            }
        }
        std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
            return a.piece->mapping != b.piece->mapping ? a.piece->mapping < b.piece->mapping
                                                        : a.piece->src.address < b.piece->src.address;
        });
        constexpr std::uint64_t kMaxGap = 4096;
        struct Span {
            std::uintptr_t begin, end;
            std::uint64_t at;  ///< Into the scratch.
        };
        std::vector<Span> spans;
        std::vector<std::size_t> span_of(members.size());
        std::uint64_t total = 0;
        for (std::size_t x = 0; x < members.size(); ++x) {
            const DeviceMemory& src = members[x].piece->src;
            const std::uintptr_t end = src.address + src.bytes;
            if (x > 0 && members[x].piece->mapping == members[x - 1].piece->mapping &&
                src.address <= spans.back().end + kMaxGap) {
                Span& last = spans.back();
                if (end > last.end) {
                    total += end - last.end;
                    last.end = end;
                }
            } else {
                // The span keeps its address modulo 256 (the kernels' vector loads see the
                // members aligned as the client laid them out).
                total = (total + 255) / 256 * 256 + src.address % 256;
                spans.push_back({src.address, end, total});
                total += src.bytes;
            }
            span_of[x] = spans.size() - 1;
        }
        Result<std::uintptr_t> scratch =
            server_.DeviceScratchOf(device, std::max<std::uint64_t>(total, 1), scratch_hold);
        if (!scratch.ok()) {
            static std::atomic<bool> warned{false};
            if (!warned.exchange(true)) {
                MCS_LOG(kWarning) << "device commit: no device memory for the daemon's copy ("
                                  << scratch.status().ToString() << "); checking on the host";
            }
            return;
        }
        for (const Span& sp : spans) {
            const Status copied = cuda::MemcpyAsync(
                reinterpret_cast<void*>(*scratch + sp.at), reinterpret_cast<const void*>(sp.begin),
                sp.end - sp.begin, cuda::CopyKind::kDeviceToDevice, kCudaPerThreadStream, device);
            if (!copied.ok()) {
                // What was queued reads the client's memory, not the store's: nothing to undo.
                (void)cuda::StreamSynchronize(kCudaPerThreadStream, device);
                MCS_LOG(kWarning) << "device commit: the copy into the daemon's memory failed ("
                                  << copied.ToString() << "); checking on the host";
                return;
            }
        }
        for (std::size_t x = 0; x < members.size(); ++x) {
            const Member& m = members[x];
            const Span& sp = spans[span_of[x]];
            own[m.item][m.k] = {*scratch + sp.at + (m.piece->src.address - sp.begin),
                                m.piece->src.bytes, device};
        }
        for (std::size_t t = 0; t < items.size(); ++t) {
            items[t].indices = own[t][0].address;
            items[t].values = own[t][1].address;
        }
        server_.device_commit_private_copies_.fetch_add(spans.size(), std::memory_order_relaxed);
    }
    // 2. The check, in groups of items pipelined with the copies into the store: the first group
    //    is checked alone, on this thread's stream (after the copies above); each next one on a
    //    worker thread, on its stream, while this thread copies the group before it into the
    //    store. The check takes the GPU's SMs, the copies its copy engine and PCIe, several times
    //    slower than the check: groups grow threefold (DeviceCommitGroups), so that only the
    //    first group's check is waited for.
    std::vector<std::uint64_t> item_bytes(items.size());
    for (std::size_t t = 0; t < items.size(); ++t) {
        item_bytes[t] = own[t][0].bytes + own[t][1].bytes;
    }
    const std::vector<std::size_t> bounds =
        DeviceCommitGroups(item_bytes, server_.options_.device_commit_group_bytes);
    const std::size_t groups = bounds.size() - 1;
    struct Checked {
        bool ok = false;  ///< The GPU check ran (its objects: the canonical items').
        std::vector<std::optional<SparseObject>> objects;  ///< Per item of the group.
    };
    const auto check = [&](std::size_t g) {
        const std::size_t lo = bounds[g], hi = bounds[g + 1];
        Checked c;
        Result<std::vector<DeviceIndexResult>> indexed = server_.options_.device_index(
            std::span<const DeviceIndexItem>(items).subspan(lo, hi - lo), kCudaPerThreadStream);
        if (!indexed.ok()) {
            MCS_LOG(kWarning) << "device commit: the GPU check failed ("
                              << indexed.status().ToString() << "); checking on the host";
            return c;
        }
        c.ok = true;
        c.objects.resize(hi - lo);
        // Each object from its tile index on its own (its tile checksums, its descriptor's
        // checks): in parallel, a layer's large tensors have thousands of tiles each.
        internal::ParallelFor(
            0, hi - lo,
            [&](std::size_t k) {
                DeviceIndexResult& r = (*indexed)[k];
                if (!r.canonical) return;
                c.objects[k] = FinishCanonicalEntries(
                    std::move(*plans[item_of[lo + k]]), std::move(r.tile_coords),
                    std::move(r.tile_ptr), r.checksum_indices, r.checksum_values);
            },
            /*chunk=*/0);
        return c;
    };
    std::vector<std::promise<Checked>> promised(groups);
    std::vector<std::future<Checked>> checked(groups);
    for (std::size_t g = 0; g < groups; ++g) checked[g] = promised[g].get_future();
    promised[0].set_value(check(0));
    // Joined before the scratch is let go (declared after its hold).
    std::jthread worker;
    if (groups > 1) {
        // The first check synchronized this thread's stream: the copies into the scratch, which
        // the worker's stream reads, are complete.
        worker = std::jthread([&] {
            for (std::size_t g = 1; g < groups; ++g) promised[g].set_value(check(g));
        });
    }
    server_.device_commit_check_groups_.fetch_add(groups, std::memory_order_relaxed);
    std::uint64_t check_nanos = NanosSince(start);
    for (std::size_t g = 0; g < groups; ++g) {
        const auto waited = std::chrono::steady_clock::now();
        Checked group = checked[g].get();
        if (g > 0) check_nanos += NanosSince(waited);
        if (!group.ok) continue;  // its items take the host's check
        CommitCheckedGroup(bounds[g], std::move(group.objects), requests, item_of, own, device,
                           outcome);
    }
    server_.device_commit_check_nanos_.fetch_add(check_nanos, std::memory_order_relaxed);
}

void NodeServer::Session::CommitCheckedGroup(
    std::size_t first, std::vector<std::optional<SparseObject>> objects,
    const std::vector<PutSparseRequest>& requests, const std::vector<std::size_t>& item_of,
    const std::vector<std::array<DeviceMemory, 2>>& own, int device,
    std::vector<std::optional<Result<CommitResult>>>& outcome) {
    // 3. The group's objects, from the GPU's tile indexes and sums.
    std::vector<SparseObject> batch;
    std::vector<bool> hard_pin;
    std::vector<std::size_t> batch_of, item_at;
    for (std::size_t k = 0; k < objects.size(); ++k) {
        std::optional<SparseObject>& object = objects[k];
        if (!object) continue;
        const std::size_t t = first + k;
        const std::size_t i = item_of[t];
        batch.push_back(std::move(*object));
        hard_pin.push_back(requests[i].hard_pin);
        batch_of.push_back(i);
        item_at.push_back(t);
    }
    if (batch.empty()) return;
    // 4. The entries from the daemon's copy into the store's memory.
    const EntryFill fill = [&](std::span<const EntryTarget> targets) -> Status {
        // Objects bound for pinned memory by device-to-host copies of their own members, in a
        // few batched driver calls (device_copy_to_host). The others (small ones, which the
        // store keeps out of its pinned pool, or any bound for pageable memory) through pinned
        // staging: the runs they form in the daemon's copy in a few copies, then host copies
        // to their places.
        constexpr std::uint64_t kDirectBytes = std::uint64_t{64} << 10;
        constexpr std::uint64_t kMaxGap = 4096;
        const auto copies = std::chrono::steady_clock::now();
        const auto source = [&](const EntryTarget& t, int k) -> const DeviceMemory& {
            return own[item_at[t.object]][k];
        };
        struct Staged {
            std::span<std::byte> dst;
            DeviceMemory src;
        };
        std::vector<Staged> staged;
        std::vector<DeviceToHostCopy> direct;
        std::uint64_t pageable = 0;
        for (const EntryTarget& t : targets) {
            if (!t.pinned) pageable += t.indices.size() + t.values.size();
            const std::span<std::byte> dst[2] = {t.indices, t.values};
            for (int k = 0; k < 2; ++k) {
                if (dst[k].size() != source(t, k).bytes) return Internal("filled entry size");
            }
            const bool to_pinned = t.pinned && t.indices.size() + t.values.size() >= kDirectBytes;
            for (int k = 0; k < 2; ++k) {
                if (dst[k].empty()) continue;
                if (to_pinned) {
                    direct.push_back({source(t, k).address, dst[k].data(), dst[k].size()});
                } else {
                    staged.push_back({dst[k], source(t, k)});
                }
            }
        }
        std::sort(staged.begin(), staged.end(), [](const Staged& a, const Staged& b) {
            return a.src.address < b.src.address;
        });
        struct Run {
            std::uintptr_t begin, end;
            std::uint64_t at;  ///< Into the landing buffer.
        };
        std::vector<Run> runs;
        std::uint64_t total = 0;
        for (const Staged& m : staged) {
            const std::uintptr_t end = m.src.address + m.src.bytes;
            if (!runs.empty() && m.src.address <= runs.back().end + kMaxGap) {
                Run& r = runs.back();
                if (end > r.end) {
                    total += end - r.end;
                    r.end = end;
                }
                continue;
            }
            total = (total + 63) / 64 * 64;
            runs.push_back({m.src.address, end, total});
            total += m.src.bytes;
        }
        HostBuffer landing;
        if (total > 0) {
            MCS_ASSIGN_OR_RETURN(landing, server_.commit_staging_->Allocate(total));
            for (const Run& r : runs) {
                direct.push_back({r.begin, landing.data() + r.at, r.end - r.begin});
            }
        }
        if (server_.options_.device_copy_to_host) {
            MCS_RETURN_IF_ERROR(
                server_.options_.device_copy_to_host(direct, device, kCudaPerThreadStream));
        } else {
            for (const DeviceToHostCopy& c : direct) {
                MCS_RETURN_IF_ERROR(cuda::MemcpyAsync(c.dst, reinterpret_cast<const void*>(c.src),
                                                      c.bytes, cuda::CopyKind::kDeviceToHost,
                                                      kCudaPerThreadStream, device));
            }
            MCS_RETURN_IF_ERROR(cuda::StreamSynchronize(kCudaPerThreadStream, device));
        }
        const std::uint64_t landed = NanosSince(copies);
        if (!staged.empty()) {
            std::vector<HostCopy> moves;
            moves.reserve(staged.size());
            std::size_t run = 0;
            for (const Staged& m : staged) {
                while (m.src.address >= runs[run].end) ++run;
                moves.push_back({m.dst.data(),
                                 landing.data() + runs[run].at + (m.src.address - runs[run].begin),
                                 m.src.bytes});
            }
            ParallelCopies(moves, DefaultCopyThreads());
        }
        server_.device_commit_copies_.fetch_add(direct.size(), std::memory_order_relaxed);
        server_.device_commit_fill_nanos_.fetch_add(NanosSince(copies), std::memory_order_relaxed);
        server_.device_commit_landed_nanos_.fetch_add(landed, std::memory_order_relaxed);
        server_.device_commit_pageable_bytes_.fetch_add(pageable, std::memory_order_relaxed);
        return Status::Ok();
    };
    Result<std::vector<Result<CommitResult>>> committed =
        sparse_->PutIndexedObjects(std::move(batch), hard_pin, fill, 0);
    for (std::size_t b = 0; b < batch_of.size(); ++b) {
        const std::size_t i = batch_of[b];
        if (!committed.ok()) {
            outcome[i] = committed.status();
            continue;
        }
        outcome[i] = std::move((*committed)[b]);  // the client names a failure
    }
    server_.device_commit_gpu_items_.fetch_add(batch_of.size(), std::memory_order_relaxed);
}

Result<const ObjectLease*> NodeServer::Session::HeldLease(std::uint64_t lease_id,
                                                         std::string_view what) const {
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) {
        return InvalidArgument(std::string(what) + ": lease " + std::to_string(lease_id) +
                               " is not held by this connection");
    }
    return &it->second;
}

Result<NodeServer::Session::Reply> NodeServer::Session::LeasesToDevice(
    const wire::LeasesToDeviceRequest& req) {
    // Every item checked before any byte moves: a lease of this connection, a member of its
    // object, a range inside the destination the client exported.
    std::vector<SegmentCopy> copies;
    copies.reserve(req.items.size());
    const std::uint64_t limit = req.destination.ref.size;
    for (std::size_t i = 0; i < req.items.size(); ++i) {
        const wire::LeaseMemberCopy& item = req.items[i];
        const std::string what = "item " + std::to_string(i);
        MCS_ASSIGN_OR_RETURN(const ObjectLease* held, HeldLease(item.lease_id, what));
        const ObjectLease& lease = *held;
        const std::vector<MemberInfo>& members = lease.info().members;
        std::size_t m = members.size();
        for (std::size_t k = 0; k < members.size(); ++k) {
            if (members[k].name == item.member) m = k;
        }
        if (m == members.size()) {
            return InvalidArgument(what + ": the leased object has no member '" +
                                   item.member.substr(0, 64) + "'");
        }
        const std::span<const std::byte> bytes = lease.Bytes(m);
        if (item.offset > limit || bytes.size() > limit - item.offset) {
            return InvalidArgument(what + ": " + std::to_string(bytes.size()) + " bytes at " +
                                   std::to_string(item.offset) +
                                   " run past the destination of " + std::to_string(limit));
        }
        copies.push_back({bytes.data(), item.offset, bytes.size(), lease.segment_id()});
    }
    MCS_RETURN_IF_ERROR(CopySegmentsToDevice(std::move(copies), req.destination));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::LeaseRangesToDevice(
    const wire::LeaseRangesToDeviceRequest& req) {
    std::vector<SegmentCopy> copies;
    copies.reserve(req.items.size());
    const std::uint64_t limit = req.destination.ref.size;
    for (std::size_t i = 0; i < req.items.size(); ++i) {
        const wire::LeaseRangeCopy& item = req.items[i];
        const std::string what = "item " + std::to_string(i);
        MCS_ASSIGN_OR_RETURN(const ObjectLease* held, HeldLease(item.lease_id, what));
        const ObjectLease& lease = *held;
        if (item.member >= lease.info().members.size()) {
            return InvalidArgument(what + ": the leased object has no member " +
                                   std::to_string(item.member));
        }
        const std::span<const std::byte> bytes = lease.Bytes(item.member);
        if (item.offset > bytes.size() || item.bytes > bytes.size() - item.offset) {
            return OutOfRange(what + ": " + std::to_string(item.bytes) + " bytes at " +
                              std::to_string(item.offset) + " run past the member of " +
                              std::to_string(bytes.size()));
        }
        if (item.dst_offset > limit || item.bytes > limit - item.dst_offset) {
            return InvalidArgument(what + ": " + std::to_string(item.bytes) + " bytes at " +
                                   std::to_string(item.dst_offset) +
                                   " run past the destination of " + std::to_string(limit));
        }
        copies.push_back({bytes.data() + item.offset, item.dst_offset, item.bytes,
                          lease.segment_id()});
    }
    MCS_RETURN_IF_ERROR(CopySegmentsToDevice(std::move(copies), req.destination, req.ready_event));
    return Reply{wire::OkReply{}, {}};
}

Status NodeServer::Session::CopySegmentsToDevice(std::vector<SegmentCopy> copies,
                                                 const wire::TensorLocation& destination,
                                                 std::string_view ready_event) {
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t total = 0;
    for (const SegmentCopy& c : copies) total += c.bytes;
    auto mapped = MapCuda(destination);
    if (!mapped.ok()) return mapped.status().WithContext("the destination");
    const DeviceMemory dst = mapped->first;
    // Host-to-device copies from the segments, in destination order (a planned read's layout
    // follows the members' addresses, LayOutStaging). Copies of one segment that the client
    // placed as they lie there (same distance apart in the destination as in the segment, a
    // few KiB at most: a read publishes its objects next to each other, a planned read's
    // ranges of one member follow each other) move as one copy of their span.
    // A span in pinned segment memory goes straight to the device; one in pageable memory is
    // first gathered into pinned landing memory on the copy threads (a pageable copy runs at a
    // fraction of the pinned rate).
    constexpr std::uint64_t kMaxGap = 4096;
    struct Run {
        const std::byte* src;
        std::uint64_t offset;
        std::uint64_t bytes;
    };
    std::stable_sort(copies.begin(), copies.end(), [](const SegmentCopy& a, const SegmentCopy& b) {
        return a.offset < b.offset;
    });
    std::vector<Run> pinned, pageable;
    std::uint64_t pageable_bytes = 0;
    for (std::size_t k = 0; k < copies.size();) {
        std::size_t end = k + 1;
        std::uint64_t bytes = copies[k].bytes;
        bool known_pinned = copies[k].pinned;
        while (end < copies.size() && copies[end].segment == copies[k].segment &&
               copies[end].src >= copies[k].src &&
               static_cast<std::uint64_t>(copies[end].src - copies[k].src) ==
                   copies[end].offset - copies[k].offset &&
               copies[end].offset >= copies[k].offset &&
               copies[end].offset <= copies[k].offset + bytes + kMaxGap) {
            bytes = std::max(bytes, copies[end].offset + copies[end].bytes - copies[k].offset);
            known_pinned = known_pinned && copies[end].pinned;
            ++end;
        }
        if (bytes > 0) {
            // Two driver queries per run otherwise (a planned read's copies: hundreds of runs).
            // A run's gap bytes lie between two pinned copies of one segment, whose registered
            // part is a prefix: pinned too.
            bool is_pinned = known_pinned;
            if (!is_pinned) {
                const auto first = cuda::DescribePointer(copies[k].src);
                const auto last = cuda::DescribePointer(copies[k].src + bytes - 1);
                is_pinned = first.ok() && last.ok() && first->type == cuda::MemoryType::kHost &&
                            last->type == cuda::MemoryType::kHost;
            }
            (is_pinned ? pinned : pageable).push_back({copies[k].src, copies[k].offset, bytes});
            if (!is_pinned) pageable_bytes += bytes;
        }
        k = end;
    }
    HostBuffer bounce;
    std::vector<HostCopy> gathers;
    if (pageable_bytes > 0) {
        MCS_ASSIGN_OR_RETURN(bounce, server_.commit_staging_->Allocate(pageable_bytes));
        std::uint64_t at = 0;
        for (Run& r : pageable) {
            gathers.push_back({bounce.data() + at, r.src, static_cast<std::size_t>(r.bytes)});
            r.src = bounce.data() + at;
            at += r.bytes;
        }
        ParallelCopies(gathers, DefaultCopyThreads());
    }
    std::uint64_t issued = 0;
    bool gathered = false;
    if (server_.options_.device_gather && (pageable.empty() || bounce.pinned())) {
        // Every run in one kernel that reads the pinned memory (the bounce buffer included).
        std::vector<DeviceRangeCopy> ranges;
        ranges.reserve(pinned.size() + pageable.size());
        for (const std::vector<Run>* runs : {&pinned, &pageable}) {
            for (const Run& r : *runs) ranges.push_back({r.src, dst.address + r.offset, r.bytes});
        }
        const Status s = server_.options_.device_gather(ranges, dst.device, kCudaPerThreadStream);
        gathered = s.ok();
        issued = gathered && !ranges.empty() ? 1 : 0;
        if (!gathered && s.code() != StatusCode::kUnimplemented) {
            // A kernel this build cannot launch here (say, no image for the device's
            // architecture): the copies below move the same bytes to the same places.
            static std::atomic<bool> warned{false};
            if (!warned.exchange(true)) {
                MCS_LOG(kWarning) << "device reads fall back to one copy per range: "
                                  << s.ToString();
            }
        }
    }
    for (const std::vector<Run>* runs : {&pinned, &pageable}) {
        for (const Run& r : *runs) {
            if (gathered) break;
            MCS_RETURN_IF_ERROR(cuda::MemcpyAsync(reinterpret_cast<void*>(dst.address + r.offset),
                                                  r.src, r.bytes, cuda::CopyKind::kHostToDevice,
                                                  kCudaPerThreadStream, dst.device));
            ++issued;
        }
    }
    // With the client's ready event, and every run read where it lies (a bounce buffer goes
    // back when this returns): the event recorded after the copies, the reply at once. The
    // leases keep the segments' bytes until the client releases them, after its wait.
    bool deferred = false;
    if (!ready_event.empty() && pageable.empty() && server_.options_.open_ipc_event &&
        server_.options_.record_ipc_event) {
        if (ready_event_.event == nullptr || ready_event_.handle != ready_event ||
            ready_event_.device != dst.device) {
            ready_event_ = {};
            Result<std::shared_ptr<void>> opened = server_.options_.open_ipc_event(
                std::as_bytes(std::span(ready_event.data(), ready_event.size())), dst.device);
            if (opened.ok()) {
                ready_event_ = {std::string(ready_event), dst.device, std::move(opened).value()};
            } else {
                static std::atomic<bool> warned{false};
                if (!warned.exchange(true)) {
                    MCS_LOG(kWarning) << "a client's ready event cannot be opened; its device "
                                         "reads are answered once copied: "
                                      << opened.status().ToString();
                }
            }
        }
        deferred = ready_event_.event != nullptr &&
                   server_.options_.record_ipc_event(ready_event_.event.get(), kCudaPerThreadStream)
                       .ok();
    }
    if (!deferred) MCS_RETURN_IF_ERROR(cuda::StreamSynchronize(kCudaPerThreadStream, dst.device));
    if (deferred) server_.leases_to_device_deferred_.fetch_add(1, std::memory_order_relaxed);
    server_.leases_to_device_bytes_.fetch_add(total, std::memory_order_relaxed);
    server_.leases_to_device_copies_.fetch_add(issued, std::memory_order_relaxed);
    server_.leases_to_device_runs_.fetch_add(pinned.size() + pageable.size(),
                                             std::memory_order_relaxed);
    server_.leases_to_device_nanos_.fetch_add(NanosSince(start), std::memory_order_relaxed);
    return Status::Ok();
}

Result<std::span<const TargetDescriptor>> NodeServer::Session::PlanTargets(
    const wire::SparseReadPlanRequest& req) {
    if (!req.target_set) return std::span<const TargetDescriptor>(req.targets);
    const std::uint64_t id = *req.target_set;
    auto it = std::find_if(kept_targets_.begin(), kept_targets_.end(),
                           [&](const KeptTargets& k) { return k.id == id; });
    if (req.targets.empty()) {
        if (it == kept_targets_.end()) {
            return NotFound("this connection keeps no targets under id " + std::to_string(id) +
                            ": send them");
        }
        it->last_use = ++kept_clock_;
        server_.planned_reads_kept_targets_.fetch_add(1, std::memory_order_relaxed);
        return std::span<const TargetDescriptor>(it->targets);
    }
    if (it != kept_targets_.end()) kept_targets_.erase(it);
    // Room for them: the least recently used sets go.
    wire::MakeRoomForKeptTargets(kept_targets_, req.targets.size());
    kept_targets_.push_back({id, req.targets, ++kept_clock_});
    return std::span<const TargetDescriptor>(kept_targets_.back().targets);
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseReadPlan(
    const wire::SparseReadPlanRequest& req) {
    // The ranges are handed out where they lie: only the node's own segments hold them so.
    if (server_.options_.sparse_objects) {
        return Unimplemented("the daemon's sparse objects are not in its segments");
    }
    if (req.options.strategy != wire::ReadStrategy::kSparseRanges) {
        return Unimplemented("a planned read reads sparse ranges");
    }
    ReadOptions options;
    options.plan = req.options.plan;
    options.num_threads = static_cast<int>(
        req.options.num_threads == 0 ? server_.options_.read_threads
                                     : std::min(req.options.num_threads, kMaxReadThreads));
    options.view_in_place = true;
    options.describe_targets = false;  // the client describes them
    std::vector<std::string> unchanged = req.unchanged;
    std::sort(unchanged.begin(), unchanged.end());
    StepManifestView step(req.step, req.manifest, unchanged);
    std::optional<SparseStore::SharedStepManifest> sealed;
    if (req.sealed_entries) {
        // The daemon's own manifest of the sealed step: the one the client got from it (a
        // sealed step's never changes), which the reply's indices refer to.
        if (!req.manifest.empty() || !req.unchanged.empty()) {
            return InvalidArgument("a planned read of a sealed step sends no manifest");
        }
        if (req.step.delta != req.step.base + 1) {
            return InvalidArgument("a planned read names a step (k - 1, k), got " +
                                   req.step.ToString());
        }
        MCS_ASSIGN_OR_RETURN(sealed, sparse_->GetManifestShared(req.step));
        if (!sealed->sealed) {
            return FailedPrecondition("step " + req.step.ToString() +
                                      " is not sealed: plan it with its manifest");
        }
        if (sealed->sources->size() != *req.sealed_entries) {
            return FailedPrecondition("step " + req.step.ToString() + " lists " +
                                      std::to_string(sealed->sources->size()) +
                                      " sources here, the client's manifest " +
                                      std::to_string(*req.sealed_entries));
        }
        step = sealed->view();
        options.manifest_owner = sealed->sources;
        server_.step_reads_.fetch_add(1, std::memory_order_relaxed);
    }

    wire::SparseReadPlanReply reply;
    std::vector<ObjectLease> leases;
    bool staged = false;  // copies into the client's memory queued (to_device)
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t plan_nanos = 0, queued_nanos = 0;
    const auto build = [&](PlannedRead& read) -> Status {
        plan_nanos = NanosSince(start);
        // A lease on every source the ranges come from: the client's copies of the ranges run
        // after this call, and the leases keep the bytes where they are until it releases them.
        std::vector<std::uint32_t> planned_of(read.manifest.size(), PlannedRead::kNoSource);
        std::vector<std::array<std::span<const std::byte>, 2>> members;
        reply.ranges.reserve(read.ranges.size());
        for (const PlannedRead::Range& range : read.ranges) {
            const SourceDescriptor& src = read.manifest[range.source];
            std::uint32_t& p = planned_of[range.source];
            if (p == PlannedRead::kNoSource) {
                // The version viewed, without a second lookup of its key.
                MCS_ASSIGN_OR_RETURN(ObjectLease lease,
                                     range.view != nullptr
                                         ? server_.store_->LeaseViewed(*range.view)
                                         : server_.store_->Lease(src.source_ref));
                const ObjectInfo& info = lease.info();
                const MemberInfo* mi = info.FindMember("indices");
                const MemberInfo* mv = info.FindMember("values");
                if (mi == nullptr || mv == nullptr) {
                    return DataLoss("source " + src.source_ref + " has no indices or values");
                }
                const std::size_t ki = static_cast<std::size_t>(mi - info.members.data());
                const std::size_t kv = static_cast<std::size_t>(mv - info.members.data());
                wire::PlannedSource ps;
                ps.indices = {lease.segment_id(), lease.member_offset(ki), mi->size_bytes};
                ps.values = {lease.segment_id(), lease.member_offset(kv), mv->size_bytes};
                ps.indices_member = static_cast<std::uint32_t>(ki);
                ps.values_member = static_cast<std::uint32_t>(kv);
                ps.pinned = range.pinned;
                members.push_back({lease.Bytes(ki), lease.Bytes(kv)});
                p = static_cast<std::uint32_t>(leases.size());
                leases.push_back(std::move(lease));
                reply.sources.push_back(ps);
            }
            // The version leased is the one the read viewed (its bytes hold the range).
            const auto offset_in = [](std::span<const std::byte> member,
                                      std::span<const std::byte> part) -> std::optional<std::uint64_t> {
                if (part.empty()) return 0;
                if (part.data() < member.data() ||
                    part.data() + part.size() > member.data() + member.size()) {
                    return std::nullopt;
                }
                return static_cast<std::uint64_t>(part.data() - member.data());
            };
            const auto oi = offset_in(members[p][0], range.indices);
            const auto ov = offset_in(members[p][1], range.values);
            if (!oi || !ov) {
                return Unavailable("source " + src.source_ref + " was replaced during the read");
            }
            reply.ranges.push_back({p, range.source, *oi, range.indices.size(), *ov,
                                    range.values.size()});
        }
        // Asked to, the ranges go to the client's device now, laid out here (the copies read
        // this process's addresses), before the rest of the reply is even built; a layout
        // larger than the destination, or copies that cannot be queued, leave that to the
        // client's copy request.
        if (req.to_device) {
            StagingLayout layout = LayOutStaging(read.ranges);
            if (layout.total <= req.to_device->destination.ref.size) {
                std::vector<SegmentCopy> copies;
                copies.reserve(2 * read.ranges.size());
                for (int k = 0; k < 2; ++k) {
                    for (std::size_t r = 0; r < read.ranges.size(); ++r) {
                        const PlannedRead::Range& range = read.ranges[r];
                        const std::span<const std::byte> bytes = k == 0 ? range.indices : range.values;
                        if (bytes.empty()) continue;
                        copies.push_back({bytes.data(), layout.at[2 * r + k], bytes.size(),
                                          leases[planned_of[range.source]].segment_id(),
                                          range.pinned});
                    }
                }
                const Status copied = CopySegmentsToDevice(
                    std::move(copies), req.to_device->destination, req.to_device->ready_event);
                if (copied.ok()) {
                    queued_nanos = NanosSince(start);
                    reply.staged_at = std::move(layout.at);
                    staged = true;
                } else {
                    static std::atomic<bool> warned{false};
                    if (!warned.exchange(true)) {
                        MCS_LOG(kWarning) << "a planned read's ranges are left to the client's "
                                             "copy request: "
                                          << copied.ToString();
                    }
                }
            }
        }
        reply.pieces.reserve(read.pieces.size());
        for (const PlannedRead::Piece& piece : read.pieces) {
            reply.pieces.push_back({piece.range, piece.begin, piece.count,
                                    piece.filter ? std::optional<Box>(piece.overlap)
                                                 : std::nullopt});
        }
        reply.targets.reserve(read.per_target.size());
        for (std::size_t t = 0; t < read.per_target.size(); ++t) {
            const PlannedRead::Target& pt = read.per_target[t];
            reply.targets.push_back({pt.end_piece - pt.first_piece, pt.first_source});
            // The client builds the targets; the daemon's own descriptors are not used.
            read.kept[t] = pt.capacity;
        }
        return Status::Ok();
    };
    MCS_ASSIGN_OR_RETURN(const std::span<const TargetDescriptor> targets, PlanTargets(req));
    Status planned = sparse_->ReadPlanned(step, targets, options, build).status();
    std::vector<std::uint64_t> ids;
    if (planned.ok()) planned = AddLeases(std::move(leases), ids);
    if (!planned.ok()) {
        // Copies left running read the leased bytes: done before the leases go.
        if (staged) {
            if (auto mapped = MapCuda(req.to_device->destination); mapped.ok()) {
                (void)cuda::StreamSynchronize(kCudaPerThreadStream, mapped->first.device);
            }
        }
        return planned;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) reply.sources[i].lease_id = ids[i];
    if (staged) server_.planned_reads_staged_.fetch_add(1, std::memory_order_relaxed);
    server_.planned_reads_.fetch_add(1, std::memory_order_relaxed);
    server_.planned_read_nanos_.fetch_add(NanosSince(start), std::memory_order_relaxed);
    server_.planned_read_plan_nanos_.fetch_add(plan_nanos, std::memory_order_relaxed);
    server_.planned_read_queued_nanos_.fetch_add(queued_nanos, std::memory_order_relaxed);
    return Reply{std::move(reply), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseAdmit(
    const wire::SparseAdmitRequest& req) {
    MCS_ASSIGN_OR_RETURN(bool admitted,
                         sparse_->Admit(req.tensor_id, req.generation, req.policy,
                                                req.source_placement, req.writer_id));
    return Reply{wire::SparseAdmitReply{admitted}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseAdmitBatch(
    const wire::SparseAdmitBatchRequest& req) {
    std::vector<AdmitRequest> items;
    items.reserve(req.items.size());
    for (const wire::SparseAdmitRequest& r : req.items) {
        items.push_back({r.tensor_id, r.generation, r.policy, r.source_placement, r.writer_id});
    }
    wire::SparseAdmitBatchReply reply;
    reply.items.reserve(items.size());
    for (Result<bool>& r : sparse_->AdmitBatch(items)) {
        if (r.ok()) {
            reply.items.push_back({0, {}, *r});
        } else {
            reply.items.push_back({static_cast<std::int32_t>(r.status().code()),
                                   std::string(r.status().message()), false});
        }
    }
    return Reply{std::move(reply), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseManifest(
    const wire::SparseManifestRequest& req) {
    MCS_ASSIGN_OR_RETURN(auto sources, sparse_->Manifest(req.generation));
    return Reply{wire::SparseManifestReply{std::move(sources)}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseCurrentGeneration(
    const wire::SparseCurrentGenerationRequest& req) {
    MCS_ASSIGN_OR_RETURN(auto generation, sparse_->CurrentGeneration(req.tensor_id));
    return Reply{wire::SparseCurrentGenerationReply{generation}, {}};
}

ReadOptions NodeServer::Session::ReadOptionsOf(const wire::SparseReadOptions& o) const {
    ReadOptions options;
    options.plan = o.plan;
    options.strategy = o.strategy == wire::ReadStrategy::kFullSourcePerTarget
                           ? ReadStrategy::kFullSourcePerTarget
                           : ReadStrategy::kSparseRanges;
    options.num_threads = static_cast<int>(
        o.num_threads == 0 ? server_.options_.read_threads
                           : std::min(o.num_threads, kMaxReadThreads));
    options.view_in_place = server_.options_.read_in_place;
    return options;
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseRead(
    const wire::SparseReadRequest& req) {
    const ReadOptions options = ReadOptionsOf(req.options);
    std::vector<TargetObject> objects;
    if (req.step) {
        // The request's sources are read where they lie; only the unchanged ids are sorted.
        std::vector<std::string> unchanged = req.unchanged;
        std::sort(unchanged.begin(), unchanged.end());
        const StepManifestView step(*req.step, req.manifest, unchanged);
        MCS_ASSIGN_OR_RETURN(objects, sparse_->ReadSparseObjects(step, req.targets, options));
    } else {
        MCS_ASSIGN_OR_RETURN(objects,
                             sparse_->ReadSparseObjects(req.manifest, req.targets, options));
    }
    return PublishRead(std::move(objects), options.num_threads);
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseReadStep(
    const wire::SparseReadStepRequest& req) {
    // The manifest is this daemon's own of the sealed step (kept since the seal or the first
    // reader's call): the one the client got from it, since a sealed step's never changes. A
    // step freed meanwhile is NotFound, as a read of its sources would be.
    if (req.step.delta != req.step.base + 1) {
        return InvalidArgument("SparseReadStep reads a step (k - 1, k), got " +
                               req.step.ToString());
    }
    MCS_ASSIGN_OR_RETURN(SparseStore::SharedStepManifest m, sparse_->GetManifestShared(req.step));
    if (!m.sealed) {
        return FailedPrecondition("step " + req.step.ToString() +
                                  " is not sealed: read it with its manifest");
    }
    ReadOptions options = ReadOptionsOf(req.options);
    options.manifest_owner = m.sources;  // the indexes cached refer to the kept manifest's entries
    MCS_ASSIGN_OR_RETURN(std::vector<TargetObject> objects,
                         sparse_->ReadSparseObjects(m.view(), req.targets, options));
    server_.step_reads_.fetch_add(1, std::memory_order_relaxed);
    return PublishRead(std::move(objects), options.num_threads);
}

Result<NodeServer::Session::Reply> NodeServer::Session::PublishRead(
    std::vector<TargetObject> objects, int num_threads) {
    // Publish each target-local object into segment memory, leased to this connection: on the
    // read's threads when there are many bytes to copy.
    wire::SparseReadReply reply;
    reply.objects.resize(objects.size());
    std::vector<ObjectLease> leases(objects.size());
    std::vector<Status> published(objects.size());
    std::uint64_t bytes = 0;
    for (const TargetObject& t : objects) bytes += t.object.PayloadBytes();
    constexpr std::uint64_t kParallelPublishBytes = std::uint64_t{8} << 20;
    const int threads = bytes < kParallelPublishBytes ? 1 : num_threads;
    internal::ParallelFor(threads, objects.size(), [&](std::size_t i) {
        TargetObject& t = objects[i];
        SparseObject& o = t.object;
        const SourceDescriptor& d = o.desc;
        const Index nnz = Index(d.nnz), rank = Index(d.rank()), tiles = Index(d.num_tiles);
        const MemberData members[] = {
            {"indices", d.index_dtype, {nnz, rank}, o.indices, o.checksum_indices},
            {"values", d.value_dtype, {nnz}, o.values, o.checksum_values},
            {"tile_coords", DType::kUInt32, {tiles, rank}, AsBytes(o.tile_coords),
             o.checksum_tile_coords},
            {"tile_ptr", DType::kUInt64, {tiles + 1}, AsBytes(o.tile_ptr), o.checksum_tile_ptr},
        };
        Result<ObjectLease> lease = server_.store_->Publish("target/" + t.target_id, {}, members);
        if (!lease.ok()) {
            published[i] = lease.status();
            return;
        }
        leases[i] = std::move(lease).value();
        const ObjectLease& l = leases[i];
        auto slice = [&](std::size_t m) -> wire::SegmentMember {
            return {{l.segment_id(), l.member_offset(m), l.info().members[m].size_bytes},
                    l.info().members[m].checksum};
        };
        // The object's bytes are in the segment now. The reply carries what the read decided;
        // the client has the rest of the descriptor from its target.
        wire::ReadTargetLocation& loc = reply.objects[i];
        loc.generation = d.generation;
        loc.tile_shape = std::move(o.desc.tile_shape);
        loc.nnz = d.nnz;
        loc.num_tiles = d.num_tiles;
        loc.apply = d.apply;
        loc.index_dtype = d.index_dtype;
        loc.value_dtype = d.value_dtype;
        loc.indices = slice(0);
        loc.values = slice(1);
        loc.tile_coords = slice(2);
        loc.tile_ptr = slice(3);
    });
    // The first failure in target order (the leases taken so far go with `leases`).
    for (const Status& s : published) MCS_RETURN_IF_ERROR(s);
    std::vector<std::uint64_t> ids;
    MCS_RETURN_IF_ERROR(AddLeases(std::move(leases), ids));
    for (std::size_t i = 0; i < ids.size(); ++i) reply.objects[i].lease_id = ids[i];
    return Reply{std::move(reply), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::Metrics(const wire::MetricsRequest& req) {
    wire::MetricsReply reply;
    for (auto& [name, value] : server_.MetricItems()) reply.items.push_back({name, value});
    if (req.reset) sparse_->ResetMetrics();
    return Reply{std::move(reply), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::ClearCaches(
    const wire::ClearCachesRequest&) {
    MCS_RETURN_IF_ERROR(sparse_->ClearCaches());
    return Reply{wire::OkReply{}, {}};
}

namespace {

wire::SparseStepManifestReply StepManifestReply(StepManifest m) {
    return {m.generation, std::move(m.sources), std::move(m.unchanged), m.sealed};
}

}  // namespace

Result<NodeServer::Session::Reply> NodeServer::Session::SparseStepManifest(
    const wire::SparseStepManifestRequest& req) {
    MCS_ASSIGN_OR_RETURN(StepManifest m, sparse_->GetManifest(req.generation));
    return Reply{StepManifestReply(std::move(m)), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseSeal(
    const wire::SparseSealRequest& req) {
    MCS_RETURN_IF_ERROR(sparse_->SealGeneration(req.generation, req.tensor_ids));
    return Reply{wire::OkReply{}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseWait(
    const wire::SparseWaitRequest& req) {
    // This connection's thread blocks; others are served meanwhile. A seal through the daemon
    // wakes it at once.
    MCS_ASSIGN_OR_RETURN(StepManifest m,
                         sparse_->WaitGeneration(req.generation, req.timeout_seconds));
    return Reply{StepManifestReply(std::move(m)), {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseLatest(
    const wire::SparseLatestRequest& req) {
    MCS_ASSIGN_OR_RETURN(std::optional<Generation> g,
                         req.anchor ? sparse_->LatestAnchor() : sparse_->LatestGeneration());
    return Reply{wire::SparseLatestReply{g}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseRetention(
    const wire::SparseRetentionRequest& req) {
    if (req.set) MCS_RETURN_IF_ERROR(sparse_->SetRetention(req.keep_last));
    if (req.keep_anchors) MCS_RETURN_IF_ERROR(sparse_->SetKeepAnchors(*req.keep_anchors));
    MCS_ASSIGN_OR_RETURN(std::uint64_t keep, sparse_->Retention());
    return Reply{wire::SparseRetentionReply{keep}, {}};
}

Result<NodeServer::Session::Reply> NodeServer::Session::SparseAnchor(
    const wire::SparseAnchorRequest& req) {
    MCS_RETURN_IF_ERROR(sparse_->RecordAnchor(req.generation, req.tensor_ids));
    return Reply{wire::OkReply{}, {}};
}

}  // namespace mooncake::sparse
