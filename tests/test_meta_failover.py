"""Clients with several metadata servers: failover order, and idempotency keys.

Real servers on loopback: the module's cluster and a port nobody listens on.  The
requests whose outcome the client cannot know (a proxy that acts and cuts the
connection) are in tests/test_meta_unknown_outcome.py.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import aiohttp
import fsspec
import pytest

from stager import AsyncClient, Client
from stager.config import load_config
from stager.errors import Unavailable, UploadNotFound
from stager.loader.dataset import parse_source
from stager.meta.http.app import SERVICE
from stager.protocol.batch import CommitItem, CreateItem
from stager.protocol.headers import ATTEMPT, IDEMPOTENCY_KEY, REPLAYED
from stager.protocol.metaurls import from_hosts, meta_urls
from stager.protocol.models import LayoutSpec
from stager.protocol.routes import route
from stager.testing import ThreadCluster


def dead_url() -> str:
    """The URL of a loopback port that nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def pending_uploads(cluster: ThreadCluster) -> set[str]:
    """The file ids of every upload begun and not yet committed or aborted."""
    assert cluster.meta is not None
    store = cluster.meta.app[SERVICE].store
    future = asyncio.run_coroutine_threadsafe(store.expired_uploads(1e12), cluster.loop)
    return {u.file_id for u in future.result(10)}


def test_meta_urls_parse_lists_strings_and_hosts() -> None:
    assert meta_urls("http://a:1/, http://b:2,http://a:1") == ("http://a:1", "http://b:2")
    assert meta_urls(["http://a:1", "http://b:2,http://c:3"]) == (
        "http://a:1", "http://b:2", "http://c:3")
    assert from_hosts("a:7070,b:7070") == "http://a:7070,http://b:7070"
    assert parse_source("stager://a:7070,b:7070/data/x") == (
        "/data/x", "http://a:7070,http://b:7070")
    with pytest.raises(ValueError):
        meta_urls(" , ")


async def test_a_refused_server_is_skipped_and_the_one_that_answered_is_kept(
        cluster: ThreadCluster, ns: str) -> None:
    dead = dead_url()
    async with AsyncClient([dead, cluster.meta_url], config=load_config(env={})) as c:
        assert c.meta_url == f"{dead},{cluster.meta_url}"
        assert c.meta.url == dead                       # first in the list, at first
        await c.pipe(f"{ns}/a", b"hello")               # a create and a commit: mutating
        assert c.meta.url == cluster.meta_url           # remembered
        assert await c.cat(f"{ns}/a") == b"hello"
    # a comma-separated string does the same, through the blocking client
    with Client(f"{dead},{cluster.meta_url}", config=load_config(env={})) as c:
        assert c.cat(f"{ns}/a") == b"hello"
    # the live one first: the dead one is never tried
    async with AsyncClient(f"{cluster.meta_url},{dead}", config=load_config(env={})) as c:
        assert (await c.stat(f"{ns}/a")).size == 5
        assert c.meta.url == cluster.meta_url


async def test_all_servers_dead_is_unavailable_naming_them(ns: str) -> None:
    urls = [dead_url(), dead_url()]
    config = load_config({"retries": 1}, env={})
    async with AsyncClient(urls, config=config) as c:
        with pytest.raises(Unavailable) as caught:
            await c.mkdir(f"{ns}/d")
    assert urls[0] in str(caught.value) and urls[1] in str(caught.value)


async def test_fsspec_takes_several_hosts(cluster: ThreadCluster, ns: str) -> None:
    host = cluster.meta_url.removeprefix("http://")
    dead = dead_url().removeprefix("http://")
    fs, path = fsspec.core.url_to_fs(f"stager://{dead},{host}{ns}/f")
    fs.pipe_file(path, b"through the second")
    assert fs.cat_file(path) == b"through the second"
    assert fs.unstrip_protocol(path) == f"stager://{dead},{host}{ns}/f"


def forget_answers(cluster: ThreadCluster) -> None:
    """Drop every recorded answer: as if the server had died right after acting."""
    assert cluster.meta is not None
    store = cluster.meta.app[SERVICE].store
    asyncio.run_coroutine_threadsafe(store.expire_answers(1e12), cluster.loop).result(10)


