"""The package's public surface (issue 50), no daemon needed: gpumove.Client and
gpumove.aio.Client have the same methods with the same parameters (coroutines in aio),
every public method says what it does, the package is marked typed (py.typed), and
result types print on a line."""
import datetime
import inspect
import os
import pickle

import pytest

import gpumove
from gpumove import aio
from gpumove._specs import transfer_spec
from gpumove.v1 import gpumove_pb2 as pb


def public_methods(cls):
    return {name for name, member in inspect.getmembers(cls)
            if not name.startswith("_") and callable(member)}


def test_both_clients_have_one_set_of_methods():
    sync, asyncio_ = public_methods(gpumove.Client), public_methods(aio.Client)
    assert sync == asyncio_, (f"only in gpumove.Client: {sorted(sync - asyncio_)}; "
                              f"only in gpumove.aio.Client: {sorted(asyncio_ - sync)}")
    # The calls users meet first are there (issue 50 found open, register missing).
    assert {"open", "register", "move", "allocate", "notifications", "close"} <= sync


@pytest.mark.parametrize("name", sorted(public_methods(gpumove.Client)) + ["__init__"])
def test_each_method_takes_the_same_parameters_in_both(name):
    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    sync, asyncio_ = getattr(gpumove.Client, name), getattr(aio.Client, name)
    assert shape(sync) == shape(asyncio_), name
    if name == "__init__":
        return
    # aio's are coroutines (watch: an async iterator); the sync ones are neither.
    assert inspect.iscoroutinefunction(asyncio_) or inspect.isasyncgenfunction(asyncio_), name
    assert not inspect.iscoroutinefunction(sync) and not inspect.isasyncgenfunction(sync), name


PUBLIC_CLASSES = [gpumove.Client, aio.Client, gpumove.NotificationStream,
                  aio.NotificationStream, gpumove.Buffer, gpumove.Ref, gpumove.Transfer,
                  gpumove.Notification, gpumove.Peer, gpumove.Info, gpumove.PreparedPieces,
                  gpumove.Error]


def test_every_public_method_has_a_docstring():
    missing = []
    for cls in PUBLIC_CLASSES:
        assert cls.__doc__, cls.__name__
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if (inspect.isfunction(fn) or isinstance(fn, property)) and not fn.__doc__:
                missing.append(f"{cls.__module__}.{cls.__name__}.{name}")
    assert not missing, f"no docstring: {missing}"
    # aio's docstrings are gpumove.Client's, saying how they are used.
    assert "await" in aio.Client.allocate.__doc__
    assert "64MiB" in aio.Client.allocate.__doc__


def test_the_package_is_marked_typed():
    # PEP 561: type checkers read the package's annotations only with this marker.
    assert os.path.isfile(os.path.join(os.path.dirname(gpumove.__file__), "py.typed"))


def some_results():
    when = datetime.datetime(2026, 12, 3, 10, 0, tzinfo=datetime.timezone.utc)
    buf = gpumove.Buffer(id="b-0123456789abcdef", node="node-a", size=64 << 20, kind="device",
                         device=1, label="x" * 200, owner="alice", lease_expire_time=when)
    info = pb.NodeInfo(node="node-a", host="host-a", version="0.1.0", authentication="open")
    info.paths.add(path=pb.LOCAL, available=True)
    info.paths.add(path=pb.UCX, available=True)
    for i in range(8):
        info.gpus.add(index=i, name="NVIDIA H200", total_memory=141 << 30)
    t = pb.Transfer(id="t-0123456789abcdef.node-a", state=pb.FAILED, length=1 << 30,
                    bytes_done=1 << 20, error_code=5, error_message="no such buffer " * 20,
                    source=pb.BufferRef(node="node-a", buffer_id=buf.id),
                    destination=pb.BufferRef(node="node-b", buffer_id="b-fedcba9876543210"))
    note = pb.Notification(sequence=7, transfer_id=t.id, destination_buffer=buf.id,
                           notify=b"n" * 500)
    return [buf, gpumove.Info.from_proto(info), gpumove.Transfer.from_proto(t),
            gpumove.Notification.from_proto(note),
            gpumove.Peer(node="node-b", address="10.0.0.2:7470", up=True, last_seen=when),
            gpumove.PreparedPieces(id="p-1.node-a", pieces=50, bytes=50 << 12,
                                   source_extent=1, destination_extent=1, label="kv"),
            buf[4096:8192]]


