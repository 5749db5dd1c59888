"""Requests whose outcome the client cannot know: a proxy that forwards a request to
the metadata server and then breaks the connection before answering (a server that
acted and died before it could say so), and one that is down for a while.  The
client sends such a request again with the same idempotency key; it acts once.

Split from tests/test_meta_failover.py (failover order and the keys' own cases), whose
helpers it shares.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from test_meta_failover import pending_uploads

from stager import AsyncClient
from stager.client.async_client import SMALL_FILE
from stager.config import load_config
from stager.errors import NotFound, UploadNotFound
from stager.protocol.batch import CreateItem, batch_body
from stager.protocol.headers import IDEMPOTENCY_KEY
from stager.protocol.models import FileInfo
from stager.protocol.routes import route
from stager.testing import ThreadCluster


class CuttingProxy:
    """Forwards every request to ``upstream`` and, for the first ``cuts`` mutating
    ones, breaks the connection instead of answering: the request took effect and
    the client cannot know.  Records the idempotency key of each request it saw."""

    def __init__(self, upstream: str, cuts: int) -> None:
        self.upstream, self.cuts = upstream, cuts
        self.keys: list[str | None] = []
        self.answers: list[Any] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.keys.append(request.headers.get(IDEMPOTENCY_KEY))
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length", "transfer-encoding")}
        async with aiohttp.ClientSession() as s, \
                s.request(request.method, self.upstream + request.path_qs,
                          data=await request.read(), headers=headers) as resp:
            status, raw = resp.status, await resp.read()
        if request.method != "GET" and self.cuts > 0:
            self.cuts -= 1
            self.answers.append(json.loads(raw))
            assert request.transport is not None
            request.transport.abort()                   # acted, and never said so
            raise ConnectionResetError("cut")
        return web.Response(status=status, body=raw,
                            headers={"Content-Type": "application/json"})

    async def __aenter__(self) -> CuttingProxy:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


@pytest.fixture
async def proxy(cluster: ThreadCluster) -> AsyncIterator[CuttingProxy]:
    async with CuttingProxy(cluster.meta_url, cuts=1) as p:
        yield p


async def test_an_unknown_outcome_is_sent_again_with_the_same_key(
        cluster: ThreadCluster, proxy: CuttingProxy, ns: str) -> None:
    """The create reaches the server through the proxy and takes effect; the answer is
    lost.  The client sends it again, with the same key, to the next server, which
    answers what was answered then: one upload, the client's."""
    before = pending_uploads(cluster)
    async with AsyncClient([proxy.url, cluster.meta_url], config=load_config(env={})) as c:
        body = batch_body([CreateItem(f"{ns}/once", None, True).to_json()])
        [answer] = (await c.meta.request(route("create"), body=body))["results"]
        assert c.meta.url == cluster.meta_url
    assert proxy.keys and proxy.keys[0] is not None
    assert answer["file_id"] == proxy.answers[0]["results"][0]["file_id"]  # the first try's
    assert pending_uploads(cluster) - before == {answer["file_id"]}


async def test_whole_writes_through_a_cutting_server_make_one_file_each(
        cluster: ThreadCluster, ns: str) -> None:
    """pipe, rename, pipe of an empty file (one request) and write_many, each by a new
    client whose first mutating request is cut after it took effect: every write lands
    once, nothing is left pending."""
    config = load_config(env={})
    async with CuttingProxy(cluster.meta_url, cuts=0) as proxy:
        before = pending_uploads(cluster)

        async def through_cut(op: Any) -> Any:
            proxy.cuts = 1
            async with AsyncClient([proxy.url, cluster.meta_url], config=config) as c:
                result = await op(c)
            assert proxy.cuts == 0          # it was cut, and the client got its answer
            return result

        info = await through_cut(lambda c: c.pipe(f"{ns}/p", b"x" * 1000))
        await through_cut(lambda c: c.rename(f"{ns}/p", f"{ns}/q"))
        proxy.keys.clear()
        empty = await through_cut(lambda c: c.pipe(f"{ns}/e", b""))     # one PUT, sent twice
        assert len(proxy.keys) == 2 and len(set(proxy.keys)) == 1 and empty.size == 0
        many = await through_cut(lambda c: c.write_many(
            [(f"{ns}/m{i}", bytes([i]) * 100) for i in range(5)]))
        async with AsyncClient(cluster.meta_url, config=config) as c:
            with pytest.raises(NotFound):
                await c.stat(f"{ns}/p", cached=False)
            assert (await c.stat(f"{ns}/q", cached=False)).file_id == info.file_id
            assert await c.cat(f"{ns}/q") == b"x" * 1000
            assert len(many) == 5
            for i in range(5):
                assert await c.cat(f"{ns}/m{i}") == bytes([i]) * 100
            assert (await c.stat(f"{ns}/e", cached=False)).file_id == empty.file_id
        assert len(proxy.answers) == 4
        assert pending_uploads(cluster) == before


