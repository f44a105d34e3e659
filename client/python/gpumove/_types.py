"""The values the clients hand back: small frozen dataclasses over the protobuf messages,
and the one exception class, gpumove.Error."""
from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Optional

import grpc

from gpumove import _checks
from gpumove.v1 import gpumove_pb2 as pb

KINDS = {"host": pb.HOST, "pinned": pb.PINNED_HOST, "device": pb.DEVICE}
KIND_NAMES = {pb.HOST: "host", pb.PINNED_HOST: "pinned", pb.DEVICE: "device", pb.FILE: "file",
              pb.MEMORY_KIND_UNSPECIFIED: "host"}
PATHS = {"auto": pb.PATH_AUTO, "local": pb.LOCAL, "cuda_ipc": pb.CUDA_IPC, "ucx": pb.UCX,
         "mpi": pb.MPI, "file_io": pb.FILE_IO}
PATH_NAMES = {v: k for k, v in PATHS.items()}
# A move's class: ready moves start latency first, then normal, then bulk.
PRIORITIES = {"latency": pb.LATENCY, "normal": pb.NORMAL, "bulk": pb.BULK}
PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}
PRIORITY_NAMES[pb.PRIORITY_UNSPECIFIED] = "normal"
STATES = {"queued": pb.QUEUED, "running": pb.RUNNING, "succeeded": pb.SUCCEEDED,
          "failed": pb.FAILED, "cancelled": pb.CANCELLED}
STATE_NAMES = {v: k for k, v in STATES.items()}
STATE_NAMES[pb.TRANSFER_STATE_UNSPECIFIED] = "unspecified"