async def _post(session: aiohttp.ClientSession, url: str, body: Any,
                key: str, attempt: int = 1) -> tuple[int, Any, bool]:
    headers = {IDEMPOTENCY_KEY: key, ATTEMPT: str(attempt)}
    async with session.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(), resp.headers.get(REPLAYED) == "1"


async def _write(session: aiohttp.ClientSession, meta: str, op: str, item: Any,
                 key: str, attempt: int = 1) -> tuple[int, Any, bool]:
    """``op`` (create, commit) of one item, a batch of one: its result, and the status
    it has (an error in its place is answered with its own status)."""
    status, answer, replayed = await _post(session, route(op).url(meta),
                                           {"items": [item]}, key, attempt)
    if status == 200:
        [answer] = answer["results"]
        status = answer["status"] if "error" in answer else 200
    return status, answer, replayed


async def test_a_repeated_key_gets_the_first_answer_and_acts_once(
        cluster: ThreadCluster, ns: str) -> None:
    meta = cluster.meta_url
    async with aiohttp.ClientSession() as s:
        body = CreateItem(f"{ns}/k", None, True).to_json()
        key = uuid.uuid4().hex
        first = await _write(s, meta, "create", body, key)
        again = await _write(s, meta, "create", body, key, attempt=2)
        assert first[0] == again[0] == 200
        assert again[1] == first[1]                             # the same upload
        file_id = first[1]["file_id"]
        assert file_id in pending_uploads(cluster)
        # a commit sent twice answers the committed file twice, never a 404
        commit = {"file_id": file_id, "size": 0, "checksums": []}
        ckey = uuid.uuid4().hex
        done = await _write(s, meta, "commit", commit, ckey)
        redone = await _write(s, meta, "commit", commit, ckey, attempt=2)
        assert done[0] == redone[0] == 200 and redone[1] == done[1]
        assert file_id not in pending_uploads(cluster)
        # without the key it would have acted again: the upload is gone
        status, answer, _ = await _write(s, meta, "commit", commit,
                                        uuid.uuid4().hex)
        assert status == 404 and answer["error"] == "upload_not_found"
        # a rename and a remove are applied once
        rename = {"src": f"{ns}/k", "dst": f"{ns}/k2", "overwrite": False}
        rkey = uuid.uuid4().hex
        assert (await _post(s, route("rename").url(meta), rename, rkey))[0] == 200
        renamed = await _post(s, route("rename").url(meta), rename, rkey, attempt=2)
        assert renamed[0] == 200 and renamed[2] and renamed[1]["path"] == f"{ns}/k2"
        remove = {"path": f"{ns}/k2", "recursive": False}
        xkey = uuid.uuid4().hex
        removed = await _post(s, route("remove").url(meta), remove, xkey)
        again = await _post(s, route("remove").url(meta), remove, xkey, attempt=2)
        assert again[2] and again[1] == removed[1] and removed[1]["removed"] == 1
        # a client that does not number its tries is answered from the record too
        async with s.post(route("remove").url(meta), json=remove,
                          headers={IDEMPOTENCY_KEY: xkey}) as resp:
            assert resp.status == 200 and resp.headers[REPLAYED] == "1"
        # a key is bound to its route: the same key on another acts afresh
        made = await _post(s, route("mkdir").url(meta),
                           {"path": f"{ns}/dir", "parents": True, "exist_ok": False}, key)
        assert made[0] == 200 and not made[2] and made[1]["type"] == "directory"


async def test_a_whole_file_put_records_no_answer_and_its_retry_finds_its_file(
        cluster: ThreadCluster, ns: str) -> None:
    """A gateway PUT (a small ``pipe``) answers its retries itself, like a create and a
    commit: the store writes no answer for it (one write fewer per small file), and
    a retry with the same key answers the file the first try committed, not replayed
    and not written again."""
    assert cluster.meta is not None
    store = cluster.meta.app[SERVICE].store
    path, key = f"{ns}/put-once", uuid.uuid4().hex
    url = f"{cluster.meta_url}/v1/files{path}"
    async with aiohttp.ClientSession() as s:
        answers = []
        for attempt in (1, 2):
            async with s.put(url, data=b"once", headers={
                    IDEMPOTENCY_KEY: key, ATTEMPT: str(attempt)}) as resp:
                assert resp.status == 201 and REPLAYED not in resp.headers
                answers.append(await resp.json())
    assert answers[0]["file_id"] == answers[1]["file_id"]
    assert cluster.call(store.recorded_answer(f"- PUT /v1/files{path} {key}")) is None
    assert Client(cluster.meta_url).cat(path) == b"once"


