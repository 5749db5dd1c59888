"""Capabilities by reference (stager/auth/refs.py): once a data server has verified a
capability's text, a request may show it ``ref1.<id>`` instead.  The server resolves
only ids it computed from texts it verified and still holds, checks what the text
grants exactly as for the text itself, and answers any other id 401
``unknown_reference``; a client's data plane then sends the texts again, once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import raw_http, start_cluster
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from stager import AsyncClient, Client
from stager.auth import CLOCK_SKEW, KEY_FILE, Capability, CapabilityCache, load_key, sign
from stager.auth.refs import PREFIX, UNKNOWN, reference
from stager.checksum import crc32c
from stager.config import load_config
from stager.dataplane.rawput import put_chunk
from stager.errors import Unauthenticated
from stager.protocol.models import ReadItem, chunk_id
from stager.testing.cluster import ThreadCluster

KEY = Ed25519PrivateKey.generate()
HOLDER = "a" * 32
FILE_A, FILE_B = "1" * 32, "2" * 32


def test_a_cache_resolves_only_references_it_computed_from_texts_it_holds() -> None:
    now = time.time()
    cache = CapabilityCache(KEY.public_key(), size=2)
    text = sign(KEY, Capability.batch([FILE_A], "read", HOLDER, now))
    ref = reference(text)
    assert ref.startswith(PREFIX) and len(ref) == len(PREFIX) + 24
    with pytest.raises(Unauthenticated) as unknown:
        cache.item(ref, now)                    # never verified here
    assert unknown.value.details["reason"] == UNKNOWN
    assert cache.item(text, now) == cache.item(ref, now)    # verified: the same claims
    # a text that leaves the cache takes its reference along
    for other in (FILE_B, "3" * 32):
        cache.item(sign(KEY, Capability.batch([other], "read", HOLDER, now)), now)
    with pytest.raises(Unauthenticated):
        cache.item(ref, now)
    # an expired text's reference is refused as expired, and then unknown
    cache.item(text, now)
    with pytest.raises(Unauthenticated) as expired:
        cache.item(ref, now + 3600 * 24 * 365)
    assert expired.value.details["reason"] == "expired"
    with pytest.raises(Unauthenticated) as gone:
        cache.item(ref, now)
    assert gone.value.details["reason"] == UNKNOWN


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, slow_callbacks: object
            ) -> Iterator[ThreadCluster]:
    c = start_cluster(Path(tmp_path_factory.mktemp("auth-refs")), auth=True)
    yield c
    c.stop()


def _files(cluster: ThreadCluster, ns: str, n: int) -> tuple[str, list]:  # type: ignore[type-arg]
    token = cluster.mint(["read", "write"])
    with Client(cluster.meta_url, config=load_config(env={}), token=token) as c:
        c.write_many([(f"{ns}/{i}", bytes([i]) * 100) for i in range(n)])
        return token, [c.stat(f"{ns}/{i}") for i in range(n)]


def _batch(cluster: ThreadCluster, token: str, file_ids: list[str]) -> str:
    got = raw_http(cluster.meta_url, "POST", "/v1/capabilities",
                   json.dumps({"op": "read", "file_ids": file_ids}).encode(),
                   {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert got.status == 200, got.body
    text = got.json()["results"][0]["capability"]
    assert isinstance(text, str)
    return text


def _get(info: object, capability: str, where: str | None = None):  # type: ignore[no-untyped-def]
    where = where or info.locations[info.layout.targets[0]]  # type: ignore[attr-defined]
    return raw_http(where, "GET", f"/v1/chunks/{chunk_id(info.file_id, 0)}",  # type: ignore[attr-defined]
                    headers={"X-Stager-Capability": capability})


def _restart_all(cluster: ThreadCluster, token: str, path_on: dict[str, str],
                 old: dict[str, str]) -> dict[str, str]:
    """Restart every data server (each on a new port: its cache starts empty); the
    new address of each target in ``path_on`` (target → a path stored there), once
    the metadata server knows it."""
    for n in range(len(cluster.data)):
        cluster.stop_data(n)
        cluster.start_data(n)
    deadline = time.monotonic() + 15
    with Client(cluster.meta_url, config=load_config(env={}), token=token) as fresh:
        while True:
            now = {t: fresh.stat(p, cached=False).locations[t] for t, p in path_on.items()}
            if all(now[t] != old[t] for t in now):
                return now
            assert time.monotonic() < deadline, "the data servers did not come back"
            time.sleep(0.05)


def test_a_reference_stands_for_exactly_what_its_verified_text_grants(
        cluster: ThreadCluster, ns: str) -> None:
    token, infos = _files(cluster, ns, 3)
    batch = _batch(cluster, token, [infos[0].file_id, infos[1].file_id])
    ref = reference(batch)
    first = _get(infos[0], ref)                 # before the server saw the text
    assert first.status == 401, first.body
    assert first.json()["error"] == "unauthenticated"
    assert first.json()["details"]["reason"] == UNKNOWN
    assert _get(infos[0], batch).status == 200
    got = _get(infos[0], ref)
    assert got.status == 200 and got.body == bytes([0]) * 100
    # no more than the text: another file's chunk, and a write, are refused
    where = infos[0].locations[infos[0].layout.targets[0]]
    assert _get(infos[2], ref, where).status == 403
    put = raw_http(where, "PUT", f"/v1/chunks/{chunk_id(infos[0].file_id, 0)}", b"x",
                   {"X-Stager-Capability": ref})
    assert put.status == 403
    # and a reference verified by one data server means nothing to another
    others = {u for i in infos for u in i.locations.values()} - {where}
    for url in others:
        assert _get(infos[0], ref, url).json()["details"]["reason"] == UNKNOWN
    # a forged id in the reference's form is unknown, whatever it names
    assert _get(infos[0], PREFIX + "A" * 24).json()["details"]["reason"] == UNKNOWN


def test_a_reference_to_an_expired_text_is_refused(cluster: ThreadCluster, ns: str) -> None:
    _, infos = _files(cluster, ns, 1)
    key = load_key(cluster.root / "meta" / "auth" / KEY_FILE)
    # good for about two seconds more, clock skew allowed for
    text = sign(key, Capability.batch([infos[0].file_id], "read", HOLDER,
                                      time.time(), ttl=2 - CLOCK_SKEW))
    assert _get(infos[0], text).status == 200
    assert _get(infos[0], reference(text)).status == 200
    time.sleep(3.2)
    late = _get(infos[0], reference(text))
    assert late.status == 401 and late.json()["details"]["reason"] == "expired"


async def test_a_client_shows_references_and_sends_texts_again_to_a_restarted_server(
        cluster: ThreadCluster, ns: str) -> None:
    token, infos = _files(cluster, ns, 6)
    want = [bytes([i]) * 100 for i in range(6)]
    async with AsyncClient(cluster.meta_url, config=load_config(env={}), token=token) as c:
        book = c.capabilities
        assert book is not None
        await book.plan("read", [i.file_id for i in infos])

        async def read_all(infos: list) -> list[bytes]:  # type: ignore[type-arg]
            return [bytes(await c.reader(i).read(0, 100)) for i in infos]

        async def shown() -> dict[str, str | None]:
            return {t: await book.header("read", [i.file_id for i in infos
                                                  if i.layout.targets[0] == t], t)
                    for t in {i.layout.targets[0] for i in infos}}

        assert await read_all(infos) == want
        before = await shown()
        assert all(h is not None and h.startswith(PREFIX) for h in before.values()), before
        # every data server restarts: its cache is empty, its references unknown; the
        # client reads on with the capabilities it holds
        first = {i.layout.targets[0]: n for n, i in enumerate(infos)}
        where = _restart_all(cluster, token, {t: f"{ns}/{n}" for t, n in first.items()},
                             {t: infos[n].locations[t] for t, n in first.items()})
        moved = [replace(i, locations={**i.locations, **where}) for i in infos]
        assert await read_all(moved) == want
        assert await shown() == before          # shown the texts, then references again


@pytest.mark.parametrize("raw", [True, False], ids=["rawhttp", "aiohttp"])
async def test_batch_reads_send_texts_again_to_a_restarted_server(
        cluster: ThreadCluster, ns: str, raw: bool) -> None:
    token, infos = _files(cluster, ns, 8)
    async with AsyncClient(cluster.meta_url, config=load_config(env={}), token=token) as c:
        plane = c.plane
        plane.options = replace(plane.options, raw_reads=raw)
        await plane.warm("read", [i.file_id for i in infos])
        by_target: dict[str, list[int]] = {}
        for n, i in enumerate(infos):
            by_target.setdefault(i.layout.targets[0], []).append(n)

        async def read(target: str, url: str) -> list[int]:
            items = [ReadItem(chunk_id(infos[n].file_id, 0), 0, 100)
                     for n in by_target[target]]
            out = memoryview(bytearray(100 * len(items)))
            await plane.batch_read_into(target, url, items, out)
            return list(out[::100])

        for t, ns_of in by_target.items():
            assert await read(t, infos[ns_of[0]].locations[t]) == ns_of     # the texts
            assert await read(t, infos[ns_of[0]].locations[t]) == ns_of     # references
        book = c.capabilities
        assert book is not None
        for t, ns_of in by_target.items():
            header = await book.header("read", [infos[n].file_id for n in ns_of], t)
            assert header is not None and header.startswith(PREFIX)
        where = _restart_all(cluster, token,
                             {t: f"{ns}/{ns_of[0]}" for t, ns_of in by_target.items()},
                             {t: infos[ns_of[0]].locations[t]
                              for t, ns_of in by_target.items()})
        for t, ns_of in by_target.items():
            assert await read(t, where[t]) == ns_of


@pytest.mark.parametrize("raw", [True, False], ids=["rawput", "aiohttp"])
async def test_chunk_writes_send_texts_again_to_a_restarted_server(
        cluster: ThreadCluster, ns: str, raw: bool) -> None:
    token = cluster.mint(["read", "write"])
    async with AsyncClient(cluster.meta_url, config=load_config(env={}), token=token) as c:
        file_id, _ = await c.create(f"{ns}/w")
        infos = {t.id: t.url for t in await c.targets()}
        target = sorted(infos)[0]
        data = b"w" * 1000

        async def put(url: str, index: int) -> None:
            chunk = f"{file_id}.{index}"
            if raw:
                await put_chunk(c.plane, target, url, chunk, data, crc32c(data))
            else:
                await c.plane.put_chunk(target, url, chunk, data, crc32c(data))

        await put(infos[target], 0)                 # the text
        await put(infos[target], 1)                 # its reference
        shown = await c.capabilities.header("write", [file_id], target)  # type: ignore[union-attr]
        assert shown is not None and shown.startswith(PREFIX)
        n = next(i for i in range(len(cluster.data)) if cluster.target_id(i) == target)
        cluster.stop_data(n)
        cluster.start_data(n)
        deadline = time.monotonic() + 15
        while (url := {t.id: t.url for t in await c.targets()}[target]) == infos[target]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await put(url, 2)                           # unknown reference: the text again


async def test_a_shuffled_pass_keeps_the_batches_held_and_each_grants_only_its_files(
        cluster: ThreadCluster, ns: str) -> None:
    token = cluster.mint(["read", "write"])
    async with AsyncClient(cluster.meta_url, config=load_config(env={}), token=token) as c:
        await c.write_many([(f"{ns}/{i}", bytes([i])) for i in range(101)])
        infos = [await c.stat(f"{ns}/{i}") for i in range(101)]
        outside, infos = infos[-1], infos[:-1]
        book = c.capabilities
        assert book is not None
        groups = [[i.file_id for i in infos[g::5]] for g in range(5)]
        for group in groups:                    # five batches, each of every fifth file
            await book.plan("read", group)
            await book._fetch_missing("read", group, anew=True)
        fetched = book.fetched
        texts = {book.held("read", i.file_id) for i in infos}
        assert len(texts) == 5
        shuffled = [i.file_id for i in infos[::-1]]     # a run a file: kept all the same
        await book.plan("read", shuffled)
        assert book.fetched == fetched
        # a data server reads each file of the five batches, shown by reference, and
        # no file they do not name
        target = infos[0].layout.targets[0]
        mine = [i for i in infos if i.layout.targets[0] == target]
        items = [ReadItem(chunk_id(i.file_id, 0), 0, 1) for i in mine]
        out = memoryview(bytearray(len(items)))
        url = mine[0].locations[target]
        for _ in range(2):                      # the texts, then the references
            await c.plane.batch_read_into(target, url, items, out)
            assert list(out) == [infos.index(i) for i in mine]
        header = await book.header("read", [i.file_id for i in mine], target)
        assert header is not None and all(h.startswith(PREFIX) for h in header.split())
        assert len(header.split()) == len({book.held("read", i.file_id) for i in mine})

        def few(*files: object) -> int:         # each looked for in each batch in turn
            body = json.dumps({"items": [[chunk_id(f.file_id, 0), 0, 1]  # type: ignore[attr-defined]
                                         for f in files]}).encode()
            return raw_http(url, "POST", "/v1/read", body,
                            {"X-Stager-Capability": header,
                             "Content-Type": "application/json"}).status

        assert few(mine[0], mine[-1]) == 200
        assert few(mine[0], outside) == 403
