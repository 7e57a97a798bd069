// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// mooncake_sparse_plan: the planning CLI / benchmark of docs/design.md §8. It plans a whole node's
// read of a Kimi-K2-shaped sparse update (steps 1-5 of §4: SelectSources + PlanBatch) and sweeps
// the hot cost of one tile-index query against nnz and against the number of tiles.
//
// Output contract: one JSON object per line on stdout (every line has "what"), human text on
// stderr; `--json PATH` saves the same lines. Every result line carries the ceiling measured in
// the same run (`bruteforce_ms`: a scan of every tile, or of every entry, of the sources read).
//
// The update is synthetic and never materialised for the model: uniformly changed entries at
// `--density` make each tile's entry count Binomial(tile elements, density), so each source's
// tile index (tile_coords + tile_ptr) is drawn directly, one TileIndex per source, none shared.
//
// Usage:
//   mooncake_sparse_plan [--model kimi-k2] [--layout all|ep8|ep4tp2] [--layers N]
//                        [--density D] [--seed S] [--repeats N] [--steps N] [--threads N]
//                        [--coalesce_gap G] [--tile_policy default|split_aware]
//                        [--summary] [--json PATH]
//   mooncake_sparse_plan --sweep nnz   [--tile T[,T...]] [--materialize_max N] [--json PATH]
//   mooncake_sparse_plan --sweep tiles [--nnz N] [--tile T[,T...]] [--json PATH]

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/planner.h"
#include "mooncake/sparse/status.h"

#include "json_lines.h"
#include "kimi_k2_model.h"
#include "synthetic_update.h"

namespace mcs = mooncake::sparse;
using mcs::Box;
using mcs::Index;
using mcs::Shape;
using mcs::TileCoord;

namespace {

// ---------------------------------------------------------------------------------------------
// Small utilities: clock, statistics, JSON lines, RNG.
// ---------------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// Minor page faults of this process so far: first-touch of fresh memory, which the kernel
/// zeroes. The planner's output structs are large enough for this to show in its timings.
std::uint64_t MinorFaults() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<std::uint64_t>(ru.ru_minflt);
}

/// The 1-minute load average (NaN where /proc/loadavg is missing): results from a shared
/// machine are read next to it.
double LoadAvg1m() {
    double load = std::nan("");
    if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
        if (std::fscanf(f, "%lf", &load) != 1) load = std::nan("");
        std::fclose(f);
    }
    return load;
}

/// CPU time of the calling thread: on a shared machine it moves far less than wall time.
double ThreadCpuMs() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

