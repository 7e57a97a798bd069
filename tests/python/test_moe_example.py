"""examples/moe_training_loop.py end to end: a real AdamW training loop of a small MoE, trainer
EP2 -> inference EP1 x TP2 with fused engine parameters, steps sealed and waited for, bit-exact
after every read (of one step, or of a fold of several)."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "moe_training_loop.py"


def load_example():
    spec = importlib.util.spec_from_file_location("moe_training_loop", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_training_loop_syncs_bit_exact():
    ex = load_example()
    results = ex.run(steps=3)
    assert [r["generation"] for r in results] == [(0, 1), (1, 2), (2, 3)]
    for r in results:
        assert r["bit_exact"] and r["read"] == r["generation"]
        assert 0 < r["changed"] < r["entries"]  # a sparse update, not the whole model
        assert 0 < r["tensors_committed"] <= r["tensors"]  # only the changed tensors
        assert sum(r["applied"]) >= r["changed"]  # TP-replicated tensors reach both ranks
    assert ex.main(["--steps", "1"]) == 0


def test_training_loop_reads_a_fold_of_several_steps():
    ex = load_example()
    results = ex.run(steps=3, read_every=2)
    assert [r["read"] for r in results] == [None, (0, 2), (2, 3)]
    assert [r["bit_exact"] for r in results] == [None, True, True]
    assert ex.main(["--steps", "2", "--read-every", "2"]) == 0
