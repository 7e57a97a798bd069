// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// commit_steady_bench: a training run's commits on the embedded store, step after step, per
// object. Every step commits the same N small tensors (64x64 float32, about 1 % of them changed,
// canonical uint16 entries) at the next generation and seals the step; retention keeps the last
// two, so from the third step on each seal frees the step before last and the store's size stays
// flat. Two ways of committing, each in a process-fresh store:
//
//   batch:   SparseStore::PutSparseObjects (the host commit: each request checked and indexed on
//            the host, then committed),
//   indexed: SparseStore::PutIndexedObjects (the GPU commit's store side: objects planned and
//            finished from their tile index, the entries written by a fill callback straight into
//            the store's memory; here the fill is a memcpy from the requests' arrays).
//
// Per step: the commit and the seal in microseconds per object, and the process's resident set.
// The ceiling of the same run: one memcpy of the step's entry bytes (per object). Whether the
// per-object costs stay flat over --steps is what this measures: a run commits thousands of steps.
//
// Output contract: one JSON object per line on stdout, human text on stderr; `--json PATH` saves
// the same lines.
//
// --shape R,C commits N bfloat16 R x C tensors instead (1 % of elements changed, encoded by the
// host codec with its default tile shape): the objects of a MoE layer's step, whose entries the
// store keeps in its pinned pool when --pinned-quota BYTES is set (pageable without CUDA, as
// the pool is; the per-object work of a commit from the GPU is the same).
//
// Usage: commit_steady_bench [--objects 10000] [--steps 40] [--paths batch,indexed]
//                            [--shape R,C] [--pinned-quota BYTES] [--json PATH]

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "executor/sparse_store.h"
#include "bench_args.h"
#include "json_lines.h"
#include "store/object_store.h"

namespace mcs = mooncake::sparse;

namespace {

[[noreturn]] void Die(const std::string& msg) {
    std::fprintf(stderr, "commit_steady_bench: %s\n", msg.c_str());
    std::exit(1);
}

struct Options {
    std::uint64_t objects = 10000;
    std::uint64_t steps = 40;
    std::vector<std::string> paths = {"batch", "indexed"};
    std::vector<std::int64_t> shape;  ///< Empty: 64x64 float32 tensors.
    std::uint64_t pinned_quota = 0;
    std::string json_path;
};

std::uint64_t ParseUnsigned(std::string_view flag, const std::string& text) {
    const std::optional<std::uint64_t> v = mooncake::sparse::bench::ParsePositive(text);
    if (!v) Die("bad value for " + std::string(flag) + ": '" + text + "'");
    return *v;
}

Options ParseArgs(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h" || i + 1 >= argc) {
            std::fprintf(stderr,
                         "usage: commit_steady_bench [--objects N] [--steps S] "
                         "[--paths batch,indexed] [--shape R,C] [--pinned-quota BYTES] "
                         "[--json PATH]\n");
            std::exit(arg == "--help" || arg == "-h" ? 0 : 1);
        }
        const std::string value = argv[++i];
        if (arg == "--objects") {
            o.objects = ParseUnsigned(arg, value);
        } else if (arg == "--steps") {
            o.steps = ParseUnsigned(arg, value);
        } else if (arg == "--paths") {
            o.paths.clear();
            std::size_t pos = 0;
            while (pos <= value.size()) {
                const std::size_t comma = std::min(value.find(',', pos), value.size());
                const std::string p = value.substr(pos, comma - pos);
                if (p != "batch" && p != "indexed") Die("unknown path '" + p + "'");
                o.paths.push_back(p);
                pos = comma + 1;
            }
        } else if (arg == "--shape") {
            const std::size_t comma = value.find(',');
            if (comma == std::string::npos) Die("--shape wants R,C");
            o.shape = {static_cast<std::int64_t>(ParseUnsigned(arg, value.substr(0, comma))),
                       static_cast<std::int64_t>(ParseUnsigned(arg, value.substr(comma + 1)))};
        } else if (arg == "--pinned-quota") {
            o.pinned_quota = ParseUnsigned(arg, value);
        } else if (arg == "--json") {
            o.json_path = value;
        } else {
            Die("unknown flag " + std::string(arg));
        }
    }
    return o;
}

using Emitter = mooncake::sparse::bench::JsonLinesOut;

/// One tensor's update: its canonical entries and the request that names them.
struct Update {
    std::vector<std::byte> indices;
    std::vector<std::byte> values;
    mcs::PutSparseRequest request;
};

