"""End-to-end demo: one sparse RL weight update of a scaled-down Kimi-K2-shaped MoE.

The trainer (EP4) encodes each changed tensor once as ONE global COO object and commits it;
inference ranks (EP2 x TP2 on one node) read only the entry ranges inside their boxes, apply,
and end up bit-identical to the trainer's new weights. Three ways of moving the update are
compared: dense full transfer, complete-source GET per target, and sparse range GET.

    python -m mooncake.sparse.demo            # default: about a minute on 2 cores
    python -m mooncake.sparse.demo --quick    # a few seconds
    python -m mooncake.sparse.demo --json out.json

Across two nodes on upstream Mooncake Store (docs/multi_node.md): node A commits and keeps its
Mooncake client (whose segment holds the objects) alive; node B reads through its node daemon.

    A$ python -m mooncake.sparse.demo --role trainer --store "mooncake://MASTER:50051?local_hostname=A"
    B$ mooncake_sparse_node --socket_path=/tmp/mcs.sock \
           --store="mooncake://MASTER:50051?local_hostname=B" &
    B$ python -m mooncake.sparse.demo --role inference --store unix:///tmp/mcs.sock
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from typing import Any

import numpy as np

import mooncake.sparse as mcs


# ---------------------------------------------------------------------------------------------
# Model shape: Kimi-K2's layout (first layer dense, then MoE layers of routed experts + one
# shared expert + MLA attention), with every extent scaled down.
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelConfig:
    layers: int = 4
    experts: int = 32
    hidden: int = 1024
    moe_intermediate: int = 256
    dense_intermediate: int = 2048
    q_lora_rank: int = 192
    kv_lora_rank: int = 64
    heads: int = 8
    head_dim: int = 96

    @classmethod
    def quick(cls) -> "ModelConfig":
        return cls(layers=2, experts=8, hidden=256, moe_intermediate=64, dense_intermediate=512,
                   q_lora_rank=64, kv_lora_rank=32, heads=4, head_dim=32)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    expert: int | None  # routed expert id, None for replicated (shared / attention / dense)
    split_dim: int | None  # TP split dimension at inference, None = whole tensor on every rank


def model_tensors(cfg: ModelConfig) -> list[TensorSpec]:
    h, m = cfg.hidden, cfg.moe_intermediate
    out: list[TensorSpec] = []
    for layer in range(cfg.layers):
        p = f"layers.{layer}"
        # MLA attention: column-parallel up-projections split on dim 0, o_proj on dim 1.
        out += [
            TensorSpec(f"{p}.attn.q_a_proj", (cfg.q_lora_rank, h), None, None),
            TensorSpec(f"{p}.attn.q_b_proj", (cfg.heads * cfg.head_dim, cfg.q_lora_rank), None, 0),
            TensorSpec(f"{p}.attn.kv_a_proj", (cfg.kv_lora_rank + 32, h), None, None),
            TensorSpec(f"{p}.attn.kv_b_proj", (cfg.heads * 2 * cfg.head_dim, cfg.kv_lora_rank), None, 0),
            TensorSpec(f"{p}.attn.o_proj", (h, cfg.heads * cfg.head_dim), None, 1),
        ]
        if layer == 0:
            d = cfg.dense_intermediate
            out += [
                TensorSpec(f"{p}.mlp.w1", (d, h), None, 0),
                TensorSpec(f"{p}.mlp.w3", (d, h), None, 0),
                TensorSpec(f"{p}.mlp.w2", (h, d), None, 1),
            ]
            continue
        for e in range(cfg.experts):
            out += [
                TensorSpec(f"{p}.mlp.experts.{e}.w1", (m, h), e, 0),
                TensorSpec(f"{p}.mlp.experts.{e}.w3", (m, h), e, 0),
                TensorSpec(f"{p}.mlp.experts.{e}.w2", (h, m), e, 1),
            ]
        out += [
            TensorSpec(f"{p}.mlp.shared_experts.w1", (m, h), None, 0),
            TensorSpec(f"{p}.mlp.shared_experts.w3", (m, h), None, 0),
            TensorSpec(f"{p}.mlp.shared_experts.w2", (h, m), None, 1),
        ]
    return out


# ---------------------------------------------------------------------------------------------
# Weights: torch bfloat16 when torch is installed, numpy float16 otherwise.
# ---------------------------------------------------------------------------------------------
class Backend:
    def __init__(self, prefer_torch: bool = True) -> None:
        self.torch = None
        if prefer_torch:
            try:
                import torch  # the demo is an application: importing torch here is fine

                self.torch = torch
            except ImportError:
                pass
        self.dtype_name = "bfloat16" if self.torch is not None else "float16"

    def random(self, shape: tuple[int, ...], rng: np.random.Generator) -> Any:
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        if self.torch is not None:
            return self.torch.from_numpy(a).to(self.torch.bfloat16)
        return a.astype(np.float16)

    def perturb(self, w: Any, density: float, rng: np.random.Generator) -> Any:
        """A copy of w with about `density` of its entries changed (an RL step)."""
        n = int(np.prod(w.shape))
        k = max(1, int(round(n * density)))
        flat_idx = rng.choice(n, size=k, replace=False)
        delta = (rng.standard_normal(k, dtype=np.float32) * 0.002).astype(np.float32)
        if self.torch is not None:
            torch = self.torch
            new = w.clone()
            flat = new.view(-1)
            ti = torch.from_numpy(flat_idx)
            flat[ti] = (flat[ti].float() + torch.from_numpy(delta)).to(torch.bfloat16)
            return new
        new = w.copy()
        flat = new.reshape(-1)
        flat[flat_idx] = (flat[flat_idx].astype(np.float32) + delta).astype(np.float16)
        return new

    def slice(self, w: Any, offset: tuple[int, ...], shape: tuple[int, ...]) -> Any:
        """A contiguous copy of a box of w (numpy does the strided copy: torch's bfloat16
        strided copy on CPU is far slower and would dominate the timings)."""
        sl = tuple(slice(o, o + s) for o, s in zip(offset, shape))
        if self.torch is not None:
            bits = np.array(w.view(self.torch.int16).numpy()[sl], order="C", copy=True)
            return self.torch.from_numpy(bits).view(self.torch.bfloat16)
        return np.array(w[sl], order="C", copy=True)

    def bits(self, w: Any) -> np.ndarray:
        if self.torch is not None:
            return w.contiguous().view(self.torch.int16).numpy()
        return w.view(np.int16)

    def to_float(self, w: Any) -> np.ndarray:
        if self.torch is not None:
            return w.float().numpy()
        return w.astype(np.float32)

    def nbytes(self, w: Any) -> int:
        return int(np.prod(w.shape)) * 2


# ---------------------------------------------------------------------------------------------
# Layouts.
# ---------------------------------------------------------------------------------------------
TRAIN_EP = 4
INFER_EP, INFER_TP = 2, 2
NODE = "node0"


def sync_plan(cfg: ModelConfig, specs: list[TensorSpec]) -> mcs.SyncPlan:
    """Trainer EP4 and inference EP2 x TP2 (TP within each EP group), described once: routed
    experts by their expert id, the rest replicated; each tensor's TP split dimension as the
    spec says. The plan gives the trainer's placements and every rank's targets."""
    rules = [mcs.TensorRule(r".*\.experts\.(?P<expert>\d+)\.w[13]", tp_dim=0),
             mcs.TensorRule(r".*\.experts\.(?P<expert>\d+)\.w2", tp_dim=1)]
    rules += [mcs.TensorRule(re.escape(s.name), tp_dim=s.split_dim) for s in specs
              if s.expert is None]
    trainer = mcs.ParallelLayout(ep=TRAIN_EP, rules=mcs.layout.expert_rules(),
                                 num_experts=cfg.experts, name="trainer")
    inference = mcs.ParallelLayout(ep=INFER_EP, tp=INFER_TP, rules=rules,
                                   num_experts=cfg.experts, name="inference")
    return mcs.SyncPlan(trainer, inference, {s.name: s.shape for s in specs})


def targets_by_tensor(plan: mcs.SyncPlan) -> dict[str, list[mcs.Target]]:
    """Every inference rank's targets, grouped by tensor (ranks in order)."""
    out: dict[str, list[mcs.Target]] = {name: [] for name in plan.tensor_ids}
    for rank in range(plan.inference.world_size):
        for t in plan.targets(rank):
            out[t.tensor_id].append(t)
    return out


