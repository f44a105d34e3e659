"""gpumove.Client: the synchronous client of one gpumoved (any node of a cluster answers
for every node: name others with `node=` or in refs)."""
from __future__ import annotations

import datetime
import logging
from typing import Iterable, Iterator, List, Optional, Sequence, Union

import grpc
from google.protobuf import duration_pb2

from gpumove._specs import RangeLike, to_ref, transfer_spec
from gpumove._types import (KINDS, STATES, Buffer, Error, Info, Notification, Peer, Ref,
                            Transfer)
from gpumove.v1 import gpumove_pb2 as pb
from gpumove.v1 import gpumove_pb2_grpc as rpc

log = logging.getLogger("gpumove")

# Bytes per Write message and the largest Read chunk the daemon sends (ReadRequest).
WRITE_CHUNK = 1 << 20
READ_CHUNK = 4 << 20
# The largest message either side takes (the daemon's --max_message_size is 64 MiB).
MAX_MESSAGE = 64 << 20

TransferLike = Union[Transfer, str]


def _duration(seconds: Optional[float]) -> Optional[duration_pb2.Duration]:
    if seconds is None:
        return None
    d = duration_pb2.Duration()
    d.FromTimedelta(datetime.timedelta(seconds=seconds))
    return d


def _id(t: TransferLike) -> str:
    return t.id if isinstance(t, Transfer) else t


def _buffer_id(b: Union[Buffer, Ref, str]) -> tuple:
    if isinstance(b, Buffer):
        return b.id, b.node
    if isinstance(b, Ref):
        return b.buffer, b.node
    r = to_ref(b)
    return r.buffer, r.node


