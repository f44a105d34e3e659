"""gpumove.Client against real daemons: buffers, bytes in and out (bytes, numpy, into a
given array), moves (LOCAL, between nodes, third-party, vectored from numpy, checksums),
transfers (submit, wait, watch, cancel, list), notifications after the data, errors with
their codes, and the CUDA calls refused cleanly without a GPU."""
import os
import threading

import grpc
import numpy as np
import pytest

import gpumove


def random_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_info_and_peers(client):
    info = client.info()
    assert info.node == "py-a"
    assert info.paths["local"] is True
    assert info.authentication == "open"
    assert client.peers() == []


def test_buffers_bytes_in_and_out(client):
    b = client.allocate(3 << 20, label="py")
    assert b.size == 3 << 20 and b.kind == "host" and b.label == "py"
    data = random_bytes(3 << 20, 1)
    assert client.write(b, data) == len(data)
    assert client.read(b) == data
    # Part of it, by offset and length, and through a slice.
    assert client.read(b, offset=5, length=10) == data[5:15]
    assert client.read(b[1000:2000]) == data[1000:2000]
    # numpy in, numpy out (filled in place), memoryview in.
    arr = np.arange(1 << 18, dtype=np.float32)
    client.write(b, arr)
    out = np.empty_like(arr)
    assert client.read(b, out=out) is out
    assert np.array_equal(out, arr)
    client.write(b, memoryview(b"abc"), offset=7)
    assert client.read(b, offset=7, length=3) == b"abc"
    assert b.id in [x.id for x in client.buffers()]
    assert client.buffer(b.id).size == b.size
    client.release(b)
    with pytest.raises(gpumove.Error) as e:
        client.buffer(b.id)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_bad_requests_get_their_codes_and_change_nothing(client):
    b = client.allocate(4096)
    client.write(b, b"\x01" * 4096)
    with pytest.raises(gpumove.Error) as e:
        client.write(b, b"x" * 10, offset=4090)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert client.read(b) == b"\x01" * 4096
    with pytest.raises(gpumove.Error) as e:
        client.allocate(0)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(gpumove.Error) as e:
        client.allocate(1 << 40)
    assert e.value.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
    with pytest.raises(gpumove.Error) as e:
        client.move(b, "b-nope")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(gpumove.Error) as e:
        client.transfer("t-0000000000000000.py-a")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ValueError):
        client.allocate(10, kind="gpu")
    with pytest.raises(ValueError):
        client.move(b, b, path="carrier-pigeon")
    client.release(b)


def test_local_moves_submit_wait_watch_cancel(client):
    src = client.allocate(8 << 20)
    dst = client.allocate(8 << 20)
    data = random_bytes(8 << 20, 2)
    client.write(src, data)
    t = client.move(src, dst, checksum=True)
    assert t.ok and t.path == "local" and t.length == 8 << 20
    assert t.source_xxh3 == t.destination_xxh3 != 0
    assert client.read(dst) == data
    # A batch that does not wait, then wait and watch.
    specs = [gpumove.spec(src[i << 20:(i + 1) << 20], dst.ref(i << 20)) for i in range(4)]
    ts = client.submit(specs)
    assert len(ts) == 4
    ended = [client.wait(x, timeout=30) for x in ts]
    assert all(x.ok for x in ended)
    events = list(client.watch(ts[0]))
    assert events[-1].ok
    assert ts[0].id in [x.id for x in client.transfers(states=["succeeded"])]
    client.release(src)
    client.release(dst)


def test_moves_keep_their_classes(client):
    src = client.allocate(1 << 20)
    dst = client.allocate(1 << 20)
    t = client.move(src, dst, priority="latency")
    assert t.ok and t.priority == "latency" and "priority='latency'" in repr(t)
    bulk = client.submit([gpumove.spec(src, dst, priority="bulk")], wait=True)[0]
    assert bulk.ok and bulk.priority == "bulk"
    assert client.move(src, dst).priority == "normal"
    with pytest.raises(ValueError, match="priority must be one of"):
        client.move(src, dst, priority="urgent")
    client.release(src)
    client.release(dst)


