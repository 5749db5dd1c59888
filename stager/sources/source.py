"""What a copy into stager reads: any fsspec filesystem, read natively when it is async.

A :class:`Source` reads files below one root of one fsspec filesystem: an async
one (http, s3, gcs, stager) awaited on the running loop (:class:`AsyncSource`),
a blocking one (local, memory, …) in a thread pool (:class:`ThreadSource`).
``put`` reads local files through :func:`local_source`; staging opens any URL
(:func:`stager.sources.open.open_source`).  Foreign exceptions become stager
errors here and nowhere else: a missing path is :class:`~stager.errors.NotFound`,
anything else that goes wrong reading the source is
:class:`~stager.errors.SourceError`, and both name the URL.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import sys
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import aiohttp
import fsspec

from ..errors import NotFound, SourceError, StagerError
from .httpraw import Got, Probed, RawHttp

T = TypeVar("T")
THREADS = 32          # blocking sources: reads in flight at once
INFO_CONCURRENCY = 64  # HEAD-like info requests (or probes) in flight while listing


@dataclass(frozen=True)
class SourceFile:
    """One file of a source, as listed."""

    path: str                 # in the source
    rel: str                  # relative to the source root
    size: int
    mtime: float | None
    etag: str | None


class Source(ABC):
    """One fsspec filesystem, read from one root path (``root``)."""

    def __init__(self, url: str, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/") or root
        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        self._quoted = bool({"http", "https"} & set(protocols))   # listings are URLs

    # -- what subclasses provide --------------------------------------------------
    @abstractmethod
    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Provided by each subclass."""

    async def close(self) -> None:  # noqa: B027 - most sources hold nothing to close
        """Release what the source holds (nothing, unless a subclass says so)."""

    # -- the interface -------------------------------------------------------------
    def name(self, path: str) -> str:
        """A URL naming ``path`` for messages."""
        return self.fs.unstrip_protocol(path)

    def name_of_root(self) -> str:
        """The root's last path component, percent-decoded for http."""
        name = self.root.rstrip("/").rsplit("/", 1)[-1]
        return unquote(name) if self._quoted else name

    def relative(self, path: str) -> str:
        """``path`` relative to the root, ``/``-separated, percent-decoded for http."""
        rel = path[len(self.root):].lstrip("/") if path.startswith(self.root) else path
        return unquote(rel) if self._quoted else rel

    async def info(self, path: str) -> dict[str, Any]:
        """``path`` as the source tells it now, never from a listing kept since (s3fs
        answers from its cached listing: a fill checking a file's version by it read
        a rewritten object's new bytes after the old ones, unnoticed)."""
        self.fs.invalidate_cache(path)
        return dict(await self._guard(path, self._call("info", path)))

    async def listing(self) -> dict[str, dict[str, Any]]:
        """Every file below the root (or the root itself when it is a file), with the
        info its listing gives (an http listing: no sizes; see :meth:`describe`).

        Raises :class:`NotFound` when the root does not exist.
        """
        if not await self._guard(self.root, self._call("exists", self.root)):
            raise NotFound(f"source {self.url} does not exist", url=self.url)
        # on_error="raise": a directory that cannot be listed must not be skipped silently.
        # s3fs lists a prefix in one flat listing, which fails whole, and passes unknown
        # keywords on to S3's ListObjects: it must not get on_error.
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) \
            else set(self.fs.protocol)
        options = {} if protocols & {"s3", "s3a"} else {"on_error": "raise"}
        found: dict[str, dict[str, Any]] = await self._guard(
            self.root, self._call("find", self.root, detail=True, **options))
        return found

    async def describe(self, path: str, info: dict[str, Any], probe: int = 0,
                       unless: tuple[int, str] | None = None) -> Probed:
        """``info`` completed with the file's size (and ETag, mtime) where the listing
        lacks it.  ``probe`` > 0: the source may read up to that many bytes to learn
        it, and then hands over the file's bytes when they all fit.  ``unless``:
        the size and strong ETag the file had, which a source may confirm
        without sending anything else (see :meth:`RawHttp.probe`)."""
        if info.get("size") is not None and info.get("type") == "file":
            return Probed(info, None)
        return Probed({**info, **await self.info(path)}, None)

    async def files(self) -> dict[str, dict[str, Any]]:
        """Every file below the root, each with its size (:meth:`listing`, completed)."""
        found = await self.listing()
        limit = asyncio.Semaphore(INFO_CONCURRENCY)

        async def complete(path: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
            async with limit:
                return path, (await self.describe(path, info)).info

        done = await asyncio.gather(*(complete(p, i) for p, i in found.items()))
        return {p: i for p, i in done if i.get("type", "file") == "file"}

    async def read(self, path: str, start: int, end: int) -> bytes:
        return bytes(await self._guard(path, self._call("cat_file", path, start=start, end=end)))

    async def read_into(self, path: str, start: int, out: memoryview, *,
                        etag: str | None = None, size: int | None = None) -> int:
        """Bytes from ``start`` into ``out``; returns how many the source sent: fewer
        at the end of the file, more when it ignored the range (``out`` keeps the
        first ``len(out)``).  ``etag``, ``size``: the file as listed; a source that
        tells them with every read raises :class:`SourceError` when they differ."""
        data = await self.read(path, start, start + len(out))
        n = min(len(data), len(out))
        out[:n] = memoryview(data)[:n]
        return len(data)

    async def read_as_listed(self, path: str, start: int, length: int, *,
                             etag: str | None, size: int) -> tuple[bytes, bool]:
        """``length`` bytes from ``start`` (fewer at the end), and whether the read's
        own answer proved the file still the listed version (its ETag and size, as a
        raw HTTP read tells them; :class:`SourceError` when they differ): when not,
        a caller that must not mix versions asks the source again."""
        data = await self.read(path, start, start + length)
        return data, False

    async def read_all(self, path: str) -> bytes:
        return bytes(await self._guard(path, self._call("cat_file", path)))

    async def read_listed(self, path: str, size: int, etag: str | None) -> bytes:
        """The whole file, which must still be as listed: ``size`` bytes (and the
        ETag ``etag``, where the source tells), else :class:`SourceError`."""
        data = await self.read_all(path)
        if len(data) != size:
            raise self.changed(path, f"it has {len(data)} bytes, listed as {size}")
        return data

    def changed(self, path: str, how: str) -> SourceError:
        return SourceError(f"source {self.name(path)} changed since it was listed: {how}",
                           url=self.name(path))

    async def stream(self, path: str, piece: int) -> AsyncIterator[bytes]:
        """The file from its start, one sequential read at a time (no byte ranges)."""
        f = await self._guard(path, self._call("open", path, "rb"))
        try:
            while data := await self._guard(path, self._read_file(f, piece)):
                yield bytes(data)
        finally:
            await self._close_file(f)

    @abstractmethod
    async def _read_file(self, f: Any, n: int) -> bytes:
        """Provided by each subclass."""

    @abstractmethod
    async def _close_file(self, f: Any) -> None:
        """Provided by each subclass."""

    async def _guard(self, path: str, work: Awaitable[T]) -> T:
        """Await ``work``, turning foreign errors into ones that name the source."""
        try:
            return await work
        except StagerError:
            raise
        except FileNotFoundError as exc:
            # fsspec's http filesystem reports any failed request (a 403, say) as a
            # missing file; the HTTP answer underneath names the real cause.
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientResponseError) and cause.status != 404:
                raise SourceError(f"cannot read source {self.name(path)}: HTTP {cause.status} "
                                  f"{cause.message}", url=self.name(path)) from exc
            raise NotFound(f"source {self.name(path)}: no such file", url=self.name(path)) \
                from exc
        except (OSError, ValueError, TypeError, aiohttp.ClientError, TimeoutError,
                NotImplementedError, RuntimeError) as exc:
            raise SourceError(f"cannot read source {self.name(path)}: "
                              f"{type(exc).__name__}: {exc}", url=self.name(path)) from exc
        except Exception as exc:
            if not backend_error(exc):
                raise
            raise SourceError(f"cannot read source {self.name(path)}: "
                              f"{type(exc).__name__}: {exc}", url=self.name(path)) from exc


