// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// encode_bench: throughput of the CPU codec (src/codec) on LLM-sized tensors.
//
//   what="encode_update"        dense (new, old) bf16 7168x16384 -> COO at 0.1 %, 1 %, 10 % changed
//   what="build_sparse_object"  unsorted (and already sorted) random COO of 1 % of 7168x2048
//   what="apply"                overwrite / scatter_add of ~1.2 M entries into a 7168x16384 bf16
//                               weight
//
// Every case runs with 1 thread and with all hardware threads. One JSON object per line on
// stdout (human text on stderr); `--json PATH` also writes the lines to PATH. Each line carries
// the ceiling measured in the same run: `ceiling_gbps` is a single-thread memcpy of the same
// bytes (for encode: one dense tensor; for apply: the dense weight), so a line reads as a ratio.
// `gbps` of encode_update counts the bytes of ONE dense tensor (`gbps_basis`), although both
// tensors are read.
//
// Flags: --json PATH, --reps N (default 5; the median is reported, the best as seconds_min),
// --quick (small shapes, for a smoke run), --only WHAT (one of the three groups).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "codec/codec.h"

namespace mcs = mooncake::sparse;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
    std::string json_path;
    int reps = 5;
    bool quick = false;
    std::string only;  ///< Run only this `what` (empty: all).
};

struct Timing {
    double median = 0;
    double min = 0;
};

template <typename F>
Timing Measure(int reps, F&& f) {
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const auto start = Clock::now();
        f();
        t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    return {t[t.size() / 2], t.front()};
}

/// Single-thread memcpy of `bytes` (destination pre-faulted): the per-core ceiling.
double MemcpyGbps(std::size_t bytes, int reps) {
    std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes, std::byte{2});
    const Timing t = Measure(reps, [&] { std::memcpy(dst.data(), src.data(), bytes); });
    if (dst[bytes / 2] != std::byte{1}) std::abort();
    return static_cast<double>(bytes) / t.min / 1e9;
}

std::string ShapeJson(const mcs::Shape& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (i) out += ",";
        out += std::to_string(s[i]);
    }
    return out + "]";
}

class Emitter {
  public:
    explicit Emitter(const std::string& path) {
        if (!path.empty()) {
            file_.open(path);
            if (!file_) {
                std::cerr << "encode_bench: cannot write " << path << "\n";
                std::exit(2);
            }
        }
    }
    void Line(const std::string& json) {
        std::cout << json << "\n" << std::flush;
        if (file_) file_ << json << "\n" << std::flush;
    }

  private:
    std::ofstream file_;
};

std::string Num(double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    return buf;
}