class Error(Exception):
    """A call the daemon (or the client) refused or could not do.

    `code` is the grpc.StatusCode (NOT_FOUND, INVALID_ARGUMENT, UNAVAILABLE, ...), `message`
    the daemon's words."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, e: grpc.RpcError) -> "Error":
        """The Error of a failed gRPC call (its code and details)."""
        return cls(e.code(), e.details() or "")


def _time(ts) -> Optional[datetime.datetime]:
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return ts.ToDatetime(tzinfo=datetime.timezone.utc)


def _short(value) -> str:
    """One field's value for a short repr: times to the second, ranges as "node/id@off+len",
    status codes by name, long strings and bytes cut at about 32 characters."""
    if isinstance(value, datetime.datetime):
        return repr(value.isoformat(timespec="seconds"))
    if isinstance(value, Ref):
        return repr(str(value))
    if isinstance(value, grpc.StatusCode):
        return value.name
    if isinstance(value, (str, bytes)) and len(value) > 32:
        return repr(value[:29]) + "..."
    return repr(value)


def _repr(obj, always: tuple, when_set: tuple = ()) -> str:
    """Name(field=value, ...): the `always` fields, then those of `when_set` that are set
    (not empty, zero, False or None); a line, not the protobuf message behind it."""
    parts = [f"{n}={_short(getattr(obj, n))}" for n in always]
    parts += [f"{n}={_short(getattr(obj, n))}" for n in when_set if getattr(obj, n)]
    return f"{type(obj).__name__}({', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class Ref:
    """A byte range: (buffer id, node, offset, length); length 0 means to the end.
    `Ref(buf, None, 4, 16)` takes a Buffer (its id and node) and None for its node."""
    buffer: str
    node: str = ""
    offset: int = 0
    length: int = 0

    def __post_init__(self):
        buffer, node = self.buffer, self.node
        if isinstance(buffer, Buffer):
            if node and node != buffer.node:
                raise ValueError(f"Ref's node {node!r} is not the node of buffer {buffer.id} "
                                 f"({buffer.node!r})")
            buffer, node = buffer.id, buffer.node
        if not isinstance(buffer, str):
            raise TypeError(f"Ref's buffer must be a gpumove.Buffer or a buffer id, "
                            f"not {buffer!r}")
        if node is None:
            node = ""
        if not isinstance(node, str):
            raise TypeError(f"Ref's node must be a node name or None, not {node!r}")
        # Frozen: set through object (the checked values, ints even from numpy).
        object.__setattr__(self, "buffer", buffer)
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "offset", _checks.count(self.offset, "Ref's offset"))
        object.__setattr__(self, "length", _checks.count(self.length, "Ref's length"))

    def to_proto(self) -> pb.BufferRef:
        """The BufferRef message of this range."""
        return pb.BufferRef(node=self.node, buffer_id=self.buffer, offset=self.offset,
                            length=self.length)

    @classmethod
    def from_proto(cls, r: pb.BufferRef) -> "Ref":
        """The Ref of a BufferRef message."""
        return cls(buffer=r.buffer_id, node=r.node, offset=r.offset, length=r.length)

    def __str__(self) -> str:
        s = f"{self.node}/{self.buffer}" if self.node else self.buffer
        if self.offset or self.length:
            s += f"@{self.offset}"
            if self.length:
                s += f"+{self.length}"
        return s


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A buffer of a daemon. Usable wherever a range is named (the whole buffer), and with
    `buffer[offset:end]` for part of it. A `with` block (`async with` for gpumove.aio's)
    releases it at its end, by the client that handed it out:

        with c.allocate("64MiB") as buf:
            c.write(buf, data)
    """
    id: str
    node: str
    size: int
    kind: str
    device: int
    label: str = ""
    owner: str = ""
    imported: bool = False
    lease_expire_time: Optional[datetime.datetime] = None
    exportable: bool = False
    # The client that handed it out (it releases the buffer at the end of a with block);
    # neither compared, shown nor pickled.
    _client: Any = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_proto(cls, b: pb.Buffer, client: Any = None) -> "Buffer":
        """The Buffer of a Buffer message; `client` releases it at the end of a with block."""
        return cls(id=b.id, node=b.node, size=b.size, kind=KIND_NAMES.get(b.kind, "host"),
                   device=b.device, label=b.label, owner=b.owner, imported=b.imported,
                   lease_expire_time=_time(b.lease_expire_time)
                   if b.HasField("lease_expire_time") else None, exportable=b.exportable,
                   _client=client)

    def ref(self, offset: int = 0, length: int = 0) -> Ref:
        """The range of `length` bytes (0: to the end) from `offset` of this buffer."""
        return Ref(buffer=self.id, node=self.node, offset=offset, length=length)

    def __repr__(self) -> str:
        return _repr(self, ("id", "node", "size", "kind"),
                     (("device",) if self.kind == "device" else ()) +
                     ("label", "imported", "exportable", "lease_expire_time"))

    def _releaser(self, asynchronous: bool):
        """The client that releases this buffer at the end of a `with` (or `async with`)."""
        c = self._client
        if c is None:
            raise TypeError(f"buffer {self.id} did not come from a client, so a with block "
                            "cannot release it: call release(buffer) on a client")
        if getattr(c, "_asynchronous", False) != asynchronous:
            way = ("gpumove.Client: use with" if asynchronous
                   else "gpumove.aio.Client: use async with")
            raise TypeError(f"buffer {self.id} came from {way} to release it at a block's end")
        return c

    def __enter__(self) -> "Buffer":
        self._releaser(False)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._releaser(False).release(self)
        except Error as e:
            if e.code != grpc.StatusCode.NOT_FOUND:  # Gone already: released or expired.
                raise

    async def __aenter__(self) -> "Buffer":
        self._releaser(True)
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self._releaser(True).release(self)
        except Error as e:
            if e.code != grpc.StatusCode.NOT_FOUND:  # Gone already: released or expired.
                raise

    def __getstate__(self) -> dict:
        # Pickled (or copied) without its client: a channel does not travel.
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __getitem__(self, s: slice) -> Ref:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("a buffer is sliced with [start:stop]")
        start, stop, _ = s.indices(self.size)
        if stop <= start:
            raise ValueError(f"empty range [{start}:{stop}] of a {self.size}-byte buffer")
        return self.ref(start, stop - start)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """A move as the daemon reported it."""
    id: str
    state: str
    source: Ref
    destination: Ref
    length: int
    bytes_done: int
    path: str
    pieces: int = 0
    error_code: grpc.StatusCode = grpc.StatusCode.OK
    error_message: str = ""
    source_xxh3: int = 0
    destination_xxh3: int = 0
    label: str = ""
    # What carried the bytes once the move ran (UCX: "rc_verbs/rxe0:1", "tcp/eth0", ...;
    # "direct copy"; "" when the path names none).
    transport: str = ""
    # Its class: "latency", "normal" or "bulk".
    priority: str = "normal"
    # The daemon's message, for the times (converted when asked: it keeps a small move's
    # reply cheap) and any field not copied above.
    raw: Optional[pb.Transfer] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def create_time(self) -> Optional[datetime.datetime]:
        """When the move submitted (UTC; None if not yet)."""
        return _time(self.raw.create_time) if self.raw is not None else None

    @property
    def start_time(self) -> Optional[datetime.datetime]:
        """When the move started (UTC; None if not yet)."""
        return _time(self.raw.start_time) if self.raw is not None else None

    @property
    def end_time(self) -> Optional[datetime.datetime]:
        """When the move ended (UTC; None if not yet)."""
        return _time(self.raw.end_time) if self.raw is not None else None

    @classmethod
    def from_proto(cls, t: pb.Transfer) -> "Transfer":
        """The Transfer of a Transfer message."""
        code = _STATUS_CODES.get(t.error_code, grpc.StatusCode.UNKNOWN)
        return cls(id=t.id, state=STATE_NAMES.get(t.state, "unspecified"),
                   source=Ref.from_proto(t.source), destination=Ref.from_proto(t.destination),
                   length=t.length, bytes_done=t.bytes_done,
                   path=PATH_NAMES.get(t.path, "auto"), pieces=t.pieces, error_code=code,
                   error_message=t.error_message, source_xxh3=t.source_xxh3,
                   destination_xxh3=t.destination_xxh3, label=t.label,
                   transport=t.transport, priority=PRIORITY_NAMES.get(t.priority, "normal"),
                   raw=t)

    def __repr__(self) -> str:
        # bytes_done only while it differs from length, path once chosen, the error's code
        # (its message is in error_message): a line of about 150 characters.
        text = _repr(self, ("id", "state", "source", "destination", "length"),
                     ("pieces", "label"))[:-1]
        if self.bytes_done != self.length:
            text += f", bytes_done={self.bytes_done}"
        if self.path != "auto":
            text += f", path={self.path!r}"
        if self.transport:
            text += f", transport={self.transport!r}"
        if self.priority != "normal":
            text += f", priority={self.priority!r}"
        if self.error_code != grpc.StatusCode.OK:
            text += f", error_code={self.error_code.name}"
        return text + ")"

    @property
    def done(self) -> bool:
        """It has ended: succeeded, failed or cancelled."""
        return self.state in ("succeeded", "failed", "cancelled")

    @property
    def cancel_requested(self) -> bool:
        """A cancel is under way: the move stops at its next chunk (cancel(wait=True) waits)."""
        return bool(self.raw is not None and self.raw.cancel_requested)

    @property
    def ok(self) -> bool:
        """It succeeded."""
        return self.state == "succeeded"

    @property
    def seconds(self) -> Optional[float]:
        """How long the daemon took to run it (start to end), when it has ended."""
        start, end = self.start_time, self.end_time
        if start is None or end is None:
            return None
        return (end - start).total_seconds()

    def raise_for_state(self) -> "Transfer":
        """Returns self when SUCCEEDED; raises Error with the move's code otherwise."""
        if self.state == "failed":
            raise Error(self.error_code, f"transfer {self.id}: {self.error_message}")
        if self.state == "cancelled":
            raise Error(grpc.StatusCode.CANCELLED, f"transfer {self.id} was cancelled")
        if not self.ok:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        f"transfer {self.id} is {self.state}")
        return self


