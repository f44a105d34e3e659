"""Listings past one page (issue 48): a daemon answers at most 1000 entries a page; the
sync and asyncio clients follow next_page_token and return every entry once, in order."""
import grpc
import pytest

import gpumove
from gpumove.v1 import gpumove_pb2 as pb
from gpumove.v1 import gpumove_pb2_grpc as rpc

COUNT = 1100


@pytest.fixture(scope="module")
def many(node):
    with gpumove.Client(node.address) as c:
        made = [c.allocate(4096).id for _ in range(COUNT)]
        yield made
        for b in made:
            c.release(b)


def test_one_raw_page_holds_at_most_1000(node, many):
    with grpc.insecure_channel(node.address) as channel:
        stub = rpc.BufferServiceStub(channel)
        first = stub.List(pb.ListBuffersRequest(), timeout=20)
        assert len(first.buffers) == 1000 and first.next_page_token
        rest = stub.List(pb.ListBuffersRequest(page_token=first.next_page_token), timeout=20)
        assert not rest.next_page_token
        assert [b.id for b in list(first.buffers) + list(rest.buffers)] == many
        with pytest.raises(grpc.RpcError) as e:
            stub.List(pb.ListBuffersRequest(page_token="garbage"), timeout=20)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_client_buffers_follows_pages(client, many):
    assert [b.id for b in client.buffers()] == many


@pytest.mark.asyncio
async def test_async_client_buffers_follows_pages(node, many):
    async with gpumove.aio.Client(node.address) as c:
        assert [b.id for b in await c.buffers()] == many


def test_transfers_newest_first_up_to_limit(client, many):
    ids = [client.move(many[0], many[1]).id for _ in range(3)]
    assert [t.id for t in client.transfers(limit=2)] == ids[::-1][:2]
    assert [t.id for t in client.transfers()][:3] == ids[::-1]


def test_long_label_is_refused(client, many):
    with pytest.raises(gpumove.Error) as e:
        client.allocate(4096, label="x" * 257)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "label" in e.value.message
    assert len(client.buffers()) == COUNT
