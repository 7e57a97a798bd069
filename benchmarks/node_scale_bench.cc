// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// node_scale_bench: one Kimi-K2 step at node scale on the CPU, through the executor. The trainer
// commits one source object per tensor (the whole model: 69,608 tensors at 61 layers) into a
// SparseStore on the embedded store, with batch commits; then one inference node (EP4 x TP2 by
// default: 142,144 targets) reads and materializes all of its targets in one
// SparseStore::ReadSparseObjects call on one thread, materializing from the store's memory
// (ReadOptions::view_in_place; --view_in_place 0 copies the ranges out through the node cache
// first). The memcpy floor of the bytes that read moves is measured in the same run, and a
// sample of targets is checked against a brute-force filter of its source's entries.
//
// The update is synthetic and drawn as COO directly (no dense tensor is ever materialised):
// every element changes with probability `--density`, independently (a Bernoulli process
// walked tile by tile with geometric gaps), so the entries come out unique and sorted by (tile,
// element) as the codec orders them; values are random finite bf16 bits; apply = overwrite.
// Each source is drawn from (seed, tensor index) alone, so the check redraws what it needs.
//
// Output contract: one JSON object per line on stdout, one per phase (what = node_scale_commit,
// node_scale_floor, node_scale_plan, node_scale_range_read, node_scale_materialize,
// node_scale_read, node_scale_verify), each with bytes, seconds, per-object microseconds, the
// ratio to the memcpy floor of the same run (ceiling_gbps), density, num_targets and
// num_sources; human text on stderr; `--json PATH` saves the same lines.
//
// The read runs --steps times: step 1 into fresh memory (first touch), each later step after the
// last one's target objects were freed and the node caches cleared (steady state: the memory a
// training run reuses step after step). Read lines carry "step" and "memory".
//
// Usage: node_scale_bench [--layers N] [--density D] [--layout ep4tp2|ep8] [--seed S]
//                         [--commit_batch N] [--commit_threads N] [--synth_threads N]
//                         [--read_threads N] [--verify_targets N] [--range_cache_mib M]
//                         [--view_in_place 0|1] [--steps N] [--json PATH]

#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "executor/sparse_store.h"
#include "json_lines.h"
#include "kimi_k2_model.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"
#include "synthetic_update.h"

namespace mcs = mooncake::sparse;
namespace k2 = mooncake::sparse::kimi_k2;
using mcs::Index;
using mcs::Shape;

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void Die(const std::string& msg) {
    std::fprintf(stderr, "node_scale_bench: %s\n", msg.c_str());
    std::exit(1);
}

template <typename T>
T OrDie(mcs::Result<T> r, std::string_view what) {
    if (!r.ok()) Die(std::string(what) + ": " + r.status().ToString());
    return std::move(r).value();
}

/// Peak resident set of this process so far, in bytes.
std::uint64_t PeakRssBytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

/// Minor page faults of this process so far: first touches of fresh memory, which the kernel
/// zeroes (on a VM, also where the host backs the page).
std::uint64_t MinorFaults() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<std::uint64_t>(ru.ru_minflt);
}

/// CPU time of the calling thread, in seconds.
double ThreadCpuSeconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

/// Current resident set, in bytes (0 where /proc is missing).
std::uint64_t RssBytes() {
    std::uint64_t pages = 0, resident = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%" SCNu64 " %" SCNu64, &pages, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return resident * 4096;
}

double LoadAvg1m() {
    double load = std::nan("");
    if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
        if (std::fscanf(f, "%lf", &load) != 1) load = std::nan("");
        std::fclose(f);
    }
    return load;
}

using mooncake::sparse::bench::JsonLine;

using Emitter = mooncake::sparse::bench::JsonLinesOut;

// ---------------------------------------------------------------------------------------------
// Options.
// ---------------------------------------------------------------------------------------------

struct Options {
    int layers = 61;
    double density = 0.001;
    std::string layout = "ep4tp2";
    std::uint64_t seed = 20261201;
    std::size_t commit_batch = 1155;  ///< Tensors per PutSparseObjects call (one MoE layer).
    int commit_threads = 1;
    int synth_threads = 2;
    int read_threads = 1;
    std::size_t verify_targets = 256;
    std::uint64_t floor_chunk_mib = 256;
    std::uint64_t range_cache_mib = 256;
    bool view_in_place = true;
    int steps = 2;
    std::string json_path;
};

