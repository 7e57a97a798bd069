#!/usr/bin/env python3
"""A whole RL step of one MoE layer, sparse against dense, with the floor of the same run.

The model is one Kimi-K2-shaped MoE layer slice (routed experts w1/w3 [I, H] and w2 [H, I], a
shared expert, MLA attention), trained under EP8 (every tensor is one global source) and served
under EP x TP (default EP4 x TP2 on one node: experts by EP rank, w1/w3/q_b/kv_b split on dim 0
and w2/o_proj on dim 1 by TP rank, the rest replicated). Inference parameters are stacked as
the engines hold them (FusedMoE w13 [E_local, 2 I/tp, H] and w2 [E_local, H, I/tp]), so every
expert target lands in a strided view of a larger tensor.

Per step (a fraction --density of every tensor changes; overwrite and scatter_add):

- sparse: encode_updates (all pairs) -> put_sparse_objects -> read_sparse_objects of every
  target of the node (device="cuda" on the GPU) -> apply_sparse_objects. --timing both (the
  default) alternates two ways of timing the steps: "phases" steps wait for the device around
  each of the four calls (encode_s, commit_s, read_s, apply_s; sparse_s their sum); "step" steps
  make the four calls as a trainer and a reader make them, the device waited for only before the
  first and after the last (sparse_s that wall, less the benchmark's own readings of its clocks
  between the calls, bookkeeping_s; each phase's figure is then the host's time from the call
  before returning to this one returning, the device work still queued at that point counted in
  a later phase). The manifest fetch between commit and read (manifest_s) is in neither;
- dense_full: batch_upsert_tensor of the whole new tensors + batch_get_tensor_into of whole
  tensors for every (rank, tensor) that needs them (into scratch buffers);
- dense_box: the same put + each rank reads only its own box into its parameter view (the best
  dense path);
- floor: encode reading new and old once at the device's copy bandwidth + the COO bytes once
  device-to-host and the target bytes once host-to-device at the pinned copy bandwidth
  (measured in this run; on the CPU: memcpy bandwidth).

Every inference parameter is checked after each sparse step (bit for bit for overwrite). On the
embedded store and through the node daemon (--backends); the daemon's steps start once it has
prepared its segments (--wait-prepared), as a daemon serving a training run has, and each row
records that preparation's state. Prints one JSON line per result.

    python benchmarks/gpu_sync_bench.py --device cuda --experts 96 --json gpu_sync.jsonl
    python benchmarks/gpu_sync_bench.py --device cpu --quick         # CI size, under a minute
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

import mooncake.sparse as mcs
from mooncake.sparse.testing import find_node_daemon, start_node_daemon, wait_prepared

try:
    import torch
except ImportError:  # pragma: no cover - the benchmark needs torch
    sys.exit("gpu_sync_bench needs torch")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_json_out = None  # --json: every line is written as it comes, so a failing run keeps its lines


def emit(r: dict) -> None:
    line = json.dumps(r)
    print(line, flush=True)
    if _json_out is not None:
        _json_out.write(line + "\n")
        _json_out.flush()


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    shape: tuple[int, int]
    split: int | None  # TP split dimension, None: replicated
    expert: int | None  # routed expert id, None: dense (every EP rank holds it)
    role: str = ""      # "w1" | "w3" | "w2" for routed experts


def layer(args) -> list[Spec]:
    H, I, Is = args.hidden, args.moe_inter, args.shared_inter
    specs: list[Spec] = []
    for e in range(args.experts):
        specs.append(Spec(f"experts.{e}.w1", (I, H), 0, e, "w1"))
        specs.append(Spec(f"experts.{e}.w3", (I, H), 0, e, "w3"))
        specs.append(Spec(f"experts.{e}.w2", (H, I), 1, e, "w2"))
    specs += [Spec("shared.w1", (Is, H), 0, None), Spec("shared.w3", (Is, H), 0, None),
              Spec("shared.w2", (H, Is), 1, None)]
    if args.attention:
        heads, nope, rope, v, q_rank, kv_rank = args.heads, 128, 64, 128, 1536, 512
        specs += [Spec("attn.q_a_proj", (q_rank, H), None, None),
                  Spec("attn.q_b_proj", (heads * (nope + rope), q_rank), 0, None),
                  Spec("attn.kv_a_proj_with_mqa", (kv_rank + rope, H), None, None),
                  Spec("attn.kv_b_proj", (heads * (nope + v), kv_rank), 0, None),
                  Spec("attn.o_proj", (H, heads * v), 1, None)]
    return specs


@dataclasses.dataclass
class Slot:
    """One (rank, tensor) target and the parameter view it lands in."""
    target: mcs.Target
    spec: Spec
    box: tuple[tuple[int, int], tuple[int, int]]  # origin, shape
    view: torch.Tensor


def inference_node(specs: list[Spec], args, device, dtype) -> tuple[list[Slot], list[torch.Tensor]]:
    ep, tp = args.ep, args.tp
    per_rank = args.experts // ep
    slots: list[Slot] = []
    params: list[torch.Tensor] = []
    I, H = args.moe_inter, args.hidden
    for p in range(ep):
        for t in range(tp):
            rank = p * tp + t
            w13 = torch.empty(per_rank, 2 * (I // tp), H, dtype=dtype, device=device)
            w2 = torch.empty(per_rank, H, I // tp, dtype=dtype, device=device)
            params += [w13, w2]
            for s in specs:
                if s.expert is not None and s.expert // per_rank != p:
                    continue
                origin, shape = [0, 0], list(s.shape)
                if s.split is not None:
                    part = s.shape[s.split] // tp
                    origin[s.split], shape[s.split] = t * part, part
                if s.expert is not None:
                    local = s.expert - p * per_rank
                    half = I // tp
                    view = {"w1": w13[local, :half], "w3": w13[local, half:],
                            "w2": w2[local]}[s.role]
                else:
                    view = torch.empty(shape, dtype=dtype, device=device)
                    params.append(view)
                target = mcs.Target(s.name, f"r{rank}/{s.name}", "node0", {}, tuple(origin),
                                    tuple(shape))
                slots.append(Slot(target, s, (tuple(origin), tuple(shape)), view))
    return slots, params


def box_of(x: torch.Tensor, box) -> torch.Tensor:
    (r0, c0), (nr, nc) = box
    return x[r0:r0 + nr, c0:c0 + nc]


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> tuple[float, object]:
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def device_clocks() -> dict[str, float]:
    """Seconds on this process's direct device paths so far (monotonic; zeros where the build
    has no GPU codec): commit_{total,index,prepare,fill,publish}, read_{total,plan,ranges,
    filter}; and the binding's split of put_sparse_objects on either store: call_{parse,commit,
    results}."""
    out = {}
    for prefix, name, keys in (
            ("commit", "_device_commit_counters", ("total", "index", "prepare", "fill", "publish")),
            ("read", "_device_read_counters", ("total", "plan", "ranges", "filter")),
            ("call", "_commit_call_counters", ("parse", "commit", "results"))):
        fn = getattr(mcs._core, name, None)
        got = fn() if fn is not None else {}
        for k in keys:
            out[f"{prefix}_{k}"] = float(got.get(f"{k}_seconds", 0.0))
    # The groups of the direct commits' GPU checks.
    fn = getattr(mcs._core, "_device_commit_counters", None)
    out["commit_groups"] = float((fn() if fn is not None else {}).get("groups", 0))
    return out


def call_clocks(store) -> dict[str, float]:
    """Through the node daemon (zeros elsewhere), seconds so far: the client's time in its calls
    and in gathering a device commit's members into its arena; taken without a call."""
    stats = getattr(store._core, "client_stats", None)
    try:
        got = stats() if stats is not None else {}
    except Exception:  # not a node store
        got = {}
    return {k: float(got.get(k, 0.0)) for k in ("call_seconds", "device_commit_gather_seconds")}


