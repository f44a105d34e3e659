"""examples/python/disaggregated.py against real daemons (CPU, host memory): the decode
side's tokens equal the reference's for prompts that fill whole and partial last blocks,
alone and as one batch, layer-wise and whole-cache, over two daemons and one; block ids
reused after release and none moved twice; the decode daemon killed mid-push fails the
batch within the peer timeout, nothing hangs, and a retry on a new decode side matches.
Run by tests/disaggregated_test.sh (pytest; GPUMOVED, GPUMOVE_EXAMPLES and
GPUMOVE_DAEMONS name the binary and the folders)."""
import os
import sys
import time

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.environ["GPUMOVE_EXAMPLES"])
sys.path.insert(0, os.environ["GPUMOVE_DAEMONS"])
import disaggregated as dis  # noqa: E402
import kv_connector as kvc  # noqa: E402
import kv_models  # noqa: E402
from daemons import Daemon, await_peers  # noqa: E402

import gpumove  # noqa: E402

BLOCK = 16
# 5: a partial first block; 16: exactly one; 37: two and a partial; 48: three full.
LENGTHS = [5, 16, 37, 48]
STEPS = 6
PEER_TIMEOUT = 1.5  # daemons.py's --peer_timeout


def setup(**kw) -> dis.Setup:
    return dis.Setup(model="tiny", block_size=BLOCK, num_blocks=40, timeout=10.0, **kw)


@pytest.fixture(scope="module")
def daemons():
    a = Daemon("kv-p")
    b = Daemon("kv-d", join=a.address)
    with gpumove.Client(a.address) as c:
        await_peers(c, 1)
    yield a, b
    b.stop()
    a.stop()


@pytest.fixture(scope="module")
def model():
    return setup().build_model()


def blocks_of(n):
    return kvc.blocks_for(n, BLOCK)


def run_and_check(prefill, prompts, steps, layerwise=True):
    r = prefill.run(prompts, steps, layerwise=layerwise)
    n = dis.check(prefill, prompts, steps, r)
    # Every block of the batch moved once per layer (K and V apart), none twice.
    total = sum(blocks_of(len(p)) for p in prompts)
    layers = prefill.pool.layers
    assert r["save"].moved_blocks == 2 * total * layers, r["save"]
    assert len(r["save"].layer_seconds) == layers
    flat = [b for t in r["tables"] for b in t]
    assert len(set(flat)) == len(flat)
    print(f"tokens matched: {len(prompts)} prompt(s) of {[len(p) for p in prompts]} tokens, "
          f"{n} tokens, {'layer-wise' if layerwise else 'whole cache'}")
    return r


def test_two_daemons_tokens_match_and_blocks_are_reused(daemons, model):
    a, b = daemons
    s = setup()
    prompts = dis.prompts_of(LENGTHS, s.shape().vocab, 1)
    decode = dis.Decode(b.address, s)
    prefill = dis.Prefill(a.address, s, decode, model=model)
    try:
        seen = []
        for p in prompts:
            seen.append(run_and_check(prefill, [p], STEPS)["tables"])
        # Released blocks are handed out again: each single prompt started at block 0.
        assert all(t[0][0] == 0 for t in seen), seen
        batch = run_and_check(prefill, prompts, STEPS)
        assert sorted(b for t in batch["tables"] for b in t) == list(
            range(sum(blocks_of(n) for n in LENGTHS)))
        run_and_check(prefill, prompts, STEPS, layerwise=False)
        # Both sides' allocators have every block back.
        assert prefill.allocator.free == s.num_blocks
    finally:
        prefill.close()
        decode.stop()
    assert decode.proc.exitcode == 0


def test_one_daemon_for_both(daemons, model):
    a, _ = daemons
    s = setup()
    prompts = dis.prompts_of([3, 33], s.shape().vocab, 2)
    decode = dis.Decode(a.address, s)
    prefill = dis.Prefill(a.address, s, decode, model=model)
    try:
        run_and_check(prefill, prompts, STEPS)
        run_and_check(prefill, prompts[:1], STEPS, layerwise=False)
    finally:
        prefill.close()
        decode.stop()


def test_the_comparison_sees_a_wrong_cache(model):
    """The check is not vacuous: the same first token and a zeroed cache give other tokens."""
    ids = dis.prompts_of([37], model.shape.vocab, 1)[0]
    want = kv_models.generate(model, ids, STEPS)
    _, kv = model.prefill(ids)
    state = model.start([(torch.zeros_like(k), torch.zeros_like(v)) for k, v in kv])
    got = [want[0]]
    for _ in range(STEPS):
        got.append(model.step(state, got[-1]))
    assert got != want


def test_decode_daemon_killed_mid_push_fails_the_batch_then_a_retry_matches(daemons, model):
    a, _ = daemons
    s = setup()
    prompts = dis.prompts_of([37, 20], s.shape().vocab, 3)
    victim = Daemon("kv-victim", join=a.address)
    with gpumove.Client(a.address) as c:
        await_peers(c, 2)
    decode = dis.Decode(victim.address, s)
    prefill = dis.Prefill(a.address, s, decode, model=model)
    killed = {}

    def kill_after_layer_0_landed(layer):
        # Layer 0 moved and in the decode pool, the others not yet: kill the decode daemon.
        if layer != 1:
            return
        deadline = time.monotonic() + 10
        while not prefill.connector.submitted() and time.monotonic() < deadline:
            time.sleep(0.001)
        first = prefill.connector.submitted()[0]
        assert prefill.client.wait(first, timeout=10).ok
        victim.proc.kill()
        victim.proc.wait()
        killed["at"] = time.monotonic()

    try:
        r = prefill.run(prompts, STEPS, after_save=kill_after_layer_0_landed)
        took = time.monotonic() - killed["at"]
        assert not r["ok"] and not r["save"].ok
        print(f"decode daemon killed after layer 0 landed: batch failed in {took:.2f} s "
              f"(peer timeout {PEER_TIMEOUT} s): {r['save'].error}; decode: {r.get('error')}")
        assert took < PEER_TIMEOUT + 5, took
        assert prefill.allocator.free == s.num_blocks
    finally:
        prefill.close()
        decode.stop()
        victim.stop()
    assert decode.proc.exitcode is not None
    # The retry: the prefill side sends the batch to another decode side.
    spare = Daemon("kv-spare", join=a.address)
    try:
        decode = dis.Decode(spare.address, s)
        prefill = dis.Prefill(a.address, s, decode, model=model)
        try:
            run_and_check(prefill, prompts, STEPS)
            print("retry on a new decode side: tokens matched")
        finally:
            prefill.close()
            decode.stop()
    finally:
        spare.stop()
