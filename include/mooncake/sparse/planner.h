// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The address-free sparse planner (docs/design.md §4 steps 1, 2, 4 and 5): placement filtering and
// box intersection from the manifest alone, entry-range planning on a source's compact tile
// index, and batch planning of a whole target set with dedup per node. It reads no payload and
// never scans nnz: a query costs O(log R + groups * log C + K) on the 2-D path.
//
// One header per concept; this one includes them all:
//   tile_index.h        TileIndex and its queries; PlanningLimits, QueryStats.
//   manifest_index.h    ManifestIndex: a manifest's sources by tensor_id.
//   source_selection.h  SelectSources (steps 1-2): which sources each target reads.
//   batch_plan.h        PlanBatch and Plan (steps 4-5): regions and deduplicated reads.
// internal/ holds what they share and no caller needs.
#pragma once

#include "mooncake/sparse/batch_plan.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/manifest_index.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/source_selection.h"
#include "mooncake/sparse/status.h"
#include "mooncake/sparse/tile_index.h"
