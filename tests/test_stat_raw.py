"""A stat goes over the data plane's raw HTTP/1.1 client, not aiohttp's (issue 30:
the client's CPU per stat; stager/client/metaconn.py), and answers as aiohttp's
path does: the same file info, the same errors, and an answer longer than the raw
client's buffer read again through aiohttp."""

from __future__ import annotations

import pytest
from conftest import meta_requests, raw_to_meta

from stager.client import metaconn
from stager.client.async_client import AsyncClient
from stager.config import load_config
from stager.errors import NotFound, StagerError
from stager.testing import ThreadCluster


async def test_a_stat_goes_raw_on_one_kept_connection(aclient: AsyncClient,
                                                      cluster: ThreadCluster, ns: str) -> None:
    await aclient.mkdir(f"{ns}/d")
    written = await aclient.pipe(f"{ns}/d/f", b"stat me")
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
        for _ in range(3):
            info = await c.stat(f"{ns}/d/f", cached=False)
        assert raw_to_meta(c, cluster.meta_url) == 1
        assert (info.file_id, info.size) == (written.file_id, 7)
        assert (await c.stat(f"{ns}/d", cached=False)).is_dir


async def test_the_same_answers_as_aiohttp_gives(cluster: ThreadCluster, ns: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A file's info and a missing path's error: equal either way."""
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
        await c.pipe(f"{ns}/same", b"x" * 100)
        raw = await c.stat(f"{ns}/same", cached=False)
        with pytest.raises(NotFound) as raw_missing:
            await c.stat(f"{ns}/missing", cached=False)
        monkeypatch.setattr(metaconn.MetaConnection, "_direct", lambda *_: None)
        plain = await c.stat(f"{ns}/same", cached=False)
        with pytest.raises(StagerError) as plain_missing:
            await c.stat(f"{ns}/missing", cached=False)
    assert raw == plain
    assert type(raw_missing.value) is type(plain_missing.value)
    assert (raw_missing.value.status, raw_missing.value.code, str(raw_missing.value),
            raw_missing.value.details) == \
        (plain_missing.value.status, plain_missing.value.code, str(plain_missing.value),
         plain_missing.value.details)


async def test_a_long_answer_is_asked_again_through_aiohttp(
        cluster: ThreadCluster, http, ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw client's buffer too short for the answer: the stat is sent again
    through aiohttp (a GET: nothing acted on twice) and answers the file."""
    async with AsyncClient(cluster.meta_url, config=load_config(env={})) as c:
        written = await c.pipe(f"{ns}/long", b"y" * 10)
        monkeypatch.setattr(metaconn, "DIRECT_ANSWER", 16)
        before = meta_requests(http, cluster).get("stat", 0)
        info = await c.stat(f"{ns}/long", cached=False)
        assert meta_requests(http, cluster)["stat"] - before == 2
    assert (info.file_id, info.size) == (written.file_id, 10)