/// N 64x64 float32 updates, each element changed with probability 1/100, entries in the
/// canonical order (by 8x8 tile, then row-major inside the tile) with uint16 indices.
std::vector<Update> MakeUpdates(std::uint64_t n) {
    std::mt19937_64 rng(1);
    std::vector<Update> ups(n);
    for (std::uint64_t i = 0; i < n; ++i) {
        std::vector<std::uint16_t> idx;
        std::vector<float> val;
        for (int tile = 0; tile < 64; ++tile) {
            for (int e = 0; e < 64; ++e) {
                if (rng() % 100 != 0) continue;
                idx.push_back(static_cast<std::uint16_t>((tile / 8) * 8 + e / 8));
                idx.push_back(static_cast<std::uint16_t>((tile % 8) * 8 + e % 8));
                val.push_back(static_cast<float>(e) + 0.5f);
            }
        }
        if (val.empty()) {
            idx = {0, 0};
            val = {1.0f};
        }
        Update& u = ups[i];
        u.indices.resize(idx.size() * sizeof(std::uint16_t));
        std::memcpy(u.indices.data(), idx.data(), u.indices.size());
        u.values.resize(val.size() * sizeof(float));
        std::memcpy(u.values.data(), val.data(), u.values.size());
        mcs::PutSparseRequest& r = u.request;
        r.tensor_id = "layers." + std::to_string(i) + ".w";
        r.global_shape = {64, 64};
        r.placement_policy = *mcs::PlacementPolicy::Parse("none");
        const auto nnz = static_cast<mcs::Index>(val.size());
        r.indices = {mcs::DType::kUInt16, {nnz, 2}, u.indices};
        r.values = {mcs::DType::kFloat32, {nnz}, u.values};
    }
    return ups;
}

/// N bfloat16 tensors of `shape`, each element changed with probability 1/100 against zeros,
/// encoded by the host codec (canonical entries, default tile shape). One dense pair at a time.
std::vector<Update> MakeLayerUpdates(std::uint64_t n, const std::vector<std::int64_t>& shape) {
    std::mt19937_64 rng(1);
    const auto elements = static_cast<std::size_t>(shape[0] * shape[1]);
    std::vector<std::uint16_t> old_values(elements, 0), new_values(elements, 0);
    const auto bytes = [](const std::vector<std::uint16_t>& v) {
        return std::as_bytes(std::span<const std::uint16_t>(v));
    };
    std::vector<Update> ups(n);
    for (std::uint64_t i = 0; i < n; ++i) {
        std::fill(new_values.begin(), new_values.end(), std::uint16_t{0});
        for (std::size_t e = 0; e < elements; ++e) {
            if (rng() % 100 == 0) new_values[e] = static_cast<std::uint16_t>(0x3f80 + rng() % 64);
        }
        const mcs::Shape s(shape.begin(), shape.end());
        mcs::Result<mcs::EncodedUpdate> enc =
            mcs::EncodeUpdate({mcs::DType::kBFloat16, s, bytes(new_values)},
                              {mcs::DType::kBFloat16, s, bytes(old_values)});
        if (!enc.ok()) Die("encode: " + enc.status().ToString());
        Update& u = ups[i];
        u.indices = std::move(enc->indices);
        u.values = std::move(enc->values);
        mcs::PutSparseRequest& r = u.request;
        r.tensor_id = "layers." + std::to_string(i) + ".w";
        r.global_shape = s;
        r.placement_policy = *mcs::PlacementPolicy::Parse("none");
        r.encode.tile_shape = enc->tile_shape;
        const auto nnz = static_cast<mcs::Index>(enc->nnz);
        r.indices = {enc->index_dtype, {nnz, static_cast<mcs::Index>(enc->rank)}, u.indices};
        r.values = {enc->value_dtype, {nnz}, u.values};
    }
    return ups;
}

double Micros(std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double, std::micro>(d).count();
}

std::uint64_t ResidentBytes() {
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr) return 0;
    unsigned long long pages = 0, resident = 0;
    const int got = std::fscanf(f, "%llu %llu", &pages, &resident);
    std::fclose(f);
    return got == 2 ? resident * 4096ULL : 0;
}

/// The objects PutIndexedObjects takes for `ups`: planned from their layout and finished with
/// their tile index and checksums, as the GPU commit makes them (here indexed on the host).
std::vector<mcs::SparseObject> IndexedObjects(const std::vector<Update>& ups) {
    std::vector<mcs::SparseObject> out;
    out.reserve(ups.size());
    for (const Update& u : ups) {
        const mcs::PutSparseRequest& r = u.request;
        const mcs::CooLayout layout{r.indices.dtype, r.indices.shape, r.indices.data.size(),
                                    r.values.dtype,  r.values.shape,  r.values.data.size()};
        std::optional<mcs::SourceDescriptor> planned = mcs::PlanIndexedSource(r, layout);
        std::optional<mcs::SparseObject> host = mcs::IndexSourceObject(r);
        if (!planned || !host) Die("update " + r.tensor_id + " is not canonical");
        std::optional<mcs::SparseObject> obj = mcs::FinishCanonicalEntries(
            std::move(*planned), std::move(host->tile_coords), std::move(host->tile_ptr),
            mcs::Checksum(r.indices.data), mcs::Checksum(r.values.data));
        if (!obj) Die("update " + r.tensor_id + " does not finish");
        out.push_back(std::move(*obj));
    }
    return out;
}

