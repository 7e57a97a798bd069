#!/usr/bin/env bash
# Builds and runs the GPU codec benchmark + torch baselines on a CUDA machine (sm_90 default).
# Usage: benchmarks/run_gpu_codec.sh OUTDIR [extra include dir for xxhash.h]
set -euo pipefail
out="${1:?OUTDIR}"; extra_inc="${2:-}"
arch="${CUDA_ARCH:-sm_90}"
b="$(mktemp -d)"
inc=(-Iinclude -Isrc); [[ -n "${extra_inc}" ]] && inc+=(-I"${extra_inc}")
for f in src/codec/*.cc; do
    g++ -std=c++20 -O2 -fPIC "${inc[@]}" -c "$f" -o "$b/$(basename "$f").o" &
done
nvcc -std=c++20 -O3 -arch="${arch}" "${inc[@]}" -c src/cuda/gpu_codec.cu -o "$b/gpu_codec.o" &
nvcc -std=c++20 -O3 -arch="${arch}" "${inc[@]}" -c benchmarks/gpu_codec_bench.cu -o "$b/bench.o" &
wait
nvcc -arch="${arch}" "$b"/*.o -o "$b/gpu_codec_bench" -lpthread
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "${out}/device.txt"
"$b/gpu_codec_bench" --json "${out}/gpu_codec.jsonl"
python3 benchmarks/gpu_torch_baseline.py --json "${out}/gpu_torch_baseline.jsonl"