class Progress:
    """A minimal progress bar on stderr (tqdm when installed)."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self._bar = None
        self.total, self.desc, self.enabled, self.n = total, desc, enabled, 0
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
            except ImportError:
                pass
        self._last = 0.0

    def update(self, k: int = 1) -> None:
        self.n += k
        if self._bar is not None:
            self._bar.update(k)
        elif self.enabled and (time.monotonic() - self._last > 0.2 or self.n == self.total):
            self._last = time.monotonic()
            width = 30
            done = int(width * self.n / max(1, self.total))
            sys.stderr.write(f"\r{self.desc:<24} [{'#' * done}{'.' * (width - done)}] {self.n}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write("\r" + " " * 80 + "\r")


# ---------------------------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------------------------
def run(cfg: ModelConfig, *, apply: str, density: float, seed: int, show_progress: bool,
        prefer_torch: bool = True, store_url: str | None = None, role: str = "both",
        wait_seconds: float = 0.0, store: Any = None) -> dict:
    """role "both": commit and read in this process (one store); "trainer": commit only;
    "inference": read what a trainer committed (same --seed) and verify it."""
    be = Backend(prefer_torch)
    rng = np.random.default_rng(seed)
    specs = model_tensors(cfg)
    generation = (0, 1)

    prog = Progress(len(specs), "weights", show_progress)
    old, new = {}, {}
    for s in specs:
        old[s.name] = be.random(s.shape, rng)
        new[s.name] = be.perturb(old[s.name], density, rng)
        prog.update()
    prog.close()
    model_bytes = sum(be.nbytes(w) for w in old.values())

    plan = sync_plan(cfg, specs)
    targets = targets_by_tensor(plan)
    all_targets = [t for s in specs for t in targets[s.name]]
    shard_bytes = sum(int(np.prod(t.local_shape)) * 2 for t in all_targets)

    if store is None:
        store = mcs.connect(store_url)
    results: dict[str, Any] = {
        "config": dataclasses.asdict(cfg), "apply": apply, "density": density,
        "dtype": be.dtype_name, "tensors": len(specs), "targets": len(all_targets),
        "model_bytes": model_bytes, "shard_bytes": shard_bytes, "role": role,
        "store": store_url or "embedded", "strategies": {},
    }
    if role in ("both", "trainer"):
        commit(store, plan, old, new, apply, generation, show_progress, results)
        if role == "trainer":
            return results
    manifest = wait_for_manifest(store, generation, len(specs), wait_seconds)
    if role == "inference":
        results.update(source_objects_put=len(manifest), encode_seconds=0.0, commit_seconds=0.0,
                       source_bytes_put=sum(m.nnz * m.entry_bytes for m in manifest))
    read_all(store, specs, targets, old, new, apply, manifest, model_bytes, shard_bytes,
             results["source_bytes_put"], show_progress, be, results)
    return results


def wait_for_manifest(store: Any, generation: tuple[int, int], expected: int,
                      wait_seconds: float) -> list:
    deadline = time.monotonic() + wait_seconds
    while True:
        manifest = store.manifest(generation)
        if len(manifest) >= expected or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if len(manifest) != expected:
        raise SystemExit(f"the manifest of generation {generation} has {len(manifest)} of "
                         f"{expected} source objects: has the trainer (same --seed and model "
                         "options) committed? (--wait SECONDS waits for it)")
    return manifest


def commit(store: Any, plan: mcs.SyncPlan, old: dict, new: dict, apply: str,
           generation: tuple[int, int], show_progress: bool, results: dict) -> None:
    # ---- Trainer: EP4; each tensor is encoded once by its one owner, committed once. -------
    t0 = time.perf_counter()
    encode_s = 0.0
    sources = plan.sources()
    prog = Progress(len(sources), "trainer commit", show_progress)
    for s in sources:  # in a real run, each trainer rank commits plan.sources(rank)
        assert store.admit(s.tensor_id, generation, s.admit_policy, s.admit_placement,
                           f"trainer/ep{s.owner}"), s.tensor_id
        te = time.perf_counter()
        idx, vals = mcs.encode_update(new[s.tensor_id], old[s.tensor_id], apply=apply)
        encode_s += time.perf_counter() - te
        store.put_sparse_object(s.tensor_id, s.global_shape, idx, vals, generation=generation,
                                apply=apply, **s.put_kwargs())
        prog.update()
    prog.close()
    commit_s = time.perf_counter() - t0
    commit_metrics = store.metrics()
    results.update(source_objects_put=commit_metrics["source_objects_put"],
                   source_bytes_put=commit_metrics["source_bytes_put"],
                   encode_seconds=encode_s, commit_seconds=commit_s)


def read_all(store: Any, specs: list, targets_of: dict, old: dict, new: dict, apply: str,
             manifest: list, model_bytes: int, shard_bytes: int, source_bytes_put: int,
             show_progress: bool, be: "Backend", results: dict) -> None:

    # ---- Dense full transfer: the trainer puts every dense tensor, every rank copies its
    # dense shard (measured as the shard copies themselves: the floor of that approach). ------
    t0 = time.perf_counter()
    for s in specs:
        for t in targets_of[s.name]:
            be.slice(new[s.name], t.global_offset, t.local_shape)
    dense_s = time.perf_counter() - t0
    results["strategies"]["dense_full"] = {
        "bytes_put": model_bytes, "range_bytes_read": 0, "full_bytes_read": shard_bytes,
        "fanout_bytes": 0, "target_bytes": shard_bytes, "seconds": dense_s, "verified": True,
    }

    # ---- Complete-source GET per target, then sparse range GET. -----------------------------
    for strategy, label in (("full_source", "full_source_per_target"), ("sparse", "sparse_ranges")):
        store.reset_metrics()
        store.clear_caches()
        shards = {}
        prog = Progress(1, label, show_progress)
        # The node's whole step in one read and one apply (the batch calls a rollout worker
        # makes): every target of every tensor.
        # An inference rank's shards exist before the step: they are made outside the timing.
        step = [(s.name, t) for s in specs for t in targets_of[s.name]]
        weights = [be.slice(old[name], t.global_offset, t.local_shape) for name, t in step]
        t0 = time.perf_counter()
        objs = store.read_sparse_objects(manifest, [t for _, t in step], strategy=strategy)
        read_s = time.perf_counter() - t0
        mcs.apply_sparse_objects(weights, objs)
        for (name, t), shard in zip(step, weights):
            shards[t.target_id, name] = (t, shard)
        total_s = time.perf_counter() - t0
        prog.update()
        prog.close()
        m = store.metrics()
        verified, max_err = verify(be, new, old, shards, apply)
        results["strategies"][label] = {
            "bytes_put": source_bytes_put,
            "range_bytes_read": m["range_bytes_read"], "full_bytes_read": m["full_bytes_read"],
            "fanout_bytes": m["fanout_bytes"], "target_bytes": m["target_bytes"],
            "seconds": total_s, "read_seconds": read_s, "verified": verified,
            "max_abs_error": max_err, "metrics": m,
        }


def verify(be: Backend, new: dict, old: dict, shards: dict, apply: str) -> tuple[bool, float]:
    """Every shard equals the trainer's new weights: bit for bit (overwrite), or (scatter_add)
    within the two roundings of old + (new - old) in the weight dtype: the delta's, up to half
    an ulp of |new - old|, and the sum's, up to half an ulp of |new|, so within 2^-7 of
    max(|new|, |old|) for bfloat16 (a weight that shrinks a lot keeps an error of the old
    weight's size)."""
    max_err = 0.0
    for (target_id, name), (t, shard) in shards.items():
        ref = be.slice(new[name], t.global_offset, t.local_shape)
        if apply == "overwrite":
            if not np.array_equal(be.bits(shard), be.bits(ref)):
                return False, float("nan")
        else:
            a, b = be.to_float(shard), be.to_float(ref)
            o = be.to_float(be.slice(old[name], t.global_offset, t.local_shape))
            err = np.abs(a - b)
            max_err = max(max_err, float(np.max(err)) if a.size else 0.0)
            if not np.all(err <= 2 ** -7 * np.maximum(np.abs(b), np.abs(o)) + 1e-6):
                return False, max_err
    return True, max_err


def format_table(r: dict) -> str:
    def mb(x: float) -> str:
        return f"{x / 1e6:10.2f}"

    lines = [
        f"model: {r['tensors']} tensors, {r['model_bytes'] / 1e6:.1f} MB {r['dtype']}, "
        f"{r['density'] * 100:.2f}% changed, apply={r['apply']}; trainer EP{TRAIN_EP} -> "
        f"inference EP{INFER_EP}xTP{INFER_TP} ({r['targets']} targets on one node)",
        (f"committed {r['source_objects_put']} source objects, "
         f"{r['source_bytes_put'] / 1e6:.2f} MB (encode {r['encode_seconds']:.2f} s, "
         f"commit {r['commit_seconds']:.2f} s)"
         if r["role"] != "inference" else
         f"found {r['source_objects_put']} source objects a trainer committed, "
         f"{r['source_bytes_put'] / 1e6:.2f} MB"),
        f"store: {r['store']}",
        "",
        f"{'strategy':<24}{'put MB':>11}{'range MB':>11}{'full MB':>11}{'fanout MB':>11}"
        f"{'target MB':>11}{'time s':>9}  verified",
    ]
    if r["role"] == "trainer":
        return "\n".join(lines[:3] + ["committed; the inference side can read it now"])
    for name, s in r["strategies"].items():
        lines.append(
            f"{name:<24}{mb(s['bytes_put'])} {mb(s['range_bytes_read'])} {mb(s['full_bytes_read'])} "
            f"{mb(s['fanout_bytes'])} {mb(s['target_bytes'])} {s['seconds']:8.2f}  "
            f"{'yes' if s['verified'] else 'NO'}"
        )
    sp = r["strategies"]["sparse_ranges"]
    fs = r["strategies"]["full_source_per_target"]
    m = sp["metrics"]
    lines += [
        "",
        f"sparse path: range_gets={m['range_gets']} full_gets={m['full_gets']} "
        f"index_gets={m['index_gets']} cache_hits={m['cache_hits']} "
        f"target_objects_published={m['target_objects_published']}",
        f"bytes moved vs dense: {r['model_bytes'] / max(1, r['source_bytes_put']):.1f}x fewer put, "
        f"{r['shard_bytes'] / max(1, sp['range_bytes_read']):.1f}x fewer read; "
        f"vs complete-source GET: {fs['full_bytes_read'] / max(1, sp['range_bytes_read']):.1f}x fewer read",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mooncake.sparse.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small model (a few seconds)")
    ap.add_argument("--apply", choices=["overwrite", "scatter_add"], default="overwrite")
    ap.add_argument("--density", type=float, default=0.01, help="fraction of weights changed")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--experts", type=int, help="routed experts per MoE layer (multiple of 4)")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="save the results as JSON")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--numpy", action="store_true", help="float16 numpy weights even if torch is installed")
    ap.add_argument("--store", metavar="URL", default=None,
                    help="store URL: embedded (default), unix:///PATH (node daemon) or mooncake://")
    ap.add_argument("--role", choices=["both", "trainer", "inference"], default="both",
                    help="both (default): one process; trainer: commit only (then --hold); "
                         "inference: read and verify what a trainer committed with the same --seed")
    ap.add_argument("--hold", action="store_true",
                    help="trainer: keep running after the commit (a mooncake:// client's segment "
                         "holds the objects) until Ctrl-C / SIGTERM")
    ap.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                    help="inference: wait up to this long for the trainer's manifest")
    args = ap.parse_args(argv)

    cfg = ModelConfig.quick() if args.quick else ModelConfig()
    overrides = {k: v for k, v in (("layers", args.layers), ("experts", args.experts),
                                   ("hidden", args.hidden)) if v is not None}
    cfg = dataclasses.replace(cfg, **overrides)
    if cfg.experts % TRAIN_EP or cfg.layers < 1:
        ap.error(f"--experts must be a multiple of {TRAIN_EP} and --layers >= 1")

    # The handle lives as long as this process: a mooncake:// client's segment holds what it
    # committed, so a holding trainer must keep it.
    store = mcs.connect(args.store)
    results = run(cfg, apply=args.apply, density=args.density, seed=args.seed,
                  show_progress=not args.no_progress and sys.stderr.isatty(),
                  prefer_torch=not args.numpy, store_url=args.store, role=args.role,
                  wait_seconds=args.wait, store=store)
    print(format_table(results), flush=True)
    if args.role == "trainer" and args.hold:
        import signal
        import threading

        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        print("holding (Ctrl-C to stop)", file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            pass
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    ok = all(s["verified"] for s in results["strategies"].values())  # trainer: nothing to verify
    if not ok:
        print("VERIFICATION FAILED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
