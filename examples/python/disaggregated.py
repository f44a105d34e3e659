"""Disaggregated prefill -> decode of a Llama-style model, its KV cache moved by gpumove
layer by layer (docs/kv-cache.md).

This process is the prefill side (and the driver); a second process (spawned) is the decode
side, each with its own gpumove client (PREFILL_ADDR and DECODE_ADDR: two daemons, or the
same daemon twice). For each batch of prompts the decode side allocates blocks from its
pool (a block allocator; released blocks are reused) and sends its block tables; prefill
runs the prompts, writes each layer's K and V into its paged pool and pushes the layer as
soon as it is computed (one vectored move per layer naming a prepared block list, a
notification per layer); decode waits for each layer, rebuilds the cache from its pool and
generates greedily. The tokens are compared with the same model generating in this
process.

    python3 disaggregated.py PREFILL_ADDR [DECODE_ADDR] [--device cuda] [--size gpu]
        [--prompts 5,16,37] [--steps 8] [--modes layerwise,whole] [--repeat 5]

Prints "tokens matched" per batch, and for each mode the medians of the per-layer move
time (the daemon's), the whole push, save_layer's cost on the compute thread, the sender's
spec + Submit per layer, and the time to the first decode token (TTFT)."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional

import numpy as np
import torch
import torch.multiprocessing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpumove  # noqa: E402
import kv_connector as kvc  # noqa: E402
import kv_models  # noqa: E402

log = logging.getLogger("disaggregated")


@dataclasses.dataclass
class Setup:
    """What both processes build the same way."""
    size: str = "ci"
    model: str = "auto"
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    block_size: int = 16
    num_blocks: int = 64
    timeout: float = 30.0  # seconds any one wait may take

    def shape(self) -> kv_models.Shape:
        return kv_models.SHAPES[self.size]

    def torch_dtype(self):
        return getattr(torch, self.dtype)

    def build_model(self):
        return kv_models.build(self.model, self.shape(), self.device, self.torch_dtype(),
                               self.seed)

    def pool(self, client, name):
        s = self.shape()
        return kvc.KVPool(client, s.layers, self.num_blocks, self.block_size, s.kv_heads,
                          s.head_dim, self.torch_dtype(), self.device, name)


def _recv(conn, timeout: float):
    if not conn.poll(timeout):
        raise TimeoutError(f"no message in {timeout} s")
    return conn.recv()


def decode_worker(conn, addr: str, setup: Setup) -> None:
    """The decode process: its pool, allocator and connector; a batch at a time."""
    logging.basicConfig(level=logging.INFO, format="decode: %(message)s")
    torch.set_num_threads(1)
    model = setup.build_model()
    with gpumove.Client(addr) as client:
        pool = setup.pool(client, "decode")
        allocator = kvc.BlockAllocator(setup.num_blocks)
        dc = kvc.DecodeConnector(client, pool)
        conn.send(("ready", [b.ref() for b in pool.buffers]))
        try:
            while True:
                msg = _recv(conn, 3600)
                if msg[0] == "stop":
                    break
                if msg[0] == "floor":  # The prefill pool's layer 0, opened by CUDA IPC.
                    _, src, table = msg
                    conn.send(("floor", copy_floors(src, pool.tensors[0], table, table)))
                    del src
                    continue
                _, batch, lengths, steps = msg
                tables = [allocator.allocate(kvc.blocks_for(n, setup.block_size))
                          for n in lengths]
                dc.start_load(batch, tables)
                conn.send(("tables", tables))
                try:
                    result = receive(conn, model, pool, dc, batch, tables, lengths, steps,
                                     setup.timeout)
                finally:
                    dc.finish(batch)
                    allocator.release([b for t in tables for b in t])
                result["tables"] = tables
                conn.send(("result", result))
        finally:
            dc.close()
            pool.close()


def receive(conn, model, pool, dc, batch, tables, lengths, steps, timeout) -> dict:
    """Waits for each layer and rebuilds each request's cache from the pool; then, once the
    prefill side sends the first tokens, generates `steps` tokens per request, step by
    step across the batch."""
    layers = pool.layers
    kv: List[list] = [[] for _ in tables]
    error = ""
    waits = []
    indices = [pool.index(t) for t in tables]
    try:
        for layer in range(layers):
            t0 = time.perf_counter()
            dc.wait_for_layer(batch, layer, timeout)
            waits.append(time.perf_counter() - t0)
            for r, idx in enumerate(indices):
                kv[r].append(pool.gather(layer, idx, lengths[r]))
    except kvc.LayerFailed as e:
        error = str(e)
    _, got_batch, firsts, t0, ok = _recv(conn, timeout * 2)
    assert got_batch == batch
    if error or not ok:
        return {"ok": False, "error": error or "the prefill side failed"}
    states = [model.start(kv[r]) for r in range(len(tables))]
    tokens = [[f] for f in firsts]
    ttft = []
    for s in range(steps):
        for r, state in enumerate(states):
            tokens[r].append(model.step(state, tokens[r][-1]))
            if s == 0:
                ttft.append(time.perf_counter() - t0)
    return {"ok": True, "tokens": tokens, "ttft": ttft, "layer_waits": waits}


class Decode:
    """The decode process, seen from the driver."""

    def __init__(self, addr: str, setup: Setup, wait: bool = True):
        # torch's context: CUDA tensors sent through its pipes travel as CUDA IPC handles.
        ctx = torch.multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=decode_worker, args=(child, addr, setup), daemon=True)
        self.proc.start()
        self.timeout = setup.timeout
        self.layers = None
        if wait:
            self.ready()

    def ready(self) -> None:
        """Waits until the decode side has its model, pool and notification stream (a
        large model is built in both processes at once meanwhile)."""
        if self.layers is None:
            _, self.layers = _recv(self.conn, 600)

    def stop(self) -> None:
        try:
            self.conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=20)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Prefill:
    """The prefill side: the model, its pool, allocator and connector."""

    def __init__(self, addr: str, setup: Setup, decode: Decode, model=None):
        self.setup = setup
        self.model = model or setup.build_model()
        self.client = gpumove.Client(addr)
        self.pool = setup.pool(self.client, "prefill")
        self.allocator = kvc.BlockAllocator(setup.num_blocks)
        self.decode = decode
        self.connector = kvc.PrefillConnector(self.client, self.pool, decode.layers,
                                              setup.num_blocks, timeout=setup.timeout)
        self.batches = 0

    def run(self, prompts: List[List[int]], steps: int, layerwise: bool = True,
            after_save: Optional[Callable[[int], None]] = None) -> dict:
        """One batch: returns the decode side's result (tokens, ttft, tables) with the push's
        SaveResult as "save". `after_save(layer)` runs after each save_layer (tests)."""
        self.batches += 1
        batch = f"b{self.batches}"
        lengths = [len(p) for p in prompts]
        self.decode.conn.send(("batch", batch, lengths, steps))
        _, dst = _recv(self.decode.conn, self.setup.timeout)
        src = [self.allocator.allocate(kvc.blocks_for(n, self.setup.block_size))
               for n in lengths]
        pc = self.connector
        pc.layerwise = layerwise
        try:
            pc.begin(batch, src, dst)
            indices = [self.pool.index(t) for t in src]
            if self.pool.mapped:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            firsts = []
            for r, ids in enumerate(prompts):
                last = r == len(prompts) - 1

                def on_layer(i, k, v, r=r, last=last):
                    self.pool.scatter(i, indices[r], k, v)
                    if last:
                        pc.save_layer(i)
                        if after_save is not None:
                            after_save(i)
                first, _ = self.model.prefill(ids, on_layer)
                firsts.append(first)
            saved = pc.finish()
        except gpumove.Error as e:  # begin's prepare: the prefill daemon refused.
            saved = kvc.SaveResult(batch, False, error=str(e))
            t0, firsts = time.perf_counter(), [0] * len(prompts)
        finally:
            self.allocator.release([b for t in src for b in t])
        try:
            self.decode.conn.send(("first", batch, firsts, t0, saved.ok))
            result = _recv(self.decode.conn, self.setup.timeout * 3)[1]
        except (OSError, EOFError, TimeoutError) as e:  # The decode process is gone.
            result = {"ok": False, "error": f"decode process: {e!r}"}
        result["save"] = saved
        result["ok"] = result["ok"] and saved.ok
        return result

    def close(self) -> None:
        self.connector.close()
        self.pool.close()
        self.client.close()


class Daemons:
    """gpumoved processes this example starts (--gpumoved): "prefill" and, unless one
    daemon serves both, "decode" joining it; on 127.0.0.1, stopped with SIGTERM."""

    def __init__(self, binary: str, one: bool, flags: List[str]):
        self.dir = tempfile.mkdtemp(prefix="gpumove-kv-")
        self.procs: List[subprocess.Popen] = []
        self.addrs: List[str] = []
        try:
            for name in (["prefill"] if one else ["prefill", "decode"]):
                port_file = os.path.join(self.dir, name)
                args = [binary, f"--node={name}", "--listen=127.0.0.1:0",
                        f"--port_file={port_file}", *flags]
                if self.addrs:
                    args.append(f"--peers={self.addrs[0]}")
                with open(os.path.join(self.dir, f"{name}.log"), "wb") as out:
                    self.procs.append(subprocess.Popen(args, stdout=out,
                                                       stderr=subprocess.STDOUT))
                deadline = time.monotonic() + 60
                while not (os.path.exists(port_file) and open(port_file).read().strip()):
                    if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"gpumoved {name} did not start (see {self.dir})")
                    time.sleep(0.05)
                self.addrs.append(open(port_file).read().strip())
            if not one:
                with gpumove.Client(self.addrs[0]) as c:
                    deadline = time.monotonic() + 30
                    while not any(p.up for p in c.peers()):
                        if time.monotonic() > deadline:
                            raise RuntimeError("the decode daemon did not join")
                        time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def copy_floors(src: torch.Tensor, dst: torch.Tensor, src_ids: List[int], dst_ids: List[int],
                repeat: int = 20) -> tuple:
    """Seconds (medians) of the raw copies a layer's move is held against, src and dst
    being one layer's pool tensors (2, blocks, ...): (gather: the blocks' K and V copied
    with index_select + index_copy_, one contiguous copy of the same bytes). On a GPU,
    synchronized around each; src may be another process's tensor (CUDA IPC)."""
    cuda = src.device.type == "cuda"
    s_idx = torch.tensor(src_ids, device=src.device)
    d_idx = torch.tensor(dst_ids, device=dst.device)
    n = 2 * len(src_ids) * src[0, 0].numel() * src.element_size()
    flat_src, flat_dst = src.view(-1).view(torch.uint8), dst.view(-1).view(torch.uint8)
    out = []
    for copy in (lambda: [dst[w].index_copy_(0, d_idx, src[w].index_select(0, s_idx))
                          for w in (0, 1)],
                 lambda: flat_dst[:n].copy_(flat_src[:n])):
        times = []
        for _ in range(repeat):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            copy()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out.append(median(times))
    return tuple(out)


