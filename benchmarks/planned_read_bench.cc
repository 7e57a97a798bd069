// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// planned_read_bench: the fixed cost of a planned read (SparseService::ReadPlanned, the plan
// that a device read builds its targets from; docs/design.md §9) for one inference rank of a
// Kimi-K2 EP4 x TP2 node, per target, JSON lines on stdout:
//   what="planned_read"  backend "embedded": an in-process SparseStore plans the read;
//                        backend "node": a NodeClient asks a NodeServer (run on a thread of
//                        this process, over a real Unix socket, the code of mooncake_sparse_node)
//                        to plan it, by step (ReadPlannedSealedStep) or with the manifest sent
//                        (ReadPlanned).
// The targets are built by a callback that only counts the plan (no bytes move), so the figure
// is the plan and its hand-over alone. The ceiling is the embedded plan of the same read on the
// same data: through the daemon, the difference is the protocol's cost (request, reply,
// leases, checks of the reply). The calls named "fresh" read a step just committed, whose
// sources no read has seen (as every step of a training run is); their ceiling is the embedded
// store's fresh read.
//
// Usage: planned_read_bench [--layers N] [--density D] [--rank R] [--repeats N] [--json PATH]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "executor/sparse_store.h"
#include "json_lines.h"
#include "kimi_k2_model.h"
#include "node/node_client.h"
#include "node/node_server.h"
#include "store/object_store.h"
#include "synthetic_update.h"

namespace mcs = mooncake::sparse;
namespace k2 = mooncake::sparse::kimi_k2;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void Die(const std::string& what) {
    std::fprintf(stderr, "planned_read_bench: %s\n", what.c_str());
    std::exit(1);
}

template <typename T>
T OrDie(mcs::Result<T> r, const std::string& what) {
    if (!r.ok()) Die(what + ": " + r.status().ToString());
    return std::move(r).value();
}

struct Options {
    int layers = 2;
    double density = 0.001;
    int rank = 0;
    int repeats = 20;
    std::string json_path;
};

Options Parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--help") {
            std::printf("planned_read_bench [--layers N] [--density D] [--rank R] [--repeats N] "
                        "[--json PATH]\n");
            std::exit(0);
        }
        if (i + 1 >= argc) Die("flag " + arg + " needs a value");
        const std::string value = argv[++i];
        if (arg == "--layers") {
            o.layers = std::atoi(value.c_str());
        } else if (arg == "--density") {
            o.density = std::atof(value.c_str());
        } else if (arg == "--rank") {
            o.rank = std::atoi(value.c_str());
        } else if (arg == "--repeats") {
            o.repeats = std::atoi(value.c_str());
        } else if (arg == "--json") {
            o.json_path = value;
        } else {
            Die("unknown flag '" + arg + "' (see --help)");
        }
    }
    if (o.layers < 1 || o.repeats < 1) Die("--layers and --repeats must be >= 1");
    if (o.rank < 0 || o.rank >= k2::kRanksPerNode) Die("--rank must be a rank of the node");
    if (!(o.density > 0.0 && o.density <= 1.0)) Die("--density must be in (0, 1]");
    return o;
}

/// The build of a plan-only read: counts what the plan hands over and keeps no entry.
struct CountPlan {
    std::size_t ranges = 0, pieces = 0, sources = 0;
    std::uint64_t range_bytes = 0;
    mcs::Status operator()(mcs::PlannedRead& read) {
        ranges = read.ranges.size();
        pieces = read.pieces.size();
        std::set<std::uint32_t> used;
        range_bytes = 0;
        for (const mcs::PlannedRead::Range& r : read.ranges) {
            used.insert(r.source);
            range_bytes += r.indices.size() + r.values.size();
        }
        sources = used.size();
        read.kept.assign(read.targets.size(), 0);
        return mcs::Status::Ok();
    }
};

struct Timing {
    double min_s = 0, median_s = 0;
};

/// The fastest and the median of `seconds`.
Timing Summarize(std::vector<double> seconds) {
    std::sort(seconds.begin(), seconds.end());
    return {seconds.front(), seconds[seconds.size() / 2]};
}

Timing Repeat(int repeats, const std::function<void()>& fn) {
    fn();  // warm-up: caches filled, connections made
    std::vector<double> s;
    for (int i = 0; i < repeats; ++i) {
        const auto t0 = Clock::now();
        fn();
        s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return Summarize(std::move(s));
}

}  // namespace

