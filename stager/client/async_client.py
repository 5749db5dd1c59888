"""``AsyncClient``: the one async core every other way of use is built on."""

from __future__ import annotations

import asyncio
import gzip
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from ..config import Config
from ..dataplane import DataPlane, PlaneOptions, StripedReader, StripedWriter, make_session
from ..dataplane.learnt import CrcMemory
from ..dataplane.transport import TargetCounters
from ..errors import IsADirectory, NotFound, StagerError, Unavailable, UploadNotFound
from ..protocol import messages as m
from ..protocol import paths
from ..protocol.authmsg import TokenCreated, TokenInfo, TokenList, TokenRequest
from ..protocol.batch import CommitItem, CreateItem, batch_body, one, read_results
from ..protocol.cluster import FsckResult, ScrubResult, Status
from ..protocol.jobreport import JobList
from ..protocol.manifest import Manifest
from ..protocol.models import FileInfo, LateAttrs, LayoutSpec, TargetInfo
from ..protocol.quotas import (
    Pin,
    PinList,
    PinRequest,
    Quota,
    QuotaList,
    QuotaRequest,
    Unpinned,
)
from ..protocol.routes import route
from ..protocol.s3keys import S3KeyCreated, S3KeyInfo, S3KeyList, S3Verdict, S3VerifyRequest
from .bulk import WriteItem, upload_gone, write_many
from .cache import CacheCalls
from .capabilities import CapabilityBook
from .cluster import Cluster
from .fileio import AsyncReadFile, AsyncWriteFile
from .listing import SHARED, info_from_bytes, listing_from_bytes
from .metaconn import LONG, MetaConnection
from .rewrite import written_again
from .stale import read_current
from .transfer import get_local, put_local

KEPT_MANIFESTS = 4         # paths whose last manifest get_manifest keeps to revalidate
SMALL_FILE = 64 << 10      # bytes: a pipe this small rides with its commit (gateway PUT)


