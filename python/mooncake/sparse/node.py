"""Runs a node daemon in this process, optionally on upstream Mooncake Store (docs/design.md §6).

    python -m mooncake.sparse.node --socket-path /run/user/$UID/mcs.sock \\
        --store "mooncake://MASTER:50051?local_hostname=THIS_HOST"

Every process of the node connects with ``mooncake.sparse.connect("unix:///run/user/...")``.
With ``--store mooncake://...`` the daemon keeps sparse source objects, manifests and
generation heads in upstream Mooncake Store, so a trainer on another node commits there and
this node's readers share the daemon's caches and single-flight table: each unique range the
node needs crosses the network once. Tensors and read results stay in the node's shared-memory
segments. Without ``--store`` it is the standalone ``mooncake_sparse_node`` in Python.

SIGTERM / SIGINT stop it cleanly (connections closed, socket file removed).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any, Sequence

from . import _core
from ._errors import Unimplemented


class NodeDaemon:
    """A node daemon served from this process (its threads; the GIL is free while it idles)."""

    def __init__(self, socket_path: str, *, node_id: str = "node0", store: str | None = None,
                 segment_bytes: int = 256 << 20, num_segments: int = 4,
                 pinned_quota_bytes: int = 0, cache_capacity_bytes: int = 1 << 30,
                 read_threads: int = 2, **store_options: Any) -> None:
        if not _core.HAS_NODE_SERVER:
            raise Unimplemented("this build of mooncake.sparse has no node daemon server")
        self.upstream = None
        if store is not None:
            from ._upstream import UpstreamObjectStore, parse_mooncake_url
            self.upstream = UpstreamObjectStore.connect(
                parse_mooncake_url(store, node_id=node_id, **store_options))
        self._server = _core._NodeServer(
            socket_path, node_id=node_id, sparse_objects=self.upstream,
            segment_size=segment_bytes, num_segments=num_segments,
            pinned_quota_bytes=pinned_quota_bytes, cache_capacity_bytes=cache_capacity_bytes,
            read_threads=read_threads)
        self.socket_path = socket_path
        self.url = "unix://" + socket_path

    def metrics(self) -> dict:
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mooncake.sparse.node", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket-path", required=True)
    p.add_argument("--node-id", default="node0")
    p.add_argument("--store", default=None,
                   help="mooncake://HOST:PORT?... for sparse objects in upstream Mooncake Store")
    p.add_argument("--segment-bytes", type=int, default=256 << 20)
    p.add_argument("--num-segments", type=int, default=4)
    p.add_argument("--pinned-quota-bytes", type=int, default=0)
    p.add_argument("--cache-capacity-bytes", type=int, default=1 << 30)
    p.add_argument("--ready-file", default=None,
                   help="written (JSON with the socket URL) once the daemon accepts connections")
    args = p.parse_args(argv)
    daemon = NodeDaemon(args.socket_path, node_id=args.node_id, store=args.store,
                        segment_bytes=args.segment_bytes, num_segments=args.num_segments,
                        pinned_quota_bytes=args.pinned_quota_bytes,
                        cache_capacity_bytes=args.cache_capacity_bytes)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            json.dump({"url": daemon.url, "node_id": args.node_id, "store": args.store}, f)
    print(f"mooncake.sparse node daemon {args.node_id} at {daemon.url}"
          + (f" on {args.store}" if args.store else ""), file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
