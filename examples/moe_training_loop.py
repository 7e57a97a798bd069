"""A small MoE trained with AdamW on CPU, its bf16 weights synced every step from a trainer
laid out EP2 to an inference engine laid out EP1 x TP2 with vLLM-style fused parameters
(qkv_proj, FusedMoE w13_weight / w2_weight, padded vocabulary rows), checked bit for bit:
after the initial load and after every read, each engine parameter (padding rows included)
equals the one vLLM's loaders would build from the trainer's weights (vllm_reference, laid
out by hand, independently of the library's views).

    python examples/moe_training_loop.py [--steps 4] [--read-every 1] [--store URL] [--verbose]

Each step commits only the tensors that changed and is sealed with the model's tensor list by
trainer rank 0; each inference rank waits for the seal (wait_generation), then applies the step
in one read, or, with --read-every N, the last N steps in one read (a fold).

Both trainer ranks and both inference ranks run in this process, on one store; in a real run
each is its own process with the same plan, and a barrier between the trainer ranks orders
rank 0's seal after every rank's commit.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch
import torch.nn.functional as F
from torch import nn

import mooncake.sparse as mcs
from mooncake.sparse import engines, layout

VOCAB, HIDDEN, LAYERS = 96, 32, 2
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
EXPERTS, TOP_K, INTER = 4, 2, 24


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        k, v = (z.repeat_interleave(HEADS // KV_HEADS, dim=1) for z in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, HEADS * HEAD_DIM))


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTER, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTER, bias=False)
        self.down_proj = nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)  # the router
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, HIDDEN)
        weights, chosen = self.gate(flat).softmax(-1).topk(TOP_K, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if len(rows):
                out.index_add_(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        return out.view_as(x)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = nn.RMSNorm(HIDDEN)
        self.mlp = MoE()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(HIDDEN)


class TinyMoE(nn.Module):
    """Qwen3-MoE's parameter names (model.layers.N.mlp.experts.E.gate_proj.weight, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Body()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def bf16_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights the inference engine serves: bf16 copies of the fp32 master weights."""
    return {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}


def engine_params(plan: mcs.SyncPlan, rank: int,
                  names: engines.EngineNameMap) -> dict[str, torch.Tensor]:
    """What the engine allocates on `rank`: its fused parameters, vocabulary rows padded to a
    multiple of 64 and split evenly (zeros past the real rows), as vLLM allocates them."""
    return {n: torch.zeros(s, dtype=torch.bfloat16)
            for n, s in mcs.engine_param_shapes(plan, rank, names).items()}


