"""``StagerFileSystem``: the ``stager://`` protocol for fsspec, pandas, pyarrow, zarr, dask.

Only the ``_`` coroutines are written here, over :class:`~stager.AsyncClient`;
fsspec's ``mirror_sync_methods`` makes the blocking twins, which run on
stager's I/O thread (:mod:`stager.client.holder`, shared with ``Client`` and
``Loader``).  ``stager://HOST:PORT/path`` names the cluster (its
metadata server); ``stager:///path`` takes it from ``STAGER_META_URL``.

Errors are stager's, which are also the built-ins fsspec callers expect
(``FileNotFoundError``, ``FileExistsError``, ``IsADirectoryError``, …).
The filesystem is safe to use after ``fork``: the child gets a fresh I/O loop
and its own client (see :mod:`stager.client.holder`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import stat
import weakref
from collections.abc import Iterable, Sequence
from glob import has_magic
from typing import Any

import numpy as np
from fsspec.asyn import AsyncFileSystem, sync, sync_wrapper
from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.utils import stringify_path

from ..aio import gather_or_cancel
from ..client import AsyncClient
from ..client.cluster import Cluster
from ..client.holder import current, new_owner, release
from ..client.stale import current_or_none
from ..client.transfer import LocalSink, SourceFile, copy_out, put_file
from ..config import Config, parse_size
from ..dataplane.engine import ReadEngine
from ..dataplane.readplan import FileTable, ReadOptions
from ..errors import IsADirectory, NotADirectory, NotFound, TargetUnavailable
from ..protocol import paths
from ..protocol.metaurls import from_hosts
from ..protocol.models import FileInfo, LayoutSpec
from .buffered import StagerReadFile, StagerWriteFile
from .info import to_fsspec

LAYOUT_KEYS = ("chunk_size", "stripe_count", "replicas")
RANGES_REQUEST_BYTES = 16 << 20    # cat_ranges: per request; a target's requests run in parallel


class StagerFileSystem(AsyncFileSystem):
    """fsspec filesystem over a stager cluster.

    ``meta_url``: the metadata server (default: ``config.meta_url``, i.e.
    ``STAGER_META_URL``); ``config``: a :class:`~stager.config.Config`; ``token``:
    a bearer token; or ``cluster``: all three resolved already
    (:class:`~stager.client.cluster.Cluster`).
    Writes take layout keywords (``chunk_size``, ``stripe_count``,
    ``replicas``), e.g. ``fs.pipe(path, data, chunk_size="1MiB")``.
    """

    protocol = "stager"
    root_marker = "/"
    async_impl = True

    def __init__(self, meta_url: str | Sequence[str] | None = None, *,
                 config: Config | None = None, token: str | None = None,
                 cluster: Cluster | None = None, asynchronous: bool = False, loop: Any = None,
                 batch_size: int | None = None, **kwargs: Any) -> None:
        self.cluster = Cluster.resolve(meta_url, config=config, token=token, cluster=cluster)
        self.config, self.meta_url = self.cluster.config, self.cluster.meta_url
        self._io_loop = loop is None and not asynchronous      # else the caller's loops
        if self._io_loop:
            loop = current().io_loop(self.config.event_loop)
        super().__init__(asynchronous=asynchronous, loop=loop, batch_size=batch_size, **kwargs)
        self._owner = new_owner()
        weakref.finalize(self, release, self._owner)   # when the filesystem goes, or at exit

    # -- process, loop and client -----------------------------------------------------
    @property
    def loop(self) -> Any:
        """The process's I/O loop (see :mod:`stager.client.holder`; in a forked child, the
        child's own), or the loop given, or none with ``asynchronous=True``."""
        return current().io_loop(self.config.event_loop) if self._io_loop else self._loop

    @property
    def client(self) -> AsyncClient:
        """The client of this process and the running loop (use inside a coroutine)."""
        return current().client(self._owner, asyncio.get_running_loop(), self._new_client)

    def _new_client(self) -> AsyncClient:
        return AsyncClient(cluster=self.cluster)

    async def aclose(self) -> None:
        """Close this filesystem's clients (the running loop's one awaited)."""
        await current().arelease(self._owner)

    def close(self) -> None:
        """Close this filesystem's clients; they are made again if it is used again."""
        current().release(self._owner)

    # -- URLs ------------------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """``stager://host:port/a/b/``, ``stager:///a/b`` and ``a/b`` all give ``/a/b``."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("stager://"):
            rest = path[len("stager://"):]
            path = rest if rest.startswith("/") else "/" + rest.partition("/")[2]
        elif path.startswith("stager::"):
            path = path[len("stager::"):]
        return "/" + "/".join(p for p in path.split("/") if p)

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        if path.startswith("stager://"):
            netloc = path[len("stager://"):].partition("/")[0]
            if netloc:      # one host, or several: stager://a:7070,b:7070/path
                return {"meta_url": from_hosts(netloc)}
        return {}

    def unstrip_protocol(self, name: str) -> str:
        if name.startswith("stager://"):
            return name
        urls = self.cluster.urls
        netloc = ",".join(u.removeprefix("http://") for u in urls) \
            if all(u.startswith("http://") for u in urls) else ""
        return f"stager://{netloc}{self._strip_protocol(name)}"

    @property
    def fsid(self) -> str:
        return f"stager-{self.meta_url}"

    # -- namespace ---------------------------------------------------------------------
    async def _stat(self, path: str) -> FileInfo:
        return await self.client.stat(self._strip_protocol(path), cached=False)

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return to_fsspec(await self._stat(path))

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        try:
            entries = await self.client.ls(path)
        except NotADirectory:
            entries = [await self.client.stat(path, cached=False)]
        if not detail:          # the names only: no info dict built per entry
            return [e.path for e in entries]
        return [to_fsspec(e) for e in entries]

    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        await self.client.mkdir(self._strip_protocol(path), parents=create_parents,
                                exist_ok=False, layout=_layout(kwargs))

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        await self.client.mkdir(self._strip_protocol(path), parents=True, exist_ok=exist_ok)

    async def _rmdir(self, path: str) -> None:
        info = await self._stat(path)
        if not info.is_dir:
            raise NotADirectory(f"{info.path} is not a directory", path=info.path)
        await self.client.rm(info.path, recursive=False)

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        await self.client.rm(self._strip_protocol(path))

    async def _rm(self, path: Any, recursive: bool = False, batch_size: int | None = None,
                  maxdepth: int | None = None, **kwargs: Any) -> None:
        """Globs expanded here; each directory goes in one server-side request."""
        if maxdepth is not None:
            await super()._rm(path, recursive=recursive, maxdepth=maxdepth)
            return
        found = await self._expand_path(path, recursive=False)
        tops = _outermost(found) if recursive else sorted(found, reverse=True)
        if recursive:
            await gather_or_cancel(self.client.rm(p, recursive=True) for p in tops)
            return
        for p in tops:            # deepest first, so emptied directories can go too
            await self.client.rm(p, recursive=False)

    async def _mv(self, path1: Any, path2: Any, recursive: bool = False,
                  maxdepth: int | None = None, **kwargs: Any) -> None:
        """A rename on the metadata server when one path moves; copy and remove otherwise."""
        if isinstance(path1, str) and isinstance(path2, str) and not has_magic(path1):
            src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
            if src == dst:
                return
            if path2.endswith("/") or await self._isdir(dst):
                dst = paths.join(dst, src.rsplit("/", 1)[-1])
            parent = paths.split(dst)[0]
            await self.client.mkdir(parent, parents=True, exist_ok=True)
            await self.client.rename(src, dst, overwrite=True)
            return
        await self._copy(path1, path2, recursive=recursive, maxdepth=maxdepth)
        await self._rm(path1, recursive=recursive)

    async def _mv_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        await self._mv(path1, path2)

    async def _modified(self, path: str) -> dt.datetime:
        return dt.datetime.fromtimestamp((await self._stat(path)).mtime, tz=dt.UTC)

    def ukey(self, path: str) -> str:
        info = self.info(path)
        return f"{info.get('file_id')}:{info.get('checksum')}:{info['size']}"

    mv = sync_wrapper(_mv)
    rmdir = sync_wrapper(_rmdir)
    modified = sync_wrapper(_modified)

    # -- reading -----------------------------------------------------------------------
    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None,
                        **kwargs: Any) -> bytes:
        return await self.client.cat(self._strip_protocol(path), start, end)

    async def _cat_ranges(self, paths_: list[str], starts: Any, ends: Any,
                          max_gap: int | None = None, batch_size: int | None = None,
                          on_error: str = "return", **kwargs: Any) -> list[Any]:
        """Every range at once: one read plan, coalesced per chunk (``max_gap``), one
        batch per target (see :mod:`stager.dataplane.engine`)."""
        if not isinstance(paths_, list):
            raise TypeError("paths must be a list")
        n = len(paths_)
        starts = list(starts) if isinstance(starts, Iterable) else [starts] * n
        ends = list(ends) if isinstance(ends, Iterable) else [ends] * n
        if len(starts) != n or len(ends) != n:
            raise ValueError("paths, starts and ends must have the same length")
        names = [self._strip_protocol(p) for p in paths_]
        unique = sorted(set(names))
        quick = any(self.client.meta.cached_stat(p) is not None for p in unique)
        stats = await asyncio.gather(*(self.client.stat(p) for p in unique),
                                     return_exceptions=True)
        infos: dict[str, FileInfo | BaseException] = dict(zip(unique, stats, strict=True))
        # through cached stats, one round over the replicas first (stager/client/stale.py)
        out = await self._ranges_of(names, starts, ends, infos, max_gap or 0,
                                    retries=0 if quick else None)
        await self._read_again(names, starts, ends, infos, max_gap or 0, out, quick)
        if on_error != "return":
            for item in out:
                if isinstance(item, BaseException):
                    raise item
        return out

    async def _read_again(self, names: list[str], starts: list[Any], ends: list[Any],
                          infos: dict[str, FileInfo | BaseException], max_gap: int,
                          out: list[Any], quick: bool) -> None:
        """The ranges of ``out`` that failed as a stale stat does (the file's chunks
        gone: see :mod:`stager.client.stale`) read again, in place, once.  Every range
        of a file the path now names another of is read from that one; so is every
        other range that failed, after a ``quick`` first read (one round over the
        replicas) or when a stale file shared its batches (a target answers a batch
        that names one missing chunk with a 404 for the whole batch)."""
        failed: set[int] = set()
        stale: dict[str, FileInfo] = {}
        for i, got in enumerate(out):
            info = infos[names[i]]
            if isinstance(got, TargetUnavailable | NotFound) and isinstance(info, FileInfo):
                failed.add(i)
                stale[names[i]] = info
        if not failed:
            return
        fresh = await asyncio.gather(*(current_or_none(self.client, info)
                                       for info in stale.values()), return_exceptions=True)
        again = {name: now for name, now in zip(stale, fresh, strict=True)
                 if isinstance(now, FileInfo | NotFound)}
        if not (again or quick):
            return
        infos.update(again)
        redo = [i for i, name in enumerate(names) if name in again or i in failed]
        got = await self._ranges_of([names[i] for i in redo], [starts[i] for i in redo],
                                    [ends[i] for i in redo], infos, max_gap)
        for i, data in zip(redo, got, strict=True):
            out[i] = data

    async def _ranges_of(self, names: list[str], starts: list[Any], ends: list[Any],
                         infos: dict[str, FileInfo | BaseException], max_gap: int,
                         retries: int | None = None) -> list[Any]:
        """Each ``(name, start, end)``'s bytes read from the file ``infos`` gives for
        the name, or the error in its place (``retries``: rounds over the replicas
        after the first; default: config ``retries``)."""
        out: list[Any] = [None] * len(names)
        wanted: list[tuple[int, tuple[FileInfo, int, int]]] = []
        for i, (name, start, end) in enumerate(zip(names, starts, ends, strict=True)):
            info = infos[name]
            if isinstance(info, BaseException):
                out[i] = info
            elif info.is_dir:
                out[i] = IsADirectory(f"{name} is a directory", path=name)
            else:
                wanted.append((i, (info, *_bounds(info.size, start, end))))
        got = await self._read_ranges([w for _, w in wanted], max_gap, retries)
        for (i, _), data in zip(wanted, got, strict=True):
            out[i] = data
        return out

    async def _read_ranges(self, wanted: list[tuple[FileInfo, int, int]],
                           max_gap: int, retries: int | None = None) -> list[Any]:
        """The bytes of each clipped ``(info, start, stop)``, or its error in its place."""
        number: dict[str | None, int] = {}
        infos: list[FileInfo] = []
        for info, _, _ in wanted:
            if info.file_id not in number:
                number[info.file_id] = len(infos)
                infos.append(info)
        engine = ReadEngine(self.client.plane, self.client.limit, ReadOptions(
            merge_gap=max_gap, max_request_bytes=RANGES_REQUEST_BYTES,
            retries=self.client.config.retries if retries is None else retries))
        return await engine.read_extents(
            FileTable(infos), np.array([number[info.file_id] for info, _, _ in wanted]),
            np.array([start for _, start, _ in wanted]),
            np.array([max(0, stop - start) for _, start, stop in wanted]), raise_errors=False)

    async def _get_file(self, rpath: str, lpath: str, callback: Any = DEFAULT_CALLBACK,
                        **kwargs: Any) -> None:
        info = await self._stat(rpath)
        if info.is_dir:
            await asyncio.to_thread(os.makedirs, lpath, exist_ok=True)
            return
        callback.set_size(info.size)
        await copy_out(self.client, info, LocalSink(lpath), on_bytes=callback.relative_update)

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None,
              autocommit: bool = True, cache_options: dict[str, Any] | None = None,
              **kwargs: Any) -> StagerReadFile | StagerWriteFile:
        path = self._strip_protocol(path)
        kwargs.pop("size", None)          # a reopened (unpickled) file: stat again anyway
        if mode == "rb":
            info = sync(self.loop, self._stat, path)
            if info.is_dir:
                raise IsADirectory(f"{path} is a directory", path=path)
            return StagerReadFile(self, path, info, block_size=block_size,
                                  cache_options=cache_options, **kwargs)
        if mode in ("wb", "xb"):
            layout = _layout(kwargs)
            return StagerWriteFile(self, path, mode, block_size=block_size,
                                   autocommit=autocommit, layout=layout, **kwargs)
        raise NotImplementedError(f"mode {mode!r}: stager files are read ('rb') or written "
                                  "whole ('wb', 'xb'); there is no append")

    # -- writing -----------------------------------------------------------------------
    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite",
                         **kwargs: Any) -> None:
        await self.client.pipe(self._strip_protocol(path), value, layout=_layout(kwargs),
                               overwrite=mode == "overwrite")

    async def _put_file(self, lpath: str, rpath: str, callback: Any = DEFAULT_CALLBACK,
                        mode: str = "overwrite", **kwargs: Any) -> None:
        rpath = self._strip_protocol(rpath)
        st = await asyncio.to_thread(os.stat, lpath)
        if stat.S_ISDIR(st.st_mode):
            await self._makedirs(rpath, exist_ok=True)
            return
        local = SourceFile(os.fspath(lpath), "", st.st_size, st.st_mtime, None)
        callback.set_size(local.size)
        await put_file(self.client, local, rpath, layout=_layout(kwargs),
                       overwrite=mode == "overwrite", on_bytes=callback.relative_update)

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        info = await self._stat(path1)
        if info.is_dir:
            await self._makedirs(path2, exist_ok=True)
            return

        async def body() -> Any:
            async for piece in self.client.reader(info).stream():
                yield piece

        await self.client.write_stream(self._strip_protocol(path2), body(),
                                       layout=_layout(kwargs))


def _bounds(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """fsspec's ``start``/``end`` (``None``, negative from the end) clipped to ``size``."""
    lo = 0 if start is None else (size + start if start < 0 else start)
    hi = size if end is None else (size + end if end < 0 else end)
    lo, hi = max(0, min(lo, size)), max(0, min(hi, size))
    return lo, max(lo, hi)


def _outermost(found: list[str]) -> list[str]:
    """The paths not below another one of them."""
    out: list[str] = []
    for p in sorted(found):
        if not any(paths.is_within(p, top) for top in out):
            out.append(p)
    return out


def _layout(kwargs: dict[str, Any]) -> LayoutSpec | None:
    """Layout keywords of a write (``chunk_size="1MiB"``, ``stripe_count``, ``replicas``)."""
    spec = kwargs.pop("layout", None)
    if isinstance(spec, dict):
        spec = LayoutSpec.from_json(spec)
    values = {k: kwargs.pop(k) for k in LAYOUT_KEYS if kwargs.get(k) is not None}
    if not values:
        return spec
    if "chunk_size" in values:
        values["chunk_size"] = parse_size(values["chunk_size"])
    merged = LayoutSpec(**values).merged_over(spec or LayoutSpec())
    merged.validate()
    return merged