/// A fast deterministic generator for filling hundreds of MB.
struct SplitMix {
    std::uint64_t s;
    std::uint64_t Next() {
        std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
};

/// bf16 weights ~ N(0, 0.02)-ish bit patterns (sign, exponent 117..124, random mantissa).
void FillWeights(std::vector<std::uint16_t>& w, std::uint64_t seed) {
    SplitMix rng{seed};
    for (std::size_t i = 0; i < w.size(); i += 4) {
        const std::uint64_t r = rng.Next();
        for (std::size_t k = 0; k < 4 && i + k < w.size(); ++k) {
            const std::uint16_t bits = static_cast<std::uint16_t>(r >> (16 * k));
            const std::uint16_t exp = 117 + (bits >> 8) % 8;
            w[i + k] = static_cast<std::uint16_t>((bits & 0x8000) | (exp << 7) | (bits & 0x7f));
        }
    }
}

/// new = old with about `density` of the elements changed (one mantissa bit flipped).
std::size_t Perturb(const std::vector<std::uint16_t>& old_v, std::vector<std::uint16_t>& new_v,
                    double density, std::uint64_t seed) {
    std::memcpy(new_v.data(), old_v.data(), old_v.size() * 2);
    SplitMix rng{seed};
    const auto threshold = static_cast<std::uint64_t>(density * 18446744073709551615.0);
    std::size_t changed = 0;
    for (std::size_t i = 0; i < new_v.size(); ++i) {
        if (rng.Next() < threshold) {
            new_v[i] ^= 1;
            ++changed;
        }
    }
    return changed;
}

void BenchEncode(const Options& opt, Emitter& out, const std::vector<int>& thread_counts) {
    const mcs::Shape shape = opt.quick ? mcs::Shape{1024, 2048} : mcs::Shape{7168, 16384};
    const std::size_t n = static_cast<std::size_t>(shape[0] * shape[1]);
    const std::size_t bytes = n * 2;
    std::vector<std::uint16_t> old_v(n), new_v(n);
    FillWeights(old_v, 1);
    const double ceiling = MemcpyGbps(bytes, opt.reps);
    std::cerr << "memcpy 1 thread of " << bytes / 1e6 << " MB: " << ceiling << " GB/s\n";

    for (double density : {0.001, 0.01, 0.1}) {
        const std::size_t changed =
            Perturb(old_v, new_v, density, 7 + static_cast<std::uint64_t>(density * 1e4));
        for (mcs::ApplyMode apply : {mcs::ApplyMode::kOverwrite, mcs::ApplyMode::kScatterAdd}) {
            if (apply == mcs::ApplyMode::kScatterAdd && density != 0.01) continue;
            for (int threads : thread_counts) {
                mcs::EncodeUpdateOptions eo;
                eo.apply = apply;
                eo.num_threads = threads;
                const mcs::HostArray a{mcs::DType::kBFloat16, shape,
                                       std::as_bytes(std::span(new_v))};
                const mcs::HostArray b{mcs::DType::kBFloat16, shape,
                                       std::as_bytes(std::span(old_v))};
                std::uint64_t entries = 0;
                const Timing t = Measure(opt.reps, [&] {
                    auto r = mcs::EncodeUpdate(a, b, eo);
                    if (!r.ok()) {
                        std::cerr << r.status().ToString() << "\n";
                        std::exit(1);
                    }
                    entries = r->nnz;
                });
                if (entries != changed) {
                    std::cerr << "encode_update found " << entries << " entries, expected "
                              << changed << "\n";
                    std::exit(1);
                }
                const double gbps = static_cast<double>(bytes) / t.median / 1e9;
                out.Line("{\"what\":\"encode_update\",\"dtype\":\"bfloat16\",\"apply\":\"" +
                         std::string(mcs::ApplyModeName(apply)) +
                         "\",\"shape\":" + ShapeJson(shape) + ",\"density\":" + Num(density) +
                         ",\"threads\":" + std::to_string(threads) +
                         ",\"seconds\":" + Num(t.median) + ",\"seconds_min\":" + Num(t.min) +
                         ",\"bytes\":" + std::to_string(bytes) + ",\"gbps\":" + Num(gbps) +
                         ",\"gbps_per_thread\":" + Num(gbps / threads) +
                         ",\"gbps_basis\":\"one dense tensor\",\"ceiling_gbps\":" + Num(ceiling) +
                         ",\"ceiling_basis\":\"memcpy 1 thread, same bytes\",\"entries\":" +
                         std::to_string(entries) + "}");
                std::cerr << "encode_update " << mcs::ApplyModeName(apply) << " density " << density
                          << " threads " << threads << ": " << gbps << " GB/s (" << t.median * 1e3
                          << " ms, " << entries << " entries)\n";
            }
        }
    }
}

void BenchBuild(const Options& opt, Emitter& out, const std::vector<int>& thread_counts) {
    const mcs::Shape shape = opt.quick ? mcs::Shape{1024, 512} : mcs::Shape{7168, 2048};
    const std::size_t total = static_cast<std::size_t>(shape[0] * shape[1]);
    const std::size_t nnz = total / 100;
    // Distinct random coordinates, in random order (int64 [nnz, 2], as numpy / torch give them).
    std::vector<std::int64_t> lin(total);
    std::iota(lin.begin(), lin.end(), std::int64_t{0});
    std::mt19937_64 rng(3);
    for (std::size_t i = 0; i < nnz; ++i) {
        std::uniform_int_distribution<std::size_t> pick(i, total - 1);
        std::swap(lin[i], lin[pick(rng)]);
    }
    std::vector<std::int64_t> idx(nnz * 2);
    std::vector<std::uint16_t> val(nnz);
    for (std::size_t i = 0; i < nnz; ++i) {
        idx[2 * i] = lin[i] / shape[1];
        idx[2 * i + 1] = lin[i] % shape[1];
        val[i] = static_cast<std::uint16_t>(i);
    }
    const std::size_t in_bytes = idx.size() * 8 + val.size() * 2;
    const double ceiling = MemcpyGbps(in_bytes, opt.reps);

    mcs::SourceDescriptor desc;
    desc.tensor_id = "bench.w";
    desc.global_shape = shape;
    desc.generation = {0, 1};
    for (bool presorted : {false, true}) {
        std::vector<std::int64_t> in_idx = idx;
        std::vector<std::uint16_t> in_val = val;
        if (presorted) {
            auto r = mcs::BuildSparseObject(desc,
                                            {mcs::DType::kInt64,
                                             {static_cast<mcs::Index>(nnz), 2},
                                             std::as_bytes(std::span(idx))},
                                            {mcs::DType::kBFloat16,
                                             {static_cast<mcs::Index>(nnz)},
                                             std::as_bytes(std::span(val))});
            const auto* p = reinterpret_cast<const std::uint16_t*>(r->indices.data());
            for (std::size_t i = 0; i < nnz * 2; ++i) in_idx[i] = p[i];
            std::memcpy(in_val.data(), r->values.data(), nnz * 2);
        }
        for (int threads : thread_counts) {
            mcs::EncodeOptions eo;
            eo.num_threads = threads;
            const Timing t = Measure(opt.reps, [&] {
                auto r = mcs::BuildSparseObject(desc,
                                                {mcs::DType::kInt64,
                                                 {static_cast<mcs::Index>(nnz), 2},
                                                 std::as_bytes(std::span(in_idx))},
                                                {mcs::DType::kBFloat16,
                                                 {static_cast<mcs::Index>(nnz)},
                                                 std::as_bytes(std::span(in_val))},
                                                eo);
                if (!r.ok() || r->desc.nnz != nnz) {
                    std::cerr << r.status().ToString() << "\n";
                    std::exit(1);
                }
            });
            const double eps = static_cast<double>(nnz) / t.median;
            out.Line("{\"what\":\"build_sparse_object\",\"input\":\"" +
                     std::string(presorted ? "sorted" : "unsorted") +
                     "\",\"index_dtype\":\"int64\",\"value_dtype\":\"bfloat16\",\"shape\":" +
                     ShapeJson(shape) + ",\"density\":0.01,\"entries\":" + std::to_string(nnz) +
                     ",\"threads\":" + std::to_string(threads) + ",\"seconds\":" + Num(t.median) +
                     ",\"seconds_min\":" + Num(t.min) + ",\"entries_per_s\":" + Num(eps) +
                     ",\"bytes\":" + std::to_string(in_bytes) +
                     ",\"gbps\":" + Num(static_cast<double>(in_bytes) / t.median / 1e9) +
                     ",\"ceiling_gbps\":" + Num(ceiling) +
                     ",\"ceiling_basis\":\"memcpy 1 thread, input bytes\"}");
            std::cerr << "build_sparse_object " << (presorted ? "sorted" : "unsorted")
                      << " threads " << threads << ": " << eps / 1e6 << " M entries/s ("
                      << t.median * 1e3 << " ms)\n";
        }
    }
    // Entries already canonical (sorted by tile, narrowest index dtype, as encode_update and
    // the GPU encode give them): the one pass that checks them, builds the tile index and
    // checksums both members, without a copy (what a batch commit does per update).
    auto canon = mcs::BuildSparseObject(desc,
                                        {mcs::DType::kInt64,
                                         {static_cast<mcs::Index>(nnz), 2},
                                         std::as_bytes(std::span(idx))},
                                        {mcs::DType::kBFloat16,
                                         {static_cast<mcs::Index>(nnz)},
                                         std::as_bytes(std::span(val))});
    const mcs::HostArray c_idx{canon->desc.index_dtype,
                               {static_cast<mcs::Index>(nnz), 2},
                               std::span<const std::byte>(canon->indices)};
    const mcs::HostArray c_val{mcs::DType::kBFloat16,
                               {static_cast<mcs::Index>(nnz)},
                               std::span<const std::byte>(canon->values)};
    const std::size_t c_bytes = canon->indices.size() + canon->values.size();
    const Timing t = Measure(opt.reps, [&] {
        auto r = mcs::IndexCanonicalEntries(desc, c_idx, c_val, {});
        if (!r || r->desc.nnz != nnz) {
            std::cerr << "canonical entries not indexed\n";
            std::exit(1);
        }
    });
    const double eps = static_cast<double>(nnz) / t.median;
    out.Line("{\"what\":\"build_sparse_object\",\"input\":\"canonical\",\"index_dtype\":\"" +
             std::string(mcs::DTypeName(canon->desc.index_dtype)) +
             "\",\"value_dtype\":\"bfloat16\",\"shape\":" + ShapeJson(shape) +
             ",\"density\":0.01,\"entries\":" + std::to_string(nnz) +
             ",\"threads\":1,\"seconds\":" + Num(t.median) + ",\"seconds_min\":" + Num(t.min) +
             ",\"entries_per_s\":" + Num(eps) + ",\"bytes\":" + std::to_string(c_bytes) +
             ",\"gbps\":" + Num(static_cast<double>(c_bytes) / t.median / 1e9) +
             ",\"ceiling_gbps\":" + Num(ceiling) +
             ",\"ceiling_basis\":\"memcpy 1 thread, input bytes\"}");
    std::cerr << "build_sparse_object canonical: " << eps / 1e6 << " M entries/s ("
              << t.median * 1e3 << " ms)\n";
}

void BenchApply(const Options& opt, Emitter& out, const std::vector<int>& thread_counts) {
    const mcs::Shape shape = opt.quick ? mcs::Shape{1024, 2048} : mcs::Shape{7168, 16384};
    const std::size_t n = static_cast<std::size_t>(shape[0] * shape[1]);
    const std::size_t bytes = n * 2;
    std::vector<std::uint16_t> old_v(n), new_v(n);
    FillWeights(old_v, 2);
    Perturb(old_v, new_v, 1.2e6 / 117440512.0, 11);
    mcs::EncodeUpdateOptions eo;
    eo.apply = mcs::ApplyMode::kOverwrite;
    auto enc =
        mcs::EncodeUpdate({mcs::DType::kBFloat16, shape, std::as_bytes(std::span(new_v))},
                          {mcs::DType::kBFloat16, shape, std::as_bytes(std::span(old_v))}, eo);
    if (!enc.ok()) std::exit(1);
    const auto nnz = static_cast<mcs::Index>(enc->nnz);
    const mcs::HostArray idx{enc->index_dtype, {nnz, 2}, enc->indices};
    const mcs::HostArray val{mcs::DType::kBFloat16, {nnz}, enc->values};
    std::vector<std::byte> dst(bytes);
    const Timing copy = Measure(opt.reps, [&] { std::memcpy(dst.data(), new_v.data(), bytes); });
    const double ceiling = static_cast<double>(bytes) / copy.min / 1e9;

    std::vector<std::uint16_t>& weight = old_v;  // overwritten in place (idempotent for timing)
    for (mcs::ApplyMode mode : {mcs::ApplyMode::kOverwrite, mcs::ApplyMode::kScatterAdd}) {
        for (int threads : thread_counts) {
            const mcs::MutableHostArray w{mcs::DType::kBFloat16, shape,
                                          std::as_writable_bytes(std::span(weight))};
            const Timing t = Measure(opt.reps, [&] {
                mcs::Status s = mcs::ApplySparse(w, idx, val, mode, threads);
                if (!s.ok()) {
                    std::cerr << s.ToString() << "\n";
                    std::exit(1);
                }
            });
            if (mode == mcs::ApplyMode::kOverwrite && weight != new_v) {
                std::cerr << "apply overwrite did not reproduce new\n";
                std::exit(1);
            }
            const double eps = static_cast<double>(nnz) / t.median;
            const std::size_t entry_bytes = idx.data.size() / static_cast<std::size_t>(nnz) + 2;
            out.Line("{\"what\":\"apply\",\"apply\":\"" + std::string(mcs::ApplyModeName(mode)) +
                     "\",\"dtype\":\"bfloat16\",\"shape\":" + ShapeJson(shape) +
                     ",\"entries\":" + std::to_string(nnz) +
                     ",\"threads\":" + std::to_string(threads) + ",\"seconds\":" + Num(t.median) +
                     ",\"seconds_min\":" + Num(t.min) + ",\"entries_per_s\":" + Num(eps) +
                     ",\"bytes\":" + std::to_string(static_cast<std::size_t>(nnz) * entry_bytes) +
                     ",\"gbps\":" + Num(static_cast<double>(nnz) * entry_bytes / t.median / 1e9) +
                     ",\"gbps_basis\":\"encoded entries\",\"dense_memcpy_seconds\":" +
                     Num(copy.min) + ",\"ceiling_gbps\":" + Num(ceiling) +
                     ",\"ceiling_basis\":\"memcpy 1 thread of the dense weight\"}");
            std::cerr << "apply " << mcs::ApplyModeName(mode) << " threads " << threads << ": "
                      << t.median * 1e3 << " ms (" << eps / 1e6 << " M entries/s; dense memcpy "
                      << copy.min * 1e3 << " ms)\n";
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--json" && i + 1 < argc) {
            opt.json_path = argv[++i];
        } else if (a == "--reps" && i + 1 < argc) {
            opt.reps = std::max(1, std::atoi(argv[++i]));
        } else if (a == "--quick") {
            opt.quick = true;
        } else if (a == "--only" && i + 1 < argc) {
            opt.only = argv[++i];
        } else {
            std::cerr << "usage: encode_bench [--json PATH] [--reps N] [--quick] "
                         "[--only encode_update|build_sparse_object|apply]\n";
            return 2;
        }
    }
    const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<int> thread_counts = {1};
    if (all > 1) thread_counts.push_back(all);
    Emitter out(opt.json_path);
    if (opt.only.empty() || opt.only == "encode_update") BenchEncode(opt, out, thread_counts);
    if (opt.only.empty() || opt.only == "build_sparse_object") BenchBuild(opt, out, thread_counts);
    if (opt.only.empty() || opt.only == "apply") BenchApply(opt, out, thread_counts);
    return 0;
}