def test_a_required_transport_is_sent_and_checked(client):
    src = client.allocate(4096)
    dst = client.allocate(4096)
    assert gpumove.spec(src, dst, require="rdma").require_transport == "rdma"
    # One host: not held to it.
    assert client.move(src, dst, require="rdma").ok
    with pytest.raises(ValueError, match="require must be"):
        client.move(src, dst, require="verbs")
    client.release(src)
    client.release(dst)


def test_a_file_region_is_a_buffer(tmp_path):
    from conftest import start
    root = tmp_path / "root"
    root.mkdir()
    d = start("py-files", f"--file_roots={root}")
    try:
        with gpumove.Client(d.address) as c:
            size = (1 << 20) + 5
            src = c.allocate(size)
            back = c.allocate(size)
            data = bytes(range(256)) * (size // 256) + b"tail!"
            c.write(src, data)
            f = c.register_file("out.bin", size, writable=True, create=True, label="ckpt")
            assert f.kind == "file" and f.size == size
            t = c.move(src, f, checksum=True, durable=True)
            assert t.ok and t.path == "file_io", t
            assert gpumove.spec(src, f, durable=True).durable
            assert (root / "out.bin").read_bytes() == data
            again = c.register_file("out.bin", size)  # Read-only.
            assert c.move(again, back, checksum=True).ok
            assert c.read(back) == data
            for bad in ("../escape", "/etc/passwd", "a/../../b"):
                with pytest.raises(gpumove.Error) as e:
                    c.register_file(bad, 4096, writable=True, create=True)
                assert e.value.code in (grpc.StatusCode.INVALID_ARGUMENT,
                                        grpc.StatusCode.PERMISSION_DENIED), bad
            with pytest.raises(ValueError, match="create needs writable"):
                c.register_file("x.bin", 4096, create=True)
            assert not (tmp_path / "escape").exists()
    finally:
        d.stop()


def test_cancel_a_slow_move():
    from conftest import start
    d = start("py-slow", "--max_move_rate=8MiB")
    try:
        with gpumove.Client(d.address) as c:
            src = c.allocate(64 << 20)
            dst = c.allocate(64 << 20)
            t = c.move(src, dst, wait=False)
            assert not t.done
            c.cancel(t)
            end = c.wait(t, timeout=30)
            assert end.state == "cancelled"
            with pytest.raises(gpumove.Error) as e:
                end.raise_for_state()
            assert e.value.code == grpc.StatusCode.CANCELLED
    finally:
        d.stop()


def test_progress_of_a_long_move(monkeypatch, caplog):
    """move(progress=True): a tqdm bar when tqdm is there (a stand-in here, to see what it
    was told), log lines on the "gpumove" logger when not; the move's end either way."""
    import logging
    import sys
    import types
    from conftest import start
    # 24 MiB at 8 MiB/s: ~3 s a move, so that a line comes before the end even when the
    # first event is late on a loaded machine (at 16 MiB/s CI once saw the end alone).
    d = start("py-progress", "--max_move_rate=8MiB")
    try:
        with gpumove.Client(d.address) as c:
            src, dst = c.allocate(24 << 20), c.allocate(24 << 20)
            c.write(src, random_bytes(24 << 20, 12))
            bars = []

            class Bar:
                def __init__(self, total, **kw):
                    self.total, self.n, self.closed = total, 0, False
                    bars.append(self)

                def update(self, n):
                    self.n += n

                def close(self):
                    self.closed = True
            monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=Bar))
            t = c.move(src, dst, progress=True)
            assert t.ok and t.bytes_done == 24 << 20
            assert len(bars) == 1 and bars[0].total == 24 << 20
            assert bars[0].n == 24 << 20 and bars[0].closed
            assert c.read(dst) == c.read(src)
            monkeypatch.setitem(sys.modules, "tqdm", None)  # Not installed.
            with caplog.at_level(logging.INFO, logger="gpumove"):
                t = c.move(dst, src, progress=True)
            assert t.ok
            lines = [r.getMessage() for r in caplog.records if r.name == "gpumove"]
            assert len(lines) >= 2, lines  # About a second apart over ~3 s, and the end.
            assert lines[-1].endswith(f"{24 << 20} of {24 << 20} bytes (succeeded)")
    finally:
        d.stop()


