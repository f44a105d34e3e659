"""An Ethernet hub for three or more Soft-RoCE nodes (tests/rdma/vm.sh): each node's QEMU
connects with -netdev socket,connect=127.0.0.1:PORT, and every frame goes to the others
(virtio-net drops those for other MACs). Lossless: TCP, whose backpressure slows a sender
instead of dropping frames as a UDP link does. Usage: hub.py PORT."""
import selectors
import socket
import struct
import sys


def main(port):
    server = socket.create_server(("127.0.0.1", port))
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    pending = {}  # connection -> bytes of a frame not yet whole
    while True:
        for key, _ in sel.select():
            if key.fileobj is server:
                conn, _ = server.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                pending[conn] = b""
                sel.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            data = conn.recv(1 << 20)
            if not data:
                sel.unregister(conn)
                del pending[conn]
                continue
            # QEMU's stream netdev: each frame is its 4-byte big-endian length, then the frame.
            buf, end = pending[conn] + data, 0
            while end + 4 <= len(buf):
                size = struct.unpack_from(">I", buf, end)[0]
                if end + 4 + size > len(buf):
                    break
                end += 4 + size
            pending[conn] = buf[end:]
            if end:
                for other in pending:
                    if other is not conn:
                        other.sendall(buf[:end])


if __name__ == "__main__":
    main(int(sys.argv[1]))
