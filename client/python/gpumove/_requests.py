"""The requests both clients (gpumove.Client, gpumove.aio.Client) send, built in one place:
each client method is "build here, call, convert the answer"."""
from __future__ import annotations

import datetime
from typing import Iterable, Iterator, Optional, Sequence, Union

from google.protobuf import duration_pb2

from gpumove._specs import RangeLike, to_ref
from gpumove._types import KINDS, STATES, Buffer, Ref, Transfer
from gpumove.v1 import gpumove_pb2 as pb

# Bytes per Write message and the largest Read chunk the daemon sends (ReadRequest).
WRITE_CHUNK = 1 << 20
READ_CHUNK = 4 << 20

TransferLike = Union[Transfer, str]
BufferLike = Union[Buffer, Ref, str]


def duration(seconds: Optional[float]) -> Optional[duration_pb2.Duration]:
    if seconds is None:
        return None
    d = duration_pb2.Duration()
    d.FromTimedelta(datetime.timedelta(seconds=seconds))
    return d


def transfer_id(t: TransferLike) -> str:
    return t.id if isinstance(t, Transfer) else t


def buffer_id(b: BufferLike) -> tuple:
    """(buffer id, node) of a Buffer, a Ref or "[node/]id"."""
    if isinstance(b, Buffer):
        return b.id, b.node
    if isinstance(b, Ref):
        return b.buffer, b.node
    r = to_ref(b)
    return r.buffer, r.node


def allocate(size: int, kind: str, device: int, node: Optional[str], lease: Optional[float],
             label: str, exportable: bool = False) -> pb.AllocateRequest:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, not {kind!r}")
    if exportable and kind != "device":
        raise ValueError(f"only device buffers can be exportable, not {kind!r} ones")
    req = pb.AllocateRequest(size=size, kind=KINDS[kind], device=device, label=label,
                             node=node or "", exportable=exportable)
    if lease is not None:
        req.lease_ttl.CopyFrom(duration(lease))
    return req


def renew(buffer: BufferLike, lease: Optional[float]) -> pb.RenewLeaseRequest:
    bid, bnode = buffer_id(buffer)
    req = pb.RenewLeaseRequest(buffer_id=bid, node=bnode)
    if lease is not None:
        req.lease_ttl.CopyFrom(duration(lease))
    return req


def write_messages(buffer: RangeLike, data, offset: int) -> Iterator[pb.WriteRequest]:
    """The messages of a Write of `data` (anything with the buffer protocol, contiguous) at
    `offset` of the range: 1 MiB each, the first naming the target; no copy of the whole."""
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
    return messages()


def read(buffer: RangeLike, offset: int, length: Optional[int], out) -> tuple:
    """(ReadRequest, first byte's offset in the buffer, writable view of `out` or None)."""
    ref = to_ref(buffer)
    view = None
    if out is not None:
        view = memoryview(out).cast("B")
        if view.readonly:
            raise ValueError("read's out must be writable")
        if length is None:
            length = len(view)
    start = ref.offset + offset
    req = pb.ReadRequest(source=pb.BufferRef(
        node=ref.node, buffer_id=ref.buffer, offset=start,
        length=length if length is not None else ref.length), chunk_size=READ_CHUNK)
    return req, start, view


def place(view: memoryview, start: int, message: pb.ReadResponse) -> None:
    """Copies one Read message into `view` (which holds the bytes from `start` on)."""
    at = message.offset - start
    if at + len(message.data) > len(view):
        raise ValueError(f"out holds {len(view)} bytes; the range has more")
    view[at:at + len(message.data)] = message.data


def submit(specs: Sequence[pb.TransferSpec], wait: bool, idempotency_key: str,
           timeout: Optional[float]) -> pb.SubmitRequest:
    req = pb.SubmitRequest(transfers=list(specs), idempotency_key=idempotency_key, wait=wait)
    if wait and timeout is not None:
        req.wait_timeout.CopyFrom(duration(timeout))
    return req


# The most pages a listing follows (a daemon answers at most 1000 entries a page).
MAX_LIST_PAGES = 10000
# The most entries a daemon answers in one page.
MAX_PAGE = 1000


def transfers(states: Iterable[str], limit: int) -> pb.ListTransfersRequest:
    return pb.ListTransfersRequest(states=[STATES[s] for s in states], limit=limit)


def cancel(transfer: TransferLike, wait: bool, timeout: Optional[float]) -> pb.CancelRequest:
    r = pb.CancelRequest(id=transfer_id(transfer), wait=wait)
    if wait and timeout is not None:
        r.wait_timeout.CopyFrom(duration(timeout))
    return r


def wait(transfer: TransferLike, timeout: Optional[float]) -> pb.WaitRequest:
    req = pb.WaitRequest(id=transfer_id(transfer))
    if timeout is not None:
        req.timeout.CopyFrom(duration(timeout))
    return req


def watch(transfer: TransferLike, interval: float) -> pb.WatchRequest:
    return pb.WatchRequest(id=transfer_id(transfer), progress_interval=duration(interval))


def notifications(buffers: Iterable[BufferLike], node: Optional[str],
                  after: Optional[int]) -> pb.NotificationsRequest:
    """Buffers named by a Buffer or "node/id" give the node when `node` is None."""
    ids, nodes = [], set()
    for b in buffers:
        bid, bnode = buffer_id(b)
        ids.append(bid)
        if bnode:
            nodes.add(bnode)
    if node is None and len(nodes) == 1:
        node = nodes.pop()
    req = pb.NotificationsRequest(node=node or "", buffers=ids)
    if after is not None:
        req.after_sequence = after
    return req
