// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The metadata schema of a sparse object: the `mooncake.sparse_object` v1 JSON of
// docs/design.md §2, written at commit and read back by every reader of the object.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "codec/codec.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

/// Metadata JSON of a sparse object (docs/design.md §2 fields).
std::string EncodeObjectMetadata(const SparseObject& object);

/// The member checksums a sparse object's metadata names.
struct MemberChecksums {
    std::uint64_t indices = 0;
    std::uint64_t values = 0;
    std::uint64_t tile_coords = 0;
    std::uint64_t tile_ptr = 0;
};

/// Whether `text` is, byte for byte, the metadata EncodeObjectMetadata writes for an object of
/// descriptor `d` (source_ref aside), coordinate space and member checksums: then decoding it
/// gives `d`. A reader holding a manifest entry so checks the stored object's metadata without
/// decoding it (several times cheaper, and no allocation); false only means "decode and
/// compare" (a text another writer formatted otherwise, or another object).
bool IsMetadataOf(std::string_view text, const SourceDescriptor& d,
                  std::string_view coordinate_space, const MemberChecksums& checksums);

/// The descriptor of the object `source_ref` from its metadata JSON.
/// Errors: InvalidArgument (not JSON, a missing or mistyped field, another schema or version,
/// a descriptor that SourceDescriptor::Make rejects).
Result<SourceDescriptor> DecodeObjectMetadata(std::string_view source_ref, std::string_view json);

}  // namespace mooncake::sparse