void Usage() {
    std::fprintf(stderr,
                 "usage: node_scale_bench [options]\n"
                 "  --layers N          model layers (layer 0 dense, 1..N-1 MoE; default 61)\n"
                 "  --density D         fraction of changed elements (default 0.001)\n"
                 "  --layout L          ep4tp2 | ep8: the inference node's layout (default "
                 "ep4tp2)\n"
                 "  --seed S            RNG seed (default 20261201)\n"
                 "  --commit_batch N    tensors per PutSparseObjects call (default 1155)\n"
                 "  --commit_threads N  PutSparseObjects num_threads (default 1)\n"
                 "  --synth_threads N   threads that draw the updates, untimed (default 2)\n"
                 "  --read_threads N    ReadOptions::num_threads of the read (default 1)\n"
                 "  --verify_targets N  targets checked against a brute-force filter (default "
                 "256)\n"
                 "  --floor_chunk_mib M memcpy floor: buffers of M MiB, copied until the read's "
                 "bytes are (default 256)\n"
                 "  --range_cache_mib M the node range cache's capacity (default 256)\n"
                 "  --view_in_place B   1: ReadOptions::view_in_place (materialize from the "
                 "store's\n"
                 "                      memory); 0: copy the ranges out through the node "
                 "cache (default 1)\n"
                 "  --steps N           reads of the step: the first into fresh memory, each "
                 "later one\n"
                 "                      after the last one's objects are freed and the node "
                 "caches\n"
                 "                      cleared (steady state; default 2)\n"
                 "  --json PATH         also write the JSON lines to PATH\n");
}

Options ParseArgs(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            Usage();
            std::exit(0);
        }
        std::string value;
        if (auto eq = arg.find('='); eq != std::string::npos) {
            value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
        } else {
            if (i + 1 >= argc) Die(arg + " needs a value (see --help)");
            value = argv[++i];
        }
        char* end = nullptr;
        const double num = std::strtod(value.c_str(), &end);
        const bool numeric = end != value.c_str() && *end == '\0';
        auto count = [&]() -> std::uint64_t {
            if (!numeric || !(num >= 0) || num > 1e18) Die("bad value '" + value + "' for " + arg);
            return static_cast<std::uint64_t>(std::llround(num));
        };
        if (arg == "--layers") {
            o.layers = static_cast<int>(count());
        } else if (arg == "--density") {
            if (!numeric) Die("bad value '" + value + "' for " + arg);
            o.density = num;
        } else if (arg == "--layout") {
            o.layout = value;
        } else if (arg == "--seed") {
            o.seed = count();
        } else if (arg == "--commit_batch") {
            o.commit_batch = count();
        } else if (arg == "--commit_threads") {
            o.commit_threads = static_cast<int>(count());
        } else if (arg == "--synth_threads") {
            o.synth_threads = static_cast<int>(count());
        } else if (arg == "--read_threads") {
            o.read_threads = static_cast<int>(count());
        } else if (arg == "--verify_targets") {
            o.verify_targets = count();
        } else if (arg == "--floor_chunk_mib") {
            o.floor_chunk_mib = count();
        } else if (arg == "--range_cache_mib") {
            o.range_cache_mib = count();
        } else if (arg == "--view_in_place") {
            const std::uint64_t v = count();
            if (v > 1) Die("--view_in_place must be 0 or 1");
            o.view_in_place = v == 1;
        } else if (arg == "--steps") {
            o.steps = static_cast<int>(count());
        } else if (arg == "--json") {
            o.json_path = value;
        } else {
            Die("unknown flag '" + arg + "' (see --help)");
        }
    }
    if (o.layers < 1) Die("--layers must be >= 1");
    if (!(o.density > 0.0 && o.density <= 1.0)) Die("--density must be in (0, 1]");
    if (o.layout != "ep4tp2" && o.layout != "ep8") Die("--layout must be ep4tp2 or ep8");
    if (o.commit_batch < 1) Die("--commit_batch must be >= 1");
    if (o.commit_threads < 1 || o.synth_threads < 1 || o.read_threads < 1) {
        Die("thread counts must be >= 1");
    }
    if (o.floor_chunk_mib < 1) Die("--floor_chunk_mib must be >= 1");
    if (o.steps < 1) Die("--steps must be >= 1");
    return o;
}