class OutageProxy(CuttingProxy):
    """Cuts the first commit after it took effect, then answers 503 to everything
    until ``down`` is cleared: a metadata tier that went away mid-commit."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, cuts=0)
        self.down = False
        self.cut_done = asyncio.Event()
        self.commit_keys: list[str | None] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        # a commit, or a small file's PUT (which commits it in the same request)
        committing = request.path.endswith("/commit") or (
            request.method == "PUT" and request.path.startswith("/v1/files/"))
        if committing:
            self.commit_keys.append(request.headers.get(IDEMPOTENCY_KEY))
        if self.down:
            return web.json_response({"error": "unavailable", "message": "down"}, status=503)
        if committing and not self.cut_done.is_set():
            self.cuts = 1
            try:
                return await super().handle(request)
            finally:
                self.down = True
                self.cut_done.set()
        return await super().handle(request)


@pytest.mark.parametrize("replaced", [False, True], ids=["alone", "replaced"])
@pytest.mark.parametrize("how", ["pipe", "small pipe", "write_many"])
async def test_a_commit_of_unknown_outcome_is_settled_not_written_again(
        cluster: ThreadCluster, ns: str, how: str, replaced: bool) -> None:
    """The commit takes effect and its answer is lost; the metadata tier then answers
    503 for a while.  The writer asks about its commit again, with the same key, once
    the tier is back, and never writes the file afresh: alone, it learns its commit
    was done; when another writer replaced the file meanwhile, it gets an error
    saying so (a small pipe, one PUT, too: no answer of it is recorded, its retry
    finds what its first try did), and the later file stays."""
    path = f"{ns}/raced"
    first_bytes = b"first" * (100 if how != "pipe" else SMALL_FILE // 5 + 1)
    before = pending_uploads(cluster)
    config = load_config({"retries": 0}, env={})
    async with OutageProxy(cluster.meta_url) as proxy, \
            AsyncClient(proxy.url, config=config) as first, \
            AsyncClient(cluster.meta_url, config=config) as later:
        if how != "write_many":
            task = asyncio.ensure_future(first.pipe(path, first_bytes))
        else:
            task = asyncio.ensure_future(first.write_many([(path, first_bytes)]))
        await asyncio.wait_for(proxy.cut_done.wait(), 30)
        assert await later.cat(path) == first_bytes              # the cut commit took effect
        first_id = (await later.stat(path, cached=False)).file_id
        if replaced:
            await later.pipe(path, b"later")
        await asyncio.sleep(0.6)                 # the first writer asks again meanwhile
        proxy.down = False
        try:
            result = await asyncio.wait_for(task, 60)
            info = result if how != "write_many" else result[0]
        except UploadNotFound as exc:
            info = exc
        if replaced:
            assert isinstance(info, UploadNotFound), info
            assert "not written again" in str(info)
            assert await later.cat(path) == b"later"             # not written again over it
        else:
            assert isinstance(info, FileInfo), info
            assert info.file_id == first_id                      # the first try's file
            assert await later.cat(path) == first_bytes
        assert len(proxy.commit_keys) >= 2                       # it did ask again...
        assert len(set(proxy.commit_keys)) == 1                  # ...with the same key
    assert pending_uploads(cluster) == before
