"""Building requests: ranges from what callers pass, and block lists from integer arrays
without a Python loop per block (packed varints encoded with numpy, parsed by protobuf)."""
from __future__ import annotations

import numbers
import struct
from typing import Any, Optional, Sequence, Union

from gpumove._types import PATHS, PRIORITIES, Buffer, PreparedPieces, Ref
from gpumove.v1 import gpumove_pb2 as pb

try:  # numpy makes block lists fast; without it they are encoded value by value.
    import numpy as np
except ImportError:  # pragma: no cover - numpy is there wherever the tests run
    np = None

if np is not None:
    _THRESHOLDS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)

RangeLike = Union[Buffer, Ref, str]


def to_ref(r: RangeLike, node: Optional[str] = None) -> Ref:
    """A Ref from a Buffer, a Ref, or "[node/]buffer_id"."""
    if isinstance(r, Ref):
        return r
    if isinstance(r, Buffer):
        return r.ref()
    if isinstance(r, str):
        if "/" in r:
            n, _, b = r.partition("/")
            return Ref(buffer=b, node=n)
        return Ref(buffer=r, node=node or "")
    raise TypeError(f"a range is a gpumove.Buffer, gpumove.Ref or buffer id, not {type(r)!r}")


def _varints(values) -> bytes:
    """The protobuf varint encoding of unsigned integers, one after another."""
    if np is None:
        out = bytearray()
        for v in values:
            v = int(v)
            if v < 0:
                raise ValueError("block indices are not negative")
            while True:
                b = v & 0x7F
                v >>= 7
                out.append(b | (0x80 if v else 0))
                if not v:
                    break
        return bytes(out)
    a = values if isinstance(values, np.ndarray) else np.array(values)
    if a.ndim != 1:
        raise ValueError("block indices are a one-dimensional array")
    if a.size == 0:
        return b""
    if not isinstance(values, np.ndarray) and a.dtype.kind in "fO":
        # Python ints past int64 (numpy made floats or objects of them).
        items = list(values)
        if not all(isinstance(v, numbers.Integral) for v in items):
            raise ValueError("block indices are integers")
        if any(v < 0 for v in items):
            raise ValueError("block indices are not negative")
        try:
            a = np.array(items, dtype=np.uint64)
        except OverflowError:
            raise ValueError("block indices are below 2^64") from None
    if a.dtype.kind not in "iu":
        raise ValueError(f"block indices are integers, not {a.dtype}")
    if a.dtype.kind == "i" and a.min() < 0:
        raise ValueError("block indices are not negative")
    a = a.astype(np.uint64, copy=False)
    # Bytes per value (1 + the 7-bit steps it passes); a value x byte matrix of 7-bit groups
    # with the continuation bit, column by column; read row by row where a value has bytes.
    lengths = np.ones(a.size, dtype=np.int64)
    for t in _THRESHOLDS:
        more = a >= t
        if not more.any():
            break
        lengths += more
    width = int(lengths.max())
    groups = np.empty((a.size, width), dtype=np.uint8)
    v = a.copy()
    for c in range(width):
        groups[:, c] = (v & np.uint64(0x7F)).astype(np.uint8)
        if c + 1 < width:
            groups[:, c] |= (lengths > c + 1).astype(np.uint8) << np.uint8(7)
            v >>= np.uint64(7)
    return groups[np.arange(width)[None, :] < lengths[:, None]].tobytes()


def _fixed32(values) -> Optional[bytes]:
    """Little-endian 32-bit integers when every value is a non-negative integer below 2^32
    (the daemon parses those as one copy), else None."""
    if np is not None:
        a = values if isinstance(values, np.ndarray) else np.array(values)
        if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "iu":
            return None
        if (a.dtype.kind == "i" and a.min() < 0) or a.max() > 0xFFFFFFFF:
            return None
        return a.astype("<u4").tobytes()
    items = list(values)
    if not items or not all(isinstance(v, numbers.Integral) and 0 <= v <= 0xFFFFFFFF
                            for v in items):
        return None
    return struct.pack(f"<{len(items)}I", *items)


def _indices(wide: int, narrow: int, values) -> bytes:
    """One side's block indices as a BlockList field: fixed 32-bit (field `narrow`) when
    they fit, else varints (field `wide`)."""
    packed = _fixed32(values)
    if packed is not None:
        return _field(narrow, packed)
    varints = _varints(values)
    return _field(wide, varints) if varints else b""


def _field(number: int, payload: bytes) -> bytes:
    return _varints([(number << 3) | 2]) + _varints([len(payload)]) + payload


