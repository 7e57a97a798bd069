// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The sparse layer of the node daemon's client (node_client.h): the RPCs of the sparse
// messages (node/wire_sparse.h), and the SparseService on top of them, whose conversions
// between executor and wire types are made here, once.
#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "executor/tensor_store.h"
#include "node/log.h"
#include "node/node_client.h"
#include "transport/parallel_for.h"
#include "node/node_tensor_store.h"
#include "store/shm_segment.h"

namespace mooncake::sparse {
namespace {

/// `a * b * c` without overflow, or nullopt.
std::optional<std::uint64_t> Product(std::uint64_t a, std::uint64_t b, std::uint64_t c = 1) {
    std::uint64_t out = 0;
    if (__builtin_mul_overflow(a, b, &out) || __builtin_mul_overflow(out, c, &out)) {
        return std::nullopt;
    }
    return out;
}

/// A read's options as the daemon takes them (the manifest index is the caller's own).
wire::SparseReadOptions WireReadOptions(const ReadOptions& options) {
    wire::SparseReadOptions out;
    out.plan = options.plan;
    out.strategy = options.strategy == ReadStrategy::kFullSourcePerTarget
                       ? wire::ReadStrategy::kFullSourcePerTarget
                       : wire::ReadStrategy::kSparseRanges;
    out.num_threads = static_cast<std::uint32_t>(options.num_threads);
    return out;
}

/// Commits updates 0..n in order (those `take(i)` accepts) in chunks of at most 8,192 updates
/// and 256 MiB of members (`bytes_of(i)`), one `commit(chunk)` each; a chunk whose call fails
/// fails all its updates with that error.
template <typename Take, typename BytesOf, typename Commit>
void CommitInChunks(std::span<const PutSparseRequest> requests, Take take, BytesOf bytes_of,
                    Commit commit, std::vector<Result<CommitResult>>& out) {
    constexpr std::size_t kBatchItems = 8192;
    constexpr std::uint64_t kBatchBytes = std::uint64_t{256} << 20;
    std::vector<std::size_t> chunk;
    std::uint64_t chunk_bytes = 0;
    const auto send = [&]() {
        if (chunk.empty()) return;
        if (Status s = commit(std::span<const std::size_t>(chunk)); !s.ok()) {
            for (std::size_t i : chunk) out[i] = s;
        }
        chunk.clear();
        chunk_bytes = 0;
    };
    for (std::size_t i = 0; i < requests.size(); ++i) {
        if (!take(i)) continue;
        const std::uint64_t bytes = bytes_of(i);
        if (!chunk.empty() && (chunk.size() == kBatchItems || chunk_bytes + bytes > kBatchBytes)) {
            send();
        }
        chunk.push_back(i);
        chunk_bytes += bytes;
    }
    send();
}

/// Each failed update's error, named by its index and tensor.
void NameFailures(std::span<const PutSparseRequest> requests,
                  std::vector<Result<CommitResult>>& out) {
    for (std::size_t i = 0; i < out.size(); ++i) {
        if (!out[i].ok()) {
            out[i] = out[i].status().WithContext("update " + std::to_string(i) + " ('" +
                                                 requests[i].tensor_id + "')");
        }
    }
}

template <typename T>
std::span<const std::byte> AsBytes(const std::vector<T>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The sparse layer at the level of the protocol
// ---------------------------------------------------------------------------------------------
Result<wire::SparseCommitReply> NodeClient::CommitSparseObject(const SourceDescriptor& desc,
                                                               std::string_view coordinate_space,
                                                               const EncodedMembers& members,
                                                               bool hard_pin) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    const std::span<const std::byte> parts[] = {members.indices, members.values,
                                                members.tile_coords, members.tile_ptr};
    std::uint64_t total = 0;
    MCS_ASSIGN_OR_RETURN(std::vector<std::uint64_t> offsets, StageInBuffer(parts, total));
    wire::SparseCommitRequest request;
    request.desc = desc;
    request.coordinate_space.assign(coordinate_space);
    request.indices = {wire::BufferRef::Client(offsets[0], parts[0].size()),
                       members.checksum_indices};
    request.values = {wire::BufferRef::Client(offsets[1], parts[1].size()),
                      members.checksum_values};
    request.tile_coords = {wire::BufferRef::Client(offsets[2], parts[2].size()),
                           members.checksum_tile_coords};
    request.tile_ptr = {wire::BufferRef::Client(offsets[3], parts[3].size()),
                        members.checksum_tile_ptr};
    request.hard_pin = hard_pin;
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseCommitReply>(request));
    std::lock_guard slock(stats_mu_);
    ++counters_.puts;
    counters_.bytes_put += total;
    return reply;
}

Result<bool> NodeClient::Admit(std::string_view tensor_id, Generation generation,
                               const PlacementPolicy& policy, const NamedAxes& source_placement,
                               std::string_view writer_id) {
    MCS_RETURN_IF_ERROR(Generation::Make(generation.base, generation.delta));
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    wire::SparseAdmitRequest request{std::string(tensor_id), generation, policy,
                                     source_placement, std::string(writer_id)};
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseAdmitReply>(request));
    return reply.admitted;
}

std::vector<Result<bool>> NodeClient::AdmitBatch(std::span<const AdmitRequest> items) {
    std::vector<Result<bool>> out(items.size(), Internal("admit_batch: no outcome"));
    // Requests of at most kAdmitChunk items: each well inside a frame (ids of up to 4 KiB).
    constexpr std::size_t kAdmitChunk = 4096;
    std::vector<std::size_t> sent;  // items of the request, in order
    wire::SparseAdmitBatchRequest request;
    const auto flush = [&]() {
        if (sent.empty()) return;
        const Result<wire::SparseAdmitBatchReply> reply =
            [&]() -> Result<wire::SparseAdmitBatchReply> {
            std::lock_guard lock(mu_);
            MCS_RETURN_IF_ERROR(EnsureConnected());
            MCS_ASSIGN_OR_RETURN(auto got, Call<wire::SparseAdmitBatchReply>(request));
            if (got.items.size() != sent.size()) {
                return DataLoss("admit_batch: " + std::to_string(got.items.size()) +
                                " outcomes for " + std::to_string(sent.size()) + " items");
            }
            return got;
        }();
        for (std::size_t k = 0; k < sent.size(); ++k) {
            if (!reply.ok()) {
                out[sent[k]] = reply.status();
            } else if (const wire::SparseAdmitOutcome& o = reply->items[k]; o.code == 0) {
                out[sent[k]] = o.admitted;
            } else {
                out[sent[k]] = Status(static_cast<StatusCode>(o.code), o.message);
            }
        }
        sent.clear();
        request.items.clear();
    };
    for (std::size_t i = 0; i < items.size(); ++i) {
        const AdmitRequest& r = items[i];
        if (Status s = Generation::Make(r.generation.base, r.generation.delta).status(); !s.ok()) {
            out[i] = s;  // fails alone
            continue;
        }
        request.items.push_back(
            {r.tensor_id, r.generation, r.policy, r.source_placement, r.writer_id});
        sent.push_back(i);
        if (sent.size() == kAdmitChunk) flush();
    }
    flush();
    return out;
}