double Median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Min(const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

double Max(const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

[[noreturn]] void Die(const std::string& msg) {
    std::fprintf(stderr, "mooncake_sparse_plan: %s\n", msg.c_str());
    std::exit(1);
}

template <typename T>
T OrDie(mcs::Result<T> r, std::string_view what) {
    if (!r.ok()) Die(std::string(what) + ": " + r.status().ToString());
    return std::move(r).value();
}

void OrDie(const mcs::Status& s, std::string_view what) {
    if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

using mooncake::sparse::bench::JsonLine;

std::string JsonShape(std::span<const Index> shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

using Emitter = mooncake::sparse::bench::JsonLinesOut;

using mooncake::sparse::synthetic::Rng;

// ---------------------------------------------------------------------------------------------
// Tile shapes and synthetic tile indexes.
// ---------------------------------------------------------------------------------------------

/// The compact tile index of one source object, as the store returns it (docs/design.md §2).
struct RawTileIndex {
    std::vector<TileCoord> coords;   ///< [num_tiles, rank], row-major.
    std::vector<std::uint64_t> ptr;  ///< [num_tiles + 1].
    std::uint64_t nnz() const { return ptr.back(); }
    std::uint64_t num_tiles() const { return ptr.size() - 1; }
};

/// Visits every tile of the grid in row-major order with its coordinates and clipped element
/// count.
template <typename Fn>
void ForEachGridTile(std::span<const Index> shape, std::span<const Index> tile, Fn&& fn) {
    const std::size_t rank = shape.size();
    std::array<Index, mcs::kMaxRank> grid{}, pos{}, extent{};
    for (std::size_t d = 0; d < rank; ++d) grid[d] = (shape[d] + tile[d] - 1) / tile[d];
    auto clipped = [&](std::size_t d) { return std::min(tile[d], shape[d] - pos[d] * tile[d]); };
    for (std::size_t d = 0; d < rank; ++d) extent[d] = clipped(d);
    while (true) {
        Index elements = 1;
        for (std::size_t d = 0; d < rank; ++d) elements *= extent[d];
        fn(std::span<const Index>(pos.data(), rank), elements);
        std::size_t d = rank;
        while (d > 0) {
            --d;
            if (++pos[d] < grid[d]) {
                extent[d] = clipped(d);
                break;
            }
            pos[d] = 0;
            extent[d] = clipped(d);
            if (d == 0) return;
        }
    }
}

/// Independently changed elements with probability `density`: each tile's entry count is
/// Binomial(tile elements, density); empty tiles are omitted.
RawTileIndex SynthesizeBernoulli(std::span<const Index> shape, std::span<const Index> tile,
                                 double density, std::uint64_t seed, std::uint64_t stream) {
    Rng rng(seed, stream);
    // Interior tiles share one element count; edge tiles add at most 2^rank more. Keep the
    // distributions, whose set-up costs several transcendental calls.
    std::vector<std::pair<Index, std::binomial_distribution<std::int64_t>>> dists;
    auto dist_for = [&](Index n) -> std::binomial_distribution<std::int64_t>& {
        for (auto& [k, d] : dists) {
            if (k == n) return d;
        }
        dists.emplace_back(n, std::binomial_distribution<std::int64_t>(n, density));
        return dists.back().second;
    };
    RawTileIndex out;
    std::size_t grid_tiles = 1;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        grid_tiles *= static_cast<std::size_t>((shape[d] + tile[d] - 1) / tile[d]);
    }
    out.coords.reserve(grid_tiles * shape.size());
    out.ptr.reserve(grid_tiles + 1);
    out.ptr.push_back(0);
    ForEachGridTile(shape, tile, [&](std::span<const Index> pos, Index elements) {
        const std::int64_t count = dist_for(elements)(rng);
        if (count == 0) return;
        for (Index c : pos) out.coords.push_back(static_cast<TileCoord>(c));
        out.ptr.push_back(out.ptr.back() + static_cast<std::uint64_t>(count));
    });
    return out;
}

/// Exactly `nnz` entries placed uniformly (with replacement) over the tensor: a multinomial
/// over tiles drawn as conditional binomials, so the total is exact.
RawTileIndex SynthesizeExact(std::span<const Index> shape, std::span<const Index> tile,
                             std::uint64_t nnz, std::uint64_t seed, std::uint64_t stream) {
    Rng rng(seed, stream);
    RawTileIndex out;
    out.ptr.push_back(0);
    double remaining_area = static_cast<double>(mcs::NumElements(shape));
    std::uint64_t remaining = nnz;
    ForEachGridTile(shape, tile, [&](std::span<const Index> pos, Index elements) {
        std::uint64_t count = 0;
        if (remaining > 0) {
            const double p = static_cast<double>(elements) / remaining_area;
            if (p >= 1.0) {
                count = remaining;
            } else {
                std::binomial_distribution<std::int64_t> dist(static_cast<std::int64_t>(remaining),
                                                              p);
                count = static_cast<std::uint64_t>(dist(rng));
            }
        }
        remaining_area -= static_cast<double>(elements);
        remaining -= count;
        if (count == 0) return;
        for (Index c : pos) out.coords.push_back(static_cast<TileCoord>(c));
        out.ptr.push_back(out.ptr.back() + count);
    });
    return out;
}

/// Materialised 2-D uint16 coordinates, [nnz, 2] row-major, consistent with `index`: each
/// tile's entries drawn uniformly inside that tile. Only the brute-force entry scan reads them.
std::vector<std::uint16_t> MaterializeCoords(const RawTileIndex& index,
                                             std::span<const Index> shape,
                                             std::span<const Index> tile, std::uint64_t seed) {
    Rng rng(seed, 0xc00dull);
    std::vector<std::uint16_t> coords(index.nnz() * 2);
    for (std::size_t t = 0; t < index.num_tiles(); ++t) {
        const Index r0 = Index(index.coords[2 * t]) * tile[0];
        const Index c0 = Index(index.coords[2 * t + 1]) * tile[1];
        const auto rows = static_cast<std::uint64_t>(std::min(tile[0], shape[0] - r0));
        const auto cols = static_cast<std::uint64_t>(std::min(tile[1], shape[1] - c0));
        for (std::uint64_t e = index.ptr[t]; e < index.ptr[t + 1]; ++e) {
            const std::uint64_t x = rng();
            coords[2 * e] = static_cast<std::uint16_t>(r0 + Index((x & 0xffffffffu) % rows));
            coords[2 * e + 1] = static_cast<std::uint16_t>(c0 + Index((x >> 32) % cols));
        }
    }
    return coords;
}

// ---------------------------------------------------------------------------------------------
// Brute-force ceilings.
// ---------------------------------------------------------------------------------------------

/// True when tile `i` (clipped to the tensor) intersects `box`.
inline bool TileHits(const mcs::TileIndexView& v, std::size_t i, std::span<const Index> tile_shape,
                     std::span<const Index> global_shape, const Box& box) {
    for (std::size_t d = 0; d < v.rank; ++d) {
        const Index lo = Index(v.tile_coords[i * v.rank + d]) * tile_shape[d];
        const Index hi = std::min(lo + tile_shape[d], global_shape[d]);
        if (hi <= box.begin(d) || lo >= box.end(d)) return false;
    }
    return true;
}

/// The brute-force tile scan: every tile of the source tested against every box. Returns the
/// entries of the hit tiles (a sink, so the scan is not optimised away).
std::uint64_t TileScan(const mcs::TileIndexView& v, std::span<const Index> tile_shape,
                       std::span<const Index> global_shape, std::span<const Box> boxes) {
    std::uint64_t hits = 0;
    const std::size_t n = v.num_tiles();
    for (std::size_t i = 0; i < n; ++i) {
        for (const Box& b : boxes) {
            if (TileHits(v, i, tile_shape, global_shape, b))
                hits += v.tile_ptr[i + 1] - v.tile_ptr[i];
        }
    }
    return hits;
}

/// The brute-force entry scan (no tile index at all): every coordinate tested against the box.
std::uint64_t EntryScan(std::span<const std::uint16_t> coords, const Box& box) {
    const auto r0 = box.begin(0), r1 = box.end(0), c0 = box.begin(1), c1 = box.end(1);
    std::uint64_t hits = 0;
    for (std::size_t e = 0; e + 1 < coords.size(); e += 2) {
        const Index r = coords[e], c = coords[e + 1];
        hits += static_cast<std::uint64_t>((r >= r0) & (r < r1) & (c >= c0) & (c < c1));
    }
    return hits;
}

/// Expected entries of tile `i` that lie inside `box`. Tiles fully inside count exactly; a
/// boundary tile counts `count * (inside area / tile area)`, the expectation under the uniform
/// distribution the update was drawn from (the benchmark never materialises the entries).
/// Adds to `exact` or `partial`.
void ExpectedInside(const mcs::TileIndexView& v, std::size_t i, std::span<const Index> tile_shape,
                    std::span<const Index> global_shape, const Box& box, std::uint64_t& exact,
                    double& partial) {
    double inside = 1.0, area = 1.0;
    bool full = true;
    for (std::size_t d = 0; d < v.rank; ++d) {
        const Index lo = Index(v.tile_coords[i * v.rank + d]) * tile_shape[d];
        const Index hi = std::min(lo + tile_shape[d], global_shape[d]);
        const Index ilo = std::max(lo, box.begin(d)), ihi = std::min(hi, box.end(d));
        if (ihi <= ilo) return;
        if (ilo != lo || ihi != hi) full = false;
        inside *= double(ihi - ilo);
        area *= double(hi - lo);
    }
    const std::uint64_t count = v.tile_ptr[i + 1] - v.tile_ptr[i];
    if (full) {
        exact += count;
    } else {
        partial += double(count) * inside / area;
    }
}

// ---------------------------------------------------------------------------------------------
// Options.
// ---------------------------------------------------------------------------------------------

struct Options {
    std::string model = "kimi-k2";
    std::string layout = "all";
    std::string sweep;
    std::string json_path;
    bool summary = false;
    int layers = 61;
    double density = 0.01;
    std::uint64_t seed = 20261130;
    int repeats = 5;
    int steps = 5;  ///< Planning-loop steps per layout (new tile indexes, recycled storage).
    int threads = 1;
    std::int64_t coalesce_gap = -1;
    std::uint64_t nnz = 10'000'000;              ///< --sweep tiles.
    std::uint64_t materialize_max = 10'000'000;  ///< --sweep: largest nnz materialised.
    std::vector<Index> tiles;                    ///< --sweep: square tile sides.
    /// Model tile shapes: "default" (DefaultTileShape of geometry.h, what the codec uses; the headline) or
    /// "split_aware" (tensors split by TP along dim 1 get tiles spanning all of dim 0, so that a
    /// TP part is one contiguous run of tiles instead of one run per tile row).
    std::string tile_policy = "default";
};

void PrintUsage() {
    std::fprintf(
        stderr,
        "usage: mooncake_sparse_plan [options]\n"
        "  --model kimi-k2        model manifest to plan (default kimi-k2)\n"
        "  --layout L             all | ep8 | ep4tp2 (default all)\n"
        "  --layers N             layers (layer 0 dense, 1..N-1 MoE; default 61)\n"
        "  --density D            fraction of changed entries (default 0.01)\n"
        "  --seed S               RNG seed (default 20261130)\n"
        "  --repeats N            plan runs per layout, the first cold (default 5)\n"
        "  --steps N              planning-loop steps per layout: new tile indexes, the\n"
        "                         last step's plan storage recycled (default 5)\n"
        "  --threads N            threads that synthesise tile indexes (default 1;\n"
        "                         planning is always timed on one thread)\n"
        "  --coalesce_gap G       PlanOptions::read_coalesce_gap (default -1)\n"
        "  --summary              human-readable table on stderr\n"
        "  --sweep nnz|tiles      hot query time vs nnz, or vs number of tiles\n"
        "  --nnz N                --sweep tiles: entries (default 1e7)\n"
        "  --tile T[,T...]        --sweep: square tile sides\n"
        "  --materialize_max N    --sweep: largest nnz whose coordinates are materialised\n"
        "  --tile_policy P        default | split_aware (model tile shapes; default: the\n"
        "                         codec's; split_aware: dim-1-split tensors tiled by column\n"
        "                         strips, reported with its own tile_policy field)\n"
        "                         for the entry-scan ceiling (default 1e7)\n"
        "  --json PATH            also write the JSON lines to PATH\n");
}

std::uint64_t ParseCount(const std::string& s, const std::string& flag) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || !(v >= 0) || v > 1e18) {
        Die("bad value '" + s + "' for " + flag);
    }
    return static_cast<std::uint64_t>(std::llround(v));
}

Options ParseArgs(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            PrintUsage();
            std::exit(0);
        }
        if (!arg.starts_with("--")) Die("unexpected argument '" + arg + "' (see --help)");
        std::string value;
        bool has_value = false;
        if (auto eq = arg.find('='); eq != std::string::npos) {
            value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
            has_value = true;
        }
        if (arg == "--summary") {
            o.summary = true;
            continue;
        }
        static constexpr std::string_view kValueFlags[] = {
            "--model",   "--layout", "--sweep",          "--json",    "--layers",
            "--density", "--seed",   "--repeats",        "--threads", "--coalesce_gap", "--steps",
            "--nnz",     "--tile",   "--materialize_max", "--tile_policy"};
        if (std::find(std::begin(kValueFlags), std::end(kValueFlags), arg) ==
            std::end(kValueFlags)) {
            Die("unknown flag '" + arg + "' (see --help)");
        }
        if (!has_value) {
            if (i + 1 >= argc) Die(arg + " needs a value");
            value = argv[++i];
        }
        if (arg == "--model") {
            o.model = value;
        } else if (arg == "--layout") {
            o.layout = value;
        } else if (arg == "--sweep") {
            o.sweep = value;
        } else if (arg == "--json") {
            o.json_path = value;
        } else if (arg == "--layers") {
            o.layers = static_cast<int>(ParseCount(value, arg));
        } else if (arg == "--density") {
            o.density = std::strtod(value.c_str(), nullptr);
        } else if (arg == "--seed") {
            o.seed = ParseCount(value, arg);
        } else if (arg == "--repeats") {
            o.repeats = static_cast<int>(ParseCount(value, arg));
        } else if (arg == "--steps") {
            o.steps = static_cast<int>(ParseCount(value, arg));
        } else if (arg == "--threads") {
            o.threads = static_cast<int>(ParseCount(value, arg));
        } else if (arg == "--coalesce_gap") {
            o.coalesce_gap = std::strtoll(value.c_str(), nullptr, 10);
        } else if (arg == "--nnz") {
            o.nnz = ParseCount(value, arg);
        } else if (arg == "--materialize_max") {
            o.materialize_max = ParseCount(value, arg);
        } else if (arg == "--tile_policy") {
            o.tile_policy = value;
        } else if (arg == "--tile") {
            std::size_t start = 0;
            while (start <= value.size()) {
                const std::size_t comma = std::min(value.find(',', start), value.size());
                o.tiles.push_back(
                    static_cast<Index>(ParseCount(value.substr(start, comma - start), arg)));
                start = comma + 1;
            }
        } else {
            Die("unknown flag '" + arg + "' (see --help)");
        }
    }
    if (o.model != "kimi-k2") Die("unknown --model '" + o.model + "' (expected kimi-k2)");
    if (o.tile_policy != "default" && o.tile_policy != "split_aware") {
        Die("unknown --tile_policy '" + o.tile_policy + "' (expected default or split_aware)");
    }
    if (o.layout != "all" && o.layout != "ep8" && o.layout != "ep4tp2") {
        Die("unknown --layout '" + o.layout + "' (expected all, ep8 or ep4tp2)");
    }
    if (!o.sweep.empty() && o.sweep != "nnz" && o.sweep != "tiles") {
        Die("unknown --sweep '" + o.sweep + "' (expected nnz or tiles)");
    }
    if (o.layers < 1) Die("--layers must be >= 1");
    if (!(o.density > 0.0 && o.density <= 1.0)) Die("--density must be in (0, 1]");
    if (o.repeats < 1) Die("--repeats must be >= 1");
    if (o.threads < 1) o.threads = 1;
    for (Index t : o.tiles) {
        if (t < 1) Die("--tile sides must be >= 1");
    }
    return o;
}

