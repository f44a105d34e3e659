"""gpumove: the Python client of gpumoved.

    import gpumove
    with gpumove.Client("127.0.0.1:7470") as c:
        with c.allocate("1MiB") as src, c.allocate("1MiB", node="node-b") as dst:
            c.write(src, b"x" * (1 << 20))
            t = c.move(src, dst, checksum=True)
        # Both buffers are released here, after an exception too.

gpumove.aio.Client has the same methods as coroutines (`async with await c.allocate(...)`).
Errors of the daemon are gpumove.Error (with the gRPC status code); bad arguments are
ValueError or TypeError."""
from gpumove._client import Client, NotificationStream, spec
from gpumove._specs import block_list, kv_specs
from gpumove._types import (Buffer, Error, Info, Notification, Peer, PreparedPieces, Ref,
                            Transfer)
from gpumove import aio

__version__ = "0.1.0"
__all__ = ["Client", "Error", "Buffer", "Ref", "Transfer", "Notification", "Peer", "Info",
           "NotificationStream", "PreparedPieces", "spec", "block_list", "kv_specs", "aio"]
