// A downstream program built against an installed MooncakeSparse: the trainer commits one
// sparse update of a shared weight, four inference ranks (EP2 x TP2 on one node) read their
// boxes through the planner, and the program checks the result and the read metrics.
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "executor/sparse_store.h"
#include "mooncake/sparse/planner.h"

using namespace mooncake::sparse;

int main() {
    const Shape shape{2048, 7168};
    std::mt19937_64 rng(42);
    std::set<std::pair<std::int64_t, std::int64_t>> coords;
    while (coords.size() < 20000) coords.insert({std::int64_t(rng() % 2048), std::int64_t(rng() % 7168)});
    std::vector<std::int64_t> idx;
    std::vector<float> val;
    for (auto [r, c] : coords) {
        idx.push_back(r);
        idx.push_back(c);
        val.push_back(float(r) + float(c) / 8192.0f);
    }

    SparseStore store(MakeEmbeddedStore());
    PutSparseRequest put;
    put.tensor_id = "layers.0.mlp.shared_experts.w1";
    put.global_shape = shape;
    put.indices = {DType::kInt64, {Index(val.size()), 2}, std::as_bytes(std::span(idx))};
    put.values = {DType::kFloat32, {Index(val.size())}, std::as_bytes(std::span(val))};
    put.placement_policy = *PlacementPolicy::Parse("replicate(ep)");
    put.generation = {0, 1};
    auto committed = store.PutSparseObject(put);
    if (!committed.ok()) {
        std::fprintf(stderr, "commit failed: %s\n", committed.status().ToString().c_str());
        return 1;
    }
    auto manifest = store.Manifest({0, 1});
    if (!manifest.ok()) return 1;

    std::vector<TargetDescriptor> targets;
    for (int ep = 0; ep < 2; ++ep) {
        for (int tp = 0; tp < 2; ++tp) {
            auto axes = NamedAxes::Make({{"ep", ep}, {"tp", tp}});
            auto t = TargetDescriptor::Make("node0/rank" + std::to_string(ep * 2 + tp), "node0", put.tensor_id,
                                            *axes, {Index(tp) * 1024, 0}, {1024, 7168});
            if (!t.ok()) return 1;
            targets.push_back(*t);
        }
    }
    auto objs = store.ReadSparseObjects(*manifest, targets);
    if (!objs.ok()) {
        std::fprintf(stderr, "read failed: %s\n", objs.status().ToString().c_str());
        return 1;
    }
    // Each TP half holds exactly the committed entries of its rows; both EP replicas agree.
    std::uint64_t half[2] = {0, 0};
    for (auto [r, c] : coords) ++half[r >= 1024];
    for (std::size_t i = 0; i < objs->size(); ++i) {
        if ((*objs)[i].object.desc.nnz != half[i % 2]) {
            std::fprintf(stderr, "target %zu: %llu entries, expected %llu\n", i,
                         (unsigned long long)(*objs)[i].object.desc.nnz, (unsigned long long)half[i % 2]);
            return 1;
        }
    }
    const SparseMetrics m = store.Metrics();
    std::printf("minimal_cpp: committed %s (%llu entries, %llu bytes)\n", committed->source_ref.c_str(),
                (unsigned long long)committed->nnz, (unsigned long long)committed->bytes);
    std::printf("minimal_cpp: 4 targets, range_gets=%llu full_gets=%llu index_gets=%llu range_bytes_read=%llu\n",
                (unsigned long long)m.range_gets, (unsigned long long)m.full_gets,
                (unsigned long long)m.index_gets, (unsigned long long)m.range_bytes_read);
    const bool ok = m.source_objects_put == 1 && m.range_gets == 2 && m.full_gets == 0;
    std::printf("minimal_cpp: %s\n", ok ? "OK" : "UNEXPECTED METRICS");
    return ok ? 0 : 1;
}