@pytest.mark.parametrize("value", some_results(), ids=lambda v: type(v).__name__)
def test_results_print_on_one_short_line(value):
    text = repr(value)
    assert len(text) < 200 and "\n" not in text, text
    assert text.startswith(type(value).__name__ + "(")


def test_reprs_say_what_matters():
    buf, info, transfer = some_results()[:3]
    assert "id='b-0123456789abcdef'" in repr(buf) and "size=67108864" in repr(buf)
    assert "lease_expire_time='2026-12-03T10:00:00+00:00'" in repr(buf)
    assert repr(info) == ("Info(node='node-a', version='0.1.0', gpus=8, "
                          "paths=['local', 'ucx'], authentication='open', tls=False)")
    assert "state='failed'" in repr(transfer)
    assert "source='node-a/b-0123456789abcdef'" in repr(transfer)
    assert "bytes_done=1048576" in repr(transfer) and "error_code=NOT_FOUND" in repr(transfer)


def test_ref_takes_a_buffer_and_no_node():
    buf = gpumove.Buffer(id="b-1", node="node-a", size=64, kind="host", device=0)
    # docs/python.md writes Ref(buffer, node, offset, length).
    assert gpumove.Ref(buf, None, 4, 16) == gpumove.Ref("b-1", "node-a", 4, 16)
    assert gpumove.Ref("b-1", None).node == ""
    assert gpumove.Ref(buf, None, 4, 16).to_proto() == pb.BufferRef(
        node="node-a", buffer_id="b-1", offset=4, length=16)
    with pytest.raises(ValueError, match="Ref's offset must be a number of bytes .* not -4"):
        gpumove.Ref(buf, None, -4, 16)
    with pytest.raises(TypeError, match="Ref's length must be a whole number of bytes, not '16'"):
        gpumove.Ref(buf, None, 4, "16")
    with pytest.raises(ValueError, match="node 'node-b' is not the node of buffer b-1"):
        gpumove.Ref(buf, "node-b")
    with pytest.raises(TypeError, match="Ref's buffer must be a gpumove.Buffer or a buffer id"):
        gpumove.Ref(42)


def test_buffers_compare_and_pickle_without_their_client():
    a = gpumove.Buffer(id="b-1", node="n", size=64, kind="host", device=0)
    b = gpumove.Buffer(id="b-1", node="n", size=64, kind="host", device=0, _client=object())
    assert a == b and hash(a) == hash(b)
    again = pickle.loads(pickle.dumps(b))
    assert again == b and again._client is None
    # A buffer no client handed out cannot be released by a with block.
    with pytest.raises(TypeError, match="did not come from a client"):
        with a:
            pass


def test_a_move_says_its_class_and_an_unknown_one_is_refused_here():
    spec = transfer_spec("b-1", "b-2", priority="latency")
    assert spec.priority == pb.LATENCY
    assert transfer_spec("b-1", "b-2").priority == pb.NORMAL
    with pytest.raises(ValueError, match="priority must be one of"):
        transfer_spec("b-1", "b-2", priority="urgent")
    t = gpumove.Transfer.from_proto(pb.Transfer(id="t-1", state=pb.QUEUED, priority=pb.BULK))
    assert t.priority == "bulk" and "priority='bulk'" in repr(t)
    assert gpumove.Transfer.from_proto(pb.Transfer(id="t-2")).priority == "normal"
    assert "priority" not in repr(gpumove.Transfer.from_proto(pb.Transfer(id="t-2")))
