// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Argument conversions of the store bindings (bind_store.cc: `_Store`, bind_sparse.cc: the
// functions beside it).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "executor/sparse_store.h"

namespace mooncake::sparse::py {

NamedAxes AxesFromDict(const pyb::handle& obj, const char* what);
pyb::dict AxesToDict(const NamedAxes& axes);
Shape ShapeArg(const pyb::handle& obj, const char* what);
std::optional<Shape> OptShape(const pyb::handle& obj, const char* what);
pyb::tuple ShapeTuple(std::span<const Index> s);
/// A TargetDescriptor from any object with the attributes of mcs.Target.
TargetDescriptor TargetFrom(const pyb::handle& obj);
std::vector<TargetDescriptor> TargetsFrom(const pyb::iterable& targets);

/// put_sparse_object's arguments as a request; the borrowed arrays stay alive with it.
struct ParsedPut {
    PutSparseRequest request;
    BorrowedArray indices;
    BorrowedArray values;
};
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
pyb::tuple StepManifestTuple(StepManifest m);
/// The StepManifest of a Python Manifest's parts.
StepManifest StepManifestFrom(const std::vector<SourceDescriptor>& sources,
                              std::pair<std::uint64_t, std::uint64_t> generation,
                              const std::vector<std::string>& unchanged);

}  // namespace mooncake::sparse::py