def requests_seconds(metrics: dict) -> float:
    """The daemon's time in the requests it served so far, its Metrics requests aside (all
    connections; 0 elsewhere)."""
    return sum(v for k, v in metrics.items()
               if k.startswith("request_") and k.endswith("_seconds")
               and k != "request_metrics_seconds")


def parse_bytes(text: str) -> int:
    """"16MiB", "256KiB", "1GiB" or a plain number of bytes."""
    for suffix, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if text.endswith(suffix):
            return int(text[:-len(suffix)]) * scale
    return int(text)


def untimed(fn, device) -> tuple[float, object]:
    """fn() without waiting for the device: the host's time until it returns."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def cpu_profiler(prefix: str):
    """gperftools' CPU profiler (libprofiler.so.0, Debian libgoogle-perftools4), loaded on first
    use: ProfilerStart(path) / ProfilerStop() around the sparse calls of each steady step
    (--cpu-profile PREFIX: PREFIX.BACKEND.APPLY.STEP, e.g. `google-pprof --text python3 FILES`).
    It samples the host's threads (SIGPROF), native frames included: where a step's host time
    goes below the Python calls that --profile sees."""
    global _libprofiler
    if _libprofiler is None:
        import ctypes
        _libprofiler = ctypes.CDLL(os.environ.get("MCS_LIBPROFILER", "libprofiler.so.0"))
        _libprofiler.ProfilerStart.argtypes = [ctypes.c_char_p]
    return _libprofiler


_libprofiler = None


def profile(what: str, fn):
    """Where a phase's host time goes (--profile): fn() under cProfile, its top functions by own
    time to stderr; returns fn's result."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    out = fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, ncalls, own, cumulative, _)
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:14]
    lines = [f"{own * 1e3:9.3f} {cum * 1e3:9.3f} {calls:7d}  {os.path.basename(f)}:{line}({name})"
             for (f, line, name), (_, calls, own, cum, _) in top]
    log(f"--- profile: {what} (own ms, cumulative ms, calls)\n" + "\n".join(lines))
    return out