Result<std::vector<SourceDescriptor>> NodeClient::Manifest(Generation generation) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply,
                         Call<wire::SparseManifestReply>(wire::SparseManifestRequest{generation}));
    return std::move(reply.sources);
}

Result<std::optional<Generation>> NodeClient::CurrentGeneration(std::string_view tensor_id) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    wire::SparseCurrentGenerationRequest request{std::string(tensor_id)};
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseCurrentGenerationReply>(request));
    return reply.generation;
}

Result<std::vector<LeasedTargetObject>> NodeClient::ReadSparseObjects(
    std::span<const SourceDescriptor> manifest, std::span<const TargetDescriptor> targets,
    const wire::SparseReadOptions& options) {
    wire::SparseReadRequest request;
    request.manifest.assign(manifest.begin(), manifest.end());
    request.targets.assign(targets.begin(), targets.end());
    request.options = options;
    return CallRead(request, targets);
}

Result<std::vector<LeasedTargetObject>> NodeClient::ReadSparseObjects(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const wire::SparseReadOptions& options) {
    wire::SparseReadRequest request;
    request.manifest.assign(manifest.sources.begin(), manifest.sources.end());
    request.targets.assign(targets.begin(), targets.end());
    request.options = options;
    request.step = manifest.generation;
    request.unchanged.assign(manifest.unchanged.begin(), manifest.unchanged.end());
    return CallRead(request, targets);
}

namespace {

StepManifest StepManifestOf(wire::SparseStepManifestReply r) {
    return {r.generation, std::move(r.sources), std::move(r.unchanged), r.sealed};
}

}  // namespace

Result<StepManifest> NodeClient::GetManifest(Generation generation) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseStepManifestReply>(
                                         wire::SparseStepManifestRequest{generation}));
    return StepManifestOf(std::move(reply));
}

Status NodeClient::SealGeneration(Generation generation, std::span<const std::string> tensor_ids) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    wire::SparseSealRequest request{generation, {tensor_ids.begin(), tensor_ids.end()}};
    return Call<wire::OkReply>(request).status();
}

Result<StepManifest> NodeClient::WaitGeneration(Generation generation, double timeout_seconds) {
    using Clock = std::chrono::steady_clock;
    const bool forever = timeout_seconds < 0;
    const auto start = Clock::now();
    // Each wait is bounded well inside the call timeout.
    const double chunk = std::min(
        10.0, std::chrono::duration<double>(options_.call_timeout).count() / 2);
    for (;;) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        const double left = forever ? chunk : std::max(0.0, timeout_seconds - elapsed);
        const double wait = std::min(left, chunk);
        std::shared_ptr<NodeClient> waiter;
        {
            std::lock_guard lock(waiter_mu_);
            if (!waiter_) {
                NodeClientOptions o = options_;
                o.client_name += " (waits)";
                MCS_ASSIGN_OR_RETURN(waiter_, Connect(o));
            }
            waiter = waiter_;
        }
        Result<StepManifest> reply = waiter->WaitOnce(generation, wait);
        if (reply.ok()) return reply;
        if (reply.status().code() != StatusCode::kDeadlineExceeded) return reply.status();
        if (!forever && wait >= left) {
            return DeadlineExceeded("wait_generation: step " +
                                    std::to_string(generation.delta) + " is not sealed after " +
                                    std::to_string(timeout_seconds) + " s");
        }
    }
}

Result<StepManifest> NodeClient::WaitOnce(Generation generation, double timeout_seconds) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseStepManifestReply>(
                                         wire::SparseWaitRequest{generation, timeout_seconds}));
    return StepManifestOf(std::move(reply));
}

Result<std::optional<Generation>> NodeClient::LatestGeneration() {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply,
                         Call<wire::SparseLatestReply>(wire::SparseLatestRequest{false}));
    return reply.generation;
}

Status NodeClient::SetRetention(std::uint64_t keep_last) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    return Call<wire::SparseRetentionReply>(
               wire::SparseRetentionRequest{true, keep_last, std::nullopt})
        .status();
}

Status NodeClient::RecordAnchor(Generation step, std::span<const std::string> tensor_ids) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    wire::SparseAnchorRequest request{step, {tensor_ids.begin(), tensor_ids.end()}};
    return Call<wire::OkReply>(request).status();
}

Result<std::optional<Generation>> NodeClient::LatestAnchor() {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply,
                         Call<wire::SparseLatestReply>(wire::SparseLatestRequest{true}));
    return reply.generation;
}

Status NodeClient::SetKeepAnchors(std::uint64_t keep_anchors) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    wire::SparseRetentionRequest request;
    request.keep_anchors = keep_anchors;
    return Call<wire::SparseRetentionReply>(request).status();
}

Result<std::uint64_t> NodeClient::Retention() {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseRetentionReply>(
                                         wire::SparseRetentionRequest{false, 0, std::nullopt}));
    return reply.keep_last;
}