async def test_a_retry_finds_the_work_of_a_try_whose_answer_was_not_recorded(
        cluster: ThreadCluster, ns: str) -> None:
    """The server acted and died before recording its answer: the client's next try
    (X-Stager-Attempt 2) finds the upload the create began and the file the commit
    made, for a batch of one and for a larger batch."""
    meta = cluster.meta_url
    async with aiohttp.ClientSession() as s:
        key = uuid.uuid4().hex
        body = CreateItem(f"{ns}/gap", None, True).to_json()
        first = await _write(s, meta, "create", body, key)
        forget_answers(cluster)
        again = await _write(s, meta, "create", body, key, attempt=2)
        assert again[0] == 200 and not again[2] and again[1] == first[1]
        file_id = first[1]["file_id"]
        assert [u for u in pending_uploads(cluster) if u == file_id] == [file_id]
        commit = CommitItem(file_id, 0, ()).to_json()
        ckey = uuid.uuid4().hex
        done = await _write(s, meta, "commit", commit, ckey)
        forget_answers(cluster)
        redone = await _write(s, meta, "commit", commit, ckey, attempt=2)
        assert redone[0] == 200 and not redone[2] and redone[1]["file_id"] == file_id
        assert redone[1]["path"] == done[1]["path"] == f"{ns}/gap"
        # batched: two creates, then their commits, each sent twice across the gap
        items = {"items": [CreateItem(f"{ns}/b{i}", None, True).to_json() for i in range(2)]}
        bkey = uuid.uuid4().hex
        made = await _post(s, route("create").url(meta), items, bkey)
        forget_answers(cluster)
        remade = await _post(s, route("create").url(meta), items, bkey, attempt=2)
        assert remade[1] == made[1]
        ids = [r["file_id"] for r in made[1]["results"]]
        commits = {"items": [CommitItem(f, 0, ()).to_json() for f in ids]}
        mkey = uuid.uuid4().hex
        await _post(s, route("commit").url(meta), commits, mkey)
        forget_answers(cluster)
        recommitted = await _post(s, route("commit").url(meta), commits, mkey, attempt=2)
        assert [r["file_id"] for r in recommitted[1]["results"]] == ids
        assert not set(ids) & pending_uploads(cluster)
        # a first try is never taken for a retry: without the mark, the gone upload is a 404
        status, _, _ = await _write(s, meta, "commit", commit, uuid.uuid4().hex)
        assert status == 404


def lose_upload(cluster: ThreadCluster, file_id: str) -> None:
    """Take a pending upload away, as a crash of the database does with one begun just
    before it (its commit had not waited for the flush)."""
    assert cluster.meta is not None
    store = cluster.meta.app[SERVICE].store
    [gone] = asyncio.run_coroutine_threadsafe(store.abort_uploads([file_id], now=0.0),
                                              cluster.loop).result(10)
    assert gone is None


async def test_an_upload_gone_at_its_first_commit_is_written_again(
        cluster: ThreadCluster, ns: str) -> None:
    """A commit asked once (no earlier try could have committed it) that finds its upload
    gone says so (``never_committed``), not that another writer replaced it; ``pipe``, which
    holds the bytes, then writes them again as a new upload."""
    async with AsyncClient(cluster.meta_url) as c:
        file_id, writer = await c.create(f"{ns}/lost")
        await writer.write(b"first")
        lose_upload(cluster, file_id)
        with pytest.raises(UploadNotFound) as gone:
            await c.commit(file_id, writer)
        assert gone.value.details.get("never_committed") is True
        assert "is gone" not in str(gone.value)

        lost: list[str] = []

        async def lose_the_first() -> None:     # while pipe writes its chunks
            while not lost:
                for pending in pending_uploads(cluster):
                    lose_upload(cluster, pending)
                    lost.append(pending)
                await asyncio.sleep(0.001)

        body = bytes(range(256)) * (64 * 1024)          # 16 MiB: chunks take a while
        loser = asyncio.create_task(lose_the_first())
        info = await c.pipe(f"{ns}/again", body, layout=LayoutSpec(chunk_size=1 << 20))
        await asyncio.wait_for(loser, 5)
        assert lost and info.file_id not in lost         # written again, as a new upload
        assert await c.cat(f"{ns}/again") == body