using mcs::synthetic::Coo;
using mcs::synthetic::Synthesize;

template <typename Fn>
void ParallelIndices(int threads, std::size_t n, Fn&& fn) {
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
        for (std::size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    };
    std::vector<std::thread> pool;
    for (int k = 1; k < threads && std::size_t(k) < n; ++k) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();
}

// ---------------------------------------------------------------------------------------------
// The memcpy floor: one thread copying the read's byte count between warm buffers larger than
// the caches.
// ---------------------------------------------------------------------------------------------

struct Floor {
    double seconds = 0;
    double gbps = 0;
};

Floor MeasureMemcpyFloor(std::uint64_t bytes, std::uint64_t chunk_bytes) {
    chunk_bytes = std::max<std::uint64_t>(4096, std::min(chunk_bytes, bytes));
    std::vector<std::byte> src(chunk_bytes), dst(chunk_bytes);
    std::memset(src.data(), 0x5a, src.size());
    std::memset(dst.data(), 0, dst.size());
    std::memcpy(dst.data(), src.data(), chunk_bytes);  // Warm both.
    double best = 1e300;
    for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = Clock::now();
        for (std::uint64_t done = 0; done < bytes; done += chunk_bytes) {
            const std::uint64_t n = std::min(chunk_bytes, bytes - done);
            std::memcpy(dst.data(), src.data(), n);
            // Keep the copy: alternate direction so neither buffer stays hot in a cache.
            std::swap(src, dst);
        }
        best = std::min(best, SecondsSince(t0));
    }
    if (src[0] != dst[0]) Die("memcpy floor: buffers differ");
    return {best, double(bytes) / best / 1e9};
}

/// The same copy into fresh memory (mapped for the copy, unmapped after): what writing that
/// many bytes of new objects costs where first touches are dear (a VM whose host backs each
/// page on its first touch).
Floor MeasureFreshMemcpyFloor(std::uint64_t bytes, std::uint64_t chunk_bytes) {
    chunk_bytes = std::max<std::uint64_t>(4096, std::min(chunk_bytes, bytes));
    std::vector<std::byte> src(chunk_bytes);
    std::memset(src.data(), 0x5a, src.size());
    const auto t0 = Clock::now();
    for (std::uint64_t done = 0; done < bytes; done += chunk_bytes) {
        const std::uint64_t n = std::min(chunk_bytes, bytes - done);
        void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) Die(std::string("mmap: ") + std::strerror(errno));
        std::memcpy(p, src.data(), n);
        munmap(p, n);
    }
    const double s = SecondsSince(t0);
    return {s, double(bytes) / s / 1e9};
}

// ---------------------------------------------------------------------------------------------
// The check of one target against a brute-force filter of its source.
// ---------------------------------------------------------------------------------------------

/// (row, col, value) packed for comparison as a multiset.
std::uint64_t Pack(std::uint64_t r, std::uint64_t c, std::uint64_t v) {
    return (r << 32) | (c << 16) | v;
}

