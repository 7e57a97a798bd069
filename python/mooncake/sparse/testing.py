"""Helpers for tests and examples: run a node daemon (mooncake_sparse_node) for a while.

    from mooncake.sparse.testing import start_node_daemon
    with start_node_daemon(tmp_path, capacity="256MiB") as node:
        store = mcs.connect(node.url)
        ...

The daemon binary is found, in order, at $MOONCAKE_SPARSE_NODE_BIN, next to this package
(mooncake/sparse/bin/, where the wheel installs it), or on PATH. Pointing
$MOONCAKE_SPARSE_NODE_BIN at a sanitizer build runs the same tests against it: at the end of the
block start_node_daemon fails when the daemon did not exit cleanly on SIGTERM or its log holds a
sanitizer report (scripts/test.sh does this with its ASan/UBSan tree).

For many nodes on upstream Mooncake Store (needs the mooncake-transfer-engine wheel):

    with start_mooncake_master(tmp_path) as master:            # a real mooncake_master
        trainer = mcs.connect(master.url(local_hostname="127.0.0.1"))
        with start_python_node_daemon(tmp_path / "b", master.url(local_hostname="127.0.0.2"),
                                      node_id="nodeB") as node_b:
            reader = mcs.connect(node_b.url)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

from ._errors import Unavailable

__all__ = ["NodeDaemon", "DaemonFailure", "find_node_daemon", "start_node_daemon",
           "MooncakeMaster", "find_mooncake_master", "start_mooncake_master",
           "start_python_node_daemon"]

_BINARY = "mooncake_sparse_node"
# First lines of AddressSanitizer, LeakSanitizer, ThreadSanitizer and UndefinedBehaviorSanitizer
# reports (UBSan prints "file:line:col: runtime error: ...").
_SANITIZER_REPORT = re.compile(
    r"^(==\d+==\s*)?(ERROR|WARNING): (Address|Leak|Thread|Memory)Sanitizer\b|: runtime error: ",
    re.MULTILINE)


class DaemonFailure(RuntimeError):
    """A node daemon exited with a non-zero status when stopped, or reported a sanitizer error."""


def find_node_daemon() -> str:
    """Path of the mooncake_sparse_node binary; raises FileNotFoundError when there is none."""
    env = os.environ.get("MOONCAKE_SPARSE_NODE_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise FileNotFoundError(f"MOONCAKE_SPARSE_NODE_BIN={env!r} is not an executable")
        return env
    bundled = Path(__file__).resolve().parent / "bin" / _BINARY
    if os.access(bundled, os.X_OK):
        return str(bundled)
    found = shutil.which(_BINARY)
    if found:
        return found
    raise FileNotFoundError(
        f"{_BINARY} not found: set MOONCAKE_SPARSE_NODE_BIN, or install the wheel (which ships "
        f"it in {bundled.parent}), or put it on PATH"
    )


def _socket_accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(0.5)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _spawn_logged(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Starts `args` with stdout and stderr appended to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)


def _terminate(process: subprocess.Popen, timeout: float) -> int:
    """SIGTERM, a wait of `timeout` seconds, then SIGKILL; the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


