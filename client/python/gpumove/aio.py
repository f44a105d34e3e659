"""gpumove.aio.Client: the asyncio client (grpc.aio), the same methods as gpumove.Client
(same names and parameters; tests/test_surface.py holds them to it) as coroutines; watch()
is an async iterator and notifications() gives one."""
from __future__ import annotations

import asyncio
import inspect
import os
from typing import AsyncIterator, Iterable, List, Optional, Sequence, Union

import grpc

from gpumove import _checks
from gpumove import _client
from gpumove import _requests as req
from gpumove._client import channel_options, credentials
from gpumove._progress import Progress
from gpumove._requests import BufferLike, TransferLike, buffer_id
from gpumove._specs import (PreparedLike, RangeLike, kv_specs, prepare_request, prepared_id,
                            transfer_spec)
from gpumove._types import Buffer, Error, Info, Notification, Peer, PreparedPieces, Transfer
from gpumove.v1 import gpumove_pb2 as pb
from gpumove.v1 import gpumove_pb2_grpc as rpc


class NotificationStream:
    """An open Notifications stream: `async for n in stream`; `await close()` (or
    cancel()) or leaving an `async with` block ends it (iteration then stops)."""

    def __init__(self, call):
        self._call = call
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Notification]:
        return self._iterate()

    async def _iterate(self):
        if self._closed:
            return
        try:
            async for n in self._call:
                yield Notification.from_proto(n)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise Error.from_rpc(e) from None
        except asyncio.CancelledError:
            # grpc.aio ends a call cancelled here with CancelledError: after close() that
            # is the stream's end, not this task's.
            if self._closed:
                return
            raise

    async def close(self) -> None:
        """Ends the stream (the daemon drops the subscription); closing twice is fine."""
        self.cancel()

    def cancel(self) -> None:
        """Ends the stream now, without awaiting (from a callback, say)."""
        self._closed = True
        self._call.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class Client:
    """The asyncio twin of gpumove.Client (same arguments, methods as coroutines):

        async with gpumove.aio.Client("127.0.0.1:7470") as c:
            async with await c.allocate("64MiB") as buf:
                await c.write(buf, data)
    """

    _asynchronous = True  # Buffers it hands out are released by `async with`.

    def __init__(self, addr: str = "127.0.0.1:7470", *, token: Optional[str] = None, tls=None,
                 timeout: Optional[float] = 60.0, server_name: Optional[str] = None):
        timeout = _checks.seconds(timeout, "timeout", positive=True)
        self._closed = False
        opts = channel_options()
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        creds = credentials(tls, token)
        self._channel = (grpc.aio.secure_channel(addr, creds, opts) if creds is not None
                         else grpc.aio.insecure_channel(addr, opts))
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self._buffers = rpc.BufferServiceStub(self._channel)
        self._transfers = rpc.TransferServiceStub(self._channel)
        self._node = rpc.NodeServiceStub(self._channel)
        self.addr = addr

    def _open(self) -> None:
        """Raises the closed-client error in our words (not grpc's) after close()."""
        if self._closed:
            raise _checks.closed(self.addr)

    async def _call(self, method, request, timeout: Optional[float] = -1.0):
        self._open()
        timeout = self._timeout if timeout == -1.0 else timeout
        waits = _checks.StartingWaits(timeout)
        while True:
            try:
                return await method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                pause = waits.next(e)
                if pause is None:
                    raise Error.from_rpc(e) from None
                await asyncio.sleep(pause)

    async def close(self) -> None:
        self._closed = True
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def info(self) -> Info:
        return Info.from_proto(await self._call(self._node.GetInfo, pb.GetInfoRequest()))

    async def peers(self) -> List[Peer]:
        r = await self._call(self._node.ListPeers, pb.ListPeersRequest())
        return [Peer.from_proto(p) for p in r.peers]

    async def allocate(self, size: Union[int, str], kind: str = "host", device: int = 0,
                       node: Optional[str] = None, lease: Optional[float] = None,
                       label: str = "", exportable: bool = False) -> Buffer:
        return Buffer.from_proto(await self._call(
            self._buffers.Allocate,
            req.allocate(size, kind, device, node, lease, label, exportable)), self)

    async def register_file(self, path: str, length: Union[int, str], *,
                            offset: Union[int, str] = 0, root: str = "", writable: bool = False,
                            create: bool = False, node: Optional[str] = None,
                            lease: Optional[float] = None, label: str = "") -> Buffer:
        return Buffer.from_proto(await self._call(
            self._buffers.RegisterFile,
            req.register_file(path, length, offset, root, writable, create, node, lease,
                              label)), self)

    async def release(self, buffer: BufferLike, node: Optional[str] = None) -> None:
        bid, bnode = buffer_id(buffer)
        await self._call(self._buffers.Release,
                         pb.ReleaseRequest(buffer_id=bid, node=node or bnode))

    async def buffer(self, buffer: BufferLike, node: Optional[str] = None) -> Buffer:
        bid, bnode = buffer_id(buffer)
        return Buffer.from_proto(await self._call(
            self._buffers.Get, pb.GetBufferRequest(buffer_id=bid, node=node or bnode)), self)

    async def _pages(self, method, request, field: str, want: int = 0) -> list:
        """As Client._pages."""
        out: list = []
        for _ in range(req.MAX_LIST_PAGES):
            if want:
                request.page_size = min(want - len(out), req.MAX_PAGE)
            r = await self._call(method, request)
            out += getattr(r, field)
            if not r.next_page_token or (want and len(out) >= want):
                break
            request.page_token = r.next_page_token
        return out

    async def buffers(self, node: Optional[str] = None) -> List[Buffer]:
        return [Buffer.from_proto(b, self) for b in await self._pages(
            self._buffers.List, pb.ListBuffersRequest(node=node or ""), "buffers")]

    async def renew(self, buffer: BufferLike, lease: Optional[float] = None) -> Buffer:
        return Buffer.from_proto(await self._call(self._buffers.RenewLease,
                                                  req.renew(buffer, lease)), self)

    async def write(self, buffer: RangeLike, data, offset: int = 0) -> int:
        messages = req.write_messages(buffer, data, offset)

        async def stream():
            for m in messages:
                yield m
        r = await self._call(self._buffers.Write, stream())
        return r.bytes_written

    async def read(self, buffer: RangeLike, offset: int = 0, length: Optional[int] = None,
                   out=None):
        request, start, view = req.read(buffer, offset, length, out)
        self._open()
        try:
            call = self._buffers.Read(request, timeout=self._timeout, metadata=self._metadata)
            if view is None:
                return b"".join([m.data async for m in call])
            async for m in call:
                req.place(view, start, m)
            return out
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    async def submit(self, specs: Sequence[pb.TransferSpec], wait: bool = False,
                     idempotency_key: str = "", timeout: Optional[float] = None) -> List[Transfer]:
        r = await self._call(self._transfers.Submit,
                             req.submit(specs, wait, idempotency_key, timeout),
                             timeout=None if wait else -1.0)
        return [Transfer.from_proto(t) for t in r.transfers]

    async def move(self, source: RangeLike, destination: RangeLike,
                   length: Optional[int] = None, *, checksum: bool = False, path: str = "auto",
                   blocks=None, block_size: Optional[int] = None, segments=None,
                   prepared: Optional[PreparedLike] = None, notify=None,
                   wait: bool = True, timeout: Optional[float] = None, label: str = "",
                   check: bool = True, progress: bool = False,
                   priority: str = "normal", require: str = "",
                   durable: bool = False) -> Transfer:
        spec = transfer_spec(source, destination, length=length, checksum=checksum, path=path,
                             blocks=blocks, block_size=block_size, segments=segments,
                             prepared=prepared, notify=notify, label=label,
                             priority=priority, require=require, durable=durable)
        if progress and wait:
            t = (await self.submit([spec], wait=False))[0]
            shown = Progress(t)
            try:
                async for event in self.watch(t):
                    if shown.show(event):
                        break
            finally:
                shown.close()
            t = shown.last
        else:
            t = (await self.submit([spec], wait=wait, timeout=timeout))[0]
        if wait and check:
            t.raise_for_state()
        return t

    async def move_kv(self, source_layers: Sequence[RangeLike],
                      destination_layers: Sequence[RangeLike], source_blocks=None,
                      destination_blocks=None, block_size: Optional[int] = None, *,
                      wait: bool = True,
                      timeout: Optional[float] = None, check: bool = True,
                      **kwargs) -> List[Transfer]:
        specs = kv_specs(source_layers, destination_layers, source_blocks, destination_blocks,
                         block_size, **kwargs)
        transfers = await self.submit(specs, wait=wait, timeout=timeout)
        if wait and check:
            for t in transfers:
                t.raise_for_state()
        return transfers

    async def prepare(self, *, blocks=None, block_size: Optional[int] = None, segments=None,
                      node: Optional[str] = None, label: str = "") -> PreparedPieces:
        return PreparedPieces.from_proto(await self._call(
            self._transfers.PreparePieces,
            prepare_request(blocks=blocks, block_size=block_size, segments=segments, node=node,
                            label=label)))

    async def release_pieces(self, prepared: PreparedLike) -> None:
        await self._call(self._transfers.ReleasePieces,
                         pb.ReleasePiecesRequest(id=prepared_id(prepared)))

    async def prepared_lists(self, node: Optional[str] = None) -> List[PreparedPieces]:
        return [PreparedPieces.from_proto(p) for p in await self._pages(
            self._transfers.ListPreparedPieces, pb.ListPreparedPiecesRequest(node=node or ""),
            "lists")]

    async def transfer(self, transfer: TransferLike) -> Transfer:
        return Transfer.from_proto(await self._call(
            self._transfers.Get, pb.GetTransferRequest(id=req.transfer_id(transfer))))

    async def transfers(self, states: Iterable[str] = (), limit: int = 0) -> List[Transfer]:
        return [Transfer.from_proto(t) for t in await self._pages(
            self._transfers.List, req.transfers(states), "transfers", req.limit(limit))]

    async def wait(self, transfer: TransferLike, timeout: Optional[float] = None) -> Transfer:
        return Transfer.from_proto(await self._call(self._transfers.Wait,
                                                    req.wait(transfer, timeout), timeout=None))

    async def watch(self, transfer: TransferLike,
                    interval: float = 0.1) -> AsyncIterator[Transfer]:
        request = req.watch(transfer, interval)
        self._open()
        try:
            async for e in self._transfers.Watch(request, metadata=self._metadata):
                yield Transfer.from_proto(e.transfer)
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    async def cancel(self, transfer: TransferLike, wait: bool = False,
                     timeout: Optional[float] = None) -> Transfer:
        return Transfer.from_proto(await self._call(
            self._transfers.Cancel, req.cancel(transfer, wait, timeout),
            **({"timeout": None} if wait else {})))

    async def notifications(self, buffers: Iterable[BufferLike] = (),
                            node: Optional[str] = None, after: Optional[int] = None,
                            timeout: Optional[float] = None) -> NotificationStream:
        request, gets = req.notifications(buffers, node, after)
        timeout = _checks.seconds(timeout, "timeout", positive=True)
        for get in gets:
            try:
                await self._call(self._buffers.Get, get)
            except Error as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    raise req.not_found(get, self.addr) from None
                raise
        self._open()
        call = self._transfers.Notifications(request, timeout=timeout, metadata=self._metadata)
        try:
            await call.initial_metadata()  # Sent once the daemon has the subscription.
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None
        if call.done():
            code = await call.code()
            if code != grpc.StatusCode.OK:
                raise Error(code, await call.details() or "")
        return NotificationStream(call)

    # CUDA: lending tensors and mapping buffers (same host as the daemon).
    async def register(self, tensor, label: str = "", lease: Optional[float] = None) -> Buffer:
        from gpumove import _cuda
        request = _cuda.import_request(tensor, label=label)
        request.owner_pid = os.getpid()
        if lease is not None:
            request.lease_ttl.CopyFrom(req.duration(lease, "lease"))
        return Buffer.from_proto(await self._call(self._buffers.Import, request), self)

    async def open(self, buffer: BufferLike):
        from gpumove import _cuda
        bid, bnode = buffer_id(buffer)
        r = await self._call(self._buffers.Export, pb.ExportRequest(buffer_id=bid, node=bnode))
        return _cuda.DeviceMemory.open(r)


def _share_docs() -> None:
    """Gives each public method of this Client gpumove.Client's docstring (one text for
    both, so they cannot drift apart), saying how the asyncio form is used."""
    for name, method in vars(Client).items():
        twin = getattr(_client.Client, name, None)
        if name.startswith("_") or not callable(method) or twin is None or not twin.__doc__:
            continue
        how = ("iterate with `async for`" if name == "watch" else "await it")
        method.__doc__ = (f"gpumove.Client.{name} for asyncio ({how}).\n\n"
                          f"{inspect.cleandoc(twin.__doc__)}")


_share_docs()
