"""benchmarks/gpu_sync_bench.py at its CPU size (--quick): a whole sparse step of a MoE layer
and its dense baselines run, every shard checked, and the JSON lines carry every phase."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_sync_bench.py"


def test_cpu_size_runs_and_reports_every_phase(tmp_path):
    out = tmp_path / "gpu_sync.jsonl"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--quick",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    steps = [r for r in recs if r["what"] == "gpu_sync"]
    assert {r["apply"] for r in steps} == {"overwrite", "scatter_add"}
    for r in steps:
        for k in ("encode_s", "commit_s", "read_s", "apply_s", "dense_box_s", "dense_full_s",
                  "floor_s"):
            assert r[k] > 0, k
        assert r["nnz"] > 0 and r["targets"] > r["tensors"]
        assert r["read_bytes"] < r["node_bytes"]
        # The daemon's steps start once it has prepared its segments; the embedded store has
        # none to prepare.
        if r["backend"] == "node":
            assert r["daemon_pinning_complete"] == 1 and r["daemon_prepared_wait_s"] >= 0
        else:
            assert r["daemon_prepared_wait_s"] is None


def test_trace_records_the_four_phases_of_each_modes_last_step(tmp_path):
    trace = tmp_path / "trace"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--quick",
                           "--backends", "embedded", "--apply", "overwrite",
                           "--trace", str(trace)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = json.loads((trace / "trace_embedded_overwrite.json").read_text())["traceEvents"]
    phases = {e["name"] for e in events if e.get("name", "").startswith("phase:")}
    assert phases == {"phase:encode", "phase:commit", "phase:read", "phase:apply"}


def test_step_timing_reports_the_wall_of_the_four_calls(tmp_path):
    # --timing step waits for the device only around the whole step: sparse_s is its wall, and
    # the phases (host intervals inside it, the last one to the device's finishing) fit in it.
    out = tmp_path / "gpu_sync.jsonl"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--quick",
                           "--backends", "embedded", "--timing", "step", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    steps = [r for r in steps if r["what"] == "gpu_sync"]
    assert len(steps) == 2 and {r["timing"] for r in steps} == {"step"}
    for r in steps:
        phases = r["encode_s"] + r["commit_s"] + r["read_s"] + r["apply_s"]
        assert 0 < phases <= r["sparse_s"]
        assert r["sparse_over_floor"] == pytest.approx(r["sparse_s"] / r["floor_s"])
