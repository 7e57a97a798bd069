"""The node daemon, from Python: the ``mooncake_sparse_node`` command and ``python -m
mooncake.sparse.node`` take the same flags, YAML keys and value syntax (sizes ``256MiB``,
durations ``10s``), parsed by the same code as the C++ daemon::

    mooncake_sparse_node --segment_size=256MiB --capacity=8GiB --pinned_quota_bytes=4GiB
    mooncake_sparse_node --config=node.yaml --log_level=debug     # flags win over the file
    mooncake_sparse_node --store "mooncake://MASTER:50051?local_hostname=THIS_HOST"

Without ``--store`` the command runs the C++ daemon that the wheel ships (``mooncake/sparse/
bin/``). With ``--store mooncake://...`` the daemon is hosted in this Python process, because
upstream Mooncake Store's client lives in Python: it keeps sparse source objects, manifests and
generation heads in upstream Mooncake Store, so a trainer on another node commits there and this
node's readers share the daemon's caches and single-flight table (each unique range the node
needs crosses the network once). Tensors are published there too (upstream's own tensor value,
in this daemon's upstream segment), so a daemon of another node on the same master reads them
by TransferEngine; read results stay in the node's shared-memory segments.
``python -m mooncake.sparse.node`` always hosts the daemon in Python.

Every process of the node connects with ``mooncake.sparse.connect("unix://")`` (the default
socket path, ``default_socket_path()``) or ``connect("unix:///PATH")``.
SIGTERM / SIGINT stop it cleanly (connections closed, socket file removed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Mapping, Sequence

from . import _core
from ._errors import InvalidArgument, Unimplemented

__all__ = ["NodeDaemon", "default_socket_path", "node_config_keys", "main", "console_main"]

# Flags of this front end only; every other flag is a key of the daemon's configuration.
_PYTHON_FLAGS = ("store", "ready_file", "exit_with_parent")
# The spellings of earlier releases of `python -m mooncake.sparse.node`.
_OLD_NAMES = {"socket-path": "socket_path", "node-id": "node_id", "segment-bytes": "segment_size",
              "num-segments": "num_segments", "pinned-quota-bytes": "pinned_quota_bytes",
              "cache-capacity-bytes": "cache_capacity_bytes", "ready-file": "ready_file"}


def default_socket_path() -> str:
    """Where the node daemon listens, and where ``connect("unix://")`` looks, when no path is
    given: ``$XDG_RUNTIME_DIR/mooncake-sparse/node.sock`` when that directory exists, else
    ``/tmp/mooncake-sparse-$EUID/node.sock`` (the daemon creates the directory, mode 0700)."""
    if getattr(_core, "HAS_NODE_SERVER", False):
        return str(_core.default_socket_path())
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/") and os.path.isdir(runtime):
        return os.path.join(runtime, "mooncake-sparse", "node.sock")
    return f"/tmp/mooncake-sparse-{os.geteuid()}/node.sock"


def node_config_keys() -> list[str]:
    """The daemon's configuration keys: flags of mooncake_sparse_node, keys of its YAML file,
    keyword arguments of NodeDaemon."""
    if not getattr(_core, "HAS_NODE_SERVER", False):
        raise Unimplemented("this build of mooncake.sparse has no node daemon server")
    return list(_core.node_config_keys())


class NodeDaemon:
    """A node daemon served from this process (its threads; the GIL is free while it idles).

    ``config`` takes the daemon's keys (``node_config_keys()``) with values as the binary takes
    them: ints or strings with units (``segment_size="256MiB"``, ``frame_timeout="10s"``).
    ``store`` (a ``mooncake://`` URL) keeps the sparse objects in upstream Mooncake Store;
    ``store_options`` override that URL's options.
    Raises InvalidArgument for an unknown key or a bad value."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *,
                 store: str | None = None, store_options: Mapping[str, Any] | None = None,
                 **config: Any) -> None:
        if not getattr(_core, "HAS_NODE_SERVER", False):
            raise Unimplemented("this build of mooncake.sparse has no node daemon server")
        if socket_path is not None:
            config["socket_path"] = os.fspath(socket_path)
        unknown = sorted(set(config) - set(node_config_keys()))
        if unknown:
            raise InvalidArgument(f"unknown node daemon configuration key(s) {unknown}; "
                                  f"known: {node_config_keys()}")
        if store is not None and not isinstance(store, str):
            raise InvalidArgument("store must be a mooncake:// URL (str)")
        self.upstream = None
        node_id = str(config.get("node_id", "node0"))
        if store is not None:
            from ._upstream import UpstreamObjectStore, parse_mooncake_url
            self.upstream = UpstreamObjectStore.connect(
                parse_mooncake_url(store, node_id=node_id, **dict(store_options or {})))
        self._server = _core._NodeServer(config, self.upstream)
        self.socket_path = str(self._server.socket_path)
        self.url = "unix://" + self.socket_path
        self.node_id = node_id

    def metrics(self) -> dict[str, float]:
        out = dict(self._server.metrics())
        if self.upstream is not None:
            out.update({f"upstream_{k}": v for k, v in self.upstream.counters().items()})
        return out

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> "NodeDaemon":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _usage() -> str:
    keys = " ".join(f"[--{k}=...]" for k in node_config_keys()) if getattr(
        _core, "HAS_NODE_SERVER", False) else ""
    return (f"usage: mooncake_sparse_node [--config=FILE.yaml] {keys} [--store=mooncake://...] "
            "[--ready_file=PATH] [--exit_with_parent] [--print_config]\n\n" + (__doc__ or ""))


