"""The Python client with a daemon that checks callers: bearer tokens (none or a wrong one
is UNAUTHENTICATED, another tenant's buffer NOT_FOUND) and TLS with client certificates
(openssl makes a CA, the daemon's and the client's certificates; without openssl the TLS
case is SKIPPED)."""
import os
import shutil
import subprocess
import tempfile

import grpc
import pytest

import gpumove
from conftest import start

TOKENS = """alice-token-0123456789,alice,team-a,user
bob-token-0123456789,bob,team-b,user
"""


def test_bearer_tokens_and_tenants():
    d = tempfile.mkdtemp()
    path = os.path.join(d, "tokens")
    with open(path, "w") as f:
        f.write(TOKENS)
    node = start("py-auth", f"--auth_tokens={path}")
    try:
        with gpumove.Client(node.address) as anon:
            with pytest.raises(gpumove.Error) as e:
                anon.info()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        with gpumove.Client(node.address, token="wrong-token-0123456789") as bad:
            with pytest.raises(gpumove.Error) as e:
                bad.allocate(4096)
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        with gpumove.Client(node.address, token="alice-token-0123456789") as alice, \
                gpumove.Client(node.address, token="bob-token-0123456789") as bob:
            b = alice.allocate(4096)
            alice.write(b, b"a" * 4096)
            assert alice.info().authentication == "bearer tokens"
            with pytest.raises(gpumove.Error) as e:
                bob.read(b)
            assert e.value.code == grpc.StatusCode.NOT_FOUND
            assert b.id not in [x.id for x in bob.buffers()]
            assert alice.read(b) == b"a" * 4096
    finally:
        node.stop()
        shutil.rmtree(d)


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make certificates")
def test_mutual_tls():
    d = tempfile.mkdtemp()
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def cert(name, ca=None):
        pem, k = os.path.join(d, f"{name}.pem"), os.path.join(d, f"{name}.key")
        if ca is None:
            openssl("req", "-x509", *key, "-keyout", k, "-out", pem, "-days", "2",
                    "-subj", f"/CN={name}")
            return pem, k
        csr, ext = os.path.join(d, f"{name}.csr"), os.path.join(d, f"{name}.ext")
        with open(ext, "w") as f:
            f.write(f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{name}\n")
        openssl("req", *key, "-keyout", k, "-out", csr, "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
                "-out", pem, "-days", "2", "-extfile", ext)
        return pem, k

    ca = cert("py-ca")
    server = cert("py-node", ca)
    client = cert("py-client", ca)
    node = start("py-tls", f"--tls_cert={server[0]}", f"--tls_key={server[1]}",
                 f"--tls_client_ca={ca[0]}")
    try:
        tls = {"ca": ca[0], "cert": client[0], "key": client[1]}
        with gpumove.Client(node.address, tls=tls, server_name="py-node") as c:
            info = c.info()
            assert info.tls
            b = c.allocate(4096)
            c.write(b, b"t" * 4096)
            assert c.read(b) == b"t" * 4096
        # Without a client certificate the handshake fails: UNAVAILABLE.
        with gpumove.Client(node.address, tls={"ca": ca[0]}, server_name="py-node",
                            timeout=5) as no_cert:
            with pytest.raises(gpumove.Error) as e:
                no_cert.info()
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        node.stop()
        shutil.rmtree(d)
