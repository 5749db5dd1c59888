"""The gateway PUT's body: read whole when it fits one piece (a small file's), streamed
when longer or of unknown length; the same files and errors either way."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest

from stager import Client
from stager.errors import NotFound
from stager.meta.http.app import STREAM_PIECE
from stager.testing import ThreadCluster


def test_small_body_over_several_chunks(cluster: ThreadCluster, http, client: Client,
                                        ns: str, payload) -> None:
    """A body read whole is still cut into its layout's chunks."""
    data = payload(3 * 4096 + 5)
    r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/s.bin?chunk_size=4096", body=data)
    assert r.status == 201, r.body
    assert r.json()["size"] == len(data) and r.json()["layout"]["chunk_size"] == 4096
    assert client.cat(f"{ns}/s.bin") == data


def test_body_at_and_past_one_piece(cluster: ThreadCluster, http, client: Client, ns: str,
                                    payload) -> None:
    """The last length read whole and the first one streamed store the same bytes."""
    for size in (STREAM_PIECE, STREAM_PIECE + 1):
        data = payload(size)
        r = http(cluster.meta_url, "PUT", f"/v1/files{ns}/p{size}", body=data)
        assert r.status == 201, r.body
        assert client.cat(f"{ns}/p{size}") == data


@pytest.mark.parametrize("sent", [0, 500])
def test_body_cut_short_stores_nothing(cluster: ThreadCluster, client: Client, ns: str,
                                       sent: int) -> None:
    """A client that promises 1,000 bytes, sends ``sent`` and goes away leaves no file,
    and the server goes on serving."""
    url = urlsplit(cluster.meta_url)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(f"PUT /v1/files{ns}/cut HTTP/1.1\r\nHost: x\r\n"
                     "Content-Length: 1000\r\n\r\n".encode() + b"x" * sent)
        time.sleep(0.2)
    time.sleep(0.3)
    with pytest.raises(NotFound):
        client.stat(f"{ns}/cut")
    client.pipe(f"{ns}/after", b"ok")
    assert client.cat(f"{ns}/after") == b"ok"