/// One path's steps over `ups` (each step sets their generation).
void Run(const std::string& path, const Options& o, std::vector<Update>& ups, Emitter& out) {
    std::vector<std::string> names;
    names.reserve(ups.size());
    std::uint64_t entry_bytes = 0;
    for (const Update& u : ups) {
        names.push_back(u.request.tensor_id);
        entry_bytes += u.indices.size() + u.values.size();
    }
    // The ceiling: the step's entry bytes copied once, warm.
    std::vector<std::byte> sink(entry_bytes);
    double memcpy_us = 1e300;
    for (int rep = 0; rep < 5; ++rep) {
        const auto t = std::chrono::steady_clock::now();
        std::size_t at = 0;
        for (const Update& u : ups) {
            std::memcpy(sink.data() + at, u.indices.data(), u.indices.size());
            at += u.indices.size();
            std::memcpy(sink.data() + at, u.values.data(), u.values.size());
            at += u.values.size();
        }
        memcpy_us = std::min(memcpy_us, Micros(std::chrono::steady_clock::now() - t));
    }
    mcs::SparseStoreOptions store_options;
    store_options.pinned_quota_bytes = o.pinned_quota;
    mcs::SparseStore store(mcs::MakeEmbeddedStore(), store_options);
    if (mcs::Status s = store.SetRetention(2); !s.ok()) Die("retention: " + s.ToString());
    const double n = static_cast<double>(o.objects);
    for (std::uint64_t k = 1; k <= o.steps; ++k) {
        const mcs::Generation g{k, k + 1};
        for (Update& u : ups) u.request.generation = g;
        double prepare_us = 0;
        const auto t0 = std::chrono::steady_clock::now();
        bool ok = true;
        if (path == "batch") {
            std::vector<mcs::PutSparseRequest> requests;
            requests.reserve(ups.size());
            for (const Update& u : ups) requests.push_back(u.request);
            for (const auto& r : store.PutSparseObjects(requests, 0)) ok = ok && r.ok();
        } else {
            std::vector<mcs::SparseObject> objects = IndexedObjects(ups);
            const std::vector<bool> pins(objects.size(), true);
            prepare_us = Micros(std::chrono::steady_clock::now() - t0);
            const mcs::EntryFill fill = [&ups](std::span<const mcs::EntryTarget> targets) {
                for (const mcs::EntryTarget& t : targets) {
                    const Update& u = ups[t.object];
                    if (t.indices.size() != u.indices.size() || t.values.size() != u.values.size()) {
                        return mcs::Internal("entry sizes differ");
                    }
                    std::memcpy(t.indices.data(), u.indices.data(), u.indices.size());
                    std::memcpy(t.values.data(), u.values.data(), u.values.size());
                }
                return mcs::Status::Ok();
            };
            auto results = store.PutIndexedObjects(std::move(objects), pins, fill, 0);
            ok = results.ok();
            if (ok) {
                for (const auto& r : *results) ok = ok && r.ok();
            }
        }
        const double commit_us = Micros(std::chrono::steady_clock::now() - t0);
        if (!ok) Die(path + ": a commit of step " + std::to_string(k) + " failed");
        const auto t1 = std::chrono::steady_clock::now();
        if (mcs::Status s = store.SealGeneration(g, names); !s.ok()) Die("seal: " + s.ToString());
        const double seal_us = Micros(std::chrono::steady_clock::now() - t1);
        char line[512];
        std::snprintf(line, sizeof(line),
                      "{\"what\": \"commit_steady\", \"path\": \"%s\", \"objects\": %llu, "
                      "\"step\": %llu, \"commit_us_per_object\": %.3f, "
                      "\"prepare_us_per_object\": %.3f, \"seal_us_per_object\": %.3f, "
                      "\"entry_bytes\": %llu, \"memcpy_us_per_object\": %.4f, "
                      "\"resident_bytes\": %llu}",
                      path.c_str(), static_cast<unsigned long long>(o.objects),
                      static_cast<unsigned long long>(k), commit_us / n, prepare_us / n,
                      seal_us / n, static_cast<unsigned long long>(entry_bytes), memcpy_us / n,
                      static_cast<unsigned long long>(ResidentBytes()));
        out.Emit(line);
        std::fprintf(stderr, "%s step %llu: commit %.2f us/object (prepare %.2f), seal %.2f\n",
                     path.c_str(), static_cast<unsigned long long>(k), commit_us / n,
                     prepare_us / n, seal_us / n);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = ParseArgs(argc, argv);
    Emitter out("commit_steady_bench", o.json_path);
    const char* preload = std::getenv("LD_PRELOAD");
    char meta[512];
    std::snprintf(meta, sizeof(meta), "{\"what\": \"meta\", \"ld_preload\": \"%s\"}",
                  preload != nullptr ? preload : "");
    out.Emit(meta);
    // The updates once for every path (a layer's take the host codec tens of seconds).
    std::vector<Update> ups =
        o.shape.empty() ? MakeUpdates(o.objects) : MakeLayerUpdates(o.objects, o.shape);
    for (const std::string& path : o.paths) Run(path, o, ups, out);
    return 0;
}
