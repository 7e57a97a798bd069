// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The metadata schema of a sparse object: the `mooncake.sparse_object` v1 JSON of
// docs/design.md §2, written at commit and read back by every reader of the object.
#pragma once

#include <string>
#include <string_view>

#include "codec/codec.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// Metadata JSON of a sparse object (docs/design.md §2 fields).
std::string EncodeObjectMetadata(const SparseObject& object);

/// The descriptor of the object `source_ref` from its metadata JSON.
/// Errors: InvalidArgument (not JSON, a missing or mistyped field, another schema or version,
/// a descriptor that SourceDescriptor::Make rejects).
Result<SourceDescriptor> DecodeObjectMetadata(std::string_view source_ref, std::string_view json);

}  // namespace mooncake::sparse
