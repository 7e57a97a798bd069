// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The views of SparseService, and SparseStore's side of it beyond the operations SparseStore
// had already (sparse_store.h).
#include "executor/sparse_service.h"

#include "executor/sparse_store.h"
#include "executor/tensor_store.h"

namespace mooncake::sparse {
namespace {

template <typename T>
std::span<const std::byte> AsBytes(const std::vector<T>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

std::vector<TargetObjectView> OwningViews(std::vector<TargetObject>&& objects) {
    std::vector<TargetObjectView> out;
    out.reserve(objects.size());
    for (TargetObject& o : objects) out.push_back(TargetObjectView::Owning(std::move(o)));
    return out;
}

}  // namespace

std::vector<Result<CommitResult>> SparseService::PutSparseObjects(
    std::span<const PutSparseRequest> requests, int /*num_threads*/) {
    std::vector<Result<CommitResult>> out;
    out.reserve(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
        Result<CommitResult> r = PutSparseObject(requests[i]);
        if (!r.ok()) {
            r = r.status().WithContext("update " + std::to_string(i) + " ('" +
                                       requests[i].tensor_id + "')");
        }
        out.push_back(std::move(r));
    }
    return out;
}

TargetObjectView TargetObjectView::Owning(TargetObject&& object) {
    // The keepalive holds the member bytes only (their buffers move, the bytes stay where they
    // are); the ids, box and descriptor move into the view.
    struct Members {
        ByteBuffer indices;
        ByteBuffer values;
        std::vector<TileCoord> tile_coords;
        std::vector<std::uint64_t> tile_ptr;
    };
    SparseObject& o = object.object;
    auto owned = std::make_shared<const Members>(Members{std::move(o.indices), std::move(o.values),
                                                         std::move(o.tile_coords),
                                                         std::move(o.tile_ptr)});
    TargetObjectView view;
    view.target_id = std::move(object.target_id);
    view.node_id = std::move(object.node_id);
    view.target_box = std::move(object.target_box);
    view.desc = std::move(o.desc);
    view.coordinate_space = std::move(o.coordinate_space);
    view.indices = owned->indices;
    view.values = owned->values;
    view.tile_coords = AsBytes(owned->tile_coords);
    view.tile_ptr = AsBytes(owned->tile_ptr);
    view.checksum_indices = o.checksum_indices;
    view.checksum_values = o.checksum_values;
    view.checksum_tile_coords = o.checksum_tile_coords;
    view.checksum_tile_ptr = o.checksum_tile_ptr;
    view.keepalive = std::move(owned);
    return view;
}

Result<std::vector<TargetObjectView>> SparseStore::ReadViews(
    std::span<const SourceDescriptor> manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options) {
    MCS_ASSIGN_OR_RETURN(std::vector<TargetObject> objects,
                         ReadSparseObjects(manifest, targets, options));
    return OwningViews(std::move(objects));
}

Result<std::vector<TargetObjectView>> SparseStore::ReadViews(
    const StepManifestView& manifest, std::span<const TargetDescriptor> targets,
    const ReadOptions& options) {
    MCS_ASSIGN_OR_RETURN(std::vector<TargetObject> objects,
                         ReadSparseObjects(manifest, targets, options));
    return OwningViews(std::move(objects));
}

Result<StoreCounters> SparseStore::ObjectCounters() { return store_->Counters(); }

Result<std::vector<std::string>> SparseStore::ListKeys(std::string_view prefix) {
    return store_->List(prefix);
}

std::unique_ptr<TensorStore> SparseStore::MakeTensorStore(const LocalTensorStoreOptions& options) {
    return MakeLocalTensorStore(store_, options);
}

}  // namespace mooncake::sparse
