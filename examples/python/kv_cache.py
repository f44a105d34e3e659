"""KV-cache style block transfer: a prefill node's per-layer KV regions, a decode node's,
and a request whose blocks sit at different block ids on each side. One Submit carries one
vectored spec per layer (block ids as numpy arrays, no loop per block), the last one with
a notification that tells the decode side the request's KV is in. With --prepared, the
request's block list is prepared once on the prefill node and every layer's spec names it
(a Submit of ids instead of one list per layer; on a GPU the layers after the first reuse
its kernel descriptors).

    python3 kv_cache.py PREFILL_ADDR DECODE_ADDR [--layers 8] [--blocks 512] [--block 16KiB]
                        [--prepared]"""
import argparse
import logging
import time

import numpy as np

import gpumove

log = logging.getLogger("kv_cache")


def run(prefill: str, decode: str, layers: int = 8, blocks_per_layer: int = 512,
        block: int = 16 << 10, request_blocks: int = 128, kind: str = "host",
        prepared: bool = False) -> float:
    rng = np.random.default_rng(0)
    with gpumove.Client(prefill) as p, gpumove.Client(decode) as d:
        region = blocks_per_layer * block
        src = [p.allocate(region, kind=kind, label=f"prefill layer {i}") for i in range(layers)]
        dst = [d.allocate(region, kind=kind, label=f"decode layer {i}") for i in range(layers)]
        for i, s in enumerate(src):
            p.write(s, np.full(region, i + 1, dtype=np.uint8))
        for x in dst:
            d.write(x, np.zeros(region, dtype=np.uint8))
        # The request's blocks: scattered ids on the prefill side, others on the decode side.
        src_ids = rng.choice(blocks_per_layer, request_blocks, replace=False)
        dst_ids = rng.choice(blocks_per_layer, request_blocks, replace=False)
        with d.notifications([dst[-1]]) as ready:
            t0 = time.perf_counter()
            # One Submit: a vectored move per layer, the last one notifying the decode side.
            if prepared:
                kept = p.prepare(blocks=(src_ids, dst_ids), block_size=block, label="request 42")
                p.move_kv(src, dst, prepared=kept, notify=b"request 42 ready", timeout=60)
                p.release_pieces(kept)
            else:
                p.move_kv(src, dst, src_ids, dst_ids, block, notify=b"request 42 ready",
                          timeout=60)
            note = next(iter(ready))
            seconds = time.perf_counter() - t0
        assert note.notify == b"request 42 ready"
        for i in range(layers):
            got = np.frombuffer(d.read(dst[i]), dtype=np.uint8).reshape(blocks_per_layer, block)
            assert (got[dst_ids] == i + 1).all(), f"layer {i}: blocks missing"
            others = np.setdiff1d(np.arange(blocks_per_layer), dst_ids)
            assert (got[others] == 0).all(), f"layer {i}: bytes outside the blocks changed"
        moved = layers * request_blocks * block
        log.info("%d layers x %d blocks of %d bytes (%d MiB) in %.1f ms: %.2f GB/s",
                 layers, request_blocks, block, moved >> 20, seconds * 1e3, moved / seconds / 1e9)
        for s in src:
            p.release(s)
        for x in dst:
            d.release(x)
        return moved / seconds


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prefill")
    p.add_argument("decode")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--block", type=int, default=16 << 10)
    p.add_argument("--kind", default="host", choices=["host", "pinned", "device"])
    p.add_argument("--prepared", action="store_true",
                   help="prepare the request's block list once; each layer names it")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run(args.prefill, args.decode, args.layers, args.blocks, args.block, kind=args.kind,
        prepared=args.prepared)
