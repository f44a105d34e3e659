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
        for b in [src, *dsts]:
            await c.release(b)