// ---------------------------------------------------------------------------------------------
// The Kimi-K2-shaped model and its node layouts.
// ---------------------------------------------------------------------------------------------

using mcs::kimi_k2::kEntryBytesBf16Uint16;
using mcs::kimi_k2::kExperts;
using mcs::kimi_k2::kRanksPerNode;
using mcs::kimi_k2::KimiK2Tensors;
using mcs::kimi_k2::TensorSpec;
using mcs::kimi_k2::TpSplit;

/// The tile shape of one model tensor under --tile_policy.
Shape ModelTileShape(const TensorSpec& spec, const std::string& policy) {
    Shape tile = mcs::DefaultTileShape(spec.shape);
    if (policy == "split_aware" && spec.split == TpSplit::kDim1) tile[0] = spec.shape[0];
    return tile;
}

struct Model {
    std::vector<TensorSpec> tensors;
    std::vector<mcs::SourceDescriptor> manifest;  ///< One source per tensor, same order.
    std::vector<RawTileIndex> raw;                ///< The stored tile index of each source.
    double synth_ms = 0;
    std::uint64_t params = 0, nnz = 0, tiles = 0;
};

Model BuildModel(const Options& opt) {
    Model m;
    m.tensors = KimiK2Tensors(opt.layers);
    const std::size_t n = m.tensors.size();
    m.manifest.resize(n);
    m.raw.resize(n);
    const auto gen = OrDie(mcs::Generation::Make(0, 1), "generation");
    const std::vector<mcs::NamedAxes> training_ranks = mcs::kimi_k2::TrainingRanks();

    const auto t0 = Clock::now();
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
        for (std::size_t i; (i = next.fetch_add(1)) < n;) {
            const TensorSpec& spec = m.tensors[i];
            const Shape tile = ModelTileShape(spec, opt.tile_policy);
            m.raw[i] = SynthesizeBernoulli(spec.shape, tile, opt.density, opt.seed, i);
        }
    };
    std::vector<std::thread> pool;
    for (int k = 1; k < opt.threads; ++k) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();
    m.synth_ms = MsSince(t0);

    for (std::size_t i = 0; i < n; ++i) {
        const TensorSpec& spec = m.tensors[i];
        mcs::SourceDescriptor d;
        d.source_ref = spec.id + "@g1";
        d.tensor_id = spec.id;
        d.global_shape = spec.shape;
        d.box = OrDie(Box::Whole(spec.shape), "box");
        d.generation = gen;
        // The owner ordinal is the expert id (training EP8: rank expert / 48 wrote it).
        auto [placement, policy] = mcs::kimi_k2::TrainerPlacement(spec, training_ranks);
        d.placement = std::move(placement);
        d.policy = std::move(policy);
        d.tile_shape = ModelTileShape(spec, opt.tile_policy);
        d.nnz = m.raw[i].nnz();
        d.num_tiles = m.raw[i].num_tiles();
        d.apply = mcs::ApplyMode::kOverwrite;
        d.index_dtype =
            mcs::NarrowestIndexDType(*std::max_element(spec.shape.begin(), spec.shape.end()));
        d.value_dtype = mcs::DType::kBFloat16;
        m.manifest[i] = OrDie(mcs::SourceDescriptor::Make(std::move(d)), "source");
        m.params += static_cast<std::uint64_t>(mcs::NumElements(spec.shape));
        m.nnz += m.raw[i].nnz();
        m.tiles += m.raw[i].num_tiles();
    }
    return m;
}