def ceilings(device, nbytes: int) -> dict:
    """Copy bandwidths of this run: device copy, pinned host<->device (CUDA), host memcpy."""
    out = {}
    n = max(1 << 20, min(nbytes, 1 << 30)) // 2 * 2
    if device.type == "cuda":
        a = torch.empty(n, dtype=torch.uint8, device=device)
        b = torch.empty_like(a)
        h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        for what, fn, moved in (("d2d", lambda: b.copy_(a), 2 * n),
                                ("h2d", lambda: a.copy_(h, non_blocking=True), n),
                                ("d2h", lambda: h.copy_(a, non_blocking=True), n)):
            fn()
            best = min(timed(fn, device)[0] for _ in range(5))
            out[f"{what}_gbps"] = moved / best / 1e9
    a = np.ones(n, np.uint8)
    b = np.empty_like(a)
    best = min(timed(lambda: np.copyto(b, a), torch.device("cpu"))[0] for _ in range(3))
    out["memcpy_gbps"] = n / best / 1e9
    return out


def changed(old: torch.Tensor, density: float, gen: torch.Generator) -> torch.Tensor:
    new = old.clone()
    mask = torch.rand(old.shape, generator=gen, device=old.device) < density
    new[mask] = (new[mask].float() + 0.5).to(old.dtype)
    return new