def channel_options() -> list:
    return [("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE)]


def credentials(tls, token: Optional[str]):
    """Channel credentials for `tls` (True: the system's CAs; a dict with ca, cert, key
    files) and a bearer `token`; None for a plaintext channel without a token."""
    creds = None
    if tls:
        opts = tls if isinstance(tls, dict) else {}

        def read(key):
            path = opts.get(key)
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()
        creds = grpc.ssl_channel_credentials(root_certificates=read("ca"),
                                             private_key=read("key"),
                                             certificate_chain=read("cert"))
    return creds


class NotificationStream:
    """An open TransferService.Notifications stream: iterate for Notifications; cancel()
    (from any thread) or leaving a `with` block ends it."""

    def __init__(self, call):
        self._call = call

    def __iter__(self) -> Iterator[Notification]:
        try:
            for n in self._call:
                yield Notification.from_proto(n)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and self._call.cancelled():
                return
            raise Error.from_rpc(e) from None

    def next(self, timeout: Optional[float] = None) -> Notification:
        """The next notification (blocking; the stream's own deadline bounds it)."""
        return next(iter(self))

    def cancel(self) -> None:
        self._call.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()


class Client:
    """A client of one gpumoved.

        with gpumove.Client("127.0.0.1:7470") as c:
            a = c.allocate(64 << 20)
            c.write(a, data)
            b = c.allocate(64 << 20, node="node-b")
            c.move(a, b, checksum=True)
            assert c.read(b) == data

    `addr` is host:port or unix:/path; `token` a bearer token (GPUMOVE_TOKEN is not read
    here); `tls` True or {"ca": ..., "cert": ..., "key": ...}; `timeout` bounds every call
    that does not wait for a move (seconds; None: no bound)."""

    def __init__(self, addr: str = "127.0.0.1:7470", *, token: Optional[str] = None, tls=None,
                 timeout: Optional[float] = 60.0, server_name: Optional[str] = None):
        opts = channel_options()
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        creds = credentials(tls, token)
        self._channel = (grpc.secure_channel(addr, creds, opts) if creds is not None
                         else grpc.insecure_channel(addr, opts))
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self._buffers = rpc.BufferServiceStub(self._channel)
        self._transfers = rpc.TransferServiceStub(self._channel)
        self._node = rpc.NodeServiceStub(self._channel)
        self.addr = addr

    # Plumbing.
    def _call(self, method, request, timeout: Optional[float] = -1.0):
        try:
            return method(request, timeout=self._timeout if timeout == -1.0 else timeout,
                          metadata=self._metadata)
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Node.
    def info(self) -> Info:
        return Info.from_proto(self._call(self._node.GetInfo, pb.GetInfoRequest()))

    def peers(self) -> List[Peer]:
        r = self._call(self._node.ListPeers, pb.ListPeersRequest())
        return [Peer.from_proto(p) for p in r.peers]

    # Buffers.
    def allocate(self, size: int, kind: str = "host", device: int = 0, node: Optional[str] = None,
                 lease: Optional[float] = None, label: str = "") -> Buffer:
        """A buffer of `size` bytes in `kind` memory ("host", "pinned", "device" on GPU
        `device`) on `node` (None: this daemon's), freed after `lease` seconds unless
        renewed (None: the daemon's default)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, not {kind!r}")
        req = pb.AllocateRequest(size=size, kind=KINDS[kind], device=device, label=label,
                                 node=node or "")
        if lease is not None:
            req.lease_ttl.CopyFrom(_duration(lease))
        return Buffer.from_proto(self._call(self._buffers.Allocate, req))

    def release(self, buffer: Union[Buffer, Ref, str], node: Optional[str] = None) -> None:
        bid, bnode = _buffer_id(buffer)
        self._call(self._buffers.Release, pb.ReleaseRequest(buffer_id=bid, node=node or bnode))

    def buffer(self, buffer: Union[Buffer, Ref, str], node: Optional[str] = None) -> Buffer:
        bid, bnode = _buffer_id(buffer)
        return Buffer.from_proto(self._call(
            self._buffers.Get, pb.GetBufferRequest(buffer_id=bid, node=node or bnode)))

    def buffers(self, node: Optional[str] = None) -> List[Buffer]:
        r = self._call(self._buffers.List, pb.ListBuffersRequest(node=node or ""))
        return [Buffer.from_proto(b) for b in r.buffers]

    def renew(self, buffer: Union[Buffer, Ref, str], lease: Optional[float] = None) -> Buffer:
        bid, bnode = _buffer_id(buffer)
        req = pb.RenewLeaseRequest(buffer_id=bid, node=bnode)
        if lease is not None:
            req.lease_ttl.CopyFrom(_duration(lease))
        return Buffer.from_proto(self._call(self._buffers.RenewLease, req))

    def write(self, buffer: RangeLike, data, offset: int = 0) -> int:
        """Writes `data` (bytes, memoryview, a numpy array, anything with the buffer
        protocol) at `offset` of the range, streamed in 1 MiB messages (no copy of the
        whole). Returns the bytes written."""
        view = memoryview(data)
        if not view.contiguous:
            raise ValueError("write takes contiguous data")
        view = view.cast("B")
        ref = to_ref(buffer)
        target = pb.BufferRef(node=ref.node, buffer_id=ref.buffer, offset=ref.offset + offset,
                              length=len(view))

        def messages():
            if len(view) == 0:
                yield pb.WriteRequest(target=target)
                return
            for at in range(0, len(view), WRITE_CHUNK):
                chunk = bytes(view[at:at + WRITE_CHUNK])
                yield (pb.WriteRequest(target=target, data=chunk) if at == 0
                       else pb.WriteRequest(data=chunk))
        r = self._call(self._buffers.Write, messages())
        return r.bytes_written

    def read(self, buffer: RangeLike, offset: int = 0, length: Optional[int] = None,
             out=None):
        """The bytes of a range (from `offset` of it, `length` of them; None: to its end).
        With `out` (a writable buffer: bytearray, numpy array, ...) they are written into it
        and `out` is returned."""
        ref = to_ref(buffer)
        if length is None and out is not None:
            length = memoryview(out).nbytes
        req = pb.ReadRequest(source=pb.BufferRef(
            node=ref.node, buffer_id=ref.buffer, offset=ref.offset + offset,
            length=length if length is not None else ref.length), chunk_size=READ_CHUNK)
        start = ref.offset + offset
        try:
            stream = self._buffers.Read(req, timeout=self._timeout, metadata=self._metadata)
            if out is None:
                parts = [m.data for m in stream]
                return b"".join(parts)
            view = memoryview(out).cast("B")
            if view.readonly:
                raise ValueError("read's out must be writable")
            got = 0
            for m in stream:
                at = m.offset - start
                if at + len(m.data) > len(view):
                    raise ValueError(f"out holds {len(view)} bytes; the range has more")
                view[at:at + len(m.data)] = m.data
                got = max(got, at + len(m.data))
            return out
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    # Transfers.
    def submit(self, specs: Sequence[pb.TransferSpec], wait: bool = False,
               idempotency_key: str = "", timeout: Optional[float] = None) -> List[Transfer]:
        """Submits moves (TransferSpecs, e.g. from gpumove.spec) all at once, accepted or
        refused whole. With `wait`, returns them ended (bounded by `timeout` seconds)."""
        req = pb.SubmitRequest(transfers=list(specs), idempotency_key=idempotency_key,
                               wait=wait)
        if wait and timeout is not None:
            req.wait_timeout.CopyFrom(_duration(timeout))
        r = self._call(self._transfers.Submit, req,
                       timeout=None if wait else -1.0)
        return [Transfer.from_proto(t) for t in r.transfers]

    def move(self, source: RangeLike, destination: RangeLike, length: Optional[int] = None, *,
             checksum: bool = False, path: str = "auto", blocks=None,
             block_size: Optional[int] = None, segments=None, notify=None, wait: bool = True,
             timeout: Optional[float] = None, label: str = "", check: bool = True) -> Transfer:
        """Moves source's bytes to destination (ranges: Buffers, Refs, "[node/]id").
        Vectored: `blocks=(src_idx, dst_idx)` with `block_size` (numpy arrays welcome), or
        `segments=[(src_off, dst_off, len), ...]`. `notify`: bytes published where the
        destination lives once the bytes are there. Waits for the end unless `wait=False`;
        with `check`, a move that did not succeed raises Error with its code."""
        spec = transfer_spec(source, destination, length=length, checksum=checksum, path=path,
                             blocks=blocks, block_size=block_size, segments=segments,
                             notify=notify, label=label)
        t = self.submit([spec], wait=wait, timeout=timeout)[0]
        if wait and check:
            t.raise_for_state()
        return t

    def transfer(self, transfer: TransferLike) -> Transfer:
        return Transfer.from_proto(self._call(self._transfers.Get,
                                              pb.GetTransferRequest(id=_id(transfer))))

    def transfers(self, states: Iterable[str] = (), limit: int = 0) -> List[Transfer]:
        req = pb.ListTransfersRequest(states=[STATES[s] for s in states], limit=limit)
        return [Transfer.from_proto(t) for t in self._call(self._transfers.List, req).transfers]

    def wait(self, transfer: TransferLike, timeout: Optional[float] = None) -> Transfer:
        """The transfer once it has ended (DEADLINE_EXCEEDED after `timeout` seconds)."""
        req = pb.WaitRequest(id=_id(transfer))
        if timeout is not None:
            req.timeout.CopyFrom(_duration(timeout))
        return Transfer.from_proto(self._call(self._transfers.Wait, req, timeout=None))

    def watch(self, transfer: TransferLike, interval: float = 0.1) -> Iterator[Transfer]:
        """The transfer now, then at every change and progress step until it ends."""
        req = pb.WatchRequest(id=_id(transfer), progress_interval=_duration(interval))
        try:
            for e in self._transfers.Watch(req, metadata=self._metadata):
                yield Transfer.from_proto(e.transfer)
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    def cancel(self, transfer: TransferLike) -> Transfer:
        return Transfer.from_proto(self._call(self._transfers.Cancel,
                                              pb.CancelRequest(id=_id(transfer))))

    def notifications(self, buffers: Iterable[Union[Buffer, Ref, str]] = (),
                      node: Optional[str] = None, after: Optional[int] = None,
                      timeout: Optional[float] = None) -> NotificationStream:
        """Subscribes to notifications of moves into `buffers` (none named: all the caller
        may see) on `node` (None: this daemon's; a Buffer names its node). Returns once the
        daemon has the subscription, so a move submitted after that is seen. `after`:
        resume after that sequence number (0: from the oldest kept); None: new ones only."""
        ids, nodes = [], set()
        for b in buffers:
            bid, bnode = _buffer_id(b)
            ids.append(bid)
            if bnode:
                nodes.add(bnode)
        if node is None and len(nodes) == 1:
            node = nodes.pop()
        req = pb.NotificationsRequest(node=node or "", buffers=ids)
        if after is not None:
            req.after_sequence = after
        call = self._transfers.Notifications(req, timeout=timeout, metadata=self._metadata)
        try:
            call.initial_metadata()  # The daemon sends its headers once subscribed.
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None
        if call.done() and call.code() != grpc.StatusCode.OK:
            raise Error(call.code(), call.details() or "")
        return NotificationStream(call)

    # CUDA: lending tensors and mapping buffers (same host as the daemon).
    def register(self, tensor, label: str = "", lease: Optional[float] = None) -> Buffer:
        """Lends a CUDA tensor (anything with __cuda_array_interface__, e.g. torch or cupy)
        to this daemon through CUDA IPC: a buffer over the tensor's bytes, released when
        this process exits. The tensor must stay alive while the buffer is used."""
        from gpumove import _cuda
        req = _cuda.import_request(tensor, label=label)
        req.owner_pid = __import__("os").getpid()
        if lease is not None:
            req.lease_ttl.CopyFrom(_duration(lease))
        return Buffer.from_proto(self._call(self._buffers.Import, req))

    def open(self, buffer: Union[Buffer, Ref, str]):
        """Maps a daemon DEVICE buffer into this process (CUDA IPC): a gpumove.DeviceMemory
        with __cuda_array_interface__ (torch.as_tensor / cupy.asarray take it)."""
        from gpumove import _cuda
        bid, bnode = _buffer_id(buffer)
        r = self._call(self._buffers.Export, pb.ExportRequest(buffer_id=bid, node=bnode))
        return _cuda.DeviceMemory.open(r)


def spec(source: RangeLike, destination: RangeLike, **kwargs) -> pb.TransferSpec:
    """A TransferSpec for Client.submit; the keywords of Client.move."""
    return transfer_spec(source, destination, **kwargs)