def floors(prefill: "Prefill", table: List[int]) -> None:
    """Logs the floors of one layer's move of `table`'s blocks: in this process, and on a
    GPU from the decode process reading this process's pool through CUDA IPC."""
    scratch = torch.empty_like(prefill.pool.tensors[0])
    gather, copy = copy_floors(prefill.pool.tensors[0], scratch, table, table)
    log.info("floor, one layer's %d blocks in this process: gather %.3f ms, one copy of "
             "the bytes %.3f ms", len(table), gather * 1e3, copy * 1e3)
    if not prefill.pool.mapped:
        return
    conn = prefill.decode.conn
    conn.send(("floor", prefill.pool.tensors[0], table))
    gather, copy = _recv(conn, prefill.setup.timeout * 3)[1]
    log.info("floor, decode process reading prefill's pool (CUDA IPC): gather %.3f ms, one "
             "copy of the bytes %.3f ms", gather * 1e3, copy * 1e3)


def prompts_of(lengths: List[int], vocab: int, seed: int) -> List[List[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def check(prefill: Prefill, prompts, steps, result) -> int:
    """Compares the decode side's tokens with the reference (this process); returns the
    tokens compared. Raises AssertionError on a difference."""
    assert result["ok"], result.get("error") or result["save"].error
    n = 0
    for r, ids in enumerate(prompts):
        want = kv_models.generate(prefill.model, ids, steps)
        got = result["tokens"][r]
        assert got == want, f"prompt {r} ({len(ids)} tokens): decode {got} != reference {want}"
        n += len(got)
    return n


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def report(mode: str, results: List[dict]) -> str:
    """One line of medians over the batches of a mode."""
    saves = [r["save"] for r in results]

    def every(field):
        return median([x for s in saves for x in getattr(s, field)])
    line = (f"{mode}: per-layer move {every('layer_seconds') * 1e3:.3f} ms, "
            f"whole push {median([s.push_seconds for s in saves]) * 1e3:.2f} ms, "
            f"save_layer {every('save_us'):.1f} us, "
            f"spec+Submit {every('submit_us'):.0f} us per layer "
            f"({median([s.submits for s in saves]):.0f} Submits a batch)")
    if any(s.stage_us for s in saves):
        line += f", CPU staging {every('stage_us'):.0f} us per layer"
    return line + f", TTFT {median([t for r in results for t in r['ttft']]) * 1e3:.2f} ms"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prefill", nargs="?", help="the prefill side's daemon")
    p.add_argument("decode", nargs="?", help="the decode side's daemon (default: PREFILL)")
    p.add_argument("--gpumoved", help="start the daemons: this binary (instead of addresses)")
    p.add_argument("--one-daemon", action="store_true",
                   help="with --gpumoved: one daemon serves both sides")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 else")
    p.add_argument("--size", default="ci", choices=sorted(kv_models.SHAPES))
    p.add_argument("--model", default="auto", choices=["auto", "hf", "tiny"])
    p.add_argument("--prompts", default="5,16,37", help="prompt lengths, comma separated")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--modes", default="layerwise,whole")
    p.add_argument("--repeat", type=int, default=3, help="batches per mode, for medians")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.prefill and not args.gpumoved:
        p.error("give the daemons' addresses or --gpumoved")
    daemons = None
    if args.gpumoved:
        daemons = Daemons(args.gpumoved, args.one_daemon, [])
        args.prefill, args.decode = daemons.addrs[0], daemons.addrs[-1]
    try:
        return run_main(args)
    finally:
        if daemons is not None:
            daemons.stop()


def run_main(args) -> int:
    lengths = [int(x) for x in args.prompts.split(",")]
    blocks = sum(kvc.blocks_for(n, args.block_size) for n in lengths)
    setup = Setup(size=args.size, model=args.model, device=args.device, seed=args.seed,
                  dtype=args.dtype or ("bfloat16" if args.device.startswith("cuda")
                                       else "float32"),
                  block_size=args.block_size, num_blocks=2 * blocks + 8)
    if setup.model == "auto":
        setup.model = "hf" if kv_models.have_transformers() else "tiny"
    prompts = prompts_of(lengths, setup.shape().vocab, args.seed)
    log.info("model %s (%s), %s %s, prompts %s, block size %d, pool %d blocks", setup.model,
             setup.size, setup.device, setup.dtype, lengths, setup.block_size,
             setup.num_blocks)
    decode = Decode(args.decode or args.prefill, setup, wait=False)
    model = setup.build_model()
    decode.ready()
    prefill = Prefill(args.prefill, setup, decode, model=model)
    try:
        # Each prompt alone, then all of them as one batch (their own block tables, one
        # move per layer), then the timed batches of each mode.
        for ids in prompts + [None]:
            batch = [ids] if ids is not None else prompts
            n = check(prefill, batch, args.steps, prefill.run(batch, args.steps))
            log.info("tokens matched: %d prompt(s) of %s tokens, %d tokens", len(batch),
                     [len(x) for x in batch], n)
        for mode in args.modes.split(","):
            results = []
            for _ in range(args.repeat):
                r = prefill.run(prompts[-1:], 1, layerwise=(mode == "layerwise"))
                check(prefill, prompts[-1:], 1, r)
                results.append(r)
            log.info("%s", report(mode, results))
        floors(prefill, list(range(kvc.blocks_for(lengths[-1], setup.block_size))))
    finally:
        prefill.close()
        decode.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
