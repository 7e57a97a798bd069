#!/usr/bin/env python3
"""Side by side: upstream Mooncake Store's tensor calls against this library's (docs/design.md §5-6),
same sizes, same run, same ceiling, on one CUDA host.

Backends (bf16 CUDA tensors of 64 MiB, 256 MiB, 1 GiB; a new key per put):
  upstream_dummy     upstream's DummyClient (setup_dummy) of its standalone mooncake_client
                     (the node-level RealClient owning the segment): put_tensor /
                     get_tensor_into_cuda
  upstream_embedded  upstream's in-process client (setup, own segment): same calls
  ours_embedded      mooncake.sparse connect(): put_tensor / get_tensor_into
  ours_daemon        mooncake.sparse DummyClient -> mooncake_sparse_node (CUDA IPC)
  ours_mooncake      mooncake.sparse connect("mooncake://..."): this library's tensor path on
                     upstream's store through its Python API (host staging on both sides)

Every line carries ceiling_gbps: cudaMemcpy through pinned memory measured in this run (D2H for
puts, H2D for gets), and pageable_gbps alongside. Also checks interop on the GPU: a tensor put by
this library on the mooncake:// store is read by upstream's get_tensor_into_cuda, and the
reverse, with equal bytes.

    python benchmarks/upstream_tensor_bench.py --json out.jsonl [--sizes-mib 64,256,1024]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tensor_bench import Emitter, MiB, cuda_ceilings, gbps, log, timed  # noqa: E402


def mooncake_client_binary() -> str:
    import mooncake

    for base in mooncake.__path__:
        p = Path(base) / "mooncake_client"
        if os.access(p, os.X_OK):
            return str(p)
    import shutil

    found = shutil.which("mooncake_client")
    if not found:
        raise SystemExit("upstream's mooncake_client not found")
    return found


class UpstreamCalls:
    """put / get_into / remove on an upstream MooncakeDistributedStore."""

    def __init__(self, client, torch):
        self.c, self.torch = client, torch

    def put(self, key, t):
        rc = self.c.put_tensor(key, t)
        if rc != 0:
            raise RuntimeError(f"upstream put_tensor({key}) = {rc}")

    def get_into(self, key, out):
        rc = self.c.get_tensor_into_cuda(key, out)
        if rc is not None and int(rc) < 0:
            raise RuntimeError(f"upstream get_tensor_into_cuda({key}) = {rc}")

    def remove(self, key):
        self.c.remove(key, True)


class OurCalls:
    def __init__(self, store):
        self.s = store

    def put(self, key, t):
        self.s.put_tensor(key, t)

    def get_into(self, key, out):
        self.s.get_tensor_into(key, out)

    def remove(self, key):
        try:
            self.s.objects.remove(key)
        except Exception:  # noqa: BLE001 - absent is fine
            pass


def bench_backend(name, calls, torch, sizes, iters, ceilings, emit):
    sync = torch.cuda.synchronize
    for size in sizes:
        c = ceilings[size]
        t = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda").normal_()
        out = torch.empty_like(t)
        keys = [f"bench/{name}/{size // MiB}/{i}" for i in range(iters + 1)]
        base = dict(backend=name, device="cuda", dtype="bfloat16", tensor_bytes=size, count=1,
                    bytes=size, iters=iters)
        try:
            first, med, _ = timed(lambda i: calls.put(keys[i], t), iters, sync,
                                  setup=lambda i: calls.remove(keys[i - 1]) if i else None)
            emit({"what": "tensor_put", **base, "seconds": med, "gbps": gbps(size, med),
                  "first_seconds": first, "ceiling_gbps": c["pinned_d2h_gbps"],
                  "ceiling": "pinned_d2h", "ratio": gbps(size, med) / c["pinned_d2h_gbps"],
                  "pageable_gbps": c["pageable_d2h_gbps"]})
            key = keys[iters]
            first, med, _ = timed(lambda i: calls.get_into(key, out), iters, sync)
            ok = bool(torch.equal(out, t))
            emit({"what": "tensor_get_into", **base, "seconds": med, "gbps": gbps(size, med),
                  "first_seconds": first, "ceiling_gbps": c["pinned_h2d_gbps"],
                  "ceiling": "pinned_h2d", "ratio": gbps(size, med) / c["pinned_h2d_gbps"],
                  "pageable_gbps": c["pageable_h2d_gbps"], "bytes_equal": ok})
            if not ok:
                raise RuntimeError("get_into returned different bytes")
            calls.remove(key)
            log(f"  {name:<18} {size // MiB:5d} MiB done")
        except Exception as e:  # noqa: BLE001 - report and go on with the other backends
            emit({"what": "error", **base, "error": f"{type(e).__name__}: {e}"})
            log(f"  {name:<18} {size // MiB:5d} MiB FAILED: {e}")
        del t, out
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sizes-mib", default="64,256,1024")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--backends", default="upstream_dummy,upstream_embedded,ours_embedded,"
                                          "ours_daemon,ours_mooncake")
    args = ap.parse_args(argv)
    import torch

    import mooncake.sparse as mcs
    from mooncake.sparse.testing import start_mooncake_master, start_node_daemon
    from mooncake.store import MooncakeDistributedStore

    emit = Emitter(args.json)
    sizes = [int(s) * MiB for s in args.sizes_mib.split(",")]
    backends = args.backends.split(",")
    segment = max(4 << 30, 3 * max(sizes))
    ceilings = {s: cuda_ceilings(torch, s, args.iters) for s in sizes}
    for s in sizes:
        emit({"what": "ceiling", "tensor_bytes": s, **ceilings[s]})
    tmp = Path(tempfile.mkdtemp(prefix="mcs-upbench-"))

    def bench_upstream(name, client, setup_rc):
        """Benchmarks an upstream client whose setup returned setup_rc, then closes it."""
        if setup_rc != 0:
            emit({"what": "error", "backend": name, "error": f"setup {setup_rc}"})
            return
        bench_backend(name, UpstreamCalls(client, torch), torch, sizes, args.iters, ceilings, emit)
        client.close()

    # A fresh master per upstream backend: a stopped client's segment stays registered with its
    # master for a while, and allocations there would fail.
    if "upstream_dummy" in backends:
        with start_mooncake_master(tmp / "master-dummy") as master:
            port = master.rpc_port + 17
            rc_log = open(tmp / "mooncake_client.log", "wb")
            proc = subprocess.Popen(
                [mooncake_client_binary(), f"--master_server_address={master.address}",
                 f"--metadata_server={master.metadata}", f"--global_segment_size={segment}",
                 "--local_buffer_size=1073741824", "--host=127.0.0.1", f"--port={port}",
                 "--protocol=tcp"], stdout=rc_log, stderr=subprocess.STDOUT)
            try:
                time.sleep(3)
                client = MooncakeDistributedStore()
                bench_upstream("upstream_dummy", client,
                               client.setup_dummy(segment, 1 << 30, f"127.0.0.1:{port}"))
            finally:
                proc.terminate()
                proc.wait(30)
    if "upstream_embedded" in backends:
        with start_mooncake_master(tmp / "master-embedded") as master:
            client = MooncakeDistributedStore()
            bench_upstream("upstream_embedded", client,
                           client.setup("127.0.0.1", master.metadata, segment, 1 << 30, "tcp",
                                        "", master.address))
    if "ours_embedded" in backends:
        bench_backend("ours_embedded", OurCalls(mcs.connect()), torch, sizes, args.iters,
                      ceilings, emit)
    if "ours_daemon" in backends:
        segment_mib = (max(sizes) + (64 << 20)) // MiB  # one tensor object per segment at most
        with start_node_daemon(tmp / "node", segment_size=f"{segment_mib}MiB", num_segments=3,
                               pinned_quota_bytes=str(3 * segment_mib * MiB),
                               client_buffer_max_bytes=str(2 << 30)) as node:
            bench_backend("ours_daemon", OurCalls(mcs.connect(node.url)), torch, sizes, args.iters,
                          ceilings, emit)
    if "ours_mooncake" in backends:
        with start_mooncake_master(tmp / "master-ours") as master:
            store = mcs.connect(master.url(local_hostname="127.0.0.1", segment_bytes=segment,
                                           buffer_bytes=1 << 30))
            bench_backend("ours_mooncake", OurCalls(store), torch, sizes, args.iters, ceilings,
                          emit)
            # Interop on the GPU, both ways, through the same upstream store.
            up = UpstreamCalls(store.upstream.client, torch)
            t = torch.empty(8 * MiB // 2, dtype=torch.bfloat16, device="cuda").normal_()
            out = torch.empty_like(t)
            store.put_tensor("interop/ours", t)
            try:
                up.get_into("interop/ours", out)
                a = bool(torch.equal(out, t))
            except Exception as e:  # noqa: BLE001
                a = f"{type(e).__name__}: {e}"
            try:  # upstream's host-side read of the same object
                host = store.upstream.client.get_tensor("interop/ours")
                a_host = bool(torch.equal(host.to("cuda"), t))
            except Exception as e:  # noqa: BLE001
                a_host = f"{type(e).__name__}: {e}"
            out.zero_()
            try:
                up.put("interop/theirs", t)
                store.get_tensor_into("interop/theirs", out)
                b = bool(torch.equal(out, t))
            except Exception as e:  # noqa: BLE001
                b = f"{type(e).__name__}: {e}"
            emit({"what": "interop_cuda", "ours_put_upstream_get_into_cuda_equal": a,
                  "ours_put_upstream_get_tensor_equal": a_host,
                  "upstream_put_ours_get_equal": b, "tensor_bytes": 8 * MiB})
    return 0


if __name__ == "__main__":
    sys.exit(main())