def block_list(block_size: int, source_blocks, destination_blocks,
               source_stride: int = 0, destination_stride: int = 0) -> pb.BlockList:
    """A BlockList: block i copies block_size bytes from source_blocks[i] * source_stride to
    destination_blocks[i] * destination_stride (strides 0: block_size). The index arrays
    (numpy arrays or sequences of ints) are packed without a loop per block."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    data = (_varints([(1 << 3) | 0, block_size]) +
            (_varints([(2 << 3) | 0, source_stride]) if source_stride else b"") +
            (_varints([(3 << 3) | 0, destination_stride]) if destination_stride else b"") +
            _indices(4, 6, source_blocks) + _indices(5, 7, destination_blocks))
    out = pb.BlockList()
    out.MergeFromString(data)
    return out


PreparedLike = Union[PreparedPieces, str]


def prepared_id(p: PreparedLike) -> str:
    """The id of a prepared piece list (a PreparedPieces or its id)."""
    if isinstance(p, PreparedPieces):
        return p.id
    if isinstance(p, str) and p:
        return p
    raise TypeError(f"a prepared list is a gpumove.PreparedPieces or its id, not {p!r}")


def _set_pieces(message, blocks: Any, block_size: Optional[int],
                segments: Optional[Sequence]) -> None:
    """Sets `message`'s blocks or segments (a TransferSpec or a PreparePiecesRequest)."""
    if blocks is not None and segments is not None:
        raise ValueError("give blocks or segments, not both")
    if blocks is not None:
        if isinstance(blocks, pb.BlockList):
            message.blocks.CopyFrom(blocks)
        else:
            if block_size is None:
                raise ValueError("blocks need a block_size")
            s, d = blocks
            message.blocks.CopyFrom(block_list(block_size, s, d))
    if segments is not None:
        for so, do, n in segments:
            message.segments.add(source_offset=int(so), destination_offset=int(do),
                                 length=int(n))


def prepare_request(*, blocks: Any = None, block_size: Optional[int] = None,
                    segments: Optional[Sequence] = None, node: Optional[str] = None,
                    label: str = "") -> pb.PreparePiecesRequest:
    """A PreparePiecesRequest: the pieces as transfer_spec takes them."""
    if blocks is None and segments is None:
        raise ValueError("a prepared list needs blocks or segments")
    r = pb.PreparePiecesRequest(node=node or "", label=label)
    _set_pieces(r, blocks, block_size, segments)
    return r


def transfer_spec(source: RangeLike, destination: RangeLike, *, length: Optional[int] = None,
                  checksum: bool = False, path: str = "auto", blocks: Any = None,
                  block_size: Optional[int] = None, segments: Optional[Sequence] = None,
                  prepared: Optional[PreparedLike] = None,
                  notify: Optional[bytes] = None, label: str = "",
                  priority: str = "normal", require: str = "",
                  durable: bool = False) -> pb.TransferSpec:
    """One TransferSpec. `blocks` is a (source_indices, destination_indices) pair (with
    `block_size`) or a pb.BlockList; `segments` a sequence of (source_offset,
    destination_offset, length) triples; `prepared` a list kept by Client.prepare (instead
    of blocks or segments); `notify` bytes (or str) for a notification; `priority` the
    move's class, "latency", "normal" or "bulk"; `require` the transport class the move must
    run over between hosts, "rdma" or "tcp" ("": any); `durable`: a move into a file buffer
    ends once its bytes are on stable storage (fdatasync)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, not {path!r}")
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {sorted(PRIORITIES)}, not {priority!r}")
    if require not in ("", "rdma", "tcp"):
        raise ValueError(f"require must be 'rdma', 'tcp' or '', not {require!r}")
    src = to_ref(source)
    if length is not None:
        src = Ref(buffer=src.buffer, node=src.node, offset=src.offset, length=length)
    spec = pb.TransferSpec(source=src.to_proto(), destination=to_ref(destination).to_proto(),
                           path=PATHS[path], checksum=checksum, label=label,
                           priority=PRIORITIES[priority], require_transport=require,
                           durable=durable)
    if prepared is not None:
        if blocks is not None or segments is not None:
            raise ValueError("give blocks, segments or prepared, not two of them")
        spec.prepared_pieces = prepared_id(prepared)
    _set_pieces(spec, blocks, block_size, segments)
    if notify is not None:
        spec.notify = notify.encode() if isinstance(notify, str) else bytes(notify)
    return spec


def kv_specs(source_layers: Sequence[RangeLike], destination_layers: Sequence[RangeLike],
             source_blocks: Any = None, destination_blocks: Any = None,
             block_size: Optional[int] = None, *, source_stride: int = 0,
             destination_stride: int = 0, prepared: Optional[PreparedLike] = None,
             path: str = "auto", checksum: bool = False, notify: Optional[bytes] = None,
             label: str = "", priority: str = "normal") -> list:
    """KV-cache shaped moves: one vectored spec per layer region, source_layers[i] ->
    destination_layers[i], each moving the same blocks (block source_blocks[j] of the
    source layer to block destination_blocks[j] of the destination layer; numpy arrays
    welcome, encoded once for every layer), or the pieces of `prepared` (a list kept by
    Client.prepare: each spec then carries only its id). `notify` goes with the last
    layer's spec only: it is published once that layer's bytes are in (submit the specs
    together and their notifications say the request's KV is complete when the last one
    arrives)."""
    if len(source_layers) != len(destination_layers):
        raise ValueError(f"{len(source_layers)} source layers but "
                         f"{len(destination_layers)} destination layers")
    if not source_layers:
        raise ValueError("no layers")
    blocks = None
    if prepared is None:
        if source_blocks is None or destination_blocks is None or block_size is None:
            raise ValueError("give source_blocks, destination_blocks and block_size, or prepared")
        blocks = block_list(block_size, source_blocks, destination_blocks,
                            source_stride=source_stride, destination_stride=destination_stride)
    elif source_blocks is not None or destination_blocks is not None:
        raise ValueError("give blocks or prepared, not both")
    last = len(source_layers) - 1
    return [transfer_spec(s, d, blocks=blocks, prepared=prepared, path=path, checksum=checksum,
                          label=label, notify=notify if i == last else None, priority=priority)
            for i, (s, d) in enumerate(zip(source_layers, destination_layers))]
