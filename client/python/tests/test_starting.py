"""A call that meets a daemon still starting (issue 50): gpumoved answers UNAVAILABLE
"gpumoved is starting (<step>)" before it has done anything, and both clients try such a
call again, bounded by its timeout; any other UNAVAILABLE is raised at once. Against a
stand-in NodeService (no daemon needed) that refuses a set number of calls."""
import asyncio
from concurrent import futures

import grpc
import pytest

import gpumove
from gpumove import aio
from gpumove.v1 import gpumove_pb2 as pb
from gpumove.v1 import gpumove_pb2_grpc as rpc


class Refusing(rpc.NodeServiceServicer):
    def __init__(self, refusals, message):
        self.refusals, self.message, self.calls = refusals, message, 0

    def GetInfo(self, request, context):
        self.calls += 1
        if self.calls <= self.refusals:
            context.abort(grpc.StatusCode.UNAVAILABLE, self.message)
        return pb.NodeInfo(node="node-a", version="test")


@pytest.fixture
def stand_in():
    servers = []

    def start(refusals, message="gpumoved is starting (setting up memory pools); try again"):
        servicer = Refusing(refusals, message)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        rpc.add_NodeServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return servicer, f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(None)


def test_a_call_waits_while_the_daemon_starts(stand_in):
    servicer, addr = stand_in(5)
    with gpumove.Client(addr, timeout=10) as c:
        assert c.info().node == "node-a"
    assert servicer.calls == 6


def test_aio_calls_wait_too(stand_in):
    servicer, addr = stand_in(3)

    async def main():
        c = aio.Client(addr, timeout=10)
        try:
            return await c.info()
        finally:
            await c.close()
    assert asyncio.run(main()).node == "node-a"
    assert servicer.calls == 4


def test_the_wait_ends_at_the_calls_timeout(stand_in):
    servicer, addr = stand_in(10**6)
    with gpumove.Client(addr, timeout=0.3) as c:
        with pytest.raises(gpumove.Error) as e:
            c.info()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert "gpumoved is starting" in str(e.value)
    assert 3 <= servicer.calls < 100


def test_other_unavailable_answers_are_not_repeated(stand_in):
    servicer, addr = stand_in(1, message="daemon is shutting down")
    with gpumove.Client(addr, timeout=5) as c:
        with pytest.raises(gpumove.Error):
            c.info()
    assert servicer.calls == 1