/// Empty when the target's object holds exactly the source entries inside its box, rebased;
/// else what differs. `expected_nnz` is the brute-force count.
std::string CheckTarget(const mcs::TargetDescriptor& target, const mcs::TargetObject& got,
                        const Coo& source, std::uint64_t& expected_nnz) {
    const Index o0 = target.box.begin(0), o1 = target.box.begin(1);
    const Index e0 = target.box.end(0), e1 = target.box.end(1);
    std::vector<std::uint64_t> want;
    for (std::uint64_t i = 0; i < source.nnz(); ++i) {
        const Index r = source.indices[2 * i], c = source.indices[2 * i + 1];
        if (r >= o0 && r < e0 && c >= o1 && c < e1) {
            want.push_back(Pack(std::uint64_t(r - o0), std::uint64_t(c - o1), source.values[i]));
        }
    }
    expected_nnz = want.size();
    const mcs::SparseObject& obj = got.object;
    if (got.target_id != target.target_id) return "target id " + got.target_id;
    if (obj.coordinate_space != "local") return "coordinate space " + obj.coordinate_space;
    if (obj.desc.nnz != want.size()) {
        return "nnz " + std::to_string(obj.desc.nnz) + ", brute force " +
               std::to_string(want.size());
    }
    const std::uint64_t nnz = obj.desc.nnz;
    const auto local = target.box.shape();
    if (obj.desc.global_shape != Shape(local.begin(), local.end())) return "local shape";
    std::vector<std::uint64_t> have;
    have.reserve(nnz);
    auto load_index = [&](std::uint64_t i, int d) -> std::uint64_t {
        switch (obj.desc.index_dtype) {
            case mcs::DType::kUInt16: {
                std::uint16_t v;
                std::memcpy(&v, obj.indices.data() + (2 * i + d) * 2, 2);
                return v;
            }
            case mcs::DType::kUInt32: {
                std::uint32_t v;
                std::memcpy(&v, obj.indices.data() + (2 * i + d) * 4, 4);
                return v;
            }
            default: {
                std::uint64_t v;
                std::memcpy(&v, obj.indices.data() + (2 * i + d) * 8, 8);
                return v;
            }
        }
    };
    if (obj.values.size() != nnz * 2) return "values size";
    for (std::uint64_t i = 0; i < nnz; ++i) {
        const std::uint64_t r = load_index(i, 0), c = load_index(i, 1);
        if (r >= std::uint64_t(local[0]) || c >= std::uint64_t(local[1])) {
            return "entry " + std::to_string(i) + " outside the local box";
        }
        std::uint16_t v;
        std::memcpy(&v, obj.values.data() + 2 * i, 2);
        have.push_back(Pack(r, c, v));
    }
    if (obj.tile_ptr.empty() || obj.tile_ptr.back() != nnz) return "tile_ptr does not end at nnz";
    std::sort(want.begin(), want.end());
    std::sort(have.begin(), have.end());
    if (have != want) return "entries differ from the brute-force filter";
    return {};
}

// ---------------------------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------------------------

struct Common {
    const Options* opt;
    std::size_t num_targets = 0, num_sources = 0;
    double floor_gbps = 0;
    void AddTo(JsonLine& j) const {
        j.Add("model", "kimi-k2")
            .Add("layout", opt->layout)
            .Add("layers", opt->layers)
            .Add("density", opt->density)
            .Add("seed", opt->seed)
            .Add("num_targets", num_targets)
            .Add("num_sources", num_sources);
    }
    /// bytes, seconds, per-object microseconds and the ratio to the floor of `bytes`.
    void AddPhase(JsonLine& j, std::uint64_t bytes, double seconds, std::size_t objects) const {
        const double floor_s = floor_gbps > 0 ? double(bytes) / (floor_gbps * 1e9) : 0.0;
        j.Add("bytes", bytes)
            .Add("seconds", seconds)
            .Add("objects", objects)
            .Add("us_per_object", objects ? seconds * 1e6 / double(objects) : 0.0)
            .Add("gbps", seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0)
            .Add("floor_seconds", floor_s)
            .Add("ratio_to_floor", floor_s > 0 ? seconds / floor_s : 0.0)
            .Add("ceiling_gbps", floor_gbps)
            .Add("ceiling", "memcpy_1thread");
    }
};

