"""gpumove.Client: the synchronous client of one gpumoved (any node of a cluster answers
for every node: name others with `node=` or in refs)."""
from __future__ import annotations

import os
import time
from typing import Iterable, Iterator, List, Optional, Sequence, Union

import grpc

from gpumove import _checks
from gpumove import _requests as req
from gpumove._progress import Progress
from gpumove._requests import BufferLike, TransferLike, buffer_id
from gpumove._specs import (PreparedLike, RangeLike, kv_specs, prepare_request, prepared_id,
                            transfer_spec)
from gpumove._types import Buffer, Error, Info, Notification, Peer, PreparedPieces, Transfer
from gpumove.v1 import gpumove_pb2 as pb
from gpumove.v1 import gpumove_pb2_grpc as rpc

# The largest message either side takes (the daemon's --max_message_size is 64 MiB).
MAX_MESSAGE = 64 << 20


def channel_options() -> list:
    """The channel options both clients use (message size bounds)."""
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
    """An open TransferService.Notifications stream: iterate for Notifications; close()
    (or cancel(), from any thread) or leaving a `with` block ends it (iteration then
    stops)."""

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

    def close(self) -> None:
        """Ends the stream (the daemon drops the subscription); closing twice is fine."""
        self._call.cancel()

    def cancel(self) -> None:
        """close() by its older name."""
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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

    _asynchronous = False  # Buffers it hands out are released by `with`, not `async with`.

    def __init__(self, addr: str = "127.0.0.1:7470", *, token: Optional[str] = None, tls=None,
                 timeout: Optional[float] = 60.0, server_name: Optional[str] = None):
        timeout = _checks.seconds(timeout, "timeout", positive=True)
        self._closed = False
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
    def _open(self) -> None:
        """Raises the closed-client error in our words (not grpc's) after close()."""
        if self._closed:
            raise _checks.closed(self.addr)

    def _call(self, method, request, timeout: Optional[float] = -1.0):
        self._open()
        timeout = self._timeout if timeout == -1.0 else timeout
        waits = _checks.StartingWaits(timeout)
        while True:
            try:
                return method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                pause = waits.next(e)
                if pause is None:
                    raise Error.from_rpc(e) from None
                time.sleep(pause)

    def close(self) -> None:
        """Closes the channel; calls after this raise ValueError. Closing twice is fine."""
        self._closed = True
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Node.
    def info(self) -> Info:
        """This daemon's node, version, GPUs, paths and security settings."""
        return Info.from_proto(self._call(self._node.GetInfo, pb.GetInfoRequest()))

    def peers(self) -> List[Peer]:
        """The other nodes of the cluster as this daemon sees them (up or not)."""
        r = self._call(self._node.ListPeers, pb.ListPeersRequest())
        return [Peer.from_proto(p) for p in r.peers]

    # Buffers.
    def allocate(self, size: Union[int, str], kind: str = "host", device: int = 0,
                 node: Optional[str] = None, lease: Optional[float] = None, label: str = "",
                 exportable: bool = False) -> Buffer:
        """A buffer of `size` bytes (or a string such as "64MiB") in `kind` memory ("host",
        "pinned", "device" on GPU `device`) on `node` (None: this daemon's), freed after
        `lease` seconds unless renewed (None: the daemon's default). `exportable` (device
        only): a GPU allocation of its own, so that `open` can map it into this process.
        `with c.allocate(...) as buf:` releases it at the block's end."""
        return Buffer.from_proto(self._call(
            self._buffers.Allocate,
            req.allocate(size, kind, device, node, lease, label, exportable)), self)

    def register_file(self, path: str, length: Union[int, str], *,
                      offset: Union[int, str] = 0, root: str = "", writable: bool = False,
                      create: bool = False, node: Optional[str] = None,
                      lease: Optional[float] = None, label: str = "") -> Buffer:
        """A region of a file under one of the node's --file_roots as a buffer of kind
        "file" (`root`: which, "" for the only one; `path` relative to it; `length` bytes
        from `offset`). `writable` to move into it, `create` to make it (mode 0600)
        when missing. Moves between it and host memory on its node run on path FILE_IO;
        SUCCEEDED means the bytes are in the file, on stable storage with move(durable=True)."""
        return Buffer.from_proto(self._call(
            self._buffers.RegisterFile,
            req.register_file(path, length, offset, root, writable, create, node, lease,
                              label)), self)

    def release(self, buffer: BufferLike, node: Optional[str] = None) -> None:
        """Frees a buffer (NOT_FOUND if it is gone; FAILED_PRECONDITION while a move uses
        it)."""
        bid, bnode = buffer_id(buffer)
        self._call(self._buffers.Release, pb.ReleaseRequest(buffer_id=bid, node=node or bnode))

    def buffer(self, buffer: BufferLike, node: Optional[str] = None) -> Buffer:
        """A buffer as its daemon has it now (NOT_FOUND if it is gone)."""
        bid, bnode = buffer_id(buffer)
        return Buffer.from_proto(self._call(
            self._buffers.Get, pb.GetBufferRequest(buffer_id=bid, node=node or bnode)), self)

    def _pages(self, method, request, field: str, want: int = 0) -> list:
        """The entries of a paged listing (`field` of each answer), page after page, up to
        `want` of them (0: all)."""
        out: list = []
        for _ in range(req.MAX_LIST_PAGES):
            if want:
                request.page_size = min(want - len(out), req.MAX_PAGE)
            r = self._call(method, request)
            out += getattr(r, field)
            if not r.next_page_token or (want and len(out) >= want):
                break
            request.page_token = r.next_page_token
        return out

    def buffers(self, node: Optional[str] = None) -> List[Buffer]:
        """Every buffer the caller sees, fetched page by page."""
        return [Buffer.from_proto(b, self) for b in self._pages(
            self._buffers.List, pb.ListBuffersRequest(node=node or ""), "buffers")]

    def renew(self, buffer: BufferLike, lease: Optional[float] = None) -> Buffer:
        """Renews a buffer's lease: `lease` seconds from now (None: its current length)."""
        return Buffer.from_proto(self._call(self._buffers.RenewLease, req.renew(buffer, lease)),
                                 self)

    def write(self, buffer: RangeLike, data, offset: int = 0) -> int:
        """Writes `data` (bytes, memoryview, a numpy array, anything with the buffer
        protocol) at `offset` of the range, streamed in 1 MiB messages (no copy of the
        whole). Returns the bytes written."""
        r = self._call(self._buffers.Write, req.write_messages(buffer, data, offset))
        return r.bytes_written

    def read(self, buffer: RangeLike, offset: int = 0, length: Optional[int] = None,
             out=None):
        """The bytes of a range (from `offset` of it, `length` of them; None: to its end).
        With `out` (a writable buffer: bytearray, numpy array, ...) they are written into it
        and `out` is returned."""
        request, start, view = req.read(buffer, offset, length, out)
        self._open()
        try:
            stream = self._buffers.Read(request, timeout=self._timeout, metadata=self._metadata)
            if view is None:
                return b"".join([m.data for m in stream])
            for m in stream:
                req.place(view, start, m)
            return out
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    # Transfers.
    def submit(self, specs: Sequence[pb.TransferSpec], wait: bool = False,
               idempotency_key: str = "", timeout: Optional[float] = None) -> List[Transfer]:
        """Submits moves (TransferSpecs, e.g. from gpumove.spec) all at once, accepted or
        refused whole. With `wait`, returns them ended (bounded by `timeout` seconds)."""
        r = self._call(self._transfers.Submit, req.submit(specs, wait, idempotency_key, timeout),
                       timeout=None if wait else -1.0)
        return [Transfer.from_proto(t) for t in r.transfers]

    def move(self, source: RangeLike, destination: RangeLike, length: Optional[int] = None, *,
             checksum: bool = False, path: str = "auto", blocks=None,
             block_size: Optional[int] = None, segments=None,
             prepared: Optional[PreparedLike] = None, notify=None, wait: bool = True,
             timeout: Optional[float] = None, label: str = "", check: bool = True,
             progress: bool = False, priority: str = "normal", require: str = "",
             durable: bool = False) -> Transfer:
        """Moves source's bytes to destination (ranges: Buffers, Refs, "[node/]id").
        Vectored: `blocks=(src_idx, dst_idx)` with `block_size` (numpy arrays welcome),
        `segments=[(src_off, dst_off, len), ...]`, or `prepared=` a list kept by
        prepare() (the node that keeps it runs the move). `notify`: bytes published where the
        destination lives once the bytes are there. Waits for the end unless `wait=False`;
        with `check`, a move that did not succeed raises Error with its code. `priority`: its
        class, "latency", "normal" (default) or "bulk"; `require`: "rdma" or "tcp" holds a
        move between hosts to that transport class (FAILED_PRECONDITION otherwise). `progress`:
        while waiting, a tqdm progress bar of the bytes done (when tqdm is installed; else
        a log line on the "gpumove" logger about every second)."""
        spec = transfer_spec(source, destination, length=length, checksum=checksum, path=path,
                             blocks=blocks, block_size=block_size, segments=segments,
                             prepared=prepared, notify=notify, label=label,
                             priority=priority, require=require, durable=durable)
        if progress and wait:
            t = self.submit([spec], wait=False)[0]
            shown = Progress(t)
            try:
                for event in self.watch(t):
                    if shown.show(event):
                        break
            finally:
                shown.close()
            t = shown.last
        else:
            t = self.submit([spec], wait=wait, timeout=timeout)[0]
        if wait and check:
            t.raise_for_state()
        return t

    def move_kv(self, source_layers: Sequence[RangeLike],
                destination_layers: Sequence[RangeLike], source_blocks=None,
                destination_blocks=None, block_size: Optional[int] = None, *,
                wait: bool = True, timeout: Optional[float] = None, check: bool = True,
                **kwargs) -> List[Transfer]:
        """One Submit of gpumove.kv_specs(...) (one vectored move per layer region, the
        same block ids in each, or `prepared=` a list kept by prepare(); `notify` on the
        last layer's): accepted or refused whole. Waits unless `wait=False`; with `check`,
        raises Error for a move that failed."""
        specs = kv_specs(source_layers, destination_layers, source_blocks, destination_blocks,
                         block_size, **kwargs)
        transfers = self.submit(specs, wait=wait, timeout=timeout)
        if wait and check:
            for t in transfers:
                t.raise_for_state()
        return transfers

    def prepare(self, *, blocks=None, block_size: Optional[int] = None, segments=None,
                node: Optional[str] = None, label: str = "") -> PreparedPieces:
        """Keeps a piece list on `node` (None: this daemon) for moves to name
        (`move(..., prepared=p)`, `move_kv(..., prepared=p)`): checked and expanded once,
        so that each move sends its id instead of the list. The pieces as move() takes them.
        Release it with release_pieces()."""
        return PreparedPieces.from_proto(self._call(
            self._transfers.PreparePieces,
            prepare_request(blocks=blocks, block_size=block_size, segments=segments, node=node,
                            label=label)))

    def release_pieces(self, prepared: PreparedLike) -> None:
        """Lets a prepared list go (moves that named it and still run keep it)."""
        self._call(self._transfers.ReleasePieces,
                   pb.ReleasePiecesRequest(id=prepared_id(prepared)))

    def prepared_lists(self, node: Optional[str] = None) -> List[PreparedPieces]:
        """The piece lists kept on `node` (None: this daemon) for the caller."""
        return [PreparedPieces.from_proto(p) for p in self._pages(
            self._transfers.ListPreparedPieces, pb.ListPreparedPiecesRequest(node=node or ""),
            "lists")]

    def transfer(self, transfer: TransferLike) -> Transfer:
        """A transfer (or its id) as the daemon has it now."""
        return Transfer.from_proto(self._call(
            self._transfers.Get, pb.GetTransferRequest(id=req.transfer_id(transfer))))

    def transfers(self, states: Iterable[str] = (), limit: int = 0) -> List[Transfer]:
        """The newest `limit` transfers (0: 1000), page by page; only those in `states`
        ("queued", "running", "succeeded", "failed", "cancelled", any case) when named."""
        return [Transfer.from_proto(t) for t in self._pages(
            self._transfers.List, req.transfers(states), "transfers", req.limit(limit))]

    def wait(self, transfer: TransferLike, timeout: Optional[float] = None) -> Transfer:
        """The transfer once it has ended (DEADLINE_EXCEEDED after `timeout` seconds)."""
        return Transfer.from_proto(self._call(self._transfers.Wait, req.wait(transfer, timeout),
                                              timeout=None))

    def watch(self, transfer: TransferLike, interval: float = 0.1) -> Iterator[Transfer]:
        """The transfer now, then at every change and progress step until it ends."""
        request = req.watch(transfer, interval)
        self._open()
        try:
            for e in self._transfers.Watch(request, metadata=self._metadata):
                yield Transfer.from_proto(e.transfer)
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    def cancel(self, transfer: TransferLike, wait: bool = False,
               timeout: Optional[float] = None) -> Transfer:
        """Asks the move to stop. With `wait`, returns once it has ended (a running move
        stops at its next chunk; its buffers are free then); otherwise at once, maybe still
        RUNNING with `cancel_requested` set."""
        return Transfer.from_proto(self._call(
            self._transfers.Cancel, req.cancel(transfer, wait, timeout),
            **({"timeout": None} if wait else {})))

    def notifications(self, buffers: Iterable[BufferLike] = (), node: Optional[str] = None,
                      after: Optional[int] = None,
                      timeout: Optional[float] = None) -> NotificationStream:
        """Subscribes to notifications of moves into `buffers` (none named: all the caller
        may see) on `node` (None: this daemon's; a Buffer names its node). Returns once the
        daemon has the subscription, so a move submitted after that is seen. `after`:
        resume after that sequence number (0: from the oldest kept); None: new ones only.
        A named buffer that does not exist is Error NOT_FOUND. `timeout` ends the stream
        after that many seconds (None: it stays open until closed)."""
        request, gets = req.notifications(buffers, node, after)
        timeout = _checks.seconds(timeout, "timeout", positive=True)
        for get in gets:
            try:
                self._call(self._buffers.Get, get)
            except Error as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    raise req.not_found(get, self.addr) from None
                raise
        self._open()
        call = self._transfers.Notifications(request, timeout=timeout, metadata=self._metadata)
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
        request = _cuda.import_request(tensor, label=label)
        request.owner_pid = os.getpid()
        if lease is not None:
            request.lease_ttl.CopyFrom(req.duration(lease, "lease"))
        return Buffer.from_proto(self._call(self._buffers.Import, request), self)

    def open(self, buffer: BufferLike):
        """Maps a daemon DEVICE buffer allocated with exportable=True into this process
        (CUDA IPC): a gpumove.DeviceMemory with __cuda_array_interface__ (torch.as_tensor /
        cupy.asarray take it)."""
        from gpumove import _cuda
        bid, bnode = buffer_id(buffer)
        r = self._call(self._buffers.Export, pb.ExportRequest(buffer_id=bid, node=bnode))
        return _cuda.DeviceMemory.open(r)


def spec(source: RangeLike, destination: RangeLike, **kwargs) -> pb.TransferSpec:
    """A TransferSpec for Client.submit; the keywords of Client.move."""
    return transfer_spec(source, destination, **kwargs)
