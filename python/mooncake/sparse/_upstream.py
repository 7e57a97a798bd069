"""The ObjectStore of this library on upstream Mooncake Store (docs/design.md §6).

Across nodes this library runs on the real Mooncake Store: its ``mooncake_master``, its clients
and TransferEngine, reached through the public Python API of the ``mooncake-transfer-engine``
wheels (``mooncake.store.MooncakeDistributedStore``). Upstream exposes no C++ SDK in those
wheels, so the adapter is written here in Python and plugged under the native sparse layer
(``_core._Store`` / ``_core._NodeServer``) as an ObjectStore: the planner, the range caches, the
single-flight table and the tensor path run unchanged on top of it.

How a structured object maps onto upstream keys (every byte moves with upstream's calls):

* ``KEY#TOKEN/MEMBER`` — one key per non-empty member, written with
  ``batch_put_from_multi_buffers`` before the head. TOKEN is random per write, so two versions
  of an object never share a member key.
* ``KEY`` — the head: magic, a small JSON table (version, token, members with dtype, shape,
  size and checksum, hard pin) and the opaque metadata. It is written last, so an object is
  visible only once all its members are (atomic visibility). ``kCreate`` relies on upstream's
  first-writer-wins put of an existing key and reads the head back to learn who won
  (exclusive create, the admission primitive); ``kUpsert`` writes with ``upsert_from`` and then
  removes the replaced version's members.
* A tensor object (one member ``tensor``, no metadata) is stored as upstream's own tensor value
  at ``KEY`` (the 304-byte ``TensorObjectHeader`` + data), so upstream's ``get_tensor`` reads
  what ``put_tensor`` here wrote and the reverse.
* Upstream has no key listing, so each directory (a key's first three ``/``-separated
  components, e.g. ``mcs/manifest/GENERATION/``) keeps a slot table ``mcs-slots/DIR#N``: a
  created head claims the next free slot with the same first-writer-wins put.
  ``list(prefix)`` (prefixes of at least three components) scans the slots and keeps the heads
  that exist.

Tensor batches (the native tensor path, python/csrc/python_object_store.cc): a batch of tensor
values is written with ONE ``batch_put_from`` / ``batch_upsert_from`` from memory the core
registered (``register_region``); a batch is read by asking the master where each replica is
(``batch_get_replica_desc``, one call): a replica in this client's own segment is viewed in
place (no transfer), the others are read with ONE ``batch_get_into`` into the core's registered
memory (one TransferEngine batch). Locality is the chosen replica's, never a preference.

Range reads go through ``get_into_ranges`` into a registered staging buffer (upstream requires
registered destinations) and are copied from there into the caller's memory. A read validates
the heads of every object it names first; a member that disappears under it (a concurrent
upsert removed that version) makes the call retry once on the new heads, so one call never
mixes two versions. Hard pin maps to ``ReplicateConfig.with_hard_pin``.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import os
import secrets
import struct
import threading
import time
import urllib.parse
from typing import Any, Sequence

import numpy as np

from ._errors import (Conflict, FailedPrecondition, InvalidArgument, NotFound, OutOfRange,
                      ResourceExhausted, Unavailable, Unimplemented)

__all__ = ["UpstreamObjectStore", "UpstreamConfig", "parse_mooncake_url", "upstream_available"]

_HEAD_MAGIC = b"MCSOBJ1\n"
_TENSOR_MAGIC = b"NOOM"  # upstream's kTensorObjectMagic (0x4d4f4f4e, little-endian)
_TENSOR_MEMBER = "tensor"
_PROBE_BYTES = 4096  # heads are read in slots of this size; larger ones take a second read
_SLOT_WINDOW = 64
_LIST_DEPTH = 3  # keys are listed in the slot table of their first three path components

# Upstream's ErrorCode values this adapter tells apart (mooncake-store types.h).
_REPLICA_NOT_READY = -703  # a put of the key is in progress (started, not yet ended)
_OBJECT_NOT_FOUND = -704
_OBJECT_ALREADY_EXISTS = -705
_INVALID_PARAMS = -600
_NO_AVAILABLE_HANDLE = -200  # allocation failed: out of segment space
# Codes that mean the peer holding a replica (or the master) cannot be reached: the transfer
# engine's (-800 .. -899) and the RPC layer's (-900 .. -999).
_TRANSFER_CODES = range(-899, -799)
_RPC_CODES = range(-999, -899)


def upstream_available() -> bool:
    """True when upstream Mooncake's Python store module can be imported here."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError:
        return False
    return True


