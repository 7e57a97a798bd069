"""The node daemon's command line, as the README shows it: `mooncake_sparse_node` on PATH after
`pip install`, `python -m mooncake.sparse.node` with the same flags and size syntax, a YAML
config, and a default socket path that exists for every user (root in a container included)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

import mooncake.sparse as mcs
from mooncake.sparse import node
from mooncake.sparse.testing import find_node_daemon

try:
    find_node_daemon()
except FileNotFoundError as e:  # pragma: no cover - the wheel always ships it
    pytest.skip(str(e), allow_module_level=True)


def command() -> str:
    """The console script pip installed beside this interpreter."""
    script = Path(sysconfig.get_path("scripts")) / "mooncake_sparse_node"
    if not script.exists():
        found = shutil.which("mooncake_sparse_node")
        assert found, "pip install did not put mooncake_sparse_node on PATH"
        return found
    return str(script)


def env_with_runtime_dir(tmp_path):
    return {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}


def run(args, tmp_path, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=60,
                          env=env_with_runtime_dir(tmp_path), **kw)


def test_both_commands_resolve_the_same_configuration(tmp_path):
    flags = ["--segment_size=1MiB", "--capacity=4MiB", "--frame_timeout=3s",
             "--cache_capacity_bytes=64MiB", "--log_level=warning"]
    native = run([command(), "--print_config", *flags], tmp_path)
    hosted = run([sys.executable, "-m", "mooncake.sparse.node", "--print_config", *flags],
                 tmp_path)
    assert native.returncode == 0, native.stderr
    assert hosted.returncode == 0, hosted.stderr
    a = json.loads(native.stdout)
    assert a["segment_size"] == 1 << 20 and a["capacity"] == 4 << 20
    assert a["frame_timeout"] == "3000ms"
    assert a["socket_path"] == str(tmp_path / "mooncake-sparse" / "node.sock")
    assert json.loads(hosted.stdout) == a


def test_yaml_config_and_flags_in_both(tmp_path):
    cfg = tmp_path / "node.yaml"
    cfg.write_text("segment_size: 2MiB\nnum_segments: 2\nnode_id: fromfile\nlog_level: error\n")
    for args in ([command()], [sys.executable, "-m", "mooncake.sparse.node"]):
        done = run([*args, "--print_config", f"--config={cfg}", "--node_id=fromflag"], tmp_path)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert got["segment_size"] == 2 << 20
        assert got["num_segments"] == 2
        assert got["node_id"] == "fromflag"  # a flag wins over the file


def test_bad_values_fail_in_both(tmp_path):
    for args in ([command()], [sys.executable, "-m", "mooncake.sparse.node"]):
        for bad, says in (("--segment_size=12 parsecs", "segment_size"),
                          ("--frame_timeout=soon", "frame_timeout"), ("--bogus=1", "bogus")):
            done = run([*args, "--print_config", bad], tmp_path)
            # 2: a bad value; gflags itself exits 1 for a flag it does not know.
            assert done.returncode in (1, 2), (args, bad, done.stdout, done.stderr)
            assert says in done.stderr and not done.stdout


def test_default_socket_path_serves_unix_url(tmp_path):
    """No --socket_path: the daemon makes its directory (0700) and connect("unix://") finds it;
    the C++ and Python rules agree."""
    env = env_with_runtime_dir(tmp_path)
    os.environ["XDG_RUNTIME_DIR"] = str(tmp_path)
    try:
        expected = tmp_path / "mooncake-sparse" / "node.sock"
        assert node.default_socket_path() == str(expected)
        proc = subprocess.Popen([command(), "--segment_size=1MiB", "--num_segments=2",
                                 "--log_level=warning"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not expected.exists():
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "the daemon did not listen"
                time.sleep(0.05)
            assert (expected.parent.stat().st_mode & 0o777) == 0o700
            store = mcs.connect("unix://")
            x = np.arange(16, dtype=np.float32)
            store.put_tensor("w", x)
            np.testing.assert_array_equal(store.get_tensor("w"), x)
            store.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        assert not expected.exists()
    finally:
        del os.environ["XDG_RUNTIME_DIR"]


def test_python_hosted_daemon_takes_the_same_flags(tmp_path):
    sock = tmp_path / "py.sock"
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "mooncake.sparse.node",
                             f"--socket_path={sock}", "--segment_size=1MiB", "--capacity=2MiB",
                             "--idle_timeout=30s", f"--ready_file={ready}"],
                            env=env_with_runtime_dir(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        store = mcs.connect(json.loads(ready.read_text())["url"])
        assert store.capabilities()["shm_capacity_bytes"] == 2 << 20
        store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_earlier_flag_spellings_still_work(tmp_path):
    done = run([sys.executable, "-m", "mooncake.sparse.node", "--print_config",
                f"--socket-path={tmp_path}/a.sock", "--segment-bytes=1048576"], tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["socket_path"] == f"{tmp_path}/a.sock" and got["segment_size"] == 1 << 20
