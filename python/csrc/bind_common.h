// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Argument conversions of the store bindings (bind_store.cc: `_Store`, bind_sparse.cc: the
// functions beside it).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "executor/sparse_store.h"

namespace mooncake::sparse::py {

/// Nanoseconds of a steady-clock interval, and since `t0`: for the binding's time counters.
inline std::uint64_t Nanos(std::chrono::steady_clock::duration d) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}
inline std::uint64_t NanosSince(std::chrono::steady_clock::time_point t0) {
    return Nanos(std::chrono::steady_clock::now() - t0);
}

/// Python's cyclic garbage collector paused while a call builds one object per item of a batch
/// (a step's result dicts: tens of thousands of containers, each of which counts towards the
/// next collection, and a collection of the older generations walks every object the caller
/// holds, such as the step's updates). Restored as it was; the next allocation after it runs
/// the one young collection those objects are due. Needs the GIL. Python >= 3.10 (before, a
/// no-op).
class GcPause {
public:
#if PY_VERSION_HEX >= 0x030A0000
    GcPause() : was_enabled_(PyGC_Disable() != 0) {}
    ~GcPause() {
        if (was_enabled_) PyGC_Enable();
    }
#else
    GcPause() = default;
#endif
    GcPause(const GcPause&) = delete;
    GcPause& operator=(const GcPause&) = delete;

private:
    [[maybe_unused]] bool was_enabled_ = false;
};

NamedAxes AxesFromDict(const pyb::handle& obj, const char* what);
pyb::dict AxesToDict(const NamedAxes& axes);
Shape ShapeArg(const pyb::handle& obj, const char* what);
std::optional<Shape> OptShape(const pyb::handle& obj, const char* what);
pyb::tuple ShapeTuple(std::span<const Index> s);
/// A TargetDescriptor from any object with the attributes of mcs.Target.
TargetDescriptor TargetFrom(const pyb::handle& obj);
std::vector<TargetDescriptor> TargetsFrom(const pyb::iterable& targets);

/// Targets converted once (mooncake.sparse.TargetBatch): a reader's targets are the same at
/// every step, so it converts them once instead of at every read of every step.
struct TargetBatch {
    std::vector<TargetDescriptor> targets;
};
/// The targets of a read: a TargetBatch's, viewed (and kept alive), or any iterable of Target,
/// converted.
struct TargetsArg {
    std::span<const TargetDescriptor> targets;
    std::shared_ptr<const TargetBatch> batch;
    std::vector<TargetDescriptor> converted;
};
TargetsArg TargetsArgFrom(const pyb::handle& targets);

/// A C-contiguous array in CUDA memory given as indices or values of a commit: it reaches the
/// request as host bytes once StageDeviceMembers has copied it.
struct DeviceMember {
    DType dtype = DType::kUInt8;
    Shape shape;
    std::uintptr_t address = 0;
    int device = 0;
    std::uint64_t bytes = 0;
    std::shared_ptr<void> keepalive;
};

/// Whether `obj` is an array in CUDA memory (a DLPack producer on a CUDA device).
bool IsCudaArray(const pyb::handle& obj);

/// put_sparse_object's arguments as a request; the borrowed arrays stay alive with it. A CUDA
/// member is left out of the request (its HostArray empty) until StageDeviceMembers.
struct ParsedPut {
    PutSparseRequest request;
    BorrowedArray indices;
    BorrowedArray values;
    std::optional<DeviceMember> device_indices;
    std::optional<DeviceMember> device_values;

    bool on_device() const { return device_indices || device_values; }
};

/// Copies the CUDA members of `puts` into one page-locked staging buffer, in a few large
/// device-to-host copies (members laid out back to back on the device, as a batch encode leaves
/// them, move as one), ordered on `stream`, and points their requests at it. The returned
/// handle keeps the staging buffer (held exclusively) until it is destroyed: commit before.
/// Throws StatusError: Unimplemented (built without the GPU codec); Unavailable / Internal
/// (CUDA errors); ResourceExhausted (cannot pin the staging memory).
std::shared_ptr<void> StageDeviceMembers(std::span<ParsedPut* const> puts, std::uintptr_t stream);