/// The targets of one node (8 ranks) that together hold the whole model.
std::vector<mcs::TargetDescriptor> BuildNodeTargets(const Model& m, std::string_view layout) {
    return mcs::kimi_k2::NodeTargets(m.tensors, layout);
}

// ---------------------------------------------------------------------------------------------
// Mode 1: plan one node.
// ---------------------------------------------------------------------------------------------

struct PlanTiming {
    double index_ms = 0;  ///< ManifestIndex::Make, part of select_ms.
    double select_ms = 0, batch_ms = 0;
    double cpu_ms = 0;  ///< Thread CPU time of select + batch (user + system).
    double index_cpu_ms = 0, select_cpu_ms = 0, batch_cpu_ms = 0;  ///< The same, per phase.
    std::uint64_t page_faults = 0;
    double total() const { return select_ms + batch_ms; }
};

/// One whole-node plan, timed: ManifestIndex::Make + SelectSources ("select") and PlanBatch
/// ("batch"). The manifest index is built inside the timing, as a caller that plans a manifest
/// once would (an executor that keeps it for the generation saves index_ms).
/// What a planning loop keeps from one step for the next: the last manifest index and plan,
/// whose storage the next step's plan is written into.
struct Recycled {
    mcs::ManifestIndex index;
    mcs::BatchPlan plan;
};

PlanTiming TimePlan(std::span<const mcs::SourceDescriptor> manifest,
                    std::span<const mcs::TargetDescriptor> targets, mcs::TileIndexLookup lookup,
                    const mcs::PlanOptions& options, std::optional<mcs::BatchPlan>* keep,
                    Recycled* recycle = nullptr) {
    PlanTiming t;
    const std::uint64_t faults0 = MinorFaults();
    const double cpu0 = ThreadCpuMs();
    auto t0 = Clock::now();
    auto index = OrDie(mcs::ManifestIndex::Make(manifest, recycle ? &recycle->index : nullptr),
                       "ManifestIndex::Make");
    t.index_ms = MsSince(t0);
    const double cpu1 = ThreadCpuMs();
    auto selection = OrDie(mcs::SelectSources(manifest, index, targets,
                                              recycle ? &recycle->plan.selection : nullptr),
                           "SelectSources");
    t.select_ms = MsSince(t0);
    const double cpu2 = ThreadCpuMs();
    auto t1 = Clock::now();
    auto plan = OrDie(mcs::PlanBatch(manifest, targets, std::move(selection), lookup, options,
                                     recycle ? &recycle->plan : nullptr),
                      "PlanBatch");
    t.batch_ms = MsSince(t1);
    const double cpu3 = ThreadCpuMs();
    t.cpu_ms = cpu3 - cpu0;
    t.index_cpu_ms = cpu1 - cpu0;
    t.select_cpu_ms = cpu2 - cpu0;
    t.batch_cpu_ms = cpu3 - cpu2;
    t.page_faults = MinorFaults() - faults0;
    // Destruction of the plan is not part of planning.
    if (recycle != nullptr) recycle->index = std::move(index);
    if (keep != nullptr) *keep = std::move(plan);
    return t;
}

struct LayoutSummary {
    std::string layout;
    std::size_t targets = 0, sources = 0;
    double plan_ms = 0, plan_ms_warm = 0, bruteforce_ms = 0;
    double cpu_ms = 0, cpu_ms_warm = 0;  ///< Thread CPU time, cold and best warm.
    std::uint64_t regions = 0, unique_ranges = 0, planned_bytes = 0, ideal_bytes = 0,
                  index_bytes = 0;
    double ratio = 0;
};

