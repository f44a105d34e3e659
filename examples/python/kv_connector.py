"""A KV-cache connector over gpumove, shaped like vLLM's KVConnectorBase_V1 worker hooks:
the prefill side saves each layer as soon as it is computed (save_layer ~ save_kv_layer),
then finish() (~ wait_for_save) waits for the moves; the decode side waits for each layer
(wait_for_layer ~ wait_for_layer_load) before it reads it.

The cache is a paged block pool per layer in vLLM's FlashAttention layout,
(2, num_blocks, block_size, num_kv_heads, head_dim): K's blocks, then V's; a request owns
the blocks of its block table. Each pool lives in gpumove buffers: on a GPU the pool's
tensors are lent to the daemon (Client.register, CUDA IPC: the daemon moves straight from
and into them); on the CPU the daemon's host buffers cannot be mapped, so the pool is a
torch tensor in the process and the blocks that move are written to (prefill) or read
from (decode) the daemon's buffer around each move.

A batch of requests is one prepared block list (Client.prepare, kept on the prefill
node): K and V blocks of every request, source ids on the prefill pool, destination ids
on the decode pool. Each layer is one vectored move naming that list, notifying the
decode side with b"<batch> <layer>"."""
from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

import gpumove

log = logging.getLogger("kv_connector")


