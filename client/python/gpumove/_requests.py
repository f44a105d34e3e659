"""The requests both clients (gpumove.Client, gpumove.aio.Client) send, built in one place:
each client method is "check and build here, call, convert the answer". Arguments are
checked here (with _checks), so both clients refuse the same ones in the same words."""
from __future__ import annotations

import datetime
from typing import Iterable, Iterator, Optional, Sequence, Union

import grpc
from google.protobuf import duration_pb2

from gpumove import _checks
from gpumove._specs import RangeLike, to_ref
from gpumove._types import KINDS, STATES, Buffer, Error, Ref, Transfer
from gpumove.v1 import gpumove_pb2 as pb

# Bytes per Write message and the largest Read chunk the daemon sends (ReadRequest).
WRITE_CHUNK = 1 << 20
READ_CHUNK = 4 << 20

TransferLike = Union[Transfer, str]
BufferLike = Union[Buffer, Ref, str]


def duration(seconds: Optional[float],
             name: str = "duration") -> Optional[duration_pb2.Duration]:
    """A Duration of `seconds` (None: None), checked as argument `name`."""
    seconds = _checks.seconds(seconds, name)
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


def allocate(size: Union[int, str], kind: str, device: int, node: Optional[str],
             lease: Optional[float], label: str, exportable: bool = False) -> pb.AllocateRequest:
    """`size`: bytes, or a string such as "64MiB"; `kind` in any case."""
    nbytes = _checks.size(size)
    name = kind.lower() if isinstance(kind, str) else None
    if name not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, not {kind!r}")
    if exportable and name != "device":
        raise ValueError(f"only device buffers can be exportable, not {kind!r} ones")
    device_index = _checks.integer(device)
    if device_index is None or device_index < 0:
        raise ValueError(f"device must be a GPU index (0 or more), not {device!r}")
    req = pb.AllocateRequest(size=nbytes, kind=KINDS[name], device=device_index, label=label,
                             node=node or "", exportable=exportable)
    if lease is not None:
        req.lease_ttl.CopyFrom(duration(lease, "lease"))
    return req


def register_file(path: str, length: Union[int, str], offset: Union[int, str], root: str,
                  writable: bool, create: bool, node: Optional[str], lease: Optional[float],
                  label: str) -> pb.RegisterFileRequest:
    """`path` relative to the root (the daemon checks it beneath the root); sizes as bytes
    or strings such as "64MiB"."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a non-empty string, not {path!r}")
    if create and not writable:
        raise ValueError("create needs writable")
    req = pb.RegisterFileRequest(root=root, path=path, offset=_checks.size(offset, "offset"),
                                 length=_checks.size(length, "length"),
                                 writable=writable, create=create, label=label, node=node or "")
    if lease is not None:
        req.lease_ttl.CopyFrom(duration(lease, "lease"))
    return req


def renew(buffer: BufferLike, lease: Optional[float]) -> pb.RenewLeaseRequest:
    bid, bnode = buffer_id(buffer)
    req = pb.RenewLeaseRequest(buffer_id=bid, node=bnode)
    if lease is not None:
        req.lease_ttl.CopyFrom(duration(lease, "lease"))
    return req


def write_messages(buffer: RangeLike, data, offset: int) -> Iterator[pb.WriteRequest]:
    """The messages of a Write of `data` (anything with the buffer protocol, contiguous) at
    `offset` of the range: 1 MiB each, the first naming the target; no copy of the whole."""
    view = memoryview(data)
    if not view.contiguous:
        raise ValueError("write takes contiguous data")
    view = view.cast("B")
    ref = to_ref(buffer)
    offset = _checks.count(offset, "write's offset")
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
    offset = _checks.count(offset, "read's offset")
    if length is not None:
        length = _checks.count(length, "read's length")
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
    if isinstance(specs, pb.TransferSpec):
        raise TypeError("submit takes a list of TransferSpecs, not one: submit([spec])")
    req = pb.SubmitRequest(transfers=list(specs), idempotency_key=idempotency_key, wait=wait)
    timeout = duration(timeout, "timeout")
    if wait and timeout is not None:
        req.wait_timeout.CopyFrom(timeout)
    return req


# The most pages a listing follows (a daemon answers at most 1000 entries a page).
MAX_LIST_PAGES = 10000
# The most entries a daemon answers in one page.
MAX_PAGE = 1000


def transfers(states: Union[str, Iterable[str]]) -> pb.ListTransfersRequest:
    """A listing of transfers in `states` (names in any case; one name alone will do)."""
    if isinstance(states, str):
        states = [states]
    codes = []
    for s in states:
        if not isinstance(s, str) or s.lower() not in STATES:
            raise ValueError(f"states must be among {list(STATES)} (any case), not {s!r}")
        codes.append(STATES[s.lower()])
    return pb.ListTransfersRequest(states=codes)


def limit(value: int) -> int:
    """The most transfers a listing returns: `value`, or MAX_PAGE for 0."""
    n = _checks.integer(value)
    if n is None or n < 0:
        raise ValueError(f"limit must be a number of transfers (0: {MAX_PAGE}), not {value!r}")
    return n or MAX_PAGE


def cancel(transfer: TransferLike, wait: bool, timeout: Optional[float]) -> pb.CancelRequest:
    r = pb.CancelRequest(id=transfer_id(transfer), wait=wait)
    timeout = duration(timeout, "timeout")
    if wait and timeout is not None:
        r.wait_timeout.CopyFrom(timeout)
    return r


def wait(transfer: TransferLike, timeout: Optional[float]) -> pb.WaitRequest:
    req = pb.WaitRequest(id=transfer_id(transfer))
    if timeout is not None:
        req.timeout.CopyFrom(duration(timeout, "timeout"))
    return req


def watch(transfer: TransferLike, interval: float) -> pb.WatchRequest:
    return pb.WatchRequest(id=transfer_id(transfer),
                           progress_interval=duration(interval, "interval"))


# The most buffers a subscription names (the daemon's bound) and so the most checked.
MAX_SUBSCRIBED = 4096


def notifications(buffers: Iterable[BufferLike], node: Optional[str],
                  after: Optional[int]) -> tuple:
    """(NotificationsRequest, [pb.GetBufferRequest for each named buffer]): the client asks
    for each buffer before it subscribes, so that a buffer that does not exist is NOT_FOUND
    rather than a stream that never says anything. Buffers named by a Buffer or "node/id"
    give the node when `node` is None."""
    if isinstance(buffers, (str, Buffer, Ref)):
        buffers = [buffers]
    named, nodes = [], set()
    for b in buffers:
        named.append(buffer_id(b))
        if named[-1][1]:
            nodes.add(named[-1][1])
    if node is None and len(nodes) == 1:
        node = nodes.pop()
    req = pb.NotificationsRequest(node=node or "", buffers=[bid for bid, _ in named])
    if after is not None:
        req.after_sequence = _checks.count(after, "after")
    # Past the daemon's bound the subscription is refused whole: no need to ask.
    gets = [] if len(named) > MAX_SUBSCRIBED else [
        pb.GetBufferRequest(buffer_id=bid, node=bnode or node or "")
        for bid, bnode in dict.fromkeys(named)]
    return req, gets


def not_found(get: pb.GetBufferRequest, addr: str) -> Error:
    """The error of a subscription to a buffer that does not exist."""
    where = f"node {get.node}" if get.node else addr
    return Error(grpc.StatusCode.NOT_FOUND,
                 f"notifications: no buffer {get.buffer_id} on {where}, so no move into it "
                 "would ever be notified")
