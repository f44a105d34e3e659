"""gpumove.aio.Client: the asyncio client (grpc.aio), the same methods as gpumove.Client
as coroutines; watch() and notifications() are async iterators."""
from __future__ import annotations

from typing import AsyncIterator, Iterable, List, Optional, Sequence, Union

import grpc

from gpumove._client import (READ_CHUNK, WRITE_CHUNK, TransferLike, _buffer_id, _duration, _id,
                             channel_options, credentials)
from gpumove._specs import RangeLike, to_ref, transfer_spec
from gpumove._types import (KINDS, STATES, Buffer, Error, Info, Notification, Peer, Ref,
                            Transfer)
from gpumove.v1 import gpumove_pb2 as pb
from gpumove.v1 import gpumove_pb2_grpc as rpc


class NotificationStream:
    """An open Notifications stream: `async for n in stream`; cancel() ends it."""

    def __init__(self, call):
        self._call = call

    def __aiter__(self) -> AsyncIterator[Notification]:
        return self._iterate()

    async def _iterate(self):
        try:
            async for n in self._call:
                yield Notification.from_proto(n)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise Error.from_rpc(e) from None

    def cancel(self) -> None:
        self._call.cancel()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.cancel()


class Client:
    """The asyncio twin of gpumove.Client (same arguments)."""

    def __init__(self, addr: str = "127.0.0.1:7470", *, token: Optional[str] = None, tls=None,
                 timeout: Optional[float] = 60.0, server_name: Optional[str] = None):
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

    async def _call(self, method, request, timeout: Optional[float] = -1.0):
        try:
            return await method(request,
                                timeout=self._timeout if timeout == -1.0 else timeout,
                                metadata=self._metadata)
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    async def close(self) -> None:
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

    async def allocate(self, size: int, kind: str = "host", device: int = 0,
                       node: Optional[str] = None, lease: Optional[float] = None,
                       label: str = "") -> Buffer:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, not {kind!r}")
        req = pb.AllocateRequest(size=size, kind=KINDS[kind], device=device, label=label,
                                 node=node or "")
        if lease is not None:
            req.lease_ttl.CopyFrom(_duration(lease))
        return Buffer.from_proto(await self._call(self._buffers.Allocate, req))

    async def release(self, buffer: Union[Buffer, Ref, str], node: Optional[str] = None) -> None:
        bid, bnode = _buffer_id(buffer)
        await self._call(self._buffers.Release,
                         pb.ReleaseRequest(buffer_id=bid, node=node or bnode))

    async def buffer(self, buffer: Union[Buffer, Ref, str], node: Optional[str] = None) -> Buffer:
        bid, bnode = _buffer_id(buffer)
        return Buffer.from_proto(await self._call(
            self._buffers.Get, pb.GetBufferRequest(buffer_id=bid, node=node or bnode)))

    async def buffers(self, node: Optional[str] = None) -> List[Buffer]:
        r = await self._call(self._buffers.List, pb.ListBuffersRequest(node=node or ""))
        return [Buffer.from_proto(b) for b in r.buffers]

    async def write(self, buffer: RangeLike, data, offset: int = 0) -> int:
        view = memoryview(data).cast("B")
        ref = to_ref(buffer)
        target = pb.BufferRef(node=ref.node, buffer_id=ref.buffer, offset=ref.offset + offset,
                              length=len(view))

        async def messages():
            if len(view) == 0:
                yield pb.WriteRequest(target=target)
                return
            for at in range(0, len(view), WRITE_CHUNK):
                chunk = bytes(view[at:at + WRITE_CHUNK])
                yield (pb.WriteRequest(target=target, data=chunk) if at == 0
                       else pb.WriteRequest(data=chunk))
        r = await self._call(self._buffers.Write, messages())
        return r.bytes_written

    async def read(self, buffer: RangeLike, offset: int = 0, length: Optional[int] = None,
                   out=None):
        ref = to_ref(buffer)
        if length is None and out is not None:
            length = memoryview(out).nbytes
        start = ref.offset + offset
        req = pb.ReadRequest(source=pb.BufferRef(
            node=ref.node, buffer_id=ref.buffer, offset=start,
            length=length if length is not None else ref.length), chunk_size=READ_CHUNK)
        try:
            call = self._buffers.Read(req, timeout=self._timeout, metadata=self._metadata)
            if out is None:
                return b"".join([m.data async for m in call])
            view = memoryview(out).cast("B")
            async for m in call:
                at = m.offset - start
                if at + len(m.data) > len(view):
                    raise ValueError(f"out holds {len(view)} bytes; the range has more")
                view[at:at + len(m.data)] = m.data
            return out
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    async def submit(self, specs: Sequence[pb.TransferSpec], wait: bool = False,
                     idempotency_key: str = "", timeout: Optional[float] = None) -> List[Transfer]:
        req = pb.SubmitRequest(transfers=list(specs), idempotency_key=idempotency_key,
                               wait=wait)
        if wait and timeout is not None:
            req.wait_timeout.CopyFrom(_duration(timeout))
        r = await self._call(self._transfers.Submit, req, timeout=None if wait else -1.0)
        return [Transfer.from_proto(t) for t in r.transfers]

    async def move(self, source: RangeLike, destination: RangeLike,
                   length: Optional[int] = None, *, checksum: bool = False, path: str = "auto",
                   blocks=None, block_size: Optional[int] = None, segments=None, notify=None,
                   wait: bool = True, timeout: Optional[float] = None, label: str = "",
                   check: bool = True) -> Transfer:
        spec = transfer_spec(source, destination, length=length, checksum=checksum, path=path,
                             blocks=blocks, block_size=block_size, segments=segments,
                             notify=notify, label=label)
        t = (await self.submit([spec], wait=wait, timeout=timeout))[0]
        if wait and check:
            t.raise_for_state()
        return t

    async def transfer(self, transfer: TransferLike) -> Transfer:
        return Transfer.from_proto(await self._call(self._transfers.Get,
                                                    pb.GetTransferRequest(id=_id(transfer))))

    async def transfers(self, states: Iterable[str] = (), limit: int = 0) -> List[Transfer]:
        req = pb.ListTransfersRequest(states=[STATES[s] for s in states], limit=limit)
        r = await self._call(self._transfers.List, req)
        return [Transfer.from_proto(t) for t in r.transfers]

    async def wait(self, transfer: TransferLike, timeout: Optional[float] = None) -> Transfer:
        req = pb.WaitRequest(id=_id(transfer))
        if timeout is not None:
            req.timeout.CopyFrom(_duration(timeout))
        return Transfer.from_proto(await self._call(self._transfers.Wait, req, timeout=None))

    async def watch(self, transfer: TransferLike,
                    interval: float = 0.1) -> AsyncIterator[Transfer]:
        req = pb.WatchRequest(id=_id(transfer), progress_interval=_duration(interval))
        try:
            async for e in self._transfers.Watch(req, metadata=self._metadata):
                yield Transfer.from_proto(e.transfer)
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None

    async def cancel(self, transfer: TransferLike) -> Transfer:
        return Transfer.from_proto(await self._call(self._transfers.Cancel,
                                                    pb.CancelRequest(id=_id(transfer))))

    async def notifications(self, buffers: Iterable[Union[Buffer, Ref, str]] = (),
                            node: Optional[str] = None, after: Optional[int] = None,
                            timeout: Optional[float] = None) -> NotificationStream:
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
            await call.initial_metadata()  # Sent once the daemon has the subscription.
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None
        if call.done():
            code = await call.code()
            if code != grpc.StatusCode.OK:
                raise Error(code, await call.details() or "")
        return NotificationStream(call)
