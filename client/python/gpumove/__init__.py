"""gpumove: the Python client of gpumoved.

    import gpumove
    with gpumove.Client("127.0.0.1:7470") as c:
        src = c.allocate(1 << 20)
        dst = c.allocate(1 << 20, node="node-b")
        c.write(src, b"x" * (1 << 20))
        t = c.move(src, dst, checksum=True)

gpumove.aio.Client has the same methods as coroutines. Errors are gpumove.Error (with the
gRPC status code)."""
from gpumove._client import Client, NotificationStream, spec
from gpumove._specs import block_list, kv_specs
from gpumove._types import (Buffer, Error, Info, Notification, Peer, PreparedPieces, Ref,
                            Transfer)
from gpumove import aio

__version__ = "0.1.0"
__all__ = ["Client", "Error", "Buffer", "Ref", "Transfer", "Notification", "Peer", "Info",
           "NotificationStream", "PreparedPieces", "spec", "block_list", "kv_specs", "aio"]