class BlockAllocator:
    """Fixed-size blocks of one pool: the most recently released are handed out first (so
    a released block is reused at once), a block is never handed out twice."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self._used: set = set()

    def allocate(self, n: int) -> List[int]:
        if n > len(self._free):
            raise RuntimeError(f"{n} blocks wanted, {len(self._free)} of "
                               f"{self.num_blocks} free")
        ids = [self._free.pop() for _ in range(n)]
        self._used.update(ids)
        return ids

    def release(self, ids: Sequence[int]) -> None:
        """Gives blocks back (checked all first: a bad list changes nothing)."""
        bad = [b for b in ids if b not in self._used]
        if bad or len(set(ids)) != len(ids):
            raise RuntimeError(f"blocks {bad or ids} released but not allocated (or twice)")
        for b in reversed(ids):  # Handed out again in the same order.
            self._used.remove(b)
            self._free.append(b)

    @property
    def free(self) -> int:
        return len(self._free)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def runs(ids: Sequence[int]):
    """(first, count) of each run of consecutive ids, in order."""
    out: list = []
    for b in ids:
        if out and out[-1][0] + out[-1][1] == b:
            out[-1][1] += 1
        else:
            out.append([b, 1])
    return [(s, n) for s, n in out]


class KVPool:
    """One side's paged KV cache: a tensor per layer and the gpumove buffer behind it."""

    def __init__(self, client: gpumove.Client, layers: int, num_blocks: int,
                 block_size: int, kv_heads: int, head_dim: int, dtype, device, name: str):
        self.client, self.layers = client, layers
        self.num_blocks, self.block_size = num_blocks, block_size
        self.device = torch.device(device)
        shape = (2, num_blocks, block_size, kv_heads, head_dim)
        self.tensors = [torch.zeros(shape, dtype=dtype, device=self.device)
                        for _ in range(layers)]
        self.block_bytes = block_size * kv_heads * head_dim * self.tensors[0].element_size()
        self.mapped = self.device.type == "cuda"
        if self.mapped:
            # Lent as bytes: torch's __cuda_array_interface__ has no bfloat16.
            self.buffers = [client.register(t.view(torch.uint8), label=f"{name} kv layer {i}")
                            for i, t in enumerate(self.tensors)]
        else:
            size = 2 * num_blocks * self.block_bytes
            self.buffers = [client.allocate(size, label=f"{name} kv layer {i}")
                            for i in range(layers)]

    def index(self, table) -> torch.Tensor:
        """A block table as an index tensor on the pool's device (make it once per request:
        from a list it is a copy to the device each time)."""
        if torch.is_tensor(table):
            return table
        return torch.tensor(list(table), dtype=torch.long, device=self.device)

    def scatter(self, layer: int, table, k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes a request's K and V, (tokens, kv_heads, head_dim), into its blocks
        (`table`: block ids, a list or index())."""
        idx = self.index(table)
        n, bs = idx.numel(), self.block_size
        for which, x in ((0, k), (1, v)):
            padded = x.new_zeros((n * bs,) + tuple(x.shape[1:]))
            padded[:x.shape[0]] = x
            self.tensors[layer][which].index_copy_(0, idx, padded.view(n, bs, *x.shape[1:]))

    def gather(self, layer: int, table, tokens: int):
        """A request's K and V of one layer, (tokens, kv_heads, head_dim) each."""
        idx = self.index(table)
        t = self.tensors[layer]
        k = t[0].index_select(0, idx).flatten(0, 1)[:tokens]
        v = t[1].index_select(0, idx).flatten(0, 1)[:tokens]
        return k, v

    def _pieces(self, layer: int, ids: Sequence[int]):
        """(byte offset in the layer's buffer, its bytes in the tensor) of each run of
        consecutive blocks of `ids`, K's then V's."""
        for which in (0, 1):
            for first, count in runs(ids):
                yield ((which * self.num_blocks + first) * self.block_bytes,
                       self.tensors[layer][which, first:first + count].view(torch.uint8).numpy())

    def write_blocks(self, layer: int, ids: Sequence[int]) -> None:
        """CPU pools: the blocks' bytes into the daemon's buffer (one Write per run)."""
        if not self.mapped:
            for offset, data in self._pieces(layer, ids):
                self.client.write(self.buffers[layer], data, offset=offset)

    def read_blocks(self, layer: int, ids: Sequence[int]) -> None:
        """CPU pools: the blocks' bytes from the daemon's buffer (one Read per run)."""
        if not self.mapped:
            for offset, out in self._pieces(layer, ids):
                self.client.read(self.buffers[layer], offset=offset, length=out.size, out=out)

    def kv_block_ids(self, ids: Sequence[int]) -> np.ndarray:
        """The pool's block indices (block_bytes each) of K and V of `ids`."""
        a = np.asarray(ids, dtype=np.int64)
        return np.concatenate([a, a + self.num_blocks])

    def close(self) -> None:
        for b in self.buffers:
            try:
                self.client.release(b)
            except gpumove.Error as e:
                log.info("releasing %s: %s", b.id, e.code.name)


@dataclasses.dataclass
class SaveResult:
    """How a batch's push went: ok, or the first error; per-layer times."""
    batch: str
    ok: bool
    error: str = ""
    layer_seconds: List[float] = dataclasses.field(default_factory=list)  # daemon, per move
    save_us: List[float] = dataclasses.field(default_factory=list)  # save_layer's own cost
    submit_us: List[float] = dataclasses.field(default_factory=list)  # spec + Submit call
    stage_us: List[float] = dataclasses.field(default_factory=list)  # CPU: writes to daemon
    push_seconds: float = 0.0  # first save_layer to the last move's end
    moved_blocks: int = 0  # block moves of the batch (K and V counted apart, all layers)
    submits: int = 0  # Submit calls that carried the layers


class PrefillConnector:
    """The prefill side. begin() a batch with its block tables on both sides, save_layer(i)
    once layer i of every request is in the pool, finish() for the outcome.

    `remote_layers`: the decode pool's buffers, one per layer (Buffers or "node/id").
    `layerwise`: push each layer as it is saved (else the whole cache in finish()).
    `timeout`: seconds finish() waits for the moves at most (a dead peer fails them
    within the daemon's --peer_timeout, well before)."""

    def __init__(self, client: gpumove.Client, pool: KVPool, remote_layers: Sequence,
                 remote_num_blocks: int, layerwise: bool = True, timeout: float = 30.0):
        if len(remote_layers) != pool.layers:
            raise ValueError(f"{len(remote_layers)} remote layers for {pool.layers}")
        self.client, self.pool, self.remote = client, pool, list(remote_layers)
        self.remote_num_blocks = remote_num_blocks
        self.layerwise, self.timeout = layerwise, timeout
        self._jobs: "queue.Queue" = queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name="kv-sender")
        self._sender.start()
        self._batch: Optional[dict] = None
        # One CUDA event a layer, made once and recorded again each batch (finish() waits
        # for the sender, so a batch's events are all consumed before the next records
        # them): save_layer then only records one and queues the layer.
        self._events = ([torch.cuda.Event() for _ in range(pool.layers)] if pool.mapped
                        else None)

    def begin(self, batch: str, src_tables: Sequence[Sequence[int]],
              dst_tables: Sequence[Sequence[int]]) -> None:
        if self._batch is not None:
            raise RuntimeError(f"batch {self._batch['id']} is not finished")
        if len(src_tables) != len(dst_tables):
            raise ValueError("one source and one destination table per request")
        src = [b for t in src_tables for b in t]
        dst = [b for t in dst_tables for b in t]
        if len(src) != len(dst) or any(len(s) != len(d) for s, d in zip(src_tables,
                                                                           dst_tables)):
            raise ValueError("each request has as many blocks on both sides")
        if len(set(dst)) != len(dst) or len(set(src)) != len(src):
            raise ValueError("a block appears twice in the batch: it would move twice")
        if max(dst) >= self.remote_num_blocks or max(src) >= self.pool.num_blocks:
            raise ValueError("a block id past its pool")
        dst_ids = np.concatenate([np.asarray(dst), np.asarray(dst) + self.remote_num_blocks])
        prepared = self.client.prepare(blocks=(self.pool.kv_block_ids(src), dst_ids),
                                       block_size=self.pool.block_bytes,
                                       label=f"kv batch {batch}")
        self._batch = {"id": batch, "src": src, "prepared": prepared, "saved": set(),
                       "result": SaveResult(batch, True, moved_blocks=0), "transfers": [],
                       "first_wall": None}

    def save_layer(self, layer: int) -> None:
        """Layer `layer` of every request of the batch is in the pool: push it (layer-wise)
        or keep it for finish(). Cheap on the caller's thread: on a GPU an event is recorded
        and the move is submitted by the sender thread once the event has passed."""
        t0 = time.perf_counter()
        b = self._batch
        if b is None or layer in b["saved"] or not 0 <= layer < self.pool.layers:
            raise ValueError(f"layer {layer} saved twice, out of range or outside a batch")
        b["saved"].add(layer)
        if b["first_wall"] is None:
            b["first_wall"] = time.time()  # The daemon's times are wall clock too.
        event = None
        if self._events is not None:
            event = self._events[layer]
            event.record()
        if self.layerwise:
            self._jobs.put((b, [layer], event))
        else:
            b.setdefault("held", []).append((layer, event))
        b["result"].save_us.append((time.perf_counter() - t0) * 1e6)

    def finish(self) -> SaveResult:
        """Waits for the batch's moves (at most `timeout` seconds); the prepared list is
        let go. The result says whether every layer arrived."""
        b, self._batch = self._batch, None
        if b is None:
            raise RuntimeError("finish() without begin()")
        r = b["result"]
        if len(b["saved"]) != self.pool.layers:
            r.ok, r.error = False, f"only {len(b['saved'])} of {self.pool.layers} layers saved"
        if not self.layerwise and b.get("held"):
            for _, event in b["held"]:
                if event is not None:
                    event.synchronize()
            self._jobs.put((b, [layer for layer, _ in b["held"]], None))
        done = threading.Event()
        self._jobs.put(done)
        deadline = time.monotonic() + self.timeout
        if not done.wait(self.timeout):
            r.ok, r.error = False, r.error or "the sender did not finish in time"
        for t in b["transfers"]:
            left = max(0.1, deadline - time.monotonic())
            try:
                t = self.client.wait(t, timeout=left)
            except gpumove.Error as e:
                r.ok, r.error = False, r.error or f"waiting for {t.id}: {e}"
                self._cancel(t)
                continue
            if not t.ok:
                r.ok = False
                r.error = r.error or f"{t.id} {t.state}: {t.error_code.name} {t.error_message}"
            else:
                r.layer_seconds.append(t.seconds or 0.0)
                r.moved_blocks += t.pieces
                if t.end_time is not None:
                    end = t.end_time.timestamp()
                    r.push_seconds = max(r.push_seconds, end - b["first_wall"])
        try:
            self.client.release_pieces(b["prepared"])
        except gpumove.Error as e:
            log.info("releasing the prepared list: %s", e.code.name)
        return r

    def submitted(self) -> list:
        """The moves of the current batch submitted so far (gpumove.Transfers, as
        submitted), in order."""
        b = self._batch
        return list(b["transfers"]) if b is not None else []

    def _cancel(self, t) -> None:
        try:
            self.client.cancel(t)
        except gpumove.Error:
            pass

    def _send_loop(self) -> None:
        """Sends what save_layer queued. Layers of a batch queued while a Submit was under
        way go together in the next Submit (still a move and a notification each), so a
        prefill that computes layers faster than a Submit returns does not fall behind."""
        while True:
            jobs = [self._jobs.get()]
            while len(jobs) < 1024:
                try:
                    jobs.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            group: list = []
            for job in jobs:
                if isinstance(job, tuple) and group and group[0][0] is job[0]:
                    group.append(job)
                    continue
                if group:
                    self._send(group)
                    group = []
                if job is None:
                    return
                if isinstance(job, threading.Event):
                    job.set()
                else:
                    group = [job]
            if group:
                self._send(group)

    def _send(self, group: list) -> None:
        """One Submit of the layers of `group`: (batch, layers, event) of one batch."""
        b = group[0][0]
        r = b["result"]
        if not r.ok and r.error:
            return  # A layer failed: the batch is failed, send no more of it.
        layers = [i for _, ls, _ in group for i in ls]
        try:
            for _, _, event in group:
                if event is not None:
                    event.synchronize()
            t0 = time.perf_counter()
            for layer in layers:
                self.pool.write_blocks(layer, b["src"])
            t1 = time.perf_counter()
            specs = [gpumove.spec(self.pool.buffers[i], self.remote[i],
                                  prepared=b["prepared"], priority="latency",
                                  notify=f"{b['id']} {i}".encode()) for i in layers]
            b["transfers"] += self.client.submit(specs)
            t2 = time.perf_counter()
            if not self.pool.mapped:
                r.stage_us.append((t1 - t0) * 1e6 / len(layers))
            r.submit_us.append((t2 - t1) * 1e6 / len(layers))
            r.submits += 1
        except gpumove.Error as e:
            r.ok, r.error = False, f"layers {layers}: {e}"

    def close(self) -> None:
        self._jobs.put(None)
        self._sender.join(timeout=self.timeout)


