"""A user's first hour (issue 50) against a real daemon, with both clients: bad arguments
are ValueError/TypeError in our words before anything is sent, sizes take "64MiB", states
any case, a closed client says so, a subscription to a buffer that does not exist is
NOT_FOUND, notification streams close, buffers release at the end of a with block (on an
exception too), and results print on a line."""
import math
import os
import sys
import types

import grpc
import pytest

import gpumove


def gone(client, buffer):
    with pytest.raises(gpumove.Error) as e:
        client.buffer(buffer.id)
    return e.value.code == grpc.StatusCode.NOT_FOUND


def test_sizes_take_strings_and_refuse_the_rest(client):
    with client.allocate("64MiB") as b:
        assert b.size == 64 << 20
    for text, size in (("4096", 4096), ("4 KiB", 4096), ("1k", 1024), ("2MB", 2_000_000)):
        with client.allocate(text) as b:
            assert b.size == size, text
    with pytest.raises(ValueError) as e:
        client.allocate(-1)
    assert str(e.value) == ("size must be a positive number of bytes or a string like "
                            "'64MiB', not -1")
    with pytest.raises(ValueError, match="size must be .* not '64 parsecs'"):
        client.allocate("64 parsecs")
    with pytest.raises(TypeError, match="size must be .* not 1.5"):
        client.allocate(1.5)
    with pytest.raises(ValueError, match="size must be .* not 18446744073709551616"):
        client.allocate(1 << 64)
    with pytest.raises(ValueError, match="kind must be one of"):
        client.allocate(4096, kind="gpu")
    with client.allocate(4096, kind="HOST") as b:  # Kinds in any case, too.
        assert b.kind == "host"


@pytest.mark.parametrize("lease", [-5, math.nan, math.inf, -math.inf])
def test_bad_leases_are_refused_in_our_words(client, lease):
    with pytest.raises(ValueError) as e:
        client.allocate(4096, lease=lease)
    assert str(e.value) == (f"lease must be a finite number of seconds, 0 or more, "
                            f"not {lease!r}")
    with client.allocate(4096, lease=30) as b:
        with pytest.raises(ValueError, match="lease must be a finite number"):
            client.renew(b, lease=lease)
    with pytest.raises(TypeError, match="lease must be a number of seconds or None, not '5'"):
        client.allocate(4096, lease="5")


def test_other_numbers_are_checked_too(client, node):
    with client.allocate(4096) as b, client.allocate(4096) as other:
        with pytest.raises(ValueError, match="read's offset must be .* not -1"):
            client.read(b, offset=-1)
        with pytest.raises(ValueError, match="write's offset must be .* not -8"):
            client.write(b, b"x", offset=-8)
        t = client.move(b, other, wait=False)
        with pytest.raises(ValueError, match="timeout must be a finite number .* not nan"):
            client.wait(t, timeout=math.nan)
        client.wait(t, timeout=30)
    with pytest.raises(ValueError, match="limit must be a number of transfers"):
        client.transfers(limit=-1)
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds, above 0"):
        gpumove.Client(node.address, timeout=-1)


def test_states_are_any_case_and_unknown_ones_refused(client):
    with client.allocate(4096) as a, client.allocate(4096) as b:
        t = client.move(a, b)
    for states in (["SUCCEEDED"], ["Succeeded"], "succeeded", ("queued", "SUCCEEDED")):
        assert t.id in [x.id for x in client.transfers(states=states)], states
    assert t.id not in [x.id for x in client.transfers(states=["FAILED"])]
    with pytest.raises(ValueError) as e:
        client.transfers(states=["DONE"])
    assert "states must be among ['queued', 'running', 'succeeded', 'failed', 'cancelled']" \
        in str(e.value) and "not 'DONE'" in str(e.value)


def test_a_closed_client_says_so(node):
    c = gpumove.Client(node.address)
    c.info()
    c.close()
    for call in (c.info, lambda: c.allocate(4096), lambda: c.read("b-1"),
                 lambda: list(c.watch("t-1")), lambda: c.notifications()):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == (f"this gpumove client of {node.address} is closed (close() "
                                "was called or its with block ended): make a new one")
    c.close()  # Twice is fine.