/// put_sparse_objects of a batch whose members all lie on one GPU, on a store that fills its
/// objects in place (the embedded store), without a staging copy: every update the sorted fast
/// path takes (rank 2, canonical order, ...) is checked, indexed and checksummed on the GPU in
/// one batch (cuda::IndexCanonicalBatch), and the commit (SparseService::PutIndexedObjects)
/// copies its entries from the device straight into the store's memory, ordered on `stream`;
/// the other updates (those the GPU finds not canonical included) are staged and encoded on the
/// host as PutSparseObjects encodes them, and join the same commit. Returns one result per
/// update of `puts`, in order, the same as PutSparseObjects(requests of `puts`) returns; or
/// nullopt, having committed nothing, where this path does not apply (built without the GPU
/// codec, another store, a member in host memory, several devices, two generations of one
/// tensor, no update the GPU could take) or the store refused the batch as a whole: the caller
/// then commits through StageDeviceMembers and PutSparseObjects. Call with the GIL held.
/// Throws StatusError: as StageDeviceMembers.
std::optional<std::vector<Result<CommitResult>>> CommitDeviceBatch(
    SparseService& service, std::span<ParsedPut* const> puts, int num_threads,
    std::uintptr_t stream);
ParsedPut ParsePut(const std::string& tensor_id, const pyb::object& global_shape,
                   const pyb::object& indices, const pyb::object& values,
                   const pyb::object& source_placement,
                   const std::optional<std::string>& placement_policy,
                   std::pair<std::uint64_t, std::uint64_t> generation, const std::string& apply,
                   const pyb::object& tile_shape, const std::string& duplicates,
                   const pyb::object& global_offset, const pyb::object& local_shape,
                   bool hard_pin, int num_threads);

/// {"source_ref", "created", "nnz", "bytes"}.
pyb::dict CommitDict(const std::string& source_ref, bool created, std::uint64_t nnz,
                     std::uint64_t bytes);

/// read_sparse_objects' options ("sparse" | "full_source").
ReadOptions ParseReadOptions(const std::string& strategy, std::int64_t read_coalesce_gap,
                             int num_threads);

/// Metric items as a dict: counters as int, *_seconds as float.
pyb::dict MetricsDict(const std::vector<std::pair<std::string, double>>& items);

/// (base, delta) or None.
pyb::object GenerationOrNone(const std::optional<Generation>& g);

/// A step manifest as Python gets it: (sources, unchanged tensor ids, sealed).
/// `array` (when not null) receives the array its SourceInfo view.
pyb::tuple StepManifestTuple(StepManifest m,
                             std::shared_ptr<const std::vector<SourceDescriptor>>* array = nullptr);
/// Sources as a list of SourceInfo: views of one shared array, in its order (what
/// ManifestFrom passes to a read as it lies).
/// `array` (when not null) receives the array its SourceInfo view.
pyb::list SourcesList(std::vector<SourceDescriptor> sources,
                      std::shared_ptr<const std::vector<SourceDescriptor>>* array = nullptr);
/// The same of an array that is shared already (a store's kept manifest of a sealed step):
/// viewed, not copied.
pyb::list SourcesList(std::shared_ptr<const std::vector<SourceDescriptor>> all);

/// The sources of a read. A list of SourceInfo that views one array of SourcesList, in its
/// order (a step's manifest as the store gave it, or a slice of it), is read where it lies;
/// any other list (filtered, reordered, joined) is copied.
struct ManifestArg {
    std::span<const SourceDescriptor> sources;
    std::shared_ptr<const void> owner;     ///< Keeps a viewed array alive.
    std::vector<SourceDescriptor> copied;  ///< Otherwise the copy `sources` views.
};
ManifestArg ManifestFrom(const pyb::list& sources);

}  // namespace mooncake::sparse::py
