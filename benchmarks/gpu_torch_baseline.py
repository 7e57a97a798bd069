"""torch baselines on the GPU for the same encode/apply work as gpu_codec_bench (JSON lines).

encode: nonzero of (new != old) + a sort of the entries by (tile, element); apply: index_put_ /
index_add_ of the entries into a weight. Timed with CUDA events, median of repeats.
"""

import argparse
import json

import torch


def median_ms(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=7168)
    ap.add_argument("--cols", type=int, default=16384)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, cols = args.rows, args.cols
    tr, tc = -(-rows // 8), -(-cols // 8)  # DefaultTileShape: 8 tiles per dim
    out = []
    for density in (0.001, 0.01, 0.1):
        old = (torch.rand(rows, cols, device="cuda") * 0.04 - 0.02).to(torch.bfloat16)
        new = old.clone()
        mask = torch.rand(rows, cols, device="cuda") < density
        new[mask] = new[mask] + 1e-3

        def encode():
            nz = (new.view(torch.int16) != old.view(torch.int16)).nonzero()
            key = ((nz[:, 0] // tr) * ((cols + tc - 1) // tc) + nz[:, 1] // tc) * (rows * cols) + nz[:, 0] * cols + nz[:, 1]
            order = torch.argsort(key)
            nz = nz[order]
            return nz, new[nz[:, 0], nz[:, 1]]

        idx, vals = encode()
        w = old.clone()
        flat = idx[:, 0] * cols + idx[:, 1]

        def apply_add():
            w.view(-1).index_add_(0, flat, vals)

        def apply_put():
            w.view(-1).index_put_((flat,), vals)

        rec = {"what": "torch_baseline", "shape": [rows, cols], "density": density, "nnz": int(idx.shape[0]),
               "encode_nonzero_sort_ms": median_ms(encode), "apply_index_add_ms": median_ms(apply_add),
               "apply_index_put_ms": median_ms(apply_put), "torch": torch.__version__}
        print(json.dumps(rec))
        out.append(rec)
    if args.json:
        with open(args.json, "w") as f:
            for r in out:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