int main(int argc, char** argv) {
    const Options opt = Parse(argc, argv);
    mcs::bench::JsonLinesOut emit("planned_read_bench", opt.json_path);

    // One rank's targets, and the tensors they read.
    const std::vector<k2::TensorSpec> all = k2::KimiK2Tensors(opt.layers);
    const std::string rank_id = "node0/rank" + std::to_string(opt.rank);
    std::vector<mcs::TargetDescriptor> targets;
    std::set<std::string> read_ids;
    for (mcs::TargetDescriptor& t : k2::NodeTargets(all, "ep4tp2")) {
        if (t.target_id != rank_id) continue;
        read_ids.insert(t.tensor_id);
        targets.push_back(std::move(t));
    }
    std::vector<k2::TensorSpec> tensors;
    for (const k2::TensorSpec& s : all) {
        if (read_ids.count(s.id) != 0) tensors.push_back(s);
    }
    const std::vector<mcs::NamedAxes> training_ranks = k2::TrainingRanks();
    std::vector<mcs::synthetic::Coo> coo(tensors.size());
    std::vector<mcs::PutSparseRequest> requests(tensors.size());
    std::vector<std::string> ids;
    std::uint64_t nnz = 0;
    const auto generation = OrDie(mcs::Generation::Make(0, 1), "generation");
    for (std::size_t k = 0; k < tensors.size(); ++k) {
        const k2::TensorSpec& spec = tensors[k];
        coo[k] = mcs::synthetic::Synthesize(spec.shape, opt.density, 7, k);
        const auto n = static_cast<mcs::Index>(coo[k].nnz());
        mcs::PutSparseRequest& q = requests[k];
        q.tensor_id = spec.id;
        q.global_shape = spec.shape;
        q.indices = {mcs::DType::kUInt16, {n, 2},
                     std::as_bytes(std::span<const std::uint16_t>(coo[k].indices))};
        q.values = {mcs::DType::kBFloat16, {n},
                    std::as_bytes(std::span<const std::uint16_t>(coo[k].values))};
        auto [placement, policy] = k2::TrainerPlacement(spec, training_ranks);
        q.source_placement = std::move(placement);
        q.placement_policy = std::move(policy);
        q.generation = generation;
        q.encode.num_threads = 1;
        ids.push_back(spec.id);
        nnz += coo[k].nnz();
    }
    std::fprintf(stderr, "kimi-k2, %d layers, %s: %zu targets of %zu tensors, %.3g entries\n",
                 opt.layers, rank_id.c_str(), targets.size(), tensors.size(), double(nnz));

    const auto commit_step = [&](mcs::SparseService& s, mcs::Generation g) {
        for (mcs::PutSparseRequest& q : requests) q.generation = g;
        for (const auto& r : s.PutSparseObjects(requests, 2)) {
            if (!r.ok()) Die("commit: " + r.status().ToString());
        }
        if (mcs::Status st = s.SealGeneration(g, ids); !st.ok()) {
            Die("seal: " + st.ToString());
        }
        return OrDie(s.GetManifest(g), "manifest");
    };
    const auto commit = [&](mcs::SparseService& s) { return commit_step(s, generation); };
    // Reads of fresh steps, as a training run makes them: each repeat commits and seals step
    // (k, k + 1), whose sources no read has seen (no tile index of theirs is cached), then
    // reads it; only the read is timed. The store keeps the last two steps.
    const auto fresh = [&](mcs::SparseService& s, const std::function<void(const mcs::StepManifest&)>& read) {
        if (mcs::Status st = s.SetRetention(2); !st.ok()) Die("retention: " + st.ToString());
        std::vector<double> times;
        for (int i = 0; i <= opt.repeats; ++i) {
            const auto g = OrDie(mcs::Generation::Make(static_cast<std::uint64_t>(i) + 1,
                                                       static_cast<std::uint64_t>(i) + 2),
                                 "generation");
            const mcs::StepManifest step = commit_step(s, g);
            const auto t0 = Clock::now();
            read(step);
            if (i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        return Summarize(std::move(times));
    };
    const auto report = [&](const char* backend, const char* call, const Timing& t,
                            const CountPlan& plan, double ceiling_s,
                            double daemon_handler_s = -1) {
        mcs::bench::JsonLine j("planned_read");
        j.Add("backend", backend)
            .Add("call", call)
            .Add("layers", opt.layers)
            .Add("rank", opt.rank)
            .Add("density", opt.density)
            .Add("targets", targets.size())
            .Add("tensors", tensors.size())
            .Add("sources_read", plan.sources)
            .Add("ranges", plan.ranges)
            .Add("pieces", plan.pieces)
            .Add("range_bytes", plan.range_bytes)
            .Add("repeats", opt.repeats)
            .Add("min_s", t.min_s)
            .Add("median_s", t.median_s)
            .Add("us_per_target", t.median_s / double(targets.size()) * 1e6)
            .Add("ceiling", "the embedded plan of the same read")
            .Add("ceiling_s", ceiling_s)
            .Add("ratio_to_ceiling", t.median_s / ceiling_s);
        if (daemon_handler_s >= 0) j.Add("daemon_handler_mean_s", daemon_handler_s);
        emit.Emit(j);
    };
    mcs::ReadOptions read_options;
    read_options.num_threads = 1;

    // Embedded: the ceiling.
    double ceiling_s = 0, fresh_ceiling_s = 0;
    {
        auto object_store = std::shared_ptr<mcs::ObjectStore>(mcs::MakeEmbeddedStore());
        mcs::SparseStore store(object_store, mcs::SparseStoreOptions{});
        const mcs::StepManifest step = commit(store);
        CountPlan plan;
        const Timing t = Repeat(opt.repeats, [&] {
            OrDie(store.ReadPlanned(step, targets, read_options, std::ref(plan)), "embedded read");
        });
        ceiling_s = t.median_s;
        report("embedded", "ReadPlanned", t, plan, ceiling_s);
        const Timing f = fresh(store, [&](const mcs::StepManifest& step) {
            OrDie(store.ReadPlanned(step, targets, read_options, std::ref(plan)), "embedded read");
        });
        fresh_ceiling_s = f.median_s;
        report("embedded", "ReadPlanned fresh", f, plan, fresh_ceiling_s);
    }

    // Through a node daemon.
    {
        char tmpl[] = "/tmp/mcs-plan-bench-XXXXXX";
        const std::string dir = ::mkdtemp(tmpl);
        mcs::NodeServerOptions options;
        options.socket_path = dir + "/node.sock";
        options.store.segment_size = std::uint64_t{256} << 20;
        options.store.num_segments =
            static_cast<std::uint32_t>(2 + nnz * 6 * 4 / options.store.segment_size);  // four steps
        options.store.prefault = false;
        auto server = OrDie(mcs::NodeServer::Start(options), "node server");
        mcs::NodeClientOptions copts;
        copts.socket_path = options.socket_path;
        std::shared_ptr<mcs::NodeClient> client = OrDie(mcs::NodeClient::Connect(copts), "client");
        const mcs::StepManifest step = commit(*client);
        CountPlan plan;
        // The daemon's handler time per call (its planned_read_seconds over the calls), beside
        // the whole call's: the rest is the client's and the socket's.
        const auto handler_s = [&] {
            for (const auto& [name, value] : OrDie(client->Metrics(false), "metrics")) {
                if (name == "planned_read_seconds") return value;
            }
            return 0.0;
        };
        // `measure` makes repeats + 1 calls (a warm-up or a first step, then the timed ones).
        const auto timed = [&](const char* call, double ceiling,
                               const std::function<Timing()>& measure) {
            const double h0 = handler_s();
            const Timing t = measure();
            const double per_call = (handler_s() - h0) / double(opt.repeats + 1);
            report("node", call, t, plan, ceiling, per_call);
        };
        timed("ReadPlannedSealedStep", ceiling_s, [&] {
            return Repeat(opt.repeats, [&] {
                OrDie(client->ReadPlannedSealedStep(step, targets, read_options, std::ref(plan)),
                      "node read by step");
            });
        });
        timed("ReadPlanned", ceiling_s, [&] {
            return Repeat(opt.repeats, [&] {
                OrDie(client->ReadPlanned(step, targets, read_options, std::ref(plan)), "node read");
            });
        });
        timed("ReadPlannedSealedStep fresh", fresh_ceiling_s, [&] {
            return fresh(*client, [&](const mcs::StepManifest& fresh_step) {
                OrDie(client->ReadPlannedSealedStep(fresh_step, targets, read_options,
                                                    std::ref(plan)),
                      "node read by step");
            });
        });
        client.reset();
        server->Stop();
        std::filesystem::remove_all(dir);
    }
    return 0;
}
