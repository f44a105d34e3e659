"""The Python client's CUDA calls on a GPU machine (torch, and cupy when there): run as
`python3 gpu_check.py` with gpumove importable and GPUMOVED set (deploy/gpu/run.sh
PARTS=python). Two daemons on GPU 0:
- register: a torch tensor that is a slice of a bigger allocation (the caching allocator's
  way) lent to daemon a, moved GPU -> GPU into daemon b's device buffer, read back;
- the lent buffer is gone once the lending process exits;
- open: daemon b's buffer mapped here, seen as a torch tensor (and a cupy array) with the
  moved values, written through the mapping and read back through the daemon;
- a vectored move of blocks from numpy indices between the daemons' device buffers.
Prints one line per check and "python gpu: N passed, M failed"."""
import os
import subprocess
import sys
import time

import numpy as np

import gpumove
from daemons import Daemon, await_peers

results = []


def check(name, fn):
    try:
        fn()
        results.append((name, None))
        print(f"[ OK ] {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
        results.append((name, e))
        print(f"[FAIL] {name}: {type(e).__name__}: {e}", flush=True)


def main():
    import torch
    assert torch.cuda.is_available(), "no CUDA device"
    a = Daemon("pa", "--device_pool_size=1GiB", "--host_pool_size=64MiB",
               "--pinned_pool_size=64MiB")
    b = Daemon("pb", "--device_pool_size=1GiB", "--host_pool_size=64MiB",
               "--pinned_pool_size=64MiB", join=a.address)
    ca, cb = gpumove.Client(a.address), gpumove.Client(b.address)
    try:
        await_peers(ca, 1)
        big = torch.arange(1 << 20, dtype=torch.int32, device="cuda")  # 4 MiB allocation...
        part = big[1000:1000 + (1 << 18)]  # ...and a tensor 4000 bytes into it.
        dst = cb.allocate(1 << 20, kind="device", exportable=True)  # open() maps it.
        state = {}

        def register_and_move():
            lent = ca.register(part, label="slice")
            assert lent.imported and lent.size == part.numel() * 4, lent
            state["lent"] = lent
            t = ca.move(lent, dst, checksum=True)
            assert t.ok and t.path in ("cuda_ipc", "ucx"), t
            got = np.frombuffer(cb.read(dst), dtype=np.int32)
            assert np.array_equal(got, np.arange(1000, 1000 + (1 << 18), dtype=np.int32))
        check("register a tensor slice and move it GPU -> GPU", register_and_move)

        def open_as_tensor():
            with cb.open(dst) as m:
                t = torch.as_tensor(m, device="cuda").view(torch.int32)
                assert t.shape[0] == 1 << 18
                assert int(t[0]) == 1000 and int(t[-1]) == 1000 + (1 << 18) - 1
                t.fill_(7)
                torch.cuda.synchronize()
            got = np.frombuffer(cb.read(dst), dtype=np.int32)
            assert (got == 7).all()
        check("open a daemon buffer as a torch tensor, write through it", open_as_tensor)

        def open_through_dlpack():
            with cb.open(dst) as m:
                t = torch.from_dlpack(m)  # DLPack, not __cuda_array_interface__.
                assert t.is_cuda and t.dtype == torch.uint8 and t.numel() == 1 << 20
                assert int(t.view(torch.int32)[0]) == 7
        check("open a daemon buffer through DLPack (torch.from_dlpack)", open_through_dlpack)

        def open_as_cupy():
            try:
                import cupy
            except ImportError:
                print("  (cupy not installed: SKIPPED)")
                return
            with cb.open(dst) as m:
                arr = cupy.asarray(m)
                assert int(arr[:4].view(cupy.int32)[0]) == 7
        check("open a daemon buffer as a cupy array", open_as_cupy)

        def vectored_device():
            src = ca.allocate(1 << 20, kind="device")
            ca.write(src, np.arange(1 << 18, dtype=np.int32))
            si = np.arange(0, 256, 2)
            di = si[::-1].copy()
            t = ca.move(src, dst, blocks=(si, di), block_size=4096, notify=b"kv")
            assert t.ok and t.pieces == len(si), t
            got = np.frombuffer(cb.read(dst), dtype=np.int32).reshape(256, 1024)
            want = np.arange(1 << 18, dtype=np.int32).reshape(256, 1024)
            assert np.array_equal(got[di], want[si])
        check("vectored move between the daemons' device buffers", vectored_device)

        def register_cupy_and_dlpack():
            # A cupy array (its __cuda_array_interface__), and an object that offers only
            # DLPack (as jax arrays do), each lent and moved, verified.
            class DlpackOnly:
                def __init__(self, t):
                    self._t = t

                def __dlpack__(self, stream=None):
                    return self._t.__dlpack__()

                def __dlpack_device__(self):
                    return self._t.__dlpack_device__()
            tensors = [("dlpack", DlpackOnly(torch.full((1 << 16,), 5, dtype=torch.int32,
                                                        device="cuda")))]
            try:
                import cupy
                tensors.append(("cupy", cupy.full((1 << 16,), 6, dtype=cupy.int32)))
            except ImportError:
                print("  (cupy not installed: cupy part SKIPPED)")
            torch.cuda.synchronize()
            for name, t in tensors:
                lent = ca.register(t, label=name)
                assert lent.imported and lent.size == 1 << 18, (name, lent)
                want = 5 if name == "dlpack" else 6
                m = ca.move(lent, dst[0:1 << 18], checksum=True)
                assert m.ok, (name, m)
                got = np.frombuffer(cb.read(dst, length=1 << 18), dtype=np.int32)
                assert (got == want).all(), name
                ca.release(lent)
        check("register a cupy array and a DLPack-only tensor", register_cupy_and_dlpack)

        examples = os.environ.get("GPUMOVE_EXAMPLES")

        def load(name):
            import importlib.util
            spec = importlib.util.spec_from_file_location(name, os.path.join(examples,
                                                                             f"{name}.py"))
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module

        def pipeline_with_cuda_tensors():
            assert examples, "GPUMOVE_EXAMPLES is not set"
            assert load("pipeline").run(a.address, b.address, batches=6, use_torch=True,
                                        progress=True) == 6
        check("examples/python/pipeline.py with CUDA tensors (register, open)",
              pipeline_with_cuda_tensors)

        def kv_cache_on_device_memory():
            assert examples, "GPUMOVE_EXAMPLES is not set"
            rate = load("kv_cache").run(a.address, b.address, layers=8, blocks_per_layer=256,
                                        block=16 << 10, request_blocks=128, kind="device")
            print(f"  kv_cache on device memory: {rate / 1e9:.2f} GB/s", flush=True)
        check("examples/python/kv_cache.py on device memory", kv_cache_on_device_memory)

        def lender_exit_releases():
            code = ("import torch, gpumove, sys, time; c = gpumove.Client(sys.argv[1]); "
                    "t = torch.ones(1 << 16, device='cuda'); b = c.register(t); print(b.id)")
            out = subprocess.run([sys.executable, "-c", code, a.address], capture_output=True,
                                 text=True, timeout=120, env=os.environ)
            assert out.returncode == 0, out.stderr[-2000:]
            bid = out.stdout.strip().splitlines()[-1]
            deadline = time.time() + 10
            while time.time() < deadline:
                try:
                    ca.buffer(bid)
                except gpumove.Error as e:
                    assert e.code.name == "NOT_FOUND"
                    return
                time.sleep(0.1)
            raise AssertionError(f"{bid} outlived the process that lent it")
        check("a lender that exits takes its lent memory with it", lender_exit_releases)
    finally:
        ca.close()
        cb.close()
        b.stop()
        a.stop()
    failed = sum(1 for _, e in results if e is not None)
    print(f"python gpu: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
