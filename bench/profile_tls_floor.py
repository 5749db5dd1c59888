"""What TLS costs with no server or client around it: ``python -m bench.profile_tls_floor``.

Three figures that bound what a faster data path over TLS could gain
(docs/tls.md, "Where the time goes"), each in one process, with the cluster's
own kind of certificate (P-256, from :func:`~stager.auth.tls.ensure_cluster_tls`):

- a full handshake's CPU, client and server side (memory BIOs, no network);
- encrypt into a memory BIO, copy out, feed the peer's BIO, decrypt: the CPU
  per GB of both ends of asyncio's TLS transport with no Python around them
  (256 KiB writes, one ``SSLObject.read`` per record as the transport does);
- a server's send over loopback TCP, through memory BIOs and ``socket.sendall``
  (asyncio's way) against ``ssl.SSLSocket`` (OpenSSL writing to the socket
  itself), its thread's CPU per GB while a client thread reads.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import tempfile
import threading
import time

from stager.auth.tls import client_context, ensure_cluster_tls, server_context

WRITE = 256 << 10
CHUNK = 4 << 20


def _pump(client: ssl.SSLObject, server: ssl.SSLObject, bios: list[ssl.MemoryBIO]
          ) -> tuple[float, float]:
    """Handshake ``client`` with ``server``; their CPU seconds."""
    c_in, c_out, s_in, s_out = bios
    spent = [0.0, 0.0]
    for _ in range(10):
        for k, (obj, out, peer) in enumerate(((client, c_out, s_in), (server, s_out, c_in))):
            start = time.process_time()
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
            spent[k] += time.process_time() - start
            peer.write(out.read())
    return spent[0], spent[1]


def _pair(cctx: ssl.SSLContext, sctx: ssl.SSLContext
          ) -> tuple[ssl.SSLObject, ssl.SSLObject, list[ssl.MemoryBIO], tuple[float, float]]:
    bios = [ssl.MemoryBIO() for _ in range(4)]
    client = cctx.wrap_bio(bios[0], bios[1], server_hostname="127.0.0.1")
    server = sctx.wrap_bio(bios[2], bios[3], server_side=True)
    return client, server, bios, _pump(client, server, bios)


def handshakes(cctx: ssl.SSLContext, sctx: ssl.SSLContext, n: int) -> tuple[float, float]:
    total = [0.0, 0.0]
    for _ in range(n):
        *_, spent = _pair(cctx, sctx)
        total = [total[0] + spent[0], total[1] + spent[1]]
    return total[0] / n, total[1] / n


def in_memory(cctx: ssl.SSLContext, sctx: ssl.SSLContext, size: int) -> float:
    """CPU seconds per GB: encrypt, copy out, copy in, decrypt."""
    client, server, (c_in, _, _, s_out), _ = _pair(cctx, sctx)
    data, out = memoryview(os.urandom(CHUNK)), memoryview(bytearray(WRITE))
    start = time.process_time()
    for _ in range(size // CHUNK):
        for at in range(0, CHUNK, WRITE):
            server.write(data[at:at + WRITE])
            c_in.write(s_out.read())
            got = 0
            while got < WRITE:
                got += client.read(WRITE - got, out[got:])
    return (time.process_time() - start) / (size / 1e9)


def sending(cctx: ssl.SSLContext, sctx: ssl.SSLContext, size: int, kind: str) -> float:
    """The sending thread's CPU seconds per GB over loopback TCP."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def receive() -> None:
        with cctx.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                              server_hostname="127.0.0.1") as conn:
            buf, n = bytearray(1 << 20), 0
            while n < size and (got := conn.recv_into(buf)):
                n += got

    reader = threading.Thread(target=receive)
    reader.start()
    raw, _ = listener.accept()
    data = memoryview(os.urandom(CHUNK))
    if kind == "SSLSocket":
        conn = sctx.wrap_socket(raw, server_side=True)
        start = time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)
        for _ in range(size // CHUNK):
            for at in range(0, CHUNK, WRITE):
                conn.sendall(data[at:at + WRITE])
    else:
        s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = sctx.wrap_bio(s_in, s_out, server_side=True)
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                raw.sendall(s_out.read())
                s_in.write(raw.recv(65536))
        raw.sendall(s_out.read())
        start = time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)
        for _ in range(size // CHUNK):
            for at in range(0, CHUNK, WRITE):
                obj.write(data[at:at + WRITE])
                raw.sendall(s_out.read())
    spent = time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID) - start
    reader.join()
    raw.close()
    listener.close()
    return spent / (size / 1e9)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile_tls_floor",
                                description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=256, help="MiB per measurement (default 256)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    size = args.size << 20
    with tempfile.TemporaryDirectory() as d:
        files = ensure_cluster_tls(d)
        cctx, sctx = client_context(files.ca_cert), server_context(files.cert, files.key)
        client, server = handshakes(cctx, sctx, 100)
        print(f"handshake CPU: client {client * 1e3:.2f} ms, server {server * 1e3:.2f} ms "
              f"({_pair(cctx, sctx)[1].cipher()[0]})")
        for r in range(args.rounds):
            print(f"round {r}: encrypt + BIOs + decrypt {in_memory(cctx, sctx, size):.3f} s/GB; "
                  f"server send, memory BIO + sendall "
                  f"{sending(cctx, sctx, size, 'BIO'):.3f} s/GB, SSLSocket "
                  f"{sending(cctx, sctx, size, 'SSLSocket'):.3f} s/GB", flush=True)


if __name__ == "__main__":
    main()
