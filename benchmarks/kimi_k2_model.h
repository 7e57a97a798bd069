// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The Kimi-K2-shaped model of the benchmarks (mooncake_sparse_plan, node_scale_bench): its
// tensor list, the trainer's source placement of each tensor, and the targets of one inference
// node (EP8, or EP4 x TP2) that together hold the whole model. Planner types only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse::kimi_k2 {

inline constexpr int kExperts = 384;
inline constexpr int kTrainingEp = 8;
inline constexpr int kRanksPerNode = 8;
inline constexpr std::uint64_t kEntryBytesBf16Uint16 = 6;  // 2 x uint16 coordinates + bf16 value.

/// How a tensor is split across tensor parallel ranks.
enum class TpSplit {
    kWhole,  ///< Small replicated tensors (q_a, kv_a): every TP rank takes the whole tensor.
    kDim0,   ///< Column parallel (w1, w3, q_b, kv_b): halves of dim 0.
    kDim1,   ///< Row parallel (w2, o): halves of dim 1.
};

struct TensorSpec {
    std::string id;
    Shape shape;
    int expert = -1;  ///< >= 0: a routed expert (owner(expert)); else replicate(ep).
    TpSplit split = TpSplit::kWhole;
};

namespace detail {
template <typename T>
T OrDie(Result<T> r, std::string_view what) {
    if (!r.ok()) {
        std::fprintf(stderr, "kimi_k2 model: %.*s: %s\n", int(what.size()), what.data(),
                     r.status().ToString().c_str());
        std::exit(1);
    }
    return std::move(r).value();
}
}  // namespace detail

/// Layer 0 is dense (MLA attention + a dense MLP); layers 1..N-1 are MoE (MLA attention, a
/// shared expert and kExperts routed experts of three matrices each).
inline std::vector<TensorSpec> KimiK2Tensors(int layers) {
    std::vector<TensorSpec> t;
    t.reserve(static_cast<std::size_t>(layers) * (kExperts * 3 + 8));
    for (int l = 0; l < layers; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        // MLA attention, replicated over EP.
        t.push_back({p + "attn.q_a", {1536, 7168}, -1, TpSplit::kWhole});
        t.push_back({p + "attn.q_b", {24576, 1536}, -1, TpSplit::kDim0});
        t.push_back({p + "attn.kv_a", {576, 7168}, -1, TpSplit::kWhole});
        t.push_back({p + "attn.kv_b", {32768, 512}, -1, TpSplit::kDim0});
        t.push_back({p + "attn.o", {7168, 16384}, -1, TpSplit::kDim1});
        if (l == 0) {
            t.push_back({p + "mlp.w1", {18432, 7168}, -1, TpSplit::kDim0});
            t.push_back({p + "mlp.w3", {18432, 7168}, -1, TpSplit::kDim0});
            t.push_back({p + "mlp.w2", {7168, 18432}, -1, TpSplit::kDim1});
            continue;
        }
        t.push_back({p + "mlp.shared_experts.w1", {2048, 7168}, -1, TpSplit::kDim0});
        t.push_back({p + "mlp.shared_experts.w3", {2048, 7168}, -1, TpSplit::kDim0});
        t.push_back({p + "mlp.shared_experts.w2", {7168, 2048}, -1, TpSplit::kDim1});
        for (int e = 0; e < kExperts; ++e) {
            const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
            t.push_back({q + "w1", {2048, 7168}, e, TpSplit::kDim0});
            t.push_back({q + "w3", {2048, 7168}, e, TpSplit::kDim0});
            t.push_back({q + "w2", {7168, 2048}, e, TpSplit::kDim1});
        }
    }
    return t;
}

/// The training side (EP8): the ranks that write sources, as named axes {ep: r}.
inline std::vector<NamedAxes> TrainingRanks() {
    std::vector<NamedAxes> ranks;
    for (int r = 0; r < kTrainingEp; ++r) {
        ranks.push_back(detail::OrDie(NamedAxes::Make({{"ep", r}}), "axes"));
    }
    return ranks;
}

/// Where the trainer writes one tensor's complete update from: a routed expert is owned by its
/// expert id (owner(expert); training EP8: rank expert / 48 wrote it), every other tensor by its
/// canonical owner among the training ranks (replicate(ep)).
struct SourcePlacement {
    NamedAxes placement;
    PlacementPolicy policy;
};

inline SourcePlacement TrainerPlacement(const TensorSpec& spec,
                                        std::span<const NamedAxes> training_ranks) {
    if (spec.expert >= 0) {
        return {detail::OrDie(NamedAxes::Make({{"expert", spec.expert}}), "axes"),
                detail::OrDie(PlacementPolicy::Owner("expert"), "policy")};
    }
    const std::size_t owner =
        detail::OrDie(CanonicalOwner(spec.id, training_ranks), "canonical owner");
    return {training_ranks[owner], detail::OrDie(PlacementPolicy::Replicate("ep"), "policy")};
}

/// The targets of one node (8 ranks, "node0") that together hold the whole model, rank by rank:
/// layout "ep8" (EP8, every rank the whole of its tensors) or "ep4tp2" (EP4 x TP2: dim-0 or
/// dim-1 halves by TpSplit).
inline std::vector<TargetDescriptor> NodeTargets(std::span<const TensorSpec> tensors,
                                                 std::string_view layout) {
    const bool tp2 = layout == "ep4tp2";
    const int ep_size = tp2 ? 4 : 8;
    const int tp_size = tp2 ? 2 : 1;
    const int experts_per_group = kExperts / ep_size;
    const std::string node = "node0";
    std::vector<TargetDescriptor> targets;
    for (int rank = 0; rank < kRanksPerNode; ++rank) {
        const int ep = rank / tp_size, tp = rank % tp_size;
        const std::string target_id = node + "/rank" + std::to_string(rank);
        std::vector<NamedAxes::Entry> base{{"ep", ep}};
        if (tp2) base.push_back({"tp", tp});
        const auto replica_axes = detail::OrDie(NamedAxes::Make(base), "axes");
        for (const TensorSpec& spec : tensors) {
            NamedAxes axes = replica_axes;
            if (spec.expert >= 0) {
                if (spec.expert / experts_per_group != ep) continue;
                auto entries = base;
                entries.push_back({"expert", spec.expert});
                axes = detail::OrDie(NamedAxes::Make(std::move(entries)), "axes");
            }
            Shape offset(spec.shape.size(), 0), local = spec.shape;
            const int split_dim = spec.split == TpSplit::kDim0   ? 0
                                  : spec.split == TpSplit::kDim1 ? 1
                                                                 : -1;
            if (tp_size > 1 && split_dim >= 0) {
                const Index part = spec.shape[split_dim] / tp_size;
                offset[split_dim] = part * tp;
                local[split_dim] =
                    tp + 1 == tp_size ? spec.shape[split_dim] - offset[split_dim] : part;
            }
            targets.push_back(detail::OrDie(TargetDescriptor::Make(target_id, node, spec.id, axes,
                                                                   std::move(offset),
                                                                   std::move(local)),
                                            "target"));
        }
    }
    return targets;
}

}  // namespace mooncake::sparse::kimi_k2