def run_backend(store, backend: str, args, device, dtype, rng_seed: int) -> list[dict]:
    specs = layer(args)
    gen = torch.Generator(device=device).manual_seed(rng_seed)
    trainer = {s.name: torch.randn(s.shape, generator=gen, device=device).to(dtype) for s in specs}
    slots, _params = inference_node(specs, args, device, dtype)
    for sl in slots:
        sl.view.copy_(box_of(trainer[sl.spec.name], sl.box))
    dense_bytes = sum(t.numel() * t.element_size() for t in trainer.values())
    node_bytes = sum(sl.view.numel() * sl.view.element_size() for sl in slots)
    ceil = ceilings(device, dense_bytes)
    store.set_retention(keep_last=1)
    prepared_wait = wait_prepared(store, args.wait_prepared)
    if prepared_wait is not None:
        log(f"{backend}: waited {prepared_wait:.2f} s for the daemon's segment preparation")
    # The node's targets, converted once as a reader keeps them (InferenceSync does too).
    targets = mcs.TargetBatch([sl.target for sl in slots])
    results = []
    step = 0
    for apply in args.apply:
        for rep in range(args.repeats):
            step += 1
            gen_k = (step - 1, step)
            new = {n: changed(t, args.density, gen) for n, t in trainer.items()}
            names = [s.name for s in specs]
            pairs = [(new[n], trainer[n]) for n in names]
            # --trace: the last step of each mode runs its four phases under the torch profiler.
            prof = None
            if args.trace and rep == args.repeats - 1:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                              + ([torch.profiler.ProfilerActivity.CUDA]
                                                 if device.type == "cuda" else []))
                prof.__enter__()

            profiled = args.profile and rep == args.repeats - 1
            # How this step is timed: "phases" waits for the device around each call; "step"
            # only before the first call and after the last (--timing both: every other step).
            timing = args.timing if args.timing != "both" else ("step" if step % 2 == 0
                                                                 else "phases")
            timer = timed if timing == "phases" else untimed
            if timing == "step":
                sync(device)
            cpu_profile = cpu_profiler(args.cpu_profile) if args.cpu_profile and step >= 3 else None
            if cpu_profile is not None:
                cpu_profile.ProfilerStart(
                    f"{args.cpu_profile}.{backend}.{apply}.{step}".encode())
            # The clocks' first readings, before the step: the calls' clocks between the phases
            # below are the benchmark's bookkeeping, taken out of a "step" step's wall
            # (bookkeeping_s), as is the manifest fetch (manifest_s: not one of the four calls, in
            # neither timing). At those points the device has finished the phase before (the
            # commit returns once its entries landed, the read once its targets are built).
            mc0 = store.metrics()
            dc0 = device_clocks()
            cc0 = call_clocks(store)
            book = [0.0]  # seconds of bookkeeping in the step's wall

            @contextlib.contextmanager
            def bookkeeping(device_idle: bool = True):
                t = time.perf_counter()
                yield
                if device_idle:  # else the device's work went on meanwhile: it stays counted
                    book[0] += time.perf_counter() - t
            t_step = time.perf_counter()

            def phase(name, fn):
                if profiled:  # --profile: this step's phases under cProfile (slower by its cost)
                    return profile(f"{backend} {apply} {name}", lambda: timer(fn, device))
                if prof is None:
                    return timer(fn, device)
                with torch.profiler.record_function(f"phase:{name}"):
                    return timer(fn, device)
            if args.trainer == "pipelined":
                # Encode and commit in one call, the copies of each part overlapping the
                # encode of the next (timed as one phase: commit_s is 0).
                pubs = [dict(tensor_id=n, global_shape=tuple(new[n].shape), new=new[n],
                             old=trainer[n], generation=gen_k, apply=apply) for n in names]
                t_enc, (res, coo) = phase("publish", lambda: store.put_sparse_updates(
                    pubs, parts=args.parts))
                t_commit = 0.0
            else:
                t_enc, coo = phase("encode", lambda: mcs.encode_updates(pairs, apply=apply))
                updates = [dict(tensor_id=n, global_shape=tuple(new[n].shape), indices=i,
                                values=v, generation=gen_k, apply=apply)
                           for n, (i, v) in zip(names, coo)]
                t_commit, res = phase("commit", lambda: store.put_sparse_objects(updates))
            with bookkeeping():
                cc1 = call_clocks(store)
                mc1 = store.metrics()
                dc1 = device_clocks()
            # The commit's own clocks: indexing and writing in the store; through the daemon,
            # its handler and the copies from the client's GPU within it.
            phases_commit = {f"{k}_s": mc1.get(f"{k}_seconds", 0.0) - mc0.get(f"{k}_seconds", 0.0)
                             for k in ("commit_index", "commit_write", "commit_put",
                                       "commit_publish", "sparse_device_commit",
                                       "sparse_device_commit_copy", "sparse_device_commit_check",
                                       "sparse_device_commit_fill", "sparse_device_commit_landed")}
            # Through the daemon: the client's time in the commit's calls, in gathering the
            # members into its arena, and the daemon's time in those requests (the rest of the
            # calls' time is the transport: encoding, the socket, decoding).
            phases_commit["client_commit_call_s"] = cc1["call_seconds"] - cc0["call_seconds"]
            phases_commit["client_commit_gather_s"] = (cc1["device_commit_gather_seconds"]
                                                       - cc0["device_commit_gather_seconds"])
            phases_commit["daemon_commit_requests_s"] = (requests_seconds(mc1)
                                                         - requests_seconds(mc0))
            phases_commit["commit_pageable_bytes"] = (
                mc1.get("sparse_device_commit_pageable_bytes", 0)
                - mc0.get("sparse_device_commit_pageable_bytes", 0))
            # Through the daemon: the groups its GPU check took (each checked while the one
            # before it was copied into the store).
            phases_commit["commit_check_groups"] = int(
                mc1.get("sparse_device_commit_check_groups", 0)
                - mc0.get("sparse_device_commit_check_groups", 0))
            bad = [r for r in res if not isinstance(r, dict)]
            if bad:
                raise bad[0]
            coo_bytes = sum(r["bytes"] for r in res)
            nnz = sum(r["nnz"] for r in res)
            t_manifest, manifest = timed(lambda: store.manifest(gen_k), device)
            kw = {"device": device} if device.type == "cuda" else {}
            with bookkeeping():
                m0 = store.metrics()
                cc2 = call_clocks(store)
            if args.reader == "pipelined":
                # Read and apply in one call, each part's read overlapping the apply of the
                # part before (timed as one phase: apply_s is 0).
                t_read, _ = phase("read+apply", lambda: store.apply_sparse_updates(
                    manifest, targets, [sl.view for sl in slots], parts=args.parts))
            else:
                t_read, objs = phase("read", lambda: store.read_sparse_objects(manifest, targets,
                                                                               **kw))
            # (The pipelined reader's call returns with its last part's apply still on the device.)
            with bookkeeping(device_idle=args.reader != "pipelined"):
                cc3 = call_clocks(store)
                m1 = store.metrics()
                dc2 = device_clocks()
            # This process's clocks of the direct device paths (embedded store): the commit's
            # GPU index pass and its parts in the store, the device read's plan / range copies
            # / filter (zero where the daemon does the work).
            clocks = {f"direct_commit_{k}_s": dc1[f"commit_{k}"] - dc0[f"commit_{k}"]
                      for k in ("total", "index", "prepare", "fill", "publish")}
            # The binding's put_sparse_objects: its parse of the updates, the backend's commit,
            # the results (the rest of commit_s is Python's, before and after the call).
            clocks.update({f"commit_call_{k}_s": dc1[f"call_{k}"] - dc0[f"call_{k}"]
                           for k in ("parse", "commit", "results")})
            clocks["direct_commit_groups"] = int(dc1["commit_groups"] - dc0["commit_groups"])
            clocks.update({f"device_read_{k}_s": dc2[f"read_{k}"] - dc1[f"read_{k}"]
                           for k in ("total", "plan", "ranges", "filter")})
            # The read's own clocks (the store's metrics): planning, binding the ranges, and
            # building the targets (on the GPU for a device read of the embedded store).
            phases = {f"read_{k}_s": m1.get(f"{k}_seconds", 0.0) - m0.get(f"{k}_seconds", 0.0)
                      for k in ("plan", "read", "materialize")}
            # The node daemon's handlers of a device read: its plan requests (with the copies
            # it queues as it plans) and its copy requests (zero on the embedded store).
            phases.update({f"daemon_{k}_s": m1.get(f"{k}_seconds", 0.0) - m0.get(f"{k}_seconds", 0.0)
                           for k in ("planned_read", "planned_read_plan", "planned_read_queued",
                                     "leases_to_device")})
            # Through the daemon: the client's time in the read's calls, the daemon's in them.
            phases["client_read_call_s"] = cc3["call_seconds"] - cc2["call_seconds"]
            phases["daemon_read_requests_s"] = requests_seconds(m1) - requests_seconds(m0)
            # The spans of segment memory the daemon's copies moved (a planned read's ranges
            # laid out as they lie in its segments merge into few).
            phases["daemon_copy_runs"] = (m1.get("leases_to_device_runs", 0)
                                          - m0.get("leases_to_device_runs", 0))
            if args.reader == "pipelined":
                t_apply = 0.0
            else:
                t_apply, _ = phase("apply", lambda: mcs.apply_sparse_objects(
                    [sl.view for sl in slots], objs))
            if timing == "step":
                # The host's time from the last call's return to the device's finishing the
                # step's work: counted in the last phase, as the step waits for it.
                t_tail, _ = untimed(lambda: sync(device), device)
                if args.reader == "pipelined":
                    t_read += t_tail
                else:
                    t_apply += t_tail
            t_wall = time.perf_counter() - t_step
            if cpu_profile is not None:
                cpu_profile.ProfilerStop()
            if args.reader == "pipelined":
                # The same read again, untimed, for its bytes (the floor's).
                objs = store.read_sparse_objects(manifest, targets, **kw)
            read_bytes = sum(int(o.indices.numel() * o.indices.element_size()
                                 + o.values.numel() * o.values.element_size())
                             if device.type == "cuda" else int(o.indices.nbytes + o.values.nbytes)
                             for o in objs)
            if prof is not None:
                prof.__exit__(None, None, None)
                os.makedirs(args.trace, exist_ok=True)
                prof.export_chrome_trace(os.path.join(args.trace, f"trace_{backend}_{apply}.json"))
            # Where the read's time goes: the same read on the host only (plan, range reads,
            # filter/rebase), outside the step's total; the rest of read_s is the upload.
            t_read_host = None
            if device.type == "cuda":
                store.clear_caches()  # as cold as the timed read (a new step's ranges)
                # The host read of the same kind as the device read (the embedded store views
                # in place for a device read).
                host_kw = {"view_in_place": True} if backend == "embedded" else {}
                t_read_host, host_objs = timed(
                    lambda: store.read_sparse_objects(manifest, targets, **host_kw), device)
                del host_objs
            # Check every shard: bit for bit (overwrite) or within one bf16 rounding.
            worst = 0.0
            for sl in slots:
                want = box_of(new[sl.spec.name], sl.box)
                if apply == "overwrite":
                    if not torch.equal(sl.view, want):
                        raise AssertionError(f"{backend}: shard {sl.target.target_id} differs")
                else:
                    worst = max(worst, float((sl.view.float() - want.float()).abs().max()))
            if apply != "overwrite":
                if worst > 0.1:
                    raise AssertionError(f"{backend}: scatter_add off by {worst}")
                for sl in slots:  # resync the shards exactly for the next step
                    sl.view.copy_(box_of(new[sl.spec.name], sl.box))
            del objs
            # The step is sealed; retention keeps the last one (the store never fills up):
            # timed, not in sparse_s (the readers above read the step's manifest before it).
            t_seal, _ = timed(lambda: store.seal_generation(gen_k, names), device)
            # The step: the four calls' sum (phases), or the wall from the first call to the
            # device's finishing the last (step), the Python between the calls included but for
            # the benchmark's own readings of the clocks and the manifest fetch.
            sparse = (t_enc + t_commit + t_read + t_apply if timing == "phases"
                      else t_wall - book[0] - t_manifest)
            # Dense baselines of the same step (--no-dense: none, their fields null).
            t_put = t_box = t_full = float("nan")
            full_bytes = 0
            if args.dense:
                keys = [f"dense/{n}" for n in names]
                tensors = [new[n] for n in names]
                t_put, _ = timed(lambda: store.batch_upsert_tensor(keys, tensors), device)
                t_box, _ = timed(lambda: store.batch_get_tensor_into(
                    [f"dense/{sl.spec.name}" for sl in slots], [sl.view for sl in slots],
                    global_offsets=[sl.box[0] for sl in slots]), device)
                for sl in slots:
                    if not torch.equal(sl.view, box_of(new[sl.spec.name], sl.box)):
                        raise AssertionError(f"{backend}: dense box read of {sl.target.target_id}")
                t_full = 0.0
            chunk = max(1, args.full_chunk)
            for lo in range(0, len(slots) if args.dense else 0, chunk):
                part = slots[lo:lo + chunk]
                scratch = [torch.empty(sl.spec.shape, dtype=dtype, device=device) for sl in part]
                dt, _ = timed(lambda: store.batch_get_tensor_into(
                    [f"dense/{sl.spec.name}" for sl in part], scratch), device)
                t_full += dt
                full_bytes += sum(s.numel() * s.element_size() for s in scratch)
                del scratch
            for n in names:
                trainer[n] = new[n]
            if device.type == "cuda":
                floor = (2 * dense_bytes / (ceil["d2d_gbps"] * 1e9) + coo_bytes / (ceil["d2h_gbps"] * 1e9)
                         + read_bytes / (ceil["h2d_gbps"] * 1e9))
            else:
                floor = (2 * dense_bytes + coo_bytes + read_bytes) / (ceil["memcpy_gbps"] * 1e9)
            r = {"what": "gpu_sync", "backend": backend, "device": str(device), "apply": apply,
                 "trainer": args.trainer, "reader": args.reader, "read_groups": args.read_groups,
                 "gather_engine_bytes": args.gather_engine_bytes,
                 "read_staging": args.read_staging,
                 "segment_huge_pages": args.segment_huge_pages,
                 "commit_group_bytes": args.commit_group_bytes, "timing": timing, "step": step, "tensors": len(specs), "targets": len(slots),
                 "experts": args.experts, "ep": args.ep, "tp": args.tp, "density": args.density,
                 "dense_bytes": dense_bytes, "node_bytes": node_bytes, "nnz": nnz,
                 "coo_bytes": coo_bytes, "read_bytes": read_bytes,
                 "encode_s": t_enc, "commit_s": t_commit, "read_s": t_read, "apply_s": t_apply,
                 "read_host_s": t_read_host, **phases, **phases_commit, **clocks,
                 "sparse_s": sparse, "seal_s": t_seal,
                 "manifest_s": t_manifest, "bookkeeping_s": book[0],
                 "commit_us_per_tensor": t_commit / len(specs) * 1e6,
                 "read_us_per_target": t_read / len(slots) * 1e6,
                 "dense_put_s": t_put, "dense_box_get_s": t_box, "dense_box_s": t_put + t_box,
                 "dense_full_get_s": t_full, "dense_full_s": t_put + t_full,
                 "dense_full_get_bytes": full_bytes,
                 # The node daemon's background preparation of its segments (pre-faulting,
                 # then registering them with CUDA) as this step ended: a step beside it
                 # measures the daemon's start, not a running daemon.
                 "daemon_pinning_complete": mc1.get("pinning_complete"),
                 "daemon_pinned_bytes": mc1.get("pinned_bytes"),
                 "daemon_prepared_wait_s": prepared_wait,
                 "floor_s": floor, "speedup_vs_dense_box": (t_put + t_box) / sparse,
                 "speedup_vs_dense_full": (t_put + t_full) / sparse, "sparse_over_floor": sparse / floor,
                 "bit_exact": apply == "overwrite", **ceil}
            emit({k: None if isinstance(v, float) and v != v else v for k, v in r.items()})
            first = ("publish" if args.trainer == "pipelined" else "enc")
            log(f"{backend} {apply} step {step} ({timing}): sparse {sparse * 1e3:.1f} ms ({first} "
                f"{t_enc * 1e3:.1f} commit {t_commit * 1e3:.1f} {'read+apply' if t_apply == 0 else 'read'} {t_read * 1e3:.1f} apply {t_apply * 1e3:.1f}) | "
                f"dense box {(t_put + t_box) * 1e3:.1f} ms, full {(t_put + t_full) * 1e3:.1f} ms | "
                f"floor {floor * 1e3:.1f} ms")
            results.append(r)
    return results