class NodeDaemon:
    """A running mooncake_sparse_node process (see start_node_daemon)."""

    def __init__(self, socket_path: Path, flags: dict[str, Any], log_path: Path) -> None:
        self.socket_path = Path(socket_path)
        self.flags = dict(flags)
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self.binary = find_node_daemon()
        # Exit status of every stop() (a kill() is meant to leave no clean exit, so it has none).
        self.exit_codes: list[int] = []

    @property
    def url(self) -> str:
        """The store URL: mcs.connect(node.url)."""
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def args(self) -> list[str]:
        out = [self.binary, f"--socket_path={self.socket_path}"]
        for key, value in self.flags.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            out.append(f"--{key}={value}")
        return out

    def start(self, timeout: float = 20.0) -> "NodeDaemon":
        """Starts the daemon and waits until it accepts connections."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the node daemon is already running")
        self.process = _spawn_logged(self.args(), self.log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Unavailable(
                    f"{_BINARY} exited with status {self.process.returncode} while starting; "
                    f"log:\n{self.log()}"
                )
            if self.socket_path.exists() and _socket_accepts(str(self.socket_path)):
                return self
            time.sleep(0.02)
        self.kill()
        raise Unavailable(f"{_BINARY} did not listen on {self.socket_path} within {timeout} s; "
                          f"log:\n{self.log()}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then waits for a clean exit; returns the exit status."""
        if self.process is None:
            return 0
        code = _terminate(self.process, timeout)
        self.process = None
        self.exit_codes.append(code)
        return code

    def check_clean(self) -> None:
        """Raises DaemonFailure when a stop() saw a non-zero exit status (a sanitizer exits with
        one, e.g. on a leak at exit) or the log holds a sanitizer report."""
        log = self.log()
        report = _SANITIZER_REPORT.search(log)
        bad = [code for code in self.exit_codes if code != 0]
        if report is None and not bad:
            return
        what = []
        if bad:
            what.append(f"exited with status {bad[0]} when stopped")
        if report is not None:
            what.append("reported a sanitizer error")
        excerpt = log[report.start():] if report is not None else log
        raise DaemonFailure(f"{_BINARY} ({self.binary}) {' and '.join(what)}; log "
                            f"{self.log_path}:\n{excerpt[-20000:]}")

    def kill(self) -> None:
        """SIGKILL (no cleanup: the socket file stays, as after a crash)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, timeout: float = 20.0) -> "NodeDaemon":
        self.stop()
        return self.start(timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def start_node_daemon(tmp_path: os.PathLike | str, *, check_clean: bool = True,
                      **flags: Any) -> Iterator[NodeDaemon]:
    """Runs mooncake_sparse_node with its socket in `tmp_path` for the duration of the block.

    Keyword arguments become flags (`capacity="256MiB"` -> `--capacity=256MiB`); without a
    `config` file the daemon gets a small store (4 segments of 16 MiB) and log_level=warning.
    Yields a NodeDaemon (url, socket_path, stop/kill/start/restart, log). On exit it is stopped
    with SIGTERM; the socket file is gone afterwards, and it also stops when the thread that
    started it exits (`exit_with_parent`: a harness killed mid-run leaves no daemon behind;
    start it from a thread that outlives it). Then, with `check_clean` (the default), a
    daemon that exited with a non-zero status when stopped, or whose log holds a sanitizer
    report, raises DaemonFailure: its crash fails the test even when the test did not notice."""
    tmp = Path(tmp_path)
    tmp.mkdir(parents=True, exist_ok=True)
    if "config" not in flags:  # a config file brings its own sizes and log level
        flags.setdefault("segment_size", "16MiB")
        if "capacity" not in flags:
            flags.setdefault("num_segments", 4)
        flags.setdefault("log_level", "warning")
    # A harness killed mid-run (the OOM killer, a timeout) takes its daemon with it.
    flags.setdefault("exit_with_parent", True)
    # sockaddr_un holds 108 bytes: keep the path short even under a deep tmp dir.
    socket_path = tmp / "node.sock"
    if len(str(socket_path)) > 100:
        import tempfile

        socket_path = Path(tempfile.mkdtemp(prefix="mcs-")) / "node.sock"
    daemon = NodeDaemon(socket_path, flags, tmp / "node.log")
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        if check_clean:
            daemon.check_clean()


def wait_prepared(store: Any, timeout: float = 120.0) -> float | None:
    """Waits up to `timeout` seconds until the node daemon behind `store` has prepared its
    segments: after it starts, it pre-faults them and registers them with CUDA in the background
    (its `pinning_complete` metric), and a benchmark's first steps would otherwise run beside that
    work, which the daemon of a running job has long finished. Returns the seconds waited, or None
    for a store without that preparation (the embedded store) or a `timeout` of 0 or less."""
    if timeout <= 0 or "pinning_complete" not in store.metrics():
        return None
    t0 = time.perf_counter()
    while store.metrics().get("pinning_complete") != 1 and time.perf_counter() - t0 < timeout:
        time.sleep(0.05)
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Upstream Mooncake Store: a real mooncake_master, and node daemons hosted in Python on it.
# ---------------------------------------------------------------------------------------------
def find_mooncake_master() -> str:
    """Path of upstream's mooncake_master (from the mooncake-transfer-engine wheel): at
    $MOONCAKE_MASTER, on PATH, or inside the installed mooncake package."""
    env = os.environ.get("MOONCAKE_MASTER")
    if env:
        return env
    found = shutil.which("mooncake_master")
    if found:
        return found
    try:
        import mooncake

        for base in getattr(mooncake, "__path__", []):
            candidate = Path(base) / "mooncake_master"
            if os.access(candidate, os.X_OK):
                return str(candidate)
    except ImportError:
        pass
    raise FileNotFoundError("mooncake_master not found: pip install mooncake-transfer-engine-non-cuda")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MooncakeMaster:
    """A running mooncake_master with its HTTP metadata server (see start_mooncake_master)."""

    def __init__(self, log_path: Path) -> None:
        self.rpc_port = _free_port()
        self.metadata_port = _free_port()
        self.metrics_port = _free_port()
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata(self) -> str:
        return f"http://127.0.0.1:{self.metadata_port}/metadata"

    def url(self, **options: Any) -> str:
        """mooncake://127.0.0.1:PORT?metadata=...&OPTION=VALUE..."""
        import urllib.parse

        query = {"protocol": "tcp", "metadata": self.metadata, **options}
        return f"mooncake://{self.address}?" + urllib.parse.urlencode(query)

    def start(self, timeout: float = 30.0) -> "MooncakeMaster":
        args = [find_mooncake_master(), f"--rpc_port={self.rpc_port}",
                "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={self.metadata_port}",
                f"--metrics_port={self.metrics_port}"]
        self.process = _spawn_logged(args, self.log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Unavailable(f"mooncake_master exited with {self.process.returncode}; "
                                  f"log:\n{self.log()}")
            if _tcp_accepts(self.rpc_port) and _tcp_accepts(self.metadata_port):
                return self
            time.sleep(0.05)
        self.stop()
        raise Unavailable(f"mooncake_master did not listen within {timeout} s; log:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None:
            _terminate(self.process, 10)
        self.process = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def start_mooncake_master(tmp_path: os.PathLike | str) -> Iterator[MooncakeMaster]:
    """Runs upstream's mooncake_master on free loopback ports for the duration of the block."""
    tmp = Path(tmp_path)
    tmp.mkdir(parents=True, exist_ok=True)
    master = MooncakeMaster(tmp / "master.log").start()
    try:
        yield master
    finally:
        master.stop()


class PythonNodeDaemon:
    """A `python -m mooncake.sparse.node` process (see start_python_node_daemon)."""

    def __init__(self, process: subprocess.Popen, socket_path: Path, log_path: Path) -> None:
        self.process = process
        self.socket_path = socket_path
        self.log_path = log_path

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> int:
        return _terminate(self.process, 20)


@contextlib.contextmanager
def start_python_node_daemon(tmp_path: os.PathLike | str, store: str | None, *,
                             node_id: str = "node0", segment_bytes: int = 16 << 20,
                             num_segments: int = 4, timeout: float = 60.0,
                             env: dict[str, str] | None = None) -> Iterator[PythonNodeDaemon]:
    """Runs a node daemon hosted in Python (mooncake.sparse.node), with its sparse objects on
    `store` (a mooncake:// URL) when given, for the duration of the block."""
    import sys
    import tempfile

    tmp = Path(tmp_path)
    tmp.mkdir(parents=True, exist_ok=True)
    socket_path = Path(tempfile.mkdtemp(prefix="mcs-")) / "node.sock"
    log_path = tmp / f"{node_id}.log"
    args = [sys.executable, "-X", "faulthandler", "-m", "mooncake.sparse.node",
            f"--socket_path={socket_path}",
            f"--node_id={node_id}", f"--segment_size={segment_bytes}",
            f"--num_segments={num_segments}"]
    if store:
        args.append(f"--store={store}")
    process = _spawn_logged(args, log_path, env={**os.environ, **(env or {})})
    daemon = PythonNodeDaemon(process, socket_path, log_path)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if process.poll() is not None:
                raise Unavailable(f"node daemon {node_id} exited with {process.returncode}; "
                                  f"log:\n{daemon.log()}")
            if socket_path.exists() and _socket_accepts(str(socket_path)):
                break
            if time.monotonic() > deadline:
                raise Unavailable(f"node daemon {node_id} did not listen within {timeout} s; "
                                  f"log:\n{daemon.log()}")
            time.sleep(0.05)
        yield daemon
    finally:
        daemon.stop()