def vllm_reference(state: dict[str, torch.Tensor], tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s parameters of vLLM's Qwen3-MoE at --tensor-parallel-size `tp` (no EP), laid
    out by hand as its loaders lay them out, independently of the library: qkv_proj is this
    rank's q heads, then its k heads, then its v heads; w13_weight [E, 2 I/tp, H] is each
    expert's gate rows, then its up rows; w2_weight [E, H, I/tp] and o_proj split their input
    dim; embed_tokens / lm_head hold rows [r * per, (r + 1) * per) of the vocabulary padded to
    a multiple of 64 (per = padded / tp), zeros past the real rows."""
    def part(x: torch.Tensor, dim: int, parts: int, i: int) -> torch.Tensor:
        return x.chunk(parts, dim)[i]

    kv_parts = min(tp, KV_HEADS)  # fewer KV heads than ranks: each is replicated
    kv_i = rank * kv_parts // tp
    out = {}
    for n, w in state.items():
        pre, _, leaf = n.rpartition(".")
        if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            if n.endswith("q_proj.weight"):
                a = pre.rpartition(".")[0]
                out[f"{a}.qkv_proj.weight"] = torch.cat([
                    part(w, 0, tp, rank), part(state[f"{a}.k_proj.weight"], 0, kv_parts, kv_i),
                    part(state[f"{a}.v_proj.weight"], 0, kv_parts, kv_i)])
        elif ".experts." in n:
            if n.endswith(".0.gate_proj.weight"):
                m = n[:-len(".0.gate_proj.weight")]
                ids = range(EXPERTS)
                out[f"{m}.w13_weight"] = torch.stack([torch.cat([
                    part(state[f"{m}.{e}.gate_proj.weight"], 0, tp, rank),
                    part(state[f"{m}.{e}.up_proj.weight"], 0, tp, rank)]) for e in ids])
                out[f"{m}.w2_weight"] = torch.stack([
                    part(state[f"{m}.{e}.down_proj.weight"], 1, tp, rank) for e in ids])
        elif n.endswith("o_proj.weight"):
            out[n] = part(w, 1, tp, rank)
        elif n in ("model.embed_tokens.weight", "lm_head.weight"):
            per = -(-VOCAB // 64) * 64 // tp
            rows = w[rank * per:(rank + 1) * per]
            out[n] = torch.cat([rows, torch.zeros(per - len(rows), HIDDEN, dtype=w.dtype)])
        else:  # norms, the router: replicated
            out[n] = w
    return out


def same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and torch.equal(a[k].view(torch.int16), b[k].view(torch.int16))
        for k in a)


def run(steps: int = 4, store_url: str | None = None, lr: float = 1e-5,
        seed: int = 0, read_every: int = 1) -> list[dict]:
    torch.manual_seed(seed)
    model = TinyMoE()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}

    # Describe both layouts once; the plan gives every rank its sources or targets.
    trainer = mcs.ParallelLayout(ep=2, rules=layout.expert_rules(), name="trainer")
    inference = mcs.ParallelLayout(ep=1, tp=2, name="inference",
                                   rules=layout.qwen3_moe_rules(num_kv_heads=KV_HEADS))
    plan = mcs.SyncPlan(trainer, inference, shapes)
    names = engines.qwen3_moe_names("vllm")
    store = mcs.connect(store_url)

    # Start: the engine loads the initial weights into its fused parameters through the views.
    state = bf16_state(model)
    syncs = [mcs.TrainerSync(store, plan, r) for r in range(trainer.world_size)]
    for r, sync in enumerate(syncs):  # each EP rank holds its experts and the shared weights
        sync.snapshot({s.tensor_id: state[s.tensor_id] for s in plan.held(r)})
    params = [engine_params(plan, r, names) for r in range(inference.world_size)]
    views = [mcs.engine_views(params[r], plan, r, names) for r in range(inference.world_size)]
    for r in range(inference.world_size):
        for t in plan.targets(r):
            views[r][t.tensor_id].copy_(box(state[t.tensor_id], t))
        if not same_bits(params[r], vllm_reference(state, inference.tp, r)):
            raise RuntimeError(f"inference rank {r}: the views do not lay the weights out as "
                               "vLLM does")
    # Each inference rank tracks the step its weights are at (0: the initial weights).
    readers = [mcs.InferenceSync(store, plan, r, views[r]) for r in range(inference.world_size)]

    results = []
    for step in range(1, steps + 1):
        tokens = torch.randint(0, VOCAB, (4, 16))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

        state = bf16_state(model)
        # Trainer: every rank commits what changed (here one after the other; in a real run
        # concurrently, then a barrier), then rank 0 seals the step with every tensor id.
        stats = [sync.step({s.tensor_id: state[s.tensor_id] for s in plan.held(r)})
                 for r, sync in enumerate(syncs)]
        syncs[0].seal(timeout=10)  # retries while a rank's commit is still in flight
        generation = stats[0].generation

        # Inference: wait for the seal, then one read (of every step since the last one).
        read = step % read_every == 0 or step == steps
        applied = [reader.update(step, timeout=60) for reader in readers] if read else []
        # Every engine parameter, padding rows included, bit for bit what vLLM would hold.
        exact = all(same_bits(params[r], vllm_reference(state, inference.tp, r))
                    for r in range(inference.world_size)) if read else None
        dense = sum(w.numel() * 2 for w in state.values())
        results.append({"step": step, "generation": generation, "loss": loss.item(),
                        "changed": sum(s.nnz for s in stats), "entries": dense // 2,
                        "tensors_committed": len({t.tensor_id for s in stats for t in s.tensors
                                                  if t.committed}),
                        "tensors": len(plan.tensor_ids),
                        "bytes_committed": sum(s.bytes for s in stats), "dense_bytes": dense,
                        "read": applied[0].generation if applied else None,
                        "applied": [a.nnz for a in applied], "bit_exact": exact})
    return results


def box(x: torch.Tensor, t: mcs.Target) -> torch.Tensor:
    return x[tuple(slice(o, o + n) for o, n in zip(t.global_offset, t.local_shape))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--read-every", type=int, default=1,
                    help="inference ranks read every N steps (N > 1: a fold of N steps)")
    ap.add_argument("--store", default=None, help="store URL (default: embedded)")
    ap.add_argument("--verbose", action="store_true", help="debug log of mooncake.sparse")
    args = ap.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("mooncake.sparse").setLevel(logging.DEBUG)
    results = run(args.steps, args.store, args.lr, read_every=args.read_every)
    for r in results:
        read = ("not read yet" if r["read"] is None else
                f"read {r['read']}: applied per inference rank {r['applied']}, "
                f"{'bit-exact' if r['bit_exact'] else 'MISMATCH'}")
        print(f"step {r['step']} {r['generation']}: loss {r['loss']:.3f}, "
              f"{r['changed']}/{r['entries']} bf16 entries changed in "
              f"{r['tensors_committed']}/{r['tensors']} tensors, "
              f"{r['bytes_committed']} B committed vs {r['dense_bytes']} B dense; {read}")
    return 0 if all(r["bit_exact"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
