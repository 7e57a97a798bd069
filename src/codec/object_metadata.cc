// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.

// GCC 12 reports a false -Wrestrict inside std::string operator+ inlined from contracts.h
// (Generation::ToString, via SourceDescriptor::Make); GCC bug 105329. The
// diagnostic is located in <string>, so this must come before any include.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include "codec/object_metadata.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

namespace mooncake::sparse {
namespace {

using Json = nlohmann::json;

Json ShapeJson(std::span<const Index> v) { return Json(std::vector<Index>(v.begin(), v.end())); }

Result<Shape> ShapeFromJson(const Json& j, std::string_view what) {
    if (!j.is_array()) return InvalidArgument(std::string(what) + " is not an array");
    Shape s;
    for (const auto& e : j) {
        if (!e.is_number_integer()) {
            return InvalidArgument(std::string(what) + " has a non-integer");
        }
        s.push_back(e.get<Index>());
    }
    return s;
}

}  // namespace

std::string EncodeObjectMetadata(const SparseObject& o) {
    const SourceDescriptor& d = o.desc;
    Json placement = Json::object();
    for (const auto& [axis, ordinal] : d.placement.entries()) placement[axis] = ordinal;
    Json j = {
        {"schema", std::string(kSparseObjectSchema)},
        {"version", kSparseObjectVersion},
        {"tensor_id", d.tensor_id},
        {"global_shape", d.global_shape},
        {"global_offset", ShapeJson(d.box.origin())},
        {"local_shape", ShapeJson(d.box.shape())},
        {"coordinate_space", o.coordinate_space},
        {"base_generation", d.generation.base},
        {"delta_generation", d.generation.delta},
        {"source_placement", placement},
        {"placement_policy", d.policy.ToString()},
        {"tile_shape", d.tile_shape},
        {"nnz", d.nnz},
        {"num_tiles", d.num_tiles},
        {"apply", std::string(ApplyModeName(d.apply))},
        {"index_dtype", std::string(DTypeName(d.index_dtype))},
        {"value_dtype", std::string(DTypeName(d.value_dtype))},
        {"members",
         {{"indices",
           {{"dtype", std::string(DTypeName(d.index_dtype))},
            {"shape", {d.nnz, d.rank()}},
            {"checksum", o.checksum_indices}}},
          {"values",
           {{"dtype", std::string(DTypeName(d.value_dtype))},
            {"shape", {d.nnz}},
            {"checksum", o.checksum_values}}},
          {"tile_coords",
           {{"dtype", "uint32"},
            {"shape", {d.num_tiles, d.rank()}},
            {"checksum", o.checksum_tile_coords}}},
          {"tile_ptr",
           {{"dtype", "uint64"},
            {"shape", {d.num_tiles + 1}},
            {"checksum", o.checksum_tile_ptr}}}}},
    };
    return j.dump();
}

Result<SourceDescriptor> DecodeObjectMetadata(std::string_view source_ref, std::string_view text) {
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
        return InvalidArgument("metadata of " + std::string(source_ref) + " is not a JSON object");
    }
    auto field = [&](const char* name) -> const Json* {
        auto it = j.find(name);
        return it == j.end() ? nullptr : &*it;
    };
    for (const char* name : {"schema", "version", "tensor_id", "global_shape", "global_offset",
                             "local_shape", "base_generation", "delta_generation",
                             "source_placement", "placement_policy", "tile_shape", "nnz",
                             "num_tiles", "apply", "index_dtype", "value_dtype"}) {
        if (!field(name)) {
            return InvalidArgument("metadata of " + std::string(source_ref) + " lacks '" + name +
                                   "'");
        }
    }
    if (!j["schema"].is_string() || j["schema"].get<std::string>() != kSparseObjectSchema ||
        !j["version"].is_number_integer() || j["version"].get<int>() != kSparseObjectVersion) {
        return InvalidArgument(std::string(source_ref) + " is not a mooncake.sparse_object v1");
    }
    try {
        SourceDescriptor d;
        d.source_ref = std::string(source_ref);
        d.tensor_id = j["tensor_id"].get<std::string>();
        MCS_ASSIGN_OR_RETURN(d.global_shape, ShapeFromJson(j["global_shape"], "global_shape"));
        MCS_ASSIGN_OR_RETURN(Shape offset, ShapeFromJson(j["global_offset"], "global_offset"));
        MCS_ASSIGN_OR_RETURN(Shape local, ShapeFromJson(j["local_shape"], "local_shape"));
        MCS_ASSIGN_OR_RETURN(d.box, Box::Make(offset, local));
        d.generation = {j["base_generation"].get<std::uint64_t>(),
                        j["delta_generation"].get<std::uint64_t>()};
        std::vector<NamedAxes::Entry> axes;
        for (auto& [k, v] : j["source_placement"].items()) {
            axes.emplace_back(k, v.get<std::int64_t>());
        }
        MCS_ASSIGN_OR_RETURN(d.placement, NamedAxes::Make(std::move(axes)));
        MCS_ASSIGN_OR_RETURN(d.policy,
                             PlacementPolicy::Parse(j["placement_policy"].get<std::string>()));
        MCS_ASSIGN_OR_RETURN(d.tile_shape, ShapeFromJson(j["tile_shape"], "tile_shape"));
        d.nnz = j["nnz"].get<std::uint64_t>();
        d.num_tiles = j["num_tiles"].get<std::uint64_t>();
        MCS_ASSIGN_OR_RETURN(d.apply, ParseApplyMode(j["apply"].get<std::string>()));
        MCS_ASSIGN_OR_RETURN(d.index_dtype, ParseDType(j["index_dtype"].get<std::string>()));
        MCS_ASSIGN_OR_RETURN(d.value_dtype, ParseDType(j["value_dtype"].get<std::string>()));
        return SourceDescriptor::Make(std::move(d));
    } catch (const Json::exception& e) {
        return InvalidArgument("metadata of " + std::string(source_ref) + ": " + e.what());
    }
}

}  // namespace mooncake::sparse