def test_vectored_moves_from_numpy(client):
    n, bs = 4096, 4096
    src = client.allocate(n * bs)
    dst = client.allocate(n * bs)
    data = np.frombuffer(random_bytes(n * bs, 3), dtype=np.uint8)
    before = np.frombuffer(random_bytes(n * bs, 4), dtype=np.uint8)
    client.write(src, data)
    client.write(dst, before)
    rng = np.random.default_rng(5)
    si = rng.permutation(n)[: n // 2]
    di = rng.permutation(n)[: n // 2]
    t = client.move(src, dst, blocks=(si, di), block_size=bs, checksum=True)
    assert t.ok and t.pieces == n // 2
    expected = before.copy().reshape(n, bs)
    expected[di] = data.reshape(n, bs)[si]
    got = np.frombuffer(client.read(dst), dtype=np.uint8).reshape(n, bs)
    assert np.array_equal(got, expected)
    # Segments, and a bad list refused with nothing written.
    t = client.move(src, dst, segments=[(0, 1, 5), (100, 50, 3)])
    assert t.ok and t.pieces == 2
    assert client.read(dst, offset=1, length=5) == data[:5].tobytes()
    snapshot = client.read(dst)
    with pytest.raises(gpumove.Error) as e:
        client.move(src, dst, blocks=([0, 1], [3, 3]), block_size=bs)  # Overlapping.
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert client.read(dst) == snapshot
    with pytest.raises(ValueError):
        client.move(src, dst, blocks=([-1], [0]), block_size=bs)
    client.release(src)
    client.release(dst)


def test_kv_helper_moves_every_layer_in_one_submit(cluster):
    # Into node c (node b's notification log is another test's).
    a, b = gpumove.Client(cluster["a"].address), gpumove.Client(cluster["c"].address)
    try:
        layers, blocks, bs = 4, 256, 4096
        src = [a.allocate(blocks * bs) for _ in range(layers)]
        dst = [b.allocate(blocks * bs) for _ in range(layers)]
        for i, s in enumerate(src):
            a.write(s, np.full(blocks * bs, i + 1, dtype=np.uint8))
        for x in dst:
            b.write(x, np.zeros(blocks * bs, dtype=np.uint8))
        rng = np.random.default_rng(11)
        si, di = rng.permutation(blocks)[:100], rng.permutation(blocks)[:100]
        specs = gpumove.kv_specs(src, dst, si, di, bs, notify=b"kv in")
        assert len(specs) == layers and all(s.blocks == specs[0].blocks for s in specs)
        assert [s.notify for s in specs] == [b""] * (layers - 1) + [b"kv in"]
        with b.notifications(dst) as stream:
            ts = a.move_kv(src, dst, si, di, bs, notify=b"kv in", checksum=True)
            assert len(ts) == layers and all(t.ok and t.pieces == 100 for t in ts)
            n = next(iter(stream))
            assert n.notify == b"kv in" and n.destination_buffer == dst[-1].id
        for i, x in enumerate(dst):
            got = np.frombuffer(b.read(x), dtype=np.uint8).reshape(blocks, bs)
            assert (got[di] == i + 1).all()
            assert (got[np.setdiff1d(np.arange(blocks), di)] == 0).all()
        # Refused whole: one layer too small for a block moves nothing in any layer.
        small = b.allocate(16 * bs)
        snapshot = b.read(dst[0])
        with pytest.raises(gpumove.Error) as e:
            a.move_kv(src, dst[:-1] + [small], [0, 1], [5, 200], bs)
        assert e.value.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE)
        assert b.read(dst[0]) == snapshot
        with pytest.raises(ValueError):
            gpumove.kv_specs(src, dst[:-1], si, di, bs)
    finally:
        a.close()
        b.close()


def test_prepared_lists_for_kv_layers(cluster):
    # Prepared on the destination's node c (the moves run there as pulls), named by every
    # layer of two KV moves; listed, released, then refused.
    a, c = gpumove.Client(cluster["a"].address), gpumove.Client(cluster["c"].address)
    try:
        layers, blocks, bs = 3, 128, 4096
        src = [a.allocate(blocks * bs) for _ in range(layers)]
        dst = [c.allocate(blocks * bs) for _ in range(layers)]
        rng = np.random.default_rng(21)
        si, di = rng.permutation(blocks)[:50], rng.permutation(blocks)[:50]
        p = a.prepare(blocks=(si, di), block_size=bs, node="c", label="kv")
        assert p.node == "c" and p.pieces == 50 and p.bytes == 50 * bs and p.label == "kv"
        assert p.destination_extent == (int(di.max()) + 1) * bs
        assert [x.id for x in c.prepared_lists()] == [p.id]
        assert [x.id for x in a.prepared_lists(node="c")] == [p.id]
        specs = gpumove.kv_specs(src, dst, prepared=p)
        assert all(s.prepared_pieces == p.id and not s.HasField("blocks") for s in specs)
        for round in range(2):
            for i, s in enumerate(src):
                a.write(s, np.full(blocks * bs, 10 * round + i + 1, dtype=np.uint8))
            for x in dst:
                c.write(x, np.zeros(blocks * bs, dtype=np.uint8))
            ts = a.move_kv(src, dst, prepared=p, checksum=True)
            assert all(t.ok and t.pieces == 50 for t in ts)
            assert all(t.raw.node == "c" for t in ts)
            for i, x in enumerate(dst):
                got = np.frombuffer(c.read(x), dtype=np.uint8).reshape(blocks, bs)
                assert (got[di] == 10 * round + i + 1).all()
                assert (got[np.setdiff1d(np.arange(blocks), di)] == 0).all()
        t = a.move(src[0], dst[0], prepared=p.id)
        assert t.ok and t.pieces == 50
        with pytest.raises(ValueError):
            a.move(src[0], dst[0], prepared=p, segments=[(0, 0, 1)])
        with pytest.raises(ValueError):
            gpumove.kv_specs(src, dst, si, di, bs, prepared=p)
        with pytest.raises(ValueError):
            a.prepare()
        a.release_pieces(p)
        assert c.prepared_lists() == []
        with pytest.raises(gpumove.Error) as e:
            a.move_kv(src, dst, prepared=p)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(gpumove.Error) as e:
            a.prepare(segments=[(0, 0, 10), (20, 5, 10)])  # Destination pieces overlap.
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        a.close()
        c.close()


def test_dlpack_tensors_are_read_without_a_copy_and_cpu_ones_refused(client):
    from gpumove import _cuda
    x = np.arange(48, dtype=np.float32).reshape(4, 12)
    kind, ptr, size = _cuda.dlpack_pointer(x[1:])
    assert (kind, ptr, size) == (1, x[1:].ctypes.data, 3 * 12 * 4)  # DLPack's kDLCPU.
    with pytest.raises(gpumove.Error) as e:
        _cuda.dlpack_pointer(x[:, 1:3])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "contiguous" in e.value.message
    # A host array offered to register: refused by where it lives, before any CUDA call.
    with pytest.raises(gpumove.Error) as e:
        client.register(x)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "CPU" in e.value.message
    assert float(x.sum()) == float(np.arange(48).sum())  # The producer still owns it.
    # What open()'s DeviceMemory hands a DLPack consumer, checked with numpy over host
    # memory (the same structures, device type CPU): a zero-copy 1-D uint8 view.
    base = np.arange(64, dtype=np.uint8)

    class Host:
        keep = []

        def __dlpack__(self, stream=None):
            return _cuda.dlpack_capsule(base.ctypes.data + 8, 32, 1, 0, self.keep)

        def __dlpack_device__(self):
            return (1, 0)
    view = np.from_dlpack(Host())
    assert view.dtype == np.uint8 and view.shape == (32,)
    assert view.ctypes.data == base.ctypes.data + 8 and view[0] == 8 and view[-1] == 39
    del view


def test_block_lists_encode_like_protobuf():
    from gpumove.v1 import gpumove_pb2 as pb
    values = [0, 1, 127, 128, 300, 16383, 16384, 2**40, 2**63, 2**64 - 1]
    for arr in (values, np.array(values, dtype=np.uint64)):
        got = gpumove.block_list(4096, arr, arr[::-1], source_stride=8192)
        want = pb.BlockList(block_size=4096, source_stride=8192, source_blocks=values,
                            destination_blocks=values[::-1])
        assert got == want
    # Indices below 2^32 go as fixed 32-bit integers (one copy for the daemon to parse).
    big = np.random.default_rng(6).permutation(150_000)
    bl = gpumove.block_list(16, big, big)
    assert list(bl.source_blocks32) == big.tolist() and not bl.source_blocks
    small = [0, 5, 2**32 - 1]
    for arr in (small, np.array(small, dtype=np.uint32), np.array(small, dtype=np.int64)):
        got = gpumove.block_list(8, arr, values[-3:])
        assert got == pb.BlockList(block_size=8, source_blocks32=small,
                                   destination_blocks=values[-3:])
    assert gpumove.block_list(8, [2**32], [1]) == pb.BlockList(
        block_size=8, source_blocks=[2**32], destination_blocks32=[1])


def test_moves_between_nodes_and_notifications(cluster):
    a, b, c = (gpumove.Client(cluster[n].address) for n in "abc")
    try:
        src = a.allocate(4 << 20)
        dst = b.allocate(4 << 20)
        data = random_bytes(4 << 20, 7)
        a.write(src, data)
        with b.notifications([dst]) as stream:
            # Pushed by a, third-party through c; each notification comes with the bytes.
            for via, note in ((a, b"push"), (c, b"third party")):
                b.write(dst, b"\0" * (4 << 20))
                t = via.move(src, dst, notify=note, wait=False)
                n = next(iter(stream))
                assert n.notify == note and n.transfer_id == t.id
                assert n.source_node == "a" and n.destination_buffer == dst.id
                assert b.read(dst) == data  # Visible by the time it is notified.
                assert via.wait(t, timeout=30).ok
        # Pull by b, vectored, with a checksum.
        idx = np.arange(64)
        t = b.move(src, dst, blocks=(idx, idx[::-1]), block_size=64 << 10)
        assert t.ok and t.path == "ucx"
        # What carried it: UCX's shared-memory transports or a direct copy on one host.
        assert t.transport == "direct copy" or "/memory" in t.transport, t
        assert "transport=" in repr(t)
        # Resume from the oldest kept: both notifications again, in order.
        with c.notifications(node="b", after=0, timeout=30) as again:
            it = iter(again)
            first, second = next(it), next(it)
            assert (first.notify, second.notify) == (b"push", b"third party")
            assert second.sequence == first.sequence + 1
    finally:
        for x in (a, b, c):
            x.close()


def test_cuda_calls_without_a_gpu_are_refused(client):
    class FakeTensor:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "|u1", "data": (0, False),
                                    "version": 3}
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has a GPU: the GPU suite covers register/open")
    with pytest.raises(gpumove.Error) as e:
        client.register(FakeTensor())
    assert e.value.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INTERNAL)
    with pytest.raises(gpumove.Error) as e:
        client.register(b"not a tensor")
    assert e.value.code in (grpc.StatusCode.INVALID_ARGUMENT,
                            grpc.StatusCode.FAILED_PRECONDITION)
    b = client.allocate(4096)
    with pytest.raises(gpumove.Error) as e:
        client.open(b)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    client.release(b)
    # Exportable: device memory only, and only where there is a GPU.
    with pytest.raises(ValueError, match="only device buffers can be exportable"):
        client.allocate(4096, exportable=True)
    with pytest.raises(gpumove.Error) as e:
        client.allocate(4096, kind="device", exportable=True)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