def vanish_upload(cluster: ThreadCluster, file_id: str) -> None:
    """Take a pending upload away without a trace (no garbage), as a crash of the
    database does with one whose reservation had not been flushed."""
    assert cluster.meta is not None
    store = cluster.meta.app[SERVICE].store
    db = store.namespace.db
    asyncio.run_coroutine_threadsafe(store.thread.run(
        lambda: db.execute("DELETE FROM uploads WHERE file_id = ?", (file_id,))),
        cluster.loop).result(10)


def garbage_ids(cluster: ThreadCluster) -> set[str]:
    assert cluster.meta is not None
    store = cluster.meta.app[SERVICE].store
    future = asyncio.run_coroutine_threadsafe(store.take_garbage(1 << 20), cluster.loop)
    return {g.file_id for g in future.result(10)}


async def test_a_retried_commit_tells_a_lost_upload_from_a_replaced_file(
        cluster: ThreadCluster, ns: str) -> None:
    """A commit asked again (its first answer lost) finds its upload gone and no file
    with its id.  Either no try committed it (the upload was lost in a crash of the
    database): the 404 says ``never_committed``, and the writer may send the bytes
    again.  Or a try did and the file was since replaced: its id is retired, as
    garbage and still once purged, and the 404 does not say so."""
    meta = cluster.meta_url

    async def begin(s: aiohttp.ClientSession, path: str) -> str:
        made = await _write(s, meta, "create", CreateItem(path, None, True).to_json(),
                            uuid.uuid4().hex)
        assert made[0] == 200
        return str(made[1]["file_id"])

    async def commit_again(s: aiohttp.ClientSession, file_id: str) -> tuple[int, Any]:
        status, answer, _ = await _write(s, meta, "commit",
                                         CommitItem(file_id, 0, ()).to_json(),
                                         uuid.uuid4().hex, attempt=2)
        return status, answer

    async with aiohttp.ClientSession() as s:
        lost = await begin(s, f"{ns}/crashed")
        vanish_upload(cluster, lost)
        status, answer = await commit_again(s, lost)
        assert status == 404 and answer["error"] == "upload_not_found"
        assert answer["details"]["never_committed"] is True
        lost_too = await begin(s, f"{ns}/crashed-in-a-batch")
        kept = await begin(s, f"{ns}/kept-in-the-batch")
        vanish_upload(cluster, lost_too)
        batch = await _post(s, route("commit").url(meta),
                            {"items": [CommitItem(f, 0, ()).to_json() for f in (lost_too, kept)]},
                            uuid.uuid4().hex, attempt=2)
        result, fine = batch[1]["results"]
        assert result["error"] == "upload_not_found"
        assert result["details"]["never_committed"] is True
        assert fine["file_id"] == kept                      # the other item went ahead

        first = await begin(s, f"{ns}/replaced")
        done = await _write(s, meta, "commit", CommitItem(first, 0, ()).to_json(),
                            uuid.uuid4().hex)
        assert done[0] == 200
        async with AsyncClient(meta) as c:
            await c.pipe(f"{ns}/replaced", b"later writer")
        assert first in garbage_ids(cluster)
        status, answer = await commit_again(s, first)
        assert status == 404 and "never_committed" not in answer.get("details", {})
        for _ in range(200):                    # the collector purges it (every 0.2 s)
            if first not in garbage_ids(cluster):
                break
            await asyncio.sleep(0.05)
        assert first not in garbage_ids(cluster)
        status, answer = await commit_again(s, first)
        assert status == 404 and "never_committed" not in answer.get("details", {})