LayoutSummary RunLayout(const Options& opt, const Model& m, const std::string& layout,
                        Emitter& emit) {
    const auto& manifest = m.manifest;
    // Fresh TileIndex objects for every layout: nothing built lazily by an earlier layout may
    // make this layout's cold run look warm.
    auto tb = Clock::now();
    std::vector<mcs::TileIndex> indexes;
    indexes.reserve(manifest.size());
    std::uint64_t index_bytes_base = 0;
    for (std::size_t i = 0; i < manifest.size(); ++i) {
        indexes.push_back(OrDie(mcs::TileIndex::Make(manifest[i], m.raw[i].coords, m.raw[i].ptr),
                                "TileIndex::Make"));
        index_bytes_base += indexes.back().MemoryBytes();
    }
    const double index_make_ms = MsSince(tb);
    auto tt = Clock::now();
    const auto targets = BuildNodeTargets(m, layout);
    const double targets_ms = MsSince(tt);
    std::vector<const mcs::TileIndex*> lookup(indexes.size());
    for (std::size_t i = 0; i < indexes.size(); ++i) lookup[i] = &indexes[i];
    mcs::PlanOptions options;
    options.read_coalesce_gap = opt.coalesce_gap;

    // Cold: the first plan pays the lazy row/column group builds, as a real step does.
    std::optional<mcs::BatchPlan> plan;
    const PlanTiming cold = TimePlan(manifest, targets, lookup, options, &plan);
    const mcs::SourceSelection* selection = &plan->selection;
    std::vector<double> warm_ms, warm_select, warm_batch, warm_cpu, warm_index_cpu,
        warm_select_cpu, warm_batch_cpu;
    std::uint64_t warm_faults = 0;
    for (int r = 1; r < opt.repeats; ++r) {
        std::optional<mcs::BatchPlan> again;
        const PlanTiming w = TimePlan(manifest, targets, lookup, options, &again);
        warm_ms.push_back(w.total());
        warm_select.push_back(w.select_ms);
        warm_batch.push_back(w.batch_ms);
        warm_cpu.push_back(w.cpu_ms);
        warm_index_cpu.push_back(w.index_cpu_ms);
        warm_select_cpu.push_back(w.select_cpu_ms);
        warm_batch_cpu.push_back(w.batch_cpu_ms);
        warm_faults = w.page_faults;
        if (again->stats.unique_ranges != plan->stats.unique_ranges ||
            again->stats.planned_bytes != plan->stats.planned_bytes) {
            Die("warm plan differs from the cold plan");
        }
    }
    // Steps of a planning loop: every step has new tile indexes (a new generation: nothing
    // built lazily is left) and plans into the storage of the step before, as an executor that
    // keeps its last plan does. The first step recycles a copy of the cold plan.
    std::vector<double> step_ms, step_select, step_batch;
    std::uint64_t step_faults = 0;
    {
        Recycled recycled{OrDie(mcs::ManifestIndex::Make(manifest), "ManifestIndex::Make"), *plan};
        for (int r = 0; r < opt.steps; ++r) {
            for (std::size_t i = 0; i < manifest.size(); ++i) {
                indexes[i] = OrDie(mcs::TileIndex::Make(manifest[i], m.raw[i].coords, m.raw[i].ptr),
                                   "TileIndex::Make");
            }
            std::optional<mcs::BatchPlan> step;
            const PlanTiming w = TimePlan(manifest, targets, lookup, options, &step, &recycled);
            step_ms.push_back(w.total());
            step_select.push_back(w.select_ms);
            step_batch.push_back(w.batch_ms);
            step_faults = std::max(step_faults, w.page_faults);
            if (step->stats.unique_ranges != plan->stats.unique_ranges ||
                step->stats.planned_bytes != plan->stats.planned_bytes ||
                step->regions.size() != plan->regions.size()) {
                Die("a step's plan differs from the cold plan");
            }
            recycled.plan = std::move(*step);
        }
    }
    const mcs::PlanStats& st = plan->stats;

    // Which boxes each needed source serves on this node (with repeats: one per target).
    std::vector<std::vector<Box>> boxes(manifest.size());
    for (const mcs::SourceMatch& mt : selection->matches) {
        boxes[mt.source_index].push_back(mt.Overlap(manifest, targets));
    }

    // Ceiling: the brute-force tile scan of every needed source against its target boxes.
    std::vector<double> brute;
    std::uint64_t brute_sink = 0;
    for (int r = 0; r < std::max(1, std::min(opt.repeats, 3)); ++r) {
        const auto t0 = Clock::now();
        for (std::size_t s : selection->needed_sources) {
            const auto& src = manifest[s];
            brute_sink += TileScan(indexes[s].view(), src.tile_shape, src.global_shape, boxes[s]);
        }
        brute.push_back(MsSince(t0));
    }

    // Ideal bytes: entries inside the union of the node's boxes of each source (identical
    // replica boxes count once, as the node reads them once). Exact for tiles fully inside a
    // box; a boundary tile contributes count * inside/tile area ("uniform_expectation").
    // `target_ideal` counts every target's box, the reference for the requested bytes.
    double ideal_bytes = 0, target_ideal_bytes = 0;
    std::uint64_t needed_nnz = 0;
    bool overlapping_boxes = false;
    for (std::size_t s : selection->needed_sources) {
        const auto& src = manifest[s];
        const auto v = indexes[s].view();
        needed_nnz += src.nnz;
        std::vector<std::pair<Box, std::uint64_t>> distinct;
        for (const Box& b : boxes[s]) {
            auto it = std::find_if(distinct.begin(), distinct.end(),
                                   [&](const auto& e) { return e.first == b; });
            if (it != distinct.end()) {
                ++it->second;
            } else {
                distinct.push_back({b, 1});
            }
        }
        for (std::size_t a = 0; a < distinct.size(); ++a) {
            for (std::size_t b = a + 1; b < distinct.size(); ++b) {
                if (mcs::Intersect(distinct[a].first, distinct[b].first)) overlapping_boxes = true;
            }
        }
        for (const auto& [b, mult] : distinct) {
            std::uint64_t exact = 0;
            double partial = 0;
            for (std::size_t i = 0; i < v.num_tiles(); ++i) {
                ExpectedInside(v, i, src.tile_shape, src.global_shape, b, exact, partial);
            }
            const double bytes = (double(exact) + partial) * double(src.EntryBytes());
            ideal_bytes += bytes;
            target_ideal_bytes += bytes * double(mult);
        }
    }
    if (overlapping_boxes) {
        std::fprintf(stderr,
                     "warning: %s: distinct target boxes of one source overlap; "
                     "ideal_bytes over-counts their intersection\n",
                     layout.c_str());
    }
    std::uint64_t requested_bytes = 0, flagged = 0;
    for (std::size_t m = 0; m < selection->matches.size(); ++m) {
        const std::uint64_t entry_bytes = manifest[selection->matches[m].source_index].EntryBytes();
        for (const mcs::Region& r : plan->regions_of_match(m)) {
            requested_bytes += r.size() * entry_bytes;
            flagged += r.exact_coordinate_filter() ? 1 : 0;
        }
    }
    // What the planner writes: its output arrays, which dominate a cold plan's page faults.
    const std::uint64_t output_bytes =
        plan->regions.size() * sizeof(mcs::Region) + plan->reads.size() * sizeof(mcs::UniqueRead) +
        selection->matches.size() * sizeof(mcs::SourceMatch) +
        plan->match_regions.size() * sizeof(mcs::RegionSpan) +
        plan->read_groups.size() * sizeof(mcs::ReadGroup) +
        (selection->target_begin.size() + selection->needed_sources.size()) *
            sizeof(std::uint32_t);
    std::uint64_t index_bytes = 0;
    for (const auto& ix : indexes) index_bytes += ix.MemoryBytes();

    LayoutSummary sum;
    sum.layout = layout;
    sum.targets = targets.size();
    sum.sources = selection->needed_sources.size();
    sum.plan_ms = cold.total();
    sum.plan_ms_warm = warm_ms.empty() ? cold.total() : Min(warm_ms);
    sum.cpu_ms = cold.cpu_ms;
    sum.cpu_ms_warm = warm_cpu.empty() ? cold.cpu_ms : Min(warm_cpu);
    sum.bruteforce_ms = Min(brute);
    sum.regions = st.regions;
    sum.unique_ranges = st.unique_ranges;
    sum.planned_bytes = st.planned_bytes;
    sum.ideal_bytes = static_cast<std::uint64_t>(std::llround(ideal_bytes));
    sum.ratio = ideal_bytes > 0 ? double(st.planned_bytes) / ideal_bytes : 0.0;
    sum.index_bytes = index_bytes;

    constexpr double kGoalPlanMs = 50.0, kGoalRatio = 1.1;
    JsonLine j("plan_node");
    j.Add("model", opt.model)
        .Add("layout", layout)
        .Add("tile_policy", opt.tile_policy)
        .Add("node", "node0")
        .Add("ranks", kRanksPerNode)
        .Add("layers", opt.layers)
        .Add("density", opt.density)
        .Add("seed", opt.seed)
        .Add("targets", targets.size())
        .Add("sources", selection->needed_sources.size())
        .Add("manifest_sources", manifest.size())
        .Add("sources_matched", st.sources_matched)
        .Add("plan_ms", sum.plan_ms)
        .Add("plan_ms_cold", cold.total())
        .Add("select_ms_cold", cold.select_ms)
        .Add("manifest_index_ms_cold", cold.index_ms)
        .Add("batch_ms_cold", cold.batch_ms)
        .Add("plan_ms_warm", sum.plan_ms_warm)
        .Add("plan_ms_warm_median", warm_ms.empty() ? cold.total() : Median(warm_ms))
        .Add("select_ms_warm", warm_select.empty() ? cold.select_ms : Min(warm_select))
        .Add("batch_ms_warm", warm_batch.empty() ? cold.batch_ms : Min(warm_batch))
        .Add("plan_cpu_ms_cold", cold.cpu_ms)
        .Add("manifest_index_cpu_ms_cold", cold.index_cpu_ms)
        // The same cold plan for a caller that keeps the generation's ManifestIndex (built once
        // per manifest, ReadOptions::manifest_index): everything but the index build.
        .Add("plan_cpu_ms_cold_reused_index", cold.cpu_ms - cold.index_cpu_ms)
        .Add("select_cpu_ms_cold", cold.select_cpu_ms)
        .Add("batch_cpu_ms_cold", cold.batch_cpu_ms)
        .Add("plan_cpu_ms_warm", warm_cpu.empty() ? cold.cpu_ms : Min(warm_cpu))
        .Add("manifest_index_cpu_ms_warm",
             warm_index_cpu.empty() ? cold.index_cpu_ms : Min(warm_index_cpu))
        .Add("select_cpu_ms_warm", warm_select_cpu.empty() ? cold.select_cpu_ms : Min(warm_select_cpu))
        .Add("batch_cpu_ms_warm", warm_batch_cpu.empty() ? cold.batch_cpu_ms : Min(warm_batch_cpu))
        .Add("page_faults_cold", cold.page_faults)
        .Add("page_faults_warm", warm_faults)
        // A planning loop's step: new tile indexes, the last step's storage (see above).
        .Add("steps", opt.steps)
        .Add("plan_ms_step", step_ms.empty() ? cold.total() : Median(step_ms))
        .Add("plan_ms_step_max", step_ms.empty() ? cold.total() : Max(step_ms))
        .Add("select_ms_step", step_select.empty() ? cold.select_ms : Median(step_select))
        .Add("batch_ms_step", step_batch.empty() ? cold.batch_ms : Median(step_batch))
        .Add("page_faults_step_max", step_faults)
        .Add("plan_output_bytes", output_bytes)
        .Add("region_struct_bytes", sizeof(mcs::Region))
        .Add("read_struct_bytes", sizeof(mcs::UniqueRead))
        .Add("repeats", opt.repeats)
        .Add("unique_ranges", st.unique_ranges)
        .Add("regions", st.regions)
        .Add("flagged_regions", flagged)
        .Add("planned_entries", st.planned_entries)
        .Add("requested_entries", st.requested_entries)
        .Add("planned_bytes", st.planned_bytes)
        .Add("ideal_bytes", sum.ideal_bytes)
        .Add("ideal_model", "uniform_expectation")
        .Add("ratio", sum.ratio)
        .Add("requested_bytes", requested_bytes)
        .Add("target_ideal_bytes", static_cast<std::uint64_t>(std::llround(target_ideal_bytes)))
        .Add("target_ratio",
             target_ideal_bytes > 0 ? double(requested_bytes) / target_ideal_bytes : 0.0)
        .Add("needed_nnz", needed_nnz)
        .Add("entry_bytes", kEntryBytesBf16Uint16)
        .Add("index_bytes", index_bytes)
        .Add("index_bytes_base", index_bytes_base)
        .Add("index_make_ms", index_make_ms)
        .Add("targets_build_ms", targets_ms)
        .Add("bruteforce_ms", sum.bruteforce_ms)
        .Add("bruteforce_kind", "tile_scan")
        .Add("bruteforce_hit_entries", brute_sink / brute.size())
        .Add("queries", st.query.queries)
        .Add("whole_source", st.query.whole_source)
        .Add("row_path", st.query.row_path)
        .Add("column_path", st.query.column_path)
        .Add("nd_path", st.query.nd_path)
        .Add("groups_visited", st.query.groups_visited)
        .Add("tiles_visited", st.query.tiles_visited)
        .Add("read_coalesce_gap", opt.coalesce_gap)
        .Add("loadavg_1m", LoadAvg1m())
        .Add("goal_plan_ms", kGoalPlanMs)
        .Add("goal_ratio", kGoalRatio)
        .Add("plan_ms_ok", sum.plan_ms <= kGoalPlanMs)
        .Add("plan_ms_step_ok", (step_ms.empty() ? cold.total() : Median(step_ms)) <= kGoalPlanMs)
        .Add("plan_cpu_ms_ok", cold.cpu_ms <= kGoalPlanMs)
        .Add("ratio_ok", sum.ratio <= kGoalRatio);
    emit.Emit(j);
    std::fprintf(stderr,
                 "[%s] %zu targets, %zu sources: plan %.1f ms cold (select %.1f + batch %.1f; "
                 "cpu %.1f ms, %" PRIu64
                 " page faults), %.1f ms warm (cpu %.1f); brute-force "
                 "tile scan %.1f ms; %" PRIu64 " unique ranges, ratio %.4f\n",
                 layout.c_str(), targets.size(), selection->needed_sources.size(), cold.total(),
                 cold.select_ms, cold.batch_ms, cold.cpu_ms, cold.page_faults, sum.plan_ms_warm,
                 warm_cpu.empty() ? cold.cpu_ms : Min(warm_cpu), sum.bruteforce_ms,
                 st.unique_ranges, sum.ratio);
    return sum;
}

