// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// GPU encode/apply: correctness against the CPU codec on fresh random data, then timings with
// CUDA events, each line with the ceiling measured in the same run (device-to-device copy of
// the bytes the kernel must at least read). JSON lines on stdout, text on stderr.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "cuda/gpu_codec.h"

using namespace mooncake::sparse;

#define CHECK_CUDA(x)                                                                   \
    do {                                                                                \
        cudaError_t e = (x);                                                            \
        if (e != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e));         \
            std::exit(2);                                                               \
        }                                                                               \
    } while (0)

static FILE* g_json = nullptr;
static void Emit(const std::string& line) {
    std::printf("%s\n", line.c_str());
    if (g_json) std::fprintf(g_json, "%s\n", line.c_str());
}

__device__ __forceinline__ std::uint64_t Mix(std::uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

__global__ void FillKernel(__nv_bfloat16* old_w, __nv_bfloat16* new_w, std::uint64_t n, std::uint64_t seed,
                           double density) {
    const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const std::uint64_t h = Mix(i ^ seed);
    const float v = (float((h >> 40) & 0xffff) / 65536.0f - 0.5f) * 0.04f;
    old_w[i] = __float2bfloat16_rn(v);
    const std::uint64_t h2 = Mix(h + 0x9e3779b97f4a7c15ull);
    const bool change = double(h2 & 0xffffffffull) < density * 4294967296.0;
    new_w[i] = change ? __float2bfloat16_rn(v + (float((h2 >> 40) & 0xff) + 1.0f) * 1e-4f) : old_w[i];
}

template <typename F>
static float TimeMs(F&& f, int reps) {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    f();  // warm-up
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> times;
    for (int r = 0; r < reps; ++r) {
        CHECK_CUDA(cudaEventRecord(a));
        f();
        CHECK_CUDA(cudaEventRecord(b));
        CHECK_CUDA(cudaEventSynchronize(b));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
        times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

template <typename T>
static std::vector<T> ToHost(std::uintptr_t p, std::uint64_t count) {
    std::vector<T> h(count);
    if (count) CHECK_CUDA(cudaMemcpy(h.data(), reinterpret_cast<void*>(p), count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

int main(int argc, char** argv) {
    std::int64_t rows = 7168, cols = 16384;
    int reps = 20;
    std::vector<double> densities = {0.001, 0.01, 0.1};
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--json" && i + 1 < argc) g_json = std::fopen(argv[++i], "w");
        else if (a == "--rows" && i + 1 < argc) rows = std::atoll(argv[++i]);
        else if (a == "--cols" && i + 1 < argc) cols = std::atoll(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    }
    if (!cuda::Available()) {
        std::fprintf(stderr, "no CUDA device: skipping\n");
        return 0;
    }
    const std::uint64_t n = std::uint64_t(rows) * cols;
    const std::uint64_t bytes = n * 2;
    __nv_bfloat16 *old_w, *new_w, *work, *scratch;
    CHECK_CUDA(cudaMalloc(&old_w, bytes));
    CHECK_CUDA(cudaMalloc(&new_w, bytes));
    CHECK_CUDA(cudaMalloc(&work, bytes));
    CHECK_CUDA(cudaMalloc(&scratch, 2 * bytes));
    // Ceiling: a device-to-device copy of the two tensors encode must read (read + write).
    const float copy_ms = TimeMs([&] {
        CHECK_CUDA(cudaMemcpyAsync(scratch, old_w, bytes, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaMemcpyAsync(scratch + n, new_w, bytes, cudaMemcpyDeviceToDevice));
    }, reps);
    const double d2d_gbps = 2.0 * 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
    const std::uint64_t seed = std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    bool all_ok = true;

    for (double density : densities) {
        FillKernel<<<unsigned((n + 255) / 256), 256>>>(old_w, new_w, n, seed + std::uint64_t(density * 1e6), density);
        CHECK_CUDA(cudaDeviceSynchronize());
        cuda::DeviceArray dn{DType::kBFloat16, {rows, cols}, {reinterpret_cast<std::uintptr_t>(new_w), 0}, bytes};
        cuda::DeviceArray dold{DType::kBFloat16, {rows, cols}, {reinterpret_cast<std::uintptr_t>(old_w), 0}, bytes};

        for (ApplyMode mode : {ApplyMode::kOverwrite, ApplyMode::kScatterAdd}) {
            cuda::GpuEncodeOptions opt;
            opt.apply = mode;
            auto enc = cuda::EncodeUpdate(dn, dold, opt);
            if (!enc.ok()) {
                std::fprintf(stderr, "encode failed: %s\n", enc.status().ToString().c_str());
                return 1;
            }
            // Correctness: identical to the CPU codec on the same data.
            std::vector<std::uint16_t> h_new = ToHost<std::uint16_t>(reinterpret_cast<std::uintptr_t>(new_w), n);
            std::vector<std::uint16_t> h_old = ToHost<std::uint16_t>(reinterpret_cast<std::uintptr_t>(old_w), n);
            HostArray hn{DType::kBFloat16, {rows, cols}, std::as_bytes(std::span(h_new))};
            HostArray ho{DType::kBFloat16, {rows, cols}, std::as_bytes(std::span(h_old))};
            EncodeUpdateOptions copt;
            copt.apply = mode;
            auto cpu = EncodeUpdate(hn, ho, copt);
            bool same = cpu.ok() && cpu->nnz == enc->nnz && cpu->index_dtype == enc->index_dtype;
            if (same) {
                auto gi = ToHost<std::byte>(enc->indices.address, enc->indices_bytes());
                auto gv = ToHost<std::byte>(enc->values.address, enc->values_bytes());
                same = gi == cpu->indices && gv == cpu->values;
                // Tile index: tiles strictly increasing, ptr consistent with the entries.
                auto tc = ToHost<std::uint32_t>(enc->tile_coords.address, enc->num_tiles * 2);
                auto tp = ToHost<std::uint64_t>(enc->tile_ptr.address, enc->num_tiles + 1);
                const auto* idx = reinterpret_cast<const std::uint16_t*>(gi.data());
                for (std::uint64_t t = 0; same && t < enc->num_tiles; ++t) {
                    same = tp[t] < tp[t + 1];
                    for (std::uint64_t e = tp[t]; same && e < tp[t + 1]; ++e) {
                        same = idx[2 * e] / enc->tile_shape[0] == tc[2 * t] &&
                               idx[2 * e + 1] / enc->tile_shape[1] == tc[2 * t + 1];
                    }
                }
                same = same && tp[0] == 0 && tp[enc->num_tiles] == enc->nnz;
            }
            // Apply: old + object == new (bit for bit for overwrite; exact here for scatter_add
            // too because the generated deltas are exact in bfloat16 arithmetic or compared in
            // float tolerance below).
            CHECK_CUDA(cudaMemcpy(work, old_w, bytes, cudaMemcpyDeviceToDevice));
            cuda::DeviceArray dw{DType::kBFloat16, {rows, cols}, {reinterpret_cast<std::uintptr_t>(work), 0}, bytes};
            cuda::DeviceArray di{enc->index_dtype, {Index(enc->nnz), 2}, enc->indices, enc->indices_bytes()};
            cuda::DeviceArray dv{DType::kBFloat16, {Index(enc->nnz)}, enc->values, enc->values_bytes()};
            Status st = cuda::ApplySparse(dw, di, dv, mode);
            CHECK_CUDA(cudaDeviceSynchronize());
            auto h_work = ToHost<std::uint16_t>(reinterpret_cast<std::uintptr_t>(work), n);
            std::uint64_t mismatches = 0;
            double max_err = 0;
            for (std::uint64_t i = 0; i < n; ++i) {
                if (h_work[i] != h_new[i]) {
                    const double a = BFloat16ToFloat(h_work[i]), b = BFloat16ToFloat(h_new[i]);
                    max_err = std::max(max_err, std::abs(a - b));
                    // scatter_add in bfloat16 rounds twice (the delta, then the sum): allow
                    // one rounding of the larger of old and new.
                    const double o = BFloat16ToFloat(h_old[i]);
                    const double tol = std::max(std::abs(o), std::abs(b)) * 0x1p-7 + 1e-7;
                    if (mode == ApplyMode::kOverwrite || std::abs(a - b) > tol) ++mismatches;
                }
            }
            const bool ok = st.ok() && same && mismatches == 0;
            all_ok &= ok;
            // Timings.
            const float enc_ms = TimeMs([&] { auto r = cuda::EncodeUpdate(dn, dold, opt); (void)r; }, reps);
            const float apply_ms = TimeMs([&] { Status s2 = cuda::ApplySparse(dw, di, dv, mode); (void)s2; }, reps);
            char line[1024];
            std::snprintf(line, sizeof line,
                          "{\"what\":\"gpu_encode\",\"dtype\":\"bfloat16\",\"shape\":[%lld,%lld],\"density\":%g,"
                          "\"apply\":\"%s\",\"nnz\":%llu,\"tiles\":%llu,\"encode_ms\":%.4f,\"goal_ms\":0.5,"
                          "\"input_gbps\":%.1f,\"ceiling_gbps\":%.1f,\"ceiling\":\"d2d copy read+write\","
                          "\"matches_cpu_codec\":%s,\"round_trip_ok\":%s}",
                          (long long)rows, (long long)cols, density, std::string(ApplyModeName(mode)).c_str(),
                          (unsigned long long)enc->nnz, (unsigned long long)enc->num_tiles, enc_ms,
                          2.0 * bytes / (enc_ms * 1e-3) / 1e9, d2d_gbps, same ? "true" : "false", ok ? "true" : "false");
            Emit(line);
            std::snprintf(line, sizeof line,
                          "{\"what\":\"gpu_apply\",\"dtype\":\"bfloat16\",\"shape\":[%lld,%lld],\"density\":%g,"
                          "\"apply\":\"%s\",\"nnz\":%llu,\"apply_ms\":%.4f,\"goal_ms\":0.15,"
                          "\"entries_per_s\":%.3e,\"ceiling_gbps\":%.1f,\"max_abs_error\":%g,\"round_trip_ok\":%s}",
                          (long long)rows, (long long)cols, density, std::string(ApplyModeName(mode)).c_str(),
                          (unsigned long long)enc->nnz, apply_ms, enc->nnz / (apply_ms * 1e-3), d2d_gbps, max_err,
                          ok ? "true" : "false");
            Emit(line);
        }
    }
    // Invalid input leaves the weight unchanged.
    {
        std::uint16_t bad_idx[2] = {std::uint16_t(rows - 1), 65535};
        std::uint16_t* di_ptr;
        CHECK_CUDA(cudaMalloc(&di_ptr, sizeof bad_idx));
        CHECK_CUDA(cudaMemcpy(di_ptr, bad_idx, sizeof bad_idx, cudaMemcpyHostToDevice));
        cuda::DeviceArray dw{DType::kBFloat16, {rows, cols}, {reinterpret_cast<std::uintptr_t>(work), 0}, bytes};
        cuda::DeviceArray di{DType::kUInt16, {1, 2}, {reinterpret_cast<std::uintptr_t>(di_ptr), 0}, 4};
        cuda::DeviceArray dv{DType::kBFloat16, {1}, {reinterpret_cast<std::uintptr_t>(old_w), 0}, 2};
        Status st = cuda::ApplySparse(dw, di, dv, ApplyMode::kOverwrite);
        const bool rejected = cols < 65536 && st.code() == StatusCode::kInvalidArgument;
        all_ok &= rejected;
        std::fprintf(stderr, "out-of-range apply rejected: %s (%s)\n", rejected ? "yes" : "NO", st.ToString().c_str());
    }
    std::fprintf(stderr, "gpu codec: %s\n", all_ok ? "all checks passed" : "CHECKS FAILED");
    if (g_json) std::fclose(g_json);
    return all_ok ? 0 : 1;
}
