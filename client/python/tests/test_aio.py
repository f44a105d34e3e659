"""gpumove.aio.Client: the same calls as coroutines against a real daemon, moves in
parallel, watch and notifications as async iterators, errors with their codes."""
import asyncio

import grpc
import numpy as np
import pytest

import gpumove


@pytest.mark.asyncio
async def test_async_client_end_to_end(node):
    async with gpumove.aio.Client(node.address) as c:
        info = await c.info()
        assert info.node == "py-a"
        src = await c.allocate(1 << 20)
        dsts = [await c.allocate(1 << 20) for _ in range(4)]
        data = np.random.default_rng(9).integers(0, 256, 1 << 20, dtype=np.uint8)
        assert await c.write(src, data) == 1 << 20
        stream = await c.notifications(dsts)
        moves = await asyncio.gather(*[c.move(src, d, checksum=True, notify=f"n{i}")
                                       for i, d in enumerate(dsts)])
        assert all(t.ok for t in moves)
        seen = set()
        async for n in stream:
            seen.add(n.notify)
            if len(seen) == 4:
                break
        stream.cancel()
        assert seen == {b"n0", b"n1", b"n2", b"n3"}
        for d in dsts:
            out = np.empty(1 << 20, dtype=np.uint8)
            await c.read(d, out=out)
            assert np.array_equal(out, data)
        t = await c.move(src, dsts[0], wait=False)
        states = [x.state async for x in c.watch(t)]
        assert states[-1] == "succeeded"
        assert (await c.wait(t)).ok
        assert (await c.transfer(t.id)).ok
        with pytest.raises(gpumove.Error) as e:
            await c.release("b-0000000000000000")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        # A prepared list, named by two moves at once.
        p = await c.prepare(segments=[(0, 4096, 100), (8192, 0, 50)])
        assert [x.id for x in await c.prepared_lists()] == [p.id]
        moves = await asyncio.gather(*[c.move(src, d, prepared=p) for d in dsts[:2]])
        assert all(t.ok and t.pieces == 2 for t in moves)
        assert await c.read(dsts[0], offset=4096, length=100) == data[:100].tobytes()
        await c.release_pieces(p)
        assert await c.prepared_lists() == []
        for b in [src, *dsts]:
            await c.release(b)
