// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// store_bench: throughput of the embedded ObjectStore (docs/design.md §6) against a memcpy ceiling.
//
// For each size it writes one sparse-shaped object (indices uint16 [rows, 2] + values bf16
// [rows], 6 bytes per entry) with kUpsert, then reads it back through ReadRanges as `--ranges`
// aligned row ranges of each member (one batch). Both copy every byte once, so the ceiling is a
// single-thread memcpy of the same number of bytes between warm buffers, measured in the same
// run. A Put also allocates the new object (fresh pages) and frees the replaced one; that cost
// is part of what it measures.
//
// Output contract: one JSON object per line on stdout (what, sizes, bytes, seconds, gbps,
// ceiling_gbps, ...), human text on stderr; `--json PATH` saves the same lines. Seconds are the
// median of `--repeats` runs; GB/s are 1e9 bytes per second.
//
// Usage: store_bench [--sizes_mib 1,16,64] [--repeats 7] [--ranges 64] [--json PATH]

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bench_args.h"
#include "json_lines.h"
#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"

namespace mcs = mooncake::sparse;

namespace {

[[noreturn]] void Die(const std::string& msg) {
    std::fprintf(stderr, "store_bench: %s\n", msg.c_str());
    std::exit(1);
}

void Check(const mcs::Status& s, std::string_view what) {
    if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

struct Options {
    std::vector<std::uint64_t> sizes_mib = {1, 16, 64};
    int repeats = 7;
    std::uint64_t ranges = 64;
    std::string json_path;
};

void Usage() {
    std::fprintf(stderr,
                 "usage: store_bench [--sizes_mib A,B,...] [--repeats N] [--ranges K] "
                 "[--json PATH]\n"
                 "  --sizes_mib   object sizes in MiB (default 1,16,64)\n"
                 "  --repeats     timed runs per measurement; the median is reported (default 7)\n"
                 "  --ranges      row ranges per member in one ReadRanges batch (default 64)\n"
                 "  --json PATH   also write the JSON lines to PATH\n");
}

std::uint64_t ParseUnsigned(std::string_view flag, const std::string& text) {
    const std::optional<std::uint64_t> v = mooncake::sparse::bench::ParsePositive(text);
    if (!v) Die("bad value for " + std::string(flag) + ": '" + text + "'");
    return *v;
}

Options ParseArgs(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            Usage();
            std::exit(0);
        }
        if (i + 1 >= argc) {
            Usage();
            Die("missing value for " + std::string(arg));
        }
        const std::string value = argv[++i];
        if (arg == "--sizes_mib") {
            o.sizes_mib.clear();
            std::size_t pos = 0;
            while (pos <= value.size()) {
                const std::size_t comma = std::min(value.find(',', pos), value.size());
                o.sizes_mib.push_back(ParseUnsigned(arg, value.substr(pos, comma - pos)));
                pos = comma + 1;
            }
        } else if (arg == "--repeats") {
            o.repeats = static_cast<int>(ParseUnsigned(arg, value));
        } else if (arg == "--ranges") {
            o.ranges = ParseUnsigned(arg, value);
        } else if (arg == "--json") {
            o.json_path = value;
        } else {
            Usage();
            Die("unknown flag " + std::string(arg));
        }
    }
    return o;
}

using Emitter = mooncake::sparse::bench::JsonLinesOut;

std::string Number(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    return buf;
}

