"""The README's main job, small: every inference shard must verify."""

import json

from mooncake.sparse import demo


def test_demo_quick_overwrite(tmp_path):
    out = tmp_path / "r.json"
    assert demo.main(["--quick", "--no-progress", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    sp = r["strategies"]["sparse_ranges"]
    fs = r["strategies"]["full_source_per_target"]
    assert sp["verified"] and fs["verified"]
    assert sp["metrics"]["full_gets"] == 0
    assert fs["metrics"]["full_gets"] > 0
    assert r["source_objects_put"] == r["tensors"]
    # The sparse path reads each source entry at most once per node.
    assert sp["range_bytes_read"] <= r["source_bytes_put"]
    assert sp["range_bytes_read"] < fs["full_bytes_read"]


def test_demo_quick_scatter_add_numpy():
    assert demo.main(["--quick", "--no-progress", "--apply", "scatter_add", "--numpy"]) == 0


def test_demo_quick_scatter_add_bfloat16(tmp_path):
    # bfloat16 weights: old + (new - old) rounds twice, and the shards verify within that.
    out = tmp_path / "r.json"
    assert demo.main(["--quick", "--no-progress", "--apply", "scatter_add", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["dtype"] == "bfloat16"
    for name in ("sparse_ranges", "full_source_per_target"):
        assert r["strategies"][name]["verified"], name
        assert 0 < r["strategies"][name]["max_abs_error"] < 0.1