def test_with_releases_a_buffer_even_after_an_exception(client):
    with client.allocate(4096, label="with") as b:
        client.write(b, b"x" * 4096)
        assert client.buffer(b).label == "with"
    assert gone(client, b)
    with pytest.raises(RuntimeError, match="user code failed"):
        with client.allocate(4096) as b:
            raise RuntimeError("user code failed")
    assert gone(client, b)
    # Released inside the block, or found by buffer(): the end of the block is still fine.
    with client.allocate(4096) as b:
        client.release(b)
    with client.buffer(client.allocate(4096).id) as again:
        assert again.size == 4096
    assert gone(client, again)
    # Buffers from listings know their client too.
    made = client.allocate(4096, label="listed")
    with [x for x in client.buffers() if x.id == made.id][0]:
        pass
    assert gone(client, made)


def test_notifications_of_a_missing_buffer_are_not_found(client):
    with pytest.raises(gpumove.Error) as e:
        client.notifications(["b-nope"])
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert e.value.message.startswith("notifications: no buffer b-nope on ")
    with client.allocate(4096) as b:
        with pytest.raises(gpumove.Error) as e:
            client.notifications([b, "b-nope"])
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert "no buffer b-nope on node py-a" in e.value.message


def test_notification_streams_close(client):
    with client.allocate(4096) as a, client.allocate(4096) as b:
        stream = client.notifications([b])
        client.move(a, b, notify=b"one")
        assert next(iter(stream)).notify == b"one"
        stream.close()
        assert list(stream) == []  # Closed: iteration ends.
        stream.close()  # Twice is fine.
        with client.notifications(b) as s:  # One buffer alone will do.
            client.move(a, b, notify=b"two")
            assert next(iter(s)).notify == b"two"
        assert list(s) == []


def test_results_print_on_a_line(client):
    info = client.info()
    assert len(repr(info)) < 200 and "\n" not in repr(info), repr(info)
    with client.allocate(4096, label="r") as a, client.allocate(4096) as b:
        t = client.move(a, b)
        for value in (a, t, client.transfer(t)):
            assert len(repr(value)) < 200 and "\n" not in repr(value), repr(value)


@pytest.mark.asyncio
async def test_async_client_first_hour(node):
    async with gpumove.aio.Client(node.address) as c:
        async with await c.allocate("1MiB", label="aio") as b:
            assert b.size == 1 << 20
            # A sync with on an aio buffer says how it is done.
            with pytest.raises(TypeError, match="gpumove.aio.Client: use async with"):
                with b:
                    pass
        with pytest.raises(gpumove.Error) as e:
            await c.buffer(b.id)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(RuntimeError):
            async with await c.allocate(4096) as b:
                raise RuntimeError("user code failed")
        with pytest.raises(gpumove.Error):
            await c.buffer(b.id)
        with pytest.raises(ValueError, match="size must be a positive number of bytes"):
            await c.allocate(-1)
        with pytest.raises(ValueError, match="lease must be a finite number"):
            await c.allocate(4096, lease=math.nan)
        with pytest.raises(ValueError, match="states must be among"):
            await c.transfers(states=["DONE"])
        with pytest.raises(gpumove.Error) as e:
            await c.notifications(["b-nope"])
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        async with await c.allocate(4096) as src, await c.allocate(4096) as dst:
            t = await c.move(src, dst)
            assert any(x.id == t.id for x in await c.transfers(states=["SUCCEEDED"]))
            async with await c.notifications([dst]) as stream:
                await c.move(src, dst, notify=b"aio")
                async for n in stream:
                    assert n.notify == b"aio"
                    break
            assert [n async for n in stream] == []  # Closed by the block.
        assert len(repr(await c.info())) < 200
    with pytest.raises(ValueError, match="is closed"):
        await c.info()


@pytest.mark.asyncio
async def test_async_move_shows_progress(monkeypatch):
    from conftest import start
    d = start("py-aio-progress", "--max_move_rate=32MiB")
    try:
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
        async with gpumove.aio.Client(d.address) as c:
            async with await c.allocate("16MiB") as src, await c.allocate("16MiB") as dst:
                t = await c.move(src, dst, progress=True)
                assert t.ok and t.bytes_done == 16 << 20
        assert len(bars) == 1 and bars[0].n == 16 << 20 and bars[0].closed
    finally:
        d.stop()


@pytest.mark.asyncio
async def test_async_cuda_calls_are_there_and_refused_without_a_gpu(node):
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has a GPU: the GPU suite covers register/open")
    async with gpumove.aio.Client(node.address) as c:
        with pytest.raises(gpumove.Error) as e:
            await c.register(b"not a tensor")
        assert e.value.code in (grpc.StatusCode.INVALID_ARGUMENT,
                                grpc.StatusCode.FAILED_PRECONDITION)
        async with await c.allocate(4096) as b:
            with pytest.raises(gpumove.Error) as e:
                await c.open(b)
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