@dataclasses.dataclass(frozen=True)
class Notification:
    """Published where a move's destination lives once its bytes are there (the move's
    `notify` bytes). `missed`: notifications that fell out of the daemon's log before this
    one; a notification with no transfer_id only reports such a loss."""
    sequence: int
    transfer_id: str
    source_node: str
    destination_buffer: str
    notify: bytes
    time: Optional[datetime.datetime]
    missed: int = 0

    @classmethod
    def from_proto(cls, n: pb.Notification) -> "Notification":
        """The Notification of a Notification message."""
        return cls(sequence=n.sequence, transfer_id=n.transfer_id, source_node=n.source_node,
                   destination_buffer=n.destination_buffer, notify=n.notify,
                   time=_time(n.time), missed=n.missed)

    def __repr__(self) -> str:
        return _repr(self, ("sequence", "transfer_id", "destination_buffer", "notify"),
                     ("missed",))


@dataclasses.dataclass(frozen=True)
class PreparedPieces:
    """A piece list kept by a node (Client.prepare): moves name it (`prepared=`) instead of
    sending it. Their source and destination ranges need at least `source_extent` and
    `destination_extent` bytes."""
    id: str
    pieces: int
    bytes: int
    source_extent: int
    destination_extent: int
    label: str = ""
    owner: str = ""
    create_time: Optional[datetime.datetime] = None

    @property
    def node(self) -> str:
        """The node that keeps it (and runs the moves that name it)."""
        return self.id.partition(".")[2]

    @classmethod
    def from_proto(cls, p: pb.PreparedPieces) -> "PreparedPieces":
        """The PreparedPieces of a PreparedPieces message."""
        return cls(id=p.id, pieces=p.pieces, bytes=p.bytes, source_extent=p.source_extent,
                   destination_extent=p.destination_extent, label=p.label, owner=p.owner,
                   create_time=_time(p.create_time))

    def __repr__(self) -> str:
        return _repr(self, ("id", "pieces", "bytes"), ("label",))