def add_layer_args(ap: argparse.ArgumentParser) -> None:
    """The layer's shape (layer() reads these)."""
    ap.add_argument("--experts", type=int, default=96)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--moe-inter", type=int, default=2048)
    ap.add_argument("--shared-inter", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=64, help="attention heads of the layer")
    ap.add_argument("--no-attention", dest="attention", action="store_false")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_layer_args(ap)
    ap.add_argument("--ep", type=int, default=4)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--apply", default="overwrite,scatter_add")
    ap.add_argument("--repeats", type=int, default=3, help="steps per apply mode")
    ap.add_argument("--backends", default="embedded,node")
    ap.add_argument("--trainer", choices=("split", "pipelined"), default="split",
                    help="split: encode_updates then put_sparse_objects, each timed; pipelined: "
                         "store.put_sparse_updates (encode_s is both, commit_s 0)")
    ap.add_argument("--reader", choices=("split", "pipelined"), default="split",
                    help="split: read_sparse_objects then apply_sparse_objects, each timed; "
                         "pipelined: store.apply_sparse_updates (read_s is both, apply_s 0)")
    ap.add_argument("--no-dense", dest="dense", action="store_false",
                    help="skip the dense baselines (their fields null): a quicker step, e.g. "
                         "for --cpu-profile")
    ap.add_argument("--cpu-profile", default=None, metavar="PREFIX",
                    help="gperftools' CPU profile of each steady step's sparse calls: "
                         "PREFIX.BACKEND.APPLY.STEP (needs libprofiler.so.0)")
    ap.add_argument("--timing", choices=("both", "phases", "step"), default="both",
                    help="phases: wait for the device around each call; step: only around the "
                         "whole step (as a trainer and a reader run it); both: every other step")
    ap.add_argument("--parts", type=int, default=4,
                    help="parts of put_sparse_updates / apply_sparse_updates (pipelined)")
    ap.add_argument("--full-chunk", type=int, default=64, help="targets per dense_full get batch")
    ap.add_argument("--read-groups", type=int, default=None,
                    help="groups of whole tensors a device read on the embedded store plans one "
                         "after another (group k + 1 planned while group k's ranges are copied; "
                         "default: the library's)")
    ap.add_argument("--gather-engine-bytes", type=int, default=None,
                    help="runs of pinned ranges of at least this many bytes that a device read "
                         "hands to the copy engine, beside the gather kernel for the rest (0: all "
                         "by the kernel; embedded store and node daemon; default: the library's)")
    ap.add_argument("--read-staging", choices=("on", "off"), default=None,
                    help="through the node daemon, whether a device read's ranges are copied as "
                         "the daemon plans the read (on) or on a copy request after it (off); "
                         "default: the library's")
    ap.add_argument("--segment-huge-pages", choices=("on", "off"), default=None,
                    help="the node daemon's segment_huge_pages (transparent huge pages for its "
                         "segments where the kernel gives them to shared memory); default: the "
                         "daemon's")
    ap.add_argument("--commit-group-bytes", default=None, metavar="BYTES",
                    help="entry bytes of the first group of a commit from CUDA memory checked on "
                         "the GPU (e.g. 16MiB; each next group three times the one before, checked "
                         "while the one before it is copied into the store; 0: the whole commit "
                         "checked before any of it is copied): the node daemon's "
                         "device_commit_group_bytes and this process's for the embedded store; "
                         "default: the library's")
    ap.add_argument("--wait-prepared", type=float, default=120.0, metavar="SECONDS",
                    help="before the first step, wait up to this long for the node daemon to "
                         "finish preparing (pre-faulting and pinning) its segments, as a daemon "
                         "that serves a training run has (0: do not wait; the rows record the "
                         "preparation's state either way)")
    ap.add_argument("--quick", action="store_true", help="CPU/CI size: 8 experts of 256x512")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the four phases of each mode's last step (stderr; that step's "
                         "timings include its overhead)")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="profile the four phases of each mode's last step with the torch profiler "
                         "(timings of that step include its overhead): DIR/trace_BACKEND_APPLY.json")
    args = ap.parse_args()
    if args.quick:
        args.experts, args.hidden, args.moe_inter, args.shared_inter = 8, 512, 256, 256
        args.heads, args.repeats = 4, 1
    args.apply = [a for a in args.apply.split(",") if a]
    setter = getattr(mcs._core, "_set_device_read_groups", None)
    if args.read_groups is not None and setter is not None:
        setter(args.read_groups)
    staging_setter = getattr(mcs._core, "_set_device_read_staging", None)
    if args.read_staging is not None and staging_setter is not None:
        staging_setter(args.read_staging == "on")
    group_setter = getattr(mcs._core, "_set_device_commit_group_bytes", None)
    if args.commit_group_bytes is not None and group_setter is not None:
        group_setter(parse_bytes(args.commit_group_bytes))
    engine_setter = getattr(mcs._core, "_set_device_gather_engine_bytes", None)
    if args.gather_engine_bytes is not None and engine_setter is not None:
        engine_setter(args.gather_engine_bytes)
    device = torch.device(args.device)
    dtype = torch.bfloat16
    if args.experts % args.ep:
        sys.exit("--experts must be a multiple of --ep")
    specs = layer(args)
    dense = sum(s.shape[0] * s.shape[1] for s in specs) * 2
    # Dense copies (an upsert holds the old and the new version at once) and two steps of
    # sparse objects, with room for the
    # allocator: the daemon places each object whole in one segment.
    store_bytes = int(dense * 2.2 + (512 << 20))
    log(f"layer: {len(specs)} tensors, {dense / 1e9:.2f} GB {dtype}, device {device}")
    global _json_out
    if args.json:
        _json_out = open(args.json, "w")
    emit({"what": "meta", "host": platform.node(), "machine": platform.machine(),
          "cpus": os.cpu_count(), "torch": torch.__version__,
          "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
          "argv": sys.argv[1:]})
    out = []
    seed = int(np.random.SeedSequence().entropy % (1 << 31))
    for backend in [b for b in args.backends.split(",") if b]:
        if backend == "embedded":
            store = mcs.connect(capacity_bytes=store_bytes, pinned_quota_bytes=store_bytes)
            out += run_backend(store, backend, args, device, dtype, seed)
            store.close()
        elif backend in ("node", "node_host_check"):
            # node_host_check: the daemon checks commits from CUDA memory on its host (its
            # gpu_commit_check off), as before it checked them on the GPU.
            try:
                find_node_daemon()
            except FileNotFoundError:
                log("node: mooncake_sparse_node not built, skipped")
                continue
            seg = 1 << 30
            with tempfile.TemporaryDirectory(prefix="mcs-gs-") as tmp, \
                    start_node_daemon(tmp, segment_size=f"{seg >> 20}MiB",
                                      num_segments=max(2, -(-store_bytes // seg)),
                                      # Its segments pinned as the embedded store's memory is.
                                      pinned_quota_bytes=str(store_bytes),
                                      gpu_commit_check=str(backend == "node").lower(),
                                      **({} if args.gather_engine_bytes is None else
                                         {"device_gather_engine_bytes": args.gather_engine_bytes}),
                                      **({} if args.commit_group_bytes is None else
                                         {"device_commit_group_bytes": args.commit_group_bytes}),
                                      **({} if args.segment_huge_pages is None else
                                         {"segment_huge_pages":
                                          str(args.segment_huge_pages == "on").lower()})
                                      ) as d:
                store = mcs.connect(d.url)
                out += run_backend(store, backend, args, device, dtype, seed)
                store.close()
        else:
            sys.exit(f"unknown backend {backend!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
