"""Staging from plain http: one request per small file, cheap resume reruns, and the
fallbacks to fsspec for servers without HEAD or byte ranges.

The source is the test source server's own handler
(:func:`stager.testing.httpserver.serve_path`) on 127.0.0.1:0 in the test's loop,
with a middleware that records every request and can change a file right after
answering a request for it (a file changed between listing and copy).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest
from aiohttp import web

from stager import AsyncClient
from stager.errors import NotFound, SourceError
from stager.protocol.models import LayoutSpec
from stager.protocol.ranges import parse_content_range
from stager.sources.httpraw import RawHttp
from stager.stage import run as stage_run
from stager.stage import stage
from stager.stage.feed import PROBE_BYTES
from stager.stage.progress import Progress
from stager.testing.httpserver import ROOT, serve_path
from stager.web.server import start_sites, stop_sites

KiB, MiB = 1 << 10, 1 << 20


@dataclass
class Seen:
    method: str
    rel: str                # the path below the root, decoded ("" for the root page)
    range: str | None
    if_none_match: str | None = None
    status: int = 0         # once answered


Hook = Callable[[Seen], None]


class Source:
    """The test source server on 127.0.0.1:0: ``head=False`` answers HEAD with 405,
    ``ranges=False`` sends whole files whatever the Range; ``after(seen)`` runs once
    each answer has been sent."""

    def __init__(self, root: Path, *, head: bool = True, ranges: bool = True) -> None:
        self.root, self.head, self.ranges = root, head, ranges
        self.seen: list[Seen] = []
        self.after: Hook | None = None
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Source:
        app = web.Application(middlewares=[self._record])
        app[ROOT] = self.root.resolve()
        app.router.add_get("/{tail:.*}", serve_path, allow_head=self.head)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self._sockets = await start_sites(self._runner, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await stop_sites(self._runner, self._sockets)

    @web.middleware
    async def _record(self, request: web.Request,
                      handler: Callable[[web.Request], object]) -> web.StreamResponse:
        seen = Seen(request.method, request.path.lstrip("/"), request.headers.get("Range"),
                    request.headers.get("If-None-Match"))
        self.seen.append(seen)
        if not self.ranges and "Range" in request.headers:
            headers = request.headers.copy()
            del headers["Range"]
            request = request.clone(headers=headers)
        try:
            resp: web.StreamResponse = await handler(request)  # type: ignore[misc]
        except web.HTTPException as exc:
            seen.status = exc.status
            raise
        after, prepare = self.after, resp.prepare

        async def prepare_then(req: web.BaseRequest) -> object:
            sent = await prepare(req)       # a FileResponse sends the whole body here
            seen.status = resp.status
            if after is not None:
                after(seen)
            return sent

        resp.prepare = prepare_then         # type: ignore[method-assign]
        return resp

    def requests(self, rel: str) -> list[Seen]:
        return [s for s in self.seen if s.rel == rel]


def make_tree(root: Path, payload: Callable[[int], bytes]) -> dict[str, bytes]:
    files = {f"small/s{i:02d}.bin": payload(1000 + 337 * i) for i in range(24)}
    files.update({
        "a b.txt": b"with a space",
        "empty": b"",
        "mid.bin": payload(PROBE_BYTES + 5000),      # sized by its probe, read after
        "large.bin": payload(5 * MiB + 3),           # ranged reads of 1 MiB
    })
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


async def staged(client: AsyncClient, root: str) -> dict[str, bytes]:
    prefix = root + "/"
    return {f.path[len(prefix):]: await client.cat(f.path) async for f in client.walk(root)}


OPTIONS = {"part_size": MiB, "layout": LayoutSpec(chunk_size=MiB)}


async def test_a_small_file_is_listed_and_read_by_one_request(
        aclient: AsyncClient, ns: str, tmp_path: Path, payload) -> None:
    files = make_tree(tmp_path, payload)
    async with Source(tmp_path) as src:
        report = await stage(aclient, src.url + "/", f"{ns}/d", **OPTIONS)
        assert report.copied == len(files)
        assert await staged(aclient, f"{ns}/d") == files
        for rel in files:
            if rel.startswith("small/") or rel == "a b.txt":
                assert src.requests(rel) == [
                    Seen("GET", rel, f"bytes=0-{PROBE_BYTES - 1}", None, 206)]
        assert [s.range for s in src.requests("mid.bin")] == [
            f"bytes=0-{PROBE_BYTES - 1}", f"bytes=0-{len(files['mid.bin']) - 1}"]
        assert all(s.method == "GET" for s in src.requests("large.bin"))
        # an empty file has no byte 0: its probe is refused (416), fsspec's HEAD sizes it
        assert [s.method for s in src.requests("empty")][:2] == ["GET", "HEAD"]
        etags = (await aclient.get_manifest(f"{ns}/d")).extra["source_etags"]
        assert set(etags) == set(files) and all(etags.values())

        # the rerun asks each file for one byte if its ETag is not the one recorded:
        # the server answers 304, reading no file, not even the large one
        src.seen.clear()
        again = await stage(aclient, src.url + "/", f"{ns}/d", **OPTIONS)
        assert (again.copied, again.skipped) == (0, len(files))
        ranged = [s for s in src.seen if s.rel.endswith((".bin", ".txt"))]
        assert len(ranged) == len(files) - 1
        assert {(s.range, s.status) for s in ranged} == {("bytes=0-0", 304)}
        assert all(s.if_none_match == etags[s.rel] for s in ranged)

        # no manifest, no ETags recorded: one byte each, and size and mtime decide
        await stage(aclient, src.url + "/", f"{ns}/n", manifest=False, **OPTIONS)
        src.seen.clear()
        again = await stage(aclient, src.url + "/", f"{ns}/n", manifest=False, **OPTIONS)
        assert (again.copied, again.skipped) == (0, len(files))
        ranged = [s for s in src.seen if s.rel.endswith((".bin", ".txt"))]
        assert {(s.range, s.status, s.if_none_match) for s in ranged} == {
            ("bytes=0-0", 206, None)}


async def test_a_single_file(aclient: AsyncClient, ns: str, tmp_path: Path, payload) -> None:
    files = make_tree(tmp_path, payload)
    async with Source(tmp_path) as src:
        for name in ("a b.txt", "mid.bin", "large.bin"):
            url = f"{src.url}/{name.replace(' ', '%20')}"
            report = await stage(aclient, url, f"{ns}/one/", **OPTIONS)
            assert report.copied == 1
            assert await aclient.cat(f"{ns}/one/{name}") == files[name]
            assert (await stage(aclient, url, f"{ns}/one/", **OPTIONS)).skipped == 1


async def test_progress_totals_grow_to_the_whole_tree(
        aclient: AsyncClient, ns: str, tmp_path: Path, payload,
        monkeypatch: pytest.MonkeyPatch) -> None:
    files = make_tree(tmp_path, payload)
    made: list[Progress] = []

    def keep(show: bool | None, url: str) -> Progress:
        made.append(Progress())
        return made[-1]

    monkeypatch.setattr(stage_run, "make_progress", keep)
    total = sum(len(d) for d in files.values())
    async with Source(tmp_path) as src:
        for _ in range(2):          # copied, then skipped: the same totals, all done
            await stage(aclient, src.url + "/", f"{ns}/p", **OPTIONS)
            p = made[-1]
            assert (p.files_total, p.bytes_total) == (len(files), total)
            assert (p.files_done, p.bytes_done) == (len(files), total)


@pytest.mark.parametrize("change", ["same size", "grown", "shrunk"])
async def test_a_file_changed_after_its_listing_is_an_error(
        aclient: AsyncClient, ns: str, tmp_path: Path, payload, change: str) -> None:
    """mid.bin and large.bin change right after their probes, before they are read."""
    files = make_tree(tmp_path, payload)
    async with Source(tmp_path) as src:
        for name in ("mid.bin", "large.bin"):
            def alter(seen: Seen, name: str = name) -> None:
                if seen.rel == name and seen.range == f"bytes=0-{PROBE_BYTES - 1}":
                    path = tmp_path / name
                    data = bytearray(path.read_bytes())
                    data[-1] ^= 0xFF
                    new = {"same size": data, "grown": data + b"+", "shrunk": data[:-2]}
                    path.write_bytes(new[change])
                    st = path.stat()
                    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))

            src.after = alter
            with pytest.raises(SourceError, match=f"{name} changed since it was listed"):
                await stage(aclient, src.url + "/", f"{ns}/{name}", include=[name],
                                    **OPTIONS)
            assert not await aclient.exists(f"{ns}/{name}/{name}")     # nothing half-visible
            (tmp_path / name).write_bytes(files[name])


async def test_a_changed_file_found_by_a_rerun_is_restaged(
        aclient: AsyncClient, ns: str, tmp_path: Path, payload) -> None:
    files = make_tree(tmp_path, payload)
    async with Source(tmp_path) as src:
        await stage(aclient, src.url + "/", f"{ns}/r", **OPTIONS)
        path = tmp_path / "small/s03.bin"
        st = path.stat()
        path.write_bytes(bytes(reversed(files["small/s03.bin"])))     # same size
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
        again = await stage(aclient, src.url + "/", f"{ns}/r", **OPTIONS)
        assert (again.copied, again.skipped) == (1, len(files) - 1)
        assert await aclient.cat(f"{ns}/r/small/s03.bin") == path.read_bytes()


@pytest.mark.parametrize(("head", "ranges"), [(False, True), (True, False), (False, False)])
async def test_servers_without_head_or_ranges(aclient: AsyncClient, ns: str, tmp_path: Path,
                                              payload, head: bool, ranges: bool) -> None:
    files = make_tree(tmp_path, payload)
    async with Source(tmp_path, head=head, ranges=ranges) as src:
        report = await stage(aclient, src.url + "/", f"{ns}/o", **OPTIONS)
        assert report.copied == len(files)
        assert await staged(aclient, f"{ns}/o") == files
        again = await stage(aclient, src.url + "/", f"{ns}/o", **OPTIONS)
        assert (again.copied, again.skipped) == (0, len(files))
    if not head:
        assert not [s for s in src.seen if s.method == "HEAD" and s.rel != "empty"]


async def test_a_file_gone_after_the_listing_is_named(aclient: AsyncClient, ns: str,
                                                      tmp_path: Path, payload) -> None:
    make_tree(tmp_path, payload)
    async with Source(tmp_path) as src:
        def remove(seen: Seen) -> None:
            if seen.rel == "small":                   # its directory page: listed
                (tmp_path / "small/s05.bin").unlink(missing_ok=True)

        src.after = remove
        with pytest.raises(NotFound, match=r"small/s05\.bin: no such file"):
            await stage(aclient, src.url + "/", f"{ns}/g", **OPTIONS)
        assert not await aclient.exists(f"{ns}/g/small/s05.bin")
        assert await aclient.get_manifest(f"{ns}/g") is None


async def test_probes_only_plain_http_without_credentials(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"0123456789")
    async with Source(tmp_path) as src:
        raw = RawHttp(fsspec.filesystem("http", asynchronous=True, skip_instance_cache=True))
        try:
            probed = await raw.probe(f"{src.url}/f", 4)          # larger than the probe
            assert probed is not None and probed.body is None
            assert probed.info["size"] == 10 and probed.info["ETag"]
            whole = await raw.probe(f"{src.url}/f", 64)
            assert whole is not None and whole.body == b"0123456789"
            assert await raw.probe(f"{src.url}/missing", 64) is None    # fsspec says why
            netloc = src.url.removeprefix("http://")
            for url in (f"https://{netloc}/f", f"http://user:pw@{netloc}/f"):
                assert await raw.probe(url, 64) is None
            assert len(src.seen) == 3
        finally:
            raw.close()


def test_content_range() -> None:
    assert parse_content_range("bytes 0-9/10") == (0, 9, 10)
    assert parse_content_range("bytes 5-9/*") == (5, 9, None)
    assert parse_content_range("bytes */10") == (None, None, None)
    assert parse_content_range("") == (None, None, None)