class UpstreamConfig:
    """What ``connect("mooncake://HOST:PORT?...")`` sets up (parse_mooncake_url)."""

    def __init__(self, master: str, *, protocol: str = "tcp", metadata: str | None = None,
                 local_hostname: str = "127.0.0.1", segment_bytes: int = 512 << 20,
                 buffer_bytes: int = 64 << 20, rdma_devices: str = "",
                 node_id: str | None = None, replicas: int = 1,
                 pin_segment: bool = True) -> None:
        self.master = master
        self.protocol = protocol
        host = master.rsplit(":", 1)[0]
        self.metadata = metadata or f"http://{host}:8080/metadata"
        self.local_hostname = local_hostname
        self.segment_bytes = int(segment_bytes)
        self.buffer_bytes = int(buffer_bytes)
        self.rdma_devices = rdma_devices
        self.node_id = node_id or local_hostname
        self.replicas = int(replicas)
        # Page-lock the segment for CUDA copies where CUDA is present (it is then resident).
        self.pin_segment = bool(pin_segment)


def parse_mooncake_url(url: str, **overrides: Any) -> UpstreamConfig:
    """``mooncake://HOST:PORT?protocol=tcp&metadata=URL&local_hostname=H&segment_bytes=N&
    buffer_bytes=N&rdma_devices=D&node_id=ID&replicas=N&pin_segment=1``. HOST:PORT is the
    mooncake_master's RPC address; metadata defaults to the master's HTTP metadata server on
    port 8080; pin_segment=0 leaves the segment pageable where CUDA is present."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "mooncake" or not parsed.netloc:
        raise InvalidArgument(f"store URL {url!r} is not mooncake://HOST:PORT[?options]")
    if parsed.port is None:
        raise InvalidArgument(f"store URL {url!r} names no master port (mooncake://HOST:PORT)")
    query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
    query.update({k: v for k, v in overrides.items() if v is not None})
    known = {"protocol", "metadata", "local_hostname", "segment_bytes", "buffer_bytes",
             "rdma_devices", "node_id", "replicas", "pin_segment"}
    unknown = set(query) - known
    if unknown:
        raise InvalidArgument(f"unknown option(s) for a mooncake:// store: {sorted(unknown)}")
    ints = {"segment_bytes", "buffer_bytes", "replicas"}
    try:
        kwargs: dict[str, Any] = {k: (int(v) if k in ints else str(v))
                                  for k, v in query.items() if k != "pin_segment"}
    except ValueError as e:
        raise InvalidArgument(f"store URL {url!r}: {e}") from None
    if "pin_segment" in query:
        v = query["pin_segment"]
        flags = {"1": True, "true": True, "0": False, "false": False}
        if isinstance(v, bool):
            kwargs["pin_segment"] = v
        elif str(v).lower() in flags:
            kwargs["pin_segment"] = flags[str(v).lower()]
        else:
            raise InvalidArgument(f"store URL {url!r}: pin_segment must be 0 or 1, got {v!r}")
    return UpstreamConfig(parsed.netloc, **kwargs)


def _raise_for(code: int, what: str) -> None:
    if code in (_OBJECT_NOT_FOUND, _REPLICA_NOT_READY):
        raise NotFound(f"{what}: no such object in the Mooncake store")
    if code == _NO_AVAILABLE_HANDLE:
        raise ResourceExhausted(f"{what}: the Mooncake store has no space left (error {code})")
    if code == _INVALID_PARAMS:
        raise InvalidArgument(f"{what}: Mooncake store rejected the parameters (error {code})")
    raise Unavailable(f"{what}: Mooncake store error {code}")


class _Staging:
    """A registered host buffer that range reads land in (grown on demand, one user at a time)."""

    def __init__(self, client: Any, nbytes: int) -> None:
        self._client = client
        self._buf: np.ndarray | None = None
        self.lock = threading.Lock()
        self.reserve(nbytes)

    def reserve(self, nbytes: int) -> None:
        if self._buf is not None and self._buf.nbytes >= nbytes:
            return
        size = max(nbytes, 1 << 20)
        if self._buf is not None:
            size = max(size, 2 * self._buf.nbytes)
            self._client.unregister_buffer(self._buf.ctypes.data)
        buf = np.empty(size, dtype=np.uint8)
        rc = self._client.register_buffer(buf.ctypes.data, buf.nbytes)
        if rc != 0:
            _raise_for(rc, "registering the staging buffer")
        self._buf = buf

    @property
    def array(self) -> np.ndarray:
        assert self._buf is not None
        return self._buf

    @property
    def address(self) -> int:
        return int(self.array.ctypes.data)

    def close(self) -> None:
        if self._buf is not None:
            self._client.unregister_buffer(self._buf.ctypes.data)
            self._buf = None


class _Head:
    __slots__ = ("key", "raw_tensor", "version", "token", "hard_pinned", "members", "metadata",
                 "pending")

    def __init__(self, key: str, pending: bool = False) -> None:
        self.key = key
        self.pending = pending  # another writer's put of this key has not completed yet
        self.raw_tensor = False
        self.version = 0
        self.token = ""
        self.hard_pinned = False
        self.members: list[tuple[str, str, tuple[int, ...], int, int]] = []
        self.metadata = b""

    def member(self, name: str) -> tuple[str, str, tuple[int, ...], int, int]:
        for m in self.members:
            if m[0] == name:
                return m
        raise NotFound(f"object {self.key!r} has no member {name!r}")

    def member_key(self, name: str) -> str:
        return self.key if self.raw_tensor else f"{self.key}#{self.token}/{name}"

    def as_tuple(self) -> tuple:
        return (self.metadata, self.members, self.version, self.hard_pinned)


def _encode_head(version: int, token: str, hard_pin: bool, members: list, metadata: bytes) -> bytes:
    table = json.dumps({"v": version, "t": token, "pin": hard_pin,
                        "m": [[n, d, list(s), size, cs] for n, d, s, size, cs in members]},
                       separators=(",", ":")).encode()
    return _HEAD_MAGIC + struct.pack("<I", len(table)) + table + metadata


def _decode_head(key: str, data: bytes, object_bytes: int) -> _Head:
    h = _Head(key)
    if data.startswith(_HEAD_MAGIC):
        (n,) = struct.unpack_from("<I", data, len(_HEAD_MAGIC))
        start = len(_HEAD_MAGIC) + 4
        table = json.loads(data[start:start + n])
        h.version, h.token, h.hard_pinned = int(table["v"]), str(table["t"]), bool(table["pin"])
        h.members = [(m[0], m[1], tuple(m[2]), int(m[3]), int(m[4])) for m in table["m"]]
        h.metadata = bytes(data[start + n:])
        return h
    if data.startswith(_TENSOR_MAGIC):
        # An upstream tensor value (written by upstream's put_tensor or by this library).
        h.raw_tensor = True
        h.members = [(_TENSOR_MEMBER, "uint8", (object_bytes,), object_bytes, 0)]
        return h
    raise InvalidArgument(f"key {key!r} holds a value that is neither a mooncake.sparse object "
                          "nor an upstream tensor")


_segment_serial = itertools.count()
_log = logging.getLogger("mooncake.sparse")


class _Segment:
    """This client's share of the store: memory this adapter creates (an anonymous memfd) and
    upstream maps and mounts (``mount_segment``), so that its bounds are known here. Where CUDA
    is present it is page-locked (``cudaHostRegister``) for as long as it is mounted: a CUDA read
    of a replica in it is one pinned host-to-device copy, as from the daemon's own segments.
    Upstream's ``setup(global_segment_size=N)`` maps its segment itself and tells no one where."""

    def __init__(self, client: Any, nbytes: int, protocol: str) -> None:
        self.name = f"mooncake-sparse-segment-{os.getpid()}-{next(_segment_serial)}"
        self._fd = os.memfd_create(self.name, os.MFD_CLOEXEC)
        self._pin: Any = None
        try:
            os.ftruncate(self._fd, nbytes)
            r = client.mount_segment(f"/proc/self/fd/{self._fd}", nbytes, 0, protocol, "")
            if not isinstance(r, dict) or r.get("ret", -1) != 0:
                raise Unavailable(f"mounting a {nbytes}-byte segment failed: {r}")
            self.segment_ids = list(r.get("segment_ids", []))
        except BaseException:
            os.close(self._fd)
            raise
        try:
            self.address, self.nbytes = self._mapping(self.name)
        except (OSError, Unavailable) as e:  # mounted, but where is not known: never pinned
            _log.info("segment %s: %s", self.name, e)
            self.address, self.nbytes = 0, 0

    @staticmethod
    def _mapping(name: str) -> tuple[int, int]:
        """The address range upstream mapped the memfd `name` at (/proc/self/maps)."""
        ranges = []
        with open("/proc/self/maps") as maps:
            for line in maps:
                if f"/memfd:{name} " in line or line.rstrip().endswith(f"/memfd:{name}"):
                    lo, hi = line.split(None, 1)[0].split("-")
                    ranges.append((int(lo, 16), int(hi, 16)))
        if len(ranges) != 1:
            raise Unavailable(f"segment {name} is mapped {len(ranges)} times, expected once")
        lo, hi = ranges[0]
        return lo, hi - lo

    def pin(self) -> bool:
        """Page-locks the segment when CUDA is present; False (and it stays pageable) when not."""
        from . import _core
        if not self.nbytes:
            return False
        try:
            self._pin = _core._PinnedHostRange(self.address, self.nbytes)
        except (Unimplemented, Unavailable) as e:
            _log.info("segment %s stays pageable: %s", self.name, e)
            return False
        return True

    @property
    def pinned(self) -> bool:
        return self._pin is not None

    def unpin(self) -> None:
        if self._pin is not None:
            self._pin.close()
            self._pin = None

    def close(self) -> None:
        self.unpin()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class UpstreamObjectStore:
    """The ObjectStore contract (src/store/object_store.h) on a MooncakeDistributedStore.

    The native core calls put/stat/read_member/read_ranges/remove/list/counters (with the GIL
    held); errors are this package's typed exceptions, which the core turns back into statuses.
    """

    def __init__(self, client: Any, *, replicas: int = 1, local_segment: str | None = None,
                 staging_bytes: int = 16 << 20, owns_client: bool = False,
                 segment: _Segment | None = None) -> None:
        self._client = client
        self._segment = segment
        self._owns_client = owns_client
        self._replicas = replicas
        self._local_segment = local_segment
        self._staging = _Staging(client, staging_bytes)
        self._put_staging = _Staging(client, 1 << 20)
        self._mu = threading.Lock()
        self._slot_hint: dict[str, int] = {}
        self._counters = {k: 0 for k in ("puts", "bytes_put", "member_gets", "member_bytes",
                                         "range_reads", "range_bytes", "removes",
                                         "upstream_calls", "local_views", "remote_views",
                                         "remote_view_bytes", "batch_transfers")}
        self._hostname = client.get_hostname() if local_segment else None
        self._regions: set[int] = set()

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def connect(cls, config: UpstreamConfig) -> "UpstreamObjectStore":
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise Unavailable(
                "mooncake:// needs upstream Mooncake's Python store module: pip install "
                f"mooncake-transfer-engine-non-cuda (or a CUDA variant) ({e})") from None
        client = MooncakeDistributedStore()
        # The segment is this adapter's own memory where upstream can mount one (its bounds
        # known, so it can be page-locked for CUDA); else upstream allocates it in setup().
        own = config.segment_bytes > 0 and hasattr(client, "mount_segment")
        rc = client.setup(config.local_hostname, config.metadata,
                          0 if own else config.segment_bytes, config.buffer_bytes,
                          config.protocol, config.rdma_devices, config.master)
        if rc != 0:
            raise Unavailable(f"could not set up a Mooncake client against master {config.master} "
                              f"(metadata {config.metadata}, protocol {config.protocol}): error {rc}")
        segment = None
        if own:
            try:
                try:
                    segment = _Segment(client, config.segment_bytes, config.protocol)
                except (TypeError, OSError, Unavailable) as e:
                    # An upstream that cannot mount this memory: it allocates the segment.
                    _log.info("mounting an own segment failed (%s); upstream allocates it", e)
                    r = client.allocate_and_mount_segment(config.segment_bytes,
                                                          config.protocol, "")
                    if not isinstance(r, dict) or r.get("ret", -1) != 0:
                        raise Unavailable(f"could not mount a {config.segment_bytes}-byte "
                                          f"segment with master {config.master}: {r}") from e
            except BaseException:
                client.close()
                raise
            if segment is not None and config.pin_segment:
                segment.pin()
        local = client.get_hostname() if config.segment_bytes > 0 else None
        return cls(client, replicas=config.replicas, local_segment=local, owns_client=True,
                   segment=segment)

    def segment_region(self) -> tuple[int, int, bool] | None:
        """(address, bytes, pinned) of this client's own segment, None when upstream allocated
        it (or there is none): the native tensor path copies a local replica to CUDA directly
        when it lies in a pinned segment."""
        if self._segment is None or not self._segment.nbytes:
            return None
        return self._segment.address, self._segment.nbytes, self._segment.pinned

    @property
    def client(self) -> Any:
        """The upstream MooncakeDistributedStore under this adapter."""
        return self._client

    def close(self) -> None:
        self._staging.close()
        self._put_staging.close()
        for address in list(self._regions):
            self.unregister_region(address)
        if self._segment is not None:
            self._segment.unpin()  # before upstream unmaps it
        if self._owns_client:
            self._client.close()
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    # -- helpers --------------------------------------------------------------------------------
    def _config(self, hard_pin: bool) -> Any:
        from mooncake.store import ReplicateConfig
        c = ReplicateConfig()
        c.replica_num = self._replicas
        c.with_hard_pin = bool(hard_pin)
        if self._local_segment:
            # The writer's node keeps the replica: readers on other nodes then pull exactly the
            # ranges they need across the network, once per node.
            c.preferred_segment = self._local_segment
        return c

    def _count(self, **deltas: int) -> None:
        with self._mu:
            for k, v in deltas.items():
                self._counters[k] += v

    def _heads(self, keys: Sequence[str], *, pending: bool = False) -> dict[str, _Head | None]:
        """The heads of `keys` (None: not found), with one batched read (+1 per large value).
        A key whose put is still in progress is not visible (None), or with pending=True a
        _Head with .pending set (a writer needs to know that the key is taken)."""
        unique = list(dict.fromkeys(keys))
        out: dict[str, _Head | None] = {}
        with self._staging.lock:
            self._staging.reserve(len(unique) * _PROBE_BYTES)
            base = self._staging.address
            ptrs = [base + i * _PROBE_BYTES for i in range(len(unique))]
            rcs = self._client.batch_get_into(unique, ptrs, [_PROBE_BYTES] * len(unique))
            self._count(upstream_calls=1)
            arr = self._staging.array
            large = []
            for i, (key, rc) in enumerate(zip(unique, rcs)):
                if rc >= 0:
                    data = arr[i * _PROBE_BYTES:i * _PROBE_BYTES + rc].tobytes()
                    out[key] = _decode_head(key, data, rc)
                elif rc == _OBJECT_NOT_FOUND:
                    out[key] = None
                elif rc == _REPLICA_NOT_READY:
                    out[key] = _Head(key, pending=True) if pending else None
                elif rc == _INVALID_PARAMS:
                    large.append(key)  # larger than a probe slot
                else:
                    _raise_for(rc, f"reading the head of {key!r}")
        for key in large:
            size = self._client.get_size(key)
            if size < 0:
                if size in (_OBJECT_NOT_FOUND, _REPLICA_NOT_READY):
                    out[key] = _Head(key, pending=True) if pending and size != _OBJECT_NOT_FOUND else None
                    continue
                _raise_for(size, f"sizing {key!r}")
            with self._staging.lock:
                first = self._read_prefix(key, min(size, _PROBE_BYTES))
                if first.startswith(_HEAD_MAGIC):
                    first = self._read_prefix(key, size)  # a head with large metadata
            out[key] = _decode_head(key, first, size)
        return out

    def _read_prefix(self, key: str, n: int) -> bytes:
        self._staging.reserve(n)
        res = self._client.get_into_ranges([self._staging.address], [[key]], [[[0]]], [[[0]]],
                                           [[[n]]])
        self._count(upstream_calls=1)
        rc = res[0][0][0]
        if rc < 0:
            _raise_for(rc, f"reading {key!r}")
        return self._staging.array[:n].tobytes()

    def _head(self, key: str) -> _Head:
        h = self._heads([key])[key]
        if h is None:
            raise NotFound(f"no object {key!r}")
        return h

    def _remove_keys(self, keys: Sequence[str]) -> None:
        if keys:
            self._client.batch_remove(list(keys), True)
            self._count(upstream_calls=1)

    # -- ObjectStore ----------------------------------------------------------------------------
    supports_unlisted = True  # put(..., listed=False): the key never enters a slot table

    def put(self, key: str, metadata: bytes, members: list, mode: str, hard_pin: bool,
            listed: bool = True) -> None:
        """members: (name, dtype, shape, address, nbytes, checksum) tuples whose bytes stay
        valid for the call. listed=False: list() need not find the key (sources, seals), so
        it takes no slot in its directory's table."""
        config = self._config(hard_pin)
        total = sum(m[4] for m in members) + len(metadata)
        if (len(members) == 1 and members[0][0] == _TENSOR_MEMBER and not metadata
                and members[0][4] >= len(_TENSOR_MAGIC)
                and ctypes.string_at(members[0][3], 4) == _TENSOR_MAGIC):
            self._put_raw_tensor(key, members[0][3], members[0][4], mode, config)
            self._count(puts=1, bytes_put=total)
            return
        existing = self._heads([key], pending=True)[key]
        if mode == "create" and existing is not None:
            raise Conflict(f"object {key!r} already exists")
        if existing is not None and existing.pending:
            existing = None  # an upsert over a create in progress: the last write wins
        if existing is not None and existing.raw_tensor:
            self._remove_keys([key])  # an upsert replaces an upstream tensor value with an object
            existing = None
        token = secrets.token_hex(8)
        version = max(time.time_ns(), (existing.version + 1) if existing else 0)
        table = [(n, d, tuple(s), size, cs) for n, d, s, _, size, cs in members]
        head = _encode_head(version, token, bool(hard_pin), table, bytes(metadata))
        member_keys = [f"{key}#{token}/{m[0]}" for m in members if m[4] > 0]
        data = [m for m in members if m[4] > 0]
        if data:
            rcs = self._client.batch_put_from_multi_buffers(
                member_keys, [[m[3]] for m in data], [[m[4]] for m in data], config)
            self._count(upstream_calls=1)
            bad = [(k, rc) for k, rc in zip(member_keys, rcs) if rc != 0]
            if bad:
                self._remove_keys(member_keys)
                _raise_for(bad[0][1], f"writing member {bad[0][0]!r}")
        try:
            self._write_head(key, head, token, mode, config)
        except BaseException:
            self._remove_keys(member_keys)
            raise
        if existing is not None:
            self._remove_keys([existing.member_key(m[0]) for m in existing.members if m[3] > 0])
        elif listed:
            self._register_in_directory(key)
        self._count(puts=1, bytes_put=total)

    def _write_head(self, key: str, head: bytes, token: str, mode: str, config: Any) -> None:
        with self._put_staging.lock:
            self._put_staging.reserve(len(head))
            self._put_staging.array[:len(head)] = np.frombuffer(head, dtype=np.uint8)
            ptr = self._put_staging.address
            if mode == "create":
                rc = self._client.put_from(key, ptr, len(head), config)
            else:
                rc = self._client.upsert_from(key, ptr, len(head), config)
            self._count(upstream_calls=1)
        if rc != 0:
            if mode == "create" and rc in (_REPLICA_NOT_READY, _OBJECT_ALREADY_EXISTS):
                raise Conflict(f"object {key!r} already exists (created concurrently)")
            _raise_for(rc, f"writing the head of {key!r}")
        if mode == "create":
            # Upstream keeps the first writer's value of a key: read it back to learn who won.
            won = self._heads([key], pending=True)[key]
            if won is None or won.pending or won.raw_tensor or won.token != token:
                raise Conflict(f"object {key!r} already exists (created concurrently)")

    def _put_raw_tensor(self, key: str, address: int, nbytes: int, mode: str, config: Any) -> None:
        if mode == "create":
            if self._client.is_exist(key) == 1:
                raise Conflict(f"object {key!r} already exists")
            rc = self._client.put_from(key, address, nbytes, config)
        else:
            existing = self._heads([key])[key]
            if existing is not None and not existing.raw_tensor:
                self.remove(key)
            rc = self._client.upsert_from(key, address, nbytes, config)
        self._count(upstream_calls=2)
        if rc != 0:
            _raise_for(rc, f"writing tensor {key!r}")

    # -- tensor batches (the native core's tensor path) --------------------------------------
    tensor_batches = True

    def register_region(self, address: int, nbytes: int) -> None:
        """Registers host memory the core fills and reads batches in (kept across calls)."""
        rc = self._client.register_buffer(int(address), int(nbytes))
        self._count(upstream_calls=1)
        if rc != 0:
            _raise_for(rc, f"registering {nbytes} bytes of host memory")
        self._regions.add(int(address))

    def unregister_region(self, address: int) -> None:
        if int(address) in self._regions:
            self._regions.discard(int(address))
            self._client.unregister_buffer(int(address))
            self._count(upstream_calls=1)

    def check_absent(self, keys: Sequence[str]) -> None:
        """Conflict when any of `keys` exists (a create batch checks before it writes)."""
        exist = self._client.batch_is_exist(list(keys))
        self._count(upstream_calls=1)
        for key, e in zip(keys, exist):
            if e == 1:
                raise Conflict(f"object {key!r} already exists")
            if e < 0:
                _raise_for(e, f"checking {key!r}")

    def put_tensors(self, keys: Sequence[str], addresses: Sequence[int], sizes: Sequence[int],
                    mode: str, hard_pin: bool) -> None:
        """Writes a batch of tensor values (upstream's TensorObjectHeader + data, in registered
        memory) with one batch_put_from / batch_upsert_from: one TransferEngine batch into this
        client's own segment (preferred_segment). A create batch that fails part way removes
        what it wrote."""
        config = self._config(hard_pin)
        keys, addresses, sizes = list(keys), [int(a) for a in addresses], [int(n) for n in sizes]
        if mode == "create":
            rcs = self._client.batch_put_from(keys, addresses, sizes, config)
        else:
            rcs = self._client.batch_upsert_from(keys, addresses, sizes, config)
        self._count(upstream_calls=1, batch_transfers=1)
        bad = [(k, rc) for k, rc in zip(keys, rcs) if rc != 0]
        if bad:
            if mode == "create":
                self._remove_keys([k for k, rc in zip(keys, rcs) if rc == 0])
                if bad[0][1] in (_OBJECT_ALREADY_EXISTS, _REPLICA_NOT_READY):
                    raise Conflict(f"object {bad[0][0]!r} already exists (created concurrently)")
            self._raise_transfer(bad[0][1], f"writing tensor {bad[0][0]!r}")
        self._count(puts=len(keys), bytes_put=sum(sizes))

    def locate_tensors(self, keys: Sequence[str]) -> list[tuple[int, int]]:
        """(size, address) of the replica each key's read takes, from one query of the master:
        the address of a complete memory replica in this client's own segment (read in place),
        else 0 (another node's replica: read_tensors moves it)."""
        found = self._client.batch_get_replica_desc(list(keys))
        self._count(upstream_calls=1)
        out = []
        for key in keys:
            chosen = None
            for d in found.get(key, []):
                if not d.is_memory_replica() or d.status.name != "COMPLETE":
                    continue
                b = d.get_memory_descriptor().buffer_descriptor
                if self._hostname is not None and b.transport_endpoint == self._hostname:
                    chosen = (int(b.size), int(b.buffer_address))
                    break
                if chosen is None:
                    chosen = (int(b.size), 0)
            if chosen is None:
                raise NotFound(f"no object {key!r}")
            out.append(chosen)
        local = sum(1 for _, a in out if a)
        self._count(local_views=local)
        return out

    def read_tensors(self, keys: Sequence[str], addresses: Sequence[int],
                     sizes: Sequence[int]) -> None:
        """Reads whole values of other nodes' replicas into registered memory with one
        batch_get_into (one TransferEngine batch). NotFound: a key vanished since
        locate_tensors; FailedPrecondition: its size changed (an upsert; the core looks again);
        Unavailable: the node holding it (or the master) is unreachable."""
        keys, sizes = list(keys), [int(n) for n in sizes]
        rcs = self._client.batch_get_into(keys, [int(a) for a in addresses], sizes)
        self._count(upstream_calls=1, batch_transfers=1)
        for key, rc, n in zip(keys, rcs, sizes):
            if rc == n:
                continue
            if rc in (_OBJECT_NOT_FOUND, _REPLICA_NOT_READY):
                raise NotFound(f"object {key!r} vanished during the read")
            if rc == _INVALID_PARAMS or rc >= 0:
                raise FailedPrecondition(f"object {key!r} changed size during the read")
            self._raise_transfer(rc, f"reading {key!r}")
        self._count(remote_views=len(keys), remote_view_bytes=sum(sizes))

    @staticmethod
    def _raise_transfer(code: int, what: str) -> None:
        if code in _TRANSFER_CODES or code in _RPC_CODES:
            raise Unavailable(f"{what}: the node holding it (or the master) is unreachable "
                              f"(Mooncake error {code})")
        _raise_for(code, what)

    def stat(self, key: str) -> tuple:
        return self._head(key).as_tuple()

    def read_member(self, key: str, member: str, address: int, nbytes: int) -> None:
        self._read([(key, member, None, None, address, nbytes)])
        self._count(member_gets=1, member_bytes=nbytes)

    def read_ranges(self, items: list) -> None:
        """items: (key, member, row_start, row_end, address, nbytes). All items are checked
        before any destination is written."""
        self._read(items)
        self._count(range_reads=len(items), range_bytes=sum(int(it[5]) for it in items))

    def _read(self, items: list) -> None:
        """read_ranges / read_member; row_start None = the whole member."""
        for attempt in range(2):
            heads = self._heads([it[0] for it in items])
            plan = []
            for key, member, r0, r1, address, nbytes in items:
                h = heads[key]
                if h is None:
                    raise NotFound(f"no object {key!r}")
                name, dtype, shape, size, _ = h.member(member)
                if r0 is None:
                    start, length = 0, size
                else:
                    rows = shape[0] if shape else 0
                    if r0 > r1 or r1 > rows:
                        raise OutOfRange(f"rows [{r0}, {r1}) of member {member!r} of {key!r} "
                                         f"(it has {rows})")
                    row_bytes = size // rows if rows else 0
                    start, length = r0 * row_bytes, (r1 - r0) * row_bytes
                if length != nbytes:
                    raise InvalidArgument(f"destination of {nbytes} bytes for {length} bytes of "
                                          f"member {member!r} of {key!r}")
                plan.append((h.member_key(name), start, length, address, r0 is None))
            try:
                self._fetch(plan)
            except NotFound:
                if attempt == 0:
                    continue  # a concurrent upsert replaced a version: read the new heads
                raise
            return

    def _fetch(self, plan: list) -> None:
        """Reads (member_key, start, length, dst, whole) items: whole members directly into
        their destinations, ranges through the registered staging buffer (then copied out, only
        once every range of the call has been read)."""
        # Whole members (tensor payloads, tile indexes) go straight into the destination with
        # get_into (upstream stages unregistered memory itself); ranges take get_into_ranges.
        for mkey, _, length, dst, whole in plan:
            if whole and length > 0:
                rc = self._client.get_into(mkey, dst, length)
                self._count(upstream_calls=1)
                if rc != length:
                    if rc in (_OBJECT_NOT_FOUND, _REPLICA_NOT_READY):
                        raise NotFound(f"member {mkey!r} vanished during the read")
                    if rc < 0:
                        _raise_for(rc, f"reading {mkey!r}")
                    raise Unavailable(f"short read of {mkey!r}: {rc} of {length} bytes")
        ranges = [p[:4] for p in plan if p[2] > 0 and not p[4]]
        if not ranges:
            return
        total = sum(p[2] for p in ranges)
        with self._staging.lock:
            self._staging.reserve(total)
            by_key: dict[str, list[tuple[int, int, int]]] = {}
            offset = 0
            places = []
            for mkey, start, length, _ in ranges:
                by_key.setdefault(mkey, []).append((offset, start, length))
                places.append(offset)
                offset += length
            keys = list(by_key)
            res = self._client.get_into_ranges(
                [self._staging.address], [keys],
                [[[r[0] for r in by_key[k]] for k in keys]],
                [[[r[1] for r in by_key[k]] for k in keys]],
                [[[r[2] for r in by_key[k]] for k in keys]])
            self._count(upstream_calls=1)
            for k, rcs in zip(keys, res[0]):
                for (_, _, length), rc in zip(by_key[k], rcs):
                    if rc != length:
                        if rc == _OBJECT_NOT_FOUND:
                            raise NotFound(f"member {k!r} vanished during the read")
                        if rc < 0:
                            _raise_for(rc, f"range read of {k!r}")
                        raise Unavailable(f"short range read of {k!r}: {rc} of {length} bytes")
            src = self._staging.address
            for (_, _, length, dst), place in zip(ranges, places):
                ctypes.memmove(dst, src + place, length)

    def remove(self, key: str) -> None:
        h = self._head(key)
        keys = [h.member_key(m[0]) for m in h.members if m[3] > 0 and not h.raw_tensor]
        self._remove_keys(keys)
        rc = self._client.remove(key, True)
        self._count(upstream_calls=1, removes=1)
        if rc != 0:
            _raise_for(rc, f"removing {key!r}")

    # -- key directories ------------------------------------------------------------------------
    @staticmethod
    def _directory(key: str) -> str:
        """The slot table a key is listed in: its parent directory, cut at _LIST_DEPTH
        components (manifests live at mcs/manifest/GENERATION/...)."""
        parts = key.split("/")[:-1][:_LIST_DEPTH]
        return "/".join(parts) + "/" if parts else ""

    def _register_in_directory(self, key: str) -> None:
        d = self._directory(key)
        payload = key.encode()
        config = self._config(True)
        n = self._slot_hint.get(d, 0)
        with self._put_staging.lock:
            self._put_staging.reserve(len(payload))
            self._put_staging.array[:len(payload)] = np.frombuffer(payload, dtype=np.uint8)
            ptr = self._put_staging.address
            while True:
                # Claim slot n with a first-writer-wins put, then read it back to learn who won.
                slot = f"mcs-slots/{d}#{n}"
                rc = self._client.put_from(slot, ptr, len(payload), config)
                self._count(upstream_calls=2)
                if rc != 0:
                    _raise_for(rc, f"registering {key!r} in its directory")
                if self._client.get(slot) == payload:
                    self._slot_hint[d] = n + 1
                    return
                n += 1  # another writer holds it

    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (sorted); `prefix` must have at least _LIST_DEPTH components,
        such as a manifest's mcs/manifest/GENERATION/."""
        if prefix.count("/") < _LIST_DEPTH:
            raise Unimplemented(
                f"mooncake:// stores list keys only under a prefix of at least {_LIST_DEPTH} "
                f"'/'-separated components (e.g. 'mcs/manifest/0-1/'), not {prefix!r}")
        d = self._directory(prefix + "x")
        found: set[str] = set()
        n, misses = 0, 0
        while misses < 2:  # two empty windows in a row: past the end (claims are in order)
            window = [f"mcs-slots/{d}#{i}" for i in range(n, n + _SLOT_WINDOW)]
            exist = self._client.batch_is_exist(window)
            present = [k for k, e in zip(window, exist) if e == 1]
            if present:
                misses = 0
                for v in self._client.get_batch(present):
                    k = bytes(v).decode(errors="replace")
                    if k.startswith(prefix):
                        found.add(k)
            else:
                misses += 1
            n += _SLOT_WINDOW
        keys = sorted(found)
        if not keys:
            return []
        alive = self._client.batch_is_exist(keys)
        return [k for k, e in zip(keys, alive) if e == 1]

    def forget_directory(self, prefix: str) -> None:
        """Drops the slot table of a directory whose keys are all removed for good (a step
        freed by retention), so that a long run's tables do not pile up in the store."""
        if prefix.count("/") < _LIST_DEPTH:
            return
        d = self._directory(prefix + "x")
        n, misses = 0, 0
        while misses < 2:
            window = [f"mcs-slots/{d}#{i}" for i in range(n, n + _SLOT_WINDOW)]
            exist = self._client.batch_is_exist(window)
            present = [k for k, e in zip(window, exist) if e == 1]
            self._count(upstream_calls=1)
            if present:
                misses = 0
                self._remove_keys(present)
            else:
                misses += 1
            n += _SLOT_WINDOW
        self._slot_hint.pop(d, None)

    def counters(self) -> dict[str, int]:
        with self._mu:
            return dict(self._counters)
