"""A data pipeline across two nodes: a producer writes numpy batches into a buffer on node
A, gpumove moves each batch to node B with a notification, and a consumer on B reads a
batch the moment it is notified (the notification comes only once the bytes are there).

    python3 pipeline.py NODE_A_ADDR NODE_B_ADDR [--batches N] [--torch]

With --torch the batches are torch tensors. On a GPU machine (both daemons on this host)
they are CUDA tensors, tensor-native end to end: each batch tensor is lent to node A
(register, CUDA IPC, no copy), moved GPU -> GPU into node B's device inbox, and the
consumer maps the inbox (open) and checks the batch as a torch tensor in place. Without a
GPU the torch tensors' bytes are written through the client. --progress draws each move's
progress (tqdm when installed)."""
import argparse
import logging
import threading

import numpy as np

import gpumove

log = logging.getLogger("pipeline")


def run(addr_a: str, addr_b: str, batches: int = 8, rows: int = 1024, cols: int = 256,
        use_torch: bool = False, progress: bool = False) -> int:
    nbytes = rows * cols * 4
    kind = "host"
    cuda = False
    if use_torch:
        import torch
        cuda = torch.cuda.is_available()
        kind = "device" if cuda else "host"
    if cuda:
        return run_cuda(addr_a, addr_b, batches, rows, cols, progress)
    with gpumove.Client(addr_a) as a, gpumove.Client(addr_b) as b:
        node_b = b.info().node
        staging = a.allocate(nbytes * batches, kind=kind, label="producer")
        inbox = b.allocate(nbytes * batches, kind=kind, label="consumer")
        received = []
        stream = b.notifications([inbox])  # Subscribed before anything moves.

        def consume():
            for n in stream:
                i = int(n.notify.decode().split()[1])
                batch = np.empty((rows, cols), dtype=np.float32)
                b.read(inbox, offset=i * nbytes, out=batch)
                assert (batch == i).all(), f"batch {i} was not all there when notified"
                received.append(i)
                log.info("batch %d arrived (%s, sequence %d)", i, n.transfer_id, n.sequence)
                if len(received) == batches:
                    return

        consumer = threading.Thread(target=consume)
        consumer.start()
        moves = []
        for i in range(batches):
            data = np.full((rows, cols), i, dtype=np.float32)
            if use_torch:
                import torch
                data = torch.from_numpy(data).numpy()  # What a torch producer hands over.
            a.write(staging, data, offset=i * nbytes)
            moves.append(a.move(staging[i * nbytes:(i + 1) * nbytes],
                                inbox.ref(i * nbytes), notify=f"batch {i}", wait=False))
        for t in moves:
            a.wait(t, timeout=60).raise_for_state()
        consumer.join(timeout=60)
        stream.cancel()
        a.release(staging)
        b.release(inbox)
        log.info("%d batches of %d bytes moved to %s", len(received), nbytes, node_b)
        return len(received)


def run_cuda(addr_a: str, addr_b: str, batches: int, rows: int, cols: int,
             progress: bool) -> int:
    """The tensor-native way (same host, GPUs): producer tensors lent, moved GPU -> GPU,
    the consumer's view a torch tensor over node B's device buffer."""
    import torch
    nbytes = rows * cols * 4
    with gpumove.Client(addr_a) as a, gpumove.Client(addr_b) as b:
        inbox = b.allocate(nbytes * batches, kind="device", label="consumer",
                           exportable=True)  # Its own allocation: open() maps it.
        view = b.open(inbox)  # Node B's device buffer, mapped here.
        inbox_t = torch.as_tensor(view, device="cuda").view(torch.float32).view(batches, rows, cols)
        received = []
        stream = b.notifications([inbox])

        def consume():
            for n in stream:
                i = int(n.notify.decode().split()[1])
                torch.cuda.synchronize()
                assert bool((inbox_t[i] == i).all()), f"batch {i} was not all there when notified"
                received.append(i)
                log.info("batch %d arrived on the GPU (%s)", i, n.transfer_id)
                if len(received) == batches:
                    return

        consumer = threading.Thread(target=consume)
        consumer.start()
        for i in range(batches):
            batch = torch.full((rows, cols), float(i), device="cuda")  # Made on the GPU.
            torch.cuda.synchronize()
            lent = a.register(batch, label=f"batch {i}")  # No copy: CUDA IPC.
            a.move(lent, inbox.ref(i * nbytes), notify=f"batch {i}", progress=progress)
            a.release(lent)  # The move is done: the tensor is ours again.
        consumer.join(timeout=60)
        stream.cancel()
        del inbox_t
        view.close()
        b.release(inbox)
        log.info("%d CUDA batches of %d bytes moved GPU -> GPU", len(received), nbytes)
        return len(received)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("node_a")
    p.add_argument("node_b")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--torch", action="store_true")
    p.add_argument("--progress", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    got = run(args.node_a, args.node_b, args.batches, use_torch=args.torch,
              progress=args.progress)
    raise SystemExit(0 if got == args.batches else 1)
