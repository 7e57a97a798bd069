"""Helpers for tests and examples: run a node daemon (mooncake_sparse_node) for a while.

    from mooncake.sparse.testing import start_node_daemon
    with start_node_daemon(tmp_path, capacity="256MiB") as node:
        store = mcs.connect(node.url)
        ...

The daemon binary is found, in order, at $MOONCAKE_SPARSE_NODE_BIN, next to this package
(mooncake/sparse/bin/, where the wheel installs it), or on PATH.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

from ._errors import Unavailable

__all__ = ["NodeDaemon", "find_node_daemon", "start_node_daemon"]

_BINARY = "mooncake_sparse_node"


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


class NodeDaemon:
    """A running mooncake_sparse_node process (see start_node_daemon)."""

    def __init__(self, socket_path: Path, flags: dict[str, Any], log_path: Path) -> None:
        self.socket_path = Path(socket_path)
        self.flags = dict(flags)
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self.binary = find_node_daemon()

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
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        finally:
            log.close()
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
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        code = self.process.returncode
        self.process = None
        return code

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
def start_node_daemon(tmp_path: os.PathLike | str, **flags: Any) -> Iterator[NodeDaemon]:
    """Runs mooncake_sparse_node with its socket in `tmp_path` for the duration of the block.

    Keyword arguments become flags (`capacity="256MiB"` -> `--capacity=256MiB`); without a
    `config` file the daemon gets a small store (4 segments of 16 MiB) and log_level=warning.
    Yields a NodeDaemon (url, socket_path, stop/kill/start/restart, log). On exit it is stopped
    with SIGTERM; the socket file is gone afterwards."""
    tmp = Path(tmp_path)
    tmp.mkdir(parents=True, exist_ok=True)
    if "config" not in flags:  # a config file brings its own sizes and log level
        flags.setdefault("segment_size", "16MiB")
        if "capacity" not in flags:
            flags.setdefault("num_segments", 4)
        flags.setdefault("log_level", "warning")
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