int RunModel(const Options& opt, Emitter& emit) {
    std::fprintf(stderr, "building %s manifest: %d layers, density %g, seed %" PRIu64 " ...\n",
                 opt.model.c_str(), opt.layers, opt.density, opt.seed);
    const Model m = BuildModel(opt);
    std::fprintf(stderr,
                 "  %zu sources, %.3g params, %.4g nnz, %.4g tiles; tile indexes drawn in "
                 "%.0f ms (%d thread%s)\n",
                 m.manifest.size(), double(m.params), double(m.nnz), double(m.tiles), m.synth_ms,
                 opt.threads, opt.threads == 1 ? "" : "s");
    JsonLine j("manifest");
    j.Add("model", opt.model)
        .Add("tile_policy", opt.tile_policy)
        .Add("layers", opt.layers)
        .Add("experts", kExperts)
        .Add("density", opt.density)
        .Add("seed", opt.seed)
        .Add("sources", m.manifest.size())
        .Add("params", m.params)
        .Add("nnz", m.nnz)
        .Add("tiles", m.tiles)
        .Add("source_bytes", m.nnz * kEntryBytesBf16Uint16)
        .Add("synth_ms", m.synth_ms)
        .Add("threads", opt.threads);
    emit.Emit(j);

    std::vector<std::string> layouts;
    if (opt.layout == "all" || opt.layout == "ep8") layouts.push_back("ep8");
    if (opt.layout == "all" || opt.layout == "ep4tp2") layouts.push_back("ep4tp2");
    std::vector<LayoutSummary> sums;
    for (const auto& layout : layouts) sums.push_back(RunLayout(opt, m, layout, emit));

    if (opt.summary) {
        std::fprintf(stderr,
                     "\n%s, %d layers, %zu sources, %.3g params, density %g -> %.3g entries, "
                     "%.2f GB of sparse objects (6 B/entry)\n",
                     opt.model.c_str(), opt.layers, m.manifest.size(), double(m.params),
                     opt.density, double(m.nnz), double(m.nnz * kEntryBytesBf16Uint16) / 1e9);
        std::fprintf(stderr, "%-8s %8s %7s %9s %9s %9s %9s %9s %9s %9s %10s %10s %7s %9s\n",
                     "layout", "targets", "sources", "plan_ms", "cpu_ms", "warm_ms", "warm_cpu",
                     "brute_ms", "regions", "ranges", "planned_GB", "ideal_GB", "ratio",
                     "index_MB");
        for (const auto& s : sums) {
            std::fprintf(stderr,
                         "%-8s %8zu %7zu %9.1f %9.1f %9.1f %9.1f %9.1f %9" PRIu64 " %9" PRIu64
                         " %10.3f %10.3f %7.4f %9.1f\n",
                         s.layout.c_str(), s.targets, s.sources, s.plan_ms, s.cpu_ms,
                         s.plan_ms_warm, s.cpu_ms_warm, s.bruteforce_ms, s.regions,
                         s.unique_ranges, double(s.planned_bytes) / 1e9,
                         double(s.ideal_bytes) / 1e9, s.ratio, double(s.index_bytes) / 1e6);
        }
        std::fprintf(stderr,
                     "tile policy %s; goals: plan_ms <= 50 (cold, one thread), ratio <= 1.1\n"
                     "(plan_ms is wall time; on a shared machine read cpu_ms, the planning "
                     "thread's CPU time)\n",
                     opt.tile_policy.c_str());
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Modes 2 and 3: hot query sweeps on one [65536, 65536] tensor.
// ---------------------------------------------------------------------------------------------

constexpr Index kSweepDim = 65536;

struct NamedBox {
    const char* name;
    Box box;
};

std::vector<NamedBox> SweepBoxes() {
    const Index h = kSweepDim / 2;
    return {
        // Column-parallel TP half: contiguous rows of tiles, one range when tile-aligned.
        {"tp_row_half", OrDie(Box::Make({0, 0}, {h, kSweepDim}), "box")},
        // Row-parallel TP half: a column band, one group per row/column of tiles.
        {"tp_col_half", OrDie(Box::Make({0, h}, {kSweepDim, h}), "box")},
        // A small unaligned box: boundary tiles need the coordinate filter.
        {"small", OrDie(Box::Make({1000, 5000}, {2000, 2000}), "box")},
    };
}

struct QueryTiming {
    double cold_us = 0, median_us = 0, best_us = 0;
    std::size_t ranges = 0, flagged = 0;
    std::uint64_t entries = 0, tiles_visited = 0, groups_visited = 0;
    std::string path;
    int reps = 0, batches = 0;
};

QueryTiming TimeQuery(const mcs::TileIndex& index, const Box& box) {
    QueryTiming qt;
    const mcs::PlanningLimits limits;
    std::vector<mcs::EntryRange> out;
    mcs::QueryStats stats;
    auto t0 = Clock::now();
    OrDie(index.Query(box, limits, out, stats), "Query");
    qt.cold_us = MsSince(t0) * 1e3;
    qt.ranges = out.size();
    for (const auto& r : out) {
        qt.flagged += r.exact_coordinate_filter ? 1 : 0;
        qt.entries += r.size();
    }
    qt.tiles_visited = stats.tiles_visited;
    qt.groups_visited = stats.groups_visited;
    qt.path = stats.whole_source  ? "whole_source"
              : stats.column_path ? "column"
              : stats.row_path    ? "row"
              : stats.nd_path     ? "nd"
                                  : "empty";
    auto run = [&](int reps) {
        const auto t = Clock::now();
        for (int i = 0; i < reps; ++i) {
            out.clear();
            mcs::QueryStats s;
            OrDie(index.Query(box, limits, out, s), "Query");
        }
        return MsSince(t) * 1e3 / reps;
    };
    // Batches of at least ~0.5 ms so the clock's resolution does not matter; 21 batches, or
    // fewer when one query is slow.
    int reps = 1;
    double per = run(1);
    while (per * reps < 500.0 && reps < (1 << 22)) {
        reps *= 2;
        per = run(reps);
    }
    const int batches = std::clamp(static_cast<int>(2e6 / std::max(per * reps, 1.0)), 5, 21);
    std::vector<double> samples;
    for (int b = 0; b < batches; ++b) samples.push_back(run(reps));
    qt.median_us = Median(samples);
    qt.best_us = Min(samples);
    qt.reps = reps;
    qt.batches = batches;
    return qt;
}

/// One sweep point: a fresh TileIndex over a [65536, 65536] bf16 tensor, every box timed.
void SweepPoint(const Options& opt, std::string_view what, std::uint64_t nnz, Index tile_side,
                Emitter& emit) {
    const Shape shape{kSweepDim, kSweepDim};
    const Shape tile{tile_side, tile_side};
    auto t0 = Clock::now();
    RawTileIndex raw = SynthesizeExact(shape, tile, nnz, opt.seed, nnz ^ std::uint64_t(tile_side));
    const double synth_ms = MsSince(t0);
    std::vector<std::uint16_t> coords;
    if (nnz <= opt.materialize_max) coords = MaterializeCoords(raw, shape, tile, opt.seed);

    mcs::SourceDescriptor d;
    d.source_ref = "sweep@g1";
    d.tensor_id = "sweep";
    d.global_shape = shape;
    d.box = OrDie(Box::Whole(shape), "box");
    d.generation = OrDie(mcs::Generation::Make(0, 1), "generation");
    d.tile_shape = tile;
    d.nnz = raw.nnz();
    d.num_tiles = raw.num_tiles();
    d.index_dtype = mcs::NarrowestIndexDType(kSweepDim);
    d.value_dtype = mcs::DType::kBFloat16;
    d = OrDie(mcs::SourceDescriptor::Make(std::move(d)), "source");
    const std::uint64_t tiles = raw.num_tiles();
    const auto index = OrDie(mcs::TileIndex::Make(d, std::move(raw.coords), std::move(raw.ptr)),
                             "TileIndex::Make");

    for (const NamedBox& nb : SweepBoxes()) {
        const QueryTiming qt = TimeQuery(index, nb.box);
        // Ceilings: the tile scan (always) and the entry scan (when materialised).
        const Box one[] = {nb.box};
        std::vector<double> tile_scan, entry_scan;
        std::uint64_t sink = 0;
        for (int r = 0; r < 3; ++r) {
            auto ts = Clock::now();
            sink += TileScan(index.view(), d.tile_shape, d.global_shape, one);
            tile_scan.push_back(MsSince(ts));
            if (!coords.empty()) {
                auto es = Clock::now();
                sink += EntryScan(coords, nb.box);
                entry_scan.push_back(MsSince(es));
            }
        }
        const bool materialized = !coords.empty();
        JsonLine j(what);
        j.Add("box", nb.name)
            .AddRaw("box_origin", JsonShape(nb.box.origin()))
            .AddRaw("box_shape", JsonShape(nb.box.shape()))
            .AddRaw("shape", JsonShape(shape))
            .AddRaw("tile_shape", JsonShape(tile))
            .Add("tile_side", tile_side)
            .Add("nnz", d.nnz)
            .Add("tiles", tiles)
            .Add("grid_tiles", (kSweepDim / tile_side) * (kSweepDim / tile_side))
            .Add("query_us", qt.median_us)
            .Add("query_us_best", qt.best_us)
            .Add("query_us_cold", qt.cold_us)
            .Add("query_reps", qt.reps * qt.batches)
            .Add("path", qt.path)
            .Add("ranges", qt.ranges)
            .Add("flagged_ranges", qt.flagged)
            .Add("range_entries", qt.entries)
            .Add("tiles_visited", qt.tiles_visited)
            .Add("groups_visited", qt.groups_visited)
            .Add("index_bytes", index.MemoryBytes())
            .Add("bruteforce_ms", materialized ? Min(entry_scan) : Min(tile_scan))
            .Add("bruteforce_kind", materialized ? "entry_scan" : "tile_scan")
            .Add("tile_scan_ms", Min(tile_scan))
            .Add("entry_scan_ms", materialized ? Min(entry_scan) : std::nan(""))
            .Add("synth_ms", synth_ms)
            .Add("loadavg_1m", LoadAvg1m())
            .Add("sink", sink % 2);
        emit.Emit(j);
        std::fprintf(stderr,
                     "  %-14s nnz %10" PRIu64 " tile %5" PRId64 " tiles %8" PRIu64
                     "  %-12s query %9.3f us (cold %9.1f us)  ranges %7zu  tile scan %8.3f ms%s\n",
                     nb.name, d.nnz, tile_side, tiles, qt.path.c_str(), qt.median_us, qt.cold_us,
                     qt.ranges, Min(tile_scan),
                     materialized
                         ? ("  entry scan " + std::to_string(Min(entry_scan)) + " ms").c_str()
                         : "");
    }
}

int RunSweep(const Options& opt, Emitter& emit) {
    const Shape shape{kSweepDim, kSweepDim};
    if (opt.sweep == "nnz") {
        // Fixed tile shapes: the default one (8192^2 here: 64 tiles) and a finer 512^2 (16384
        // tiles), so that the tile count saturates at different nnz.
        std::vector<Index> sides = opt.tiles;
        if (sides.empty()) sides = {mcs::DefaultTileShape(shape)[0], 512};
        const std::uint64_t points[] = {10'000,    31'623,     100'000,    316'228,    1'000'000,
                                        3'162'278, 10'000'000, 31'622'777, 100'000'000};
        for (Index side : sides) {
            std::fprintf(stderr, "query vs nnz, tile %" PRId64 "^2:\n", side);
            for (std::uint64_t nnz : points) SweepPoint(opt, "query_vs_nnz", nnz, side, emit);
        }
    } else {
        std::vector<Index> sides = opt.tiles;
        if (sides.empty()) sides = {8192, 4096, 2048, 1024, 512, 256, 128, 64, 32};
        std::fprintf(stderr, "query vs tiles, nnz %" PRIu64 ":\n", opt.nnz);
        for (Index side : sides) SweepPoint(opt, "query_vs_tiles", opt.nnz, side, emit);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const Options opt = ParseArgs(argc, argv);
    Emitter emit("mooncake_sparse_plan", opt.json_path);
    if (!opt.sweep.empty()) return RunSweep(opt, emit);
    return RunModel(opt, emit);
}