class LayerFailed(Exception):
    """A layer did not arrive in time, or could not be read (the daemon is gone)."""


class DecodeConnector:
    """The decode side: one notification stream over its pool's buffers (opened here, so
    open it before the prefill side starts pushing); wait_for_layer(batch, layer) returns
    once that layer's blocks are in the pool."""

    def __init__(self, client: gpumove.Client, pool: KVPool):
        self.client, self.pool = client, pool
        self._arrived: Dict[tuple, float] = {}
        self._error: Optional[str] = None
        self._cond = threading.Condition()
        self._tables: Dict[str, List[int]] = {}
        self._stream = client.notifications(pool.buffers)
        self._reader = threading.Thread(target=self._read, daemon=True, name="kv-notes")
        self._reader.start()

    def _read(self) -> None:
        try:
            for n in self._stream:
                batch, _, layer = n.notify.decode().rpartition(" ")
                with self._cond:
                    self._arrived[(batch, int(layer))] = time.perf_counter()
                    self._cond.notify_all()
            error = "the notification stream ended"
        except gpumove.Error as e:
            error = f"notifications: {e}"
        except ValueError as e:
            error = f"a notification not of this connector: {e}"
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def start_load(self, batch: str, tables: Sequence[Sequence[int]]) -> None:
        """The batch's blocks on this side (all its requests), read per layer on a CPU."""
        self._tables[batch] = [b for t in tables for b in t]

    def wait_for_layer(self, batch: str, layer: int, timeout: float = 30.0) -> float:
        """Returns once layer `layer` of `batch` is in the pool (its arrival time,
        perf_counter); raises LayerFailed after `timeout` seconds, or when the stream
        failed or the blocks cannot be read (the daemon is gone)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (batch, layer) not in self._arrived:
                left = deadline - time.monotonic()
                if self._error is not None:
                    raise LayerFailed(f"batch {batch} layer {layer}: {self._error}")
                if left <= 0:
                    raise LayerFailed(f"batch {batch} layer {layer}: not in {timeout} s")
                self._cond.wait(left)
            at = self._arrived.pop((batch, layer))
        try:
            self.pool.read_blocks(layer, self._tables[batch])
        except gpumove.Error as e:
            raise LayerFailed(f"batch {batch} layer {layer}: reading its blocks: {e}") from None
        return at

    def finish(self, batch: str) -> None:
        self._tables.pop(batch, None)
        with self._cond:
            for key in [k for k in self._arrived if k[0] == batch]:
                del self._arrived[key]

    def close(self) -> None:
        self._stream.close()
        self._reader.join(timeout=5)