class AsyncSource(Source):
    """An async fsspec filesystem, awaited on the running loop.

    ``raw_http``: plain ``http://`` URLs are probed and read by
    :class:`~stager.client.transfer.httpraw.RawHttp`, falling back to fsspec for any answer
    it does not take.
    """

    def __init__(self, url: str, fs: fsspec.AbstractFileSystem, root: str, *,
                 raw_http: bool = False) -> None:
        super().__init__(url, fs, root)
        self._raw = RawHttp(fs) if raw_http else None

    async def describe(self, path: str, info: dict[str, Any], probe: int = 0,
                       unless: tuple[int, str] | None = None) -> Probed:
        if self._raw is not None and probe > 0 and info.get("size") is None:
            probed = await self._guard(path, self._raw.probe(path, probe, unless))
            if probed is not None:
                return Probed({**info, **probed.info}, probed.body)
        return await super().describe(path, info, probe)

    async def read_into(self, path: str, start: int, out: memoryview, *,
                        etag: str | None = None, size: int | None = None) -> int:
        if await self._raw_read(path, start, out, etag, size) is not None:
            return len(out)
        return await super().read_into(path, start, out)

    async def _raw_read(self, path: str, start: int, out: memoryview, etag: str | None,
                        size: int | None) -> Got | None:
        """A raw HTTP read into ``out``, its answer checked against the listed size and
        ETag; ``None`` where there is no raw reader or it did not take the answer."""
        if self._raw is None:
            return None
        got = await self._guard(path, self._raw.read_into(path, start, out))
        if got is not None:
            self._check(path, got, etag, size)
        return got

    async def read_as_listed(self, path: str, start: int, length: int, *,
                             etag: str | None, size: int) -> tuple[bytes, bool]:
        buf = bytearray(length if self._raw is not None else 0)
        got = await self._raw_read(path, start, memoryview(buf), etag, size) if buf else None
        if got is not None:
            return bytes(buf), etag is not None and got.etag is not None \
                and got.total is not None
        return await super().read_as_listed(path, start, length, etag=etag, size=size)

    async def read_listed(self, path: str, size: int, etag: str | None) -> bytes:
        if self._raw is None or not size:
            return await super().read_listed(path, size, etag)
        buf = bytearray(size)
        if await self._raw_read(path, 0, memoryview(buf), etag, size) is None:
            # fewer bytes, say, or no ranges: fsspec tells which
            return await super().read_listed(path, size, etag)
        return bytes(buf)

    def _check(self, path: str, got: Got, etag: str | None, size: int | None) -> None:
        """A raw read's answer names the file's size and ETag: both must be as listed."""
        if size is not None and got.total is not None and got.total != size:
            raise self.changed(path, f"it has {got.total} bytes, listed as {size}")
        if etag is not None and got.etag is not None and got.etag != etag:
            raise self.changed(path, f"its ETag is {got.etag}, listed as {etag}")

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "open":
            return await self.fs.open_async(*args, **kwargs)
        return await getattr(self.fs, "_" + name)(*args, **kwargs)

    async def _read_file(self, f: Any, n: int) -> bytes:
        return bytes(await f.read(n))

    async def _close_file(self, f: Any) -> None:
        await f.close()

    async def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
        closer: Callable[[], Awaitable[None]] | None = getattr(self.fs, "aclose", None)
        if closer is not None:
            await closer()
        # s3fs: its aiobotocore client (or per-region cache of them), closed the way
        # s3fs's own finalizer does; an async instance has no public close.
        s3 = getattr(self.fs, "_s3creator", None)
        if s3 is not None:
            await s3.__aexit__(None, None, None)
        # fsspec's http filesystem: its aiohttp session (else closed by a finalizer,
        # after a warning that it was not)
        session = getattr(self.fs, "_session", None)
        if session is not None and not session.closed:
            await session.close()
        for value in list(vars(self.fs).values()):   # http, gcs: an aiohttp session
            if isinstance(value, aiohttp.ClientSession) and not value.closed:
                await value.close()