class AsyncClient(CacheCalls):
    """Talks to one stager cluster.  Use ``async with AsyncClient(...) as c``.

    ``meta_url`` (one URL, several comma-separated, or a sequence: metadata servers
    on one store, tried in order) defaults to ``config.meta_url``
    (``STAGER_META_URL``, else ``http://127.0.0.1:7070``).  All chunk traffic goes through one
    :class:`~stager.dataplane.DataPlane`, so per-target counters cover
    everything this client read and wrote.
    """

    def __init__(self, meta_url: str | Sequence[str] | None = None, *,
                 config: Config | None = None, token: str | None = None,
                 cluster: Cluster | None = None) -> None:
        self.cluster = Cluster.resolve(meta_url, config=config, token=token, cluster=cluster)
        self.config = self.cluster.config
        self.meta_url = self.cluster.meta_url   # every metadata server, comma-separated
        self.options = PlaneOptions.of(self.config)
        self._session: aiohttp.ClientSession | None = None
        self._plane: DataPlane | None = None
        self._limit: asyncio.Semaphore | None = None
        self.meta = MetaConnection(self.cluster, lambda: self.plane.session)
        # The last manifest of each path and its ETag, revalidated (get_manifest): a
        # few paths, as each of a 100,000-file dataset's is tens of megabytes.
        self._manifests: dict[str, tuple[str, Manifest]] = {}
        # With a token, the capabilities data servers want (stager/client/capabilities.py)
        self.capabilities = CapabilityBook(self.meta.request) \
            if self.meta.headers else None

    # -- lifecycle ----------------------------------------------------------------
    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._plane is not None and self._plane.learnt is not None:
            await self._plane.learnt.close()    # the last reads reported, session still open
        if self.capabilities is not None:
            await self.capabilities.close()
        if self._session is not None:
            await self._session.close()
        self._session = self._plane = self._limit = None

    @property
    def plane(self) -> DataPlane:
        if self._plane is None:
            self._session = make_session(self.options)
            self._plane = DataPlane(self._session, self.options, credentials=self.capabilities,
                                    filler=self.fill, learnt=CrcMemory(self.count_reads))
            self._limit = asyncio.Semaphore(self.config.client_concurrency)
        return self._plane

    @property
    def limit(self) -> asyncio.Semaphore:
        self.plane  # noqa: B018 - creates the semaphore with the session
        assert self._limit is not None
        return self._limit

    def target_counters(self) -> dict[str, TargetCounters]:
        return dict(self.plane.counters)

    # -- namespace -------------------------------------------------------------------
    async def stat(self, path: str, *, cached: bool = True) -> FileInfo:
        """The file's or directory's info; reused for ``stat_cache_ttl`` seconds."""
        path = paths.normalize(path)
        hit = self.meta.cached_stat(path) if cached else None
        if hit is not None:
            return hit
        now, stat = time.monotonic(), route("stat")
        info = await self.meta.request(stat, path=path, decode=info_from_bytes, small=True)
        self.learn("read", info.file_id, info.capability)
        self.meta.remember_stat(path, info, now)
        return info

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path, cached=False)
            return True
        except NotFound:
            return False

    async def iter_dir(self, path: str, *, page_size: int | None = None, after: str = ""
                       ) -> AsyncIterator[FileInfo]:
        """A directory's entries named after ``after`` (bytewise), a page a request."""
        cursor: str | None = after
        while cursor is not None:
            page = await self.meta.request(route("list"), path=paths.normalize(path), query={
                "after": cursor, "limit": page_size or None, "layouts": SHARED},
                decode=listing_from_bytes)
            for entry in page.entries:
                yield entry
            cursor = page.next

    async def ls(self, path: str = "/") -> list[FileInfo]:
        return [e async for e in self.iter_dir(path)]

    async def walk(self, path: str) -> AsyncIterator[FileInfo]:
        """Every file below ``path`` (or ``path`` itself when it is a file)."""
        info = await self.stat(path, cached=False)
        if not info.is_dir:
            yield info
            return
        async for entry in self.iter_dir(path):
            if entry.is_dir:
                async for sub in self.walk(entry.path):
                    yield sub
            else:
                yield entry

    async def mkdir(self, path: str, *, parents: bool = True, exist_ok: bool = True,
                    layout: LayoutSpec | None = None) -> FileInfo:
        body = m.MkdirRequest(paths.normalize(path), parents, exist_ok, layout)
        return FileInfo.from_json(await self.meta.request(route("mkdir"), body=body.to_json()))

    async def set_layout(self, path: str, layout: LayoutSpec) -> FileInfo:
        """The default layout new files below directory ``path`` inherit."""
        body = m.SetLayoutRequest(paths.normalize(path), layout)
        return FileInfo.from_json(await self.meta.request(route("set_layout"),
                                                          body=body.to_json()))

    async def rename(self, src: str, dst: str, *, overwrite: bool = False) -> FileInfo:
        self.meta.forget(src, dst)
        body = m.RenameRequest(paths.normalize(src), paths.normalize(dst), overwrite)
        return FileInfo.from_json(await self.meta.request(route("rename"), body=body.to_json()))

    async def rm(self, path: str, *, recursive: bool = False) -> int:
        """Delete a file or directory; returns how many files went."""
        self.meta.forget(path)
        body = m.RemoveRequest(paths.normalize(path), recursive)
        return m.RemoveResult.from_json(
            await self.meta.request(route("remove"), body=body.to_json())).removed

    async def put_manifest(self, manifest: Manifest) -> int:
        """Record ``manifest`` on its directory; returns the number of files."""
        answer = await self.meta.request(route("put_manifest"),
                                         path=paths.normalize(manifest.path),
                                         body=manifest.to_json())
        return m.ManifestStored.from_json(answer).files

    async def get_manifest(self, path: str) -> Manifest | None:
        """The dataset manifest of directory ``path``, resolved; ``None`` if none recorded.

        The last one of each path is kept with its ETag and revalidated: while nothing
        it resolves against changed, the server answers 304 and the same object comes
        back (treat it as read-only).  A new one is inflated and parsed in a thread:
        for 100,000 files that is a good part of a second of CPU."""
        path = paths.normalize(path)
        kept = self._manifests.get(path)
        headers = {"Accept-Encoding": "gzip"}
        if kept is not None:
            headers["If-None-Match"] = kept[0]
        try:
            status, answered, raw = await self.meta.exchange(
                route("get_manifest"), headers=headers, path=path)
        except NotFound:
            self._manifests.pop(path, None)
            if not (await self.stat(path, cached=False)).is_dir:
                raise
            return None
        if status == 304 and kept is not None:
            self._manifests[path] = self._manifests.pop(path)
            return kept[1]
        gzipped = answered.get("Content-Encoding", "").lower() == "gzip"
        manifest = await asyncio.to_thread(_decode_manifest, raw, gzipped)
        etag = answered.get("ETag")
        self._manifests.pop(path, None)
        if etag:
            self._manifests[path] = (etag, manifest)
            while len(self._manifests) > KEPT_MANIFESTS:    # the least recently fetched out
                del self._manifests[next(iter(self._manifests))]
        return manifest

    async def status(self) -> dict[str, Any]:
        """The cluster at a glance, as JSON (what ``stager status --json`` prints)."""
        return Status.from_json(await self.meta.request(route("status"))).to_json()

    # -- administration (stager/meta/upkeep/reliability.py) ---------------------------
    async def remove_target(self, target_id: str) -> TargetInfo:
        """Declare a target lost: its chunks are re-replicated onto other targets."""
        return TargetInfo.from_json(await self.meta.request(
            route("remove_target"), target_id=target_id, body={}))

    async def forget_target(self, target_id: str) -> TargetInfo:
        """Drop a lost or removed target whose chunks are all copied elsewhere (its
        credential is revoked); refused (409) while it is up, down or rebuilding."""
        return TargetInfo.from_json(await self.meta.request(
            route("forget_target"), target_id=target_id, body={}))

    async def scrub(self, *, rate: int | None = None) -> dict[str, Any]:
        """Every up target verifies all its chunks now; corrupt copies are repaired."""
        return ScrubResult.from_json(await self.meta.request(
            route("scrub"), body=m.ScrubRequest(rate).to_json(), timeout=LONG)).to_json()

    async def fsck(self, *, repair: bool = False) -> dict[str, Any]:
        """Namespace against chunks: missing and orphan copies (``repair`` fixes them)."""
        return FsckResult.from_json(await self.meta.request(
            route("fsck"), body=m.FsckRequest(repair).to_json(), timeout=LONG)).to_json()

    async def targets(self) -> list[TargetInfo]:
        return list(m.TargetList.from_json(await self.meta.request(route("list_targets"))).targets)

    # -- tokens (stager/meta/http/authapp.py; an admin token) ------------------------------
    async def create_token(self, scopes: Sequence[str], prefixes: Sequence[str] = ("/",),
                           ttl: int = 86400, name: str = "",
                           uses: int | None = None) -> TokenCreated:
        """Mint a token: its text (shown this once) and what the server keeps of it.
        ``uses``: how many new targets a join token may register (``None``: no limit)."""
        body = TokenRequest(tuple(scopes), tuple(prefixes), int(ttl), name, uses).to_json()
        return TokenCreated.from_json(await self.meta.request(route("create_token"), body=body))

    async def list_tokens(self) -> list[TokenInfo]:
        return list(TokenList.from_json(await self.meta.request(route("list_tokens"))).tokens)

    async def revoke_token(self, token_id: str) -> TokenInfo:
        """Revoke a token: the metadata server refuses it from its next request on."""
        return TokenInfo.from_json(await self.meta.request(route("revoke_token"),
                                                           token_id=token_id, body={}))

    async def create_s3_key(self, scopes: Sequence[str], prefixes: Sequence[str] = ("/",),
                            ttl: int = 86400, name: str = "") -> S3KeyCreated:
        """Mint a token and an S3 key bound to it (admin): the token's and the secret's
        texts, shown this once."""
        body = TokenRequest(tuple(scopes), tuple(prefixes), int(ttl), name).to_json()
        return S3KeyCreated.from_json(await self.meta.request(route("s3key_create"),
                                                              body=body))

    async def list_s3_keys(self) -> list[S3KeyInfo]:
        return list(S3KeyList.from_json(await self.meta.request(route("s3key_list"))).keys)

    async def verify_s3(self, question: S3VerifyRequest) -> S3Verdict:
        """An S3 gateway's question (its token: scope ``s3gateway``): does the signature
        sign the string with the key's secret?  stager/s3/auth.py."""
        return S3Verdict.from_json(await self.meta.request(route("s3key_verify"),
                                                           body=question.to_json()))

    # -- loader telemetry (stager/meta/jobtable.py) ----------------------------------------
    async def report_job(self, job: str, rank: int, report: Mapping[str, Any], *,
                         worker: int | None = None, timeout: float | None = None) -> None:
        """Send one loader's telemetry (the ``report_rank`` route), once."""
        await self.meta.request(route("report_rank"), job=job, rank=int(rank), body=dict(report),
                                query={"worker": int(worker) if worker is not None else None},
                                timeout=aiohttp.ClientTimeout(total=timeout) if timeout else None)

    async def jobs(self) -> list[dict[str, Any]]:
        """Live loader telemetry: every job with its ranks and summary, worst stall first."""
        listing = JobList.from_json(await self.meta.request(route("list_jobs")))
        return [j.to_json() for j in listing.jobs]

    # -- quotas and pins (stager/meta/quotas.py) ---------------------------------------
    async def set_quota(self, path: str, *, max_bytes: int | None = None,
                        max_files: int | None = None) -> Quota:
        """Set directory ``path``'s quota (admin); both ``None``: drop it."""
        body = QuotaRequest(max_bytes, max_files).to_json()
        return Quota.from_json(await self.meta.request(route("set_quota"), path=path,
                                                       body=body))

    async def quotas(self) -> list[Quota]:
        """Every quota with its use (on the paths this client may read)."""
        return list(QuotaList.from_json(await self.meta.request(route("list_quotas"))).quotas)

    async def pin(self, path: str, *, ttl: float | None = None) -> Pin:
        """Pin ``path`` (never evicted) for ``ttl`` seconds, or until unpinned."""
        return Pin.from_json(await self.meta.request(route("pin"), path=path,
                                                     body=PinRequest(ttl).to_json()))

    async def unpin(self, path: str) -> None:
        Unpinned.from_json(await self.meta.request(route("unpin"), path=path))

    async def pins(self) -> list[Pin]:
        return list(PinList.from_json(await self.meta.request(route("list_pins"))).pins)

    # -- reading ---------------------------------------------------------------------
    def reader(self, info: FileInfo, *, retries: int | None = None) -> StripedReader:
        """A reader of the file ``info``; ``retries``: rounds over its replicas after
        the first (default: config ``retries``)."""
        if info.is_dir:
            raise IsADirectory(f"{info.path} is a directory", path=info.path)
        return StripedReader(self.plane, info, concurrency=self.limit,
                             readahead=self.config.readahead_chunks,
                             retries=self.config.retries if retries is None else retries)

    async def cat(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """The bytes of ``path`` in ``[start, end)``; negative values count from the end.
        One version's bytes: a stale cached stat is taken again (:mod:`.stale`)."""
        async def read(reader: StripedReader) -> bytes:
            lo, hi = _span(reader.size, start, end)
            return bytes(await reader.read(lo, hi))

        return await read_current(self, path, read)

    async def read_into(self, path: str, out: memoryview, offset: int = 0) -> int:
        """Fill ``out`` from ``offset`` (clipped at the end); returns bytes read."""
        async def read(reader: StripedReader) -> int:
            n = max(0, min(len(out), reader.size - offset))
            await reader.read_into(offset, out[:n])
            return n

        return await read_current(self, path, read)

    async def get(self, src: str, dst: str | os.PathLike[str]) -> int:
        """Copy a file or a directory tree to the local file system; returns bytes.
        Each local file appears whole (a temporary name of its own, fsynced, renamed
        into place) with the stager file's mtime (see :mod:`stager.client.transfer`)."""
        return await get_local(self, src, dst)

    # -- writing ---------------------------------------------------------------------
    async def create(self, path: str, *, layout: LayoutSpec | None = None,
                     overwrite: bool = True) -> tuple[str, StripedWriter]:
        """Begin a write; returns the file id and a writer.  See :meth:`commit`."""
        body = batch_body([CreateItem(paths.normalize(path), layout, overwrite).to_json()])
        upload = one(read_results(await self.meta.request(route("create"), body=body),
                                  m.Upload.from_json))
        self.learn("write", upload.file_id, upload.capability)

        writer = StripedWriter(self.plane, upload.file_id, upload.layout, upload.locations,
                               max_in_flight=self.config.readahead_chunks,
                               reroute=self.reroute)
        return upload.file_id, writer

    async def reroute(self, target: str, cause: StagerError, items: Sequence[m.RerouteItem]
                      ) -> list[m.Upload | StagerError]:
        """Chunk writes to ``target`` failed with ``cause``: the metadata server gives
        each upload a layout with another target in its slot (and marks the target
        suspect only when its own probe fails too: :mod:`stager.meta.reroute`); per
        item, the upload so placed or its error."""
        answer = await self.meta.request(route("reroute"), body=m.RerouteRequest(
            target, cause.code, cause.message, tuple(items)).to_json())
        results = read_results(answer, m.Upload.from_json)
        for got in results:
            if isinstance(got, m.Upload):
                self.learn("write", got.file_id, got.capability)
        return results

    def learn(self, op: str, file_id: str | None, capability: str | None) -> None:
        """Keep a capability an answer carried (with auth on)."""
        if self.capabilities is not None:
            self.capabilities.learn(op, file_id, capability)

    async def commit(self, file_id: str, writer: StripedWriter, *,
                     mtime: float | None = None, attrs: dict[str, Any] | None = None) -> FileInfo:
        size, sums = await writer.close()
        body = batch_body([CommitItem(file_id, size, tuple(sums), mtime, attrs or {}).to_json()])
        # A commit whose outcome is unknown is asked again (the same key), never the
        # file written afresh: that could apply it twice, over a later writer's.
        try:
            info = one(read_results(await self.meta.request(
                route("commit"), body=body, settle=self.config.write_retries),
                FileInfo.from_json))
        except UploadNotFound as exc:
            gone = upload_gone(file_id, exc)
            if gone is exc:
                raise       # no try committed it: the bytes may be sent again
            raise gone from exc

        self.meta.forget(info.path)
        return info

    async def abort(self, file_id: str, writer: StripedWriter | None = None) -> None:
        if writer is not None:
            await writer.abort()
        try:
            one(read_results(await self.meta.request(
                route("abort"), body=batch_body([file_id], name="file_ids")), lambda _: None))
        except (NotFound, Unavailable):
            pass  # committed, already collected, or the server will collect it

    async def write_stream(self, path: str, source: AsyncIterator[bytes], *,
                           layout: LayoutSpec | None = None, overwrite: bool = True,
                           mtime: float | None = None, attrs: LateAttrs | None = None) -> FileInfo:
        """Write everything ``source`` yields; visible at ``path`` only when complete."""
        file_id, writer = await self.create(path, layout=layout, overwrite=overwrite)
        try:
            async for data in source:
                await writer.write(data)
            return await self.commit(file_id, writer, mtime=mtime, attrs=attrs() if attrs else None)
        except BaseException:
            await asyncio.shield(self.abort(file_id, writer))
            raise

    async def pipe(self, path: str, data: bytes | bytearray | memoryview, *,
                   layout: LayoutSpec | None = None, overwrite: bool = True) -> FileInfo:
        """Write ``data`` at ``path``; a failed write is written again as :mod:`.rewrite`
        decides (``write_retries`` times, only with ``overwrite``)."""
        async def one() -> AsyncIterator[bytes]:
            yield data  # type: ignore[misc]

        async def write() -> FileInfo:
            if overwrite and layout is None and len(data) <= SMALL_FILE:
                return await self._put_whole(path, data)
            return await self.write_stream(path, one(), layout=layout, overwrite=overwrite)

        return await written_again(write, self.config.write_retries if overwrite else 0)

    async def _put_whole(self, path: str, data: bytes | bytearray | memoryview) -> FileInfo:
        """A small file in one request, not three: the gateway PUT (create, chunk, commit)."""
        path = paths.normalize(path)
        info = FileInfo.from_json(await self.meta.request(
            route("gateway_put"), raw=data if len(data) else None,
            settle=self.config.write_retries, path=path))
        self.meta.forget(info.path)
        return info

    async def put(self, src: str | os.PathLike[str], dst: str, *,
                  layout: LayoutSpec | None = None, overwrite: bool = True,
                  files_in_flight: int = 4) -> list[FileInfo]:
        """Copy a local file, or a directory tree, into the namespace, keeping each
        file's mtime: small files in groups, larger ones ``files_in_flight`` at a time
        (see :mod:`stager.client.transfer`)."""
        return await put_local(self, Path(src), dst, layout=layout, overwrite=overwrite,
                               files_in_flight=files_in_flight)

    async def write_many(self, items: Iterable[WriteItem | tuple[Any, ...]], *,
                         layout: LayoutSpec | None = None, overwrite: bool = True
                         ) -> list[FileInfo | StagerError]:
        """Write many files held in memory, ``(path, data[, mtime])`` or
        :class:`~stager.client.bulk.WriteItem` each, in batches: one create and one
        commit request per batch, the chunks grouped per target (see
        :mod:`stager.client.bulk`).  Returns, per item, the committed file's info or
        the error that kept it from being written; each file is visible only once
        committed, whole.  Bad input (an invalid path, a path twice) raises and
        writes nothing."""
        return await write_many(self, items, layout=layout, overwrite=overwrite)

    # -- files -----------------------------------------------------------------------
    async def open(self, path: str, mode: str = "rb", *, layout: LayoutSpec | None = None,
                   overwrite: bool = True) -> AsyncReadFile | AsyncWriteFile:
        """A file object: ``"rb"`` reads with striped readahead; ``"wb"`` commits on close."""
        if mode == "rb":
            return AsyncReadFile(self, await self.stat(path, cached=False))
        if mode in ("wb", "xb"):
            file_id, writer = await self.create(path, layout=layout,
                                                overwrite=overwrite and mode == "wb")
            return AsyncWriteFile(self, file_id, writer)
        raise ValueError(f"unsupported mode {mode!r}: use 'rb', 'wb' or 'xb'")


def _span(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    lo = 0 if start is None else (size + start if start < 0 else start)
    hi = size if end is None else (size + end if end < 0 else end)
    lo, hi = max(0, min(lo, size)), max(0, min(hi, size))
    return lo, max(lo, hi)



def _decode_manifest(raw: bytes, gzipped: bool) -> Manifest:
    return Manifest.decode(gzip.decompress(raw) if gzipped else raw)