template <typename Request>
Result<std::vector<LeasedTargetObject>> NodeClient::CallRead(
    const Request& request, std::span<const TargetDescriptor> targets) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseReadReply>(request));
    std::vector<LeasedTargetObject> out;
    out.reserve(reply.objects.size());
    // Keepalives first, so that every lease is released whatever fails below.
    std::vector<LeaseKeepalive> keepalives;
    keepalives.reserve(reply.objects.size());
    for (const auto& o : reply.objects) keepalives.push_back(MakeKeepalive(o.lease_id, 0));
    if (reply.objects.size() != targets.size()) {
        return DataLoss("the node daemon returned " + std::to_string(reply.objects.size()) +
                        " objects for " + std::to_string(targets.size()) + " targets");
    }
    for (std::size_t i = 0; i < reply.objects.size(); ++i) {
        wire::ReadTargetLocation& o = reply.objects[i];
        const TargetDescriptor& target = targets[i];
        Result<SourceDescriptor> desc = TargetObjectDescriptor(
            target, {o.generation, o.apply, o.index_dtype, o.value_dtype, std::move(o.tile_shape),
                     o.nnz, o.num_tiles});
        if (!desc.ok()) {
            return DataLoss("the node daemon returned an object for " + target.target_id +
                            " that its target cannot have: " + desc.status().message());
        }
        const SourceDescriptor& d = *desc;
        const auto index_bytes = Product(d.nnz, d.rank(), DTypeSize(d.index_dtype));
        const auto value_bytes = Product(d.nnz, DTypeSize(d.value_dtype));
        const auto coord_bytes = Product(d.num_tiles, d.rank(), sizeof(TileCoord));
        const auto ptr_bytes = Product(d.num_tiles + 1, sizeof(std::uint64_t));
        if (!index_bytes || !value_bytes || !coord_bytes || !ptr_bytes ||
            o.indices.slice.size != *index_bytes || o.values.slice.size != *value_bytes ||
            o.tile_coords.slice.size != *coord_bytes || o.tile_ptr.slice.size != *ptr_bytes) {
            return DataLoss("the node daemon returned members of " + target.target_id +
                            " whose sizes do not match its descriptor");
        }
        LeasedTargetObject& t = out.emplace_back();
        MCS_ASSIGN_OR_RETURN(t.indices, View(o.indices.slice));
        MCS_ASSIGN_OR_RETURN(t.values, View(o.values.slice));
        MCS_ASSIGN_OR_RETURN(t.tile_coords, View(o.tile_coords.slice));
        MCS_ASSIGN_OR_RETURN(t.tile_ptr, View(o.tile_ptr.slice));
        t.target_id = target.target_id;
        t.node_id = target.node_id;
        t.target_box = target.box;
        t.desc = std::move(desc).value();
        t.coordinate_space = "local";
        t.checksum_indices = o.indices.checksum;
        t.checksum_values = o.values.checksum;
        t.checksum_tile_coords = o.tile_coords.checksum;
        t.checksum_tile_ptr = o.tile_ptr.checksum;
        t.keepalive = std::move(keepalives[i]);
        t.lease_id = o.lease_id;
        t.lease_scope = session_.get();
    }
    return out;
}

Status NodeClient::ClearCaches() {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    return Call<wire::OkReply>(wire::ClearCachesRequest{}).status();
}

Result<MetricItems> NodeClient::Metrics(bool reset) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::MetricsReply>(wire::MetricsRequest{reset}));
    MetricItems out;
    out.reserve(reply.items.size());
    for (auto& item : reply.items) out.emplace_back(std::move(item.name), item.value);
    return out;
}

// ---------------------------------------------------------------------------------------------
// SparseService
// ---------------------------------------------------------------------------------------------
Result<CommitResult> NodeClient::PutSparseObject(const PutSparseRequest& request) {
    // Encoded once, here (canonical entries are only indexed, not copied); the daemon
    // validates the object again and commits it.
    std::optional<SparseObject> indexed = IndexSourceObject(request);
    if (!indexed) {
        MCS_ASSIGN_OR_RETURN(SparseObject built, BuildSourceObject(request));
        indexed = std::move(built);
    }
    const SparseObject& o = *indexed;
    const bool views = o.indices.empty() && o.values.empty() && o.desc.nnz > 0;
    const EncodedMembers members{views ? request.indices.data : std::span<const std::byte>(o.indices),
                                 views ? request.values.data : std::span<const std::byte>(o.values),
                                 AsBytes(o.tile_coords),
                                 AsBytes(o.tile_ptr),
                                 o.checksum_indices,
                                 o.checksum_values,
                                 o.checksum_tile_coords,
                                 o.checksum_tile_ptr};
    MCS_ASSIGN_OR_RETURN(wire::SparseCommitReply reply,
                         CommitSparseObject(o.desc, o.coordinate_space, members, request.hard_pin));
    return CommitResult{std::move(reply.source_ref), reply.created, reply.nnz, reply.bytes};
}

std::vector<Result<CommitResult>> NodeClient::PutSparseObjects(
    std::span<const PutSparseRequest> requests, int num_threads) {
    const std::size_t n = requests.size();
    std::vector<Result<CommitResult>> out(n, Internal("unset"));
    // Encoded here, in parallel (the daemon validates every object again), then sent in
    // requests of at most 8,192 objects and 256 MiB of members each (CommitInChunks).
    // Entries already in canonical order (what encode_update returns) are not copied: the
    // object holds their tile index and checksums, and the request's arrays are sent as they are.
    std::vector<std::optional<SparseObject>> objects(n);
    internal::ParallelFor(num_threads, n, [&](std::size_t i) {
        if (std::optional<SparseObject> indexed = IndexSourceObject(requests[i])) {
            objects[i] = std::move(indexed);
            return;
        }
        Result<SparseObject> built = BuildSourceObject(requests[i]);
        if (built.ok()) {
            objects[i] = std::move(built).value();
        } else {
            out[i] = built.status();
        }
    });
    CommitInChunks(
        requests, [&](std::size_t i) { return objects[i].has_value(); },
        [&](std::size_t i) {
            const SparseObject& o = *objects[i];
            return o.PayloadBytes() + (o.indices.empty() && o.values.empty()
                                           ? requests[i].indices.data.size() +
                                                 requests[i].values.data.size()
                                           : 0);
        },
        [&](std::span<const std::size_t> chunk) {
            return CommitChunk(requests, objects, chunk, out);
        },
        out);
    NameFailures(requests, out);
    return out;
}

Status NodeClient::CommitChunk(std::span<const PutSparseRequest> requests,
                               std::vector<std::optional<SparseObject>>& objects,
                               std::span<const std::size_t> chunk,
                               std::vector<Result<CommitResult>>& out) {
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    std::vector<std::span<const std::byte>> parts;
    parts.reserve(4 * chunk.size());
    for (std::size_t i : chunk) {
        const SparseObject& o = *objects[i];
        // An indexed object (IndexSourceObject) sends the request's entries themselves.
        const bool indexed = o.indices.empty() && o.values.empty() && o.desc.nnz > 0;
        parts.insert(parts.end(), {indexed ? requests[i].indices.data : std::span<const std::byte>(o.indices),
                                   indexed ? requests[i].values.data : std::span<const std::byte>(o.values),
                                   AsBytes(o.tile_coords), AsBytes(o.tile_ptr)});
    }
    std::uint64_t total = 0;
    MCS_ASSIGN_OR_RETURN(std::vector<std::uint64_t> offsets, StageInBuffer(parts, total));
    wire::SparseCommitBatchRequest request;
    request.items.resize(chunk.size());
    for (std::size_t k = 0; k < chunk.size(); ++k) {
        SparseObject& o = *objects[chunk[k]];
        wire::SparseCommitRequest& item = request.items[k];
        const auto member = [&](std::size_t m, std::uint64_t checksum) {
            return wire::ClientMember{wire::BufferRef::Client(offsets[4 * k + m], parts[4 * k + m].size()),
                                      checksum};
        };
        item.desc = std::move(o.desc);  // the object is done with once sent (its bytes are staged)
        item.coordinate_space = std::move(o.coordinate_space);
        item.indices = member(0, o.checksum_indices);
        item.values = member(1, o.checksum_values);
        item.tile_coords = member(2, o.checksum_tile_coords);
        item.tile_ptr = member(3, o.checksum_tile_ptr);
        item.hard_pin = requests[chunk[k]].hard_pin;
    }
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseCommitBatchReply>(request));
    if (reply.items.size() != chunk.size()) {
        return DataLoss("the daemon answered " + std::to_string(reply.items.size()) +
                        " items of a batch of " + std::to_string(chunk.size()));
    }
    for (std::size_t k = 0; k < chunk.size(); ++k) {
        wire::SparseCommitOutcome& r = reply.items[k];
        if (r.code != 0) {
            out[chunk[k]] = Status(static_cast<StatusCode>(r.code), std::move(r.message));
        } else {
            out[chunk[k]] = CommitResult{std::move(r.result.source_ref), r.result.created,
                                         r.result.nnz, r.result.bytes};
        }
    }
    std::lock_guard slock(stats_mu_);
    counters_.puts += chunk.size();
    counters_.bytes_put += total;
    return Status::Ok();
}