class ThreadSource(Source):
    """A blocking fsspec filesystem, called from a pool of threads."""

    def __init__(self, url: str, fs: fsspec.AbstractFileSystem, root: str) -> None:
        super().__init__(url, fs, root)
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="stage-source")

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await self._run(getattr(self.fs, name), *args, **kwargs)

    async def read_into(self, path: str, start: int, out: memoryview, *,
                        etag: str | None = None, size: int | None = None) -> int:
        return await self._guard(path, self._run(_read_into, self.fs, path, start, out))

    async def _read_file(self, f: Any, n: int) -> bytes:
        return bytes(await self._run(f.read, n))

    async def _close_file(self, f: Any) -> None:
        await self._run(f.close)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _read_into(fs: fsspec.AbstractFileSystem, path: str, start: int, out: memoryview) -> int:
    """``out`` filled from ``start`` of a blocking filesystem's file, until full or
    the end of the file; returns the bytes read."""
    with fs.open(path, "rb") as f:
        f.seek(start)
        readinto = getattr(f, "readinto", None)
        pos = 0
        while pos < len(out):
            if readinto is not None:
                n = readinto(out[pos:])
            else:
                data = f.read(len(out) - pos)
                n = len(data)
                out[pos:pos + n] = data
            if not n:
                break
            pos += n
        return pos


def source_mtime(info: dict[str, Any]) -> float | None:
    """The modification time an fsspec info dict reports, as a Unix time."""
    for key in ("mtime", "LastModified", "last_modified", "Last-Modified", "updated",
                "modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, dt.datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return email.utils.parsedate_to_datetime(value).timestamp()
            except (TypeError, ValueError):
                try:
                    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
    return None


def backend_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an fsspec backend library's own error that inherits no
    built-in: botocore's (s3fs: no endpoint, no credentials, …).  Its module is
    loaded whenever one of them can be raised, so nothing is imported here."""
    boto = sys.modules.get("botocore.exceptions")
    return boto is not None and isinstance(exc, boto.BotoCoreError)


def source_etag(info: dict[str, Any]) -> str | None:
    for key in ("ETag", "etag", "md5Hash"):
        value = info.get(key)
        if value:
            return str(value)
    return None


def local_tree(root: Path) -> list[SourceFile]:
    """Every file below ``root``, in path order (blocking: call it in a thread)."""
    return [_local(p, p.relative_to(root).as_posix()) for p in sorted(root.rglob("*"))
            if p.is_file()]


def local_file(path: Path) -> SourceFile:
    """The local file ``path`` (blocking); :class:`NotFound` when there is none."""
    try:
        return _local(path, path.name)
    except FileNotFoundError as exc:
        raise NotFound(f"{path}: no such file", path=str(path)) from exc


def _local(path: Path, rel: str) -> SourceFile:
    st = path.stat()
    return SourceFile(str(path), rel, st.st_size, st.st_mtime, None)
