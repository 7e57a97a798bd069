"""Workers of the training-run tests (tests/python/test_steps.py): a trainer that trains a small
model with AdamW and commits each step's changed tensors, and readers that wait for each step,
read their TP shard of it and apply it. Started with the 'spawn' context, so they live in an
importable module of their own."""

from __future__ import annotations

import hashlib
import os
import time
import traceback

import numpy as np

HIDDEN, INTER = 48, 64
TP = 2
# name -> (shape, TP split dim: 0 column-parallel, 1 row-parallel, None replicated)
TENSORS = {
    "w_up": ((INTER, HIDDEN), 0),
    "w_down": ((HIDDEN, INTER), 1),
    "norm": ((HIDDEN,), None),   # never trained: unchanged every step
    "bias": ((INTER,), 0),       # trained only every 10th step
}


def shard_box(name: str, rank: int):
    shape, dim = TENSORS[name]
    offset = [0] * len(shape)
    local = list(shape)
    if dim is not None:
        local[dim] = shape[dim] // TP
        offset[dim] = rank * local[dim]
    return tuple(offset), tuple(local)


def digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()


def initial_weights() -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    return {n: (torch.randn(shape, generator=g) * 0.05).to(torch.bfloat16)
            for n, (shape, _) in TENSORS.items()}


MAX_LEAD = 10  # steps the trainer may run ahead of the slowest live reader


def trainer(url: str, namespace: str, steps: int, keep_last: int, q, positions=None) -> None:
    """Step k: one AdamW update of a bf16 model on random data; commits the tensors whose bits
    changed (overwrite, bit-exact), then seals the step with every tensor id. Sends each step's
    full weights' digest per rank shard. `positions`: the readers' steps (-1: not running); the
    trainer stays within MAX_LEAD steps of the live ones, as an RL trainer waits for its
    rollouts."""
    try:
        import torch

        import mooncake.sparse as mcs

        store = mcs.connect(url, namespace=namespace)
        store.set_retention(keep_last)
        params = {n: torch.nn.Parameter(t.clone()) for n, t in initial_weights().items()}
        opt = torch.optim.AdamW([params["w_up"], params["w_down"], params["bias"]], lr=1e-3)
        g = torch.Generator().manual_seed(1)
        for k in range(1, steps + 1):
            while positions is not None:
                live = [p for p in positions[:] if p >= 0]
                if not live or k - min(live) <= MAX_LEAD:
                    break
                time.sleep(0.002)
            old = {n: p.detach().clone() for n, p in params.items()}
            x = torch.randn(8, HIDDEN, generator=g).to(torch.bfloat16)
            h = torch.relu(x @ params["w_up"].T + params["bias"]) @ params["w_down"].T
            loss = ((h * params["norm"]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            if k % 10 != 0:
                params["bias"].grad = None  # the bias moves only every 10th step
            opt.step()
            committed = []
            for n, p in params.items():
                idx, vals = mcs.encode_update(p.detach(), old[n])
                if len(vals) == 0:
                    continue  # unchanged: no object, the seal covers it
                store.put_sparse_object(n, TENSORS[n][0], idx, vals, generation=(k - 1, k))
                committed.append(n)
            store.seal_generation((k - 1, k), list(TENSORS))
            shards = {}
            for r in range(TP):
                arrays = {}
                for n, p in params.items():
                    off, loc = shard_box(n, r)
                    sl = tuple(slice(o, o + s) for o, s in zip(off, loc))
                    arrays[n] = p.detach()[sl].view(torch.int16).numpy()
                shards[r] = digest(arrays)
            q.put(("step", k, shards, committed))
        q.put(("done", len(store.list_keys("mcs/src@" + namespace + "/w_up/")
                            if namespace else store.list_keys("mcs/src/w_up/"))))
    except BaseException:  # noqa: BLE001 - reported to the test
        q.put(("error", traceback.format_exc()))


def reader(url: str, namespace: str, rank: int, first: int, last: int, state_path: str,
           q, positions=None, fold: bool = True) -> None:
    """Holds its TP shard of every tensor. Resumes from `state_path` when it exists (a
    restarted worker: one read of the fold from its step to the newest), then follows step by
    step, saving its shards and step after each. `fold`: when behind, catch up in one read;
    otherwise read every step in turn."""
    try:
        import torch

        import mooncake.sparse as mcs

        store = mcs.connect(url, namespace=namespace)
        if os.path.exists(state_path):
            saved = np.load(state_path)
            at = int(saved["__step__"])
            shards = {n: torch.from_numpy(saved[n].copy()).view(torch.bfloat16) for n in TENSORS}
        else:
            at = first - 1
            full = initial_weights()
            shards = {}
            for n in TENSORS:
                off, loc = shard_box(n, rank)
                sl = tuple(slice(o, o + s) for o, s in zip(off, loc))
                shards[n] = full[n][sl].clone()
        targets = [mcs.Target(n, f"rank{rank}/{n}", "node0", {"tp": rank}, *shard_box(n, rank))
                   for n in TENSORS]
        while at < last:
            newest = store.latest_generation()
            k = at + 1
            if fold and newest is not None and newest[1] > k:
                k = min(newest[1], last)  # behind (or restarted): one read of the fold
            manifest = store.wait_generation((at, k), timeout=60)
            objs = store.read_sparse_objects(manifest, targets)
            for t, o in zip(targets, objs):
                mcs.apply_sparse_object(shards[t.tensor_id], o)
            if k > at + 1:
                q.put(("caught_up", rank, at, k))
            at = k
            if positions is not None:
                positions[rank] = at
            arrays = {n: shards[n].view(torch.int16).numpy() for n in TENSORS}
            q.put(("step", rank, at, digest(arrays)))
            tmp = state_path + ".tmp.npz"
            np.savez(tmp, __step__=np.int64(at), **arrays)
            os.replace(tmp, state_path)
        q.put(("done", rank))
    except BaseException:  # noqa: BLE001
        q.put(("error", traceback.format_exc()))