int Run(const Options& opt) {
    Emitter emit("node_scale_bench", opt.json_path);
    const std::vector<k2::TensorSpec> tensors = k2::KimiK2Tensors(opt.layers);
    const std::vector<mcs::NamedAxes> training_ranks = k2::TrainingRanks();
    const std::vector<mcs::TargetDescriptor> targets = k2::NodeTargets(tensors, opt.layout);
    std::uint64_t params = 0;
    for (const auto& t : tensors) params += static_cast<std::uint64_t>(mcs::NumElements(t.shape));
    std::fprintf(stderr,
                 "kimi-k2, %d layers: %zu tensors, %.4g params; node %s: %zu targets; density %g "
                 "(~%.3g entries, ~%.2f GB)\n",
                 opt.layers, tensors.size(), double(params), opt.layout.c_str(), targets.size(),
                 opt.density, double(params) * opt.density,
                 double(params) * opt.density * 6 / 1e9);

    auto object_store = std::shared_ptr<mcs::ObjectStore>(mcs::MakeEmbeddedStore());
    mcs::SparseStoreOptions store_options;
    store_options.range_cache_capacity_bytes = opt.range_cache_mib << 20;
    mcs::SparseStore store(object_store, store_options);
    const auto generation = OrDie(mcs::Generation::Make(0, 1), "generation");
    Common common{&opt, targets.size(), tensors.size(), 0};

    // --- Commit: the trainer's step, in batches of commit_batch tensors. ---------------------
    double commit_s = 0, synth_s = 0;
    std::uint64_t nnz_total = 0, source_bytes = 0;
    std::size_t batches = 0;
    for (std::size_t first = 0; first < tensors.size(); first += opt.commit_batch) {
        const std::size_t n = std::min(opt.commit_batch, tensors.size() - first);
        std::vector<Coo> coo(n);
        const auto ts = Clock::now();
        ParallelIndices(opt.synth_threads, n, [&](std::size_t k) {
            coo[k] = Synthesize(tensors[first + k].shape, opt.density, opt.seed, first + k);
        });
        synth_s += SecondsSince(ts);
        std::vector<mcs::PutSparseRequest> requests(n);
        for (std::size_t k = 0; k < n; ++k) {
            const k2::TensorSpec& spec = tensors[first + k];
            mcs::PutSparseRequest& q = requests[k];
            const auto nnz = static_cast<Index>(coo[k].nnz());
            q.tensor_id = spec.id;
            q.global_shape = spec.shape;
            q.indices = {mcs::DType::kUInt16,
                         {nnz, 2},
                         std::as_bytes(std::span<const std::uint16_t>(coo[k].indices))};
            q.values = {mcs::DType::kBFloat16,
                        {nnz},
                        std::as_bytes(std::span<const std::uint16_t>(coo[k].values))};
            auto [placement, policy] = k2::TrainerPlacement(spec, training_ranks);
            q.source_placement = std::move(placement);
            q.placement_policy = std::move(policy);
            q.generation = generation;
            q.apply = mcs::ApplyMode::kOverwrite;
            q.encode.num_threads = 1;
            nnz_total += coo[k].nnz();
        }
        const auto tc = Clock::now();
        auto results = store.PutSparseObjects(requests, opt.commit_threads);
        commit_s += SecondsSince(tc);
        for (std::size_t k = 0; k < n; ++k) {
            const auto& r = results[k];
            if (!r.ok()) Die("commit of " + tensors[first + k].id + ": " + r.status().ToString());
            if (!r->created) Die("commit of " + tensors[first + k].id + " was not created");
            source_bytes += r->bytes;
        }
        ++batches;
        if (batches % 10 == 0 || first + n == tensors.size()) {
            std::fprintf(stderr, "  committed %zu / %zu tensors (%.3g entries), rss %.2f GB\n",
                         first + n, tensors.size(), double(nnz_total), double(RssBytes()) / 1e9);
        }
    }
    const std::uint64_t rss_after_commit = RssBytes();

    // --- The memcpy floor of the read's bytes (sized from a first estimate: what the read
    // publishes is known only after it; re-scaled below). -------------------------------------
    const auto manifest = OrDie(store.Manifest(generation), "Manifest");
    if (manifest.size() != tensors.size()) {
        Die("manifest has " + std::to_string(manifest.size()) + " sources, expected " +
            std::to_string(tensors.size()));
    }
    const Floor floor = MeasureMemcpyFloor(source_bytes, opt.floor_chunk_mib << 20);
    common.floor_gbps = floor.gbps;
    {
        JsonLine j("node_scale_floor");
        common.AddTo(j);
        common.AddPhase(j, source_bytes, floor.seconds, 0);
        j.Add("chunk_bytes", std::min<std::uint64_t>(opt.floor_chunk_mib << 20, source_bytes))
            .Add("loadavg_1m", LoadAvg1m());
        emit.Emit(j);
    }
    {
        JsonLine j("node_scale_commit");
        common.AddTo(j);
        common.AddPhase(j, source_bytes, commit_s, tensors.size());
        j.Add("api", "PutSparseObjects")
            .Add("nnz", nnz_total)
            .Add("params", params)
            .Add("batches", batches)
            .Add("commit_batch", opt.commit_batch)
            .Add("threads", opt.commit_threads)
            .Add("synth_seconds", synth_s)
            .Add("synth_threads", opt.synth_threads)
            .Add("rss_bytes", rss_after_commit);
        emit.Emit(j);
    }
    std::fprintf(stderr,
                 "commit: %zu tensors, %.4g entries, %.3f GB in %.2f s (%.1f us/tensor); "
                 "synthesis %.1f s; memcpy floor %.2f GB/s\n",
                 tensors.size(), double(nnz_total), double(source_bytes) / 1e9, commit_s,
                 commit_s * 1e6 / double(tensors.size()), synth_s, floor.gbps);

    // --- Read: every target of the node in one call, on read_threads threads. Step 1 writes
    // into fresh memory; each later step reads the same step again after the last one's target
    // objects are freed and the node caches (tile indexes, ranges) cleared: what a training run
    // does step after step, with memory the process already backs. -------------------------
    for (int step = 1; step <= opt.steps; ++step) {
        const char* memory = step == 1 ? "first_touch" : "steady_state";
        if (step > 1) {
            const mcs::Status cleared = store.ClearCaches();
            if (!cleared.ok()) Die("ClearCaches: " + cleared.ToString());
        }
        store.ResetMetrics();
        mcs::ReadOptions options;
        options.num_threads = opt.read_threads;
        options.view_in_place = opt.view_in_place;
        const std::uint64_t faults0 = MinorFaults();
        const double cpu0 = ThreadCpuSeconds();
        const auto tr = Clock::now();
        auto objects = OrDie(store.ReadSparseObjects(manifest, targets, options), "ReadSparseObjects");
        const double read_s = SecondsSince(tr);
        const double read_cpu_s = ThreadCpuSeconds() - cpu0;
        const std::uint64_t read_faults = MinorFaults() - faults0;
        // The second floor, measured right after the read: the bytes the read first-touched,
        // copied into fresh memory.
        const Floor fresh = MeasureFreshMemcpyFloor(read_faults * 4096, opt.floor_chunk_mib << 20);
        const mcs::SparseMetrics m = store.Metrics();
        const std::uint64_t rss_after_read = RssBytes();
        if (objects.size() != targets.size()) Die("read returned a wrong number of objects");
        if (m.full_gets != 0 || m.dense_fallbacks != 0) Die("the read fell back to full GETs");
        std::uint64_t target_nnz = 0;
        for (const auto& o : objects) target_nnz += o.object.desc.nnz;

        // Phases as the executor times them: plan = manifest index + source selection + index-only
        // GETs + PlanBatch (from the call's start); range reads; materialize = filter + rebase +
        // build of every target object. The read moves range_bytes_read out of the store and
        // writes target_bytes.
        const double plan_s = m.plan_seconds;
        const double range_s = m.read_seconds;
        const double materialize_s = m.materialize_seconds;
        const std::uint64_t moved = m.range_bytes_read + m.target_bytes;
        auto emit_phase = [&](const char* what, std::uint64_t bytes, double seconds,
                              std::size_t objects_n, auto&& extra) {
            JsonLine j(what);
            common.AddTo(j);
            common.AddPhase(j, bytes, seconds, objects_n);
            j.Add("read_threads", opt.read_threads)
                .Add("step", step)
                .Add("memory", memory)
                .Add("range_cache_bytes", opt.range_cache_mib << 20)
                .Add("view_in_place", opt.view_in_place);
            extra(j);
            emit.Emit(j);
        };
        emit_phase("node_scale_plan", m.range_bytes_read, plan_s, targets.size(), [&](JsonLine& j) {
            j.Add("index_gets", m.index_gets)
                .Add("planned_ranges", m.planned_ranges)
                .Add("unique_ranges", m.unique_ranges);
        });
        emit_phase("node_scale_range_read", m.range_bytes_read, range_s, targets.size(),
                   [&](JsonLine& j) { j.Add("range_gets", m.range_gets); });
        emit_phase("node_scale_materialize", m.target_bytes, materialize_s, targets.size(),
                   [&](JsonLine& j) {
                       j.Add("fanout_bytes", m.fanout_bytes).Add("target_nnz", target_nnz);
                   });
        // The read as the goal counts it: the whole ReadSparseObjects call (plan included), against
        // the floor of the bytes it moves (range_bytes_read + target_bytes, each copied once).
        emit_phase("node_scale_read", moved, read_s, targets.size(), [&](JsonLine& j) {
            j.Add("api", "SparseStore::ReadSparseObjects")
                .Add("read_seconds_without_plan", read_s - plan_s)
                .Add("range_bytes_read", m.range_bytes_read)
                .Add("target_bytes", m.target_bytes)
                .Add("target_nnz", target_nnz)
                .Add("source_objects_put", m.source_objects_put)
                .Add("index_gets", m.index_gets)
                .Add("range_gets", m.range_gets)
                .Add("full_gets", m.full_gets)
                .Add("dense_fallbacks", m.dense_fallbacks)
                .Add("cache_hits", m.cache_hits)
                .Add("fanout_bytes", m.fanout_bytes)
                .Add("target_objects_published", m.target_objects_published)
                .Add("cpu_seconds", read_cpu_s)
                .Add("fresh_memcpy_gbps", fresh.gbps)
                .Add("fresh_memcpy_seconds", fresh.seconds)
                // The floor of a read that writes its fresh bytes at the fresh-memory rate and
                // copies the rest of what it moves between warm buffers.
                .Add("floor_seconds_fresh",
                     fresh.seconds + double(moved > read_faults * 4096 ? moved - read_faults * 4096
                                                                       : 0) /
                                         (floor.gbps * 1e9))
                .Add("minor_faults", read_faults)
                .Add("fresh_bytes", read_faults * 4096)
                .Add("goal_seconds", 3.0)
                .Add("goal_ok", read_s <= 3.0)
                .Add("rss_bytes", rss_after_read)
                .Add("peak_rss_bytes", PeakRssBytes())
                .Add("loadavg_1m", LoadAvg1m());
        });
        std::fprintf(stderr,
                     "read (step %d, %s): %zu targets, %.4g entries, %.3f GB read + %.3f GB published in %.3f s "
                     "(plan %.3f, range reads %.3f, materialize %.3f); floor of those bytes %.3f s "
                     "(x%.2f); peak rss %.2f GB; %.3g page faults (fresh-memory memcpy %.2f GB/s); "
                     "read thread cpu %.3f s\n",
                     step, memory, targets.size(), double(target_nnz),
                     double(m.range_bytes_read) / 1e9,
                     double(m.target_bytes) / 1e9, read_s, plan_s, range_s, materialize_s,
                     double(moved) / (floor.gbps * 1e9),
                     read_s / (double(moved) / (floor.gbps * 1e9)), double(PeakRssBytes()) / 1e9,
                     double(read_faults), fresh.gbps, read_cpu_s);

        // --- Check a sample of targets against a brute-force filter of their sources. -----------
        std::size_t tensor_of_id_hint = 0;
        auto tensor_index = [&](const std::string& id) -> std::size_t {
            for (std::size_t k = 0; k < tensors.size(); ++k) {
                const std::size_t i = (tensor_of_id_hint + k) % tensors.size();
                if (tensors[i].id == id) return tensor_of_id_hint = i;
            }
            Die("target of unknown tensor " + id);
        };
        const std::size_t sample = std::min(opt.verify_targets, targets.size());
        std::uint64_t checked_nnz = 0, brute_nnz = 0;
        const auto tv = Clock::now();
        for (std::size_t s = 0; s < sample; ++s) {
            // Spread over the batch, first and last included.
            const std::size_t t =
                sample == 1 ? 0 : s * (targets.size() - 1) / (sample - 1);
            const std::size_t ti = tensor_index(targets[t].tensor_id);
            const Coo source = Synthesize(tensors[ti].shape, opt.density, opt.seed, ti);
            std::uint64_t expected = 0;
            const std::string err = CheckTarget(targets[t], objects[t], source, expected);
            if (!err.empty()) Die("target " + targets[t].target_id + " " + targets[t].tensor_id + ": " + err);
            checked_nnz += objects[t].object.desc.nnz;
            brute_nnz += expected;
        }
        {
            JsonLine j("node_scale_verify");
            common.AddTo(j);
            j.Add("step", step)
                .Add("memory", memory)
                .Add("targets_checked", sample)
                .Add("checked_nnz", checked_nnz)
                .Add("bruteforce_nnz", brute_nnz)
                .Add("ok", checked_nnz == brute_nnz)
                .Add("seconds", SecondsSince(tv))
                .Add("peak_rss_bytes", PeakRssBytes());
            emit.Emit(j);
        }
        std::fprintf(stderr, "verify: %zu targets, %" PRIu64 " entries match the brute-force filter\n",
                     sample, checked_nnz);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(ParseArgs(argc, argv)); }
