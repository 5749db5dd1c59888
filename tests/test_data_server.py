"""The data server over HTTP: chunk PUT/GET/HEAD/DELETE, batched reads, corruption."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from conftest import start_cluster

from stager import AsyncClient, Client
from stager.checksum import crc32c
from stager.dataplane import DataPlane, PlaneOptions, make_session
from stager.errors import ChunkNotFound, CorruptChunk, RangeNotSatisfiable
from stager.protocol.models import LayoutSpec, ReadItem
from stager.testing import ThreadCluster

SMALL = 64 * 1024


def new_chunk(index: int = 0) -> str:
    return f"{uuid.uuid4().hex}.{index}"


def chunk_file(cluster: ThreadCluster, i: int, chunk: str) -> Path:
    return cluster.root / f"data{i}" / "chunks" / chunk[:2] / chunk[2:4] / chunk


def put(http, url: str, chunk: str, data: bytes, crc: int | None = None):  # type: ignore[no-untyped-def]
    crc = crc32c(data) if crc is None else crc
    return http(url, "PUT", f"/v1/chunks/{chunk}", body=data,
                headers={"X-Stager-Crc32c": f"{crc:08x}"})


@pytest.fixture
def data_url(cluster: ThreadCluster) -> str:
    server = cluster.data[0]
    assert server is not None
    return server.url


def test_put_get_head_delete(cluster: ThreadCluster, http, data_url: str, payload) -> None:
    data = payload(SMALL * 2 + 11)
    chunk = new_chunk()
    r = put(http, data_url, chunk, data)
    assert r.status == 201
    assert r.json() == {"chunk": chunk, "size": len(data), "crc32c": f"{crc32c(data):08x}"}
    assert chunk_file(cluster, 0, chunk).exists()

    r = http(data_url, "GET", f"/v1/chunks/{chunk}")
    assert r.status == 200 and r.body == data
    assert r.headers["X-Stager-Crc32c"] == f"{crc32c(data):08x}"
    assert r.headers["X-Stager-Chunk-Size"] == str(len(data))
    assert r.headers["X-Stager-Target"] == cluster.target_id(0)
    assert r.headers["Accept-Ranges"] == "bytes"

    h = http(data_url, "HEAD", f"/v1/chunks/{chunk}")
    assert h.status == 200 and h.body == b""
    assert h.headers["Content-Length"] == str(len(data))
    assert h.headers["X-Stager-Crc32c"] == f"{crc32c(data):08x}"

    d = http(data_url, "DELETE", f"/v1/chunks/{chunk}")
    assert d.status == 200 and d.json() == {"deleted": True}
    assert not chunk_file(cluster, 0, chunk).exists()
    assert http(data_url, "DELETE", f"/v1/chunks/{chunk}").json() == {"deleted": False}
    assert http(data_url, "GET", f"/v1/chunks/{chunk}").status == 404
    assert http(data_url, "HEAD", f"/v1/chunks/{chunk}").status == 404


def test_wrong_crc_is_refused_and_nothing_is_stored(cluster: ThreadCluster, http,
                                                    data_url: str) -> None:
    chunk = new_chunk()
    data = b"payload" * 1000
    r = put(http, data_url, chunk, data, crc=crc32c(data) ^ 1)
    assert r.status == 400
    body = r.json()
    assert body["error"] == "checksum_mismatch"
    assert body["details"]["chunk"] == chunk
    assert not chunk_file(cluster, 0, chunk).exists()
    assert not list((cluster.root / "data0" / "chunks").rglob("*.tmp"))
    assert http(data_url, "GET", f"/v1/chunks/{chunk}").status == 404


def test_put_is_idempotent(cluster: ThreadCluster, http, data_url: str) -> None:
    chunk = new_chunk(3)
    data = os.urandom(5000)
    before = _stored_count(http, data_url)
    for _ in range(3):
        assert put(http, data_url, chunk, data).status == 201
    assert _stored_count(http, data_url) == before + 1
    assert http(data_url, "GET", f"/v1/chunks/{chunk}").body == data
    files = [p for p in chunk_file(cluster, 0, chunk).parent.iterdir()
             if p.name.startswith(chunk.split(".")[0])]
    assert [p.name for p in files] == [chunk]


def _stored_count(http, url: str) -> int:  # type: ignore[no-untyped-def]
    for line in http(url, "GET", "/metrics").body.decode().splitlines():
        if line.startswith("stager_target_chunks "):
            return int(float(line.split()[1]))
    raise AssertionError("no stager_target_chunks gauge")


@pytest.mark.parametrize("header, start, stop", [
    ("bytes=0-9", 0, 10), ("bytes=70000-", 70000, 3 * SMALL), ("bytes=-5", 3 * SMALL - 5,
                                                               3 * SMALL),
    (f"bytes={SMALL - 3}-{SMALL + 2}", SMALL - 3, SMALL + 3),
    ("bytes=100-99999999", 100, 3 * SMALL),
])
def test_ranged_get(http, data_url: str, payload, header: str, start: int, stop: int) -> None:
    data = payload(3 * SMALL)
    chunk = new_chunk()
    put(http, data_url, chunk, data)
    r = http(data_url, "GET", f"/v1/chunks/{chunk}", headers={"Range": header})
    assert r.status == 206
    assert r.body == data[start:stop]
    assert r.headers["Content-Range"] == f"bytes {start}-{stop - 1}/{len(data)}"


def test_unsatisfiable_chunk_range(http, data_url: str) -> None:
    chunk = new_chunk()
    put(http, data_url, chunk, b"0123456789")
    for header in ("bytes=10-", "bytes=20-30", "bytes=9-3", "bytes=x-1"):
        r = http(data_url, "GET", f"/v1/chunks/{chunk}", headers={"Range": header})
        assert r.status == 416
        assert r.headers["Content-Range"] == "bytes */10"
        assert r.json()["error"] == "range_not_satisfiable"


def test_batched_read_returns_pieces_in_order(http, data_url: str, payload) -> None:
    a, b = payload(SMALL + 5), payload(SMALL * 2)[::-1]
    ca, cb = new_chunk(0), new_chunk(1)
    put(http, data_url, ca, a)
    put(http, data_url, cb, b)
    items = [(cb, 10, 100), (ca, 0, 1), (ca, SMALL - 2, 7), (cb, 0, 0), (cb, SMALL * 2 - 1, 1),
             (ca, 0, SMALL + 5), (cb, 5, 5)]
    blobs = {ca: a, cb: b}
    expected = b"".join(blobs[c][o:o + n] for c, o, n in items)
    r = http(data_url, "POST", "/v1/read",
             body=json.dumps({"items": [list(i) for i in items]}).encode())
    assert r.status == 200
    assert r.headers["Content-Length"] == str(len(expected))
    assert r.body == expected
    # past the end of a chunk, or a chunk that is not there: refused before any byte
    r = http(data_url, "POST", "/v1/read", body=json.dumps({"items": [[ca, SMALL, 6]]}).encode())
    assert r.status == 416 and r.json()["error"] == "range_not_satisfiable"
    r = http(data_url, "POST", "/v1/read",
             body=json.dumps({"items": [[ca, 0, 1], [new_chunk(), 0, 1]]}).encode())
    assert r.status == 404 and r.json()["error"] == "chunk_not_found"


async def test_batched_read_through_the_data_plane(data_url: str, cluster: ThreadCluster,
                                                   payload) -> None:
    """Many pieces, more than one 4 MiB slice of the response, over the client transport."""
    big = payload(4 * 1024 * 1024 + 3)
    chunk = new_chunk()
    target = cluster.target_id(0)
    options = PlaneOptions()
    async with make_session(options) as session:
        plane = DataPlane(session, options)
        await plane.put_chunk(target, data_url, chunk, big, crc32c(big))
        items = [ReadItem(chunk, off, 300_001) for off in range(0, len(big) - 300_001, 250_000)]
        items.append(ReadItem(chunk, 0, len(big)))
        out = bytearray(sum(i.length for i in items))
        await plane.batch_read_into(target, data_url, items, memoryview(out))
        pos = 0
        for item in items:
            assert out[pos:pos + item.length] == big[item.offset:item.offset + item.length]
            pos += item.length
        with pytest.raises(RangeNotSatisfiable):
            await plane.batch_read_into(target, data_url, [ReadItem(chunk, len(big), 1)],
                                        memoryview(bytearray(1)))
        with pytest.raises(ChunkNotFound):
            await plane.read_chunk_into(target, data_url, new_chunk(), 0,
                                        memoryview(bytearray(1)))
        assert plane.counters[target].bytes_read == len(out) and plane.counters[target].errors


def test_purge_deletes_every_chunk_of_a_file(cluster: ThreadCluster, http,
                                             data_url: str) -> None:
    fid = uuid.uuid4().hex
    for i in range(4):
        put(http, data_url, f"{fid}.{i}", b"x" * (i + 1))
    other = new_chunk()
    put(http, data_url, other, b"keep")
    r = http(data_url, "POST", "/v1/purge", body=json.dumps({"file_ids": [fid]}).encode())
    assert r.status == 200 and r.json() == {"removed": 4}
    assert all(not chunk_file(cluster, 0, f"{fid}.{i}").exists() for i in range(4))
    assert http(data_url, "GET", f"/v1/chunks/{other}").body == b"keep"
    r = http(data_url, "POST", "/v1/purge", body=json.dumps({"file_ids": [fid]}).encode())
    assert r.json() == {"removed": 0}


# -- corruption --------------------------------------------------------------------------
def _file_on_one_target(client: Client, cluster: ThreadCluster, path: str, data: bytes,
                        replicas: int = 1) -> tuple[str, list[int]]:
    """Write ``data`` as one 128 KiB chunk; returns its chunk id and the data servers holding it."""
    info = client.pipe(path, data, layout=LayoutSpec(chunk_size=2 * SMALL, stripe_count=3,
                                                     replicas=replicas))
    assert info.layout is not None and info.file_id is not None
    holders = []
    for i in range(cluster.n):
        if chunk_file(cluster, i, f"{info.file_id}.0").exists():
            holders.append(i)
    assert len(holders) == replicas
    return f"{info.file_id}.0", holders


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x40]))


def test_flipped_byte_is_detected(client: Client, cluster: ThreadCluster, http, ns: str,
                                  payload) -> None:
    data = payload(2 * SMALL)
    chunk, [i] = _file_on_one_target(client, cluster, f"{ns}/c.bin", data)
    _flip(chunk_file(cluster, i, chunk), SMALL + 100)          # in block 1
    url = cluster.data[i].url  # type: ignore[union-attr]
    # a ranged read touching the bad block is refused by the server
    r = http(url, "GET", f"/v1/chunks/{chunk}", headers={"Range": f"bytes={SMALL}-{SMALL + 200}"})
    assert r.status == 500 and r.json()["error"] == "chunk_corrupt"
    assert r.json()["details"]["block"] == 1
    # a ranged read of a good block still works (verified block by block)
    r = http(url, "GET", f"/v1/chunks/{chunk}", headers={"Range": "bytes=0-99"})
    assert r.status == 206 and r.body == data[:100]
    # the batched read verifies too
    r = http(url, "POST", "/v1/read", body=json.dumps({"items": [[chunk, SMALL, 10]]}).encode())
    assert r.status == 500 and r.json()["error"] == "chunk_corrupt"
    # a whole-chunk GET is zero-copy and unverified on the server, but its header still
    # carries the CRC stored at write, which the bytes no longer match
    r = http(url, "GET", f"/v1/chunks/{chunk}")
    assert r.status == 200 and crc32c(r.body) != int(r.headers["X-Stager-Crc32c"], 16)
    # the client never returns the wrong bytes, whole or ranged
    with pytest.raises(CorruptChunk):
        client.cat(f"{ns}/c.bin")
    with pytest.raises(CorruptChunk):
        client.cat(f"{ns}/c.bin", SMALL, SMALL + 10)
    assert client.cat(f"{ns}/c.bin", 0, 100) == data[:100]
    # nor does the gateway
    r = http(cluster.meta_url, "GET", f"/v1/files{ns}/c.bin")
    assert r.status == 500 and r.json()["error"] == "chunk_corrupt"


@pytest.fixture
def unrepaired(tmp_path: Path) -> Iterator[ThreadCluster]:
    """A cluster whose data servers never scrub, so no repair rewrites a copy a test
    damaged.  On the shared cluster a read of a bad copy has it repaired in the
    background (see stager/data/scrub.py); that repair could land after a test's
    later byte flips and put good bytes back under it."""
    c = start_cluster(tmp_path, 3, scrub_interval=0)
    yield c
    c.stop()


async def test_corrupt_replica_fails_over_to_a_good_one(unrepaired: ThreadCluster, ns: str,
                                                        payload) -> None:
    """Failover and the all-copies-bad error, not repair (tests/test_scrub.py has that):
    on a cluster that does not repair, the copies stay as the test damages them."""
    cluster = unrepaired
    data = payload(2 * SMALL)
    with Client(cluster.meta_url) as c:
        chunk, holders = _file_on_one_target(c, cluster, f"{ns}/r.bin", data, replicas=2)
    for i in holders[:1]:
        _flip(chunk_file(cluster, i, chunk), 5)
    async with AsyncClient(cluster.meta_url) as c:
        for _ in range(3):      # whichever replica is tried first, the answer is right
            assert await c.cat(f"{ns}/r.bin") == data
            assert await c.cat(f"{ns}/r.bin", 0, 10) == data[:10]
    for i in holders:
        _flip(chunk_file(cluster, i, chunk), 5 if i == holders[1] else 6)
    async with AsyncClient(cluster.meta_url) as c:
        with pytest.raises(CorruptChunk):
            await c.cat(f"{ns}/r.bin")


async def test_corruption_late_in_a_batch_cuts_the_response(cluster: ThreadCluster,
                                                            data_url: str, payload) -> None:
    """Past the first 4 MiB slice the headers have gone: the body is cut short, and the
    client raises instead of handing back wrong bytes."""
    big = payload(5 * 1024 * 1024)
    chunk = new_chunk()
    target = cluster.target_id(0)
    options = PlaneOptions()
    async with make_session(options) as session:
        plane = DataPlane(session, options)
        await plane.put_chunk(target, data_url, chunk, big, crc32c(big))
        _flip(chunk_file(cluster, 0, chunk), len(big) - 10)
        items = [ReadItem(chunk, 0, 4 * 1024 * 1024), ReadItem(chunk, len(big) - 20, 20)]
        out = bytearray(sum(i.length for i in items))
        with pytest.raises(ConnectionError):
            await plane.batch_read_into(target, data_url, items, memoryview(out))


@pytest.mark.parametrize("damage", ["trailer", "footer", "truncate", "append"])
def test_damaged_trailer_or_length_is_corrupt(client: Client, cluster: ThreadCluster, http,
                                              ns: str, payload, damage: str) -> None:
    data = payload(2 * SMALL)
    chunk, [i] = _file_on_one_target(client, cluster, f"{ns}/t.bin", data)
    path = chunk_file(cluster, i, chunk)
    size = path.stat().st_size
    if damage == "trailer":
        _flip(path, 2 * SMALL + 1)                 # in the block CRC table
    elif damage == "footer":
        _flip(path, size - 10)
    elif damage == "truncate":
        os.truncate(path, size - 1)
    else:
        with open(path, "ab") as fh:
            fh.write(b"\0")
    url = cluster.data[i].url  # type: ignore[union-attr]
    for headers in ({}, {"Range": "bytes=0-9"}):
        r = http(url, "GET", f"/v1/chunks/{chunk}", headers=headers)
        assert r.status == 500 and r.json()["error"] == "chunk_corrupt"
    assert http(url, "HEAD", f"/v1/chunks/{chunk}").status == 500
    with pytest.raises(CorruptChunk):
        client.cat(f"{ns}/t.bin")


async def test_data_server_health_and_identity(cluster: ThreadCluster, data_url: str) -> None:
    async with aiohttp.ClientSession() as s, s.get(f"{data_url}/v1/health") as r:
        body = await r.json()
    assert body["ok"] is True and body["role"] == "data"
    assert body["id"] == cluster.target_id(0) and body["node"] == "node0"