def _parse_flags(argv: Sequence[str]) -> dict[str, str | bool]:
    """gflags-style ``--key=value``, ``--key value`` and bare boolean ``--key``."""
    out: dict[str, str | bool] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--") or a == "--":
            raise InvalidArgument(f"unexpected argument {a!r} (flags are --key=value)")
        name, eq, value = a[2:].partition("=")
        name = _OLD_NAMES.get(name, name)
        if not eq:
            if name in ("print_config", "prefault_segments", "exit_with_parent", "help"):
                out[name] = True
                i += 1
                continue
            if i + 1 >= len(args):
                raise InvalidArgument(f"--{name} needs a value")
            value = args[i + 1]
            i += 1
        out[name] = value
        i += 1
    return out


def _resolve(flags: Mapping[str, str | bool]) -> dict[str, Any]:
    """Defaults < --config file < flags, resolved by the daemon binary's own parser (yaml-cpp
    lives in the binary only, and it prints exactly what it would run with); without the
    binary, flags alone are parsed by the extension when the daemon starts."""
    daemon_flags = {k: v for k, v in flags.items()
                    if k not in _PYTHON_FLAGS and k not in ("print_config", "help")}
    unknown = sorted(set(daemon_flags) - set(node_config_keys()) - {"config"})
    if unknown:
        raise InvalidArgument(f"unknown flag(s) {['--' + k for k in unknown]}; "
                              f"known: {['--' + k for k in node_config_keys()]}")
    from .testing import find_node_daemon

    try:
        binary = find_node_daemon()
    except FileNotFoundError:
        if "config" in daemon_flags:
            raise InvalidArgument("--config needs the mooncake_sparse_node binary (it parses "
                                  "the YAML file); set MOONCAKE_SPARSE_NODE_BIN") from None
        return dict(daemon_flags)
    args = [binary, "--print_config"]
    args += [f"--{k}={'true' if v is True else v}" for k, v in daemon_flags.items()]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise InvalidArgument(f"node daemon configuration: {done.stderr.strip()}")
    return dict(json.loads(done.stdout))


def _exit_with_parent() -> None:
    """SIGTERM to this process when the thread that started it exits (Linux PR_SET_PDEATHSIG),
    as the C++ daemon's --exit_with_parent; a parent gone already stops it now."""
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mooncake.sparse.node``: the daemon hosted in this process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        flags = _parse_flags(argv)
        if flags.get("help"):
            print(_usage())
            return 0
        config = _resolve(flags)
        if flags.get("print_config"):
            print(json.dumps(config))
            return 0
        store = flags.get("store")
        daemon = NodeDaemon(store=str(store) if store else None, **config)
    except InvalidArgument as e:
        print(f"mooncake_sparse_node: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if str(flags.get("exit_with_parent", False)).lower() in ("true", "1", "yes"):
        _exit_with_parent()
    ready_file = flags.get("ready_file")
    if ready_file:
        with open(str(ready_file), "w") as f:
            json.dump({"url": daemon.url, "node_id": daemon.node_id, "store": store}, f)
    print(f"mooncake.sparse node daemon {daemon.node_id} at {daemon.url}"
          + (f" on {store}" if store else ""), file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    daemon.stop()
    return 0


def console_main() -> int:
    """The ``mooncake_sparse_node`` command: the shipped C++ daemon, or with ``--store`` the
    daemon hosted in Python (same flags either way)."""
    argv = sys.argv[1:]
    if any(a == "--store" or a.startswith("--store=") for a in argv):
        return main(argv)
    # Not a PATH lookup: on PATH, mooncake_sparse_node is this very command.
    binary = os.environ.get("MOONCAKE_SPARSE_NODE_BIN") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "bin", "mooncake_sparse_node")
    if not os.access(binary, os.X_OK):
        print(f"mooncake_sparse_node: the daemon binary {binary} is missing (this build of "
              "mooncake.sparse has none; set MOONCAKE_SPARSE_NODE_BIN)", file=sys.stderr)
        return 1
    os.execv(binary, [binary, *argv])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
