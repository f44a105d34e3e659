"""The values the clients hand back: small frozen dataclasses over the protobuf messages,
and the one exception class, gpumove.Error."""
from __future__ import annotations

import dataclasses
import datetime
from typing import Optional

import grpc

from gpumove.v1 import gpumove_pb2 as pb

KINDS = {"host": pb.HOST, "pinned": pb.PINNED_HOST, "device": pb.DEVICE}
KIND_NAMES = {pb.HOST: "host", pb.PINNED_HOST: "pinned", pb.DEVICE: "device",
              pb.MEMORY_KIND_UNSPECIFIED: "host"}
PATHS = {"auto": pb.PATH_AUTO, "local": pb.LOCAL, "cuda_ipc": pb.CUDA_IPC, "ucx": pb.UCX,
         "mpi": pb.MPI}
PATH_NAMES = {v: k for k, v in PATHS.items()}
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
        return cls(e.code(), e.details() or "")


def _time(ts) -> Optional[datetime.datetime]:
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return ts.ToDatetime(tzinfo=datetime.timezone.utc)


@dataclasses.dataclass(frozen=True)
class Ref:
    """A byte range: (node, buffer id, offset, length); length 0 means to the end."""
    buffer: str
    node: str = ""
    offset: int = 0
    length: int = 0

    def to_proto(self) -> pb.BufferRef:
        return pb.BufferRef(node=self.node, buffer_id=self.buffer, offset=self.offset,
                            length=self.length)

    @classmethod
    def from_proto(cls, r: pb.BufferRef) -> "Ref":
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
    `buffer[offset:end]` for part of it."""
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

    @classmethod
    def from_proto(cls, b: pb.Buffer) -> "Buffer":
        return cls(id=b.id, node=b.node, size=b.size, kind=KIND_NAMES.get(b.kind, "host"),
                   device=b.device, label=b.label, owner=b.owner, imported=b.imported,
                   lease_expire_time=_time(b.lease_expire_time)
                   if b.HasField("lease_expire_time") else None, exportable=b.exportable)

    def ref(self, offset: int = 0, length: int = 0) -> Ref:
        return Ref(buffer=self.id, node=self.node, offset=offset, length=length)

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
    # The daemon's message, for the times (converted when asked: it keeps a small move's
    # reply cheap) and any field not copied above.
    raw: Optional[pb.Transfer] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def create_time(self) -> Optional[datetime.datetime]:
        return _time(self.raw.create_time) if self.raw is not None else None

    @property
    def start_time(self) -> Optional[datetime.datetime]:
        return _time(self.raw.start_time) if self.raw is not None else None

    @property
    def end_time(self) -> Optional[datetime.datetime]:
        return _time(self.raw.end_time) if self.raw is not None else None

    @classmethod
    def from_proto(cls, t: pb.Transfer) -> "Transfer":
        code = _STATUS_CODES.get(t.error_code, grpc.StatusCode.UNKNOWN)
        return cls(id=t.id, state=STATE_NAMES.get(t.state, "unspecified"),
                   source=Ref.from_proto(t.source), destination=Ref.from_proto(t.destination),
                   length=t.length, bytes_done=t.bytes_done,
                   path=PATH_NAMES.get(t.path, "auto"), pieces=t.pieces, error_code=code,
                   error_message=t.error_message, source_xxh3=t.source_xxh3,
                   destination_xxh3=t.destination_xxh3, label=t.label, raw=t)

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")

    @property
    def cancel_requested(self) -> bool:
        """A cancel is under way: the move stops at its next chunk (cancel(wait=True) waits)."""
        return bool(self.raw is not None and self.raw.cancel_requested)

    @property
    def ok(self) -> bool:
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
        return cls(sequence=n.sequence, transfer_id=n.transfer_id, source_node=n.source_node,
                   destination_buffer=n.destination_buffer, notify=n.notify,
                   time=_time(n.time), missed=n.missed)


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
        return cls(id=p.id, pieces=p.pieces, bytes=p.bytes, source_extent=p.source_extent,
                   destination_extent=p.destination_extent, label=p.label, owner=p.owner,
                   create_time=_time(p.create_time))


@dataclasses.dataclass(frozen=True)
class Peer:
    node: str
    address: str
    up: bool
    last_seen: Optional[datetime.datetime] = None

    @classmethod
    def from_proto(cls, p: pb.PeerInfo) -> "Peer":
        return cls(node=p.node, address=p.address, up=p.up, last_seen=_time(p.last_seen))


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
    raw: pb.NodeInfo

    @classmethod
    def from_proto(cls, i: pb.NodeInfo) -> "Info":
        paths = {PATH_NAMES.get(p.path, str(p.path)): p.available for p in i.paths}
        return cls(node=i.node, host=i.host, version=i.version, gpus=len(i.gpus), paths=paths,
                   ucx_cuda_aware=i.ucx_cuda_aware, mpi_cuda_aware=i.mpi_cuda_aware,
                   authentication=i.authentication, tls=i.tls, raw=i)


_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}