@dataclasses.dataclass(frozen=True)
class Peer:
    """A node of the cluster as this daemon sees it (ListPeers)."""
    node: str
    address: str
    up: bool
    last_seen: Optional[datetime.datetime] = None

    @classmethod
    def from_proto(cls, p: pb.PeerInfo) -> "Peer":
        """The Peer of a PeerInfo message."""
        return cls(node=p.node, address=p.address, up=p.up, last_seen=_time(p.last_seen))

    def __repr__(self) -> str:
        return _repr(self, ("node", "address", "up"), ("last_seen",))


@dataclasses.dataclass(frozen=True)
class Info:
    """A node's answer to GetInfo; `raw` is the whole NodeInfo message."""
    node: str
    host: str
    version: str
    gpus: int
    paths: dict
    ucx_cuda_aware: bool
    mpi_cuda_aware: bool
    authentication: str
    tls: bool
    # The whole message (dozens of lines printed): kept out of repr and comparisons.
    raw: pb.NodeInfo = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, i: pb.NodeInfo) -> "Info":
        """The Info of a NodeInfo message."""
        paths = {PATH_NAMES.get(p.path, str(p.path)): p.available for p in i.paths}
        return cls(node=i.node, host=i.host, version=i.version, gpus=len(i.gpus), paths=paths,
                   ucx_cuda_aware=i.ucx_cuda_aware, mpi_cuda_aware=i.mpi_cuda_aware,
                   authentication=i.authentication, tls=i.tls, raw=i)

    def __repr__(self) -> str:
        available = [name for name, up in self.paths.items() if up]
        return (f"Info(node={_short(self.node)}, version={_short(self.version)}, "
                f"gpus={self.gpus}, paths={available!r}, "
                f"authentication={_short(self.authentication)}, tls={self.tls})")


_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}
