// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Scattered ranges of page-locked host memory into device memory, as a device read gathers a
// step's unique entry ranges (src/cuda/gpu_read.h): the gather kernel (cuda::GatherToDevice,
// SMs reading host memory over PCIe), one copy-engine transfer per range (cudaMemcpyAsync), and
// one batched call (cudaMemcpyBatchAsync), against the ceiling of the same run: one contiguous
// pinned host-to-device copy of the same bytes. Every method's bytes are checked. JSON lines on
// stdout, one per (range size, method).
//
//   gpu_gather_bench [--total-mib 256] [--iters 5] [--json PATH]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/gpu_read.h"

using namespace mooncake::sparse;

#define CHECK_CUDA(x)                                                               \
    do {                                                                            \
        cudaError_t e = (x);                                                        \
        if (e != cudaSuccess) {                                                     \
            std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e));     \
            std::exit(2);                                                           \
        }                                                                           \
    } while (0)

namespace {

FILE* g_json = nullptr;

void Emit(const std::string& line) {
    std::printf("%s\n", line.c_str());
    if (g_json != nullptr) std::fprintf(g_json, "%s\n", line.c_str());
}

double Median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/// Milliseconds of `fn` (which enqueues on `s`), median of `iters` runs after one warm-up.
template <typename Fn>
double TimeMs(cudaStream_t s, int iters, Fn&& fn) {
    fn();
    CHECK_CUDA(cudaStreamSynchronize(s));
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        CHECK_CUDA(cudaStreamSynchronize(s));
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return Median(ms);
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t total_mib = 256;
    int iters = 5;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--total-mib" && i + 1 < argc) total_mib = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
        else if (a == "--json" && i + 1 < argc) g_json = std::fopen(argv[++i], "w");
        else {
            std::fprintf(stderr, "usage: gpu_gather_bench [--total-mib N] [--iters N] [--json PATH]\n");
            return 2;
        }
    }
    const std::uint64_t total = total_mib << 20;
    // Ranges lie in every other slot of a host buffer twice their total: scattered, as a read's
    // ranges lie among the entries other nodes need.
    std::byte* host = nullptr;
    CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), 2 * total, cudaHostAllocDefault));
    std::mt19937_64 rng(7);
    for (std::uint64_t i = 0; i < 2 * total; i += 8) {
        const std::uint64_t v = rng();
        std::memcpy(host + i, &v, 8);
    }
    void* dev = nullptr;
    CHECK_CUDA(cudaMalloc(&dev, total + (1 << 20)));
    std::vector<std::byte> back(total + (1 << 20));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const auto dev_host = cuda::DeviceAddressOfHost(host, 0);
    if (!dev_host) {
        std::fprintf(stderr, "the device cannot address page-locked host memory\n");
        return 2;
    }
    const double ceiling_ms =
        TimeMs(s, iters, [&] { CHECK_CUDA(cudaMemcpyAsync(dev, host, total, cudaMemcpyHostToDevice, s)); });
    const double ceiling_gbps = double(total) / ceiling_ms / 1e6;
    char line[512];
    for (std::uint64_t size : {std::uint64_t(4) << 10, std::uint64_t(16) << 10, std::uint64_t(64) << 10,
                               std::uint64_t(256) << 10, std::uint64_t(1) << 20, std::uint64_t(4) << 20}) {
        // Range k: host slot 2k (unaligned by k % 16 bytes, as entry ranges are), device offset
        // packed, with the host's alignment modulo 16 (as a device read lays its staging out).
        const std::uint64_t n = total / size;
        std::vector<cuda::GatherCopy> copies(n);
        std::vector<void*> dsts(n);
        std::vector<const void*> srcs(n);
        std::vector<std::size_t> sizes(n);
        std::uint64_t at = 0;
        for (std::uint64_t k = 0; k < n; ++k) {
            const std::uint64_t src_off = 2 * k * size + (k % 16) * 2;
            const std::uint64_t bytes = size - 32;
            at = (at + 15) / 16 * 16 + (src_off & 15);
            copies[k] = {*dev_host + src_off, bytes, at};
            dsts[k] = static_cast<std::byte*>(dev) + at;
            srcs[k] = host + src_off;
            sizes[k] = bytes;
            at += bytes;
        }
        const auto verify = [&](const char* method) {
            CHECK_CUDA(cudaMemset(dev, 0, total));
            return method;
        };
        const auto check_bytes = [&](const char* method) {
            CHECK_CUDA(cudaMemcpy(back.data(), dev, at, cudaMemcpyDeviceToHost));
            for (std::uint64_t k = 0; k < n; ++k) {
                const std::uint64_t d = copies[k].dst_offset;
                if (std::memcmp(back.data() + d, srcs[k], sizes[k]) != 0) {
                    std::fprintf(stderr, "%s: range %llu differs\n", method, (unsigned long long)k);
                    std::exit(1);
                }
            }
        };
        const auto report = [&](const char* method, double ms) {
            std::snprintf(line, sizeof(line),
                          "{\"what\": \"gather\", \"method\": \"%s\", \"range_bytes\": %llu, "
                          "\"ranges\": %llu, \"bytes\": %llu, \"ms\": %.4f, \"gbps\": %.2f, "
                          "\"ceiling_gbps\": %.2f, \"ratio\": %.3f}",
                          method, (unsigned long long)(size - 32), (unsigned long long)n,
                          (unsigned long long)at, ms, double(at) / ms / 1e6, ceiling_gbps,
                          double(at) / ms / 1e6 / ceiling_gbps);
            Emit(line);
        };
        verify("kernel");
        const double kernel_ms = TimeMs(s, iters, [&] {
            if (!cuda::GatherToDevice(copies, {reinterpret_cast<std::uintptr_t>(dev), 0},
                                      reinterpret_cast<std::uintptr_t>(s)).ok()) {
                std::exit(2);
            }
        });
        check_bytes("kernel");
        report("kernel", kernel_ms);
        verify("memcpy_per_range");
        const double each_ms = TimeMs(s, iters, [&] {
            for (std::uint64_t k = 0; k < n; ++k) {
                CHECK_CUDA(cudaMemcpyAsync(dsts[k], srcs[k], sizes[k], cudaMemcpyHostToDevice, s));
            }
        });
        check_bytes("memcpy_per_range");
        report("memcpy_per_range", each_ms);
        verify("memcpy_batch");
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        std::size_t attr_index = 0;
        const double batch_ms = TimeMs(s, iters, [&] {
            CHECK_CUDA(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, &attr,
                                            &attr_index, 1, s));
        });
        check_bytes("memcpy_batch");
        report("memcpy_batch", batch_ms);
    }
    CHECK_CUDA(cudaFreeHost(host));
    CHECK_CUDA(cudaFree(dev));
    if (g_json != nullptr) std::fclose(g_json);
    return 0;
}
