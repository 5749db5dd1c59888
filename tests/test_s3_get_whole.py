"""A whole-object GET's pieces are lent by the reader and handed back once sent
(stager/s3/objects.py, ``_hand_back``): a slow client, whose connection keeps
megabytes unsent, and clients reading the same object at once still get every byte
as written."""

from __future__ import annotations

import hashlib
import http.client
import random
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import raw_http

from stager.client import Client
from stager.protocol.models import LayoutSpec
from stager.testing.cluster import ThreadCluster
from stager.testing.s3cluster import S3Thread

MiB = 1 << 20
SIZE = 24 * MiB + 12345


@pytest.fixture(scope="module")
def s3(cluster: ThreadCluster) -> Iterator[tuple[S3Thread, bytes]]:
    data = random.Random(7).randbytes(SIZE)
    with S3Thread(cluster.meta_url) as gw, Client(cluster.meta_url) as c:
        assert raw_http(gw.url, "PUT", "/whole").status == 200
        c.pipe("/whole/obj", data, layout=LayoutSpec(chunk_size=MiB))
        yield gw, data


def _get(url: str, *, pause: float = 0.0, headers: dict[str, str] | None = None) -> bytes:
    host, port = url.rsplit("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    conn.request("GET", "/whole/obj", headers=headers or {})
    reply = conn.getresponse()
    assert reply.status in (200, 206)
    out = bytearray()
    while piece := reply.read(256 * 1024):
        out += piece
        time.sleep(pause)       # the gateway's sends back up behind a slow reader
    conn.close()
    return bytes(out)


def test_a_slow_client_gets_every_byte(s3: tuple[S3Thread, bytes]) -> None:
    gw, data = s3
    assert hashlib.md5(_get(gw.url, pause=0.002)).digest() == hashlib.md5(data).digest()


def test_clients_reading_one_object_at_once_get_their_own_bytes(
        s3: tuple[S3Thread, bytes]) -> None:
    gw, data = s3
    with ThreadPoolExecutor(4) as pool:
        whole = [pool.submit(_get, gw.url, pause=p) for p in (0.0, 0.001, 0.0)]
        part = pool.submit(_get, gw.url, headers={"Range": f"bytes={3 * MiB + 5}-"})
        for got in whole:
            assert got.result() == data
        assert part.result() == data[3 * MiB + 5:]