bool NodeClient::CanCommitFromDevice() {
    int known = device_commit_.load(std::memory_order_acquire);
    if (known >= 0) return known == 1;
    bool ok = cuda::GetSupport().ipc_available;
    if (ok) {
        Result<wire::HelloReply> hello = Hello();
        ok = hello.ok() && hello->protocol_version >= 6;
    }
    if (ok) {
        Result<MetricItems> metrics = Metrics(/*reset=*/false);
        ok = false;
        if (metrics.ok()) {
            for (const auto& [name, value] : *metrics) {
                if (name == "cuda_ipc_available") ok = value != 0;
            }
        }
    }
    device_commit_.store(ok ? 1 : 0, std::memory_order_release);
    return ok;
}

Result<const NodeClient::DeviceArena*> NodeClient::ArenaLocked(int device, std::uint64_t bytes) {
    DeviceArena* arena = nullptr;
    for (DeviceArena& a : arenas_) {
        if (a.device == device) arena = &a;
    }
    if (arena == nullptr) {
        arena = &arenas_.emplace_back();
        arena->device = device;
    }
    if (arena->bytes >= bytes && arena->address != 0) return arena;
    if (arena->address != 0) {
        MCS_RETURN_IF_ERROR(cuda::DeviceFree(arena->address, device));
        *arena = DeviceArena{0, 0, device, {}};
    }
    // Grown in steps of 64 MiB (at least twice the old size), so that a run that commits
    // steps of about the same size allocates, and the daemon maps, once.
    constexpr std::uint64_t kStep = std::uint64_t{64} << 20;
    const std::uint64_t size = std::max((bytes + kStep - 1) / kStep * kStep, 2 * arena->bytes);
    MCS_ASSIGN_OR_RETURN(const std::uintptr_t address, cuda::DeviceAlloc(size, device));
    auto exported = ExportCudaIpc(DeviceMemory{address, size, device});
    if (!exported.ok()) {
        (void)cuda::DeviceFree(address, device);
        return exported.status().WithContext("exporting the device commit arena");
    }
    arena->address = address;
    arena->bytes = size;
    arena->exported = std::move(exported).value();
    return arena;
}

Result<std::shared_ptr<NodeClient::DeviceArena>> NodeClient::ReadArenaLocked(int device,
                                                                         std::uint64_t total) {
    // A free allocation of the pool large enough, else a new one (a free one too small goes).
    std::shared_ptr<DeviceArena> arena;
    for (auto it = read_arenas_.begin(); it != read_arenas_.end();) {
        DeviceArena& a = **it;
        if (it->use_count() == 1 && a.device == device) {
            if (a.bytes >= total && !arena) {
                arena = *it;
            } else if (a.bytes < total) {
                it = read_arenas_.erase(it);
                continue;
            }
        }
        ++it;
    }
    if (!arena) {
        constexpr std::uint64_t kStep = std::uint64_t{64} << 20;
        const std::uint64_t size = std::max<std::uint64_t>((total + kStep - 1) / kStep * kStep, kStep);
        MCS_ASSIGN_OR_RETURN(const std::uintptr_t address, cuda::DeviceAlloc(size, device));
        auto fresh = std::shared_ptr<DeviceArena>(new DeviceArena{address, size, device, {}},
                                                  [](DeviceArena* a) {
                                                      (void)cuda::DeviceFree(a->address, a->device);
                                                      delete a;
                                                  });
        auto exported = ExportCudaIpc(DeviceMemory{address, size, device});
        if (!exported.ok()) return exported.status().WithContext("exporting a read's device memory");
        fresh->exported = std::move(exported).value();
        read_arenas_.push_back(fresh);
        arena = std::move(fresh);
    }
    return arena;
}

std::shared_ptr<NodeClient::DeviceArena> NodeClient::FreeReadArenaLocked(int device) {
    std::shared_ptr<DeviceArena> arena;
    for (const std::shared_ptr<DeviceArena>& a : read_arenas_) {
        if (a.use_count() == 1 && a->device == device && (!arena || a->bytes > arena->bytes)) {
            arena = a;
        }
    }
    return arena;
}

Result<NodeClient::DeviceCopy> NodeClient::CopyViewsToDevice(
    std::span<const TargetObjectView* const> views, int device, CudaStream stream) {
    if (!CanCommitFromDevice()) {
        return Unimplemented("CUDA IPC with the node daemon is not available here");
    }
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    // The destination mirrors the segments: members that lie a few KiB apart there keep their
    // distance here, so the daemon moves each run of them in one copy.
    struct Member {
        const std::byte* at;
        std::uint64_t bytes;
        std::size_t slot;  ///< 2 * view + (0 indices, 1 values)
    };
    std::vector<Member> members;
    members.reserve(2 * views.size());
    for (std::size_t i = 0; i < views.size(); ++i) {
        const TargetObjectView& v = *views[i];
        if (v.lease_id == 0 || v.lease_scope != session_.get()) {
            return FailedPrecondition("target " + v.target_id +
                                      " is not a read of this connection to the node daemon");
        }
        if (!v.indices.empty()) members.push_back({v.indices.data(), v.indices.size(), 2 * i});
        if (!v.values.empty()) members.push_back({v.values.data(), v.values.size(), 2 * i + 1});
    }
    std::vector<std::size_t> order(members.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return members[a].at < members[b].at; });
    constexpr std::uint64_t kMaxGap = 4096;
    DeviceCopy out;
    out.offsets.assign(2 * views.size(), 0);
    std::uint64_t total = 0;
    const std::byte* run_at = nullptr;
    std::uint64_t run_offset = 0;
    const std::byte* run_end = nullptr;
    for (std::size_t k : order) {
        const Member& m = members[k];
        if (run_at == nullptr || m.at < run_end || m.at > run_end + kMaxGap) {
            run_offset = (total + 63) / 64 * 64;
            run_at = m.at;
            run_end = m.at;
        }
        out.offsets[m.slot] = run_offset + static_cast<std::uint64_t>(m.at - run_at);
        run_end = std::max(run_end, m.at + m.bytes);
        total = std::max(total, out.offsets[m.slot] + m.bytes);
    }
    MCS_ASSIGN_OR_RETURN(std::shared_ptr<DeviceArena> arena, ReadArenaLocked(device, total));
    // Whatever the caller queued on the previous views of this allocation runs first.
    MCS_RETURN_IF_ERROR(cuda::StreamSynchronize(stream, device));
    wire::LeasesToDeviceRequest request;
    request.items.reserve(members.size());
    for (std::size_t k : order) {
        const Member& m = members[k];
        request.items.push_back({views[m.slot / 2]->lease_id, m.slot % 2 == 0 ? "indices" : "values",
                                 out.offsets[m.slot]});
    }
    request.destination = wire::CudaLocation(arena->exported, arena->exported.offset, arena->bytes);
    MCS_RETURN_IF_ERROR(Call<wire::OkReply>(request, total));
    out.base = arena->address;
    out.owner = std::move(arena);
    return out;
}

