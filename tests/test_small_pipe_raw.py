"""A small ``pipe``'s gateway PUT goes over the data plane's raw HTTP/1.1 client, not
aiohttp's (client CPU: stager/client/metaconn.py); the answers and errors are the
same as aiohttp's path gives, and an answer the raw client cannot hold goes again
through aiohttp as a later try of the same key, which finds the first's file."""

from __future__ import annotations

import re

import pytest
from conftest import meta_requests, raw_to_meta

from stager.client import metaconn
from stager.client.async_client import AsyncClient
from stager.config import load_config
from stager.errors import StagerError
from stager.testing import ThreadCluster


def chunk_puts(http, cluster: ThreadCluster) -> float:  # type: ignore[no-untyped-def]
    """Chunk PUTs the data servers answered, all together (their /metrics)."""
    total = 0.0
    for target in http(cluster.meta_url, "GET", "/v1/targets").json()["targets"]:
        text = http(target["url"], "GET", "/metrics").body.decode()
        total += sum(float(v) for v in re.findall(
            r'^stager_requests_total\{op="put_chunk",status="2\d\d"\} (\S+)$', text, re.M))
    return total


async def test_a_small_pipe_goes_raw(aclient: AsyncClient, cluster: ThreadCluster,
                                     ns: str, payload) -> None:
    data = payload(1024)
    info = await aclient.pipe(f"{ns}/r.bin", data)
    assert raw_to_meta(aclient, cluster.meta_url) == 1
    again = await aclient.pipe(f"{ns}/r2.bin", data)        # the kept-alive connection
    assert raw_to_meta(aclient, cluster.meta_url) == 1
    assert (info.size, again.size) == (1024, 1024)
    assert await aclient.cat(f"{ns}/r.bin") == data
    assert (await aclient.stat(f"{ns}/r.bin", cached=False)).file_id == info.file_id


async def test_errors_as_aiohttp_gives_them(aclient: AsyncClient, cluster: ThreadCluster,
                                            ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe onto a directory: the same error (class, code, message, details) either way."""
    await aclient.mkdir(f"{ns}/d")
    with pytest.raises(StagerError) as raw:
        await aclient.pipe(f"{ns}/d", b"x")
    assert raw_to_meta(aclient, cluster.meta_url) == 1
    monkeypatch.setattr(metaconn.MetaConnection, "_direct", lambda *_: None)
    with pytest.raises(StagerError) as plain:
        await aclient.pipe(f"{ns}/d", b"x")
    assert type(raw.value) is type(plain.value)
    assert (raw.value.status, raw.value.code, str(raw.value), raw.value.details) == \
        (plain.value.status, plain.value.code, str(plain.value), plain.value.details)


async def test_a_long_answer_goes_again_through_aiohttp(
        cluster: ThreadCluster, http, ns: str, payload,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw client's answer buffer too small: the PUT was made, its answer not read;
    sent again (through aiohttp) as a later try, it answers the file the first made,
    not a second one written over it."""
    monkeypatch.setattr(metaconn, "DIRECT_ANSWER", 16)
    data = payload(1024)
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
        puts = chunk_puts(http, cluster)
        await c.pipe(f"{ns}/once.bin", data)
        once = chunk_puts(http, cluster) - puts        # a pipe's chunk copies
        before, puts = meta_requests(http, cluster), chunk_puts(http, cluster)
        info = await c.pipe(f"{ns}/long.bin", data)
        after = meta_requests(http, cluster)
        assert after["gateway_put"] - before.get("gateway_put", 0) == 2
        assert once >= 1 and chunk_puts(http, cluster) - puts == once   # not written twice
        assert await c.cat(f"{ns}/long.bin") == data
        assert (await c.stat(f"{ns}/long.bin", cached=False)).file_id == info.file_id
