"""The examples in examples/python run against a real two-node cluster (host memory)."""
import importlib.util
import os

import pytest

from conftest import start
from daemons import await_peers
import gpumove

EXAMPLES = os.environ.get("GPUMOVE_EXAMPLES") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python")


def load(name):
    path = os.path.join(EXAMPLES, f"{name}.py")
    if not os.path.exists(path):
        pytest.skip(f"no {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def two_nodes():
    a = start("ex-a")
    b = start("ex-b", join=a.address)
    with gpumove.Client(a.address) as c:
        await_peers(c, 1)
    yield a.address, b.address
    b.stop()
    a.stop()


def test_pipeline_example(two_nodes):
    assert load("pipeline").run(*two_nodes, batches=6) == 6


def test_kv_cache_example(two_nodes):
    for prepared in (False, True):
        rate = load("kv_cache").run(*two_nodes, layers=4, blocks_per_layer=256, block=4096,
                                    request_blocks=64, prepared=prepared)
        assert rate > 0