std::vector<Result<CommitResult>> NodeClient::PutSparseObjectsFromDevice(
    std::span<PutSparseRequest> requests, std::span<const DeviceMember> indices,
    std::span<const DeviceMember> values, CudaStream stream) {
    const std::size_t n = requests.size();
    std::vector<Result<CommitResult>> out(n, Internal("unset"));
    if (indices.size() != n || values.size() != n) {
        for (auto& r : out) r = InvalidArgument("one indices and one values array per update");
        return out;
    }
    // The producer's work on the members comes before every copy of them.
    std::vector<int> devices;
    std::vector<bool> rejected(n, false);
    for (std::size_t i = 0; i < n; ++i) {
        if (indices[i].memory.device != values[i].memory.device) {
            rejected[i] = true;
            out[i] = InvalidArgument("indices and values of update " + std::to_string(i) +
                                     " are on different CUDA devices");
            continue;
        }
        const int d = indices[i].memory.device;
        if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    }
    for (int d : devices) {
        if (Status s = cuda::StreamSynchronize(stream, d); !s.ok()) {
            for (auto& r : out) r = s;
            return out;
        }
    }
    // Per device, in chunks.
    for (int d : devices) {
        CommitInChunks(
            requests, [&](std::size_t i) { return !rejected[i] && indices[i].memory.device == d; },
            [&](std::size_t i) { return indices[i].memory.bytes + values[i].memory.bytes + 128; },
            [&](std::span<const std::size_t> chunk) {
                return CommitDeviceChunk(requests, indices, values, chunk, out);
            },
            out);
    }
    NameFailures(requests, out);
    return out;
}

Status NodeClient::CommitDeviceChunk(std::span<PutSparseRequest> requests,
                                     std::span<const DeviceMember> indices,
                                     std::span<const DeviceMember> values,
                                     std::span<const std::size_t> chunk,
                                     std::vector<Result<CommitResult>>& out) {
    // The arena layout: every update's indices, then every update's values (a batch encode
    // lays each member kind out back to back, so) a member whose bytes follow the previous
    // one's in the caller's memory follows it here too, and one copy moves the run; others
    // start 64-byte aligned. The daemon then reads the arena's used span in one copy.
    const int device = indices[chunk.front()].memory.device;
    const std::size_t m = chunk.size();
    const auto mem = [&](std::size_t x) -> const DeviceMemory& {  // x: indices 0..m, values m..2m
        return x < m ? indices[chunk[x]].memory : values[chunk[x - m]].memory;
    };
    std::vector<std::uint64_t> at(2 * m);
    std::uint64_t total = 0;
    for (std::size_t x = 0; x < 2 * m; ++x) {
        const bool follows = x > 0 && mem(x - 1).address + mem(x - 1).bytes == mem(x).address;
        at[x] = follows ? total : (total + 63) / 64 * 64;
        total = at[x] + mem(x).bytes;
    }
    std::lock_guard lock(mu_);
    MCS_RETURN_IF_ERROR(EnsureConnected());
    MCS_ASSIGN_OR_RETURN(const DeviceArena* arena, ArenaLocked(device, std::max<std::uint64_t>(total, 1)));
    const auto gather = std::chrono::steady_clock::now();
    // Device-to-device copies into the arena, runs of adjacent members as one copy.
    for (std::size_t j = 0; j < at.size();) {
        std::size_t end = j + 1;
        std::uint64_t bytes = mem(j).bytes;
        while (end < at.size() && mem(end).address == mem(j).address + bytes &&
               at[end] == at[j] + bytes) {
            bytes += mem(end).bytes;
            ++end;
        }
        MCS_RETURN_IF_ERROR(cuda::MemcpyAsync(reinterpret_cast<void*>(arena->address + at[j]),
                                              reinterpret_cast<const void*>(mem(j).address),
                                              bytes, cuda::CopyKind::kDeviceToDevice,
                                              kCudaPerThreadStream, device));
        j = end;
    }
    MCS_RETURN_IF_ERROR(cuda::StreamSynchronize(kCudaPerThreadStream, device));
    {
        const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - gather;
        std::lock_guard slock(stats_mu_);
        stats_.device_commit_gather_seconds += spent.count();
    }

    // Every member as an offset into the arena's used span, exported once for the request.
    wire::SparseCommitDeviceRequest request;
    const CudaIpcExport& e = arena->exported;
    request.memory = wire::CudaLocation(e, e.offset, total);
    request.items.resize(chunk.size());
    std::uint64_t bytes = 0;
    for (std::size_t k = 0; k < chunk.size(); ++k) {
        // Moved: the caller's requests are not read again but for their tensor_id.
        PutSparseRequest& r = requests[chunk[k]];
        wire::DeviceUpdate& u = request.items[k];
        u.tensor_id = r.tensor_id;
        u.global_shape = std::move(r.global_shape);
        u.global_offset = std::move(r.global_offset);
        u.local_shape = std::move(r.local_shape);
        u.source_placement = std::move(r.source_placement);
        u.policy = std::move(r.placement_policy);
        u.generation = r.generation;
        u.apply = r.apply;
        u.tile_shape = std::move(r.encode.tile_shape);
        u.duplicates = r.encode.duplicates;
        u.hard_pin = r.hard_pin;
        const DeviceMember& mi = indices[chunk[k]];
        const DeviceMember& mv = values[chunk[k]];
        u.indices = {mi.dtype, mi.shape, at[k], mi.memory.bytes};
        u.values = {mv.dtype, mv.shape, at[m + k], mv.memory.bytes};
        bytes += mi.memory.bytes + mv.memory.bytes;
    }
    MCS_ASSIGN_OR_RETURN(auto reply, Call<wire::SparseCommitBatchReply>(request, total));
    if (reply.items.size() != chunk.size()) {
        return DataLoss("the daemon answered " + std::to_string(reply.items.size()) +
                        " items of a batch of " + std::to_string(chunk.size()));
    }
    for (std::size_t k = 0; k < chunk.size(); ++k) {
        wire::SparseCommitOutcome& r = reply.items[k];
        if (r.code != 0) {
            out[chunk[k]] = Status(static_cast<StatusCode>(r.code), std::move(r.message));
        } else {
            out[chunk[k]] = CommitResult{std::move(r.result.source_ref), r.result.created,
                                         r.result.nnz, r.result.bytes};
        }
    }
    std::lock_guard slock(stats_mu_);
    counters_.puts += chunk.size();
    counters_.bytes_put += bytes;
    return Status::Ok();
}

