"""pytest fixtures: one daemon (module scope) and a three-node cluster (daemons.py)."""
import pytest

import gpumove
from daemons import Daemon, Missing, await_peers


def start(*args, **kwargs):
    try:
        return Daemon(*args, **kwargs)
    except Missing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def node():
    d = start("py-a")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def cluster():
    a = start("a")
    b = start("b", join=a.address)
    c = start("c", join=a.address)
    for d in (a, b, c):
        with gpumove.Client(d.address) as cl:
            await_peers(cl, 2)
    yield {"a": a, "b": b, "c": c}
    for d in (c, b, a):
        d.stop()


@pytest.fixture
def client(node):
    with gpumove.Client(node.address) as c:
        yield c
