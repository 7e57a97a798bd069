#!/usr/bin/env python3
"""Cross-node tensor benchmark (docs/multi_node.md, "Tensors across nodes"): a real
mooncake_master, node A's and node B's daemons (python -m mooncake.sparse.node on
--store mooncake://, 127.0.0.1 and 127.0.0.2, TCP), tensors put through A's daemon and read on
node B three ways, in the same run:

  daemon        a client of node B's daemon: get_tensor_into / batch_get_tensor_into (B's daemon
                reads A's replica with one TransferEngine batch into its registered memory, then
                copies into the caller's tensor: memcpy through the client buffer for a CPU
                tensor, CUDA IPC for a CUDA one);
  upstream      upstream's own client on node B (MooncakeDistributedStore, 127.0.0.2):
                get_tensor_into / batch_get_tensor_into into a registered host tensor (then
                .copy_ into the CUDA tensor when --device cuda);
  te_ceiling    a raw TransferEngine read of the same replica bytes (the addresses the master
                reports) into registered memory on node B: one batch_transfer_sync_read per
                batch. The ceiling of this run (`ceiling_gbps` on every line).

and on node A itself:

  local         a client of node A's daemon reading A's own replicas into the same destinations
                (no transfer: the replica is in A's segment, which is page-locked where CUDA is
                present, so a CUDA read is one pinned host-to-device copy). Its ceiling is the
                same run's pinned host-to-device copy (--device cuda) or host memcpy (cpu) of
                the same bytes (`xnode_local_get` lines).

Each size runs the four paths in turn, `--iters` rounds (after one warm-up each), and reports
each path's median.

One JSON object per result line on stdout (and in --json PATH); human text on stderr.

    python benchmarks/xnode_tensor_bench.py --json out.jsonl
    python benchmarks/xnode_tensor_bench.py --sizes-mib 1 4 --batch 8x1 --iters 3
    python benchmarks/xnode_tensor_bench.py --device cuda     # a CUDA host (two daemons on it)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

MiB = 1 << 20


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class Emitter:
    def __init__(self, path):
        self.file = open(path, "w") if path else None

    def __call__(self, record):
        line = json.dumps(record)
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


def timed_round_robin(fns, iters, sync=None):
    """{name: median seconds}: one untimed warm-up of each, then `iters` rounds that run every
    path once in turn, so that all paths see the same conditions (a loaded host, TCP)."""
    for fn in fns.values():
        fn()
    if sync:
        sync()
    times = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if sync:
                sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes-mib", type=int, nargs="*", default=[1, 4, 16, 64],
                   help="single-tensor sizes (MiB)")
    p.add_argument("--batch", default="16x4", help="batch COUNTxMIB ('' for none)")
    p.add_argument("--iters", type=int, default=9)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the destination tensors live (cuda: when torch sees a GPU)")
    p.add_argument("--segment-mib", type=int, default=0,
                   help="node A's segment (default: room for every tensor twice)")
    p.add_argument("--json", help="also write the JSON lines here")
    args = p.parse_args(argv)

    import torch

    import mooncake.sparse as mcs
    from mooncake.engine import TransferEngine
    from mooncake.store import MooncakeDistributedStore
    from mooncake.sparse.testing import start_mooncake_master, start_python_node_daemon

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        log("no CUDA device: --device cuda needs one")
        return 2
    emit = Emitter(args.json)
    if device == "cuda":
        # The pinned host-to-device ceiling of this host, same run: where a read lands after
        # the network (the daemon's pinned memory -> the caller's CUDA tensor).
        n = 256 * MiB
        h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        d = torch.empty(n, dtype=torch.uint8, device="cuda")
        d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            d.copy_(h, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        emit({"what": "xnode_pinned_ceiling", "device": device, "bytes": n,
              "gbps": n / best / 1e9})
        del h, d
    else:
        # The host memcpy ceiling of this host, same run: a local read's copy out of the segment.
        n = 256 * MiB
        h, d = torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            d.copy_(h)
            best = min(best, time.perf_counter() - t)
        emit({"what": "xnode_memcpy_ceiling", "device": device, "bytes": n,
              "gbps": n / best / 1e9})
        del h, d
    local_ceiling = {"what": "xnode_pinned_ceiling" if device == "cuda" else
                     "xnode_memcpy_ceiling", "gbps": n / best / 1e9}
    batches = []
    if args.batch:
        count, mib = (int(x) for x in args.batch.lower().split("x"))
        batches.append((count, mib))
    cases = [(1, s) for s in args.sizes_mib] + batches
    total = sum(n * s for n, s in cases) * MiB
    segment = args.segment_mib * MiB or max(64 * MiB, 2 * total + 64 * MiB)
    landing = max(n * s for n, s in cases) * MiB + MiB

    tmp = tempfile.mkdtemp(prefix="xnode-bench-")
    with start_mooncake_master(tmp) as master:
        url_a = master.url(local_hostname="127.0.0.1", segment_bytes=segment,
                           buffer_bytes=64 * MiB)
        url_b = master.url(local_hostname="127.0.0.2", segment_bytes=16 * MiB,
                           buffer_bytes=64 * MiB)
        with start_python_node_daemon(tmp, url_a, node_id="nodeA") as da, \
                start_python_node_daemon(tmp, url_b, node_id="nodeB") as db:
            a, b = mcs.connect(da.url), mcs.connect(db.url)
            up = MooncakeDistributedStore()  # upstream's own client on node B
            if up.setup("127.0.0.2", master.metadata, 16 * MiB, 64 * MiB, "tcp", "",
                        master.address) != 0:
                log("upstream client setup failed")
                return 1
            te = TransferEngine()  # the raw ceiling on node B
            if te.initialize("127.0.0.2", master.metadata, "tcp", "") != 0:
                log("TransferEngine initialize failed")
                return 1
            up_buf = torch.empty(landing, dtype=torch.uint8)
            te_buf = torch.empty(landing, dtype=torch.uint8)
            assert up.register_buffer(up_buf.data_ptr(), up_buf.numel()) == 0
            assert te.register_memory(te_buf.data_ptr(), te_buf.numel()) == 0
            sync = torch.cuda.synchronize if device == "cuda" else None
            machine = {"device": device, "protocol": "tcp", "nodes": "127.0.0.1 -> 127.0.0.2"}
            for n, mib in cases:
                nbytes = mib * MiB
                elems = nbytes // 2
                keys = [f"bench/{n}x{mib}/{i}" for i in range(n)]
                src = [torch.randint(-32768, 32767, (elems,), dtype=torch.int16)
                       .view(torch.bfloat16).reshape(-1, 1024) for _ in range(n)]
                a.batch_put_tensor(keys, src)  # through node A's daemon: replicas in A
                dsts = [torch.empty_like(t, device=device) for t in src]
                what = "xnode_get" if n == 1 else "xnode_batch_get"
                total_bytes = n * nbytes

                # The raw TransferEngine read of the same replicas (ceiling).
                desc = up.batch_get_replica_desc(keys)
                where = [desc[k][0].get_memory_descriptor().buffer_descriptor for k in keys]
                endpoint = where[0].transport_endpoint
                assert all(w.transport_endpoint == endpoint for w in where)
                sizes = [int(w.size) for w in where]
                offs, at = [], 0
                for s in sizes:
                    offs.append(at)
                    at += s
                local = [te_buf.data_ptr() + o for o in offs]
                remote = [int(w.buffer_address) for w in where]

                def te_read():
                    rc = te.batch_transfer_sync_read(endpoint, local, remote, sizes)
                    assert rc == 0, rc

                def daemon_get():
                    if n == 1:
                        b.get_tensor_into(keys[0], dsts[0])
                    else:
                        b.batch_get_tensor_into(keys, dsts)

                def local_get():
                    if n == 1:
                        a.get_tensor_into(keys[0], dsts[0])
                    else:
                        a.batch_get_tensor_into(keys, dsts)

                def upstream_get():
                    ptrs = [up_buf.data_ptr() + o for o in offs]
                    if n == 1:
                        got = [up.get_tensor_into(keys[0], ptrs[0], sizes[0])]
                    else:
                        got = up.batch_get_tensor_into(keys, ptrs, sizes)
                    for t, d in zip(got, dsts):
                        assert isinstance(t, torch.Tensor), t
                        if device == "cuda":
                            d.copy_(t.view(d.dtype).reshape(d.shape), non_blocking=False)

                medians = timed_round_robin({"te_ceiling": te_read, "daemon": daemon_get,
                                             "upstream": upstream_get, "local": local_get},
                                            args.iters, sync)
                ceiling = total_bytes / medians["te_ceiling"] / 1e9
                for path in ("daemon", "upstream", "te_ceiling"):
                    s = medians[path]
                    gbps = total_bytes / s / 1e9
                    rec = {"what": what, "path": path, "tensors": n, "tensor_bytes": nbytes,
                           "bytes": total_bytes, "seconds": s, "gbps": gbps,
                           "ceiling_gbps": ceiling, "ratio": gbps / ceiling, **machine}
                    emit(rec)
                    log(f"{what:16s} {n:3d} x {mib:4d} MiB  {path:10s} {gbps:6.2f} GB/s "
                        f"({gbps / ceiling:4.2f} of the TE ceiling {ceiling:5.2f})")
                s = medians["local"]
                gbps = total_bytes / s / 1e9
                emit({"what": "xnode_local_get", "path": "local", "tensors": n,
                      "tensor_bytes": nbytes, "bytes": total_bytes, "seconds": s, "gbps": gbps,
                      "ceiling": local_ceiling["what"], "ceiling_gbps": local_ceiling["gbps"],
                      "ratio": gbps / local_ceiling["gbps"], "device": device,
                      "nodes": "127.0.0.1 (its own replica)"})
                log(f"{'xnode_local_get':16s} {n:3d} x {mib:4d} MiB  {'local':10s} "
                    f"{gbps:6.2f} GB/s ({gbps / local_ceiling['gbps']:4.2f} of the "
                    f"{'pinned H2D' if device == 'cuda' else 'memcpy'} ceiling "
                    f"{local_ceiling['gbps']:5.2f})")
                # Bit-exact check of the last daemon read, and of the last local one.
                for get in (local_get, daemon_get):
                    get()
                    for t, d in zip(src, dsts):
                        assert torch.equal(d.cpu().view(torch.int16), t.view(torch.int16))
                ma = a.metrics()
                emit({"what": "xnode_local_counters", "tensors": n, "tensor_bytes": nbytes,
                      "local_views": ma["tensor_store_local_views"],
                      "pinned_copies": ma["tensor_pinned_copies"],
                      "pageable_copies": ma["tensor_pageable_copies"]})
                m = b.metrics()
                emit({"what": "xnode_counters", "tensors": n, "tensor_bytes": nbytes,
                      "local_views": m["tensor_store_local_views"],
                      "remote_views": m["tensor_store_remote_views"],
                      "batch_transfers": m["tensor_store_batch_transfers"]})
                for k in keys:
                    up.remove(k, True)
            up.unregister_buffer(up_buf.data_ptr())
            up.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