template <typename Fn>
double MedianSeconds(int repeats, Fn&& fn) {
    fn();  // Warm-up: first-touch and allocator effects of the very first run are not measured.
    std::vector<double> secs;
    secs.reserve(static_cast<std::size_t>(repeats));
    for (int i = 0; i < repeats; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        const auto t1 = std::chrono::steady_clock::now();
        secs.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    return secs[secs.size() / 2];
}

void Fill(std::vector<std::byte>& v, std::uint8_t seed) {
    for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<std::byte>((seed + i * 131) & 0xff);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const Options opt = ParseArgs(argc, argv);
    Emitter emit("store_bench", opt.json_path);
    auto store = mcs::MakeEmbeddedStore();

    std::fprintf(stderr, "%-20s %10s %10s %9s %9s %9s\n", "what", "MiB", "rows", "ms", "GB/s",
                 "ceiling");
    for (const std::uint64_t mib : opt.sizes_mib) {
        const std::uint64_t rows = mib * (1u << 20) / 6;
        const std::uint64_t ranges = std::min(opt.ranges, rows);
        std::vector<std::byte> indices(rows * 4), values(rows * 2);
        Fill(indices, 1);
        Fill(values, 2);
        const std::uint64_t bytes = indices.size() + values.size();
        const auto n = static_cast<mcs::Index>(rows);
        const std::vector<mcs::MemberData> members = {
            {"indices", mcs::DType::kUInt16, {n, 2}, indices, 0},
            {"values", mcs::DType::kBFloat16, {n}, values, 0},
        };
        const std::string key = "bench/" + std::to_string(mib);

        // Ceiling: one thread, memcpy of the same byte count between warm buffers.
        std::vector<std::byte> src(bytes), dst(bytes);
        Fill(src, 3);
        std::memset(dst.data(), 0, dst.size());
        const double ceiling_s =
            MedianSeconds(opt.repeats, [&] { std::memcpy(dst.data(), src.data(), bytes); });
        const double ceiling_gbps = static_cast<double>(bytes) / ceiling_s / 1e9;

        const double put_s = MedianSeconds(opt.repeats, [&] {
            Check(store->Put(key, "metadata", members, {mcs::PutMode::kUpsert, false}), "Put");
        });

        // Read back: `ranges` aligned row ranges of each member, in one batch, into warm buffers.
        std::vector<std::byte> idx_out(indices.size()), val_out(values.size());
        std::memset(idx_out.data(), 0, idx_out.size());
        std::memset(val_out.data(), 0, val_out.size());
        std::vector<mcs::RangeRead> reads;
        reads.reserve(2 * ranges);
        for (std::uint64_t r = 0; r < ranges; ++r) {
            const std::uint64_t begin = rows * r / ranges, end = rows * (r + 1) / ranges;
            reads.push_back({key, "indices", begin, end,
                             std::span(idx_out).subspan(begin * 4, (end - begin) * 4)});
            reads.push_back({key, "values", begin, end,
                             std::span(val_out).subspan(begin * 2, (end - begin) * 2)});
        }
        const double read_s =
            MedianSeconds(opt.repeats, [&] { Check(store->ReadRanges(reads), "ReadRanges"); });
        if (idx_out != indices || val_out != values) Die("read back differs from what was put");

        const std::string sizes =
            "[[" + std::to_string(rows) + ",2],[" + std::to_string(rows) + "]]";
        struct Row {
            const char* what;
            double seconds;
            std::uint64_t items;
        };
        for (const Row& row : {Row{"embedded_put", put_s, 1},
                               Row{"embedded_range_read", read_s, 2 * ranges}}) {
            const double gbps = static_cast<double>(bytes) / row.seconds / 1e9;
            std::string line = "{\"what\":\"" + std::string(row.what) + "\",\"sizes\":" + sizes +
                               ",\"dtypes\":[\"uint16\",\"bfloat16\"],\"bytes\":" +
                               std::to_string(bytes) + ",\"items\":" + std::to_string(row.items) +
                               ",\"seconds\":" + Number(row.seconds) + ",\"gbps\":" + Number(gbps) +
                               ",\"ceiling_gbps\":" + Number(ceiling_gbps) +
                               ",\"ceiling\":\"memcpy_1thread\",\"repeats\":" +
                               std::to_string(opt.repeats) + "}";
            emit.Emit(line);
            std::fprintf(stderr, "%-20s %10" PRIu64 " %10" PRIu64 " %9.3f %9.2f %9.2f\n", row.what,
                         mib, rows, row.seconds * 1e3, gbps, ceiling_gbps);
        }
        Check(store->Remove(key), "Remove");
    }
    return 0;
}