Result<std::vector<TargetObjectView>> NodeClient::ReadViews(
    std::span<const SourceDescriptor> manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options) {
    return ReadSparseObjects(manifest, targets, WireReadOptions(options));
}

Result<std::vector<TargetObjectView>> NodeClient::ReadViews(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options) {
    return ReadSparseObjects(manifest, targets, WireReadOptions(options));
}

Result<std::vector<TargetObjectView>> NodeClient::ReadSealedStepViews(
    Generation step, std::span<const TargetDescriptor> targets, const ReadOptions& options) {
    wire::SparseReadStepRequest request;
    request.step = step;
    request.targets.assign(targets.begin(), targets.end());
    request.options = WireReadOptions(options);
    return CallRead(request, targets);
}

Result<std::vector<TargetObjectView>> NodeClient::ReadPlanned(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options, const PlannedReadFn& build) {
    return ReadPlannedAs(manifest, targets, options, build, /*by_step=*/false);
}

Result<std::vector<TargetObjectView>> NodeClient::ReadPlannedSealedStep(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options, const PlannedReadFn& build) {
    return ReadPlannedAs(manifest, targets, options, build, /*by_step=*/true);
}

Result<std::vector<TargetObjectView>> NodeClient::ReadPlannedAs(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options, const PlannedReadFn& build, bool by_step) {
    if (options.strategy != ReadStrategy::kSparseRanges) {
        return Unimplemented("a planned read reads sparse ranges");
    }
    const bool ipc = CanCommitFromDevice();
    const std::span<const SourceDescriptor> sources = manifest.sources;
    const auto bad = [](const std::string& what) {
        return DataLoss("the node daemon's plan of the read: " + what);
    };

    // The targets in requests of at most options_.planned_read_targets, a tensor's targets
    // together (its ranges are then planned, and copied, once), each request with the sources
    // of its tensors only. One request when the read is that small.
    const std::size_t chunk = std::max<std::size_t>(options_.planned_read_targets, 1);
    std::vector<std::uint32_t> order(targets.size());
    for (std::size_t t = 0; t < order.size(); ++t) order[t] = static_cast<std::uint32_t>(t);
    std::vector<std::vector<std::uint32_t>> chunks;
    std::unordered_map<std::string_view, std::vector<std::uint32_t>> sources_of;
    if (targets.size() <= chunk) {
        chunks.push_back(std::move(order));
    } else {
        std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
            return targets[a].tensor_id < targets[b].tensor_id;
        });
        for (std::size_t k = 0; k < order.size(); ++k) {
            const bool full = chunks.empty() || chunks.back().size() >= chunk;
            const bool same = !chunks.empty() && !chunks.back().empty() &&
                              targets[chunks.back().back()].tensor_id == targets[order[k]].tensor_id;
            if (chunks.empty() || (full && (!same || chunks.back().size() >= 2 * chunk))) {
                chunks.emplace_back();
            }
            chunks.back().push_back(order[k]);
        }
        // Each request lists the sources of its tensors (by step, the daemon has them all).
        for (std::size_t i = 0; i < sources.size() && !by_step; ++i) {
            sources_of[sources[i].tensor_id].push_back(static_cast<std::uint32_t>(i));
        }
    }

    // Every request's plan, merged: sources (leases) and ranges appended, indices of the whole
    // manifest; each target's pieces where its request put them.
    wire::SparseReadPlanReply all;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> pieces_of(targets.size());  // first, count
    std::vector<std::uint32_t> first_source(targets.size(), PlannedRead::kNoSource);
    std::vector<LeaseKeepalive> keepalives;  // the leases go when this call returns
    std::vector<std::array<std::span<const std::byte>, 2>> members;
    std::shared_ptr<Session> session;
    // Ranges the daemon copied as it planned (ReadOptions::stage_on_device): where, and the
    // allocation. If the call fails after the daemon answered and before the build has taken
    // them, the daemon's copies may still run, and the pool's next user would not wait for
    // them: the allocation goes back to the pool once they have run (DeviceStaging::wait_ready),
    // else it is kept out of the pool.
    std::shared_ptr<DeviceArena> staged_arena;
    std::vector<std::uint64_t> staged_at;
    struct StagedGuard {
        std::shared_ptr<DeviceArena> arena;
        std::vector<std::shared_ptr<DeviceArena>>* held = nullptr;
        std::mutex* mu = nullptr;
        const std::function<Status()>* wait_ready = nullptr;
        ~StagedGuard() {
            if (!arena || held == nullptr) return;
            if (wait_ready != nullptr && *wait_ready) {
                const Status waited = (*wait_ready)();
                if (waited.ok()) return;
                MCS_LOG(kWarning) << "a failed device read could not wait for the node daemon's "
                                     "copies ("
                                  << waited.ToString() << "): its allocation is not reused";
            }
            std::lock_guard lock(*mu);
            held->push_back(std::move(arena));
        }
    } staged_guard;
    staged_guard.mu = &mu_;
    if (options.stage_on_device) staged_guard.wait_ready = &options.stage_on_device->wait_ready;
    {
        std::unique_lock lock(mu_);
        MCS_RETURN_IF_ERROR(EnsureConnected());
        session = session_;
        for (const std::vector<std::uint32_t>& c : chunks) {
            wire::SparseReadPlanRequest request;
            request.step = manifest.generation;
            request.options = WireReadOptions(options);
            std::vector<std::uint32_t> manifest_of;  // request's manifest index -> manifest's
            if (by_step) {
                request.sealed_entries = sources.size();  // indices are of the whole manifest
            } else if (chunks.size() == 1) {
                request.manifest.assign(sources.begin(), sources.end());
                request.unchanged.assign(manifest.unchanged.begin(), manifest.unchanged.end());
            } else {
                std::vector<std::string_view> tensors;
                for (std::uint32_t t : c) {
                    if (tensors.empty() || tensors.back() != targets[t].tensor_id) {
                        tensors.push_back(targets[t].tensor_id);
                    }
                }
                for (std::string_view id : tensors) {
                    if (auto it = sources_of.find(id); it != sources_of.end()) {
                        for (std::uint32_t i : it->second) {
                            request.manifest.push_back(sources[i]);
                            manifest_of.push_back(i);
                        }
                    }
                    if (std::binary_search(manifest.unchanged.begin(), manifest.unchanged.end(), id)) {
                        request.unchanged.emplace_back(id);
                    }
                }
            }
            // The daemon keeps the targets for this connection: a reader's next reads of the
            // same targets name them by id (the sets as the daemon keeps them, least recently
            // used dropped first; one it dropped anyway is sent again).
            if (kept_epoch_ != epoch_) {
                kept_targets_.clear();
                kept_epoch_ = epoch_;
            }
            const auto same = [&](const KeptTargets& k) {
                if (k.targets.size() != c.size()) return false;
                for (std::size_t j = 0; j < c.size(); ++j) {
                    if (!(k.targets[j] == targets[c[j]])) return false;
                }
                return true;
            };
            auto kept = std::find_if(kept_targets_.begin(), kept_targets_.end(), same);
            const auto send_targets = [&] {
                request.target_set = next_target_set_++;
                request.targets.reserve(c.size());
                for (std::uint32_t t : c) request.targets.push_back(targets[t]);
            };
            if (kept != kept_targets_.end()) {
                request.target_set = kept->id;
                kept->last_use = ++kept_clock_;
            } else {
                send_targets();
            }
            // A read planned in one request may have its ranges copied to the caller's device
            // as the daemon plans them, into a free allocation of the read pool (none free, as
            // on a first read: the copy request below allocates one, for the next reads).
            if (options.stage_on_device && ipc && chunks.size() == 1) {
                const ReadOptions::DeviceStaging& st = *options.stage_on_device;
                staged_arena = FreeReadArenaLocked(st.device);
                if (staged_arena) {
                    if (!st.stream_waited) {
                        MCS_RETURN_IF_ERROR(cuda::StreamSynchronize(st.stream, st.device));
                    }
                    wire::PlanToDevice& to = request.to_device.emplace();
                    to.destination = wire::CudaLocation(staged_arena->exported,
                                                        staged_arena->exported.offset,
                                                        staged_arena->bytes);
                    to.ready_event.assign(reinterpret_cast<const char*>(st.ready_event.data()),
                                          st.ready_event.size());
                }
            }
            Result<wire::SparseReadPlanReply> called = Call<wire::SparseReadPlanReply>(request);
            if (!called.ok() && called.status().code() == StatusCode::kNotFound &&
                request.targets.empty() && session_ == session) {
                kept_targets_.erase(kept);
                kept = kept_targets_.end();
                send_targets();
                called = Call<wire::SparseReadPlanReply>(request);
            }
            MCS_RETURN_IF_ERROR(called.status());
            wire::SparseReadPlanReply reply = std::move(called).value();
            if (!reply.staged_at.empty()) {
                // The daemon may still be copying into the allocation: it stays out of the
                // pool until the caller's work has waited for the copies (the build's).
                staged_guard.arena = staged_arena;
                staged_guard.held = &held_read_arenas_;
                if (!request.to_device || reply.staged_at.size() != 2 * reply.ranges.size()) {
                    return bad("ranges staged where none were asked for, or not one offset per "
                               "range member");
                }
                for (std::size_t r = 0; r < reply.ranges.size(); ++r) {
                    const wire::PlannedRange& pr = reply.ranges[r];
                    if (!RangeWithin(reply.staged_at[2 * r], pr.indices_bytes, staged_arena->bytes) ||
                        !RangeWithin(reply.staged_at[2 * r + 1], pr.values_bytes,
                                     staged_arena->bytes)) {
                        return bad("range " + std::to_string(r) + " staged past the allocation");
                    }
                }
                staged_at = std::move(reply.staged_at);
            }
            if (session_ != session) {
                return Unavailable("the connection to the node daemon was lost during the read");
            }
            if (!request.targets.empty()) {
                // Kept as the daemon keeps them: the least recently used sets make room.
                wire::MakeRoomForKeptTargets(kept_targets_, c.size());
                kept_targets_.push_back(
                    {*request.target_set, std::move(request.targets), ++kept_clock_});
                request.targets.clear();
            }
            for (const wire::PlannedSource& ps : reply.sources) {
                keepalives.push_back(MakeKeepalive(ps.lease_id, ps.indices.segment_id));
            }
            const auto to_manifest = [&](std::uint32_t i) -> std::optional<std::uint32_t> {
                if (i >= (by_step ? sources.size() : request.manifest.size())) return std::nullopt;
                return manifest_of.empty() ? i : manifest_of[i];
            };
            if (reply.targets.size() != c.size()) {
                return bad(std::to_string(reply.targets.size()) + " targets for " +
                           std::to_string(c.size()));
            }
            const std::uint32_t source_base = static_cast<std::uint32_t>(all.sources.size());
            const std::uint32_t range_base = static_cast<std::uint32_t>(all.ranges.size());
            for (const wire::PlannedSource& ps : reply.sources) {
                members.emplace_back();
                MCS_ASSIGN_OR_RETURN(members.back()[0], View(ps.indices));
                MCS_ASSIGN_OR_RETURN(members.back()[1], View(ps.values));
                all.sources.push_back(ps);
            }
            for (std::size_t r = 0; r < reply.ranges.size(); ++r) {
                wire::PlannedRange pr = reply.ranges[r];
                const std::optional<std::uint32_t> m = to_manifest(pr.manifest_index);
                if (pr.source >= reply.sources.size() || !m) {
                    return bad("range " + std::to_string(r) + " names no source");
                }
                pr.source += source_base;
                pr.manifest_index = *m;
                all.ranges.push_back(pr);
            }
            std::uint64_t k = all.pieces.size();
            for (const wire::PlannedPiece& p : reply.pieces) {
                all.pieces.push_back(p);
                if (p.range >= reply.ranges.size()) {
                    return bad("piece " + std::to_string(all.pieces.size() - 1) + " names no range");
                }
                all.pieces.back().range += range_base;
            }
            for (std::size_t j = 0; j < c.size(); ++j) {
                const wire::PlannedTarget& wt = reply.targets[j];
                if (wt.pieces > all.pieces.size() - k) {
                    return bad("target " + targets[c[j]].target_id + " has pieces past the reply's");
                }
                pieces_of[c[j]] = {k, wt.pieces};
                k += wt.pieces;
                if (wt.first_source != PlannedRead::kNoSource) {
                    const std::optional<std::uint32_t> m = to_manifest(wt.first_source);
                    if (!m) return bad("target " + targets[c[j]].target_id + " names no source");
                    first_source[c[j]] = *m;
                }
            }
            if (k != all.pieces.size()) return bad("pieces of no target");
        }
    }

    PlannedRead read;
    read.manifest = sources;
    read.targets = targets;
    // Every range inside its source's members and whole entries of its manifest source; every
    // piece inside its range.
    std::vector<std::uint64_t> entries(all.ranges.size());
    read.ranges.reserve(all.ranges.size());
    for (std::size_t r = 0; r < all.ranges.size(); ++r) {
        const wire::PlannedRange& pr = all.ranges[r];
        const auto& m = members[pr.source];
        if (!RangeWithin(pr.indices_offset, pr.indices_bytes, m[0].size()) ||
            !RangeWithin(pr.values_offset, pr.values_bytes, m[1].size())) {
            return bad("range " + std::to_string(r) + " lies outside its source");
        }
        const SourceDescriptor& d = sources[pr.manifest_index];
        const std::uint64_t value_size = DTypeSize(d.value_dtype);
        const std::uint64_t index_row = d.rank() * DTypeSize(d.index_dtype);
        entries[r] = pr.values_bytes / value_size;
        if (pr.values_bytes % value_size != 0 || pr.indices_bytes != entries[r] * index_row) {
            return bad("range " + std::to_string(r) + " is not whole entries of " + d.source_ref);
        }
        read.ranges.push_back({m[0].subspan(pr.indices_offset, pr.indices_bytes),
                               m[1].subspan(pr.values_offset, pr.values_bytes),
                               pr.manifest_index, false});
    }
    std::vector<SourceDescriptor> descs(targets.size());
    read.per_target.resize(targets.size());
    read.pieces.reserve(all.pieces.size());
    for (std::size_t t = 0; t < targets.size(); ++t) {
        PlannedRead::Target& pt = read.per_target[t];
        pt.first_source = first_source[t];
        const SourceDescriptor* first =
            pt.first_source == PlannedRead::kNoSource ? nullptr : &sources[pt.first_source];
        MCS_ASSIGN_OR_RETURN(descs[t],
                             PlannedTargetDescriptor(targets[t], first, manifest.generation));
        pt.index_dtype = descs[t].index_dtype;
        pt.value_dtype = descs[t].value_dtype;
        pt.first_piece = read.pieces.size();
        const auto [begin, count] = pieces_of[t];
        for (std::uint64_t k = begin; k < begin + count; ++k) {
            const wire::PlannedPiece& p = all.pieces[k];
            if (!RangeWithin(p.begin, p.count, entries[p.range]) ||
                (p.overlap && p.overlap->rank() != targets[t].box.rank())) {
                return bad("piece " + std::to_string(k) + " lies outside its range");
            }
            read.pieces.push_back({p.range, p.begin, p.count, p.overlap.has_value(),
                                   p.overlap.value_or(Box{})});
            pt.capacity += p.count;
        }
        pt.end_piece = read.pieces.size();
    }
    if (ipc) {
        read.ranges_to_device = [&](std::span<const std::uint64_t> at, std::uint64_t total,
                                    int device, std::uintptr_t stream,
                                    std::span<const std::byte> ready_event, bool stream_waited)
            -> Result<PlannedRead::DeviceRanges> {
            if (at.size() != 2 * all.ranges.size()) {
                return InvalidArgument("one offset per range member");
            }
            // The daemon takes the items in destination order: those laid out as they lie in
            // its segments (LayOutStaging) move as one copy.
            wire::LeaseRangesToDeviceRequest copy;
            copy.items.reserve(at.size());
            for (int k = 0; k < 2; ++k) {
                for (std::size_t r = 0; r < all.ranges.size(); ++r) {
                    const wire::PlannedRange& pr = all.ranges[r];
                    const wire::PlannedSource& ps = all.sources[pr.source];
                    const std::uint64_t bytes = k == 0 ? pr.indices_bytes : pr.values_bytes;
                    if (bytes == 0) continue;
                    copy.items.push_back({ps.lease_id, k == 0 ? ps.indices_member : ps.values_member,
                                          k == 0 ? pr.indices_offset : pr.values_offset, bytes,
                                          at[2 * r + k]});
                }
            }
            std::lock_guard guard(mu_);
            if (session_ != session) {
                return Unavailable("the connection to the node daemon was lost during the read");
            }
            MCS_ASSIGN_OR_RETURN(std::shared_ptr<DeviceArena> arena,
                                 ReadArenaLocked(device, std::max<std::uint64_t>(total, 1)));
            // Whatever the caller queued on this allocation's previous use runs first.
            if (!stream_waited) MCS_RETURN_IF_ERROR(cuda::StreamSynchronize(stream, device));
            copy.destination =
                wire::CudaLocation(arena->exported, arena->exported.offset, arena->bytes);
            copy.ready_event.assign(reinterpret_cast<const char*>(ready_event.data()),
                                    ready_event.size());
            MCS_RETURN_IF_ERROR(Call<wire::OkReply>(copy, total));
            return PlannedRead::DeviceRanges{arena->address, std::move(arena), ready_event.empty()};
        };
    }
    if (!staged_at.empty()) {
        read.staged = PlannedRead::DeviceRanges{staged_arena->address, staged_arena,
                                                options.stage_on_device->ready_event.empty()};
        read.staged_at = std::move(staged_at);
        staged_guard.arena.reset();  // the build waits for the copies before anything else
    }
    read.kept.assign(targets.size(), 0);
    MCS_RETURN_IF_ERROR(build(read));
    return PlannedTargetViews(read, std::move(descs));
}

Result<StoreCounters> NodeClient::ObjectCounters() {
    MCS_ASSIGN_OR_RETURN(MetricItems items, Metrics(/*reset=*/false));
    StoreCounters c;
    std::pair<std::string_view, std::uint64_t*> fields[] = {
        {"store_puts", &c.puts},
        {"store_bytes_put", &c.bytes_put},
        {"store_member_gets", &c.member_gets},
        {"store_member_bytes", &c.member_bytes},
        {"store_range_reads", &c.range_reads},
        {"store_range_bytes", &c.range_bytes},
        {"store_removes", &c.removes},
    };
    for (const auto& [name, value] : items) {
        for (auto& [field, out] : fields) {
            if (name == field) *out = static_cast<std::uint64_t>(value);
        }
    }
    return c;
}

Result<std::vector<std::string>> NodeClient::ListKeys(std::string_view prefix) {
    return List(prefix);
}

std::unique_ptr<TensorStore> NodeClient::MakeTensorStore(const LocalTensorStoreOptions&) {
    return MakeNodeTensorStore(shared_from_this());
}

}  // namespace mooncake::sparse
